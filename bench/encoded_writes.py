"""Microbenchmark: the active controller's CPU for the writes of new partitions that are not prepared
topics (session 18; issue #17) — what building upb records and encoding them at the append cost against
encoding the values as the records are built.

Through ``ControllerLogic`` on ``--brokers`` unfenced brokers (``bench.controller``'s registrations), CPU
time of this thread (ms, ``time.thread_time``), each phase up to the values the append takes
(``Outcome.encoded()``, the bulk slices' values — ``encode_value`` of records on a tree before):

- ``big_topic``: one topic of ``--big`` partitions (RF 3) — plan, placement in work units, the first
  write and every bulk slice (``continue_bulk_values``, or ``continue_bulk_jobs`` then ``encode_value``);
- ``small_creates``: ``--small-requests`` CreateTopics of 10 topics x ``--small-partitions`` partitions;
- ``grow``: CreatePartitions of ``--grow-topics`` of those topics (the first of each request: at most
  ``--small-requests``), each to ``--grow-to`` partitions.

Session 19 adds, on a second controller logic (``--brokers`` brokers, ``min.insync.replicas`` 2) whose
image holds ``--sole`` one-partition topics with broker 1 their only replica and a topic of
``--pairs`` partitions of RF 2 led by broker 2 (``bench.shutdown_profile``'s way: replayed, then
``reset``), the bulk work of fences and unfences — each a heartbeat and every bulk slice after it
(``continue_bulk_values``), to the end:

- ``fence_sole``: broker 1 fenced — its sole replicas leave (ISR emptied, the broker into the ELR);
- ``unfence_sole``: broker 1 unfenced — an election from the ELR in each of those partitions;
- ``fence_pairs``: broker 2 fenced — its ISRs drop below min ISR (the ELR's shape: the general rules).

Session 20 adds ``--work-unit`` (records per write and bulk slice, both logics: 200 gives a fence of
30,000 one-partition topics the ~150 slices a 5 ms event budget gave it in session 19, deterministically)
and, with ``--led N``, a third logic (``--brokers`` brokers, min ISR 1) whose image holds ``N`` RF-3
partitions led by broker 1 (topics of 1,000, ``bench.shutdown_profile``'s), its phases:

- ``fence_led``: broker 1 fenced — it leaves every ISR, the next replica leads;
- ``led_settle``: the rejoin index's flags the fence's slices left dirty, settled (``index_some``, as the
  shell does in events of their own between the fence and the unfence);
- ``unfence_led``: broker 1 unfenced — its rejoin job over the index's candidates.

``--no-creates`` leaves out the first logic's phases.

The collector is off during the phases (what a phase costs, not when a collection happens to run).  Works
on trees before session 18 (A/B: run it from each tree's root, alternated).  Prints JSON; ``--out`` also
writes it.  Run: ``python -m bench.encoded_writes [--rounds 3]`` (~15 s a round); ``--sole 0 --pairs 0``
leaves out the fences.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.controller import register_active_brokers
from kraft.clock import Deadline
from kraft.metadata import records as rec
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.partition_growth import create_partitions
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

CLUSTER = "bench"
WORK_UNIT = 1000
EVENT_MS = 5
LED_PER_TOPIC = 1000


def _values(outcome: Any) -> list[bytes]:
    encoded = getattr(outcome, "encoded", None)
    if encoded is not None:
        return list(encoded())
    return [rec.encode_value(r) for r in outcome.records]


def _timed(fn: Callable[[], int]) -> tuple[float, int]:
    started = time.thread_time_ns()
    count = fn()
    return (time.thread_time_ns() - started) / 1e6, count


def one_round(args: argparse.Namespace) -> dict[str, float]:
    result: dict[str, float] = {}
    if not args.no_creates:
        result.update(create_round(args))
    if args.sole or args.pairs:
        result.update(fence_round(args))
    if args.led:
        result.update(led_round(args))
    return result


def _settings(args: argparse.Namespace) -> ControllerSettings:
    """Every logic's settings: no partition caps, ``--work-unit`` records per write, the event budget."""
    return ControllerSettings(
        CLUSTER,
        max_partitions=10**9,
        max_broker_partitions=10**9,
        max_changes_per_write=args.work_unit,
        max_event_time_ms=EVENT_MS,
    )


def create_round(args: argparse.Namespace) -> dict[str, float]:
    settings = _settings(args)
    # no clock: events bounded by record counts only, so both trees write the same slices and requests
    logic = ControllerLogic(settings, MetadataImage.empty(), 0)
    offset = register_active_brokers(logic, args.brokers)
    next_slice = getattr(logic, "continue_bulk_values", None)

    def big_topic() -> int:
        nonlocal offset
        topic = cpb.CreatableTopic(name="big", num_partitions=args.big, replication_factor=3)
        _, plan = logic.plan_topic(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), offset)
        assert plan is not None
        while not plan.place_some(Deadline(None, 0), args.work_unit):
            pass
        written = len(_values(logic.create_planned_topic(plan, False, offset)))
        offset += written
        while logic.has_bulk_jobs():
            if next_slice is not None:
                more = next_slice(offset)
            else:
                more = [rec.encode_value(r) for r in logic.continue_bulk_jobs(offset)]
            offset += len(more)
            written += len(more)
        return written

    def small_creates() -> int:
        nonlocal offset
        written = 0
        for r in range(args.small_requests):
            request = cpb.CreateTopicsRequest(cluster_id=CLUSTER)
            for t in range(10):
                request.topics.add(
                    name=f"small-{r}-{t}", num_partitions=args.small_partitions, replication_factor=3
                )
            values = _values(logic.create_topics(request, offset))
            offset += len(values)
            written += len(values)
        return written

    def grow() -> int:
        nonlocal offset
        written = 0
        for r in range(args.grow_topics):
            request = cpb.CreatePartitionsRequest(
                cluster_id=CLUSTER,
                topics=[cpb.CreatePartitionsTopic(name=f"small-{r}-0", count=args.grow_to)],
            )
            outcome = create_partitions(logic, request, offset)
            assert outcome.response.topics[0].error_code == 0, outcome.response
            values = _values(outcome)
            offset += len(values)
            written += len(values)
        return written

    gc.collect()
    gc.disable()
    try:
        result: dict[str, float] = {}
        for name, fn in (("big_topic", big_topic), ("small_creates", small_creates), ("grow", grow)):
            ms, records = _timed(fn)
            result[f"{name}_ms"] = round(ms, 1)
            result[f"{name}_records"] = records
            result[f"{name}_us_per_record"] = round(ms * 1000 / max(records, 1), 2)
    finally:
        gc.enable()
    return result


def _fence_logic(args: argparse.Namespace) -> tuple[ControllerLogic, int]:
    """The second logic: brokers, then ``--sole`` topics on broker 1 alone and the ``pairs`` topic of RF 2
    (broker 2 and one other), replayed into its image and reset onto it, the rejoin index built."""
    settings = ControllerSettings(
        CLUSTER,
        max_partitions=10**9,
        max_broker_partitions=10**9,
        max_changes_per_write=args.work_unit,
        max_event_time_ms=EVENT_MS,
        min_insync_replicas=2,
    )
    logic = ControllerLogic(settings, MetadataImage.empty(), 0)
    offset = register_active_brokers(logic, args.brokers)
    delta = MetadataDelta(logic.image)

    def add(record: Any) -> None:
        nonlocal offset
        delta.replay(rec.wrap(record), offset)
        offset += 1

    for t in range(args.sole):
        add(pb.TopicRecord(name=f"sole-{t}", topic_id=f"s{t}"))
        add(pb.PartitionRecord(topic_id=f"s{t}", partition_id=0, replicas=[1], isr=[1], leader=1))
    if args.pairs:
        add(pb.TopicRecord(name="pairs", topic_id="pairs"))
        for p in range(args.pairs):
            replicas = [2, 3 + p % (args.brokers - 2)]
            add(
                pb.PartitionRecord(
                    topic_id="pairs", partition_id=p, replicas=replicas, isr=replicas, leader=2
                )
            )
    logic.reset(delta.apply(), 0)
    while not logic.index_some(10**9):
        pass
    return logic, offset


def _led_logic(args: argparse.Namespace) -> tuple[ControllerLogic, int]:
    """The third logic: brokers, then ``--led`` partitions of RF 3 led by broker 1 (topics of 1,000; the
    other two replicas spread over brokers 2..), replayed into its image and reset onto it, the rejoin
    index built."""
    settings = _settings(args)
    logic = ControllerLogic(settings, MetadataImage.empty(), 0)
    offset = register_active_brokers(logic, args.brokers)
    delta = MetadataDelta(logic.image)
    for t in range(0, args.led, LED_PER_TOPIC):
        delta.replay(rec.wrap(pb.TopicRecord(name=f"led-{t}", topic_id=f"l{t}")), offset)
        offset += 1
        for p in range(min(LED_PER_TOPIC, args.led - t)):
            other = 2 + (t + p) % (args.brokers - 3)
            replicas = [1, other, other + 1]
            record = pb.PartitionRecord(
                topic_id=f"l{t}", partition_id=p, replicas=replicas, isr=replicas, leader=1
            )
            delta.replay(rec.wrap(record), offset)
            offset += 1
    logic.reset(delta.apply(), 0)
    while not logic.index_some(10**9):
        pass
    return logic, offset


def _beat(logic: ControllerLogic, offset: list[int], broker_id: int, want_fence: bool) -> Callable[[], int]:
    """A heartbeat of ``broker_id`` (fence or, caught up, unfence) and every bulk slice after it, to the
    end; ``offset[0]`` moves past what they wrote."""
    next_slice = getattr(logic, "continue_bulk_values", None)

    def run() -> int:
        request = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=logic.image.brokers[broker_id].epoch,
            current_metadata_offset=offset[0] + 10**9,  # caught up: the unfence runs its elections
            want_fence=want_fence,
        )
        written = len(_values(logic.broker_heartbeat(request, 0, offset[0])))
        offset[0] += written
        while logic.has_bulk_jobs():
            if next_slice is not None:
                more = next_slice(offset[0])
            else:
                more = [rec.encode_value(r) for r in logic.continue_bulk_jobs(offset[0])]
            offset[0] += len(more)
            written += len(more)
        return written

    return run


def led_round(args: argparse.Namespace) -> dict[str, float]:
    logic, start = _led_logic(args)
    offset = [start]

    def settle() -> int:
        """The index's dirty flags settled as the shell does, an event at a time; returns the events."""
        events = 0
        while getattr(logic.rejoin_index, "settling", False):
            logic.index_some()
            events += 1
        return events

    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        result: dict[str, float] = {}
        for name, fn in (
            ("fence_led", _beat(logic, offset, 1, True)),
            ("led_settle", settle),
            ("unfence_led", _beat(logic, offset, 1, False)),
        ):
            ms, records = _timed(fn)
            result[f"{name}_ms"] = round(ms, 1)
            result[f"{name}_records"] = records  # (led_settle: its events)
    finally:
        gc.enable()
        gc.unfreeze()
    return result


def fence_round(args: argparse.Namespace) -> dict[str, float]:
    logic, offset = _fence_logic(args)
    next_slice = getattr(logic, "continue_bulk_values", None)

    def beat(broker_id: int, want_fence: bool) -> Callable[[], int]:
        def run() -> int:
            nonlocal offset
            request = cpb.BrokerHeartbeatRequest(
                cluster_id=CLUSTER,
                broker_id=broker_id,
                broker_epoch=logic.image.brokers[broker_id].epoch,
                current_metadata_offset=offset + 10**9,  # caught up: the unfence runs its elections
                want_fence=want_fence,
            )
            written = len(_values(logic.broker_heartbeat(request, 0, offset)))
            offset += written
            while logic.has_bulk_jobs():
                if next_slice is not None:
                    more = next_slice(offset)
                else:
                    more = [rec.encode_value(r) for r in logic.continue_bulk_jobs(offset)]
                offset += len(more)
                written += len(more)
            return written

        return run

    gc.collect()
    gc.freeze()  # the image as the heap freezer leaves it (collections off anyway, as above)
    gc.disable()
    try:
        result: dict[str, float] = {}
        for name, fn in (
            ("fence_sole", beat(1, True)),
            ("unfence_sole", beat(1, False)),
            ("fence_pairs", beat(2, True)),
        ):
            ms, records = _timed(fn)
            result[f"{name}_ms"] = round(ms, 1)
            result[f"{name}_records"] = records
            result[f"{name}_us_per_record"] = round(ms * 1000 / max(records, 1), 2)
    finally:
        gc.enable()
        gc.unfreeze()
    return result


def main() -> None:
    reap_children_on_exit()  # no child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(
        prog="python -m bench.encoded_writes", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--big", type=int, default=50_000)
    parser.add_argument("--small-requests", type=int, default=100)
    parser.add_argument("--small-partitions", type=int, default=20)
    parser.add_argument("--grow-topics", type=int, default=100)
    parser.add_argument("--grow-to", type=int, default=220)
    parser.add_argument("--sole", type=int, default=10_000, help="one-partition topics of broker 1 alone")
    parser.add_argument("--pairs", type=int, default=20_000, help="partitions of RF 2 led by broker 2")
    parser.add_argument("--work-unit", type=int, default=WORK_UNIT, help="records per write and slice")
    parser.add_argument("--led", type=int, default=0, help="RF-3 partitions led by broker 1 (third logic)")
    parser.add_argument("--no-creates", action="store_true", help="leave out the first logic's phases")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    load_before = os.getloadavg()
    rounds = [one_round(args) for _ in range(args.rounds)]
    keys = rounds[0].keys()
    out = {
        "benchmark": "encoded_writes",
        "tree": str(Path.cwd()),
        "brokers": args.brokers,
        "rounds": rounds,
        "median": {k: statistics.median(r[k] for r in rounds) for k in keys},
        "load_average_before": load_before,
        "load_average_after": os.getloadavg(),
    }
    text = json.dumps(out, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
