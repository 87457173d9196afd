"""Exclusive per-process locks on data directories (Kafka's ``.lock`` file in every log dir).

A second ``kraft controller start`` or ``kraft broker start`` with the configuration of a node that is
already running must not open — let alone recover and truncate — the running node's logs.  Every process
therefore takes an exclusive, non-blocking ``fcntl.flock`` on a lock file in each of its directories
*before* any storage is opened; the second process fails with one line::

    data directory /var/lib/kraft/meta is in use by another process (pid 4242)

and touches nothing else.

One lock file per role, ``.controller.lock`` and ``.broker.lock``: a combined node
(``process.roles=broker,controller``) runs its controller and its broker as two processes over the same
directories, and each of them owns different files there (the metadata log and the controller's image
store, versus partition logs and the broker's image store).  Two processes of the same role on one
directory are the hazard the lock rules out.

The kernel drops a ``flock`` when the holding process ends in any way (kill -9 included), so a lock file
left behind by a crash never blocks a restart; the pid written into the file is only for the message.
The file descriptors are close-on-exec (Python's default), so child processes do not inherit the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterable
from pathlib import Path

from kraft.storage.errors import StorageStateError

LOCK_FILE_SUFFIX = ".lock"


def lock_file_name(role: str) -> str:
    """The lock file of ``role`` (``controller`` or ``broker``) in a data directory."""
    return f".{role}{LOCK_FILE_SUFFIX}"


class DirectoryInUseError(StorageStateError):
    """Another live process holds the lock on ``directory``."""

    def __init__(self, directory: Path, holder_pid: int | None) -> None:
        holder = f" (pid {holder_pid})" if holder_pid is not None else ""
        super().__init__(f"data directory {directory} is in use by another process{holder}")
        self.directory = directory
        self.holder_pid = holder_pid


def _holder_pid(fd: int) -> int | None:
    with contextlib.suppress(OSError, ValueError):
        text = os.pread(fd, 64, 0).decode("ascii", errors="replace").strip()
        return int(text) if text else None
    return None


class DirectoryLocks:
    """The locks one process holds on its data directories; :meth:`release` (or process exit) frees them."""

    def __init__(self, held: dict[Path, int]) -> None:
        self._held = held

    @property
    def directories(self) -> tuple[Path, ...]:
        return tuple(self._held)

    @classmethod
    def acquire(cls, directories: Iterable[Path], role: str) -> DirectoryLocks:
        """Lock every directory (all or none): :class:`DirectoryInUseError` when another process holds one,
        :class:`StorageStateError` when a lock file cannot be created (missing or read-only directory)."""
        held: dict[Path, int] = {}
        try:
            for directory in dict.fromkeys(Path(d) for d in directories):
                held[directory] = _lock_one(directory, role)
        except BaseException:
            cls(held).release()
            raise
        return cls(held)

    def release(self) -> None:
        held, self._held = self._held, {}
        for fd in held.values():
            with contextlib.suppress(OSError):
                os.close(fd)  # closing the only descriptor of the open file drops the flock

    def __enter__(self) -> DirectoryLocks:
        return self

    def __exit__(self, *_: object) -> None:
        self.release()


def _lock_one(directory: Path, role: str) -> int:
    path = directory / lock_file_name(role)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise StorageStateError(f"cannot create the lock file {path}: {exc.strerror or exc}") from None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise DirectoryInUseError(directory, _holder_pid(fd)) from None
        except OSError as exc:
            raise StorageStateError(f"cannot lock {path}: {exc.strerror or exc}") from None
        # Ours now: record the pid for the message a second process prints (not needed for correctness).
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode("ascii"), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd
