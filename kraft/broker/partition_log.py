"""The narrow interface the partition manager needs from a partition's log.

The real implementation (:mod:`kraft.broker.segmented_partition_log`) wraps the segmented log of
:mod:`kraft.storage`; keeping the manager on this protocol keeps ``broker`` independent of the storage
module's internals and lets follower fetchers (a later step) reuse the same calls (append at a given
epoch, truncate, read).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from kraft.broker.types import ProducedRecord, StoredRecord


class PartitionLog(Protocol):
    @property
    def log_start_offset(self) -> int: ...

    @property
    def log_end_offset(self) -> int: ...

    def append_records(
        self, records: Sequence[ProducedRecord], leader_epoch: int, max_batch_bytes: int | None = None
    ) -> int:
        """Append one batch stamped with ``leader_epoch``; return the offset of its first record.

        A batch whose encoded size is above ``max_batch_bytes`` raises RecordTooLargeError
        (MESSAGE_TOO_LARGE) and writes nothing.
        """
        ...

    def read_records(self, offset: int, max_bytes: int) -> list[StoredRecord]:
        """Records from ``offset`` (log_start ≤ offset ≤ log_end, else OffsetOutOfRangeError).

        At least one record is returned when ``offset`` < log_end, even if it exceeds ``max_bytes``.
        """
        ...

    def flush(self) -> None: ...

    # --- replication (docs/internals/replication.md) ---------------------------------------------

    @property
    def flushed_offset(self) -> int:
        """Everything below it is on disk (fsynced): the position replication counts."""
        ...

    def epoch_entries(self) -> list[tuple[int, int]]:
        """``(leader epoch, start offset)`` of every epoch with records, both increasing."""
        ...

    def read_batches(self, offset: int, max_bytes: int, max_offset: int) -> bytes:
        """Whole stored batches from the one holding ``offset``, byte for byte (at least one when there
        is one), only batches whose base offset is below ``max_offset``."""
        ...

    def append_batches(self, data: bytes) -> int:
        """Append a leader's batches unchanged (their offsets and epochs; validated: CRC, contiguity,
        epochs not decreasing); returns the new log end."""
        ...

    def truncate_to(self, offset: int) -> int:
        """Remove everything at and above ``offset``; returns the new log end."""
        ...

    def close(self) -> None: ...


# Opens (creating if needed) the log stored in a partition directory.
PartitionLogOpener = Callable[[Path], PartitionLog]
