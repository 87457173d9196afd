"""KRaft's request and response rules as pure functions: what the core must answer or become.

Each rule takes the few values it reads and returns a verdict (an error to answer, whether a vote may be
granted, which transition a response forces); :class:`~kraft.raft.core.RaftCore` applies it.  Kept apart
so each rule can be tested without building a core.
"""

from __future__ import annotations

from dataclasses import dataclass

from kraft.errors import ErrorCode
from kraft.raft.core_decisions import BecomeFollower, BecomeUnattached
from kraft.raft.core_types import RaftConfig
from kraft.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    RaftResponse,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import ElectionState, StateKind

RequestError = tuple[ErrorCode, str]
"""An error code and message to answer a request with."""

_REQUEST_ERRORS = frozenset(
    {
        ErrorCode.INCONSISTENT_CLUSTER_ID,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INCONSISTENT_VOTER_SET,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    }
)
"""Answers that say our request was wrong: retry after the backoff, learn nothing from them."""

_LEADERLESS_STATES = frozenset({StateKind.UNATTACHED, StateKind.PROSPECTIVE, StateKind.CANDIDATE})


# ------------------------------------------------------------------------------ Vote


def vote_request_error(request: VoteRequest, config: RaftConfig, epoch: int) -> RequestError | None:
    """Why a (pre-)vote request must be refused with an error before its log is even compared."""
    if (
        request.candidate_id < 0
        or request.last_offset < 0
        or request.last_offset_epoch < 0
        or request.last_offset_epoch >= request.candidate_epoch
    ):
        return ErrorCode.INVALID_REQUEST, "invalid vote request"
    if not config.is_voter or request.voter_id != config.node_id or request.candidate_id not in config.voters:
        return ErrorCode.INCONSISTENT_VOTER_SET, "candidate or receiver is not a voter"
    if request.candidate_epoch < epoch:
        return ErrorCode.FENCED_LEADER_EPOCH, "stale candidate epoch"
    return None


def may_grant_pre_vote(state: StateKind, follower_protects_leader: bool) -> bool:
    """KIP-996: a leader never grants; a follower refuses while it protects a live leader."""
    if state is StateKind.LEADER:
        return False
    return not (state is StateKind.FOLLOWER and follower_protects_leader)


def may_grant_vote(state: StateKind, election: ElectionState, candidate_id: int) -> bool:
    """A standard vote (at the request's epoch, already adopted): at most one per epoch, none once a
    leader is known, and only from a node that is not campaigning past its pre-vote."""
    return (
        state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE)
        and not election.has_leader
        and election.voted_id in (NO_LEADER, candidate_id)
    )


# ------------------------------------------------------------------------------ Begin/EndQuorumEpoch


def quorum_epoch_request_error(
    request: BeginQuorumEpochRequest | EndQuorumEpochRequest, config: RaftConfig, epoch: int
) -> RequestError | None:
    """Shared checks of BeginQuorumEpoch and EndQuorumEpoch: addressed to us, from a voter, not stale."""
    if request.voter_id != config.node_id or request.leader_id not in config.voters:
        return ErrorCode.INCONSISTENT_VOTER_SET, "leader or receiver is not a voter"
    if request.leader_epoch < epoch:
        return ErrorCode.FENCED_LEADER_EPOCH, "stale leader epoch"
    return None


# ------------------------------------------------------------------------------ leader-only requests


def fetch_request_error(request: FetchRequest | FetchSnapshotRequest) -> RequestError | None:
    """Malformed Fetch / FetchSnapshot requests."""
    if isinstance(request, FetchRequest):
        if (
            request.fetch_offset < 0
            or request.last_fetched_epoch < 0
            or request.current_leader_epoch < 0
            or request.last_fetched_epoch > request.current_leader_epoch
            or request.max_bytes <= 0
        ):
            return ErrorCode.INVALID_REQUEST, "invalid fetch request"
        return None
    if request.position < 0 or request.max_bytes <= 0 or request.current_leader_epoch < 0:
        return ErrorCode.INVALID_REQUEST, "invalid fetch-snapshot request"
    return None


def leader_epoch_error(request_epoch: int, epoch: int, is_leader: bool, node_id: int) -> RequestError | None:
    """KRaft's answer to a leader-only request unless ``request_epoch`` is ours and we lead it."""
    if request_epoch < epoch:
        return ErrorCode.FENCED_LEADER_EPOCH, f"epoch {request_epoch} is older than {epoch}"
    if request_epoch > epoch:
        return ErrorCode.UNKNOWN_LEADER_EPOCH, f"epoch {request_epoch} is newer than {epoch}"
    if not is_leader:
        return ErrorCode.NOT_LEADER_OR_FOLLOWER, f"node {node_id} is not the leader"
    return None


# ------------------------------------------------------------------------------ responses


@dataclass(frozen=True, slots=True)
class ResponseVerdict:
    """What KRaft's shared response rules make of a response: an optional transition, and whether its
    payload may still be processed (``usable``) afterwards."""

    usable: bool
    transition: BecomeFollower | BecomeUnattached | None = None


def common_response_verdict(
    response: RaftResponse, epoch: int, node_id: int, known_leader: int, state: StateKind
) -> ResponseVerdict:
    """Apply the rules every response follows before its own handler sees it."""
    if response.error_code in _REQUEST_ERRORS:
        return ResponseVerdict(usable=False)
    leader = response.leader_id
    if response.leader_epoch > epoch:
        if leader not in (NO_LEADER, node_id):
            return ResponseVerdict(False, BecomeFollower(leader, response.leader_epoch))
        return ResponseVerdict(False, BecomeUnattached(response.leader_epoch))
    if response.leader_epoch < epoch:
        # A pre-vote answer from a voter still at an older epoch counts; nothing else does.
        return ResponseVerdict(usable=isinstance(response, VoteResponse) and response.pre_vote)
    if leader not in (NO_LEADER, node_id, known_leader) and state in _LEADERLESS_STATES:
        # Same epoch, a leader we did not know: follow it (this is how observers find the leader).
        usable = response.error_code is ErrorCode.NONE and isinstance(response, FetchResponse)
        return ResponseVerdict(usable, BecomeFollower(leader, epoch))
    return ResponseVerdict(usable=True)
