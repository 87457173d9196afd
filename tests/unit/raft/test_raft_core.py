"""Scripted interactions with the IO-free core: votes, pre-vote, divergence, HWM, check-quorum, long polls."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import pytest

from kraft.errors import ErrorCode
from kraft.raft.api import NotLeaderError
from kraft.raft.core import RaftCore
from kraft.raft.core_log import EpochEntry, LogInvariantError, LogMeta
from kraft.raft.core_output import (
    AppendFetched,
    AppendLeaderChange,
    AppendRecords,
    OutboundRequest,
    OutboundResponse,
    Output,
    TruncateTo,
)
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import scan_kafka_batches
from kraft.raft.messages import (
    BeginQuorumEpochRequest,
    EndQuorumEpochRequest,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import ElectionState, StateKind
from kraft.storage.batch import build_batch

RequestT = TypeVar("RequestT")
CLUSTER = "c1"
ELECTION_MS = 100  # FixedRng → every election timeout is 150 ms
FETCH_TIMEOUT_MS = 200
STARTED_MS = min(FETCH_TIMEOUT_MS, ELECTION_MS // 2)
"""A started voter grants no (pre-)vote for its vote protection (the leader lease's promise): vote tests
send their requests this long after ``start(0)``."""


class FixedRng:
    def random(self) -> float:
        return 0.5


def make_core(
    node_id: int = 1,
    voters: tuple[int, ...] = (1, 2, 3),
    election: ElectionState | None = None,
    log: LogMeta | None = None,
    **overrides: int,
) -> RaftCore:
    settings: dict[str, Any] = {
        "election_timeout_ms": ELECTION_MS,
        "fetch_timeout_ms": FETCH_TIMEOUT_MS,
        "request_timeout_ms": 50,
        "append_linger_ms": 5,
        "fetch_max_wait_ms": 30,
        **overrides,
    }
    config = RaftConfig(node_id=node_id, voters=voters, cluster_id=CLUSTER, **settings)
    return RaftCore(config, FixedRng(), scan_kafka_batches, election or ElectionState(0), log or LogMeta())


def log_with(epochs: list[tuple[int, int]], end_offset: int, start_offset: int = 0) -> LogMeta:
    entries = [EpochEntry(epoch, start) for epoch, start in epochs]
    return LogMeta(start_offset, end_offset, end_offset, entries)


def batch_bytes(base_offset: int, count: int, epoch: int) -> bytes:
    records = [(None, b"v%d" % (base_offset + i)) for i in range(count)]
    return build_batch(base_offset, records, leader_epoch=epoch, timestamp_ms=0)


@dataclass(frozen=True)
class Sent(Generic[RequestT]):
    dest: int
    correlation_id: int
    request: RequestT
    after_persist: bool


def sent_requests(out: Output, kind: type[RequestT]) -> list[Sent[RequestT]]:
    found: list[Sent[RequestT]] = []
    for after_persist, messages in ((False, out.send_now), (True, out.send_after_persist)):
        for m in messages:
            if isinstance(m, OutboundRequest) and isinstance(m.request, kind):
                found.append(Sent(m.dest, m.correlation_id, m.request, after_persist))
    return found


def state_of(core: RaftCore) -> StateKind:
    """Read the state through a call so mypy does not narrow it across steps of a test."""
    return core.state


def only_response(out: Output) -> OutboundResponse:
    responses = [m for m in [*out.send_now, *out.send_after_persist] if isinstance(m, OutboundResponse)]
    assert len(responses) == 1, responses
    return responses[0]


def elect(core: RaftCore, now_ms: int = 0) -> int:
    """Drive a fresh 3-voter core to leadership; returns the time reached."""
    core.start(now_ms)
    now_ms += 150
    out = core.poll(now_ms)
    assert state_of(core) is StateKind.PROSPECTIVE
    pre_vote = sent_requests(out, VoteRequest)[0]
    out = core.handle_response(
        pre_vote.correlation_id, VoteResponse(ErrorCode.NONE, "", -1, 0, True, True), now_ms
    )
    assert state_of(core) is StateKind.CANDIDATE
    vote = sent_requests(out, VoteRequest)[0]
    core.handle_response(vote.correlation_id, VoteResponse(ErrorCode.NONE, "", -1, core.epoch, True), now_ms)
    assert state_of(core) is StateKind.LEADER
    return now_ms


# --------------------------------------------------------------------------- votes


def test_a_vote_is_granted_once_per_epoch_and_only_after_persisting() -> None:
    core = make_core()
    core.start(0)
    out = core.handle_request(1, VoteRequest(CLUSTER, 1, 2, 1, 0, 0), STARTED_MS + 1)
    assert out.election_state == ElectionState(1, -1, 2)
    response = only_response(out)
    assert out.send_after_persist == [response]
    assert isinstance(response.response, VoteResponse) and response.response.vote_granted
    out = core.handle_request(2, VoteRequest(CLUSTER, 1, 3, 1, 0, 0), STARTED_MS + 2)
    second = only_response(out).response
    assert isinstance(second, VoteResponse) and not second.vote_granted
    assert out.election_state is None


def test_a_vote_for_a_less_up_to_date_log_is_rejected() -> None:
    core = make_core(log=log_with([(1, 0), (2, 5)], 10), election=ElectionState(2))
    core.start(0)
    now = STARTED_MS + 1
    stale_epoch = only_response(core.handle_request(1, VoteRequest(CLUSTER, 3, 2, 1, 1, 20), now)).response
    shorter = only_response(core.handle_request(2, VoteRequest(CLUSTER, 3, 3, 1, 2, 9), now)).response
    assert isinstance(stale_epoch, VoteResponse) and not stale_epoch.vote_granted
    assert isinstance(shorter, VoteResponse) and not shorter.vote_granted
    assert core.epoch == 3  # a higher epoch is adopted even when the vote is refused


def test_a_candidate_from_an_older_epoch_is_fenced() -> None:
    core = make_core(election=ElectionState(5))
    core.start(0)
    response = only_response(core.handle_request(1, VoteRequest(CLUSTER, 4, 2, 1, 0, 0), 1)).response
    assert response.error_code is ErrorCode.FENCED_LEADER_EPOCH
    assert response.leader_epoch == 5


def test_a_vote_request_whose_log_epoch_is_not_below_its_epoch_is_invalid() -> None:
    core = make_core()
    core.start(0)
    response = only_response(core.handle_request(1, VoteRequest(CLUSTER, 3, 2, 1, 3, 0), 1)).response
    assert response.error_code is ErrorCode.INVALID_REQUEST


def test_a_pre_vote_changes_no_state_and_is_not_persisted() -> None:
    core = make_core(election=ElectionState(2))
    core.start(0)
    out = core.handle_request(1, VoteRequest(CLUSTER, 3, 2, 1, 0, 0, pre_vote=True), STARTED_MS + 1)
    response = only_response(out).response
    assert isinstance(response, VoteResponse) and response.vote_granted and response.pre_vote
    assert out.election_state is None and out.send_now
    assert core.epoch == 2 and core.state is StateKind.UNATTACHED


def test_a_follower_that_hears_from_its_leader_rejects_pre_votes_until_the_leader_resigns() -> None:
    core = make_core()
    out = core.start(0)
    out = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 2, 1, 1), STARTED_MS + 1)
    fetch = sent_requests(out, FetchRequest)[0]
    core.handle_response(fetch.correlation_id, FetchResponse(ErrorCode.NONE, "", 2, 1, 0, 0), STARTED_MS + 2)
    pre_vote = VoteRequest(CLUSTER, 2, 3, 1, 0, 0, pre_vote=True)
    rejected = only_response(core.handle_request(2, pre_vote, STARTED_MS + 3)).response
    assert isinstance(rejected, VoteResponse) and not rejected.vote_granted
    core.handle_request(3, EndQuorumEpochRequest(CLUSTER, 2, 1, 1, (3, 1)), STARTED_MS + 4)
    granted = only_response(core.handle_request(4, pre_vote, STARTED_MS + 5)).response
    assert isinstance(granted, VoteResponse) and granted.vote_granted


# --------------------------------------------------------------------------- elections


def test_an_election_runs_pre_vote_then_vote_then_appends_leader_change() -> None:
    core = make_core()
    core.start(0)
    assert core.poll(149).is_empty()
    out = core.poll(150)
    assert state_of(core) is StateKind.PROSPECTIVE and core.epoch == 0
    assert out.election_state is None
    pre_votes = sent_requests(out, VoteRequest)
    assert {m.dest for m in pre_votes} == {2, 3}
    assert all(m.request.pre_vote and m.request.candidate_epoch == 1 for m in pre_votes)
    out = core.handle_response(
        pre_votes[0].correlation_id, VoteResponse(ErrorCode.NONE, "", -1, 0, True, True), 151
    )
    assert state_of(core) is StateKind.CANDIDATE
    assert out.election_state == ElectionState(1, -1, 1)
    votes = sent_requests(out, VoteRequest)
    assert votes and all(m.after_persist and not m.request.pre_vote for m in votes)
    out = core.handle_response(votes[0].correlation_id, VoteResponse(ErrorCode.NONE, "", -1, 1, True), 152)
    assert state_of(core) is StateKind.LEADER
    assert out.election_state == ElectionState(1, 1, 1)
    assert out.log_ops == [AppendLeaderChange(0, 1, 1, (1, 2, 3), (1, 2))]
    assert {m.dest for m in sent_requests(out, BeginQuorumEpochRequest)} == {2, 3}
    assert out.flush


def test_a_sole_voter_elects_itself_at_once() -> None:
    core = make_core(voters=(1,))
    core.start(0)
    core.poll(0)
    assert state_of(core) is StateKind.LEADER
    core.on_flushed(1, 1)
    assert core.high_watermark == 1


def test_a_restarted_leader_resigns_its_old_epoch_instead_of_voting_in_it() -> None:
    core = make_core(election=ElectionState(4, 1, 1), log=log_with([(4, 0)], 3))
    core.start(0)
    assert state_of(core) is StateKind.RESIGNED
    response = only_response(core.handle_request(1, VoteRequest(CLUSTER, 4, 2, 1, 3, 10), 1)).response
    assert isinstance(response, VoteResponse) and not response.vote_granted


def test_an_election_state_older_than_the_log_starts_unattached_at_the_log_epoch() -> None:
    core = make_core(election=ElectionState(2), log=log_with([(2, 0), (5, 4)], 8))
    out = core.start(0)
    assert state_of(core) is StateKind.UNATTACHED and core.epoch == 5
    assert out.election_state == ElectionState(5)


def test_observers_never_vote_or_campaign() -> None:
    core = make_core(node_id=9)
    core.start(0)
    assert sent_requests(core.poll(0), FetchRequest)  # asks a voter who leads
    core.poll(10_000)
    assert state_of(core) is StateKind.UNATTACHED
    response = only_response(core.handle_request(1, VoteRequest(CLUSTER, 1, 2, 9, 0, 0), 1)).response
    assert response.error_code is ErrorCode.INCONSISTENT_VOTER_SET


# --------------------------------------------------------------------------- leader: fetch validation


def _leader_with_log() -> tuple[RaftCore, int]:
    # Log: epoch 1 at [0, 5), epoch 3 at [5, 10); this node wins epoch 4 and appends LeaderChange at 10.
    core = make_core(election=ElectionState(3), log=log_with([(1, 0), (3, 5)], 10))
    now = elect(core)
    assert core.epoch == 4
    return core, now


@pytest.mark.parametrize(
    ("fetch_offset", "last_epoch", "expected"),
    [
        (8, 2, EpochEndOffset(1, 5)),  # epoch 2 unknown here: end of the largest epoch below it
        (12, 3, EpochEndOffset(3, 10)),  # follower has more epoch-3 entries than the leader
        (6, 1, EpochEndOffset(1, 5)),  # follower kept epoch 1 past where the leader's epoch 1 ends
    ],
)
def test_a_diverged_fetch_gets_the_epoch_end_offset(
    fetch_offset: int, last_epoch: int, expected: EpochEndOffset
) -> None:
    core, now = _leader_with_log()
    out = core.handle_request(7, FetchRequest(CLUSTER, 2, 4, fetch_offset, last_epoch), now)
    response = only_response(out).response
    assert isinstance(response, FetchResponse) and response.diverging_epoch == expected


def test_a_consistent_fetch_gets_records_read_from_its_offset() -> None:
    core, now = _leader_with_log()
    message = only_response(core.handle_request(7, FetchRequest(CLUSTER, 2, 4, 5, 1), now))
    assert isinstance(message.response, FetchResponse) and message.response.diverging_epoch is None
    assert message.read_log is not None and message.read_log.offset == 5


def test_a_fetch_below_the_log_start_gets_the_snapshot_id() -> None:
    log = log_with([(3, 20)], 30, start_offset=20)
    log.snapshot = SnapshotId(20, 2)
    core = make_core(election=ElectionState(3), log=log)
    now = elect(core)
    response = only_response(core.handle_request(7, FetchRequest(CLUSTER, 2, 4, 3, 1), now)).response
    assert isinstance(response, FetchResponse) and response.snapshot_id == SnapshotId(20, 2)


def test_leader_only_requests_report_epoch_errors() -> None:
    core, now = _leader_with_log()
    older = only_response(core.handle_request(1, FetchRequest(CLUSTER, 2, 3, 0, 0), now)).response
    newer = only_response(core.handle_request(2, FetchRequest(CLUSTER, 2, 9, 0, 0), now)).response
    assert older.error_code is ErrorCode.FENCED_LEADER_EPOCH
    assert newer.error_code is ErrorCode.UNKNOWN_LEADER_EPOCH
    follower = make_core(node_id=2)
    follower.start(0)
    not_leader = only_response(follower.handle_request(3, FetchRequest(CLUSTER, 3, 0, 0, 0), 1)).response
    assert not_leader.error_code is ErrorCode.NOT_LEADER_OR_FOLLOWER


# --------------------------------------------------------------------------- high watermark


def test_the_high_watermark_needs_a_majority_and_a_record_of_the_leaders_epoch() -> None:
    core, now = _leader_with_log()  # LeaderChange at offset 10: epoch start offset
    core.handle_request(1, FetchRequest(CLUSTER, 2, 4, 10, 3), now)
    assert core.high_watermark == 0  # leader's own LeaderChange not flushed yet
    core.on_flushed(11, now)
    assert core.high_watermark == 0  # majority offset 10 is not past the epoch start
    core.handle_request(2, FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=0), now)
    assert core.high_watermark == 11


def test_observers_do_not_count_towards_the_high_watermark() -> None:
    core, now = _leader_with_log()
    core.on_flushed(11, now)
    core.handle_request(1, FetchRequest(CLUSTER, 9, 4, 11, 4, max_wait_ms=0), now)
    assert core.high_watermark == 0
    core.handle_request(2, FetchRequest(CLUSTER, 3, 4, 11, 4, max_wait_ms=0), now)
    assert core.high_watermark == 11


def test_the_high_watermark_never_goes_back_when_a_follower_refetches_lower() -> None:
    core, now = _leader_with_log()
    core.on_flushed(11, now)
    core.handle_request(1, FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=0), now)
    assert core.high_watermark == 11
    core.handle_request(2, FetchRequest(CLUSTER, 2, 4, 10, 3, max_wait_ms=0), now)
    assert core.high_watermark == 11


# --------------------------------------------------------------------------- follower: divergence


def _follower(log: LogMeta, leader_epoch: int = 4) -> tuple[RaftCore, Sent[FetchRequest]]:
    core = make_core(node_id=2, election=ElectionState(leader_epoch - 1), log=log)
    core.start(0)
    out = core.handle_request(1, BeginQuorumEpochRequest(CLUSTER, 1, leader_epoch, 2), 1)
    return core, sent_requests(out, FetchRequest)[0]


def test_a_follower_truncates_to_the_smaller_of_both_epoch_ends() -> None:
    core, fetch = _follower(log_with([(1, 0), (2, 5)], 10))
    response = FetchResponse(ErrorCode.NONE, "", 1, 4, 0, 0, b"", EpochEndOffset(1, 7))
    out = core.handle_response(fetch.correlation_id, response, 2)
    assert TruncateTo(5) in out.log_ops  # local epoch 1 ends at 5
    refetch = sent_requests(out, FetchRequest)[0].request
    assert (refetch.fetch_offset, refetch.last_fetched_epoch) == (5, 1)


def test_a_follower_truncates_to_the_leaders_end_of_a_shared_epoch() -> None:
    core, fetch = _follower(log_with([(1, 0), (2, 5)], 10))
    response = FetchResponse(ErrorCode.NONE, "", 1, 4, 0, 0, b"", EpochEndOffset(2, 8))
    out = core.handle_response(fetch.correlation_id, response, 2)
    assert TruncateTo(8) in out.log_ops


def test_a_follower_refuses_to_truncate_below_its_high_watermark() -> None:
    core, fetch = _follower(log_with([(1, 0), (2, 5)], 10))
    core.high_watermark = 9
    response = FetchResponse(ErrorCode.NONE, "", 1, 4, 9, 0, b"", EpochEndOffset(1, 5))
    with pytest.raises(LogInvariantError):
        core.handle_response(fetch.correlation_id, response, 2)


def test_a_follower_fetches_the_next_offset_only_after_flushing() -> None:
    core, fetch = _follower(log_with([(1, 0)], 3))
    records = batch_bytes(3, 2, 4)
    out = core.handle_response(
        fetch.correlation_id, FetchResponse(ErrorCode.NONE, "", 1, 4, 4, 0, records), 2
    )
    assert out.log_ops == [AppendFetched(3, 4, records)] and out.flush
    assert not sent_requests(out, FetchRequest)
    assert core.high_watermark == 4
    out = core.on_flushed(5, 3)
    assert sent_requests(out, FetchRequest)[0].request.fetch_offset == 5


def test_corrupt_fetched_bytes_are_dropped_and_refetched_later() -> None:
    core, fetch = _follower(log_with([(1, 0)], 3))
    corrupt = bytearray(batch_bytes(3, 2, 4))
    corrupt[-1] ^= 0xFF
    out = core.handle_response(
        fetch.correlation_id, FetchResponse(ErrorCode.NONE, "", 1, 4, 4, 0, bytes(corrupt)), 2
    )
    assert not out.log_ops and core.log.end_offset == 3
    assert sent_requests(core.poll(2 + 20), FetchRequest)


# --------------------------------------------------------------------------- check-quorum, resignation


def test_a_leader_not_fetched_from_by_a_majority_resigns() -> None:
    core, now = _leader_with_log()
    core.poll(now + 299)
    assert state_of(core) is StateKind.LEADER
    out = core.poll(now + 300)  # 1.5 x fetch timeout
    assert state_of(core) is StateKind.RESIGNED and out.lost_leadership
    ends = sent_requests(out, EndQuorumEpochRequest)
    assert {m.dest for m in ends} == {2, 3}


def test_fetches_from_a_majority_keep_the_leader() -> None:
    core, now = _leader_with_log()
    for step in range(1, 6):
        core.handle_request(step, FetchRequest(CLUSTER, 2, 4, 10, 3, max_wait_ms=0), now + step * 100)
        core.poll(now + step * 100)
    assert state_of(core) is StateKind.LEADER


def test_appends_fail_on_a_non_leader_and_batch_within_the_linger() -> None:
    follower = make_core()
    follower.start(0)
    with pytest.raises(NotLeaderError):
        follower.append([b"x"], 0)
    core, now = _leader_with_log()
    assert core.append([b"a"], now) == 11
    assert core.append([b"b", b"c"], now + 1) == 13
    assert not core.poll(now + 4).log_ops
    out = core.poll(now + 5)
    assert out.log_ops == [AppendRecords(11, 4, (b"a", b"b", b"c"))]


def test_a_parked_fetch_answers_when_data_arrives_or_its_wait_expires() -> None:
    core, now = _leader_with_log()
    core.on_flushed(11, now)
    # Fetchers that know every commit up to their log end: only data or the wait's end answers them.
    out = core.handle_request(5, FetchRequest(CLUSTER, 2, 4, 11, 4, max_wait_ms=30, high_watermark=11), now)
    assert not [m for m in out.send_now if isinstance(m, OutboundResponse)]
    core.append([b"x"], now)
    out = core.poll(now + 5)
    message = only_response(out)
    assert message.request_id == 5 and message.read_log is not None and message.read_log.offset == 11
    core.handle_request(6, FetchRequest(CLUSTER, 3, 4, 12, 4, max_wait_ms=30, high_watermark=12), now + 5)
    assert core.poll(now + 34).send_now == []
    empty = only_response(core.poll(now + 35))
    assert empty.request_id == 6 and empty.read_log is None
