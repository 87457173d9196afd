"""CPU per steady BrokerHeartbeat on both ends: a unary call each, against one long-lived stream per broker
(issue #17, session 15).

The leader's intake spends ~0.3-0.45 ms of grpc.aio per unary call ("The intake's unary path against the
floor, piece by piece (session 14)"); a message on an open stream costs far less (``bench.raft``: stream
writes/s ~4.7x unary).  This isolates the heartbeat's transport from Raft and the controller: the server
is a process built as ``ControllerNode`` builds its intake — ``server_options``, a
:class:`~kraft.node.intake.HopInterceptor` on an :class:`~kraft.node.intake.IntakeLoop` thread — serving
``BrokerHeartbeat`` through a real :class:`~kraft.node.controller_bridge.HeartbeatBridge` whose controller
has a real :class:`~kraft.metadata.heartbeat_lane.HeartbeatLane` holding every broker steady (the fast lane
answers all of them on the intake thread, as on a leader whose brokers changed nothing).  Variants:

- ``unary``: ``heartbeat_handler(bridge)``, each heartbeat one unary call (today's path);
- ``stream``: ``BrokerHeartbeatStream`` (``heartbeat_stream_handler(bridge)``), each broker one stream kept
  open, a heartbeat one message each way.

This process plays ``--brokers`` brokers on ONE channel (as the fleet does), each sending a heartbeat every
``--interval`` s and waiting for its answer.  Over a window it reads the server's ``/proc`` (process and
intake thread) and its own CPU, and divides by the heartbeats answered.  Variants alternate in every round
(A B | B A ...).  Run under ``flock /tmp/kraft-bench.lock``:
``python -m bench.heartbeat_stream_cost [--rounds 4] [--brokers 1000] [--interval 2] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.proc_cpu import TICK_S, snapshot
from kraft.procutil import reap_children_on_exit  # imports no grpc: the gRPC I/O layer is chosen later

REPO_ROOT = Path(__file__).resolve().parents[1]
VARIANTS = ("unary", "stream")
SERVICE = "kraft.v1.ControllerService"
UNARY = f"/{SERVICE}/BrokerHeartbeat"
STREAM = f"/{SERVICE}/BrokerHeartbeatStream"
CLUSTER = "bench-cluster"
EPOCH = 7


def _cpu(pid: int) -> tuple[float, dict[str, float]]:
    snap = snapshot(pid)
    if snap is None:
        return 0.0, {}
    return snap.ticks * TICK_S, {name: ticks * TICK_S for name, (ticks, _) in snap.threads.items()}


async def _serve(port: int, brokers: int) -> None:
    import grpc
    import grpc.aio

    from kraft.clock import SystemClock
    from kraft.grpc_service import ServerLimits, server_options
    from kraft.metadata.heartbeat_lane import HeartbeatLane, LaneSnapshot
    from kraft.node.controller_bridge import HeartbeatBridge, heartbeat_handler
    from kraft.node.heartbeat_stream import heartbeat_stream_handler
    from kraft.node.intake import HopInterceptor, IntakeLoop

    main_loop = asyncio.get_running_loop()
    forever = 2**62
    lane = HeartbeatLane(SystemClock(), CLUSTER, lambda: forever, note_interval_ms=1000)
    lane.snapshot = LaneSnapshot(
        None, None, CLUSTER, 10, forever, {b: (EPOCH, 0) for b in range(1, brokers + 1)}
    )

    class _Controller:  # what the bridge reads of a QuorumController: its lane
        def __init__(self) -> None:
            self.lane = lane

    class _Guard:  # no authorizer: the identity binding only (plaintext: no identity)
        authorizer = None

    controller: Any = _Controller()
    guard: Any = _Guard()
    bridge = HeartbeatBridge(main_loop, lambda: guard, lambda: controller)
    handlers = {UNARY: heartbeat_handler(bridge), STREAM: heartbeat_stream_handler(bridge)}
    intake = IntakeLoop()
    intake.start()
    hop = HopInterceptor(main_loop, intake.loop, replace=handlers)

    async def start_on_intake() -> grpc.aio.Server:
        server = grpc.aio.server(options=server_options(ServerLimits()), interceptors=[hop])
        # the interceptor replaces a method only when the server has a handler for it
        server.add_generic_rpc_handlers(
            (
                grpc.method_handlers_generic_handler(
                    SERVICE, {name.rsplit("/", 1)[1]: handler for name, handler in handlers.items()}
                ),
            )
        )
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        return server

    server = await intake.run(start_on_intake())
    stop = asyncio.Event()
    main_loop.add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    del server
    os._exit(0)


async def _load(
    variant: str, target: str, pid: int, brokers: int, interval_s: float, warmup_s: float, window_s: float
) -> dict[str, Any]:
    import grpc.aio

    from kraft.v1 import controller_pb2 as cpb

    channel = grpc.aio.insecure_channel(target)
    latencies: list[float] = []
    errors = 0
    stopping = False

    def request(broker: int) -> bytes:
        return cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER, broker_id=broker, broker_epoch=EPOCH, current_metadata_offset=5
        ).SerializeToString()

    async def unary_broker(broker: int, offset_s: float) -> None:
        nonlocal errors
        call = channel.unary_unary(UNARY, request_serializer=None, response_deserializer=None)
        raw = request(broker)
        await asyncio.sleep(offset_s)
        while not stopping:
            started = time.perf_counter()
            try:
                cpb.BrokerHeartbeatResponse.FromString(await call(raw, timeout=5))
            except Exception:
                errors += 1
            else:
                latencies.append(time.perf_counter() - started)
            await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - started)))

    async def stream_broker(broker: int, offset_s: float) -> None:
        nonlocal errors
        raw = request(broker)
        await asyncio.sleep(offset_s)
        stream = channel.stream_stream(STREAM, request_serializer=None, response_deserializer=None)(None)
        try:
            while not stopping:
                started = time.perf_counter()
                try:
                    async with asyncio.timeout(5):  # no task per heartbeat, as wait_for makes
                        await stream.write(raw)
                        cpb.BrokerHeartbeatResponse.FromString(await stream.read())  # type: ignore[arg-type]
                except Exception:
                    errors += 1
                    stream.cancel()
                    stream = channel.stream_stream(
                        STREAM, request_serializer=None, response_deserializer=None
                    )(None)
                else:
                    latencies.append(time.perf_counter() - started)
                await asyncio.sleep(max(0.0, interval_s - (time.perf_counter() - started)))
        finally:
            stream.cancel()

    run = unary_broker if variant == "unary" else stream_broker
    tasks = [asyncio.create_task(run(b, b * interval_s / brokers)) for b in range(1, brokers + 1)]
    try:
        await asyncio.sleep(warmup_s)
        (server0, threads0), client0 = _cpu(pid), time.process_time()
        done0, errors0, started = len(latencies), errors, time.perf_counter()
        await asyncio.sleep(window_s)
        window = sorted(latencies[done0:])
        elapsed = time.perf_counter() - started
        (server1, threads1), client1 = _cpu(pid), time.process_time()
        errors_in = errors - errors0
    finally:
        stopping = True
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await channel.close(grace=None)
    count = max(1, len(window))
    per = 1e6 / count
    intake = sum(cpu - threads0.get(name, 0.0) for name, cpu in threads1.items() if "intake" in name)
    main = sum(cpu - threads0.get(name, 0.0) for name, cpu in threads1.items() if name.startswith("main"))
    return {
        "heartbeats": len(window),
        "heartbeats_per_s": round(len(window) / elapsed),
        "errors": errors_in,
        "p50_ms": round(window[len(window) // 2] * 1e3, 2) if window else None,
        "p99_ms": round(window[int(len(window) * 0.99)] * 1e3, 2) if window else None,
        "server_us_per_hb": round((server1 - server0) * per, 1),
        "intake_thread_us_per_hb": round(intake * per, 1),
        "server_main_thread_us_per_hb": round(main * per, 1),
        "client_us_per_hb": round((client1 - client0) * per, 1),
        "load_1m": round(os.getloadavg()[0], 2),
    }


def _one(variant: str, brokers: int, interval_s: float, warmup_s: float, window_s: float) -> dict[str, Any]:
    import uvloop

    from kraft.netutil import free_port, wait_for_port
    from kraft.procutil import reap, spawn_child
    from kraft.runtime import configure_grpc_io

    port = free_port()
    env = dict(os.environ)
    configure_grpc_io(env)
    process = spawn_child(
        [sys.executable, "-m", "bench.heartbeat_stream_cost", "--serve", str(port), str(brokers)],
        cwd=REPO_ROOT,
        env=env,
    )
    try:
        if not wait_for_port("127.0.0.1", port, timeout_s=30):
            raise RuntimeError(f"{variant}: the server did not listen within 30 s")
        return uvloop.run(
            _load(variant, f"127.0.0.1:{port}", process.pid, brokers, interval_s, warmup_s, window_s)
        )
    finally:
        process.terminate()
        reap(process)


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no server outlives the benchmark (kraft.procutil)
    args_list = sys.argv[1:] if argv is None else argv
    if args_list[:1] == ["--serve"]:
        import uvloop

        uvloop.run(_serve(int(args_list[1]), int(args_list[2])))
        return 0
    parser = argparse.ArgumentParser(
        prog="python -m bench.heartbeat_stream_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--rounds", type=int, default=4, help="rounds, the order reversed every other one")
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--interval", type=float, default=2.0, help="seconds between a broker's heartbeats")
    parser.add_argument("--warmup", type=float, default=3.0)
    parser.add_argument("--window", type=float, default=6.0)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(args_list)
    rows: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="hb-stream-"):
        for index in range(args.rounds):
            for variant in VARIANTS if index % 2 == 0 else tuple(reversed(VARIANTS)):
                row = _one(variant, args.brokers, args.interval, args.warmup, args.window)
                row["round"] = index
                rows[variant].append(row)
                print(f"round {index} {variant}: {row}", flush=True)
    keys = ("server_us_per_hb", "intake_thread_us_per_hb", "client_us_per_hb", "p99_ms", "load_1m")
    summary = {
        variant: {key: _median([row[key] for row in side]) for key in keys} for variant, side in rows.items()
    }
    result = {"brokers": args.brokers, "interval_s": args.interval, "summary": summary, "rows": rows}
    print(json.dumps(summary, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
