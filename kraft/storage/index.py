"""Sparse segment indexes in Kafka's file format.

- ``.index``: entries of (int32 relative offset, int32 file position), 8 bytes each, big-endian.  As in
  Kafka, the offset is the *last* offset of the batch that starts at that position; one entry is added
  after at least ``index_interval_bytes`` of data.
- ``.timeindex``: entries of (int64 timestamp, int32 relative offset), 12 bytes each: the largest
  timestamp seen so far in the segment and the last offset of the batch that carried it.

Indexes are held in memory (two int arrays per index) and written to disk whole when a segment is rolled
or the log is closed — at close only if they changed since they were loaded or last written
(``persisted``), and without an fsync of their own (one barrier for every log: kraft.storage.log,
"Closing"); they are not fsynced on the append path because recovery rebuilds any index that is missing
or fails the load checks.
"""

from __future__ import annotations

import bisect
import struct
import sys
from array import array
from pathlib import Path

from kraft.storage.fileio import atomic_write

_OFFSET_ENTRY = 8
_TIME_ENTRY = 12
_TIME_STRUCT = struct.Struct(">qi")


def _big_endian_int32s(values: array[int]) -> bytes:
    if sys.byteorder == "little":
        swapped = array("i", values)
        swapped.byteswap()
        return swapped.tobytes()
    return values.tobytes()


class OffsetIndex:
    """Relative last offset → position of the batch start; lookups find where to start scanning."""

    __slots__ = ("base_offset", "offsets", "path", "persisted", "positions")

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.persisted = False
        """True while the file holds exactly these entries (loaded or written, unchanged since)."""
        self.offsets: array[int] = array("i")  # relative last offsets, strictly increasing
        self.positions: array[int] = array("i")  # batch start positions, strictly increasing

    def __len__(self) -> int:
        return len(self.offsets)

    def append(self, last_offset: int, position: int) -> None:
        self.offsets.append(last_offset - self.base_offset)
        self.positions.append(position)
        self.persisted = False

    def lookup(self, offset: int) -> int:
        """A file position at or before the batch holding ``offset`` (0 if no entry is small enough).

        Entry (L, P) says the batch at P ends at L; a batch holding ``offset`` > L starts after P, and
        the batch holding ``offset`` == L starts at P, so the largest L <= offset is a safe start.
        """
        index = bisect.bisect_right(self.offsets, offset - self.base_offset) - 1
        return self.positions[index] if index >= 0 else 0

    def lookup_entry(self, offset: int) -> tuple[int | None, int]:
        """(last offset, position) of the entry :meth:`lookup` uses; (None, 0) when it starts at 0."""
        index = bisect.bisect_right(self.offsets, offset - self.base_offset) - 1
        if index < 0:
            return None, 0
        return self.base_offset + self.offsets[index], self.positions[index]

    def truncate_to_position(self, position: int) -> None:
        """Drop entries for batches starting at or after ``position``."""
        keep = bisect.bisect_left(self.positions, position)
        if keep < len(self.offsets):
            self.persisted = False
        del self.offsets[keep:]
        del self.positions[keep:]

    def clear(self) -> None:
        del self.offsets[:]
        del self.positions[:]
        self.persisted = False

    def last_entry(self) -> tuple[int, int] | None:
        if not self.offsets:
            return None
        return self.base_offset + self.offsets[-1], self.positions[-1]

    def load(self, segment_size: int) -> bool:
        """Read the file; False (and empty) if it is missing or not a plausible index for the segment."""
        self.clear()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        if len(raw) % _OFFSET_ENTRY:
            return False
        values = array("i")
        values.frombytes(raw)
        if sys.byteorder == "little":
            values.byteswap()
        offsets = values[0::2]
        positions = values[1::2]
        previous_offset = -1
        previous_position = -1
        for rel, pos in zip(offsets, positions, strict=True):
            if rel <= previous_offset or pos <= previous_position or pos >= segment_size:
                return False
            previous_offset, previous_position = rel, pos
        self.offsets = offsets
        self.positions = positions
        self.persisted = True
        return True

    def encode(self) -> bytes:
        interleaved = array("i", bytes(8 * len(self.offsets)))
        interleaved[0::2] = self.offsets
        interleaved[1::2] = self.positions
        return _big_endian_int32s(interleaved)

    def write(self) -> None:
        atomic_write(self.path, self.encode())
        self.persisted = True


class TimeIndex:
    """(max timestamp so far, relative last offset) entries; answers "first offset with time >= t"."""

    __slots__ = ("base_offset", "offsets", "path", "persisted", "timestamps")

    def __init__(self, path: Path, base_offset: int) -> None:
        self.path = path
        self.base_offset = base_offset
        self.persisted = False
        """True while the file holds exactly these entries (loaded or written, unchanged since)."""
        self.timestamps: array[int] = array("q")
        self.offsets: array[int] = array("i")

    def __len__(self) -> int:
        return len(self.timestamps)

    def maybe_append(self, max_timestamp: int, last_offset: int) -> None:
        if not self.timestamps or max_timestamp > self.timestamps[-1]:
            self.timestamps.append(max_timestamp)
            self.offsets.append(last_offset - self.base_offset)
            self.persisted = False

    def lookup(self, timestamp: int) -> int | None:
        """An offset at or before the first batch whose max timestamp is >= ``timestamp``."""
        index = bisect.bisect_left(self.timestamps, timestamp)
        if index >= len(self.timestamps):
            return None
        if index == 0:
            return self.base_offset
        return self.base_offset + self.offsets[index - 1] + 1

    def truncate_to_offset(self, next_offset: int) -> None:
        keep = bisect.bisect_left(self.offsets, next_offset - self.base_offset)
        if keep < len(self.offsets):
            self.persisted = False
        del self.timestamps[keep:]
        del self.offsets[keep:]

    def clear(self) -> None:
        del self.timestamps[:]
        del self.offsets[:]
        self.persisted = False

    def load(self) -> bool:
        self.clear()
        try:
            raw = self.path.read_bytes()
        except FileNotFoundError:
            return False
        if len(raw) % _TIME_ENTRY:
            return False
        previous_ts: int | None = None
        previous_rel = -1
        for ts, rel in _TIME_STRUCT.iter_unpack(raw):
            if rel <= previous_rel or (previous_ts is not None and ts <= previous_ts):
                self.clear()
                return False
            self.timestamps.append(ts)
            self.offsets.append(rel)
            previous_ts, previous_rel = ts, rel
        self.persisted = True
        return True

    def encode(self) -> bytes:
        pairs = zip(self.timestamps, self.offsets, strict=True)
        return b"".join(_TIME_STRUCT.pack(ts, rel) for ts, rel in pairs)

    def write(self) -> None:
        atomic_write(self.path, self.encode())
        self.persisted = True
