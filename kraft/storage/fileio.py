"""Durable file primitives: fsync that is never retried, atomic replace, directory fsync.

The "fsyncgate" rule: after a failed fsync the kernel may have dropped the dirty pages and cleared the
error, so a retry can "succeed" over lost data.  Every fsync failure therefore raises
:class:`FatalStorageError`, which callers must treat as "stop the process".
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from kraft.storage.errors import FatalStorageError

MAX_FILE_NAME_BYTES = 255
"""NAME_MAX of ext4, xfs, btrfs and tmpfs; topic names are ASCII, so characters = bytes.  The controller
refuses a topic whose partition directory names would exceed it and the broker caps its temporary
directory names to it: one definition so the two agree."""


def fsync_fd(fd: int, what: str) -> None:
    try:
        os.fsync(fd)
    except OSError as exc:
        raise FatalStorageError(
            f"fsync of {what} failed ({exc.strerror}); stopping: data may be lost"
        ) from exc


def fdatasync_fd(fd: int, what: str) -> None:
    """fdatasync: the data plus the metadata needed to read it back (the size), not timestamps.  On a
    file that does not grow (a preallocated segment) this skips the filesystem journal commit, which is
    what makes it cheaper than fsync; when the file did grow it is exactly as durable."""
    try:
        os.fdatasync(fd)
    except OSError as exc:
        raise FatalStorageError(
            f"fdatasync of {what} failed ({exc.strerror}); stopping: data may be lost"
        ) from exc


def fsync_dir(path: Path) -> None:
    """Make the directory's entries (created/renamed/deleted files) durable."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise FatalStorageError(f"cannot open directory {path} to fsync it: {exc.strerror}") from exc
    try:
        fsync_fd(fd, f"directory {path}")
    finally:
        os.close(fd)


def _write_fully(write: Callable[[memoryview], int], data: bytes | bytearray | memoryview, what: str) -> None:
    view = memoryview(data)
    try:
        while view:
            view = view[write(view) :]
    except OSError as exc:
        raise FatalStorageError(f"write to {what} failed ({exc.strerror}); stopping") from exc


def write_all(fd: int, data: bytes | bytearray | memoryview, what: str) -> None:
    """Write every byte or raise FatalStorageError (a failed/short write leaves the file state unknown)."""
    _write_fully(lambda view: os.write(fd, view), data, what)


def pwrite_all(fd: int, data: bytes | bytearray | memoryview, position: int, what: str) -> None:
    """Write every byte at ``position`` (the file offset is not used) or raise FatalStorageError."""
    done = 0

    def write(view: memoryview) -> int:
        nonlocal done
        written = os.pwrite(fd, view, position + done)
        done += written
        return written

    _write_fully(write, data, what)


def atomic_write(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` durably: temp file, fsync, rename, directory fsync."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise FatalStorageError(f"cannot create {tmp}: {exc.strerror}") from exc
    try:
        write_all(fd, data, str(tmp))
        fsync_fd(fd, str(tmp))
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise FatalStorageError(f"cannot rename {tmp} to {path}: {exc.strerror}") from exc
    fsync_dir(path.parent)


def pread_exact(fd: int, size: int, position: int) -> bytes:
    """Read up to ``size`` bytes at ``position`` (fewer only at end of file)."""
    chunks: list[bytes] = []
    remaining = size
    while remaining > 0:
        chunk = os.pread(fd, remaining, position)
        if not chunk:
            break
        chunks.append(chunk)
        remaining -= len(chunk)
        position += len(chunk)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)
