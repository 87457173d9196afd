"""Leadership confirmation (ReadIndex): ``RaftCore.confirm_leadership`` and the leader's rounds.

A round confirms only once a majority of voters, the leader included, fetched at the leader's epoch
*echoing* it (or a later round); callers share a round until a response carried it, and start the next
one at once after that; losing leadership ends every round unconfirmed; a sole voter confirms at once.
docs/internals/raft.md "Confirming leadership".
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_raft_core import CLUSTER, elect, log_with, make_core, sent_requests, state_of

from kraft.errors import ErrorCode
from kraft.raft.api import NotLeaderError
from kraft.raft.core import RaftCore
from kraft.raft.core_decisions import ConfirmReadRound, Respond, RespondError
from kraft.raft.core_leader import LeaderRole
from kraft.raft.core_log import EpochEntry, LogMeta
from kraft.raft.core_output import OutboundRequest, OutboundResponse, Output
from kraft.raft.core_types import RaftConfig
from kraft.raft.messages import FetchRequest, FetchResponse, VoteRequest, VoteResponse
from kraft.raft.state import ElectionState, StateKind


def _leader(voters: tuple[int, ...] = (1, 2, 3)) -> tuple[RaftCore, int]:
    """Node 1 leads epoch 4 with a durable log of 11 (its LeaderChange at 10)."""
    core = make_core(voters=voters, election=ElectionState(3), log=log_with([(1, 0), (3, 5)], 10))
    if voters == (1,):
        core.start(0)
        core.poll(0)
        now = 0
    elif len(voters) == 3:
        now = elect(core)
    else:
        now = _elect_by_all(core)
    assert core.is_leader and core.epoch == 4
    core.on_flushed(11, now)
    return core, now


def _elect_by_all(core: RaftCore) -> int:
    """Every other voter grants the pre-vote and the vote."""
    core.start(0)
    out = core.poll(150)
    for pre_vote in sent_requests(out, VoteRequest):
        granted = VoteResponse(ErrorCode.NONE, "", -1, core.epoch, True, True)
        out = core.handle_response(pre_vote.correlation_id, granted, 150)
        if state_of(core) is StateKind.CANDIDATE:
            break
    for vote in sent_requests(out, VoteRequest):
        core.handle_response(vote.correlation_id, VoteResponse(ErrorCode.NONE, "", -1, core.epoch, True), 150)
    return 150


def _fetch(replica: int, read_round: int, *, wait_ms: int = 30, offset: int = 11) -> FetchRequest:
    # The fetcher knows every commit up to its log end: no high-watermark answer is owed (a Fetch that
    # commits is answered at once otherwise), so these long polls park or answer by the read-round rules.
    return FetchRequest(
        CLUSTER, replica, 4, offset, 4, max_wait_ms=wait_ms, read_round=read_round, high_watermark=offset
    )


def _responses(out: Output) -> dict[int, FetchResponse]:
    found: dict[int, FetchResponse] = {}
    for message in [*out.send_now, *out.send_after_persist]:
        if isinstance(message, OutboundResponse) and isinstance(message.response, FetchResponse):
            found[message.request_id] = message.response
    return found


def test_a_sole_voter_confirms_at_once() -> None:
    core, now = _leader(voters=(1,))
    first = core.confirm_leadership(now)
    assert core.take_output(now).confirmed_read_round == first
    second = core.confirm_leadership(now + 1)
    assert second > first and core.take_output(now + 1).confirmed_read_round == second


def test_a_round_needs_a_majority_echo_not_just_a_later_fetch() -> None:
    core, now = _leader()
    assert not _responses(core.handle_request(1, _fetch(2, 0), now))  # parked long poll
    read_round = core.confirm_leadership(now + 1)
    out = core.take_output(now + 1)
    # The voter's parked long poll answers at once, carrying the round, so it echoes without waiting.
    assert _responses(out)[1].read_round == read_round and out.confirmed_read_round is None
    # A fetch sent before the voter saw the round arrives after it started: it proves nothing.
    out = core.handle_request(2, _fetch(3, 0), now + 2)
    assert out.confirmed_read_round is None
    assert _responses(out)[2].read_round == read_round  # answered now, not parked: it owes an echo
    out = core.handle_request(3, _fetch(2, read_round), now + 3)
    assert out.confirmed_read_round == read_round  # voter 2 and the leader: 2 of 3


def test_callers_join_a_round_no_voter_has_seen_and_otherwise_start_the_next_at_once() -> None:
    """Rounds overlap (issue #17): a caller arriving after the round in flight was published starts the
    next round at once instead of waiting for that one to confirm; until a response carried a round,
    new callers share it.  An echo of a later round confirms every earlier one."""
    core, now = _leader()
    first = core.confirm_leadership(now)
    core.take_output(now)
    assert core.confirm_leadership(now + 1) == first  # no response carried it: nobody echoed it yet
    # Voter 2 fetches: answered at once (it owes an echo), carrying the round — now it is published.
    assert _responses(core.handle_request(1, _fetch(2, 0), now + 2))[1].read_round == first
    second = core.confirm_leadership(now + 3)
    assert second == first + 1  # started now, with the first still in flight
    assert core.confirm_leadership(now + 4) == second
    assert _responses(core.handle_request(2, _fetch(3, 0), now + 5))[2].read_round == second
    # Voter 2 echoes the first only: the first confirms (2 of 3 with the leader), the second does not.
    assert core.handle_request(3, _fetch(2, first), now + 6).confirmed_read_round == first
    assert core.handle_request(4, _fetch(3, second), now + 7).confirmed_read_round == second
    assert core.confirm_leadership(now + 8) == second + 1  # nothing in flight: a new round


def test_an_echo_of_the_later_round_confirms_the_earlier_one_too() -> None:
    core, now = _leader()
    first = core.confirm_leadership(now)
    core.take_output(now)
    core.handle_request(1, _fetch(2, 0), now + 1)  # publishes the first
    second = core.confirm_leadership(now + 2)
    core.take_output(now + 2)
    assert _responses(core.handle_request(2, _fetch(3, 0), now + 3))[2].read_round == second
    # Voter 3 never echoed the first; its echo of the second covers it.
    assert second > first
    assert core.handle_request(3, _fetch(3, second), now + 4).confirmed_read_round == second


def test_five_voters_need_two_echoes_besides_the_leader_and_observers_do_not_count() -> None:
    core, now = _leader(voters=(1, 2, 3, 4, 5))
    read_round = core.confirm_leadership(now)
    core.take_output(now)
    assert core.handle_request(1, _fetch(2, read_round), now + 1).confirmed_read_round is None
    assert core.handle_request(2, _fetch(2, read_round), now + 1).confirmed_read_round is None  # same voter
    assert core.handle_request(3, _fetch(9, read_round), now + 2).confirmed_read_round is None  # observer
    assert core.handle_request(4, _fetch(4, read_round), now + 3).confirmed_read_round == read_round


def test_losing_leadership_ends_the_round_unconfirmed() -> None:
    core, now = _leader()
    core.confirm_leadership(now)
    core.take_output(now)
    out = core.poll(now + 300)  # check-quorum: nobody fetched for 1.5 fetch timeouts
    assert state_of(core) is StateKind.RESIGNED
    assert out.lost_leadership and out.confirmed_read_round is None
    with pytest.raises(NotLeaderError):
        core.confirm_leadership(now + 301)


@pytest.mark.parametrize("read_round", [-1, 5])
def test_an_echo_of_a_round_never_started_is_refused(read_round: int) -> None:
    core, now = _leader()
    started = core.confirm_leadership(now)
    core.take_output(now)
    assert started < 5
    out = core.handle_request(1, _fetch(2, read_round), now + 1)
    response = _responses(out)[1]
    assert response.error_code is ErrorCode.INVALID_REQUEST and out.confirmed_read_round is None


def test_a_follower_echoes_the_highest_round_its_leader_sent() -> None:
    log = LogMeta(0, 11, 11, [EpochEntry(1, 0), EpochEntry(4, 10)])
    core = make_core(node_id=2, election=ElectionState(4, 1), log=log)
    out = core.start(0)
    (fetch,) = [m for m in out.send_now if isinstance(m, OutboundRequest)]
    assert isinstance(fetch.request, FetchRequest) and fetch.request.read_round == 0
    answer = FetchResponse(ErrorCode.NONE, "", 1, 4, 11, 0, b"", read_round=7)
    out = core.handle_response(fetch.correlation_id, answer, 1)
    (fetch,) = [m for m in out.send_now if isinstance(m, OutboundRequest)]
    assert isinstance(fetch.request, FetchRequest) and fetch.request.read_round == 7
    older = FetchResponse(ErrorCode.NONE, "", 1, 4, 11, 0, b"", read_round=3)  # reordered: never lower
    out = core.handle_response(fetch.correlation_id, older, 2)
    (fetch,) = [m for m in out.send_now if isinstance(m, OutboundRequest)]
    assert isinstance(fetch.request, FetchRequest) and fetch.request.read_round == 7


# --------------------------------------------------------------------------- property: the leader role


@settings(max_examples=150, deadline=None)
@given(
    voters=st.sampled_from([(1, 2, 3), (1, 2, 3, 4, 5)]),
    steps=st.lists(
        st.one_of(st.just(("ask", 0)), st.tuples(st.just("fetch"), st.integers(2, 5))), max_size=60
    ),
)
def test_rounds_confirm_only_after_a_majority_echoed_them_and_every_caller_is_served(
    voters: tuple[int, ...], steps: list[tuple[str, int]]
) -> None:
    """Followers echo the highest round they received; each confirmed round had, after it started, fetches
    echoing it from a majority (the leader included); once everyone fetches, every caller's round confirms."""
    config = RaftConfig(node_id=1, voters=voters, cluster_id=CLUSTER)
    role = LeaderRole(config, 4, 0, voters)
    log = LogMeta(0, 1, 1, [EpochEntry(4, 0)])
    role.start(0)
    seen = dict.fromkeys(voters, 0)
    echoed_since: dict[int, set[int]] = {}  # round -> voters that echoed it after it started
    asked: list[int] = []
    confirmed = 0

    def absorb(decisions: list[object]) -> None:
        nonlocal confirmed
        for decision in decisions:
            if isinstance(decision, ConfirmReadRound):
                assert decision.read_round > confirmed
                echoes = echoed_since.get(decision.read_round, set())
                assert len(echoes) + 1 >= len(voters) // 2 + 1, (decision, echoes)
                confirmed = decision.read_round
            elif isinstance(decision, Respond) and isinstance(decision.response, FetchResponse):
                replica = pending.pop(decision.request_id)
                seen[replica] = max(seen[replica], decision.response.read_round)
            else:
                assert not isinstance(decision, RespondError), decision

    pending: dict[int, int] = {}
    request_id = 0

    def fetch(replica: int) -> None:
        nonlocal request_id
        if replica in pending.values():
            return  # one fetch in flight per follower
        request_id += 1
        pending[request_id] = replica
        echo = seen[replica]
        for started in range(1, role.read_round_started + 1):
            if echo >= started:
                echoed_since.setdefault(started, set()).add(replica)
        request = FetchRequest(CLUSTER, replica, 4, 1, 4, max_wait_ms=500, read_round=echo)
        absorb(list(role.handle_fetch(request_id, request, 1, log, 0)))

    for kind, replica in steps:
        if kind == "ask":
            started_before = role.read_round_started
            read_round, decisions = role.request_read_round(log, 0)
            # The caller's round started with this call, or it joined the latest one, which no response
            # carried yet (so no voter can have echoed it before the call).
            assert read_round > confirmed
            assert read_round == role.read_round_started
            if read_round == started_before:
                assert role.read_round_published < read_round
            asked.append(read_round)
            absorb(list(decisions))
        elif replica in voters:
            fetch(replica)
    # Liveness: followers keep fetching (their long polls answered by new rounds) until all are served.
    for _ in range(10):
        for replica in voters[1:]:
            fetch(replica)
    assert confirmed >= max(asked, default=0)
