"""BrokerHeartbeatStream served on the request plane's loop (kraft.node.heartbeat_stream): each message is
answered as a unary BrokerHeartbeat carrying it would be, in request order — from the fast lane when it
may, else through the main loop; NOT_CONTROLLER per message; a message for another broker's id is refused
(ending the stream with the unary call's status) even when the lane could answer it; a stream cancelled
while its heartbeat waits for a commit leaves nothing behind; and on a real node the stream is served by
the bridge (intake thread) or by the servicer (without it), over gRPC."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import grpc
import grpc.aio
import pytest

from kraft.client.channel import open_channel
from kraft.config import NodeConfig
from kraft.errors import ErrorCode
from kraft.metadata.controller import QuorumController
from kraft.metadata.heartbeat_lane import SLOW_REASONS
from kraft.metadata.service import ControllerServicer
from kraft.netutil import free_port
from kraft.node.controller import ControllerNode
from kraft.node.controller_bridge import HeartbeatBridge
from kraft.node.heartbeat_stream import HEARTBEAT_STREAM_METHOD, heartbeat_stream_handler
from kraft.node.intake import IntakeLoop
from kraft.node.metadata_layer import install_metadata_layer
from kraft.observability.metrics import CONTROLLER_HEARTBEATS_FAST_LANE, CONTROLLER_HEARTBEATS_SLOW_PATH
from kraft.observability.stall_sampler import HEARTBEAT_ARRIVAL_DELAY, ArrivalProbe, stamp_sent
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc

from .test_controller import registration, until
from .test_heartbeat_bridge import (
    Aborted,
    CallContext,
    register_broker_7,
    tls_identities,  # noqa: F401 - the fixture the tests use
)
from .test_heartbeat_lane import _beat, _controller, _unfenced

TIMEOUT_S = 10.0
T = TypeVar("T")


def _on(intake: IntakeLoop, coro: Coroutine[Any, Any, T]) -> asyncio.Future[T]:
    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, intake.loop))


class Stream:
    """One BrokerHeartbeatStream call served by the handler on the intake loop, from ``caller``."""

    def __init__(self, intake: IntakeLoop, bridge: HeartbeatBridge, caller: str) -> None:
        self._intake = intake
        self._handler = heartbeat_stream_handler(bridge).stream_stream
        self._caller = caller
        self._queue: asyncio.Queue[bytes | None] | None = None
        self._answers: Any = None

    async def open(self) -> None:
        async def setup() -> None:  # on the intake loop
            queue: asyncio.Queue[bytes | None] = asyncio.Queue()

            async def requests() -> AsyncIterator[bytes]:
                while (item := await queue.get()) is not None:
                    yield item

            assert self._handler is not None
            self._queue = queue
            self._answers = self._handler(requests(), CallContext(self._caller))  # type: ignore[arg-type]

        await _on(self._intake, setup())

    def send(self, *requests: cpb.BrokerHeartbeatRequest) -> asyncio.Future[list[Any]]:
        """Write ``requests`` at once (pipelined), then read as many answers (or the stream's end)."""

        async def exchange() -> list[Any]:
            assert self._queue is not None
            for request in requests:
                self._queue.put_nowait(request.SerializeToString())
            answers: list[Any] = []
            for _ in requests:
                try:
                    answers.append(await anext(self._answers))
                except (Aborted, StopAsyncIteration) as exc:
                    answers.append(exc)
                    break
            return answers

        return _on(self._intake, exchange())


async def _with_lane() -> tuple[Any, QuorumController, ControllerServicer]:
    raft, controller, _clock, _lease = await _controller()
    return raft, controller, ControllerServicer(controller)


@pytest.mark.usefixtures("tls_identities")
async def test_messages_answered_in_order_from_the_lane_or_the_main_loop() -> None:
    _, controller, servicer = await _with_lane()
    intake = IntakeLoop(name="test-heartbeat-stream")
    intake.start()
    try:
        epoch = await _unfenced(controller, 101)
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        stream = Stream(intake, bridge, "broker-101")
        await stream.open()
        # pipelined: a stale epoch (not steady: the main loop answers it) before a steady one (the lane
        # could answer it at once) — the answers still come in request order
        stale, steady = _beat(101, epoch + 5), _beat(101, epoch)
        answers = await asyncio.wait_for(stream.send(stale, steady), TIMEOUT_S)
        assert [a.error_code for a in answers] == [ErrorCode.STALE_BROKER_EPOCH, ErrorCode.NONE]
        assert (bridge.calls, bridge.fast) == (1, 1), "the stale one crossed to the main loop, not the steady"
        again = await asyncio.wait_for(stream.send(steady, steady), TIMEOUT_S)
        assert [a.error_code for a in again] == [ErrorCode.NONE] * 2 and not any(a.is_fenced for a in again)
        assert (bridge.calls, bridge.fast) == (1, 3), "steady heartbeats never reach the main loop"
    finally:
        intake.close()
        await controller.stop()


def _fast_and_slow() -> tuple[float, float]:
    """The controller's (node 1's) fast-lane answers and slow-path heartbeats (all reasons) so far."""
    fast = CONTROLLER_HEARTBEATS_FAST_LANE.labels("1")._value.get()
    slow = sum(CONTROLLER_HEARTBEATS_SLOW_PATH.labels("1", reason)._value.get() for reason in SLOW_REASONS)
    return fast, slow


@pytest.mark.usefixtures("tls_identities")
async def test_every_message_counts_as_a_heartbeat_and_reaches_the_arrival_probe() -> None:
    """The heartbeat series count messages, not streams (one stream, five heartbeats): each steady message
    one fast-lane answer, the stale one one slow-path heartbeat; and each message that carries its send
    time (in the message: the stream's metadata is sent once) is timed to its arrival."""
    _, controller, servicer = await _with_lane()
    intake = IntakeLoop(name="test-heartbeat-stream")
    intake.start()
    try:
        epoch = await _unfenced(controller, 101)
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        bridge.message_probe = ArrivalProbe("stream-test").message
        arrivals = HEARTBEAT_ARRIVAL_DELAY.labels("stream-test")
        stream = Stream(intake, bridge, "broker-101")
        await stream.open()
        stamped = [_beat(101, epoch) for _ in range(3)]
        stale = _beat(101, epoch + 5)
        for request in (*stamped, stale):
            stamp_sent(request)
        before, observed = _fast_and_slow(), _observations(arrivals)
        answers = await asyncio.wait_for(stream.send(*stamped, _beat(101, epoch), stale), TIMEOUT_S)
        assert [a.error_code for a in answers] == [ErrorCode.NONE] * 4 + [ErrorCode.STALE_BROKER_EPOCH]
        fast, slow = _fast_and_slow()
        assert (fast - before[0], slow - before[1]) == (4, 1), "one count per message"
        assert _observations(arrivals) - observed == 4, "each stamped message timed, the plain one not"
    finally:
        intake.close()
        await controller.stop()


def _observations(histogram: Any) -> float:
    return float(sum(bucket.get() for bucket in histogram._buckets))


@pytest.mark.usefixtures("tls_identities")
async def test_a_steady_message_is_not_answered_before_the_one_ahead_of_it() -> None:
    raft, controller, servicer = await _with_lane()
    intake = IntakeLoop(name="test-heartbeat-stream-order")
    intake.start()
    try:
        fenced = (await controller.register_broker(registration(101))).broker_epoch
        steady = await _unfenced(controller, 102)
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        stream = Stream(intake, bridge, "admin")  # no node identity, no authorizer: may speak for both
        await stream.open()
        raft.hold_commits = True  # 101's unfence record waits for release()
        both = stream.send(_beat(101, fenced), _beat(102, steady))
        await until(lambda: bridge.calls == 1 and len(bridge._running) == 1, TIMEOUT_S)
        await asyncio.sleep(0.05)  # time for a wrong handler to answer 102 ahead of 101
        assert bridge.fast == 0 and not both.done(), "102 is not taken while 101 waits"
        raft.release()
        answers = await asyncio.wait_for(both, TIMEOUT_S)
        assert [a.error_code for a in answers] == [ErrorCode.NONE, ErrorCode.NONE]
        assert not answers[0].is_fenced and bridge.fast == 1
    finally:
        intake.close()
        await controller.stop()


@pytest.mark.usefixtures("tls_identities")
async def test_each_message_is_checked_for_its_broker_id_and_a_refusal_ends_the_stream() -> None:
    _, controller, servicer = await _with_lane()
    intake = IntakeLoop(name="test-heartbeat-stream-auth")
    intake.start()
    try:
        epochs = {b: await _unfenced(controller, b) for b in (101, 102)}
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        stream = Stream(intake, bridge, "broker-101")
        await stream.open()
        # broker 102 is steady (the lane could answer), but this stream's caller is broker 101
        answers = await asyncio.wait_for(
            stream.send(_beat(101, epochs[101]), _beat(102, epochs[102]), _beat(101, epochs[101])), TIMEOUT_S
        )
        assert answers[0].error_code == ErrorCode.NONE
        assert isinstance(answers[1], Aborted) and answers[1].code == grpc.StatusCode.PERMISSION_DENIED
        assert answers[1].details.startswith("CLUSTER_AUTHORIZATION_FAILED: User:CN=broker-101,O=kraft")
        assert len(answers) == 2, "the refusal ended the stream"
        assert bridge.fast == 1
    finally:
        intake.close()
        await controller.stop()


@pytest.mark.usefixtures("tls_identities")
async def test_without_a_controller_each_message_answers_not_controller() -> None:
    servicer = ControllerServicer(None)
    intake = IntakeLoop(name="test-heartbeat-stream-none")
    intake.start()
    try:
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: None)
        stream = Stream(intake, bridge, "broker-101")
        await stream.open()
        answers = await asyncio.wait_for(stream.send(_beat(101, 5), _beat(101, 5)), TIMEOUT_S)
        assert [a.error_code for a in answers] == [ErrorCode.NOT_CONTROLLER] * 2, "the stream goes on"
        assert all(a.controller.node_id == -1 for a in answers)
    finally:
        intake.close()


@pytest.mark.usefixtures("tls_identities")
async def test_a_stream_cancelled_while_its_heartbeat_waits_leaves_nothing_behind() -> None:
    raft, controller, servicer = await _with_lane()
    intake = IntakeLoop(name="test-heartbeat-stream-cancel")
    errors: list[dict[str, Any]] = []  # what the intake loop would log (an answer set on a cancelled call)
    intake.loop.set_exception_handler(lambda _loop, context: errors.append(context))
    intake.start()
    try:
        epoch = (await controller.register_broker(registration(101))).broker_epoch  # fenced
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        stream = Stream(intake, bridge, "broker-101")
        await stream.open()
        raft.hold_commits = True  # the unfence record is appended, never committed until release()
        waiting = stream.send(_beat(101, epoch))
        await until(lambda: bridge.calls == 1 and not bridge._queued, TIMEOUT_S)
        assert len(bridge._running) == 1 and not waiting.done()
        waiting.cancel()  # the call is cancelled (client gone): grpc.aio cancels the handler's task
        with pytest.raises(asyncio.CancelledError):
            await waiting
        raft.release()
        await until(lambda: not bridge._running, TIMEOUT_S)
        assert not bridge._queued
        # the controller went on: the broker is unfenced, and a new stream is answered
        fresh = Stream(intake, bridge, "broker-101")
        await fresh.open()
        answers = await asyncio.wait_for(fresh.send(_beat(101, epoch)), TIMEOUT_S)
        assert answers[0].error_code == ErrorCode.NONE and not answers[0].is_fenced
        assert errors == []
    finally:
        intake.close()
        await controller.stop()


@pytest.mark.parametrize("intake_thread", [True, False])
async def test_a_real_node_serves_the_stream(tmp_path: Path, intake_thread: bool) -> None:
    """Over gRPC: with the intake thread the bridge serves it (the fast lane answers steady heartbeats),
    without it the servicer runs each message through BrokerHeartbeat; the answers are the same."""
    port = free_port()
    cluster_id = random_uuid()
    format_log_dir(tmp_path / "meta", cluster_id=cluster_id, node_id=1)
    config = NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=tmp_path / "meta",
        controller_request_intake_thread=intake_thread,
        observability_stall_sampler_ms=50,  # the arrival probe on: it times each stamped message
    )
    arrivals = HEARTBEAT_ARRIVAL_DELAY.labels("1")
    observed = _observations(arrivals)
    node = ControllerNode(config)
    layer = install_metadata_layer(node)
    await node.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = controller_pb2_grpc.ControllerServiceStub(channel)
            registered = await register_broker_7(stub, cluster_id)
            beat = cpb.BrokerHeartbeatRequest(
                cluster_id=cluster_id,
                broker_id=7,
                broker_epoch=registered.broker_epoch,
                current_metadata_offset=1 << 40,
            )
            call = channel.stream_stream(
                HEARTBEAT_STREAM_METHOD,
                request_serializer=cpb.BrokerHeartbeatRequest.SerializeToString,
                response_deserializer=cpb.BrokerHeartbeatResponse.FromString,
            )(None, timeout=TIMEOUT_S)
            answers: list[cpb.BrokerHeartbeatResponse] = []
            for sent in (beat, beat, cpb.BrokerHeartbeatRequest(cluster_id=cluster_id, broker_id=8)):
                request = cpb.BrokerHeartbeatRequest()
                request.CopyFrom(sent)  # fresh: each stamped once
                stamp_sent(request)
                await call.write(request)
                answer = await call.read()
                assert isinstance(answer, cpb.BrokerHeartbeatResponse)
                answers.append(answer)
            await call.done_writing()
            assert [a.error_code for a in answers] == [
                ErrorCode.NONE,
                ErrorCode.NONE,
                ErrorCode.STALE_BROKER_EPOCH,
            ]
            assert not answers[1].is_fenced
            assert await call.code() == grpc.StatusCode.OK
        if intake_thread:
            assert layer.heartbeats is not None and layer.heartbeats.calls + layer.heartbeats.fast == 3
            assert _observations(arrivals) - observed == 3, "the node's arrival probe timed every message"
        else:
            assert layer.heartbeats is None
    finally:
        await node.stop()
