"""Explicit-assignment big topics written in slices (issue #17): checked entry by entry in bounded events,
written inside a metadata transaction like an auto-placed big topic, equal to the unsliced creation;
refused with the unsliced creation's error codes; undone by a new active controller (its plan is not in
the log) so that no reader ever sees part of it; and a heartbeat answered while one is being written."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable

import pytest
from loop_fakes import CostClock

from kraft.clock import Deadline, ManualClock
from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.controller_logic import (
    CREATE_TOPIC_TRANSACTION,
    PREPARED_TOPIC_MIN_PARTITIONS,
    ControllerLogic,
    ControllerSettings,
    TopicPlan,
    is_prepared_topic,
)
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.placement import UsableBroker, place_replicas
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .fake_raft import FakeRaft
from .test_controller import CLUSTER, activate_broker, settle
from .test_work_budget import _cluster_with_a_topic, _logic, _replay, _started


def _assigned(name: str, assignment: list[list[int]], order: list[int] | None = None) -> cpb.CreatableTopic:
    topic = cpb.CreatableTopic(name=name)
    for partition_id in order if order is not None else range(len(assignment)):
        topic.assignments.add(partition=partition_id, broker_ids=assignment[partition_id])
    return topic


def _rotating(partitions: int) -> list[list[int]]:
    return [[1 + p % 3, 1 + (p + 1) % 3] for p in range(partitions)]


def _plan_and_start(logic: ControllerLogic, log: list[pb.MetadataRecord], topic: cpb.CreatableTopic) -> int:
    """Plan, check every entry (a work unit per slice) and write the first slice; the checking slices."""
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
    assert logic.is_big_topic(topic)
    outcome, plan = logic.plan_topic(request, len(log))
    assert plan is not None and not outcome.records, outcome.response
    slices = 1
    while not plan.place_some(Deadline(None, 0), logic.settings.max_changes_per_write):
        slices += 1
    first = logic.create_planned_topic(plan, False, len(log))
    assert first.response.topics[0].error_code == ErrorCode.NONE
    log.extend(first.records)
    return slices


def test_an_explicit_big_topic_is_checked_and_written_in_slices_as_the_unsliced_one() -> None:
    order = list(range(95))
    random.Random(7).shuffle(order)  # entries in any order: each names its partition
    topic = _assigned("assigned", _rotating(95), order)
    sliced = _logic(None, budget_ms=0, max_changes=10)
    sliced_log = _cluster_with_a_topic(sliced, 3)
    whole = _logic(None, budget_ms=0, max_changes=10_000)
    whole_log = _cluster_with_a_topic(whole, 3)
    assert not whole.is_big_topic(topic)
    assert _plan_and_start(sliced, sliced_log, topic) == 10
    sizes = [len(sliced_log) - len(whole_log)]
    while sliced.has_bulk_jobs():
        assert sliced.image.transaction.startswith(CREATE_TOPIC_TRANSACTION)
        more = sliced.continue_bulk_jobs(len(sliced_log))
        sizes.append(len(more))
        sliced_log.extend(more)
    assert max(sizes) <= 10 and len(sizes) >= 10, sizes
    kinds = [r.WhichOneof("record") for r in sliced_log[len(whole_log) :]]
    assert kinds[:2] == ["begin_transaction", "topic"] and kinds[-1] == "end_transaction"
    whole_log.extend(
        whole.create_topics(
            cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), len(whole_log)
        ).records
    )
    replayed, expected = _replay(sliced_log), _replay(whole_log)
    assert not replayed.transaction
    got, want = replayed.topic("assigned"), expected.topic("assigned")
    assert got is not None and want is not None and got.partitions == want.partitions


def _with_broker_4_fenced(logic: ControllerLogic, log: list[pb.MetadataRecord]) -> None:
    request = cpb.RegisterBrokerRequest(cluster_id=CLUSTER, broker_id=4, incarnation_id="i")
    log.extend(logic.register_broker(request, 0, len(log)).records)


@pytest.mark.parametrize(
    ("entries", "code"),
    [
        ([(p, [1, 2]) for p in range(29)] + [(3, [2, 3])], ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # twice
        ([(p, [1, 2]) for p in range(29)] + [(30, [2, 3])], ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # a hole
        ([(p, [1, 2]) for p in range(29)] + [(29, [1, 2, 3])], ErrorCode.INVALID_REPLICATION_FACTOR),
        ([(p, [1, 2]) for p in range(29)] + [(29, [])], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ([(p, [1, 2]) for p in range(29)] + [(29, [2, 2])], ErrorCode.INVALID_REPLICA_ASSIGNMENT),
        ([(p, [1, 2]) for p in range(29)] + [(29, [2, 9])], ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # unknown
        ([(p, [1, 2]) for p in range(29)] + [(29, [4])], ErrorCode.INVALID_REPLICATION_FACTOR),
        ([(p, [1]) for p in range(29)] + [(29, [4])], ErrorCode.INVALID_REPLICA_ASSIGNMENT),  # fenced only
    ],
)
def test_an_explicit_big_topic_is_refused_as_the_unsliced_one_and_writes_nothing(
    entries: list[tuple[int, list[int]]], code: ErrorCode
) -> None:
    topic = cpb.CreatableTopic(name="bad")
    for partition_id, replicas in entries:
        topic.assignments.add(partition=partition_id, broker_ids=replicas)
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
    whole = _logic(None, budget_ms=0, max_changes=10_000)
    whole_log = _cluster_with_a_topic(whole, 3)
    _with_broker_4_fenced(whole, whole_log)
    expected = whole.create_topics(request, len(whole_log))
    assert expected.response.topics[0].error_code == code and not expected.records
    sliced = _logic(None, budget_ms=0, max_changes=4)
    log = _cluster_with_a_topic(sliced, 3)
    _with_broker_4_fenced(sliced, log)
    outcome, plan = sliced.plan_topic(request, len(log))
    assert plan is not None and not outcome.records
    with pytest.raises(KraftError) as refused:
        while not plan.place_some(Deadline(None, 0), 4):
            pass
    assert refused.value.code == code
    assert sliced.image.topic("bad") is None and not sliced.has_bulk_jobs()


def test_a_new_active_controller_undoes_a_half_written_explicit_topic() -> None:
    """The first controller writes a few slices and is gone.  The assignment is not in the log, so a
    logic reset on the committed image removes what was written inside the transaction and closes it:
    a reader holding the transaction open (a broker) never sees the topic, and the name is free again."""
    first = _logic(None, budget_ms=0, max_changes=10)
    log = _cluster_with_a_topic(first, 3)
    base = _replay(log)
    _plan_and_start(first, log, _assigned("assigned", _rotating(95)))
    for _ in range(2):
        log.extend(first.continue_bulk_jobs(len(log)))
    committed = _replay(log)
    partial = committed.topic("assigned")
    assert partial is not None and 0 < len(partial.partitions) < 95 and committed.transaction
    second = ControllerLogic(ControllerSettings(CLUSTER, max_changes_per_write=7), committed, 0)
    assert second.has_bulk_jobs()
    undo = second.continue_bulk_jobs(len(log))
    assert [r.WhichOneof("record") for r in undo] == ["remove_topic", "end_transaction"]
    assert not second.has_bulk_jobs()
    log.extend(undo)
    after = _replay(log)
    assert after.topic("assigned") is None and not after.transaction
    broker = MetadataDelta(base)  # a broker's delta, kept open across the transaction
    for offset in range(base.offset + 1, len(log)):
        broker.replay(log[offset], offset)
    assert not broker.in_transaction and not broker.replay_errors
    assert "assigned" not in broker.apply().topic_ids_by_name
    assert not list(broker.changed_topics()) and not broker.removed_topics()
    retry = second.create_topics(
        cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[_assigned("assigned", _rotating(95))]), len(log)
    )
    assert retry.response.topics[0].error_code == ErrorCode.NONE


async def start_and_hold_part_written(
    raft: FakeRaft, controller: QuorumController, topic: cpb.CreatableTopic, total: int
) -> tuple[asyncio.Task[cpb.CreateTopicsResponse], Callable[[], int]]:
    """Start creating ``topic`` (a big one, written in slices), let it run until some but not all of its
    ``total`` partitions are committed, then hold commits there: the create task and a count of what is
    written."""
    create = asyncio.create_task(
        controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]))
    )

    def written() -> int:
        found = controller.committed.topic(topic.name)
        return 0 if found is None else len(found.partitions)

    for _ in range(1000):
        await asyncio.sleep(0)
        if 0 < written() < total:
            break
    raft.hold_commits = True
    await settle()
    return create, written


async def test_a_heartbeat_is_answered_while_an_explicit_big_topic_is_being_written() -> None:
    """The topic's slices wait for their commits (a slow quorum); a heartbeat is answered meanwhile, and
    the creation is answered once its last slice committed."""
    clock = ManualClock()
    options = ControllerOptions(
        noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=4, max_uncommitted_bulk_records=4
    )
    raft, controller = await _started(options, clock)
    try:
        epochs = {b: await activate_broker(controller, b) for b in (1, 2, 3)}
        topic = _assigned("assigned", [[1, 2, 3]] * 40)
        create, written = await start_and_hold_part_written(raft, controller, topic, 40)
        assert not create.done() and controller.committed.transaction
        beat = await asyncio.wait_for(
            controller.broker_heartbeat(
                cpb.BrokerHeartbeatRequest(
                    cluster_id=CLUSTER, broker_id=2, broker_epoch=epochs[2], current_metadata_offset=epochs[2]
                )
            ),
            5,
        )
        assert beat.error_code == ErrorCode.NONE and not beat.is_fenced
        assert not create.done() and 0 < written() < 40  # still in progress when the heartbeat answered
        raft.release()
        answer = await asyncio.wait_for(create, 5)
        assert answer.topics[0].error_code == ErrorCode.NONE and written() == 40
        assert not controller.committed.transaction
    finally:
        await controller.stop()


@pytest.mark.parametrize(
    ("brokers", "racks", "factor", "start"), [(7, 1, 3, 0), (40, 4, 3, 1234), (9, 3, 2, 17)]
)
def test_a_plan_placed_in_slices_gives_the_unsliced_placement(
    brokers: int, racks: int, factor: int, start: int
) -> None:
    """A big topic's plan places its partitions slice by slice (from one rack-alternated order, computed
    once): exactly the tuples one place_replicas call gives."""
    usable = [UsableBroker(b, f"r{b % racks}") for b in range(1, brokers + 1)]
    plan = TopicPlan("t", 500, factor, start, usable, {})
    sliced: list[tuple[int, ...]] = []
    for first in range(0, 500, 7):
        sliced.extend(plan.place(first, min(7, 500 - first)))
    assert sliced == place_replicas(usable, 500, factor, start)


def test_a_prepared_topic_is_built_in_bounded_events_and_written_in_one_append_as_the_unsliced_one() -> None:
    """Placement and records in events cut by the time budget (1 ms per clock read, 5 ms budget), nothing
    written until the last step, whose one append is byte for byte what one CreateTopics event writes."""
    clock = CostClock(0)  # free until the test sets a cost
    prepared = _logic(clock, budget_ms=5)
    log = _cluster_with_a_topic(prepared, 3)
    whole = _logic(None, budget_ms=0)
    whole_log = _cluster_with_a_topic(whole, 3)
    topic = cpb.CreatableTopic(
        name="mid",
        num_partitions=600,
        replication_factor=2,
        configs=[cpb.TopicConfig(name="retention.ms", value="9")],
    )
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
    assert is_prepared_topic(topic, 1_000, 1, PREPARED_TOPIC_MIN_PARTITIONS)
    outcome, plan = prepared.plan_topic(request, len(log), prepared=True)
    assert plan is not None and not outcome.records
    clock.cost_ms = 1
    events = 1
    while not prepared.prepare_some(plan, Deadline(clock, 5), 1_000):
        events += 1
        assert prepared.image.topic("mid") is None  # nothing written while preparing
    clock.cost_ms = 0
    assert events > 3
    written = prepared.create_prepared_topic(plan, False, len(log))
    expected = whole.create_topics(request, len(whole_log))
    assert written.response == expected.response
    assert written.encoded() == expected.encoded()  # (the prepared one encoded as it was built)
    assert prepared.image.topic("mid") == whole.image.topic("mid")


def test_a_prepared_topic_takes_the_brokers_as_they_are_when_it_is_written() -> None:
    """A broker starts a controlled shutdown between the preparation and the write: the records built
    earlier are rebuilt, and no partition has it in its ISR or as its leader."""
    logic = _logic(None, budget_ms=0)
    log = _cluster_with_a_topic(logic, 3)
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatableTopic(name="mid", num_partitions=300, replication_factor=3)]
    )
    _, plan = logic.plan_topic(request, len(log), prepared=True)
    assert plan is not None
    while not logic.prepare_some(plan, Deadline(None, 0), 100):
        pass
    shutdown = logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=3), len(log))
    log.extend(shutdown.records)
    while logic.has_bulk_jobs():
        log.extend(logic.continue_bulk_jobs(len(log)))
    written = logic.create_prepared_topic(plan, False, len(log))
    assert written.response.topics[0].error_code == ErrorCode.NONE
    topic = logic.image.topic("mid")
    assert topic is not None and len(topic.partitions) == 300
    assert all(3 not in p.isr and p.leader != 3 and p.isr for p in topic.partitions)
    assert any(3 in p.replicas for p in topic.partitions)


def test_topics_planned_together_are_placed_one_after_the_other() -> None:
    """Two plans before either is written: the second's placement starts after the first's partitions,
    as consecutive topics of one request would (not every topic's leaders from the same broker)."""
    logic = _logic(None, budget_ms=0)
    log = _cluster_with_a_topic(logic, 3)

    def planned(name: str) -> TopicPlan:
        request = cpb.CreateTopicsRequest(
            cluster_id=CLUSTER,
            topics=[cpb.CreatableTopic(name=name, num_partitions=301, replication_factor=1)],
        )
        _, plan = logic.plan_topic(request, len(log), prepared=True)
        assert plan is not None
        return plan

    first, second = planned("a"), planned("b")
    assert second.start_index == first.start_index + 301
    for plan in (first, second):
        while not logic.prepare_some(plan, Deadline(None, 0), 1_000):
            pass
        log.extend(logic.create_prepared_topic(plan, False, len(log)).all_records())
    a, b = logic.image.topic("a"), logic.image.topic("b")
    assert a is not None and b is not None
    assert a.partitions[0].leader != b.partitions[0].leader
    assert planned("c").start_index == 3 + 301 + 301  # nothing planned ahead any more


async def test_a_prepared_topic_through_the_controller_is_one_append_after_bounded_events() -> None:
    clock = ManualClock()
    raft, controller = await _started(ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000), clock)
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        start = len(controller.writes.queue.processed)
        batches = len(raft.log)
        request = cpb.CreateTopicsRequest(
            cluster_id=CLUSTER,
            topics=[
                cpb.CreatableTopic(name="mid", num_partitions=300, replication_factor=2),
                cpb.CreatableTopic(name="small", num_partitions=2, replication_factor=2),
                _assigned("mid-assigned", [[1, 2]] * 280),
            ],
        )
        response = await asyncio.wait_for(controller.create_topics(request), 10)
        assert [t.name for t in response.topics] == ["mid", "small", "mid-assigned"]
        assert all(t.error_code == ErrorCode.NONE for t in response.topics)
        processed = controller.writes.queue.processed[start:]
        assert processed.count("create-topic-plan") == 2 and processed.count("create-topic-prepare") >= 2
        for name, count in (("mid", 300), ("mid-assigned", 280)):
            topic = controller.committed.topic(name)
            assert topic is not None and len(topic.partitions) == count
            # every record of the topic in one batch (one append)
            holding = [
                b
                for b in raft.log[batches:]
                if any(
                    records.decode_value(r.value).WhichOneof("record") == "partition"
                    and records.decode_value(r.value).partition.topic_id == topic.topic_id
                    for r in b.records
                )
            ]
            assert len(holding) == 1
        assert not controller.committed.transaction
    finally:
        await controller.stop()


def test_a_prepared_explicit_assignment_in_any_order_is_the_unsliced_one() -> None:
    """Entries in shuffled order, checked a few per event: the records are built once every entry was
    checked, and the append is byte for byte what one CreateTopics event writes."""
    order = list(range(300))
    random.Random(3).shuffle(order)
    topic = _assigned("assigned", _rotating(300), order)
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
    prepared = _logic(None, budget_ms=0)
    log = _cluster_with_a_topic(prepared, 3)
    whole = _logic(None, budget_ms=0)
    whole_log = _cluster_with_a_topic(whole, 3)
    _, plan = prepared.plan_topic(request, len(log), prepared=True)
    assert plan is not None
    events = 1
    while not prepared.prepare_some(plan, Deadline(None, 0), 64):
        events += 1
    assert events >= 300 * 2 // 64  # checking, then building
    written = prepared.create_prepared_topic(plan, False, len(log))
    expected = whole.create_topics(request, len(whole_log))
    assert written.response == expected.response
    assert written.encoded() == expected.encoded()  # (the prepared one encoded as it was built)
