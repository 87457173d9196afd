"""The read-round echo: a voter busy writing a fetched batch echoes a new leadership-confirmation round at
once, in a Fetch marked ``echo_only``, instead of in its next ordinary Fetch after the flush.

Why (issue #17): during bulk work a follower's fetch cycle is write + listeners' replay + fsync of a big
batch, and a round waited a whole such cycle for the second-fastest voter.  The echo proves only that the
voter, after it got the round, still followed this leader's epoch; that needs nothing durable
(docs/internals/raft.md, "Confirming leadership").  Everything here runs on a manual clock.
"""

from __future__ import annotations

from test_raft_core import CLUSTER, batch_bytes, elect, log_with, make_core, sent_requests

from kraft.errors import ErrorCode
from kraft.raft.core import RaftCore
from kraft.raft.core_log import EpochEntry, LogMeta
from kraft.raft.core_output import AppendFetched, OutboundRequest, OutboundResponse, Output
from kraft.raft.messages import BeginQuorumEpochRequest, FetchRequest, FetchResponse
from kraft.raft.state import ElectionState


def _follower() -> tuple[RaftCore, int]:
    """Node 2 follows leader 1 in epoch 4 with a durable log of 11; returns it and its first fetch's id."""
    log = LogMeta(0, 11, 11, [EpochEntry(1, 0), EpochEntry(4, 10)])
    core = make_core(node_id=2, election=ElectionState(4, 1), log=log)
    (fetch,) = sent_requests(core.start(0), FetchRequest)
    assert fetch.request.read_round == 0 and not fetch.request.echo_only
    return core, fetch.correlation_id


def _fetches(out: Output) -> list[OutboundRequest]:
    return [m for m in out.send_now if isinstance(m, OutboundRequest) and isinstance(m.request, FetchRequest)]


def _request(message: OutboundRequest) -> FetchRequest:
    assert isinstance(message.request, FetchRequest)
    return message.request


def _with_records(read_round: int, base_offset: int = 11, count: int = 3) -> FetchResponse:
    return FetchResponse(
        ErrorCode.NONE, "", 1, 4, 11, 0, batch_bytes(base_offset, count, 4), read_round=read_round
    )


def test_a_follower_echoes_a_new_round_before_the_flush_of_the_batch_that_brought_it() -> None:
    core, fetch_id = _follower()
    out = core.handle_response(fetch_id, _with_records(read_round=5), 1)
    assert [type(op) for op in out.log_ops] == [AppendFetched] and out.flush
    (echo,) = _fetches(out)  # the ordinary fetch waits for the flush; the echo does not
    request = _request(echo)
    assert request.echo_only and request.read_round == 5 and request.max_wait_ms == 0
    # It reports only what was durable before this batch: 11, not the unflushed 14.
    assert (request.fetch_offset, request.last_fetched_epoch, request.current_leader_epoch) == (11, 4, 4)
    (fetch,) = _fetches(core.on_flushed(14, 2))  # the ordinary fetch, beside the echo still in flight
    assert not _request(fetch).echo_only
    assert (_request(fetch).fetch_offset, _request(fetch).read_round) == (14, 5)


def test_no_echo_without_a_new_round_and_none_once_the_ordinary_fetch_carries_it() -> None:
    core, fetch_id = _follower()
    out = core.handle_response(fetch_id, _with_records(read_round=0), 1)
    assert out.flush and not _fetches(out)  # nothing new to echo
    (fetch,) = _fetches(core.on_flushed(14, 2))
    # A round that arrives with no records: the next ordinary fetch goes at once and echoes it.
    answer = FetchResponse(ErrorCode.NONE, "", 1, 4, 14, 0, b"", read_round=6)
    (fetch,) = _fetches(core.handle_response(fetch.correlation_id, answer, 3))
    assert not _request(fetch).echo_only and _request(fetch).read_round == 6
    # The batch after it brings no newer round: no echo (round 6 was already sent).
    out = core.handle_response(fetch.correlation_id, _with_records(read_round=6, base_offset=14), 4)
    assert out.flush and not _fetches(out)


def test_an_echo_answer_with_a_newer_round_is_echoed_again_while_the_flush_still_holds_the_fetch() -> None:
    core, fetch_id = _follower()
    (echo,) = _fetches(core.handle_response(fetch_id, _with_records(read_round=5), 1))
    newer = FetchResponse(ErrorCode.NONE, "", 1, 4, 11, 0, b"", read_round=7)
    (again,) = _fetches(core.handle_response(echo.correlation_id, newer, 2))
    assert _request(again).echo_only and _request(again).read_round == 7
    assert _request(again).fetch_offset == 11
    # The same answer again (nothing newer): no third echo.
    same = FetchResponse(ErrorCode.NONE, "", 1, 4, 11, 0, b"", read_round=7)
    assert not _fetches(core.handle_response(again.correlation_id, same, 3))


def test_a_failed_echo_does_not_hold_back_or_delay_the_ordinary_fetch() -> None:
    core, fetch_id = _follower()
    (echo,) = _fetches(core.handle_response(fetch_id, _with_records(read_round=5), 1))
    assert not _fetches(core.handle_send_failure(echo.correlation_id, 2, unreachable=True))
    (fetch,) = _fetches(core.on_flushed(14, 3))  # at once: no retry backoff from the echo's failure
    assert not _request(fetch).echo_only and _request(fetch).read_round == 5


def test_a_follower_that_moved_to_a_newer_epoch_echoes_nothing_more_to_its_old_leader() -> None:
    core, fetch_id = _follower()
    (echo,) = _fetches(core.handle_response(fetch_id, _with_records(read_round=5), 1))
    # Node 3 won epoch 5 (node 1's partition, say) and tells node 2, which now follows it.
    core.handle_request(9, BeginQuorumEpochRequest(CLUSTER, 3, 5, 2), 2)
    assert core.epoch == 5 and core.leader_and_epoch.leader_id == 3
    # The old leader's answer to the echo, with a newer round: nothing goes back to it at epoch 4.
    late = FetchResponse(ErrorCode.NONE, "", 1, 4, 11, 0, b"", read_round=8)
    out = core.handle_response(echo.correlation_id, late, 3)
    assert not [r for r in map(_request, _fetches(out)) if r.current_leader_epoch == 4]
    assert not [r for r in map(_request, _fetches(core.on_flushed(14, 4))) if r.current_leader_epoch == 4]


# --------------------------------------------------------------------------- the leader's side


def _leader_with_a_round() -> tuple[RaftCore, int, int]:
    """Node 1 leads epoch 4 (log 0..10 durable, then 10 more records flushed); voter 2 fetched up to 21."""
    core = make_core(voters=(1, 2, 3), election=ElectionState(3), log=log_with([(1, 0), (3, 5)], 10))
    now = elect(core)
    core.on_flushed(11, now)
    core.append([b"r%d" % i for i in range(10)], now)
    core.poll(now + 10)
    core.on_flushed(21, now + 10)
    now += 10
    core.handle_request(1, FetchRequest(CLUSTER, 2, 4, 21, 4, max_wait_ms=0), now)
    read_round = core.confirm_leadership(now)
    core.take_output(now)
    return core, read_round, now


def _voter_end(core: RaftCore, voter: int, now: int) -> int:
    (state,) = [s for s in core.describe_quorum(now).current_voters if s.replica_id == voter]
    return state.log_end_offset


def test_an_echo_confirms_the_round_and_is_answered_at_once_without_records_or_progress() -> None:
    core, read_round, now = _leader_with_a_round()
    assert _voter_end(core, 2, now) == 21
    # Voter 2 echoes from behind: its echo carries its last durable offset before the batch it writes.
    echo = FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=0, read_round=read_round, echo_only=True)
    out = core.handle_request(2, echo, now + 1)
    assert out.confirmed_read_round == read_round
    responses = [m for m in out.send_now if isinstance(m, OutboundResponse) and m.request_id == 2]
    (answer,) = responses
    assert isinstance(answer.response, FetchResponse) and answer.response.error_code is ErrorCode.NONE
    assert answer.read_log is None  # no records read for it
    assert answer.response.read_round == read_round
    assert _voter_end(core, 2, now + 1) == 21  # the replica's end is not moved back to 11


def test_an_echo_of_a_round_never_started_is_refused_like_any_fetch() -> None:
    core, read_round, now = _leader_with_a_round()
    echo = FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=0, read_round=read_round + 1, echo_only=True)
    out = core.handle_request(2, echo, now + 1)
    (answer,) = [m for m in out.send_now if isinstance(m, OutboundResponse)]
    assert answer.response.error_code is ErrorCode.INVALID_REQUEST and out.confirmed_read_round is None


def test_an_echo_from_an_older_epoch_confirms_nothing() -> None:
    core, read_round, now = _leader_with_a_round()
    stale = FetchRequest(CLUSTER, 2, 3, 11, 3, max_wait_ms=0, read_round=read_round, echo_only=True)
    out = core.handle_request(2, stale, now + 1)
    (answer,) = [m for m in out.send_now if isinstance(m, OutboundResponse)]
    assert answer.response.error_code is ErrorCode.FENCED_LEADER_EPOCH and out.confirmed_read_round is None


def test_a_round_completes_from_an_echo_sent_before_the_followers_flush() -> None:
    """Leader and follower cores wired by hand: the follower receives a big batch with a new round; the
    round confirms from its echo while the batch's flush has not completed (on the old code the round
    waited for the flush and the next ordinary fetch)."""
    leader, read_round, now = _leader_with_a_round()
    log = LogMeta(0, 11, 11, [EpochEntry(1, 0), EpochEntry(3, 5), EpochEntry(4, 10)])
    follower = make_core(node_id=3, election=ElectionState(4, 1), log=log)
    (first,) = _fetches(follower.start(now))
    out = leader.handle_request(30, _request(first), now)
    (answer,) = [m for m in out.send_now if isinstance(m, OutboundResponse) and m.request_id == 30]
    assert answer.read_log is not None and answer.read_log.offset == 11  # the driver fills the records
    assert isinstance(answer.response, FetchResponse) and answer.response.read_round == read_round
    filled = FetchResponse(
        ErrorCode.NONE,
        "",
        1,
        4,
        answer.response.high_watermark,
        0,
        batch_bytes(11, 10, 4),
        read_round=read_round,
    )
    out = follower.handle_response(first.correlation_id, filled, now + 1)
    assert out.flush  # the batch is being written; follower.on_flushed is never called below
    (echo,) = _fetches(out)
    confirmed = leader.handle_request(31, _request(echo), now + 2).confirmed_read_round
    assert confirmed == read_round
