"""The clean-shutdown marker of one log directory (``.kraft_cleanshutdown``, like Kafka's
``.kafka_cleanshutdown``): one fixed-size record saying whether the log was closed cleanly, and at which
end offset.

Record (24 bytes, big-endian)::

    magic "KRAFTCS1" (8) | state (1: 'C' clean, 'D' dirty) | 3 zero bytes | end offset (int64) |
    CRC-32C of the 20 bytes before it (uint32)

Why a record rewritten in place and not a file that exists only while the log is closed: creating a file
costs a directory change (measured ~0.5-1.5 ms on ext4 here, against ~20 µs to rewrite 24 bytes of an
existing one), and a broker closes thousands of logs at once.  The file is created once, *dirty*, when
the log is first opened; :func:`kraft.storage.log.close_logs` writes *clean* (after every byte it vouches
for is durable); the next open reads it and, before the first change to the log, writes *dirty* again
and fdatasyncs it.

Only a complete record with a matching CRC and state *clean* means clean.  Anything else — dirty, a torn
or partly written record, an empty file (the markers of older versions were empty: one recovery after
the upgrade), a missing or unreadable file — means "recover": the safe reading of every damaged state.
"""

from __future__ import annotations

import os
import struct
from pathlib import Path
from typing import NamedTuple

from crc32c import crc32c

from kraft.storage.errors import FatalStorageError
from kraft.storage.fileio import fdatasync_fd, pwrite_all

MARKER_FILE = ".kraft_cleanshutdown"
_MAGIC = b"KRAFTCS1"
_BODY = struct.Struct(">8sB3xq")
_RECORD = struct.Struct(">20sI")
RECORD_SIZE = _RECORD.size
_CLEAN = ord("C")
_DIRTY = ord("D")


class MarkerState(NamedTuple):
    clean: bool
    end_offset: int  # the log's end offset at the clean close (-1 unless clean)
    exists: bool


def encode(clean: bool, end_offset: int) -> bytes:
    body = _BODY.pack(_MAGIC, _CLEAN if clean else _DIRTY, end_offset if clean else -1)
    return _RECORD.pack(body, crc32c(body))


def decode(raw: bytes) -> MarkerState:
    """The state a marker's bytes say; anything but a complete, CRC-valid clean record is not clean."""
    if len(raw) != RECORD_SIZE:
        return MarkerState(False, -1, True)
    body, crc = _RECORD.unpack(raw)
    if crc32c(body) != crc:
        return MarkerState(False, -1, True)
    magic, state, end_offset = _BODY.unpack(body)
    if magic != _MAGIC or state != _CLEAN or end_offset < 0:
        return MarkerState(False, -1, True)
    return MarkerState(True, end_offset, True)


def read(directory: Path) -> MarkerState:
    """The marker of the log in ``directory`` (never raises: an unreadable marker means "recover")."""
    try:
        raw = (directory / MARKER_FILE).read_bytes()
    except FileNotFoundError:
        return MarkerState(False, -1, False)
    except OSError:
        return MarkerState(False, -1, True)
    return decode(raw)


def write(directory: Path, *, clean: bool, end_offset: int, sync: bool) -> Path:
    """Write the record in place (creating the file if needed); fdatasync it when ``sync`` (otherwise the
    caller's barrier makes it durable).  Returns the marker's path."""
    path = directory / MARKER_FILE
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644)
    except OSError as exc:
        raise FatalStorageError(f"cannot open {path}: {exc.strerror}") from exc
    try:  # an ftruncate failure is an OSError: the same fatal error
        pwrite_all(fd, encode(clean, end_offset), 0, str(path))
        if os.fstat(fd).st_size != RECORD_SIZE:  # an older, empty marker or a longer damaged one
            os.ftruncate(fd, RECORD_SIZE)
        if sync:
            fdatasync_fd(fd, str(path))
    finally:
        os.close(fd)
    return path
