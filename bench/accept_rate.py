"""How fast does a grpc.aio server on an intake thread accept calls while the main thread holds the GIL?
(issue #17, session 14; docs/internals/raft-performance.md, "The accept path under a busy main thread").

Session 14's attribution of the bulk-phase heartbeat tail inferred that grpc.aio's one outstanding
``request_call`` per server limits how many calls a CPU-starved controller accepts.  This tests it apart
from kraft: a server process runs a grpc.aio server (or two sharing the port through ``SO_REUSEPORT``) on
an :class:`~kraft.node.intake.IntakeLoop` (uvloop by default), with ``sys.setswitchinterval(0.0001)`` as a
controller node sets, and its main thread optionally busy in a pure-Python loop (GIL-holding slices, like
bulk work; ``--busy-ms`` / ``--gap-ms``), optionally beside ``--burners`` external CPU-burning processes.
This process is the client: it sends no-op calls at a fixed rate, each carrying its send time
(``CLOCK_MONOTONIC``, shared by the processes), over ``--conns`` connections — unary calls (one accept
each), or messages over ``--conns`` long-lived bidi streams (one accept per stream; ``--shape stream``).
The server's handler records each call's send-to-handler delay; the server's CPU is read per thread
(``/proc/self/task/*/schedstat``) so the busy main thread's own CPU is not counted as the calls' cost.

Run: ``python -m bench.accept_rate --shape unary --servers 1 --conns 1 --rate 3000 --seconds 3 [--busy-ms
5 --gap-ms 0] [--burners 1]``; prints one JSON line per point.  ``--matrix`` runs the session's matrix
(every shape and busy setting, forward then reversed, to alternate) and writes ``--out``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import struct
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from kraft.netutil import free_port, wait_for_port
from kraft.node.intake import IntakeLoop
from kraft.procutil import reap, reap_children_on_exit, spawn_child

REPO_ROOT = Path(__file__).resolve().parents[1]
SERVICE = "bench.Accept"
CALL = f"/{SERVICE}/Call"
STREAM = f"/{SERVICE}/Stream"
RESET = f"/{SERVICE}/Reset"
REPORT = f"/{SERVICE}/Report"
STAMP = struct.Struct("<q")
CALL_TIMEOUT_S = 60.0
DRAIN_S = 8.0
RAMP_NS = 250_000_000  # the first 250 ms of sending are left out of the accepted rate
# One connection per channel: without a local subchannel pool, channels to one target share a connection.
CHANNEL_OPTIONS = (("grpc.use_local_subchannel_pool", 1),)


def _thread_cpu_ns() -> dict[int, int]:
    """CPU time of each thread of this process (ns, from schedstat: exact, not in clock ticks)."""
    out: dict[int, int] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as fh:
                out[int(tid)] = int(fh.read().split()[0])
        except (OSError, ValueError, IndexError):  # the thread ended meanwhile
            continue
    return out


class Recorder:
    """The server's counters, touched on the intake thread only (the handlers and Reset/Report)."""

    def __init__(self, servers: int) -> None:
        self.delays_ns: list[int] = []
        self.arrived_ns: list[int] = []
        self.per_server = [0] * servers
        self.cpu_at_reset: dict[int, int] = {}
        self.wall_at_reset = 0

    def note(self, payload: bytes, server: int) -> None:
        now = time.monotonic_ns()
        self.delays_ns.append(now - STAMP.unpack_from(payload)[0])
        self.arrived_ns.append(now)
        self.per_server[server] += 1

    def reset(self) -> None:
        self.delays_ns.clear()
        self.arrived_ns.clear()
        self.per_server = [0] * len(self.per_server)
        self.cpu_at_reset = _thread_cpu_ns()
        self.wall_at_reset = time.monotonic_ns()

    def report(self) -> dict[str, Any]:
        cpu = _thread_cpu_ns()
        main_tid = os.getpid()
        used = {tid: ns - self.cpu_at_reset.get(tid, 0) for tid, ns in cpu.items()}
        return {
            "delays_ns": self.delays_ns,
            "arrived_ns": self.arrived_ns,
            "per_server": self.per_server,
            "wall_ns": time.monotonic_ns() - self.wall_at_reset,
            "main_cpu_ns": used.get(main_tid, 0),
            "other_cpu_ns": sum(ns for tid, ns in used.items() if tid != main_tid),
        }


def _handlers(recorder: Recorder, index: int) -> grpc.GenericRpcHandler[Any, Any]:
    async def call(request: bytes, _context: Any) -> bytes:
        recorder.note(request, index)
        return b""

    async def stream(requests: AsyncIterator[bytes], _context: Any) -> AsyncIterator[bytes]:
        async for request in requests:
            recorder.note(request, index)
            yield b""

    async def reset(_request: bytes, _context: Any) -> bytes:
        recorder.reset()
        return b""

    async def report(_request: bytes, _context: Any) -> bytes:
        return json.dumps(recorder.report()).encode()

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Call": grpc.unary_unary_rpc_method_handler(call),
            "Stream": grpc.stream_stream_rpc_method_handler(stream),
            "Reset": grpc.unary_unary_rpc_method_handler(reset),
            "Report": grpc.unary_unary_rpc_method_handler(report),
        },
    )


async def _start_servers(port: int, count: int, recorder: Recorder) -> list[grpc.aio.Server]:
    servers = []
    for index in range(count):
        server = grpc.aio.server(options=(("grpc.so_reuseport", 1),))
        server.add_generic_rpc_handlers((_handlers(recorder, index),))
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        servers.append(server)
    return servers


def _busy_python(seconds: float) -> None:
    """Pure-Python work: holds the GIL except when the switch interval hands it over."""
    end = time.perf_counter() + seconds
    counter = 0
    while time.perf_counter() < end:
        for _ in range(200):
            counter += 1


def serve(port: int, servers: int, busy_s: float, gap_s: float) -> None:
    sys.setswitchinterval(0.0001)  # as install_metadata_layer does in a controller node
    recorder = Recorder(servers)
    intake = IntakeLoop()
    intake.start()
    started = asyncio.run_coroutine_threadsafe(_start_servers(port, servers, recorder), intake.loop)
    running = started.result(30)  # held: a grpc.aio server that is garbage-collected stops
    while True:  # until terminated: the main thread is the "state machine" doing bulk slices
        if busy_s > 0:
            _busy_python(busy_s)
        if gap_s > 0 or busy_s <= 0:
            time.sleep(gap_s if gap_s > 0 else 1.0)
    del running  # (never reached)


async def _load(target: str, shape: str, conns: int, rate: float, seconds: float) -> dict[str, Any]:
    channels = [grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) for _ in range(conns)]
    try:
        for channel in channels:
            await channel.channel_ready()
        calls = [channel.unary_unary(CALL, None, None) for channel in channels]
        control = channels[0].unary_unary(RESET, None, None)
        for call in calls:  # warm each connection
            for _ in range(20):
                await call(STAMP.pack(time.monotonic_ns()), timeout=CALL_TIMEOUT_S)
        streams: list[Any] = []
        readers: list[asyncio.Task[None]] = []
        answered = 0

        async def read(stream: Any) -> None:
            nonlocal answered
            async for _ in stream:
                answered += 1

        if shape == "stream":
            streams = [
                channel.stream_stream(STREAM, None, None)(None, timeout=CALL_TIMEOUT_S * 10)
                for channel in channels
            ]
            for stream in streams:
                readers.append(asyncio.ensure_future(read(stream)))
        await control(b"", timeout=CALL_TIMEOUT_S)
        pending: set[asyncio.Future[Any]] = set()
        total = int(rate * seconds)
        lateness_ms: list[float] = []
        start = time.monotonic()
        sent = 0
        while sent < total:
            due = start + sent / rate
            now = time.monotonic()
            if due > now:
                await asyncio.sleep(due - now)
                continue
            lateness_ms.append((now - due) * 1e3)
            payload = STAMP.pack(time.monotonic_ns())
            if shape == "stream":
                await streams[sent % conns].write(payload)
            else:
                pending.add(asyncio.ensure_future(calls[sent % conns](payload, timeout=CALL_TIMEOUT_S)))
            sent += 1
            if sent % 64 == 0:
                await asyncio.sleep(0)  # let answers in
        send_s = time.monotonic() - start
        window_ns = (int(start * 1e9) + RAMP_NS, time.monotonic_ns())
        if pending:  # a saturated server's queue: wait a bounded time, then the channels' close cancels it
            await asyncio.wait(pending, timeout=DRAIN_S)
        for stream in streams:
            await stream.done_writing()
        if readers:
            await asyncio.wait(readers, timeout=DRAIN_S)
        unanswered = sum(1 for f in pending if not f.done())
        errors = sum(1 for f in pending if f.done() and f.exception() is not None)
        raw = await channels[0].unary_unary(REPORT, None, None)(b"", timeout=CALL_TIMEOUT_S)
        report: dict[str, Any] = json.loads(raw)
        lateness_ms.sort()
        report["client"] = {
            "sent": sent,
            "send_s": round(send_s, 3),
            "send_late_p99_ms": round(lateness_ms[int(len(lateness_ms) * 0.99)], 1),
            "errors": errors,
            "unanswered_after_drain": unanswered,
        }
        report["window_ns"] = window_ns
        return report
    finally:
        for channel in channels:
            await channel.close(None)


def _pct(ordered: list[float], q: float) -> float:
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 1) if ordered else 0.0


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """Accepted calls/s (over the span the server saw them), CPU per call, send-to-handler delays."""
    delays = sorted(ns / 1e6 for ns in report["delays_ns"])
    arrived: list[int] = report["arrived_ns"]
    calls = len(arrived)
    # Accepted while the client was still sending (after a short ramp): a saturated server's queue keeps
    # growing then, so this is its acceptance rate; the calls drained afterwards are not counted.
    lo_ns, hi_ns = report["window_ns"]
    in_window = sum(1 for at in arrived if lo_ns <= at <= hi_ns)
    window_s = (hi_ns - lo_ns) / 1e9
    # Peak acceptance: the most calls any 250 ms window saw, per second.
    peak = 0
    lo = 0
    for hi, at in enumerate(arrived):
        while at - arrived[lo] > 250_000_000:
            lo += 1
        peak = max(peak, hi - lo + 1)
    return {
        "calls": calls,
        "accepted_per_s": round(in_window / window_s, 1) if window_s > 0 else 0.0,
        "peak_250ms_per_s": peak * 4,
        "server_cpu_us_per_call": round(report["other_cpu_ns"] / 1e3 / calls, 1) if calls else 0.0,
        "main_cpu_share": round(report["main_cpu_ns"] / report["wall_ns"], 2),
        # the rest of the server process (intake thread, gRPC's threads): with main_cpu_share ~1.0 together,
        # the process runs Python as fast as one GIL allows
        "other_cpu_share": round(report["other_cpu_ns"] / report["wall_ns"], 2),
        "delay_p50_ms": _pct(delays, 0.5),
        "delay_p99_ms": _pct(delays, 0.99),
        "delay_max_ms": _pct(delays, 1.0),
        "offered_per_s": round(report["client"]["sent"] / report["client"]["send_s"], 1),
        "per_server": report["per_server"],
        "client": report["client"],
    }


def measure(
    shape: str,
    servers: int,
    conns: int,
    rate: float,
    seconds: float,
    busy_ms: float,
    gap_ms: float,
    burners: int,
) -> dict[str, Any]:
    port = free_port()
    argv = [sys.executable, "-m", "bench.accept_rate", "--serve", str(port), "--servers", str(servers)]
    argv += ["--busy-ms", str(busy_ms), "--gap-ms", str(gap_ms)]
    children = [spawn_child(argv, cwd=REPO_ROOT)]
    burn = [sys.executable, "-c", "while True: pass"]
    children += [spawn_child(burn) for _ in range(burners)]
    try:
        if not wait_for_port("127.0.0.1", port, timeout_s=30):
            raise RuntimeError("the server did not listen")
        report = asyncio.run(_load(f"127.0.0.1:{port}", shape, conns, rate, seconds))
    finally:
        for child in children:
            child.terminate()
        for child in children:
            reap(child, timeout_s=10)
    point = {"shape": shape, "servers": servers, "conns": conns, "rate": rate, "busy_ms": busy_ms}
    return {**point, "gap_ms": gap_ms, "burners": burners, **summarize(report)}


MATRIX = (  # (shape, servers, conns)
    ("unary", 1, 1),
    ("unary", 1, 4),
    ("unary", 2, 4),
    ("stream", 1, 1),
    ("stream", 1, 4),
)
BUSY = ((0.0, 0.0, 0), (5.0, 0.0, 0), (5.0, 0.0, 1))  # (busy_ms, gap_ms, burners)


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # the server and burners end with the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.accept_rate", description=__doc__.splitlines()[0])
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--shape", choices=("unary", "stream"), default="unary")
    parser.add_argument("--servers", type=int, default=1, help="grpc.aio servers sharing the port")
    parser.add_argument("--conns", type=int, default=1, help="client connections (streams, for stream)")
    parser.add_argument("--rate", type=float, default=3000.0, help="calls/s sent")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--busy-ms", type=float, default=0.0, help="main thread's pure-Python slice")
    parser.add_argument("--gap-ms", type=float, default=0.0, help="sleep between slices (0: back to back)")
    parser.add_argument("--burners", type=int, default=0, help="external CPU-burning processes")
    parser.add_argument("--matrix", action="store_true", help="the session's matrix, forward then reversed")
    parser.add_argument("--out", type=Path, help="write the matrix's points here (JSON)")
    args = parser.parse_args(argv)
    if args.serve is not None:
        serve(args.serve, args.servers, args.busy_ms / 1e3, args.gap_ms / 1e3)
        return 0
    if not args.matrix:
        point = measure(
            args.shape,
            args.servers,
            args.conns,
            args.rate,
            args.seconds,
            args.busy_ms,
            args.gap_ms,
            args.burners,
        )
        print(json.dumps(point))
        return 0
    order = [(m, b) for b in BUSY for m in MATRIX]
    points = []
    for (shape, servers, conns), (busy_ms, gap_ms, burners) in order + order[::-1]:
        point = measure(shape, servers, conns, args.rate, args.seconds, busy_ms, gap_ms, burners)
        point["load_1m"] = os.getloadavg()[0]
        print(json.dumps(point), flush=True)
        points.append(point)
    if args.out is not None:
        args.out.write_text(json.dumps({"benchmark": "accept_rate", "points": points}, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
