"""One log segment: ``<base offset 20 digits>.log`` plus its sparse ``.index`` and ``.timeindex``.

Invariants (checked by recovery, relied on by reads):
- the file holds whole, CRC-valid v2 batches back to back, the first starting at ``base_offset`` and each
  starting at the previous batch's ``next_offset`` (kraft logs have no offset gaps);
- ``size`` is the end of the last batch and ``next_offset`` the offset after it;
- index entries point at batch starts inside the file (see :mod:`kraft.storage.index`).

Appends are single ``pwrite`` calls of whole batches at ``size``, so a crash can only leave a torn *tail*,
which recovery truncates.

Preallocation (``preallocate_bytes`` > 0, the metadata log's active segment): the file is kept ahead of the
data by zero-filled space, so an append overwrites already allocated blocks and the flush is an fdatasync
that does not grow the file — no filesystem journal commit per flush, the way etcd keeps its WAL.  The
zero tail is an allocation, not data: reads never pass ``size``; rolling and closing trim the file to
``size`` (so only the newest segment of a crashed log can carry one); recovery recognises an all-zero
tail and cuts it without reporting damage.
"""

from __future__ import annotations

import mmap
import os
import struct
from array import array
from pathlib import Path
from typing import Protocol

from crc32c import crc32c

from kraft.observability.logging import get_logger
from kraft.storage.batch import HEADER_SIZE, LOG_OVERHEAD, MAGIC, BatchHeader, peek_batch_header
from kraft.storage.errors import CorruptLogError, FatalStorageError, StorageStateError
from kraft.storage.fileio import fdatasync_fd, fsync_fd, pread_exact, pwrite_all
from kraft.storage.index import OffsetIndex, TimeIndex
from kraft.storage.open_files import OpenFileCache

LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"
TIMEINDEX_SUFFIX = ".timeindex"

# Fields recovery needs, read straight from the header without building a BatchHeader.
_SCAN = struct.Struct(">qiibIhiqq")
MAX_RELATIVE_OFFSET = 2**31 - 1
"""The widest offset span one segment holds: its index stores offsets relative to the base in 32 bits."""
# Enough to hold the headers between two index entries plus one header in the common case.
_LOOKUP_READ_BYTES = 16 * 1024
_PAGE = 4096
_ZERO_CHECK_CHUNK = 1 << 20

PROTECT_ALL = 2**63
"""``protect_below`` for a segment whose every byte is known flushed: any damage raises."""

_log = get_logger("storage")


class EpochCheck(Protocol):
    """check(epoch, base_offset) -> the next offset at which to call it again even if the epoch stays the
    same, or -1 to reject the batch (``problem`` then says why).  See SegmentedLog._load."""

    problem: str

    def __call__(self, epoch: int, base_offset: int, /) -> int: ...

    def rewind(self, offset: int, /) -> None:
        """Forget what the calls for batches at or after ``offset`` recorded (a segment is rescanned)."""


def segment_file_name(base_offset: int, suffix: str) -> str:
    return f"{base_offset:020d}{suffix}"


class LogSegment:
    __slots__ = (
        "_allocated",
        "_bytes_since_index",
        "_fd",
        "_files",
        "_last",
        "_live",
        "base_offset",
        "dirty",
        "epoch_problem",
        "first_timestamp",
        "index",
        "index_interval_bytes",
        "log_path",
        "max_timestamp",
        "next_offset",
        "preallocate_bytes",
        "preallocated_tail",
        "scanned_bytes",
        "size",
        "time_index",
    )

    def __init__(
        self,
        directory: Path,
        base_offset: int,
        index_interval_bytes: int,
        preallocate_bytes: int = 0,
        open_files: OpenFileCache | None = None,
    ) -> None:
        self.base_offset = base_offset
        self.index_interval_bytes = index_interval_bytes
        self.preallocate_bytes = preallocate_bytes
        self.log_path = directory / segment_file_name(base_offset, LOG_SUFFIX)
        self.index = OffsetIndex(directory / segment_file_name(base_offset, INDEX_SUFFIX), base_offset)
        self.time_index = TimeIndex(directory / segment_file_name(base_offset, TIMEINDEX_SUFFIX), base_offset)
        self._files = open_files
        self._live = True  # until close()/delete(): the file may be reopened after an eviction
        try:
            self._fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise StorageStateError(f"cannot open segment {self.log_path}: {exc.strerror}") from exc
        # Until loaded/recovered, the whole file counts as data; recovery cuts a preallocated tail.
        self.size = os.fstat(self._fd).st_size
        if open_files is not None:
            open_files.opened(self)
        self._allocated = self.size
        self.preallocated_tail = 0  # bytes of zero tail the last recovery cut (not damage)
        self.scanned_bytes = 0  # bytes the last recovery CRC-checked (from where its scan started)
        self.next_offset = base_offset
        self.first_timestamp: int | None = None
        self.max_timestamp = -1
        self._bytes_since_index = 0
        self.dirty = False  # written since the last fsync
        self.epoch_problem = ""  # why the last scan refused a batch's leader epoch
        # (position, header) of the last batch, or None until an append or a verified header walk finds
        # it: a read at the log's end (a Fetch answer, the leader's own listener) then skips the index
        # lookup and the header walk.  Set only from a batch this process appended or from find_batch's
        # verified walk; cleared whenever the file is truncated or rescanned.
        self._last: tuple[int, BatchHeader] | None = None

    # --- the file descriptor (kept open, or through an OpenFileCache) -------------------------------

    def _file(self) -> int:
        """The open descriptor of the ``.log`` file, reopened if the open-file cache closed it."""
        fd = self._fd
        files = self._files
        if fd >= 0:
            if files is not None:
                files.used(self)
            return fd
        if not self._live:
            raise StorageStateError(f"segment {self.log_path} is closed")
        try:
            fd = os.open(self.log_path, os.O_RDWR)  # no O_CREAT: a deleted file is never recreated
        except OSError as exc:
            raise FatalStorageError(f"cannot reopen segment {self.log_path}: {exc.strerror}") from exc
        self._fd = fd
        if files is not None:
            files.opened(self)
        return fd

    def file_descriptor(self) -> int:
        """The open descriptor (reopened if the open-file cache closed it), for a sync elsewhere."""
        return self._file()

    def release_file(self) -> None:
        """Close the descriptor for the open-file cache (flushed first if written since the last flush:
        never leave unflushed data behind a closed descriptor)."""
        fd = self._fd
        if fd < 0:
            return
        if self.dirty:
            self.dirty = False
            fdatasync_fd(fd, str(self.log_path))  # FatalStorageError: the caller's log dir goes offline
        os.close(fd)
        self._fd = -1

    # --- opening -----------------------------------------------------------------------------------

    def load_trusted(self) -> None:
        """Open a segment known to be flushed (below the recovery point or after a clean shutdown).

        Loads the indexes and finds ``next_offset``/``max_timestamp`` by walking the few headers after
        the last index entry.  If that does not add up, the indexes are rebuilt by a full scan — and any
        damage that scan finds raises :class:`CorruptLogError`: these bytes were flushed, so they are
        never truncated.  (Batch CRCs are not re-checked here, to keep opening cheap; reads check them.)
        """
        if self.size == 0:
            self.index.clear()
            self.time_index.clear()
            return
        if not (
            self.index.load(self.size)
            and self.time_index.load()
            and self._walk_tail()
            and self._time_index_within_segment()
            and self._read_first_timestamp()
        ):
            self.recover(None, protect_below=PROTECT_ALL)
            return
        last = self.index.last_entry()
        self._bytes_since_index = self.size - last[1] if last else self.size

    def _time_index_within_segment(self) -> bool:
        offsets = self.time_index.offsets
        return not offsets or self.base_offset + offsets[-1] < self.next_offset

    def _read_first_timestamp(self) -> bool:
        """Set ``first_timestamp`` from the first batch; False if its header is not plausible."""
        raw = pread_exact(self._file(), HEADER_SIZE, 0)
        if len(raw) < HEADER_SIZE:
            return False
        base, length, _epoch, magic, _crc, _attrs, delta, _base_ts, max_ts = _SCAN.unpack_from(raw)
        if base != self.base_offset or magic != MAGIC or length < HEADER_SIZE - LOG_OVERHEAD or delta < 0:
            return False
        self.first_timestamp = max_ts
        return True

    def _walk_tail(self) -> bool:
        """From the last index entry to the end of file: True if headers chain exactly to ``size``."""
        last = self.index.last_entry()
        position = last[1] if last else 0
        max_ts = self.time_index.timestamps[-1] if len(self.time_index) else -1
        # From position 0 the first batch must start at the base offset; from an index entry we check
        # that the entry's batch ends where the entry says.
        expected: int | None = self.base_offset if last is None else None
        next_offset = self.base_offset
        while position < self.size:
            raw = pread_exact(self._file(), HEADER_SIZE, position)
            if len(raw) < HEADER_SIZE:
                return False
            base, length, _epoch, magic, _crc, _attrs, delta, _base_ts, batch_max_ts = _SCAN.unpack_from(raw)
            if magic != MAGIC or length < HEADER_SIZE - LOG_OVERHEAD or delta < 0:
                return False
            if expected is not None and base != expected:
                return False
            if last is not None and position == last[1] and base + delta != last[0]:
                return False
            expected = base + delta + 1
            next_offset = expected
            max_ts = max(max_ts, batch_max_ts)
            position += length + LOG_OVERHEAD
        if position != self.size:
            return False
        self.next_offset = next_offset
        self.max_timestamp = max_ts
        return True

    def recover(
        self,
        check_epoch: EpochCheck | None,
        max_batch_bytes: int = 2**31 - 1,
        *,
        protect_below: int,
        resume_at: int | None = None,
    ) -> bool:
        """Validate every batch (size, magic, CRC, offset continuity, leader epoch), rebuild both indexes,
        and truncate the file at the first bad batch.  Returns True if damaged bytes were truncated.

        ``protect_below`` is the recovery point: the offsets below it were flushed, so damage there (or
        the file ending before it) raises :class:`CorruptLogError` and nothing is truncated.  Only what
        lies at or above it — a torn or unflushed tail — may be cut; every cut is logged.

        ``check_epoch(epoch, base_offset)`` is called for the first batch, whenever the leader epoch
        changes, and at the offsets it asks for; it rebuilds the leader-epoch cache and may reject a batch
        (the epoch field is outside the CRC, so only such a cross-check can catch it being damaged).

        ``resume_at`` (the recovery point, when it lies inside this segment): the batches below it were
        flushed and are trusted as a segment below the recovery point is, so the CRC scan starts at the
        batch holding it instead of at byte 0.  Its position is found by a header walk from the start
        (magic, lengths, offset continuity, leader epochs — the indexes are rebuilt from those headers)
        and verified: the batch before it must pass its CRC and end exactly at offset ``resume_at``, and
        the batch at it must pass the scan (or be a preallocated zero tail).  Any mismatch falls back to
        the whole-segment scan (logged ``recovery_resume_refused``), whose rules then decide.
        ``scanned_bytes`` says how many bytes the CRC scan covered.
        """
        if resume_at is not None and self.base_offset < resume_at and self.size > 0:
            resumed = self._recover_from(check_epoch, max_batch_bytes, resume_at)
            if not isinstance(resumed, str):
                return self._finish_recovery(protect_below, *resumed)
            problem = resumed
            _log.warning(
                "recovery_resume_refused",
                file=str(self.log_path),
                recovery_point=resume_at,
                reason=problem,
                action="scanning the whole segment",
            )
            if check_epoch is not None:
                check_epoch.rewind(self.base_offset)
        self._reset_recovery_state()
        if self.size == 0:
            self.next_offset = self.base_offset
            if self.base_offset < protect_below:
                raise CorruptLogError(
                    self.log_path,
                    0,
                    f"empty, but offsets below the recovery point {protect_below} were flushed",
                    offset=self.base_offset,
                )
            return False
        # The file is mapped rather than read: the scan then costs one CRC pass over the page cache and
        # no copies.  Nothing else touches the file while the log is being opened.
        # MAP_POPULATE maps every page in one go instead of faulting them in one by one.
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        with mmap.mmap(self._file(), self.size, flags=flags, prot=mmap.PROT_READ) as mapped:
            view = memoryview(mapped)
            try:
                valid_end = self._scan(view, check_epoch, max_batch_bytes)[0]
                reason = "" if valid_end == self.size else self._damage(view, valid_end, max_batch_bytes)
            finally:
                view.release()
        self.scanned_bytes = self.size
        return self._finish_recovery(protect_below, valid_end, reason)

    def _recover_from(
        self, check_epoch: EpochCheck | None, max_batch_bytes: int, resume_at: int
    ) -> tuple[int, str] | str:
        """The scan of :meth:`recover` with CRCs checked from the recovery point ``resume_at`` on:
        (valid end, why the batch there was refused) — or, as a plain string, why the position of the
        recovery point could not be verified (the caller then scans the whole segment)."""
        self._reset_recovery_state()
        # No MAP_POPULATE: below the recovery point only the headers are read, a page in four or fewer.
        with mmap.mmap(self._file(), self.size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ) as mapped:
            view = memoryview(mapped)
            try:
                valid_end, crc_start, resume_position = self._scan(
                    view, check_epoch, max_batch_bytes, crc_from=resume_at
                )
                reason = "" if valid_end == self.size else self._damage(view, valid_end, max_batch_bytes)
            finally:
                view.release()
        if self.next_offset < resume_at:
            return f"the batch headers stop at offset {self.next_offset}, position {valid_end}: {reason}"
        if valid_end <= resume_position and valid_end < self.size and not self._is_zero(valid_end):
            # The first batch at the recovery point is refused: let the whole-segment scan judge (it
            # reaches the same cut if everything below is sound, and raises if not).
            return f"the batch at the recovery point (position {valid_end}) is refused: {reason}"
        self.scanned_bytes = self.size - crc_start
        return valid_end, reason

    def _reset_recovery_state(self) -> None:
        self._last = None
        self.index.clear()
        self.time_index.clear()
        self._bytes_since_index = 0
        self.max_timestamp = -1
        self.first_timestamp = None
        self.preallocated_tail = 0
        self.scanned_bytes = 0

    def _finish_recovery(self, protect_below: int, valid_end: int, reason: str) -> bool:
        """Apply the rules to where the scan stopped (``valid_end``, refused for ``reason``): raise below
        the recovery point, else cut the tail (logged).  True if damaged (non-zero) bytes were cut."""
        if valid_end == self.size:
            return False
        zero_tail = self._is_zero(valid_end)
        if self.next_offset < protect_below:
            what = "zeroed" if zero_tail else reason
            raise CorruptLogError(
                self.log_path,
                valid_end,
                f"{what}, below the recovery point {protect_below} (flushed data): refusing to truncate it",
                offset=self.next_offset,
            )
        dropped = self.size - valid_end
        self.preallocated_tail = dropped if zero_tail else 0
        # A zero tail is what every crash of a preallocated log leaves: info, not a warning.
        (_log.info if zero_tail else _log.warning)(
            "log_truncated",
            file=str(self.log_path),
            position=valid_end,
            offset=self.next_offset,
            bytes_dropped=dropped,
            reason="preallocated zero tail" if zero_tail else reason,
            recovery_point=protect_below,
        )
        self._truncate_file(valid_end)
        return not zero_tail

    def _damage(self, view: memoryview, position: int, max_batch_bytes: int) -> str:
        """Why the batch at ``position`` (where the scan stopped) was refused — for the log line or error."""
        size = len(view)
        if size - position < HEADER_SIZE:
            return f"torn batch header ({size - position} bytes)"
        base, length, epoch, magic, crc, _attrs, delta, _base_ts, _max_ts = _SCAN.unpack_from(view, position)
        batch_size = length + LOG_OVERHEAD
        if magic != MAGIC:
            return f"magic {magic}, expected {MAGIC}"
        if length < HEADER_SIZE - LOG_OVERHEAD or batch_size > max_batch_bytes:
            return f"batch length {length} out of range"
        if position + batch_size > size:
            return f"torn batch: length {length} runs past the end of the file"
        if base != self.next_offset:
            return f"base offset {base}, expected {self.next_offset}"
        if delta < 0 or base + delta - self.base_offset > MAX_RELATIVE_OFFSET:
            return f"last offset delta {delta} out of range"
        computed = crc32c(view[position + 21 : position + batch_size])
        if computed != crc:
            return f"CRC-32C mismatch (stored {crc:#010x}, computed {computed:#010x})"
        return f"leader epoch {epoch} refused: {self.epoch_problem or 'out of order'}"

    def _is_zero(self, position: int) -> bool:
        """True if every byte from ``position`` to the end of the file is zero (a preallocated tail)."""
        zeros = bytes(_ZERO_CHECK_CHUNK)
        while position < self.size:
            chunk = pread_exact(self._file(), min(_ZERO_CHECK_CHUNK, self.size - position), position)
            if not chunk or chunk != zeros[: len(chunk)]:
                return False
            position += len(chunk)
        return True

    def _scan(
        self, view: memoryview, check_epoch: EpochCheck | None, max_batch_bytes: int, crc_from: int = -1
    ) -> tuple[int, int, int]:
        """Walk the batches in ``view``; returns (the end of the valid prefix, the position of the first
        CRC-checked batch, the position of the first batch at or after offset ``crc_from``) and sets
        next_offset etc.  Batches ending before ``crc_from - 1`` get the header checks only (their CRC is
        checked when read); -1 checks every CRC."""
        crc_start = -1
        resume_position = -1
        size = len(view)
        expected = self.base_offset
        self.epoch_problem = ""
        last_epoch: int | None = None
        next_check = 0
        position = 0
        interval = self.index_interval_bytes
        index = self.index
        time_index = self.time_index
        scan = _SCAN.unpack_from
        max_ts = -1
        since_index = 0
        while size - position >= HEADER_SIZE:
            base, length, epoch, magic, crc, _attrs, delta, _base_ts, batch_max_ts = scan(view, position)
            batch_size = length + LOG_OVERHEAD
            if (
                magic != MAGIC
                or length < HEADER_SIZE - LOG_OVERHEAD
                or batch_size > max_batch_bytes
                or position + batch_size > size
                or base != expected
                or delta < 0
                or base + delta - self.base_offset > MAX_RELATIVE_OFFSET
            ):
                break
            if base + delta >= crc_from - 1:
                # From the batch ending just before crc_from on (its CRC vouches for the position the
                # header walk found), every batch is CRC-checked.
                if crc_start < 0:
                    crc_start = position
                if resume_position < 0 and base >= crc_from:
                    resume_position = position
                if crc32c(view[position + 21 : position + batch_size]) != crc:
                    break
            if last_epoch is not None and epoch < last_epoch:
                # The epoch is outside the CRC: a decrease along the log can only be damage.
                self.epoch_problem = f"below the previous batch's epoch {last_epoch}"
                break
            if check_epoch is not None and (epoch != last_epoch or base >= next_check):
                next_check = check_epoch(epoch, base)
                if next_check < 0:
                    self.epoch_problem = check_epoch.problem
                    break
            last_epoch = epoch
            last_offset = base + delta
            max_ts = max(max_ts, batch_max_ts)
            if self.first_timestamp is None:
                self.first_timestamp = batch_max_ts
            if since_index >= interval:
                index.append(last_offset, position)
                time_index.maybe_append(max_ts, last_offset)
                since_index = 0
            since_index += batch_size
            expected = last_offset + 1
            position += batch_size
        self.max_timestamp = max_ts
        self._bytes_since_index = since_index
        self.next_offset = expected
        return (
            position,
            position if crc_start < 0 else crc_start,
            position if resume_position < 0 else resume_position,
        )

    # --- appending ---------------------------------------------------------------------------------

    def append(self, data: bytes | bytearray | memoryview, headers: list[BatchHeader]) -> None:
        """Append whole, already validated batches whose headers are ``headers`` (in order)."""
        position = self.size
        end = position + len(data)
        pwrite_all(self._file(), data, position, str(self.log_path))
        if end > self._allocated:
            self._allocated = end
            if self.preallocate_bytes > 0:
                self._preallocate(end)
        self.dirty = True
        interval = self.index_interval_bytes
        start = position
        for header in headers:
            start = position
            last_offset = header.base_offset + header.last_offset_delta
            self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
            if self.first_timestamp is None:
                self.first_timestamp = header.max_timestamp
            if self._bytes_since_index >= interval:
                self.index.append(last_offset, position)
                self.time_index.maybe_append(self.max_timestamp, last_offset)
                self._bytes_since_index = 0
            self._bytes_since_index += header.size_in_bytes
            position += header.size_in_bytes
            self.next_offset = last_offset + 1
        self.size = position
        if headers:
            self._last = (start, headers[-1])

    def _preallocate(self, end: int) -> None:
        """Zero-fill from ``end`` to the next page boundary ``preallocate_bytes`` ahead.  Zeros, not
        fallocate: blocks fallocate reserves are "unwritten" and the first write to each still costs a
        journal commit at flush time."""
        target = (end + self.preallocate_bytes + _PAGE - 1) // _PAGE * _PAGE
        pwrite_all(self._file(), bytes(target - end), end, str(self.log_path))
        self._allocated = target

    def trim(self) -> None:
        """Cut the preallocated tail off (durably), leaving exactly the batches: before a segment stops
        being the active one and before a clean shutdown."""
        if self._allocated > self.size and self._live:
            self._truncate_file(self.size)

    def fits_relative(self, last_offset: int) -> bool:
        return last_offset - self.base_offset <= MAX_RELATIVE_OFFSET

    def flush(self) -> None:
        if self.dirty:
            self.dirty = False
            fdatasync_fd(self._file(), str(self.log_path))

    # --- reading -----------------------------------------------------------------------------------

    def find_batch(self, offset: int) -> tuple[int, BatchHeader] | None:
        """(position, header) of the batch holding ``offset``, or None if it is not in this segment.

        The header walk is verified (magic, sane lengths, each batch continuing the previous one, the
        first matching its index entry): base offset, length and magic lie outside the CRC.  An index
        that does not fit the batches is rebuilt by a full verifying scan; batches that do not chain
        raise CorruptLogError."""
        if offset >= self.next_offset or offset < self.base_offset:
            return None
        last = self._last
        if last is not None and offset >= last[1].base_offset:
            # The last batch holds every offset from its base to next_offset.  The end check keeps a
            # stale entry (never expected: every size change sets or clears it) from being served.
            if last[0] + last[1].size_in_bytes == self.size:
                return last
            self._last = None
        entry_last, position = self.index.lookup_entry(offset)
        found = self._walk_to(offset, position, entry_last)
        if found is None and entry_last is not None:
            # Derived data gone wrong (the batches may be fine): rebuild it; a damaged batch raises.
            _log.warning("index_rebuilt", file=str(self.index.path), position=position, offset=offset)
            self._rebuild_index()
            entry_last, position = self.index.lookup_entry(offset)
            found = self._walk_to(offset, position, entry_last)
        if found is None:
            raise CorruptLogError(
                self.log_path, position, f"batch headers do not chain to offset {offset}", offset=offset
            )
        if found[0] + found[1].size_in_bytes == self.size:
            self._last = found  # the walk verified its chain: later reads at the end skip it
        return found

    def _rebuild_index(self) -> None:
        """Rebuild the indexes by a verifying scan of an open segment.  If the scan finds damage, the
        segment's state is put back as it was (its end offset must not shrink under the log: nothing is
        truncated) and the CorruptLogError propagates."""
        saved = (
            self.next_offset,
            self.max_timestamp,
            self.first_timestamp,
            self._bytes_since_index,
            self.preallocated_tail,
            array("i", self.index.offsets),
            array("i", self.index.positions),
            array("q", self.time_index.timestamps),
            array("i", self.time_index.offsets),
            self._last,
        )
        try:
            self.recover(None, protect_below=PROTECT_ALL)
        except CorruptLogError:
            (
                self.next_offset,
                self.max_timestamp,
                self.first_timestamp,
                self._bytes_since_index,
                self.preallocated_tail,
                self.index.offsets,
                self.index.positions,
                self.time_index.timestamps,
                self.time_index.offsets,
                self._last,
            ) = saved
            raise

    def _walk_to(self, offset: int, position: int, entry_last: int | None) -> tuple[int, BatchHeader] | None:
        """Walk headers from ``position`` to the batch holding ``offset``; None if they do not chain."""
        # From the segment start the first batch starts at the base offset; from an index entry (L, P)
        # the batch at P ends at L.
        expected: int | None = self.base_offset if entry_last is None else None
        while position < self.size:
            raw = pread_exact(self._file(), min(_LOOKUP_READ_BYTES, self.size - position), position)
            chunk_pos = 0
            while len(raw) - chunk_pos >= HEADER_SIZE:
                base, length, _epoch, magic, _crc, _attrs, delta, _base_ts, _max_ts = _SCAN.unpack_from(
                    raw, chunk_pos
                )
                if magic != MAGIC or length < HEADER_SIZE - LOG_OVERHEAD or delta < 0:
                    return None
                if expected is None:
                    if base + delta != entry_last:
                        return None
                elif base != expected:
                    return None
                if base + delta >= offset:
                    return position + chunk_pos, peek_batch_header(raw, chunk_pos)
                expected = base + delta + 1
                chunk_pos += length + LOG_OVERHEAD
            if chunk_pos == 0:
                break
            position += chunk_pos
        return None

    def read_from(
        self, position: int, first: BatchHeader, max_bytes: int, max_offset: int | None
    ) -> tuple[bytes, int]:
        """Whole batches from ``position``, where batch ``first`` starts (always included), up to
        ``max_bytes`` in total and only batches whose base offset is below ``max_offset``.
        Returns the bytes and the offset after the last batch included."""
        limit = min(max(first.size_in_bytes, max_bytes), self.size - position)
        raw = pread_exact(self._file(), limit, position)
        end = first.size_in_bytes
        next_offset = first.next_offset
        while len(raw) - end >= HEADER_SIZE:
            header = peek_batch_header(raw, end)
            if max_offset is not None and header.base_offset >= max_offset:
                break
            if end + header.size_in_bytes > len(raw):
                break
            end += header.size_in_bytes
            next_offset = header.next_offset
        return (raw if end == len(raw) else raw[:end]), next_offset

    def read_all(self) -> bytes:
        return pread_exact(self._file(), self.size, 0)

    # --- truncation and deletion -------------------------------------------------------------------

    def truncate_to(self, offset: int) -> None:
        """Remove every batch whose last offset is >= ``offset`` (the batch holding it included)."""
        found = self.find_batch(offset)
        if found is None:
            return
        position, _header = found
        self._truncate_file(position)
        self.index.truncate_to_position(position)
        last = self.index.last_entry()
        self.time_index.truncate_to_offset(last[0] + 1 if last else self.base_offset)
        self._bytes_since_index = position - last[1] if last else position
        if not self._walk_tail():
            # Cannot happen for a segment that passed recovery; rebuild rather than trust a bad index
            # (what is left was flushed or is about to be: damage in it raises, never truncates).
            self._rebuild_index()
        if self.size == 0:
            self.first_timestamp = None
            self.max_timestamp = -1
            self.next_offset = self.base_offset
        elif self.first_timestamp is None and not self._read_first_timestamp():
            raise CorruptLogError(self.log_path, 0, "first batch header is damaged", offset=self.base_offset)

    def _truncate_file(self, position: int) -> None:
        try:
            os.ftruncate(self._file(), position)
        except OSError as exc:
            raise FatalStorageError(f"truncate of {self.log_path} failed ({exc.strerror}); stopping") from exc
        self.size = position
        self._allocated = position
        self._last = None
        # Truncation must be durable before anything new is written over the old bytes.
        fsync_fd(self._file(), str(self.log_path))
        self.dirty = False

    def write_indexes(self) -> None:
        self.index.write()
        self.time_index.write()

    def close(self) -> None:
        self._live = False
        if self._files is not None:
            self._files.closed(self)
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index.path, self.time_index.path):
            path.unlink(missing_ok=True)
