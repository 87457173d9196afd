"""Partition replication (issue #16): what producers were told with acks=all must be what the logs hold.

Inputs are plain values, so the checkers are pure:

- ``ok`` operations of the data-plane workload (``f == "produce-all"``, ``key`` = ``chaos-data-<p>``,
  ``value`` = the record's bytes as text, ``result`` = the acknowledged offset);
- :class:`PartitionRead`: the final leader's records below its high watermark, read with consumer
  Fetches after every fault was healed and the ISR was whole again;
- :class:`ReplicaLog`: each replica's partition log as its files hold it after a clean stop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from chaos.checkers.verdict import Verdict, failed, passed, unknown
from chaos.history import EventType, Operation

DATA_PRODUCE = "produce-all"


@dataclass(frozen=True, slots=True)
class PartitionRead:
    """The final leader's view of one partition: records by offset below ``high_watermark``."""

    partition: int
    leader: int
    high_watermark: int
    records: Mapping[int, bytes]
    log_start_offset: int = 0


@dataclass(frozen=True, slots=True)
class ReplicaLog:
    """One replica's partition log from disk: records by offset, where it starts and ends."""

    broker: int
    partition: int
    records: Mapping[int, bytes]
    log_start_offset: int
    log_end_offset: int


def partition_of(key: str | None) -> int | None:
    """``chaos-data-3`` → 3; anything else → None."""
    if key is None or "-" not in key:
        return None
    tail = key.rsplit("-", 1)[1]
    return int(tail) if tail.isdigit() else None


def check_acknowledged_at_their_offsets(
    ops: Sequence[Operation], final: Mapping[int, PartitionRead]
) -> Verdict:
    """Every record acknowledged with acks=all is readable from the final leader at exactly the offset it
    was acknowledged at, and no offset was acknowledged for two different records."""
    checker = "acks-all-at-their-offsets"
    acked = [op for op in ops if op.f == DATA_PRODUCE and op.outcome is EventType.OK]
    if not acked:
        return unknown(checker, "no produce was acknowledged")
    problems: list[str] = []
    seen: dict[tuple[int, int], Operation] = {}
    for op in acked:
        partition = partition_of(op.key)
        if partition is None or not isinstance(op.result, int):
            problems.append(f"{op.describe()}: no partition or offset recorded")
            continue
        offset = op.result
        previous = seen.setdefault((partition, offset), op)
        if previous is not op:
            problems.append(
                f"partition {partition} offset {offset} acknowledged twice: {previous.describe()} and "
                f"{op.describe()}"
            )
        read = final.get(partition)
        if read is None:
            problems.append(f"{op.describe()}: partition {partition} was not read at the end")
            continue
        if offset < read.log_start_offset:
            continue  # deleted by retention: nothing to compare
        expected = str(op.value).encode()
        if offset >= read.high_watermark:
            problems.append(
                f"{op.describe()}: offset {offset} is not below the final HWM {read.high_watermark} "
                f"of leader {read.leader}"
            )
        elif read.records.get(offset) != expected:
            found = read.records.get(offset)
            problems.append(
                f"{op.describe()}: leader {read.leader} holds {found!r} at offset {offset}, not {expected!r}"
            )
    if problems:
        return failed(checker, f"{len(problems)} acknowledged records lost or moved", problems)
    return passed(checker, f"{len(acked)} acknowledged records at their offsets on the final leaders")


def check_replicas_identical_below_hwm(
    replicas: Sequence[ReplicaLog], final: Mapping[int, PartitionRead]
) -> Verdict:
    """Below the final high watermark every replica holds every offset, and holds what the leader holds
    there: no offset carries two different records on two replicas."""
    checker = "replicas-identical-below-hwm"
    if not replicas or not final:
        return unknown(checker, "no replica logs or no final read")
    problems: list[str] = []
    compared = 0
    for replica in replicas:
        read = final.get(replica.partition)
        if read is None:
            continue
        start = max(replica.log_start_offset, read.log_start_offset)
        for offset in range(start, read.high_watermark):
            data = replica.records.get(offset)
            if data is None:
                problems.append(
                    f"partition {replica.partition} offset {offset}: missing on broker {replica.broker} "
                    f"(its log ends at {replica.log_end_offset}, the HWM is {read.high_watermark})"
                )
                break
            if data != read.records.get(offset):
                problems.append(
                    f"partition {replica.partition} offset {offset}: broker {replica.broker} holds {data!r}, "
                    f"leader {read.leader} holds {read.records.get(offset)!r}"
                )
            compared += 1
    if problems:
        return failed(checker, f"{len(problems)} replica disagreements below the HWM", problems)
    if compared == 0:
        return unknown(checker, "nothing below any high watermark to compare")
    return passed(checker, f"{len(replicas)} replica logs agree on {compared} offsets below the HWM")


# --- min.insync.replicas: acks=all refused while the leader's ISR is below the minimum -------------

DATA_CONSUME = "consume"


@dataclass(frozen=True, slots=True)
class IsrSample:
    """One broker's own view (its Metadata answer) of one partition: asked at ``sent_ns``, answered at
    ``answered_ns``; the broker's image held this leader, leader epoch and ISR somewhere in between."""

    broker: int
    partition: int
    sent_ns: int
    answered_ns: int
    leader: int
    leader_epoch: int
    isr: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class UnderMinIsrInterval:
    """``broker`` led ``partition`` at ``leader_epoch`` with an ISR below the minimum from ``start_ns``
    to ``end_ns`` at least (its own image said so the whole time)."""

    broker: int
    partition: int
    leader_epoch: int
    isr: tuple[int, ...]
    start_ns: int
    end_ns: int


def under_min_isr_intervals(samples: Sequence[IsrSample], min_isr: int) -> list[UnderMinIsrInterval]:
    """Conservative periods in which a leader's own image showed an ISR below ``min_isr``.

    Per (broker, partition), consecutive samples (by answer time) in which the broker names itself
    leader at one leader epoch with the same ISR below the minimum form a run; the period starts at the
    *answer* of the run's first sample (the image showed it by then) and ends at the *send* of its last
    (the image still showed it then).  kraft bumps the leader epoch on every partition change and a
    broker's image only moves forward, so one leader epoch at both ends means no change in between.  A
    sample of anything else (another leader or epoch, a larger ISR) ends the run; an unanswered probe
    does not (one epoch at both ends already rules out a change).
    """
    by_key: dict[tuple[int, int], list[IsrSample]] = {}
    for sample in samples:
        by_key.setdefault((sample.broker, sample.partition), []).append(sample)
    intervals: list[UnderMinIsrInterval] = []

    def close(run: list[IsrSample]) -> None:
        if run and run[-1].sent_ns >= run[0].answered_ns:  # one sample alone proves no period
            first = run[0]
            intervals.append(
                UnderMinIsrInterval(
                    first.broker,
                    first.partition,
                    first.leader_epoch,
                    first.isr,
                    first.answered_ns,
                    run[-1].sent_ns,
                )
            )

    for (broker, _), series in sorted(by_key.items()):
        run: list[IsrSample] = []
        for sample in sorted(series, key=lambda s: s.answered_ns):
            under = sample.leader == broker and len(sample.isr) < min_isr
            if run and (not under or (sample.leader_epoch, sample.isr) != (run[0].leader_epoch, run[0].isr)):
                close(run)
                run = []
            if under:
                run.append(sample)
        close(run)
    return intervals


def check_acks_all_refused_under_min_isr(
    ops: Sequence[Operation],
    intervals: Sequence[UnderMinIsrInterval],
    broker_of: Mapping[int, int],
    min_isr: int,
) -> Verdict:
    """No acks=all produce sent to a leader and both invoked and answered while that leader's image
    showed the partition's ISR below ``min.insync.replicas`` was acknowledged (it must be refused with
    NOT_ENOUGH_REPLICAS before anything is appended).  ``broker_of`` maps a producer process to the
    broker it sent to."""
    checker = "acks-all-refused-under-min-isr"
    acked = [op for op in ops if op.f == DATA_PRODUCE and op.outcome is EventType.OK]
    refused = [
        op
        for op in ops
        if op.f == DATA_PRODUCE
        and op.outcome is EventType.FAIL
        and (op.error or "").startswith("NOT_ENOUGH_REPLICAS ")
    ]
    by_key: dict[tuple[int, int], list[UnderMinIsrInterval]] = {}
    for interval in intervals:
        by_key.setdefault((interval.broker, interval.partition), []).append(interval)
    problems: list[str] = []
    inside = 0
    for op in acked:
        partition = partition_of(op.key)
        broker = broker_of.get(op.process)
        if partition is None or broker is None or op.complete_ns is None:
            continue
        for interval in by_key.get((broker, partition), ()):
            if interval.start_ns <= op.invoke_ns and op.complete_ns <= interval.end_ns:
                inside += 1
                problems.append(
                    f"{op.describe()}: acknowledged by broker {broker} while it led partition {partition} "
                    f"at epoch {interval.leader_epoch} with ISR {list(interval.isr)} (min.insync.replicas "
                    f"{min_isr})"
                )
                break
    details = {"intervals": len(intervals), "refused": len(refused), "min_insync_replicas": min_isr}
    if problems:
        return failed(
            checker, f"{len(problems)} acks=all produces acknowledged under min ISR", problems, **details
        )
    if not acked and not refused:
        return unknown(checker, "no acks=all produce was answered", **details)
    return passed(
        checker,
        f"{len(acked)} acknowledged, none inside {len(intervals)} under-min-ISR periods; "
        f"{len(refused)} refused with NOT_ENOUGH_REPLICAS",
        **details,
    )


def check_refused_never_written(ops: Sequence[Operation], replicas: Sequence[ReplicaLog]) -> Verdict:
    """A produce refused with an error before the append (``fail``: NOT_ENOUGH_REPLICAS) is in no
    replica's log: refused means nothing was written.  Record values are unique per run."""
    checker = "refused-records-never-written"
    refused = [op for op in ops if op.f == DATA_PRODUCE and op.outcome is EventType.FAIL]
    if not replicas:
        return unknown(checker, "no replica logs were read")
    where: dict[tuple[int, bytes], list[tuple[int, int]]] = {}
    for replica in replicas:
        for offset, data in replica.records.items():
            where.setdefault((replica.partition, data), []).append((replica.broker, offset))
    problems: list[str] = []
    for op in refused:
        partition = partition_of(op.key)
        if partition is None:
            continue
        found = where.get((partition, str(op.value).encode()))
        if found:
            places = ", ".join(f"broker {b} offset {o}" for b, o in sorted(found))
            problems.append(f"{op.describe()} {op.error!r}: written anyway ({places})")
    if problems:
        return failed(checker, f"{len(problems)} refused records are in replica logs", problems)
    return passed(
        checker, f"none of {len(refused)} refused records is in any of {len(replicas)} replica logs"
    )


# --- consumers: what they read is committed --------------------------------------------------------


def consumed_records(op: Operation) -> tuple[int, list[tuple[int, bytes]]] | None:
    """A consume operation's answer: (the high watermark it carried, [(offset, value)]); None if it
    has none (failed, or not a consume)."""
    if op.f != DATA_CONSUME or op.outcome is not EventType.OK or not isinstance(op.result, dict):
        return None
    hwm = op.result.get("hwm")
    records = op.result.get("records")
    if not isinstance(hwm, int) or not isinstance(records, list):
        return None
    return hwm, [(int(offset), str(value).encode()) for offset, value in records]


def check_consumed_in_final_log(ops: Sequence[Operation], final: Mapping[int, PartitionRead]) -> Verdict:
    """Every record a consumer read (consumer Fetch, from whichever broker it believed led) was below
    the high watermark that answer carried, and is in the final log at the same offset: a consumer never
    sees an uncommitted record, nor one that a later leader truncated or replaced."""
    checker = "consumed-records-in-final-log"
    problems: list[str] = []
    read = 0
    for op in ops:
        answer = consumed_records(op)
        if answer is None:
            continue
        hwm, records = answer
        partition = partition_of(op.key)
        if partition is None:
            continue
        log = final.get(partition)
        for offset, data in records:
            read += 1
            if offset >= hwm:
                problems.append(
                    f"{op.describe()}: offset {offset} returned at or above the answer's HWM {hwm}"
                )
            elif log is None:
                problems.append(f"{op.describe()}: partition {partition} was not read at the end")
            elif offset < log.log_start_offset:
                continue
            elif offset >= log.high_watermark:
                problems.append(
                    f"{op.describe()}: read {data!r} at offset {offset}, not below the final HWM "
                    f"{log.high_watermark} of leader {log.leader}"
                )
            elif log.records.get(offset) != data:
                problems.append(
                    f"{op.describe()}: read {data!r} at offset {offset}, the final log holds "
                    f"{log.records.get(offset)!r}"
                )
            if len(problems) >= 50:
                break
    if problems:
        return failed(checker, f"{len(problems)} consumed records are not in the final log", problems)
    if read == 0:
        return unknown(checker, "no consumer read a record")
    return passed(checker, f"{read} consumed records are in the final logs at their offsets")
