"""One client's latency against a quorum's leader, for intake processes (issue #17, session 11).

Three kinds of sequential call, alternated in rounds: ``TestAppend`` (a unary write: commit), the same
values over one ``TestAppendStream`` (commit, no per-call setup), and ``TestDigest`` — a call that commits
nothing, so through an intake process it measures the extra hop alone.  Comparing a configuration with
intake processes against ``controller.intake.processes=0`` tells how much of a lone write's extra latency
is the hop of the client's own call and how much the commit path's (docs/internals/raft-performance.md,
"Intake processes, phase 2").

Run: ``python -m bench.intake_latency [--calls N] [--rounds R] [--set KEY=VALUE ...] [--label L]``; prints
one JSON line (p50/p90 ms per kind and the load average).  Environment choices (``KRAFT_GRPC_IO``,
``KRAFT_INTAKE_GRPC_IO``) reach the quorum's processes as they are.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc.aio

from kraft.cluster.quorum import ControllerQuorum
from kraft.procutil import reap_children_on_exit
from kraft.v1 import raft_pb2, raft_pb2_grpc

WARMUP_CALLS = 50
CALL_TIMEOUT_S = 5.0
KINDS = ("unary", "stream", "digest")


async def probe(target: str, cluster_id: str, calls: int, rounds: int) -> dict[str, list[float]]:
    """Milliseconds per call of each kind, ``calls`` of each per round."""
    out: dict[str, list[float]] = {kind: [] for kind in KINDS}
    async with grpc.aio.insecure_channel(target) as channel:
        stub = raft_pb2_grpc.RaftTestServiceStub(channel)
        for _ in range(WARMUP_CALLS):
            await stub.TestAppend(
                raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[b"w"]), timeout=CALL_TIMEOUT_S
            )
        for _ in range(rounds):
            for _ in range(calls):
                started = time.perf_counter()
                await stub.TestAppend(
                    raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[b"x"]), timeout=CALL_TIMEOUT_S
                )
                out["unary"].append((time.perf_counter() - started) * 1e3)
            stream: Any = stub.TestAppendStream(None, timeout=CALL_TIMEOUT_S * calls)
            for _ in range(calls):
                started = time.perf_counter()
                await stream.write(raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[b"s"]))
                await stream.read()
                out["stream"].append((time.perf_counter() - started) * 1e3)
            await stream.done_writing()
            for _ in range(calls):
                started = time.perf_counter()
                digest = raft_pb2.TestDigestRequest(cluster_id=cluster_id)
                await stub.TestDigest(digest, timeout=CALL_TIMEOUT_S)
                out["digest"].append((time.perf_counter() - started) * 1e3)
    return out


def summarize(samples: list[float]) -> dict[str, float]:
    ordered = sorted(samples)
    return {"p50": round(statistics.median(ordered), 3), "p90": round(ordered[int(len(ordered) * 0.9)], 3)}


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # whatever it starts ends with it (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.intake_latency", description=__doc__)
    parser.add_argument("--calls", type=int, default=200, help="calls of each kind per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--label", default="")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override")
    args = parser.parse_args(argv)
    overrides = {"log.level": "WARNING"}
    for setting in args.set:
        key, sep, value = setting.partition("=")
        if not sep:
            parser.error(f"--set wants KEY=VALUE, got {setting!r}")
        overrides[key] = value
    with (
        tempfile.TemporaryDirectory(prefix="kraft-intake-latency-") as work_dir,
        ControllerQuorum(Path(work_dir) / "kraft", overrides=overrides) as quorum,
    ):
        quorum.start()
        target = quorum.nodes[quorum.wait_for_leader(30).node_id].target
        samples = asyncio.run(probe(target, quorum.cluster_id, args.calls, args.rounds))
    with open("/proc/loadavg") as loadavg:
        load = loadavg.read().split()[:3]
    result = {"label": args.label, "overrides": overrides, "load": load}
    result.update({kind: summarize(values) for kind, values in samples.items()})
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
