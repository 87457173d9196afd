"""One-client unary TestAppend of two source trees side by side, in one run (issue #17).

``bench.raft``'s 1-client unary point (a bare Raft commit through ``TestAppend``) for two trees at once,
the way :mod:`bench.admin_ab` compares CreateTopics: two Raft-only 3-controller quorums (``bench.raft``'s
profile, ``kraft.test.append.enable``), quorum A running ``TREE_A``'s code and quorum B ``TREE_B``'s, then
one-client windows alternating A, B, B, A, … so both see the same host load.  Per window: p50/p99 of
the commit, and the CPU (``/proc``) of the leader, of its main thread and of both followers, per write.

Run under ``flock /tmp/kraft-bench.lock``, without ``PYTHONPATH`` (the controllers would inherit it and
both run that tree): ``python -m bench.raft_ab TREE_A TREE_B [--pairs N] [--seconds S] [--out PATH]``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.admin_ab import code_of, cpu_seconds, main_thread_cpu_seconds
from bench.raft import THROUGHPUT_PROFILE, KraftWriter, closed_loop
from kraft.cluster.quorum import ControllerQuorum
from kraft.procutil import reap_children_on_exit

_SIDES = ("A", "B")
_KEYS = ("p50_ms", "p99_ms", "leader_cpu_us", "leader_main_thread_cpu_us", "followers_cpu_us", "load_1m")


async def _windows(quorums: dict[str, ControllerQuorum], pairs: int, seconds: float) -> dict[str, Any]:
    writers: dict[str, tuple[KraftWriter, int, list[int]]] = {}
    rows: dict[str, list[dict[str, Any]]] = {side: [] for side in _SIDES}
    try:
        for side, quorum in quorums.items():
            leader = quorum.wait_for_leader(30).node_id
            pids = {node_id: node.pid for node_id, node in quorum.nodes.items() if node.pid is not None}
            writer = KraftWriter(quorum.nodes[leader].target, quorum.cluster_id)
            others = [pid for node_id, pid in pids.items() if node_id != leader]
            writers[side] = (writer, pids[leader], others)
            await closed_loop(writer.write_one, 1, 1.0, 0.2)  # warm-up
        for index in range(pairs):
            for side in _SIDES if index % 2 == 0 else tuple(reversed(_SIDES)):
                writer, leader_pid, follower_pids = writers[side]
                load = os.getloadavg()[0]
                cpu = cpu_seconds(leader_pid)
                main = main_thread_cpu_seconds(leader_pid)
                followers = sum(cpu_seconds(pid) for pid in follower_pids)
                result = await closed_loop(writer.write_one, 1, seconds, 0.3)
                ops = max(result.ops, 1)
                row = {
                    "p50_ms": round(result.p50_ms, 3),
                    "p99_ms": round(result.p99_ms, 3),
                    "ops": result.ops,
                    "leader_cpu_us": round((cpu_seconds(leader_pid) - cpu) / ops * 1e6),
                    "leader_main_thread_cpu_us": round(
                        (main_thread_cpu_seconds(leader_pid) - main) / ops * 1e6
                    ),
                    "followers_cpu_us": round(
                        (sum(cpu_seconds(pid) for pid in follower_pids) - followers) / ops * 1e6
                    ),
                    "load_1m": round(load, 2),
                }
                rows[side].append(row)
                print(f"pair {index} {side}: {row}", flush=True)
    finally:
        for writer, _leader, _followers in writers.values():
            await writer.close()
    summary = {
        side: {key: round(statistics.median(row[key] for row in rows[side]), 3) for key in _KEYS}
        for side in _SIDES
        if rows[side]
    }
    b_better = sum(1 for a, b in zip(rows["A"], rows["B"], strict=True) if b["p50_ms"] < a["p50_ms"])
    return {"summary": summary, "b_better_pairs": b_better, "rows": rows}


def run(tree_a: Path, tree_b: Path, pairs: int, seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kraft-bench-raft-ab-") as tmp:
        quorums: dict[str, ControllerQuorum] = {}
        try:
            for side, tree in zip(_SIDES, (tree_a, tree_b), strict=True):
                quorum = ControllerQuorum(Path(tmp) / side, overrides=dict(THROUGHPUT_PROFILE))
                quorums[side] = quorum
                with code_of(tree):
                    quorum.start()
            result = asyncio.run(_windows(quorums, pairs, seconds))
        finally:
            for quorum in quorums.values():
                quorum.close()
    result["trees"] = {"A": str(tree_a), "B": str(tree_b)}
    return result


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no controller outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.raft_ab", description=__doc__.splitlines()[0])
    parser.add_argument("tree_a", type=Path, help="repository root whose code quorum A runs (the base)")
    parser.add_argument("tree_b", type=Path, help="repository root whose code quorum B runs (the change)")
    parser.add_argument("--pairs", type=int, default=8, help="alternated pairs of windows (default 8)")
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each window (default 3)")
    parser.add_argument("--out", type=Path, help="also write the result JSON there")
    args = parser.parse_args(argv)
    result = run(args.tree_a, args.tree_b, args.pairs, args.seconds)
    summary = result["summary"]
    print(
        f"A p50={summary['A']['p50_ms']} ms  B p50={summary['B']['p50_ms']} ms  "
        f"(medians of {args.pairs} pairs; B better in {result['b_better_pairs']})"
    )
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
