"""Executor side of compaction: copy the surviving records of one offset range into new segments.

A writer task receives, sorted by offset, the *survivor offsets* of its range (the newest offset of each
key, found by Spark's shuffle) and re-reads the input segments with a forward-only cursor, merging the two
sorted streams: memory stays O(one batch) however many keys there are.

Output invariants (what ``kraft.storage`` recovery and Kafka readers require):
- batches chain exactly: each starts at the previous batch's ``last_offset + 1``; the gap left by removed
  records is absorbed at the start of the next batch (its first record has ``offset_delta > 0``), and the
  last batch of a range stretches to the range end through ``last_offset_delta``, so the log start and
  log end offsets are those of the input and no offset is ever reused;
- a range with nothing left still writes one empty batch covering it (Kafka's cleaner does the same);
- every record keeps its offset, timestamp, key, value and headers; segments are named by the base offset
  of their first batch and rolled at ``segment_bytes``; each file is written under a temporary name,
  fsynced, then renamed, so a retried task never leaves a half segment behind.
"""

from __future__ import annotations

import bisect
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from kraft.errors import ErrorCode, KraftError
from kraft.pipeline.decode import MappedFile
from kraft.pipeline.layout import LogFile, segment_file_name
from kraft.storage.batch import (
    ATTR_TIMESTAMP_TYPE,
    ATTR_TRANSACTIONAL,
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    STORED_BATCH_MAX_BYTES,
    Record,
    RecordBatch,
    decode_batch,
    encode_batch,
    peek_batch_header,
)
from kraft.storage.segment import MAX_RELATIVE_OFFSET

# Kind of a row reaching a writer; RANGE_START sorts first at equal offsets.
KIND_RANGE_START = -1
KIND_KEYED = 0  # survivor: the newest offset of one key
KIND_KEYLESS = 1  # statistics row: records without a key (an error for a compacted topic)
KIND_CONTROL = 2  # statistics row: control records (not carried into the compacted log)

# Source-batch attributes a merged output batch must share (compression is always none on output).
_KEPT_ATTRIBUTES = ATTR_TIMESTAMP_TYPE | ATTR_TRANSACTIONAL


@dataclass(frozen=True, slots=True)
class OffsetRange:
    """One writer task's share of a partition: offsets ``[start, end)``."""

    task: int
    topic: str
    partition: int
    start: int
    end: int
    leader_epoch: int  # epoch of the input batch at ``start``: used for an empty range batch
    tombstone_horizon_ms: int  # tombstones with a timestamp below this are dropped
    segments: tuple[LogFile, ...]  # the partition's input segments, by base offset


@dataclass(slots=True)
class RangeStats:
    task: int
    topic: str
    partition: int
    distinct_keys: int = 0
    keyed_records_in: int = 0
    keyless_records: int = 0
    keyless_first_offset: int = -1
    control_records: int = 0
    records_out: int = 0
    tombstones_kept: int = 0
    tombstones_dropped: int = 0
    batches_out: int = 0
    segments_out: int = 0
    bytes_out: int = 0


class InputCursor:
    """Finds records by increasing offset in a partition's segments, reading each batch at most once."""

    def __init__(self, segments: tuple[LogFile, ...]) -> None:
        self._segments = segments
        self._bases = [s.base_offset for s in segments]
        self._index = -1
        self._file: MappedFile | None = None
        self._pos = 0
        self._batch: RecordBatch | None = None
        self._record_index = 0

    def _open(self, index: int) -> None:
        self.close()
        self._index = index
        self._file = MappedFile(self._segments[index].path)
        self._pos = 0
        self._batch = None

    def close(self) -> None:
        self._batch = None
        if self._file is not None:
            self._file.close()
        self._file = None

    def find(self, offset: int) -> tuple[RecordBatch, Record]:
        batch = self._batch
        if batch is None or not (batch.base_offset <= offset <= batch.last_offset):
            batch = self._seek_batch(offset)
        records = batch.records
        i = self._record_index
        while i < len(records) and batch.base_offset + records[i].offset_delta < offset:
            i += 1
        if i == len(records) or batch.base_offset + records[i].offset_delta != offset:
            raise KraftError(
                ErrorCode.CORRUPT_MESSAGE,
                f"offset {offset} vanished from {self._segments[self._index].path} during compaction",
            )
        self._record_index = i + 1
        return batch, records[i]

    def _seek_batch(self, offset: int) -> RecordBatch:
        wanted = bisect.bisect_right(self._bases, offset) - 1
        if wanted < 0:
            raise KraftError(ErrorCode.CORRUPT_MESSAGE, f"offset {offset} is below the first input segment")
        if wanted != self._index:
            self._open(wanted)
        assert self._file is not None
        view = self._file.view
        while self._pos < len(view):
            header = peek_batch_header(view, self._pos)
            if header.last_offset < offset:
                self._pos += header.size_in_bytes  # skip without decoding: nothing of it survives
                continue
            batch, self._pos = decode_batch(view, self._pos, max_batch_bytes=STORED_BATCH_MAX_BYTES)
            self._batch = batch
            self._record_index = 0
            return batch
        raise KraftError(
            ErrorCode.CORRUPT_MESSAGE,
            f"offset {offset} not found in {self._segments[self._index].path} during compaction",
        )


class SegmentWriter:
    """Writes contiguous batches of one range into segment files under ``directory``."""

    def __init__(self, directory: Path, segment_bytes: int, stats: RangeStats) -> None:
        self._directory = directory
        self._segment_bytes = segment_bytes
        self._stats = stats
        self._file: BinaryIO | None = None
        self._tmp_path: Path | None = None
        self._final_path: Path | None = None
        self._segment_base = 0
        self._segment_size = 0

    def write(self, batch_bytes: bytes, base_offset: int, last_offset: int) -> None:
        too_big = self._segment_size > 0 and self._segment_size + len(batch_bytes) > self._segment_bytes
        too_far = last_offset - self._segment_base > MAX_RELATIVE_OFFSET
        if self._file is None or too_big or too_far:
            self._roll(base_offset)
        assert self._file is not None
        self._file.write(batch_bytes)
        self._segment_size += len(batch_bytes)
        self._stats.batches_out += 1
        self._stats.bytes_out += len(batch_bytes)

    def _roll(self, base_offset: int) -> None:
        self.close()
        self._directory.mkdir(parents=True, exist_ok=True)
        self._final_path = self._directory / segment_file_name(base_offset)
        self._tmp_path = self._final_path.with_name(self._final_path.name + f".{os.getpid()}.tmp")
        self._file = open(self._tmp_path, "wb")  # noqa: SIM115 - closed in close()
        self._segment_base = base_offset
        self._segment_size = 0
        self._stats.segments_out += 1

    def close(self) -> None:
        if self._file is None:
            return
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        assert self._tmp_path is not None and self._final_path is not None
        self._tmp_path.replace(self._final_path)
        self._file = None


class RangeCompactor:
    """Builds the output batches of one :class:`OffsetRange` from its survivor offsets, in order."""

    def __init__(
        self, rng: OffsetRange, out_root: Path, segment_bytes: int, batch_records: int, batch_bytes: int
    ) -> None:
        self.range = rng
        self.stats = RangeStats(rng.task, rng.topic, rng.partition)
        self._cursor = InputCursor(rng.segments)
        self._writer = SegmentWriter(out_root / f"{rng.topic}-{rng.partition}", segment_bytes, self.stats)
        self._batch_records = batch_records
        self._batch_bytes = batch_bytes
        self._next_base = rng.start  # where the next output batch must start (contiguity)
        # (absolute offset, absolute timestamp, source record) of the open batch's records
        self._pending: list[tuple[int, int, Record]] = []
        self._pending_bytes = 0
        self._pending_source: tuple[int, int, int, int] | None = None
        self._pending_sequence = NO_SEQUENCE

    def add_row(self, kind: int, offset: int, records: int, first_offset: int) -> None:
        if kind == KIND_KEYED:
            self.stats.distinct_keys += 1
            self.stats.keyed_records_in += records
            self._keep(offset)
        elif kind == KIND_KEYLESS:
            self.stats.keyless_records += records
            if self.stats.keyless_first_offset < 0 or first_offset < self.stats.keyless_first_offset:
                self.stats.keyless_first_offset = first_offset
        elif kind == KIND_CONTROL:
            self.stats.control_records += records

    def _keep(self, offset: int) -> None:
        if not self.range.start <= offset < self.range.end:
            raise KraftError(
                ErrorCode.UNKNOWN_SERVER_ERROR,
                f"survivor offset {offset} routed to range [{self.range.start}, {self.range.end})",
            )
        batch, record = self._cursor.find(offset)
        timestamp = batch.base_timestamp + record.timestamp_delta
        if record.value is None:
            if timestamp < self.range.tombstone_horizon_ms:
                self.stats.tombstones_dropped += 1
                return
            self.stats.tombstones_kept += 1
        source = (
            batch.partition_leader_epoch,
            batch.producer_id,
            batch.producer_epoch,
            batch.attributes & _KEPT_ATTRIBUTES,
        )
        size = len(record.key or b"") + len(record.value or b"") + 16
        if self._pending and (
            source != self._pending_source
            or len(self._pending) >= self._batch_records
            or self._pending_bytes + size > self._batch_bytes
        ):
            self._flush(last_offset=self._pending[-1][0])
        if not self._pending:
            self._pending_source = source
            # Idempotent-producer batches keep their sequence numbering relative to the first record.
            self._pending_sequence = (
                batch.base_sequence + record.offset_delta
                if batch.producer_id != NO_PRODUCER_ID and batch.base_sequence != NO_SEQUENCE
                else NO_SEQUENCE
            )
        self._pending.append((offset, timestamp, record))
        self._pending_bytes += size

    def _flush(self, last_offset: int) -> None:
        base = self._next_base
        if self._pending:
            epoch, producer_id, producer_epoch, attributes = self._pending_source or (
                self.range.leader_epoch,
                NO_PRODUCER_ID,
                NO_PRODUCER_EPOCH,
                0,
            )
            first_ts = self._pending[0][1]
            records = tuple(
                Record(off - base, ts - first_ts, rec.key, rec.value, rec.headers)
                for off, ts, rec in self._pending
            )
            max_ts = max(ts for _, ts, _ in self._pending)
            sequence = self._pending_sequence
        else:
            epoch, producer_id, producer_epoch, attributes = (
                self.range.leader_epoch,
                NO_PRODUCER_ID,
                NO_PRODUCER_EPOCH,
                0,
            )
            records = ()
            first_ts = max_ts = -1
            sequence = NO_SEQUENCE
        encoded = encode_batch(
            RecordBatch(
                base_offset=base,
                partition_leader_epoch=epoch,
                magic=2,
                crc=0,
                attributes=attributes,
                last_offset_delta=last_offset - base,
                base_timestamp=first_ts,
                max_timestamp=max_ts,
                producer_id=producer_id,
                producer_epoch=producer_epoch,
                base_sequence=sequence,
                records=records,
            )
        )
        self._writer.write(encoded, base, last_offset)
        self.stats.records_out += len(records)
        self._next_base = last_offset + 1
        self._pending = []
        self._pending_bytes = 0
        self._pending_source = None

    def finish(self) -> RangeStats:
        """Close the range: the last batch stretches to the range end, so the log end is preserved."""
        try:
            if self._pending or self._next_base < self.range.end:
                self._flush(last_offset=self.range.end - 1)
            self._writer.close()
        finally:
            self._cursor.close()
        return self.stats
