"""Batched ControllerService calls through intake processes, in-process: the intake process's
:class:`ControllerCallBatcher` (calls of one turn as one message, answers per caller as they stream back,
a failed batch failing only its unanswered callers), the node's :class:`CallBatchServicer` on a real
QuorumController (FakeRaft, manual clock): each caller's identity, ACLs and errors are its own, heartbeats
go in as one controller event and answer as they would alone, and the service refuses every call that
does not come over the unix socket — and the counters an intake process reports become metrics."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

import kraft.security.principal as principal_module
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.service import ControllerServicer
from kraft.netutil import free_port
from kraft.node.intake_batch import (
    HEARTBEAT_METHOD,
    CallBatchServicer,
    add_intake_service,
    headers_of,
)
from kraft.node.intake_process import (
    CALL_BATCH_METHOD,
    HOLD_CREATES_ENV,
    REPORT_COUNTERS_METHOD,
    BatchedCallFailed,
    ControllerCallBatcher,
    HeldTurnCallBatcher,
    Upstream,
    call_batch_opener,
    call_batcher,
)
from kraft.observability.metrics import render_metrics
from kraft.security.authorizer import AuthorizerSettings
from kraft.security.principal import (
    INTAKE_AUTH_KEY,
    INTAKE_PEER_KEY,
    TlsPrincipalExtractor,
    encode_auth,
    install_principal_extractor,
    stop_trusting_intake_forwarding,
    trust_intake_forwarding,
)
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import intake_pb2

from .fake_raft import FakeRaft
from .test_controller import CLUSTER, ENDPOINTS, activate_broker, registration, until

TIMEOUT_S = 10.0
CREATE_METHOD = "/kraft.v1.ControllerService/CreateTopics"
UNIX_PEER = "unix:/data/intake/node.sock"


# --- the intake process's side: ControllerCallBatcher against a fake node ---


class FakeBatchCall:
    """One batch sent to the :class:`FakeNode`: the answers the test streams, the callers named as left."""

    def __init__(self, request: intake_pb2.CallBatchRequest) -> None:
        self.request = request
        self.queue: asyncio.Queue[intake_pb2.CallBatchResponse | Exception | None] = asyncio.Queue()
        self.left: list[int] = []
        self.cancelled = False

    async def responses(self) -> AsyncIterator[intake_pb2.CallBatchResponse]:
        while True:
            item = await self.queue.get()
            if item is None:
                return
            if isinstance(item, Exception):
                raise item
            yield item

    async def leave(self, indices: Sequence[int]) -> None:
        self.left.extend(indices)

    def cancel(self) -> None:
        self.cancelled = True
        self.queue.put_nowait(BatchedCallFailed(grpc.StatusCode.CANCELLED, "cancelled by the intake process"))


class FakeNode:
    """An ``OpenBatch`` whose answers the test streams: ``answer(batch, index, ...)`` sends one result."""

    def __init__(self) -> None:
        self.calls: list[FakeBatchCall] = []

    @property
    def batches(self) -> list[intake_pb2.CallBatchRequest]:
        return [call.request for call in self.calls]

    def open(self, request: intake_pb2.CallBatchRequest, deadline_s: float | None) -> FakeBatchCall:
        self.calls.append(FakeBatchCall(request))
        return self.calls[-1]

    def answer(self, batch: int, *results: intake_pb2.CallResult) -> None:
        self.calls[batch].queue.put_nowait(intake_pb2.CallBatchResponse(results=list(results)))

    def end(self, batch: int, error: Exception | None = None) -> None:
        self.calls[batch].queue.put_nowait(error)

    async def wait_batches(self, count: int) -> None:
        async with asyncio.timeout(TIMEOUT_S):
            while len(self.calls) < count:  # noqa: ASYNC110 (a bounded spin over loop turns)
                await asyncio.sleep(0)


def _ok(index: int, body: bytes) -> intake_pb2.CallResult:
    return intake_pb2.CallResult(index=index, response=body)


def _calls(node: FakeNode, max_calls: int = 100) -> ControllerCallBatcher:
    return ControllerCallBatcher(node.open, max_calls=max_calls, max_bytes=1 << 20)


async def test_calls_of_one_turn_go_as_one_message_and_each_caller_gets_its_own_answer_as_it_comes() -> None:
    node = FakeNode()
    batcher = _calls(node)
    who = [(INTAKE_PEER_KEY, f"ipv4:10.0.0.{i}:1") for i in range(3)]
    callers = [
        asyncio.create_task(batcher.call(HEARTBEAT_METHOD, b"hb-%d" % i, [who[i]], 5.0)) for i in range(3)
    ]
    await node.wait_batches(1)
    sent = node.batches[0]
    assert [c.request for c in sent.calls] == [b"hb-0", b"hb-1", b"hb-2"]
    assert [c.metadata[0].value for c in sent.calls] == [value for _, value in who]  # each its own caller
    node.answer(0, _ok(2, b"two"))  # the node streams answers as they are ready, in any order
    assert await asyncio.wait_for(callers[2], TIMEOUT_S) == b"two"
    assert not callers[0].done() and not callers[1].done()
    node.answer(
        0,
        _ok(0, b"zero"),
        intake_pb2.CallResult(
            index=1, status_code=grpc.StatusCode.PERMISSION_DENIED.value[0], details="not you"
        ),
    )
    node.end(0)
    assert await asyncio.wait_for(callers[0], TIMEOUT_S) == b"zero"
    with pytest.raises(BatchedCallFailed) as refused:
        await asyncio.wait_for(callers[1], TIMEOUT_S)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED and refused.value.details == "not you"
    assert (batcher.batches, batcher.calls) == (1, 3)


async def test_a_lone_call_goes_at_once_even_while_an_earlier_batch_is_in_flight() -> None:
    node = FakeNode()
    batcher = _calls(node)
    slow = asyncio.create_task(batcher.call(CREATE_METHOD, b"big", [], None))
    await node.wait_batches(1)
    quick = asyncio.create_task(batcher.call(HEARTBEAT_METHOD, b"hb", [], 1.0))
    await node.wait_batches(2)  # not held back by the CreateTopics batch still in flight
    node.answer(1, _ok(0, b"beat"))
    node.end(1)
    assert await asyncio.wait_for(quick, TIMEOUT_S) == b"beat"
    assert not slow.done()
    node.end(0)  # ended without answering: its caller learns it, it is not left hanging
    with pytest.raises(BatchedCallFailed) as ended:
        await asyncio.wait_for(slow, TIMEOUT_S)
    assert ended.value.code == grpc.StatusCode.UNAVAILABLE


async def test_a_failed_batch_fails_only_its_unanswered_callers_and_batches_respect_the_call_limit() -> None:
    node = FakeNode()
    batcher = _calls(node, max_calls=2)
    callers = [asyncio.create_task(batcher.call(HEARTBEAT_METHOD, b"%d" % i, [], 5.0)) for i in range(3)]
    await node.wait_batches(2)
    assert [len(b.calls) for b in node.batches] == [2, 1]
    node.answer(0, _ok(0, b"first"))
    node.end(0, BatchedCallFailed(grpc.StatusCode.UNAVAILABLE, "socket closed"))
    node.answer(1, _ok(0, b"third"))
    node.end(1)
    assert await asyncio.wait_for(callers[0], TIMEOUT_S) == b"first"
    with pytest.raises(BatchedCallFailed) as failed:
        await asyncio.wait_for(callers[1], TIMEOUT_S)
    assert failed.value.details == "socket closed"
    assert await asyncio.wait_for(callers[2], TIMEOUT_S) == b"third"


async def test_a_caller_that_leaves_before_its_batch_goes_is_not_sent() -> None:
    node = FakeNode()
    batcher = _calls(node)
    gone = asyncio.create_task(batcher.call(CREATE_METHOD, b"gone", [], None))
    kept = asyncio.create_task(batcher.call(CREATE_METHOD, b"kept", [], None))
    await asyncio.sleep(0)  # both queued for the end of this turn's batch, which is not cut yet
    assert node.calls == []
    gone.cancel()
    await node.wait_batches(1)
    assert [c.request for c in node.batches[0].calls] == [b"kept"]
    node.answer(0, _ok(0, b"made"))
    node.end(0)
    assert await asyncio.wait_for(kept, TIMEOUT_S) == b"made"
    assert gone.cancelled()
    assert node.calls[0].left == [] and not node.calls[0].cancelled


async def _turns(count: int = 5) -> None:
    for _ in range(count):
        await asyncio.sleep(0)


async def test_a_held_turn_takes_every_call_until_n_creates_wait_then_batches_by_turn_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = FakeNode()
    monkeypatch.setenv(HOLD_CREATES_ENV, "3")
    batcher = call_batcher(node.open, max_calls=100, max_bytes=1 << 20)
    assert isinstance(batcher, HeldTurnCallBatcher)
    callers = [asyncio.create_task(batcher.call(CREATE_METHOD, b"c0", [], 5.0))]
    await _turns()  # turns pass: the plain batcher would have sent c0 alone by now
    callers.append(asyncio.create_task(batcher.call(HEARTBEAT_METHOD, b"hb", [], 5.0)))
    await _turns()
    callers.append(asyncio.create_task(batcher.call(CREATE_METHOD, b"c1", [], 5.0)))
    await _turns()
    assert node.calls == [], "held until the third CreateTopics"
    callers.append(asyncio.create_task(batcher.call(CREATE_METHOD, b"c2", [], 5.0)))
    await node.wait_batches(1)
    assert [c.request for c in node.batches[0].calls] == [b"c0", b"hb", b"c1", b"c2"]
    callers.append(asyncio.create_task(batcher.call(CREATE_METHOD, b"c3", [], 5.0)))
    await node.wait_batches(2)  # released: a lone call goes at the end of its turn, as before
    assert [c.request for c in node.batches[1].calls] == [b"c3"]
    node.answer(0, *(_ok(i, b"%d" % i) for i in range(4)))
    node.answer(1, _ok(0, b"4"))
    node.end(0)
    node.end(1)
    assert await asyncio.wait_for(asyncio.gather(*callers), TIMEOUT_S) == [b"0", b"1", b"2", b"3", b"4"]
    assert (batcher.batches, batcher.calls) == (2, 5)


async def test_a_held_turn_goes_after_its_bound_and_production_has_no_hold(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(HOLD_CREATES_ENV, raising=False)
    assert type(call_batcher(FakeNode().open, max_calls=1, max_bytes=1)) is ControllerCallBatcher
    node = FakeNode()
    batcher = HeldTurnCallBatcher(
        node.open, max_calls=100, max_bytes=1 << 20, hold_method=CREATE_METHOD, hold_calls=5, bound_s=0.01
    )
    lone = asyncio.create_task(batcher.call(CREATE_METHOD, b"c0", [], 5.0))
    await node.wait_batches(1)  # fewer than 5 came: sent anyway (the test that held it fails, not hangs)
    assert [c.request for c in node.batches[0].calls] == [b"c0"]
    node.answer(0, _ok(0, b"made"))
    node.end(0)
    assert await asyncio.wait_for(lone, TIMEOUT_S) == b"made"


async def test_a_caller_that_leaves_a_batch_in_flight_is_named_to_the_node_and_the_last_ends_it() -> None:
    node = FakeNode()
    batcher = _calls(node)
    callers = [asyncio.create_task(batcher.call(CREATE_METHOD, b"%d" % i, [], 5.0)) for i in range(3)]
    await node.wait_batches(1)
    sent = node.calls[0]
    node.answer(0, _ok(0, b"zero"))
    assert await asyncio.wait_for(callers[0], TIMEOUT_S) == b"zero"
    callers[2].cancel()  # its caller left (cancelled, or its deadline passed: gRPC cancels the handler)
    async with asyncio.timeout(TIMEOUT_S):
        while sent.left != [2]:  # noqa: ASYNC110 (a bounded spin over loop turns)
            await asyncio.sleep(0)
    assert not sent.cancelled  # caller 1 still waits for its answer
    callers[1].cancel()  # the last caller waiting: the whole CallBatch ends
    async with asyncio.timeout(TIMEOUT_S):
        while not sent.cancelled:  # noqa: ASYNC110 (a bounded spin over loop turns)
            await asyncio.sleep(0)
    assert sent.left == [2]  # ending the call cancels caller 1's call on the node: no message for it
    results = await asyncio.gather(*callers, return_exceptions=True)
    assert results[0] == b"zero"
    assert all(isinstance(r, asyncio.CancelledError) for r in results[1:])
    await asyncio.sleep(0)
    assert batcher._rounds == set()  # the batch's task ended with the call


# --- the node's side: CallBatchServicer on a real controller ---

BROKER_101 = {"transport_security_type": [b"ssl"], "x509_subject": [b"CN=broker-101,O=kraft"]}
BROKER_102 = {"transport_security_type": [b"ssl"], "x509_subject": [b"CN=broker-102,O=kraft"]}
ADMIN = {"transport_security_type": [b"ssl"], "x509_subject": [b"CN=admin,O=kraft"]}
STRANGER = {"transport_security_type": [b"ssl"], "x509_subject": [b"CN=stranger,O=kraft"]}


@pytest.fixture
def trusting_tls() -> Iterator[None]:
    """A TLS node with intake processes: identities forwarded on the unix socket are believed."""
    before = principal_module._extractor
    install_principal_extractor(TlsPrincipalExtractor())
    trust_intake_forwarding(tls=True)
    try:
        yield
    finally:
        stop_trusting_intake_forwarding()
        install_principal_extractor(before)


class BatchContext:
    """The node's view of one CallBatch call: its transport and what the servicer writes back."""

    def __init__(self, peer: str = UNIX_PEER) -> None:
        self._peer = peer
        self.written: list[intake_pb2.CallBatchResponse] = []

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> dict[str, list[bytes]]:
        return {}

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return ()

    async def write(self, message: intake_pb2.CallBatchResponse) -> None:
        self.written.append(message)

    async def abort(self, code: grpc.StatusCode, details: str = "") -> None:
        raise grpc.aio.AbortError(f"{code.name}: {details}")

    def results(self) -> dict[int, intake_pb2.CallResult]:
        return {r.index: r for message in self.written for r in message.results}


async def _stream(*messages: intake_pb2.CallBatchRequest) -> AsyncIterator[intake_pb2.CallBatchRequest]:
    """A CallBatch's messages as the node reads them (the batch, then any ``left`` messages)."""
    for message in messages:
        yield message


def _as(auth: dict[str, list[bytes]], peer: str = "ipv4:10.1.1.1:5000") -> list[intake_pb2.ForwardedHeader]:
    return headers_of([(INTAKE_PEER_KEY, peer), (INTAKE_AUTH_KEY, encode_auth(auth))])


def _call(method: str, request: Any, auth: dict[str, list[bytes]]) -> intake_pb2.BatchedCall:
    raw = request if isinstance(request, bytes) else request.SerializeToString()
    return intake_pb2.BatchedCall(method=method, request=raw, metadata=_as(auth))


async def _controller(settings: AuthorizerSettings | None) -> tuple[QuorumController, ControllerServicer]:
    raft = FakeRaft(1)
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000)
    controller = QuorumController(raft, CLUSTER, ENDPOINTS, options, clock=ManualClock())
    await controller.start()
    raft.elect()
    await until(lambda: controller.is_active)
    await activate_broker(controller, 1)  # topics need a broker to live on
    return controller, ControllerServicer(controller, authorizer=settings)


def _beat(broker_id: int, epoch: int) -> cpb.BrokerHeartbeatRequest:
    return cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER, broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=1 << 40
    )


def _create(name: str) -> cpb.CreateTopicsRequest:
    return cpb.CreateTopicsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatableTopic(name=name, num_partitions=1, replication_factor=1)]
    )


async def test_each_batched_call_is_answered_as_it_would_be_alone_and_heartbeats_make_one_event(
    trusting_tls: None,
) -> None:
    controller, servicer = await _controller(None)
    try:
        epochs = {}
        for broker_id in (101, 102):
            epochs[broker_id] = (await controller.register_broker(registration(broker_id))).broker_epoch
        batches = CallBatchServicer(servicer, lambda: controller, node="batch-test-1")
        events: list[int] = []
        alone = controller.broker_heartbeats

        def counted(reqs: Any) -> AsyncIterator[list[tuple[int, cpb.BrokerHeartbeatResponse]]]:
            events.append(len(reqs))
            return alone(reqs)

        controller.broker_heartbeats = counted  # type: ignore[method-assign]
        context = BatchContext()
        request = intake_pb2.CallBatchRequest(
            calls=[
                _call(
                    HEARTBEAT_METHOD, _beat(101, epochs[101]), BROKER_101
                ),  # 0: fenced → unfenced (appends)
                _call(HEARTBEAT_METHOD, _beat(102, epochs[102]), BROKER_101),  # 1: as another broker
                _call(HEARTBEAT_METHOD, b"\xff\xff not a message", BROKER_101),  # 2: undecodable
                _call(HEARTBEAT_METHOD, _beat(102, epochs[102] + 7), BROKER_102),  # 3: stale epoch
                _call(HEARTBEAT_METHOD, _beat(102, epochs[102]), BROKER_102),  # 4: fenced → unfenced
                _call(CREATE_METHOD, _create("orders"), ADMIN),  # 5: no authorizer: allowed
                _call("/kraft.v1.ControllerService/NoSuchMethod", b"", ADMIN),  # 6
            ]
        )
        await asyncio.wait_for(batches.CallBatch(_stream(request), context), TIMEOUT_S)  # type: ignore[arg-type]
        results = context.results()
        assert sorted(results) == list(range(7))
        ok = grpc.StatusCode.OK.value[0]
        first = cpb.BrokerHeartbeatResponse.FromString(results[0].response)
        assert results[0].status_code == ok and first.error_code == ErrorCode.NONE and not first.is_fenced
        assert results[1].status_code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        assert results[1].details.startswith("CLUSTER_AUTHORIZATION_FAILED: User:CN=broker-101,O=kraft")
        assert results[2].status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        stale = cpb.BrokerHeartbeatResponse.FromString(results[3].response)
        assert results[3].status_code == ok and stale.error_code == ErrorCode.STALE_BROKER_EPOCH
        fourth = cpb.BrokerHeartbeatResponse.FromString(results[4].response)
        assert fourth.error_code == ErrorCode.NONE and not fourth.is_fenced
        created = cpb.CreateTopicsResponse.FromString(results[5].response)
        assert created.error_code == ErrorCode.NONE and created.topics[0].error_code == ErrorCode.NONE
        assert results[6].status_code == grpc.StatusCode.UNIMPLEMENTED.value[0]
        assert events == [3], "the three admitted heartbeats (0, 3, 4) ran as one controller call"
        # committed as if each had come alone: both brokers unfenced, the topic exists
        image = controller.committed
        assert not image.brokers[101].fenced and not image.brokers[102].fenced and image.topic("orders")
        # a second batch of unchanged heartbeats shares one wait and answers every caller
        again = BatchContext()
        unchanged = intake_pb2.CallBatchRequest(
            calls=[
                _call(HEARTBEAT_METHOD, _beat(b, epochs[b]), BROKER_101 if b == 101 else BROKER_102)
                for b in (101, 102)
            ]
        )
        await asyncio.wait_for(batches.CallBatch(_stream(unchanged), again), TIMEOUT_S)  # type: ignore[arg-type]
        answers = [cpb.BrokerHeartbeatResponse.FromString(r.response) for r in again.results().values()]
        assert [a.error_code for a in answers] == [ErrorCode.NONE] * 2 and not any(
            a.is_fenced for a in answers
        )
        assert events == [3, 2]
    finally:
        await controller.stop()


async def test_acls_are_checked_per_caller_inside_one_batch(trusting_tls: None) -> None:
    settings = AuthorizerSettings(enabled=True, super_users=frozenset({"User:CN=admin,O=kraft"}))
    controller, servicer = await _controller(settings)
    try:
        batches = CallBatchServicer(servicer, lambda: controller, node="batch-test-2")
        context = BatchContext()
        request = intake_pb2.CallBatchRequest(
            calls=[
                _call(CREATE_METHOD, _create("mine"), ADMIN),
                _call(CREATE_METHOD, _create("theirs"), STRANGER),
                _call(HEARTBEAT_METHOD, _beat(1, 0), STRANGER),  # not a node principal: identity refused
            ]
        )
        await asyncio.wait_for(batches.CallBatch(_stream(request), context), TIMEOUT_S)  # type: ignore[arg-type]
        results = context.results()
        assert results[0].status_code == 0
        assert cpb.CreateTopicsResponse.FromString(results[0].response).topics[0].error_code == 0
        assert results[1].status_code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        assert results[1].details.startswith("TOPIC_AUTHORIZATION_FAILED: User:CN=stranger,O=kraft")
        assert results[2].status_code == grpc.StatusCode.PERMISSION_DENIED.value[0]
        committed = controller.committed
        assert committed.topic("mine") is not None and committed.topic("theirs") is None
    finally:
        await controller.stop()


async def test_without_a_controller_every_heartbeat_answers_not_controller(trusting_tls: None) -> None:
    servicer = ControllerServicer(None)
    batches = CallBatchServicer(servicer, lambda: None, node="batch-test-3")
    context = BatchContext()
    request = intake_pb2.CallBatchRequest(
        calls=[_call(HEARTBEAT_METHOD, _beat(101, 5), BROKER_101) for _ in range(3)]
    )
    await asyncio.wait_for(batches.CallBatch(_stream(request), context), TIMEOUT_S)  # type: ignore[arg-type]
    answers = [cpb.BrokerHeartbeatResponse.FromString(r.response) for r in context.results().values()]
    assert [a.error_code for a in answers] == [ErrorCode.NOT_CONTROLLER] * 3


async def test_the_intake_service_refuses_calls_from_the_network_port_and_serves_the_unix_socket(
    trusting_tls: None, tmp_path: Path
) -> None:
    batches = CallBatchServicer(ControllerServicer(None), lambda: None, node="batch-test-4")
    server = grpc.aio.server()
    add_intake_service(server, batches)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    socket = tmp_path / "node.sock"
    assert port != 0 and server.add_insecure_port(f"unix:{socket}") != 0
    await server.start()
    # a forged batch: a heartbeat vouched for as broker-101
    forged = intake_pb2.CallBatchRequest(calls=[_call(HEARTBEAT_METHOD, _beat(101, 5), BROKER_101)])
    counters = intake_pb2.IntakeCounters(index=0, append_batches=3, append_calls=10, proxied_calls=4)
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as network:
            batch = network.stream_stream(
                CALL_BATCH_METHOD,
                intake_pb2.CallBatchRequest.SerializeToString,
                intake_pb2.CallBatchResponse.FromString,
            )
            # The node refuses before it reads a message. A client still writing when that refusal
            # lands sees grpc.aio's own INTERNAL "Failed execute_batch" instead of the node's status
            # (the aio client replaces the status when a send fails), so this caller writes nothing
            # and holds its side open: what comes back is the node's answer alone.
            hold_open = asyncio.Event()

            async def silent() -> AsyncIterator[intake_pb2.CallBatchRequest]:
                await hold_open.wait()
                yield forged

            try:
                with pytest.raises(grpc.aio.AioRpcError) as refused:
                    async for _ in batch(silent(), timeout=TIMEOUT_S):
                        pass
            finally:
                hold_open.set()
            assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert "served only to this node's intake processes" in (refused.value.details() or "")
            report = network.unary_unary(
                REPORT_COUNTERS_METHOD,
                intake_pb2.IntakeCounters.SerializeToString,
                intake_pb2.IntakeCountersAck.FromString,
            )
            with pytest.raises(grpc.aio.AioRpcError) as refused_report:
                await report(counters, timeout=TIMEOUT_S)
            assert refused_report.value.code() == grpc.StatusCode.PERMISSION_DENIED
        async with grpc.aio.insecure_channel(f"unix:{socket}") as local:
            batch = local.stream_stream(
                CALL_BATCH_METHOD,
                intake_pb2.CallBatchRequest.SerializeToString,
                intake_pb2.CallBatchResponse.FromString,
            )
            answers = [
                r async for message in batch(iter([forged]), timeout=TIMEOUT_S) for r in message.results
            ]
            assert [a.status_code for a in answers] == [0]
            report = local.unary_unary(
                REPORT_COUNTERS_METHOD,
                intake_pb2.IntakeCounters.SerializeToString,
                intake_pb2.IntakeCountersAck.FromString,
            )
            await report(counters, timeout=TIMEOUT_S)
            await report(
                intake_pb2.IntakeCounters(index=0, append_batches=5, append_calls=10, proxied_calls=4),
                timeout=TIMEOUT_S,
            )
    finally:
        await server.stop(None)
    text = render_metrics()
    assert 'kraft_intake_append_batches_total{intake="0",node="batch-test-4"} 5.0' in text
    assert 'kraft_intake_append_calls_total{intake="0",node="batch-test-4"} 10.0' in text
    assert 'kraft_intake_received_batches_total{node="batch-test-4"} 1.0' in text  # the refused one not


def test_forwarded_headers_round_trip_text_and_binary() -> None:
    headers = headers_of([("x-app", "1"), (INTAKE_AUTH_KEY, b"\x00\x01")])
    assert headers[0].value == "1" and headers[1].binary_value == b"\x00\x01"


async def test_a_heartbeat_of_a_batch_is_not_held_for_another_heartbeats_later_commit() -> None:
    raft = FakeRaft(1)
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000)
    controller = QuorumController(raft, CLUSTER, ENDPOINTS, options, clock=ManualClock())
    await controller.start()
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        steady = await activate_broker(controller, 102)  # unfenced: its heartbeat changes nothing
        joining = (await controller.register_broker(registration(101))).broker_epoch  # fenced
        raft.hold_commits = True  # the joining broker's unfencing records will not commit yet
        answers = controller.broker_heartbeats([_beat(101, joining), _beat(102, steady)])
        first = await asyncio.wait_for(anext(answers), TIMEOUT_S)
        assert [index for index, _ in first] == [1]  # the steady broker's answer, while 101's is held
        assert first[0][1].error_code == ErrorCode.NONE and not first[0][1].is_fenced
        raft.release()
        second = await asyncio.wait_for(anext(answers), TIMEOUT_S)
        assert [index for index, _ in second] == [0]
        assert second[0][1].error_code == ErrorCode.NONE and not second[0][1].is_fenced
        with pytest.raises(StopAsyncIteration):
            await asyncio.wait_for(anext(answers), TIMEOUT_S)
    finally:
        await controller.stop()


async def test_a_call_whose_caller_left_is_cancelled_on_the_node_and_the_others_are_answered(
    trusting_tls: None,
) -> None:
    controller, servicer = await _controller(None)
    try:
        batches = CallBatchServicer(servicer, lambda: controller, node="batch-test-5")
        context = BatchContext()
        request = intake_pb2.CallBatchRequest(
            calls=[_call(CREATE_METHOD, _create("gone"), ADMIN), _call(CREATE_METHOD, _create("kept"), ADMIN)]
        )
        # the caller of call 0 left as the batch arrived: its CreateTopics is still queued (not run)
        left = intake_pb2.CallBatchRequest(left=[0])
        await asyncio.wait_for(batches.CallBatch(_stream(request, left), context), TIMEOUT_S)  # type: ignore[arg-type]
        results = context.results()
        assert results[0].status_code == grpc.StatusCode.CANCELLED.value[0]
        assert results[0].details == "the caller left"
        assert results[1].status_code == grpc.StatusCode.OK.value[0]
        assert cpb.CreateTopicsResponse.FromString(results[1].response).topics[0].error_code == ErrorCode.NONE
        assert sum(len(m.results) for m in context.written) == 2  # one answer per call
        committed = controller.committed
        assert committed.topic("kept") is not None
        assert committed.topic("gone") is None, "a call whose caller left before it ran must never run"
        assert 'kraft_intake_cancelled_calls_total{node="batch-test-5"} 1.0' in render_metrics()
    finally:
        await controller.stop()


async def test_over_the_unix_socket_a_caller_leaving_cancels_its_call_on_the_node(
    trusting_tls: None, tmp_path: Path
) -> None:
    """The intake process's batcher and the node's service over a real unix socket: a caller that
    leaves while its CreateTopics waits for its commit gets its call cancelled on the node; the other
    caller of the same batch is answered once the commit comes."""
    raft = FakeRaft(1)
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000)
    controller = QuorumController(raft, CLUSTER, ENDPOINTS, options, clock=ManualClock())
    await controller.start()
    server = grpc.aio.server()
    upstream: Upstream | None = None
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        await activate_broker(controller, 1)
        batches = CallBatchServicer(ControllerServicer(controller), lambda: controller, node="batch-test-6")
        add_intake_service(server, batches)
        socket = tmp_path / "node.sock"
        assert server.add_insecure_port(f"unix:{socket}") != 0
        await server.start()
        upstream = Upstream(str(socket), 4 << 20, channels=1)
        batcher = ControllerCallBatcher(call_batch_opener(upstream), max_calls=100, max_bytes=1 << 20)
        raft.hold_commits = True  # both CreateTopics wait for their commit
        who = [(INTAKE_PEER_KEY, "ipv4:10.1.1.1:5000"), (INTAKE_AUTH_KEY, encode_auth(ADMIN))]

        def create(name: str) -> asyncio.Task[bytes]:
            raw = _create(name).SerializeToString()
            return asyncio.create_task(batcher.call(CREATE_METHOD, raw, who, 30.0))

        gone = [create("gone-1"), create("gone-2")]
        kept = create("kept")
        await until(lambda: batches.counters._metrics.received_calls._value.get() >= 3, TIMEOUT_S)
        for caller in gone:  # two callers leave in the same turn: two messages on the call, one at a time
            caller.cancel()
        cancelled = batches.counters._metrics.cancelled_calls
        await until(lambda: cancelled._value.get() == 2, TIMEOUT_S)
        raft.release()
        answer = cpb.CreateTopicsResponse.FromString(await asyncio.wait_for(kept, TIMEOUT_S))
        assert answer.topics[0].error_code == ErrorCode.NONE
        assert all(caller.cancelled() for caller in gone)
    finally:
        if upstream is not None:
            await upstream.close()
        await server.stop(None)
        await controller.stop()
