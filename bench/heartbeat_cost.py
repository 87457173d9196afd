"""What a BrokerHeartbeat that changes nothing costs the active controller (issue #17, session 12).

For each configuration (a source tree, optionally with controller config overrides) a fresh 3-node
quorum is started with N registered brokers heartbeating every 2 s and no admin calls; after a short
warm-up, windows of the leader's main-thread CPU, process CPU and main-thread voluntary context switches
(wake-ups) are taken and divided by the heartbeats the fleet got answered in them.  Configurations run in
turn, their order reversed every round (A B C | C B A ...), one quorum at a time, so that the host's
speed drifts (raft-performance.md "CPU-speed probe") fall on all of them alike.  Each window also keeps
its errors by kind (a client-side DEADLINE_EXCEEDED is told from an answer's error), the heartbeats' p99
and ``run_cores``: the CPU of the bench, its nodes and their intake processes — at ~1.7 of a 2-core host's
2, other load on the host starves the quorum ("Heartbeat errors under intake processes (session 14)").

    python -m bench.heartbeat_cost --brokers 1000 --rounds 3 \\
        base=/path/to/base-tree new=. bridge=.,controller.broker.heartbeats.on.intake=true

A ``bench.heartbeat.stream=false`` item is the bench's own, not the quorum's: the fleet sends each
heartbeat as a unary call instead of over one BrokerHeartbeatStream per broker (session 15; a broker's
default, and the fleet's, is the stream).

docs/internals/raft-performance.md "What a heartbeat costs the leader (session 12)".
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.admin_ab import code_of, cpu_seconds, main_thread_cpu_seconds, main_thread_switches
from bench.controller import PROFILE
from bench.controller_fleet import Fleet, gather_limited
from kraft.client.admin import AdminClient
from kraft.clock import SystemClock
from kraft.cluster.quorum import ControllerQuorum
from kraft.procutil import reap_children_on_exit

INTERVAL_S = 2.0
WARM_S = 3.0


def tree_cpu_seconds(root: int) -> float:
    """CPU seconds of ``root`` and every process under it (the bench, its quorum's nodes and their intake
    processes): with the host's cores, what the run itself asks of them."""
    total, todo = 0.0, [root]
    while todo:
        pid = todo.pop()
        with contextlib.suppress(OSError):  # a process that ended meanwhile
            total += cpu_seconds(pid)
            for task in os.listdir(f"/proc/{pid}/task"):
                todo.extend(
                    int(child) for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                )
    return total


def parse_config(spec: str) -> tuple[str, Path, dict[str, str]]:
    """``NAME=TREE[,KEY=VALUE...]``."""
    name, _, rest = spec.partition("=")
    tree, *sets = rest.split(",")
    if not name or not tree:
        raise argparse.ArgumentTypeError(f"{spec!r}: want NAME=TREE[,KEY=VALUE...]")
    return name, Path(tree).resolve(), dict(item.split("=", 1) for item in sets)


BENCH_STREAM_KEY = "bench.heartbeat.stream"


async def _measure(
    quorum: ControllerQuorum, brokers: int, windows: int, seconds: float, stream: bool = True
) -> list[dict[str, Any]]:
    quorum.wait_for_leader(timeout_s=60)
    targets = [node.target for node in quorum.nodes.values()]
    client = AdminClient(targets, timeout_s=30, clock=SystemClock())
    beats = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
    fleet = Fleet(client, beats, quorum.cluster_id, interval_s=INTERVAL_S, heartbeat_stream=stream)
    await gather_limited(32, [fleet.register(b) for b in range(1, brokers + 1)])
    tasks = [asyncio.create_task(fleet.run_one(b, b * INTERVAL_S / brokers)) for b in range(1, brokers + 1)]
    rows: list[dict[str, Any]] = []
    try:
        await asyncio.sleep(WARM_S)
        pid = quorum.nodes[quorum.wait_for_leader(timeout_s=10).node_id].pid
        assert pid is not None
        for _ in range(windows):
            answered, errors, kinds = len(fleet.latencies), fleet.errors, fleet.error_kinds.copy()
            cpu, main, switches = cpu_seconds(pid), main_thread_cpu_seconds(pid), main_thread_switches(pid)
            everything, leader_tree = tree_cpu_seconds(os.getpid()), tree_cpu_seconds(pid)
            started = time.monotonic()
            await asyncio.sleep(seconds)
            wall = time.monotonic() - started
            main_s = main_thread_cpu_seconds(pid) - main
            woken = main_thread_switches(pid) - switches
            count = max(1, len(fleet.latencies) - answered)
            latencies = sorted(beat.latency for beat in fleet.latencies[answered:])
            rows.append(
                {
                    "heartbeats_per_s": round(count / wall),
                    "errors": fleet.errors - errors,
                    "error_kinds": dict(fleet.error_kinds - kinds),
                    "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1e3, 1) if latencies else None,
                    "run_cores": round((tree_cpu_seconds(os.getpid()) - everything) / wall, 2),
                    "leader_main_thread_cpu_ms_per_s": round(main_s * 1e3 / wall, 1),
                    "leader_cpu_ms_per_s": round((cpu_seconds(pid) - cpu) * 1e3 / wall, 1),
                    # the leader with its intake processes (controller.intake.processes): where the
                    # calls a proxy forwards are paid for twice
                    "leader_tree_cpu_ms_per_s": round((tree_cpu_seconds(pid) - leader_tree) * 1e3 / wall, 1),
                    "leader_main_thread_wakeups_per_s": round(woken / wall),
                    "main_thread_cpu_us_per_heartbeat": round(main_s * 1e6 / count),
                    "wakeups_per_heartbeat": round(woken / count, 2),
                    "load_1m": round(os.getloadavg()[0], 2),
                }
            )
    finally:
        fleet.stopped.update(fleet.epochs)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await fleet.close_streams()
        await beats.close()
        await client.close()
    return rows


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def run(
    configs: list[tuple[str, Path, dict[str, str]]], brokers: int, rounds: int, windows: int, seconds: float
) -> dict[str, Any]:
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in configs}
    for index in range(rounds):
        for name, tree, sets in configs if index % 2 == 0 else list(reversed(configs)):
            with tempfile.TemporaryDirectory(prefix="kraft-bench-hbcost-") as tmp:
                overrides = {key: value for key, value in sets.items() if key != BENCH_STREAM_KEY}
                stream = sets.get(BENCH_STREAM_KEY, "true").lower() != "false"
                quorum = ControllerQuorum(Path(tmp), overrides={**PROFILE, **overrides}, test_append=False)
                try:
                    with code_of(tree):
                        quorum.start()
                    got = asyncio.run(_measure(quorum, brokers, windows, seconds, stream))
                finally:
                    quorum.close()
            for row in got:
                row["round"] = index
            rows[name].extend(got)
            print(f"round {index} {name}: {got}", flush=True)
    keys = (
        "main_thread_cpu_us_per_heartbeat",
        "wakeups_per_heartbeat",
        "leader_cpu_ms_per_s",
        "leader_tree_cpu_ms_per_s",
        "run_cores",
        "p99_ms",
        "load_1m",
    )
    summary = {
        name: {key: _median([row[key] for row in side if row[key] is not None]) for key in keys}
        for name, side in rows.items()
        if side
    }
    return {
        "brokers": brokers,
        "interval_s": INTERVAL_S,
        "configs": {name: {"tree": str(tree), "overrides": sets} for name, tree, sets in configs},
        "summary": summary,
        "rows": rows,
    }


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # the quorums it starts die with it (kraft.procutil)
    parser = argparse.ArgumentParser(
        prog="python -m bench.heartbeat_cost", description=__doc__.split("\n")[0]
    )
    parser.add_argument("configs", nargs="+", type=parse_config, help="NAME=TREE[,KEY=VALUE...]")
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="rounds, the order reversed in every other one")
    parser.add_argument("--windows", type=int, default=2, help="measured windows per quorum")
    parser.add_argument("--seconds", type=float, default=4.0, help="length of each window")
    parser.add_argument("--out", type=Path, help="also write the result JSON there")
    args = parser.parse_args(argv)
    result = run(args.configs, args.brokers, args.rounds, args.windows, args.seconds)
    text = json.dumps(result, indent=1)
    print(json.dumps(result["summary"], indent=1))
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
