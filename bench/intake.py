"""Request plane apart from the state machine? A separate intake thread with its own event loop vs. the
single loop, measured (issue #17, docs/internals/raft-performance.md "Intake thread").

A server process answers ``RaftTestService.TestAppend`` after running a fixed amount of "state machine"
work per request (``--work-us``, a busy loop) on the state machine's loop.  Optionally that loop also runs
*bulk work*: slices of ``--slice-ms`` busy time, back to back with one loop turn in between (what a sliced
bulk operation does).  Two shapes:

- ``single``: gRPC intake and the state machine on one loop (kraft's controller today);
- ``thread``: the state machine on a thread with its own loop, gRPC's server on the main one; each request
  is handed to the state machine loop (``run_coroutine_threadsafe``) and its answer handed back;
- ``intake``: the same hop the other way round — gRPC's server on an intake thread with its own loop (the
  shape kraft's controller node uses), the state machine on the main loop.

A client process keeps ``--clients`` unary calls in flight for ``--seconds``; ops/s and p50/p99 per shape
and bulk setting.  Run: ``python -m bench.intake [--out bench/results/intake.json]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import sys
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from kraft.netutil import free_port, wait_for_port
from kraft.procutil import reap, reap_children_on_exit, spawn_child
from kraft.runtime import check_choices, configure_grpc_io, run_server
from kraft.v1 import raft_pb2

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "intake.json"
METHOD = "/kraft.v1.RaftTestService/TestAppend"


def _busy(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


async def _bulk(slice_s: float) -> None:
    while True:
        _busy(slice_s)
        await asyncio.sleep(0)


async def serve(port: int, shape: str, work_s: float, slice_s: float) -> None:
    sys.setswitchinterval(0.0001)  # as install_metadata_layer does
    if shape == "thread":
        machine = asyncio.new_event_loop()
        threading.Thread(target=machine.run_forever, daemon=True, name="state-machine").start()
    elif shape == "intake":
        # the gRPC server on an intake thread with its own loop; the state machine stays on this one
        machine = asyncio.get_running_loop()
        intake = (check_choices() or asyncio.new_event_loop)()
        threading.Thread(target=intake.run_forever, daemon=True, name="grpc-intake").start()
        started = asyncio.run_coroutine_threadsafe(_start_server(port, machine, work_s, True), intake)
        await asyncio.wrap_future(started)
        if slice_s > 0:
            await _bulk(slice_s)  # runs until the process is terminated
        await asyncio.Event().wait()
        return
    else:
        machine = asyncio.get_running_loop()

    if slice_s > 0:
        machine.call_soon_threadsafe(lambda: machine.create_task(_bulk(slice_s)))
    server = await _start_server(port, machine, work_s, shape == "thread")
    await server.wait_for_termination()


async def _start_server(
    port: int, machine: asyncio.AbstractEventLoop, work_s: float, hop: bool
) -> grpc.aio.Server:
    async def apply(values: int) -> raft_pb2.TestAppendResponse:
        _busy(work_s)
        return raft_pb2.TestAppendResponse(base_offset=1, last_offset=values)

    async def handle(
        request: raft_pb2.TestAppendRequest, _context: grpc.aio.ServicerContext[Any, Any]
    ) -> raft_pb2.TestAppendResponse:
        if hop:
            future = asyncio.run_coroutine_threadsafe(apply(len(request.values)), machine)
            return await asyncio.wrap_future(future)
        return await apply(len(request.values))

    server = grpc.aio.server()
    handler = grpc.unary_unary_rpc_method_handler(
        handle,
        request_deserializer=raft_pb2.TestAppendRequest.FromString,
        response_serializer=raft_pb2.TestAppendResponse.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("kraft.v1.RaftTestService", {"TestAppend": handler}),)
    )
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def load(target: str, clients: int, seconds: float) -> dict[str, Any]:
    latencies: list[float] = []
    async with grpc.aio.insecure_channel(target) as channel:
        call = channel.unary_unary(
            METHOD,
            request_serializer=raft_pb2.TestAppendRequest.SerializeToString,
            response_deserializer=raft_pb2.TestAppendResponse.FromString,
        )
        request = raft_pb2.TestAppendRequest(values=[b"x" * 256])
        for _ in range(20):
            await call(request, timeout=10)
        end = time.monotonic() + seconds

        async def client() -> None:
            while time.monotonic() < end:
                start = time.perf_counter()
                await call(request, timeout=10)
                latencies.append((time.perf_counter() - start) * 1000)

        await asyncio.gather(*(client() for _ in range(clients)))
    ordered = sorted(latencies)

    def pct(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"ops_per_s": round(len(ordered) / seconds, 1), "p50_ms": pct(0.5), "p99_ms": pct(0.99)}


def measure(shape: str, work_us: int, slice_ms: float, clients: int, seconds: float) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.intake", "--serve", str(port), "--shape", shape]
    argv += ["--work-us", str(work_us), "--slice-ms", str(slice_ms)]
    server = spawn_child(argv, cwd=REPO_ROOT)
    try:
        wait_for_port("127.0.0.1", port, timeout_s=30)
        result = asyncio.run(load(f"127.0.0.1:{port}", clients, seconds))
    finally:
        server.terminate()
        reap(server, timeout_s=10)
    return {"shape": shape, "bulk_slice_ms": slice_ms, "clients": clients, **result}


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.intake", description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=("single", "thread", "intake"), default="single")
    parser.add_argument("--work-us", type=int, default=50, help="state-machine work per request (µs)")
    parser.add_argument("--slice-ms", type=float, default=0.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    if args.serve is not None:
        configure_grpc_io()
        run_server(serve(args.serve, args.shape, args.work_us / 1e6, args.slice_ms / 1000))
        return 0
    points = [
        measure(shape, args.work_us, slice_ms, args.clients, args.seconds)
        for slice_ms in (0.0, 5.0)
        for shape in ("single", "thread", "intake")
    ]
    for point in points:
        print(json.dumps(point))
    results = {
        "benchmark": "intake",
        "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
        "work_us_per_request": args.work_us,
        "points": points,
    }
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
