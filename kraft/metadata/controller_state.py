"""What the active controller's parts share: one :class:`ControllerState` per controller, on one event loop.

Each field has one writer; everyone else only reads it:

- ``committed``, ``leader`` and the commit signal: the Raft listener (:class:`QuorumController`);
- ``logic`` and ``active_epoch``: :class:`~kraft.metadata.controller_activation.Activation`;
- ``stopping``: :meth:`QuorumController.stop`.
"""

from __future__ import annotations

import asyncio

from kraft.metadata.controller_logic import ControllerLogic
from kraft.metadata.image import MetadataImage
from kraft.raft.api import LeaderAndEpoch
from kraft.raft.messages import NO_LEADER

# Long loops over records/partitions yield to the event loop this often: gRPC accepts about one new
# call per loop turn, so a turn must stay short (a few ms) for heartbeats to keep flowing.
YIELD_EVERY_RECORDS = 2_000


class NotControllerError(Exception):
    def __init__(self, leader_id: int) -> None:
        super().__init__(f"not the active controller (active: {leader_id})")
        self.leader_id = leader_id


class WriteOutcomeUnknown(NotControllerError):
    """Leadership was lost *after* this request's records were appended: they may still commit under
    the new leader (if it holds them) or be truncated.  Answered as REQUEST_TIMED_OUT with the new
    controller's ``NodeRef`` (see :mod:`kraft.errors`), never as NOT_CONTROLLER, which promises that
    nothing was done."""

    def __init__(self, leader_id: int) -> None:
        super().__init__(leader_id)
        self.args = (f"leadership moved to {leader_id} after the write was appended; outcome unknown",)


class ControllerState:
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.committed = MetadataImage.empty()
        self.leader = LeaderAndEpoch(NO_LEADER, -1)
        self.logic: ControllerLogic | None = None
        """Set only while active."""
        self.active_epoch = -1
        self.stopping = False
        self._next_commit: asyncio.Future[None] | None = None

    @property
    def is_leader(self) -> bool:
        return self.leader.leader_id == self.node_id

    def next_commit(self) -> asyncio.Future[None]:
        """Completes at the next commit (a fresh one after each): long-polls and pacing wait on it."""
        if self._next_commit is None:
            self._next_commit = asyncio.get_running_loop().create_future()
        return self._next_commit

    def signal_commit(self) -> None:
        waiting, self._next_commit = self._next_commit, None
        if waiting is not None and not waiting.done():
            waiting.set_result(None)
