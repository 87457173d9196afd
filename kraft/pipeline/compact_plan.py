"""Compaction planning: scan segment headers (in executors), then cut each partition into offset ranges.

The header scan reads 61 bytes per batch plus its CRC — no record decoding — and yields the facts the
driver needs: log start/end offsets, newest timestamp (for the tombstone horizon), record and byte
counts, and *checkpoints* (a batch start every ``checkpoint_bytes``) where a writer range may begin.
"""

from __future__ import annotations

from dataclasses import dataclass

from kraft.errors import ErrorCode, KraftError
from kraft.pipeline.compact_writer import OffsetRange
from kraft.pipeline.decode import mapped
from kraft.pipeline.layout import LogFile, PartitionDir
from kraft.storage.batch import STORED_BATCH_MAX_BYTES, check_batch
from kraft.storage.errors import CorruptRecordError


@dataclass(frozen=True, slots=True)
class Checkpoint:
    offset: int  # base offset of a batch
    leader_epoch: int
    position: int  # bytes of the partition before this batch (within its segment + earlier segments)


@dataclass(frozen=True, slots=True)
class SegmentScan:
    log_file: LogFile
    first_offset: int  # -1 when the segment holds no valid batch
    next_offset: int
    max_timestamp_ms: int
    records: int
    batches: int
    valid_bytes: int
    checkpoints: tuple[Checkpoint, ...]  # positions relative to the segment start


@dataclass(frozen=True, slots=True)
class PartitionPlan:
    topic: str
    partition: int
    path: str
    log_start_offset: int
    log_end_offset: int
    max_timestamp_ms: int
    tombstone_horizon_ms: int
    records_in: int
    bytes_in: int
    truncated_tail_bytes: int
    segments_in: int
    ranges: tuple[OffsetRange, ...]


def scan_segment(log_file: LogFile, checkpoint_bytes: int) -> SegmentScan:
    """Validate every batch header and CRC of one segment (runs in an executor)."""
    first = -1
    next_offset = log_file.base_offset
    max_ts = -1
    records = batches = 0
    checkpoints: list[Checkpoint] = []
    last_checkpoint_pos = -checkpoint_bytes
    with mapped(log_file.path) as view:
        pos = 0
        end = len(view)
        while pos < end:
            try:
                header = check_batch(view, pos, max_batch_bytes=STORED_BATCH_MAX_BYTES)
            except CorruptRecordError as exc:
                if log_file.is_last_segment:
                    break  # a torn tail: recovery would truncate here, so does compaction
                raise KraftError(ErrorCode.CORRUPT_MESSAGE, f"{log_file.path}: {exc.message}") from exc
            if first < 0:
                first = header.base_offset
            if pos - last_checkpoint_pos >= checkpoint_bytes:
                checkpoints.append(Checkpoint(header.base_offset, header.partition_leader_epoch, pos))
                last_checkpoint_pos = pos
            next_offset = header.next_offset
            max_ts = max(max_ts, header.max_timestamp)
            records += header.record_count
            batches += 1
            pos += header.size_in_bytes
    return SegmentScan(log_file, first, next_offset, max_ts, records, batches, pos, tuple(checkpoints))


def plan_partition(
    partition_dir: PartitionDir,
    scans: list[SegmentScan],
    *,
    first_task: int,
    task_bytes: int,
    tombstone_retention_ms: int,
) -> PartitionPlan:
    """Cut one partition into ranges of about ``task_bytes`` input bytes, starting at checkpoints."""
    useful = [s for s in sorted(scans, key=lambda s: s.log_file.base_offset) if s.batches > 0]
    bytes_in = sum(s.valid_bytes for s in useful)
    truncated = sum(s.log_file.size_bytes - s.valid_bytes for s in scans)
    records_in = sum(s.records for s in useful)
    if not useful:
        return PartitionPlan(
            partition_dir.topic,
            partition_dir.partition,
            partition_dir.path,
            -1,
            -1,
            -1,
            -1,
            0,
            0,
            truncated,
            len(scans),
            (),
        )
    max_ts = max(s.max_timestamp_ms for s in useful)
    horizon = max_ts - tombstone_retention_ms
    log_start = useful[0].first_offset
    log_end = useful[-1].next_offset
    segments = tuple(s.log_file for s in useful)
    starts: list[Checkpoint] = []
    consumed = 0
    for scan in useful:
        for checkpoint in scan.checkpoints:
            position = consumed + checkpoint.position
            if not starts or position - starts[-1].position >= task_bytes:
                starts.append(Checkpoint(checkpoint.offset, checkpoint.leader_epoch, position))
        consumed += scan.valid_bytes
    ranges = tuple(
        OffsetRange(
            task=first_task + i,
            topic=partition_dir.topic,
            partition=partition_dir.partition,
            start=start.offset,
            end=starts[i + 1].offset if i + 1 < len(starts) else log_end,
            leader_epoch=start.leader_epoch,
            tombstone_horizon_ms=horizon,
            segments=segments,
        )
        for i, start in enumerate(starts)
    )
    return PartitionPlan(
        partition_dir.topic,
        partition_dir.partition,
        partition_dir.path,
        log_start,
        log_end,
        max_ts,
        horizon,
        records_in,
        bytes_in,
        truncated,
        len(scans),
        ranges,
    )
