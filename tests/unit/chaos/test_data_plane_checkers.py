"""The data-plane checkers (chaos.checkers.data_plane): acks=all records at their offsets on the final
leader, replicas identical below the high watermark — each with the violation it must catch."""

from __future__ import annotations

from chaos_histories import op

from chaos.checkers import Status
from chaos.checkers.data_plane import (
    DATA_PRODUCE,
    PartitionRead,
    ReplicaLog,
    check_acknowledged_at_their_offsets,
    check_replicas_identical_below_hwm,
    partition_of,
)
from chaos.history import EventType, Operation


def _ack(partition: int, value: str, offset: int, t: int = 0) -> Operation:
    return op(DATA_PRODUCE, t, t + 1, key=f"chaos-data-{partition}", value=value, result=offset)


def _final(records: dict[int, bytes], hwm: int | None = None, partition: int = 0) -> dict[int, PartitionRead]:
    return {partition: PartitionRead(partition, 101, len(records) if hwm is None else hwm, records)}


def test_partition_of_reads_the_key() -> None:
    assert partition_of("chaos-data-3") == 3
    assert partition_of("orders") is None and partition_of(None) is None


def test_every_acknowledged_record_at_its_offset_passes() -> None:
    ops = [
        _ack(0, "p0-0", 0),
        _ack(0, "p0-1", 1),
        op(DATA_PRODUCE, 3, None, key="chaos-data-0", value="p0-2"),
    ]
    verdict = check_acknowledged_at_their_offsets(ops, _final({0: b"p0-0", 1: b"p0-1", 2: b"p0-2"}))
    assert verdict.status is Status.PASS, verdict


def test_a_lost_acknowledged_record_fails() -> None:
    # the new leader never had offset 1 (the KIP-101 loss): it reused the offset for another record
    ops = [_ack(0, "p0-0", 0), _ack(0, "p0-1", 1)]
    verdict = check_acknowledged_at_their_offsets(ops, _final({0: b"p0-0", 1: b"p0-9"}))
    assert verdict.status is Status.FAIL and "b'p0-9'" in verdict.offending[0]


def test_an_acknowledged_record_above_the_final_hwm_fails() -> None:
    verdict = check_acknowledged_at_their_offsets([_ack(0, "p0-0", 0)], _final({}, hwm=0))
    assert verdict.status is Status.FAIL and "not below the final HWM" in verdict.offending[0]


def test_an_offset_acknowledged_twice_fails() -> None:
    ops = [_ack(0, "p0-0", 0), _ack(0, "p0-1", 0, t=5)]
    verdict = check_acknowledged_at_their_offsets(ops, _final({0: b"p0-0"}))
    assert verdict.status is Status.FAIL
    assert any("acknowledged twice" in line for line in verdict.offending)


def test_no_acknowledged_record_is_unknown() -> None:
    failed = op(DATA_PRODUCE, 0, 1, key="chaos-data-0", value="x", outcome=EventType.FAIL)
    assert check_acknowledged_at_their_offsets([failed], _final({})).status is Status.UNKNOWN


def test_identical_replicas_pass_and_a_divergent_or_short_one_fails() -> None:
    records = {0: b"a", 1: b"b", 2: b"c"}
    final = _final(records, hwm=2)  # offset 2 above the HWM: a replica may not have it yet
    same = [ReplicaLog(b, 0, dict(records), 0, 3) for b in (101, 102)] + [
        ReplicaLog(103, 0, {0: b"a", 1: b"b"}, 0, 2)
    ]
    assert check_replicas_identical_below_hwm(same, final).status is Status.PASS
    diverged = [*same, ReplicaLog(104, 0, {0: b"a", 1: b"X"}, 0, 2)]
    verdict = check_replicas_identical_below_hwm(diverged, final)
    assert verdict.status is Status.FAIL and "broker 104 holds b'X'" in verdict.offending[0]
    short = [*same, ReplicaLog(105, 0, {0: b"a"}, 0, 1)]
    verdict = check_replicas_identical_below_hwm(short, final)
    assert verdict.status is Status.FAIL and "missing on broker 105" in verdict.offending[0]


def test_replicas_with_nothing_below_the_hwm_are_unknown() -> None:
    verdict = check_replicas_identical_below_hwm([ReplicaLog(101, 0, {}, 0, 0)], _final({}, hwm=0))
    assert verdict.status is Status.UNKNOWN
