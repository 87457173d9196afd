"""Snapshot files (KIP-630): ``<end offset 20 digits>-<epoch 10 digits>.checkpoint`` in the log directory.

A snapshot file is a sequence of record batches (offsets from 0, leader epoch = the snapshot epoch):
a control batch with the SnapshotHeader record, the data batches, and a control batch with the
SnapshotFooter record.  Life cycle:

- written as ``….checkpoint.part`` (by :class:`RecordsSnapshotWriter` from records, or by
  :class:`RawSnapshotWriter` from bytes downloaded with FetchSnapshot), then *frozen*: validated, fsynced,
  renamed to ``.checkpoint``, directory fsynced — so a ``.checkpoint`` file is always complete;
- read back in chunks by byte position (:meth:`SnapshotReader.read_chunk`, for FetchSnapshot) or batch
  by batch (:meth:`SnapshotReader.batches`, for loading an image);
- deleted once superseded: renamed to ``.checkpoint.deleted`` and unlinked.  Leftover ``.part`` and
  ``.deleted`` files are removed when a :class:`SnapshotDirectory` opens.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from kraft.storage.batch import (
    HEADER_SIZE,
    ControlMessage,
    ControlRecordType,
    RecordBatch,
    RecordInput,
    SnapshotFooterRecord,
    SnapshotHeaderRecord,
    build_batch,
    build_control_batch,
    check_batch,
    decode_batch,
    decode_control_key,
    peek_batch_header,
    with_base_offset,
    with_leader_epoch,
)
from kraft.storage.errors import (
    CorruptLogError,
    CorruptRecordError,
    InvalidAppendError,
    RecordTooLargeError,
    StorageStateError,
)
from kraft.storage.fileio import fsync_dir, fsync_fd, pread_exact, write_all

SNAPSHOT_SUFFIX = ".checkpoint"
PART_SUFFIX = ".checkpoint.part"
DELETED_SUFFIX = ".checkpoint.deleted"
_NAME = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")


class SnapshotFileId(NamedTuple):
    """Orders like Kafka's OffsetAndEpoch: by end offset, then epoch."""

    end_offset: int
    epoch: int


def snapshot_file_name(snapshot_id: SnapshotFileId) -> str:
    return f"{snapshot_id.end_offset:020d}-{snapshot_id.epoch:010d}{SNAPSHOT_SUFFIX}"


def parse_snapshot_file_name(name: str) -> SnapshotFileId | None:
    match = _NAME.match(name)
    return SnapshotFileId(int(match.group(1)), int(match.group(2))) if match else None


def _check_id(snapshot_id: SnapshotFileId) -> None:
    if snapshot_id.end_offset < 0 or snapshot_id.epoch < 0:
        raise InvalidAppendError(f"invalid snapshot id {snapshot_id}: offset and epoch must be >= 0")


class _PartFile:
    """An open ``.part`` file; freeze() makes it the durable ``.checkpoint``."""

    def __init__(self, directory: Path, snapshot_id: SnapshotFileId) -> None:
        _check_id(snapshot_id)
        self.snapshot_id = snapshot_id
        self.final_path = directory / snapshot_file_name(snapshot_id)
        self.part_path = directory / (snapshot_file_name(snapshot_id)[: -len(SNAPSHOT_SUFFIX)] + PART_SUFFIX)
        if self.final_path.exists():
            raise StorageStateError(f"snapshot {self.final_path} already exists")
        self._fd = os.open(self.part_path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
        self.size = 0
        self.done = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        write_all(self._fd, data, str(self.part_path))
        self.size += len(data)

    def validate(self) -> None:
        validate_snapshot_bytes(
            pread_exact(self._fd, self.size, 0), str(self.part_path), epoch=self.snapshot_id.epoch
        )

    def freeze(self) -> Path:
        fsync_fd(self._fd, str(self.part_path))
        os.close(self._fd)
        os.replace(self.part_path, self.final_path)
        fsync_dir(self.final_path.parent)
        self.done = True
        return self.final_path

    def abort(self) -> None:
        if not self.done:
            os.close(self._fd)
            self.part_path.unlink(missing_ok=True)
            self.done = True


class RecordsSnapshotWriter:
    """Builds a snapshot from records: header batch on create, footer batch on :meth:`freeze`."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        snapshot_id: SnapshotFileId,
        *,
        last_contained_log_timestamp: int,
        timestamp_ms: int,
    ) -> None:
        self._part = _PartFile(Path(directory), snapshot_id)
        self._timestamp_ms = timestamp_ms
        self.next_offset = 0
        self._append_control(SnapshotHeaderRecord(last_contained_log_timestamp=last_contained_log_timestamp))

    @property
    def snapshot_id(self) -> SnapshotFileId:
        return self._part.snapshot_id

    def _append_control(self, message: SnapshotHeaderRecord | SnapshotFooterRecord) -> None:
        self.append_control([message])

    def append_control(self, messages: Sequence[ControlMessage]) -> None:
        """One control batch (after the header: KIP-853's KRaftVersion and Voters records)."""
        data = build_control_batch(
            self.next_offset, messages, leader_epoch=self.snapshot_id.epoch, timestamp_ms=self._timestamp_ms
        )
        self._part.write(data)
        self.next_offset += len(messages)

    def append_records(self, records: Sequence[RecordInput]) -> None:
        data = build_batch(
            self.next_offset, records, leader_epoch=self.snapshot_id.epoch, timestamp_ms=self._timestamp_ms
        )
        self._part.write(data)
        self.next_offset += len(records)

    def append_batch(self, data: bytes) -> None:
        """Append one already encoded batch (re-based to the snapshot's next offset)."""
        header = check_batch(data)
        if header.size_in_bytes != len(data):
            raise InvalidAppendError("append_batch takes exactly one batch")
        # Snapshot batches carry the snapshot epoch (as Kafka writes them); readers verify it.
        self._part.write(with_leader_epoch(with_base_offset(data, self.next_offset), self.snapshot_id.epoch))
        self.next_offset += header.last_offset_delta + 1

    def freeze(self) -> Path:
        """Write the footer, fsync, rename to ``.checkpoint``, fsync the directory."""
        self._append_control(SnapshotFooterRecord())
        return self._part.freeze()

    def abort(self) -> None:
        self._part.abort()

    def __enter__(self) -> RecordsSnapshotWriter:
        return self

    def __exit__(self, exc_type: object, *_rest: object) -> None:
        if exc_type is not None or not self._part.done:
            self._part.abort()


class RawSnapshotWriter:
    """Receives a snapshot as raw bytes in position order (FetchSnapshot's UnalignedRecords)."""

    def __init__(self, directory: str | os.PathLike[str], snapshot_id: SnapshotFileId) -> None:
        self._part = _PartFile(Path(directory), snapshot_id)

    @property
    def snapshot_id(self) -> SnapshotFileId:
        return self._part.snapshot_id

    @property
    def size(self) -> int:
        """Bytes received so far: the position to fetch next."""
        return self._part.size

    def write(self, position: int, data: bytes) -> None:
        if position != self._part.size:
            raise InvalidAppendError(f"snapshot chunk at position {position}, expected {self._part.size}")
        self._part.write(data)

    def freeze(self) -> Path:
        """Validate the whole file (every batch CRC-valid, header first, footer last), then make it
        durable.  On a validation error the ``.part`` file is deleted and the error re-raised."""
        try:
            self._part.validate()
        except CorruptRecordError:
            self._part.abort()
            raise
        return self._part.freeze()

    def abort(self) -> None:
        self._part.abort()


def _control_type(batch: RecordBatch) -> int | None:
    if not batch.is_control or not batch.records:
        return None
    return decode_control_key(batch.records[0].key)


def snapshot_problem(data: bytes, epoch: int | None = None) -> tuple[int, str] | None:
    """(byte position, what is wrong) of the first defect of snapshot bytes, or None if they are valid:
    every batch CRC-valid, offsets contiguous from 0, every batch's leader epoch (outside the CRC) equal
    to the snapshot's ``epoch`` when given (Kafka writes snapshot batches at the snapshot epoch), a
    SnapshotHeader control batch first and a SnapshotFooter control batch last."""
    if not data:
        return 0, "empty"
    position = 0
    expected_offset = 0
    first: RecordBatch | None = None
    last: RecordBatch | None = None
    last_position = 0
    while position < len(data):
        try:
            header = check_batch(data, position)
            if first is None or header.is_control:
                batch, _ = decode_batch(data, position)
                if first is None:
                    first = batch
                last = batch
            else:
                last = None
        except (CorruptRecordError, RecordTooLargeError) as exc:
            return position, exc.message
        if header.base_offset != expected_offset:
            return position, f"batch base offset {header.base_offset}, expected {expected_offset}"
        if epoch is not None and header.partition_leader_epoch != epoch:
            return (
                position,
                f"batch leader epoch {header.partition_leader_epoch}, expected the snapshot's {epoch}",
            )
        expected_offset = header.next_offset
        last_position = position
        position += header.size_in_bytes
    if first is None or _control_type(first) != ControlRecordType.SNAPSHOT_HEADER:
        return 0, "does not start with a SnapshotHeader control batch"
    if last is None or _control_type(last) != ControlRecordType.SNAPSHOT_FOOTER:
        return last_position, "does not end with a SnapshotFooter control batch"
    return None


def validate_snapshot_bytes(data: bytes, what: str, *, epoch: int | None = None) -> None:
    """Raise CorruptRecordError (bytes from the network) naming ``what`` if :func:`snapshot_problem`
    finds a defect."""
    problem = snapshot_problem(data, epoch)
    if problem is not None:
        raise CorruptRecordError(f"snapshot {what} at byte {problem[0]}: {problem[1]}")


class SnapshotReader:
    """Read access to one frozen snapshot file, verified whole when opened (``verify``): a bad snapshot
    raises CorruptLogError naming the file and is never served or loaded."""

    def __init__(self, path: Path, *, verify: bool = True) -> None:
        snapshot_id = parse_snapshot_file_name(path.name)
        if snapshot_id is None:
            raise StorageStateError(f"{path} is not a snapshot file name")
        self.snapshot_id = snapshot_id
        self.path = path
        try:
            self._fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            raise StorageStateError(f"snapshot {path} does not exist") from None
        self.size = os.fstat(self._fd).st_size
        if verify:
            try:
                self.validate()
            except BaseException:
                self.close()
                raise

    def read_chunk(self, position: int, max_bytes: int) -> bytes:
        """Up to ``max_bytes`` raw bytes at ``position`` (not aligned to batches; for FetchSnapshot)."""
        if position < 0 or position >= self.size:
            raise StorageStateError(
                f"position {position} outside snapshot {self.path.name} of {self.size} bytes"
            )
        return pread_exact(self._fd, min(max_bytes, self.size - position), position)

    def read_all(self) -> bytes:
        return pread_exact(self._fd, self.size, 0)

    def batches(self) -> Iterator[RecordBatch]:
        """Decode every batch (header, data, footer) in order; CorruptRecordError on a bad one."""
        position = 0
        while position < self.size:
            head = pread_exact(self._fd, HEADER_SIZE, position)
            size = peek_batch_header(head).size_in_bytes
            batch, _ = decode_batch(pread_exact(self._fd, size, position))
            yield batch
            position += size

    def header(self) -> SnapshotHeaderRecord:
        for batch in self.batches():
            for message in batch.control_messages():
                if isinstance(message, SnapshotHeaderRecord):
                    return message
            break
        raise CorruptRecordError(f"snapshot {self.path.name} has no SnapshotHeader")

    def validate(self) -> None:
        """CorruptLogError naming the file, the byte position and the defect (see snapshot_problem)."""
        problem = snapshot_problem(self.read_all(), self.snapshot_id.epoch)
        if problem is not None:
            raise CorruptLogError(self.path, problem[0], f"bad snapshot: {problem[1]}")

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SnapshotReader:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


class SnapshotDirectory:
    """The snapshots of one log directory."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        # Frozen snapshots never change: one full verification per file identity (FetchSnapshot opens
        # the file once per chunk; verifying each time would make a transfer quadratic).
        self._verified: dict[Path, tuple[int, int, int]] = {}
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        removed = False
        for stray in (*self.dir.glob(f"*{PART_SUFFIX}"), *self.dir.glob(f"*{DELETED_SUFFIX}")):
            stray.unlink()
            removed = True
        if removed:
            fsync_dir(self.dir)

    def snapshot_ids(self) -> list[SnapshotFileId]:
        ids = (parse_snapshot_file_name(p.name) for p in self.dir.glob(f"*{SNAPSHOT_SUFFIX}"))
        return sorted(i for i in ids if i is not None)

    def latest(self) -> SnapshotFileId | None:
        ids = self.snapshot_ids()
        return ids[-1] if ids else None

    def earliest(self) -> SnapshotFileId | None:
        ids = self.snapshot_ids()
        return ids[0] if ids else None

    def path(self, snapshot_id: SnapshotFileId) -> Path:
        return self.dir / snapshot_file_name(snapshot_id)

    def open(self, snapshot_id: SnapshotFileId) -> SnapshotReader:
        """The snapshot, verified (every batch's CRC, offsets, epochs, header and footer) the first time
        this store opens this file; CorruptLogError naming the file if it is bad."""
        path = self.path(snapshot_id)
        try:
            info = path.stat()
        except FileNotFoundError:
            raise StorageStateError(f"snapshot {path} does not exist") from None
        identity = (info.st_ino, info.st_size, info.st_mtime_ns)
        verified = self._verified.get(path) == identity
        reader = SnapshotReader(path, verify=not verified)
        self._verified[path] = identity
        return reader

    def read_verified(self, snapshot_id: SnapshotFileId) -> bytes:
        """The whole snapshot file, verified as by :meth:`open` (for loading it into a state machine)."""
        with self.open(snapshot_id) as reader:
            return reader.read_all()

    def create(
        self, snapshot_id: SnapshotFileId, *, last_contained_log_timestamp: int, timestamp_ms: int
    ) -> RecordsSnapshotWriter:
        return RecordsSnapshotWriter(
            self.dir,
            snapshot_id,
            last_contained_log_timestamp=last_contained_log_timestamp,
            timestamp_ms=timestamp_ms,
        )

    def create_raw(self, snapshot_id: SnapshotFileId) -> RawSnapshotWriter:
        return RawSnapshotWriter(self.dir, snapshot_id)

    def delete(self, snapshot_id: SnapshotFileId) -> bool:
        path = self.path(snapshot_id)
        doomed = path.with_name(path.name[: -len(SNAPSHOT_SUFFIX)] + DELETED_SUFFIX)
        self._verified.pop(path, None)
        try:
            os.replace(path, doomed)
        except FileNotFoundError:
            return False
        fsync_dir(self.dir)
        doomed.unlink()
        return True

    def delete_before(self, snapshot_id: SnapshotFileId) -> list[SnapshotFileId]:
        """Delete every snapshot older than ``snapshot_id`` (superseded); returns what was deleted."""
        doomed = [i for i in self.snapshot_ids() if i < snapshot_id]
        for old in doomed:
            self.delete(old)
        return doomed
