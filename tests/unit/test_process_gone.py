"""pid_alive: a killed process counts as gone only once all its threads have exited (its sockets closed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

from kraft.cluster.process import pid_alive
from kraft.netutil import free_port, port_in_use

_HOLDER = """
import socket, sys, threading, time
listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", int(sys.argv[1])))
listener.listen()
for _ in range(40):  # a node has many threads (gRPC, executors); they exit after the leader
    threading.Thread(target=time.sleep, args=(100,), daemon=True).start()
print("ready", flush=True)
time.sleep(100)
"""


def test_a_killed_multithreaded_process_is_gone_only_when_its_listening_port_is_free() -> None:
    for _ in range(5):
        port = free_port()
        holder = subprocess.Popen(
            [sys.executable, "-c", _HOLDER, str(port)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        try:
            assert holder.stdout is not None and holder.stdout.readline() == b"ready\n"
            os.kill(holder.pid, signal.SIGKILL)
            deadline = time.monotonic() + 10
            while pid_alive(holder.pid):  # not reaped on purpose: a zombie, as for a node of another parent
                assert time.monotonic() < deadline, "a SIGKILLed process stayed alive"
                time.sleep(0.0005)
            assert not port_in_use("127.0.0.1", port)
        finally:
            holder.kill()
            holder.wait(timeout=10)
