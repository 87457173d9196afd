"""The recent committed batches a controller serves MetadataFetch from (pure, bounded).

Batches are kept whole, oldest first, until more than ``max_records`` records are held; a fetch below
the oldest batch is answered with a snapshot instead.  Lookup is a binary search over base offsets, and
trimming advances a start index (the list is compacted once half of it is dead), so both stay cheap
with hundreds of thousands of tiny batches (NoOps, heartbeat-driven changes).
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class WindowBatch:
    base_offset: int
    last_offset: int
    epoch: int
    append_time_ms: int
    records: tuple[tuple[int, bytes], ...]  # (offset, value); empty for Raft control batches


@dataclass(frozen=True, slots=True)
class WindowRecord:
    offset: int
    epoch: int
    append_time_ms: int
    value: bytes


class FetchWindow:
    def __init__(self, max_records: int) -> None:
        self.max_records = max_records
        self._batches: list[WindowBatch] = []
        self._start = 0
        self._held = 0

    def __len__(self) -> int:
        return len(self._batches) - self._start

    def clear(self) -> None:
        self._batches = []
        self._start = 0
        self._held = 0

    def start_offset(self, default: int) -> int:
        """Base offset of the oldest batch held (``default`` when empty)."""
        return self._batches[self._start].base_offset if len(self) else default

    def append(self, batch: WindowBatch) -> None:
        self._batches.append(batch)
        self._held += len(batch.records) or 1
        while self._held > self.max_records and len(self) > 1:
            self._held -= len(self._batches[self._start].records) or 1
            self._start += 1
        if self._start > 1024 and self._start * 2 > len(self._batches):
            del self._batches[: self._start]
            self._start = 0

    def read(self, fetch_offset: int, max_records: int) -> list[WindowRecord]:
        """Records at offsets ≥ ``fetch_offset``, whole batches, at least one batch with records."""
        index = bisect.bisect_right(self._batches, fetch_offset, lo=self._start, key=lambda b: b.base_offset)
        index = max(self._start, index - 1)
        result: list[WindowRecord] = []
        for batch in self._batches[index:]:
            if result and len(result) + len(batch.records) > max_records:
                break
            for offset, value in batch.records:
                if offset >= fetch_offset:
                    result.append(WindowRecord(offset, batch.epoch, batch.append_time_ms, value))
        return result
