"""The core's view of its log: offsets and the leader-epoch cache, no bytes.

The driver owns the real log; the core mirrors only what Raft decisions need and tells the driver what
to do through effects.  Invariants: ``start_offset <= flushed_end <= end_offset``; ``epochs`` is sorted
by both epoch and start offset, every start in ``[start_offset, end_offset)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kraft.raft.messages import EpochEndOffset, SnapshotId
from kraft.raft.voters import VoterSet, VoterSetHistory


class LogInvariantError(Exception):
    """A log operation that would break Raft's log rules: a bug, or data the node must refuse."""


@dataclass(slots=True)
class EpochEntry:
    epoch: int
    start_offset: int


@dataclass(slots=True)
class LogMeta:
    start_offset: int = 0
    end_offset: int = 0
    flushed_end: int = 0
    epochs: list[EpochEntry] = field(default_factory=list)
    snapshot: SnapshotId | None = None
    """The latest snapshot; when ``start_offset > 0`` it ends exactly at ``start_offset``."""
    voters: VoterSetHistory | None = None
    """Every voter set in the log by offset, over the snapshot's (or bootstrap, or static) set; the core
    fills in the static configuration when the driver found none.  Moves with the log: a truncation
    reverts it, a snapshot compacts it."""

    @property
    def voter_history(self) -> VoterSetHistory:
        if self.voters is None:
            raise LogInvariantError("the log has no voter set history")
        return self.voters

    @property
    def last_epoch(self) -> int:
        """Epoch of the last record, or of the snapshot the log starts at, or 0 for an empty log."""
        if self.epochs:
            return self.epochs[-1].epoch
        return self._base_epoch()

    def _base_epoch(self) -> int:
        if self.snapshot is not None and self.snapshot.end_offset == self.start_offset:
            return self.snapshot.epoch
        return 0

    def append(self, base_offset: int, last_offset: int, epoch: int, voters: VoterSet | None = None) -> None:
        if base_offset != self.end_offset or last_offset < base_offset:
            raise LogInvariantError(
                f"append [{base_offset}, {last_offset}] does not continue the log ending at {self.end_offset}"
            )
        if epoch < self.last_epoch:
            raise LogInvariantError(f"append of epoch {epoch} after epoch {self.last_epoch}")
        if voters is not None:
            self.voter_history.add_at(base_offset, voters)
        if not self.epochs or self.epochs[-1].epoch != epoch:
            self.epochs.append(EpochEntry(epoch, base_offset))
        self.end_offset = last_offset + 1

    def truncate_to(self, end_offset: int) -> None:
        if end_offset < self.start_offset:
            raise LogInvariantError(f"truncate to {end_offset} below the log start {self.start_offset}")
        if end_offset >= self.end_offset:
            return
        self.end_offset = end_offset
        self.flushed_end = min(self.flushed_end, end_offset)
        if self.voters is not None:
            self.voters.truncate_to(end_offset)
        while self.epochs and self.epochs[-1].start_offset >= end_offset:
            self.epochs.pop()

    def mark_flushed(self, end_offset: int) -> None:
        self.flushed_end = max(self.flushed_end, min(end_offset, self.end_offset))

    def end_offset_for_epoch(self, epoch: int) -> EpochEndOffset | None:
        """End of the largest local epoch ``<= epoch`` (Kafka's ``endOffsetForEpoch``).

        ``None`` when ``epoch`` is older than anything this log can still vouch for (below the snapshot).
        """
        for index in range(len(self.epochs) - 1, -1, -1):
            entry = self.epochs[index]
            if entry.epoch <= epoch:
                end = self.epochs[index + 1].start_offset if index + 1 < len(self.epochs) else self.end_offset
                return EpochEndOffset(entry.epoch, end)
        base_epoch = self._base_epoch()
        if epoch >= base_epoch:
            first_start = self.epochs[0].start_offset if self.epochs else self.end_offset
            return EpochEndOffset(base_epoch, first_start)
        return None

    def epoch_at(self, offset: int) -> int | None:
        """Epoch of the record at ``offset`` (None when outside the log)."""
        if offset < self.start_offset or offset >= self.end_offset:
            if self.snapshot is not None and offset == self.snapshot.end_offset - 1:
                return self.snapshot.epoch
            return None
        for entry in reversed(self.epochs):
            if entry.start_offset <= offset:
                return entry.epoch
        return self._base_epoch()

    def reset_to_snapshot(self, snapshot_id: SnapshotId, voters: VoterSet | None = None) -> None:
        """Replace everything by a snapshot: the log restarts empty at its end offset.  ``voters`` is the
        snapshot's voter set; None while unknown (the core learns it when the snapshot is loaded), and
        meanwhile the set in force before stays."""
        if self.voters is not None:
            self.voters.reset(voters or self.voters.latest, static=voters is None and self.voters.static)
        self.snapshot = snapshot_id
        self.start_offset = self.end_offset = self.flushed_end = snapshot_id.end_offset
        self.epochs = []

    def advance_start(self, start_offset: int) -> None:
        """The driver deleted the log below ``start_offset`` (after a snapshot covering it)."""
        if start_offset <= self.start_offset:
            return
        if start_offset > self.end_offset:
            raise LogInvariantError(f"log start {start_offset} beyond the log end {self.end_offset}")
        keep: list[EpochEntry] = []
        for index, entry in enumerate(self.epochs):
            end = self.epochs[index + 1].start_offset if index + 1 < len(self.epochs) else self.end_offset
            if end > start_offset:
                keep.append(EpochEntry(entry.epoch, max(entry.start_offset, start_offset)))
        self.epochs = keep
        self.start_offset = start_offset
        if self.voters is not None:
            self.voters.compact_before(start_offset)
