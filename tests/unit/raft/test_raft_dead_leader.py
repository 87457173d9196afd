"""Fast dead-leader detection on followers: refused fetches end the fetch timeout early (IO-free core)."""

from __future__ import annotations

from test_raft_core import (
    CLUSTER,
    ELECTION_MS,
    FETCH_TIMEOUT_MS,
    make_core,
    only_response,
    sent_requests,
    state_of,
)

from kraft.errors import ErrorCode
from kraft.raft.core import RaftCore
from kraft.raft.core_fetcher import UNREACHABLE_MIN_FAILURES
from kraft.raft.driver import is_unreachable
from kraft.raft.messages import (
    BeginQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import StateKind
from kraft.raft.transport import TransportError

GRACE_MS = (ELECTION_MS + ELECTION_MS // 2) // 2  # FixedRng: random election timeout = 1.5 T, halved


def _fetching_follower() -> tuple[RaftCore, int]:
    """Node 2, following leader 1 in epoch 1, has fetched once at t=2; returns the fetch in flight."""
    core = make_core(node_id=2)
    core.start(0)
    out = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 1, 2), 1)
    fetch = sent_requests(out, FetchRequest)[0]
    out = core.handle_response(fetch.correlation_id, FetchResponse(ErrorCode.NONE, "", 1, 1, 0, 0), 2)
    return core, sent_requests(out, FetchRequest)[0].correlation_id


def _fail_fetches(core: RaftCore, correlation_id: int, start_ms: int, *, unreachable: bool) -> int:
    """Fail the fetch in flight and each retry (20 ms apart), UNREACHABLE_MIN_FAILURES times."""
    now = start_ms
    for _ in range(UNREACHABLE_MIN_FAILURES):
        core.handle_send_failure(correlation_id, now, unreachable=unreachable)
        now += 20  # retry_backoff_ms
        retries = sent_requests(core.poll(now), FetchRequest)
        assert len(retries) == 1
        correlation_id = retries[0].correlation_id
    return now


def test_a_follower_refused_by_a_dead_leader_pre_votes_before_the_fetch_timeout() -> None:
    core, fetch = _fetching_follower()
    _fail_fetches(core, fetch, 10, unreachable=True)
    assert state_of(core) is StateKind.FOLLOWER
    out = core.poll(10 + GRACE_MS)
    assert 10 + GRACE_MS < 2 + FETCH_TIMEOUT_MS
    assert state_of(core) is StateKind.PROSPECTIVE
    pre_votes = sent_requests(out, VoteRequest)
    assert pre_votes and all(sent.request.pre_vote for sent in pre_votes)
    assert core.epoch == 1  # a pre-vote changes nothing until it wins


def test_timeouts_are_no_evidence_of_a_dead_leader() -> None:
    core, fetch = _fetching_follower()
    _fail_fetches(core, fetch, 10, unreachable=False)
    core.poll(10 + GRACE_MS)
    assert state_of(core) is StateKind.FOLLOWER
    core.poll(2 + FETCH_TIMEOUT_MS)
    assert state_of(core) is StateKind.PROSPECTIVE


def test_an_answer_from_the_leader_clears_the_evidence() -> None:
    core, fetch = _fetching_follower()
    core.handle_send_failure(fetch, 10, unreachable=True)
    core.handle_send_failure(-1, 11, unreachable=True)  # not the fetch in flight: ignored
    retry = sent_requests(core.poll(30), FetchRequest)[0]
    out = core.handle_response(retry.correlation_id, FetchResponse(ErrorCode.NONE, "", 1, 1, 0, 0), 31)
    nxt = sent_requests(out, FetchRequest)
    assert nxt
    _fail_fetches(core, nxt[0].correlation_id, 40, unreachable=False)
    core.poll(40 + GRACE_MS)
    assert state_of(core) is StateKind.FOLLOWER


def test_a_follower_refused_by_its_leader_grants_pre_votes_but_one_that_hears_from_it_does_not() -> None:
    core, fetch = _fetching_follower()
    pre_vote = VoteRequest(CLUSTER, 2, 3, 2, 0, 0, pre_vote=True)
    rejected = only_response(core.handle_request(7, pre_vote, 5)).response
    assert isinstance(rejected, VoteResponse) and not rejected.vote_granted
    now = _fail_fetches(core, fetch, 10, unreachable=True)
    granted = only_response(core.handle_request(8, pre_vote, now)).response
    assert isinstance(granted, VoteResponse) and granted.vote_granted
    assert core.epoch == 1 and state_of(core) is StateKind.FOLLOWER  # granting changed nothing


def test_only_refused_or_reset_connections_count_as_unreachable() -> None:
    assert is_unreachable(TransportError(1, "UNAVAILABLE: failed to connect to all addresses"))
    assert is_unreachable(TransportError(1, "fetch stream closed: EOF"))
    assert not is_unreachable(TransportError(1, "DEADLINE_EXCEEDED: fetch stream round trip"))
    assert not is_unreachable(TransportError(1, "in backoff after 3 failed calls"))
