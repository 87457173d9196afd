"""Inputs the driver feeds to the core while its log fsync runs (issue #17, session 13: the lease's echo
path; docs/internals/raft.md "Leader lease", "Driver tasks").

The driver awaits each fsync before the next input, so nothing writes the log while it runs.  A leader's
inbound Fetches, the answers to its parked Fetches when a round starts, and a follower's echo answers
write nothing (``RaftCore.takes_request_during_flush`` and siblings), so they reach the core during the
fsync: the followers' echoes renew the lease, their progress commits, and a follower echoes a newer round
at once although its own fsync holds its ordinary Fetch back.  Everything else still waits.

Every test holds an fsync open with a gate and runs on a manual clock (no timer fires: what happens is
what the inputs alone cause).
"""

from __future__ import annotations

import asyncio
import random
import threading
from dataclasses import dataclass
from typing import Any

from raft_helpers import FAST_TIMINGS, LoopbackCluster, NodeStores, wait_until

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.raft.api import NotLeaderError
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import MemoryElectionStore, MemoryLogStore, MemorySnapshotStore
from kraft.raft.messages import FetchRequest, FetchResponse, RaftRequest, RaftResponse
from kraft.raft.state import ElectionState, StateKind
from kraft.storage.batch import build_batch

GATE_TIMEOUT_S = 5.0
WAIT_S = 3.0


class GatedLog(MemoryLogStore):
    """A log whose flush (run on the driver's fsync thread) can be held until the test releases it."""

    def __init__(self) -> None:
        super().__init__()
        self.open = threading.Event()
        self.open.set()
        self.held = threading.Event()
        self.flushes = 0

    def flush(self) -> int:
        if not self.open.is_set():
            self.held.set()
            self.open.wait(GATE_TIMEOUT_S)  # bounded: a test that forgets to release still ends
        self.flushes += 1
        return super().flush()


def gated_cluster(size: int, **overrides: int) -> tuple[LoopbackCluster, dict[int, GatedLog]]:
    cluster = LoopbackCluster(size)
    cluster.timings.update(overrides)
    logs = {node_id: GatedLog() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id] = NodeStores(log=log)
    return cluster, logs


async def test_a_leader_commits_and_confirms_a_round_while_its_fsync_runs() -> None:
    cluster, logs = gated_cluster(3)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        await cluster.settle()
        gate = logs[leader.node_id]
        gate.open.clear()
        offset = leader.schedule_append([b"a"])
        await wait_until(gate.held.is_set, WAIT_S, "the leader's fsync held")
        # The followers took the record (sent before the leader's own fsync), flushed it and fetched
        # again: a majority has it durable, so it commits although the leader's copy is not yet.
        await wait_until(lambda: leader.high_watermark > offset, WAIT_S, "the commit during the fsync")
        # A round asked for now reaches the parked followers and their echoes confirm it, all while
        # the fsync is still held.
        confirmed = leader.confirm_leadership()
        await wait_until(confirmed.done, WAIT_S, "the round confirmed during the fsync")
        assert not gate.open.is_set() and gate.flushes == 1  # the one fsync (the election's) finished
        gate.open.set()
        await cluster.settle()
        assert leader.high_watermark > offset
    finally:
        for log in logs.values():
            log.open.set()
        await cluster.close()


async def test_a_leader_defers_fetches_while_an_append_that_filled_a_batch_waits() -> None:
    # An append that fills a batch during the fsync cuts it into the output being built: the next
    # output writes the log, so no Fetch may take it before the fsync returns — they wait, and nothing
    # writes the log under the fsync (else the driver fails: LogInvariantError).
    cluster, logs = gated_cluster(3, max_batch_records=2)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        await cluster.settle()
        followers = [logs[n] for n in cluster.voters if n != leader.node_id]
        for log in logs.values():
            log.open.clear()  # every fsync held: the followers' next Fetches wait for the test
        gate = logs[leader.node_id]
        first = leader.schedule_append([b"a"])
        await wait_until(gate.held.is_set, WAIT_S, "the leader's fsync held")
        await wait_until(lambda: all(f.held.is_set() for f in followers), WAIT_S, "the followers' fsyncs")
        end_before = gate.end_offset
        second = leader.schedule_append([b"b", b"c"])  # a full batch: cut at once, into the output
        flushed = [f.flushes for f in followers]
        for log in followers:
            log.open.set()  # their Fetches (progress past `first`) now reach the leader mid-fsync
        await wait_until(
            lambda: all(f.flushes > n for f, n in zip(followers, flushed, strict=True)),
            WAIT_S,
            "the followers' fsyncs done",
        )
        for _ in range(200):
            await asyncio.sleep(0)
        await asyncio.sleep(0.05)
        assert gate.end_offset == end_before  # nothing written while the fsync runs
        assert leader.high_watermark <= first  # the Fetches wait behind the batch's output
        gate.open.set()
        await cluster.run_until(lambda: leader.high_watermark > second, "the full batch committed", 1000)
        leader.schedule_append([b"d"])  # raises RaftShutdownError had the driver failed
        assert leader.leader_and_epoch.leader_id == leader.node_id
    finally:
        for log in logs.values():
            log.open.set()
        await cluster.close()


# ------------------------------------------------------------------ a follower against a scripted leader


@dataclass
class Sent:
    request: RaftRequest
    answer: asyncio.Future[RaftResponse]


class ScriptedLeader:
    """The follower's transport: every request it sends waits here until the test answers it."""

    def __init__(self) -> None:
        self.sent: asyncio.Queue[Sent] = asyncio.Queue()

    async def send(self, dest: int, request: RaftRequest, timeout_ms: int) -> RaftResponse:
        answer: asyncio.Future[RaftResponse] = asyncio.get_running_loop().create_future()
        await self.sent.put(Sent(request, answer))
        return await answer

    async def close(self) -> None:
        pass

    async def next_fetch(self) -> tuple[FetchRequest, asyncio.Future[RaftResponse]]:
        sent = await asyncio.wait_for(self.sent.get(), WAIT_S)
        assert isinstance(sent.request, FetchRequest)
        return sent.request, sent.answer


LEADER, FOLLOWER, EPOCH = 1, 2, 3


def answer(read_round: int, records: bytes = b"", high_watermark: int = 0) -> FetchResponse:
    return FetchResponse(ErrorCode.NONE, "", LEADER, EPOCH, high_watermark, 0, records, read_round=read_round)


async def test_a_follower_echoes_a_newer_round_while_its_fsync_runs() -> None:
    leader = ScriptedLeader()
    log = GatedLog()
    elections = MemoryElectionStore()
    elections.write(ElectionState(EPOCH, LEADER, LEADER))
    timings: dict[str, Any] = dict(FAST_TIMINGS)
    follower = RaftDriver(
        RaftConfig(node_id=FOLLOWER, cluster_id="test-cluster", voters=(LEADER, FOLLOWER), **timings),
        transport=leader,
        log=log,
        elections=elections,
        snapshots=MemorySnapshotStore(),
        clock=ManualClock(),
        rng=random.Random(FOLLOWER),
    )
    await follower.start()
    try:
        first, first_answer = await leader.next_fetch()
        assert first.fetch_offset == 0 and not first.echo_only
        log.open.clear()
        batch = build_batch(0, [(None, b"v")], leader_epoch=EPOCH, timestamp_ms=0)
        first_answer.set_result(answer(read_round=1, records=batch))
        # Round 1 came with records: echoed at once, before the batch's write is flushed.
        echo, echo_answer = await leader.next_fetch()
        assert echo.echo_only and echo.read_round == 1 and echo.fetch_offset == 0
        await wait_until(log.held.is_set, WAIT_S, "the follower's fsync held")
        # The leader started round 2 meanwhile: its answer to the echo carries it.  The follower takes
        # that answer during its fsync and echoes round 2 — its ordinary Fetch still waits for the flush.
        echo_answer.set_result(answer(read_round=2))
        again, again_answer = await leader.next_fetch()
        assert again.echo_only and again.read_round == 2
        assert again.fetch_offset == 0  # never an offset it has not made durable
        assert not log.open.is_set()
        again_answer.set_result(answer(read_round=2))
        log.open.set()
        ordinary, ordinary_answer = await leader.next_fetch()
        assert not ordinary.echo_only and ordinary.fetch_offset == 1
        assert ordinary.read_round == 2
        ordinary_answer.set_result(answer(read_round=2, high_watermark=1))
    finally:
        log.open.set()
        await follower.stop()


# ------------------------------------------------------------------ timers under back-to-back flushes


class AppendingLog(MemoryLogStore):
    """While armed, each flush hands its driver another append before it returns (from the fsync thread,
    as a request plane on another thread does): the next event always arrives during the flush."""

    def __init__(self) -> None:
        super().__init__()
        self.driver: RaftDriver | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.appends = 0

    def flush(self) -> int:
        if self.driver is not None and self.loop is not None:
            self.loop.call_soon_threadsafe(self._append)
        return super().flush()

    def _append(self) -> None:
        driver = self.driver
        if driver is None:
            return
        try:
            driver.schedule_append([b"x"])
            self.appends += 1
        except NotLeaderError:
            self.driver = None  # deposed: the chain ends


async def test_a_leader_whose_every_flush_brings_the_next_append_still_polls_its_timers() -> None:
    # Before session 13 the driver took queued events until none was left and only then polled the
    # core: with an append arriving during every fsync it never polled, so an isolated leader never
    # resigned (check-quorum) and the lease's renewals from poll never ran.
    cluster = LoopbackCluster(3)
    logs = {node_id: AppendingLog() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id] = NodeStores(log=log)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        await cluster.settle()
        log = logs[leader.node_id]
        cluster.network.isolate(leader.node_id)  # no Fetch reaches it: check-quorum must depose it
        log.loop = asyncio.get_running_loop()
        log.driver = leader
        leader.schedule_append([b"first"])
        check_quorum_ms = 3 * FAST_TIMINGS["fetch_timeout_ms"] // 2
        for _ in range(4 * check_quorum_ms // 10):
            if leader.state is not StateKind.LEADER:
                break
            cluster.clock.advance(10)
            for driver in cluster.drivers.values():
                driver.recheck_timers()
            await asyncio.sleep(0.002)
        assert log.appends > 10  # the flushes did bring appends all along
        assert leader.state is not StateKind.LEADER, "the isolated leader never polled its check-quorum"
    finally:
        for log in logs.values():
            log.driver = None
        await cluster.close()
