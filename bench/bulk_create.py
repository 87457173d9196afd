"""Microbenchmark: where the active controller's CPU goes in ``bench.controller``'s bulk creation — one
CreateTopics request of ``--topics`` topics x ``--per-topic`` partitions (RF 3) over ``--brokers``
brokers — and a follower controller's replay of its records.

The controller logic is driven in the order the controller shell (:mod:`kraft.metadata.controller`) runs
a request of many prepared topics: every topic's plan first (one event each; each reserves its
partitions), then the preparing events (placement and records, a work unit each) round robin over the
topics, then the writes one after the other (``_prepared_writes``) — so when a topic is written, the
plans of the request's later topics are still pending, as in the real run.  Timing each topic alone
(plan, prepare, write, then the next: ``bench.work_units``' ``small_topic_prepared``) leaves no plan
pending at any write, which is why that bench did not see the write check's cost per pending plan.

Phases (ms, CPU time of this thread):

- ``plan``: ``plan_topic`` (checks, usable brokers, the reservation);
- ``prepare``: ``prepare_some`` (placement, reservation counts, PartitionRecords and registrations);
- ``write_check``: ``_recheck_plan`` in the write (limits again, the plans a write leaves out);
- ``write_build``: the rest of ``create_prepared_topic`` (records into the batch, speculative image);
- ``encode``: ``encode_value`` of every record (what the append serializes; since session 17 a prepared
  topic's PartitionRecords are encoded in ``prepare`` and this is only the few other records);
- ``follower_replay``: decode + ``MetadataDelta.replay_decoded`` in commit_replay's 200-record slices and
  ``apply()`` per topic batch, on an image holding the topics before it.

``--gc`` (session 16): the collector on at a node's thresholds (``NODE_GC_THRESHOLD``) instead of off, and
``gc_ms`` / ``gc_collections`` (per generation) over the leader's phases (plan to encode) reported: what
the objects a phase keeps cost in collections (each phase's CPU then includes its collections).

Works on trees before the partition reservations too (8917bf5: no ``order``, no ``_recheck_plan``
split).  Prints JSON; ``--out`` also writes it.

Run: ``python -m bench.bulk_create [--rounds 3]`` (~10 s per round).
"""

from __future__ import annotations

import argparse
import gc
import inspect
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.controller import register_active_brokers
from kraft.clock import Deadline, SystemClock
from kraft.metadata import records as rec
from kraft.metadata.commit_replay import REPLAY_SLICE_RECORDS
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.observability.gc_watch import NODE_GC_THRESHOLD
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb

CLUSTER = "bench"
WORK_UNIT = 1000
EVENT_MS = 5


class Phases:
    """CPU time (``time.thread_time_ns``) per named phase."""

    def __init__(self) -> None:
        self.ns: dict[str, int] = {}

    def timed(self, name: str, fn: Callable[..., Any], *args: Any) -> Any:
        started = time.thread_time_ns()
        try:
            return fn(*args)
        finally:
            self.ns[name] = self.ns.get(name, 0) + time.thread_time_ns() - started

    def ms(self) -> dict[str, float]:
        return {name: round(ns / 1e6, 1) for name, ns in self.ns.items()}


def one_round(brokers: int, topics: int, per_topic: int, collect: bool = False) -> dict[str, float]:
    settings = ControllerSettings(
        CLUSTER,
        max_partitions=10**9,
        max_broker_partitions=10**9,
        max_changes_per_write=WORK_UNIT,
        max_event_time_ms=EVENT_MS,
    )
    logic = ControllerLogic(settings, MetadataImage.empty(), 0, clock=SystemClock())
    offset = register_active_brokers(logic, brokers)
    follower_image = logic.image  # a follower that has replayed the registrations
    phases = Phases()
    recheck = getattr(logic, "_recheck_plan", None)
    if recheck is not None:  # the write's checks, apart from its records

        def timed_recheck(*args: Any) -> Any:
            return phases.timed("write_check", recheck, *args)

        vars(logic)["_recheck_plan"] = timed_recheck  # this instance's only (the bench's probe)
    bulk = [
        cpb.CreatableTopic(name=f"bulk-{i}", num_partitions=per_topic, replication_factor=3)
        for i in range(topics)
    ]
    takes_order = "order" in inspect.signature(logic.plan_topic).parameters
    order: Any = None
    if takes_order:
        from kraft.metadata.partition_reservations import RequestOrder

        order = RequestOrder({t.name: i for i, t in enumerate(bulk)})
    gc.collect()
    thresholds = gc.get_threshold()
    pauses = GcPauses()
    if collect:  # as in a node (kraft.observability.gc_watch.tune_node_gc), the collections timed
        gc.set_threshold(*NODE_GC_THRESHOLD)
        gc.callbacks.append(pauses.callback)
    else:
        gc.disable()  # the phases, not when a collection happens to run
    try:
        plans = []
        for topic in bulk:
            one = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
            if takes_order:
                _, plan = phases.timed("plan", logic.plan_topic, one, offset, True, order)
            else:
                _, plan = phases.timed("plan", logic.plan_topic, one, offset, True)
            assert plan is not None
            plans.append(plan)
        pending = list(plans)
        while pending:  # the event queue runs the topics' preparing events in turn
            still = []
            for plan in pending:
                done = phases.timed(
                    "prepare", logic.prepare_some, plan, Deadline(SystemClock(), EVENT_MS), WORK_UNIT
                )
                if not done:
                    still.append(plan)
            pending = still
        batches = []
        for plan in plans:
            started = time.thread_time_ns()
            check_before = phases.ns.get("write_check", 0)
            out = logic.create_prepared_topic(plan, False, offset)
            spent = time.thread_time_ns() - started - (phases.ns.get("write_check", 0) - check_before)
            phases.ns["write_build"] = phases.ns.get("write_build", 0) + spent
            assert out.response.topics[0].error_code == 0, out.response.topics[0].error_message
            values = phases.timed("encode", _encoded, out)
            offset += len(values)
            batches.append(values)
        leader_gc = (pauses.seconds, list(pauses.collections))
        for values in batches:  # one committed batch per topic, replayed as commit_replay does

            def replay(image: MetadataImage, values: list[bytes]) -> MetadataImage:
                delta = MetadataDelta(image)
                for start in range(0, len(values), REPLAY_SLICE_RECORDS):
                    delta.replay_decoded(rec.decode_values(values[start : start + REPLAY_SLICE_RECORDS]))
                return delta.apply()

            follower_image = phases.timed("follower_replay", replay, follower_image, values)
    finally:
        if collect:
            gc.callbacks.remove(pauses.callback)
            gc.set_threshold(*thresholds)
        gc.enable()
    assert len(follower_image.topics_by_id) == topics
    out_ms = phases.ms()
    out_ms["leader_total"] = round(
        sum(out_ms.get(k, 0.0) for k in ("plan", "prepare", "write_check", "write_build", "encode")), 1
    )
    if collect:
        out_ms["leader_gc_ms"] = round(leader_gc[0] * 1000, 1)
        for generation, count in enumerate(leader_gc[1]):
            out_ms[f"leader_gc_collections_{generation}"] = count
    return out_ms


def _encoded(out: Any) -> list[bytes]:
    """The values the write appends: since session 17 a prepared topic's are encoded as it is prepared
    (``Outcome.values``; then ``encode`` is ~0 and ``prepare`` holds the encoding), before it every
    record through ``encode_value``."""
    values = getattr(out, "values", None)
    if values is not None:
        return list(values)
    return [rec.encode_value(r) for r in out.records]


class GcPauses:
    """The collections' pauses (``gc.callbacks``) and their count per generation."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = [0, 0, 0]
        self._started = 0.0

    def callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
            return
        self.seconds += time.perf_counter() - self._started
        self.collections[info["generation"]] += 1


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--per-topic", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument(
        "--gc",
        action="store_true",
        help="run with the collector on at a node's thresholds and report its pauses (default: off)",
    )
    args = parser.parse_args()
    load_before = os.getloadavg()
    rounds = [one_round(args.brokers, args.topics, args.per_topic, args.gc) for _ in range(args.rounds)]
    phases = list(rounds[0])
    result = {
        "benchmark": "bulk_create",
        "brokers": args.brokers,
        "topics": args.topics,
        "partitions_per_topic": args.per_topic,
        "rounds": args.rounds,
        "gc": args.gc,
        "median_cpu_ms": {name: statistics.median(r[name] for r in rounds) for name in phases},
        "min_cpu_ms": {name: min(r[name] for r in rounds) for name in phases},
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
