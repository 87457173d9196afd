"""Intake processes' parts in-process: the TestAppend batcher (group commit, per-caller offsets, errors),
the byte-for-byte proxy against a fake upstream on a unix socket (every streaming shape, status and
trailing metadata, deadlines), and the node-side checks (refusals, the socket directory, the port probe)."""

from __future__ import annotations

import asyncio
import socket
import stat
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

import kraft.security.principal as principal_module
from kraft.config import NodeConfig
from kraft.grpc_service import ServerLimits, create_server, server_options
from kraft.netutil import free_port
from kraft.node.intake_batch import IntakeCounterSink
from kraft.node.intake_pool import (
    IntakeConfigError,
    check_port_free,
    check_supported,
    child_environment,
    prepare_socket_dir,
    socket_path,
)
from kraft.node.intake_process import (
    APPEND_METHOD,
    AppendBatcher,
    AppendStream,
    AppendStreamFailed,
    IntakeHandler,
    Proxy,
    Upstream,
    forwarded_metadata,
    method_shapes,
    split_answer,
)
from kraft.observability.metrics import INTAKE_COUNTERS
from kraft.security.guard import peer_host
from kraft.security.principal import (
    ANONYMOUS,
    INTAKE_AUTH_KEY,
    INTAKE_PEER_KEY,
    NodeIdentity,
    NodeRole,
    TlsPrincipalExtractor,
    decode_auth,
    encode_auth,
    install_principal_extractor,
    is_tls,
    node_identity,
    principal_of,
    stop_trusting_intake_forwarding,
    trust_intake_forwarding,
)
from kraft.v1 import raft_pb2

CLUSTER = "cluster-A"
TIMEOUT_S = 10.0


def _request(*values: bytes, cluster_id: str = CLUSTER) -> raft_pb2.TestAppendRequest:
    return raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=list(values))


class FakeLeader:
    """A ``send`` whose answers the test releases one at a time; offsets continue from ``next_offset``."""

    def __init__(self) -> None:
        self.sent: list[raft_pb2.TestAppendRequest] = []
        self.next_offset = 100
        self._gates: list[asyncio.Future[raft_pb2.TestAppendResponse | Exception | None]] = []

    async def send(self, request: raft_pb2.TestAppendRequest) -> raft_pb2.TestAppendResponse:
        self.sent.append(request)
        gate: asyncio.Future[raft_pb2.TestAppendResponse | Exception | None] = (
            asyncio.get_running_loop().create_future()
        )
        self._gates.append(gate)
        outcome = await gate
        if isinstance(outcome, Exception):
            raise outcome
        if outcome is not None:
            return outcome
        count = len(request.values)
        base, self.next_offset = self.next_offset, self.next_offset + count
        return raft_pb2.TestAppendResponse(
            error_code=0, leader_id=1, leader_epoch=3, base_offset=base, last_offset=base + count - 1
        )

    async def wait_sent(self, count: int) -> None:
        async with asyncio.timeout(TIMEOUT_S):
            while len(self.sent) < count:  # noqa: ASYNC110 (a bounded spin over loop turns)
                await asyncio.sleep(0)

    def release(self, outcome: raft_pb2.TestAppendResponse | Exception | None = None) -> None:
        gate = next(g for g in self._gates if not g.done())
        gate.set_result(outcome)


def _batcher(leader: FakeLeader, **limits: int) -> AppendBatcher:
    return AppendBatcher(
        leader.send,
        cluster_id=CLUSTER,
        max_values=limits.get("max_values", 1000),
        max_bytes=limits.get("max_bytes", 1 << 20),
    )


async def test_calls_of_one_turn_go_as_one_batch_and_each_gets_its_own_offsets() -> None:
    leader = FakeLeader()
    batcher = _batcher(leader)
    calls = [
        asyncio.create_task(batcher.append(_request(b"a"))),
        asyncio.create_task(batcher.append(_request(b"b", b"c", b"d"))),
        asyncio.create_task(batcher.append(_request(b"e", b"f"))),
    ]
    await leader.wait_sent(1)
    assert [list(r.values) for r in leader.sent] == [[b"a", b"b", b"c", b"d", b"e", b"f"]]
    assert leader.sent[0].cluster_id == CLUSTER
    leader.release()
    answers = await asyncio.gather(*calls)
    assert [(a.base_offset, a.last_offset) for a in answers] == [(100, 100), (101, 103), (104, 105)]
    assert {(a.error_code, a.leader_id, a.leader_epoch) for a in answers} == {(0, 1, 3)}
    assert (batcher.batches, batcher.calls) == (1, 3)


async def test_calls_arriving_while_a_batch_is_in_flight_form_the_next_batch() -> None:
    leader = FakeLeader()
    batcher = _batcher(leader)
    first = asyncio.create_task(batcher.append(_request(b"1")))
    await leader.wait_sent(1)
    later = [asyncio.create_task(batcher.append(_request(b"%d" % i))) for i in range(2, 6)]
    for _ in range(5):
        await asyncio.sleep(0)
    assert len(leader.sent) == 1, "one batch in flight at a time"
    leader.release()
    assert (await first).base_offset == 100
    await leader.wait_sent(2)
    assert list(leader.sent[1].values) == [b"2", b"3", b"4", b"5"]
    leader.release()
    assert [(a.base_offset, a.last_offset) for a in await asyncio.gather(*later)] == [
        (101, 101),
        (102, 102),
        (103, 103),
        (104, 104),
    ]


async def test_a_batch_never_exceeds_the_value_and_byte_limits() -> None:
    leader = FakeLeader()
    batcher = _batcher(leader, max_values=3, max_bytes=10)
    calls = [
        asyncio.create_task(batcher.append(_request(b"a", b"b"))),
        asyncio.create_task(batcher.append(_request(b"c", b"d"))),  # 4 values: next batch
        asyncio.create_task(batcher.append(_request(b"x" * 9))),  # bytes: a batch of its own
        asyncio.create_task(batcher.append(_request(b"y" * 20))),  # too big alone: still goes, alone
    ]
    for expected in range(1, 5):
        await leader.wait_sent(expected)
        leader.release()
    await asyncio.gather(*calls)
    assert [list(r.values) for r in leader.sent] == [[b"a", b"b"], [b"c", b"d"], [b"x" * 9], [b"y" * 20]]


async def test_an_error_answer_goes_to_every_caller_of_the_batch() -> None:
    leader = FakeLeader()
    batcher = _batcher(leader)
    calls = [asyncio.create_task(batcher.append(_request(b"v"))) for _ in range(3)]
    await leader.wait_sent(1)
    not_leader = raft_pb2.TestAppendResponse(error_code=6, error_message="not leader", leader_id=2)
    leader.release(not_leader)
    answers = await asyncio.gather(*calls)
    assert [(a.error_code, a.leader_id, a.error_message) for a in answers] == [(6, 2, "not leader")] * 3


async def test_a_failed_stream_fails_the_batch_and_the_next_batch_still_goes() -> None:
    leader = FakeLeader()
    batcher = _batcher(leader)
    calls = [asyncio.create_task(batcher.append(_request(b"v"))) for _ in range(2)]
    await leader.wait_sent(1)
    leader.release(AppendStreamFailed(grpc.StatusCode.UNAVAILABLE, "gone"))
    for call in calls:
        with pytest.raises(AppendStreamFailed, match="gone"):
            await call
    again = asyncio.create_task(batcher.append(_request(b"w")))
    await leader.wait_sent(2)
    leader.release()
    assert (await again).base_offset == 100


async def test_a_caller_that_left_is_not_sent() -> None:
    leader = FakeLeader()
    batcher = _batcher(leader)
    first = asyncio.create_task(batcher.append(_request(b"1")))
    await leader.wait_sent(1)
    gone = asyncio.create_task(batcher.append(_request(b"gone")))
    stays = asyncio.create_task(batcher.append(_request(b"stays")))
    await asyncio.sleep(0)
    gone.cancel()
    leader.release()
    await first
    await leader.wait_sent(2)
    assert list(leader.sent[1].values) == [b"stays"]
    leader.release()
    assert (await stays).base_offset == 101


def test_only_requests_the_leader_would_take_are_batchable() -> None:
    batcher = _batcher(FakeLeader(), max_values=2)
    assert batcher.batchable(_request(b"a", b"b"))
    assert not batcher.batchable(_request())
    assert not batcher.batchable(_request(b"a", b"b", b"c"))
    assert not batcher.batchable(_request(b"a", cluster_id="other"))


def test_an_answer_whose_offsets_do_not_cover_the_batch_is_refused() -> None:
    wrong = raft_pb2.TestAppendResponse(error_code=0, base_offset=5, last_offset=5)

    class _P:
        def __init__(self, n: int) -> None:
            self.request = _request(*[b"x"] * n)

    with pytest.raises(RuntimeError, match=r"offsets 5\.\.5"):
        split_answer(wrong, [_P(1), _P(1)])  # type: ignore[list-item]


def test_method_shapes_come_from_the_descriptors() -> None:
    shapes = method_shapes()
    assert not shapes[APPEND_METHOD].client_streaming and not shapes[APPEND_METHOD].server_streaming
    stream = shapes["/kraft.v1.RaftTestService/TestAppendStream"]
    assert stream.client_streaming and stream.server_streaming
    assert "/kraft.v1.RaftService/Fetch" in shapes
    assert (
        "/grpc.health.v1.Health/Watch" in shapes and shapes["/grpc.health.v1.Health/Watch"].server_streaming
    )
    assert any(name.startswith("/kraft.v1.ControllerService/") for name in shapes)


# --- the proxy against a fake upstream ---

UNARY = "/kraft.v1.RaftService/Vote"
SERVER_STREAM = "/grpc.health.v1.Health/Watch"
CLIENT_STREAM = "/kraft.v1.FakeClientStream/Take"  # not a real method: routed by the test's handler
BIDI = "/kraft.v1.RaftTestService/TestAppendStream"


class FakeUpstream(grpc.GenericRpcHandler):  # type: ignore[type-arg]
    """Echoes bytes with a prefix; sees the metadata; fails on request ``fail``."""

    def __init__(self) -> None:
        self.metadata: list[tuple[tuple[str, Any], ...]] = []
        self.deadlines: list[float | None] = []
        self.appends: list[raft_pb2.TestAppendRequest] = []
        self.intake: IntakeHandler | None = None  # the intake handler in front of it (its counters)

    def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler[Any, Any] | None:
        if details.method == UNARY:
            return grpc.unary_unary_rpc_method_handler(self._unary)
        if details.method == SERVER_STREAM:
            return grpc.unary_stream_rpc_method_handler(self._server_stream)
        if details.method == BIDI:
            return grpc.stream_stream_rpc_method_handler(self._bidi)
        return None

    async def _unary(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self.metadata.append(tuple(context.invocation_metadata() or ()))
        self.deadlines.append(context.time_remaining())
        if request == b"fail":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "no", (("why", "because"),))
        context.set_trailing_metadata((("trailer", "t"),))
        return b"up:" + request

    async def _server_stream(
        self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        for index in range(3):
            yield b"%d:" % index + request
        if request == b"fail":
            await context.abort(grpc.StatusCode.RESOURCE_EXHAUSTED, "stream failed")

    async def _bidi(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        offset = 0
        async for raw in requests:
            request = raft_pb2.TestAppendRequest.FromString(raw)
            self.appends.append(request)
            count = len(request.values)
            yield raft_pb2.TestAppendResponse(
                error_code=0, base_offset=offset, last_offset=offset + count - 1
            ).SerializeToString()
            offset += count


@pytest.fixture
async def proxied(tmp_path: Path) -> AsyncIterator[tuple[grpc.aio.Channel, FakeUpstream]]:
    upstream_handler = FakeUpstream()
    upstream_server = grpc.aio.server()
    upstream_server.add_generic_rpc_handlers([upstream_handler])
    path = tmp_path / "up.sock"
    assert upstream_server.add_insecure_port(f"unix:{path}") != 0
    await upstream_server.start()
    upstream = Upstream(str(path), 1 << 20)
    stream = AppendStream(upstream.append)
    batcher = AppendBatcher(stream.send, cluster_id=CLUSTER, max_values=1000, max_bytes=1 << 20)
    intake = grpc.aio.server()
    upstream_handler.intake = IntakeHandler(Proxy(upstream), batcher)
    intake.add_generic_rpc_handlers([upstream_handler.intake])
    port = intake.add_insecure_port(f"127.0.0.1:{free_port()}")
    await intake.start()
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
    try:
        yield channel, upstream_handler
    finally:
        await channel.close(None)
        await intake.stop(None)
        stream.close()
        await upstream.close()
        await upstream_server.stop(None)


async def test_unary_calls_are_proxied_with_metadata_deadline_status_and_trailers(
    proxied: tuple[grpc.aio.Channel, FakeUpstream],
) -> None:
    channel, upstream = proxied
    call = channel.unary_unary(UNARY, None, None)(b"hello", metadata=(("x-who", "me"),), timeout=7)
    assert await call == b"up:hello"
    assert ("trailer", "t") in tuple(await call.trailing_metadata())
    assert ("x-who", "me") in upstream.metadata[0]
    # the caller's user-agent stays behind (the forwarding channel sends its own, once)
    assert [key for key, _ in upstream.metadata[0]].count("user-agent") == 1
    deadline = upstream.deadlines[0]
    # propagated (not None: no deadline), to within grpc-timeout's encoding, which rounds each hop's
    # remaining time up to a coarser unit (seen: 7.009 s at the upstream for a 7 s deadline)
    assert deadline is not None and 0 < deadline <= 7.5
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await channel.unary_unary(UNARY, None, None)(b"fail", timeout=TIMEOUT_S)
    assert failed.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert failed.value.details() == "no"
    trailing: tuple[Any, ...] = tuple(failed.value.trailing_metadata() or ())
    assert ("why", "because") in trailing


async def test_server_streams_are_proxied_item_by_item_with_their_status(
    proxied: tuple[grpc.aio.Channel, FakeUpstream],
) -> None:
    channel, _ = proxied
    items = [item async for item in channel.unary_stream(SERVER_STREAM, None, None)(b"s", timeout=TIMEOUT_S)]
    assert items == [b"0:s", b"1:s", b"2:s"]
    call = channel.unary_stream(SERVER_STREAM, None, None)(b"fail", timeout=TIMEOUT_S)
    seen = []
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        async for item in call:
            seen.append(item)
    assert seen == [b"0:fail", b"1:fail", b"2:fail"]
    assert failed.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED


async def test_a_proxied_stream_counts_one_call_and_every_answer(
    proxied: tuple[grpc.aio.Channel, FakeUpstream],
) -> None:
    """A BrokerHeartbeatStream through an intake process is ONE proxied call carrying a heartbeat per
    message: ``proxied_answers`` counts the messages, so kraft_intake_* do not read a broker's heartbeats as
    one call per leader change; exported by the node's sink as they grow."""
    channel, upstream = proxied
    assert upstream.intake is not None
    before = upstream.intake.counters(0)
    items = [item async for item in channel.unary_stream(SERVER_STREAM, None, None)(b"s", timeout=TIMEOUT_S)]
    counters = upstream.intake.counters(0)
    assert len(items) == 3
    grown = (counters.proxied_calls - before.proxied_calls, counters.proxied_answers - before.proxied_answers)
    assert grown == (1, 3)
    sink = IntakeCounterSink("proxied-answers-test")
    sink.report(counters)
    exported = INTAKE_COUNTERS["proxied_answers"].labels("proxied-answers-test", "0")._value.get()
    assert exported == counters.proxied_answers


async def test_bidi_streams_are_proxied_and_unknown_methods_are_unimplemented(
    proxied: tuple[grpc.aio.Channel, FakeUpstream],
) -> None:
    channel, _ = proxied
    call = channel.stream_stream(
        BIDI,
        raft_pb2.TestAppendRequest.SerializeToString,
        raft_pb2.TestAppendResponse.FromString,
    )(None, timeout=TIMEOUT_S)
    await call.write(_request(b"a", b"b"))
    first = await call.read()
    await call.write(_request(b"c"))
    second = await call.read()
    assert isinstance(first, raft_pb2.TestAppendResponse)
    assert isinstance(second, raft_pb2.TestAppendResponse)
    await call.done_writing()
    assert (first.base_offset, first.last_offset, second.base_offset) == (0, 1, 2)
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await channel.unary_unary(CLIENT_STREAM, None, None)(b"x", timeout=TIMEOUT_S)
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_test_appends_from_many_callers_reach_the_upstream_batched(
    proxied: tuple[grpc.aio.Channel, FakeUpstream],
) -> None:
    channel, upstream = proxied
    append = channel.unary_unary(
        APPEND_METHOD, raft_pb2.TestAppendRequest.SerializeToString, raft_pb2.TestAppendResponse.FromString
    )
    answers = await asyncio.gather(
        *(append(_request(*[b"%d" % i] * (1 + i % 3)), timeout=TIMEOUT_S) for i in range(30))
    )
    offsets = sorted(o for a in answers for o in range(a.base_offset, a.last_offset + 1))
    assert offsets == list(range(sum(1 + i % 3 for i in range(30))))
    for index, answer in enumerate(answers):
        assert answer.last_offset - answer.base_offset + 1 == 1 + index % 3
    assert len(upstream.appends) < 30, "concurrent callers share batches"
    # a request the leader would refuse is not batched: proxied alone as a unary call
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await append(_request(b"x", cluster_id="other"), timeout=TIMEOUT_S)
    assert failed.value.code() == grpc.StatusCode.UNIMPLEMENTED  # the fake upstream has no TestAppend


async def test_append_stream_messages_join_the_unary_calls_batches_and_answer_in_order(
    proxied: tuple[grpc.aio.Channel, FakeUpstream],
) -> None:
    # TestAppendStream is answered by the intake process, each message through the batcher (as the main
    # process answers it: TestAppend per message, in order), not passed through message by message
    channel, upstream = proxied
    open_stream = channel.stream_stream(
        BIDI, raft_pb2.TestAppendRequest.SerializeToString, raft_pb2.TestAppendResponse.FromString
    )
    append = channel.unary_unary(
        APPEND_METHOD, raft_pb2.TestAppendRequest.SerializeToString, raft_pb2.TestAppendResponse.FromString
    )

    async def stream_client(index: int) -> list[tuple[int, int]]:
        call = open_stream(None, timeout=TIMEOUT_S)
        got = []
        for round_ in range(3):
            await call.write(_request(*[b"s%d-%d" % (index, round_)] * (1 + index % 2)))
            answer = await call.read()
            assert isinstance(answer, raft_pb2.TestAppendResponse)
            got.append((answer.base_offset, answer.last_offset))
        await call.done_writing()
        return got

    streams, unary = await asyncio.gather(
        asyncio.gather(*(stream_client(i) for i in range(8))),
        asyncio.gather(*(append(_request(b"u%d" % i), timeout=TIMEOUT_S) for i in range(8))),
    )
    for index, got in enumerate(streams):
        assert all(last - base + 1 == 1 + index % 2 for base, last in got)
        assert [base for base, _ in got] == sorted(base for base, _ in got), "in order"
    offsets = sorted(
        [o for got in streams for base, last in got for o in range(base, last + 1)]
        + [o for a in unary for o in range(a.base_offset, a.last_offset + 1)]
    )
    assert offsets == list(range(len(offsets))), "every value its own offset, none twice"
    assert len(upstream.appends) < 8 * 3 + 8, "stream messages and unary calls share batches"


# --- node-side checks ---


def _config(tmp_path: Path, **extra: object) -> NodeConfig:
    return NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters="1@127.0.0.1:9093",
        listeners="CONTROLLER://127.0.0.1:9093",
        metadata_log_dir=tmp_path / "meta",
        controller_intake_processes=2,
        **extra,
    )


def test_intake_processes_run_with_tls_and_an_authorizer_refuse_exclusive_on_port_0_and_are_off_by_default(
    tmp_path: Path,
) -> None:
    check_supported(_config(tmp_path))
    check_supported(_config(tmp_path, authorizer_class_name="kraft"))  # principals and hosts forwarded
    check_supported(  # TLS: the callers' identities are forwarded
        _config(
            tmp_path,
            listener_security_protocol_map="CONTROLLER:SSL",
            ssl_keystore_location=tmp_path / "controller-1.pem",
            ssl_truststore_location=tmp_path / "ca.pem",
            ssl_client_auth="required",
        )
    )
    with pytest.raises(IntakeConfigError, match="fixed CONTROLLER port"):
        check_supported(
            NodeConfig.build(
                process_roles="controller",
                node_id=1,
                controller_quorum_voters="1@127.0.0.1:9093",
                listeners="CONTROLLER://127.0.0.1:0",
                metadata_log_dir=tmp_path / "meta",
                controller_intake_processes=1,
                controller_intake_exclusive=True,
            )
        )
    default = NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters="1@127.0.0.1:9093",
        listeners="CONTROLLER://127.0.0.1:9093",
        metadata_log_dir=tmp_path / "meta",
    )
    assert default.controller_intake_processes == 0
    assert ("grpc.so_reuseport", 0) in server_options(ServerLimits())
    assert ("grpc.so_reuseport", 1) in server_options(ServerLimits(reuseport=True))


def test_intake_processes_run_on_iomgr_unless_told_otherwise_and_an_operators_experiments_win() -> None:
    iomgr = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
    assert child_environment({"PATH": "/bin"}) == {
        "PATH": "/bin",
        "KRAFT_GRPC_IO": "iomgr",
        "GRPC_EXPERIMENTS": iomgr,
    }
    # event-engine chosen for them, on a node that itself runs iomgr: the inherited experiments go
    chosen = child_environment(
        {"KRAFT_INTAKE_GRPC_IO": "event-engine", "KRAFT_GRPC_IO": "iomgr", "GRPC_EXPERIMENTS": iomgr}
    )
    assert chosen["KRAFT_GRPC_IO"] == "event-engine" and "GRPC_EXPERIMENTS" not in chosen
    assert child_environment({"GRPC_EXPERIMENTS": "mine"})["GRPC_EXPERIMENTS"] == "mine"
    with pytest.raises(IntakeConfigError, match="KRAFT_INTAKE_GRPC_IO"):
        child_environment({"KRAFT_INTAKE_GRPC_IO": "epoll"})


def test_the_socket_directory_is_private_and_long_paths_are_refused(tmp_path: Path) -> None:
    path = socket_path(_config(tmp_path))
    path.parent.mkdir(parents=True, mode=0o755)
    path.parent.chmod(0o755)
    prepare_socket_dir(path)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    deep = tmp_path / ("d" * 120) / "node.sock"
    with pytest.raises(IntakeConfigError, match="longer than"):
        prepare_socket_dir(deep)


def test_a_port_another_process_listens_on_is_refused_before_binding_with_reuseport() -> None:
    with socket.socket() as taken:
        taken.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)  # even one that allows sharing
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        with pytest.raises(IntakeConfigError, match="cannot listen"):
            check_port_free("127.0.0.1", taken.getsockname()[1])
    check_port_free("127.0.0.1", free_port())
    check_port_free("127.0.0.1", 0)


async def test_a_server_with_reuseport_shares_its_port_with_an_intake_server() -> None:
    port = free_port()
    limits = ServerLimits(reuseport=True)
    first, second = create_server(limits), create_server(limits)
    try:
        assert first.add_insecure_port(f"127.0.0.1:{port}") == port
        assert second.add_insecure_port(f"127.0.0.1:{port}") == port
    finally:
        await first.stop(None)
        await second.stop(None)


# --- the caller's identity through an intake process ---


class FakeCallContext:
    def __init__(self, peer: str, auth: dict[str, list[bytes]], metadata: tuple[tuple[str, Any], ...] = ()):
        self._peer = peer
        self._auth = auth
        self._metadata = metadata

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata


ADMIN_TLS = {"transport_security_type": [b"ssl"], "x509_subject": [b"CN=admin,O=kraft"]}
CONTROLLER_2 = {
    "transport_security_type": [b"ssl"],
    "x509_subject": [b"CN=controller-2,O=kraft"],
    "x509_pem_cert": [b"-----BEGIN CERTIFICATE-----..."],
}


@pytest.fixture
def trusting_tls() -> Iterator[None]:
    # the default certificate-to-principal mapping, whatever an earlier test in this worker installed
    before = principal_module._extractor
    install_principal_extractor(TlsPrincipalExtractor())
    trust_intake_forwarding(tls=True)
    try:
        yield
    finally:
        stop_trusting_intake_forwarding()
        install_principal_extractor(before)


def _forged() -> tuple[tuple[str, Any], ...]:
    return ((INTAKE_AUTH_KEY, encode_auth(CONTROLLER_2)), (INTAKE_PEER_KEY, "ipv4:10.9.9.9:1"))


def test_a_forwarded_identity_is_believed_only_from_the_unix_socket(trusting_tls: None) -> None:
    # on the network port: the call's own TLS identity, whatever the metadata says
    network = FakeCallContext("ipv4:127.0.0.1:5000", ADMIN_TLS, _forged())
    assert str(principal_of(network)) == "User:CN=admin,O=kraft"
    assert peer_host(network) == "127.0.0.1"
    # from an intake process over the unix socket: the caller's, as forwarded
    local = FakeCallContext("unix:/data/intake/node.sock", {}, _forged())
    assert node_identity(principal_of(local)) == NodeIdentity(NodeRole.CONTROLLER, 2)
    assert is_tls(local) and peer_host(local) == "10.9.9.9"
    # the unix socket without a forwarded identity on a TLS node: TLS without a certificate (refused
    # wherever an identity is needed), never plaintext
    bare = FakeCallContext("unix:/data/intake/node.sock", {})
    assert principal_of(bare) == ANONYMOUS and is_tls(bare) and peer_host(bare) == ""
    garbled = FakeCallContext("unix:/x", {}, ((INTAKE_AUTH_KEY, b"{not json"),))
    assert principal_of(garbled) == ANONYMOUS and is_tls(garbled)


def test_without_intake_processes_forwarded_identity_is_ignored_even_on_the_unix_socket() -> None:
    stop_trusting_intake_forwarding()
    local = FakeCallContext("unix:/data/intake/node.sock", {}, _forged())
    assert principal_of(local) == ANONYMOUS and not is_tls(local)


def test_an_intake_process_drops_callers_intake_headers_and_forwards_its_own() -> None:
    caller = FakeCallContext(
        "ipv4:10.0.0.7:999", ADMIN_TLS, (("x-app", "1"), *_forged(), ("user-agent", "grpc-python"))
    )
    plain = dict(forwarded_metadata(caller, forward_auth=False))  # type: ignore[arg-type]
    assert plain == {"x-app": "1", INTAKE_PEER_KEY: "ipv4:10.0.0.7:999"}
    tls = forwarded_metadata(caller, forward_auth=True)  # type: ignore[arg-type]
    auth = [value for key, value in tls if key == INTAKE_AUTH_KEY]
    assert len(auth) == 1 and decode_auth(auth[0]) == ADMIN_TLS
    assert "x509_pem_cert" not in decode_auth(encode_auth(CONTROLLER_2))
