"""The bulk creation end to end on two source trees side by side (session 16; issue #17).

Two 3-controller quorums (``bench.controller``'s profile), quorum A running ``TREE_A``'s code and quorum B
``TREE_B``'s, each with ``--brokers`` brokers registered and unfenced once (the broker session timeout
raised to 10 minutes, so they stay unfenced without heartbeats), then in alternating rounds (A B | B A | …)
one CreateTopics of ``--topics`` topics x ``--per-topic`` partitions (RF 3) — ``bench.controller``'s bulk
phase, by default without the fleet's heartbeats, so what is timed is the quorum's own creation path: the
leader's plans, preparation and writes, the followers' replication and replay, the commits (``--fleet``: the
brokers heartbeat every 2 s all the same, and each round reports the heartbeats sent during its creation).
Every round creates new names, so the n-th round of both sides starts from the same image size.  Per round
and side: the seconds, each controller's CPU (``/proc``) and the leader's main thread's.

Run under ``flock /tmp/kraft-bench.lock``, without ``PYTHONPATH`` (the controllers would inherit it):
``python -m bench.bulk_create_ab TREE_A TREE_B [--pairs N] [--brokers B] [--out PATH]``, and
``--set-a``/``--set-b KEY=VALUE``: a controller config override for that side only (an A/B of one tree).
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

from bench.admin_ab import code_of, cpu_seconds, main_thread_cpu_seconds
from bench.controller import PROFILE, check_created
from bench.controller_fleet import Fleet, gather_limited
from kraft.client.admin import AdminClient
from kraft.clock import SystemClock
from kraft.cluster.quorum import ControllerQuorum
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb

_SIDES = ("A", "B")
SESSION_TIMEOUT_MS = 600_000
"""Brokers registered once stay unfenced this long without heartbeats (longer than any run)."""


async def _round(
    quorum: ControllerQuorum,
    client: AdminClient,
    topics: int,
    per_topic: int,
    prefix: str,
    fleet: Fleet | None = None,
) -> dict[str, Any]:
    leader = quorum.wait_for_leader(timeout_s=10).node_id
    pids = {node_id: node.pid for node_id, node in quorum.nodes.items() if node.pid is not None}
    request = cpb.CreateTopicsRequest(
        topics=[
            cpb.CreatableTopic(name=f"{prefix}-{i}", num_partitions=per_topic, replication_factor=3)
            for i in range(topics)
        ]
    )
    load = os.getloadavg()[0]
    cpu_before = {node_id: cpu_seconds(pid) for node_id, pid in pids.items()}
    main_before = main_thread_cpu_seconds(pids[leader])
    started = time.monotonic()
    check_created(await client.call(lambda s: s.CreateTopics, request))
    seconds = time.monotonic() - started
    cpu = {node_id: cpu_seconds(pid) - cpu_before[node_id] for node_id, pid in pids.items()}
    row: dict[str, Any] = {
        "seconds": round(seconds, 3),
        "leader_cpu_s": round(cpu[leader], 3),
        "leader_main_thread_cpu_s": round(main_thread_cpu_seconds(pids[leader]) - main_before, 3),
        "followers_cpu_s": [round(v, 3) for k, v in sorted(cpu.items()) if k != leader],
        "load_1m": round(load, 2),
    }
    if fleet is not None:  # the heartbeats sent during the creation
        beats = fleet.window(started, started + seconds)
        row["heartbeat_p50_ms"] = beats["p50_ms"]
        row["heartbeat_p99_ms"] = beats["p99_ms"]
        row["heartbeat_p99_ms_less_client_lag"] = beats.get("client", {}).get("p99_ms_less_client_lag")
        row["heartbeat_errors"] = fleet.errors
    return row


async def _run(
    quorums: dict[str, ControllerQuorum],
    pairs: int,
    brokers: int,
    topics: int,
    per_topic: int,
    heartbeating: bool = False,
) -> dict[str, Any]:
    clients: dict[str, AdminClient] = {}
    beats: dict[str, AdminClient] = {}
    fleets: dict[str, Fleet] = {}
    heartbeats: list[asyncio.Task[None]] = []
    rows: dict[str, list[dict[str, Any]]] = {side: [] for side in _SIDES}
    try:
        for side, quorum in quorums.items():
            quorum.wait_for_leader(timeout_s=60)
            targets = [node.target for node in quorum.nodes.values()]
            clients[side] = AdminClient(targets, timeout_s=60, clock=SystemClock())
            beats[side] = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
            fleet = fleets[side] = Fleet(clients[side], beats[side], quorum.cluster_id, interval_s=2.0)
            await gather_limited(32, [fleet.register(b) for b in range(1, brokers + 1)])
            if heartbeating:  # every broker heartbeats every 2 s, spread over the interval (bench.admin_ab)
                heartbeats.extend(
                    asyncio.create_task(fleet.run_one(b, b * fleet.interval_s / brokers))
                    for b in range(1, brokers + 1)
                )
        for index in range(pairs):
            for side in _SIDES if index % 2 == 0 else tuple(reversed(_SIDES)):
                fleet_or_none = fleets[side] if heartbeating else None
                row = await _round(
                    quorums[side], clients[side], topics, per_topic, f"r{index}", fleet_or_none
                )
                rows[side].append(row)
                print(f"pair {index} {side}: {row}", flush=True)
    finally:
        for fleet in fleets.values():
            fleet.stopped.update(fleet.epochs)
        for task in heartbeats:
            task.cancel()
        await asyncio.gather(*heartbeats, return_exceptions=True)
        for fleet in fleets.values():
            await fleet.close_streams()
        for client in (*beats.values(), *clients.values()):
            await client.close()
    keys = ["seconds", "leader_cpu_s", "leader_main_thread_cpu_s", "load_1m"]
    if heartbeating:
        keys += ["heartbeat_p50_ms", "heartbeat_p99_ms"]
    summary = {
        side: {key: round(statistics.median(row[key] for row in rows[side]), 3) for key in keys}
        for side in _SIDES
        if rows[side]
    }
    b_faster = sum(1 for a, b in zip(rows["A"], rows["B"], strict=True) if b["seconds"] < a["seconds"])
    return {"summary": summary, "b_faster_pairs": b_faster, "rows": rows}


def run(
    tree_a: Path,
    tree_b: Path,
    pairs: int,
    brokers: int,
    topics: int,
    per_topic: int,
    sets: dict[str, dict[str, str]] | None = None,
    heartbeating: bool = False,
) -> dict[str, Any]:
    overrides = {**PROFILE, "broker.session.timeout.ms": str(SESSION_TIMEOUT_MS)}
    with tempfile.TemporaryDirectory(prefix="kraft-bench-bulk-create-ab-") as tmp:
        quorums: dict[str, ControllerQuorum] = {}
        try:
            for side, tree in zip(_SIDES, (tree_a, tree_b), strict=True):
                side_overrides = {**overrides, **(sets or {}).get(side, {})}
                quorum = ControllerQuorum(Path(tmp) / side, overrides=side_overrides, test_append=False)
                quorums[side] = quorum
                with code_of(tree):
                    quorum.start()
            return asyncio.run(_run(quorums, pairs, brokers, topics, per_topic, heartbeating))
        finally:
            for quorum in quorums.values():
                quorum.close()


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(
        prog="python -m bench.bulk_create_ab", description=__doc__.splitlines()[0]
    )
    parser.add_argument("tree_a", type=Path)
    parser.add_argument("tree_b", type=Path)
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--per-topic", type=int, default=1000)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--fleet",
        action="store_true",
        help="the brokers heartbeat every 2 s throughout (one fleet per quorum, from this process); each "
        "round also reports the heartbeats sent during its creation",
    )
    for side in ("a", "b"):
        parser.add_argument(
            f"--set-{side}",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"a config override of {side}",
        )
    args = parser.parse_args(argv)
    sets: dict[str, dict[str, str]] = {}
    for side, given in (("A", args.set_a), ("B", args.set_b)):
        for setting in given:
            key, sep, value = setting.partition("=")
            if not sep or not key:
                parser.error(f"--set-{side.lower()} wants KEY=VALUE, got {setting!r}")
            sets.setdefault(side, {})[key] = value
    load_before = os.getloadavg()
    result = run(
        args.tree_a, args.tree_b, args.pairs, args.brokers, args.topics, args.per_topic, sets, args.fleet
    )
    result.update(
        tree_a=str(args.tree_a),
        tree_b=str(args.tree_b),
        sets=sets,
        load_average_before=[round(x, 2) for x in load_before],
        load_average_after=[round(x, 2) for x in os.getloadavg()],
    )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
