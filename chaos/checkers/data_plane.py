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
