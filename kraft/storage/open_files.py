"""An LRU of open segment files, so an idle partition costs no file descriptor (issue #14).

Every :class:`~kraft.storage.segment.LogSegment` holds one descriptor (its ``.log`` file; the indexes
are read and written whole, never kept open).  A broker hosting 100,000 partitions would need 100,000+
descriptors — beyond most limits — although almost all of them sit idle.  With an
:class:`OpenFileCache` (``LogConfig.open_files``) a segment opens its file on first use and the cache
closes the least recently used one when more than ``capacity`` are open; the segment reopens it on its
next read or write (``os.open`` without ``O_CREAT``: a deleted file is never recreated).

Durability: a segment with unflushed writes is fdatasync'ed before its descriptor is closed — after a
close, a later fsync through a new descriptor might not report a writeback error of the old one (the
"fsyncgate" rule), so nothing unflushed is ever left behind a closed descriptor.  A failed fdatasync
there raises :class:`~kraft.storage.errors.FatalStorageError` to the caller whose open caused the
eviction (the broker takes that log dir offline).

Threading: with a cache, every segment sharing it must be used from one thread (the broker's event
loop); the Raft metadata log, which flushes in a worker thread, runs without one.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Protocol


class CachedFile(Protocol):
    def release_file(self) -> None:
        """Flush if dirty, then close the descriptor (the owner reopens it on next use)."""
        ...


@dataclass(slots=True)
class OpenFileStats:
    opens: int = 0
    """Descriptors opened through the cache (first opens and reopens)."""
    evictions: int = 0
    """Descriptors the cache closed to stay within its capacity."""


class OpenFileCache:
    """Least-recently-used set of open segment files, at most ``capacity`` at a time."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"an open-file cache needs a capacity of at least 1, got {capacity}")
        self.capacity = capacity
        self.stats = OpenFileStats()
        self._open: OrderedDict[CachedFile, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self._open)

    def opened(self, owner: CachedFile) -> None:
        """``owner`` just opened its file: make it the most recent, close the oldest beyond capacity."""
        self.stats.opens += 1
        self._open[owner] = None
        self._open.move_to_end(owner)
        while len(self._open) > self.capacity:
            oldest = next(iter(self._open))
            if oldest is owner:  # capacity 1 and only the caller open: nothing else to close
                break
            del self._open[oldest]
            self.stats.evictions += 1
            oldest.release_file()

    def used(self, owner: CachedFile) -> None:
        """``owner``'s open file was used: it becomes the most recent."""
        self._open.move_to_end(owner)

    def closed(self, owner: CachedFile) -> None:
        """``owner`` closed its file itself (segment closed or deleted)."""
        self._open.pop(owner, None)
