"""Microbenchmark: how long one event (one uninterrupted stretch of event-loop work) of a bulk metadata
operation runs on each node that handles it — against ``controller.max.event.time.ms`` (5 ms).

Builds, through ``ControllerLogic``, an image of ``--brokers`` unfenced brokers and one big topic of
``--partitions`` partitions (RF 3), then times, per step, the work that runs without yielding:

- ``delete_*``: DeleteTopics of the big topic — the active controller's logic (records, speculative
  image, rejoin index), a follower controller's replay of the records and ``apply()``, a broker's
  ``local_changes`` (its deletes) and the image store's loop-side bookkeeping (``_save_topics``' digest);
- ``explicit_*``: CreateTopics of a topic with an explicit assignment of that many partitions (the
  logic's one event);
- ``small_topic_*``: CreateTopics of one 1,000-partition topic (auto-placed) and a follower's replay of
  its records.

With ``--sliced`` the sliced paths are timed instead (the largest single event of each). Prints JSON
(median and max over ``--rounds`` rounds, ms, with the load average).

With ``--apply-costs [PARTITIONS ...]`` only ``MetadataDelta.apply()`` is timed, per slice of a big
topic's creation and per PartitionChangeRecord, on topics of 100,000 and 1,000,000 partitions (and the
reads of the topic: a pass over it, a lookup by id) — the cost that chunked partition sequences make
independent of the topic's size.

``--broker-only``: a broker hosting *all* of the deleted topic (3 brokers, RF 3) — the longest event-loop
stretch of scanning, converting and ordering its deletes in one go (the code before) and in steps; the
paced deletion of ``--deletion-partitions`` real partition logs, 64 per turn and each log closed
(synced) first (before), within the work unit's budget so, and within the budget with the logs discarded
unsynced (now); and freeing the deleted topic's objects when the last image holding it goes, in one go
(before) or by :mod:`kraft.reaper` (its longest turn) — wall and CPU (``time.thread_time``) time.

Run: ``python -m bench.work_units`` (100,000 partitions over 1,000 brokers; ~1 min).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import replace
from itertools import chain
from pathlib import Path
from typing import Any

from bench.controller import register_active_brokers
from kraft.broker.image_adapter import _entry, to_local_changes_in_steps
from kraft.broker.partitions import Pacer, PartitionManager, in_order
from kraft.broker.segmented_partition_log import SegmentedPartitionLog, segmented_log_opener
from kraft.broker.types import LocalChanges, PartitionAssignment, TopicPartition
from kraft.clock import DEFAULT_WORK_UNIT_MS, Deadline, SystemClock
from kraft.metadata import records as rec
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import LocalReplicaChanges, MetadataDelta
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.metadata.store import _partition_digest, _topic_key
from kraft.procutil import reap_children_on_exit
from kraft.reaper import SLICE_MS, Reaper
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb
from kraft.v1 import metadata_pb2 as pb

CLUSTER = "bench"
_discard = SegmentedPartitionLog.discard
SMALL_TOPICS = 10


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return (time.perf_counter() - started) * 1000, out


def median_and_max(rounds: Sequence[Mapping[str, float]]) -> dict[str, dict[str, float]]:
    """Each measure of ``rounds`` (one dict per round, the same keys) as its median and max, rounded to
    0.01: the ``results`` of this bench's JSON, and of bench.clear_elr's and bench.snapshot_reap's."""
    return {
        key: {
            "median": round(statistics.median(r[key] for r in rounds), 2),
            "max": round(max(r[key] for r in rounds), 2),
        }
        for key in rounds[0]
    }


def build(brokers: int, partitions: int, work_unit: int) -> tuple[ControllerLogic, int]:
    settings = ControllerSettings(
        CLUSTER, max_partitions=10**9, max_broker_partitions=10**9, max_changes_per_write=work_unit
    )
    logic = ControllerLogic(settings, MetadataImage.empty(), 0, clock=SystemClock())
    offset = register_active_brokers(logic, brokers)
    topic = cpb.CreatableTopic(name="big", num_partitions=partitions, replication_factor=3)
    out = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), offset)
    offset += len(out.records)
    # the index follows the image from here (as on a controller that has been active for a while)
    while not logic.index_some(10**9):
        pass
    return logic, offset


def replay_events(image: MetadataImage, records: list[Any]) -> list[float]:
    """A follower controller's replay of ``records`` (decoded values) in commit_replay's slices of 200
    records, then ``apply()``: the duration of each slice (the last includes ``apply``)."""
    values = [rec.encode_value(r) for r in records]
    delta = MetadataDelta(image)
    durations: list[float] = []
    for start in range(0, len(values), 200):
        started = time.perf_counter()
        delta.replay_decoded(rec.decode_values(values[start : start + 200]))
        durations.append((time.perf_counter() - started) * 1000)
    started = time.perf_counter()
    delta.apply()
    durations[-1] += (time.perf_counter() - started) * 1000
    return durations


def _renamed(topic: cpb.CreatableTopic, name: str) -> cpb.CreatableTopic:
    copy = cpb.CreatableTopic()
    copy.CopyFrom(topic)
    copy.name = name
    return copy


def sliced_creation(
    logic: ControllerLogic, topic: cpb.CreatableTopic, offset: int
) -> tuple[list[float], float]:
    """The events of a big topic's sliced creation, as the shell runs them (plan, placing events of a
    work unit and the time budget, the first write, then bulk slices): each one's duration, and the sum."""
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
    ms, (outcome, plan) = timed(lambda: logic.plan_topic(request, offset))
    assert plan is not None, outcome.response
    events = [ms]
    limit = logic.settings.max_changes_per_write
    budget = logic.settings.max_event_time_ms
    while True:
        ms, done = timed(lambda: plan.place_some(Deadline(logic.clock, budget), limit))
        events.append(ms)
        if done:
            break
    ms, first = timed(lambda: logic.create_planned_topic(plan, False, offset))
    events.append(ms)
    written = len(first.records)
    while logic.has_bulk_jobs():
        started = time.perf_counter()
        more = getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs)(offset + written)
        events.append((time.perf_counter() - started) * 1000)
        written += len(more)
    return events, sum(events)


def one_round(brokers: int, partitions: int, work_unit: int) -> dict[str, float]:
    logic, offset = build(brokers, partitions, work_unit)
    gc.collect()
    gc.freeze()
    before = logic.image
    out: dict[str, float] = {}
    # --- DeleteTopics of the big topic ---
    follower_image = before
    request = cpb.DeleteTopicsRequest(cluster_id=CLUSTER, names=["big"])
    ms, outcome = timed(lambda: logic.delete_topics(request, offset))
    records = list(outcome.records)
    events = [ms]
    next_slice = getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs)  # values: session 18
    while logic.has_bulk_jobs():
        ms, more = timed(lambda: next_slice(offset + len(records)))
        records.extend(more if not more or type(more[0]) is not bytes else rec.decode_values(more))
        events.append(ms)
    out["delete_active_max_event_ms"] = max(events)
    out["delete_active_events"] = len(events)
    out["delete_records"] = len(records)
    out["delete_follower_max_event_ms"] = max(replay_events(follower_image, records))
    delta = MetadataDelta(follower_image)
    for r in records:
        delta.replay(r)
    ms, changes = timed(lambda: delta.local_changes(1))
    out["delete_broker_local_changes_ms"] = ms
    out["delete_broker_deletes"] = len(changes.deletes)
    if hasattr(delta, "local_changes_in_steps"):  # the sliced scan: its longest step between pauses
        pauses: list[float] = []
        started = time.perf_counter()
        for _ in delta.local_changes_in_steps(1, LocalReplicaChanges()):
            now = time.perf_counter()
            pauses.append((now - started) * 1000)
            started = now
        out["delete_broker_longest_step_ms"] = max(pauses)
    big = before.topic("big")
    assert big is not None
    key = _topic_key(big.topic_id)
    ms, _ = timed(lambda: sum(_partition_digest(key, i, p) for i, p in enumerate(big.partitions)))
    out["delete_store_digest_ms"] = ms  # on the event loop before, on the SQLite thread after
    # --- explicit assignment ---
    assignment = [
        ((i % brokers) + 1, ((i + 1) % brokers) + 1, ((i + 2) % brokers) + 1) for i in range(partitions)
    ]
    topic = cpb.CreatableTopic(name="explicit")
    for partition_id, replicas in enumerate(assignment):
        topic.assignments.add(partition=partition_id, broker_ids=replicas)
    create = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
    ms, outcome = timed(lambda: logic.create_topics(create, offset))
    out["explicit_active_event_ms"] = ms
    # --- the sliced path of a big topic (plan, placing events, slices), if the logic has it ---
    for label, big_topic in (
        ("sliced_auto", cpb.CreatableTopic(name="auto2", num_partitions=partitions, replication_factor=3)),
        ("sliced_explicit", _renamed(topic, "explicit2")),
    ):
        if logic.is_big_topic(big_topic):
            events, started = sliced_creation(logic, big_topic, offset)
            out[f"{label}_max_event_ms"] = max(events)
            out[f"{label}_events"] = len(events)
            out[f"{label}_total_ms"] = started
    # --- 1,000-partition topics (SMALL_TOPICS of them, one after the other) ---
    image = logic.image
    unsliced: list[float] = []
    for index in range(SMALL_TOPICS):
        small = cpb.CreatableTopic(name=f"small-{index}", num_partitions=1000, replication_factor=3)
        started = time.perf_counter()
        outcome = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[small]), offset)
        unsliced.append((time.perf_counter() - started) * 1000)
        if index == 0:
            out["small_topic_follower_max_slice_ms"] = max(replay_events(image, list(outcome.records)))
    out["small_topic_active_event_ms"] = statistics.median(unsliced)
    out["small_topic_active_event_max_ms"] = max(unsliced)
    if hasattr(logic, "prepare_some"):  # the prepared path: plan, bounded preparing events, one write
        steps: list[float] = []
        writes: list[float] = []
        budget = logic.settings.max_event_time_ms
        for index in range(SMALL_TOPICS):
            mid = cpb.CreateTopicsRequest(
                cluster_id=CLUSTER,
                topics=[
                    cpb.CreatableTopic(name=f"prepared-{index}", num_partitions=1000, replication_factor=3)
                ],
            )
            started = time.perf_counter()
            _, plan = logic.plan_topic(mid, offset, prepared=True)
            steps.append((time.perf_counter() - started) * 1000)
            assert plan is not None
            while True:
                started = time.perf_counter()
                done = logic.prepare_some(plan, Deadline(logic.clock, budget), 1000)
                steps.append((time.perf_counter() - started) * 1000)
                if done:
                    break
            started = time.perf_counter()
            logic.create_prepared_topic(plan, False, offset)
            writes.append((time.perf_counter() - started) * 1000)
        out["small_topic_prepared_write_ms"] = statistics.median(writes)
        out["small_topic_prepared_event_ms"] = statistics.median(steps + writes)
        out["small_topic_prepared_max_event_ms"] = max(steps + writes)
        out["small_topic_prepared_events"] = (len(steps) + len(writes)) / SMALL_TOPICS
    gc.unfreeze()
    return out


def _image_with_topic(partitions: int, brokers: int) -> MetadataImage:
    """An image holding one topic of ``partitions`` partitions (RF 3, replica lists shared like a replayed
    image's), built directly: a million PartitionRecords would take longer to replay than to measure."""
    lists = [tuple((i + k) % brokers + 1 for k in range(3)) for i in range(brokers)]
    registrations = [PartitionRegistration(r, r, r[0], 0, 0) for r in lists]
    topic = TopicImage("big", "big-id", tuple(registrations[i % brokers] for i in range(partitions)))
    return replace(
        MetadataImage.empty(), offset=0, topics_by_id={"big-id": topic}, topic_ids_by_name={"big": "big-id"}
    )


def apply_costs(partitions: int, brokers: int, slice_size: int, slices: int) -> dict[str, float]:
    """What a delta's ``apply()`` costs on a topic of ``partitions`` partitions, median over ``slices``
    deltas (ms), and what reading the topic costs:

    - ``slice_apply_ms``: ``apply()`` of a delta appending ``slice_size`` PartitionRecords (one slice of a
      big topic's sliced creation, as every controller and broker applies it), the topic growing slice
      by slice; ``slice_replay_apply_ms`` adds the replay of those records;
    - ``change_apply_ms``: ``apply()`` of a delta of one PartitionChangeRecord on the big topic;
    - ``new_topic_apply_ms``: ``apply()`` of a delta creating the whole topic (a snapshot's load),
      best of 3;
    - ``iterate_ms``: one pass over the topic's partitions; ``lookup_us``: one ``partitions[i]`` at a
      random ``i`` (mean over ``partitions`` lookups); each the best of 3 passes."""
    image = _image_with_topic(partitions, brokers)
    rng = random.Random(7)
    # A delta creating the whole topic (a snapshot load, a broker's first fetch): apply() builds it.
    whole = MetadataDelta(MetadataImage.empty())
    whole.replay(rec.wrap(mpb.TopicRecord(name="big", topic_id="big-id")))
    for partition_id, registration in enumerate(image.topics_by_id["big-id"].partitions):
        whole.set_partition("big-id", partition_id, registration)
    gc.collect()
    new_topic_ms = min(timed(whole.apply)[0] for _ in range(3))  # apply() leaves the delta as it is
    assert len(whole.apply().topics_by_id["big-id"].partitions) == partitions
    del whole
    slice_apply: list[float] = []
    slice_total: list[float] = []
    for _ in range(slices):
        count = len(image.topics_by_id["big-id"].partitions)
        records = [
            rec.wrap(
                mpb.PartitionRecord(
                    partition_id=count + i,
                    topic_id="big-id",
                    replicas=[1, 2, 3],
                    isr=[1, 2, 3],
                    leader=1,
                )
            )
            for i in range(slice_size)
        ]
        started = time.perf_counter()
        delta = MetadataDelta(image)
        for record in records:
            delta.replay(record)
        replayed = time.perf_counter()
        image = delta.apply()
        done = time.perf_counter()
        slice_apply.append((done - replayed) * 1000)
        slice_total.append((done - started) * 1000)
    change_apply: list[float] = []
    for _ in range(slices):
        delta = MetadataDelta(image)
        delta.replay(
            rec.wrap(
                mpb.PartitionChangeRecord(partition_id=rng.randrange(partitions), topic_id="big-id", leader=2)
            )
        )
        started = time.perf_counter()
        image = delta.apply()
        change_apply.append((time.perf_counter() - started) * 1000)
    topic = image.topics_by_id["big-id"]
    seq = topic.partitions
    # reads: the best of 3 (the host is shared; the least disturbed pass is the cost)
    ms = min(timed(lambda: sum(1 for _ in seq))[0] for _ in range(3))
    positions = [rng.randrange(partitions) for _ in range(partitions)]
    lookup_ms = min(timed(lambda: [seq[i] for i in positions])[0] for _ in range(3))
    return {
        "slice_apply_ms": round(statistics.median(slice_apply), 3),
        "slice_apply_max_ms": round(max(slice_apply), 3),
        "slice_replay_apply_ms": round(statistics.median(slice_total), 3),
        "change_apply_ms": round(statistics.median(change_apply), 3),
        "change_apply_max_ms": round(max(change_apply), 3),
        "new_topic_apply_ms": round(new_topic_ms, 2),
        "iterate_ms": round(ms, 2),
        "lookup_us": round(lookup_ms * 1000 / partitions, 3),
    }


async def _stretches(work: Callable[[], Awaitable[Any]]) -> tuple[float, float, int]:
    """Run ``work`` beside a task that takes a turn whenever the loop lets it: the longest stretch the
    loop ran without it (wall ms, CPU ms by ``time.thread_time``) and the number of turns — one
    uninterrupted event-loop stretch of ``work`` each."""
    walls: list[float] = []
    cpus: list[float] = []
    done = False

    async def ticker() -> None:
        wall, cpu = time.perf_counter(), time.thread_time()
        while not done:
            await asyncio.sleep(0)
            now_wall, now_cpu = time.perf_counter(), time.thread_time()
            walls.append((now_wall - wall) * 1000)
            cpus.append((now_cpu - cpu) * 1000)
            wall, cpu = now_wall, now_cpu

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0)
    await work()
    done = True
    await ticking
    return max(walls), max(cpus), len(walls)


def _fresh_copy(topic: TopicImage) -> TopicImage:
    """``topic`` as a node that replayed its records holds it: its own registrations (sharing the replica
    tuples, as replay's interning does), held by nobody else."""
    return TopicImage(topic.name, topic.topic_id, tuple(p._replace() for p in topic.partitions))


def _to_local_changes_before(changes: LocalReplicaChanges) -> LocalChanges:
    """``to_local_changes`` as it was before it was sliced (main at 8917bf5), for the one-go rows."""
    return LocalChanges(
        deletes={TopicPartition(p.topic_name, p.partition_id): p.topic_id for p in changes.deletes},
        leaders=dict(_entry(p) for p in changes.leaders),
        followers=dict(_entry(p) for p in changes.followers),
    )


def _convert_and_sort_one_go(delta: MetadataDelta) -> dict[str, float]:
    """The two parts of the one-go code, each timed alone (wall)."""
    changes = delta.local_changes(1)
    convert_ms, local = timed(lambda: _to_local_changes_before(changes))
    sort_ms, _ = timed(lambda: sorted(local.deletes.items()))
    return {"broker_all_convert_one_go_ms": convert_ms, "broker_all_sort_one_go_ms": sort_ms}


def broker_round(partitions: int, deletion_partitions: int, collect: bool = True) -> dict[str, float]:
    """A broker hosting all of a deleted topic (3 brokers, RF 3): its deletes converted and ordered, in one
    go (the code before) and in steps (``_local_changes``, ``in_order``); the paced deletion of
    ``deletion_partitions`` real partition logs (64 per turn before, the work unit's budget after); and
    freeing the deleted topic's objects when the last image goes, in one go and by the reaper."""
    logic, _ = build(3, partitions, 1000)
    big = logic.image.topic("big")
    assert big is not None
    copies = [_fresh_copy(big) for _ in range(2)]
    gc.collect()
    gc.freeze()
    if not collect:  # (--no-gc: what is left of a stretch without the collections it triggers)
        gc.disable()
    out: dict[str, float] = {}
    delta = MetadataDelta(logic.image)
    delta.replay(rec.wrap(pb.RemoveTopicRecord(topic_id=big.topic_id)))
    clock = SystemClock()

    # What each side built is kept past its stretch: freeing it is not this row (the publisher hands it
    # to kraft.reaper: the free_topic rows measure that kind of release).
    kept: list[object] = []

    async def one_go() -> None:
        local = _to_local_changes_before(delta.local_changes(1))
        ordered = sorted(local.deletes.items())
        assert len(ordered) == partitions
        kept.append((local, ordered))

    async def in_steps() -> None:  # as MetadataPublisher.publish: one pacer through to the ordering
        pacer = Pacer(clock, DEFAULT_WORK_UNIT_MS)
        changes = LocalReplicaChanges()
        local = LocalChanges({}, {}, {})
        for _ in chain(delta.local_changes_in_steps(1, changes), to_local_changes_in_steps(changes, local)):
            await pacer.tick()
        ordered = await in_order(local.deletes, pacer)
        assert len(ordered) == partitions
        kept.append((local, ordered))

    out.update(_convert_and_sort_one_go(delta))
    for label, work in (("one_go", one_go), ("steps", in_steps)):
        wall, cpu, turns = asyncio.run(_stretches(work))
        out[f"broker_all_scan_convert_order_{label}_longest_ms"] = wall
        out[f"broker_all_scan_convert_order_{label}_longest_cpu_ms"] = cpu
        out[f"broker_all_scan_convert_order_{label}_turns"] = turns
        kept.clear()
    # --- the paced deletion of real partition logs ---
    with tempfile.TemporaryDirectory(prefix="work-units-") as root:
        variants = (
            ("per_64_close", 0, True),  # the code before: 64 a turn, each log closed (synced) first
            ("budget_close", DEFAULT_WORK_UNIT_MS, True),
            ("budget", DEFAULT_WORK_UNIT_MS, False),  # now: the budget, logs discarded unsynced
        )
        for label, work_unit_ms, synced in variants:
            if synced:  # (the code before this change closed the log it deleted)
                SegmentedPartitionLog.discard = SegmentedPartitionLog.close  # type: ignore[method-assign]
            else:
                SegmentedPartitionLog.discard = _discard  # type: ignore[method-assign]
            manager = PartitionManager(
                1, [Path(root) / label], segmented_log_opener(1 << 20), work_unit_ms=work_unit_ms
            )
            manager.load()
            tps = [TopicPartition("big", p) for p in range(deletion_partitions)]
            assignment = PartitionAssignment("B", 1, 1, 1, (1, 2, 3), (1, 2, 3))
            manager.apply(LocalChanges(leaders=dict.fromkeys(tps, assignment)))

            async def delete(manager: PartitionManager = manager, tps: list[TopicPartition] = tps) -> None:
                await manager.apply_paced(LocalChanges(deletes=dict.fromkeys(tps, "B")))

            wall, cpu, turns = asyncio.run(_stretches(delete))
            out[f"broker_delete_logs_{label}_longest_ms"] = wall
            out[f"broker_delete_logs_{label}_longest_cpu_ms"] = cpu
            out[f"broker_delete_logs_{label}_turns"] = turns
            manager.close()
    SegmentedPartitionLog.discard = _discard  # type: ignore[method-assign]
    # --- freeing the deleted topic when the last image holding it goes ---
    one = copies.pop()
    started, started_cpu = time.perf_counter(), time.thread_time()
    del one
    out["free_topic_one_go_ms"] = (time.perf_counter() - started) * 1000
    out["free_topic_one_go_cpu_ms"] = (time.thread_time() - started_cpu) * 1000
    reaper = Reaper(clock)
    reaper.adopt(copies)
    copies.clear()
    walls: list[float] = []
    cpus: list[float] = []
    while True:
        started, started_cpu = time.perf_counter(), time.thread_time()
        done = reaper.release_some(Deadline(clock, SLICE_MS))
        walls.append((time.perf_counter() - started) * 1000)
        cpus.append((time.thread_time() - started_cpu) * 1000)
        if done:
            break
    assert reaper.idle
    out["free_topic_reaper_longest_turn_ms"] = max(walls)
    out["free_topic_reaper_longest_turn_cpu_ms"] = max(cpus)
    out["free_topic_reaper_turns"] = len(walls)
    out["free_topic_reaper_total_cpu_ms"] = sum(cpus)
    gc.unfreeze()
    gc.enable()
    return out


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser()
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--work-unit", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--apply-costs",
        type=int,
        nargs="*",
        metavar="PARTITIONS",
        help="only time apply() per slice (--work-unit partitions) and per change on topics of these sizes "
        "(default 100000 1000000), and reads of the topic",
    )
    parser.add_argument(
        "--broker-only",
        action="store_true",
        help="only the broker-side deletion (3 brokers: one hosts all of it) and the freeing of the topic",
    )
    parser.add_argument("--deletion-partitions", type=int, default=2000, help="real logs deleted")
    parser.add_argument("--no-gc", action="store_true", help="--broker-only with garbage collection off")
    args = parser.parse_args()
    if args.apply_costs is not None:
        sizes = args.apply_costs or [100_000, 1_000_000]
        results = {}
        for size in sizes:
            gc.collect()
            results[str(size)] = apply_costs(size, args.brokers, args.work_unit, 20)
        print(json.dumps({"loadavg": os.getloadavg(), "slice": args.work_unit, "results": results}, indent=1))
        return
    if args.broker_only:
        rounds = [
            broker_round(args.partitions, args.deletion_partitions, not args.no_gc)
            for _ in range(args.rounds)
        ]
    else:
        rounds = [one_round(args.brokers, args.partitions, args.work_unit) for _ in range(args.rounds)]
    summary = median_and_max(rounds)
    print(
        json.dumps(
            {
                "brokers": args.brokers,
                "partitions": args.partitions,
                "loadavg": os.getloadavg(),
                "results": summary,
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
