"""Raft benchmark: kraft's 3-controller quorum against etcd's 3 members, side by side on loopback.

What is measured (results in ``bench/results/raft.json``; the targets: 64-client throughput ≥ etcd's in the
same run, ≥ 100,000 records/s batched; 1-client p50 ≤ 1.5x etcd's and p99 ≤ 5 ms; failover p50 ≤ 1.5 s
with defaults, p50 ≤ 250 ms and p99 ≤ 600 ms with the fast profile):

- committed writes/s and p50/p99 latency for 1, 16 and 64 closed-loop clients, each awaiting the commit
  of one 256-byte record per request: kraft ``RaftTestService.TestAppend`` to the leader vs etcd
  ``KV.Put`` to the leader, both from Python grpc.aio clients in this process, fsync on in both;
- batched records/s (TestAppend with many records per request);
- failover after SIGKILL of the leader: time from the kill to the first successful write started after
  it (10 trials), with kraft's defaults and with a fast profile (election ~150 ms);
- the grpc.aio floor (:mod:`bench.raft_floor`): the same client against a server process that answers
  TestAppend at once — no Raft, no disk — so ``floor/etcd`` bounds what kraft/etcd could ever reach.

kraft runs with its shipped defaults for the latency/throughput points, the append linger included
(``controller.quorum.append.linger.ms=25`` is only an upper bound: the leader batches by group commit,
writing a lone append at once and gathering appends only while a flush is in flight; etcd has no linger
either) — reported in the JSON.

Run: ``python -m bench`` (all benchmarks) or ``python -m bench.raft [--quick]``;
``KRAFT_GRPC_IO=iomgr python -m bench.raft`` runs kraft's servers on gRPC's iomgr (:mod:`kraft.runtime`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

from bench.raft_etcd import EtcdCluster, EtcdPutClient, ensure_etcd_installed
from bench.raft_floor import FloorServer
from kraft.client.channel import ChannelSecurity, open_channel
from kraft.cluster.quorum import ControllerQuorum
from kraft.errors import ErrorCode
from kraft.procutil import reap_children_on_exit
from kraft.runtime import configure_grpc_io
from kraft.v1 import raft_pb2, raft_pb2_grpc

AppendStream = grpc.aio.StreamStreamCall[raft_pb2.TestAppendRequest, raft_pb2.TestAppendResponse]

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "raft.json"
VALUE = b"v" * 256
CONCURRENCY = (1, 16, 64)

THROUGHPUT_PROFILE: dict[str, str] = {"log.level": "WARNING"}
FAILOVER_PROFILES: dict[str, dict[str, str]] = {
    "default": {"log.level": "WARNING"},
    "fast": {
        "log.level": "WARNING",
        "controller.quorum.election.timeout.ms": "150",
        "controller.quorum.fetch.timeout.ms": "150",
        "controller.quorum.election.backoff.max.ms": "100",
        "controller.quorum.fetch.max.wait.ms": "50",
        "controller.quorum.request.timeout.ms": "500",
    },
}


@dataclass(frozen=True, slots=True)
class LoadResult:
    clients: int
    ops: int
    seconds: float
    writes_per_s: float
    p50_ms: float
    p99_ms: float
    errors: int


def _percentile(sorted_values: list[float], fraction: float) -> float:
    if not sorted_values:
        return float("nan")
    index = min(len(sorted_values) - 1, max(0, round(fraction * (len(sorted_values) - 1))))
    return sorted_values[index]


async def closed_loop(
    call: Callable[[int], Awaitable[None]], clients: int, duration_s: float, warmup_s: float
) -> LoadResult:
    """``clients`` tasks each calling ``call(seq)`` back to back; only calls finished after the warm-up
    and started before the end count.  Bounded: every call has its own gRPC deadline."""
    latencies: list[float] = []
    errors = 0
    start = time.perf_counter()
    measure_from = start + warmup_s
    stop_at = measure_from + duration_s

    async def worker(worker_id: int) -> None:
        nonlocal errors
        seq = worker_id << 32
        while True:
            began = time.perf_counter()
            if began >= stop_at:
                return
            seq += 1
            try:
                await call(seq)
            except Exception:
                errors += 1
                continue
            if began >= measure_from:
                latencies.append(time.perf_counter() - began)

    await asyncio.gather(*(worker(i) for i in range(clients)))
    latencies.sort()
    return LoadResult(
        clients=clients,
        ops=len(latencies),
        seconds=duration_s,
        writes_per_s=len(latencies) / duration_s,
        p50_ms=_percentile(latencies, 0.50) * 1000,
        p99_ms=_percentile(latencies, 0.99) * 1000,
        errors=errors,
    )


class KraftWriter:
    """TestAppend to one node over grpc.aio; raises on any error code (the load targets the leader)."""

    def __init__(
        self,
        target: str,
        cluster_id: str,
        security: ChannelSecurity | None = None,
        own_connection: bool = False,
    ) -> None:
        """``own_connection``: a TCP connection of this writer's own (gRPC otherwise shares one between
        channels with the same options)."""
        options: list[tuple[str, Any]] = [("grpc.max_send_message_length", 64 << 20)]
        if own_connection:
            options.append(("grpc.use_local_subchannel_pool", 1))
        self._channel = open_channel(target, options=options, security=security)
        self._stub = raft_pb2_grpc.RaftTestServiceStub(self._channel)
        self._cluster_id = cluster_id

    async def append(self, values: list[bytes], timeout_s: float = 5.0) -> raft_pb2.TestAppendResponse:
        request = raft_pb2.TestAppendRequest(cluster_id=self._cluster_id, values=values)
        response: raft_pb2.TestAppendResponse = await self._stub.TestAppend(request, timeout=timeout_s)
        return response

    async def write_one(self, _seq: int) -> None:
        response = await self.append([VALUE])
        if response.error_code != ErrorCode.NONE:
            raise RuntimeError(f"TestAppend failed: {ErrorCode.from_wire(response.error_code).name}")

    async def close(self) -> None:
        await self._channel.close(grace=None)


class KraftStreamWriter:
    """One ``TestAppendStream`` per client task; each message carries one record and is awaited until
    committed — the same closed loop as :class:`KraftWriter`, minus the per-call cost of unary gRPC."""

    def __init__(self, target: str, cluster_id: str) -> None:
        self._channel = open_channel(target)
        self._stub = raft_pb2_grpc.RaftTestServiceStub(self._channel)
        self._request = raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[VALUE])
        self._streams: dict[int, AppendStream] = {}

    async def write_one(self, seq: int) -> None:
        worker = seq >> 32  # closed_loop numbers each worker's calls from worker_id << 32
        stream = self._streams.get(worker)
        if stream is None:
            stream = self._stub.TestAppendStream(None)
            self._streams[worker] = stream
        try:
            await stream.write(self._request)
            response = await asyncio.wait_for(stream.read(), 5.0)
        except BaseException:
            self._streams.pop(worker, None)
            stream.cancel()
            raise
        if not isinstance(response, raft_pb2.TestAppendResponse) or response.error_code != ErrorCode.NONE:
            self._streams.pop(worker, None)
            stream.cancel()
            raise RuntimeError("TestAppendStream failed")

    async def close(self) -> None:
        for stream in self._streams.values():
            stream.cancel()
        self._streams.clear()
        await self._channel.close(grace=None)


def _median_point(runs: list[LoadResult]) -> dict[str, Any]:
    """The run with the median throughput, plus every run's rate (shared machines are noisy)."""
    ordered = sorted(runs, key=lambda r: r.writes_per_s)
    point = asdict(ordered[len(ordered) // 2])
    point["runs_writes_per_s"] = [round(r.writes_per_s, 1) for r in runs]
    return point


async def _throughput_points(
    kraft_target: str,
    cluster_id: str,
    etcd_target: str | None,
    floor_target: str,
    duration_s: float,
    warmup_s: float,
    repeats: int,
) -> dict[str, list[dict[str, Any]]]:
    """For each concurrency, alternate kraft (unary), kraft (stream), etcd and floor runs ``repeats``
    times; the median run per system and concurrency."""
    writer = KraftWriter(kraft_target, cluster_id)
    streamer = KraftStreamWriter(kraft_target, cluster_id)
    floor = KraftWriter(floor_target, cluster_id)
    etcd_client = EtcdPutClient(etcd_target) if etcd_target else None

    async def put(seq: int) -> None:
        assert etcd_client is not None
        await etcd_client.put(b"bench/%d" % (seq % 10_000), VALUE)

    systems: dict[str, Callable[[int], Awaitable[None]]] = {
        "kraft": writer.write_one,
        "kraft_stream": streamer.write_one,
    }
    if etcd_client is not None:
        systems["etcd"] = put
    systems["floor"] = floor.write_one
    points: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    try:
        for clients in CONCURRENCY:
            runs: dict[str, list[LoadResult]] = {name: [] for name in systems}
            for _ in range(repeats):
                for name, call in systems.items():
                    runs[name].append(await closed_loop(call, clients, duration_s, warmup_s))
            for name in systems:
                points[name].append(_median_point(runs[name]))
    finally:
        await writer.close()
        await streamer.close()
        await floor.close()
        if etcd_client is not None:
            await etcd_client.close()
    return points


async def _batched_point(
    target: str, cluster_id: str, duration_s: float, warmup_s: float, batch: int
) -> dict[str, Any]:
    writer = KraftWriter(target, cluster_id)
    values = [VALUE] * batch

    async def write_batch(_seq: int) -> None:
        response = await writer.append(values, timeout_s=10.0)
        if response.error_code != ErrorCode.NONE:
            raise RuntimeError(f"TestAppend failed: {ErrorCode.from_wire(response.error_code).name}")

    try:
        batched = await closed_loop(write_batch, 4, duration_s, warmup_s)
    finally:
        await writer.close()
    return {
        "records_per_request": batch,
        "clients": 4,
        "requests_per_s": batched.writes_per_s,
        "records_per_s": batched.writes_per_s * batch,
        "p50_ms": batched.p50_ms,
        "p99_ms": batched.p99_ms,
        "errors": batched.errors,
    }


def bench_throughput(
    work_dir: Path, duration_s: float, warmup_s: float, batch: int, repeats: int
) -> dict[str, Any]:
    """Both clusters up at once; points alternate between them so machine load hits both alike."""
    etcd_note = ""
    with contextlib.ExitStack() as stack:
        quorum = stack.enter_context(ControllerQuorum(work_dir / "kraft", overrides=THROUGHPUT_PROFILE))
        quorum.start()
        floor = stack.enter_context(FloorServer())
        etcd_target: str | None = None
        if ensure_etcd_installed():
            cluster = stack.enter_context(EtcdCluster(work_dir / "etcd"))
            etcd_target = cluster.wait_for_leader(30).target
        else:
            etcd_note = "etcd-server not installed and could not be installed; etcd side skipped"
        kraft_target = quorum.nodes[quorum.wait_for_leader(30).node_id].target
        points = asyncio.run(
            _throughput_points(
                kraft_target, quorum.cluster_id, etcd_target, floor.target, duration_s, warmup_s, repeats
            )
        )
        batched = asyncio.run(_batched_point(kraft_target, quorum.cluster_id, duration_s, warmup_s, batch))
    return {
        "kraft": {"points": points["kraft"], "stream_points": points["kraft_stream"], "batched": batched},
        "etcd": points.get("etcd"),
        "grpc_aio_floor": points["floor"],
        "etcd_note": etcd_note,
        "kraft_config": THROUGHPUT_PROFILE,
        "repeats": repeats,
    }


async def _first_write_after(quorum: ControllerQuorum, killed_at: float, timeout_s: float) -> float:
    """Seconds from ``killed_at`` until a TestAppend started after it commits (polls all live nodes)."""
    writers = {i: KraftWriter(quorum.nodes[i].target, quorum.cluster_id) for i in quorum.live_ids}
    try:
        deadline = killed_at + timeout_s
        while time.perf_counter() < deadline:
            attempts = [w.append([VALUE], timeout_s=1.0) for w in writers.values()]
            for outcome in await asyncio.gather(*attempts, return_exceptions=True):
                if isinstance(outcome, raft_pb2.TestAppendResponse) and outcome.error_code == ErrorCode.NONE:
                    return time.perf_counter() - killed_at
            await asyncio.sleep(0.005)
        raise TimeoutError(f"no write committed within {timeout_s} s of the kill")
    finally:
        for writer in writers.values():
            await writer.close()


def bench_failover(work_dir: Path, profile: str, trials: int) -> dict[str, Any]:
    overrides = FAILOVER_PROFILES[profile]
    samples_ms: list[float] = []
    with ControllerQuorum(work_dir / f"failover-{profile}", overrides=overrides) as quorum:
        quorum.start()
        for _ in range(trials):
            leader = quorum.wait_for_leader(60)
            _, last = quorum.append([VALUE])
            for node_id in quorum.nodes:
                quorum.wait_caught_up(node_id, last + 1, timeout_s=60)
            killed_at = time.perf_counter()
            quorum.kill(leader.node_id)
            samples_ms.append(asyncio.run(_first_write_after(quorum, killed_at, 30.0)) * 1000)
            quorum.restart(leader.node_id)
    samples_ms.sort()
    return {
        "profile": profile,
        "config": overrides,
        "trials": trials,
        "samples_ms": [round(s, 1) for s in samples_ms],
        "min_ms": samples_ms[0],
        "p50_ms": statistics.median(samples_ms),
        "p99_ms": _percentile(samples_ms, 0.99),
        "max_ms": samples_ms[-1],
    }


def _ratios(throughput: Mapping[str, Any]) -> dict[str, float]:
    etcd = throughput.get("etcd")
    if not etcd:
        return {}
    out: dict[str, float] = {}
    floors = throughput.get("grpc_aio_floor") or [None] * len(etcd)
    for ours, streamed, theirs, floor in zip(
        throughput["kraft"]["points"], throughput["kraft"]["stream_points"], etcd, floors, strict=True
    ):
        clients = ours["clients"]
        if theirs["writes_per_s"] > 0:
            out[f"writes_per_s_{clients}_clients"] = ours["writes_per_s"] / theirs["writes_per_s"]
            out[f"stream_writes_per_s_{clients}_clients"] = streamed["writes_per_s"] / theirs["writes_per_s"]
            if floor is not None:
                out[f"floor_writes_per_s_{clients}_clients"] = floor["writes_per_s"] / theirs["writes_per_s"]
                out[f"floor_p50_{clients}_clients"] = floor["p50_ms"] / theirs["p50_ms"]
        if theirs["p50_ms"] > 0:
            out[f"p50_{clients}_clients"] = ours["p50_ms"] / theirs["p50_ms"]
            out[f"stream_p50_{clients}_clients"] = streamed["p50_ms"] / theirs["p50_ms"]
    return out


def _targets(result: Mapping[str, Any]) -> dict[str, bool | None]:
    ratios = result["ratios"]
    kraft_points = {p["clients"]: p for p in result["throughput"]["kraft"]["points"]}
    failover = {f["profile"]: f for f in result["failover"]}
    batched = result["throughput"]["kraft"]["batched"]
    default = failover.get("default")
    fast = failover.get("fast")
    return {
        "1_throughput_64_clients_ge_etcd": (ratios["writes_per_s_64_clients"] >= 1.0) if ratios else None,
        "1_batched_ge_100k_records_per_s": batched["records_per_s"] >= 100_000,
        "2_p50_1_client_le_1_5x_etcd": (ratios["p50_1_clients"] <= 1.5) if ratios else None,
        "2_p99_1_client_le_5ms": kraft_points[1]["p99_ms"] <= 5.0,
        "3_failover_default_p50_le_1500ms": default["p50_ms"] <= 1500 if default else None,
        "3_failover_fast_p50_le_250ms": fast["p50_ms"] <= 250 if fast else None,
        "3_failover_fast_p99_le_600ms": fast["p99_ms"] <= 600 if fast else None,
    }


def format_table(result: Mapping[str, Any]) -> str:
    """The human-readable summary printed after a run (and pasted into reports)."""
    lines = [
        "| clients | kraft unary writes/s | p50 / p99 ms | kraft stream writes/s | p50 / p99 ms "
        "| etcd writes/s | p50 / p99 ms | floor writes/s | p50 / p99 ms | unary/etcd | stream/etcd "
        "| floor/etcd |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    throughput = result["throughput"]
    etcd_points = throughput["etcd"] or []
    floor_points = throughput.get("grpc_aio_floor") or []

    def ratio(key: str) -> str:
        value = result["ratios"].get(key)
        return "-" if value is None else f"{value:.2f}"

    def cells(point: Mapping[str, Any] | None) -> str:
        if point is None:
            return "- | -"
        return f"{point['writes_per_s']:.0f} | {point['p50_ms']:.2f} / {point['p99_ms']:.2f}"

    for index, ours in enumerate(throughput["kraft"]["points"]):
        streamed = throughput["kraft"]["stream_points"][index]
        theirs = etcd_points[index] if index < len(etcd_points) else None
        floor = floor_points[index] if index < len(floor_points) else None
        clients = ours["clients"]
        lines.append(
            f"| {clients} | {cells(ours)} | {cells(streamed)} | {cells(theirs)} | {cells(floor)} | "
            f"{ratio(f'writes_per_s_{clients}_clients')} | "
            f"{ratio(f'stream_writes_per_s_{clients}_clients')} | "
            f"{ratio(f'floor_writes_per_s_{clients}_clients')} |"
        )
    batched = result["throughput"]["kraft"]["batched"]
    lines.append(
        f"\nbatched: {batched['records_per_s']:.0f} records/s "
        f"({batched['records_per_request']} records/request, {batched['clients']} clients)"
    )
    for fail in result["failover"]:
        lines.append(
            f"failover {fail['profile']}: min {fail['min_ms']:.0f} ms, p50 {fail['p50_ms']:.0f} ms, "
            f"p99 {fail['p99_ms']:.0f} ms, max {fail['max_ms']:.0f} ms ({fail['trials']} trials)"
        )
    lines.append("targets: " + ", ".join(f"{k}={v}" for k, v in result["targets"].items()))
    return "\n".join(lines)


TLS_CONCURRENCY = (1, 64)


async def _tls_points(
    targets: Mapping[str, tuple[str, str, ChannelSecurity]], duration_s: float, warmup_s: float, repeats: int
) -> dict[str, list[dict[str, Any]]]:
    """Unary TestAppend against each quorum (PLAINTEXT, SSL), alternating runs so load hits both alike."""
    writers = {
        name: KraftWriter(target, cluster_id, security)
        for name, (target, cluster_id, security) in targets.items()
    }
    points: dict[str, list[dict[str, Any]]] = {name: [] for name in writers}
    try:
        for clients in TLS_CONCURRENCY:
            runs: dict[str, list[LoadResult]] = {name: [] for name in writers}
            for _ in range(repeats):
                for name, writer in writers.items():
                    runs[name].append(await closed_loop(writer.write_one, clients, duration_s, warmup_s))
            for name in writers:
                points[name].append(_median_point(runs[name]))
    finally:
        for writer in writers.values():
            await writer.close()
    return points


def bench_tls(work_dir: Path, duration_s: float, warmup_s: float, repeats: int) -> dict[str, Any]:
    """The same quorum over PLAINTEXT and over mutual TLS (Raft between controllers and the client
    link); TLS cost = 1 - TLS/PLAINTEXT throughput at 64 clients and the 1-client p50 difference."""
    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(ControllerQuorum(work_dir / "plain", overrides=THROUGHPUT_PROFILE))
        tls = stack.enter_context(ControllerQuorum(work_dir / "tls", overrides=THROUGHPUT_PROFILE, tls=True))
        plain.start()
        tls.start()
        targets = {
            name: (q.nodes[q.wait_for_leader(30).node_id].target, q.cluster_id, q.client_security())
            for name, q in (("plaintext", plain), ("tls", tls))
        }
        points = asyncio.run(_tls_points(targets, duration_s, warmup_s, repeats))
    by_clients = {name: {p["clients"]: p for p in pts} for name, pts in points.items()}
    high = max(TLS_CONCURRENCY)
    throughput_cost = (
        1 - by_clients["tls"][high]["writes_per_s"] / by_clients["plaintext"][high]["writes_per_s"]
    )
    p50_cost_ms = by_clients["tls"][1]["p50_ms"] - by_clients["plaintext"][1]["p50_ms"]
    return {
        "points": points,
        f"throughput_cost_{high}_clients": round(throughput_cost, 4),
        "p50_cost_1_client_ms": round(p50_cost_ms, 4),
        "targets": {
            f"tls_throughput_cost_{high}_clients_le_15pct": throughput_cost <= 0.15,
            "tls_p50_cost_1_client_le_0_3ms": p50_cost_ms <= 0.3,
        },
    }


def format_tls(result: Mapping[str, Any]) -> str:
    lines = ["TLS vs PLAINTEXT (unary TestAppend, 256-byte records)"]
    for name, pts in result["points"].items():
        for p in pts:
            lines.append(
                f"  {name:<9} clients={p['clients']:<3} {p['writes_per_s']:>9.0f} writes/s "
                f"p50={p['p50_ms']:.3f} ms p99={p['p99_ms']:.3f} ms errors={p['errors']}"
            )
    costs = {k: v for k, v in result.items() if k.startswith(("throughput_cost", "p50_cost"))}
    lines.append("  " + ", ".join(f"{k}={v}" for k, v in costs.items()))
    lines.append("  targets: " + ", ".join(f"{k}={v}" for k, v in result["targets"].items()))
    return "\n".join(lines)


def run(
    quick: bool = False,
    results_path: Path = RESULTS_PATH,
    point_s: float | None = None,
    failover_trials: int | None = None,
) -> dict[str, Any]:
    """Run every point, write ``results_path`` and return the result document.  ``point_s`` and
    ``failover_trials`` shrink a run below ``--quick`` (bench.device_suite's smoke run)."""
    duration_s, warmup_s, trials, batch, repeats = (2.0, 0.5, 3, 500, 1) if quick else (3.0, 0.5, 10, 1000, 3)
    if point_s is not None:
        duration_s, warmup_s = point_s, min(warmup_s, point_s / 2)
    if failover_trials is not None:
        trials = failover_trials
    started = time.time()
    with tempfile.TemporaryDirectory(prefix="kraft-bench-raft-") as tmp:
        work_dir = Path(tmp)
        throughput = bench_throughput(work_dir, duration_s, warmup_s, batch, repeats)
        failover = [bench_failover(work_dir, profile, trials) for profile in FAILOVER_PROFILES]
    result: dict[str, Any] = {
        "benchmark": "raft",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1),
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "quick": quick,
        "point_s": duration_s,
        "failover_trials": trials,
        # What kraft's controller processes (and the floor server) run on; the client side (etcd's and
        # kraft's alike) stays on gRPC's defaults.  KRAFT_GRPC_IO=iomgr in the environment switches them.
        "kraft_grpc_io": configure_grpc_io(dict(os.environ)),
        "record_bytes": len(VALUE),
        "throughput": throughput,
        "failover": failover,
    }
    result["ratios"] = _ratios(throughput)
    result["targets"] = _targets(result)
    results_path.parent.mkdir(parents=True, exist_ok=True)
    results_path.write_text(json.dumps(result, indent=2) + "\n")
    return result


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.raft", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="short points and 3 failover trials")
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    parser.add_argument("--point-s", type=float, help="seconds per throughput point (default 3; --quick 2)")
    parser.add_argument(
        "--failover-trials", type=int, help="SIGKILL trials per failover profile (default 10; --quick 3)"
    )
    parser.add_argument(
        "--tls", action="store_true", help="only compare PLAINTEXT with mutual TLS (writes raft-tls.json)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override for every quorum of the run (A/B runs), e.g. "
        "controller.request.intake.thread=false",
    )
    args = parser.parse_args(argv)
    for setting in args.set:
        key, sep, value = setting.partition("=")
        if not sep or not key:
            parser.error(f"--set wants KEY=VALUE, got {setting!r}")
        for profile in (THROUGHPUT_PROFILE, *FAILOVER_PROFILES.values()):
            profile[key] = value
    if args.tls:
        duration_s, warmup_s, repeats = (2.0, 0.5, 1) if args.quick else (3.0, 0.5, 3)
        started, load_before = time.time(), os.getloadavg()
        with tempfile.TemporaryDirectory(prefix="kraft-bench-tls-") as tmp:
            tls_result = bench_tls(Path(tmp), duration_s, warmup_s, repeats)
        tls_result = {
            "benchmark": "raft-tls",
            "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
            "duration_s": round(time.time() - started, 1),
            "machine": {
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(),
                # A shared host: the 1/5/15-minute load averages around the run say how comparable it is.
                "load_average_before": [round(v, 2) for v in load_before],
                "load_average_after": [round(v, 2) for v in os.getloadavg()],
            },
            "quick": args.quick,
            "record_bytes": len(VALUE),
            **tls_result,
        }
        out = args.out.with_name("raft-tls.json") if args.out == RESULTS_PATH else args.out
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(tls_result, indent=2) + "\n")
        print(format_tls(tls_result))
        print(f"results: {out}")
        return 0
    if args.point_s is not None and args.point_s <= 0:
        parser.error("--point-s must be positive")
    if args.failover_trials is not None and args.failover_trials < 1:
        parser.error("--failover-trials must be at least 1")
    result = run(args.quick, args.out, args.point_s, args.failover_trials)
    print(format_table(result))
    print(f"results: {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
