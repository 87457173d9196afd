"""The active controller's write path: records appended at the offsets the logic predicted, answers
released when they commit.

Owns everything between "the logic produced records" and "they committed": the next offset, the commit
waiters, the images and values of this epoch's own appends (so their commit needs no replay), pacing of
bulk writes, and the leader lease (how long the oldest write has waited).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import heapq
import itertools
from collections import deque
from collections.abc import Callable
from typing import Any, TypeVar

from google.protobuf.message import Message

from kraft.metadata import records as rec
from kraft.metadata.controller_logic import ControllerLogic, Outcome
from kraft.metadata.controller_state import ControllerState, NotControllerError, WriteOutcomeUnknown
from kraft.metadata.event_queue import ControllerEventQueue, EventPriority, EventQueueClosedError
from kraft.metadata.image import MetadataImage
from kraft.metadata.timers import Timers
from kraft.observability.logging import StructLogger
from kraft.raft.api import CommittedBatch, NotLeaderError, RaftClient, RaftShutdownError
from kraft.raft.messages import NO_LEADER
from kraft.v1 import metadata_pb2 as pb

R = TypeVar("R", bound=Message)

# Bulk writes (leave and rejoin jobs, big CreateTopics, DeleteTopics) stop computing further appends
# while this many records are appended but not committed (the default of
# ControllerOptions.max_uncommitted_bulk_records): Raft batches stay small and the event loop serves
# heartbeats and fetches in between, instead of the leader racing far ahead of its followers.
MAX_UNCOMMITTED_RECORDS = 10_000


@dataclasses.dataclass(slots=True)
class BulkJobStats:
    """One run of the bulk job driver (a controlled shutdown's ISR removals, unfence elections, a big
    topic's parts): logged as ``bulk_jobs_done`` when it ends, so an operator (and the benchmarks) can
    tell a bulk operation held back by commits (``room_wait_ms``: waiting while
    ``max_uncommitted_bulk_records`` were not committed) from one that is CPU-bound (many slices, little
    waiting)."""

    started_ms: int
    slices: int = 0
    records: int = 0
    room_wait_ms: int = 0

    def log(self, log: StructLogger, now_ms: int, *, finished: bool) -> None:
        log.info(
            "bulk_jobs_done" if finished else "bulk_jobs_stopped",
            slices=self.slices,
            records=self.records,
            duration_ms=now_ms - self.started_ms,
            room_wait_ms=self.room_wait_ms,
        )


class LeadershipNotConfirmed(Exception):
    """Raft did not confirm this controller's leadership within the commit timeout (a majority out of
    reach, or slow): the answer is withheld, the caller retries (REQUEST_TIMED_OUT)."""


SETTLE_PAUSE_MS = 10
"""Pause between two slices of the rejoin index's settling (each ``controller_logic.SETTLE_SLICE_MS``):
~10 % of the loop while it lasts (~3-4 s after a 109k-leadership shutdown), so the heartbeats right after a
bulk job do not compete with it for the host's cores (session 12; 2 ms and half-budget slices before).
Nothing waits for it: an unfence meanwhile settles the rest in its rejoin job's slices."""


def _retrieve(task: asyncio.Future[Any]) -> None:
    """An outcome read by whoever waits for it, if anyone (the job driver), or not wanted at all (a round
    wait given up): never reported as "never retrieved"."""
    if not task.cancelled():
        task.exception()


class WritePath:
    def __init__(
        self,
        state: ControllerState,
        raft: RaftClient,
        timers: Timers,
        *,
        commit_timeout_ms: int,
        leader_lease_ms: int,
        on_not_leader: Callable[[int], None],
        log: StructLogger,
        max_uncommitted_records: int = MAX_UNCOMMITTED_RECORDS,
    ) -> None:
        self._state = state
        self._raft = raft
        self._timers = timers
        self._commit_timeout_ms = commit_timeout_ms
        self._leader_lease_ms = leader_lease_ms
        self._on_not_leader = on_not_leader
        self._log = log
        self._next_offset = 0
        self.last_write_ms = 0
        self._oldest_pending_ms: int | None = None
        # (offset, seq, epoch the offset was appended in, future): a waiter resolves when its offset commits
        # in a batch of its own epoch, and fails when a newer leader's batch commits there instead.
        self._waiters: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        # last offset of each append of this epoch → the logic's image right after it (see own_image)
        self._own_images: dict[int, MetadataImage] = {}
        self._own_values: deque[tuple[int, list[bytes]]] = deque()
        """(first offset, values) of each append whose image is in ``_own_images``, in offset order."""
        self.resignations: list[asyncio.Task[None]] = []
        self._max_uncommitted = max_uncommitted_records
        self.queue = ControllerEventQueue()
        """Every computation on the logic runs as an event here (see event_queue.py)."""
        self._driver: asyncio.Task[int] | None = None
        self._driver_logic: ControllerLogic | None = None
        # settles the rejoin index's flags that bulk writes left dirty, once the bulk work is done
        self._settler: asyncio.Task[None] | None = None
        self.last_bulk_run: BulkJobStats | None = None
        """The job driver's last run (slices, records, time waiting for commits), once it ended."""

    # ---- appends ----

    @property
    def next_offset(self) -> int:
        """The offset the next appended record gets, which the logic builds its records for (a broker
        epoch is the offset of its registration).  While active it is read from Raft, never counted
        here: the Raft leader appends control records of its own between ours (a VotersRecord when a
        voter is added or removed, KIP-853), and a count of our own appends would then predict offsets
        the records do not get (the controller used to resign on every voter change)."""
        if self._state.logic is not None:
            return self._raft.next_append_offset
        return self._next_offset

    @next_offset.setter
    def next_offset(self, offset: int) -> None:
        self._next_offset = offset

    def append(self, records: list[pb.MetadataRecord], first_offset: int, *, hold: bool = False) -> int:
        """Schedule records at the offsets the logic predicted; returns the last offset.  ``hold``: a bulk
        slice with more to follow — Raft may keep it for the next slices' records to share its batch
        (``RaftClient.schedule_append``)."""
        return self.append_values([rec.encode_value(r) for r in records], first_offset, hold=hold)

    def append_values(self, values: list[bytes], first_offset: int, *, hold: bool = False) -> int:
        """:meth:`append` of records encoded already (:attr:`Outcome.values`: a prepared topic's)."""
        try:
            last = self._raft.schedule_append(values, hold=hold)
        except NotLeaderError as exc:
            self._on_not_leader(exc.leader.leader_id)
            raise NotControllerError(exc.leader.leader_id) from exc
        expected = first_offset + len(values) - 1
        self._next_offset = last + 1
        self.last_write_ms = self._timers.now_ms()
        if self._oldest_pending_ms is None:
            self._oldest_pending_ms = self.last_write_ms
        logic = self._state.logic
        if last != expected:
            # Broker epochs inside these records assumed other offsets; let a new leader rebuild.
            self._log.error("offset_prediction_mismatch", expected=expected, got=last)
            self.resignations.append(asyncio.get_running_loop().create_task(self._raft.resign()))
        elif logic is not None and logic.image.offset == last:
            self._own_images[last] = logic.image
            self._own_values.append((last - len(values) + 1, values))
        if logic is not None and not hold and not logic.has_bulk_jobs():
            self.settle_index(logic)  # a big write outside a bulk job (else the job driver's end does)
        return last

    async def write(
        self,
        build: Callable[[ControllerLogic], Outcome[R]],
        *,
        priority: EventPriority = EventPriority.NORMAL,
        name: str = "write",
        wait_for_jobs: bool = True,
        confirm_unchanged: bool = False,
    ) -> R:
        """Run ``build`` on the active logic as one event of the queue, append its records, and answer
        once they (and everything before) committed.

        ``build`` runs inside the event, so the offsets it predicts (``next_offset``) are the ones its
        records get.  Bulk work it started (brokers leaving their ISRs, unfence elections) continues in
        further events of bounded size run by the job driver; with ``wait_for_jobs`` the answer waits for
        the last of them (ShutdownBroker, UnregisterBroker), otherwise only for its own records (a
        heartbeat's answer never waits behind bulk work).

        Raises NotControllerError when nothing was appended (the request may go to the new leader as it
        is), :class:`WriteOutcomeUnknown` when leadership was lost after its records were appended, and
        TimeoutError when the records did not commit within the commit timeout (outcome unknown too).

        ``confirm_unchanged``: an answer that appends nothing (a heartbeat that changes nothing) is given
        only once Raft confirmed, after the event ran, that this node still leads
        (:meth:`confirm_leadership`): a deposed controller that does not know it yet must not extend a
        broker's session that the new controller may already have fenced.  One that appends is confirmed
        by its commit.  Raises :class:`LeadershipNotConfirmed` when that takes longer than the commit
        timeout.
        """
        outcome, last, logic = await self.queue.run(priority, name, lambda: self._run_event(build))
        if last is not None:
            try:
                if logic.has_bulk_jobs():
                    driver = self.drive_jobs(logic)
                    if wait_for_jobs:
                        last = max(last, await asyncio.shield(driver))
                await self.wait_committed(last)
            except NotControllerError as exc:
                # Appended, then deposed: the records may commit under the new leader or be truncated.
                raise WriteOutcomeUnknown(exc.leader_id) from exc
        else:
            depends_on = outcome.wait_offset if outcome.wait_offset is not None else self.next_offset - 1
            if confirm_unchanged:
                await self._committed_and_confirmed(depends_on)
            else:
                await self.wait_committed(depends_on)
        return outcome.response

    async def _committed_and_confirmed(self, depends_on: int) -> None:
        """Wait for ``depends_on`` to commit and for a leadership round, both at once.

        The round may start before the commit: what it must follow is the event that read the state the
        answer comes from, which already ran.  Waiting for them one after the other cost their sum — during
        bulk work a commit of the bulk records the answer depends on, then a whole round (issue #17); now
        it costs the longer of the two.  A commit failure wins (as when they ran in turn) and ends the round
        wait.
        """
        deadline_ms = self._timers.now_ms() + self._commit_timeout_ms
        confirmation = self._start_confirmation(lease=True)
        try:
            await self.wait_committed(depends_on)
        except BaseException:
            confirmation.cancel()
            confirmation.add_done_callback(_retrieve)
            raise
        await self._confirmed(confirmation, deadline_ms)

    async def confirm_leadership(self) -> None:
        """Wait for a Raft leadership-confirmation round that starts now (ReadIndex: a majority of voters
        fetched at this epoch after it started, so no newer leader was elected before this call); every
        caller waiting at the same time shares one round.  NotControllerError when leadership is lost,
        :class:`LeadershipNotConfirmed` after the commit timeout."""
        deadline_ms = self._timers.now_ms() + self._commit_timeout_ms
        await self._confirmed(self._start_confirmation(), deadline_ms)

    def _start_confirmation(self, *, lease: bool = False) -> asyncio.Future[None]:
        """Ask Raft for a round now, in this step: a task would ask a loop turn later, and under bulk work
        a turn of this loop is long (issue #17).  A refusal comes back as the future's exception.

        ``lease``: Raft may confirm at once from its check-quorum leader lease (a majority of voters is
        provably still refusing to vote for anyone else: docs/internals/raft.md "Leader lease"); it
        falls back to a round when the lease lapsed, never answers stale."""
        try:
            # A future already (no task is made for it): the round was asked for in this call.
            return asyncio.ensure_future(self._raft.confirm_leadership(lease=lease))
        except (NotLeaderError, RaftShutdownError) as exc:
            refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            refused.set_exception(exc)
            return refused

    async def _confirmed(self, confirmation: asyncio.Future[None], deadline_ms: int) -> None:
        """Watch the round's future (not through a task: each task in between costs loop turns)."""
        try:
            confirmed = await self._timers.wait(confirmation, deadline_ms)
        finally:
            if not confirmation.done():
                confirmation.cancel()
        if not confirmed:
            raise LeadershipNotConfirmed
        try:
            confirmation.result()
        except NotLeaderError as exc:
            raise NotControllerError(exc.leader.leader_id) from exc
        except RaftShutdownError as exc:  # this node is stopping: nothing was done, ask another
            raise NotControllerError(NO_LEADER) from exc

    def _run_event(
        self, build: Callable[[ControllerLogic], Outcome[R]]
    ) -> tuple[Outcome[R], int | None, ControllerLogic]:
        logic = self._state.logic
        if logic is None:
            raise NotControllerError(self._state.leader.leader_id)
        outcome = build(logic)
        values = outcome.encoded()
        last = self.append_values(values, outcome.first_offset) if values else None
        return outcome, last, logic

    def drive_jobs(self, logic: ControllerLogic) -> asyncio.Future[int]:
        """Start (or join) the task that runs ``logic``'s bulk jobs slice by slice; its result is the
        last offset appended (NotControllerError if leadership went away meanwhile)."""
        driver = self._driver
        if driver is None or driver.done() or self._driver_logic is not logic:
            # (a driver of an earlier logic ends by itself: its logic is no longer the active one)
            driver = self._driver = asyncio.get_running_loop().create_task(
                self._run_jobs(logic), name="controller-bulk-jobs"
            )
            self._driver_logic = logic
            driver.add_done_callback(_retrieve)
        return driver

    async def _run_jobs(self, logic: ControllerLogic) -> int:
        last = self.next_offset - 1
        state = self._state
        stats = BulkJobStats(self._timers.now_ms())

        def next_slice() -> int | None:
            if logic is not state.logic:
                raise NotControllerError(state.leader.leader_id)
            first = self.next_offset
            more = logic.continue_bulk_values(first)
            stats.slices += 1
            stats.records += len(more)
            # Slices are ~5 ms of work each; a Raft batch each cost an fsync on every node, a fetch round
            # and a commit (~300-470 batches for a 109k-leadership shutdown).  While more slices follow,
            # Raft holds them for the next ones (up to its linger bound or a full batch); the last one is
            # cut at once, with whatever is held.  Heartbeats still run between slices: their records
            # end the hold.  A last slice that wrote nothing (the job's tail scan found no change) ends
            # the hold itself: the slices held before it would otherwise wait for the linger bound.
            if more:
                return self.append_values(more, first, hold=logic.has_bulk_jobs())
            if not logic.has_bulk_jobs():
                self._raft.end_hold()
            return None

        try:
            while logic is state.logic and logic.has_bulk_jobs():
                stats.room_wait_ms += await self.wait_for_room()
                appended = await self.queue.run(EventPriority.NORMAL, "bulk-slice", next_slice)
                if appended is not None:
                    last = appended
        finally:
            self.last_bulk_run = stats
            stats.log(self._log, self._timers.now_ms(), finished=logic is state.logic)
        if logic is not state.logic:
            raise NotControllerError(state.leader.leader_id)
        self.settle_index(logic)
        return last

    def settle_index(self, logic: ControllerLogic) -> None:
        """Start (unless running) the task that settles the rejoin index's dirty flags (bulk writes leave
        them: ``RejoinIndex.settle_some``) in events of their own, once no bulk job is left: off the
        bulk work's slices, and done before most unfences (which otherwise settle all at once)."""
        if not logic.rejoin_index.settling or logic.has_bulk_jobs():
            return
        settler = self._settler
        if settler is None or settler.done():
            self._settler = asyncio.get_running_loop().create_task(
                self._settle(logic), name="controller-rejoin-settle"
            )
            self._settler.add_done_callback(_retrieve)

    async def _settle(self, logic: ControllerLogic) -> None:
        state = self._state
        with contextlib.suppress(NotControllerError, EventQueueClosedError, TimeoutError):
            # After what was written commits: the answers waiting for it come first.
            await self.wait_committed(self.next_offset - 1)
            # A bulk job started meanwhile: stop; its driver starts this again when done.
            while logic is state.logic and not logic.has_bulk_jobs():
                if await self.queue.run(EventPriority.NORMAL, "rejoin-index-slice", logic.index_some):
                    return
                # Paced: nothing waits for it, and right after a bulk job back-to-back slices put
                # every step of the heartbeats' round trips (I/O, Fetch, commit) behind one (session 11,
                # bench.controller: heartbeat p99 after the shutdown 39 ms on main, 135-156 ms with
                # unpaced 5 ms slices; session 12: still 60-371 ms with 2-ms pauses, see SETTLE_PAUSE_MS).
                await self._timers.sleep_ms(SETTLE_PAUSE_MS)

    @property
    def settler(self) -> asyncio.Task[None] | None:
        """The index-settling task, if one was started (stop() cancels it)."""
        return self._settler

    @property
    def driver(self) -> asyncio.Task[int] | None:
        """The job driver task, if one was started (stop() cancels it)."""
        return self._driver

    async def wait_for_room(self) -> int:
        """Yield, then wait while too many appended records are not committed yet (bulk writes only);
        returns how long it waited for commits (ms, on the clock; 0 when there was room at once)."""
        await asyncio.sleep(0)
        state = self._state
        started = self._timers.now_ms()
        deadline = started + self._commit_timeout_ms
        waited = False
        while (
            state.logic is not None and self.next_offset - 1 - state.committed.offset > self._max_uncommitted
        ):
            if self._timers.now_ms() >= deadline:
                raise TimeoutError
            waited = True
            await self._timers.wait(state.next_commit(), deadline)
        return self._timers.now_ms() - started if waited else 0

    # ---- waiting for commits ----

    async def wait_committed(self, offset: int) -> None:
        if offset <= self._state.committed.offset:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (offset, next(self._seq), self._state.active_epoch, future))
        # Not asyncio.wait_for: on Python 3.11 it returns the future's outcome when the future completes in
        # the same loop turn as a cancellation of the waiting task, swallowing the cancellation — the idle
        # NoOp task then kept running and stop() never returned (found by the controller simulation).
        try:
            committed = await self._timers.wait_own(future, self._timers.now_ms() + self._commit_timeout_ms)
        except asyncio.CancelledError:
            future.cancel()  # resolve_waiters skips it
            raise
        if not committed:
            future.cancel()
            raise TimeoutError
        future.result()  # NotControllerError when a newer leader's batch committed at that offset

    def on_committed(self, offset: int, epoch: int) -> None:
        """Everything up to ``offset`` committed, the last of it in a batch of ``epoch``."""
        self.resolve_waiters(offset, epoch)
        if offset >= self.next_offset - 1:
            self._oldest_pending_ms = None
        elif self._oldest_pending_ms is not None:
            self._oldest_pending_ms = self._timers.now_ms()  # progress renews the lease

    def resolve_waiters(self, offset: int, epoch: int) -> None:
        # A record this controller appended in epoch E can only commit inside a batch of epoch E.  If a
        # batch of a newer epoch commits at its offset, a newer leader truncated ours (e.g. we were paused
        # and deposed): fail the waiter, never acknowledge a write no log holds.
        while self._waiters and self._waiters[0][0] <= offset:
            _, _, append_epoch, future = heapq.heappop(self._waiters)
            if future.done():
                continue
            if epoch > append_epoch:
                # Another node leads now; which one this node may not know yet (the leader change can
                # arrive after the newer epoch's batch): never name itself.
                leader = self._state.leader.leader_id
                future.set_exception(
                    NotControllerError(NO_LEADER if leader == self._state.node_id else leader)
                )
            else:
                future.set_result(None)

    def drop_pending(self, leader_id: int) -> None:
        """Leadership is gone: nothing appended in this epoch can be answered or reused."""
        self._own_images.clear()
        self._own_values.clear()
        self._oldest_pending_ms = None
        waiters, self._waiters = self._waiters, []
        for _, _, _, future in waiters:
            if not future.done():
                future.set_exception(NotControllerError(leader_id))
        # Wake whatever waits for the next commit (bulk pacing, long-polls): there may be none for a long
        # time, and each of them re-checks that this controller is still active.
        self._state.signal_commit()

    def lease_expired(self) -> bool:
        """True when a write has waited longer than the lease: this node may have been deposed without
        knowing it yet, and must not keep brokers talking to it (they would miss the real leader)."""
        pending_since = self._oldest_pending_ms
        return pending_since is not None and self._timers.now_ms() - pending_since > self._leader_lease_ms

    # ---- this epoch's own appends, committed without replay ----

    def own_image(self, batch: CommittedBatch) -> MetadataImage | None:
        """The image the active logic built for exactly this batch (records it appended in this epoch
        on top of the committed image), or None: then the batch is replayed."""
        images = self._own_images
        if not images:
            return None
        image = images.pop(batch.last_offset, None)
        for offset in [o for o in images if o < batch.last_offset]:
            del images[offset]
        state = self._state
        if (
            image is None
            or state.logic is None
            or batch.epoch != state.active_epoch
            or batch.base_offset != state.committed.offset + 1
            or image.offset != batch.last_offset
        ):
            return None
        return image if image.epoch == batch.epoch else dataclasses.replace(image, epoch=batch.epoch)

    def own_values(self, batch: CommittedBatch) -> list[tuple[int, bytes]] | None:
        """(offset, value) of every record of ``batch`` from what :meth:`append` scheduled, or None if
        some are not known (the caller then decodes the batch)."""
        self.forget_own_values_below(batch.base_offset)
        pending = self._own_values
        out: list[tuple[int, bytes]] = []
        offset = batch.base_offset
        while pending and offset <= batch.last_offset:
            first, values = pending[0]
            if first > offset:
                return None
            index = offset - first
            take = values[index : index + batch.last_offset - offset + 1]
            if not take:
                return None  # appends overlap (never expected): decode instead
            out.extend(zip(range(offset, offset + len(take)), take, strict=True))
            offset += len(take)
            if index + len(take) == len(values):
                pending.popleft()
        return out if offset == batch.last_offset + 1 else None

    def forget_own_values_below(self, offset: int) -> None:
        pending = self._own_values
        while pending and pending[0][0] + len(pending[0][1]) <= offset:
            pending.popleft()
