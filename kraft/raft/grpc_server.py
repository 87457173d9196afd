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

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TypeVar

import grpc
import grpc.aio

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.grpc_service import RequestDecoder, ServicerContext, abort, register_service
from kraft.raft import grpc_codec as codec
from kraft.raft import messages as m
from kraft.raft.api import NotLeaderError, RaftShutdownError, VoterChangeError
from kraft.raft.core_rules import claimed_sender
from kraft.raft.driver import PeerProblem
from kraft.raft.transport import RequestHandler, VoterChangeHandler
from kraft.raft.voters import Endpoint, Voter
from kraft.security.principal import NodeRole, is_tls, node_identity, principal_of
from kraft.storage.ids import parse_uuid
from kraft.v1 import common_pb2, raft_pb2, raft_pb2_grpc

_log = logging.getLogger(__name__)

_Request = TypeVar("_Request", bound=m.RaftRequest)

SERVICE_NAME = "kraft.v1.RaftService"
MAX_FETCH_WAIT_MS = 10_000
"""The longest a Raft Fetch may long-poll, whatever it asks for."""
_SERVICE = raft_pb2.DESCRIPTOR.services_by_name["RaftService"]
FETCH_METHODS = frozenset(f"/{_SERVICE.full_name}/{name}" for name in ("Fetch", "FetchStream"))
"""The full gRPC names of the methods ``RaftServicer(fetch_handler=...)`` answers through that handler."""


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


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling, from the call's auth context: ``peer_id`` (:func:`authenticated_peer_id`) and
    whether the call came over TLS without proving a controller identity (its Raft requests are refused).
    The same for every message of one call, so a FetchStream reads it once, not per Fetch (two auth
    context reads, ~10 µs per message, on the leader's intake thread for every write)."""

    peer_id: int | None
    unproven_tls: bool


def caller_of(context: ServicerContext) -> Caller:
    peer_id = authenticated_peer_id(context)
    return Caller(peer_id, peer_id is None and is_tls(context))


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


def node_refs(
    endpoints: Mapping[int, tuple[str, int]],
    *,
    listener_name: str = "CONTROLLER",
    security_protocol: str = "PLAINTEXT",
) -> list[common_pb2.NodeRef]:
    """``NodeRef`` messages for the controller endpoints a response advertises (for redirects): every
    controller on the listener ``listener_name`` with its ``security_protocol`` (``PLAINTEXT`` or ``SSL``,
    from ``listener.security.protocol.map``; a quorum's controllers share one controller listener)."""
    return [
        common_pb2.NodeRef(
            node_id=node_id,
            endpoint=common_pb2.Endpoint(
                name=listener_name, host=host, port=port, security_protocol=security_protocol
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
        endpoints: Mapping[int, tuple[str, int]] | None = None,
        voter_changes: VoterChangeHandler | None = None,
        listener_name: str = "CONTROLLER",
        security_protocol: str = "PLAINTEXT",
        node_id: int = -1,
        peer_problems: Callable[[], Iterable[PeerProblem]] | None = None,
        fetch_handler: RequestHandler | None = None,
    ) -> None:
        """``endpoints`` node id → (host, port): the controllers a response advertises for redirects
        (with a dynamic quorum the voter set's own endpoints are added), on ``listener_name`` with
        ``security_protocol`` (the controller listener's, from the node config).  Directory ids travel in the
        messages themselves (KIP-853): the core tracks them.  ``voter_changes`` serves AddRaftVoter,
        RemoveRaftVoter and UpdateRaftVoter (None: refused as UNSUPPORTED_VERSION).  ``node_id`` and
        ``peer_problems`` (the driver's :meth:`~kraft.raft.driver.PeerProblems.reports`) fill
        DescribeQuorum's ``responder_id`` and ``peer_problems`` in every answer, leader or not.
        ``fetch_handler`` answers Fetch and FetchStream instead of ``handler`` (:data:`FETCH_METHODS`:
        the node's request plane runs them on its own loop and reaches the driver through it)."""
        self._handler = handler
        self._fetch_handler = fetch_handler or handler
        self._cluster_id = cluster_id
        self._endpoints = dict(endpoints or {})
        self._voter_changes = voter_changes
        self._listener_name = listener_name
        self._security_protocol = security_protocol
        self._node_id = node_id
        self._peer_problems = peer_problems

    async def _handle(
        self,
        request: _Request,
        context: ServicerContext,
        handler: RequestHandler | None = None,
        caller: Caller | None = None,
    ) -> m.RaftResponse:
        if caller is None:
            caller = caller_of(context)
        peer_id = caller.peer_id
        if caller.unproven_tls and claimed_sender(request) is not None:
            # A TLS caller without a controller certificate (a broker, an admin, no certificate) must not
            # move Raft; on PLAINTEXT there is nothing to check (docs/security.md).
            await abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"{type(request).__name__} needs a controller certificate "
                f"(caller is {principal_of(context)})",
            )
        try:
            return await (handler or self._handler).handle_request(request, peer_id=peer_id)
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
        if not (
            valid_directory_id(request.candidate_directory_id)
            and valid_directory_id(request.voter_directory_id)
        ):
            message = "directory ids must be empty or 22-character base64url UUIDs"
            return codec.vote_response_to_pb(
                m.VoteResponse(
                    ErrorCode.INVALID_REQUEST, message, m.NO_LEADER, m.NO_LEADER, False, request.pre_vote
                )
            )
        response = await self._handle(codec.vote_request_from_pb(request), context)
        assert isinstance(response, m.VoteResponse)
        return codec.vote_response_to_pb(response)

    async def BeginQuorumEpoch(
        self, request: raft_pb2.BeginQuorumEpochRequest, context: ServicerContext
    ) -> raft_pb2.BeginQuorumEpochResponse:
        if not valid_directory_id(request.voter_directory_id):
            message = "voter_directory_id must be empty or a 22-character base64url UUID"
            return codec.begin_response_to_pb(
                m.BeginQuorumEpochResponse(ErrorCode.INVALID_REQUEST, message, m.NO_LEADER, m.NO_LEADER)
            )
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
        self, request: raft_pb2.FetchRequest, context: ServicerContext, caller: Caller | None = None
    ) -> raft_pb2.FetchResponse:
        if not valid_directory_id(request.replica_directory_id):
            # Refused before the core sees it; the fetcher's request-error rule retries after a backoff.
            message = "replica_directory_id must be empty or a 22-character base64url UUID"
            return codec.fetch_response_to_pb(
                m.FetchResponse(ErrorCode.INVALID_REQUEST, message, m.NO_LEADER, m.NO_LEADER)
            )
        # A parked Fetch lives in the leader's core until its deadline: a caller may not pick one of days
        # (issue #15).  Real fetchers ask for controller.quorum.fetch.max.wait.ms (500 ms).
        request.max_wait_ms = min(request.max_wait_ms, MAX_FETCH_WAIT_MS)
        response = await self._handle(
            codec.fetch_request_from_pb(request), context, self._fetch_handler, caller
        )
        assert isinstance(response, m.FetchResponse)
        return codec.fetch_response_to_pb(response)

    async def Fetch(self, request: raft_pb2.FetchRequest, context: ServicerContext) -> raft_pb2.FetchResponse:
        return await self._fetch(request, context)

    async def FetchStream(
        self, request_iterator: AsyncIterator[raft_pb2.FetchRequest], context: ServicerContext
    ) -> AsyncIterator[raft_pb2.FetchResponse]:
        # One request in flight per stream: the follower sends its next Fetch only after this answer.  The
        # caller is the same for the whole stream: authenticated once.
        caller: Caller | None = None
        async for request in request_iterator:
            if caller is None:
                caller = caller_of(context)
            yield await self._fetch(request, context, caller)

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
        out = codec.describe_response_to_pb(response)
        out.cluster_id = self._cluster_id
        out.nodes.extend(self._nodes())
        out.responder_id = self._node_id
        if self._peer_problems is not None:
            out.peer_problems.extend(
                raft_pb2.PeerProblem(peer_id=p.peer_id, address=p.address, kind=p.kind, detail=p.detail)
                for p in self._peer_problems()
            )
        return out

    def _nodes(self) -> list[common_pb2.NodeRef]:
        """The controllers a response advertises: the configured ones, and the voter set's endpoints."""
        endpoints = dict(self._endpoints)
        if self._voter_changes is not None:
            for voter in self._voter_changes.voter_set:
                if voter.endpoints:
                    endpoints[voter.node_id] = (voter.endpoints[0].host, voter.endpoints[0].port)
        return node_refs(
            endpoints, listener_name=self._listener_name, security_protocol=self._security_protocol
        )

    # -- KIP-853 voter changes

    async def AddRaftVoter(
        self, request: raft_pb2.AddRaftVoterRequest, context: ServicerContext
    ) -> raft_pb2.RaftVoterChangeResponse:
        endpoints = tuple(Endpoint(e.name, e.host, e.port) for e in request.listeners)
        voter = Voter(request.voter_id, request.voter_directory_id, endpoints)
        return await self._voter_change(
            context, request.cluster_id, request.timeout_ms, lambda changes: changes.add_voter(voter)
        )

    async def RemoveRaftVoter(
        self, request: raft_pb2.RemoveRaftVoterRequest, context: ServicerContext
    ) -> raft_pb2.RaftVoterChangeResponse:
        return await self._voter_change(
            context,
            request.cluster_id,
            request.timeout_ms,
            lambda changes: changes.remove_voter(request.voter_id, request.voter_directory_id),
        )

    async def UpdateRaftVoter(
        self, request: raft_pb2.UpdateRaftVoterRequest, context: ServicerContext
    ) -> raft_pb2.RaftVoterChangeResponse:
        endpoints = tuple(Endpoint(e.name, e.host, e.port) for e in request.listeners)
        return await self._voter_change(
            context,
            request.cluster_id,
            request.timeout_ms,
            lambda changes: changes.update_voter(request.voter_id, request.voter_directory_id, endpoints),
            only_for=request.voter_id,
        )

    async def _voter_change(
        self,
        context: ServicerContext,
        cluster_id: str,
        timeout_ms: int,
        attempt: Callable[[VoterChangeHandler], Awaitable[int]],
        *,
        only_for: int | None = None,
    ) -> raft_pb2.RaftVoterChangeResponse:
        """Run one voter change on the leader, asking again while the answer is "not yet"
        (REQUEST_TIMED_OUT: epoch or previous change uncommitted, new voter still catching up) until
        ``timeout_ms`` (default 30 s, at most 10 min).  ``only_for``: on TLS only that controller's
        certificate may ask (UpdateRaftVoter: a voter moves only its own endpoint)."""
        if is_tls(context) and authenticated_peer_id(context) is None:
            # Changing the voter set moves Raft like a Vote does: on TLS it needs a controller certificate
            # (`kraft quorum add-controller --command-config` passes the joining controller's own).
            await abort(
                context,
                grpc.StatusCode.PERMISSION_DENIED,
                f"voter changes need a controller certificate (caller is {principal_of(context)})",
            )
        changes = self._voter_changes

        def answer(code: ErrorCode, message: str, offset: int = -1) -> raft_pb2.RaftVoterChangeResponse:
            leader = changes.leader_and_epoch if changes is not None else None
            return raft_pb2.RaftVoterChangeResponse(
                error_code=int(code),
                error_message=message,
                leader_id=leader.leader_id if leader is not None else m.NO_LEADER,
                leader_epoch=leader.epoch if leader is not None else m.NO_LEADER,
                offset=offset,
                nodes=self._nodes() if code is ErrorCode.NOT_LEADER_OR_FOLLOWER else (),
            )

        if cluster_id != self._cluster_id:  # an empty one too (issue #15)
            return answer(ErrorCode.INCONSISTENT_CLUSTER_ID, f"cluster id {cluster_id!r} is not ours")
        caller = authenticated_peer_id(context) if is_tls(context) else None
        if only_for is not None and caller is not None and caller != only_for:
            return answer(
                ErrorCode.INVALID_REQUEST,
                f"controller {caller} may update only its own endpoints, not voter {only_for}'s",
            )
        if changes is None:
            return answer(ErrorCode.UNSUPPORTED_VERSION, "this node does not serve voter changes")
        if timeout_ms < 0:
            return answer(ErrorCode.INVALID_REQUEST, "timeout_ms must not be negative")
        deadline = time.monotonic() + min(timeout_ms or 30_000, 600_000) / 1000.0
        while True:
            remaining = deadline - time.monotonic()
            try:
                async with asyncio.timeout(max(remaining, 0.001)):
                    offset = await attempt(changes)
                return answer(ErrorCode.NONE, "", offset)
            except VoterChangeError as exc:
                if exc.code is ErrorCode.REQUEST_TIMED_OUT and deadline - time.monotonic() > 0.1:
                    await asyncio.sleep(0.1)
                    continue
                return answer(exc.code, exc.message)
            except NotLeaderError as exc:
                return answer(ErrorCode.NOT_LEADER_OR_FOLLOWER, str(exc))
            except TimeoutError:
                return answer(ErrorCode.REQUEST_TIMED_OUT, "the change did not commit within the timeout")
            except RaftShutdownError:
                return answer(ErrorCode.BROKER_NOT_AVAILABLE, "raft node is shutting down")


def add_raft_service(servicer: RaftServicer, server: grpc.aio.Server) -> None:
    """Register ``kraft.v1.RaftService`` with handlers that decode inside the servicer
    (:func:`kraft.grpc_service.register_service`): undecodable bytes get INVALID_ARGUMENT, logged as
    ``raft_bad_request`` once per peer per interval."""
    register_service(server, servicer, _SERVICE, RequestDecoder(_log, "raft_bad_request"))
