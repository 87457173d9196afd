"""A partition log on :class:`kraft.storage.log.SegmentedLog` (Kafka's on-disk format).

Durability follows Kafka's defaults: a Produce appends to the page cache and is not fsynced on its own
(Kafka relies on replication, ``flush.messages`` is unbounded); segments are fsynced when they roll and
when the log closes, and :meth:`SegmentedPartitionLog.flush` exists for callers that want more.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kraft.broker.partition_log import PartitionLog, PartitionLogOpener
from kraft.broker.types import ProducedRecord, StoredRecord
from kraft.storage.batch import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    Record,
    RecordBatch,
    encode_batch,
    iter_batches,
)
from kraft.storage.log import LogConfig, SegmentedLog


class SegmentedPartitionLog:
    __slots__ = ("_log",)

    def __init__(self, log: SegmentedLog) -> None:
        self._log = log

    @property
    def log_start_offset(self) -> int:
        return self._log.start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log.end_offset

    def append_records(self, records: Sequence[ProducedRecord], leader_epoch: int) -> int:
        first = records[0].timestamp_ms
        if all(r.timestamp_ms == first for r in records):
            result = self._log.append_records(
                [(r.key, r.value) for r in records], leader_epoch=leader_epoch, timestamp_ms=first
            )
            return result.first_offset
        # Mixed timestamps: keep each record's own timestamp as a delta from the first.
        batch = RecordBatch(
            base_offset=self._log.end_offset,
            partition_leader_epoch=leader_epoch,
            magic=2,
            crc=0,
            attributes=0,
            last_offset_delta=len(records) - 1,
            base_timestamp=first,
            max_timestamp=max(r.timestamp_ms for r in records),
            producer_id=NO_PRODUCER_ID,
            producer_epoch=NO_PRODUCER_EPOCH,
            base_sequence=NO_SEQUENCE,
            records=tuple(Record(i, r.timestamp_ms - first, r.key, r.value) for i, r in enumerate(records)),
        )
        return self._log.append_batch(encode_batch(batch), validate=True).first_offset

    def read_records(self, offset: int, max_bytes: int) -> list[StoredRecord]:
        read = self._log.read(offset, max_bytes)
        out: list[StoredRecord] = []
        for batch in iter_batches(read.records):
            if batch.is_control:
                continue
            base = batch.base_offset
            for record in batch.records:
                record_offset = base + record.offset_delta
                if record_offset >= offset:
                    out.append(
                        StoredRecord(
                            record_offset,
                            batch.base_timestamp + record.timestamp_delta,
                            record.key,
                            record.value,
                            batch.partition_leader_epoch,
                        )
                    )
        return out

    def flush(self) -> None:
        self._log.flush()

    def close(self) -> None:
        self._log.close()


def segmented_log_opener(segment_bytes: int) -> PartitionLogOpener:
    """Opens partition directories as segmented logs rolling at ``segment_bytes`` (log.segment.bytes)."""
    config = LogConfig(segment_bytes=segment_bytes)

    def open_log(path: Path) -> PartitionLog:
        return SegmentedPartitionLog(SegmentedLog.open(path, config))

    return open_log
