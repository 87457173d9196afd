"""Activation: the step from "Raft leader" to "active controller", and back.

On becoming leader of an epoch one task appends a NoOp and waits for it to commit — so the committed image
holds everything of earlier epochs — then resets the logic from it (fresh heartbeat sessions for every
broker), resumes unfinished ISR removals and writes the bootstrap records.  Any leader change away from
this node deactivates at once.  Owns ``state.logic`` and ``state.active_epoch``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

from kraft.errors import KraftError
from kraft.metadata import records as rec
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings, Outcome
from kraft.metadata.controller_state import ControllerState, NotControllerError
from kraft.metadata.controller_writes import WritePath
from kraft.metadata.event_queue import EventPriority, EventQueueClosedError
from kraft.metadata.timers import Timers
from kraft.observability.logging import StructLogger
from kraft.observability.metrics import ControllerMetrics
from kraft.raft.api import LeaderAndEpoch, NotLeaderError, RaftClient, RaftError
from kraft.raft.messages import NO_LEADER
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb


class Activation:
    def __init__(
        self,
        state: ControllerState,
        raft: RaftClient,
        writes: WritePath,
        settings: ControllerSettings,
        timers: Timers,
        *,
        activation_wait_ms: int,
        new_topic_id: Callable[[], str] | None,
        metrics: ControllerMetrics,
        log: StructLogger,
    ) -> None:
        self._state = state
        self._raft = raft
        self._writes = writes
        self._settings = settings
        self._timers = timers
        self._activation_wait_ms = activation_wait_ms
        self._new_topic_id = new_topic_id
        self._metrics = metrics
        self._log = log
        self._activated: asyncio.Future[None] | None = None
        """Completes at the next activation; requests that arrive mid-activation wait for it."""
        self.task: asyncio.Task[None] | None = None
        self.index_task: asyncio.Task[None] | None = None
        """Builds the new logic's rejoin index in slices, one event of the queue each."""

    def on_leader_change(self, leader: LeaderAndEpoch) -> None:
        state = self._state
        if leader.leader_id == state.node_id and not state.stopping:
            if state.active_epoch != leader.epoch:
                self.deactivate(leader.leader_id)
                state.active_epoch = leader.epoch
                self.task = asyncio.create_task(self._activate(leader.epoch), name="controller-activate")
        else:
            self.deactivate(leader.leader_id)

    def deactivate(self, leader_id: int) -> None:
        state = self._state
        if self.task is not None and not self.task.done():
            self.task.cancel()
        if self.index_task is not None and not self.index_task.done():
            self.index_task.cancel()
        was_active = state.logic is not None
        state.logic = None
        state.active_epoch = -1 if leader_id != state.node_id else state.active_epoch
        self._writes.drop_pending(leader_id)
        self._metrics.active_controller_count.set(0)
        if was_active:
            self._log.info("resigned_active", leader=leader_id)

    async def active_logic(self) -> ControllerLogic:
        """The logic to run a request on; waits out an activation in progress, else NotControllerError."""
        state = self._state
        if state.logic is not None:
            if self._writes.lease_expired():
                raise NotControllerError(NO_LEADER)
            return state.logic
        if state.is_leader and not state.stopping:
            if self._activated is None:
                self._activated = asyncio.get_running_loop().create_future()
            await self._timers.wait(self._activated, self._timers.now_ms() + self._activation_wait_ms)
            if state.logic is not None:
                return state.logic
        raise NotControllerError(state.leader.leader_id)

    async def _build_index(self, logic: ControllerLogic) -> None:
        state, queue = self._state, self._writes.queue

        def build_some() -> bool:
            # Done once rebuilt: flags that bulk slices left dirty meanwhile are settled by the write
            # path once the bulk job is done (settle_index), not between its slices.
            return logic.index_some() or not logic.rejoin_index.building

        with contextlib.suppress(NotControllerError, EventQueueClosedError):
            while logic is state.logic:
                if await queue.run(EventPriority.NORMAL, "rejoin-index-slice", build_some):
                    return

    async def _activate(self, epoch: int) -> None:
        state, writes = self._state, self._writes
        while True:
            try:
                last = self._raft.schedule_append([rec.encode_value(rec.wrap(pb.NoOpRecord()))])
                await writes.wait_committed(last)
                break
            except (NotLeaderError, NotControllerError, RaftError):
                return
            except TimeoutError:
                # no majority for a while; Raft resigns on check-quorum, otherwise try again
                if state.active_epoch != epoch:
                    return
        if state.active_epoch != epoch or not state.is_leader:
            return
        writes.next_offset = state.committed.offset + 1
        logic = ControllerLogic(
            self._settings,
            state.committed,
            self._timers.now_ms(),
            new_topic_id=self._new_topic_id,
            clock=self._timers.clock,
        )
        state.logic = logic
        activated, self._activated = self._activated, None
        if activated is not None and not activated.done():
            activated.set_result(None)
        self._metrics.active_controller_count.set(1)
        self._metrics.new_active_controllers.inc()
        self._log.info(
            "became_active", epoch=epoch, offset=state.committed.offset, brokers=len(state.committed.brokers)
        )
        self.index_task = asyncio.create_task(self._build_index(logic), name="controller-rejoin-index")
        if logic.has_bulk_jobs():
            # A bulk job the previous controller left half done (found in the image by reset): resumed
            # by the job driver, slice by slice, behind heartbeats like any bulk work.
            self._log.info("resuming_bulk_jobs")
            writes.drive_jobs(logic)
        with contextlib.suppress(NotControllerError, KraftError, TimeoutError, EventQueueClosedError):
            await writes.write(
                lambda lg: Outcome(
                    lg.bootstrap_records(writes.next_offset),
                    cpb.DescribeClusterResponse(),
                    writes.next_offset,
                ),
                name="bootstrap",
                wait_for_jobs=False,
            )
