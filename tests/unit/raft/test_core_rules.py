"""KRaft's request/response rules (core_rules) and the in-flight request table, without a core."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kraft.errors import ErrorCode
from kraft.raft.core_decisions import BecomeFollower, BecomeUnattached
from kraft.raft.core_inflight import InflightRequests
from kraft.raft.core_rules import (
    ResponseVerdict,
    common_response_verdict,
    fetch_request_error,
    leader_epoch_error,
    may_grant_pre_vote,
    may_grant_vote,
    quorum_epoch_request_error,
    vote_request_error,
)
from kraft.raft.core_timers import NEVER_MS
from kraft.raft.core_types import RaftConfig
from kraft.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    RaftResponse,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import ElectionState, StateKind

CONFIG = RaftConfig(node_id=1, voters=(1, 2, 3), cluster_id="c1")
OBSERVER = RaftConfig(node_id=9, voters=(1, 2, 3), cluster_id="c1")


# --------------------------------------------------------------------------- requests


@pytest.mark.parametrize(
    ("config", "request_", "expected"),
    [
        (CONFIG, VoteRequest("c1", 3, 2, 1, 2, 10), None),
        (CONFIG, VoteRequest("c1", 3, 2, 1, 3, 10), ErrorCode.INVALID_REQUEST),  # log epoch >= its epoch
        (CONFIG, VoteRequest("c1", 3, -1, 1, 2, 10), ErrorCode.INVALID_REQUEST),
        (CONFIG, VoteRequest("c1", 3, 2, 1, 2, -1), ErrorCode.INVALID_REQUEST),
        (CONFIG, VoteRequest("c1", 3, 7, 1, 2, 10), ErrorCode.INCONSISTENT_VOTER_SET),  # candidate no voter
        (CONFIG, VoteRequest("c1", 3, 2, 3, 2, 10), ErrorCode.INCONSISTENT_VOTER_SET),  # addressed to 3
        (OBSERVER, VoteRequest("c1", 3, 2, 9, 2, 10), ErrorCode.INCONSISTENT_VOTER_SET),
        (CONFIG, VoteRequest("c1", 2, 2, 1, 1, 10), ErrorCode.FENCED_LEADER_EPOCH),
    ],
)
def test_vote_request_errors(config: RaftConfig, request_: VoteRequest, expected: ErrorCode | None) -> None:
    error = vote_request_error(request_, config, epoch=3)
    assert (error[0] if error else None) is expected


def test_begin_and_end_quorum_epoch_share_their_checks() -> None:
    for make in (BeginQuorumEpochRequest, EndQuorumEpochRequest):
        assert quorum_epoch_request_error(make("c1", 2, 5, 1), CONFIG, 5) is None
        stale = quorum_epoch_request_error(make("c1", 2, 4, 1), CONFIG, 5)
        wrong_leader = quorum_epoch_request_error(make("c1", 7, 5, 1), CONFIG, 5)
        wrong_receiver = quorum_epoch_request_error(make("c1", 2, 5, 3), CONFIG, 5)
        assert stale is not None and stale[0] is ErrorCode.FENCED_LEADER_EPOCH
        assert wrong_leader is not None and wrong_leader[0] is ErrorCode.INCONSISTENT_VOTER_SET
        assert wrong_receiver is not None and wrong_receiver[0] is ErrorCode.INCONSISTENT_VOTER_SET


@pytest.mark.parametrize(
    "request_",
    [
        FetchRequest("c1", 2, 4, -1, 1),
        FetchRequest("c1", 2, 4, 3, 5),  # last fetched epoch newer than the leader epoch it names
        FetchRequest("c1", 2, 4, 3, 1, 0, 0),
        FetchSnapshotRequest("c1", 2, 4, SnapshotId(5, 1), -1),
        FetchSnapshotRequest("c1", 2, 4, SnapshotId(5, 1), 0, 0),
    ],
)
def test_malformed_fetches_are_invalid(request_: FetchRequest | FetchSnapshotRequest) -> None:
    error = fetch_request_error(request_)
    assert error is not None and error[0] is ErrorCode.INVALID_REQUEST


def test_leader_only_requests_need_our_epoch_and_our_leadership() -> None:
    assert leader_epoch_error(4, 4, True, 1) is None
    codes = [
        leader_epoch_error(3, 4, True, 1),
        leader_epoch_error(5, 4, True, 1),
        leader_epoch_error(4, 4, False, 1),
    ]
    assert [error[0] if error else None for error in codes] == [
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
    ]


# --------------------------------------------------------------------------- votes


@given(
    st.sampled_from(list(StateKind)),
    st.integers(-1, 4),
    st.integers(-1, 4),
    st.integers(0, 4),
)
def test_at_most_one_vote_per_epoch_and_none_once_a_leader_is_known(
    state: StateKind, leader_id: int, voted_id: int, candidate_id: int
) -> None:
    election = ElectionState(3, leader_id, voted_id)
    granted = may_grant_vote(state, election, candidate_id)
    if granted:
        assert state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE)
        assert leader_id == NO_LEADER
        assert voted_id in (NO_LEADER, candidate_id)  # a repeated request for the same vote is granted again


def test_pre_votes_are_refused_by_leaders_and_by_followers_protecting_a_live_leader() -> None:
    assert not may_grant_pre_vote(StateKind.LEADER, follower_protects_leader=False)
    assert not may_grant_pre_vote(StateKind.FOLLOWER, follower_protects_leader=True)
    assert may_grant_pre_vote(StateKind.FOLLOWER, follower_protects_leader=False)
    for state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE, StateKind.CANDIDATE, StateKind.RESIGNED):
        assert may_grant_pre_vote(state, follower_protects_leader=True)


# --------------------------------------------------------------------------- the shared response rules


def verdict(
    response: RaftResponse, state: StateKind = StateKind.FOLLOWER, leader: int = 2
) -> ResponseVerdict:
    return common_response_verdict(response, epoch=5, node_id=1, known_leader=leader, state=state)


def test_a_higher_epoch_in_any_response_moves_the_node_there_and_drops_the_payload() -> None:
    assert verdict(FetchResponse(ErrorCode.NONE, "", 3, 6)) == ResponseVerdict(False, BecomeFollower(3, 6))
    assert verdict(FetchResponse(ErrorCode.NONE, "", -1, 6)) == ResponseVerdict(False, BecomeUnattached(6))
    assert verdict(FetchResponse(ErrorCode.NONE, "", 1, 6)) == ResponseVerdict(False, BecomeUnattached(6))


def test_an_older_epoch_is_ignored_except_for_pre_vote_answers() -> None:
    assert verdict(FetchResponse(ErrorCode.NONE, "", 2, 4)) == ResponseVerdict(False)
    assert verdict(VoteResponse(ErrorCode.NONE, "", -1, 4, True, False)) == ResponseVerdict(False)
    assert verdict(VoteResponse(ErrorCode.NONE, "", -1, 4, True, True)) == ResponseVerdict(True)


def test_a_leaderless_node_follows_a_leader_it_learns_at_its_own_epoch() -> None:
    fetched = FetchResponse(ErrorCode.NONE, "", 3, 5)
    for state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE, StateKind.CANDIDATE):
        assert verdict(fetched, state, NO_LEADER) == ResponseVerdict(True, BecomeFollower(3, 5))
        # only a successful Fetch answer is worth processing after the transition
        other = BeginQuorumEpochResponse(ErrorCode.NONE, "", 3, 5)
        assert verdict(other, state, NO_LEADER) == ResponseVerdict(False, BecomeFollower(3, 5))
    assert verdict(fetched, StateKind.FOLLOWER, 2) == ResponseVerdict(True)


@pytest.mark.parametrize(
    "code",
    [
        ErrorCode.INCONSISTENT_CLUSTER_ID,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INCONSISTENT_VOTER_SET,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    ],
)
def test_an_answer_that_blames_our_request_teaches_nothing(code: ErrorCode) -> None:
    assert verdict(FetchResponse(code, "", 3, 9)) == ResponseVerdict(False)


# --------------------------------------------------------------------------- in-flight requests


def test_correlation_ids_keep_counting_across_a_clear_so_late_answers_are_never_confused() -> None:
    inflight = InflightRequests()
    request = FetchRequest("c1", 1, 4, 0, 0)
    first = inflight.add(2, request, 100)
    inflight.clear()
    second = inflight.add(2, request, 100)
    assert second > first and inflight.pop(first) is None
    assert inflight.pop(second) is not None


def test_expired_requests_leave_the_table_oldest_first() -> None:
    inflight = InflightRequests()
    request = FetchRequest("c1", 1, 4, 0, 0)
    ids = [inflight.add(2, request, deadline) for deadline in (30, 10, 50)]
    assert inflight.next_deadline_ms() == 10
    assert [cid for cid, _ in inflight.pop_expired(30)] == ids[:2]
    assert inflight.next_deadline_ms() == 50
    inflight.clear()
    assert inflight.next_deadline_ms() == NEVER_MS
