"""Outbound Raft over gRPC: :class:`GrpcTransport` implements :class:`kraft.raft.transport.Transport`.

- One persistent ``grpc.aio`` channel per peer, opened on first use and kept for the node's lifetime
  (gRPC reconnects it by itself; the reconnect backoff is capped low so a restarted peer is reachable
  again within ~``max_backoff_ms``, not gRPC's default two minutes).  The channels come from a
  :class:`kraft.client.channel.ChannelPool`: when the node's keystore or truststore files are rotated,
  the peers are dialled again with the new files within about a second (calls in flight on the old
  channels finish first), so the Raft links follow a certificate rotation without a restart.
- Every call has a deadline (the ``timeout_ms`` the driver passes; for a Fetch that already includes the
  long-poll wait).
- Fetch goes over one long-lived ``FetchStream`` per peer (one request in flight, answers in order):
  a stream round trip costs less than half a unary call.  Each round trip is bounded by the same
  deadline; on any failure the stream is dropped and the next fetch opens a new one.  A peer without
  FetchStream (UNIMPLEMENTED) gets unary Fetch from then on.  A stream that ended while its request was
  being written (grpc.aio then reports its own INTERNAL, not the peer's status) sends that fetch unary.
- After a failed call the peer is in backoff: the next call to it first sleeps ``retry_backoff_ms``,
  doubling per consecutive failure up to ``max_backoff_ms`` (bounded by the call's own deadline), so a
  dead peer costs a few calls per second instead of a busy loop.  One success clears it.
- Message size is bounded both ways by ``max_message_bytes`` (``grpc.max.message.bytes``).
- Addresses (KIP-853): ``resolve(node id)`` first — the endpoints of the voter set in force, so a voter
  added, or moved by UpdateRaftVoter, is dialled where the log says (a changed address gets a new
  channel) — then the static ``peers``.  Bootstrap servers are peers under pseudo ids below -1.  A node
  id known to neither (the leader a joining observer just learned of, before it fetched the VotersRecord
  naming it) is looked up with DescribeQuorum on the bootstrap servers, whose answer lists every
  controller's endpoint (``nodes``), within the call's deadline.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

import grpc
import grpc.aio

from kraft.client.channel import ChannelPool, ChannelSecurity, PoolLog
from kraft.raft import grpc_codec as codec
from kraft.raft import messages as m
from kraft.raft.transport import TransportError
from kraft.v1 import raft_pb2, raft_pb2_grpc

if TYPE_CHECKING:
    from kraft.v1.raft_pb2_grpc import RaftServiceAsyncStub

FetchStreamCall = grpc.aio.StreamStreamCall[raft_pb2.FetchRequest, raft_pb2.FetchResponse]


class _EndedBeforeWrite(Exception):
    """A fetch stream's write failed because the call had ended: the request was not sent, and grpc.aio
    reports INTERNAL in place of the status the peer ended the call with."""


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")

DEFAULT_MAX_MESSAGE_BYTES = 16 * 1024 * 1024


def channel_options(max_message_bytes: int, max_backoff_ms: int) -> list[tuple[str, Any]]:
    """Channel arguments every kraft client channel uses (shared with the CLI and the benchmark)."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.initial_reconnect_backoff_ms", min(100, max_backoff_ms)),
        # Not a backoff: gRPC core's minimum time for one connection attempt (TCP and HTTP/2 SETTINGS;
        # subchannel.cc, min_connect_timeout).  At 100 ms a handshake on a loaded host timed out
        # ("connection attempt timed out before receiving SETTINGS frame": 6 of 800 loopback runs at load
        # ~10, 0 of 800 at 1 s), failing calls at once with UNAVAILABLE.  Reconnects to a refused port
        # keep their pace (the backoff does not read it); an attempt to a silent host lasts ≤ this.
        ("grpc.min_reconnect_backoff_ms", max_backoff_ms),
        ("grpc.max_reconnect_backoff_ms", max_backoff_ms),
        # Raft retries on its own terms; a transparent gRPC retry would only hide a slow peer.
        ("grpc.enable_retries", 0),
        ("grpc.keepalive_time_ms", 10_000),
        ("grpc.keepalive_timeout_ms", 5_000),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.keepalive_permit_without_calls", 1),
    ]


@dataclass(slots=True)
class _Peer:
    """A peer's channel, its stub, and its backoff state (owned by the event loop's single thread)."""

    address: str
    channel: grpc.aio.Channel
    stub: RaftServiceAsyncStub
    fetch_lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    """Serializes round trips on the fetch stream (one request in flight keeps responses in order)."""
    fetch_stream: FetchStreamCall | None = None
    stream_unsupported: bool = False
    """The peer answered UNIMPLEMENTED to FetchStream (an older build): use unary Fetch."""
    failures: int = 0
    retry_at: float = 0.0
    """The transport's ``monotonic()`` before which a call first waits (0 = no backoff)."""

    def drop_fetch_stream(self) -> None:
        stream, self.fetch_stream = self.fetch_stream, None
        if stream is not None:
            stream.cancel()


class GrpcTransport:
    """Sends Raft requests to peers by node id; see the module docstring for the guarantees."""

    def __init__(
        self,
        peers: dict[int, str],
        *,
        retry_backoff_ms: int = 20,
        max_backoff_ms: int = 1000,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES,
        security: ChannelSecurity | None = None,
        resolve: Callable[[int], str | None] | None = None,
        cluster_id: str = "",
        log: PoolLog | None = None,
        channels: ChannelPool | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """``peers`` maps node id → ``host:port`` (bootstrap servers under ids below -1); ``security`` is
        how the peers' controller listener is dialled (None: the process default); ``resolve`` gives a
        node's address from the voter set in force (None: unknown); ``cluster_id`` goes with the
        DescribeQuorum that looks up an address nobody knows; ``log`` hears of certificate rotations;
        ``channels`` replaces the pool built from ``security`` (tests pace its checks with a clock);
        ``monotonic`` (seconds) and ``sleep`` measure the calls' deadlines and wait out a peer's backoff
        (tests run the backoff on a manual clock; a call's deadline still goes to gRPC, which keeps it on
        the host's clock)."""
        self._addresses = dict(peers)
        self._resolve = resolve
        self._cluster_id = cluster_id
        self._learned: dict[int, str] = {}
        """Addresses learned from a bootstrap server's DescribeQuorum answer."""
        self._retry_backoff_s = max(retry_backoff_ms, 1) / 1000.0
        self._max_backoff_s = max(max_backoff_ms, retry_backoff_ms) / 1000.0
        options = channel_options(max_message_bytes, max(max_backoff_ms, 100))
        self._channels = channels or ChannelPool(options, security, log=log, name="raft")
        self._peers: dict[int, _Peer] = {}
        self._closed = False
        self._monotonic = monotonic
        self._sleep = sleep

    def address_of(self, dest: int) -> str | None:
        """The ``host:port`` this transport dials for node ``dest`` (for log lines that name it)."""
        address = self._resolve(dest) if self._resolve is not None else None
        return address or self._addresses.get(dest) or self._learned.get(dest)

    def _peer(self, dest: int) -> _Peer:
        return self._peer_at(dest, self.address_of(dest))

    def _peer_at(self, dest: int, address: str | None) -> _Peer:
        """The peer state of ``dest``, dialled at ``address`` (what :meth:`address_of` says now)."""
        peer = self._peers.get(dest)
        if address is None:
            if peer is None:
                raise TransportError(dest, "unknown node id")
            address = peer.address
        channel = self._channels.get(address)
        if peer is not None and peer.channel is channel:
            return peer
        if peer is not None and peer.address != address:
            # The voter moved (UpdateRaftVoter): dial its new address; the old channel is retired.
            peer.drop_fetch_stream()
            self._channels.discard(peer.address)
        fresh = _Peer(address, channel, raft_pb2_grpc.RaftServiceStub(channel))
        if peer is not None and peer.address == address:
            # New TLS material (the pool replaced the channel): the peer's state carries over; its old
            # fetch stream ends when the pool closes the old channel, after any round trip in flight.
            fresh.stream_unsupported = peer.stream_unsupported
            fresh.failures, fresh.retry_at = peer.failures, peer.retry_at
        self._peers[dest] = fresh
        return fresh

    async def _look_up(self, dest: int, deadline: float) -> None:
        """Ask the bootstrap servers (DescribeQuorum) for the endpoint of ``dest``, within ``deadline``."""
        for pseudo_id in sorted((i for i in self._addresses if i < -1), reverse=True):
            remaining = deadline - self._monotonic()
            if remaining <= 0 or dest in self._learned:
                return
            stub = self._peer(pseudo_id).stub
            try:
                answer = await stub.DescribeQuorum(
                    raft_pb2.DescribeQuorumRequest(cluster_id=self._cluster_id), timeout=remaining
                )
            except (grpc.aio.AioRpcError, grpc.aio.UsageError):
                continue
            for node in answer.nodes:
                if node.node_id >= 0 and node.endpoint.host and 0 < node.endpoint.port < 65536:
                    host = node.endpoint.host
                    self._learned[node.node_id] = (
                        f"[{host}]:{node.endpoint.port}" if ":" in host else f"{host}:{node.endpoint.port}"
                    )

    async def send(self, dest: int, request: m.RaftRequest, timeout_ms: int) -> m.RaftResponse:
        if self._closed:
            raise TransportError(dest, "transport closed")
        timeout_s = max(timeout_ms, 1) / 1000.0
        deadline = self._monotonic() + timeout_s
        # Resolved once per call (the voter set's endpoint: a few µs on every follower's Fetch round).
        address = self.address_of(dest)
        if dest >= 0 and address is None:
            await self._look_up(dest, deadline)
            address = self.address_of(dest)
        peer = self._peer_at(dest, address)
        if peer.retry_at:
            wait_s = peer.retry_at - self._monotonic()
            if wait_s >= timeout_s:
                raise TransportError(dest, f"in backoff after {peer.failures} failed calls")
            if wait_s > 0:
                await self._sleep(wait_s)
        stub = peer.stub
        # Ordered by frequency: Fetch dominates every running cluster.
        if isinstance(request, m.FetchRequest):
            pb_fetch = codec.fetch_request_to_pb(request)
            if peer.stream_unsupported:
                fetched = await self._call(dest, peer, stub.Fetch, pb_fetch, deadline)
            else:
                fetched = await self._stream_fetch(dest, peer, pb_fetch, deadline)
            return codec.fetch_response_from_pb(fetched)
        if isinstance(request, m.VoteRequest):
            voted = await self._call(dest, peer, stub.Vote, codec.vote_request_to_pb(request), deadline)
            return codec.vote_response_from_pb(voted)
        if isinstance(request, m.BeginQuorumEpochRequest):
            begun = await self._call(
                dest, peer, stub.BeginQuorumEpoch, codec.begin_request_to_pb(request), deadline
            )
            return codec.begin_response_from_pb(begun)
        if isinstance(request, m.EndQuorumEpochRequest):
            ended = await self._call(
                dest, peer, stub.EndQuorumEpoch, codec.end_request_to_pb(request), deadline
            )
            return codec.end_response_from_pb(ended)
        if isinstance(request, m.FetchSnapshotRequest):
            chunk = await self._call(
                dest, peer, stub.FetchSnapshot, codec.fetch_snapshot_request_to_pb(request), deadline
            )
            return codec.fetch_snapshot_response_from_pb(chunk)
        described = await self._call(
            dest, peer, stub.DescribeQuorum, codec.describe_request_to_pb(request), deadline
        )
        return codec.describe_response_from_pb(described)

    async def _call(
        self,
        dest: int,
        peer: _Peer,
        method: grpc.aio.UnaryUnaryMultiCallable[_Req, _Resp],
        request: _Req,
        deadline: float,
    ) -> _Resp:
        try:
            response: _Resp = await method(request, timeout=max(deadline - self._monotonic(), 0.001))
        except grpc.aio.AioRpcError as exc:
            self._record_failure(peer)
            raise TransportError(dest, f"{exc.code().name}: {exc.details()}") from None
        except grpc.aio.UsageError as exc:  # the channel was closed under us (shutdown)
            raise TransportError(dest, f"channel closed: {exc}") from None
        if peer.failures:
            peer.failures = 0
            peer.retry_at = 0.0
        return response

    async def _stream_fetch(
        self, dest: int, peer: _Peer, request: raft_pb2.FetchRequest, deadline: float
    ) -> raft_pb2.FetchResponse:
        """One round trip on the peer's fetch stream, bounded by ``deadline``.

        Any failure (deadline, peer gone, cancellation) drops the stream: a late answer must never be
        read as the answer to the next request.  The next fetch opens a fresh stream.
        """
        # asyncio.timeout, not wait_for: no extra task per round trip (this is the replication hot path),
        # and 3.11's wait_for can swallow a cancellation (gh-86296).
        lock = peer.fetch_lock
        if lock.locked():
            try:
                async with asyncio.timeout(max(deadline - self._monotonic(), 0.001)):
                    await lock.acquire()
            except TimeoutError:
                raise TransportError(dest, "DEADLINE_EXCEEDED: another fetch holds the stream") from None
        else:
            await lock.acquire()  # free: returns without suspending
        try:
            if peer.fetch_stream is None:
                peer.fetch_stream = peer.stub.FetchStream(None)
            stream = peer.fetch_stream
            try:
                async with asyncio.timeout(max(deadline - self._monotonic(), 0.001)):
                    response = await self._round_trip(stream, request)
            except TimeoutError:
                peer.drop_fetch_stream()
                self._record_failure(peer)
                raise TransportError(dest, "DEADLINE_EXCEEDED: fetch stream round trip") from None
            except _EndedBeforeWrite:
                # Nothing was sent and the peer's status is lost: this fetch goes unary, whose status is
                # the peer's own.  The stream is not given up (the peer may serve it); the next fetch
                # opens one again.
                peer.drop_fetch_stream()
                return await self._call(dest, peer, peer.stub.Fetch, request, deadline)
            except grpc.aio.AioRpcError as exc:
                peer.drop_fetch_stream()
                if exc.code() is grpc.StatusCode.UNIMPLEMENTED:
                    peer.stream_unsupported = True
                    return await self._call(dest, peer, peer.stub.Fetch, request, deadline)
                self._record_failure(peer)
                raise TransportError(dest, f"{exc.code().name}: {exc.details()}") from None
            except (grpc.aio.UsageError, EOFError) as exc:
                peer.drop_fetch_stream()
                self._record_failure(peer)
                raise TransportError(dest, f"fetch stream closed: {exc}") from None
            except asyncio.CancelledError:
                peer.drop_fetch_stream()
                raise
        finally:
            lock.release()
        if peer.failures:
            peer.failures = 0
            peer.retry_at = 0.0
        return response

    @staticmethod
    async def _round_trip(stream: FetchStreamCall, request: raft_pb2.FetchRequest) -> raft_pb2.FetchResponse:
        try:
            await stream.write(request)
        except asyncio.InvalidStateError:
            # The call ended before this write — e.g. UNIMPLEMENTED from a peer without FetchStream
            # answered faster than we wrote: report the status it ended with, like a failed read would.
            code = await stream.code()
            details = await stream.details()
            empty = grpc.aio.Metadata()
            raise grpc.aio.AioRpcError(code, empty, empty, details, details) from None
        except grpc.aio.AioRpcError as exc:
            if exc.code() is grpc.StatusCode.INTERNAL:
                # The call ended while this request was being sent (e.g. a peer without FetchStream
                # answered UNIMPLEMENTED): grpc.aio then replaces the status it had received with its
                # own INTERNAL "Failed execute_batch" (grpc/aio/_call.py, _write), so the peer's answer
                # cannot be read back.  Measured with the peer in another thread: most such calls.
                raise _EndedBeforeWrite from None
            raise  # the status the call had ended with before the write began: the peer's own
        response = await stream.read()
        if not isinstance(response, raft_pb2.FetchResponse):  # grpc.aio.EOF
            raise EOFError("the peer ended the stream")
        return response

    def _record_failure(self, peer: _Peer) -> None:
        peer.failures += 1
        backoff_s = min(self._retry_backoff_s * (2 ** min(peer.failures - 1, 16)), self._max_backoff_s)
        peer.retry_at = self._monotonic() + backoff_s

    async def close(self) -> None:
        self._closed = True
        peers, self._peers = self._peers, {}
        for peer in peers.values():
            peer.drop_fetch_stream()
        await self._channels.close()
