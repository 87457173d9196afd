"""Leader-epoch cache: epoch → start offset, persisted as Kafka's ``leader-epoch-checkpoint``.

File format (text, like Kafka's)::

    0            <- version
    2            <- number of entries
    0 0          <- epoch start_offset
    3 120

Invariants: epochs and start offsets both strictly increase.  The file is rewritten atomically whenever
the entries change (epoch changes are rare, so the fsync cost does not matter).  The checkpoint may run
ahead of the log after a crash (it is written before the batch is flushed); the log calls
:meth:`truncate_from_end` with its recovered end offset to drop such entries.
"""

from __future__ import annotations

import bisect
from pathlib import Path

from kraft.storage.fileio import atomic_write

CHECKPOINT_FILE = "leader-epoch-checkpoint"
UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1


class LeaderEpochCache:
    __slots__ = ("_epochs", "_offsets", "path")

    def __init__(self, path: Path) -> None:
        self.path = path
        self._epochs: list[int] = []
        self._offsets: list[int] = []

    # --- persistence -------------------------------------------------------------------------------

    def load(self) -> bool:
        """Load the checkpoint; False if it is missing (the caller rebuilds from the log).

        A file that exists but cannot be parsed also returns False: the cache is derived data.
        """
        self._epochs, self._offsets = [], []
        try:
            lines = self.path.read_text(encoding="ascii").split("\n")
        except FileNotFoundError:
            return False
        except (OSError, UnicodeDecodeError):
            return False
        try:
            if lines[0].strip() != "0":
                return False
            count = int(lines[1])
            entries = [tuple(int(field) for field in line.split()) for line in lines[2 : 2 + count]]
        except (ValueError, IndexError):
            return False
        # Exactly ``count`` entries and nothing after them (as Kafka's reader insists): a damaged count
        # must not silently drop the newest entries, which recovery would then take for damaged batches.
        if len(entries) != count or any(line.strip() for line in lines[2 + count :]):
            return False
        for entry in entries:
            if len(entry) != 2 or not self._valid_next(entry[0], entry[1]):
                self._epochs, self._offsets = [], []
                return False
            self._epochs.append(entry[0])
            self._offsets.append(entry[1])
        return True

    def _valid_next(self, epoch: int, start_offset: int) -> bool:
        if epoch < 0 or start_offset < 0:
            return False
        return not self._epochs or (epoch > self._epochs[-1] and start_offset > self._offsets[-1])

    def save(self) -> None:
        body = "".join(f"{e} {o}\n" for e, o in zip(self._epochs, self._offsets, strict=True))
        atomic_write(self.path, f"0\n{len(self._epochs)}\n{body}".encode("ascii"))

    # --- queries -----------------------------------------------------------------------------------

    def entries(self) -> list[tuple[int, int]]:
        return list(zip(self._epochs, self._offsets, strict=True))

    @property
    def latest_epoch(self) -> int:
        return self._epochs[-1] if self._epochs else UNDEFINED_EPOCH

    @property
    def first_offset(self) -> int | None:
        """Start offset of the earliest entry (None when empty): batches from here on have known epochs."""
        return self._offsets[0] if self._offsets else None

    def epoch_for_offset(self, offset: int) -> int:
        """The epoch of the batch holding ``offset`` (UNDEFINED_EPOCH if before the first entry)."""
        index = bisect.bisect_right(self._offsets, offset) - 1
        return self._epochs[index] if index >= 0 else UNDEFINED_EPOCH

    def epoch_span(self, offset: int) -> tuple[int, int, int]:
        """(epoch holding ``offset``, its start offset, the next epoch's start or 2**63); the epoch is
        UNDEFINED_EPOCH before the first entry (then the span ends at the first entry)."""
        index = bisect.bisect_right(self._offsets, offset) - 1
        end = self._offsets[index + 1] if index + 1 < len(self._offsets) else 2**63
        if index < 0:
            return UNDEFINED_EPOCH, -(2**63), end
        return self._epochs[index], self._offsets[index], end

    def end_offset_for(self, requested_epoch: int, log_end_offset: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch: (largest epoch <= requested, the offset where it ends).

        - requested == latest epoch → (latest, log end offset)
        - requested > latest, or no entries → (UNDEFINED_EPOCH, UNDEFINED_OFFSET)
        - requested < earliest → (requested, start offset of the earliest epoch)
        - otherwise → (floor epoch, start offset of the next higher epoch)
        """
        if requested_epoch == UNDEFINED_EPOCH or not self._epochs:
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if requested_epoch == self._epochs[-1]:
            return requested_epoch, log_end_offset
        higher = bisect.bisect_right(self._epochs, requested_epoch)
        if higher >= len(self._epochs):
            return UNDEFINED_EPOCH, UNDEFINED_OFFSET
        if higher == 0:
            return requested_epoch, self._offsets[0]
        return self._epochs[higher - 1], self._offsets[higher]

    # --- updates -----------------------------------------------------------------------------------

    def assign(self, epoch: int, start_offset: int) -> bool:
        """Record that ``epoch`` starts at ``start_offset`` if it is newer than the latest; True if added.

        Like Kafka, entries starting at or after ``start_offset`` are replaced: the only way a newer epoch
        can start there is right after ``delete_before``/``truncate_from_start`` moved the previous
        epoch's start up to the log start offset, where the new epoch's first batch now lands.
        """
        if epoch < 0 or (self._epochs and epoch <= self._epochs[-1]):
            return False
        while self._offsets and self._offsets[-1] >= start_offset:
            self._offsets.pop()
            self._epochs.pop()
        self._epochs.append(epoch)
        self._offsets.append(start_offset)
        return True

    def truncate_from_end(self, end_offset: int) -> bool:
        """Drop entries whose start offset is >= ``end_offset`` (after a log truncation). True if changed."""
        keep = bisect.bisect_left(self._offsets, end_offset)
        if keep == len(self._offsets):
            return False
        del self._epochs[keep:]
        del self._offsets[keep:]
        return True

    def truncate_from_start(self, start_offset: int) -> bool:
        """Forget epochs entirely before ``start_offset``; the epoch holding it now starts there."""
        index = bisect.bisect_right(self._offsets, start_offset) - 1
        if index < 0 or (index == 0 and self._offsets[0] == start_offset):
            return False
        del self._epochs[:index]
        del self._offsets[:index]
        self._offsets[0] = start_offset
        return True

    def clear(self) -> None:
        self._epochs, self._offsets = [], []
