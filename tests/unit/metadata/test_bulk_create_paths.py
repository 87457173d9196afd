"""The bulk creation's per-partition shortcuts (session 16) give what the rules written plainly give.

- ``place_ordered_range`` (the chosen ids in a list) places exactly what ``_place_ordered_range_sets``
  (the rule with sets, any factor) places;
- a new partition's ISR is its whole replica list only while every replica is acceptable: the set of
  acceptable ids (``ControllerLogic.acceptable_ids``) follows a fence and a controlled shutdown made
  between creates, and a fence made between the plan of a prepared topic and its records;
- a prepared topic's registrations share the ISR with the replica list, as a replay does;
- a plan made from the logic's kept order of usable brokers places what placement over the image's
  usable brokers places, and so does the plan its transaction name gives back (a failover's resume);
- a CreateTopics of many prepared topics writes its first topics before its last ones are prepared.
"""

from __future__ import annotations

import itertools
from collections.abc import Awaitable, Callable
from typing import TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.clock import Deadline
from kraft.errors import ErrorCode
from kraft.metadata.controller import ControllerOptions
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings, TopicPlan
from kraft.metadata.event_queue import EventPriority
from kraft.metadata.image import MetadataImage
from kraft.metadata.placement import (
    UsableBroker,
    _place_ordered_range_sets,
    place_ordered_range,
    place_replicas,
    rack_alternated,
    rack_count,
)
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller import activate_broker, started, until

CLUSTER = "c1"
T = TypeVar("T")
BROKERS = 6


@settings(max_examples=500, deadline=None)
@given(
    brokers=st.dictionaries(
        st.integers(min_value=0, max_value=40), st.sampled_from([None, "", "a", "b", "c"]), min_size=1
    ),
    factor=st.integers(min_value=1, max_value=11),
    first=st.integers(min_value=0, max_value=120),
    count=st.integers(min_value=0, max_value=60),
    start=st.integers(min_value=0, max_value=10_000),
)
def test_placement_with_lists_places_what_the_rule_with_sets_places(
    brokers: dict[int, str | None], factor: int, first: int, count: int, start: int
) -> None:
    ordered = rack_alternated([UsableBroker(b, rack) for b, rack in brokers.items()])
    factor = min(factor, len(ordered))
    racks = rack_count(ordered)
    assert place_ordered_range(ordered, racks, first, count, factor, start) == _place_ordered_range_sets(
        ordered, racks, first, count, factor, start
    )


def _logic() -> tuple[ControllerLogic, list[pb.MetadataRecord]]:
    """Brokers 1..6 (two racks) registered and unfenced."""
    ids = (f"topic-{i}" for i in itertools.count())
    logic = ControllerLogic(
        ControllerSettings(CLUSTER, max_changes_per_write=10_000),
        MetadataImage.empty(),
        0,
        new_topic_id=lambda: next(ids),
    )
    log: list[pb.MetadataRecord] = []

    def commit(out: list[pb.MetadataRecord]) -> None:
        log.extend(out)
        while logic.has_bulk_jobs():
            log.extend(logic.continue_bulk_jobs(len(log)))

    for broker_id in range(1, BROKERS + 1):
        request = cpb.RegisterBrokerRequest(
            cluster_id=CLUSTER, broker_id=broker_id, incarnation_id="i", rack=f"r{broker_id % 2}"
        )
        commit(logic.register_broker(request, 0, len(log)).records)
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=logic.image.brokers[broker_id].epoch,
            current_metadata_offset=999,
        )
        commit(logic.broker_heartbeat(beat, 0, len(log)).records)
    assert not any(b.fenced for b in logic.image.brokers.values())
    return logic, log


def _fence(logic: ControllerLogic, log: list[pb.MetadataRecord], broker_id: int) -> None:
    fence = cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER,
        broker_id=broker_id,
        broker_epoch=logic.image.brokers[broker_id].epoch,
        want_fence=True,
    )
    log.extend(logic.broker_heartbeat(fence, 0, len(log)).records)
    assert logic.image.brokers[broker_id].fenced


def _explicit(logic: ControllerLogic, log: list[pb.MetadataRecord], name: str) -> list[pb.PartitionRecord]:
    """An explicitly assigned topic over every broker; its PartitionRecords."""
    topic = cpb.CreatableTopic(name=name)
    for p in range(BROKERS):
        topic.assignments.add(partition=p, broker_ids=[1 + p, 1 + (p + 1) % BROKERS, 1 + (p + 2) % BROKERS])
    out = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), len(log))
    assert out.response.topics[0].error_code == 0, out.response.topics[0].error_message
    log.extend(out.records)
    return [r.partition for r in out.records if r.WhichOneof("record") == "partition"]


def _acceptable(logic: ControllerLogic) -> set[int]:
    return {b for b in range(1, BROKERS + 1) if logic.acceptable_in(logic.image)(b)}


def test_the_isr_of_new_partitions_follows_fences_and_shutdowns_between_creates() -> None:
    logic, log = _logic()
    for partition in _explicit(logic, log, "all-in"):  # builds the acceptable set for this broker map
        assert list(partition.isr) == list(partition.replicas)
        assert partition.leader == partition.replicas[0]
    _fence(logic, log, 2)
    shutdown = cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=4)
    log.extend(logic.shutdown_broker(shutdown, len(log)).records)
    assert _acceptable(logic) == {1, 3, 5, 6}
    for partition in _explicit(logic, log, "two-out"):
        assert list(partition.isr) == [b for b in partition.replicas if b not in (2, 4)]
        assert partition.leader == (partition.isr[0] if partition.isr else -1)
    topic = logic.image.topics_by_id[logic.image.topic_ids_by_name["two-out"]]
    for registration in topic.partitions:
        assert registration.isr == tuple(b for b in registration.replicas if b not in (2, 4))
        assert (registration.isr is registration.replicas) == (registration.isr == registration.replicas)


def test_a_prepared_topic_leaves_a_broker_fenced_after_its_plan_out_of_its_isrs() -> None:
    logic, log = _logic()
    # a first prepared topic builds the acceptable set for this broker map
    for name in ("first", "second"):
        request = cpb.CreateTopicsRequest(
            cluster_id=CLUSTER,
            topics=[cpb.CreatableTopic(name=name, num_partitions=60, replication_factor=3)],
        )
        outcome, plan = logic.plan_topic(request, len(log), prepared=True)
        assert plan is not None, outcome.response
        if name == "second":
            _fence(logic, log, 5)  # after the plan placed on it, before its records are built
        while not logic.prepare_some(plan, Deadline(None, 0), 7):
            pass
        written = logic.create_prepared_topic(plan, False, len(log))
        assert written.response.topics[0].error_code == 0, written.response.topics[0].error_message
        records = written.all_records()  # (its values, decoded)
        log.extend(records)
        topic = logic.image.topics_by_id[logic.image.topic_ids_by_name[name]]
        out = {5} if name == "second" else set()
        assert any(5 in r.replicas for r in topic.partitions)
        written_partitions = [r.partition for r in records if r.WhichOneof("record") == "partition"]
        for registration, record in zip(topic.partitions, written_partitions, strict=True):
            isr = tuple(b for b in registration.replicas if b not in out)
            assert registration.isr == isr == tuple(record.isr)
            assert registration.leader == record.leader == isr[0]
            assert (registration.isr is registration.replicas) == (not out & set(registration.replicas))


def test_a_plan_places_from_the_kept_order_as_from_the_image_and_resumes_the_same() -> None:
    logic, log = _logic()
    _fence(logic, log, 3)  # not usable: placed on by no plan
    placed = _explicit(logic, log, "moves-the-cursor")
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatableTopic(name="t", num_partitions=50, replication_factor=3)]
    )
    outcome, plan = logic.plan_topic(request, len(log), prepared=True)
    assert plan is not None, outcome.response
    assert plan.start_index == len(placed)
    usable = [
        UsableBroker(b.broker_id, b.rack)
        for b in logic.image.brokers.values()
        if not b.fenced and not b.in_controlled_shutdown
    ]
    expected = place_replicas(usable, 50, 3, plan.start_index)
    assert plan.place(0, 50) == expected
    resumed = TopicPlan.parse(plan.transaction_name("T"))
    assert resumed is not None
    assert resumed[1].place(0, 50) == expected


@pytest.mark.parametrize("preparing_max", [0, 2])
async def test_a_request_writes_its_first_prepared_topics_before_its_last_ones_are_prepared(
    monkeypatch: pytest.MonkeyPatch, preparing_max: int
) -> None:
    """With ``controller.create.topics.preparing.max`` = 2 prepared topics are built two at a time, so the
    request's writes (and the followers' replication of them) start while later topics are still being
    prepared; with 0 (the default) every topic's records are built before the first write."""
    options = ControllerOptions(
        noop_interval_ms=0,
        session_timeout_ms=60_000,
        max_work_unit_records=8,
        prepared_topic_min_partitions=4,
        create_topics_preparing_max=preparing_max,
    )
    raft, controller = await started(options)
    raft.elect()
    await until(lambda: controller.is_active)
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        ran: list[str] = []
        queue = controller.writes.queue
        submit = queue.run

        def run(priority: EventPriority, name: str, event: Callable[[], T]) -> Awaitable[T]:
            def logged() -> T:
                ran.append(name)
                return event()

            return submit(priority, name, logged)

        monkeypatch.setattr(queue, "run", run)
        topics = [cpb.CreatableTopic(name=f"t{i}", num_partitions=8, replication_factor=3) for i in range(10)]
        response = await controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=topics))
        assert [t.error_code for t in response.topics] == [ErrorCode.NONE] * 10
        assert [t.name for t in response.topics] == [t.name for t in topics]
        assert (
            ran.count("create-topic-plan")
            == ran.count("create-topic-prepare")
            == ran.count("create-topics")
            == 10
        )
        first_write = ran.index("create-topics")
        # all ten at once: every prepare event runs before the first write; two at a time: the first
        # write follows the first topics' preparing events, ahead of most of the others'
        prepared_after_first_write = ran[first_write:].count("create-topic-prepare")
        if preparing_max == 0:
            assert prepared_after_first_write == 0
        else:
            assert prepared_after_first_write >= 6
        committed = controller.committed
        assert all(committed.topic_ids_by_name.get(t.name) for t in topics)
    finally:
        await controller.stop()
