"""Quorum arithmetic and timer formulas: pure functions, no state, no IO."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol


class Rng(Protocol):
    """The slice of ``random.Random`` the core uses; inject a seeded instance."""

    def random(self) -> float: ...


def majority(voter_count: int) -> int:
    """Votes needed to win among ``voter_count`` voters."""
    return voter_count // 2 + 1


def majority_offset(voter_end_offsets: Iterable[int]) -> int:
    """The largest offset that a majority of voters have reached (the high-watermark candidate).

    Sort end offsets descending and take index ``n // 2`` (Kafka's ``LeaderState.maybeUpdateHighWatermark``).
    Unknown replicas count as -1.
    """
    ordered = sorted(voter_end_offsets, reverse=True)
    return ordered[len(ordered) // 2]


def is_log_up_to_date(
    candidate_last_epoch: int, candidate_end_offset: int, local_last_epoch: int, local_end_offset: int
) -> bool:
    """Raft's "at least as up to date": compare last epoch, then end offset."""
    if candidate_last_epoch != local_last_epoch:
        return candidate_last_epoch > local_last_epoch
    return candidate_end_offset >= local_end_offset


def random_election_timeout_ms(base_ms: int, rng: Rng) -> int:
    """Uniform in ``[base, 2 * base)``."""
    return base_ms + int(rng.random() * base_ms)


def election_backoff_ms(retries: int, base_ms: int, max_ms: int, rng: Rng) -> int:
    """Backoff after a lost candidacy: ``min(base * rand[0, 2^retries), max)``, at least 1 ms."""
    exponent = min(retries, 20)
    return max(1, min(int(base_ms * rng.random() * (1 << exponent)), max_ms))


def end_quorum_backoff_ms(node_id: int, preferred_successors: Sequence[int], backoff_max_ms: int) -> int:
    """Election delay after EndQuorumEpoch by position in the leader's preferred successors.

    First → 0; position ``p`` of ``n`` → ``min(max, (max >> (n - 1)) << (p - 1))``; absent → max.
    """
    if node_id not in preferred_successors:
        return backoff_max_ms
    position = list(preferred_successors).index(node_id)
    if position == 0:
        return 0
    count = len(preferred_successors)
    return min(backoff_max_ms, (backoff_max_ms >> (count - 1)) << (position - 1))
