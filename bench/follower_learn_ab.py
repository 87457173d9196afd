"""When followers learn a commit, and what that costs, for two source trees side by side (issue #17).

Two Raft-only 3-controller quorums (:mod:`bench.raft_ab`'s setup: ``bench.raft``'s profile, shipped
defaults, ``fetch_max_wait`` 500 ms), quorum A running ``TREE_A``'s code and quorum B ``TREE_B``'s, measured
in alternating windows (A, B, B, A, …) so both see the same host load.  Per window and side:

- **learn**: ``--writes`` lone writes (``TestAppend`` of one record to the leader, then an idle gap so the
  followers' long polls park), each followed by polling both followers' ``TestDigest`` every
  ``POLL_INTERVAL_S`` until their listeners applied the record: the time from the write's answer to each
  follower's apply (p50/p99/max over both followers), and the leader's/followers' CPU per lone write;
- **load**: a closed-loop window of ``--clients`` clients writing one record each (``bench.raft``'s
  ``closed_loop``): writes/s, p50/p99 and the leader's/followers' CPU (``/proc``) per write.

Run under ``flock /tmp/kraft-bench.lock``, without ``PYTHONPATH`` (the controllers would inherit it):
``python -m bench.follower_learn_ab TREE_A TREE_B [--pairs N] [--writes K] [--clients C] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.admin_ab import code_of, cpu_seconds
from bench.raft import THROUGHPUT_PROFILE, KraftWriter, closed_loop
from kraft.client.channel import open_channel
from kraft.cluster.quorum import ControllerQuorum
from kraft.procutil import reap_children_on_exit
from kraft.v1 import raft_pb2, raft_pb2_grpc

_SIDES = ("A", "B")
POLL_INTERVAL_S = 0.002
"""How often a follower's applied offset is read: the resolution of the learn times."""
IDLE_GAP_S = 0.05
"""After a write is applied everywhere: long enough for the followers' next long polls to park."""
LEARN_TIMEOUT_S = 3.0
"""A follower that has not applied a write by then counts as this (far above any long poll)."""


class Side:
    def __init__(self, quorum: ControllerQuorum) -> None:
        leader = quorum.wait_for_leader(30).node_id
        self.writer = KraftWriter(quorum.nodes[leader].target, quorum.cluster_id)
        self.cluster_id = quorum.cluster_id
        pids = {node_id: node.pid for node_id, node in quorum.nodes.items() if node.pid is not None}
        self.leader_pid = pids[leader]
        self.follower_pids = [pid for node_id, pid in pids.items() if node_id != leader]
        self.channels = [
            open_channel(node.target) for node_id, node in quorum.nodes.items() if node_id != leader
        ]
        self.digests: list[raft_pb2_grpc.RaftTestServiceAsyncStub] = [
            raft_pb2_grpc.RaftTestServiceStub(channel) for channel in self.channels
        ]

    async def applied(self, stub: raft_pb2_grpc.RaftTestServiceAsyncStub) -> int:
        request = raft_pb2.TestDigestRequest(cluster_id=self.cluster_id)
        response: raft_pb2.TestDigestResponse = await stub.TestDigest(request, timeout=5.0)
        return int(response.applied_offset)

    def cpu(self) -> tuple[float, float]:
        return cpu_seconds(self.leader_pid), sum(cpu_seconds(pid) for pid in self.follower_pids)

    async def close(self) -> None:
        await self.writer.close()
        for channel in self.channels:
            await channel.close(grace=None)


async def _learn_one(side: Side) -> list[float]:
    """One lone write; the seconds from its answer until each follower applied it."""
    response = await side.writer.append([b"v" * 256])
    answered = time.perf_counter()
    offset = int(response.last_offset)
    took: list[float] = []
    for stub in side.digests:
        while await side.applied(stub) <= offset:
            if time.perf_counter() - answered > LEARN_TIMEOUT_S:
                break
            await asyncio.sleep(POLL_INTERVAL_S)
        took.append(time.perf_counter() - answered)
    return took


async def _learn_window(side: Side, writes: int) -> dict[str, Any]:
    load = os.getloadavg()[0]
    times: list[float] = []
    busy_s = 0.0
    leader_cpu = follower_cpu = 0.0
    for _ in range(writes):
        await asyncio.sleep(IDLE_GAP_S)
        leader_before, followers_before = side.cpu()
        began = time.perf_counter()
        times += await _learn_one(side)
        busy_s += time.perf_counter() - began
        leader_after, followers_after = side.cpu()
        leader_cpu += leader_after - leader_before
        follower_cpu += followers_after - followers_before
    times.sort()
    return {
        "learn_p50_ms": round(statistics.median(times) * 1000, 2),
        "learn_p99_ms": round(times[min(len(times) - 1, int(len(times) * 0.99))] * 1000, 2),
        "learn_max_ms": round(times[-1] * 1000, 2),
        # CPU from each write until both followers applied it (the digest polls' share included, alike
        # on both sides): the lone write's own cost, HW answers included.
        "lone_leader_cpu_us": round(leader_cpu / writes * 1e6),
        "lone_followers_cpu_us": round(follower_cpu / writes * 1e6),
        "load_1m": round(load, 2),
    }


async def _load_window(side: Side, clients: int, seconds: float) -> dict[str, Any]:
    load = os.getloadavg()[0]
    leader_before, followers_before = side.cpu()
    result = await closed_loop(side.writer.write_one, clients, seconds, 0.3)
    leader_after, followers_after = side.cpu()
    ops = max(result.ops, 1)
    return {
        "writes_per_s": round(result.ops / seconds),
        "p50_ms": round(result.p50_ms, 3),
        "p99_ms": round(result.p99_ms, 3),
        "leader_cpu_us": round((leader_after - leader_before) / ops * 1e6),
        "followers_cpu_us": round((followers_after - followers_before) / ops * 1e6),
        "load_1m": round(load, 2),
    }


async def _windows(
    quorums: dict[str, ControllerQuorum], pairs: int, writes: int, clients: list[int], seconds: float
) -> dict[str, Any]:
    sides: dict[str, Side] = {}
    rows: dict[str, list[dict[str, Any]]] = {side: [] for side in _SIDES}
    try:
        for name, quorum in quorums.items():
            side = sides[name] = Side(quorum)
            await closed_loop(side.writer.write_one, 1, 1.0, 0.2)  # warm-up
            for stub in side.digests:
                await side.applied(stub)  # registers the digest listener (it replays the log once)
        for index in range(pairs):
            for name in _SIDES if index % 2 == 0 else tuple(reversed(_SIDES)):
                side = sides[name]
                row: dict[str, Any] = {"learn": await _learn_window(side, writes)}
                for count in clients:
                    row[f"load_{count}"] = await _load_window(side, count, seconds)
                rows[name].append(row)
                print(f"pair {index} {name}: {json.dumps(row)}", flush=True)
    finally:
        for side in sides.values():
            await side.close()
    summary: dict[str, dict[str, Any]] = {}
    for name in _SIDES:
        if not rows[name]:
            continue
        summary[name] = {
            part: {
                key: round(statistics.median(row[part][key] for row in rows[name]), 3)
                for key in rows[name][0][part]
            }
            for part in rows[name][0]
        }
    better = {
        f"{part}.{key}": sum(
            1 for a, b in zip(rows["A"], rows["B"], strict=True) if b[part][key] < a[part][key]
        )
        for part, key in [("learn", "learn_p50_ms")] + [(f"load_{count}", "p50_ms") for count in clients]
    }
    return {"summary": summary, "b_lower_pairs": better, "rows": rows}


def run(
    tree_a: Path, tree_b: Path, pairs: int, writes: int, clients: list[int], seconds: float
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kraft-bench-follower-learn-") as tmp:
        quorums: dict[str, ControllerQuorum] = {}
        try:
            for name, tree in zip(_SIDES, (tree_a, tree_b), strict=True):
                quorum = ControllerQuorum(Path(tmp) / name, overrides=dict(THROUGHPUT_PROFILE))
                quorums[name] = quorum
                with code_of(tree):
                    quorum.start()
            result = asyncio.run(_windows(quorums, pairs, writes, clients, seconds))
        finally:
            for quorum in quorums.values():
                quorum.close()
    result["trees"] = {"A": str(tree_a), "B": str(tree_b)}
    result["settings"] = {"pairs": pairs, "writes": writes, "clients": clients, "seconds": seconds}
    return result


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no controller outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(
        prog="python -m bench.follower_learn_ab", description=__doc__.splitlines()[0]
    )
    parser.add_argument("tree_a", type=Path, help="repository root whose code quorum A runs (the base)")
    parser.add_argument("tree_b", type=Path, help="repository root whose code quorum B runs (the change)")
    parser.add_argument("--pairs", type=int, default=4, help="alternated pairs of windows (default 4)")
    parser.add_argument("--writes", type=int, default=20, help="lone writes per learn window (default 20)")
    parser.add_argument(
        "--clients", type=int, nargs="*", default=[1, 64], help="closed-loop client counts (default 1 64)"
    )
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each load window (default 3)")
    parser.add_argument("--out", type=Path, help="also write the result JSON there")
    args = parser.parse_args(argv)
    result = run(args.tree_a, args.tree_b, args.pairs, args.writes, args.clients, args.seconds)
    print(json.dumps({"summary": result["summary"], "b_lower_pairs": result["b_lower_pairs"]}, indent=2))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
