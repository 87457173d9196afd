"""The inbound half of Raft over gRPC: ``kraft.v1.RaftService``.

Each RPC decodes the protobuf, awaits the driver (:class:`kraft.raft.transport.RequestHandler`) in the
RPC's own task — a long-polling Fetch parks there without blocking anything else — and encodes the
answer.  Protocol errors (wrong cluster id, stale epoch, not leader) come back inside the response as
``error_code``; only "the node is stopping" (UNAVAILABLE) and bugs (INTERNAL) become gRPC statuses.

Hardening (issue #15): registered with :func:`add_raft_service`, the service decodes request bytes itself,
so bytes that are no protobuf message of the method's type get ``INVALID_ARGUMENT`` with one short
message, logged at most once per :data:`BAD_REQUEST_LOG_INTERVAL_S` per peer host, without a traceback
(gRPC's own deserializer logged a traceback at error level per request and answered UNKNOWN).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Collection, Mapping
from typing import TypeVar

import grpc
import grpc.aio

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.grpc_service import RequestDecoder, ServicerContext, abort, register_service
from kraft.raft import grpc_codec as codec
from kraft.raft import messages as m
from kraft.raft.api import RaftShutdownError
from kraft.raft.core_rules import claimed_sender
from kraft.raft.transport import RequestHandler
from kraft.security.principal import NodeRole, is_tls, node_identity, principal_of
from kraft.storage.ids import parse_uuid
from kraft.v1 import common_pb2, raft_pb2, raft_pb2_grpc

_log = logging.getLogger(__name__)

_Request = TypeVar("_Request", bound=m.RaftRequest)

SERVICE_NAME = "kraft.v1.RaftService"
MAX_FETCH_WAIT_MS = 10_000
"""The longest a Raft Fetch may long-poll, whatever it asks for."""
_SERVICE = raft_pb2.DESCRIPTOR.services_by_name["RaftService"]


def authenticated_peer_id(context: ServicerContext) -> int | None:
    """The node id the caller proved it is: the voter a controller certificate names, else None.

    On a PLAINTEXT listener nobody is authenticated (None), and the core trusts the sender id a request
    claims, as Kafka and etcd do without TLS.  On an mTLS listener the client certificate's principal
    (:func:`kraft.security.principal.principal_of`) names the node (``CN=controller-2`` → 2); the core
    refuses a request whose claimed sender differs, and :class:`RaftServicer` refuses every Raft request
    but DescribeQuorum from a TLS caller that is no controller (PERMISSION_DENIED)."""
    identity = node_identity(principal_of(context))
    if identity is None or identity.role is not NodeRole.CONTROLLER:
        return None
    return identity.node_id


def valid_directory_id(directory_id: str) -> bool:
    """A fetcher's ``replica_directory_id``: empty (unknown) or a Kafka UUID (22 base64url characters,
    16 bytes); anything else — issue #15 kept a 4 MB one in memory — is refused."""
    if not directory_id:
        return True
    try:
        parse_uuid(directory_id)
    except ValueError:
        return False
    return True


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


class RaftServicer(raft_pb2_grpc.RaftServiceServicer):
    """Serves RaftService by delegating every request to the node's driver."""

    def __init__(
        self,
        handler: RequestHandler,
        *,
        cluster_id: str,
        local_directory: tuple[int, str] | None = None,
        endpoints: Mapping[int, tuple[str, int]] | None = None,
        voters: Collection[int] | None = None,
    ) -> None:
        """``local_directory`` is (our node id, our directory.id); ``endpoints`` node id → (host, port);
        ``voters`` (default: the ids in ``endpoints``) are the only replicas whose directory ids are kept."""
        self._handler = handler
        self._cluster_id = cluster_id
        self._nodes = node_refs(endpoints or {})
        self._voters = frozenset(voters if voters is not None else (endpoints or {}))
        # voter id → directory.id, learned from Fetch requests (the core does not track it).  Only voters:
        # observers are unbounded in number and an unauthenticated caller may claim any id.
        self._directory_ids: dict[int, str] = {}
        if local_directory is not None:
            self._directory_ids[local_directory[0]] = local_directory[1]

    async def _handle(self, request: _Request, context: ServicerContext) -> m.RaftResponse:
        peer_id = authenticated_peer_id(context)
        if peer_id is None and claimed_sender(request) is not None and is_tls(context):
            # A TLS caller without a controller certificate (a broker, an admin, no certificate) must not
            # move Raft; on PLAINTEXT there is nothing to check (docs/security.md).
            await abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{type(request).__name__} needs a controller certificate "
                f"(caller is {principal_of(context)})",
            )
        try:
            return await self._handler.handle_request(request, peer_id=peer_id)
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

    async def _fetch(
        self, request: raft_pb2.FetchRequest, context: ServicerContext
    ) -> raft_pb2.FetchResponse:
        directory_id = request.replica_directory_id
        if not valid_directory_id(directory_id):
            # Refused before the core sees it; the fetcher's request-error rule retries after a backoff.
            message = "replica_directory_id must be empty or a 22-character base64url UUID"
            return codec.fetch_response_to_pb(
                m.FetchResponse(ErrorCode.INVALID_REQUEST, message, m.NO_LEADER, m.NO_LEADER)
            )
        # A parked Fetch lives in the leader's core until its deadline: a caller may not pick one of days
        # (issue #15).  Real fetchers ask for controller.quorum.fetch.max.wait.ms (500 ms).
        request.max_wait_ms = min(request.max_wait_ms, MAX_FETCH_WAIT_MS)
        response = await self._handle(codec.fetch_request_from_pb(request), context)
        assert isinstance(response, m.FetchResponse)
        if directory_id and request.replica_id in self._voters and response.error_code is ErrorCode.NONE:
            self._directory_ids[request.replica_id] = directory_id
        return codec.fetch_response_to_pb(response)

    async def Fetch(self, request: raft_pb2.FetchRequest, context: ServicerContext) -> raft_pb2.FetchResponse:
        return await self._fetch(request, context)

    async def FetchStream(
        self, request_iterator: AsyncIterator[raft_pb2.FetchRequest], context: ServicerContext
    ) -> AsyncIterator[raft_pb2.FetchResponse]:
        # One request in flight per stream: the follower sends its next Fetch only after this answer.
        async for request in request_iterator:
            yield await self._fetch(request, context)

    async def FetchSnapshot(
        self, request: raft_pb2.FetchSnapshotRequest, context: ServicerContext
    ) -> raft_pb2.FetchSnapshotResponse:
        response = await self._handle(codec.fetch_snapshot_request_from_pb(request), context)
        assert isinstance(response, m.FetchSnapshotResponse)
        return codec.fetch_snapshot_response_to_pb(response)

    async def DescribeQuorum(
        self, request: raft_pb2.DescribeQuorumRequest, context: ServicerContext
    ) -> raft_pb2.DescribeQuorumResponse:
        # An empty cluster id is refused like a wrong one (issue #15); the answer states this cluster's id
        # even then, which is how admin tools that were not told it learn it (kraft.client.quorum).
        response = await self._handle(m.DescribeQuorumRequest(cluster_id=request.cluster_id), context)
        assert isinstance(response, m.DescribeQuorumResponse)
        out = codec.describe_response_to_pb(response, self._directory_ids)
        out.cluster_id = self._cluster_id
        out.nodes.extend(self._nodes)
        return out


def add_raft_service(servicer: RaftServicer, server: grpc.aio.Server) -> None:
    """Register ``kraft.v1.RaftService`` with handlers that decode inside the servicer
    (:func:`kraft.grpc_service.register_service`): undecodable bytes get INVALID_ARGUMENT, logged as
    ``raft_bad_request`` once per peer per interval."""
    register_service(server, servicer, _SERVICE, RequestDecoder(_log, "raft_bad_request"))
