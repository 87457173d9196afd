"""The grpc.aio floor: a server process that answers ``RaftTestService.TestAppend`` at once, doing no
Raft, no disk and no bookkeeping.

Measured in the same run and with the same client as kraft and etcd, it bounds what *any* Python grpc.aio
server can do for "one write per unary RPC" on this machine: kraft's leader does all of this per request
plus replication and fsync, so kraft/etcd can never exceed floor/etcd.  The server runs on the loop and the
gRPC I/O layer kraft's controllers use (:mod:`kraft.runtime`: uvloop; EventEngine unless
``KRAFT_GRPC_IO=iomgr``).

Run by hand: ``python -m bench.raft_floor PORT`` (serves until SIGTERM).
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from kraft.netutil import free_port, wait_for_port
from kraft.procutil import reap, reap_children_on_exit, spawn_child
from kraft.runtime import configure_grpc_io, run_server
from kraft.v1 import raft_pb2

REPO_ROOT = Path(__file__).resolve().parents[1]


async def _test_append(
    request: raft_pb2.TestAppendRequest, _context: grpc.aio.ServicerContext[Any, Any]
) -> raft_pb2.TestAppendResponse:
    return raft_pb2.TestAppendResponse(base_offset=1, last_offset=len(request.values))


async def serve(port: int) -> None:
    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        _test_append,
        request_deserializer=raft_pb2.TestAppendRequest.FromString,
        response_serializer=raft_pb2.TestAppendResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("kraft.v1.RaftTestService", {"TestAppend": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await server.stop(grace=None)


class FloorServer:
    """The floor server in its own process (like a controller); a context manager that always stops it."""

    def __init__(self) -> None:
        self.port = free_port()
        self._process: subprocess.Popen[bytes] | None = None

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def __enter__(self) -> FloorServer:
        env = dict(os.environ)
        configure_grpc_io(env)  # the gRPC I/O layer kraft's own server processes run on
        self._process = spawn_child(
            [sys.executable, "-m", "bench.raft_floor", str(self.port)],
            cwd=REPO_ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        if not wait_for_port("127.0.0.1", self.port, timeout_s=30):
            self.__exit__()
            raise RuntimeError("the grpc.aio floor server did not start listening within 30 s")
        return self

    def __exit__(self, *_exc: object) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        process.terminate()
        reap(process)


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not args[0].isdigit():
        print("usage: python -m bench.raft_floor PORT", file=sys.stderr)
        return 2
    run_server(serve(int(args[0])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
