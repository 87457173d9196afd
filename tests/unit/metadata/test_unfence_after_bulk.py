"""An unfence right after a bulk job, whose flags in the rejoin index are not settled yet (issue #17,
session 12): no event runs past its budget, and the records are the full scan's.

A bulk delta leaves its partitions' flags dirty (``RejoinIndex`` ``LAZY_MIN_CHANGES``); the unfence used
to settle all of them inside its own event (0.2-0.3 s after a 109k-leadership shutdown).  Now it settles
what fits its budget and, when flags remain, its rejoin job gets the index ready in the next slices before
it takes its candidates.

Time is a :class:`CostClock` that charges the flag work itself (``flagged_replicas``: one ms per
``_PER_MS`` partitions settled), so an event that settles more than its budget allows is seen as long,
whatever the host.
"""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_fakes import CostClock

from kraft.metadata import records, rejoin_index
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import NO_PARTITION_LEADER, MetadataImage, PartitionRegistration
from kraft.metadata.image_records import partition_record
from kraft.metadata.rejoin_index import SETTLE_CHECK_EVERY
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .fake_raft import FakeRaft
from .test_controller import CLUSTER, ENDPOINTS, activate_broker, settle, until
from .test_rejoin_equivalence import ScanLogic
from .test_work_budget import unfenced_brokers

_PER_MS = 32  # partitions whose flags cost one ms of the clock
_STEP_MS = SETTLE_CHECK_EVERY // _PER_MS  # how far settling may run past its deadline (one check step)


def _replay(log: list[pb.MetadataRecord]) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for offset, record in enumerate(log):
        delta.replay(records.decode_value(records.encode_value(record)), offset)
    assert not delta.replay_errors
    return delta.apply()


def _cluster(big: int, solo: int) -> list[pb.MetadataRecord]:
    """Brokers 1-4 unfenced; topic ``big`` of ``big`` partitions led by broker 1 (replicas 1, 2, 4), and
    ``solo`` one-partition topics whose only replica is broker 4: unfencing broker 4 looks at every
    partition (it is out of each ISR), the elections are those of the one-partition topics, last."""
    log = unfenced_brokers(ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0), [None] * 4)
    log.append(records.wrap(pb.TopicRecord(name="big", topic_id="big")))
    for pid in range(big):
        led_by_1 = PartitionRegistration((1, 2, 4), (1, 2, 4), 1, 0, 0)
        log.append(records.wrap(partition_record("big", pid, led_by_1)))
    for i in range(solo):
        name = f"four-{i}"
        log.append(records.wrap(pb.TopicRecord(name=name, topic_id=name)))
        log.append(records.wrap(partition_record(name, 0, PartitionRegistration((4,), (4,), 4, 0, 0))))
    return log


def _beat(
    logic: ControllerLogic, broker_id: int, log: list[pb.MetadataRecord], *, fence: bool = False
) -> None:
    beat = cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER,
        broker_id=broker_id,
        broker_epoch=logic.image.brokers[broker_id].epoch,
        current_metadata_offset=len(log) + 1_000,
        want_fence=fence,
    )
    log.extend(logic.broker_heartbeat(beat, 0, len(log)).records)


def _drain(logic: ControllerLogic, log: list[pb.MetadataRecord], clock: CostClock | None = None) -> list[int]:
    """Every bulk slice until no job is left; the clock ms of each."""
    spent: list[int] = []
    while logic.has_bulk_jobs():
        assert len(spent) < 10_000, "the bulk jobs do not end"  # (a job that never finishes fails here)
        started = clock.now_ms if clock is not None else 0
        log.extend(logic.continue_bulk_jobs(len(log)))
        spent.append((clock.now_ms if clock is not None else 0) - started)
    return spent


def _after_shutdown(
    cls: type[ControllerLogic], big: int, solo: int, budget_ms: int, clock: CostClock | None
) -> tuple[ControllerLogic, list[pb.MetadataRecord]]:
    """Broker 4 fenced (its partitions offline), then broker 1's controlled shutdown run to its end: the
    index holds the shutdown's changes dirty."""
    log = _cluster(big, solo)
    logic = cls(
        ControllerSettings(CLUSTER, max_changes_per_write=200, max_event_time_ms=budget_ms),
        _replay(log),
        0,
        clock=clock,
    )
    while not logic.index_some():  # the activation's rebuild, done
        pass
    _beat(logic, 4, log, fence=True)
    _drain(logic, log)
    log.extend(
        logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1), len(log)).records
    )
    _drain(logic, log)
    return logic, log


def _charge_flags(monkeypatch: pytest.MonkeyPatch, clock: CostClock) -> None:
    flagged = rejoin_index.flagged_replicas
    calls = [0]

    def costly(partition: PartitionRegistration) -> tuple[int, ...]:
        calls[0] += 1
        if calls[0] % _PER_MS == 0:
            clock.advance(1)
        return flagged(partition)

    monkeypatch.setattr(rejoin_index, "flagged_replicas", costly)


def _unfence_4(
    logic: ControllerLogic, log: list[pb.MetadataRecord], clock: CostClock | None
) -> tuple[int, bool, list[int]]:
    """Broker 4's unfencing heartbeat, then every slice of its job: (the heartbeat's ms, whether flags
    were left to settle after it, each slice's ms)."""
    started = clock.now_ms if clock is not None else 0
    _beat(logic, 4, log)
    first = (clock.now_ms if clock is not None else 0) - started
    left = logic.rejoin_index.settling
    return first, left, _drain(logic, log, clock)


def _check_unfenced(image: MetadataImage, solo: int) -> None:
    assert not image.brokers[4].fenced
    for i in range(solo):
        partition = image.topics_by_id[f"four-{i}"].partitions[0]
        assert partition.leader == 4 and partition.isr == (4,)  # elected again: the rejoin job ran


@settings(max_examples=15, deadline=None)
@given(big=st.integers(300, 1_200), solo=st.integers(1, 30), budget_ms=st.integers(4, 12))
def test_an_unfence_right_after_a_bulk_job_settles_in_slices_within_the_budget_as_the_scan_writes(
    big: int, solo: int, budget_ms: int
) -> None:
    clock = CostClock(0)
    with pytest.MonkeyPatch.context() as monkeypatch:
        logic, log = _after_shutdown(ControllerLogic, big, solo, budget_ms, clock)
        index = logic.rejoin_index
        dirty = sum(len(ids) for ids in index._dirty.values())
        assert (
            dirty > big - rejoin_index.LAZY_MIN_CHANGES
        )  # the shutdown's changes, unsettled (no settler here)
        _charge_flags(monkeypatch, clock)
        beat_ms, left, slices_ms = _unfence_4(logic, log, clock)
    # Every event within its budget, past it by one settle step at most (before: the heartbeat settled
    # all `dirty` partitions at once, dirty / _PER_MS ms).
    assert beat_ms <= budget_ms + _STEP_MS, (beat_ms, dirty)
    assert all(ms <= budget_ms + _STEP_MS for ms in slices_ms), slices_ms
    if dirty > (budget_ms + _STEP_MS) * _PER_MS:
        assert left and slices_ms  # the settling did not fit the heartbeat's event: the job's slices did it
    assert index.ready_for(logic.image.topics_by_id)
    _check_unfenced(logic.image, solo)
    # The records are the full scan's, unsliced: the same shutdown and unfence on the oracle, no clock.
    scan, scan_log = _after_shutdown(ScanLogic, big, solo, budget_ms, None)
    _unfence_4(scan, scan_log, None)
    assert [r.SerializeToString() for r in log] == [r.SerializeToString() for r in scan_log]
    assert logic.image.topics_by_id == scan.image.topics_by_id


def test_the_unfence_job_waits_for_the_settling_and_a_new_active_controller_resumes_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = CostClock(0)
    logic, log = _after_shutdown(ControllerLogic, 2_000, 30, 5, clock)
    _charge_flags(monkeypatch, clock)
    _beat(logic, 4, log)
    assert not logic.image.brokers[4].fenced  # the registration change is written at once ...
    assert logic.rejoin_index.settling  # ... the flags are not settled yet ...
    assert logic.has_bulk_jobs()  # ... and the elections wait in the job
    image = logic.image
    assert all(image.topics_by_id[f"four-{i}"].partitions[0].leader == NO_PARTITION_LEADER for i in range(30))
    # A failover now: the new active controller finds the elections from its image and runs them.
    logic.reset(logic.image, 0)
    _drain(logic, log, clock)
    _check_unfenced(logic.image, 30)
    assert _replay(log).topics_by_id == logic.image.topics_by_id


async def test_through_the_controller_an_unfence_while_the_settling_trickles_keeps_every_event_in_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The shell: broker 1's ShutdownBroker leaves 1,000 partitions dirty; the write path's settler has run
    # one 1-ms slice and pauses (the manual clock is not moved) when broker 4 is unfenced.  Its heartbeat
    # answers, the job driver settles the rest in slices and then runs the elections: no event of the
    # queue (as EventTimings sees it, on the clock) runs past the budget by more than one settle step.
    clock = CostClock(0)
    budget_ms = 5
    options = ControllerOptions(
        noop_interval_ms=0, session_timeout_ms=600_000, max_work_unit_records=100, max_event_time_ms=budget_ms
    )
    raft = FakeRaft(1)
    controller = QuorumController(raft, CLUSTER, ENDPOINTS, options, clock=clock)
    await controller.start()
    raft.elect()
    await until(lambda: controller.is_active)
    try:
        epochs = {b: await activate_broker(controller, b) for b in (1, 2, 3, 4)}
        big = cpb.CreatableTopic(name="big")
        for p in range(1_000):
            big.assignments.add(partition=p, broker_ids=[1, 2, 3])
        solo = [cpb.CreatableTopic(name=f"four-{i}") for i in range(10)]
        for topic in solo:
            topic.assignments.add(partition=0, broker_ids=[4])
        await controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[big, *solo]))
        logic = controller.logic
        assert logic is not None

        def beat(fence: bool) -> cpb.BrokerHeartbeatRequest:
            return cpb.BrokerHeartbeatRequest(
                cluster_id=CLUSTER,
                broker_id=4,
                broker_epoch=epochs[4],
                current_metadata_offset=logic.image.offset,
                want_fence=fence,
            )

        await controller.broker_heartbeat(beat(True))
        await until(lambda: not logic.has_bulk_jobs())
        assert logic.image.topics_by_id[logic.image.topic_ids_by_name["four-0"]].partitions[0].leader == -1
        _charge_flags(monkeypatch, clock)
        await asyncio.wait_for(
            controller.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1)), 5
        )
        await settle()
        index = logic.rejoin_index
        assert index.settling  # the settler took a slice or none, and pauses
        seen: list[tuple[str, int]] = []
        record = controller.event_timings.record

        def watch(kind: str, duration_ms: int) -> None:
            seen.append((kind, duration_ms))
            record(kind, duration_ms)

        controller.writes.queue.observe(clock, watch, controller.event_timings.start)
        answer = await asyncio.wait_for(controller.broker_heartbeat(beat(False)), 5)
        assert not answer.is_fenced
        await until(lambda: not logic.has_bulk_jobs())
        assert all(ms <= budget_ms + _STEP_MS for _, ms in seen), seen
        assert sum(1 for kind, _ in seen if kind == "bulk-slice") >= 2  # the settling, then the elections
        for topic in solo:
            partition = logic.image.topics_by_id[logic.image.topic_ids_by_name[topic.name]].partitions[0]
            assert partition.leader == 4
        assert index.ready_for(logic.image.topics_by_id)
    finally:
        await controller.stop()
