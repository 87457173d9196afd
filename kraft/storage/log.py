"""The segmented log: one directory of Kafka-format segments, used for the Raft metadata log and for
broker partition logs.

Directory contents::

    00000000000000000000.log / .index / .timeindex    segments (see kraft.storage.segment)
    leader-epoch-checkpoint                             epoch → start offset (kraft.storage.epoch_cache)
    recovery-point-offset-checkpoint                    Kafka's format, this log's entry (offset_checkpoint)
    log-start-offset-checkpoint                         Kafka's format, this log's entry
    .kraft_cleanshutdown                                clean or dirty, with the end offset (shutdown_marker)

Offsets: ``start_offset`` ≤ ``flushed_offset`` ≤ ``end_offset`` (``flushed_offset`` may briefly lag
``start_offset`` only right after a ``truncate_fully_and_start_at``).  The recovery point ≤
``flushed_offset`` is the offset below which everything is known fsynced, checkpointed after flushes
(paced: after a roll or every ``recovery_point_interval_bytes``).  After an unclean shutdown, segments
wholly below it are trusted (their batches are verified when read), the rest are scanned batch by batch
(size, magic, CRC, offset continuity, leader epoch): damage at or above the recovery point is truncated
(and logged with file, offset and bytes), damage below it raises CorruptLogError — flushed data is never
silently dropped.  In the segment holding the recovery point, the batches below it get a header walk
(which rebuilds the indexes) and the CRC scan starts at the recovery point's batch, once its position is
verified (the CRC of the batch ending just before it; else the whole segment is scanned).
Without a readable recovery-point checkpoint every segment is scanned and only the newest may be cut
(damage in an older segment, which was complete when the next one was rolled, raises).

Threading: every method must be called from one thread, except :meth:`flush`, which may run in a worker
thread (``asyncio.to_thread``) concurrently with appends and reads — not with truncation, deletion or
close.
"""

from __future__ import annotations

import os
import struct
import threading
from bisect import bisect_right
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from kraft.observability.logging import get_logger
from kraft.storage import shutdown_marker
from kraft.storage.batch import (
    DEFAULT_MAX_BATCH_BYTES,
    HEADER_SIZE,
    LOG_OVERHEAD,
    MAGIC,
    BatchHeader,
    ControlMessage,
    RecordInput,
    build_batch,
    build_control_batch,
    check_batch,
    peek_batch_header,
)
from kraft.storage.epoch_cache import CHECKPOINT_FILE, UNDEFINED_EPOCH, LeaderEpochCache
from kraft.storage.errors import (
    CorruptLogError,
    FatalStorageError,
    InvalidAppendError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageStateError,
)
from kraft.storage.fileio import (
    SyncBarrier,
    fdatasync_fd,
    fdatasync_path,
    fsync_dir,
    overwrite_unsynced,
    replace_unsynced,
)
from kraft.storage.offset_checkpoint import (
    LOG_START_OFFSET_FILE,
    RECOVERY_POINT_FILE,
    offset_checkpoint_bytes,
    read_offset_checkpoint,
    write_offset_checkpoint,
)
from kraft.storage.open_files import OpenFileCache
from kraft.storage.segment import INDEX_SUFFIX, LOG_SUFFIX, PROTECT_ALL, TIMEINDEX_SUFFIX, LogSegment

CLEAN_SHUTDOWN_FILE = shutdown_marker.MARKER_FILE
LEGACY_OFFSETS_CHECKPOINT_FILE = "log-offsets-checkpoint"
"""Before the Kafka-format checkpoints: "0\\n<log start>\\n<recovery point>\\n"; read once, then removed."""
RECOVERY_POINT_INTERVAL_BYTES = 1 << 20
_EVERYTHING = PROTECT_ALL
_log = get_logger("storage")
METADATA_LOG_DIR_NAME = "__cluster_metadata-0"
METADATA_LOG_PREALLOCATE_BYTES = 1 << 20
"""The Raft log flushes after every batch, so it keeps 1 MiB preallocated ahead of its data: the per-batch
fdatasync then never grows the file (measured here: ~0.2 ms vs ~0.35 ms p50 for append+fsync with three
logs flushing at once, and a p90 ~10x lower)."""


def partition_dir_name(topic: str, partition: int) -> str:
    """Kafka's partition directory name, e.g. ``orders-3``; the metadata log is ``__cluster_metadata-0``."""
    return f"{topic}-{partition}"


@dataclass(frozen=True, slots=True)
class LogConfig:
    segment_bytes: int = 1024 * 1024 * 1024  # log.segment.bytes / metadata.log.segment.bytes
    segment_ms: int = 7 * 24 * 3600 * 1000  # metadata.log.segment.ms (compared with batch timestamps)
    index_interval_bytes: int = 4096  # Kafka's index.interval.bytes
    max_batch_bytes: int = DEFAULT_MAX_BATCH_BYTES
    recovery_point_interval_bytes: int = RECOVERY_POINT_INTERVAL_BYTES
    """A flush rewrites the recovery-point checkpoint (two extra fsyncs) once this many bytes were
    appended since the last one, and always after a roll.  Smaller: less flushed data is exposed to
    truncation after a crash and less is scanned; larger: fewer checkpoint writes on the flush path."""
    open_files: OpenFileCache | None = field(default=None, compare=False)
    """Keep at most this cache's capacity of segment files open (an LRU shared by many logs, reopened on
    use; :mod:`kraft.storage.open_files`); None = every segment keeps its file open.  With a cache, every
    call — :meth:`SegmentedLog.flush` included — must come from one thread."""
    defer_recovery_sync: bool = False
    """After a recovery scan, leave the fdatasync of the scanned segments to :func:`sync_recovered_logs`
    (many logs' syncs at once, in parallel) — or, if it is not called, to the first use of the log.
    Until then ``flushed_offset`` stays at the recovery point.  The broker opens its partitions so."""
    preallocate_bytes: int = 0
    """Zero-filled space kept ahead of the active segment's data so flushes do not grow the file (see
    :mod:`kraft.storage.segment`); 0 = off.  The metadata log uses :data:`METADATA_LOG_PREALLOCATE_BYTES`."""

    def __post_init__(self) -> None:
        if self.segment_bytes < 1024:
            raise ValueError(f"segment_bytes must be >= 1024, got {self.segment_bytes}")
        if self.segment_ms <= 0 or self.index_interval_bytes <= 0 or self.max_batch_bytes <= 0:
            raise ValueError("segment_ms, index_interval_bytes and max_batch_bytes must be positive")
        if self.preallocate_bytes < 0:
            raise ValueError(f"preallocate_bytes must be >= 0, got {self.preallocate_bytes}")
        if self.recovery_point_interval_bytes < 0:
            raise ValueError(
                f"recovery_point_interval_bytes must be >= 0, got {self.recovery_point_interval_bytes}"
            )


class AppendResult(NamedTuple):
    first_offset: int
    last_offset: int


class ReadResult(NamedTuple):
    """Whole batches starting with the one holding the requested offset (``records`` may be empty)."""

    records: bytes
    first_offset: int  # base offset of the first batch returned (may be below the requested offset)
    next_offset: int  # offset after the last batch returned (= requested offset when empty)


class SegmentInfo(NamedTuple):
    base_offset: int
    next_offset: int
    size_in_bytes: int
    max_timestamp: int
    path: Path


def _parse_segment_base(name: str) -> int:
    stem = name[: -len(LOG_SUFFIX)]
    if len(stem) != 20 or not stem.isdigit():
        raise StorageStateError(f"unexpected segment file name {name!r}: expected <20-digit offset>.log")
    return int(stem)


class _RecoveryEpochCheck:
    """Validates batch leader epochs during a recovery scan and rebuilds the epoch cache from them.

    The partition leader epoch is outside the batch CRC (Kafka's format), so a damaged epoch field would
    pass the CRC.  Two checks catch it: epochs never decrease along the log, and — when the
    ``leader-epoch-checkpoint`` was readable — every batch's epoch must be the one the checkpoint gives
    for its offset (the checkpoint is written before the batches of a new epoch, so it always covers
    them).  Offsets below the checkpoint's first entry (before the log start) are not cross-checked.
    """

    __slots__ = ("_cache", "_last_epoch", "_ref_epochs", "_ref_offsets", "problem")

    def __init__(self, cache: LeaderEpochCache, reference: list[tuple[int, int]]) -> None:
        self.problem = ""
        self._cache = cache
        self._ref_epochs = [e for e, _ in reference]
        self._ref_offsets = [o for _, o in reference]
        self._last_epoch = cache.latest_epoch

    def __call__(self, epoch: int, base_offset: int) -> int:
        if epoch < self._last_epoch:
            self.problem = f"below the previous batch's epoch {self._last_epoch}"
            return -1
        next_check = _NO_CHECK
        offsets = self._ref_offsets
        if offsets and base_offset >= offsets[0]:
            i = bisect_right(offsets, base_offset) - 1
            if self._ref_epochs[i] != epoch:
                self.problem = f"{CHECKPOINT_FILE} gives epoch {self._ref_epochs[i]} for this offset"
                return -1
            if i + 1 < len(offsets):
                next_check = offsets[i + 1]
        elif offsets:
            next_check = offsets[0]
        self._last_epoch = epoch
        self._cache.assign(epoch, base_offset)
        return next_check

    def rewind(self, offset: int) -> None:
        self._cache.truncate_from_end(offset)
        self._last_epoch = self._cache.latest_epoch


_NO_CHECK = 2**63
# base offset, length, partition leader epoch, magic, CRC, attributes, last offset delta: what a read
# verifies.
_READ_CHECK = struct.Struct(">qiibIhi")


class SegmentedLog:
    """See the module docstring.  Open with :meth:`open`; always :meth:`close` (it writes the
    clean-shutdown marker that lets the next open skip recovery)."""

    def __init__(self, directory: Path, config: LogConfig) -> None:
        self.dir = directory
        self.config = config
        self._segments: list[LogSegment] = []
        self._bases: list[int] = []
        self._epochs = LeaderEpochCache(directory / CHECKPOINT_FILE)
        self._start_offset = 0
        self._flushed_offset = 0
        self._recovery_point = 0
        self._dir_dirty = False
        # The clean-shutdown marker still says "clean" on disk (read so at open): it is rewritten "dirty"
        # before the first change to the log (:meth:`_settle_marker`), so it never outlives a change.
        self._marker_says_clean = False
        # Segments kept by a recovery scan and not fsynced yet (LogConfig.defer_recovery_sync).
        self._unsynced: list[LogSegment] = []
        # The offsets the checkpoint files hold (None: unknown), so a close rewrites only what changed.
        self._checkpointed_start: int | None = None
        self._checkpointed_recovery: int | None = None
        self._lock = threading.Lock()  # guards the segment list against a concurrent flush()
        self._flush_lock = threading.Lock()
        self._closed = False
        # Set by the first failed fsync/write: every later call re-raises it (fsyncgate: never retry).
        self._failed: FatalStorageError | None = None
        self.recovered_bytes_truncated = 0  # for logs/metrics: bytes cut off by the last recovery
        # Bytes the open's recovery CRC-checked (segments scanned, from the recovery point inside the
        # segment holding it): what a crash costs to reopen.
        self.recovered_bytes_scanned = 0
        # Bytes ever appended (written by the appending thread only) and the count at the last
        # recovery-point checkpoint (written by the flushing thread): their difference paces checkpoints.
        self._appended_bytes = 0
        self._checkpointed_bytes = 0

    # --- opening -----------------------------------------------------------------------------------

    @classmethod
    def open(
        cls, directory: str | os.PathLike[str], config: LogConfig | None = None, *, create: bool = True
    ) -> SegmentedLog:
        """Open (and recover if needed) the log in ``directory``; create it if ``create`` is set.

        Raises StorageStateError if the directory is missing (and ``create`` is False) or holds files that
        cannot be a kraft log; FatalStorageError on an IO failure.
        """
        path = Path(directory)
        if not path.is_dir():
            if not create:
                raise StorageStateError(f"log directory {path} does not exist")
            try:
                path.mkdir(parents=True)
            except OSError as exc:
                raise StorageStateError(f"cannot create log directory {path}: {exc.strerror}") from exc
            fsync_dir(path.parent)
        log = cls(path, config or LogConfig())
        log._load()
        return log

    def _load(self) -> None:
        # One listing, not a glob per suffix: a broker opens thousands of these directories at start.
        names = os.listdir(self.dir)
        for name in names:
            if name.endswith(".tmp"):
                (self.dir / name).unlink()
        bases = sorted(_parse_segment_base(name) for name in names if name.endswith(LOG_SUFFIX))
        self._remove_orphan_indexes(names, set(bases))
        marker = shutdown_marker.read(self.dir)
        clean = marker.clean
        start_offset, recovery_point = self._read_offsets_checkpoints(clean, bool(bases))
        if clean:
            # The marker holds the end offset of the clean close, the recovery point it vouches for.
            recovery_point = marker.end_offset
        epochs_ok = self._epochs.load()
        first_entry = self._epochs.first_offset
        if epochs_ok and bases and first_entry is not None and first_entry > max(start_offset, bases[0]):
            # The first epoch must start at the log start (truncate_from_start keeps it there): a later
            # first entry leaves batches without an epoch — a damaged checkpoint, rebuilt by a full scan.
            epochs_ok = False
        reference = self._epochs.entries() if epochs_ok else []
        epochs_changed = False
        full_scan = not epochs_ok
        if full_scan:
            # Derived data: rebuild it from every segment (a full scan; rare).  The recovery point still
            # says which offsets were flushed, so damage below it still stops the open.
            self._epochs.clear()
            epochs_changed = True
        # A segment is trusted (not scanned) after a clean shutdown, or when it lies entirely below the
        # recovery point (it was fsynced before the checkpoint was written).
        trusted = [
            not full_scan and (clean or (i + 1 < len(bases) and bases[i + 1] <= recovery_point))
            for i in range(len(bases))
        ]
        # After a clean close everything was flushed, whatever the checkpoint says.  Without a recovery
        # point (its file lost or unreadable) only the newest segment can hold an unflushed tail: every
        # older one was complete when the next was rolled, so damage there is corruption, not a torn write.
        if clean:
            protect_below = _EVERYTHING
        elif recovery_point < 0 and bases:
            protect_below = bases[-1]
        else:
            protect_below = recovery_point
        first_scanned = next((b for b, t in zip(bases, trusted, strict=True) if not t), None)
        if first_scanned is not None:
            epochs_changed |= self._epochs.truncate_from_end(first_scanned)
        try:
            self._open_segments(
                bases,
                trusted,
                _RecoveryEpochCheck(self._epochs, reference),
                protect_below,
                recovery_point,
                # The segment holding the recovery point is CRC-scanned from the recovery point on
                # (segment.recover, resume_at): what lies below it was flushed.
                resume_at=recovery_point if not clean and not full_scan and recovery_point > 0 else None,
            )
        except BaseException:
            for segment in self._segments:
                segment.close()
            raise
        if not self._segments:
            if recovery_point > max(start_offset, 0):
                raise CorruptLogError(
                    self.dir,
                    None,
                    f"no segment files, but the recovery point is {recovery_point} (flushed data is missing, "
                    f"or {RECOVERY_POINT_FILE} is damaged)",
                )
            self._segments.append(self._new_segment(max(start_offset, 0)))
        self._bases = [s.base_offset for s in self._segments]
        end = self.end_offset
        self._start_offset = min(max(start_offset, self._segments[0].base_offset), end)
        epochs_changed |= self._epochs.truncate_from_start(self._start_offset)
        epochs_changed |= self._epochs.truncate_from_end(end)
        # A recovery scan re-derives the entries of the segments it scanned: usually the same ones, and
        # then the file is not rewritten (two fsyncs per partition after every crash).
        if not epochs_ok or (epochs_changed and self._epochs.entries() != reference):
            self._epochs.save()
        # What a recovery scan kept may still sit only in the page cache (written by the crashed process):
        # make it durable now, so the flushed offset can start at the end.  Trusted segments need no sync:
        # they lie below the recovery point or were synced before the clean-shutdown marker was written.
        if not clean and first_scanned is not None:
            self._unsynced = [s for s in self._segments if s.base_offset >= first_scanned]
        if self._unsynced and not self.config.defer_recovery_sync:
            self._sync_recovered()
        # Until the recovered segments are synced (sync_recovered_logs, or the first use of the log),
        # the recovery point is what is known flushed.
        self._flushed_offset = end if not self._unsynced else max(min(recovery_point, end), 0)
        # "Dirty" is written lazily, before the first change (_settle_marker): a clean open syncs nothing.
        self._marker_says_clean = clean
        if not marker.exists:
            # Created once, dirty (creating a file is what costs at close; rewriting it is cheap).  Made
            # durable by the next directory fsync; if a crash loses it, the log is simply recovered.
            shutdown_marker.write(self.dir, clean=False, end_offset=-1, sync=False)
            self._dir_dirty = True
        if self._dir_dirty:
            fsync_dir(self.dir)
            self._dir_dirty = False
        # After a clean close the recovery point is the end (the marker's); after a crash the one read
        # stays valid (a lower bound: everything below it is still flushed) and advances with the next
        # flush.  The checkpoint file is written only when it is unreadable.
        self._recovery_point = end if clean or recovery_point < 0 else recovery_point
        if self._checkpointed_recovery is None:
            self._write_recovery_point()
        if self._start_offset != self._checkpointed_start:
            self._write_start_offset()
        legacy = self.dir / LEGACY_OFFSETS_CHECKPOINT_FILE
        if legacy.exists():
            legacy.unlink()
            fsync_dir(self.dir)

    def _sync_recovered(self) -> None:
        """fdatasync the segments a recovery scan kept (they may hold a crashed process's page-cache
        writes); from then on everything up to the end is flushed."""
        unsynced, self._unsynced = self._unsynced, []
        try:
            for segment in unsynced:
                segment.dirty = True
                segment.flush()
        except FatalStorageError as exc:
            self._failed = exc
            raise
        self._flushed_offset = max(self._flushed_offset, self.end_offset)

    def _settle_marker(self) -> None:
        """Before the first change after a clean open: rewrite the marker "dirty" and fdatasync it, so a
        crash can never leave a "clean" marker vouching for a log that changed after it was written."""
        if self._marker_says_clean:
            shutdown_marker.write(self.dir, clean=False, end_offset=-1, sync=True)
            self._marker_says_clean = False

    def _open_segments(
        self,
        bases: list[int],
        trusted: list[bool],
        check: _RecoveryEpochCheck,
        protect_below: int,
        recovery_point: int,
        resume_at: int | None = None,
    ) -> None:
        """Load trusted segments, recover the others; drop everything after the first damage above the
        recovery point (``protect_below``), raise CorruptLogError for damage below it.  The first
        recovered segment is CRC-scanned from offset ``resume_at`` on when it holds it."""
        truncated_at: int | None = None
        for i, base in enumerate(bases):
            segment = self._segment(base)
            before = segment.size
            try:
                if trusted[i]:
                    segment.load_trusted()
                    cut = False
                else:
                    cut = segment.recover(
                        check, self.config.max_batch_bytes, protect_below=protect_below, resume_at=resume_at
                    )
                    resume_at = None  # only the first recovered segment can hold the recovery point
                    self.recovered_bytes_scanned += segment.scanned_bytes
            except BaseException:
                segment.close()
                raise
            self.recovered_bytes_truncated += before - segment.size - segment.preallocated_tail
            if self._segments and self._segments[-1].next_offset != base:
                # A gap after a truncated or empty segment: this and every later segment are garbage —
                # unless the missing offsets were flushed.  An overlap, or a mismatch after a trusted
                # segment (whose last header, e.g. a last-offset delta, is damaged), is never a torn tail.
                previous_end = self._segments[-1].next_offset
                segment.close()
                if previous_end < protect_below or previous_end > base or trusted[i - 1]:
                    raise CorruptLogError(
                        segment.log_path,
                        0,
                        f"segment starts at offset {base} but the log before it ends at {previous_end} "
                        f"(recovery point {recovery_point}): flushed data is damaged or missing",
                    )
                truncated_at = i
                break
            self._segments.append(segment)
            if cut:
                truncated_at = i + 1
                break
        end = self._segments[-1].next_offset if self._segments else None
        if end is not None and protect_below == _EVERYTHING and 0 <= recovery_point != end:
            # Closed cleanly at the recovery point, yet the trusted newest segment ends elsewhere: a
            # damaged header (say a last-offset delta, which the cheap tail walk cannot check) or a
            # damaged checkpoint.  A verifying scan decides: damage raises, else the checkpoint was wrong.
            newest = self._segments[-1]
            try:
                newest.recover(None, protect_below=PROTECT_ALL)
            except BaseException:
                for segment in self._segments:
                    segment.close()
                raise
            _log.warning(
                "recovery_point_mismatch",
                file=str(self.dir / RECOVERY_POINT_FILE),
                recovery_point=recovery_point,
                end_offset=newest.next_offset,
                action="the newest segment passed a full verifying scan",
            )
            end = newest.next_offset
        if end is not None and end < recovery_point:
            # Every file read fine but the log is shorter than what was flushed (a file cut at a batch
            # boundary, a deleted newest segment).
            for segment in self._segments:
                segment.close()
            raise CorruptLogError(
                self._segments[-1].log_path,
                self._segments[-1].size,
                f"the log ends at offset {end}, below its recovery point {recovery_point} "
                f"(flushed data is missing, or {RECOVERY_POINT_FILE} is damaged)",
            )
        if truncated_at is not None:
            for base in bases[truncated_at:]:
                doomed = self._segment(base)
                self.recovered_bytes_truncated += doomed.size
                _log.warning(
                    "log_truncated",
                    file=str(doomed.log_path),
                    offset=base,
                    bytes_dropped=doomed.size,
                    reason="segment after the truncation point",
                    recovery_point=protect_below,
                )
                doomed.delete()
            self._dir_dirty = True

    def _remove_orphan_indexes(self, names: list[str], bases: set[int]) -> None:
        for suffix in (INDEX_SUFFIX, TIMEINDEX_SUFFIX):
            for name in names:
                if not name.endswith(suffix):
                    continue
                stem = name[: -len(suffix)]
                if not (len(stem) == 20 and stem.isdigit() and int(stem) in bases):
                    (self.dir / name).unlink()
                    self._dir_dirty = True

    def _read_offsets_checkpoints(self, clean: bool, has_segments: bool) -> tuple[int, int]:
        """(log start offset, recovery point); -1 for what is missing or unreadable.  A recovery point of
        -1 makes every segment scanned, with every segment but the newest protected (logged)."""
        start = read_offset_checkpoint(self.dir / LOG_START_OFFSET_FILE)
        recovery = read_offset_checkpoint(self.dir / RECOVERY_POINT_FILE)
        self._checkpointed_start, self._checkpointed_recovery = start.offset, recovery.offset
        if start.offset is not None and recovery.offset is not None:
            return start.offset, recovery.offset
        legacy = self._read_legacy_offsets_checkpoint()
        start_offset = start.offset if start.offset is not None else legacy[0]
        if recovery.offset is not None:
            return start_offset, recovery.offset
        if legacy[1] >= 0:
            return start_offset, legacy[1]
        if not clean and has_segments:
            _log.warning(
                "recovery_point_unknown",
                file=str(self.dir / RECOVERY_POINT_FILE),
                problem=recovery.problem,
                action="scanning every segment; damage before the newest segment stops the open",
            )
        return start_offset, -1

    def _read_legacy_offsets_checkpoint(self) -> tuple[int, int]:
        """The pre-Kafka-format ``log-offsets-checkpoint`` ("0\n<start>\n<recovery point>\n"), read
        once when upgrading a directory; its recovery point was a segment base, a valid lower bound."""
        try:
            lines = (self.dir / LEGACY_OFFSETS_CHECKPOINT_FILE).read_text(encoding="ascii").split()
            if len(lines) == 3 and lines[0] == "0":
                start, recovery = int(lines[1]), int(lines[2])
                if start >= 0 and recovery >= 0:
                    return start, recovery
        except (OSError, UnicodeDecodeError, ValueError):
            pass
        return -1, -1

    def _write_offsets_checkpoint(self) -> None:
        self._write_start_offset()
        self._write_recovery_point()

    def _write_start_offset(self) -> None:
        start = self._start_offset
        write_offset_checkpoint(self.dir / LOG_START_OFFSET_FILE, start)
        self._checkpointed_start = start

    def _write_recovery_point(self, appended: int | None = None) -> None:
        point = self._recovery_point
        write_offset_checkpoint(self.dir / RECOVERY_POINT_FILE, point)
        self._checkpointed_recovery = point
        self._checkpointed_bytes = self._appended_bytes if appended is None else appended

    def _segment(self, base_offset: int) -> LogSegment:
        config = self.config
        return LogSegment(
            self.dir, base_offset, config.index_interval_bytes, config.preallocate_bytes, config.open_files
        )

    def _new_segment(self, base_offset: int) -> LogSegment:
        segment = self._segment(base_offset)
        if segment.size:
            # A stale file with this name (cannot happen after recovery) must not be appended to.
            raise StorageStateError(f"segment {segment.log_path} already exists with {segment.size} bytes")
        # Empty index files now, with the segment (made durable with it by the next directory fsync), so
        # a close only ever rewrites existing files in place: creating a file is what costs there.
        for index in (segment.index, segment.time_index):
            overwrite_unsynced(index.path, b"")
            index.persisted = True
        self._dir_dirty = True
        return segment

    # --- state -------------------------------------------------------------------------------------

    @property
    def start_offset(self) -> int:
        return self._start_offset

    @property
    def end_offset(self) -> int:
        return self._segments[-1].next_offset

    @property
    def usable(self) -> bool:
        """Open and not failed (a failed write or flush makes every later use raise: fail-stop).  For
        a reader that may answer from its own copy of what was written (kraft.raft.log_tail)."""
        return self._failed is None and not self._closed

    @property
    def flushed_offset(self) -> int:
        if self._unsynced:
            self._sync_recovered()
        return self._flushed_offset

    @property
    def recovery_point(self) -> int:
        return self._recovery_point

    @property
    def last_epoch(self) -> int:
        """Epoch of the last batch (UNDEFINED_EPOCH = -1 for a log without batches)."""
        return self._epochs.latest_epoch

    @property
    def size_in_bytes(self) -> int:
        return sum(s.size for s in self._segments)

    def epoch_entries(self) -> list[tuple[int, int]]:
        """(epoch, start offset) pairs of the leader-epoch cache."""
        return self._epochs.entries()

    def end_offset_for_epoch(self, epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch answer (epoch, end offset); (-1, -1) if the epoch is unknown/newer."""
        return self._epochs.end_offset_for(epoch, self.end_offset)

    def epoch_for_offset(self, offset: int) -> int:
        return self._epochs.epoch_for_offset(offset)

    def segments(self) -> list[SegmentInfo]:
        return [
            SegmentInfo(s.base_offset, s.next_offset, s.size, s.max_timestamp, s.log_path)
            for s in self._segments
        ]

    # --- appending ---------------------------------------------------------------------------------

    def append_batch(
        self,
        data: bytes | bytearray | memoryview,
        *,
        validate: bool = True,
        checked: Sequence[BatchHeader] | None = None,
    ) -> AppendResult:
        """Append one or more whole encoded batches; the first must start at ``end_offset``.

        With ``validate`` (the default; pass False only for batches this process just built) every batch
        is checked — magic, size cap, CRC, contiguous offsets, non-decreasing leader epoch — before
        anything is written, so a bad buffer leaves the log untouched (CorruptRecordError,
        RecordTooLargeError or InvalidAppendError).

        ``checked``: the headers of ``data``'s batches, in order, each read by :func:`check_batch` from
        these very bytes a moment ago (a follower's driver scans what it fetched before it appends it):
        the CRC and magic pass is not run twice.  The size cap (this log's), that the headers tile
        ``data`` exactly, the offsets and the epochs are still checked here.
        """
        self._check_open()
        headers = self._headers_of(data, validate) if checked is None else self._tiling(data, checked)
        if not headers:
            raise InvalidAppendError("append of an empty buffer")
        expected = self.end_offset
        latest_epoch = self._epochs.latest_epoch
        for header in headers:
            if header.base_offset != expected:
                raise InvalidAppendError(
                    f"batch base offset {header.base_offset} does not continue the log at {expected}"
                )
            if header.partition_leader_epoch < latest_epoch:
                raise InvalidAppendError(
                    f"batch at offset {header.base_offset} has leader epoch {header.partition_leader_epoch}, "
                    f"below the log's latest epoch {latest_epoch}"
                )
            latest_epoch = header.partition_leader_epoch
            expected = header.next_offset
        try:
            self._write(data, headers)
        except FatalStorageError as exc:
            self._failed = exc
            raise
        self._appended_bytes += len(data)
        return AppendResult(headers[0].base_offset, headers[-1].last_offset)

    def append_records(
        self, records: Sequence[RecordInput], *, leader_epoch: int, timestamp_ms: int
    ) -> AppendResult:
        """Build a batch at ``end_offset`` from (key, value[, headers]) tuples and append it."""
        if leader_epoch < self._epochs.latest_epoch:
            raise InvalidAppendError(f"leader epoch {leader_epoch} is below the log's {self.last_epoch}")
        data = build_batch(self.end_offset, records, leader_epoch=leader_epoch, timestamp_ms=timestamp_ms)
        return self.append_batch(data, validate=False)

    def append_control(
        self, messages: Sequence[ControlMessage], *, leader_epoch: int, timestamp_ms: int
    ) -> AppendResult:
        """Append a control batch (e.g. the LeaderChange a new leader writes) at ``end_offset``."""
        if leader_epoch < self._epochs.latest_epoch:
            raise InvalidAppendError(f"leader epoch {leader_epoch} is below the log's {self.last_epoch}")
        data = build_control_batch(
            self.end_offset, messages, leader_epoch=leader_epoch, timestamp_ms=timestamp_ms
        )
        return self.append_batch(data, validate=False)

    def _headers_of(self, data: bytes | bytearray | memoryview, validate: bool) -> list[BatchHeader]:
        headers: list[BatchHeader] = []
        position = 0
        end = len(data)
        max_bytes = self.config.max_batch_bytes
        while position < end:
            if validate:
                header = check_batch(data, position, max_batch_bytes=max_bytes)
            else:
                header = peek_batch_header(data, position)
            headers.append(header)
            position += header.size_in_bytes
        if position != end:
            raise InvalidAppendError(f"buffer of {end} bytes does not end on a batch boundary ({position})")
        return headers

    def _tiling(
        self, data: bytes | bytearray | memoryview, checked: Sequence[BatchHeader]
    ) -> list[BatchHeader]:
        """``checked`` (see :meth:`append_batch`) as this log's header list, once each batch is within the
        size cap and the batches' sizes add up to ``data`` (no byte unaccounted for, none beyond it)."""
        max_bytes = self.config.max_batch_bytes
        total = 0
        for header in checked:
            size = header.size_in_bytes
            if size > max_bytes:
                raise RecordTooLargeError(
                    f"batch at offset {header.base_offset} is {size} bytes, above the maximum of {max_bytes}"
                )
            total += size
        if total != len(data):
            raise InvalidAppendError(f"checked batches of {total} bytes do not tile a buffer of {len(data)}")
        return list(checked)

    def _write(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader]) -> None:
        self._settle_marker()
        # The epoch checkpoint goes to disk before the batches of a new epoch: recovery relies on it
        # covering every batch (and trims entries beyond the recovered end).
        epochs_changed = False
        for header in headers:
            epochs_changed |= self._epochs.assign(header.partition_leader_epoch, header.base_offset)
        if epochs_changed:
            self._epochs.save()
        view = memoryview(data)
        group_start = 0
        position = 0
        group: list[BatchHeader] = []
        for header in headers:
            if self._should_roll(header, pending=position - group_start):
                if group:
                    self._segments[-1].append(view[group_start:position], group)
                    group = []
                group_start = position
                self._roll(header.base_offset)
            group.append(header)
            position += header.size_in_bytes
        self._segments[-1].append(view[group_start:position], group)

    def _should_roll(self, header: BatchHeader, pending: int) -> bool:
        segment = self._segments[-1]
        size = segment.size + pending
        if size == 0:
            return False
        if size + header.size_in_bytes > self.config.segment_bytes:
            return True
        first_ts = segment.first_timestamp
        if first_ts is not None and header.max_timestamp - first_ts > self.config.segment_ms:
            return True
        return not segment.fits_relative(header.last_offset)

    def _roll(self, base_offset: int) -> None:
        old = self._segments[-1]
        old.write_indexes()
        # Durably trimmed before the next segment exists: only the newest segment can carry zeros.
        old.trim()
        segment = self._new_segment(base_offset)
        with self._lock:
            self._segments.append(segment)
            self._bases.append(base_offset)
            # Under the lock: a concurrent flush() reads and clears this flag.
            self._dir_dirty = True

    def roll(self) -> None:
        """Start a new segment at ``end_offset`` now (no-op if the active segment is empty)."""
        self._check_open()
        if self._segments[-1].size:
            self._settle_marker()
            self._roll(self.end_offset)

    # --- durability --------------------------------------------------------------------------------

    def flush(self) -> int:
        """fsync everything appended so far (one fsync per dirty segment, however many batches) and
        return the new flushed offset.  Raises FatalStorageError on failure; the log then refuses all
        further use (never retry an fsync), and the caller must stop the process."""
        self._check_open()
        # One flush at a time: a second one must not report data durable whose fsync the first one
        # (which already cleared the dirty flag) has not finished yet.
        with self._flush_lock:
            with self._lock:
                end = self.end_offset
                dirty = [s for s in self._segments if s.dirty]
                dir_dirty, self._dir_dirty = self._dir_dirty, False
                active_base = self._segments[-1].base_offset
                appended = self._appended_bytes
            try:
                for segment in dirty:
                    segment.flush()
                if dir_dirty:
                    fsync_dir(self.dir)
            except FatalStorageError as exc:
                self._failed = exc
                raise
            with self._lock:
                self._flushed_offset = max(self._flushed_offset, end)
                # After a roll (so at most the active segment is scanned on open) or once enough bytes
                # were flushed since the last checkpoint (bounds the flushed data left unprotected).
                advance = end > self._recovery_point and (
                    active_base > self._recovery_point
                    or appended - self._checkpointed_bytes >= self.config.recovery_point_interval_bytes
                )
                if advance:
                    self._recovery_point = end
            if advance:
                try:
                    self._write_recovery_point(appended)
                except FatalStorageError as exc:
                    self._failed = exc
                    raise
            return end

    # --- reading -----------------------------------------------------------------------------------

    def read(self, offset: int, max_bytes: int, *, max_offset: int | None = None) -> ReadResult:
        """Whole batches from the one holding ``offset``: at least one batch (even if larger than
        ``max_bytes``, so readers always progress), then more while they fit in ``max_bytes``; only
        batches whose base offset is below ``max_offset`` (e.g. the high watermark) when given.
        Reads stay within one segment.  ``offset == end_offset`` gives an empty read;
        outside [start_offset, end_offset] raises OffsetOutOfRangeError.
        """
        self._check_open()
        end = self.end_offset
        if offset < self._start_offset or offset > end:
            raise OffsetOutOfRangeError(
                f"offset {offset} is outside the log range [{self._start_offset}, {end}]"
            )
        index = bisect_right(self._bases, offset) - 1
        for segment in self._segments[max(index, 0) :]:
            found = segment.find_batch(offset)
            if found is None:
                continue
            position, header = found
            if max_offset is not None and header.base_offset >= max_offset:
                break
            records, next_offset = segment.read_from(position, header, max_bytes, max_offset)
            self._verify_read(segment, position, records)
            return ReadResult(records, header.base_offset, next_offset)
        return ReadResult(b"", offset, offset)

    def _verify_read(self, segment: LogSegment, position: int, records: bytes) -> None:
        """Every batch a read returns is checked — CRC-32C, the header chain, and its leader epoch
        (outside the CRC) against the epoch cache — because segments below the recovery point are not
        scanned on open.  Damage raises CorruptLogError naming the file and position: never serve it,
        never truncate it.  (Hot path: one struct unpack and one CRC per batch; the epoch cache is
        consulted once per epoch span, not per batch.)"""
        epochs = self._epochs
        first_epoch_offset = epochs.first_offset
        unpack = _READ_CHECK.unpack_from
        size = len(records)
        view = memoryview(records)
        pos = 0
        expected = -1
        span_epoch, span_start, span_end = UNDEFINED_EPOCH, 0, -1
        try:
            while pos < size:
                if size - pos < HEADER_SIZE:
                    raise CorruptLogError(segment.log_path, position + pos, "torn batch header on read")
                base, length, epoch, magic, crc, _attributes, delta = unpack(view, pos)
                end = pos + length + LOG_OVERHEAD
                # Base offset, length and magic are outside the CRC: the batches must chain.
                if magic != MAGIC or length < 0 or end > size or (expected >= 0 and base != expected):
                    raise CorruptLogError(
                        segment.log_path,
                        position + pos,
                        f"batch header (magic {magic}, base offset {base}, length {length}) does not "
                        f"continue the log at {expected} on read",
                        offset=base,
                    )
                computed = crc32c(view[pos + 21 : end])
                if computed != crc:
                    raise CorruptLogError(
                        segment.log_path,
                        position + pos,
                        f"CRC-32C mismatch (stored {crc:#010x}, computed {computed:#010x}) on read",
                        offset=base,
                    )
                last = base + delta
                if first_epoch_offset is not None and base >= first_epoch_offset:
                    if not span_start <= base < span_end:
                        span_epoch, span_start, span_end = epochs.epoch_span(base)
                    # The batch's epoch, and no other epoch starting inside the batch (which a damaged
                    # leader-epoch-checkpoint could claim).
                    if epoch != span_epoch or last >= span_end:
                        raise CorruptLogError(
                            segment.log_path,
                            position + pos,
                            f"leader epoch {epoch} on read, but {CHECKPOINT_FILE} gives epoch {span_epoch} "
                            f"for offsets {span_start}..{span_end - 1}, batch holds {base}..{last}",
                            offset=base,
                        )
                expected = last + 1
                pos = end
        finally:
            view.release()

    def read_all_batches(self) -> bytes:
        """Every byte of every segment, in order (tools and tests; not for large logs)."""
        return b"".join(s.read_all() for s in self._segments)

    # --- truncation and retention ------------------------------------------------------------------

    def truncate_to(self, offset: int) -> int:
        """Remove every batch holding an offset >= ``offset`` (a batch straddling it goes entirely) and
        return the new end offset.  Trims the epoch cache.  Below the log start → truncate fully."""
        self._check_open()
        if offset >= self.end_offset:
            return self.end_offset
        if offset < self._start_offset:
            self.truncate_fully_and_start_at(offset)
            return self.end_offset
        self._settle_marker()
        old_end, old_size = self.end_offset, self.size_in_bytes
        # The recovery point must never lie above the log's end on disk (the next open would call the
        # log damaged): lower it durably *before* cutting, to the base of the segment that keeps the end.
        keeper_base = self._bases[max(bisect_right(self._bases, offset) - 1, 0)]
        old_recovery_point = self._recovery_point
        if old_recovery_point > keeper_base:
            self._recovery_point = keeper_base
            self._write_recovery_point()
        with self._lock:
            while len(self._segments) > 1 and self._segments[-1].base_offset >= offset:
                doomed = self._segments.pop()
                self._bases.pop()
                doomed.delete()
                self._dir_dirty = True
            active = self._segments[-1]
            active.truncate_to(offset)
            active.index.write()
            active.time_index.write()
        new_end = self.end_offset
        _log.info(
            "log_truncated",
            file=str(self._segments[-1].log_path),
            offset=new_end,
            bytes_dropped=old_size - self.size_in_bytes,
            reason=f"requested truncation to {offset} (log end was {old_end})",
        )
        if new_end < self._start_offset:
            # The batch holding the target straddled the log start: nothing valid is left.
            self.truncate_fully_and_start_at(self._start_offset)
            return self.end_offset
        if self._epochs.truncate_from_end(new_end):
            self._epochs.save()
        self._flushed_offset = min(self._flushed_offset, new_end)
        if self._dir_dirty:
            fsync_dir(self.dir)
            self._dir_dirty = False
        if old_recovery_point > self._recovery_point:
            # The cut is durable: what was flushed below the new end is protected again.
            self._recovery_point = min(old_recovery_point, new_end)
            self._write_recovery_point()
        return new_end

    def delete_before(self, offset: int) -> int:
        """Advance the log start offset to ``offset`` (≤ end offset) and delete the segments lying
        entirely below it (never the active one).  Returns the number of segments deleted."""
        self._check_open()
        if offset > self.end_offset:
            raise OffsetOutOfRangeError(f"cannot start the log at {offset}, beyond its end {self.end_offset}")
        if offset <= self._start_offset:
            return 0
        self._settle_marker()
        deleted = 0
        with self._lock:
            self._start_offset = offset
            while len(self._segments) > 1 and self._segments[1].base_offset <= offset:
                self._segments.pop(0).delete()
                self._bases.pop(0)
                deleted += 1
        changed = self._epochs.truncate_from_start(offset)
        if self._epochs.truncate_from_end(self.end_offset) or changed:
            self._epochs.save()
        self._write_start_offset()
        if deleted:
            fsync_dir(self.dir)
        return deleted

    def truncate_fully_and_start_at(self, offset: int) -> None:
        """Drop every segment and restart the log empty at ``offset`` (snapshot catch-up)."""
        self._check_open()
        if offset < 0:
            raise InvalidAppendError(f"log cannot start at negative offset {offset}")
        self._settle_marker()
        # As in truncate_to: a crash after the deletion must not find a recovery point above the log.
        safe = min(self._recovery_point, self._start_offset, offset)
        if self._recovery_point > safe:
            self._recovery_point = safe
            self._write_recovery_point()
        _log.info(
            "log_truncated",
            file=str(self.dir),
            offset=offset,
            bytes_dropped=self.size_in_bytes,
            reason=f"requested restart of the log at {offset} (log end was {self.end_offset})",
        )
        with self._lock:
            for segment in self._segments:
                segment.delete()
            self._segments = []
            self._bases = []
            fsync_dir(self.dir)
            self._segments = [self._new_segment(offset)]
            self._bases = [offset]
            self._start_offset = offset
            self._flushed_offset = offset
            self._recovery_point = offset
        self._epochs.clear()
        self._epochs.save()
        self._write_offsets_checkpoint()
        fsync_dir(self.dir)
        self._dir_dirty = False

    # --- closing -----------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush, persist what changed, then write the clean-shutdown marker (:func:`close_logs`)."""
        close_logs([self])

    # The phases of close_logs, one log at a time.

    def _close_flush_jobs(self) -> tuple[list[LogSegment], bool]:
        """Phase 1, on the caller's thread: trim preallocated tails, return the dirty segments to sync
        and whether the directory needs an fsync (segments created since the last flush)."""
        for segment in self._segments:
            segment.trim()
        return [s for s in self._segments if s.dirty], self._dir_dirty

    def _close_write_metadata(self, barrier: SyncBarrier) -> None:
        """Phase 2: write (unsynced) the indexes and checkpoints that changed; the barrier syncs them."""
        self._dir_dirty = False
        self._flushed_offset = self.end_offset
        for segment in self._segments:
            for index in (segment.index, segment.time_index):
                if not index.persisted:
                    # In place (no new file: creating one is the expensive part): a crash before the
                    # barrier may leave it torn, and indexes are checked when loaded and when used.
                    overwrite_unsynced(index.path, index.encode())
                    index.persisted = True
                    barrier.add(index.path)
        self._recovery_point = self.end_offset
        if self._checkpointed_recovery != self._recovery_point:
            # In place too: one write of a few bytes after O_TRUNC leaves, after a crash, the old file,
            # an empty or zero-filled one, a prefix or the new one — and the reader accepts only a
            # complete file (exact lines, final newline), so the worst case is "unknown", never a wrong
            # value.  Phase 1 synced the data it covers, so it never runs ahead of the log.
            path = self.dir / RECOVERY_POINT_FILE
            overwrite_unsynced(path, offset_checkpoint_bytes(path, self._recovery_point))
            self._checkpointed_recovery = self._recovery_point
            barrier.add(path)
        if self._checkpointed_start != self._start_offset:
            path = self.dir / LOG_START_OFFSET_FILE
            replace_unsynced(path, offset_checkpoint_bytes(path, self._start_offset))
            self._checkpointed_start = self._start_offset
            barrier.add(path)

    def _close_files(self) -> None:
        for segment in self._segments:
            segment.close()
        self._closed = True

    def abandon(self) -> None:
        """Close the files without flushing or marking a clean shutdown (tests: simulate a crash; the
        broker: a partition log about to be deleted)."""
        if self._closed:
            return
        for segment in self._segments:
            segment.close()
        self._closed = True

    def _check_open(self) -> None:
        if self._unsynced and self._failed is None and not self._closed:
            self._sync_recovered()  # every use of the log comes after the deferred sync
        if self._failed is not None:
            raise FatalStorageError(
                f"log {self.dir} failed earlier and must not be used: {self._failed.message}"
            )
        if self._closed:
            raise StorageStateError(f"log {self.dir} is closed")

    def __enter__(self) -> SegmentedLog:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


CLOSE_SYNC_THREADS = 16
"""Threads that fdatasync dirty segments at close: concurrent syncs share the filesystem's journal
commits and keep the device's queue full, where one-by-one they pay a full round trip each."""


def close_logs(logs: Sequence[SegmentedLog], *, sync_threads: int = CLOSE_SYNC_THREADS) -> None:
    """Close ``logs`` cleanly with a few syncs in all, instead of several fsyncs per log.

    The phases, each finished for every log before the next starts (the order is what makes a crash at
    any point safe; docs/internals/storage.md, "Clean shutdown"):

    1. **data**: every segment written since its last flush is fdatasync'ed (in parallel, through the
       descriptor that wrote it, so a writeback error is reported), new segments' directories fsynced;
    2. **metadata**: the indexes and offset checkpoints that changed are written by rename *without* an
       fsync each, then one barrier (``syncfs`` per filesystem for many logs; :class:`SyncBarrier`) makes
       them durable.  A crash here leaves no marker: the next open recovers, verifying or rebuilding
       these files — and a recovery point on disk never runs ahead of data, which phase 1 already synced;
    3. **markers**: only then each log's ``.kraft_cleanshutdown`` is created, and a second barrier makes
       the markers durable (a marker lost to a crash only costs a recovery).

    A log that failed before, or whose phase-1 sync fails, is closed without a marker (abandoned) while
    the others proceed; the first error is raised at the end.  A failed barrier leaves every log of that
    call without a marker."""
    errors: list[FatalStorageError] = []
    live: list[SegmentedLog] = []
    for log in logs:
        if log._closed:
            continue
        with log._flush_lock:
            pass  # a flush still running in a worker thread finishes first (as close() always waited)
        if log._failed is not None:
            log.abandon()  # never mark a failed log clean: the next open must recover it
            continue
        live.append(log)
    # Phase 1: data.
    syncs: list[tuple[SegmentedLog, LogSegment]] = []
    dir_syncs: list[SegmentedLog] = []
    ready: list[SegmentedLog] = []
    for log in live:
        try:
            dirty, dir_dirty = log._close_flush_jobs()
        except FatalStorageError as exc:
            log._failed = exc
            errors.append(exc)
            log.abandon()
            continue
        syncs.extend((log, segment) for segment in dirty)
        if dir_dirty:
            dir_syncs.append(log)
        ready.append(log)
    failed = _sync_in_parallel(syncs, dir_syncs, sync_threads)
    for log, error in failed.items():
        log._failed = error
        errors.append(error)
        log.abandon()
    ready = [log for log in ready if log not in failed]
    if ready:
        try:
            # Phase 2: changed metadata, one barrier.
            with SyncBarrier([log.dir for log in ready]) as barrier:
                for log in ready:
                    log._close_write_metadata(barrier)
                barrier.sync()
            # Phase 3: the markers, vouching only for what phases 1 and 2 made durable.
            with SyncBarrier([log.dir for log in ready]) as barrier:
                for log in ready:
                    marker = shutdown_marker.write(log.dir, clean=True, end_offset=log.end_offset, sync=False)
                    barrier.add(marker)
                barrier.sync()
        except FatalStorageError as exc:
            errors.append(exc)
            for log in ready:
                log._failed = exc
                log.abandon()
            ready = []
    for log in ready:
        log._close_files()
    if errors:
        raise errors[0]


def sync_recovered_logs(
    logs: Sequence[SegmentedLog], *, sync_threads: int = CLOSE_SYNC_THREADS
) -> dict[SegmentedLog, FatalStorageError]:
    """The deferred fdatasyncs of freshly opened logs (``LogConfig.defer_recovery_sync``), in parallel:
    after a crash every partition's newest segment is scanned, and one sync after another took most of
    a broker's start.  Returns the logs whose sync failed (they refuse every further use) → the error."""
    # By path, each on its own short-lived descriptor: thousands of segments may not all be open at once
    # (the open-file cache), and fdatasync reaches a file's pages whichever descriptor wrote them.
    jobs = [
        (log, partial(fdatasync_path, segment.log_path))
        for log in logs
        if log._failed is None
        for segment in log._unsynced
    ]
    failed = _run_in_parallel(jobs, sync_threads)
    for log in logs:
        if not log._unsynced:
            continue
        log._unsynced = []
        error = failed.get(log)
        if error is not None:
            log._failed = error
        else:
            log._flushed_offset = max(log._flushed_offset, log.end_offset)
    return failed


def _sync_in_parallel(
    syncs: Sequence[tuple[SegmentedLog, LogSegment]], dir_syncs: Sequence[SegmentedLog], threads: int
) -> dict[SegmentedLog, FatalStorageError]:
    """fdatasync the given segments and fsync the given logs' directories, ``threads`` at a time; the
    logs whose sync failed → the error.  The descriptors are taken here, on the caller's thread (the
    open-file cache is single-threaded; a dirty segment's descriptor is always open)."""
    jobs: list[tuple[SegmentedLog, Callable[[], None]]] = []
    for log, segment in syncs:
        segment.dirty = False
        fd = segment.file_descriptor()
        jobs.append((log, partial(fdatasync_fd, fd, str(segment.log_path))))
    for log in dir_syncs:
        jobs.append((log, partial(fsync_dir, log.dir)))
    return _run_in_parallel(jobs, threads)


def _run_in_parallel(
    jobs: Sequence[tuple[SegmentedLog, Callable[[], None]]], threads: int
) -> dict[SegmentedLog, FatalStorageError]:
    failed: dict[SegmentedLog, FatalStorageError] = {}

    def run(job: tuple[SegmentedLog, Callable[[], None]]) -> FatalStorageError | None:
        try:
            job[1]()
        except FatalStorageError as exc:
            return exc
        return None

    if len(jobs) <= 1 or threads <= 1:
        results = [run(job) for job in jobs]
    else:
        with ThreadPoolExecutor(max_workers=min(threads, len(jobs)), thread_name_prefix="log-sync") as pool:
            results = list(pool.map(run, jobs))
    for (log, _job), error in zip(jobs, results, strict=True):
        if error is not None and log not in failed:
            failed[log] = error
    return failed


__all__ = [
    "CLEAN_SHUTDOWN_FILE",
    "LEGACY_OFFSETS_CHECKPOINT_FILE",
    "LOG_START_OFFSET_FILE",
    "METADATA_LOG_DIR_NAME",
    "METADATA_LOG_PREALLOCATE_BYTES",
    "RECOVERY_POINT_FILE",
    "UNDEFINED_EPOCH",
    "AppendResult",
    "LogConfig",
    "ReadResult",
    "SegmentInfo",
    "SegmentedLog",
    "close_logs",
    "partition_dir_name",
    "sync_recovered_logs",
]
