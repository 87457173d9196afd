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
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, NoReturn, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import DecodeError, Message

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.raft import grpc_codec as codec
from kraft.raft import messages as m
from kraft.raft.api import NotLeaderError, RaftShutdownError, VoterChangeError
from kraft.raft.transport import RequestHandler, VoterChangeHandler
from kraft.raft.voters import Endpoint, Voter
from kraft.storage.ids import parse_uuid
from kraft.v1 import common_pb2, raft_pb2, raft_pb2_grpc

_log = logging.getLogger(__name__)

ServicerContext = grpc.aio.ServicerContext[Any, Any]
_Request = TypeVar("_Request", bound=m.RaftRequest)
_Pb = TypeVar("_Pb", bound=Message)

SERVICE_NAME = "kraft.v1.RaftService"
BAD_REQUEST_LOG_INTERVAL_S = 10.0
"""A peer sending undecodable requests is logged at most this often (the rest are counted)."""
_MAX_LOGGED_PEERS = 1024
"""Peers remembered by the rate limiter; past that it starts over (a bound, not a policy)."""


class RateLimitedLog:
    """One warning per ``key`` per ``interval_s``; how many were suppressed rides on the next one."""

    def __init__(self, interval_s: float = BAD_REQUEST_LOG_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}

    def should_log(self, key: str, now_s: float) -> int | None:
        """None to stay quiet, else how many were suppressed since the last logged one."""
        last = self._last.get(key)
        if last is not None and now_s - last[0] < self._interval_s:
            self._last[key] = (last[0], last[1] + 1)
            return None
        if len(self._last) >= _MAX_LOGGED_PEERS:
            self._last.clear()
        self._last[key] = (now_s, 0)
        return 0 if last is None else last[1]


def peer_host(context: ServicerContext) -> str:
    """The caller's address without its port (one client opens many connections)."""
    peer = context.peer() or "unknown"
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


def authenticated_peer_id(context: ServicerContext) -> int | None:
    """The node id the caller proved it is, or None.

    Plaintext today: None, and the core then trusts the sender id a request claims (anyone reaching the
    port can claim any voter id).  The TLS/mTLS work fills this in from ``context.auth_context()`` (the
    client certificate's node identity); the core already refuses a request whose claimed sender differs.
    """
    return None


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
        endpoints: Mapping[int, tuple[str, int]] | None = None,
        voter_changes: VoterChangeHandler | None = None,
    ) -> None:
        """``endpoints`` node id → (host, port): the controllers a response advertises for redirects
        (with a dynamic quorum the voter set's own endpoints are added).  Directory ids travel in the
        messages themselves (KIP-853): the core tracks them.  ``voter_changes`` serves AddRaftVoter,
        RemoveRaftVoter and UpdateRaftVoter (None: refused as UNSUPPORTED_VERSION)."""
        self._handler = handler
        self._cluster_id = cluster_id
        self._endpoints = dict(endpoints or {})
        self._voter_changes = voter_changes
        self._bad_requests = RateLimitedLog()

    async def _handle(self, request: _Request, context: ServicerContext) -> m.RaftResponse:
        try:
            return await self._handler.handle_request(request, peer_id=authenticated_peer_id(context))
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
        self, request: raft_pb2.FetchRequest, context: ServicerContext
    ) -> raft_pb2.FetchResponse:
        if not valid_directory_id(request.replica_directory_id):
            # Refused before the core sees it; the fetcher's request-error rule retries after a backoff.
            message = "replica_directory_id must be empty or a 22-character base64url UUID"
            return codec.fetch_response_to_pb(
                m.FetchResponse(ErrorCode.INVALID_REQUEST, message, m.NO_LEADER, m.NO_LEADER)
            )
        response = await self._handle(codec.fetch_request_from_pb(request), context)
        assert isinstance(response, m.FetchResponse)
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
        # Admin tools may not know the cluster id yet: an empty one means "whatever this cluster is".
        cluster_id = request.cluster_id or self._cluster_id
        response = await self._handle(m.DescribeQuorumRequest(cluster_id=cluster_id), context)
        assert isinstance(response, m.DescribeQuorumResponse)
        out = codec.describe_response_to_pb(response)
        out.cluster_id = self._cluster_id
        out.nodes.extend(self._nodes())
        return out

    def _nodes(self) -> list[common_pb2.NodeRef]:
        """The controllers a response advertises: the configured ones, and the voter set's endpoints."""
        endpoints = dict(self._endpoints)
        if self._voter_changes is not None:
            for voter in self._voter_changes.voter_set:
                if voter.endpoints:
                    endpoints[voter.node_id] = (voter.endpoints[0].host, voter.endpoints[0].port)
        return node_refs(endpoints)

    # -- KIP-853 voter changes

    async def AddRaftVoter(
        self, request: raft_pb2.AddRaftVoterRequest, context: ServicerContext
    ) -> raft_pb2.RaftVoterChangeResponse:
        endpoints = tuple(Endpoint(e.name, e.host, e.port) for e in request.listeners)
        voter = Voter(request.voter_id, request.voter_directory_id, endpoints)
        return await self._voter_change(
            request.cluster_id, request.timeout_ms, lambda changes: changes.add_voter(voter)
        )

    async def RemoveRaftVoter(
        self, request: raft_pb2.RemoveRaftVoterRequest, context: ServicerContext
    ) -> raft_pb2.RaftVoterChangeResponse:
        return await self._voter_change(
            request.cluster_id,
            request.timeout_ms,
            lambda changes: changes.remove_voter(request.voter_id, request.voter_directory_id),
        )

    async def UpdateRaftVoter(
        self, request: raft_pb2.UpdateRaftVoterRequest, context: ServicerContext
    ) -> raft_pb2.RaftVoterChangeResponse:
        endpoints = tuple(Endpoint(e.name, e.host, e.port) for e in request.listeners)
        return await self._voter_change(
            request.cluster_id,
            request.timeout_ms,
            lambda changes: changes.update_voter(request.voter_id, request.voter_directory_id, endpoints),
        )

    async def _voter_change(
        self, cluster_id: str, timeout_ms: int, attempt: Callable[[VoterChangeHandler], Awaitable[int]]
    ) -> raft_pb2.RaftVoterChangeResponse:
        """Run one voter change on the leader, asking again while the answer is "not yet"
        (REQUEST_TIMED_OUT: epoch or previous change uncommitted, new voter still catching up) until
        ``timeout_ms`` (default 30 s, at most 10 min)."""
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

        if cluster_id and cluster_id != self._cluster_id:
            return answer(ErrorCode.INCONSISTENT_CLUSTER_ID, f"cluster id {cluster_id!r} is not ours")
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

    # -- decoding under our control (see add_raft_service)

    async def decode(self, raw: bytes, pb_type: type[_Pb], method: str, context: ServicerContext) -> _Pb:
        """Parse one request; undecodable bytes end the call with INVALID_ARGUMENT (rate-limited log)."""
        try:
            return pb_type.FromString(raw)
        except (DecodeError, ValueError, RuntimeError) as exc:  # RuntimeError: recursion limit
            host = peer_host(context)
            suppressed = self._bad_requests.should_log(host, time.monotonic())
            if suppressed is not None:
                _log.warning(
                    "raft_bad_request peer=%s method=%s error=%s suppressed=%d",
                    host,
                    method,
                    type(exc).__name__,
                    suppressed,
                )
            await abort(
                context, grpc_status_for(ErrorCode.INVALID_REQUEST), f"undecodable {pb_type.__name__}"
            )


def _unary(
    servicer: RaftServicer,
    name: str,
    pb_type: type[_Pb],
    method: Callable[[_Pb, ServicerContext], Awaitable[Message]],
) -> Callable[[bytes, ServicerContext], Awaitable[Message]]:
    async def handle(raw: bytes, context: ServicerContext) -> Message:
        request = await servicer.decode(raw, pb_type, name, context)
        return await method(request, context)

    return handle


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


def add_raft_service(servicer: RaftServicer, server: grpc.aio.Server) -> None:
    """Register ``kraft.v1.RaftService`` with raw-bytes handlers that decode inside the servicer.

    Same methods and wire format as ``raft_pb2_grpc.add_RaftServiceServicer_to_server``; the difference is
    only who decodes: gRPC's generated deserializer logs every undecodable request with a traceback and
    answers UNKNOWN, this answers INVALID_ARGUMENT and logs once per peer per interval.
    """

    async def fetch_stream(
        raw_requests: AsyncIterator[bytes], context: ServicerContext
    ) -> AsyncIterator[raft_pb2.FetchResponse]:
        async def decoded() -> AsyncIterator[raft_pb2.FetchRequest]:
            async for raw in raw_requests:
                yield await servicer.decode(raw, raft_pb2.FetchRequest, "FetchStream", context)

        async for response in servicer.FetchStream(decoded(), context):
            yield response

    unary = {
        "Vote": _unary(servicer, "Vote", raft_pb2.VoteRequest, servicer.Vote),
        "BeginQuorumEpoch": _unary(
            servicer, "BeginQuorumEpoch", raft_pb2.BeginQuorumEpochRequest, servicer.BeginQuorumEpoch
        ),
        "EndQuorumEpoch": _unary(
            servicer, "EndQuorumEpoch", raft_pb2.EndQuorumEpochRequest, servicer.EndQuorumEpoch
        ),
        "Fetch": _unary(servicer, "Fetch", raft_pb2.FetchRequest, servicer.Fetch),
        "FetchSnapshot": _unary(
            servicer, "FetchSnapshot", raft_pb2.FetchSnapshotRequest, servicer.FetchSnapshot
        ),
        "DescribeQuorum": _unary(
            servicer, "DescribeQuorum", raft_pb2.DescribeQuorumRequest, servicer.DescribeQuorum
        ),
        "AddRaftVoter": _unary(servicer, "AddRaftVoter", raft_pb2.AddRaftVoterRequest, servicer.AddRaftVoter),
        "RemoveRaftVoter": _unary(
            servicer, "RemoveRaftVoter", raft_pb2.RemoveRaftVoterRequest, servicer.RemoveRaftVoter
        ),
        "UpdateRaftVoter": _unary(
            servicer, "UpdateRaftVoter", raft_pb2.UpdateRaftVoterRequest, servicer.UpdateRaftVoter
        ),
    }
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
        name: grpc.unary_unary_rpc_method_handler(handler, response_serializer=_serialize)
        for name, handler in unary.items()
    }
    handlers["FetchStream"] = grpc.stream_stream_rpc_method_handler(
        fetch_stream, response_serializer=_serialize
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE_NAME, handlers),))
