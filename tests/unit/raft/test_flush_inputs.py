"""Inputs the driver feeds to the core while a leader's log fsync runs (issue #17, session 13: the lease's
echo path; docs/internals/raft.md "Leader lease", "Driver tasks").

The driver awaits each fsync before the next input, so nothing writes the log while it runs.  A leader's
inbound Fetches and the answers to its parked Fetches when a round starts write nothing
(``RaftCore.takes_request_during_flush`` and ``takes_output_during_flush``), so they reach the core during
the leader's fsync (on its fsync thread): the followers' echoes renew the lease and their progress
commits.  Everything else still waits.  A follower's fsync runs inline on its loop (session 13, "A lone
CreateTopics"): nothing reaches its core meanwhile — its echo was sent before the flush.

Every test holds an fsync open with a gate (a leader's) or holds Fetches at the transport (a follower's,
whose inline flush cannot be held without blocking the loop) and runs on a manual clock (no timer fires:
what happens is what the inputs alone cause).
"""

from __future__ import annotations

import asyncio
import threading

from raft_helpers import FAST_TIMINGS, HeldFetches, LoopbackCluster, NodeStores, wait_until

from kraft.raft.api import NotLeaderError
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import MemoryLogStore
from kraft.raft.state import StateKind

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
    fetches = HeldFetches(cluster)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        await cluster.settle()
        follower_ids = {n for n in cluster.voters if n != leader.node_id}
        gate = logs[leader.node_id]
        gate.open.clear()  # the leader's fsync held
        fetches.hold(follower_ids)  # the followers' next Fetches wait for the test
        first = leader.schedule_append([b"a"])
        await wait_until(gate.held.is_set, WAIT_S, "the leader's fsync held")
        # The followers took the record (sent before the leader's own fsync), flushed it inline and
        # fetched again with their progress: those Fetches are held at the wire.
        await wait_until(
            lambda: all(any(f.fetch_offset > first for f in fetches.held.get(n, ())) for n in follower_ids),
            WAIT_S,
            "the followers' progress Fetches held",
        )
        end_before = gate.end_offset
        second = leader.schedule_append([b"b", b"c"])  # a full batch: cut at once, into the output
        held = sum(len(v) for v in fetches.held.values())
        fetches.release()  # their Fetches (progress past `first`) now reach the leader mid-fsync
        await wait_until(lambda: fetches.delivered >= held, WAIT_S, "the held Fetches delivered")
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
        fetches.release()
        for log in logs.values():
            log.open.set()
        await cluster.close()


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
            appends = log.appends
            cluster.clock.advance(10)
            for driver in cluster.drivers.values():
                driver.recheck_timers()
            # The next 10 ms of the clock once the chain took another turn (a flush handed over the
            # next append), not after a fixed 2 ms of real time: with the fsync thread late on a loaded
            # host (a 15 ms stall per flush, injected) the clock reached check-quorum after 9 appends.
            # Polled: the chain runs on the fsync thread, no event to wait on.
            async with asyncio.timeout(WAIT_S):
                while log.appends == appends and leader.state is StateKind.LEADER:  # noqa: ASYNC110
                    await asyncio.sleep(0.001)
        assert log.appends > 10  # the flushes did bring appends all along
        assert leader.state is not StateKind.LEADER, "the isolated leader never polled its check-quorum"
    finally:
        for log in logs.values():
            log.driver = None
        await cluster.close()
