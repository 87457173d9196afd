"""A single-node, in-memory RaftClient for controller tests (commits each batch on the next loop turn).

It follows the RaftClient contract that the controller relies on: offsets assigned at schedule time,
listeners fed committed batches in order by their own task, leader changes delivered after the commits
before them, NotLeaderError when not leader.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from kraft.raft.api import (
    CommittedBatch,
    CommittedRecord,
    CommittedSlice,
    LeaderAndEpoch,
    LoadedSnapshot,
    NotLeaderError,
    RaftListener,
    SnapshotChunk,
    SnapshotWriter,
)
from kraft.raft.messages import DescribeQuorumResponse, SnapshotId


class FakeSnapshotWriter:
    def __init__(self, raft: FakeRaft, snapshot_id: SnapshotId) -> None:
        self._raft = raft
        self._id = snapshot_id
        self.records: list[bytes] = []

    @property
    def snapshot_id(self) -> SnapshotId:
        return self._id

    def append(self, records: Sequence[bytes]) -> None:
        self.records.extend(records)

    async def freeze(self) -> SnapshotId:
        self._raft.snapshots[self._id] = list(self.records)
        return self._id

    async def close(self) -> None:
        return None


class FakeRaft:
    def __init__(self, node_id: int = 1) -> None:
        self._node_id = node_id
        self._leader = LeaderAndEpoch(-1, 0)
        self.log: list[CommittedBatch] = []
        self.end_offset = 0
        self._hwm = 0
        self._queues: dict[int, asyncio.Queue[object]] = {}
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._pending: list[bytes] = []
        self._flush: asyncio.Handle | None = None
        self.snapshots: dict[SnapshotId, list[bytes]] = {}
        self.resigned = 0
        self.holds: list[bool] = []
        """The ``hold`` of every append, in order."""
        self.holds_ended = 0
        """Calls of :meth:`end_hold`."""
        self.hold_commits = False
        """While True appended records stay uncommitted (a slow quorum); :meth:`release` commits them."""
        self.hold_confirmations = False
        """While True ``confirm_leadership`` waits (a majority out of reach); :meth:`confirm` answers."""
        self.confirmations = 0
        self.lease_asks = 0
        """Confirmations asked with ``lease=True`` (answered like any: this fake has no lease)."""
        """How many times ``confirm_leadership`` was called."""
        self._confirm_waiters: list[asyncio.Future[None]] = []

    # ---- test controls ----

    def elect(self) -> None:
        """Become leader of the next epoch (a control batch, then the leader change)."""
        epoch = self._leader.epoch + 1
        self._leader = LeaderAndEpoch(self._node_id, epoch)
        self._commit_batch([], control=True)
        self._broadcast(self._leader)

    def append_control(self) -> int:
        """Raft appends a control record of its own (a VotersRecord): pending records are cut first, as
        the real leader's accumulator does; returns its offset."""
        self._flush_pending()
        offset = self.end_offset
        self._commit_batch([], control=True)
        return offset

    def release(self) -> None:
        self.hold_commits = False
        self._flush_pending()

    def lose_leadership(self, new_leader: int) -> None:
        self.end_offset -= len(self._pending)  # the uncommitted tail is truncated by the new leader
        self._pending.clear()
        self._leader = LeaderAndEpoch(new_leader, self._leader.epoch + 1)
        for waiter in self._confirm_waiters:
            if not waiter.done():
                waiter.set_exception(NotLeaderError(self._leader, "leadership lost before it was confirmed"))
        self._confirm_waiters.clear()
        self._broadcast(self._leader)

    def confirm(self) -> None:
        """A majority confirmed the leadership: every held ``confirm_leadership`` returns."""
        self.hold_confirmations = False
        for waiter in self._confirm_waiters:
            if not waiter.done():
                waiter.set_result(None)
        self._confirm_waiters.clear()

    # ---- RaftClient ----

    @property
    def node_id(self) -> int:
        return self._node_id

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch:
        return self._leader

    @property
    def high_watermark(self) -> int:
        return self._hwm

    @property
    def next_append_offset(self) -> int:
        return self.end_offset

    def register_listener(self, listener: RaftListener) -> None:
        queue: asyncio.Queue[object] = asyncio.Queue()
        for batch in self.log:
            queue.put_nowait(batch)
        if self._leader.leader_id != -1:
            queue.put_nowait(self._leader)
        self._queues[id(listener)] = queue
        self._tasks[id(listener)] = asyncio.get_running_loop().create_task(self._feed(listener, queue))

    def unregister_listener(self, listener: RaftListener) -> None:
        self._queues.pop(id(listener), None)
        task = self._tasks.pop(id(listener), None)
        if task is not None:
            task.cancel()

    def schedule_append(self, records: Sequence[bytes], *, hold: bool = False) -> int:
        """(``hold`` is only recorded: every append is flushed on the next loop turn.)"""
        self.holds.append(hold)
        if self._leader.leader_id != self._node_id:
            raise NotLeaderError(self._leader)
        if not records:
            raise ValueError("empty append")
        self._pending.extend(records)
        self.end_offset += len(records)
        if self._flush is None:
            self._flush = asyncio.get_running_loop().call_soon(self._flush_pending)
        return self.end_offset - 1

    def end_hold(self) -> None:
        """(Only recorded, as ``hold``: nothing here is ever held.)"""
        self.holds_ended += 1

    async def append(self, records: Sequence[bytes]) -> int:
        return self.schedule_append(records)

    async def yield_turn(self) -> None:
        """One loop turn: no Raft driver of its own whose work could go first."""
        await asyncio.sleep(0)

    async def learn_log_end_commit(self) -> int:
        """At once: the fake's log holds nothing above its high watermark it could learn later."""
        return self._hwm

    def confirm_leadership(self, *, lease: bool = False) -> asyncio.Future[None]:
        """Confirmed at once (a single voter) unless ``hold_confirmations``."""
        if self._leader.leader_id != self._node_id:
            raise NotLeaderError(self._leader)
        self.confirmations += 1
        self.lease_asks += lease
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self.hold_confirmations:
            self._confirm_waiters.append(waiter)
        else:
            waiter.set_result(None)
        return waiter

    def create_snapshot(
        self, end_offset: int, epoch: int, last_contained_timestamp_ms: int
    ) -> SnapshotWriter:
        if end_offset > self._hwm:
            raise ValueError("snapshot beyond the high watermark")
        return FakeSnapshotWriter(self, SnapshotId(end_offset, epoch))

    async def read_committed(self, offset: int, max_bytes: int) -> CommittedSlice:
        return CommittedSlice(b"", offset, self._hwm, 0)

    def latest_snapshot_id(self) -> SnapshotId | None:
        return max(self.snapshots, key=lambda s: s.end_offset, default=None)

    async def read_snapshot(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> SnapshotChunk:
        raise ValueError("the fake keeps snapshots as record lists only")

    def describe_quorum(self) -> DescribeQuorumResponse:
        raise NotImplementedError("not used by the controller")

    async def resign(self) -> None:
        self.resigned += 1

    async def shutdown(self, timeout_ms: int) -> None:
        for listener_id in list(self._tasks):
            self._tasks.pop(listener_id).cancel()

    # ---- internals ----

    def _flush_pending(self) -> None:
        self._flush = None
        if self._pending and not self.hold_commits:
            records, self._pending = self._pending, []
            self._commit_batch(records)

    def _commit_batch(self, values: list[bytes], control: bool = False) -> None:
        base = self._hwm
        if control:
            self.end_offset += 1
            last = base
            batch_records: list[CommittedRecord] = []
        else:
            last = base + len(values) - 1
            batch_records = [CommittedRecord(base + i, v) for i, v in enumerate(values)]
        batch = CommittedBatch(base, last, self._leader.epoch, batch_records, 0, control)
        self.log.append(batch)
        self._hwm = last + 1
        self._broadcast(batch)

    def _broadcast(self, item: object) -> None:
        for queue in self._queues.values():
            queue.put_nowait(item)

    @staticmethod
    async def _feed(listener: RaftListener, queue: asyncio.Queue[object]) -> None:
        while True:
            item = await queue.get()
            if isinstance(item, CommittedBatch):
                await listener.handle_commit(item)
            elif isinstance(item, LoadedSnapshot):
                await listener.handle_load_snapshot(item)
            elif isinstance(item, LeaderAndEpoch):
                await listener.handle_leader_change(item)
