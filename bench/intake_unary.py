"""Server CPU per unary ``TestAppend`` call: the no-op grpc.aio floor against kraft's intake handler chain,
piece by piece, and cheaper server options (issue #17, session 14).

``bench.raft_cpu`` found the leader's intake thread spending more per unary write than the whole floor
server.  This isolates the intake from Raft: each variant is a server process answering
``RaftTestService.TestAppend`` (no Raft, no disk), loaded by 64 closed-loop grpc.aio clients in this
process over one channel (as ``bench.raft``'s ``KraftWriter``: 256-byte records).  Over a fixed window it
reads the server's ``/proc/PID/stat`` and every thread's, and counts calls: µs of server CPU per call, per
thread, and calls/s.  Variants (alternated inside every round, so load hits them alike):

- ``floor``: ``bench.raft_floor``'s server (grpc.aio defaults, protobuf decoded by gRPC);
- ``floor_raw``: the same handler decoding raw bytes itself (``request_deserializer=None``), as kraft's
  :func:`kraft.grpc_service.register_service` does;
- ``floor_registered``: ``add_registered_method_handlers`` instead of a generic handler;
- ``floor_options``: kraft's :func:`kraft.grpc_service.server_options` (limits, keepalive, streams);
- ``floor_executor``: a sync handler on the grpc.aio server (run on its default executor);
- ``sync_pool``: the sync ``grpc.server`` with a 4-thread pool;
- ``kraft_chain``: kraft's own chain as ``ControllerNode`` builds it — ``server_options``, the
  ``HopInterceptor`` (``TestAppend`` native), the server on an :class:`~kraft.node.intake.IntakeLoop`
  thread, ``add_raft_test_service`` and ``RaftTestServicer.TestAppend`` — with an append that answers at
  once;
- ``kraft_wait``: the same, the append answering after ``--commit-ms`` (a commit's latency, no hand-off);
- ``kraft_bridge``: the same through a real :class:`~kraft.node.intake.AppendBridge` to the main loop,
  whose driver stand-in commits each hand-off ``--commit-ms`` later (the hand-offs, not Raft).

Run under ``flock /tmp/kraft-bench.lock``: ``python -m bench.intake_unary [--rounds 3] [--window 3]
[--only VARIANT ...] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Any

from bench.proc_cpu import TICK_S, snapshot
from kraft.procutil import reap_children_on_exit  # imports no grpc: the gRPC I/O layer is chosen later

REPO_ROOT = Path(__file__).resolve().parents[1]
CLIENTS = 64
VARIANTS = (
    "floor",
    "floor_raw",
    "floor_registered",
    "floor_options",
    "floor_executor",
    "sync_pool",
    "kraft_chain",
    "kraft_wait",
    "kraft_bridge",
)
SERVICE = "kraft.v1.RaftTestService"
METHOD = f"/{SERVICE}/TestAppend"


def _cpu(pid: int) -> tuple[float, dict[str, float]]:
    """CPU seconds of ``pid`` and of each of its threads, keyed ``comm:tid`` (``main`` for its main thread;
    bench.proc_cpu reads them)."""
    snap = snapshot(pid)
    if snap is None:
        return 0.0, {}
    return snap.ticks * TICK_S, {name: ticks * TICK_S for name, (ticks, _) in snap.threads.items()}


# ---------------------------------------------------------------------------------------------- servers


class _StubDriver:
    """:class:`~kraft.node.intake.DriverAppend` without Raft: every hand-off commits ``commit_s`` later
    (on the main loop, as the driver's commit callback runs)."""

    def __init__(self, commit_s: float) -> None:
        from kraft.raft.api import LeaderAndEpoch

        self.leader_and_epoch = LeaderAndEpoch(1, 1)
        self._commit_s = commit_s
        self._offset = 0

    def append_callback(
        self, records: Sequence[bytes], on_commit: Callable[[int | None, BaseException | None], None]
    ) -> int:
        self._offset += len(records)
        asyncio.get_running_loop().call_later(self._commit_s, on_commit, self._offset, None)
        return self._offset

    def pull_during_flush(self, source: object) -> None:
        return None


class _AnswerAt:
    """An :class:`~kraft.raft.grpc_test_service.AppendPath` without Raft: at once, or after ``wait_s``."""

    def __init__(self, wait_s: float) -> None:
        from kraft.raft.api import LeaderAndEpoch

        self._leader = LeaderAndEpoch(1, 1)
        self._wait_s = wait_s
        self._offset = 0

    async def append(self, values: list[bytes]) -> tuple[int, Any]:
        if self._wait_s:
            await asyncio.sleep(self._wait_s)
        self._offset += len(values)
        return self._offset, self._leader

    async def leader_and_epoch(self) -> Any:
        return self._leader


def _serve_sync(port: int) -> None:
    import grpc

    from kraft.v1 import raft_pb2

    def test_append(request: raft_pb2.TestAppendRequest, _context: Any) -> raft_pb2.TestAppendResponse:
        return raft_pb2.TestAppendResponse(base_offset=1, last_offset=len(request.values))

    handler = grpc.unary_unary_rpc_method_handler(
        test_append,
        request_deserializer=raft_pb2.TestAppendRequest.FromString,
        response_serializer=raft_pb2.TestAppendResponse.SerializeToString,
    )
    server = grpc.server(futures.ThreadPoolExecutor(4))
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, {"TestAppend": handler}),))
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    signal.signal(signal.SIGTERM, lambda *_: server.stop(None))
    server.wait_for_termination()


async def _serve_aio(variant: str, port: int, commit_s: float, report: Path) -> None:
    import grpc
    import grpc.aio

    from bench.raft_floor import _test_append
    from kraft.grpc_service import ServerLimits, server_options
    from kraft.node.intake import AppendBridge, HopInterceptor, IntakeLoop
    from kraft.raft.grpc_test_service import APPEND_METHODS, RaftTestServicer, add_raft_test_service
    from kraft.v1 import raft_pb2

    main_loop = asyncio.get_running_loop()
    decoded = {"request_deserializer": raft_pb2.TestAppendRequest.FromString}
    encode = raft_pb2.TestAppendResponse.SerializeToString
    bridge: AppendBridge | None = None

    def build(interceptors: list[Any] | None) -> grpc.aio.Server:
        kraft_like = variant.startswith("kraft") or variant == "floor_options"
        server = grpc.aio.server(
            options=server_options(ServerLimits()) if kraft_like else None, interceptors=interceptors
        )
        if variant.startswith("kraft"):
            nonlocal bridge
            appends: Any
            if variant == "kraft_bridge":
                appends = bridge = AppendBridge(main_loop, _StubDriver(commit_s))
            else:
                appends = _AnswerAt(commit_s if variant == "kraft_wait" else 0.0)
            # the servicer's Raft client and digest state are not touched by TestAppend with ``appends``
            servicer = RaftTestServicer(None, None, cluster_id="bench", appends=appends)  # type: ignore[arg-type]
            add_raft_test_service(servicer, server)
        else:
            handler: grpc.RpcMethodHandler[Any, Any]
            if variant == "floor_raw":

                async def raw_append(raw: bytes, context: Any) -> bytes:
                    return encode(await _test_append(raft_pb2.TestAppendRequest.FromString(raw), context))

                handler = grpc.unary_unary_rpc_method_handler(raw_append)
            elif variant == "floor_executor":

                def sync_append(request: raft_pb2.TestAppendRequest, _context: Any) -> Any:
                    return raft_pb2.TestAppendResponse(base_offset=1, last_offset=len(request.values))

                handler = grpc.unary_unary_rpc_method_handler(
                    sync_append, response_serializer=encode, **decoded
                )
            else:
                handler = grpc.unary_unary_rpc_method_handler(
                    _test_append, response_serializer=encode, **decoded
                )
            if variant == "floor_registered":
                # in grpc.aio since grpcio 1.63; not in the stubs kraft type-checks against
                server.add_registered_method_handlers(SERVICE, {"TestAppend": handler})  # type: ignore[attr-defined]
            else:
                server.add_generic_rpc_handlers(
                    (grpc.method_handlers_generic_handler(SERVICE, {"TestAppend": handler}),)
                )
        server.add_insecure_port(f"127.0.0.1:{port}")
        return server

    if variant.startswith("kraft"):  # as ControllerNode: the server on the intake thread, the hop on it
        intake = IntakeLoop()
        intake.start()
        hop = HopInterceptor(main_loop, intake.loop, native=APPEND_METHODS)

        async def start_on_intake() -> grpc.aio.Server:
            server = build([hop])
            await server.start()
            return server

        server = await intake.run(start_on_intake())
    else:
        server = build(None)
        await server.start()
    stop = asyncio.Event()
    main_loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    del server  # held until here: a grpc.aio server that is collected stops serving
    handoffs = bridge.handoffs if bridge is not None else None
    report.write_text(json.dumps({"handoffs": handoffs}))  # noqa: ASYNC240 - the process's last act
    os._exit(0)  # the servers are not stopped: nothing of theirs is measured after the window


# ---------------------------------------------------------------------------------------------- clients


async def _load(target: str, pid: int, warmup_s: float, window_s: float) -> dict[str, Any]:
    """64 closed-loop callers over one channel; /proc read at both ends of the window."""
    import grpc.aio

    from bench.raft import VALUE
    from kraft.v1 import raft_pb2

    request = raft_pb2.TestAppendRequest(cluster_id="bench", values=[VALUE]).SerializeToString()
    channel = grpc.aio.insecure_channel(target)
    call = channel.unary_unary(METHOD, request_serializer=None, response_deserializer=None)
    done = errors = 0
    stop = False

    async def caller() -> None:
        nonlocal done, errors
        while not stop:
            try:
                await call(request, timeout=5)
            except Exception:
                errors += 1
                await asyncio.sleep(0.001)
                continue
            done += 1

    tasks = [asyncio.create_task(caller()) for _ in range(CLIENTS)]
    try:
        await asyncio.sleep(warmup_s)
        (server0, threads0), client0 = _cpu(pid), time.process_time()
        done0, started = done, time.perf_counter()
        await asyncio.sleep(window_s)
        calls, elapsed = done - done0, time.perf_counter() - started
        (server1, threads1), client1 = _cpu(pid), time.process_time()
    finally:
        stop = True
        await asyncio.gather(*tasks, return_exceptions=True)
        await channel.close(grace=None)
    per_call = 1e6 / max(calls, 1)
    threads = {
        name: round((cpu - threads0.get(name, 0.0)) * per_call, 1)
        for name, cpu in threads1.items()
        if cpu > threads0.get(name, 0.0)
    }
    return {
        "calls": calls,
        "calls_total": done,  # warm-up, window and the drain: what the server's hand-offs carried
        "calls_per_s": calls / elapsed,
        "errors": errors,
        "server_us_per_call": (server1 - server0) * per_call,
        "client_us_per_call": (client1 - client0) * per_call,
        "server_threads_us_per_call": threads,
    }


def _one(variant: str, warmup_s: float, window_s: float, commit_ms: float) -> dict[str, Any]:
    import uvloop

    from kraft.netutil import free_port, wait_for_port
    from kraft.procutil import reap, spawn_child
    from kraft.runtime import configure_grpc_io

    port = free_port()
    env = dict(os.environ)
    configure_grpc_io(env)
    with tempfile.TemporaryDirectory(prefix="intake-unary-") as scratch:  # removed however the run ends
        report = Path(scratch) / "report.json"
        process = spawn_child(
            [
                sys.executable,
                "-m",
                "bench.intake_unary",
                "--serve",
                variant,
                str(port),
                str(commit_ms),
                str(report),
            ],
            cwd=REPO_ROOT,
            env=env,
        )
        try:
            if not wait_for_port("127.0.0.1", port, timeout_s=30):
                raise RuntimeError(f"{variant}: the server did not listen within 30 s")
            result = uvloop.run(_load(f"127.0.0.1:{port}", process.pid, warmup_s, window_s))
        finally:
            process.terminate()
            reap(process)
        handoffs = json.loads(report.read_text())["handoffs"] if report.exists() else None
    if handoffs:
        result["calls_per_handoff"] = result["calls_total"] / handoffs  # both over the whole run
    return result


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no server outlives the benchmark (kraft.procutil)
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--serve"]:
        variant, port, commit_ms, report = args_list[1], int(args_list[2]), float(args_list[3]), args_list[4]
        if variant == "sync_pool":
            _serve_sync(port)
        else:
            from kraft.runtime import run_server

            logging.disable(logging.WARNING)
            run_server(_serve_aio(variant, port, commit_ms / 1000, Path(report)))
        return 0
    parser = argparse.ArgumentParser(prog="python -m bench.intake_unary", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=3.0)
    parser.add_argument("--commit-ms", type=float, default=2.0, help="kraft_wait/kraft_bridge commit latency")
    parser.add_argument("--only", action="append", choices=VARIANTS, help="variants to run (default: all)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(args_list)
    from kraft.runtime import configure_grpc_io

    configure_grpc_io()  # the client on the same gRPC I/O layer as the servers
    variants = args.only or list(VARIANTS)
    runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in variants}
    for round_index in range(args.rounds):
        for variant in variants:
            result = _one(variant, args.warmup, args.window, args.commit_ms)
            runs[variant].append(result)
            top = sorted(result["server_threads_us_per_call"].items(), key=lambda item: -item[1])[:4]
            print(
                f"round {round_index} {variant:17s} {result['calls_per_s']:7.0f} calls/s  server "
                f"{result['server_us_per_call']:6.1f} µs/call  client {result['client_us_per_call']:6.1f}  "
                f"errors {result['errors']}  calls/hand-off {result.get('calls_per_handoff', '-')}  {top}",
                flush=True,
            )
    summary = {
        variant: {
            "server_us_per_call_median": _median([r["server_us_per_call"] for r in results]),
            "server_us_per_call": [round(r["server_us_per_call"], 1) for r in results],
            "calls_per_s_median": _median([r["calls_per_s"] for r in results]),
        }
        for variant, results in runs.items()
    }
    print("variant            server µs/call (median; all)            calls/s (median)")
    for variant, row in summary.items():
        print(
            f"{variant:17s} {row['server_us_per_call_median']:7.1f}  {row['server_us_per_call']}  "
            f"{row['calls_per_s_median']:7.0f}"
        )
    if args.out is not None:
        args.out.write_text(
            json.dumps(
                {"args": vars(args) | {"out": str(args.out)}, "summary": summary, "runs": runs},
                indent=1,
                default=str,
            )
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
