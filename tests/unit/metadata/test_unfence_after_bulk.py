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

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_fakes import CostClock

from kraft.metadata import records, rejoin_index
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import NO_PARTITION_LEADER, MetadataImage, PartitionRegistration
from kraft.metadata.image_records import partition_record
from kraft.metadata.rejoin_index import SETTLE_CHECK_EVERY
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller import CLUSTER
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
    """Brokers 1-4 unfenced; topic ``big`` of ``big`` partitions led by broker 1 (replicas 1, 2, 3), and
    ``solo`` one-partition topics whose only replica is broker 4."""
    log = unfenced_brokers(ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0), [None] * 4)
    log.append(records.wrap(pb.TopicRecord(name="big", topic_id="big")))
    for pid in range(big):
        log.append(
            records.wrap(partition_record("big", pid, PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 0, 0)))
        )
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
    spent = []
    while logic.has_bulk_jobs():
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
