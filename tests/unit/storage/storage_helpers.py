"""Shared helpers for the storage tests: a model of what a log should hold, and full-scan readers."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from kraft.storage.batch import BatchHeader, iter_batch_headers
from kraft.storage.log import SegmentedLog


@dataclass
class StoredBatch:
    base_offset: int
    next_offset: int
    epoch: int
    data: bytes


@dataclass
class LogModel:
    """What the log must hold: every batch appended and not truncated (including ones below the log
    start, which delete_before only removes segment-wise)."""

    batches: list[StoredBatch] = field(default_factory=list)
    start_offset: int = 0

    @property
    def end_offset(self) -> int:
        return max(self.batches[-1].next_offset, self.start_offset) if self.batches else self.start_offset

    def add(self, data: bytes, header: BatchHeader) -> None:
        epoch = header.partition_leader_epoch
        self.batches.append(StoredBatch(header.base_offset, header.next_offset, epoch, data))

    def truncate_to(self, offset: int) -> None:
        self.batches = [b for b in self.batches if b.next_offset <= offset]

    def delete_before(self, offset: int) -> None:
        self.start_offset = max(self.start_offset, offset)

    def epoch_entries(self) -> list[tuple[int, int]]:
        """The documented invariant of the epoch cache, as a pure function of the log's contents: one
        (epoch, first offset) entry per epoch that has offsets in [start_offset, end_offset)."""
        entries: list[tuple[int, int]] = []
        for batch in self.batches:
            if batch.next_offset <= self.start_offset:
                continue
            if not entries or batch.epoch > entries[-1][0]:
                entries.append((batch.epoch, max(batch.base_offset, self.start_offset)))
        return entries


def scan_batches(log: SegmentedLog) -> list[tuple[BatchHeader, bytes]]:
    """Every batch of every segment by a full CRC-checked scan (independent of the indexes)."""
    data = log.read_all_batches()
    return [(h, data[pos : pos + h.size_in_bytes]) for pos, h in iter_batch_headers(data)]


def segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))
