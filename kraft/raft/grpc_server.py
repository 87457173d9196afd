"""The inbound half of Raft over gRPC: ``kraft.v1.RaftService``.

Each RPC decodes the protobuf, awaits the driver (:class:`kraft.raft.transport.RequestHandler`) in the
RPC's own task — a long-polling Fetch parks there without blocking anything else — and encodes the
answer.  Protocol errors (wrong cluster id, stale epoch, not leader) come back inside the response as
``error_code``; only "the node is stopping" (UNAVAILABLE) and bugs (INTERNAL) become gRPC statuses.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Mapping
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.raft import grpc_codec as codec
from kraft.raft import messages as m
from kraft.raft.api import RaftShutdownError
from kraft.raft.transport import RequestHandler
from kraft.v1 import common_pb2, raft_pb2, raft_pb2_grpc

_log = logging.getLogger(__name__)

ServicerContext = grpc.aio.ServicerContext[Any, Any]
_Request = TypeVar("_Request", bound=m.RaftRequest)


def node_refs(endpoints: Mapping[int, tuple[str, int]]) -> list[common_pb2.NodeRef]:
    """``NodeRef`` messages for the controller endpoints a response advertises (for redirects)."""
    return [
        common_pb2.NodeRef(
            node_id=node_id,
            endpoint=common_pb2.Endpoint(
                name="CONTROLLER", host=host, port=port, security_protocol="PLAINTEXT"
            ),
        )
        for node_id, (host, port) in sorted(endpoints.items())
    ]


async def abort(context: ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class RaftServicer(raft_pb2_grpc.RaftServiceServicer):
    """Serves RaftService by delegating every request to the node's driver."""

    def __init__(
        self,
        handler: RequestHandler,
        *,
        cluster_id: str,
        local_directory: tuple[int, str] | None = None,
        endpoints: Mapping[int, tuple[str, int]] | None = None,
    ) -> None:
        """``local_directory`` is (our node id, our directory.id); ``endpoints`` node id → (host, port)."""
        self._handler = handler
        self._cluster_id = cluster_id
        self._nodes = node_refs(endpoints or {})
        # replica id → directory.id, learned from Fetch requests (the core does not track it).
        self._directory_ids: dict[int, str] = {}
        if local_directory is not None:
            self._directory_ids[local_directory[0]] = local_directory[1]

    async def _handle(self, request: _Request, context: ServicerContext) -> m.RaftResponse:
        try:
            return await self._handler.handle_request(request)
        except RaftShutdownError:
            await abort(
                context, grpc_status_for(ErrorCode.BROKER_NOT_AVAILABLE), "raft node is shutting down"
            )
        except Exception as exc:
            _log.exception("raft_request_failed request=%s", type(request).__name__)
            await abort(
                context, grpc_status_for(ErrorCode.UNKNOWN_SERVER_ERROR), f"{type(exc).__name__}: {exc}"
            )

    async def Vote(self, request: raft_pb2.VoteRequest, context: ServicerContext) -> raft_pb2.VoteResponse:
        response = await self._handle(codec.vote_request_from_pb(request), context)
        assert isinstance(response, m.VoteResponse)
        return codec.vote_response_to_pb(response)

    async def BeginQuorumEpoch(
        self, request: raft_pb2.BeginQuorumEpochRequest, context: ServicerContext
    ) -> raft_pb2.BeginQuorumEpochResponse:
        response = await self._handle(codec.begin_request_from_pb(request), context)
        assert isinstance(response, m.BeginQuorumEpochResponse)
        return codec.begin_response_to_pb(response)

    async def EndQuorumEpoch(
        self, request: raft_pb2.EndQuorumEpochRequest, context: ServicerContext
    ) -> raft_pb2.EndQuorumEpochResponse:
        response = await self._handle(codec.end_request_from_pb(request), context)
        assert isinstance(response, m.EndQuorumEpochResponse)
        return codec.end_response_to_pb(response)

    async def Fetch(self, request: raft_pb2.FetchRequest, context: ServicerContext) -> raft_pb2.FetchResponse:
        if request.replica_directory_id:
            self._directory_ids[request.replica_id] = request.replica_directory_id
        response = await self._handle(codec.fetch_request_from_pb(request), context)
        assert isinstance(response, m.FetchResponse)
        return codec.fetch_response_to_pb(response)

    async def FetchStream(
        self, request_iterator: AsyncIterator[raft_pb2.FetchRequest], context: ServicerContext
    ) -> AsyncIterator[raft_pb2.FetchResponse]:
        # One request in flight per stream: the follower sends its next Fetch only after this answer.
        async for request in request_iterator:
            if request.replica_directory_id:
                self._directory_ids[request.replica_id] = request.replica_directory_id
            response = await self._handle(codec.fetch_request_from_pb(request), context)
            assert isinstance(response, m.FetchResponse)
            yield codec.fetch_response_to_pb(response)

    async def FetchSnapshot(
        self, request: raft_pb2.FetchSnapshotRequest, context: ServicerContext
    ) -> raft_pb2.FetchSnapshotResponse:
        response = await self._handle(codec.fetch_snapshot_request_from_pb(request), context)
        assert isinstance(response, m.FetchSnapshotResponse)
        return codec.fetch_snapshot_response_to_pb(response)

    async def DescribeQuorum(
        self, request: raft_pb2.DescribeQuorumRequest, context: ServicerContext
    ) -> raft_pb2.DescribeQuorumResponse:
        # Admin tools may not know the cluster id yet: an empty one means "whatever this cluster is".
        cluster_id = request.cluster_id or self._cluster_id
        response = await self._handle(m.DescribeQuorumRequest(cluster_id=cluster_id), context)
        assert isinstance(response, m.DescribeQuorumResponse)
        out = codec.describe_response_to_pb(response, self._directory_ids)
        out.cluster_id = self._cluster_id
        out.nodes.extend(self._nodes)
        return out
