"""The MetadataFetch side of the active controller: what brokers call to follow the metadata log.

Serves committed records from a bounded window of recent batches (:class:`FetchWindow`), long-polls
until a commit or ``max_wait_ms``, and offers a snapshot of the committed image (built once, cached,
served in chunks) to a broker below the window.  Only the active controller answers.

A dynamic quorum's voter set rides along (KIP-853): a fetch names the version of the voter set the broker
holds (``known_voters``: leader epoch, offset of its VotersRecord) and the answer carries this controller's
voter set in force (``voters``) when that is newer — so a broker learns every voter with its endpoints,
and a removed one leaves its rotation, from the quorum it already follows (as Kafka's brokers read the
VotersRecords of the log they replicate).  Keyed by the leader epoch first: a new leader's set wins over a
deposed leader's possibly truncated one; within one leadership the set only moves forward.  An older
broker sends no ``known_voters`` and gets none; a static quorum sends none (its brokers know every voter
from ``controller.quorum.voters``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

from kraft.errors import ErrorCode
from kraft.metadata.controller_logic import ControllerLogic, error_response
from kraft.metadata.controller_state import YIELD_EVERY_RECORDS, ControllerState, NotControllerError
from kraft.metadata.fetch_window import FetchWindow, WindowBatch
from kraft.metadata.image_records import image_values
from kraft.metadata.timers import Timers
from kraft.raft.voters import VoterSet
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb

SNAPSHOT_CHUNK_RECORDS = 20_000
DEFAULT_FETCH_RECORDS = 10_000

NotControllerAnswer = Callable[[cpb.MetadataFetchResponse, int], cpb.MetadataFetchResponse]
VotersInForce = Callable[[], tuple[int, VoterSet] | None]
"""The voter set in force with the offset of the VotersRecord that introduced it (-1: the snapshot's or the
bootstrap checkpoint's); None on a static quorum."""


class FetchServer:
    def __init__(
        self,
        state: ControllerState,
        timers: Timers,
        *,
        cluster_id: str,
        window_records: int,
        max_wait_ms: int = 10_000,
        max_parked: int = 1000,
        active_logic: Callable[[], Awaitable[ControllerLogic]],
        not_controller: NotControllerAnswer,
        voters: VotersInForce | None = None,
    ) -> None:
        self._state = state
        self._timers = timers
        self._cluster_id = cluster_id
        self._active_logic = active_logic
        self._not_controller = not_controller
        self.window = FetchWindow(window_records)
        self._snapshot: tuple[cpb.SnapshotRef, list[bytes]] | None = None
        self._max_wait_ms = max_wait_ms
        self._max_parked = max_parked
        self.parked = 0  # requests long-polling now
        self._voters = voters
        # The last voter set sent, as a message (built once per set and leader epoch, then copied).
        self._voters_message: tuple[tuple[int, int], VoterSet, cpb.QuorumVoters] | None = None

    def remember(self, batch: WindowBatch) -> None:
        """A batch committed (after the image took it in)."""
        self.window.append(batch)

    def forget_all(self) -> None:
        """A Raft snapshot replaced the image: the window no longer leads up to it."""
        self.window.clear()

    async def serve(self, req: cpb.MetadataFetchRequest) -> cpb.MetadataFetchResponse:
        response = cpb.MetadataFetchResponse()
        state = self._state
        if req.cluster_id != self._cluster_id:
            return error_response(
                response,
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"cluster id {req.cluster_id!r} is not {self._cluster_id!r}",
            )
        try:
            await self._active_logic()
        except NotControllerError as exc:
            return self._not_controller(response, exc.leader_id)
        response.controller_epoch = state.leader.epoch
        if req.HasField("snapshot_id"):
            return self._snapshot_chunk(req, response)
        # The long-poll is capped (metadata.fetch.max.wait.ms), and at most max_parked requests wait at
        # once (fetch.max.parked.requests): past that a request is answered at once (issue #15).
        wait_ms = min(max(0, req.max_wait_ms), self._max_wait_ms)
        if self.parked >= self._max_parked:
            wait_ms = 0
        deadline = self._timers.now_ms() + wait_ms
        parked = False
        try:
            while True:
                start = self.window.start_offset(state.committed.offset + 1)
                if req.fetch_offset < start:
                    return await self._offer_snapshot(req, response)
                if req.fetch_offset <= state.committed.offset:
                    self._fill_records(req, response)
                    if response.records:
                        break
                if self._timers.now_ms() >= deadline or state.logic is None:
                    break
                if not parked:
                    parked = True
                    self.parked += 1
                await self._timers.wait(state.next_commit(), deadline)
        finally:
            if parked:
                self.parked -= 1
        response.high_watermark = state.committed.offset + 1
        response.log_start_offset = self.window.start_offset(state.committed.offset + 1)
        if state.logic is None:
            return self._not_controller(response, state.leader.leader_id)
        self._fill_voters(req, response)
        return response

    def _fill_voters(self, req: cpb.MetadataFetchRequest, response: cpb.MetadataFetchResponse) -> None:
        """This controller's voter set when the broker asked (``known_voters``) and holds an older one."""
        if self._voters is None or not req.HasField("known_voters"):
            return
        in_force = self._voters()
        if in_force is None or not in_force[1].voters:
            return
        offset, voters = in_force
        version = (self._state.leader.epoch, offset)
        if version <= (req.known_voters.leader_epoch, req.known_voters.offset):
            return
        cached = self._voters_message
        if cached is None or cached[0] != version or cached[1] is not voters:
            message = cpb.QuorumVoters(version=cpb.VoterSetVersion(leader_epoch=version[0], offset=offset))
            for voter in voters:
                message.voters.add(
                    node_id=voter.node_id,
                    endpoints=[
                        common_pb2.Endpoint(name=e.name, host=e.host, port=e.port) for e in voter.endpoints
                    ],
                )
            cached = self._voters_message = (version, voters, message)
        response.voters.CopyFrom(cached[2])

    def _fill_records(self, req: cpb.MetadataFetchRequest, response: cpb.MetadataFetchResponse) -> None:
        limit = req.max_records if req.max_records > 0 else DEFAULT_FETCH_RECORDS
        for r in self.window.read(req.fetch_offset, limit):
            response.records.add(
                offset=r.offset, leader_epoch=r.epoch, append_time_ms=r.append_time_ms, value=r.value
            )

    async def _offer_snapshot(
        self, req: cpb.MetadataFetchRequest, response: cpb.MetadataFetchResponse
    ) -> cpb.MetadataFetchResponse:
        cached = self._snapshot
        image = self._state.committed
        # A broker resumes at the snapshot's end offset, so that must still be inside the window.
        if cached is None or cached[0].end_offset < self.window.start_offset(image.offset + 1):
            ref = cpb.SnapshotRef(end_offset=image.offset + 1, epoch=image.epoch)
            values: list[bytes] = []
            for i, value in enumerate(image_values(image)):
                values.append(value)
                if i % YIELD_EVERY_RECORDS == YIELD_EVERY_RECORDS - 1:
                    await asyncio.sleep(0)
            cached = (ref, values)
            self._snapshot = cached
        committed = self._state.committed
        response.snapshot_id.CopyFrom(cached[0])
        response.high_watermark = committed.offset + 1
        response.log_start_offset = self.window.start_offset(committed.offset + 1)
        self._fill_voters(req, response)
        return response

    def _snapshot_chunk(
        self, req: cpb.MetadataFetchRequest, response: cpb.MetadataFetchResponse
    ) -> cpb.MetadataFetchResponse:
        cached = self._snapshot
        if cached is None or cached[0] != req.snapshot_id:
            return error_response(
                response,
                ErrorCode.SNAPSHOT_NOT_FOUND,
                "that snapshot is no longer served; fetch from your offset again",
            )
        ref, values = cached
        if not 0 <= req.snapshot_position <= len(values):
            return error_response(
                response,
                ErrorCode.POSITION_OUT_OF_RANGE,
                f"position {req.snapshot_position} not in 0..{len(values)}",
            )
        limit = req.max_records if req.max_records > 0 else SNAPSHOT_CHUNK_RECORDS
        end = min(len(values), req.snapshot_position + limit)
        response.snapshot_id.CopyFrom(ref)
        response.snapshot_records.extend(values[req.snapshot_position : end])
        response.next_snapshot_position = end
        response.snapshot_done = end == len(values)
        response.high_watermark = self._state.committed.offset + 1
        return response
