"""GrpcTransport ↔ RaftServicer over a real loopback grpc.aio server, with a scripted request handler."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import grpc.aio
import pytest
from slow_handshake import slow_first_answer

from kraft.client.channel import open_channel
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.raft import messages as m
from kraft.raft.api import RaftShutdownError
from kraft.raft.grpc_server import RaftServicer, add_raft_service
from kraft.raft.grpc_transport import GrpcTransport
from kraft.raft.transport import TransportError
from kraft.v1 import raft_pb2, raft_pb2_grpc

CLUSTER = "test-cluster-id"
DIR_1 = "3JYSPKIBRe-ipK1M2Xq7Lg"  # directory ids are Kafka UUIDs (22 base64url characters)
DIR_2 = "x4Q2ZLnyQKq7mYwV-8Kc3g"

Handler = Callable[[m.RaftRequest], Awaitable[m.RaftResponse]]


@dataclass
class ScriptedHandler:
    """A RequestHandler that records requests and answers with ``respond`` (an echo by default)."""

    respond: Handler | None = None
    received: list[m.RaftRequest] = field(default_factory=list)

    async def handle_request(self, request: m.RaftRequest, *, peer_id: int | None = None) -> m.RaftResponse:
        self.received.append(request)
        if self.respond is not None:
            return await self.respond(request)
        return m.error_response_for(request, ErrorCode.NONE, "", 1, 7)


@dataclass
class Server:
    port: int
    handler: ScriptedHandler
    server: grpc.aio.Server


async def _start_server(handler: ScriptedHandler, max_message_bytes: int = 1 << 20) -> Server:
    port = free_port()
    options = [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
    ]
    server = grpc.aio.server(options=options)
    servicer = RaftServicer(
        handler,
        cluster_id=CLUSTER,
        endpoints={1: ("127.0.0.1", port)},
    )
    add_raft_service(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return Server(port, handler, server)


@pytest.fixture
async def server() -> AsyncIterator[Server]:
    started = await _start_server(ScriptedHandler())
    try:
        yield started
    finally:
        await started.server.stop(grace=None)


@pytest.fixture
async def transport(server: Server) -> AsyncIterator[GrpcTransport]:
    client = GrpcTransport({1: f"127.0.0.1:{server.port}"}, max_message_bytes=1 << 20)
    try:
        yield client
    finally:
        await client.close()


async def test_each_rpc_reaches_the_handler_and_its_response_comes_back(
    server: Server, transport: GrpcTransport
) -> None:
    requests: list[m.RaftRequest] = [
        m.VoteRequest(CLUSTER, 3, 2, 1, 2, 40, pre_vote=True),
        m.BeginQuorumEpochRequest(CLUSTER, 2, 3, 1),
        m.EndQuorumEpochRequest(CLUSTER, 2, 3, 1, (3, 1)),
        m.FetchRequest(CLUSTER, 2, 3, 40, 2, max_wait_ms=10),
        m.FetchSnapshotRequest(CLUSTER, 2, 3, m.SnapshotId(30, 2), 0),
        m.DescribeQuorumRequest(CLUSTER),
    ]
    for request in requests:
        response = await transport.send(1, request, timeout_ms=2000)
        assert response == m.error_response_for(request, ErrorCode.NONE, "", 1, 7)
    assert server.handler.received == requests


async def test_a_long_poll_fetch_does_not_block_a_vote(server: Server, transport: GrpcTransport) -> None:
    release = asyncio.Event()

    async def respond(request: m.RaftRequest) -> m.RaftResponse:
        if isinstance(request, m.FetchRequest):
            await asyncio.wait_for(release.wait(), timeout=5)
        return m.error_response_for(request, ErrorCode.NONE, "", 1, 7)

    server.handler.respond = respond
    fetch = asyncio.ensure_future(transport.send(1, m.FetchRequest(CLUSTER, 2, 7, 0, 0), timeout_ms=5000))
    vote = await transport.send(1, m.VoteRequest(CLUSTER, 8, 2, 1, 7, 0), timeout_ms=2000)
    assert isinstance(vote, m.VoteResponse)
    assert not fetch.done()
    release.set()
    assert isinstance(await asyncio.wait_for(fetch, timeout=5), m.FetchResponse)


class _ManualTime:
    """The transport's ``monotonic`` and ``sleep`` on a clock that only a sleep moves (seconds)."""

    def __init__(self) -> None:
        self.now = 1_000.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


async def test_a_call_past_its_deadline_raises_transport_error(server: Server) -> None:
    """The call's deadline goes to gRPC, and its expiry ends the call as a TransportError while the peer
    still holds the request (it never answers): the deadline, not an answer, ended it."""
    held = asyncio.Event()
    release = asyncio.Event()

    async def never(request: m.RaftRequest) -> m.RaftResponse:
        held.set()
        await asyncio.wait_for(release.wait(), timeout=60)
        return m.error_response_for(request, ErrorCode.NONE, "", 1, 7)

    server.handler.respond = never
    clock = _ManualTime()
    transport = GrpcTransport({1: f"127.0.0.1:{server.port}"}, monotonic=clock.monotonic, sleep=clock.sleep)
    deadlines: list[float] = []
    try:
        stub = transport._peer(1).stub
        begin = stub.BeginQuorumEpoch

        def recorded(request: raft_pb2.BeginQuorumEpochRequest, *, timeout: float) -> Any:
            deadlines.append(timeout)
            return begin(request, timeout=timeout)

        stub.BeginQuorumEpoch = recorded  # type: ignore[assignment]
        with pytest.raises(TransportError, match="DEADLINE_EXCEEDED"):
            await transport.send(1, m.BeginQuorumEpochRequest(CLUSTER, 2, 3, 1), timeout_ms=200)
        assert held.is_set() and not release.is_set()  # the peer got it and has not answered
        assert deadlines == pytest.approx([0.2])  # the call's own 200 ms, not more
    finally:
        release.set()
        await transport.close()


async def test_an_unreachable_peer_raises_and_backs_off_without_exceeding_the_deadline() -> None:
    """After each failed call the next one first waits out the peer's backoff, doubling from
    ``retry_backoff_ms`` up to ``max_backoff_ms``; a backoff that would outlast the call's deadline fails
    the call at once instead of sleeping past it.  On a manual clock: the schedule itself is asserted."""
    clock = _ManualTime()
    transport = GrpcTransport(
        {5: f"127.0.0.1:{free_port()}"},
        retry_backoff_ms=50,
        max_backoff_ms=400,
        monotonic=clock.monotonic,
        sleep=clock.sleep,
    )
    try:
        for _ in range(4):
            with pytest.raises(TransportError) as info:
                await transport.send(5, m.DescribeQuorumRequest(CLUSTER), timeout_ms=300)
            assert info.value.dest == 5
        # 50 + 100 + 200 ms of backoff before the 2nd..4th call; a busy loop would sleep none.
        assert clock.slept == pytest.approx([0.05, 0.1, 0.2])
        # The 5th call's backoff (400 ms, the cap) is not shorter than its 300 ms deadline: refused unslept.
        with pytest.raises(TransportError, match="in backoff after 4 failed calls"):
            await transport.send(5, m.DescribeQuorumRequest(CLUSTER), timeout_ms=300)
        assert len(clock.slept) == 3
        # A call with a longer deadline waits it out; the backoff stays at the cap.
        for _ in range(2):
            with pytest.raises(TransportError, match=r"UNAVAILABLE|DEADLINE_EXCEEDED"):
                await transport.send(5, m.DescribeQuorumRequest(CLUSTER), timeout_ms=1000)
        assert clock.slept[3:] == pytest.approx([0.4, 0.4])
    finally:
        await transport.close()


async def test_a_restarted_peer_is_reachable_again_soon(server: Server) -> None:
    transport = GrpcTransport({1: f"127.0.0.1:{server.port}"}, retry_backoff_ms=20, max_backoff_ms=300)
    try:
        await server.server.stop(grace=None)
        with pytest.raises(TransportError):
            await transport.send(1, m.DescribeQuorumRequest(CLUSTER), timeout_ms=300)
        restarted = await _start_server_on(server.port, server.handler)
        try:
            deadline = time.monotonic() + 5
            while True:
                try:
                    await transport.send(1, m.DescribeQuorumRequest(CLUSTER), timeout_ms=300)
                    break
                except TransportError:
                    assert time.monotonic() < deadline, "peer not reachable 5 s after its restart"
        finally:
            await restarted.stop(grace=None)
    finally:
        await transport.close()


async def _start_server_on(port: int, handler: ScriptedHandler) -> grpc.aio.Server:
    server = grpc.aio.server()
    raft_pb2_grpc.add_RaftServiceServicer_to_server(RaftServicer(handler, cluster_id=CLUSTER), server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server


async def test_unknown_destination_raises_transport_error(transport: GrpcTransport) -> None:
    with pytest.raises(TransportError, match="unknown node id"):
        await transport.send(42, m.DescribeQuorumRequest(CLUSTER), timeout_ms=100)


async def test_a_response_over_the_max_message_size_is_refused(
    server: Server, transport: GrpcTransport
) -> None:
    async def huge(request: m.RaftRequest) -> m.RaftResponse:
        return m.FetchResponse(ErrorCode.NONE, "", 1, 7, records=b"x" * (2 << 20))

    server.handler.respond = huge
    with pytest.raises(TransportError, match="RESOURCE_EXHAUSTED"):
        await transport.send(1, m.FetchRequest(CLUSTER, 2, 7, 0, 0), timeout_ms=2000)


async def test_a_stopping_node_answers_unavailable(server: Server, transport: GrpcTransport) -> None:
    async def stopping(request: m.RaftRequest) -> m.RaftResponse:
        raise RaftShutdownError("stopping")

    server.handler.respond = stopping
    with pytest.raises(TransportError, match="UNAVAILABLE"):
        await transport.send(1, m.VoteRequest(CLUSTER, 3, 2, 1, 2, 40), timeout_ms=2000)


async def test_describe_quorum_names_the_cluster_nodes_and_fetchers_directory_ids(
    server: Server, transport: GrpcTransport
) -> None:
    async def describe(request: m.RaftRequest) -> m.RaftResponse:
        if isinstance(request, m.DescribeQuorumRequest):
            voters = (m.ReplicaState(1, 5, 1, 1, DIR_1), m.ReplicaState(2, 5, 1, 1, DIR_2))
            return m.DescribeQuorumResponse(ErrorCode.NONE, "", 1, 7, 5, voters)
        return m.error_response_for(request, ErrorCode.NONE, "", 1, 7)

    server.handler.respond = describe
    fetch = m.FetchRequest(CLUSTER, 2, 7, 0, 0, replica_directory_id=DIR_2)
    await transport.send(1, fetch, timeout_ms=2000)
    assert fetch in server.handler.received  # the fetcher's directory id reaches the core
    async with open_channel(f"127.0.0.1:{server.port}") as channel:
        stub = raft_pb2_grpc.RaftServiceStub(channel)
        answer = await stub.DescribeQuorum(raft_pb2.DescribeQuorumRequest(cluster_id=CLUSTER), timeout=2)
        # An empty cluster id reaches the core as it is (the core refuses it); the answer states the id.
        unnamed = await stub.DescribeQuorum(raft_pb2.DescribeQuorumRequest(), timeout=2)
    assert server.handler.received[-1] == m.DescribeQuorumRequest("")
    assert unnamed.cluster_id == CLUSTER
    assert answer.cluster_id == CLUSTER
    assert [(n.node_id, n.endpoint.port) for n in answer.nodes] == [(1, server.port)]
    assert [v.directory_id for v in answer.current_voters] == [DIR_1, DIR_2]


async def test_a_closed_transport_refuses_to_send(transport: GrpcTransport) -> None:
    await transport.close()
    with pytest.raises(TransportError, match="closed"):
        await transport.send(1, m.DescribeQuorumRequest(CLUSTER), timeout_ms=100)


async def test_a_fetch_that_times_out_on_the_stream_never_hands_its_late_answer_to_the_next(
    server: Server, transport: GrpcTransport
) -> None:
    release = asyncio.Event()

    async def slow_then_fast(request: m.RaftRequest) -> m.RaftResponse:
        assert isinstance(request, m.FetchRequest)
        if request.fetch_offset == 1:
            await asyncio.wait_for(release.wait(), timeout=5)
        return m.FetchResponse(ErrorCode.NONE, "", 1, 7, records=b"answer-to-%d" % request.fetch_offset)

    server.handler.respond = slow_then_fast
    with pytest.raises(TransportError, match="DEADLINE_EXCEEDED"):
        await transport.send(1, m.FetchRequest(CLUSTER, 2, 7, 1, 0), timeout_ms=200)
    # The late answer goes out now, on the stream it was asked on, ahead of anything asked after it (the
    # server answers a stream in order): a transport that kept that stream would read it for offset 2.
    release.set()
    for offset in (2, 3):
        answer = await transport.send(1, m.FetchRequest(CLUSTER, 2, 7, offset, 0), timeout_ms=2000)
        assert isinstance(answer, m.FetchResponse)
        assert answer.records == b"answer-to-%d" % offset


class _ServicerWithoutFetchStream(RaftServicer):
    """A peer built before FetchStream existed."""

    FetchStream = raft_pb2_grpc.RaftServiceServicer.FetchStream  # type: ignore[assignment]


@contextlib.asynccontextmanager
async def _legacy_peer() -> AsyncIterator[tuple[ScriptedHandler, GrpcTransport]]:
    """Node 1 served by a peer without FetchStream, and a transport to it."""
    handler = ScriptedHandler()
    port = free_port()
    legacy = grpc.aio.server()
    raft_pb2_grpc.add_RaftServiceServicer_to_server(
        _ServicerWithoutFetchStream(handler, cluster_id=CLUSTER), legacy
    )
    legacy.add_insecure_port(f"127.0.0.1:{port}")
    await legacy.start()
    transport = GrpcTransport({1: f"127.0.0.1:{port}"})
    try:
        yield handler, transport
    finally:
        await transport.close()
        await legacy.stop(grace=None)


async def test_fetch_falls_back_to_unary_when_the_peer_has_no_fetch_stream() -> None:
    async with _legacy_peer() as (handler, transport):
        for offset in (5, 6):
            answer = await transport.send(1, m.FetchRequest(CLUSTER, 2, 7, offset, 0), timeout_ms=2000)
            assert isinstance(answer, m.FetchResponse) and answer.error_code is ErrorCode.NONE
        assert [r.fetch_offset for r in handler.received if isinstance(r, m.FetchRequest)] == [5, 6]


async def test_fetch_falls_back_to_unary_when_the_stream_ended_before_the_first_write() -> None:
    # The race behind a once-flaky run: the peer's UNIMPLEMENTED can end the call before the transport
    # writes its first request, and grpc.aio then refuses the write (InvalidStateError), not the read.
    async with _legacy_peer() as (handler, transport):
        peer = transport._peer(1)
        peer.fetch_stream = peer.stub.FetchStream(None)
        async with asyncio.timeout(5):
            assert await peer.fetch_stream.code() is grpc.StatusCode.UNIMPLEMENTED  # ended, nothing written
        answer = await transport.send(1, m.FetchRequest(CLUSTER, 2, 7, 5, 0), timeout_ms=2000)
        assert isinstance(answer, m.FetchResponse) and answer.error_code is ErrorCode.NONE
        assert peer.stream_unsupported
        assert [r.fetch_offset for r in handler.received if isinstance(r, m.FetchRequest)] == [5]


class _StreamEndedDuringWrite:
    """A fetch stream whose call ended while its request was being sent, as grpc.aio reports it: the
    write raises grpc.aio's own INTERNAL "Failed execute_batch" and the peer's status is gone (a peer
    without FetchStream, in another process, gives this on most stream opens)."""

    def __init__(self) -> None:
        self.cancelled = False

    async def write(self, request: raft_pb2.FetchRequest) -> None:
        empty = grpc.aio.Metadata()
        debug = 'Failed "execute_batch": (<grpc._cython.cygrpc.SendMessageOperation object>,)'
        raise grpc.aio.AioRpcError(grpc.StatusCode.INTERNAL, empty, empty, "Internal error from Core", debug)

    async def read(self) -> raft_pb2.FetchResponse:
        raise AssertionError("never read: the write failed")

    def cancel(self) -> bool:
        self.cancelled = True
        return True


async def test_a_fetch_whose_stream_ended_during_the_write_goes_unary_and_the_next_streams_again(
    server: Server, transport: GrpcTransport
) -> None:
    # The request never left (the write failed), so sending it unary is safe, and the unary call's status
    # is the peer's own; the stream is not given up on an unknown status.
    peer = transport._peer(1)
    ended = _StreamEndedDuringWrite()
    peer.fetch_stream = ended  # type: ignore[assignment]
    answer = await transport.send(1, m.FetchRequest(CLUSTER, 2, 7, 5, 0), timeout_ms=2000)
    assert isinstance(answer, m.FetchResponse) and answer.error_code is ErrorCode.NONE
    assert ended.cancelled and not peer.stream_unsupported and peer.failures == 0
    answer = await transport.send(1, m.FetchRequest(CLUSTER, 2, 7, 6, 0), timeout_ms=2000)
    assert isinstance(answer, m.FetchResponse) and answer.error_code is ErrorCode.NONE
    assert peer.fetch_stream is not None, "the next fetch went over a new stream"
    fetched = [r.fetch_offset for r in server.handler.received if isinstance(r, m.FetchRequest)]
    assert fetched == [5, 6]


async def test_a_peer_whose_handshake_answer_takes_300_ms_is_reached_on_the_first_call(
    server: Server,
) -> None:
    # gRPC core gives one connection attempt grpc.min_reconnect_backoff_ms (TCP and HTTP/2 SETTINGS); at
    # 100 ms a loaded host's handshake failed the call at once with UNAVAILABLE.
    async with slow_first_answer(server.port, delay_s=0.3) as port:
        transport = GrpcTransport({1: f"127.0.0.1:{port}"})
        try:
            answer = await transport.send(1, m.FetchRequest(CLUSTER, 2, 7, 5, 0), timeout_ms=5000)
        finally:
            await transport.close()
    assert isinstance(answer, m.FetchResponse) and answer.error_code is ErrorCode.NONE


async def test_addresses_follow_the_voter_set_and_an_unknown_leader_is_looked_up_on_a_bootstrap_server(
    server: Server,
) -> None:
    """KIP-853: node 1 is known to nobody but the bootstrap server (pseudo id -2), whose DescribeQuorum
    answer names its endpoint; once the voter set in force (``resolve``) puts node 1 elsewhere — it moved
    — the transport dials the new address."""
    moved = await _start_server(ScriptedHandler())
    where: dict[int, str] = {}
    client = GrpcTransport(
        {-2: f"127.0.0.1:{server.port}"}, max_message_bytes=1 << 20, resolve=where.get, cluster_id=CLUSTER
    )
    fetch = m.FetchRequest(CLUSTER, 2, 3, 40, 2, max_wait_ms=10)
    try:
        assert client.address_of(1) is None
        await client.send(1, fetch, timeout_ms=2000)
        assert [type(r) for r in server.handler.received] == [m.DescribeQuorumRequest, m.FetchRequest]
        assert client.address_of(1) == f"127.0.0.1:{server.port}"

        where[1] = f"127.0.0.1:{moved.port}"
        await client.send(1, fetch, timeout_ms=2000)
        assert moved.handler.received == [fetch] and len(server.handler.received) == 2
        with pytest.raises(TransportError, match="unknown node id"):
            await client.send(9, fetch, timeout_ms=500)  # the bootstrap server does not know it either
    finally:
        await client.close()
        await moved.server.stop(grace=None)
