"""The core's own election timer and the backoff after lost elections.

Roles keep their own deadlines (fetch timeout, check-quorum, retries); this one belongs to the states
without a role timer: an Unattached voter campaigns when it fires, a Prospective or Candidate gives up
its round, a Resigned leader moves to the next epoch.  Every random draw of the core's own timers
happens here, in the order the core asks for them (the simulation replays seeds on that order).
"""

from __future__ import annotations

from kraft.raft.core_types import RaftConfig
from kraft.raft.quorum import Rng, election_backoff_ms, random_election_timeout_ms

NEVER_MS = 1 << 62
"""A deadline that never comes (every Raft role's unset timer; one definition so they compare equal)."""


class ElectionTimer:
    def __init__(self, config: RaftConfig, rng: Rng) -> None:
        self.config = config
        self.rng = rng
        self.deadline_ms = NEVER_MS
        self.lost_elections = 0
        """Elections lost in a row since a leader was last heard from: grows the backoff."""

    def expired(self, now_ms: int) -> bool:
        return now_ms >= self.deadline_ms

    def stop(self) -> None:
        self.deadline_ms = NEVER_MS

    def fire_now(self, now_ms: int) -> None:
        self.deadline_ms = now_ms

    def fire_by(self, at_ms: int) -> None:
        """Fire no later than ``at_ms`` (EndQuorumEpoch's successor backoff)."""
        self.deadline_ms = min(self.deadline_ms, at_ms)

    def not_before(self, at_ms: int) -> None:
        """Fire no earlier than ``at_ms`` (a stopped timer stays stopped)."""
        if self.deadline_ms != NEVER_MS:
            self.deadline_ms = max(self.deadline_ms, at_ms)

    def restart(self, now_ms: int) -> None:
        """A fresh randomized election timeout in ``[T, 2T)``."""
        self.deadline_ms = now_ms + random_election_timeout_ms(self.config.election_timeout_ms, self.rng)

    def back_off(self, now_ms: int) -> None:
        """Wait out the randomized, growing backoff after a lost election."""
        self.deadline_ms = now_ms + self.backoff_ms()

    def backoff_ms(self) -> int:
        return election_backoff_ms(
            self.lost_elections,
            self.config.election_backoff_base_ms,
            self.config.election_backoff_max_ms,
            self.rng,
        )
