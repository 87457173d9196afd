"""Bounded work units by time (``controller.max.event.time.ms``) on an injected clock.

A :class:`CostClock` stands in for slow work: every read of the clock advances it by a fixed cost, so a
budgeted loop (which reads the clock every ``CHECK_EVERY`` items) sees time pass in proportion to the
items it handled — on a ManualClock, with no dependence on how fast the host runs.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import logging
from collections.abc import Sequence

import pytest
from loop_fakes import CostClock
from metric_reads import family_sample
from prometheus_client.metrics import MetricWrapperBase
from pytest import MonkeyPatch

from kraft.clock import CHECK_EVERY, Deadline, ManualClock
from kraft.errors import ErrorCode
from kraft.metadata import controller_logic, records
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.controller_logic import CREATE_TOPIC_TRANSACTION, ControllerLogic, ControllerSettings
from kraft.metadata.controller_writes import SETTLE_PAUSE_MS
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.event_queue import ControllerEventQueue, EventPriority
from kraft.metadata.event_timings import EventTimings
from kraft.metadata.image import MetadataImage
from kraft.metadata.rejoin_index import RejoinIndex
from kraft.observability.gc_watch import GcWatch
from kraft.observability.logging import _FIELDS_ATTR, get_logger
from kraft.observability.metrics import CONTROLLER_EVENT_LONGEST, CONTROLLER_EVENT_PROCESSING_TIME
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .fake_raft import FakeRaft
from .test_controller import CLUSTER, ENDPOINTS, activate_broker, settle, step, until


def test_a_deadline_expires_after_its_budget_and_never_without_one() -> None:
    clock = ManualClock()
    deadline = Deadline(clock, 5)
    clock.advance(4)
    assert not deadline.expired()
    clock.advance(1)
    assert deadline.expired()
    unbounded = Deadline(clock, 0)
    clock.advance(1_000_000)
    assert not unbounded.expired()
    assert not Deadline(None, 5).expired()


def _logic(clock: ManualClock | None, budget_ms: int, max_changes: int = 1_000) -> ControllerLogic:
    ids = (f"topic-{i}" for i in itertools.count())
    return ControllerLogic(
        ControllerSettings(CLUSTER, max_changes_per_write=max_changes, max_event_time_ms=budget_ms),
        MetadataImage.empty(),
        0,
        new_topic_id=lambda: next(ids),
        clock=clock,
    )


def _cluster_with_a_topic(logic: ControllerLogic, partitions: int) -> list[pb.MetadataRecord]:
    """Three unfenced brokers and one topic of ``partitions`` (rf 3), every write committed at once."""
    log = unfenced_brokers(logic, [None, None, None])
    topic = cpb.CreatableTopic(name="big", num_partitions=partitions, replication_factor=3)
    created = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), len(log))
    log.extend(created.records)
    return log


def unfenced_brokers(logic: ControllerLogic, racks: Sequence[str | None]) -> list[pb.MetadataRecord]:
    """Brokers 1… registered with ``racks`` and unfenced, every write committed at once: the records."""
    log: list[pb.MetadataRecord] = []
    ids = range(1, len(racks) + 1)
    for broker_id, rack in zip(ids, racks, strict=True):
        request = cpb.RegisterBrokerRequest(
            cluster_id=CLUSTER, broker_id=broker_id, incarnation_id="i", rack=rack
        )
        log.extend(logic.register_broker(request, 0, len(log)).records)
    for broker_id in ids:
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=logic.image.brokers[broker_id].epoch,
            current_metadata_offset=99,
        )
        log.extend(logic.broker_heartbeat(beat, 0, len(log)).records)
    return log


def _shutdown_in_slices(logic: ControllerLogic, log: list[pb.MetadataRecord]) -> list[int]:
    """Controlled shutdown of broker 1, then every bulk slice; the record count of each append."""
    first = logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1), len(log))
    sizes = [len(first.records)]
    log.extend(first.records)
    while logic.has_bulk_jobs():
        more = logic.continue_bulk_jobs(len(log))
        sizes.append(len(more))
        log.extend(more)
    return sizes


def test_a_leave_job_slice_stops_at_the_time_budget_and_the_result_is_the_unbounded_one() -> None:
    # 1 ms per clock read = 1 ms per CHECK_EVERY partitions: a 5 ms budget ends a slice after ~5 reads,
    # long before the 1,000-record bound.
    clock = CostClock(0)  # free until the test sets a cost
    timed = _logic(clock, budget_ms=5)
    timed_log = _cluster_with_a_topic(timed, 900)
    untimed = _logic(None, budget_ms=5)
    untimed_log = _cluster_with_a_topic(untimed, 900)
    clock.cost_ms = 1
    timed_sizes = _shutdown_in_slices(timed, timed_log)
    untimed_sizes = _shutdown_in_slices(untimed, untimed_log)
    assert len(untimed_sizes) <= 2  # the record bound alone: the whole job fits one slice
    assert len(timed_sizes) > 5
    assert all(0 < size <= 6 * CHECK_EVERY for size in timed_sizes[1:-1]), timed_sizes
    assert sum(timed_sizes) == sum(untimed_sizes)
    timed_topic, untimed_topic = timed.image.topic("big"), untimed.image.topic("big")
    assert timed_topic is not None and untimed_topic is not None
    assert timed_topic.partitions == untimed_topic.partitions
    assert timed.leader_count(1) == 0


def test_a_create_topics_part_stops_at_the_time_budget_after_a_whole_topic() -> None:
    clock = CostClock(0)  # free until the test sets a cost
    logic = _logic(clock, budget_ms=5)
    log = _cluster_with_a_topic(logic, 3)
    clock.cost_ms = 2  # each topic reads the clock once: ~3 topics fit in 5 ms
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        topics=[cpb.CreatableTopic(name=f"t{i}", num_partitions=2, replication_factor=2) for i in range(10)],
    )
    outcome = logic.create_topics(request, len(log))
    done = [t.name for t in outcome.response.topics]
    assert 1 <= len(done) < 10 and done == [f"t{i}" for i in range(len(done))]
    assert all(t.error_code == ErrorCode.NONE for t in outcome.response.topics)
    assert {r.topic.name for r in outcome.records if r.WhichOneof("record") == "topic"} == set(done)
    assert all(logic.image.topic(name) is not None for name in done)
    assert logic.image.topic(f"t{len(done)}") is None


async def _started(options: ControllerOptions, clock: ManualClock) -> tuple[FakeRaft, QuorumController]:
    raft = FakeRaft(1)
    controller = QuorumController(raft, CLUSTER, ENDPOINTS, options, clock=clock)
    await controller.start()
    raft.elect()
    await until(lambda: controller.is_active)
    return raft, controller


def assert_flags_of_a_rebuild(index: RejoinIndex, image: MetadataImage) -> None:
    fresh = RejoinIndex()
    fresh.rebuild(image.topics_by_id)
    assert index._flags == fresh._flags and index._by_broker == fresh._by_broker


async def _led_by_1(controller: QuorumController) -> dict[int, int]:
    """Brokers 1-3 active, and topic ``led-by-1``: 40 partitions on 1, 2, 3, all led by broker 1 (its
    controlled shutdown is a bulk job of 40 leader moves); the brokers' epochs."""
    epochs = {b: await activate_broker(controller, b) for b in (1, 2, 3)}
    topic = cpb.CreatableTopic(name="led-by-1")
    for p in range(40):
        topic.assignments.add(partition=p, broker_ids=[1, 2, 3])
    await controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]))
    return epochs


async def test_a_create_topics_cut_by_the_time_budget_still_answers_and_creates_every_topic() -> None:
    clock = CostClock(0)  # free until the test sets a cost
    _raft, controller = await _started(
        ControllerOptions(noop_interval_ms=0, session_timeout_ms=600_000), clock
    )
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        names = [f"t{i}" for i in range(12)]
        request = cpb.CreateTopicsRequest(
            cluster_id=CLUSTER,
            topics=[cpb.CreatableTopic(name=n, num_partitions=2, replication_factor=2) for n in names],
        )
        start = len(controller.writes.queue.processed)
        clock.cost_ms = 2
        response = await asyncio.wait_for(controller.create_topics(request), 10)
        clock.cost_ms = 0
        assert [t.name for t in response.topics] == names
        assert all(t.error_code == ErrorCode.NONE for t in response.topics)
        assert all(controller.committed.topic(n) is not None for n in names)
        parts = controller.writes.queue.processed[start:].count("create-topics")
        assert parts > 1  # the one 24-record part was cut by time, not by records
    finally:
        await controller.stop()


async def test_a_heartbeat_is_answered_while_a_controlled_shutdown_is_in_progress() -> None:
    """The shutdown's slices wait for their commits (a slow quorum); a heartbeat of another broker is
    answered meanwhile, and the shutdown finishes once commits resume."""
    clock = ManualClock()
    options = ControllerOptions(
        noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=4, max_uncommitted_bulk_records=4
    )
    raft, controller = await _started(options, clock)
    try:
        epochs = await _led_by_1(controller)

        def leads_1() -> int:
            led = controller.committed.topic("led-by-1")
            assert led is not None
            return sum(1 for p in led.partitions if p.leader == 1)

        shutdown = asyncio.create_task(
            controller.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1))
        )
        for _ in range(1000):
            await asyncio.sleep(0)
            if 0 < leads_1() < 40:
                break
        raft.hold_commits = True
        await settle()
        assert not shutdown.done() and controller.logic is not None and controller.logic.has_bulk_jobs()
        beat = await asyncio.wait_for(
            controller.broker_heartbeat(
                cpb.BrokerHeartbeatRequest(
                    cluster_id=CLUSTER, broker_id=2, broker_epoch=epochs[2], current_metadata_offset=epochs[2]
                )
            ),
            5,
        )
        assert beat.error_code == ErrorCode.NONE and not beat.is_fenced
        assert not shutdown.done() and 0 < leads_1() < 40  # still in progress when the heartbeat answered
        raft.release()
        answer = await asyncio.wait_for(shutdown, 5)
        assert answer.error_code == ErrorCode.NONE and leads_1() == 0
    finally:
        await controller.stop()


async def test_bulk_slices_ask_raft_to_hold_them_for_the_next_and_the_last_is_cut_at_once() -> None:
    clock = ManualClock()
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=4)
    raft, controller = await _started(options, clock)
    try:
        await _led_by_1(controller)
        before = len(raft.holds)
        answer = await asyncio.wait_for(
            controller.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1)), 5
        )
        assert answer.error_code == ErrorCode.NONE
        holds = raft.holds[before:]
        # the request's own event (registration change + first slice), then slices of 4: all but the
        # last held for the next, the last cut at once (the answer waits for it)
        assert holds[0] is False and holds[-1] is False
        assert holds[1:-1] and all(holds[1:-1]), holds
    finally:
        await controller.stop()


async def test_a_last_slice_that_writes_nothing_ends_the_hold_of_the_slices_before_it() -> None:
    # Broker 1 leads 7 partitions of the first topic and is in none of the second: the request's event
    # moves 3 (a registration change + 3 = the unit of 4), the next slice the other 4 (held: the job is
    # not done), and the last only scans the second topic — nothing to append, so it ends the hold
    # (before: the held slice waited for Raft's linger bound).
    clock = ManualClock()
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=4)
    raft, controller = await _started(options, clock)
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        led = cpb.CreatableTopic(name="led-by-1")
        for p in range(7):
            led.assignments.add(partition=p, broker_ids=[1, 2, 3])
        other = cpb.CreatableTopic(name="without-1")
        for p in range(3):
            other.assignments.add(partition=p, broker_ids=[2, 3])
        for created in (led, other):  # in this order (the leave job's)
            await controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[created]))
        before, ended = len(raft.holds), raft.holds_ended
        answer = await asyncio.wait_for(
            controller.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1)), 5
        )
        assert answer.error_code == ErrorCode.NONE
        assert raft.holds[before:] == [False, True]  # the request's event, then the held slice
        assert raft.holds_ended == ended + 1
    finally:
        await controller.stop()


async def test_flags_a_bulk_job_leaves_dirty_are_settled_in_events_once_it_is_done() -> None:
    clock = ManualClock()
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=4)
    _raft, controller = await _started(options, clock)
    try:
        await _led_by_1(controller)
        logic = controller.logic
        assert logic is not None
        index = logic.rejoin_index
        index.lazy_min_changes = 1  # every slice a bulk delta (the default takes 64 changes)
        seen_dirty = []
        advance = index.advance

        def watch(*args: object) -> None:
            advance(*args)  # type: ignore[arg-type]
            seen_dirty.append(index.settling)

        vars(index)["advance"] = watch
        await asyncio.wait_for(
            controller.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1)), 5
        )
        assert any(seen_dirty)  # the slices left their flags to settle
        await until(lambda: not index.settling)
        # settled, the flags are a rebuild's: every partition now led by 2, broker 1 out of its ISR —
        # stable since session 20 (no election moves it), nothing flagged
        assert index.current_for is logic.image.topics_by_id
        assert_flags_of_a_rebuild(index, logic.image)
        assert index.leader_counts[2] == 40
    finally:
        await controller.stop()


async def test_the_settling_after_a_bulk_job_pauses_between_its_slices(monkeypatch: MonkeyPatch) -> None:
    # Slices of 8 partitions: 40 dirty ones take 5, each after a pause of SETTLE_PAUSE_MS on the clock
    # (nothing waits for the settling; heartbeats right after a bulk job must not wait behind it).
    monkeypatch.setattr(controller_logic, "SETTLE_SLICE_PARTITIONS", 8)
    clock = ManualClock()
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=4)
    _raft, controller = await _started(options, clock)
    try:
        await _led_by_1(controller)
        logic = controller.logic
        assert logic is not None
        index = logic.rejoin_index
        index.lazy_min_changes = 1
        await asyncio.wait_for(
            controller.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1)), 5
        )
        await settle()
        assert index.settling  # a slice or so, then the pause: the clock has not moved
        left = sum(len(ids) for ids in index._dirty.values())
        assert 0 < left < 40
        for _ in range(10):
            if not index.settling:
                break
            await step(controller, SETTLE_PAUSE_MS)
        assert not index.settling
        assert_flags_of_a_rebuild(index, logic.image)
    finally:
        await controller.stop()


def _sample(family: MetricWrapperBase, name: str, node: str, kind: str) -> float | None:
    return family_sample(family, name, node=node, kind=kind)


async def test_event_durations_are_measured_per_kind_and_a_slow_one_is_counted() -> None:
    clock = ManualClock()
    timings = EventTimings(901, clock, budget_ms=5, log=get_logger("test"))
    queue = ControllerEventQueue()
    queue.observe(clock, timings.record)

    def quick() -> None:
        clock.advance(1)

    def slow() -> None:
        clock.advance(40)  # 8x the budget

    await queue.run(EventPriority.NORMAL, "quick", quick)
    await queue.run(EventPriority.NORMAL, "slow", slow)
    await queue.close()
    assert timings.slow_threshold_ms == 20
    assert timings.slow_events == 1
    name = "kraft_controller_event_queue_processing_time_seconds"
    assert _sample(CONTROLLER_EVENT_PROCESSING_TIME, f"{name}_count", "901", "quick") == 1
    assert _sample(CONTROLLER_EVENT_PROCESSING_TIME, f"{name}_sum", "901", "slow") == 0.04
    longest = "kraft_controller_event_queue_longest_event_seconds"
    assert _sample(CONTROLLER_EVENT_LONGEST, longest, "901", "slow") == 0.04
    assert _sample(CONTROLLER_EVENT_LONGEST, longest, "901", "quick") == 0.001
    # A kind's series are looked up once and kept (issue #17, session 12): later events of it still land
    # in its own series, and a longer one moves its longest.
    again = EventTimings(901, clock, budget_ms=5, log=get_logger("test"))
    for kind, ms in (("again-a", 1), ("again-b", 2), ("again-a", 3), ("again-a", 2)):
        again.record(kind, ms)
    assert _sample(CONTROLLER_EVENT_PROCESSING_TIME, f"{name}_count", "901", "again-a") == 3
    assert _sample(CONTROLLER_EVENT_PROCESSING_TIME, f"{name}_sum", "901", "again-a") == 0.006
    assert _sample(CONTROLLER_EVENT_PROCESSING_TIME, f"{name}_count", "901", "again-b") == 1
    assert _sample(CONTROLLER_EVENT_LONGEST, longest, "901", "again-a") == 0.003
    assert _sample(CONTROLLER_EVENT_LONGEST, longest, "901", "again-b") == 0.002


async def test_a_slow_events_line_says_how_much_was_its_own_cpu_and_how_much_the_gc(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A slow event's line separates the event's own work from waiting (cpu_ms below duration_ms: the
    loop thread waited for a core or the GIL) and from a collection its allocations triggered (gc_ms)."""
    caplog.set_level(logging.WARNING, logger="kraft.test-slow-line")
    clock = ManualClock()
    cpu_s = [0.0]
    watch = GcWatch(timer=iter(float(i) * 0.025 for i in itertools.count()).__next__)
    timings = EventTimings(
        902, clock, budget_ms=5, log=get_logger("test-slow-line"), cpu_clock=lambda: cpu_s[0], gc_watch=watch
    )
    queue = ControllerEventQueue()
    queue.observe(clock, timings.record, timings.start)

    def starved_and_collecting() -> None:
        clock.advance(60)  # 60 ms of wall time,
        cpu_s[0] += 0.035  # 35 of them on the loop thread's CPU,
        watch.install()
        try:
            gc.collect()  # 25 of those in a full collection
        finally:
            watch.uninstall()

    await queue.run(EventPriority.NORMAL, "bulk-slice", starved_and_collecting)
    await queue.close()
    [line] = [r for r in caplog.records if "controller_event_slow" in r.getMessage()]
    fields = getattr(line, _FIELDS_ATTR)
    assert (fields["kind"], fields["duration_ms"], fields["cpu_ms"], fields["gc_ms"]) == (
        "bulk-slice",
        60,
        35,
        25,
    )


# ---- a topic bigger than a work unit: planned, then written in slices inside a transaction ----


def _replay(log: list[pb.MetadataRecord]) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for offset, record in enumerate(log):
        delta.replay(records.decode_value(records.encode_value(record)), offset)
    assert not delta.replay_errors
    return delta.apply()


def _big_topic_request(partitions: int) -> cpb.CreateTopicsRequest:
    return cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        topics=[
            cpb.CreatableTopic(
                name="huge",
                num_partitions=partitions,
                replication_factor=2,
                configs=[cpb.TopicConfig(name="retention.ms", value="1000")],
            )
        ],
    )


def _start_big_topic(logic: ControllerLogic, log: list[pb.MetadataRecord], partitions: int) -> int:
    """Plan (in slices) and write the first slice; returns how many slices planning took."""
    request = _big_topic_request(partitions)
    assert logic.is_big_topic(request.topics[0])
    outcome, plan = logic.plan_topic(request, len(log))
    assert plan is not None and not outcome.records
    slices = 1
    while not plan.place_some(Deadline(None, 0), logic.settings.max_changes_per_write):
        slices += 1
    first = logic.create_planned_topic(plan, False, len(log))
    assert first.response.topics[0].error_code == ErrorCode.NONE
    log.extend(first.records)
    return slices


def test_a_big_topic_is_written_in_slices_inside_one_transaction_as_the_unsliced_one() -> None:
    sliced = _logic(None, budget_ms=0, max_changes=10)
    sliced_log = _cluster_with_a_topic(sliced, 3)
    whole = _logic(None, budget_ms=0, max_changes=10_000)
    whole_log = _cluster_with_a_topic(whole, 3)
    plan_slices = _start_big_topic(sliced, sliced_log, 95)
    assert plan_slices == 10
    sizes = [len(sliced_log) - len(whole_log)]
    while sliced.has_bulk_jobs():
        assert sliced.image.transaction.startswith(CREATE_TOPIC_TRANSACTION)
        assert sliced.creating(sliced.image.topic_ids_by_name["huge"])
        more = sliced.continue_bulk_jobs(len(sliced_log))
        sizes.append(len(more))
        sliced_log.extend(more)
    assert max(sizes) <= 10 and len(sizes) >= 10, sizes
    kinds = [r.WhichOneof("record") for r in sliced_log[len(whole_log) :]]
    assert kinds[:3] == ["begin_transaction", "topic", "config"] and kinds[-1] == "end_transaction"
    assert not sliced.image.transaction
    whole_log.extend(whole.create_topics(_big_topic_request(95), len(whole_log)).records)
    replayed, expected = _replay(sliced_log), _replay(whole_log)
    assert not replayed.transaction
    assert replayed.topic("huge") is not None and expected.topic("huge") is not None
    assert replayed.topic("huge").partitions == expected.topic("huge").partitions  # type: ignore[union-attr]
    assert replayed.configs == expected.configs


def test_a_new_active_controller_resumes_a_half_written_big_topic_from_its_image() -> None:
    """The first controller writes three slices and is gone; a logic reset on the committed image (the
    prefix of the log) finds the open transaction, writes the rest from the plan and closes it."""
    first = _logic(None, budget_ms=0, max_changes=10)
    log = _cluster_with_a_topic(first, 3)
    whole = _logic(None, budget_ms=0, max_changes=10_000)
    whole_log = _cluster_with_a_topic(whole, 3)
    _start_big_topic(first, log, 95)
    for _ in range(2):
        log.extend(first.continue_bulk_jobs(len(log)))
    committed = _replay(log)
    huge = committed.topic("huge")
    assert huge is not None and 0 < len(huge.partitions) < 95 and committed.transaction
    second = ControllerLogic(ControllerSettings(CLUSTER, max_changes_per_write=7), committed, 0)
    assert second.has_bulk_jobs() and second.creating(huge.topic_id)
    while second.has_bulk_jobs():
        log.extend(second.continue_bulk_jobs(len(log)))
    whole_log.extend(whole.create_topics(_big_topic_request(95), len(whole_log)).records)
    replayed, expected = _replay(log), _replay(whole_log)
    assert not replayed.transaction
    assert replayed.topic("huge").partitions == expected.topic("huge").partitions  # type: ignore[union-attr]
    assert [r.WhichOneof("record") for r in log].count("end_transaction") == 1


def test_a_broker_delta_holds_a_transaction_open_across_batches() -> None:
    logic = _logic(None, budget_ms=0, max_changes=10)
    log = _cluster_with_a_topic(logic, 3)
    base = _replay(log)
    _start_big_topic(logic, log, 40)
    delta = MetadataDelta(base)
    for offset in range(base.offset + 1, len(log)):
        delta.replay(log[offset], offset)
    assert delta.in_transaction
    while logic.has_bulk_jobs():
        more = logic.continue_bulk_jobs(len(log))
        for record in more:
            delta.replay(record, len(log))
            log.append(record)
    assert not delta.in_transaction
    topic = delta.apply().topic("huge")
    assert topic is not None and len(topic.partitions) == 40


async def test_a_big_topic_through_the_controller_is_answered_once_complete() -> None:
    clock = ManualClock()
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=8)
    raft, controller = await _started(options, clock)
    try:
        for broker_id in (1, 2, 3):
            await activate_broker(controller, broker_id)
        request = cpb.CreateTopicsRequest(
            cluster_id=CLUSTER,
            topics=[
                cpb.CreatableTopic(name="small", num_partitions=2, replication_factor=2),
                cpb.CreatableTopic(name="huge", num_partitions=50, replication_factor=3),
                cpb.CreatableTopic(name="small", num_partitions=2, replication_factor=2),
                cpb.CreatableTopic(name="huge2", num_partitions=30, replication_factor=2),
                cpb.CreatableTopic(name="other", num_partitions=3, replication_factor=2),
            ],
        )
        start = len(controller.writes.queue.processed)
        response = await asyncio.wait_for(controller.create_topics(request), 10)
        assert [t.name for t in response.topics] == ["small", "huge", "small", "huge2", "other"]
        assert [t.error_code for t in response.topics] == [
            ErrorCode.INVALID_REQUEST,
            ErrorCode.NONE,
            ErrorCode.INVALID_REQUEST,
            ErrorCode.NONE,
            ErrorCode.NONE,
        ]
        for name, count in (("huge", 50), ("huge2", 30), ("other", 3)):
            topic = controller.committed.topic(name)
            assert topic is not None and len(topic.partitions) == count
        assert not controller.committed.transaction
        processed = controller.writes.queue.processed[start:]
        # one checking event and ceil(n / 8) placing events per big topic, slices for the rest
        assert (
            processed.count("create-topic-plan") == (1 + 7) + (1 + 4) and processed.count("bulk-slice") >= 8
        )
        # the two transactions one after the other, never nested
        kinds = [records.decode_value(r.value).WhichOneof("record") for b in raft.log for r in b.records]
        markers = [k for k in kinds if k in ("begin_transaction", "end_transaction")]
        assert markers == ["begin_transaction", "end_transaction"] * 2
        grow = await controller.create_partitions(
            cpb.CreatePartitionsRequest(
                cluster_id=CLUSTER, topics=[cpb.CreatePartitionsTopic(name="huge", count=51)]
            )
        )
        assert grow.topics[0].error_code == ErrorCode.NONE  # no longer being created
    finally:
        await controller.stop()
