"""One-client CreateTopics of two source trees side by side, in one run (issue #17).

On this shared 2-core host single ``bench.admin_latency`` runs scatter by ±0.3-0.5 ms between minutes,
more than a change on a lone write's path moves.  This benchmark starts two metadata quorums at once —
quorum A's controllers run the code of ``TREE_A``, quorum B's that of ``TREE_B`` (each controller process
starts with its tree as working directory, so ``python -m kraft.cli.main`` imports that tree) — prefills
both the same way (``bench.controller``'s 16-client ``admin_ops`` part, thousands of topics), then runs
short one-client CreateTopics windows alternating A, B, B, A, … so both see the same host load.  Per
window it reads the CPU (``/proc``, utime + stime) of every controller process (and of the leader's
main thread apart) and of this client, per CreateTopics, and the host's CPU speed from a probe beside the
run (:mod:`bench.cpu_probe`: ``speed_factor`` per window, 1.7 = the same CPU work took 1.7x as long; off
with ``--no-cpu-probe``).  Broker 1 is registered and heartbeats in both quorums, as in
``bench.controller`` (``--brokers N`` registers more).

The client code (this process) is the tree it is run from; only the controllers differ.  Run under
``flock /tmp/kraft-bench.lock``:
``python -m bench.admin_ab TREE_A TREE_B [--pairs N] [--seconds S] [--prefill S] [--brokers N] [--out PATH]``
(``--brokers``: that many brokers registered and heartbeating every 2 s in each quorum, not just broker 1).
``--set-a`` / ``--set-b KEY=VALUE`` add a controller config override to one side only: with the same tree
twice, an A/B of a switch (``. . --set-a controller.broker.heartbeats.on.intake=false``).  Per window the
leader's CPU and its main thread's wake-ups (voluntary context switches: each time its event loop slept
and was woken) are also given per second of the window, which with a fixed heartbeat rate is the fleet's
cost on the leader.

Quorum 1 runs ``TREE_A`` and quorum 2 ``TREE_B`` for the first half of the pairs; then both quorums are
restarted on their own data with the trees (and ``--set-a`` / ``--set-b``) swapped, warmed again, and the
second half runs (``--no-swap``: no swap).  Before session 16 a tree stayed on its quorum for the whole run,
and the quorums differ by more than most changes (which was prefilled first and to how many topics, which
started first, …): A = main, B = branch gave the branch 7 of 8 pairs where the same trees swapped gave it
3 of 6.  The result keeps ``summary`` per tree (``A``, ``B``, each over both quorums), adds
``summary_by_quorum`` (``1``, ``2``: the bias that cancels) and ``summary_by_tree_and_quorum``, and every
row names its ``tree`` and ``quorum``.
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
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import kraft.cluster.quorum as quorum_module
from bench.controller import PROFILE, admin_ops
from bench.controller_fleet import Fleet, gather_limited
from bench.cpu_probe import CpuProbe
from kraft.client.admin import AdminClient
from kraft.clock import SystemClock
from kraft.cluster.quorum import ControllerQuorum
from kraft.procutil import reap_children_on_exit

_TICKS = os.sysconf("SC_CLK_TCK")
_SIDES = ("A", "B")  # the trees
_QUORUMS = ("1", "2")  # the quorums: 1 runs tree A and 2 tree B, then (after the swap) the other way round
_SUMMARY_KEYS = (
    "p50_ms",
    "p99_ms",
    "leader_cpu_us",
    "leader_main_thread_cpu_us",
    "leader_cpu_ms_per_s",
    "leader_main_thread_cpu_ms_per_s",
    "leader_main_thread_wakeups_per_s",
    "followers_cpu_us",
    "followers_main_thread_cpu_us",
    "followers_wakeups",
    "client_cpu_us",
    "load_1m",
)
_IDLE_KEYS = (
    "idle_leader_cpu_ms_per_s",
    "idle_leader_main_thread_cpu_ms_per_s",
    "idle_leader_main_thread_wakeups_per_s",
)
# After a swap the quorums' new leaders must have taken broker 1 back (a CreateTopics needs an unfenced
# broker) before the windows go on.
_SWAP_READY_TIMEOUT_S = 60.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of process ``pid`` (all its threads), in seconds."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def main_thread_switches(pid: int) -> int:
    """Voluntary context switches of the main thread of ``pid``: each one a sleep of its event loop (in
    epoll, or for the GIL) that something woke."""
    for line in Path(f"/proc/{pid}/task/{pid}/status").read_text().splitlines():
        if line.startswith("voluntary_ctxt_switches:"):
            return int(line.split()[1])
    return 0


def thread_switches(pid: int) -> dict[int, int]:
    """Voluntary context switches of each thread of ``pid`` (tid → count); threads gone meanwhile skipped."""
    counts: dict[int, int] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            lines = (task / "status").read_text().splitlines()
        except OSError:
            continue
        for line in lines:
            if line.startswith("voluntary_ctxt_switches:"):
                counts[int(task.name)] = int(line.split()[1])
    return counts


def main_thread_cpu_seconds(pid: int) -> float:
    """utime + stime of the main thread of process ``pid`` (the event loop of the controller's logic and
    Raft driver; the rest is the gRPC intake thread, gRPC's own threads and the fsync workers)."""
    fields = Path(f"/proc/{pid}/task/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


@contextlib.contextmanager
def code_of(tree: Path) -> Iterator[None]:
    """Controllers started inside run ``tree``'s code (their working directory is the repository root)."""
    saved = quorum_module.REPO_ROOT
    quorum_module.REPO_ROOT = tree
    try:
        yield
    finally:
        quorum_module.REPO_ROOT = saved


async def _window(
    quorum: ControllerQuorum, client: AdminClient, seconds: float, prefix: str
) -> dict[str, Any]:
    pids = {node_id: node.pid for node_id, node in quorum.nodes.items() if node.pid is not None}
    leader = quorum.wait_for_leader(timeout_s=10).node_id
    load = os.getloadavg()[0]
    before = {node_id: cpu_seconds(pid) for node_id, pid in pids.items()}
    main_before = {node_id: main_thread_cpu_seconds(pid) for node_id, pid in pids.items()}
    switches_before = main_thread_switches(pids[leader]) if leader in pids else 0
    threads_before = {node_id: thread_switches(pid) for node_id, pid in pids.items() if node_id != leader}
    own_before = time.process_time()
    wall_before = time.monotonic()
    result = await admin_ops(client, seconds, workers=1, prefix=prefix)
    wall = time.monotonic() - wall_before
    own = time.process_time() - own_before
    switches = (main_thread_switches(pids[leader]) - switches_before) if leader in pids else 0
    # a follower's wake-ups per CreateTopics, per thread (main thread first, then the busiest others: the
    # intake thread, gRPC's poller, the fsync worker), and all of its threads' together
    follower_threads: list[list[float]] = []
    follower_wakeups = 0
    for node_id, before_counts in threads_before.items():
        after = thread_switches(pids[node_id])
        deltas = {tid: count - before_counts.get(tid, 0) for tid, count in after.items()}
        follower_wakeups += sum(deltas.values())
        main_delta = deltas.pop(pids[node_id], 0)
        others = sorted(deltas.values(), reverse=True)[:4]
        follower_threads.append([round(v / max(1, result["ops"]), 2) for v in (main_delta, *others)])
    ops = max(1, result["ops"])
    cpu = {node_id: (cpu_seconds(pid) - before[node_id]) / ops * 1e6 for node_id, pid in pids.items()}
    main = {
        node_id: (main_thread_cpu_seconds(pid) - main_before[node_id]) / ops * 1e6
        for node_id, pid in pids.items()
    }
    return {
        "p50_ms": result["p50_ms"],
        "p99_ms": result["p99_ms"],
        "ops": result["ops"],
        "leader_cpu_us": round(cpu.get(leader, 0.0)),
        "leader_main_thread_cpu_us": round(main.get(leader, 0.0)),
        "leader_cpu_ms_per_s": round(cpu.get(leader, 0.0) * ops / 1e3 / wall, 1),
        "leader_main_thread_cpu_ms_per_s": round(main.get(leader, 0.0) * ops / 1e3 / wall, 1),
        "leader_main_thread_wakeups_per_s": round(switches / wall),
        "followers_cpu_us": round(sum(v for node_id, v in cpu.items() if node_id != leader)),
        "followers_main_thread_cpu_us": round(sum(v for node_id, v in main.items() if node_id != leader)),
        "followers_wakeups": round(follower_wakeups / ops, 1),
        "follower_thread_wakeups": follower_threads,
        "client_cpu_us": round(own / ops * 1e6),
        "load_1m": round(load, 2),
    }


async def _idle_window(quorum: ControllerQuorum, seconds: float) -> dict[str, Any]:
    """The leader's CPU and main-thread wake-ups per second while no admin call runs: what the heartbeating
    fleet (and Raft's idle traffic) costs it."""
    leader = quorum.wait_for_leader(timeout_s=10).node_id
    pid = quorum.nodes[leader].pid
    assert pid is not None
    cpu, main, switches = cpu_seconds(pid), main_thread_cpu_seconds(pid), main_thread_switches(pid)
    started = time.monotonic()
    await asyncio.sleep(seconds)
    wall = time.monotonic() - started
    return {
        "idle_leader_cpu_ms_per_s": round((cpu_seconds(pid) - cpu) * 1e3 / wall, 1),
        "idle_leader_main_thread_cpu_ms_per_s": round((main_thread_cpu_seconds(pid) - main) * 1e3 / wall, 1),
        "idle_leader_main_thread_wakeups_per_s": round((main_thread_switches(pid) - switches) / wall),
    }


def swapped(assignment: Mapping[str, str]) -> dict[str, str]:
    """Each quorum (``1``, ``2``) given the other tree (``A``, ``B``)."""
    other = {"A": "B", "B": "A"}
    return {quorum: other[tree] for quorum, tree in assignment.items()}


def _medians(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> dict[str, float]:
    return {key: round(statistics.median(row[key] for row in rows), 2) for key in keys}


def summarize(rows: dict[str, list[dict[str, Any]]], idle: bool) -> dict[str, Any]:
    """Medians per tree (over both quorums), per quorum (over both trees) and per tree on each quorum, and
    how many pairs went B's way: over the whole run and in each half (each half on one assignment)."""
    keys = (*_SUMMARY_KEYS, *(_IDLE_KEYS if idle else ()))
    every = [row for side in _SIDES for row in rows[side]]
    by_quorum = {q: [row for row in every if row["quorum"] == q] for q in _QUORUMS}
    by_both = {
        f"{side}@{q}": [row for row in rows[side] if row["quorum"] == q] for side in _SIDES for q in _QUORUMS
    }
    pairs = list(zip(rows["A"], rows["B"], strict=True))
    b_better_by_phase: dict[str, int] = {}
    for a, b in pairs:
        phase = f"A@{a['quorum']}"
        b_better_by_phase[phase] = b_better_by_phase.get(phase, 0) + (1 if b["p50_ms"] < a["p50_ms"] else 0)
    return {
        "summary": {side: _medians(rows[side], keys) for side in _SIDES if rows[side]},
        "summary_by_quorum": {q: _medians(r, keys) for q, r in by_quorum.items() if r},
        "summary_by_tree_and_quorum": {
            name: _medians(r, ("p50_ms", "p99_ms")) for name, r in by_both.items() if r
        },
        "b_better_pairs": sum(1 for a, b in pairs if b["p50_ms"] < a["p50_ms"]),
        "b_better_pairs_by_assignment": b_better_by_phase,
    }


async def _ready(client: AdminClient, timeout_s: float, prefix: str) -> None:
    """Until one CreateTopics succeeds (bounded): after a restart the new leader must know broker 1 alive."""
    deadline = time.monotonic() + timeout_s
    attempt = 0
    while True:
        attempt += 1
        try:
            await admin_ops(client, 0.01, workers=1, prefix=f"{prefix}-{attempt}")
            return
        except Exception:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


async def _run(
    quorums: dict[str, ControllerQuorum],
    pairs: int,
    seconds: float,
    prefill_s: float,
    probe: CpuProbe,
    brokers: int = 1,
    idle_s: float = 0.0,
    swap: Callable[[dict[str, str]], None] | None = None,
) -> dict[str, Any]:
    """``quorums`` by quorum (``1``, ``2``); ``swap(assignment)`` restarts them with each quorum's tree
    (quorum → ``A``/``B``) after half of the pairs (None: no swap)."""
    clients: dict[str, AdminClient] = {}
    beats: dict[str, AdminClient] = {}
    fleets: dict[str, Fleet] = {}
    heartbeats: list[asyncio.Task[None]] = []
    rows: dict[str, list[dict[str, Any]]] = {side: [] for side in _SIDES}
    prefill: dict[str, Any] = {}
    assignment = dict(zip(_QUORUMS, _SIDES, strict=True))
    swap_at = pairs // 2 if swap is not None and pairs >= 2 else None
    try:
        for q, quorum in quorums.items():
            quorum.wait_for_leader(timeout_s=60)
            targets = [node.target for node in quorum.nodes.values()]
            clients[q] = AdminClient(targets, timeout_s=30, clock=SystemClock())
            beats[q] = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
            fleets[q] = Fleet(clients[q], beats[q], quorum.cluster_id, interval_s=2.0)
            await fleets[q].register(1)
            heartbeats.append(asyncio.create_task(fleets[q].run_one(1, 0.0)))
            if brokers > 1:
                # more brokers, all unfenced and heartbeating (spread over the interval): a CreateTopics
                # places its partitions over all of them (the same load on both quorums)
                fleet = fleets[q]
                await gather_limited(32, [fleet.register(b) for b in range(2, brokers + 1)])
                heartbeats.extend(
                    asyncio.create_task(fleet.run_one(b, b * fleet.interval_s / brokers))
                    for b in range(2, brokers + 1)
                )
        for q in _QUORUMS:
            if prefill_s > 0:
                prefill[q] = await admin_ops(clients[q], prefill_s, workers=16, prefix="prefill")
            await admin_ops(clients[q], 1.0, workers=1, prefix="warm")
        for index in range(pairs):
            if index == swap_at and swap is not None:
                assignment = swapped(assignment)
                print(f"swap: {assignment} (quorum: tree), restarting both quorums", flush=True)
                swap(assignment)
                for q in _QUORUMS:
                    quorums[q].wait_for_leader(timeout_s=60)
                    await _ready(clients[q], _SWAP_READY_TIMEOUT_S, "ready")
                    await admin_ops(clients[q], 1.0, workers=1, prefix="warm-swapped")
            quorum_of = {tree: q for q, tree in assignment.items()}
            for side in _SIDES if index % 2 == 0 else tuple(reversed(_SIDES)):
                q = quorum_of[side]
                with probe.phase(f"{side}{index}"):
                    row = await _window(quorums[q], clients[q], seconds, f"w{index}")
                if idle_s > 0:
                    row.update(await _idle_window(quorums[q], idle_s))
                row["tree"], row["quorum"] = side, q
                rows[side].append(row)
                print(f"pair {index} {side} (quorum {q}): {row}", flush=True)
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
    return {**summarize(rows, idle_s > 0), "swap_at_pair": swap_at, "rows": rows, "prefill": prefill}


def run(
    tree_a: Path,
    tree_b: Path,
    pairs: int,
    seconds: float,
    prefill_s: float,
    cpu_probe: bool = True,
    brokers: int = 1,
    overrides: dict[str, dict[str, str]] | None = None,
    idle_s: float = 0.0,
    swap: bool = True,
) -> dict[str, Any]:
    probe = CpuProbe()  # never started without cpu_probe: the windows are marked on it all the same
    trees = {"A": tree_a, "B": tree_b}

    def start(quorum: ControllerQuorum, side: str) -> None:
        """Run ``quorum`` on tree ``side``'s code and overrides (a running one is restarted on its data)."""
        for node_id in quorum.live_ids:
            quorum.terminate(node_id)
        quorum.overrides = {**PROFILE, **(overrides or {}).get(side, {})}
        quorum.prepare()  # rewrites the configs; storage is formatted once
        with code_of(trees[side]):
            quorum.start()

    with tempfile.TemporaryDirectory(prefix="kraft-bench-admin-ab-") as tmp:
        quorums: dict[str, ControllerQuorum] = {}
        try:
            if cpu_probe:
                probe.start()
            for q, side in zip(_QUORUMS, _SIDES, strict=True):
                quorums[q] = ControllerQuorum(Path(tmp) / f"quorum{q}", test_append=False)
                start(quorums[q], side)

            def restart(assignment: dict[str, str]) -> None:
                for q, side in assignment.items():
                    start(quorums[q], side)

            result = asyncio.run(
                _run(quorums, pairs, seconds, prefill_s, probe, brokers, idle_s, restart if swap else None)
            )
        finally:
            probe.stop()
            for quorum in quorums.values():
                quorum.close()
    if cpu_probe:
        report = probe.report()
        for side, rows in result["rows"].items():
            for index, row in enumerate(rows):
                row["speed_factor"] = report["phases"][f"{side}{index}"]["speed_factor"]
            factors = [row["speed_factor"] for row in rows if row["speed_factor"] is not None]
            if side in result["summary"] and factors:
                result["summary"][side]["speed_factor"] = round(statistics.median(factors), 3)
        result["cpu_probe"] = report
    result["trees"] = {"A": str(tree_a), "B": str(tree_b)}
    result["overrides"] = overrides or {}
    return result


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no controller outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.admin_ab", description=__doc__.splitlines()[0])
    parser.add_argument("tree_a", type=Path, help="repository root whose code quorum A runs (the base)")
    parser.add_argument("tree_b", type=Path, help="repository root whose code quorum B runs (the change)")
    parser.add_argument("--pairs", type=int, default=10, help="alternated pairs of windows (default 10)")
    parser.add_argument("--seconds", type=float, default=2.5, help="length of each window (default 2.5)")
    parser.add_argument("--prefill", type=float, default=10.0, metavar="S", help="16-client prefill, each")
    parser.add_argument(
        "--brokers", type=int, default=1, help="registered, heartbeating brokers in each quorum (default 1)"
    )
    for side in ("a", "b"):
        parser.add_argument(
            f"--set-{side}",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"a controller config override for quorum {side.upper()} only (repeatable)",
        )
    parser.add_argument(
        "--idle",
        type=float,
        default=0.0,
        metavar="S",
        help="after each window, S seconds without admin calls: the leader's CPU and main-thread wake-ups "
        "per second then (idle_* keys; with --brokers N, the fleet's heartbeats' cost)",
    )
    parser.add_argument("--out", type=Path, help="also write the result JSON there")
    parser.add_argument("--no-cpu-probe", action="store_true", help="no CPU-speed probe (bench.cpu_probe)")
    parser.add_argument(
        "--no-swap",
        action="store_true",
        help="keep each tree on its quorum for the whole run (default: swap the quorums' trees half-way)",
    )
    args = parser.parse_args(argv)
    overrides: dict[str, dict[str, str]] = {}
    for side, settings in (("A", args.set_a), ("B", args.set_b)):
        for setting in settings:
            key, sep, value = setting.partition("=")
            if not sep or not key:
                parser.error(f"--set-{side.lower()} wants KEY=VALUE, got {setting!r}")
            overrides.setdefault(side, {})[key] = value
    started = time.time()
    result = run(
        args.tree_a.resolve(),
        args.tree_b.resolve(),
        args.pairs,
        args.seconds,
        args.prefill,
        not args.no_cpu_probe,
        args.brokers,
        overrides,
        args.idle,
        not args.no_swap,
    )
    result["brokers"] = args.brokers
    result["started_at"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started))
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
    summary, by_quorum = result["summary"], result["summary_by_quorum"]
    print(
        f"A p50={summary['A']['p50_ms']} ms  B p50={summary['B']['p50_ms']} ms  "
        f"(medians of {args.pairs} pairs; B better in {result['b_better_pairs']}, by assignment "
        f"{result['b_better_pairs_by_assignment']})  quorum 1 p50={by_quorum['1']['p50_ms']} ms  "
        f"quorum 2 p50={by_quorum['2']['p50_ms']} ms  per tree and quorum "
        f"{result['summary_by_tree_and_quorum']}  A={summary['A']}  B={summary['B']}  "
        f"took={time.time() - started:.0f}s"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
