"""The production controller on the Raft simulator: an in-process RaftClient over a :class:`SimNode` and a
deterministic event loop on the simulation's virtual clock.

- :class:`VirtualTimeLoop`: an asyncio loop whose ``time()`` is the simulation's ManualClock, so every
  ``asyncio.sleep`` / ``wait_for`` in the controller is measured in virtual time.  The simulation runs it
  only between its own events (:meth:`VirtualTimeLoop.run_ready`: everything ready or due now, never
  blocking) and schedules an event at the loop's next timer, so a seed replays exactly.
- :class:`SimRaftClient`: the RaftClient contract the controller relies on, over one simulated node:
  offsets assigned at schedule time (the core's append), NotLeaderError when not leader, committed batches
  and leader changes delivered by a per-listener task in ``kraft.raft.listeners.ListenerSet``'s order: ask
  :func:`~kraft.raft.listeners.leader_change_due` (the production rule itself: a change to *another*
  leader at once, becoming leader only once the batches before this node's epoch start were delivered),
  hand over committed batches in order, ask again.  The batches come from the simulated log (values, not
  encoded bytes), which is why the feed does not read through ListenerSet itself.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import contextvars
import dataclasses
import heapq
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from kraft.clock import ManualClock
from kraft.raft.api import (
    CommitNowListener,
    CommittedBatch,
    CommittedRecord,
    CommittedSlice,
    LeaderAndEpoch,
    LoadedSnapshot,
    NotLeaderError,
    RaftListener,
    RaftShutdownError,
    SnapshotChunk,
    SnapshotWriter,
)
from kraft.raft.executor import OutputPorts
from kraft.raft.listeners import (
    SYNC_DELIVERY_MAX_RECORDS,
    BuiltRecords,
    CommitView,
    hand_over_now,
    leader_change_due,
)
from kraft.raft.messages import NO_LEADER, DescribeQuorumResponse, SnapshotId
from kraft.raft.state import ElectionState, StateKind
from sim.harness import InvariantViolation, SimNode

MAX_LOOP_TURNS_PER_EVENT = 100_000

_T = TypeVar("_T")

_NODE_PORTS: weakref.WeakKeyDictionary[SimNode, OutputPorts] = weakref.WeakKeyDictionary()
"""Each node's ports as the harness built them (before any :class:`SimRaftClient` wrapped them)."""


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """Tracks the callbacks it was handed (``call_soon``, ``call_at``; ``call_later`` goes through
    ``call_at``) until they run, so :meth:`run_ready` and :meth:`next_timer_ms` need none of asyncio's
    private queues.  A cancelled handle counts as gone: asyncio skips it when its turn comes."""

    def __init__(self, clock: ManualClock) -> None:
        super().__init__()
        self._virtual_clock = clock
        self._soon: set[asyncio.Handle] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._timer_heap: list[tuple[float, int, asyncio.TimerHandle]] = []
        """The timers by due time (and order of scheduling): :meth:`next_timer_ms` drops the run or
        cancelled ones off its top instead of scanning every pending timer after every event."""
        self._timer_seq = 0

    def time(self) -> float:
        return self._virtual_clock.now_ms / 1000

    def call_soon(  # type: ignore[override]
        self, callback: Callable[..., object], *args: Any, context: contextvars.Context | None = None
    ) -> asyncio.Handle:
        handles: list[asyncio.Handle] = []

        def run(*call_args: Any) -> None:
            self._soon.discard(handles[0])
            callback(*call_args)

        handle = super().call_soon(run, *args, context=context)
        handles.append(handle)
        self._soon.add(handle)
        return handle

    def call_at(  # type: ignore[override]
        self,
        when: float,
        callback: Callable[..., object],
        *args: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.TimerHandle:
        handles: list[asyncio.TimerHandle] = []

        def run(*call_args: Any) -> None:
            self._timers.discard(handles[0])
            callback(*call_args)

        handle = super().call_at(when, run, *args, context=context)
        handles.append(handle)
        self._timers.add(handle)
        self._timer_seq += 1
        heapq.heappush(self._timer_heap, (handle.when(), self._timer_seq, handle))
        return handle

    def run_in_executor(  # type: ignore[override]
        self, executor: concurrent.futures.Executor | None, func: Callable[..., _T], *args: Any
    ) -> asyncio.Future[_T]:
        """Run ``func`` at once on the loop's own thread, whichever executor was named (None, the
        default executor, is what ``asyncio.to_thread`` uses): on a worker thread its answer would
        arrive after a real delay, while :meth:`run_ready` found nothing ready, counted the loop idle and
        the simulation moved the clock on — so a seed's run depended on the thread's real speed (a
        paced apply's state-file writes made two runs of one seed differ).  The answer is handed over
        one turn later (``call_soon``, tracked as ready), as a thread's could be at the earliest, so the
        awaiting task still gives way to the others; it takes no virtual time."""
        future: asyncio.Future[_T] = self.create_future()
        try:
            result = func(*args)
        except Exception as exc:  # (a worker thread's error reaches its awaiter through the future)
            self.call_soon(_settle, future, None, exc)
        else:
            self.call_soon(_settle, future, result, None)
        return future

    def _has_ready(self) -> bool:
        if not self._soon:  # the usual answer, after most events: nothing was handed over
            return False
        if any(h.cancelled() for h in self._soon):
            self._soon = {h for h in self._soon if not h.cancelled()}
        return bool(self._soon)

    def run_ready(self) -> None:
        """Run every callback that is ready or due at the current virtual time, until none is.

        An idle loop (nothing ready, no timer due) is left alone: a turn of it would run no callback of
        anyone's, only its own ``sleep(0)`` task — and the simulations call this after every event, most
        of them with every loop idle (the controller sim spent ~half its time in such empty turns)."""
        if not self._idle():
            self.run_until_complete(self._turn_until_idle())

    def _idle(self) -> bool:
        next_ms = self.next_timer_ms()
        return not self._has_ready() and (next_ms is None or next_ms > self._virtual_clock.now_ms)

    async def _turn_until_idle(self) -> None:
        """Give the loop turns until it is idle, checking after each: one ``run_until_complete`` per
        :meth:`run_ready`, not one per turn (its task and stop callback cost more than most turns' work).
        The callbacks run in the same order as with a ``run_until_complete(sleep(0))`` per turn: the
        loop's ready queue is first-in first-out whatever this task adds to it."""
        for _ in range(MAX_LOOP_TURNS_PER_EVENT):
            await asyncio.sleep(0)
            if self._idle():
                return
        raise InvariantViolation("the controllers' event loop never went idle")

    def next_timer_ms(self) -> int | None:
        """Virtual time (ms, rounded up) of the earliest pending timer."""
        heap, timers = self._timer_heap, self._timers
        while heap:
            when, _seq, handle = heap[0]
            if handle in timers and not handle.cancelled():
                return math.ceil(when * 1000 - 1e-6)
            heapq.heappop(heap)
            timers.discard(handle)
        return None


def _settle(future: asyncio.Future[_T], result: _T | None, error: Exception | None) -> None:
    if future.cancelled():  # (the awaiter was cancelled meanwhile, as it may be while a thread runs)
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)  # type: ignore[arg-type]


class SimRaftClient:
    def __init__(
        self, node: SimNode, on_append: Callable[[int, Sequence[bytes]], None], *, commit_now: bool = True
    ) -> None:
        """``commit_now``: as the driver, hand a few committed batches to an idle
        :class:`~kraft.raft.api.CommitNowListener` in the step a leader's high watermark passes them
        (:class:`ListenerFeed`); False: every batch through its listener's task."""
        self._node = node
        self._on_append = on_append
        self._commit_now = commit_now
        self._feeds: dict[int, ListenerFeed] = {}
        self._committed_now_closed = 0
        self.resignations = 0
        # confirm_leadership() callers by (node incarnation, round): a restarted core counts rounds
        # from 1 again, so a round id alone could match a waiter of the incarnation before.
        self._read_waiters: dict[tuple[int, int], list[asyncio.Future[None]]] = {}
        # The node's effects reach these waiters as the driver's do (OutputPorts); the plain Raft
        # simulation has nobody waiting and keeps the default ports.  A restarted controller gets a new
        # client on the same node: wrap the node's own ports, never the previous client's.
        ports = _NODE_PORTS.setdefault(node, node.ports)
        fail_appends = ports.fail_pending_appends

        def lost_leadership() -> None:
            fail_appends()
            self._fail_read_waiters()

        node.ports = dataclasses.replace(
            ports, confirm_read_round=self._on_read_round_confirmed, fail_pending_appends=lost_leadership
        )

    # ---- what the simulation calls ----

    def stop(self) -> None:
        """The node crashed or the controller stops: callers still waiting for a leadership confirmation
        fail, as the driver's do when it stops (their round can no longer be confirmed)."""
        error = RaftShutdownError("raft is shut down")
        for key in list(self._read_waiters):
            for future in self._read_waiters.pop(key):
                if not future.done():
                    future.set_exception(error)

    @property
    def committed_now(self) -> int:
        """Batches its listeners took synchronously (``handle_commit_now``), closed listeners included."""
        return self._committed_now_closed + sum(feed.committed_now for feed in self._feeds.values())

    def pump(self) -> None:
        """Hand every listener what its node has committed and its leader changes (after every event)."""
        for feed in self._feeds.values():
            feed.pump()

    # ---- RaftClient ----

    @property
    def node_id(self) -> int:
        return self._node.node_id

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch:
        core = self._node.core
        return core.leader_and_epoch if core is not None else LeaderAndEpoch(NO_LEADER, -1)

    @property
    def high_watermark(self) -> int:
        return self._node.high_watermark

    @property
    def next_append_offset(self) -> int:
        core = self._node.core
        if core is None:
            raise NotLeaderError(self.leader_and_epoch)
        return core.next_append_offset

    def register_listener(self, listener: RaftListener) -> None:
        feed = ListenerFeed(self._node, listener, commit_now=self._commit_now)
        self._feeds[id(listener)] = feed
        feed.pump()

    def unregister_listener(self, listener: RaftListener) -> None:
        feed = self._feeds.pop(id(listener), None)
        if feed is not None:
            self._committed_now_closed += feed.committed_now
            feed.close()

    def schedule_append(self, records: Sequence[bytes], *, hold: bool = False) -> int:
        node = self._node
        core = node.core
        if not node.running or core is None or not core.is_leader:
            raise NotLeaderError(self.leader_and_epoch)
        if not records:
            raise ValueError("empty append")
        now_ms = node.clock_ms()
        last = core.append(list(records), now_ms, hold=hold)
        self._on_append(last - len(records) + 1, records)
        node.process(core.take_output(now_ms))
        return last

    def end_hold(self) -> None:
        node = self._node
        core = node.core
        if not node.running or core is None or not core.is_leader:
            return
        now_ms = node.clock_ms()
        core.end_hold(now_ms)
        node.process(core.take_output(now_ms))

    async def append(self, records: Sequence[bytes]) -> int:
        return self.schedule_append(records)

    async def yield_turn(self) -> None:
        """One loop turn: no Raft driver of its own whose work could go first."""
        await asyncio.sleep(0)

    async def learn_log_end_commit(self) -> int:
        """At once: not modelled (its only caller is a stopping controller's image-store catch-up, and the
        simulated controllers keep no store)."""
        return self.high_watermark

    def confirm_leadership(self, *, lease: bool = False) -> asyncio.Future[None]:
        node = self._node
        core = node.core
        if not node.running or core is None or not core.is_leader:
            raise NotLeaderError(self.leader_and_epoch)
        now_ms = node.clock_ms()
        read_round = core.confirm_leadership(now_ms, lease=lease)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if read_round == 0:  # confirmed by the leader lease
            future.set_result(None)
            node.process(core.take_output(now_ms))
            return future
        self._read_waiters.setdefault((node.incarnation, read_round), []).append(future)
        node.process(core.take_output(now_ms))
        return future

    def _on_read_round_confirmed(self, read_round: int) -> None:
        incarnation = self._node.incarnation
        for key in sorted(self._read_waiters):
            if key[0] != incarnation:
                self._fail_read_waiters(key)  # that core crashed: its rounds never confirm
            elif key[1] <= read_round:
                for future in self._read_waiters.pop(key):
                    if not future.done():
                        future.set_result(None)

    def _fail_read_waiters(self, only: tuple[int, int] | None = None) -> None:
        error = NotLeaderError(self.leader_and_epoch, "leadership lost before it was confirmed")
        for key in [only] if only is not None else list(self._read_waiters):
            for future in self._read_waiters.pop(key, []):
                if not future.done():
                    future.set_exception(error)

    def create_snapshot(
        self, end_offset: int, epoch: int, last_contained_timestamp_ms: int
    ) -> SnapshotWriter:
        raise ValueError("the controller simulation keeps no Raft snapshots")

    async def read_committed(self, offset: int, max_bytes: int) -> CommittedSlice:
        raise NotImplementedError("not used by the controller")

    def latest_snapshot_id(self) -> SnapshotId | None:
        return None

    async def read_snapshot(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> SnapshotChunk:
        raise NotImplementedError("not used by the controller")

    def describe_quorum(self) -> DescribeQuorumResponse:
        raise NotImplementedError("not used by the controller")

    async def resign(self) -> None:
        self.resignations += 1

    async def shutdown(self, timeout_ms: int) -> None:
        for feed in self._feeds.values():
            self._committed_now_closed += feed.committed_now
            feed.close()
        self._feeds.clear()


class ListenerFeed:
    """One listener's cursor over its node's committed batches (the simulation's ``ListenerSet``).

    As the driver does, a leader whose high watermark rose hands a few newly committed batches it built to
    an idle :class:`~kraft.raft.api.CommitNowListener` in the same step (``pump``, between two simulation
    events, before the loop runs), asking :func:`~kraft.raft.listeners.hand_over_now` — the rule
    ``ListenerSet.deliver_now`` follows; whatever it does not take goes through the feed's task as before.
    ``commit_now=False`` leaves the fast path out (every batch through ``handle_commit``)."""

    def __init__(self, node: SimNode, listener: RaftListener, *, commit_now: bool = True) -> None:
        self._node = node
        self._listener = listener
        self.next_offset = 0
        self.reported_leader: LeaderAndEpoch | None = None
        self._commit_now = (
            listener.handle_commit_now if commit_now and isinstance(listener, CommitNowListener) else None
        )
        self._seen_high_watermark = 0
        self.committed_now = 0
        """Batches handed over synchronously (``handle_commit_now`` took them)."""
        self._idle = False
        self._pumped: tuple[int, LeaderAndEpoch, int, int, int] | None = None
        self._leader_of: tuple[StateKind, ElectionState, LeaderAndEpoch] | None = None
        """The core's state and election at the last pump and the leader and epoch they make
        (``RaftCore.leader_and_epoch`` builds a new one at every call; the pump runs after every event)."""
        """What the last :meth:`pump` saw: (applied end, leader, epoch start, id and start of the log)."""
        self._queue: asyncio.Queue[Any] = asyncio.Queue()
        self._task = asyncio.get_running_loop().create_task(self._feed())

    def pump(self) -> None:
        node, core = self._node, self._node.core
        if not node.running or core is None:
            return
        known = self._leader_of
        if known is not None and known[0] is core.state and known[1] is core.election:
            leader = known[2]  # the same state and election (immutable): the same leader and epoch
        else:
            leader = core.leader_and_epoch
            self._leader_of = (core.state, core.election, leader)
        epoch_start = core.epoch_start_offset if core.is_leader else -1
        log = node.log
        seen = (node.applied_end, leader, epoch_start, id(log), log.start_offset)
        if seen == self._pumped:
            # Nothing it reads moved since the last pump, which left nothing to do with it: the batches
            # below the applied end are committed (never truncated; appends land at the log's end, above
            # it), and leader_change_due gives the answer it gave at that pump's end.  The simulation
            # pumps after every event; most events move none of these.
            return
        self._pumped = seen
        rose = node.applied_end > self._seen_high_watermark
        self._seen_high_watermark = node.applied_end
        if rose and core.is_leader and self._commit_now is not None and self._idle and self._queue.empty():
            self._hand_over_now(core.epoch, CommitView(node.applied_end, leader, epoch_start))
        self._maybe_report(leader, epoch_start)
        index = max(0, bisect.bisect_right(log.bases, self.next_offset) - 1)
        while index < len(log.batches):
            base, last, epoch, values = log.batches[index]
            index += 1
            if last < self.next_offset:
                continue
            if last >= node.applied_end:
                break
            control = all(not isinstance(v, bytes) for v in values)
            records = (
                []
                if control
                else [CommittedRecord(base + i, v) for i, v in enumerate(values) if isinstance(v, bytes)]
            )
            self._queue.put_nowait(CommittedBatch(base, last, epoch, records, 0, control))
            self.next_offset = last + 1
        self._maybe_report(leader, epoch_start)

    def _hand_over_now(self, epoch: int, view: CommitView) -> None:
        """The driver's ``_on_high_watermark`` on a leader: ``ListenerSet.deliver_now`` over the batches
        this leader built (its own epoch's record batches of at most ``SYNC_DELIVERY_MAX_RECORDS`` records,
        as ``RaftDriver._remember_built`` keeps them) from the cursor up to the high watermark."""
        commit_now = self._commit_now
        assert commit_now is not None
        log = self._node.log
        built: list[CommittedBatch] = []
        index = max(0, bisect.bisect_right(log.bases, self.next_offset) - 1)
        while index < len(log.batches):
            base, last, batch_epoch, values = log.batches[index]
            index += 1
            if last < self.next_offset:
                continue
            if base >= view.high_watermark:
                break
            records = [v for v in values if isinstance(v, bytes)]
            if batch_epoch == epoch and len(records) == len(values) <= SYNC_DELIVERY_MAX_RECORDS:
                built.append(CommittedBatch(base, last, batch_epoch, BuiltRecords(base, records), 0))

        def counted(batch: CommittedBatch) -> bool:
            taken = commit_now(batch)
            self.committed_now += taken
            return taken

        # An exception is the task's to handle in the driver (it delivers the same batch again): here it
        # fails the simulation, as any listener error does.
        hand_over_now(self, counted, built, lambda: view, log.start_offset)

    def _maybe_report(self, leader: LeaderAndEpoch, epoch_start: int) -> None:
        if not leader_change_due(leader, self.reported_leader, self.next_offset, epoch_start):
            return
        self.reported_leader = leader
        self._queue.put_nowait(leader)

    def close(self) -> None:
        self._task.cancel()

    async def _feed(self) -> None:
        while True:
            self._idle = True
            try:
                item = await self._queue.get()
            finally:
                self._idle = False
            if isinstance(item, CommittedBatch):
                await self._listener.handle_commit(item)
            elif isinstance(item, LoadedSnapshot):
                await self._listener.handle_load_snapshot(item)
            else:
                await self._listener.handle_leader_change(item)
