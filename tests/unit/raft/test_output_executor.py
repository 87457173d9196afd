"""The one executor of the core's Output: the order of effects it pins, and that the driver runs on it."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import replace

import pytest
from raft_helpers import wait_until

import kraft.raft.driver as driver_module
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.raft.api import LeaderAndEpoch
from kraft.raft.core_output import (
    AppendLeaderChange,
    AppendRecords,
    LogRead,
    OutboundRequest,
    OutboundResponse,
    Output,
    TruncateTo,
)
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.executor import OutputPorts, execute_output, execute_output_now
from kraft.raft.memory import LoopbackNetwork, MemoryElectionStore, MemoryLogStore, MemorySnapshotStore
from kraft.raft.messages import FetchRequest, FetchResponse, SnapshotId, VoteRequest, VoteResponse
from kraft.raft.state import ElectionState

Call = tuple[str, object]


def recording_ports(calls: list[Call], on_flush: Callable[[], None] = lambda: None) -> OutputPorts:
    """Ports that only record what they were asked to do, in order (awaitables complete at once)."""

    async def write_log(op: object) -> None:
        calls.append(("write_log", op))

    async def persist_election(election: ElectionState) -> None:
        calls.append(("persist_election", election))

    async def flush() -> None:
        calls.append(("flush", None))
        on_flush()

    return OutputPorts(
        write_log=write_log,
        send=lambda message: calls.append(("send", message)),
        persist_election=persist_election,
        load_snapshot=lambda snapshot_id: calls.append(("load_snapshot", snapshot_id)),
        commit=lambda high_watermark: calls.append(("commit", high_watermark)),
        fail_pending_appends=lambda: calls.append(("fail_pending_appends", None)),
        announce_leader=lambda leader: calls.append(("announce_leader", leader)),
        wait_until=lambda deadline_ms: calls.append(("wait_until", deadline_ms)),
        flush=flush,
    )


def _fetch_answer(request_id: int) -> OutboundResponse:
    response = FetchResponse(ErrorCode.NONE, "", leader_id=1, leader_epoch=3, high_watermark=0)
    return OutboundResponse(request_id, response, read_log=LogRead(5, 1024))


_VOTE = OutboundResponse(7, VoteResponse(ErrorCode.NONE, "", leader_id=-1, leader_epoch=3, vote_granted=True))
_VOTE_REQUEST = OutboundRequest(
    2,
    11,
    VoteRequest("c", candidate_epoch=3, candidate_id=1, voter_id=2, last_offset_epoch=2, last_offset=5),
    100,
)
_FETCH = OutboundRequest(
    2, 12, FetchRequest("c", replica_id=1, current_leader_epoch=3, fetch_offset=5, last_fetched_epoch=2), 100
)


def test_every_effect_runs_in_the_documented_order() -> None:
    append = AppendRecords(5, 3, (b"x",))
    truncate = TruncateTo(5)
    election = ElectionState(3, voted_id=2)
    out = Output(
        log_ops=[truncate, append],
        send_now=[_fetch_answer(1), _FETCH],
        election_state=election,
        send_after_persist=[_VOTE, _VOTE_REQUEST],
        flush=True,
        high_watermark=4,
        leader_change=LeaderAndEpoch(2, 3),
        lost_leadership=True,
        installed_snapshot=SnapshotId(4, 2),
        next_deadline_ms=99,
    )
    calls: list[Call] = []
    execute_output_now(out, recording_ports(calls))
    assert calls == [
        ("write_log", truncate),
        ("write_log", append),
        ("send", _fetch_answer(1)),
        ("send", _FETCH),
        ("persist_election", election),
        ("send", _VOTE),
        ("send", _VOTE_REQUEST),
        ("load_snapshot", SnapshotId(4, 2)),
        ("commit", 4),
        ("fail_pending_appends", None),
        ("announce_leader", LeaderAndEpoch(2, 3)),
        ("wait_until", 99),
        ("flush", None),
    ]


def test_messages_after_persist_leave_only_once_the_election_state_is_durable() -> None:
    calls: list[Call] = []
    out = Output(send_after_persist=[_VOTE], election_state=ElectionState(3, voted_id=2), send_now=[_FETCH])
    execute_output_now(out, recording_ports(calls))
    names = [name for name, _ in calls]
    assert names.index("persist_election") < calls.index(("send", _VOTE))
    assert calls.index(("send", _FETCH)) < names.index("persist_election")  # send-now does not wait


def test_log_writes_come_before_every_message_so_fetch_answers_can_read_them() -> None:
    calls: list[Call] = []
    append = AppendLeaderChange(0, 1, 1, (1, 2, 3), (1, 2))
    execute_output_now(Output(log_ops=[append], send_now=[_fetch_answer(1)]), recording_ports(calls))
    assert calls[:2] == [("write_log", append), ("send", _fetch_answer(1))]


def test_notifications_come_before_this_outputs_flush_and_the_flush_is_last() -> None:
    calls: list[Call] = []
    out = Output(log_ops=[AppendRecords(3, 1, (b"x",))], flush=True, high_watermark=3, next_deadline_ms=8)
    execute_output_now(out, recording_ports(calls))
    names = [name for name, _ in calls]
    assert names == ["write_log", "commit", "wait_until", "flush"]


def test_the_flushs_own_output_supersedes_the_one_that_asked_for_it() -> None:
    # The driver feeds on_flushed into the core from its flush port and executes that Output at once:
    # its higher high watermark and later deadline must come after the outer Output's, never before.
    calls: list[Call] = []
    inner = Output(high_watermark=9, next_deadline_ms=20)
    ports = recording_ports(calls, on_flush=lambda: execute_output_now(inner, ports))
    execute_output_now(Output(flush=True, high_watermark=5, next_deadline_ms=10), ports)
    assert calls == [("commit", 5), ("wait_until", 10), ("flush", None), ("commit", 9), ("wait_until", 20)]


def test_an_empty_output_only_sets_the_next_deadline() -> None:
    calls: list[Call] = []
    execute_output_now(Output(next_deadline_ms=42), recording_ports(calls))
    assert calls == [("wait_until", 42)]


def test_running_without_an_event_loop_refuses_a_port_that_suspends() -> None:
    calls: list[Call] = []

    async def suspending_write(_op: object) -> None:
        await asyncio.sleep(0)  # yields to an event loop that is not there

    ports = replace(recording_ports(calls), write_log=suspending_write)
    with pytest.raises(RuntimeError, match="suspended"):
        execute_output_now(Output(log_ops=[TruncateTo(0)]), ports)


async def test_the_driver_executes_every_output_through_the_shared_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    executed: list[Output] = []

    async def recording_execute(out: Output, ports: OutputPorts) -> None:
        executed.append(out)
        await execute_output(out, ports)

    # The driver looks the executor up in its module at each call, so this sees every Output it runs,
    # including those of on_flushed that its flush port executes.
    monkeypatch.setattr(driver_module, "execute_output", recording_execute)
    clock = ManualClock()
    driver = RaftDriver(
        RaftConfig(node_id=1, voters=(1,), cluster_id="c1", append_linger_ms=1),
        transport=LoopbackNetwork().transport(1),
        log=MemoryLogStore(),
        elections=MemoryElectionStore(),
        snapshots=MemorySnapshotStore(),
        clock=clock,
        rng=random.Random(3),
    )
    await driver.start()
    try:
        await wait_until(lambda: driver.leader_and_epoch.leader_id == 1, 5, "self-election")
        offset = driver.schedule_append([b"a"])
        clock.advance(1)  # past the append linger
        await wait_until(lambda: driver.high_watermark > offset, 5, "the append committing")
    finally:
        await driver.stop()
    ops = [op for out in executed for op in out.log_ops]
    assert any(isinstance(op, AppendLeaderChange) for op in ops)
    assert AppendRecords(1, 1, (b"a",)) in ops
    assert any(out.election_state is not None for out in executed)
    # A single voter commits on its own flush: that high watermark comes from on_flushed's Output.
    assert [out.high_watermark for out in executed if out.high_watermark is not None][-1] == 2
