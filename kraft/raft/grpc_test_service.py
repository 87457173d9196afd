"""Test/benchmark-only Raft access: ``kraft.v1.RaftTestService`` and the state machine behind it.

Registered only when ``kraft.test.append.enable=true`` (off by default; in production the active
controller is the only writer).

- ``TestAppend`` appends raw record values through :meth:`RaftClient.append` and answers with their
  offsets once committed; ``TestAppendStream`` does the same per message of one long-lived stream.
- :class:`DigestStateMachine` is a :class:`RaftListener` that folds every committed value into a chained
  BLAKE2b digest (O(1) memory however much is written) and, when it owns snapshots, writes one every
  ``snapshot_every_bytes`` of applied values — a one-record snapshot holding (count, digest).  Replicas
  that applied the same log prefix report the same digest, whether they replayed it or loaded a snapshot
  (FetchSnapshot catch-up), which is what the integration tests compare via ``TestDigest``.  It starts
  with the first ``TestDigest`` call (a listener replays the log from its start or from the latest
  snapshot), so load-only runs measure replication without a state machine.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import time
from collections.abc import AsyncIterator
from typing import Protocol

import grpc.aio

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.grpc_service import RequestDecoder, ServicerContext, abort, register_service
from kraft.raft.api import (
    CommittedBatch,
    LeaderAndEpoch,
    LoadedSnapshot,
    NotLeaderError,
    RaftClient,
    RaftShutdownError,
)
from kraft.raft.grpc_server import node_refs
from kraft.v1 import raft_pb2, raft_pb2_grpc

_log = logging.getLogger(__name__)

_SNAPSHOT_MAGIC = b"kraft-test-digest-v1"
_SNAPSHOT_LAYOUT = struct.Struct(">q32s")  # record count, digest
_EMPTY_DIGEST = bytes(32)


def chain_digest(previous: bytes, value: bytes) -> bytes:
    """The next link: BLAKE2b-256 over (previous digest, value)."""
    return hashlib.blake2b(previous + value, digest_size=32).digest()


class DigestStateMachine:
    """Applies committed batches into (applied_offset, record_count, digest); optionally snapshots."""

    def __init__(self, client: RaftClient, *, snapshot_every_bytes: int = 0) -> None:
        """``snapshot_every_bytes`` 0 = never snapshot (another component owns snapshots)."""
        self._client = client
        self._snapshot_every_bytes = snapshot_every_bytes
        self.applied_offset = 0
        self.record_count = 0
        self.digest = _EMPTY_DIGEST
        self.snapshots_loaded = 0
        self.snapshots_created = 0
        self._bytes_since_snapshot = 0

    async def handle_commit(self, batch: CommittedBatch) -> None:
        digest = self.digest
        size = 0
        for record in batch.records:
            digest = chain_digest(digest, record.value)
            size += len(record.value)
        self.digest = digest
        self.record_count += len(batch.records)
        self.applied_offset = batch.last_offset + 1
        self._bytes_since_snapshot += size
        if self._snapshot_every_bytes and self._bytes_since_snapshot >= self._snapshot_every_bytes:
            await self._snapshot(batch)

    async def _snapshot(self, batch: CommittedBatch) -> None:
        self._bytes_since_snapshot = 0
        try:
            writer = self._client.create_snapshot(
                batch.last_offset + 1, batch.epoch, batch.append_timestamp_ms or int(time.time() * 1000)
            )
        except ValueError as exc:  # not a valid snapshot point (e.g. one already exists there)
            _log.warning("test_snapshot_skipped end_offset=%d reason=%s", batch.last_offset + 1, exc)
            return
        try:
            writer.append([_SNAPSHOT_MAGIC + _SNAPSHOT_LAYOUT.pack(self.record_count, self.digest)])
            await writer.freeze()
            self.snapshots_created += 1
        finally:
            await writer.close()

    async def handle_load_snapshot(self, reader: LoadedSnapshot) -> None:
        count, digest = 0, _EMPTY_DIGEST
        for record in reader.records:
            if record.startswith(_SNAPSHOT_MAGIC):
                count, digest = _SNAPSHOT_LAYOUT.unpack(record[len(_SNAPSHOT_MAGIC) :])
        self.record_count = count
        self.digest = digest
        self.applied_offset = reader.snapshot_id.end_offset
        self.snapshots_loaded += 1
        self._bytes_since_snapshot = 0

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        return None


_TEST_SERVICE = raft_pb2.DESCRIPTOR.services_by_name["RaftTestService"]
APPEND_METHODS = frozenset(
    f"/{_TEST_SERVICE.full_name}/{name}" for name in ("TestAppend", "TestAppendStream")
)
"""The full gRPC names of the methods ``RaftTestServicer(appends=...)`` answers through that path: they may
run on the intake loop (:class:`kraft.node.intake.AppendBridge`)."""


class AppendPath(Protocol):
    """How ``TestAppend`` reaches Raft: :class:`kraft.node.intake.AppendBridge` from the intake loop, or
    the client itself (:class:`_DirectAppends`) on the loop that runs it."""

    async def append(self, values: list[bytes]) -> tuple[int, LeaderAndEpoch]:
        """The last value's offset once committed, and the leader and epoch then."""
        ...

    async def leader_and_epoch(self) -> LeaderAndEpoch: ...


class _DirectAppends:
    def __init__(self, client: RaftClient) -> None:
        self._client = client

    async def append(self, values: list[bytes]) -> tuple[int, LeaderAndEpoch]:
        last_offset = await self._client.append(values)
        return last_offset, self._client.leader_and_epoch

    async def leader_and_epoch(self) -> LeaderAndEpoch:
        return self._client.leader_and_epoch


class RaftTestServicer(raft_pb2_grpc.RaftTestServiceServicer):
    """``TestAppend`` (answer once committed) and ``TestDigest`` (this replica's applied state).

    With ``appends`` (an :class:`AppendPath` such as :class:`kraft.node.intake.AppendBridge`) the two
    append methods (:data:`APPEND_METHODS`) touch Raft only through it, so they may run on the intake loop
    while ``TestDigest`` runs on the client's loop."""

    def __init__(
        self,
        client: RaftClient,
        state_machine: DigestStateMachine,
        *,
        cluster_id: str,
        endpoints: dict[int, tuple[str, int]] | None = None,
        max_values: int = 100_000,
        listener_name: str = "CONTROLLER",
        security_protocol: str = "PLAINTEXT",
        appends: AppendPath | None = None,
    ) -> None:
        self._client = client
        self._appends: AppendPath = appends if appends is not None else _DirectAppends(client)
        self._state = state_machine
        self._state_registered = False
        self._cluster_id = cluster_id
        self._nodes = node_refs(
            endpoints or {}, listener_name=listener_name, security_protocol=security_protocol
        )
        self._max_values = max_values

    def _error(self, code: ErrorCode, message: str, leader: LeaderAndEpoch) -> raft_pb2.TestAppendResponse:
        return raft_pb2.TestAppendResponse(
            error_code=int(code),
            error_message=message,
            leader_id=leader.leader_id,
            leader_epoch=leader.epoch,
            nodes=self._nodes,
        )

    def _cluster_mismatch(self, cluster_id: str) -> str | None:
        if cluster_id == self._cluster_id:
            return None
        return f"request cluster id {cluster_id!r} does not match this cluster ({self._cluster_id!r})"

    async def TestAppend(
        self, request: raft_pb2.TestAppendRequest, context: ServicerContext
    ) -> raft_pb2.TestAppendResponse:
        mismatch = self._cluster_mismatch(request.cluster_id)
        if mismatch is not None:
            leader = await self._appends.leader_and_epoch()
            return self._error(ErrorCode.INCONSISTENT_CLUSTER_ID, mismatch, leader)
        count = len(request.values)
        if count == 0 or count > self._max_values:
            return self._error(
                ErrorCode.INVALID_REQUEST,
                f"values must hold 1..{self._max_values} records, got {count}",
                await self._appends.leader_and_epoch(),
            )
        try:
            last_offset, leader = await self._appends.append(list(request.values))
        except NotLeaderError as exc:
            return self._error(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(exc), exc.leader)
        except RaftShutdownError:
            await abort(
                context, grpc_status_for(ErrorCode.BROKER_NOT_AVAILABLE), "raft node is shutting down"
            )
        return raft_pb2.TestAppendResponse(
            error_code=int(ErrorCode.NONE),
            leader_id=leader.leader_id,
            leader_epoch=leader.epoch,
            base_offset=last_offset - count + 1,
            last_offset=last_offset,
        )

    async def TestAppendStream(
        self, request_iterator: AsyncIterator[raft_pb2.TestAppendRequest], context: ServicerContext
    ) -> AsyncIterator[raft_pb2.TestAppendResponse]:
        # Answers in request order; a client that awaits each answer has one append in flight.
        async for request in request_iterator:
            yield await self.TestAppend(request, context)

    async def TestDigest(
        self, request: raft_pb2.TestDigestRequest, context: ServicerContext
    ) -> raft_pb2.TestDigestResponse:
        leader = self._client.leader_and_epoch
        mismatch = self._cluster_mismatch(request.cluster_id)
        if mismatch is not None:
            return raft_pb2.TestDigestResponse(
                error_code=int(ErrorCode.INCONSISTENT_CLUSTER_ID),
                error_message=mismatch,
                leader_id=leader.leader_id,
                leader_epoch=leader.epoch,
            )
        if not self._state_registered:
            # Started by the first TestDigest, so pure load runs (benchmarks) do not pay for decoding and
            # hashing every record; a listener replays the whole log (or loads the snapshot) anyway.
            self._client.register_listener(self._state)
            self._state_registered = True
        state = self._state
        return raft_pb2.TestDigestResponse(
            error_code=int(ErrorCode.NONE),
            leader_id=leader.leader_id,
            leader_epoch=leader.epoch,
            applied_offset=state.applied_offset,
            record_count=state.record_count,
            digest=state.digest,
            high_watermark=self._client.high_watermark,
            snapshots_loaded=state.snapshots_loaded,
            snapshots_created=state.snapshots_created,
        )


def add_raft_test_service(servicer: RaftTestServicer, server: grpc.aio.Server) -> None:
    """Register ``kraft.v1.RaftTestService`` decoding inside the call (undecodable → INVALID_ARGUMENT)."""
    register_service(
        server,
        servicer,
        raft_pb2.DESCRIPTOR.services_by_name["RaftTestService"],
        RequestDecoder(_log, "raft_test_bad_request"),
    )
