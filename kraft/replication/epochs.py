"""Leader-epoch entries and OffsetsForLeaderEpoch, as a leader answers it (KIP-101, KIP-279, KIP-320).

A log's *epoch entries* are ``(epoch, start_offset)`` pairs, both strictly increasing: the first offset
written in each leader epoch (Kafka's ``leader-epoch-checkpoint``; kraft's
:class:`kraft.storage.epoch_cache.LeaderEpochCache` and ``SegmentedLog.epoch_entries()`` hold exactly
this). An epoch *ends* where the next one starts; the latest one ends at the log end offset.

Every record of epoch ``e`` was written by the one leader of ``e``, at the offset it has on every replica
that holds it. So two logs holding a record of the same epoch at the same offset hold the same records
up to it (Raft's Log Matching), and comparing epoch boundaries finds where two logs diverge without
comparing records.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

UNDEFINED_EPOCH = -1
UNDEFINED_OFFSET = -1

# (epoch, start offset) pairs, both strictly increasing.
EpochEntries = Sequence[tuple[int, int]]


@dataclass(frozen=True, slots=True)
class EpochEndOffset:
    """An OffsetsForLeaderEpoch answer: the largest epoch ≤ the requested one, and where it ends."""

    epoch: int
    end_offset: int

    @property
    def is_undefined(self) -> bool:
        return self.end_offset == UNDEFINED_OFFSET


UNDEFINED = EpochEndOffset(UNDEFINED_EPOCH, UNDEFINED_OFFSET)


def check_entries(entries: EpochEntries, log_end: int) -> None:
    """Raise ValueError unless ``entries`` are strictly increasing and start below ``log_end``.

    An entry may start *at* ``log_end``: a leader records its epoch when it is elected, before it
    appends anything (see :func:`with_leader_epoch`).
    """
    for (epoch, start), (next_epoch, next_start) in itertools.pairwise(entries):
        if next_epoch <= epoch or next_start <= start:
            raise ValueError(f"epoch entries not strictly increasing: {list(entries)}")
    if entries and (entries[0][0] < 0 or entries[0][1] < 0 or entries[-1][1] > log_end):
        raise ValueError(f"epoch entries {list(entries)} do not fit a log ending at {log_end}")


def latest_epoch(entries: EpochEntries) -> int:
    return entries[-1][0] if entries else UNDEFINED_EPOCH


def end_offset_for_epoch(entries: EpochEntries, log_end: int, requested_epoch: int) -> EpochEndOffset:
    """OffsetsForLeaderEpoch on the log described by ``entries`` and ``log_end``.

    Kafka's ``LeaderEpochFileCache.endOffsetFor``:

    - requested == the latest epoch → (latest, ``log_end``): the current epoch ends at the log end;
    - requested undefined, above the latest, or no entries → UNDEFINED (the answerer knows nothing
      about that epoch; a leader never gets here for a follower's epoch once it has recorded its own,
      which is always the largest — see :func:`with_leader_epoch`);
    - requested below the earliest → (requested, start of the earliest): the data before it is gone
      (log start moved), the follower may keep nothing past it. Kafka returns this, not UNDEFINED;
    - otherwise → (largest epoch ≤ requested, start of the next larger epoch).
    """
    if requested_epoch == UNDEFINED_EPOCH or not entries:
        return UNDEFINED
    if requested_epoch == entries[-1][0]:
        return EpochEndOffset(requested_epoch, log_end)
    epochs = [epoch for epoch, _ in entries]
    higher = bisect.bisect_right(epochs, requested_epoch)
    if higher >= len(entries):
        return UNDEFINED
    if higher == 0:
        return EpochEndOffset(requested_epoch, entries[0][1])
    return EpochEndOffset(entries[higher - 1][0], entries[higher][1])


def with_leader_epoch(entries: EpochEntries, leader_epoch: int, log_end: int) -> tuple[tuple[int, int], ...]:
    """The entries after a leader of ``leader_epoch`` records where its epoch starts (its log end).

    Kafka's ``Partition.makeLeader`` does this on election, before any append: after quick successive
    elections a follower may hold entries of a later epoch than any in the new leader's log; recording
    the new leader epoch, larger than any epoch a follower can ask about, lets it truncate correctly.
    Without it, a follower asking about such an epoch gets UNDEFINED and falls back to its high watermark.
    """
    if entries and entries[-1][0] >= leader_epoch:
        return tuple(entries)
    # An older epoch that starts at the log end holds no record: the new one replaces it (as Kafka's
    # LeaderEpochFileCache.assign does).
    kept = tuple(entry for entry in entries if entry[1] < log_end)
    return (*kept, (leader_epoch, log_end))


def entries_truncated_to(entries: EpochEntries, end_offset: int) -> tuple[tuple[int, int], ...]:
    """The entries of the log after ``truncate_to(end_offset)``: epochs starting at or after it go."""
    return tuple(entry for entry in entries if entry[1] < end_offset)


def diverging_epoch(
    entries: EpochEntries, log_end: int, fetch_offset: int, last_fetched_epoch: int
) -> EpochEndOffset | None:
    """The leader's Fetch-time divergence check (Kafka ≥ 2.7, Fetch v12 ``LastFetchedEpoch``).

    None when the follower's position ``(fetch_offset, last_fetched_epoch)`` is on the leader's log;
    otherwise the answer to send as ``DivergingEpoch``: the leader's largest epoch ≤ the follower's and
    where it ends — the follower treats it exactly like an OffsetsForLeaderEpoch answer
    (:func:`kraft.replication.truncation.next_truncation_step`). An UNDEFINED result means the leader
    cannot place the epoch at all (Kafka answers OFFSET_OUT_OF_RANGE then).
    """
    answer = end_offset_for_epoch(entries, log_end, last_fetched_epoch)
    if answer.is_undefined or answer.epoch < last_fetched_epoch or answer.end_offset < fetch_offset:
        return answer
    return None
