"""Microbenchmark: the bounded-work leftovers of issue #17 (session 13), CPU per event (thread time).

``unclean``: an implicit UNCLEAN ElectLeaders right after a controlled shutdown of ~109,000 leaderships
(``bench.shutdown_profile``'s image: 9,000 one-partition topics of broker 1 alone, left leaderless, and
``--topics`` x 1,000 partitions led by broker 1; the shutdown's slices leave their flags dirty).  Times
the request as one event (``elect_leaders`` without a scan: the code before, unchanged) and in parts
(``UncleanElectionScan``: each part one event), alternated on the same state (the request writes
nothing there: broker 1 is shutting down, so no partition has a live replica; the dirty flags stay).

``delta``: a delta of ``--changes`` PartitionChangeRecords of one topic of ``--partitions`` partitions
(ids shuffled; every 5th given an ELR, so the ELR index takes its bulk path), as a reader catching up
over many batches accumulates it: the longest single ``replay`` call (thread CPU; a dict's table
rebuild before, a part's conversion now), the whole replay, and ``apply_steps``' longest step and
total.  Uses only ``MetadataDelta``'s public methods, so it runs on any tree (``PYTHONPATH`` set to
the other tree for A/B).

Prints JSON: per round, and the median (ms), with ``/proc/loadavg`` before and after.
Run: ``python -m bench.bounded_leftovers unclean`` / ``python -m bench.bounded_leftovers delta``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kraft.metadata import records as rec
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb


def _loadavg() -> str:
    return Path("/proc/loadavg").read_text().split(" ", 3)[:3].__str__()


def _cpu_ms(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.thread_time_ns()
    out = fn()
    return (time.thread_time_ns() - started) / 1e6, out


def unclean_round(logic: Any, offset: int) -> dict[str, float]:
    from kraft.metadata.controller_logic import UncleanElectionScan

    request = cpb.ElectLeadersRequest(cluster_id="bench", election_type=1)
    one_ms, outcome = _cpu_ms(lambda: logic.elect_leaders(request, offset))
    assert not outcome.records
    results = sum(len(g.partitions) for g in outcome.response.topics)
    scan = UncleanElectionScan()
    parts: list[float] = []
    part_results = 0
    while not scan.done:
        ms, part = _cpu_ms(lambda: logic.elect_leaders(request, offset, scan))
        parts.append(ms)
        assert not part.records
        part_results += sum(len(g.partitions) for g in part.response.topics)
    assert part_results == results, (part_results, results)
    return {
        "one_event_cpu_ms": one_ms,
        "parts": float(len(parts)),
        "part_cpu_first_ms": parts[0],
        "part_cpu_max_ms": max(parts),
        "part_cpu_p50_ms": statistics.median(parts),
        "parts_cpu_total_ms": sum(parts),
        "results": float(results),
        "dirty": float(sum(len(ids) for ids in logic.rejoin_index._dirty.values())),
    }


def run_unclean(args: argparse.Namespace) -> dict[str, Any]:
    from bench.shutdown_profile import build
    from bench.unfence_after_bulk import _shut_down_1

    logic, offset, image = build(args.brokers, args.topics, args.small_topics, args.work_unit, args.event_ms)
    logic.reset(image, 0)  # (as bench.unfence_after_bulk: a controller active a while)
    while not logic.index_some(10**9):
        pass
    offset = _shut_down_1(logic, offset)
    assert logic.rejoin_index.settling
    gc.collect()
    gc.freeze()
    return {"rounds": [unclean_round(logic, offset) for _ in range(args.rounds)]}


def _base_image(partitions: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for broker_id in (1, 2, 3):
        delta.replay(
            rec.wrap(
                pb.RegisterBrokerRecord(
                    broker_id=broker_id,
                    broker_epoch=broker_id,
                    incarnation_id=f"i{broker_id}",
                    endpoints=[common_pb2.Endpoint(name="P", host="h", port=9000 + broker_id)],
                    fenced=False,
                )
            )
        )
    delta.replay(rec.wrap(pb.TopicRecord(name="big", topic_id="B")))
    for p in range(partitions):
        replicas = [1 + p % 3, 1 + (p + 1) % 3, 1 + (p + 2) % 3]
        delta.replay(
            rec.wrap(
                pb.PartitionRecord(
                    topic_id="B", partition_id=p, replicas=replicas, isr=replicas, leader=replicas[0]
                )
            )
        )
    return delta.apply()


def delta_round(base: MetadataImage, changes: list[pb.MetadataRecord]) -> dict[str, float]:
    delta = MetadataDelta(base)
    replay = delta.replay
    longest = 0.0
    started = time.thread_time_ns()
    for record in changes:
        one = time.thread_time_ns()
        replay(record)
        took = time.thread_time_ns() - one
        longest = max(longest, took)
    replay_ms = (time.thread_time_ns() - started) / 1e6
    steps = delta.apply_steps()
    step_ms: list[float] = []
    while True:
        started = time.thread_time_ns()
        try:
            next(steps)
        except StopIteration:
            step_ms.append((time.thread_time_ns() - started) / 1e6)
            break
        step_ms.append((time.thread_time_ns() - started) / 1e6)
    return {
        "longest_replay_cpu_ms": longest / 1e6,
        "replay_cpu_ms": replay_ms,
        "apply_steps": float(len(step_ms)),
        "apply_longest_step_cpu_ms": max(step_ms),
        "apply_cpu_total_ms": sum(step_ms),
    }


def run_delta(args: argparse.Namespace) -> dict[str, Any]:
    base = _base_image(args.partitions)
    rng = random.Random(7)
    ids = list(range(args.partitions))
    rng.shuffle(ids)
    changes = []
    for p in ids[: args.changes]:
        change = pb.PartitionChangeRecord(topic_id="B", partition_id=p, leader=1 + (p + 1) % 3)
        if p % 5 == 0:
            change.eligible_leader_replicas.CopyFrom(pb.BrokerIdList(ids=[1 + (p + 2) % 3]))
        changes.append(rec.wrap(change))
    gc.collect()
    gc.freeze()
    return {"rounds": [delta_round(base, changes) for _ in range(args.rounds)]}


def main() -> None:
    reap_children_on_exit()
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["unclean", "delta"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--small-topics", type=int, default=9000)
    parser.add_argument("--work-unit", type=int, default=1000)
    parser.add_argument("--event-ms", type=int, default=5)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--changes", type=int, default=100_000)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = _loadavg()
    result = run_unclean(args) if args.what == "unclean" else run_delta(args)
    rounds = result["rounds"]
    result["median"] = {key: round(statistics.median(r[key] for r in rounds), 3) for key in rounds[0]}
    result["rounds"] = [{key: round(value, 3) for key, value in r.items()} for r in rounds]
    result["loadavg"] = {"before": load_before, "after": _loadavg()}
    result["config"] = vars(args) | {"out": str(args.out) if args.out else None}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
