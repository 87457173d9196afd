"""Raft election states and the transitions between them, kept as data.

Theory of operation
-------------------
A node is always in exactly one :class:`StateKind` at one epoch.  Epochs only grow.  Only a Candidate
bumps the epoch on its own; every other epoch change comes from a message carrying a higher epoch.

- **Unattached** — no leader known in this epoch (maybe a vote cast).  A voter whose election timer
  expires becomes *Prospective*.
- **Prospective** (KIP-996 pre-vote) — asks voters whether they *would* vote for it at epoch+1 without
  changing anyone's state.  A majority of grants → *Candidate*; rejected or timed out → back to
  *Follower* (leader known) or *Unattached*.
- **Candidate** — bumped the epoch, voted for itself (persisted), asks for votes.  Majority → *Leader*;
  election timeout or lost election → *Prospective*.
- **Leader** — appends a LeaderChange control batch, announces itself with BeginQuorumEpoch, serves
  fetches, advances the high watermark.  Check-quorum failure or a graceful resign → *Resigned*.
- **Follower** — fetches from the known leader.  A voter whose fetch timer expires → *Prospective*.
- **Resigned** — a former leader of this epoch (it voted for itself, so it must never vote again in it).
  After the election timeout → *Unattached* at epoch+1.

Any state moves to *Unattached* on a higher epoch with no leader, and to *Follower* when it learns a
leader at an equal (if it had none) or higher epoch.  Observers (non-voters) only move between
Unattached and Follower.  ``Prospective`` and ``Resigned`` are memory-only; every other transition
writes the quorum-state file before any message that depends on it leaves the node.

:data:`ALLOWED_TRANSITIONS` is the whole table; the core asserts every transition against it, so a
missing row is a bug caught by the simulation, not silent misbehaviour.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from kraft.raft.messages import NO_LEADER


class StateKind(enum.Enum):
    UNATTACHED = "Unattached"
    PROSPECTIVE = "Prospective"
    CANDIDATE = "Candidate"
    LEADER = "Leader"
    FOLLOWER = "Follower"
    RESIGNED = "Resigned"


U, P, C, L, F, R = (
    StateKind.UNATTACHED,
    StateKind.PROSPECTIVE,
    StateKind.CANDIDATE,
    StateKind.LEADER,
    StateKind.FOLLOWER,
    StateKind.RESIGNED,
)

ALLOWED_TRANSITIONS: dict[StateKind, frozenset[StateKind]] = {
    # Unattached: election timeout → P; higher epoch / vote cast → U; leader learned → F.
    U: frozenset({P, U, F}),
    # Prospective: pre-vote majority → C; rejected/timeout/vote cast/higher epoch → U or F.
    P: frozenset({C, U, F}),
    # Candidate: majority → L; timeout or lost → P; higher epoch → U; leader learned → F.
    C: frozenset({L, P, U, F}),
    # Leader: check-quorum or resign → R; higher epoch → U or F.
    L: frozenset({R, U, F}),
    # Follower: fetch timeout → P; higher epoch → U; new leader at a higher epoch → F.
    F: frozenset({P, U, F}),
    # Resigned: election timeout or higher epoch → U; leader at a higher epoch → F.
    R: frozenset({U, F}),
}

OBSERVER_STATES: frozenset[StateKind] = frozenset({U, F})

PERSISTED_STATES: frozenset[StateKind] = frozenset({U, C, L, F})
"""States whose entry writes the quorum-state file (Prospective and Resigned are memory-only)."""


class ImpossibleElectionStateError(ValueError):
    """The stored election state (or log) holds an epoch no node can have produced: corrupt or forged.
    Fatal at startup, with one line naming it (a node must never run on a guessed epoch)."""


class InvalidTransitionError(Exception):
    """A transition the table does not allow: a bug in the core."""


def check_transition(current: StateKind, target: StateKind, *, is_voter: bool) -> None:
    if target not in ALLOWED_TRANSITIONS[current]:
        raise InvalidTransitionError(f"{current.value} -> {target.value} is not a Raft transition")
    # A leader removed from the voter set (KIP-853) resigns as a non-voter once the removal commits.
    if not is_voter and target not in OBSERVER_STATES and target is not StateKind.RESIGNED:
        raise InvalidTransitionError(f"an observer cannot become {target.value}")


@dataclass(frozen=True, slots=True)
class ElectionState:
    """What ``quorum-state`` holds: the epoch, the known leader and this node's vote in that epoch."""

    epoch: int
    leader_id: int = NO_LEADER
    voted_id: int = NO_LEADER

    @property
    def has_leader(self) -> bool:
        return self.leader_id != NO_LEADER

    @property
    def has_voted(self) -> bool:
        return self.voted_id != NO_LEADER
