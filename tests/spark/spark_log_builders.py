"""Build small kraft logs for the Spark tests through ``kraft.storage`` (the real writer), and read
segment files back with kafka-python's record parser (an independent implementation of the format)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kafka.record import MemoryRecords

from kraft.storage.batch import LeaderChangeMessage
from kraft.storage.log import LogConfig, SegmentedLog

Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True)
class Written:
    """One record as it was appended: what a reader must give back."""

    topic: str
    partition: int
    offset: int
    leader_epoch: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    headers: Headers
    is_control: bool


@dataclass(frozen=True)
class BatchSpec:
    records: tuple[tuple[bytes | None, bytes | None, Headers], ...]
    timestamp_ms: int
    leader_epoch: int = 0
    roll_before: bool = False  # start a new segment before this batch
    control_leader: int | None = None  # append a LeaderChange control batch instead of records


def write_partition(root: Path, topic: str, partition: int, batches: list[BatchSpec]) -> list[Written]:
    """Append ``batches`` to ``root/<topic>-<partition>`` with kraft's SegmentedLog; return every record."""
    written: list[Written] = []
    log = SegmentedLog.open(root / f"{topic}-{partition}", LogConfig(segment_bytes=1 << 20))
    try:
        for spec in batches:
            if spec.roll_before and log.end_offset > log.segments()[-1].base_offset:
                log.roll()
            if spec.control_leader is not None:
                result = log.append_control(
                    [LeaderChangeMessage(spec.control_leader, (1, 2, 3), (spec.control_leader,))],
                    leader_epoch=spec.leader_epoch,
                    timestamp_ms=spec.timestamp_ms,
                )
                written.append(
                    Written(
                        topic,
                        partition,
                        result.first_offset,
                        spec.leader_epoch,
                        spec.timestamp_ms,
                        None,
                        None,
                        (),
                        True,
                    )
                )
                continue
            result = log.append_records(
                list(spec.records), leader_epoch=spec.leader_epoch, timestamp_ms=spec.timestamp_ms
            )
            for i, (key, value, headers) in enumerate(spec.records):
                written.append(
                    Written(
                        topic,
                        partition,
                        result.first_offset + i,
                        spec.leader_epoch,
                        spec.timestamp_ms,
                        key,
                        value,
                        headers,
                        False,
                    )
                )
        log.flush()
    finally:
        log.close()
    return written


@dataclass(frozen=True)
class ParsedBatch:
    base_offset: int
    last_offset: int
    records: tuple[
        tuple[int, int, bytes | None, bytes | None, Headers], ...
    ]  # offset, ts, key, value, headers


def parse_with_kafka_python(partition_dir: Path) -> list[ParsedBatch]:
    """Every batch of every segment, in file-name order, parsed by kafka-python (CRCs checked)."""
    out: list[ParsedBatch] = []
    for segment in sorted(partition_dir.glob("*.log")):
        records = MemoryRecords(segment.read_bytes())
        while (batch := records.next_batch()) is not None:
            assert batch.validate_crc(), f"CRC mismatch in {segment} at {batch.base_offset}"
            parsed = tuple(
                (r.offset, r.timestamp, r.key, r.value, tuple((k, v) for k, v in r.headers)) for r in batch
            )
            out.append(ParsedBatch(batch.base_offset, batch.base_offset + batch.last_offset_delta, parsed))
    return out
