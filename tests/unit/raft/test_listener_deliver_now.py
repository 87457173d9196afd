"""A leader's committed batches handed to a :class:`~kraft.raft.api.CommitNowListener` in the step its high
watermark passes them (issue #17, session 16: ``ListenerSet.deliver_now``).

The contract kept: batches in offset order from the cursor, never while the listener's task is inside a
delivery, a leader change due reported (by the task) before any batch, and everything the fast path does
not take — too many records, a listener that declines, one without the method — delivered by the task as
before.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field

from raft_helpers import LoopbackCluster, wait_until

from kraft.observability.logging import get_logger
from kraft.raft.api import CommittedBatch, LeaderAndEpoch, LoadedSnapshot, offset_values
from kraft.raft.listeners import SYNC_DELIVERY_MAX_RECORDS, BuiltRecords, CommitView, LazyRecords, ListenerSet
from kraft.raft.memory import MemoryLogStore, MemorySnapshotStore
from kraft.storage.batch import build_batch, iter_batch_headers

TIMEOUT_S = 5.0
LEADER = LeaderAndEpoch(1, 1)


@dataclass
class _Recorder:
    """Records every delivery as ``(how, base offset)``: ``now`` through ``handle_commit_now``, ``task``
    through ``handle_commit``; ``take_now`` False declines the synchronous path."""

    take_now: bool = True
    events: list[tuple[str, int]] = field(default_factory=list)
    decline_once: set[int] = field(default_factory=set)
    """Base offsets declined the first time they are offered (then taken)."""
    gate: asyncio.Event | None = None
    """When set, ``handle_commit`` waits on it (a delivery in progress, suspended)."""
    in_task: bool = False
    overlaps: list[int] = field(default_factory=list)
    """Base offsets offered while the task was inside a delivery (never expected)."""

    def handle_commit_now(self, batch: CommittedBatch) -> bool:
        if self.in_task:
            self.overlaps.append(batch.base_offset)
        if not self.take_now or batch.base_offset in self.decline_once:
            self.decline_once.discard(batch.base_offset)
            return False
        self.events.append(("now", batch.base_offset))
        return True

    async def handle_commit(self, batch: CommittedBatch) -> None:
        self.in_task = True
        try:
            self.events.append(("task", batch.base_offset))
            if self.gate is not None:
                await asyncio.wait_for(self.gate.wait(), TIMEOUT_S)
        finally:
            self.in_task = False

    async def handle_load_snapshot(self, reader: LoadedSnapshot) -> None:
        self.events.append(("snapshot", reader.snapshot_id.end_offset))

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self.events.append(("leader", leader.epoch))


@dataclass
class _AsyncOnly:
    events: list[tuple[str, int]] = field(default_factory=list)

    async def handle_commit(self, batch: CommittedBatch) -> None:
        self.events.append(("task", batch.base_offset))

    async def handle_load_snapshot(self, reader: LoadedSnapshot) -> None:
        pass

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self.events.append(("leader", leader.epoch))


class _Quorum:
    """A log and a commit view the test moves by hand, a ListenerSet over them, and the batches "built"
    (what the driver passes to ``deliver_now``)."""

    def __init__(self) -> None:
        self.log = MemoryLogStore()
        self.view = CommitView(0, LEADER, 0)
        self.listeners = ListenerSet(self.log, MemorySnapshotStore(), lambda: self.view, get_logger("test"))
        self.built: list[CommittedBatch] = []

    def append(self, records: int = 1, epoch: int = 1, *, kept: bool = True) -> int:
        """Write a batch; ``kept``: also in :attr:`built` (else the driver did not keep it: a gap)."""
        base = self.log.end_offset
        values = tuple(b"v%d" % (base + i) for i in range(records))
        self.log.append(build_batch(base, [(None, v) for v in values], leader_epoch=epoch, timestamp_ms=0))
        self.log.flush()
        if kept:
            self.built.append(CommittedBatch(base, base + records - 1, epoch, BuiltRecords(base, values), 0))
        return base

    def deliver_now(self) -> None:
        self.listeners.deliver_now(self.built)

    def commit(self) -> None:
        self.view = CommitView(self.log.end_offset, self.view.leader, self.view.leader_epoch_start_offset)


async def _caught_up(quorum: _Quorum, events: list[tuple[str, int]], count: int) -> None:
    """Wait (bounded) until ``count`` events were recorded and the listener's task is idle again."""
    await wait_until(
        lambda: len(events) >= count and all(c.idle for c in quorum.listeners._cursors),
        TIMEOUT_S,
        f"{count} deliveries and an idle listener task",
    )


async def test_a_few_committed_records_are_handed_over_in_the_step_the_high_watermark_rises() -> None:
    quorum = _Quorum()
    quorum.append()  # the epoch's first batch, delivered by the task (the leader change comes with it)
    quorum.commit()
    recorder = _Recorder()
    quorum.listeners.register(recorder)
    try:
        await _caught_up(quorum, recorder.events, 2)
        assert recorder.events == [("task", 0), ("leader", 1)]
        first = quorum.append(records=2)
        second = quorum.append(records=1)
        quorum.commit()
        quorum.deliver_now()
        # In this very step: no loop turn in between.
        assert recorder.events[2:] == [("now", first), ("now", second)]
        for _ in range(5):
            await asyncio.sleep(0)
        assert recorder.events[2:] == [("now", first), ("now", second)]  # not delivered twice
    finally:
        await quorum.listeners.close()


async def test_what_the_fast_path_does_not_take_goes_through_the_task_in_order() -> None:
    quorum = _Quorum()
    quorum.append()
    quorum.commit()
    recorder = _Recorder()
    plain = _AsyncOnly()
    quorum.listeners.register(recorder)
    quorum.listeners.register(plain)
    try:
        await _caught_up(quorum, recorder.events, 2)
        await _caught_up(quorum, plain.events, 2)
        # Too many records at once: the task's sliced path.
        big = quorum.append(records=SYNC_DELIVERY_MAX_RECORDS + 1)
        quorum.commit()
        quorum.deliver_now()
        assert recorder.events[2:] == [] and plain.events[2:] == []
        await _caught_up(quorum, recorder.events, 3)
        await _caught_up(quorum, plain.events, 3)
        assert recorder.events[2:] == [("task", big)] and plain.events[2:] == [("task", big)]
        # A batch the driver did not keep (a control batch, say): the task reads it, and the next one too.
        gap = quorum.append(kept=False)
        following = quorum.append()
        quorum.commit()
        quorum.deliver_now()
        assert recorder.events[3:] == []
        await _caught_up(quorum, recorder.events, 5)
        assert recorder.events[3:] == [("task", gap), ("task", following)]
        await _caught_up(quorum, plain.events, 5)
        del recorder.events[3:5], plain.events[3:5]
        # A listener that declines: the same batch reaches handle_commit, once.
        recorder.take_now = False
        declined = quorum.append()
        quorum.commit()
        quorum.deliver_now()
        assert recorder.events[3:] == []
        await _caught_up(quorum, recorder.events, 4)
        await _caught_up(quorum, plain.events, 4)
        assert recorder.events[3:] == [("task", declined)] and plain.events[3:] == [("task", declined)]
    finally:
        await quorum.listeners.close()


async def test_nothing_is_handed_over_while_the_task_is_inside_a_delivery() -> None:
    quorum = _Quorum()
    quorum.append()
    quorum.commit()
    recorder = _Recorder()
    quorum.listeners.register(recorder)
    try:
        await _caught_up(quorum, recorder.events, 2)
        recorder.gate = asyncio.Event()
        slow = quorum.append()
        recorder.decline_once.add(slow)  # declined now: the task's, which suspends inside it
        quorum.commit()
        quorum.deliver_now()
        await wait_until(lambda: recorder.in_task, TIMEOUT_S, "the task inside handle_commit")
        after = quorum.append()
        quorum.commit()
        quorum.deliver_now()  # the task holds `slow`: `after` must wait for it
        assert recorder.events[2:] == [("task", slow)]
        recorder.gate.set()
        await _caught_up(quorum, recorder.events, 4)
        assert recorder.events[2:] == [("task", slow), ("task", after)]
        assert recorder.overlaps == []
    finally:
        await quorum.listeners.close()


async def test_a_leader_change_due_is_reported_by_the_task_before_any_batch() -> None:
    quorum = _Quorum()
    quorum.append()
    quorum.commit()
    recorder = _Recorder()
    quorum.listeners.register(recorder)
    try:
        await _caught_up(quorum, recorder.events, 2)
        # Another node leads now (epoch 2); its first batch commits here in the same step.
        quorum.view = CommitView(quorum.view.high_watermark, LeaderAndEpoch(2, 2), -1)
        newer = quorum.append(epoch=2)
        quorum.commit()
        quorum.deliver_now()
        assert recorder.events[2:] == []
        await _caught_up(quorum, recorder.events, 4)
        assert recorder.events[2:] == [("leader", 2), ("task", newer)]
    finally:
        await quorum.listeners.close()


async def test_a_leaders_commit_reaches_its_listener_in_the_drivers_own_step() -> None:
    """On the real driver: the listener is called by the raft-driver task, at a moment its high watermark
    already covers the batch (committed: on a majority's disks), and the append's own waiter is settled
    first (``_on_high_watermark`` pops the pending appends before it delivers)."""
    cluster = LoopbackCluster(3)
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        seen: list[tuple[str, int, bool]] = []
        recorder = _Recorder()

        handed: list[CommittedBatch] = []

        def handle_commit_now(batch: CommittedBatch) -> bool:
            handed.append(batch)
            task = asyncio.current_task()
            seen.append(
                (
                    task.get_name() if task is not None else "",
                    batch.base_offset,
                    leader.high_watermark > batch.last_offset,
                )
            )
            return _Recorder.handle_commit_now(recorder, batch)

        recorder.handle_commit_now = handle_commit_now  # type: ignore[method-assign]
        leader.register_listener(recorder)
        await cluster.settle()
        offset = await cluster.complete(leader.append([b"a", b"b"]), "the append's commit")
        await cluster.settle()
        assert ("now", offset - 1) in recorder.events, recorder.events
        assert ("raft-driver", offset - 1, True) in seen, seen
        # What was handed over from memory is what the log holds there.
        batch = next(b for b in handed if b.base_offset == offset - 1)
        data = cluster.stores[leader.node_id].log.read(batch.base_offset, 1 << 20)
        position, header = next(iter_batch_headers(data))
        assert (
            batch.base_offset,
            batch.last_offset,
            batch.epoch,
            batch.append_timestamp_ms,
            batch.control,
        ) == (
            header.base_offset,
            header.last_offset,
            header.partition_leader_epoch,
            header.max_timestamp,
            header.is_control,
        )
        assert offset_values(batch.records) == offset_values(LazyRecords(data, position))
        assert [(r.offset, r.value) for r in batch.records] == [(offset - 1, b"a"), (offset, b"b")]
    finally:
        await cluster.close()
