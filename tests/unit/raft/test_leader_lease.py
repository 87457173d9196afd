"""The leader lease on a manual clock (docs/internals/raft.md "Leader lease").

Leader side: the lease runs ``leader_lease_ms`` from the arrival of the Fetch that completed the latest
majority; none before a majority fetched in the epoch.  Voter side: a voter that sent its leader a Fetch
grants no standard vote in a higher epoch and does not campaign for ``vote_promise_ms`` after the send.
Together: a leader cut off from its quorum loses its lease before any other node can be elected.
"""

from __future__ import annotations

from test_raft_core import (
    CLUSTER,
    ELECTION_MS,
    FETCH_TIMEOUT_MS,
    elect,
    log_with,
    make_core,
    only_response,
    sent_requests,
    state_of,
)

from kraft.errors import ErrorCode
from kraft.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    FetchRequest,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import ElectionState, StateKind


def test_the_lease_math_follows_the_timeouts() -> None:
    core = make_core()
    # the fast dead-leader path waits at least half an election timeout: it bounds the promise
    assert core.config.vote_promise_ms == min(FETCH_TIMEOUT_MS, ELECTION_MS // 2) == 50
    assert core.config.leader_lease_ms == 25
    big = make_core(election_timeout_ms=10_000, fetch_timeout_ms=300)
    assert big.config.vote_promise_ms == 300 and big.config.leader_lease_ms == 150


def test_a_leader_holds_a_lease_only_after_a_majority_fetched_and_while_it_is_fresh() -> None:
    core = make_core(log=log_with([(1, 0)], 5), election=ElectionState(1))
    now = elect(core)
    assert core.is_leader
    assert core.leader_lease_until_ms == -1  # elected, but nobody fetched in this epoch yet
    core.handle_request(1, FetchRequest(CLUSTER, 2, core.epoch, 5, 1), now + 3)
    assert core.leader_lease_until_ms == now + 3 + core.config.leader_lease_ms
    # a later fetch from the other voter renews it from its own arrival
    core.handle_request(2, FetchRequest(CLUSTER, 3, core.epoch, 5, 1), now + 10)
    assert core.leader_lease_until_ms == now + 10 + core.config.leader_lease_ms
    # a non-voter's fetch counts for nothing
    core.handle_request(3, FetchRequest(CLUSTER, 9, core.epoch, 5, 1), now + 30)
    assert core.leader_lease_until_ms == now + 10 + core.config.leader_lease_ms
    # check-quorum (1.5 fetch timeouts) still holds long after the lease ran out
    core.poll(now + 10 + core.config.leader_lease_ms + 1)
    assert core.is_leader


def test_a_sole_voter_always_holds_its_lease_and_a_follower_never_does() -> None:
    sole = make_core(voters=(1,))
    sole.start(0)
    sole.poll(200)
    assert sole.is_leader and sole.leader_lease_until_ms > 10**12
    follower = make_core(node_id=2, election=ElectionState(3))
    follower.start(0)
    follower.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 4, 2), 1)
    assert follower.leader_lease_until_ms == -1


def test_a_voter_that_fetched_refuses_votes_until_its_promise_ends() -> None:
    core = make_core(node_id=2, election=ElectionState(3))
    core.start(0)
    out = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 4, 2), 10)
    assert sent_requests(out, FetchRequest)  # the Fetch went at 10: promise until 60
    promise_end = 10 + core.config.vote_promise_ms
    # Its fetch is lost (no answer): the fetch-timeout protection alone would not hold it back — it
    # has not fetched successfully from this leader yet.  The promise does.
    vote = VoteRequest(CLUSTER, 5, 3, 2, 4, 100)
    refused = only_response(core.handle_request(2, vote, promise_end - 1)).response
    assert isinstance(refused, VoteResponse) and not refused.vote_granted and core.epoch == 4
    granted = only_response(core.handle_request(3, vote, promise_end)).response
    assert isinstance(granted, VoteResponse) and granted.vote_granted and core.epoch == 5


def test_a_fetch_refused_as_unreachable_takes_its_promise_back() -> None:
    core = make_core(node_id=2, election=ElectionState(3))
    core.start(0)
    out = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 4, 2), 10)
    fetch = sent_requests(out, FetchRequest)[0]
    core.handle_send_failure(fetch.correlation_id, 12, unreachable=True)  # never reached the leader
    granted = only_response(core.handle_request(2, VoteRequest(CLUSTER, 5, 3, 2, 4, 100), 13)).response
    assert isinstance(granted, VoteResponse) and granted.vote_granted


def test_a_resigned_leader_releases_the_promise() -> None:
    core = make_core(node_id=2, election=ElectionState(3))
    core.start(0)
    core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 4, 2), 10)
    core.handle_request(2, EndQuorumEpochRequest(CLUSTER, 1, 4, 2, (2, 3)), 11)
    granted = only_response(core.handle_request(3, VoteRequest(CLUSTER, 5, 3, 2, 4, 100), 12)).response
    assert isinstance(granted, VoteResponse) and granted.vote_granted


def test_a_restarted_follower_keeps_the_promise_it_may_have_made() -> None:
    core = make_core(node_id=2, election=ElectionState(4, leader_id=1))
    core.start(100)
    assert state_of(core) is StateKind.FOLLOWER
    vote = VoteRequest(CLUSTER, 5, 3, 2, 4, 100)
    refused = only_response(core.handle_request(1, vote, 100 + core.config.vote_promise_ms - 1)).response
    assert isinstance(refused, VoteResponse) and not refused.vote_granted


def test_a_won_pre_vote_campaigns_only_when_the_promise_ends() -> None:
    core = make_core(node_id=2, election=ElectionState(3))
    core.start(0)
    out = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 4, 2), 10)
    fetch = sent_requests(out, FetchRequest)[0]
    # Just before the fetch timeout (10 + 200) the fetch times out — it may have reached the leader —
    # and the retry goes out: that retry's promise outlives the fetch timeout.
    failed_at = 185
    core.handle_send_failure(fetch.correlation_id, failed_at)
    retry_at = failed_at + core.config.retry_backoff_ms
    assert sent_requests(core.poll(retry_at), FetchRequest)
    promise_end = retry_at + core.config.vote_promise_ms
    out = core.poll(10 + FETCH_TIMEOUT_MS)
    assert state_of(core) is StateKind.PROSPECTIVE and promise_end > 10 + FETCH_TIMEOUT_MS + 1
    pre_vote = sent_requests(out, VoteRequest)[0]
    out = core.handle_response(
        pre_vote.correlation_id,
        VoteResponse(ErrorCode.NONE, "", -1, 4, True, True),
        10 + FETCH_TIMEOUT_MS + 1,
    )
    assert state_of(core) is StateKind.PROSPECTIVE  # won, held until the promise ends
    assert out.next_deadline_ms <= promise_end
    core.poll(promise_end - 1)
    assert state_of(core) is StateKind.PROSPECTIVE
    core.poll(promise_end)
    assert state_of(core) is StateKind.CANDIDATE and core.epoch == 5
