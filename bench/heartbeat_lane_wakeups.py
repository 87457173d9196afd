"""What one BrokerHeartbeat costs a controller's MAIN thread, with and without the heartbeat fast lane.

An in-process single-voter controller node (the metadata layer installed, the intake thread on) and one
broker heartbeating from a child process (synchronous gRPC, one call after the other, so the child's own
gRPC machinery is not in this process).  Around ``--heartbeats`` calls the main thread's voluntary
context switches (wake-ups) and its CPU time are read (``/proc/self/task/<tid>/status``,
``time.thread_time``) and divided by the calls.  Configurations alternate (off, fast, off, fast ...).
Unlike :mod:`bench.heartbeat_cost` (a 3-node quorum, 1,000 brokers) nothing else runs on the node: what
is left on the main thread is what the heartbeat path itself puts there.

    python -m bench.heartbeat_lane_wakeups --rounds 2 --heartbeats 2000

docs/internals/raft-performance.md "Heartbeats on the intake thread (session 13)".
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kraft.config import NodeConfig
from kraft.netutil import free_port
from kraft.node.controller import ControllerNode
from kraft.node.metadata_layer import install_metadata_layer
from kraft.procutil import reap_children_on_exit
from kraft.runtime import check_choices
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir

TIMEOUT_S = 120.0

_CLIENT = r"""
import sys, time, grpc
from kraft.v1 import common_pb2, controller_pb2_grpc
from kraft.v1 import controller_pb2 as cpb
port, cluster, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
stub = controller_pb2_grpc.ControllerServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))
register = cpb.RegisterBrokerRequest(cluster_id=cluster, broker_id=7, incarnation_id="i7",
    listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9007)])
deadline = time.monotonic() + 30
while True:  # the single voter elects itself and activates
    registered = stub.RegisterBroker(register, timeout=5)
    if registered.error_code == 0 or time.monotonic() > deadline:
        break
    time.sleep(0.05)
beat = cpb.BrokerHeartbeatRequest(cluster_id=cluster, broker_id=7, broker_epoch=registered.broker_epoch,
    current_metadata_offset=1 << 40)
for _ in range(20):  # unfenced, and warm
    stub.BrokerHeartbeat(beat, timeout=5)
    time.sleep(0.01)
print("READY", flush=True)
sys.stdin.readline()
for _ in range(count):
    stub.BrokerHeartbeat(beat, timeout=5)
print("DONE", flush=True)
"""


def _wakeups(tid: int) -> int:
    for line in Path(f"/proc/{os.getpid()}/task/{tid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches"):
            return int(line.split()[1])
    raise RuntimeError("no voluntary_ctxt_switches in /proc")


async def _measure(lane: bool, heartbeats: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kraft-bench-hblane-") as tmp:
        port, cluster = free_port(), random_uuid()
        format_log_dir(Path(tmp) / "meta", cluster_id=cluster, node_id=1)
        config = NodeConfig.build(
            process_roles="controller",
            node_id=1,
            controller_quorum_voters=f"1@127.0.0.1:{port}",
            listeners=f"CONTROLLER://127.0.0.1:{port}",
            metadata_log_dir=Path(tmp) / "meta",
            controller_broker_heartbeats_fast_lane=lane,
        )
        node = ControllerNode(config)
        layer = install_metadata_layer(node)
        await node.start()
        child = await asyncio.create_subprocess_exec(
            sys.executable,
            "-c",
            _CLIENT,
            str(port),
            cluster,
            str(heartbeats),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )
        assert child.stdin is not None and child.stdout is not None
        try:
            ready = await asyncio.wait_for(child.stdout.readline(), TIMEOUT_S)
            if not ready.startswith(b"READY"):
                raise RuntimeError(f"the heartbeating child did not start: {ready!r}")
            await asyncio.sleep(0.5)
            tid = threading.get_native_id()
            woken, cpu = _wakeups(tid), time.thread_time()
            child.stdin.write(b"go\n")
            await child.stdin.drain()
            done = await asyncio.wait_for(child.stdout.readline(), TIMEOUT_S)
            if not done.startswith(b"DONE"):
                raise RuntimeError(f"the heartbeating child failed: {done!r}")
            woken, cpu = _wakeups(tid) - woken, time.thread_time() - cpu
            controller = layer.controller
            answered = controller.lane.answered if controller is not None and controller.lane else 0
            return {
                "fast_lane": lane,
                "heartbeats": heartbeats,
                "answered_on_intake": answered,
                "main_thread_wakeups_per_heartbeat": round(woken / heartbeats, 3),
                "main_thread_cpu_us_per_heartbeat": round(cpu * 1e6 / heartbeats, 1),
                "load_1m": round(os.getloadavg()[0], 2),
            }
        finally:
            if child.returncode is None:
                child.kill()
            await child.wait()
            await node.stop()


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # (first: the rule for every bench; this one's child is an asyncio subprocess)
    parser = argparse.ArgumentParser(
        prog="python -m bench.heartbeat_lane_wakeups", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of (off, fast), alternated")
    parser.add_argument("--heartbeats", type=int, default=2000, help="heartbeats measured per run")
    parser.add_argument("--out", type=Path, help="also write the result JSON there")
    args = parser.parse_args(argv)
    factory = check_choices() or asyncio.new_event_loop
    rows: list[dict[str, Any]] = []
    for index in range(args.rounds):
        for lane in (False, True) if index % 2 == 0 else (True, False):
            loop = factory()
            try:
                row = loop.run_until_complete(_measure(lane, args.heartbeats))
            finally:
                loop.close()
            row["round"] = index
            rows.append(row)
            print(json.dumps(row), flush=True)
    if args.out is not None:
        args.out.write_text(json.dumps({"rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
