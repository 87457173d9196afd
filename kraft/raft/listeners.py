"""Delivery of committed data to :class:`~kraft.raft.api.RaftListener` s, one task per listener.

Each listener has its own cursor (``next_offset``) and task, so a slow state machine delays only itself.
The task wakes on every high-watermark, snapshot or leader change and catches up: report a change to
another leader (or to no leader) at once, load the latest snapshot when its cursor is below the log start,
then hand over committed batches in order.  A change that makes *this* node leader is reported only once
the listener has seen everything up to the leader's epoch start offset (Kafka's rule: the new active
controller must have replayed the previous epochs before it acts).

On a leader the driver hands a few committed records to a :class:`~kraft.raft.api.CommitNowListener` in the
step the high watermark passes them, from the batches it built (:meth:`ListenerSet.deliver_now`: no log
read), when its task is idle: the active controller's commit answers wait on its listener, and the task's
wake-up was a loop turn, a log read and a catch-up pass on every write's path
(docs/internals/raft-performance.md, "The commit handed over in the driver's step (session 16)").
Anything else — a follower, a big range, a listener that declines, a leader change due, a batch the
driver does not hold, a snapshot to load — goes through the task as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, overload

from kraft.observability.logging import StructLogger
from kraft.raft.api import (
    CommitNowListener,
    CommittedBatch,
    CommittedRecord,
    LeaderAndEpoch,
    LoadedSnapshot,
    RaftListener,
)
from kraft.raft.messages import SnapshotId
from kraft.raft.ports import LogStore, SnapshotStore
from kraft.storage.batch import decode_offset_values, iter_batch_headers

_READ_BYTES = 1024 * 1024
LISTENER_ATTEMPTS = 3
"""Consecutive failures of one catch-up before a listener is given up (and ``on_failure`` called)."""
_RETRY_PAUSE_S = 0.05
SYNC_DELIVERY_MAX_RECORDS = 64
"""At most this many committed records (high watermark minus the cursor) are handed over in the driver's
step by :meth:`ListenerSet.deliver_now`; a larger range goes to the listener's task, one batch per loop
turn (a lone write's batch has a few records; bulk work's batches go the sliced way)."""


class LazyRecords(Sequence[CommittedRecord]):
    """The records of the batch at ``position`` of ``data``, decoded on first use (then ``data`` is let go).

    The bytes come from the local log, whose batches were CRC-checked when they were appended and when the
    listener read their headers.  Decoding is the expensive part (a batch of 1,000 partition records: 2.5 ms
    to decode into records, 0.01 ms to check its header and CRC), and the active controller skips it for
    the batches it wrote itself (it holds their values and the image they lead to).
    """

    __slots__ = ("_data", "_pairs", "_position", "_records")

    def __init__(self, data: bytes, position: int) -> None:
        self._data = data
        self._position = position
        self._pairs: list[tuple[int, bytes]] | None = None
        self._records: list[CommittedRecord] | None = None

    def offset_values(self) -> list[tuple[int, bytes]]:
        """``(offset, value)`` of every record, decoded without a record object each (what a metadata
        replay reads: :func:`kraft.raft.api.offset_values`)."""
        if self._pairs is None:
            if self._records is not None:
                self._pairs = [(r.offset, r.value) for r in self._records]
            else:
                self._pairs = decode_offset_values(self._data, self._position)
                self._data = b""
        return self._pairs

    def _decoded(self) -> list[CommittedRecord]:
        if self._records is None:
            self._records = [CommittedRecord(offset, value) for offset, value in self.offset_values()]
        return self._records

    def __len__(self) -> int:
        return len(self._decoded())

    @overload
    def __getitem__(self, index: int) -> CommittedRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[CommittedRecord]: ...

    def __getitem__(self, index: int | slice) -> CommittedRecord | Sequence[CommittedRecord]:
        return self._decoded()[index]

    def __iter__(self) -> Iterator[CommittedRecord]:
        return iter(self._decoded())


class BuiltRecords(Sequence[CommittedRecord]):
    """The records of a batch this node built as leader, from the values it wrote (for
    :meth:`ListenerSet.deliver_now`: nothing to read or decode; a :class:`CommittedRecord` each only on
    first use)."""

    __slots__ = ("_base", "_records", "_values")

    def __init__(self, base_offset: int, values: Sequence[bytes]) -> None:
        self._base = base_offset
        self._values = values
        self._records: list[CommittedRecord] | None = None

    def offset_values(self) -> list[tuple[int, bytes]]:
        """``(offset, value)`` of every record (:func:`kraft.raft.api.offset_values`)."""
        return list(zip(range(self._base, self._base + len(self._values)), self._values, strict=True))

    def _decoded(self) -> list[CommittedRecord]:
        if self._records is None:
            self._records = [CommittedRecord(offset, value) for offset, value in self.offset_values()]
        return self._records

    def __len__(self) -> int:
        return len(self._values)

    @overload
    def __getitem__(self, index: int) -> CommittedRecord: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[CommittedRecord]: ...

    def __getitem__(self, index: int | slice) -> CommittedRecord | Sequence[CommittedRecord]:
        return self._decoded()[index]

    def __iter__(self) -> Iterator[CommittedRecord]:
        return iter(self._decoded())


async def _next_turn() -> None:
    await asyncio.sleep(0)


def leader_change_due(
    leader: LeaderAndEpoch, reported: LeaderAndEpoch | None, next_offset: int, leader_epoch_start_offset: int
) -> bool:
    """Whether a listener whose cursor is at ``next_offset`` and that was last told ``reported`` is told
    ``leader`` now.  ``leader_epoch_start_offset`` is where this node's own leadership epoch starts (-1 when
    it is not the leader): becoming leader waits until the listener has everything before that offset.

    The one statement of the rule: :class:`ListenerSet` and the controller simulation's listener feed
    (tests/sim/sim_raft_client.py) both ask it, before and after handing over committed batches.
    """
    if leader == reported:
        return False
    # Not caught up with the previous epochs yet: report once the LeaderChange batch is delivered.
    return leader_epoch_start_offset < 0 or next_offset > leader_epoch_start_offset


@dataclass(frozen=True, slots=True)
class CommitView:
    """What a listener task reads from the driver, captured at one instant of the event loop."""

    high_watermark: int
    leader: LeaderAndEpoch
    leader_epoch_start_offset: int
    """Where this node's own leadership epoch starts (-1 when it is not the leader)."""


@dataclass
class ListenerCursor:
    listener: RaftListener
    next_offset: int = 0
    reported_leader: LeaderAndEpoch | None = None
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None
    commit_now: Callable[[CommittedBatch], bool] | None = None
    """The listener's ``handle_commit_now`` (a :class:`~kraft.raft.api.CommitNowListener`), else None."""
    idle: bool = False
    """The task waits for its next wake-up and has nothing in hand: :meth:`ListenerSet.deliver_now` may
    hand over batches meanwhile (its next catch-up starts from ``next_offset`` as they left it)."""


class DeliveryCursor(Protocol):
    """Where one listener stands: the next offset it is handed and the leader it was last told."""

    next_offset: int
    reported_leader: LeaderAndEpoch | None


def hand_over_now(
    cursor: DeliveryCursor,
    commit_now: Callable[[CommittedBatch], bool],
    built: Sequence[CommittedBatch],
    view: Callable[[], CommitView],
    log_start_offset: int,
) -> bool:
    """:meth:`ListenerSet.deliver_now`'s decision for one idle listener: hand ``commit_now`` the batches of
    ``built`` from ``cursor.next_offset`` up to the high watermark, advancing the cursor past each it takes,
    and say whether the cursor is caught up afterwards (False: its task has something left to do).  An
    exception from ``commit_now`` propagates (the cursor stays past the batches taken before it).

    The one statement of the rule: :class:`ListenerSet` and the controller simulation's listener feed
    (tests/sim/sim_raft_client.py) both ask it, so the simulation takes the driver's fast path."""
    current = view()
    high_watermark = current.high_watermark
    start = cursor.next_offset
    if (
        start >= high_watermark
        or high_watermark - start > SYNC_DELIVERY_MAX_RECORDS
        or start < log_start_offset
        or leader_change_due(current.leader, cursor.reported_leader, start, current.leader_epoch_start_offset)
    ):
        return False
    for batch in built:
        if batch.last_offset < start:
            continue
        if batch.base_offset != cursor.next_offset or batch.last_offset >= high_watermark:
            break  # a gap (the task reads it from the log), or not wholly committed yet
        if not commit_now(batch):
            return False
        cursor.next_offset = batch.last_offset + 1
    if cursor.next_offset < high_watermark:
        return False
    # Becoming leader is reported once the batches before the epoch start are delivered: the task's.
    current = view()
    return not leader_change_due(
        current.leader, cursor.reported_leader, cursor.next_offset, current.leader_epoch_start_offset
    )


class ListenerSet:
    def __init__(
        self,
        log: LogStore,
        snapshots: SnapshotStore,
        view: Callable[[], CommitView],
        logger: StructLogger,
        on_failure: Callable[[BaseException], None] | None = None,
        pause: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        """``pause``: awaited between two batches (the driver's ``yield_turn``); one loop turn by
        default."""
        self._log = log
        self._pause = pause if pause is not None else _next_turn
        self._snapshots = snapshots
        self._view = view
        self._log_struct = logger
        self._on_failure = on_failure
        self._cursors: list[ListenerCursor] = []

    def register(self, listener: RaftListener) -> None:
        if any(cursor.listener is listener for cursor in self._cursors):
            return
        cursor = ListenerCursor(listener)
        if isinstance(listener, CommitNowListener):
            cursor.commit_now = listener.handle_commit_now
        cursor.task = asyncio.get_running_loop().create_task(self._run(cursor), name="raft-listener")
        self._cursors.append(cursor)
        cursor.wake.set()

    def unregister(self, listener: RaftListener) -> None:
        for cursor in list(self._cursors):
            if cursor.listener is listener:
                self._cursors.remove(cursor)
                if cursor.task is not None:
                    cursor.task.cancel()

    def wake_all(self) -> None:
        for cursor in self._cursors:
            cursor.wake.set()

    def deliver_now(self, built: Sequence[CommittedBatch]) -> None:
        """The leader's high watermark rose: hand each idle :class:`~kraft.raft.api.CommitNowListener` the
        newly committed batches now, in this step, if they are few (``SYNC_DELIVERY_MAX_RECORDS``), all in
        ``built`` and it takes them all; wake the task of every other listener (and of one that did not
        take everything) as :meth:`wake_all` does.

        ``built``: batches the leader built and wrote to this log in offset order (from the values it
        wrote: no log read, no decoding, nothing here does IO), possibly with gaps — a batch not in it
        (a control batch, a big one, one from before this node led) ends the hand-over there, and the task
        reads the rest from the log.  The same order as the task's: a leader change due is reported first
        (by the task: this declines), batches go in offset order from the cursor, and a cursor is never
        handed a batch while its task is inside a delivery."""
        for cursor in self._cursors:
            commit_now = cursor.commit_now
            if commit_now is None or not cursor.idle or not self._deliver_now(cursor, commit_now, built):
                cursor.wake.set()

    def _deliver_now(
        self,
        cursor: ListenerCursor,
        commit_now: Callable[[CommittedBatch], bool],
        built: Sequence[CommittedBatch],
    ) -> bool:
        """Whether ``cursor`` is caught up with the high watermark after the batches handed over here (False:
        its task has something left to do)."""
        try:
            return hand_over_now(cursor, commit_now, built, self._view, self._log.start_offset)
        except Exception:
            # A listener that raises is the task's to handle: it delivers the same batch again, and gives
            # the listener up after LISTENER_ATTEMPTS (fail-stop), as for any delivery.
            self._log_struct.debug("listener_deliver_now_failed", next_offset=cursor.next_offset)
            return False

    async def close(self) -> None:
        tasks = [cursor.task for cursor in self._cursors if cursor.task is not None]
        self._cursors.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

    async def _run(self, cursor: ListenerCursor) -> None:
        failures = 0
        while True:
            if failures == 0:
                cursor.idle = True
                try:
                    await cursor.wake.wait()
                finally:
                    cursor.idle = False
            cursor.wake.clear()
            try:
                await self._catch_up(cursor)
                failures = 0
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                failures += 1
                self._log_struct.exception(
                    "listener_failed", next_offset=cursor.next_offset, attempt=failures
                )
                if self._on_failure is None:
                    failures = 0  # no owner to tell: retried on the next wake-up, as before
                    continue
                if failures >= LISTENER_ATTEMPTS:
                    # The same committed data failed to load or apply every time (a corrupt checkpoint
                    # or segment, a record the state machine cannot take): the state machine can never
                    # get past it, and a node that leads or serves without it would answer from an
                    # incomplete state.  The owner stops the process (fail-stop, issue #14).
                    self._on_failure(exc)
                    return
                # A few quick retries first: a snapshot file replaced by a newer one between listing
                # and reading is a race that resolves by reading again.
                await asyncio.sleep(_RETRY_PAUSE_S * failures)

    async def _catch_up(self, cursor: ListenerCursor) -> None:
        while True:
            view = self._view()
            # A change to *another* leader is reported before any batch of the newer epoch is delivered,
            # so a deposed active controller learns it lost leadership before it sees the records that
            # replaced its own uncommitted ones (becoming leader ourselves still waits, see below).
            await self._maybe_report_leader(cursor, view)
            if cursor.next_offset < self._log.start_offset:
                snapshot_id = self._snapshots.latest()
                if snapshot_id is None:
                    return
                await self._load_snapshot(cursor, snapshot_id)
                continue
            if cursor.next_offset >= view.high_watermark:
                break
            data = self._log.read(cursor.next_offset, _READ_BYTES, view.high_watermark)
            if not data:
                break
            before = cursor.next_offset
            for position, header in iter_batch_headers(data):
                if header.last_offset < cursor.next_offset:
                    continue
                if header.base_offset >= view.high_watermark:
                    break
                committed = CommittedBatch(
                    header.base_offset,
                    header.last_offset,
                    header.partition_leader_epoch,
                    () if header.is_control else LazyRecords(data, position),
                    header.max_timestamp,
                    header.is_control,
                )
                await cursor.listener.handle_commit(committed)
                cursor.next_offset = header.last_offset + 1
                # One batch per event-loop turn: a listener that applies a batch without suspending
                # (e.g. the active controller, which already holds the image) must not hold the loop
                # for a whole read (up to _READ_BYTES of batches) — gRPC accepts about one new call
                # per loop turn, so long turns starve heartbeats and Raft fetches.  On a follower the
                # pause also lets Raft's own pending work (its next Fetch) finish first.
                await self._pause()
            if cursor.next_offset == before:
                break  # nothing deliverable (never expected): wait for the next wake-up, do not spin
        await self._maybe_report_leader(cursor, self._view())

    async def _load_snapshot(self, cursor: ListenerCursor, snapshot_id: SnapshotId) -> None:
        last_contained_ms, records = await asyncio.to_thread(self._snapshots.read_records, snapshot_id)
        await cursor.listener.handle_load_snapshot(LoadedSnapshot(snapshot_id, last_contained_ms, records))
        cursor.next_offset = snapshot_id.end_offset

    async def _maybe_report_leader(self, cursor: ListenerCursor, view: CommitView) -> None:
        if not leader_change_due(
            view.leader, cursor.reported_leader, cursor.next_offset, view.leader_epoch_start_offset
        ):
            return
        cursor.reported_leader = view.leader
        await cursor.listener.handle_leader_change(view.leader)
