"""When a follower's listeners run (issue #17, "Where a lone CreateTopics' time goes").

A follower learns a higher high watermark from the Fetch answer that brings the next records.  Its
listeners are handed the newly committed batches only once that output ran to its end — the records'
log flush and the next Fetch included — so a state machine applying them (the metadata replay) never
holds the loop and the GIL while the follower's fsync and its next Fetch, and with them the leader's next
commit, wait.  A leader wakes its listeners at once: commit answers wait on them.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

import pytest
from metric_reads import family_sample
from raft_helpers import (
    HeldFetches,
    LoopbackCluster,
    NodeStores,
    RecordingListener,
    park_commits_like_an_older_leader,
    wait_until,
)

from kraft.observability.metrics import RAFT_FETCH_TURNAROUND
from kraft.raft.api import CommittedBatch
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import MemoryLogStore

GATE_TIMEOUT_S = 5.0


class ObservedLog(MemoryLogStore):
    """A log that calls ``on_flush`` as each flush starts.  A follower's flush runs inline on the driver's
    loop (``RaftDriver._flush``), so what ``on_flush`` sees is the follower's state at that moment of its
    output: the records written, their fsync not done, the next Fetch not sent."""

    def __init__(self) -> None:
        super().__init__()
        self.on_flush: Callable[[], None] | None = None
        self.after_flush: Callable[[], None] | None = None
        self.flushes = 0

    def flush(self) -> int:
        if self.on_flush is not None:
            self.on_flush()
        end = super().flush()
        self.flushes += 1
        if self.after_flush is not None:
            self.after_flush()
        return end


async def _loop_turns(turns: int) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


async def test_a_follower_applies_a_commit_only_after_flushing_the_records_that_brought_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The commit must come with the next records: a leader that parks the Fetch that committed (an
    # older one; today's answers it at once, docs/internals/raft.md "Long polls and the high watermark").
    park_commits_like_an_older_leader(monkeypatch)
    cluster = LoopbackCluster(2)  # one follower: its Fetch alone moves the high watermark
    logs = {node_id: ObservedLog() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id] = NodeStores(log=log)
    fetches = HeldFetches(cluster)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        follower_id = next(n for n in cluster.voters if n != leader.node_id)
        follower = cluster.drivers[follower_id]
        listener = RecordingListener()
        follower.register_listener(listener)
        await cluster.settle()

        # The follower's Fetch with its progress past `first` reaches the leader after the leader's own
        # fsync of `first` (held at the wire until then): that Fetch commits `first` and parks.  (One
        # that arrives during the leader's fsync is taken then — the lease's echo path — and answered
        # when the fsync raises the high watermark, so the follower would learn the commit at once.)
        leader_flushes = logs[leader.node_id].flushes
        fetches.hold({follower_id})
        first = leader.schedule_append([b"a"])
        await wait_until(
            lambda: (
                logs[leader.node_id].flushes > leader_flushes
                and any(f.fetch_offset > first for f in fetches.held.get(follower_id, ()))
            ),
            GATE_TIMEOUT_S,
            "the leader's fsync done and the follower's progress Fetch held",
        )
        await cluster.settle()
        fetches.release()
        await cluster.settle()  # replicated and committed; no time passes, so no long poll expires
        assert leader.high_watermark > first
        # The follower's Fetch that committed `first` is parked at the leader: it learns the new high
        # watermark only with the next records.
        assert follower.high_watermark <= first
        assert first not in listener.values

        seen: list[tuple[int, bool]] = []  # at each follower flush: its high watermark, `first` applied
        logs[follower_id].on_flush = lambda: seen.append((follower.high_watermark, first in listener.values))
        second = leader.schedule_append([b"b"])
        await cluster.run_until(lambda: first in listener.values, "the first record applied", 1000)
        await cluster.run_until(lambda: second in listener.values, "the second record applied", 1000)
        # The flush of the second record: `first`'s commit learned with it, not applied before it.
        assert seen and seen[0][0] > first
        assert seen[0][1] is False
        assert listener.values[first] == b"a" and listener.values[second] == b"b"
    finally:
        await cluster.close()


async def test_a_leader_applies_a_commit_at_once() -> None:
    cluster = LoopbackCluster(3)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        listener = RecordingListener()
        leader.register_listener(listener)
        await cluster.settle()
        offset = await cluster.complete(leader.append([b"v"]), "the append committed")
        # append() returns when the high watermark passed it; the listener was woken in the same step.
        await _loop_turns(10)
        assert listener.values.get(offset) == b"v"
    finally:
        await cluster.close()


DELAY_MS = 20


async def test_a_follower_with_a_listener_delay_applies_commits_that_long_later_all_at_once() -> None:
    cluster = LoopbackCluster(2)
    cluster.driver_options = {"follower_listener_delay_ms": DELAY_MS}
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        follower = next(d for n, d in cluster.drivers.items() if n != leader.node_id)
        listener = RecordingListener()
        follower.register_listener(listener)
        await cluster.advance(DELAY_MS)  # whatever was committed before is applied
        first = leader.schedule_append([b"a"])
        await cluster.settle()
        second = leader.schedule_append([b"b"])
        await cluster.settle()  # the follower flushed `second` and learned that `first` committed
        assert follower.high_watermark > first
        await cluster.advance(DELAY_MS - 1)
        assert first not in listener.values  # not before the delay ran out
        third = leader.schedule_append([b"c"])
        await cluster.settle()  # a further commit learned meanwhile does not push the wake-up back
        assert follower.high_watermark > second
        await cluster.advance(1)
        await _loop_turns(20)
        # Everything committed by then is applied in that one wake-up (`third` too if the follower
        # learned its commit meanwhile: its Fetch may reach the leader during the leader's fsync).
        assert listener.values.get(first) == b"a" and listener.values.get(second) == b"b"
        assert (third in listener.values) == (follower.high_watermark > third)
        await cluster.run_until(lambda: third in listener.values, "the third record applied", 1000)
    finally:
        await cluster.close()


async def test_a_leader_ignores_the_follower_listener_delay() -> None:
    cluster = LoopbackCluster(3)
    cluster.driver_options = {"follower_listener_delay_ms": DELAY_MS}
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        listener = RecordingListener()
        leader.register_listener(listener)
        await cluster.settle()
        offset = await cluster.complete(leader.append([b"v"]), "the append committed")
        await _loop_turns(10)
        assert listener.values.get(offset) == b"v"  # no clock movement needed
    finally:
        await cluster.close()


async def test_a_follower_that_becomes_leader_applies_what_it_held_back_at_once() -> None:
    cluster = LoopbackCluster(3)
    cluster.driver_options = {"follower_listener_delay_ms": 60_000}  # never runs out in this test
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        listeners = {n: RecordingListener() for n in cluster.drivers}
        for node_id, driver in cluster.drivers.items():
            driver.register_listener(listeners[node_id])
        await cluster.settle()
        offset = await cluster.complete(leader.append([b"v"]), "the append committed")
        second = await cluster.complete(leader.append([b"w"]), "the second append committed")
        await cluster.settle()
        followers = [n for n in cluster.drivers if n != leader.node_id]
        assert any(cluster.drivers[n].high_watermark > offset for n in followers)
        assert all(offset not in listeners[n].values for n in followers)  # held back
        await cluster.stop(leader.node_id)
        successor = await cluster.elect(exclude=leader.node_id)
        await cluster.settle()
        await _loop_turns(20)
        assert listeners[successor.node_id].values.get(offset) == b"v"
        assert listeners[successor.node_id].values.get(second) == b"w"
    finally:
        await cluster.close()


class SteppingListener(RecordingListener):
    """Applies each batch in many steps, awaiting the driver's ``yield_turn`` between them (as the
    metadata replay does), until the test lets the current batch finish."""

    def __init__(self, driver: RaftDriver) -> None:
        super().__init__()
        self.driver = driver
        self.steps = 0
        self.replaying = False
        self.finish = asyncio.Event()

    async def handle_commit(self, batch: CommittedBatch) -> None:
        if batch.control:
            await super().handle_commit(batch)
            return
        self.replaying = True
        for _ in range(MAX_STEPS):  # bounded: a test that never lets it finish still ends
            if self.finish.is_set():
                break
            self.steps += 1
            await self.driver.yield_turn()
        self.replaying = False
        await super().handle_commit(batch)


MAX_STEPS = 200_000


async def test_a_follower_replay_waits_while_its_fetch_turnaround_runs() -> None:
    # A Fetch response that arrives while the follower's listener is mid-replay is taken to its end
    # (records appended, flushed, next Fetch sent) before the replay takes another step.
    cluster = LoopbackCluster(2)  # one follower: its next Fetch alone moves the high watermark
    logs = {node_id: ObservedLog() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id] = NodeStores(log=log)
    await cluster.start_all()
    listener: SteppingListener | None = None
    try:
        leader = await cluster.elect()
        follower_id = next(n for n in cluster.voters if n != leader.node_id)
        follower = cluster.drivers[follower_id]
        await cluster.settle()
        listener = SteppingListener(follower)
        follower.register_listener(listener)
        stepping = listener
        first = leader.schedule_append([b"a"])
        await cluster.settle()
        leader.schedule_append([b"b"])  # brings the follower the news that `first` committed
        await wait_until(lambda: stepping.replaying, GATE_TIMEOUT_S, "the follower replaying `first`")
        await wait_until(lambda: follower.idle, GATE_TIMEOUT_S, "the follower parked on its next Fetch")

        at_flush: list[tuple[int, int]] = []  # the replay's steps as the flush of `c` starts and ends
        log = logs[follower_id]
        log.on_flush = lambda: at_flush.append((stepping.steps, -1))
        log.after_flush = lambda: at_flush.append((at_flush.pop()[0], stepping.steps))
        third = leader.schedule_append([b"c"])
        # The next Fetch (which commits `c` on the leader) goes out while `first` is still replaying.
        await wait_until(lambda: leader.high_watermark > third, GATE_TIMEOUT_S, "`c` committed")
        assert at_flush and at_flush[0][1] == at_flush[0][0]  # no replay step while the flush ran
        steps = at_flush[0][1]
        assert stepping.replaying and first not in stepping.values
        await wait_until(lambda: stepping.steps > steps, GATE_TIMEOUT_S, "the replay going on")
        stepping.finish.set()
        await cluster.run_until(lambda: third in stepping.values, "`c` applied", 1000)
        assert stepping.values[first] == b"a"
    finally:
        if listener is not None:
            listener.finish.set()
        await cluster.close()


def _turnaround(node_id: int) -> tuple[float, float]:
    node = str(node_id)
    count = family_sample(RAFT_FETCH_TURNAROUND, "kraft_raft_fetch_turnaround_seconds_count", node=node)
    total = family_sample(RAFT_FETCH_TURNAROUND, "kraft_raft_fetch_turnaround_seconds_sum", node=node)
    return count or 0.0, total or 0.0


async def test_a_followers_fetch_turnaround_is_measured_from_the_response_to_the_next_fetch() -> None:
    cluster = LoopbackCluster(2)
    logs = {node_id: ObservedLog() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id] = NodeStores(log=log)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        follower_id = next(n for n in cluster.voters if n != leader.node_id)
        await cluster.settle()
        count, total = _turnaround(follower_id)
        log = logs[follower_id]

        def slow_fsync() -> None:  # the follower's fsync of the record takes 30 ms of the manual clock
            cluster.clock.advance(30)
            log.on_flush = None

        log.on_flush = slow_fsync
        offset = leader.schedule_append([b"a"])
        await wait_until(lambda: leader.high_watermark > offset, GATE_TIMEOUT_S, "the record committed")
        after_count, after_total = _turnaround(follower_id)
        assert after_count > count
        # Only that turnaround took manual time: the response → flush → next Fetch
        assert after_total - total == pytest.approx(0.030)
    finally:
        await cluster.close()


async def test_a_followers_log_flush_runs_inline_and_a_leaders_on_the_fsync_thread() -> None:
    # A follower's fsync is on every write's critical path (records in -> fsync -> the next Fetch that
    # commits them): inline on the driver's loop, no thread hop.  A leader's loop serves requests during
    # its fsync: the SyncWorker thread (raft-performance.md "A lone CreateTopics, session 13").
    cluster = LoopbackCluster(3)
    logs = {node_id: ObservedLog() for node_id in cluster.voters}
    threads: dict[int, set[int]] = {node_id: set() for node_id in cluster.voters}
    for node_id, log in logs.items():
        cluster.stores[node_id] = NodeStores(log=log)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        await cluster.settle()
        for node_id, log in logs.items():
            log.on_flush = lambda node_id=node_id: threads[node_id].add(threading.get_ident())
        offset = await cluster.complete(leader.append([b"a"]), "the append committed")
        await cluster.run_until(
            lambda: all(d.log_end_offset > offset for d in cluster.drivers.values()), "replicated", 1000
        )
        loop_thread = threading.get_ident()
        followers = [n for n in cluster.voters if n != leader.node_id]
        assert all(threads[n] == {loop_thread} for n in followers)
        assert threads[leader.node_id] and loop_thread not in threads[leader.node_id]
    finally:
        await cluster.close()
