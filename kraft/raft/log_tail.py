"""The bytes of the log's newest batches, kept in memory for the reads that follow their append.

A leader answers its followers' Fetches with the batch it has just appended, and on a metadata node the
listeners read the batches just committed: both read the log's tail, right after writing it.  From the
segment file that read cost two or three ``pread`` calls (a header walk, then the batches) and a CRC-32C
pass per fetch, and every ``pread`` dropped the GIL on the leader's main loop: with the intake thread busy
it then waited to get it back — the reads took 75 of the main loop's 198 µs of wall time per write at 64
unary clients (docs/internals/raft-performance.md, "Fetch answers from memory (session 16)").

:class:`LogTail` holds the newest appended batches, whole, up to ``max_bytes`` (the newest one always,
whatever its size), and answers a read that starts inside them exactly as the segment log would — the
batch holding the offset, then more while they fit ``max_bytes``, only batches starting below
``max_offset``.  Anything older is read from disk as before.  It always ends at the log's end: the owner
reports every append (:meth:`appended`), and clears it when the log is truncated, reset or reopened
(:meth:`clear`).  The bytes are those the append wrote — a batch this node built, or fetched bytes the log
validated (CRC, offsets) before writing them — so they carry what the file holds.  What this skips is the
re-check of the file's bytes on read, which finds damage done to them on disk; once a batch leaves the
tail (or after a restart) its reads check the file again, and every fetcher still checks each batch's CRC
before it appends.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence

from kraft.storage.batch import BatchHeader, peek_batch_header

DEFAULT_TAIL_BYTES = 1 << 20
"""How much of the log's tail :class:`LogTail` keeps by default: followers in step and listeners read
within a few batches of the end; 1 MiB holds hundreds of 64-client batches, or one full batch."""


class LogTail:
    """The newest batches of a log, whole, contiguous up to its end (see the module docstring)."""

    def __init__(self, max_bytes: int = DEFAULT_TAIL_BYTES) -> None:
        """``max_bytes`` 0: keep nothing (every read goes to disk)."""
        self._max_bytes = max_bytes
        self._bases: list[int] = []  # base offset of each batch kept, ascending and contiguous
        self._data: list[bytes] = []  # the batch's bytes, header included
        self._bytes = 0
        self._end = -1  # the offset after the last batch kept (-1: nothing kept)
        self.hits = 0  # reads answered from memory (tests and benchmarks read them)

    @property
    def start_offset(self) -> int | None:
        """The base offset of the oldest batch kept (None: none)."""
        return self._bases[0] if self._bases else None

    def appended(self, data: bytes, base_offset: int, headers: Sequence[BatchHeader] | None = None) -> None:
        """``data`` (whole batches, the first at ``base_offset``) was appended at the log's end;
        ``headers``: its batches' headers when the caller has them (the log's append read them), else
        they are read here."""
        if self._max_bytes <= 0:
            return
        if base_offset != self._end:
            self.clear()  # not a continuation (the first append, or one after a clear): start over
        bases, kept = self._bases, self._data
        size = len(data)
        position = 0
        if headers is None:
            headers = list(_headers_in(data))
        for header in headers:
            end = position + header.size_in_bytes
            bases.append(header.base_offset)
            kept.append(data if position == 0 and end == size else data[position:end])
            self._end = header.next_offset
            position = end
        self._bytes += size
        if self._bytes > self._max_bytes and len(kept) > 1:
            drop = 0
            while self._bytes > self._max_bytes and drop < len(kept) - 1:
                self._bytes -= len(kept[drop])
                drop += 1
            del bases[:drop]
            del kept[:drop]

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes | None:
        """The log's answer to ``read(offset, max_bytes, max_offset)`` when ``offset`` lies in the tail
        (or is its end: nothing); None when it does not and the disk must answer."""
        bases, kept = self._bases, self._data
        if not bases or len(kept) != len(bases) or offset < bases[0] or offset > self._end:
            return None  # (unequal lengths: cleared meanwhile from another thread, see clear)
        if offset == self._end:
            return b""
        index = bisect_right(bases, offset) - 1  # contiguous: that batch holds ``offset``
        if max_offset is not None and bases[index] >= max_offset:
            return b""
        first = kept[index]
        size = len(first)
        last = index + 1
        while last < len(kept):
            if max_offset is not None and bases[last] >= max_offset:
                break
            size += len(kept[last])
            if size > max_bytes:
                break
            last += 1
        self.hits += 1
        return first if last == index + 1 else b"".join(kept[index:last])

    def clear(self) -> None:
        """Forget everything.  A snapshot install resets the log on a worker thread: new lists, so that a
        read running meanwhile on the loop sees the old ones whole or a mismatch (and reads the disk)."""
        self._bases = []
        self._data = []
        self._bytes = 0
        self._end = -1


def _headers_in(data: bytes) -> Iterator[BatchHeader]:
    """The header of every batch in ``data`` (whole batches, already validated by the log's append)."""
    size = len(data)
    position = 0
    while position < size:
        header = peek_batch_header(data, position)
        yield header
        position += header.size_in_bytes
