"""The data-plane checkers (chaos.checkers.data_plane): acks=all records at their offsets on the final
leader, replicas identical below the high watermark, acks=all refused under min.insync.replicas, refused
records never written, consumed records in the final log — each with the violation it must catch."""

from __future__ import annotations

from dataclasses import replace

from chaos_histories import op

from chaos.checkers import Status
from chaos.checkers.data_plane import (
    DATA_CONSUME,
    DATA_PRODUCE,
    IsrSample,
    PartitionRead,
    ReplicaLog,
    check_acknowledged_at_their_offsets,
    check_acks_all_refused_under_min_isr,
    check_consumed_in_final_log,
    check_refused_never_written,
    check_replicas_identical_below_hwm,
    partition_of,
    under_min_isr_intervals,
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


# --- min.insync.replicas ---------------------------------------------------------------------------


def _isr(broker: int, sent: int, epoch: int, isr: tuple[int, ...], leader: int = 101) -> IsrSample:
    return IsrSample(broker, 0, sent, sent + 1, leader, epoch, isr)


def test_under_min_isr_periods_run_from_the_first_answer_to_the_last_send_at_one_epoch() -> None:
    samples = [
        _isr(101, 0, 5, (101, 102)),
        _isr(101, 10, 6, (101,)),
        _isr(101, 20, 6, (101,)),
        _isr(101, 30, 6, (101,)),
        _isr(101, 40, 7, (101,)),  # a new epoch: a change may lie between 30 and 40
        _isr(101, 50, 7, (101,)),
        _isr(102, 60, 7, (101,)),  # another broker's view: not its own leadership
        _isr(102, 70, 7, (101,)),
        _isr(101, 80, 8, (101,)),  # one sample alone proves no period
    ]
    intervals = under_min_isr_intervals(samples, 2)
    assert [(i.broker, i.leader_epoch, i.start_ns, i.end_ns) for i in intervals] == [
        (101, 6, 11, 30),
        (101, 7, 41, 50),
    ]
    assert under_min_isr_intervals(samples, 1) == []


def _produce(process: int, invoke: int, complete: int, outcome: EventType = EventType.OK) -> Operation:
    result = 0 if outcome is EventType.OK else None
    made = op(
        DATA_PRODUCE, invoke, complete, key="chaos-data-0", value=f"v{invoke}", result=result, outcome=outcome
    )
    error = None if outcome is EventType.OK else "NOT_ENOUGH_REPLICAS "
    return replace(made, process=process, error=error)


def test_an_acks_all_produce_acknowledged_inside_an_under_min_isr_period_fails() -> None:
    intervals = under_min_isr_intervals([_isr(101, 10, 6, (101,)), _isr(101, 40, 6, (101,))], 2)
    broker_of = {1: 101, 2: 102}
    inside = _produce(1, 15, 30)
    outside = [_produce(1, 5, 30), _produce(1, 30, 45), _produce(2, 15, 30)]  # straddles, or broker 102
    refused = _produce(1, 15, 30, EventType.FAIL)
    ok = check_acks_all_refused_under_min_isr([*outside, refused], intervals, broker_of, 2)
    assert ok.status is Status.PASS and ok.details["refused"] == 1, ok
    bad = check_acks_all_refused_under_min_isr([*outside, inside], intervals, broker_of, 2)
    assert (
        bad.status is Status.FAIL
        and "ISR [101]" in bad.offending[0]
        and f"op#{inside.op_id}" in bad.offending[0]
    )
    assert check_acks_all_refused_under_min_isr([], intervals, broker_of, 2).status is Status.UNKNOWN


def test_a_refused_record_found_in_a_replica_log_fails() -> None:
    refused = _produce(1, 15, 30, EventType.FAIL)
    clean = [ReplicaLog(101, 0, {0: b"v1"}, 0, 1)]
    assert check_refused_never_written([refused], clean).status is Status.PASS
    written = [*clean, ReplicaLog(102, 0, {0: b"v1", 1: b"v15"}, 0, 2)]
    verdict = check_refused_never_written([refused], written)
    assert verdict.status is Status.FAIL and "broker 102 offset 1" in verdict.offending[0]
    assert check_refused_never_written([refused], []).status is Status.UNKNOWN


# --- consumers -------------------------------------------------------------------------------------


def _consume(records: list[tuple[int, str]], hwm: int, t: int = 0) -> Operation:
    result = {"broker": 101, "hwm": hwm, "records": [[o, v] for o, v in records]}
    return op(
        DATA_CONSUME, t, t + 1, key="chaos-data-0", value=records[0][0] if records else 0, result=result
    )


def test_consumed_records_in_the_final_log_pass_and_a_vanished_or_replaced_one_fails() -> None:
    final = _final({0: b"a", 1: b"b", 2: b"c"})
    reads = [_consume([(0, "a"), (1, "b")], 2), _consume([(2, "c")], 3), _consume([], 3)]
    assert check_consumed_in_final_log(reads, final).status is Status.PASS
    # the zombie leader served offset 2 = "x" and a later leader holds "c" there
    replaced = check_consumed_in_final_log([*reads, _consume([(2, "x")], 3)], final)
    assert replaced.status is Status.FAIL and "final log holds b'c'" in replaced.offending[0]
    # read at offset 3, which the final leader never committed
    vanished = check_consumed_in_final_log([_consume([(3, "d")], 4)], final)
    assert vanished.status is Status.FAIL and "not below the final HWM 3" in vanished.offending[0]


def test_a_record_returned_at_or_above_its_answers_hwm_fails() -> None:
    final = _final({0: b"a", 1: b"b"})
    verdict = check_consumed_in_final_log([_consume([(0, "a"), (1, "b")], 1)], final)
    assert verdict.status is Status.FAIL and "at or above the answer's HWM 1" in verdict.offending[0]


def test_no_record_consumed_is_unknown() -> None:
    failed_read = op(DATA_CONSUME, 0, 1, key="chaos-data-0", value=0, outcome=EventType.FAIL)
    assert check_consumed_in_final_log([failed_read, _consume([], 0)], _final({})).status is Status.UNKNOWN
