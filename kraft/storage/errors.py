"""Storage error types.

Every storage error is a :class:`~kraft.errors.KraftError` so a gRPC edge can answer with its code:

- :class:`CorruptRecordError` (CORRUPT_MESSAGE): bytes that are not a valid v2 record batch.
- :class:`RecordTooLargeError` (MESSAGE_TOO_LARGE): a batch larger than the configured maximum.
- :class:`StorageStateError` (KAFKA_STORAGE_ERROR): an unusable directory or state file — unformatted,
  corrupt, or belonging to another cluster/node.  Nothing is overwritten when it is raised.
- :class:`InconsistentClusterIdError` (INCONSISTENT_CLUSTER_ID): ``meta.properties`` names another cluster.
- :class:`CorruptLogError` (KAFKA_STORAGE_ERROR): a log, snapshot or state file whose *durable* bytes fail
  verification (below the recovery point, in a frozen snapshot, in ``meta.properties``).  Nothing is
  truncated or rewritten: the data was acknowledged, so the process must stop rather than run without it.
- :class:`FatalStorageError`: an fsync/write failure (EIO, ENOSPC).  The page cache state is unknown after a
  failed fsync (the "fsyncgate" rule), so it is never retried: the caller must stop the process.
"""

from __future__ import annotations

from kraft.errors import ErrorCode, KraftError


class StorageError(KraftError):
    """Base class of every storage error."""


class CorruptRecordError(StorageError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CORRUPT_MESSAGE, message)


class RecordTooLargeError(StorageError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.MESSAGE_TOO_LARGE, message)


class OffsetOutOfRangeError(StorageError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.OFFSET_OUT_OF_RANGE, message)


class InvalidAppendError(StorageError):
    """An append whose base offset or epoch does not fit the log (a caller bug, nothing was written)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INVALID_REQUEST, message)


class StorageStateError(StorageError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, message)


class InconsistentClusterIdError(StorageError):
    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.INCONSISTENT_CLUSTER_ID, message)


class FatalStorageError(StorageError):
    """A failed fsync or write: the on-disk state is unknown, so the process must stop (never retry)."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, message)


class CorruptLogError(StorageError):
    """Durable data failed verification: a one-line message naming the file, the byte position (and the
    offset when there is one) and what failed.  Raised instead of truncating, because the bytes were
    known flushed — acknowledged — and dropping them silently would lose committed data."""

    def __init__(self, path: object, position: int | None, reason: str, *, offset: int | None = None) -> None:
        where = f" at byte {position}" if position is not None else ""
        at_offset = f" (offset {offset})" if offset is not None else ""
        super().__init__(ErrorCode.KAFKA_STORAGE_ERROR, f"corrupt {path}{where}{at_offset}: {reason}")
        self.path = str(path)
        self.position = position
        self.offset = offset
        self.reason = reason
