"""The roles as pure decision makers: given the state they read, the decisions they return.

No :class:`~kraft.raft.core.RaftCore` here — each role is driven directly, and the test applies the
decisions to a :class:`LogMeta` and a high watermark the way the core does.
"""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from kraft.errors import ErrorCode
from kraft.raft.core_decisions import (
    AdvanceHighWatermark,
    AppendToLog,
    BecomeCandidate,
    BecomeLeader,
    Decisions,
    FetchAgain,
    ResetElectionRetries,
    ResetToSnapshot,
    Respond,
    RespondError,
    SendFetch,
    SendRequest,
    TruncateLog,
    WriteChunk,
)
from kraft.raft.core_election import ElectionOutcome, ElectionRole
from kraft.raft.core_fetcher import FetcherRole
from kraft.raft.core_leader import LeaderRole, next_high_watermark
from kraft.raft.core_log import EpochEntry, LogMeta
from kraft.raft.core_output import AppendFetched, AppendLeaderChange, AppendRecords, WriteSnapshotChunk
from kraft.raft.core_types import BatchInfo, RaftConfig
from kraft.raft.messages import (
    BeginQuorumEpochRequest,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.quorum import majority

CLUSTER = "c1"


class FixedRng:
    def random(self) -> float:
        return 0.5


def config(node_id: int = 1, voters: tuple[int, ...] = (1, 2, 3), **overrides: Any) -> RaftConfig:
    return RaftConfig(node_id=node_id, voters=voters, cluster_id=CLUSTER, **overrides)


def apply_to_log(log: LogMeta, decisions: Decisions) -> None:
    """What the core does with the log-changing decisions."""
    for decision in decisions:
        if isinstance(decision, AppendToLog):
            for batch in decision.batches:
                log.append(batch.base_offset, batch.last_offset, batch.epoch)
        elif isinstance(decision, TruncateLog):
            log.truncate_to(decision.end_offset)
        elif isinstance(decision, ResetToSnapshot):
            log.reset_to_snapshot(decision.snapshot_id)


def fetch_responses(decisions: Decisions) -> list[FetchResponse]:
    return [d.response for d in decisions if isinstance(d, Respond) and isinstance(d.response, FetchResponse)]


# --------------------------------------------------------------------------- ElectionRole


def test_an_election_asks_every_other_voter_and_only_a_real_vote_waits_for_persistence() -> None:
    log = LogMeta(0, 4, 4, [EpochEntry(2, 0)])
    for pre_vote in (True, False):
        role = ElectionRole(config(), 3, pre_vote=pre_vote)
        decisions = role.start(log)
        assert [d.dest for d in decisions if isinstance(d, SendRequest)] == [2, 3]
        for decision in decisions:
            assert isinstance(decision, SendRequest) and isinstance(decision.request, VoteRequest)
            assert decision.after_persist is not pre_vote
            assert decision.request.candidate_epoch == (4 if pre_vote else 3)
            assert (decision.request.last_offset_epoch, decision.request.last_offset) == (2, 4)


def test_a_won_pre_vote_leads_to_candidacy_and_a_won_vote_to_leadership() -> None:
    pre_vote = ElectionRole(config(), 3, pre_vote=True)
    assert pre_vote.tally(3, VoteResponse(ErrorCode.NONE, "", -1, 3, True, True)) is ElectionOutcome.WON
    assert pre_vote.transition_for_win() == BecomeCandidate()
    vote = ElectionRole(config(), 4, pre_vote=False)
    assert vote.tally(3, VoteResponse(ErrorCode.NONE, "", -1, 4, True)) is ElectionOutcome.WON
    assert vote.transition_for_win() == BecomeLeader((1, 3))


def test_a_conceded_election_asks_nobody_again() -> None:
    role = ElectionRole(config(), 3, pre_vote=False)
    role.on_failed(2, 10)
    assert role.next_deadline_ms() == 10
    role.concede()
    role.on_failed(3, 20)
    assert role.poll(100, LogMeta()) == [] and role.retry_at_ms == {}


def test_a_failed_vote_request_is_retried_only_to_voters_that_have_not_answered() -> None:
    role = ElectionRole(config(voters=(1, 2, 3, 4, 5)), 3, pre_vote=False)
    role.start(LogMeta())
    role.on_failed(2, 10)
    role.on_failed(3, 10)
    role.tally(3, VoteResponse(ErrorCode.NONE, "", -1, 3, False))
    assert role.poll(9, LogMeta()) == []
    assert [d.dest for d in role.poll(10, LogMeta()) if isinstance(d, SendRequest)] == [2]


@given(st.integers(1, 9), st.data())
def test_an_election_is_won_exactly_by_a_majority_and_lost_once_a_majority_is_out_of_reach(
    voter_count: int, data: st.DataObject
) -> None:
    voters = tuple(range(1, voter_count + 1))
    role = ElectionRole(config(voters=voters), 1, pre_vote=False)
    answers = data.draw(st.lists(st.booleans(), min_size=voter_count - 1, max_size=voter_count - 1))
    for voter, granted in zip(voters[1:], answers, strict=True):
        outcome = role.tally(voter, VoteResponse(ErrorCode.NONE, "", -1, 1, granted))
        grants = 1 + sum(answers[: voter - 1])
        refusals = (voter - 1) - sum(answers[: voter - 1])
        if grants >= majority(voter_count):
            assert outcome is ElectionOutcome.WON
        elif voter_count - refusals < majority(voter_count):
            assert outcome is ElectionOutcome.LOST
        else:
            assert outcome is ElectionOutcome.PENDING


# --------------------------------------------------------------------------- LeaderRole


def started_leader(
    voters: tuple[int, ...] = (1, 2, 3), end_offset: int = 0, **overrides: Any
) -> tuple[LeaderRole, LogMeta]:
    log = LogMeta(0, end_offset, end_offset, [EpochEntry(1, 0)] if end_offset else [])
    role = LeaderRole(config(voters=voters, **overrides), 2, end_offset, (1, 2))
    apply_to_log(log, role.start(0))
    return role, log


def test_a_new_leader_appends_its_leader_change_then_announces_itself_after_persisting() -> None:
    role = LeaderRole(config(), 2, 5, (1, 2))
    decisions = role.start(0)
    assert decisions[0] == AppendToLog(AppendLeaderChange(5, 2, 1, (1, 2, 3), (1, 2)), (BatchInfo(5, 5, 2),))
    announcements = decisions[1:]
    assert [d.dest for d in announcements if isinstance(d, SendRequest)] == [2, 3]
    assert all(
        isinstance(d, SendRequest) and d.after_persist and isinstance(d.request, BeginQuorumEpochRequest)
        for d in announcements
    )


def test_the_high_watermark_waits_for_the_leaders_own_flush_and_the_epoch_start() -> None:
    role, log = started_leader(end_offset=10)  # LeaderChange at 10
    decisions = role.handle_fetch(1, FetchRequest(CLUSTER, 2, 2, 11, 2, 0), 1, log, 0)
    assert not any(isinstance(d, AdvanceHighWatermark) for d in decisions)  # leader not flushed
    log.mark_flushed(11)
    decisions, high_watermark = role.maybe_advance_high_watermark(log, 0)
    assert decisions == [AdvanceHighWatermark(11)] and high_watermark == 11
    assert role.maybe_advance_high_watermark(log, 11) == ([], 11)


def test_a_fetch_that_moves_the_high_watermark_is_answered_with_the_new_one() -> None:
    role, log = started_leader()
    log.mark_flushed(1)
    decisions = role.handle_fetch(1, FetchRequest(CLUSTER, 2, 2, 1, 2, 0), 1, log, 0)
    assert decisions[0] == AdvanceHighWatermark(1)
    assert [r.high_watermark for r in fetch_responses(decisions)] == [1]


def _long_poll(replica_id: int, fetch_offset: int, known: int | None) -> FetchRequest:
    return FetchRequest(CLUSTER, replica_id, 2, fetch_offset, 2, 500, high_watermark=known)


def test_a_long_poll_that_moves_the_high_watermark_is_answered_at_once_with_it() -> None:
    # Nothing new to send, but the fetcher (of a version that does not say what it knows) would
    # otherwise learn the commit its own Fetch made only with the next write or the long poll's end.
    role, log = started_leader(fetch_high_watermark_wait_ms=0)
    log.mark_flushed(1)
    decisions = role.handle_fetch(1, _long_poll(2, 1, None), 1, log, 0)
    assert decisions[0] == AdvanceHighWatermark(1)
    assert [r.high_watermark for r in fetch_responses(decisions)] == [1] and role.parked == {}
    # The next one moves nothing: it parks (an older fetcher arriving after the move parks too).
    assert fetch_responses(role.handle_fetch(2, _long_poll(2, 1, None), 2, log, 1)) == []
    assert fetch_responses(role.handle_fetch(3, _long_poll(3, 1, None), 3, log, 1)) == []
    assert sorted(role.parked) == [2, 3]


def test_a_long_poll_that_knows_an_older_high_watermark_is_answered_at_once_then_parks() -> None:
    role, log = started_leader(fetch_high_watermark_wait_ms=0)
    log.mark_flushed(1)
    moved = role.handle_fetch(1, _long_poll(2, 1, 0), 1, log, 0)  # moves it, and knows 0
    assert [r.high_watermark for r in fetch_responses(moved)] == [1] and role.parked == {}
    # The other follower's Fetch arrives after the move: it knows 0, so it is answered too.
    late = role.handle_fetch(2, _long_poll(3, 1, 0), 2, log, 1)
    assert [d.request_id for d in late if isinstance(d, Respond)] == [2]
    assert [r.high_watermark for r in fetch_responses(late)] == [1]
    # Once they know it, their long polls park (no answer loop).
    for request_id, replica_id in ((3, 2), (4, 3)):
        assert fetch_responses(role.handle_fetch(request_id, _long_poll(replica_id, 1, 1), 3, log, 1)) == []
    assert sorted(role.parked) == [3, 4]
    # A fetcher that knows more than this leader (learned from the last one) parks as well.
    assert fetch_responses(role.handle_fetch(5, _long_poll(2, 1, 7), 4, log, 1)) == []


def test_a_long_poll_owed_a_high_watermark_waits_briefly_for_the_next_batch_to_carry_it() -> None:
    role, log = started_leader(fetch_high_watermark_wait_ms=10)
    log.mark_flushed(1)
    held = role.handle_fetch(1, _long_poll(2, 1, 0), 100, log, 0)
    assert held[0] == AdvanceHighWatermark(1) and fetch_responses(held) == []
    assert role.next_deadline_ms() == 110  # not the long poll's 600
    # The next batch within the wait answers it: its records and the high watermark in one response.
    role.append([b"a"], 105, log, 1)
    decisions, _end = role.drain_accumulator(log, 1)
    (answer,) = [d for d in decisions if isinstance(d, Respond)]
    assert answer.request_id == 1 and answer.read_log is not None and answer.read_log.offset == 1
    assert isinstance(answer.response, FetchResponse) and answer.response.high_watermark == 1
    # With no batch, the wait's end answers with the high watermark alone.
    apply_to_log(log, decisions)
    log.mark_flushed(2)
    role.handle_fetch(2, _long_poll(2, 2, 1), 120, log, 1)  # moves it to 2, knows 1
    assert role.poll(129, log, 2) == []
    (alone,) = fetch_responses(role.poll(130, log, 2))
    assert alone.high_watermark == 2 and alone.records == b""


def test_a_follower_fetches_with_the_high_watermark_it_knows() -> None:
    log = LogMeta(0, 3, 3, [EpochEntry(1, 0)])
    role = FetcherRole(config(), 4, FixedRng(), 2)
    (decision,) = role.start(0, log, 2)
    assert isinstance(decision, SendFetch) and isinstance(decision.request, FetchRequest)
    assert decision.request.high_watermark == 2


def test_a_full_accumulator_is_cut_into_one_batch_and_answers_waiting_fetches() -> None:
    role, log = started_leader()
    log.mark_flushed(1)
    role.handle_fetch(1, FetchRequest(CLUSTER, 2, 2, 1, 2, 0), 1, log, 0)
    parked = role.handle_fetch(2, FetchRequest(CLUSTER, 3, 2, 1, 2, 500), 2, log, 1)
    assert fetch_responses(parked) == [] and role.next_deadline_ms() <= 502
    assert role.append([b"a"], 3, log, 1) == (1, [])
    last_offset, decisions = role.append([b"b"] * 1999, 3, log, 1)
    assert last_offset == 2000
    assert decisions[0] == AppendToLog(
        AppendRecords(1, 2, (b"a",) + (b"b",) * 1999), (BatchInfo(1, 2000, 2),)
    )
    answered = [d for d in decisions if isinstance(d, Respond)]
    assert [d.request_id for d in answered] == [2]
    assert answered[0].read_log is not None and answered[0].read_log.offset == 1


def test_a_lingering_batch_is_cut_at_the_linger_deadline() -> None:
    role, log = started_leader()
    role.append([b"a"], 10, log, 0)
    assert role.poll(34, log, 0) == []
    decisions = role.poll(35, log, 0)
    assert decisions[0] == AppendToLog(AppendRecords(1, 2, (b"a",)), (BatchInfo(1, 1, 2),))


def test_a_fetch_for_a_missing_snapshot_is_refused() -> None:
    role, log = started_leader()
    decisions = role.handle_fetch_snapshot(
        1, FetchSnapshotRequest(CLUSTER, 2, 2, SnapshotId(5, 1), 0), 1, log
    )
    assert len(decisions) == 1 and isinstance(decisions[0], RespondError)
    assert decisions[0].code is ErrorCode.SNAPSHOT_NOT_FOUND


@given(
    st.sampled_from([(1, 2, 3), (1, 2, 3, 4, 5), (1, 2), (1,)]),
    st.lists(st.tuples(st.sampled_from(["append", "flush", "fetch"]), st.integers(0, 50)), max_size=60),
)
def test_the_high_watermark_never_decreases_and_never_passes_a_majoritys_durable_offset(
    voters: tuple[int, ...], steps: list[tuple[str, int]]
) -> None:
    role, log = started_leader(voters)
    high_watermark = 0
    durable = {voter: -1 for voter in voters}  # reported durable ends (followers: last fetch offset)
    for now, (action, value) in enumerate(steps, start=1):
        decisions: Decisions = []
        if action == "append":
            decisions = role.append([b"x"] * (value + 1), now, log, high_watermark)[1]
            decisions += role.drain_accumulator(log, high_watermark)[0] if role.pending_records else []
        elif action == "flush":
            log.mark_flushed(log.end_offset)
            decisions = role.maybe_advance_high_watermark(log, high_watermark)[0]
        elif len(voters) > 1:
            follower = voters[1 + value % (len(voters) - 1)]
            offset = min(value, log.end_offset)
            durable[follower] = offset
            request = FetchRequest(CLUSTER, follower, 2, offset, 2, 0)
            decisions = role.handle_fetch(now, request, now, log, high_watermark)
        durable[1] = log.flushed_end
        for decision in decisions:
            if isinstance(decision, AdvanceHighWatermark):
                assert decision.offset > high_watermark
                assert decision.offset > role.epoch_start_offset
                # when the leader decides it, a majority has durably reached it
                assert sum(1 for offset in durable.values() if offset >= decision.offset) >= majority(
                    len(voters)
                )
                high_watermark = decision.offset
            elif isinstance(decision, Respond) and isinstance(decision.response, FetchResponse):
                # answers carry the high watermark decided so far, never a stale one
                assert decision.response.high_watermark == high_watermark
        apply_to_log(log, decisions)


@given(st.lists(st.integers(-1, 100), min_size=1, max_size=7), st.integers(-1, 100), st.integers(0, 100))
def test_next_high_watermark_only_moves_forward_to_an_offset_a_majority_reached(
    offsets: list[int], epoch_start: int, high_watermark: int
) -> None:
    advanced = next_high_watermark(offsets, epoch_start, high_watermark)
    if advanced is not None:
        assert advanced > high_watermark and advanced > epoch_start
        assert sum(1 for offset in offsets if offset >= advanced) >= majority(len(offsets))
    else:
        best = max(x for x in offsets if sum(1 for o in offsets if o >= x) >= majority(len(offsets)))
        assert best <= high_watermark or best <= epoch_start


# --------------------------------------------------------------------------- FetcherRole


def follower(log: LogMeta) -> tuple[FetcherRole, int]:
    """A follower of node 2 at epoch 4 with its first fetch in flight; returns it and the correlation id."""
    role = FetcherRole(config(), 4, FixedRng(), 2)
    decisions = role.start(0, log, 0)
    assert len(decisions) == 1 and isinstance(decisions[0], SendFetch)
    role.on_sent(7)
    return role, 7


def scan(data: bytes) -> list[BatchInfo]:
    """Test format: ``base,last,epoch;`` per batch."""
    batches = []
    for part in data.decode().split(";"):
        if part:
            base, last, epoch = (int(x) for x in part.split(","))
            batches.append(BatchInfo(base, last, epoch))
    return batches


def answer(role: FetcherRole, log: LogMeta, response: FetchResponse, high_watermark: int = 0) -> Decisions:
    request = FetchRequest(CLUSTER, 1, 4, log.end_offset, log.last_epoch)
    return role.handle_fetch_response(7, 2, request, response, 5, log, high_watermark, scan)


def test_a_follower_fetches_from_its_log_end_and_waits_for_the_long_poll() -> None:
    log = LogMeta(0, 3, 3, [EpochEntry(1, 0)])
    role = FetcherRole(config(fetch_max_wait_ms=30), 4, FixedRng(), 2)
    (decision,) = role.start(0, log, 0)
    assert decision == SendFetch(
        2, FetchRequest(CLUSTER, 1, 4, 3, 1, 30, 8 * 1024 * 1024, high_watermark=0), extra_timeout_ms=30
    )
    role.on_sent(7)
    assert role.next_fetch(0, log, 0) == []  # one fetch at a time


def test_fetched_batches_are_appended_and_the_high_watermark_is_capped_by_the_new_log_end() -> None:
    log = LogMeta(0, 3, 3, [EpochEntry(1, 0)])
    role, _ = follower(log)
    decisions = answer(role, log, FetchResponse(ErrorCode.NONE, "", 2, 4, 9, 0, b"3,4,4;"))
    assert decisions == [
        ResetElectionRetries(),
        AppendToLog(AppendFetched(3, 4, b"3,4,4;"), (BatchInfo(3, 4, 4),)),
        AdvanceHighWatermark(5),
        FetchAgain(),
    ]
    apply_to_log(log, decisions)
    assert role.next_fetch(5, log, 0) == []  # nothing new is fetched before the append is durable
    log.mark_flushed(5)
    assert len(role.next_fetch(5, log, 0)) == 1


def test_batches_that_do_not_continue_the_log_are_dropped_and_fetched_again_after_the_backoff() -> None:
    log = LogMeta(0, 3, 3, [EpochEntry(1, 0)])
    role, _ = follower(log)
    for data in (b"4,5,4;", b"3,4,5;", b"garbage"):  # gap, epoch newer than the leader's, corrupt
        role, _ = follower(log)
        assert answer(role, log, FetchResponse(ErrorCode.NONE, "", 2, 4, 9, 0, data)) == [
            ResetElectionRetries()
        ]
        assert role.next_fetch(5, log, 0) == [] and len(role.next_fetch(25, log, 0)) == 1


def test_a_diverging_epoch_truncates_then_fetches_again_from_the_truncated_log() -> None:
    log = LogMeta(0, 10, 10, [EpochEntry(1, 0), EpochEntry(3, 5)])
    role, _ = follower(log)
    decisions = answer(role, log, FetchResponse(ErrorCode.NONE, "", 2, 4, 0, 0, b"", EpochEndOffset(1, 7)))
    assert decisions == [ResetElectionRetries(), TruncateLog(5), FetchAgain()]
    apply_to_log(log, decisions)
    (fetch,) = role.next_fetch(5, log, 0)
    assert isinstance(fetch, SendFetch) and isinstance(fetch.request, FetchRequest)
    assert (fetch.request.fetch_offset, fetch.request.last_fetched_epoch) == (5, 1)


def test_a_snapshot_download_writes_chunks_then_installs_and_raises_the_high_watermark() -> None:
    log = LogMeta(0, 3, 3, [EpochEntry(1, 0)])
    role, _ = follower(log)
    snapshot = SnapshotId(20, 3)
    decisions = answer(role, log, FetchResponse(ErrorCode.NONE, "", 2, 4, 0, 0, b"", None, snapshot))
    assert decisions == [ResetElectionRetries(), FetchAgain()]
    (request,) = role.next_fetch(5, log, 0)
    assert isinstance(request, SendFetch) and isinstance(request.request, FetchSnapshotRequest)
    role.on_sent(8)
    chunk = FetchSnapshotResponse(ErrorCode.NONE, "", 2, 4, snapshot, 6, 0, b"abc")
    assert role.handle_fetch_snapshot_response(8, chunk, 6) == [
        ResetElectionRetries(),
        WriteChunk(WriteSnapshotChunk(snapshot, 0, b"abc")),
        FetchAgain(),
    ]
    role.on_sent(9)
    last = FetchSnapshotResponse(ErrorCode.NONE, "", 2, 4, snapshot, 6, 3, b"def")
    assert role.handle_fetch_snapshot_response(9, last, 7) == [
        ResetElectionRetries(),
        WriteChunk(WriteSnapshotChunk(snapshot, 3, b"def")),
        ResetToSnapshot(snapshot),
        AdvanceHighWatermark(20),
        FetchAgain(),
    ]


def test_answers_to_superseded_fetches_are_ignored() -> None:
    log = LogMeta()
    role, _ = follower(log)
    request = FetchRequest(CLUSTER, 1, 4, 0, 0)
    response = FetchResponse(ErrorCode.NONE, "", 2, 4, 9)
    assert role.handle_fetch_response(6, 2, request, response, 5, log, 0, scan) == []
    assert role.inflight == 7


@given(st.integers(0, 20), st.integers(0, 40), st.integers(0, 5))
def test_a_follower_never_raises_its_high_watermark_past_its_log_end(
    end_offset: int, leader_high_watermark: int, appended: int
) -> None:
    log = LogMeta(0, end_offset, end_offset, [EpochEntry(1, 0)] if end_offset else [])
    role, _ = follower(log)
    data = f"{end_offset},{end_offset + appended - 1},4;".encode() if appended else b""
    decisions = answer(role, log, FetchResponse(ErrorCode.NONE, "", 2, 4, leader_high_watermark, 0, data))
    apply_to_log(log, decisions)
    advances = [d.offset for d in decisions if isinstance(d, AdvanceHighWatermark)]
    assert advances == [min(leader_high_watermark, log.end_offset)]
