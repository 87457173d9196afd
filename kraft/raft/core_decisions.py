"""What a role decides: small frozen values the roles return and :class:`~kraft.raft.core.RaftCore` applies.

The roles (:mod:`~kraft.raft.core_election`, :mod:`~kraft.raft.core_leader`,
:mod:`~kraft.raft.core_fetcher`) read the state they are given and return a list of decisions; they never
write the core's fields or its :class:`~kraft.raft.core_output.Output`.  ``RaftCore._apply`` is the one
place where a decision becomes a change of state and an effect, in list order, so a role can rely on
the decisions before one being applied when the core reaches it (e.g. :class:`FetchAgain` after a
:class:`TruncateLog` sees the truncated log).

Transitions (:data:`Transition`) are decisions too, but only the core picks them: from an election's
outcome (:meth:`~kraft.raft.core_election.ElectionRole.transition_for_win`), a response's verdict
(:func:`~kraft.raft.core_rules.common_response_verdict`) or a timer.  ``RaftCore._become`` applies them
through the transition table in :mod:`kraft.raft.state`.
"""

from __future__ import annotations

from dataclasses import dataclass

from kraft.errors import ErrorCode
from kraft.raft.core_output import (
    AppendFetched,
    AppendLeaderChange,
    AppendRecords,
    AppendVoters,
    LogRead,
    SnapshotRead,
    WriteSnapshotChunk,
)
from kraft.raft.core_types import BatchInfo
from kraft.raft.messages import (
    NO_LEADER,
    FetchRequest,
    FetchSnapshotRequest,
    RaftRequest,
    RaftResponse,
    SnapshotId,
)


@dataclass(frozen=True, slots=True)
class SendRequest:
    """Send ``request``; ``after_persist`` when it relies on the election state being written first."""

    dest: int
    request: RaftRequest
    after_persist: bool


@dataclass(frozen=True, slots=True)
class SendFetch:
    """The fetcher's one request in flight (sent now); the core tells the fetcher its correlation id."""

    dest: int
    request: FetchRequest | FetchSnapshotRequest
    extra_timeout_ms: int = 0
    echo: bool = False
    """A read-round echo (``FetchRequest.echo_only``) sent beside the one fetch in flight, not as it."""


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer inbound request ``request_id``."""

    request_id: int
    response: RaftResponse
    after_persist: bool = False
    read_log: LogRead | None = None
    read_snapshot: SnapshotRead | None = None


@dataclass(frozen=True, slots=True)
class RespondError:
    """Answer ``request`` with an error; the core adds the leader and epoch it currently knows."""

    request_id: int
    request: RaftRequest
    code: ErrorCode
    message: str


@dataclass(frozen=True, slots=True)
class AppendToLog:
    """Append ``op`` (whose batches are ``batches``) and flush."""

    op: AppendRecords | AppendLeaderChange | AppendVoters | AppendFetched
    batches: tuple[BatchInfo, ...]


@dataclass(frozen=True, slots=True)
class TruncateLog:
    """Delete the log from ``end_offset`` on (the role checked it is not below the high watermark)."""

    end_offset: int


@dataclass(frozen=True, slots=True)
class WriteChunk:
    """Write a downloaded snapshot chunk (the log itself does not change until :class:`ResetToSnapshot`)."""

    op: WriteSnapshotChunk


@dataclass(frozen=True, slots=True)
class ResetToSnapshot:
    """The downloaded snapshot is complete: install it, the log restarts empty at its end."""

    snapshot_id: SnapshotId


@dataclass(frozen=True, slots=True)
class AdvanceHighWatermark:
    """Raise the high watermark to ``offset`` (ignored unless higher: it never goes back)."""

    offset: int


@dataclass(frozen=True, slots=True)
class ResetElectionRetries:
    """A leader answered: the next lost election starts the backoff from scratch."""


@dataclass(frozen=True, slots=True)
class FetchAgain:
    """Ask the fetcher for its next request once the decisions before this one are applied."""


@dataclass(frozen=True, slots=True)
class ConfirmReadRound:
    """Leadership-confirmation round ``read_round`` (and every earlier one) is confirmed: a majority of
    voters, the leader included, was still in this leader's epoch after the round started."""

    read_round: int


Decision = (
    SendRequest
    | SendFetch
    | Respond
    | RespondError
    | AppendToLog
    | TruncateLog
    | WriteChunk
    | ResetToSnapshot
    | AdvanceHighWatermark
    | ResetElectionRetries
    | FetchAgain
    | ConfirmReadRound
)

Decisions = list[Decision]


# ---------------------------------------------------------------------------------------- transitions


@dataclass(frozen=True, slots=True)
class BecomeUnattached:
    """Move to ``epoch`` with no leader known (``voted_id``: a vote cast in it)."""

    epoch: int
    voted_id: int = NO_LEADER


@dataclass(frozen=True, slots=True)
class BecomeFollower:
    """Follow ``leader_id`` at ``epoch`` (keeping this epoch's vote when the epoch does not change)."""

    leader_id: int
    epoch: int


@dataclass(frozen=True, slots=True)
class BecomeProspective:
    """Start a pre-vote for the next epoch (election or fetch timeout, or a lost candidacy's backoff)."""


@dataclass(frozen=True, slots=True)
class BecomeCandidate:
    """Won the pre-vote: bump the epoch and vote for ourselves."""


@dataclass(frozen=True, slots=True)
class BecomeLeader:
    """Won the vote of this epoch; ``granting_voters`` go into the LeaderChange record."""

    granting_voters: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class BecomeResigned:
    """Stop leading this epoch (check-quorum failed or a graceful resignation)."""


Transition = (
    BecomeUnattached | BecomeFollower | BecomeProspective | BecomeCandidate | BecomeLeader | BecomeResigned
)
