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
    MAX_EPOCH,
    NO_LEADER,
    BeginQuorumEpochRequest,
    DescribeQuorumRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    RaftRequest,
    RaftResponse,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import ElectionState, StateKind
from kraft.raft.voters import VoterSetHistory

RequestError = tuple[ErrorCode, str]
"""An error code and message to answer a request with."""

_REQUEST_ERRORS = frozenset(
    {
        ErrorCode.INCONSISTENT_CLUSTER_ID,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INCONSISTENT_VOTER_SET,
        ErrorCode.INVALID_VOTER_KEY,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    }
)
"""Answers that say our request was wrong: retry after the backoff, learn nothing from them."""

_LEADERLESS_STATES = frozenset({StateKind.UNATTACHED, StateKind.PROSPECTIVE, StateKind.CANDIDATE})


# ------------------------------------------------------------------------------ every request


def claimed_sender(request: RaftRequest) -> int | None:
    """The node id a request says it comes from (None for DescribeQuorum, which admin tools send)."""
    if isinstance(request, VoteRequest):
        return request.candidate_id
    if isinstance(request, BeginQuorumEpochRequest | EndQuorumEpochRequest):
        return request.leader_id
    if isinstance(request, DescribeQuorumRequest):
        return None
    return request.replica_id


def sender_error(request: RaftRequest, config: RaftConfig, peer_id: int | None) -> RequestError | None:
    """Who may send this request: never "us" (we never send to ourselves, so such a request is forged),
    and, when the transport authenticated the peer (mTLS), only the node the request names.

    ``peer_id`` None means an unauthenticated (plaintext) peer: then anyone who can reach the port can
    claim any voter id, exactly as in Kafka or etcd without TLS; the epoch, voter-set and live-leader
    rules below still apply."""
    sender = claimed_sender(request)
    if sender is None:
        return None
    if sender == config.node_id:
        return ErrorCode.INVALID_REQUEST, f"request claims to come from this node ({sender})"
    if peer_id is not None and peer_id != sender:
        return ErrorCode.INVALID_REQUEST, f"peer authenticated as node {peer_id} claims to be node {sender}"
    return None


def epoch_bound_error(request_epoch: int, epoch: int, config: RaftConfig) -> RequestError | None:
    """An epoch we must never adopt: past :data:`MAX_EPOCH` (it could not be bumped and encoded) or more
    than ``max_epoch_jump`` ahead of ours (one election moves it by one).  Checked before anything is
    persisted, so a forged epoch cannot reach quorum-state."""
    if request_epoch > MAX_EPOCH:
        return ErrorCode.INVALID_REQUEST, f"epoch {request_epoch} is beyond the maximum {MAX_EPOCH}"
    if request_epoch - epoch > config.max_epoch_jump:
        message = f"epoch {request_epoch} is more than {config.max_epoch_jump} past our epoch {epoch}"
        return ErrorCode.INVALID_REQUEST, message
    return None


# ------------------------------------------------------------------------------ Vote


def voter_key_error(directory_id: str, config: RaftConfig) -> RequestError | None:
    """KIP-853: a Vote or BeginQuorumEpoch names the receiver's directory id as the sender's voter set
    knows it; a receiver with another one (its disk was wiped and reformatted) is not that voter."""
    if directory_id and directory_id != config.directory_id:
        return ErrorCode.INVALID_VOTER_KEY, f"directory id {directory_id} is not ours"
    return None


def vote_request_error(
    request: VoteRequest, config: RaftConfig, epoch: int, *, voters: VoterSetHistory | None = None
) -> RequestError | None:
    """Why a (pre-)vote request must be refused with an error before its log is even compared.

    With a static voter set (``voters`` None or kraft.version 0) candidate and receiver must both be
    voters.  With a dynamic one (KIP-853) neither is required: a voter set is in force as soon as it is
    in a log, so a newly added voter may campaign before the receiver has replicated its addition, and
    the candidate counts only the votes of its own voter set — but the receiver must be the replica the
    candidate asked (:func:`voter_key_error`), and a candidate that is a voter here only under another
    directory id is refused."""
    if (
        request.candidate_id < 0
        or request.last_offset < 0
        or request.last_offset_epoch < 0
        or request.last_offset_epoch >= request.candidate_epoch
    ):
        return ErrorCode.INVALID_REQUEST, "invalid vote request"
    if request.voter_id != config.node_id:
        return ErrorCode.INCONSISTENT_VOTER_SET, "candidate or receiver is not a voter"
    if voters is None or voters.static:
        voter_ids = voters.latest.ids if voters is not None else config.voters
        is_voter = config.node_id in voter_ids
        if not is_voter or request.candidate_id not in voter_ids:
            return ErrorCode.INCONSISTENT_VOTER_SET, "candidate or receiver is not a voter"
    else:
        candidate = voters.latest.get(request.candidate_id)
        if candidate is not None and not candidate.matches(
            request.candidate_id, request.candidate_directory_id
        ):
            message = f"candidate {request.candidate_id} is a voter with another directory id"
            return ErrorCode.INVALID_VOTER_KEY, message
    key_error = voter_key_error(request.voter_directory_id, config)
    if key_error is not None:
        return key_error
    if request.candidate_epoch < epoch:
        return ErrorCode.FENCED_LEADER_EPOCH, "stale candidate epoch"
    return epoch_bound_error(request.candidate_epoch, epoch, config)


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
    request: BeginQuorumEpochRequest | EndQuorumEpochRequest,
    config: RaftConfig,
    epoch: int,
    *,
    voters: VoterSetHistory | None = None,
) -> RequestError | None:
    """Shared checks of BeginQuorumEpoch and EndQuorumEpoch: addressed to us, not stale, and — with a
    static voter set — from a voter.  A dynamic voter set (KIP-853) may lag the leader's: a new voter
    that leads before our log holds its addition must still be followed."""
    static = voters is None or voters.static
    voter_ids = config.voters if voters is None else voters.latest.ids
    if request.voter_id != config.node_id or (static and request.leader_id not in voter_ids):
        return ErrorCode.INCONSISTENT_VOTER_SET, "leader or receiver is not a voter"
    if isinstance(request, BeginQuorumEpochRequest):
        key_error = voter_key_error(request.voter_directory_id, config)
        if key_error is not None:
            return key_error
    if request.leader_epoch < epoch:
        return ErrorCode.FENCED_LEADER_EPOCH, "stale leader epoch"
    if isinstance(request, EndQuorumEpochRequest):
        successors = request.preferred_successors
        # A resigning leader lists the other voters once each; anything else is not from a leader.
        if len(set(successors)) != len(successors) or (static and not set(successors) <= set(voter_ids)):
            return ErrorCode.INVALID_REQUEST, "preferred successors must be distinct voters"
    return epoch_bound_error(request.leader_epoch, epoch, config)


# ------------------------------------------------------------------------------ leader-only requests


def fetch_request_error(request: FetchRequest | FetchSnapshotRequest) -> RequestError | None:
    """Malformed Fetch / FetchSnapshot requests."""
    if request.replica_id < 0 or request.current_leader_epoch > MAX_EPOCH:
        return ErrorCode.INVALID_REQUEST, "invalid replica id or leader epoch"
    if isinstance(request, FetchRequest):
        if (
            request.fetch_offset < 0
            or request.last_fetched_epoch < 0
            or request.current_leader_epoch < 0
            or request.last_fetched_epoch > request.current_leader_epoch
            or request.max_bytes <= 0
            or request.max_wait_ms < 0
            or request.read_round < 0
        ):
            return ErrorCode.INVALID_REQUEST, "invalid fetch request"
        return None
    snapshot_id = request.snapshot_id
    if (
        request.position < 0
        or request.max_bytes <= 0
        or request.current_leader_epoch < 0
        or snapshot_id.end_offset < 0
        or not 0 <= snapshot_id.epoch <= MAX_EPOCH
    ):
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
    response: RaftResponse,
    epoch: int,
    node_id: int,
    known_leader: int,
    state: StateKind,
    config: RaftConfig | None = None,
    *,
    voters: VoterSetHistory | None = None,
) -> ResponseVerdict:
    """Apply the rules every response follows before its own handler sees it.

    With ``config``, a response naming a leader that is no voter (of a static voter set: a dynamic one
    may lag the leader's), or an epoch we must never adopt (:func:`epoch_bound_error`), is dropped
    whole: it moves nothing and persists nothing."""
    if response.error_code in _REQUEST_ERRORS:
        return ResponseVerdict(usable=False)
    leader = response.leader_id
    static = voters is None or voters.static
    voter_ids = voters.latest.ids if voters is not None else config.voters if config is not None else ()
    if config is not None and (
        (leader != NO_LEADER and static and leader not in voter_ids)
        or epoch_bound_error(response.leader_epoch, epoch, config) is not None
    ):
        return ResponseVerdict(usable=False)
    if response.leader_epoch > epoch:
        if leader not in (NO_LEADER, node_id):
            return ResponseVerdict(False, BecomeFollower(leader, response.leader_epoch))
        return ResponseVerdict(False, BecomeUnattached(response.leader_epoch))
    if response.leader_epoch < epoch:
        # A pre-vote answer from a voter still at an older epoch counts; so does a refused standard vote
        # from a voter that protects a live leader (it answers at its own, older epoch without adopting
        # ours — see :func:`protects_live_leader`); nothing else does.
        usable = isinstance(response, VoteResponse) and (response.pre_vote or not response.vote_granted)
        return ResponseVerdict(usable=usable)
    if leader not in (NO_LEADER, node_id, known_leader) and state in _LEADERLESS_STATES:
        # Same epoch, a leader we did not know: follow it (this is how observers find the leader).
        usable = response.error_code is ErrorCode.NONE and isinstance(response, FetchResponse)
        return ResponseVerdict(usable, BecomeFollower(leader, epoch))
    return ResponseVerdict(usable=True)
