"""The check-quorum leader lease (issue #17) on the core's manual clock.

Leader: ``confirm_leadership(now, lease=True)`` answers 0 (confirmed now) only while a majority of voters
— the leader counts itself — echoed a round that started less than ``lease_ms`` ago; the lease runs from
the round's *start* on the leader's clock, never from when the echo arrived; it renews itself with a
background round; without it the caller gets an ordinary round.  Voters: the promise the lease rests on —
no (pre-)vote for ``vote_protection_ms`` after starting, and none on the refused-fetch path before that
long after the last answer from the leader.  docs/internals/raft.md "Leader lease".
"""

from __future__ import annotations

import pytest
from test_raft_core import CLUSTER, ELECTION_MS, FETCH_TIMEOUT_MS, make_core, only_response, sent_requests
from test_read_index import _fetch, _leader, _responses

from kraft.errors import ErrorCode
from kraft.raft.core import RaftCore
from kraft.raft.core_timers import NEVER_MS
from kraft.raft.core_types import RaftConfig
from kraft.raft.messages import (
    BeginQuorumEpochRequest,
    FetchRequest,
    FetchResponse,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import StateKind

PROTECTION_MS = min(FETCH_TIMEOUT_MS, ELECTION_MS // 2)  # 50
LEASE_MS = PROTECTION_MS - PROTECTION_MS // 5  # 40


def _leased(core: RaftCore, now: int) -> tuple[int, int]:
    """Start a round at ``now`` and have voter 2 echo it at ``now + 1``: the lease runs from ``now``."""
    read_round = core.confirm_leadership(now)
    core.take_output(now)
    core.handle_request(1, _fetch(2, 0), now)  # publishes the round to voter 2
    out = core.handle_request(2, _fetch(2, read_round), now + 1)
    assert out.confirmed_read_round == read_round
    return read_round, now + LEASE_MS


def test_the_lease_bounds_follow_from_the_config() -> None:
    config = make_core().config
    assert config.vote_protection_ms == PROTECTION_MS
    assert config.max_lease_ms == config.lease_ms == LEASE_MS
    assert RaftConfig(1, (1, 2, 3), CLUSTER, leader_lease_ms=0).lease_ms == 0
    with pytest.raises(ValueError, match="leader lease"):
        RaftConfig(1, (1, 2, 3), CLUSTER, leader_lease_ms=401)  # 0.8 x min(2000, 1000 // 2) = 400
    assert RaftConfig(1, (1, 2, 3), CLUSTER, leader_lease_ms=400).lease_ms == 400


def test_no_lease_before_a_majority_echoed_a_round() -> None:
    core, now = _leader()
    assert core.leader_lease_expiry_ms() == -1
    assert core.confirm_leadership(now, lease=True) > 0  # an ordinary round


def test_the_lease_answers_at_once_until_it_ends_then_a_round_is_needed() -> None:
    core, now = _leader()
    read_round, expiry = _leased(core, now)
    assert core.leader_lease_expiry_ms() == expiry
    assert core.confirm_leadership(now + 2, lease=True) == 0
    assert core.confirm_leadership(expiry - 1, lease=True) == 0
    # Ended: a round like any caller's (never an answer from an expired lease).
    fallback = core.confirm_leadership(expiry, lease=True)
    assert fallback > read_round
    # Without lease=True nobody is answered from it, even while it holds.
    core2, now2 = _leader()
    _leased(core2, now2)
    assert core2.confirm_leadership(now2 + 2) > 0


def test_the_lease_runs_from_the_rounds_start_not_from_the_echos_arrival() -> None:
    """The echo proves the voter took a response written after the round started — nothing later — so a
    late echo buys no more lease than a prompt one."""
    core, now = _leader()
    read_round = core.confirm_leadership(now)
    core.take_output(now)
    core.handle_request(1, _fetch(2, 0), now)
    core.handle_request(2, _fetch(2, read_round), now + LEASE_MS - 5)
    assert core.leader_lease_expiry_ms() == now + LEASE_MS
    assert core.confirm_leadership(now + LEASE_MS, lease=True) > 0


def test_the_lease_runs_from_the_first_response_that_carried_the_round_when_that_is_later() -> None:
    """During bulk work a voter's next Fetch comes long after the round started: the response that
    brought it the round was built then, and the voter's promise started after that — not after a later
    response carrying the same round, which it may not be the one it took."""
    core, now = _leader()
    read_round = core.confirm_leadership(now)
    core.take_output(now)
    assert _responses(core.handle_request(1, _fetch(2, 0, wait_ms=0), now + 10))[1].read_round == read_round
    assert _responses(core.handle_request(2, _fetch(2, 0, wait_ms=0), now + 15))[2].read_round == read_round
    core.handle_request(3, _fetch(2, read_round), now + 20)
    assert core.leader_lease_expiry_ms() == now + 10 + LEASE_MS
    # A response to another voter says nothing about this one: voter 3's echo counts from its own.
    assert _responses(core.handle_request(4, _fetch(3, 0, wait_ms=0), now + 21))[4].read_round == read_round
    core.handle_request(5, _fetch(3, read_round), now + 22)
    assert core.leader_lease_expiry_ms() == now + 21 + LEASE_MS  # one other voter is a majority of 3


def test_a_fetch_without_a_fresh_echo_renews_nothing() -> None:
    core, now = _leader()
    read_round, expiry = _leased(core, now)
    core.handle_request(3, _fetch(2, read_round), expiry - 1)  # the same round again
    core.handle_request(4, _fetch(3, 0), expiry - 1)  # voter 3 never echoed
    assert core.leader_lease_expiry_ms() == expiry


def test_the_lease_renews_itself_with_a_background_round() -> None:
    core, now = _leader()
    read_round, _ = _leased(core, now)
    # Voter 2 long-polls (parked).  Less than a quarter of the lease spent: nothing starts.
    assert not _responses(core.handle_request(3, _fetch(2, read_round), now + 2))
    assert core.confirm_leadership(now + 3, lease=True) == 0
    assert not _responses(core.take_output(now + 3))
    # More than a quarter spent: answered from the lease, and a new round starts — the parked fetch is
    # answered at once carrying it.
    later = now + LEASE_MS // 4 + 1
    assert core.confirm_leadership(later, lease=True) == 0
    answered = _responses(core.take_output(later))
    assert answered[3].read_round == read_round + 1
    # Its echo moves the lease to that round's start.
    core.handle_request(4, _fetch(2, read_round + 1), later + 1)
    assert core.leader_lease_expiry_ms() == later + LEASE_MS
    # Rounds overlap, but at most one background round starts per eighth of the lease.
    leader = core._leader
    assert leader is not None
    renew = later + LEASE_MS // 4 + 1
    assert core.confirm_leadership(renew, lease=True) == 0
    assert leader.read_round_started == read_round + 2
    assert core.confirm_leadership(renew + LEASE_MS // 8 - 1, lease=True) == 0
    assert leader.read_round_started == read_round + 2
    assert core.confirm_leadership(renew + LEASE_MS // 8, lease=True) == 0
    assert leader.read_round_started == read_round + 3


def _in_use_with_a_parked_voter(core: RaftCore, now: int) -> tuple[int, int]:
    """Leased at ``now`` (expiry ``now + LEASE_MS``), one lease caller at ``now + 2``, then voter 2's
    long poll parked; nobody else asks.  Returns (round, when the lease wants its next round)."""
    read_round, expiry = _leased(core, now)
    assert core.confirm_leadership(now + 2, lease=True) == 0  # the lease is in use
    assert not _responses(core.handle_request(3, _fetch(2, read_round, wait_ms=1000), now + 2))
    return read_round, expiry - LEASE_MS * 3 // 4 + 1


def test_a_lease_in_use_renews_from_poll_without_a_caller() -> None:
    """Issue #17, session 12: during bulk work the heartbeats come in bursts with gaps of 100-300 ms (the
    client or the leader's loop waits for a core); a renewal only a caller starts let the lease run out in
    such a gap while the voters' long polls sat parked.  The core asks to be polled when the renewal is
    due and starts the round then: the parked fetch is answered at once and its echo renews the lease."""
    core, now = _leader()
    read_round, due = _in_use_with_a_parked_voter(core, now)
    assert core.take_output(now + 2).next_deadline_ms == due
    assert not _responses(core.poll(due - 1))
    answered = _responses(core.poll(due))
    assert answered[3].read_round == read_round + 1
    core.handle_request(4, _fetch(2, read_round + 1, wait_ms=1000), due + 1)
    assert core.leader_lease_expiry_ms() == due + LEASE_MS
    # The next renewal is due a quarter of the new lease on, still inside the caller's lease: polled then.
    assert core.take_output(due + 1).next_deadline_ms == due + LEASE_MS // 4 + 1
    assert _responses(core.poll(due + LEASE_MS // 4 + 1))[4].read_round == read_round + 2


def test_poll_renews_only_a_lease_in_use() -> None:
    """No caller asked for the lease (only ordinary rounds), or the last one did a lease ago: the idle
    leader starts no rounds, and the voters' long polls stay parked."""
    core, now = _leader()
    read_round, expiry = _leased(core, now)  # confirmed by an ordinary round: the lease is not in use
    assert not _responses(core.handle_request(3, _fetch(2, read_round, wait_ms=1000), now + 2))
    leader = core._leader
    assert leader is not None and leader.lease_renewal_due_ms(now + 2) == NEVER_MS
    assert 3 not in _responses(core.poll(expiry - 1))
    assert leader.read_round_started == read_round
    # One lease caller: renewals while it is less than a lease ago, none after.
    core2, now2 = _leader()
    round2, due = _in_use_with_a_parked_voter(core2, now2)
    caller_ms = now2 + 2
    leader2 = core2._leader
    assert leader2 is not None and leader2.lease_renewal_due_ms(caller_ms + LEASE_MS - 1) == due
    assert leader2.lease_renewal_due_ms(caller_ms + LEASE_MS) == NEVER_MS
    assert 3 not in _responses(core2.poll(caller_ms + LEASE_MS))
    assert leader2.read_round_started == round2


def test_a_due_renewal_whose_round_nobody_can_carry_yet_does_not_poll_again_at_once() -> None:
    """With no long poll parked the renewal round stays unpublished until the next Fetch: the core then
    asks for no poll before that Fetch (a new round would only join it), so the driver does not spin."""
    core, now = _leader()
    read_round = core.confirm_leadership(now)
    core.take_output(now)
    core.handle_request(1, _fetch(2, 0, wait_ms=0), now)
    echoed = core.handle_request(2, _fetch(2, read_round, wait_ms=0), now + 1)
    assert echoed.confirmed_read_round == read_round
    expiry = now + LEASE_MS
    assert core.leader_lease_expiry_ms() == expiry
    assert core.confirm_leadership(now + 2, lease=True) == 0
    due = expiry - LEASE_MS * 3 // 4 + 1
    out = core.poll(due)
    leader = core._leader
    assert leader is not None and leader.read_round_started == read_round + 1
    assert leader.lease_renewal_due_ms(due) == NEVER_MS and out.next_deadline_ms > expiry
    # The next Fetch carries it, and the following renewal is due an eighth of the lease after it began.
    assert _responses(core.handle_request(3, _fetch(2, read_round), due + 1))[3].read_round == read_round + 1
    assert core.take_output(due + 1).next_deadline_ms == due + LEASE_MS // 8


def test_a_lease_of_zero_is_off() -> None:
    core, now = _leader()
    core.config = make_core(leader_lease_ms=0).config
    core._leader.config = core.config  # type: ignore[union-attr]
    read_round = core.confirm_leadership(now)
    core.take_output(now)
    core.handle_request(1, _fetch(2, 0), now)
    core.handle_request(2, _fetch(2, read_round), now + 1)
    assert core.leader_lease_expiry_ms() == -1
    assert core.confirm_leadership(now + 2, lease=True) > 0


def test_losing_leadership_ends_the_lease() -> None:
    core, now = _leader()
    _leased(core, now)
    core.resign(now + 2)
    assert core.leader_lease_expiry_ms() == -1


def test_a_sole_voter_needs_nobody() -> None:
    core, now = _leader(voters=(1,))
    assert core.confirm_leadership(now, lease=True) == 0


# ------------------------------------------------------------------------- the voters' promise


def _pre_vote(core: RaftCore, request_id: int, now: int) -> VoteResponse:
    request = VoteRequest(
        CLUSTER, core.epoch + 1, 3, core.node_id, core.log.last_epoch, core.log.end_offset, pre_vote=True
    )
    response = only_response(core.handle_request(request_id, request, now)).response
    assert isinstance(response, VoteResponse)
    return response


def _vote(core: RaftCore, request_id: int, now: int) -> VoteResponse:
    request = VoteRequest(CLUSTER, core.epoch + 1, 3, core.node_id, core.log.last_epoch, core.log.end_offset)
    response = only_response(core.handle_request(request_id, request, now)).response
    assert isinstance(response, VoteResponse)
    return response


def test_a_started_voter_grants_no_vote_for_the_vote_protection() -> None:
    """Before a restart it may have taken a response from a leader whose lease counts it; it forgot."""
    core = make_core(node_id=2)
    core.start(1000)
    refused_pre_vote = _pre_vote(core, 1, 1000 + PROTECTION_MS - 1)
    assert not refused_pre_vote.vote_granted and refused_pre_vote.error_code is ErrorCode.NONE
    refused = _vote(core, 2, 1000 + PROTECTION_MS - 1)
    assert not refused.vote_granted and refused.error_code is ErrorCode.NONE
    assert core.epoch == 0  # nothing adopted or persisted
    assert _pre_vote(core, 3, 1000 + PROTECTION_MS).vote_granted
    assert _vote(core, 4, 1000 + PROTECTION_MS).vote_granted


def test_a_started_voter_does_not_campaign_within_the_vote_protection() -> None:
    core = make_core(node_id=2, election_timeout_ms=10, fetch_timeout_ms=1000)  # protection 5 ms
    out = core.start(0)
    assert out.next_deadline_ms >= core.config.vote_protection_ms


def test_a_sole_voter_elects_itself_at_once() -> None:
    core = make_core(voters=(1,))
    core.start(0)
    core.poll(0)
    assert core.is_leader


def _refused_follower() -> tuple[RaftCore, int]:
    """Node 2 follows leader 1 (epoch 1), last answered at t=100, then three fetches refused outright."""
    core = make_core(node_id=2, retry_backoff_ms=1)
    core.start(0)
    out = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, 1, 2), 99)
    fetch = sent_requests(out, FetchRequest)[0]
    out = core.handle_response(fetch.correlation_id, FetchResponse(ErrorCode.NONE, "", 1, 1, 0, 0), 100)
    now = 100
    for _ in range(3):
        request = sent_requests(out, FetchRequest)[0]
        core.handle_send_failure(request.correlation_id, now + 1, unreachable=True)
        now += core.config.retry_backoff_ms + 1
        out = core.poll(now)
    assert core.state is StateKind.FOLLOWER and core._fetcher is not None
    assert core._fetcher.unreachable_failures >= 3
    return core, now


def test_refused_fetches_do_not_end_the_promise_early() -> None:
    """Three refusals in a row used to free a follower at once (the fast dead-leader path); the leader's
    lease counts on its promise, and refusals alone do not prove the leader is gone."""
    core, now = _refused_follower()
    assert now < 100 + PROTECTION_MS
    refused = _pre_vote(core, 10, now)
    assert not refused.vote_granted and refused.error_code is ErrorCode.NONE
    assert not _vote(core, 11, now).vote_granted
    assert not _pre_vote(core, 12, 100 + PROTECTION_MS - 1).vote_granted
    assert _pre_vote(core, 13, 100 + PROTECTION_MS).vote_granted


def test_the_fast_dead_leader_path_campaigns_no_earlier_than_the_promise() -> None:
    core, now = _refused_follower()
    out = core.poll(now)
    assert out.next_deadline_ms >= 100 + PROTECTION_MS
    assert core.poll(100 + PROTECTION_MS - 1) and core.state is StateKind.FOLLOWER


def test_the_lease_ages_say_whether_a_round_was_asked_for_or_the_voters_were_slow_to_echo() -> None:
    """``leader_lease_ages_ms`` (the driver's ``lease_lapsed`` log line, issue #17 session 11): the age of
    the latest round's start and of each voter's lease basis, on the core's clock."""
    core, now = _leader()
    assert core.leader_lease_ages_ms(now) == (-1, {})  # no round kept, no basis
    _read_round, expiry = _leased(core, now)
    assert core.leader_lease_ages_ms(now + 5) == (5, {2: 5})
    # lapsed with nobody asking since: the latest round is as old as the basis
    assert core.leader_lease_ages_ms(expiry + 3) == (LEASE_MS + 3, {2: LEASE_MS + 3})
    # a lapsed caller's round starts now: the latest round is fresh, voter 2's basis is the old one
    assert core.confirm_leadership(expiry + 3, lease=True) > 0
    assert core.leader_lease_ages_ms(expiry + 3) == (0, {2: LEASE_MS + 3})
    assert core.leader_lease_ages_ms(now) == (0, {2: LEASE_MS + 3})  # never before the core's own time


def test_a_lease_hit_is_quiet_only_when_it_changes_neither_the_output_nor_the_deadline() -> None:
    """Issue #17, session 12: the driver takes an output after a lease hit only when ``lease_hit_quiet``
    is False.  The first lease caller arms the renewal timer (the deadline moves earlier): not quiet.
    Hits after it change nothing: quiet, and the output they would give is empty with the same deadline.
    A hit that starts a renewal round (answering the parked fetch): not quiet."""
    core, now = _leader()
    read_round, expiry = _leased(core, now)  # by an ordinary round: the lease is not in use yet
    assert not _responses(core.handle_request(3, _fetch(2, read_round, wait_ms=1000), now + 1))
    idle_deadline = core.take_output(now + 1).next_deadline_ms
    due = expiry - LEASE_MS * 3 // 4 + 1
    assert idle_deadline > due
    assert core.confirm_leadership(now + 2, lease=True) == 0
    assert not core.lease_hit_quiet
    assert core.take_output(now + 2).next_deadline_ms == due
    for at in (now + 3, due - 1):
        assert core.confirm_leadership(at, lease=True) == 0
        assert core.lease_hit_quiet
        out = core.take_output(at)
        assert out.is_empty() and out.next_deadline_ms == due
    assert core.confirm_leadership(due, lease=True) == 0
    assert not core.lease_hit_quiet
    assert _responses(core.take_output(due))[3].read_round == read_round + 1
