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

Run: ``python -m bench.work_units`` (100,000 partitions over 1,000 brokers; ~1 min).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from bench.controller import register_active_brokers
from kraft.clock import Deadline, SystemClock
from kraft.metadata import records as rec
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import LocalReplicaChanges, MetadataDelta
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.metadata.store import _partition_digest, _topic_key
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb

CLUSTER = "bench"
SMALL_TOPICS = 10


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    started = time.perf_counter()
    out = fn()
    return (time.perf_counter() - started) * 1000, out


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
        more = logic.continue_bulk_jobs(offset + written)
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
    while logic.has_bulk_jobs():
        ms, more = timed(lambda: logic.continue_bulk_jobs(offset + len(records)))
        records.extend(more)
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


def main() -> None:
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
    args = parser.parse_args()
    if args.apply_costs is not None:
        sizes = args.apply_costs or [100_000, 1_000_000]
        results = {}
        for size in sizes:
            gc.collect()
            results[str(size)] = apply_costs(size, args.brokers, args.work_unit, 20)
        print(json.dumps({"loadavg": os.getloadavg(), "slice": args.work_unit, "results": results}, indent=1))
        return
    rounds = [one_round(args.brokers, args.partitions, args.work_unit) for _ in range(args.rounds)]
    summary = {
        key: {
            "median": round(statistics.median(r[key] for r in rounds), 2),
            "max": round(max(r[key] for r in rounds), 2),
        }
        for key in rounds[0]
    }
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
