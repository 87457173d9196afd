"""A partition log on :class:`kraft.storage.log.SegmentedLog` (Kafka's on-disk format).

Durability follows Kafka's defaults: a Produce appends to the page cache and is not fsynced on its own
(Kafka relies on replication, ``flush.messages`` is unbounded); segments are fsynced when they roll and
when the log closes, and :meth:`SegmentedPartitionLog.flush` exists for callers that want more.

Size limits: a Produce's batch is built here and checked against the caller's limit (``message.max.bytes``
or the topic's ``max.message.bytes``) before a byte is written.  Reading and recovery accept any batch up
to :data:`STORED_BATCH_MAX_BYTES`: like Kafka, recovery is bounded by the file and the CRC, not by today's
produce limit, so lowering a limit (or restarting after kill -9) never cuts off batches that were
acknowledged under a higher one.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kraft.broker.partition_log import PartitionLog, PartitionLogOpener
from kraft.broker.types import ProducedRecord, StoredRecord
from kraft.observability.logging import get_logger
from kraft.storage.batch import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    STORED_BATCH_MAX_BYTES,
    Record,
    RecordBatch,
    RecordTooLargeError,
    build_batch,
    encode_batch,
    iter_batches,
)
from kraft.storage.log import LogConfig, SegmentedLog, close_logs, sync_recovered_logs
from kraft.storage.open_files import OpenFileCache


class SegmentedPartitionLog:
    __slots__ = ("_log", "_max_stored_batch_bytes")

    def __init__(self, log: SegmentedLog, max_stored_batch_bytes: int = STORED_BATCH_MAX_BYTES) -> None:
        self._log = log
        self._max_stored_batch_bytes = max_stored_batch_bytes

    @property
    def log_start_offset(self) -> int:
        return self._log.start_offset

    @property
    def log_end_offset(self) -> int:
        return self._log.end_offset

    def append_records(
        self, records: Sequence[ProducedRecord], leader_epoch: int, max_batch_bytes: int | None = None
    ) -> int:
        data = self._build(records, leader_epoch)
        if max_batch_bytes is not None and len(data) > max_batch_bytes:
            # Nothing is written: the batch only existed in memory.
            raise RecordTooLargeError(
                f"record batch of {len(data)} bytes is above the limit of {max_batch_bytes} bytes"
            )
        # Built here at end_offset and not yet written, so only the leader-epoch rule is left to check.
        return self._log.append_batch(data, validate=False).first_offset

    def _build(self, records: Sequence[ProducedRecord], leader_epoch: int) -> bytes:
        first = records[0].timestamp_ms
        if all(r.timestamp_ms == first for r in records):
            return build_batch(
                self._log.end_offset,
                [(r.key, r.value) for r in records],
                leader_epoch=leader_epoch,
                timestamp_ms=first,
            )
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
        return encode_batch(batch)

    def read_records(self, offset: int, max_bytes: int) -> list[StoredRecord]:
        read = self._log.read(offset, max_bytes)
        out: list[StoredRecord] = []
        for batch in iter_batches(read.records, max_batch_bytes=self._max_stored_batch_bytes):
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

    @property
    def flushed_offset(self) -> int:
        return self._log.flushed_offset

    def epoch_entries(self) -> list[tuple[int, int]]:
        return self._log.epoch_entries()

    def read_batches(self, offset: int, max_bytes: int, max_offset: int) -> bytes:
        return bytes(self._log.read(offset, max_bytes, max_offset=max_offset).records)

    def append_batches(self, data: bytes) -> int:
        self._log.append_batch(data, validate=True)
        return self._log.end_offset

    def truncate_to(self, offset: int) -> int:
        return self._log.truncate_to(offset)

    def close(self) -> None:
        self._log.close()

    def discard(self) -> None:
        """Close before the log is deleted: no flush, no sync, no clean-shutdown marker (Kafka does not
        flush a log it deletes either). ``close`` would fsync every dirty segment and write the marker —
        one deleted partition was 60-90 ms of a loaded host's event loop, for data about to go."""
        self._log.abandon()


def close_partition_logs(logs: Sequence[PartitionLog]) -> None:
    """Close many partition logs together: the segmented ones with :func:`kraft.storage.log.close_logs`
    (a few syncs in all instead of several fsyncs per partition), any other kind one by one.  Every log
    is closed (a failed one without its clean-shutdown marker); the first error is raised at the end."""
    segmented = [log._log for log in logs if isinstance(log, SegmentedPartitionLog)]
    first: BaseException | None = None
    try:
        close_logs(segmented)
    except Exception as exc:  # re-raised below, after the other logs are closed
        first = exc
    for other in logs:
        if not isinstance(other, SegmentedPartitionLog):
            try:
                other.close()
            except Exception as exc:  # the first error is re-raised below
                first = first or exc
    if first is not None:
        raise first


def sync_recovered_partition_logs(logs: Sequence[PartitionLog]) -> dict[PartitionLog, Exception]:
    """After opening many partitions: the fdatasyncs their recovery scans deferred, in parallel
    (:func:`kraft.storage.log.sync_recovered_logs`).  Returns the logs whose sync failed → the error (such
    a log refuses every further use)."""
    by_inner = {log._log: log for log in logs if isinstance(log, SegmentedPartitionLog)}
    failed = sync_recovered_logs(list(by_inner))
    return {by_inner[inner]: error for inner, error in failed.items()}


def segmented_log_opener(
    segment_bytes: int,
    max_stored_batch_bytes: int = STORED_BATCH_MAX_BYTES,
    *,
    open_files: OpenFileCache | None = None,
) -> PartitionLogOpener:
    """Opens partition directories as segmented logs rolling at ``segment_bytes`` (log.segment.bytes);
    reads and recovery accept batches up to ``max_stored_batch_bytes``.  With ``open_files`` every log
    shares that LRU of open segment files, so idle partitions hold no file descriptor (issue #14).
    After a crash, the sync of what a log's recovery scan kept is deferred: call
    :func:`sync_recovered_partition_logs` once the partitions are open (else each log syncs itself on
    first use)."""
    config = LogConfig(
        segment_bytes=segment_bytes,
        max_batch_bytes=max_stored_batch_bytes,
        open_files=open_files,
        defer_recovery_sync=True,
    )
    log = get_logger("broker.partition_log")

    def open_log(path: Path) -> PartitionLog:
        segmented = SegmentedLog.open(path, config)
        if segmented.recovered_bytes_truncated:
            # Recovery cut a torn or corrupt tail: say so, it is the only trace of lost unflushed bytes.
            log.warning(
                "partition_log_truncated_by_recovery",
                path=str(path),
                bytes=segmented.recovered_bytes_truncated,
                log_end_offset=segmented.end_offset,
            )
        return SegmentedPartitionLog(segmented, max_stored_batch_bytes)

    return open_log
