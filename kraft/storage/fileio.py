"""Durable file primitives: fsync that is never retried, atomic replace, directory fsync.

The "fsyncgate" rule: after a failed fsync the kernel may have dropped the dirty pages and cleared the
error, so a retry can "succeed" over lost data.  Every fsync failure therefore raises
:class:`FatalStorageError`, which callers must treat as "stop the process".
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import cast

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


def replace_unsynced(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` by temp file and rename, *without* fsync: the caller makes it durable
    with a later barrier (:class:`SyncBarrier`).  Until then a crash may leave the old file, the new one,
    an empty one or a stray ``.tmp`` — so only for files that are verified when read or derived (indexes,
    checkpoints: see kraft.storage.log, "Closing")."""
    tmp = path.with_name(path.name + ".tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    except OSError as exc:
        raise FatalStorageError(f"cannot create {tmp}: {exc.strerror}") from exc
    try:
        write_all(fd, data, str(tmp))
    finally:
        os.close(fd)
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise FatalStorageError(f"cannot rename {tmp} to {path}: {exc.strerror}") from exc


def overwrite_unsynced(path: Path, data: bytes) -> None:
    """Rewrite ``path`` in place (created if missing) without fsync: ``pwrite`` at 0, then cut the file
    to the new length if it was longer (no O_TRUNC, which frees and reallocates the blocks: measured
    several times slower).  A :class:`SyncBarrier` makes it durable.  Not atomic — a crash may leave the
    old bytes, the new ones, or a mix and a wrong length — so only for files whose reader refuses anything
    but a complete file (offset checkpoints: exact lines) or verifies what it uses (indexes)."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as exc:
        raise FatalStorageError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        pwrite_all(fd, data, 0, str(path))
        if os.fstat(fd).st_size > len(data):
            os.ftruncate(fd, len(data))
    except OSError as exc:
        raise FatalStorageError(f"cannot rewrite {path}: {exc.strerror}") from exc
    finally:
        os.close(fd)


def _load_syncfs() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        syncfs = libc.syncfs
    except (OSError, AttributeError):
        return None
    syncfs.argtypes = [ctypes.c_int]
    syncfs.restype = ctypes.c_int
    return cast(Callable[[int], int], syncfs)


_SYNCFS = _load_syncfs()
SYNCFS_MIN_DIRS = 16
"""From this many directories on, a :class:`SyncBarrier` calls one ``syncfs`` per filesystem instead of
fsyncing every file and directory (a broker closing 2,000 partitions: one call instead of thousands);
below it, the few fsyncs are cheaper than writing back the whole filesystem."""


class SyncBarrier:
    """Make many files written with :func:`replace_unsynced` / :func:`create_unsynced` durable at once.

    Create it *before* writing them.  With at least :data:`SYNCFS_MIN_DIRS` directories on Linux,
    :meth:`sync` calls ``syncfs`` on a descriptor of each filesystem opened at construction: ``syncfs``
    reports every writeback error of that filesystem since then (Linux >= 5.8; possibly one of another
    process's files — a spurious failure only costs a recovery), so an error writing any of the files is
    raised, never lost.  Otherwise it fsyncs each file :meth:`add` ed, then each directory.  Any failure
    raises :class:`FatalStorageError` (never retried: fsyncgate)."""

    def __init__(self, directories: Sequence[Path]) -> None:
        self._fds: dict[int, int] = {}
        self._files: list[Path] = []
        self._dirs: dict[Path, None] = dict.fromkeys(directories)
        if _SYNCFS is None or len(self._dirs) < SYNCFS_MIN_DIRS:
            return
        for directory in self._dirs:
            try:
                device = os.stat(directory).st_dev
                if device not in self._fds:
                    self._fds[device] = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
            except OSError as exc:
                self.close()
                raise FatalStorageError(
                    f"cannot open {directory} for a sync barrier: {exc.strerror}"
                ) from exc

    @property
    def uses_syncfs(self) -> bool:
        return bool(self._fds)

    def add(self, path: Path) -> None:
        """A file written since the barrier was created (in one of its directories)."""
        self._files.append(path)

    def sync(self) -> None:
        syncfs = _SYNCFS
        if self._fds and syncfs is not None:
            for fd in self._fds.values():
                if syncfs(fd) != 0:
                    err = ctypes.get_errno()
                    raise FatalStorageError(f"syncfs failed ({os.strerror(err)}); stopping: data may be lost")
            self._files.clear()
            return
        for path in self._files:
            fsync_path(path)
        self._files.clear()
        for directory in self._dirs:
            fsync_dir(directory)

    def close(self) -> None:
        for fd in self._fds.values():
            os.close(fd)
        self._fds.clear()

    def __enter__(self) -> SyncBarrier:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def fdatasync_path(path: Path) -> None:
    """fdatasync one file by name (opened read-only for it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise FatalStorageError(f"cannot open {path} to fdatasync it: {exc.strerror}") from exc
    try:
        fdatasync_fd(fd, str(path))
    finally:
        os.close(fd)


def fsync_path(path: Path) -> None:
    """fsync one file by name (opened read-only for it)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise FatalStorageError(f"cannot open {path} to fsync it: {exc.strerror}") from exc
    try:
        fsync_fd(fd, str(path))
    finally:
        os.close(fd)


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
