"""BrokerHeartbeat served on the request plane's loop (kraft.node.controller_bridge.HeartbeatBridge): the
calls of one intake turn reach a real QuorumController (FakeRaft, manual clock) as ONE hand-off and one
controller event; each caller is checked (identity, ACLs) and answered on its own, a refused, undecodable
or failing call fails alone; a heartbeat is answered while a bulk operation is still being written; and
``controller.broker.heartbeats.on.intake`` picks the bridge or the per-call hop on a real node."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

import kraft.security.principal as principal_module
from kraft.client.channel import open_channel
from kraft.clock import ManualClock
from kraft.config import NodeConfig
from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.service import ControllerServicer
from kraft.netutil import free_port
from kraft.node.controller import ControllerNode
from kraft.node.controller_bridge import HeartbeatBridge, heartbeat_handler
from kraft.node.intake import IntakeLoop
from kraft.node.metadata_layer import install_metadata_layer
from kraft.security.authorizer import AuthorizerSettings
from kraft.security.principal import TlsPrincipalExtractor, install_principal_extractor
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir
from kraft.v1 import common_pb2, controller_pb2_grpc
from kraft.v1 import controller_pb2 as cpb

from .fake_raft import FakeRaft
from .test_controller import CLUSTER, ENDPOINTS, activate_broker, registration, until

TIMEOUT_S = 10.0
PEER = "ipv4:10.1.1.1:5000"


def _identity(name: str) -> dict[str, list[bytes]]:
    return {"transport_security_type": [b"ssl"], "x509_subject": [f"CN={name},O=kraft".encode()]}


@pytest.fixture
def tls_identities() -> Iterator[None]:
    """Principals from the callers' TLS subjects (``CN=broker-101`` is broker 101)."""
    before = principal_module._extractor
    install_principal_extractor(TlsPrincipalExtractor())
    try:
        yield
    finally:
        install_principal_extractor(before)


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class CallContext:
    """One gRPC call's context as the intake loop sees it: its caller's TLS identity and address."""

    def __init__(self, caller: str) -> None:
        self._auth = _identity(caller)

    def peer(self) -> str:
        return PEER

    def auth_context(self) -> dict[str, list[bytes]]:
        return self._auth

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return ()

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise Aborted(code, details)


def _beat(broker_id: int, epoch: int) -> cpb.BrokerHeartbeatRequest:
    return cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER, broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=1 << 40
    )


Call = tuple[cpb.BrokerHeartbeatRequest | bytes, str]
"""A request (or raw undecodable bytes) and its caller's TLS common name."""


def _one_turn(intake: IntakeLoop, bridge: HeartbeatBridge, calls: list[Call]) -> asyncio.Future[list[Any]]:
    """Start every call on the intake loop (through the gRPC handler, decoding included) while the main
    loop is held (this call blocks it until the decodable ones are queued), so all of them wait for the
    same hand-off; the future (on the caller's loop) gives each call's answer or exception, in call order."""
    handler = heartbeat_handler(bridge).unary_unary
    assert handler is not None
    decodable = sum(not isinstance(request, bytes) for request, _ in calls)

    async def serve(request: cpb.BrokerHeartbeatRequest | bytes, caller: str) -> Any:
        raw = request if isinstance(request, bytes) else request.SerializeToString()
        return await handler(raw, CallContext(caller))  # type: ignore[arg-type]

    async def start() -> asyncio.Future[list[Any]]:
        tasks = [asyncio.create_task(serve(request, caller)) for request, caller in calls]
        async with asyncio.timeout(TIMEOUT_S):
            while len(bridge._queued) < decodable:  # noqa: ASYNC110 - each sleep lets one task queue
                await asyncio.sleep(0)
        return asyncio.gather(*tasks, return_exceptions=True)

    gathered = asyncio.run_coroutine_threadsafe(start(), intake.loop).result(TIMEOUT_S)

    async def answers() -> list[Any]:
        return await gathered

    return asyncio.wrap_future(asyncio.run_coroutine_threadsafe(answers(), intake.loop))


async def _controller(
    settings: AuthorizerSettings | None = None, options: ControllerOptions | None = None
) -> tuple[FakeRaft, QuorumController, ControllerServicer]:
    raft = FakeRaft(1)
    options = options or ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000)
    controller = QuorumController(raft, CLUSTER, ENDPOINTS, options, clock=ManualClock())
    await controller.start()
    raft.elect()
    await until(lambda: controller.is_active)
    await activate_broker(controller, 1)
    return raft, controller, ControllerServicer(controller, authorizer=settings)


def _counting_events(controller: QuorumController) -> list[int]:
    """The heartbeats of each ``broker_heartbeats`` call (one controller event each)."""
    events: list[int] = []
    alone = controller.broker_heartbeats

    def counted(reqs: Any) -> AsyncIterator[list[tuple[int, cpb.BrokerHeartbeatResponse]]]:
        events.append(len(reqs))
        return alone(reqs)

    controller.broker_heartbeats = counted  # type: ignore[method-assign]
    return events


async def test_calls_of_one_turn_are_one_handoff_and_one_event_each_answered_on_its_own(
    tls_identities: None,
) -> None:
    _, controller, servicer = await _controller()
    intake = IntakeLoop(name="test-heartbeat-bridge")
    intake.start()
    try:
        epochs = {b: (await controller.register_broker(registration(b))).broker_epoch for b in (101, 102)}
        events = _counting_events(controller)
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        answers = await asyncio.wait_for(
            _one_turn(
                intake,
                bridge,
                [
                    (_beat(102, epochs[102] + 7), "broker-102"),  # 0: stale epoch: its own error code
                    (_beat(101, epochs[101]), "broker-101"),  # 1: fenced -> unfenced (appends)
                    (_beat(102, epochs[102]), "broker-101"),  # 2: as another broker: refused alone
                    (b"\xff\xff not a message", "broker-101"),  # 3: undecodable: refused alone
                    (_beat(102, epochs[102]), "broker-102"),  # 4: fenced -> unfenced
                ],
            ),
            TIMEOUT_S,
        )
        assert isinstance(answers[0], cpb.BrokerHeartbeatResponse)
        assert answers[0].error_code == ErrorCode.STALE_BROKER_EPOCH
        assert isinstance(answers[1], cpb.BrokerHeartbeatResponse)
        assert answers[1].error_code == ErrorCode.NONE and not answers[1].is_fenced
        assert isinstance(answers[2], Aborted) and answers[2].code == grpc.StatusCode.PERMISSION_DENIED
        assert answers[2].details.startswith("CLUSTER_AUTHORIZATION_FAILED: User:CN=broker-101,O=kraft")
        assert isinstance(answers[3], Aborted) and answers[3].code == grpc.StatusCode.INVALID_ARGUMENT
        assert isinstance(answers[4], cpb.BrokerHeartbeatResponse)
        assert answers[4].error_code == ErrorCode.NONE and not answers[4].is_fenced
        assert (bridge.handoffs, bridge.calls) == (1, 4), "the decoded calls crossed to the main loop once"
        assert events == [3], "the admitted heartbeats (0, 1, 4) ran as one controller event"
        image = controller.committed
        assert not image.brokers[101].fenced and not image.brokers[102].fenced
        # unchanged heartbeats: answered without records, again one hand-off
        again = await asyncio.wait_for(
            _one_turn(intake, bridge, [(_beat(b, epochs[b]), f"broker-{b}") for b in (101, 102, 101)]),
            TIMEOUT_S,
        )
        assert [a.error_code for a in again] == [ErrorCode.NONE] * 3 and not any(a.is_fenced for a in again)
        assert (bridge.handoffs, events) == (2, [3, 3])
    finally:
        intake.close()
        await controller.stop()


async def test_acls_per_call_and_a_failing_event_fails_only_its_waiting_calls(tls_identities: None) -> None:
    settings = AuthorizerSettings(enabled=True, super_users=frozenset({"User:CN=admin,O=kraft"}))
    _, controller, servicer = await _controller(settings)
    intake = IntakeLoop(name="test-heartbeat-bridge-acl")
    intake.start()
    try:
        epoch = (await controller.register_broker(registration(101))).broker_epoch
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        answers = await asyncio.wait_for(
            _one_turn(
                intake,
                bridge,
                [(_beat(101, epoch), "stranger"), (_beat(101, epoch), "admin")],  # no node principal / super
            ),
            TIMEOUT_S,
        )
        assert isinstance(answers[0], Aborted) and answers[0].code == grpc.StatusCode.PERMISSION_DENIED
        assert "is not a node principal" in answers[0].details
        assert isinstance(answers[1], cpb.BrokerHeartbeatResponse) and answers[1].error_code == ErrorCode.NONE

        async def broken(reqs: Any) -> AsyncIterator[list[tuple[int, cpb.BrokerHeartbeatResponse]]]:
            yield [(0, cpb.BrokerHeartbeatResponse())]  # the first is answered, then the event fails
            raise RuntimeError("boom")

        controller.broker_heartbeats = broken  # type: ignore[method-assign]
        failed = await asyncio.wait_for(
            _one_turn(
                intake,
                bridge,
                [(_beat(101, epoch), "admin"), (_beat(101, epoch), "stranger"), (_beat(101, epoch), "admin")],
            ),
            TIMEOUT_S,
        )
        assert isinstance(failed[0], cpb.BrokerHeartbeatResponse)  # answered before the failure
        assert isinstance(failed[1], Aborted) and failed[1].code == grpc.StatusCode.PERMISSION_DENIED
        assert isinstance(failed[2], Aborted) and failed[2].code == grpc_status_for(
            ErrorCode.UNKNOWN_SERVER_ERROR
        )
        assert failed[2].details == "RuntimeError: boom"
    finally:
        intake.close()
        await controller.stop()


async def test_without_a_controller_each_call_answers_not_controller(tls_identities: None) -> None:
    servicer = ControllerServicer(None)
    intake = IntakeLoop(name="test-heartbeat-bridge-none")
    intake.start()
    try:
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: None)
        answers = await asyncio.wait_for(
            _one_turn(intake, bridge, [(_beat(101, 5), "broker-101"), (_beat(102, 5), "broker-101")]),
            TIMEOUT_S,
        )
        assert isinstance(answers[0], cpb.BrokerHeartbeatResponse)
        assert answers[0].error_code == ErrorCode.NOT_CONTROLLER and answers[0].controller.node_id == -1
        assert isinstance(answers[1], Aborted) and answers[1].code == grpc.StatusCode.PERMISSION_DENIED
    finally:
        intake.close()


async def test_a_heartbeat_is_answered_while_a_bulk_creation_is_still_being_written(
    tls_identities: None,
) -> None:
    # 20,000 partitions in work units of 50 records: hundreds of events of the creation
    options = ControllerOptions(
        noop_interval_ms=0, session_timeout_ms=60_000, max_work_unit_records=50, max_broker_partitions=100_000
    )
    raft, controller, servicer = await _controller(options=options)
    intake = IntakeLoop(name="test-heartbeat-bridge-bulk")
    intake.start()
    try:
        epoch = await activate_broker(controller, 101)  # registered and unfenced, committed
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        topic = cpb.CreatableTopic(name="big", num_partitions=20_000, replication_factor=1)
        create = asyncio.create_task(
            controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]))
        )
        await until(lambda: controller.writes.next_offset > 200 or create.done(), TIMEOUT_S)
        # the creation is under way, and from now on none of its slices commits: it cannot end before
        # release(), while a heartbeat that changes nothing waits only for its broker's own records
        raft.hold_commits = True
        assert not create.done(), create.result()
        answers = await asyncio.wait_for(
            _one_turn(intake, bridge, [(_beat(101, epoch), "broker-101")]), TIMEOUT_S
        )
        assert isinstance(answers[0], cpb.BrokerHeartbeatResponse) and answers[0].error_code == ErrorCode.NONE
        assert not answers[0].is_fenced
        assert not create.done()
        raft.release()
        created = await asyncio.wait_for(create, 60.0)
        assert created.topics[0].error_code == ErrorCode.NONE
    finally:
        intake.close()
        await controller.stop()


@pytest.mark.parametrize("on_intake", [True, False])
async def test_the_config_switch_picks_the_bridge_or_the_hop(tmp_path: Path, on_intake: bool) -> None:
    """``controller.broker.heartbeats.on.intake`` on a real node: on, BrokerHeartbeat goes through the
    bridge; off, it hops to the main loop per call; the answers are the same, other methods hop either way."""
    port = free_port()
    cluster_id = random_uuid()
    format_log_dir(tmp_path / "meta", cluster_id=cluster_id, node_id=1)
    config = NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=tmp_path / "meta",
        controller_broker_heartbeats_on_intake=on_intake,
        # This switch alone: the fast lane (on by default) installs the bridge whatever it says and
        # answers steady heartbeats before the bridge counts them (test_heartbeat_lane.py covers it).
        controller_broker_heartbeats_fast_lane=False,
    )
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
            answers = await asyncio.gather(*(stub.BrokerHeartbeat(beat, timeout=TIMEOUT_S) for _ in range(3)))
            assert all(a.error_code == ErrorCode.NONE for a in answers)
            again = await stub.BrokerHeartbeat(beat, timeout=TIMEOUT_S)
            assert again.error_code == ErrorCode.NONE and not again.is_fenced
            with pytest.raises(grpc.aio.AioRpcError) as bad:
                await channel.unary_unary(
                    "/kraft.v1.ControllerService/BrokerHeartbeat",
                    request_serializer=lambda raw: raw,
                    response_deserializer=cpb.BrokerHeartbeatResponse.FromString,
                )(b"\xff\xff not a message", timeout=TIMEOUT_S)
            assert bad.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        if on_intake:
            assert layer.heartbeats is not None and layer.heartbeats.calls == 4
        else:
            assert layer.heartbeats is None
    finally:
        await node.stop()


async def register_broker_7(stub: Any, cluster_id: str) -> cpb.RegisterBrokerResponse:
    """Registers broker 7 through ``stub`` (a grpc.aio ControllerService stub) on a real single-voter
    node, retrying until it has elected itself and activated (system clock, bounded by TIMEOUT_S)."""
    register = cpb.RegisterBrokerRequest(
        cluster_id=cluster_id,
        broker_id=7,
        incarnation_id="i7",
        listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9007)],
    )
    deadline = time.monotonic() + TIMEOUT_S
    while True:
        registered = await stub.RegisterBroker(register, timeout=TIMEOUT_S)
        if registered.error_code == ErrorCode.NONE or time.monotonic() > deadline:
            break
        await asyncio.sleep(0.01)
    assert isinstance(registered, cpb.RegisterBrokerResponse) and registered.error_code == ErrorCode.NONE
    return registered
