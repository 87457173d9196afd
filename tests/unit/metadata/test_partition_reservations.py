"""Partitions of topics still being created count for the partition limits of every other request
(issue #17): while a big topic is written in slices, and while a big or prepared topic's plan waits for
its write, CreateTopics and CreatePartitions are checked against ``max.partitions`` /
``max.broker.partitions`` as if all its partitions existed — released when it is written, deleted
mid-way, undone or refused, and rebuilt by a new active controller that resumes the transaction."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections import Counter

import pytest

from kraft.clock import Deadline, ManualClock
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings, TopicPlan
from kraft.metadata.image import MetadataImage
from kraft.metadata.partition_growth import create_partitions
from kraft.metadata.partition_reservations import PartitionReservations, placement_bound
from kraft.metadata.placement import UsableBroker, place_replicas
from kraft.metadata.topic_rules import check_partition_limits
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller import CLUSTER, activate_broker, settle
from .test_sliced_topics import _assigned, _rotating, start_and_hold_part_written
from .test_work_budget import _cluster_with_a_topic, _replay, _started

BIG = 95  # partitions of the big topic, rf 2 over brokers 1-3, written 10 per slice
SLICE = 10


def _logic(max_partitions: int = 1_000_000, max_broker_partitions: int = 10_000) -> ControllerLogic:
    ids = (f"topic-{i}" for i in itertools.count())
    return ControllerLogic(
        _settings(max_partitions, max_broker_partitions),
        MetadataImage.empty(),
        0,
        new_topic_id=lambda: next(ids),
    )


def _settings(max_partitions: int, max_broker_partitions: int) -> ControllerSettings:
    return ControllerSettings(
        CLUSTER,
        max_changes_per_write=SLICE,
        max_event_time_ms=0,
        max_partitions=max_partitions,
        max_broker_partitions=max_broker_partitions,
    )


def _big_request(name: str = "huge", validate_only: bool = False) -> cpb.CreateTopicsRequest:
    topic = cpb.CreatableTopic(name=name, num_partitions=BIG, replication_factor=2)
    return cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic], validate_only=validate_only)


def _planned(logic: ControllerLogic, request: cpb.CreateTopicsRequest, prepared: bool = False) -> TopicPlan:
    outcome, plan = logic.plan_topic(request, 0, prepared=prepared)
    assert plan is not None, outcome.response
    return plan


def _start_big(logic: ControllerLogic, log: list[pb.MetadataRecord]) -> None:
    """Plan and count the big topic (slices of a work unit), then its first slice."""
    plan = _planned(logic, _big_request())
    while not plan.place_some(Deadline(None, 0), SLICE):
        pass
    first = logic.create_planned_topic(plan, False, len(log))
    assert first.response.topics[0].error_code == ErrorCode.NONE
    log.extend(first.records)


def _slices(logic: ControllerLogic, log: list[pb.MetadataRecord], count: int) -> None:
    for _ in range(count):
        log.extend(logic.continue_bulk_jobs(len(log)))


def _create(
    logic: ControllerLogic, log: list[pb.MetadataRecord], partitions: int, rf: int, name: str = "small"
) -> cpb.CreatableTopicResult:
    topic = cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=rf)
    out = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), len(log))
    log.extend(out.records)
    return out.response.topics[0]


def _written(logic: ControllerLogic, name: str = "huge") -> int:
    topic = logic.image.topic(name)
    return 0 if topic is None else len(topic.partitions)


def _replicas_written(logic: ControllerLogic) -> Counter[int]:
    topic = logic.image.topic("huge")
    assert topic is not None
    return Counter(b for partition in topic.partitions for b in partition.replicas)


def _big_by_broker() -> Counter[int]:
    """The big topic's replicas per broker: placed after the 3 partitions of ``big`` (the cursor)."""
    brokers = [UsableBroker(b, None) for b in (1, 2, 3)]
    return Counter(b for replicas in place_replicas(brokers, BIG, 2, 3) for b in replicas)


def _limits_broker_tight() -> int:
    """max.broker.partitions leaving room for 2 more replicas on the fullest broker once the big
    topic is complete (each broker hosts 3 replicas of ``big``)."""
    return 3 + max(_big_by_broker().values()) + 2


def test_the_big_topic_counts_whole_for_max_partitions_while_written_and_not_after_its_deletion() -> None:
    limit = 3 + BIG + 5  # ``big`` (3) + the big topic + room for 5
    logic = _logic(max_partitions=limit)
    log = _cluster_with_a_topic(logic, 3)
    _start_big(logic, log)
    _slices(logic, log, 2)
    assert 0 < _written(logic) < BIG and logic.image.transaction
    assert logic.reservations.partitions == BIG - _written(logic)
    refused = _create(logic, log, 6, 1)
    assert refused.error_code == ErrorCode.POLICY_VIOLATION  # counted only as written: 3 + 30 + 6 fits
    assert "max.partitions" in refused.error_message and "reserved by topics being created" in (
        refused.error_message
    )
    assert _create(logic, log, 5, 1).error_code == ErrorCode.NONE  # exactly up to the limit
    assert _create(logic, log, 1, 1, name="one-more").error_code == ErrorCode.POLICY_VIOLATION
    deleted = logic.delete_topics(cpb.DeleteTopicsRequest(cluster_id=CLUSTER, names=["huge"]), len(log))
    log.extend(deleted.records)
    assert logic.reservations.partitions == 0  # released with the deletion, not at the next slice
    assert _create(logic, log, 6, 1, name="after").error_code == ErrorCode.NONE
    while logic.has_bulk_jobs():  # the job only closes the transaction
        log.extend(logic.continue_bulk_jobs(len(log)))
    assert not logic.image.transaction and logic.image.topic("huge") is None


def test_the_big_topic_counts_whole_per_broker_while_written() -> None:
    logic = _logic(max_broker_partitions=_limits_broker_tight())
    log = _cluster_with_a_topic(logic, 3)
    _start_big(logic, log)
    _slices(logic, log, 1)
    assert logic.image.transaction
    refused = _create(logic, log, 3, 3)  # one replica on each broker, 3 per broker: one too many
    assert refused.error_code == ErrorCode.POLICY_VIOLATION
    assert "max.broker.partitions" in refused.error_message
    assert _create(logic, log, 2, 3).error_code == ErrorCode.NONE
    while logic.has_bulk_jobs():
        log.extend(logic.continue_bulk_jobs(len(log)))
    # written: the same limit from the image, nothing reserved any more
    assert logic.reservations.partitions == 0 and len(logic.reservations) == 0
    assert logic.reservations.replicas_on(1) == logic.reservations.replicas_on(2) == 0
    assert _create(logic, log, 1, 3, name="full").error_code == ErrorCode.POLICY_VIOLATION


def test_create_partitions_counts_the_big_topic_whole_while_it_is_written() -> None:
    logic = _logic(max_partitions=3 + BIG + 2)
    log = _cluster_with_a_topic(logic, 3)
    _start_big(logic, log)

    def grow(count: int) -> cpb.CreatePartitionsTopicResult:
        request = cpb.CreatePartitionsRequest(
            cluster_id=CLUSTER, topics=[cpb.CreatePartitionsTopic(name="big", count=count)]
        )
        out = create_partitions(logic, request, len(log))
        log.extend(out.records)
        return out.response.topics[0]

    refused = grow(3 + 3)
    assert refused.error_code == ErrorCode.POLICY_VIOLATION and "max.partitions" in refused.error_message
    assert grow(3 + 2).error_code == ErrorCode.NONE


@pytest.mark.parametrize("per_broker", [False, True])
def test_a_new_active_controller_resuming_the_big_topic_still_counts_it_whole(per_broker: bool) -> None:
    """Failover mid-way: the committed image holds part of the big topic and the open transaction;
    the new controller's reset reserves the rest from the plan in the log (per broker: an upper bound,
    then the exact count of the rest before it writes again)."""
    limits = (
        {"max_broker_partitions": _limits_broker_tight()} if per_broker else {"max_partitions": 3 + BIG + 2}
    )
    first = _logic(**limits)
    log = _cluster_with_a_topic(first, 3)
    _start_big(first, log)
    _slices(first, log, 2)
    committed = _replay(log)
    written = committed.topic("huge")
    assert written is not None and committed.transaction
    done = len(written.partitions)
    second = ControllerLogic(
        _settings(limits.get("max_partitions", 1_000_000), limits.get("max_broker_partitions", 10_000)),
        committed,
        0,
        new_topic_id=lambda: "after-failover",
    )
    assert second.reservations.partitions == BIG - done
    small = (3, 3) if per_broker else (3, 1)
    assert _create(second, log, *small).error_code == ErrorCode.POLICY_VIOLATION
    # the rest is counted per broker before the writing resumes: then the reservation is exact
    full = _big_by_broker()
    exact_while_unwritten = False
    while second.has_bulk_jobs():
        # never below the replicas still to be written on a broker; exact once counted
        rest = {b: full[b] - _replicas_written(second)[b] for b in (1, 2, 3)}
        reserved = {b: second.reservations.replicas_on(b) for b in (1, 2, 3)}
        assert all(reserved[b] >= rest[b] for b in rest), (reserved, rest)
        if reserved == rest and _written(second) < BIG:
            exact_while_unwritten = True
            if _written(second) < BIG - 2:
                assert _create(second, log, *small, name="still").error_code == ErrorCode.POLICY_VIOLATION
        assert second.reservations.partitions == BIG - _written(second)
        log.extend(second.continue_bulk_jobs(len(log)))
    assert exact_while_unwritten
    assert second.reservations.partitions == 0 and not second.image.transaction
    huge = _replay(log).topic("huge")
    assert huge is not None and len(huge.partitions) == BIG
    allowed = (2, 3) if per_broker else (2, 1)
    assert _create(second, log, *allowed, name="fits").error_code == ErrorCode.NONE


def test_a_new_active_controller_undoing_an_explicit_big_topic_reserves_nothing() -> None:
    limit = 3 + 95 + 2
    first = _logic(max_partitions=limit)
    log = _cluster_with_a_topic(first, 3)
    plan = _planned(
        first, cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[_assigned("pinned", _rotating(95))])
    )
    while not plan.place_some(Deadline(None, 0), SLICE):
        pass
    log.extend(first.create_planned_topic(plan, False, len(log)).records)
    assert first.reservations.partitions == 95 - _written(first, "pinned") > 0
    assert _create(first, log, 3, 1).error_code == ErrorCode.POLICY_VIOLATION
    _slices(first, log, 2)
    second = ControllerLogic(_settings(limit, 10_000), _replay(log), 0, new_topic_id=lambda: "again")
    assert second.reservations.partitions == 0  # undone: its rest is never written
    while second.has_bulk_jobs():
        log.extend(second.continue_bulk_jobs(len(log)))
    assert _create(second, log, 3, 1).error_code == ErrorCode.NONE


def test_a_plan_waiting_for_its_write_reserves_its_partitions_and_replicas_as_counted() -> None:
    logic = _logic(max_partitions=3 + BIG + 2)
    log = _cluster_with_a_topic(logic, 3)
    plan = _planned(logic, _big_request())
    assert logic.reservations.partitions == BIG and logic.reservations.replicas_on(1) == 0
    assert _create(logic, log, 3, 1).error_code == ErrorCode.POLICY_VIOLATION
    while not plan.place_some(Deadline(None, 0), SLICE):
        pass
    assert {b: logic.reservations.replicas_on(b) for b in (1, 2, 3)} == dict(_big_by_broker())
    # its own check for the write does not count itself; then the written rest stays reserved
    first = logic.create_planned_topic(plan, False, len(log))
    assert first.response.topics[0].error_code == ErrorCode.NONE
    log.extend(first.records)
    assert logic.reservations.partitions == BIG - _written(logic) and len(logic.reservations) == 1
    plan.release()  # what the shell does when the call ends: the write's reservation is not the plan's
    assert logic.reservations.partitions == BIG - _written(logic)


def test_a_prepared_topic_and_a_big_topic_pending_together_each_count_the_other() -> None:
    prepared_size = 300
    logic = _logic(max_partitions=3 + BIG + prepared_size + 2)
    log = _cluster_with_a_topic(logic, 3)
    _start_big(logic, log)
    topic = cpb.CreatableTopic(name="prepared", num_partitions=prepared_size, replication_factor=1)
    prepared = _planned(logic, cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), prepared=True)
    assert logic.reservations.partitions == BIG - _written(logic) + prepared_size
    while not logic.prepare_some(prepared, Deadline(None, 0), 1_000):
        pass
    assert _create(logic, log, 3, 1).error_code == ErrorCode.POLICY_VIOLATION
    assert _create(logic, log, 2, 1).error_code == ErrorCode.NONE  # exactly up to the limit
    # the prepared topic's own write counts the big topic's unwritten rest (and not itself)
    written = logic.create_prepared_topic(prepared, False, len(log))
    assert written.response.topics[0].error_code == ErrorCode.NONE
    log.extend(written.all_records())
    assert logic.reservations.partitions == BIG - _written(logic)
    while logic.has_bulk_jobs():
        log.extend(logic.continue_bulk_jobs(len(log)))
    assert logic.reservations.partitions == 0
    assert logic.image.partition_count() == 3 + BIG + prepared_size + 2


def test_a_prepared_topic_that_no_longer_fits_is_refused_at_its_write_and_reserves_nothing() -> None:
    """Before a plan's placement is counted its replicas per broker are not known, so a request in
    between may take the room on a broker; the plan's own check for its write refuses it then."""
    logic = _logic(max_broker_partitions=3 + 100 + 2)
    log = _cluster_with_a_topic(logic, 3)
    topic = cpb.CreatableTopic(name="prepared", num_partitions=300, replication_factor=1)  # 100 each
    prepared = _planned(logic, cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), prepared=True)
    assert _create(logic, log, 3, 3).error_code == ErrorCode.NONE  # counted before the placement
    while not logic.prepare_some(prepared, Deadline(None, 0), 1_000):
        pass
    assert _create(logic, log, 1, 3, name="more").error_code == ErrorCode.POLICY_VIOLATION  # counted now
    refused = logic.create_prepared_topic(prepared, False, len(log))
    assert refused.response.topics[0].error_code == ErrorCode.POLICY_VIOLATION and not refused.encoded()
    assert logic.reservations.partitions == 0 and len(logic.reservations) == 0
    assert _create(logic, log, 2, 3, name="fits").error_code == ErrorCode.NONE


def test_a_refused_or_dry_run_plan_reserves_nothing() -> None:
    logic = _logic()
    log = _cluster_with_a_topic(logic, 3)
    dry = _planned(logic, _big_request(validate_only=True))
    assert logic.reservations.partitions == 0
    while not dry.place_some(Deadline(None, 0), SLICE):
        pass
    answer = logic.create_planned_topic(dry, True, len(log))
    assert answer.response.topics[0].error_code == ErrorCode.NONE and not answer.records
    assert logic.reservations.partitions == 0 and not logic.has_bulk_jobs()
    bad = cpb.CreatableTopic(name="bad")
    for partition_id in range(29):
        bad.assignments.add(partition=partition_id, broker_ids=[1, 2])
    bad.assignments.add(partition=29, broker_ids=[2, 9])  # an unregistered broker
    plan = _planned(logic, cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[bad]))
    assert logic.reservations.partitions == 30
    with pytest.raises(KraftError):
        while not plan.place_some(Deadline(None, 0), SLICE):
            pass
    assert logic.reservations.partitions == 0 and logic.reservations.replicas_on(1) == 0


def test_reservations_release_once_and_a_cleared_registry_ignores_old_ones() -> None:
    registry = PartitionReservations()
    first = registry.reserve(4, {1: 4, 2: 4})
    second = registry.reserve(2)
    second.add_replicas([(1, 3), (3, 1)])
    assert registry.partitions == 6 and registry.replicas_on(1) == 6 and registry.replicas_on(3) == 2
    first.consume([(1, 2)])
    assert registry.partitions == 5 and registry.replicas_on(1) == 5 and registry.replicas_on(2) == 3
    first.set_replicas({2: 1})
    assert registry.replicas_on(1) == 2 and registry.replicas_on(2) == 1
    first.release()
    first.release()
    assert registry.partitions == 2 and registry.replicas_on(2) == 0 and len(registry) == 1
    registry.clear()
    second.release()
    second.add_replicas([(1,)])
    fresh = registry.reserve(1, {1: 1})
    assert registry.partitions == 1 and registry.replicas_on(1) == 1 and fresh.held and not second.held


@pytest.mark.parametrize("racks", [None, ["a"], ["a", "b"], ["a", "a", "b"]])
def test_the_resumed_plans_bound_per_broker_is_never_below_its_placement(racks: list[str] | None) -> None:
    """:func:`placement_bound` against the placement itself, every range of small plans."""
    for count in range(1, 8):
        brokers = [UsableBroker(b, None if racks is None else racks[b % len(racks)]) for b in range(count)]
        for factor in range(1, count + 1):
            for start in (0, 1, count, 2 * count + 1, 17):
                placed = place_replicas(brokers, 3 * count * count, factor, start)
                for first in range(0, len(placed), max(1, count // 2)):
                    for length in (1, count - 1, count, count + 1, 2 * count + 3, len(placed) - first):
                        rest = placed[first : first + length]
                        if not rest:
                            continue
                        actual = Counter(b for replicas in rest for b in replicas)
                        bound = placement_bound(brokers, len(rest), factor)
                        assert all(actual[b] <= bound[b] for b in actual), (count, factor, start, first)


def _reserved(controller: QuorumController) -> int:
    logic = controller.state.logic
    assert logic is not None
    return logic.reservations.partitions


async def test_through_the_controller_a_request_during_a_big_topics_write_counts_it_whole() -> None:
    clock = ManualClock()
    options = ControllerOptions(
        noop_interval_ms=0,
        session_timeout_ms=60_000,
        max_work_unit_records=4,
        max_uncommitted_bulk_records=4,
        max_partitions=40 + 3,
    )
    raft, controller = await _started(options, clock)
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        big = cpb.CreatableTopic(name="huge", num_partitions=40, replication_factor=2)
        create, written = await start_and_hold_part_written(raft, controller, big, 40)
        assert not create.done() and 0 < written() < 40 and _reserved(controller) > 0

        def small(name: str, partitions: int) -> cpb.CreateTopicsRequest:
            topic = cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=1)
            return cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])

        over = asyncio.create_task(controller.create_topics(small("over", 4)))
        fits = asyncio.create_task(controller.create_topics(small("fits", 3)))
        await settle()
        raft.release()
        assert (await asyncio.wait_for(create, 5)).topics[0].error_code == ErrorCode.NONE
        refused = (await asyncio.wait_for(over, 5)).topics[0]
        assert (
            refused.error_code == ErrorCode.POLICY_VIOLATION and "max.partitions=43" in refused.error_message
        )
        assert (await asyncio.wait_for(fits, 5)).topics[0].error_code == ErrorCode.NONE
        assert written() == 40 and _reserved(controller) == 0
    finally:
        await controller.stop()


@pytest.mark.parametrize("placing", [False, True])
@pytest.mark.parametrize(("partitions", "work_unit"), [(300, 1_000), (40, 32)])  # prepared; big
async def test_a_plan_given_up_by_its_caller_stops_reserving(
    partitions: int, work_unit: int, placing: bool
) -> None:
    """The caller's CreateTopics is cancelled once the plan was made, or while it is placed (before its
    write): the reservation made with the plan is released, not held until the next failover."""
    clock = ManualClock()
    options = ControllerOptions(
        noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=work_unit
    )
    _raft, controller = await _started(options, clock)
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        start = len(controller.writes.queue.processed)
        topic = cpb.CreatableTopic(name="given-up", num_partitions=partitions, replication_factor=2)
        create = asyncio.create_task(
            controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]))
        )

        def placing_started() -> bool:
            processed = controller.writes.queue.processed[start:]
            return "create-topic-prepare" in processed or processed.count("create-topic-plan") >= 2

        for _ in range(1000):
            await asyncio.sleep(0)
            if _reserved(controller) > 0 and (placing_started() or not placing):
                break
        assert _reserved(controller) == partitions and controller.committed.topic("given-up") is None
        assert placing_started() == placing and not create.done()
        create.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await create
        await settle()
        assert _reserved(controller) == 0 and controller.committed.topic("given-up") is None
    finally:
        await controller.stop()


@pytest.mark.parametrize("per_broker", [False, True])
def test_plans_pending_together_are_admitted_in_request_order_as_the_unsliced_request(
    per_broker: bool,
) -> None:
    """Three prepared topics of one request, all planned and placed before the first is written, with
    room for two: the first two are created and the third refused — what one unsliced CreateTopics of
    the three gives — not the first refused for the room the later plans hold."""
    limits = {"max_broker_partitions": 3 + 2 * 300 // 3} if per_broker else {"max_partitions": 3 + 2 * 300}
    topics = [cpb.CreatableTopic(name=f"p{i}", num_partitions=300, replication_factor=1) for i in range(3)]
    whole = _logic(**limits)
    whole_log = _cluster_with_a_topic(whole, 3)
    unsliced = whole.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=topics), len(whole_log))
    expected = [t.error_code for t in unsliced.response.topics]
    assert expected == [ErrorCode.NONE, ErrorCode.NONE, ErrorCode.POLICY_VIOLATION]
    logic = _logic(**limits)
    log = _cluster_with_a_topic(logic, 3)
    got: dict[str, int] = {}
    plans: list[TopicPlan] = []
    for topic in topics:  # refused when planned already, for the cluster-wide count (known at once)
        outcome, plan = logic.plan_topic(
            cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), len(log), prepared=True
        )
        if plan is None:
            got[topic.name] = outcome.response.topics[0].error_code
        else:
            plans.append(plan)
    assert len(plans) == (3 if per_broker else 2)
    for plan in plans:
        while not logic.prepare_some(plan, Deadline(None, 0), 1_000):
            pass
    for plan in plans:
        out = logic.create_prepared_topic(plan, False, len(log))
        log.extend(out.all_records())
        got[plan.name] = out.response.topics[0].error_code
    assert [got[t.name] for t in topics] == expected
    assert logic.reservations.partitions == 0 and len(logic.reservations) == 0
    for name in ("p0", "p1"):
        created, want = logic.image.topic(name), _replay(whole_log + unsliced.records).topic(name)
        assert created is not None and want is not None and len(created.partitions) == 300


def test_a_plans_check_leaves_out_only_plans_made_after_it() -> None:
    registry = PartitionReservations()
    earlier = registry.reserve(3, {1: 3}, planned=True)
    writing = registry.reserve(5, {1: 5, 2: 5})  # a write under way: counted by every check
    seq = registry.take_seq()
    later = registry.reserve(7, {2: 7}, planned=True)
    after_that = registry.reserve(1, {1: 1}, planned=True)
    for left_out in (registry.left_out(seq - 1, None), registry.left_out(earlier.seq, None)):
        # not the write under way
        assert (left_out.partitions, left_out.replicas()) == (8, {1: 1, 2: 7})
        assert (left_out.replicas_on(1), left_out.replicas_on(2), left_out.replicas_on(3)) == (1, 7, 0)
    later.release()
    left_out = registry.left_out(earlier.seq, None)
    assert (left_out.partitions, left_out.replicas()) == (1, {1: 1})
    assert writing.seq < seq <= after_that.seq
    lookup = registry.replicas_lookup()  # the checks' C-level replicas_on: 0 for a broker with none
    assert [lookup(b) for b in (1, 2, 3)] == [registry.replicas_on(b) for b in (1, 2, 3)] == [9, 5, 0]
    after_that.release()  # changed in place: the lookup follows
    assert lookup(1) == 8 and 3 not in registry._replicas


def test_a_checks_left_out_replicas_are_summed_only_for_a_broker_the_full_count_refuses() -> None:
    """The later plans' replicas on a broker are asked for only where counting every reservation would
    refuse (summing them for every broker was O(later plans x brokers) per write: ~0.5 s of the active
    controller's CPU for one request of 100 topics x 1,000 partitions); the decision and the message
    are those of the exact count."""
    registry = PartitionReservations()
    mine = registry.reserve(10, {1: 5, 2: 5}, planned=True)
    registry.reserve(10, {1: 1, 2: 6}, planned=True)  # made later: left out of mine's check
    left_out = registry.left_out(mine.seq, None)
    mine.release()  # as _recheck_plan: its own reservation goes before its check
    asked: list[int] = []

    def later_on(broker_id: int) -> int:
        asked.append(broker_id)
        return left_out.replicas_on(broker_id)

    def check(limit: int) -> None:
        check_partition_limits(
            "t",
            10,
            0,
            1_000,
            {1: 5, 2: 5},
            lambda b: 0,
            limit,
            registry.partitions - left_out.partitions,
            registry.replicas_on,
            later_on,
        )

    check(10)  # broker 1: 5 + 1 fits; broker 2: 5 + 6 does not, less the later plan's 6 it does
    assert asked == [2]
    asked.clear()
    check(11)  # the full count fits everywhere: nothing summed
    assert asked == []
    registry.reserve(6, {2: 6})  # a write under way: never left out
    with pytest.raises(KraftError) as refused:
        check(10)
    assert refused.value.code == ErrorCode.POLICY_VIOLATION
    assert "broker 2, which hosts 6 (+6 reserved by topics being created)" in refused.value.message
    assert asked == [2]


@pytest.mark.parametrize("big_first", [True, False])
@pytest.mark.parametrize(("partitions", "work_unit"), [(300, 1_000), (40, 32)])  # prepared; big
async def test_a_request_mixing_planned_and_small_topics_is_admitted_in_its_order(
    partitions: int, work_unit: int, big_first: bool
) -> None:
    """Room for the planned topic or the small one, not both: whichever the request lists first is
    created, as one unsliced CreateTopics does — though the planned topic reserves its partitions before
    the small one is checked, and the small one is written before the planned one's write."""
    limit = partitions + 2
    planned = cpb.CreatableTopic(name="planned", num_partitions=partitions, replication_factor=2)
    small = cpb.CreatableTopic(name="small", num_partitions=5, replication_factor=2)
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER, topics=[planned, small] if big_first else [small, planned]
    )
    whole = _logic(max_partitions=limit)
    whole_log = _cluster_with_a_topic(whole, 0)  # three brokers (a topic of 0 partitions is refused)
    expected = {t.name: t.error_code for t in whole.create_topics(request, len(whole_log)).response.topics}
    assert sorted(expected.values()) == [ErrorCode.NONE, ErrorCode.POLICY_VIOLATION]
    clock = ManualClock()
    options = ControllerOptions(
        noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=work_unit, max_partitions=limit
    )
    _raft, controller = await _started(options, clock)
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        start = len(controller.writes.queue.processed)
        response = await asyncio.wait_for(controller.create_topics(request), 10)
        assert {t.name: t.error_code for t in response.topics} == expected
        processed = controller.writes.queue.processed[start:]
        assert processed.count("create-topic-plan") >= 1  # planned apart from the small topic
        assert _reserved(controller) == 0
    finally:
        await controller.stop()
