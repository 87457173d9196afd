"""Issue #15: what a forged or buggy peer sends is refused by the IO-free core, and changes nothing.

Each attack measured against a live cluster is replayed here against a core: a forged Vote (from a voter
and from a non-voter), forged BeginQuorumEpoch / EndQuorumEpoch, a Fetch impersonating another voter
under an authenticated identity, epochs near the int32 limit.  Each asserts: refused, no leader change,
no persisted election-state change, high watermark unaffected.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_raft_core import CLUSTER, FETCH_TIMEOUT_MS, elect, log_with, make_core, only_response, sent_requests

from kraft.errors import ErrorCode
from kraft.raft.core import RaftCore
from kraft.raft.core_log import LogMeta
from kraft.raft.core_rules import common_response_verdict, epoch_bound_error, sender_error
from kraft.raft.core_types import RaftConfig
from kraft.raft.messages import (
    INT32_MAX,
    MAX_EPOCH,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    DescribeQuorumResponse,
    EndQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import ElectionState, StateKind

CONFIG = RaftConfig(node_id=1, voters=(1, 2, 3), cluster_id=CLUSTER)


def _fetching_follower() -> tuple[RaftCore, int, int]:
    """Node 2 follows leader 1 in epoch 1 and has fetched from it at t=2; returns the time and the
    correlation id of its next fetch (in flight)."""
    core = make_core(node_id=2)
    core.start(0)
    out = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 1, 2), 1)
    fetch = sent_requests(out, FetchRequest)[0]
    out = core.handle_response(fetch.correlation_id, FetchResponse(ErrorCode.NONE, "", 1, 1, 0, 0), 2)
    assert core.state is StateKind.FOLLOWER
    return core, 3, sent_requests(out, FetchRequest)[0].correlation_id


def _follower() -> tuple[RaftCore, int]:
    core, now, _ = _fetching_follower()
    return core, now


def _leader() -> tuple[RaftCore, int]:
    """Node 1 leads epoch 4 with its LeaderChange at offset 10 flushed, nobody fetched yet."""
    core = make_core(election=ElectionState(3), log=log_with([(1, 0), (3, 5)], 10))
    now = elect(core)
    core.on_flushed(11, now)
    return core, now


def _unchanged(core: RaftCore, state: StateKind, election: ElectionState, hwm: int) -> None:
    assert core.state is state
    assert core.election == election
    assert core.persisted_election == election
    assert core.high_watermark == hwm


def _answer(core: RaftCore, request: object, now: int, peer_id: int | None = None) -> object:
    out = core.handle_request(99, request, now, peer_id=peer_id)  # type: ignore[arg-type]
    assert out.election_state is None, "a refused request must not persist anything"
    return only_response(out).response


# --------------------------------------------------------------------------- forged votes


def test_a_follower_of_a_live_leader_refuses_a_forged_vote_without_adopting_its_epoch() -> None:
    core, now = _follower()
    before = core.election
    response = _answer(core, VoteRequest(CLUSTER, 2, 3, 2, 0, 0), now)
    assert isinstance(response, VoteResponse)
    assert not response.vote_granted and response.error_code is ErrorCode.NONE
    assert (response.leader_id, response.leader_epoch) == (1, 1)  # the candidate learns who leads
    _unchanged(core, StateKind.FOLLOWER, before, 0)


def test_a_forged_pre_vote_is_refused_too() -> None:
    core, now = _follower()
    before = core.election
    response = _answer(core, VoteRequest(CLUSTER, 2, 3, 2, 0, 0, pre_vote=True), now)
    assert isinstance(response, VoteResponse) and not response.vote_granted
    _unchanged(core, StateKind.FOLLOWER, before, 0)


def test_a_vote_from_a_non_voter_is_refused() -> None:
    core, now = _follower()
    before = core.election
    response = _answer(core, VoteRequest(CLUSTER, 2, 7, 2, 0, 0), now)
    assert isinstance(response, VoteResponse) and response.error_code is ErrorCode.INCONSISTENT_VOTER_SET
    _unchanged(core, StateKind.FOLLOWER, before, 0)


def test_a_live_leader_is_not_deposed_by_a_forged_vote() -> None:
    core, now = _leader()
    core.handle_request(1, FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=0), now)
    assert core.high_watermark == 11
    before = core.election
    for epoch in (5, 6, 100):  # issue #15: six forged votes moved the epoch 4 → 16
        response = _answer(core, VoteRequest(CLUSTER, epoch, 2, 1, 4, 11), now + 1)
        assert isinstance(response, VoteResponse) and not response.vote_granted
    _unchanged(core, StateKind.LEADER, before, 11)


def test_a_leader_that_lost_its_quorum_no_longer_protects_itself() -> None:
    core, now = _leader()
    later = now + FETCH_TIMEOUT_MS * 3 // 2
    core.poll(later)  # check-quorum: nobody fetched, the leader resigns
    assert core.state is StateKind.RESIGNED
    out = core.handle_request(1, VoteRequest(CLUSTER, 5, 2, 1, 4, 11), later)
    assert core.epoch == 5 and out.election_state is not None


def test_a_graceful_handover_still_gets_its_vote() -> None:
    core, now = _follower()
    now = core.config.vote_protection_ms + 1  # past the vote protection after start (the lease's)
    core.handle_request(1, EndQuorumEpochRequest(CLUSTER, 1, 1, 2, (3, 2)), now)
    out = core.handle_request(2, VoteRequest(CLUSTER, 2, 3, 2, 0, 0), now + 1)
    response = only_response(out).response
    assert isinstance(response, VoteResponse) and response.vote_granted
    assert out.election_state == ElectionState(2, -1, 3)


def test_a_refused_standard_vote_counts_as_a_rejection_for_the_candidate() -> None:
    refusal = VoteResponse(ErrorCode.NONE, "leader 1 is live", 1, 1, False, False)
    verdict = common_response_verdict(refusal, 2, 3, -1, StateKind.CANDIDATE, CONFIG)
    assert verdict.usable and verdict.transition is None
    forged_grant = VoteResponse(ErrorCode.NONE, "", 1, 1, True, False)
    assert not common_response_verdict(forged_grant, 2, 3, -1, StateKind.CANDIDATE, CONFIG).usable


# --------------------------------------------------------------------------- forged Begin/EndQuorumEpoch


@pytest.mark.parametrize("kind", [BeginQuorumEpochRequest, EndQuorumEpochRequest])
def test_begin_and_end_quorum_epoch_under_another_identity_are_refused(
    kind: type[BeginQuorumEpochRequest] | type[EndQuorumEpochRequest],
) -> None:
    core, now = _follower()
    before = core.election
    response = _answer(core, kind(CLUSTER, 3, 2, 2), now, peer_id=1)
    assert response.error_code is ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    _unchanged(core, StateKind.FOLLOWER, before, 0)
    assert not core._fetcher.leader_resigned  # type: ignore[union-attr]


@pytest.mark.parametrize("kind", [BeginQuorumEpochRequest, EndQuorumEpochRequest])
def test_begin_and_end_quorum_epoch_from_a_non_voter_or_naming_us_are_refused(
    kind: type[BeginQuorumEpochRequest] | type[EndQuorumEpochRequest],
) -> None:
    core, now = _follower()
    before = core.election
    for leader_id, code in ((9, ErrorCode.INCONSISTENT_VOTER_SET), (2, ErrorCode.INVALID_REQUEST)):
        response = _answer(core, kind(CLUSTER, leader_id, 2, 2), now)
        assert response.error_code is code  # type: ignore[attr-defined]
    _unchanged(core, StateKind.FOLLOWER, before, 0)


def test_end_quorum_epoch_with_bogus_successors_is_refused() -> None:
    core, now = _follower()
    before = core.election
    for successors in ((2, 2), (2, 9)):
        response = _answer(core, EndQuorumEpochRequest(CLUSTER, 1, 1, 2, successors), now)
        assert response.error_code is ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    _unchanged(core, StateKind.FOLLOWER, before, 0)


# --------------------------------------------------------------------------- epochs and offsets


@pytest.mark.parametrize("epoch", [INT32_MAX, MAX_EPOCH + 1, 1 + (1 << 20) + 1])
def test_huge_epochs_are_refused_before_they_reach_quorum_state(epoch: int) -> None:
    core = make_core(node_id=2)
    core.start(0)
    before = core.election
    requests = [
        VoteRequest(CLUSTER, epoch, 3, 2, 0, 0),
        VoteRequest(CLUSTER, epoch, 3, 2, 0, 0, pre_vote=True),
        BeginQuorumEpochRequest(CLUSTER, 1, epoch, 2),
        EndQuorumEpochRequest(CLUSTER, 1, epoch, 2, (2, 3)),
    ]
    for request in requests:
        response = _answer(core, request, 1)
        assert response.error_code is ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    _unchanged(core, StateKind.UNATTACHED, before, 0)


def test_a_response_with_a_huge_epoch_is_dropped() -> None:
    core, now, fetch = _fetching_follower()
    before = core.election
    out = core.handle_response(fetch, FetchResponse(ErrorCode.NONE, "", 3, INT32_MAX), now)
    assert out.election_state is None
    _unchanged(core, StateKind.FOLLOWER, before, 0)
    for bad in (FetchResponse(ErrorCode.NONE, "", 3, MAX_EPOCH + 1), FetchResponse(ErrorCode.NONE, "", 9, 2)):
        assert not common_response_verdict(bad, 1, 2, 1, StateKind.FOLLOWER, CONFIG).usable


def test_epoch_bound_rule() -> None:
    assert epoch_bound_error(5, 4, CONFIG) is None
    assert epoch_bound_error(4 + CONFIG.max_epoch_jump, 4, CONFIG) is None
    assert epoch_bound_error(5 + CONFIG.max_epoch_jump, 4, CONFIG) is not None
    assert epoch_bound_error(MAX_EPOCH + 1, MAX_EPOCH, CONFIG) is not None
    # A candidate at the highest accepted epoch can still encode its next vote request.
    assert MAX_EPOCH + 1 <= INT32_MAX


@pytest.mark.parametrize(
    "election", [ElectionState(INT32_MAX), ElectionState(MAX_EPOCH + 2, 2, 2), ElectionState(-1)]
)
def test_an_impossible_stored_epoch_is_a_clear_startup_error(election: ElectionState) -> None:
    with pytest.raises(ValueError, match="impossible epoch") as info:
        make_core(election=election)
    assert "\n" not in str(info.value)


def test_an_impossible_log_epoch_is_a_clear_startup_error() -> None:
    with pytest.raises(ValueError, match="impossible epoch"):
        make_core(log=LogMeta(0, 5, 5, log_with([(INT32_MAX, 0)], 5).epochs))


@pytest.mark.parametrize(
    "request_",
    [
        FetchRequest(CLUSTER, -5, 4, 11, 4),
        FetchRequest(CLUSTER, 2, MAX_EPOCH + 1, 11, 4),
        FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=-1),
        FetchSnapshotRequest(CLUSTER, 2, 4, SnapshotId(-1, 1), 0),
        FetchSnapshotRequest(CLUSTER, 2, 4, SnapshotId(5, INT32_MAX), 0),
    ],
)
def test_malformed_leader_requests_are_refused(request_: FetchRequest | FetchSnapshotRequest) -> None:
    core, now = _leader()
    response = _answer(core, request_, now)
    assert response.error_code is ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert core.high_watermark == 0


# --------------------------------------------------------------------------- identity and the HWM


def test_a_fetch_impersonating_another_voter_is_refused_and_never_counted() -> None:
    core, now = _leader()
    before = core.election
    response = _answer(core, FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=0), now, peer_id=3)
    assert response.error_code is ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    _unchanged(core, StateKind.LEADER, before, 0)
    described = core.describe_quorum(now)
    assert [r.log_end_offset for r in described.current_voters if r.replica_id == 2] == [-1]
    # The same fetch from the voter it names counts.
    core.handle_request(2, FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=0), now, peer_id=2)
    assert core.high_watermark == 11


def test_a_fetch_claiming_to_be_the_leader_itself_is_refused() -> None:
    core, now = _leader()
    response = _answer(core, FetchRequest(CLUSTER, 1, 4, 11, 4, max_wait_ms=0), now)
    assert response.error_code is ErrorCode.INVALID_REQUEST  # type: ignore[attr-defined]
    assert core.high_watermark == 0


def test_sender_rule() -> None:
    fetch = FetchRequest(CLUSTER, 2, 4, 11, 4)
    assert sender_error(fetch, CONFIG, None) is None  # plaintext: anyone may claim a voter id
    assert sender_error(fetch, CONFIG, 2) is None
    assert sender_error(fetch, CONFIG, 3) is not None
    assert sender_error(VoteRequest(CLUSTER, 2, 1, 1, 0, 0), CONFIG, None) is not None


@pytest.mark.parametrize("cluster_id", ["", "other"])
def test_an_empty_or_wrong_cluster_id_is_refused(cluster_id: str) -> None:
    core, now = _leader()
    response = _answer(core, FetchRequest(cluster_id, 2, 4, 11, 4, max_wait_ms=0), now)
    assert response.error_code is ErrorCode.INCONSISTENT_CLUSTER_ID  # type: ignore[attr-defined]
    assert core.high_watermark == 0


_FORGED_FETCH = st.builds(
    FetchRequest,
    st.just(CLUSTER),
    st.integers(-3, 40),  # replica ids, voters 1-3 included
    st.integers(-1, 6),
    st.integers(-1, 1 << 40),
    st.integers(-1, 6),
    st.just(0),
    st.integers(-1, 1 << 20),
)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(_FORGED_FETCH, st.sampled_from([None, 4, 5, 6])), max_size=25))
def test_forged_fetches_never_move_the_high_watermark(forged: list[tuple[FetchRequest, int | None]]) -> None:
    """Fetches from non-voters (unauthenticated), and fetches naming any replica from a peer authenticated
    as a non-voter, never advance the HWM — whatever their offsets and epochs."""
    core, now = _leader()
    for request_id, (request, peer_id) in enumerate(forged):
        if peer_id is None and request.replica_id in core.voters:
            continue  # plaintext claims of a voter id are indistinguishable from the voter (documented)
        core.handle_request(request_id, request, now, peer_id=peer_id)
        assert core.high_watermark == 0
        assert core.state is StateKind.LEADER and core.epoch == 4


# --------------------------------------------------------------------------- observers


def test_observers_are_bounded_and_forgotten() -> None:
    core = make_core(election=ElectionState(3), log=log_with([(1, 0), (3, 5)], 10), max_observers=3)
    now = elect(core)
    for observer in range(10, 20):
        core.handle_request(observer, FetchRequest(CLUSTER, observer, 4, 11, 4, max_wait_ms=0), now)
    described = core.describe_quorum(now)
    assert isinstance(described, DescribeQuorumResponse)
    assert [o.replica_id for o in described.observers] == [10, 11, 12]
    later = now + core.config.observer_forget_ms + 1
    core.handle_request(99, FetchRequest(CLUSTER, 50, 4, 11, 4, max_wait_ms=0), later)
    assert [o.replica_id for o in core.describe_quorum(later).observers] == [50]


# ------------------------------------------------------------------- a voter stranded at a higher epoch


def test_a_live_leader_re_announces_itself_to_a_silent_voter_and_steps_down_on_its_higher_epoch() -> None:
    core, now = _leader()
    for voter in (2, 3):
        core.handle_request(voter, FetchRequest(CLUSTER, voter, 4, 11, 4, max_wait_ms=0), now)
    core.handle_request(4, FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=0), now + FETCH_TIMEOUT_MS - 10)
    later = now + FETCH_TIMEOUT_MS  # voter 3 fetched at `now`, silent since
    announcements = sent_requests(core.poll(later), BeginQuorumEpochRequest)
    assert [sent.dest for sent in announcements] == [3]
    fenced = BeginQuorumEpochResponse(ErrorCode.FENCED_LEADER_EPOCH, "stale leader epoch", -1, 5)
    core.handle_response(announcements[0].correlation_id, fenced, later)
    assert core.state is StateKind.UNATTACHED and core.epoch == 5
