"""``replication-offset-checkpoint``: the high watermarks of one log dir's partitions (Kafka's file).

Kafka's text format (``OffsetCheckpointFile``: a version line, a count line, ``topic partition offset``
lines) with kraft's additions: every line carries the topic id, so a checkpoint written before a topic
was deleted and re-created under the same name is never applied to the new topic's log; and (version 2)
a last line ``crc32c <8 hex digits>`` over every byte before it, so a damaged file is detected instead of
trusted — a flipped digit in an offset would otherwise still parse, and a leader would start from a high
watermark its followers never had (consumers would read uncommitted records) or a follower would refuse a
legitimate truncation.  Version 1 files (no checksum, written by earlier builds) are still read, strictly.

Why it exists: a restarted broker would otherwise start every partition at HWM 0 — as a leader, consumers
see nothing until every ISR follower fetched again; as a follower, its truncation floor
(docs/internals/replication.md, "The high-watermark rule of truncation") is lower than it could be.  A
stored value is a high watermark the partition really had, so it is safe to start from it (it is still
capped by the log's flushed end).  A file that is missing, unreadable or fails its checksum or parse is
never used: every partition of that dir starts from 0 (safe, only slower), and the reason is logged
(``hwm_checkpoint_unusable``).

Cost (Kafka's design, issue #14): one file per log dir holding all of its partitions, written every
``replica.high.watermark.checkpoint.interval.ms`` (5 s) and at shutdown — never per partition update.
:class:`CheckpointWriter` skips a dir whose entries did not change since its last write (idle brokers
write nothing) and does the write — temp file, fsync, rename, directory fsync — on its own thread, so the
broker's event loop only builds the bytes; writes happen in submission order (one worker), so the final
write at shutdown is always the last.  ``bench/hwm_checkpoint.py`` measures it.  The periodic write
(:meth:`CheckpointWriter.write_changed_paced`) compares and encodes in steps of :data:`STEP` entries and
yields the loop whenever its pacer's budget ran out (issue #17, bounded work units): at 100,000 hosted
partitions the tick was one 200-250 ms stretch of CPU.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from itertools import islice
from pathlib import Path
from typing import NamedTuple, Protocol

from crc32c import crc32c

from kraft.broker.types import TopicPartition
from kraft.observability.logging import get_logger
from kraft.storage.fileio import atomic_write

FILE_NAME = "replication-offset-checkpoint"
VERSION = 2
_LEGACY_VERSION = 1

Entries = Mapping[tuple[TopicPartition, str], int]

# ``topic partition offset topic_id``: Kafka topic names are [a-zA-Z0-9._-]; decimal numbers without
# sign or leading zeros (a byte damaged into another digit is caught by the checksum, not by this).
_ENTRY = re.compile(r"([A-Za-z0-9._-]+) (0|[1-9][0-9]{0,9}) (0|[1-9][0-9]{0,18}) ([!-~]+)")
_COUNT = re.compile(r"0|[1-9][0-9]{0,9}")
_CRC_LINE = re.compile(rb"crc32c ([0-9a-f]{8})")


STEP = 256
"""Entries compared or encoded between two looks at the pacer (~0.1 ms)."""


class Pacer(Protocol):
    """What a paced write needs of :class:`kraft.broker.partitions.Pacer`."""

    async def tick(self) -> None: ...


def _lines(entries: Mapping[tuple[TopicPartition, str], int]) -> str:
    return "".join(
        f"{tp.topic} {tp.partition} {offset} {topic_id}\n" for (tp, topic_id), offset in entries.items()
    )


def _framed(count: int, lines: str) -> bytes:
    data = f"{VERSION}\n{count}\n{lines}".encode()
    return data + b"crc32c %08x\n" % crc32c(data)


def encode(entries: Entries) -> bytes:
    """``{(partition, topic id): high watermark}`` as the file's bytes, lines in the mapping's order (a
    dict's insertion order: deterministic; the reader needs no order, as Kafka's does not)."""
    return _framed(len(entries), _lines(entries))


async def encode_paced(entries: Mapping[tuple[TopicPartition, str], int], pacer: Pacer) -> bytes:
    """:func:`encode` in steps of :data:`STEP` lines, ``pacer`` yielding between them; the same bytes.
    ``entries`` must not change until this returns."""
    pieces: list[str] = []
    items = iter(entries.items())
    while piece := dict(islice(items, STEP)):
        pieces.append(_lines(piece))
        await pacer.tick()
    return _framed(len(entries), "".join(pieces))


async def same_paced(
    written: Mapping[tuple[TopicPartition, str], int] | None,
    entries: Mapping[tuple[TopicPartition, str], int],
    pacer: Pacer,
) -> bool:
    """``written == entries`` in steps of :data:`STEP` entries, ``pacer`` yielding between them (a dict
    comparison of 100,000 entries is one C call hashing every key in Python, ~40 ms).  Neither may
    change until this returns."""
    if written is None or len(written) != len(entries):
        return False
    get = written.get
    items = iter(entries.items())
    while piece := list(islice(items, STEP)):
        for key, offset in piece:
            if get(key) != offset:
                return False
        await pacer.tick()
    return True


def decode(data: bytes) -> dict[tuple[TopicPartition, str], int]:
    """The entries of a file; ValueError naming what is wrong when it is not a complete, intact
    checkpoint (checksum, version, count, every line's shape, no duplicates)."""
    if not data.endswith(b"\n"):
        raise ValueError("torn: the last line is incomplete")
    lines = data[:-1].split(b"\n")
    version = lines[0]
    if version == b"%d" % VERSION:
        crc = _CRC_LINE.fullmatch(lines[-1]) if len(lines) >= 3 else None
        if crc is None:
            raise ValueError("no crc32c line at the end")
        body_end = len(data) - len(lines[-1]) - 1
        actual = crc32c(memoryview(data)[:body_end])
        if actual != int(crc.group(1), 16):
            raise ValueError(f"crc32c mismatch: stored {crc.group(1).decode()}, computed {actual:08x}")
        lines = lines[:-1]
    elif version != b"%d" % _LEGACY_VERSION:
        raise ValueError(f"unknown version {version[:16]!r}")
    text = b"\n".join(lines).decode("ascii")  # every valid line is ASCII: anything else is damage
    lines_text = text.split("\n")
    if len(lines_text) < 2 or _COUNT.fullmatch(lines_text[1]) is None:
        raise ValueError("no entry count")
    count = int(lines_text[1])
    if len(lines_text) != count + 2:
        raise ValueError(f"announces {count} entries, holds {len(lines_text) - 2}")
    entries: dict[tuple[TopicPartition, str], int] = {}
    match_entry = _ENTRY.fullmatch
    for number, line in enumerate(lines_text[2:], start=3):
        match = match_entry(line)
        if match is None:
            raise ValueError(f"line {number} is malformed: {line[:80]!r}")
        topic, partition, offset, topic_id = match.groups()
        entries[(TopicPartition(topic, int(partition)), topic_id)] = int(offset)
    if len(entries) != count:
        raise ValueError(f"{count - len(entries)} partitions are listed more than once")
    return entries


class CheckpointRead(NamedTuple):
    entries: dict[tuple[TopicPartition, str], int]
    problem: str  # "" when the file was read and verified, "missing", or why it is not used


def read_checked(log_dir: Path) -> CheckpointRead:
    """A log dir's checkpoint, verified; empty entries and the reason when it cannot be used."""
    try:
        data = (log_dir / FILE_NAME).read_bytes()
    except FileNotFoundError:
        return CheckpointRead({}, "missing")
    except OSError as exc:
        return CheckpointRead({}, f"unreadable: {exc.strerror or exc}")
    try:
        return CheckpointRead(decode(data), "")
    except (ValueError, UnicodeDecodeError) as exc:
        return CheckpointRead({}, str(exc))


def read(log_dir: Path) -> dict[tuple[TopicPartition, str], int]:
    """:func:`read_checked`, logging a damaged or unreadable file (``hwm_checkpoint_unusable``): its
    partitions start from high watermark 0 — safe (never above what was committed), only slower."""
    result = read_checked(log_dir)
    if result.problem and result.problem != "missing":
        get_logger("broker.hwm_checkpoint").warning(
            "hwm_checkpoint_unusable",
            file=str(log_dir / FILE_NAME),
            reason=result.problem,
            action="every partition of this log dir starts from high watermark 0",
        )
    return result.entries


def write(log_dir: Path, entries: Entries) -> None:
    """Atomically (temp file, fsync, rename, directory fsync) replace the log dir's checkpoint."""
    atomic_write(log_dir / FILE_NAME, encode(entries))


class CheckpointWriter:
    """Writes the checkpoints of a broker's log dirs: skips unchanged dirs, writes on one worker thread
    (in submission order), and synchronously at shutdown after every queued write."""

    def __init__(self) -> None:
        self._written: dict[Path, dict[tuple[TopicPartition, str], int]] = {}
        self._executor: ThreadPoolExecutor | None = None
        self.writes = 0
        """Files written (tests and the benchmark read it)."""

    def _changed(self, by_dir: Mapping[Path, dict[tuple[TopicPartition, str], int]]) -> list[Path]:
        return [d for d, entries in by_dir.items() if self._written.get(d) != entries]

    async def write_changed(self, by_dir: Mapping[Path, dict[tuple[TopicPartition, str], int]]) -> int:
        """Write the dirs whose entries changed since their last write, off the event loop; the number of
        files written.  A failed write raises (FatalStorageError from the fsync rule)."""
        changed = self._changed(by_dir)
        if not changed:
            return 0
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hwm-checkpoint")
        loop = asyncio.get_running_loop()
        for log_dir in changed:
            entries = by_dir[log_dir]
            data = encode(entries)
            await loop.run_in_executor(self._executor, atomic_write, log_dir / FILE_NAME, data)
            self._written[log_dir] = entries
            self.writes += 1
        return len(changed)

    async def write_changed_paced(
        self,
        by_dir: Mapping[Path, dict[tuple[TopicPartition, str], int]],
        pacer: Pacer,
        *,
        wanted: Callable[[Path], bool] = lambda log_dir: True,
        settle: Callable[[Path, dict[tuple[TopicPartition, str], int]], bool] = lambda d, e: False,
    ) -> int:
        """:meth:`write_changed` with every step on the loop bounded: the comparison with the last write
        and the encoding run in steps (``pacer``), the write on the worker thread.  ``by_dir`` is this
        call's own (no one else changes it).  Before a dir's bytes go to the worker, ``wanted(dir)``
        (False: the broker closed or the dir went offline meanwhile — nothing is written) and
        ``settle(dir, entries)`` (True: it changed entries while this call yielded — a high watermark
        lowered by an unclean truncation — so they are compared and encoded again).  A write that
        :meth:`write_now` overtook is not recorded as the last one."""
        written = 0
        for log_dir, entries in by_dir.items():
            settle(log_dir, entries)
            while True:
                same = await same_paced(self._written.get(log_dir), entries, pacer)
                data = None if same else await encode_paced(entries, pacer)
                if not settle(log_dir, entries):
                    break
            if data is None or not wanted(log_dir):
                continue
            if self._executor is None:
                self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hwm-checkpoint")
            before = self._written.get(log_dir)
            await asyncio.get_running_loop().run_in_executor(
                self._executor, atomic_write, log_dir / FILE_NAME, data
            )
            if self._written.get(log_dir) is before:
                self._written[log_dir] = entries
            self.writes += 1
            written += 1
        return written

    def write_now(self, by_dir: Mapping[Path, dict[tuple[TopicPartition, str], int]]) -> int:
        """At shutdown: wait for any write in progress, then write every changed dir on this thread."""
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None
        changed = self._changed(by_dir)
        for log_dir in changed:
            write(log_dir, by_dir[log_dir])
            self._written[log_dir] = by_dir[log_dir]
            self.writes += 1
        return len(changed)
