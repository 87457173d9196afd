"""Group commit on the leader (issue #17): the core decides when the pending appends become a batch.

Rule under test (``LeaderRole.batch_due``): with no flush in flight an append is written in the very next
output; while a flush is in flight appends gather and are cut, as one batch, right after it completes
(``on_flushed`` asks for an immediate poll); the linger bound and a full batch cut at once anyway.  Every
step passes its time explicitly, so these are statements about the core alone, not about any clock.
"""

from __future__ import annotations

from typing import Any

from kraft.errors import ErrorCode
from kraft.raft.core import RaftCore
from kraft.raft.core_log import EpochEntry, LogMeta
from kraft.raft.core_output import (
    AppendLeaderChange,
    AppendRecords,
    OutboundRequest,
    OutboundResponse,
    Output,
)
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import scan_kafka_batches
from kraft.raft.messages import FetchRequest, FetchResponse, VoteRequest, VoteResponse
from kraft.raft.state import ElectionState, StateKind

CLUSTER = "c1"
LINGER_MS = 25  # the shipped default of controller.quorum.append.linger.ms
EPOCH = 4  # the epoch elect() wins (the log below ends in epoch 3)
LEADER_CHANGE_AT = 10  # the log ends at 10, so the leader's LeaderChange batch is offset 10


class FixedRng:
    def random(self) -> float:
        return 0.5


def leader(voters: tuple[int, ...] = (1, 2, 3), **overrides: int) -> tuple[RaftCore, int]:
    """A core that has just won epoch 4 with a 10-record log; returns it and the time it won.

    Its LeaderChange batch is written and its flush asked for, but not yet reported: a flush is in flight.
    """
    settings: dict[str, Any] = {
        "election_timeout_ms": 100,
        "fetch_timeout_ms": 200,
        "append_linger_ms": LINGER_MS,
    }
    config = RaftConfig(node_id=1, voters=voters, cluster_id=CLUSTER, **{**settings, **overrides})
    log = LogMeta(0, 10, 10, [EpochEntry(1, 0), EpochEntry(3, 5)])
    core = RaftCore(config, FixedRng(), scan_kafka_batches, ElectionState(3), log)
    now = 0
    core.start(now)
    now += 150  # FixedRng: every election timeout is 150 ms
    out = core.poll(now)
    for pre_vote in (True, False):
        if core.state is StateKind.LEADER:  # a sole voter needs no votes
            break
        messages = [*out.send_now, *out.send_after_persist]
        requests = [m for m in messages if isinstance(m, OutboundRequest)]
        vote = next(m for m in requests if isinstance(m.request, VoteRequest))
        epoch = core.epoch
        out = core.handle_response(
            vote.correlation_id, VoteResponse(ErrorCode.NONE, "", -1, epoch, True, pre_vote), now
        )
    assert core.state is StateKind.LEADER and core.epoch == EPOCH
    assert out.flush and any(isinstance(op, AppendLeaderChange) for op in out.log_ops)
    return core, now


def idle_leader(**overrides: Any) -> tuple[RaftCore, int]:
    """A leader whose every write is durable (its LeaderChange flush came back): no flush in flight."""
    core, now = leader(**overrides)
    out = core.on_flushed(LEADER_CHANGE_AT + 1, now)
    assert not out.log_ops and not out.flush
    return core, now


def appended(out: Output) -> list[tuple[int, tuple[bytes, ...]]]:
    """(base offset, records) of every data batch the output writes."""
    return [(op.base_offset, op.records) for op in out.log_ops if isinstance(op, AppendRecords)]


def test_an_append_while_idle_is_written_in_the_same_output() -> None:
    core, now = idle_leader()
    assert core.append([b"a"], now) == 11
    out = core.take_output(now)
    assert appended(out) == [(11, (b"a",))]
    assert out.flush  # the one fsync this lone write pays; no linger before it
    assert out.log_ops == [AppendRecords(11, EPOCH, (b"a",))]


def test_appends_before_the_driver_takes_the_output_share_the_idle_batch() -> None:
    # The cut is deferred to take_output, so every append that lands before the driver wakes joins it.
    core, now = idle_leader()
    core.append([b"a"], now)
    core.append([b"b", b"c"], now)
    assert appended(core.take_output(now)) == [(11, (b"a", b"b", b"c"))]


def test_appends_while_a_flush_is_in_flight_are_held_and_written_as_one_batch_when_it_completes() -> None:
    core, now = idle_leader()
    core.append([b"a"], now)
    first = core.take_output(now)
    assert appended(first) == [(11, (b"a",))] and first.flush  # flush of [11, 12) in flight now

    assert core.append([b"b"], now + 1) == 12
    held = core.take_output(now + 1)
    assert held.log_ops == [] and not held.flush
    assert held.next_deadline_ms <= now + 1 + LINGER_MS  # the linger bound is still armed
    assert core.append([b"c", b"d"], now + 2) == 14
    assert core.take_output(now + 2).log_ops == []
    assert core.poll(now + 3).log_ops == []  # a poll before the flush completes changes nothing

    done = core.on_flushed(12, now + 4)
    # Not inside on_flushed's own output: the driver first takes what queued up during the fsync ...
    assert done.log_ops == [] and not done.flush
    # ... but it asks to be polled at once, and that poll writes everything held as one batch.
    assert done.next_deadline_ms == now + 4
    cut = core.poll(now + 4)
    assert appended(cut) == [(12, (b"b", b"c", b"d"))] and cut.flush


def test_a_fetch_parked_during_the_flush_is_answered_with_the_held_batch_when_it_is_cut() -> None:
    core, now = idle_leader()
    core.append([b"a"], now)
    core.take_output(now)
    # A caught-up observer long-polls at the end of the log while the flush of [11, 12) runs (an
    # observer, so that the flush completing moves no high watermark, which would answer it with no data).
    parked = core.handle_request(7, FetchRequest(CLUSTER, 9, EPOCH, 12, EPOCH, max_wait_ms=500), now + 1)
    assert not [m for m in parked.send_now if isinstance(m, OutboundResponse)]
    core.append([b"b"], now + 1)
    core.take_output(now + 1)
    core.on_flushed(12, now + 2)
    cut = core.poll(now + 2)
    assert appended(cut) == [(12, (b"b",))]
    answers = [m for m in cut.send_now if isinstance(m, OutboundResponse)]
    assert [m.request_id for m in answers] == [7]
    assert isinstance(answers[0].response, FetchResponse)
    assert answers[0].read_log is not None and answers[0].read_log.offset == 12


def test_the_linger_bound_cuts_a_batch_while_a_flush_is_still_in_flight() -> None:
    core, now = idle_leader()
    core.append([b"a"], now)
    core.take_output(now)  # flush of [11, 12) in flight, and it does not come back
    core.append([b"b"], now + 1)  # the bound counts from the first held record: now + 1 + 25
    out = core.take_output(now + 1)
    assert out.log_ops == [] and out.next_deadline_ms == now + 1 + LINGER_MS
    core.append([b"c"], now + 10)  # a later record does not extend the bound
    assert core.poll(now + LINGER_MS).log_ops == []
    cut = core.poll(now + 1 + LINGER_MS)
    assert appended(cut) == [(12, (b"b", b"c"))] and cut.flush


def test_records_wait_for_every_flush_in_flight_not_just_the_first() -> None:
    # Two flushes in flight (the linger cut a second batch): the first completing is not enough.
    core, now = idle_leader()
    core.append([b"a"], now)
    core.take_output(now)
    core.append([b"b"], now)
    core.poll(now + LINGER_MS)  # [12, 13) cut by the bound; flushes of [11, 12) and [12, 13) in flight
    core.append([b"c"], now + LINGER_MS)
    partial = core.on_flushed(12, now + LINGER_MS + 1)
    assert partial.log_ops == [] and partial.next_deadline_ms > now + LINGER_MS + 1
    assert core.poll(now + LINGER_MS + 1).log_ops == []
    core.on_flushed(13, now + LINGER_MS + 2)
    assert appended(core.poll(now + LINGER_MS + 2)) == [(13, (b"c",))]


def test_a_full_batch_is_cut_at_once_even_while_a_flush_is_in_flight() -> None:
    core, now = idle_leader(max_batch_records=4)
    core.append([b"a"], now)
    core.take_output(now)  # flush in flight
    core.append([b"b", b"c"], now + 1)
    assert core.take_output(now + 1).log_ops == []
    core.append([b"d", b"e"], now + 2)  # 4 records: full
    out = core.take_output(now + 2)
    assert appended(out) == [(12, (b"b", b"c", b"d", b"e"))] and out.flush


def test_a_batch_full_by_bytes_is_cut_at_once_too() -> None:
    core, now = idle_leader(max_batch_bytes=1000)
    core.append([b"a"], now)
    core.take_output(now)
    core.append([b"x" * 600], now + 1)
    assert core.take_output(now + 1).log_ops == []
    core.append([b"y" * 400], now + 2)
    assert appended(core.take_output(now + 2)) == [(12, (b"x" * 600, b"y" * 400))]


def test_a_zero_linger_never_holds_an_append() -> None:
    core, now = idle_leader(append_linger_ms=0)
    core.append([b"a"], now)
    core.take_output(now)  # flush in flight
    core.append([b"b"], now)
    assert appended(core.take_output(now)) == [(12, (b"b",))]


def test_appends_right_after_election_wait_for_the_leader_change_flush() -> None:
    core, now = leader()  # the LeaderChange flush is in flight
    core.append([b"a"], now)
    assert core.take_output(now).log_ops == []
    core.on_flushed(LEADER_CHANGE_AT + 1, now + 1)
    assert appended(core.poll(now + 1)) == [(11, (b"a",))]


def test_a_batch_written_at_once_still_commits_only_once_it_is_durable() -> None:
    # Group commit changes when batches are written, never what the high watermark may cover.
    core, now = idle_leader(voters=(1,))
    assert core.high_watermark == LEADER_CHANGE_AT + 1
    core.append([b"a"], now)
    out = core.take_output(now)
    assert appended(out) == [(11, (b"a",))] and out.high_watermark is None
    assert core.high_watermark == LEADER_CHANGE_AT + 1  # written, not durable: not committed
    assert core.on_flushed(12, now + 1).high_watermark == 12


# ---- held (bulk) appends: consecutive bulk slices share a batch ----


def test_held_appends_wait_for_the_linger_bound_even_with_no_flush_in_flight() -> None:
    core, now = idle_leader()
    assert core.append([b"a"], now, hold=True) == 11
    out = core.take_output(now)
    assert out.log_ops == [] and not out.flush  # idle, but held: not cut at the next output
    assert out.next_deadline_ms <= now + LINGER_MS
    core.append([b"b", b"c"], now + 10, hold=True)
    assert core.take_output(now + 10).log_ops == [] and core.poll(now + LINGER_MS - 1).log_ops == []
    cut = core.poll(now + LINGER_MS)  # the bound counts from the first held record
    assert appended(cut) == [(11, (b"a", b"b", b"c"))] and cut.flush


def test_an_append_that_is_not_held_ends_the_hold_and_takes_the_held_records_along() -> None:
    # A heartbeat's record between two bulk slices is never delayed by them.
    core, now = idle_leader()
    core.append([b"bulk"], now, hold=True)
    assert core.take_output(now).log_ops == []
    assert core.append([b"beat"], now + 1) == 12
    assert appended(core.take_output(now + 1)) == [(11, (b"bulk", b"beat"))]
    # and the next held record starts a new hold (an idle log again once that flush came back)
    core.on_flushed(13, now + 2)
    core.append([b"more"], now + 3, hold=True)
    assert core.take_output(now + 3).log_ops == []
    core.append([b"last"], now + 4)  # the bulk job's last slice: not held
    assert appended(core.take_output(now + 4)) == [(13, (b"more", b"last"))]


def test_held_appends_are_cut_at_once_when_the_batch_is_full() -> None:
    core, now = idle_leader(max_batch_records=4)
    core.append([b"a", b"b"], now, hold=True)
    assert core.take_output(now).log_ops == []
    core.append([b"c", b"d"], now + 1, hold=True)
    assert appended(core.take_output(now + 1)) == [(11, (b"a", b"b", b"c", b"d"))]


def test_ending_the_hold_cuts_the_held_records_at_the_next_output() -> None:
    # A bulk job whose last slice wrote nothing: its held slices go now, not at the linger bound.
    core, now = idle_leader()
    core.append([b"a"], now, hold=True)
    assert core.take_output(now).log_ops == []
    core.end_hold(now + 1)
    cut = core.take_output(now + 1)
    assert appended(cut) == [(11, (b"a",))] and cut.flush
    core.end_hold(now + 2)  # nothing held: nothing happens
    assert core.take_output(now + 2).log_ops == []


def test_ending_the_hold_during_a_flush_cuts_once_that_flush_completes() -> None:
    core, now = idle_leader()
    core.append([b"a"], now)
    assert appended(core.take_output(now)) == [(11, (b"a",))]  # its flush is now in flight
    core.append([b"b"], now + 1, hold=True)
    core.end_hold(now + 2)
    assert core.take_output(now + 2).log_ops == []  # waits for the flush, as any append
    core.on_flushed(12, now + 3)
    assert appended(core.take_output(now + 3)) == [(12, (b"b",))]


def test_ending_the_hold_is_a_no_op_on_a_follower() -> None:
    core, now = idle_leader()
    core.end_hold(now)  # leader, nothing pending
    assert core.take_output(now).log_ops == []
