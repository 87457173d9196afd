"""NOT_CONTROLLER (nothing was done) versus REQUEST_TIMED_OUT (outcome unknown), and failing fast.

Against in-process gRPC servers: a write whose outcome is unknown is never resent blindly; CreateTopics,
DeleteTopics and UnregisterBroker are resent and reconciled (a retried create does not report
TOPIC_ALREADY_EXISTS for the topic it created itself); a dead bootstrap address and a broker given as a
controller fail within seconds, naming the address."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from kraft.client.admin import (
    AdminClient,
    ControllerUnreachable,
    NotAController,
    WriteOutcomeUnknown,
    matches_spec,
)
from kraft.client.controller import ControllerClient
from kraft.clock import ManualClock, SystemClock
from kraft.errors import ErrorCode, KraftError
from kraft.netutil import free_port
from kraft.v1 import broker_pb2 as bpb
from kraft.v1 import broker_pb2_grpc, controller_pb2_grpc
from kraft.v1 import controller_pb2 as cpb
from kraft.v1.common_pb2 import NodeRef

DEPOSED = NodeRef(node_id=-1)


CLUSTER_ID = "outcomes-cluster"


class _Controller(controller_pb2_grpc.ControllerServiceServicer):
    """Creates/deletes topics in a dict; the first ``unknown`` writes answer REQUEST_TIMED_OUT *after*
    applying them (an append that committed under the next leader), as a deposed controller does."""

    def __init__(self, unknown: int = 0, hold_creates: bool = False) -> None:
        self.topics: dict[str, cpb.TopicDescription] = {}
        self.registered = {101}
        self.unknown = unknown
        # Set: a CreateTopics is answered only once the test releases it (bounded by a minute).
        self.create_released: asyncio.Event | None = asyncio.Event() if hold_creates else None
        self.calls: dict[str, int] = {}

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1

    def _deposed(self) -> bool:
        if self.unknown > 0:
            self.unknown -= 1
            return True
        return False

    async def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: Any
    ) -> cpb.DescribeClusterResponse:
        # The client learns the cluster id here before its first request (controllers refuse an empty one);
        # not counted in ``calls``, which are about the writes.
        return cpb.DescribeClusterResponse(cluster_id=CLUSTER_ID)

    async def CreateTopics(self, request: cpb.CreateTopicsRequest, context: Any) -> cpb.CreateTopicsResponse:
        self._count("CreateTopics")
        assert request.cluster_id == CLUSTER_ID
        if self.create_released is not None:
            await asyncio.wait_for(self.create_released.wait(), timeout=60)
        response = cpb.CreateTopicsResponse()
        for topic in request.topics:
            if topic.name in self.topics:
                response.topics.append(
                    cpb.CreatableTopicResult(name=topic.name, error_code=ErrorCode.TOPIC_ALREADY_EXISTS)
                )
                continue
            self.topics[topic.name] = cpb.TopicDescription(
                name=topic.name,
                topic_id=f"id-{topic.name}",
                configs=list(topic.configs),
                partitions=[
                    cpb.PartitionDescription(
                        partition=p, leader=101, replicas=[101, 102][: topic.replication_factor]
                    )
                    for p in range(topic.num_partitions)
                ],
            )
            response.topics.append(cpb.CreatableTopicResult(name=topic.name, topic_id=f"id-{topic.name}"))
        if self._deposed():
            return cpb.CreateTopicsResponse(
                error_code=ErrorCode.REQUEST_TIMED_OUT, error_message="lost leadership", controller=DEPOSED
            )
        return response

    async def DeleteTopics(self, request: cpb.DeleteTopicsRequest, context: Any) -> cpb.DeleteTopicsResponse:
        self._count("DeleteTopics")
        response = cpb.DeleteTopicsResponse()
        for name in request.names:
            gone = self.topics.pop(name, None) is None
            code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if gone else ErrorCode.NONE
            response.topics.append(cpb.DeletableTopicResult(name=name, error_code=code))
        if self._deposed():
            return cpb.DeleteTopicsResponse(error_code=ErrorCode.REQUEST_TIMED_OUT, controller=DEPOSED)
        return response

    async def UnregisterBroker(
        self, request: cpb.UnregisterBrokerRequest, context: Any
    ) -> cpb.UnregisterBrokerResponse:
        self._count("UnregisterBroker")
        if request.broker_id not in self.registered:
            return cpb.UnregisterBrokerResponse(error_code=ErrorCode.BROKER_ID_NOT_REGISTERED)
        self.registered.discard(request.broker_id)
        if self._deposed():
            return cpb.UnregisterBrokerResponse(error_code=ErrorCode.REQUEST_TIMED_OUT, controller=DEPOSED)
        return cpb.UnregisterBrokerResponse()

    async def DescribeTopics(
        self, request: cpb.DescribeTopicsRequest, context: Any
    ) -> cpb.DescribeTopicsResponse:
        self._count("DescribeTopics")
        names = list(request.names) or sorted(self.topics)
        return cpb.DescribeTopicsResponse(
            topics=[
                self.topics.get(n)
                or cpb.TopicDescription(name=n, error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION)
                for n in names
            ]
        )

    async def ShutdownBroker(
        self, request: cpb.ShutdownBrokerRequest, context: Any
    ) -> cpb.ShutdownBrokerResponse:
        self._count("ShutdownBroker")
        if self._deposed():
            return cpb.ShutdownBrokerResponse(
                error_code=ErrorCode.REQUEST_TIMED_OUT, controller=NodeRef(node_id=2)
            )
        return cpb.ShutdownBrokerResponse()


class _Broker(broker_pb2_grpc.BrokerServiceServicer):
    async def DescribeBroker(self, request: Any, context: Any) -> bpb.DescribeBrokerResponse:
        return bpb.DescribeBrokerResponse(broker_id=101)


def _new_controller(unknown: int = 0, hold_creates: bool = False) -> _Controller:
    return _Controller(unknown, hold_creates)  # type: ignore[abstract]


def _new_broker() -> _Broker:
    return _Broker()  # type: ignore[abstract]


async def _serve(register: Callable[[grpc.aio.Server], None]) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    register(server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def serve() -> AsyncIterator[Callable[[Callable[[grpc.aio.Server], None]], Any]]:
    servers: list[grpc.aio.Server] = []

    async def start(register: Callable[[grpc.aio.Server], None]) -> str:
        server, target = await _serve(register)
        servers.append(server)
        return target

    yield start
    for server in servers:
        await server.stop(None)


def _controller(servicer: _Controller) -> Callable[[grpc.aio.Server], None]:
    return lambda server: controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)


def _admin(targets: list[str], lines: list[str], **kwargs: Any) -> AdminClient:
    return AdminClient(targets, timeout_s=10.0, clock=SystemClock(), on_retry=lines.append, **kwargs)


def _create(name: str = "orders", partitions: int = 3, factor: int = 2) -> cpb.CreateTopicsRequest:
    topic = cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=factor)
    topic.configs.append(cpb.TopicConfig(name="retention.ms", value="1000"))
    return cpb.CreateTopicsRequest(topics=[topic])


async def test_a_create_resent_after_an_unknown_outcome_reports_its_own_topic_as_created(serve: Any) -> None:
    controller = _new_controller(unknown=1)  # the first create is applied, then answered "outcome unknown"
    lines: list[str] = []
    async with _admin([await serve(_controller(controller))], lines) as client:
        response = await client.create_topics(_create())
    result = response.topics[0]
    assert ErrorCode.from_wire(result.error_code) is ErrorCode.NONE, result.error_message
    assert (result.topic_id, result.num_partitions, result.replication_factor) == ("id-orders", 3, 2)
    assert controller.calls["CreateTopics"] == 2
    assert any("outcome unknown" in line and "resending" in line for line in lines), lines
    assert any("created by the first attempt" in line for line in lines), lines


async def test_an_existing_topic_with_another_spec_is_still_topic_already_exists(serve: Any) -> None:
    controller = _new_controller(unknown=1)
    controller.topics["orders"] = cpb.TopicDescription(
        name="orders", partitions=[cpb.PartitionDescription(partition=0, replicas=[101])]
    )
    lines: list[str] = []
    async with _admin([await serve(_controller(controller))], lines) as client:
        response = await client.create_topics(_create())
    # The first attempt found the topic already there (another client's, 1 partition): not ours.
    assert ErrorCode.from_wire(response.topics[0].error_code) is ErrorCode.TOPIC_ALREADY_EXISTS


async def test_a_create_without_an_unknown_outcome_is_sent_once(serve: Any) -> None:
    controller = _new_controller()
    controller.topics["orders"] = cpb.TopicDescription(name="orders")
    async with _admin([await serve(_controller(controller))], []) as client:
        response = await client.create_topics(_create())
    assert ErrorCode.from_wire(response.topics[0].error_code) is ErrorCode.TOPIC_ALREADY_EXISTS
    assert controller.calls == {"CreateTopics": 1}, "no DescribeTopics, no resend"


async def test_a_non_idempotent_call_is_never_resent_after_an_unknown_outcome(serve: Any) -> None:
    controller = _new_controller(unknown=5)
    async with _admin([await serve(_controller(controller))], []) as client:
        with pytest.raises(WriteOutcomeUnknown) as raised:
            await client.call(lambda s: s.CreateTopics, _create(), idempotent=False)
    assert raised.value.code is ErrorCode.REQUEST_TIMED_OUT
    assert controller.calls["CreateTopics"] == 1


async def test_a_deadline_after_sending_is_an_unknown_outcome_not_a_resend(serve: Any) -> None:
    """The controller holds the create and never answers: the attempt's own deadline (0.5 s, not the
    call's 10 s) ends it, as an unknown outcome, while the controller still holds it; it is not resent."""
    controller = _new_controller(hold_creates=True)
    released = controller.create_released
    assert released is not None
    deadlines: list[float] = []

    def create_recording_its_deadline(stub: Any) -> Callable[..., Any]:
        def send(request: cpb.CreateTopicsRequest, *, timeout: float) -> Any:
            deadlines.append(timeout)
            return stub.CreateTopics(request, timeout=timeout)

        return send

    try:
        async with AdminClient(
            [await serve(_controller(controller))], timeout_s=10.0, attempt_timeout_s=0.5, clock=SystemClock()
        ) as client:
            with pytest.raises(WriteOutcomeUnknown, match="may have been applied"):
                await client.call(create_recording_its_deadline, _create(), idempotent=False)
            assert not released.is_set() and controller.calls["CreateTopics"] == 1  # sent, never answered
    finally:
        released.set()
    assert deadlines == [0.5]  # one attempt, at the attempt timeout


async def test_delete_and_unregister_resent_after_an_unknown_outcome_succeed(serve: Any) -> None:
    controller = _new_controller(unknown=1)
    controller.topics["old"] = cpb.TopicDescription(name="old")
    lines: list[str] = []
    async with _admin([await serve(_controller(controller))], lines) as client:
        deleted = await client.delete_topics(cpb.DeleteTopicsRequest(names=["old"]))
        controller.unknown = 1
        await client.unregister_broker(cpb.UnregisterBrokerRequest(broker_id=101))
        with pytest.raises(KraftError) as missing:  # known outcome: not registered is an error
            await client.unregister_broker(cpb.UnregisterBrokerRequest(broker_id=101))
    assert ErrorCode.from_wire(deleted.topics[0].error_code) is ErrorCode.NONE
    assert controller.calls["DeleteTopics"] == 2 and controller.calls["UnregisterBroker"] == 3
    assert missing.value.code is ErrorCode.BROKER_ID_NOT_REGISTERED
    assert any("deleted by the first attempt" in line for line in lines)
    assert any("unregistered by the first attempt" in line for line in lines)


async def test_an_idempotent_call_follows_a_deposed_answer_and_a_non_idempotent_one_does_not(
    serve: Any,
) -> None:
    deposed, active = _new_controller(unknown=2), _new_controller()
    deposed_target = await serve(_controller(deposed))
    active_target = await serve(_controller(active))
    lines: list[str] = []
    client = ControllerClient([(1, deposed_target), (2, active_target)], on_retry=lines.append)
    try:
        request = cpb.ShutdownBrokerRequest(broker_id=101)
        answer = await client.call(lambda s: s.ShutdownBroker, request, 2.0)
        assert answer.error_code == ErrorCode.NONE and active.calls["ShutdownBroker"] == 1
        assert any("resending to controller 2" in line for line in lines), lines
        other = ControllerClient([(1, deposed_target), (2, active_target)])
        try:
            kept = await other.call(lambda s: s.ShutdownBroker, request, 2.0, idempotent=False)
        finally:
            await other.close()
        assert kept.error_code == ErrorCode.REQUEST_TIMED_OUT and active.calls["ShutdownBroker"] == 1
    finally:
        await client.close()


async def test_a_dead_bootstrap_address_fails_fast_and_names_the_address() -> None:
    """An address that refuses connections ends the call once it has refused for unreachable_timeout_s
    (0.5 s) of the client's clock — at the first round past it — not at the call's 30 s budget.  On a manual
    clock that only the backoff sleeps between rounds move."""
    dead = f"127.0.0.1:{free_port()}"
    clock = ManualClock(start_ms=1_000_000)
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(round(seconds * 1000))

    async with AdminClient(
        [dead], timeout_s=30.0, unreachable_timeout_s=0.5, clock=clock, sleep=sleep
    ) as client:
        with pytest.raises(ControllerUnreachable) as raised:
            await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
    assert slept, "no round was retried"
    assert sum(slept) >= 0.5 > sum(slept[:-1]), f"gave up at the wrong round: slept {slept}"
    assert dead in str(raised.value) and "controller -1" not in str(raised.value)


async def test_a_broker_given_as_controller_is_named_a_broker(serve: Any) -> None:
    broker = await serve(lambda s: broker_pb2_grpc.add_BrokerServiceServicer_to_server(_new_broker(), s))
    nothing = await serve(lambda s: None)
    async with AdminClient([broker], timeout_s=30.0, clock=SystemClock()) as client:
        with pytest.raises(NotAController, match=f"{broker} is a broker, not a controller"):
            await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
    async with AdminClient([nothing], timeout_s=30.0, clock=SystemClock()) as client:
        with pytest.raises(NotAController, match="serves no kraft ControllerService"):
            await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())


async def test_a_broker_beside_a_controller_in_the_list_is_skipped(serve: Any) -> None:
    broker = await serve(lambda s: broker_pb2_grpc.add_BrokerServiceServicer_to_server(_new_broker(), s))
    controller = _new_controller()
    controller.topics["t"] = cpb.TopicDescription(name="t")
    async with _admin([broker, await serve(_controller(controller))], []) as client:
        response = await client.call(lambda s: s.DescribeTopics, cpb.DescribeTopicsRequest())
    assert [t.name for t in response.topics] == ["t"]


@pytest.mark.parametrize(
    ("wanted", "matches"),
    [
        (cpb.CreatableTopic(name="t", num_partitions=2, replication_factor=2), True),
        (cpb.CreatableTopic(name="t", num_partitions=-1, replication_factor=-1), True),
        (cpb.CreatableTopic(name="t", num_partitions=3, replication_factor=2), False),
        (cpb.CreatableTopic(name="t", num_partitions=2, replication_factor=1), False),
        (
            cpb.CreatableTopic(
                name="t",
                assignments=[
                    cpb.ReplicaAssignment(partition=1, broker_ids=[102, 101]),
                    cpb.ReplicaAssignment(partition=0, broker_ids=[101, 102]),
                ],
            ),
            True,
        ),
        (
            cpb.CreatableTopic(
                name="t", assignments=[cpb.ReplicaAssignment(partition=0, broker_ids=[102, 101])]
            ),
            False,
        ),
        (
            cpb.CreatableTopic(
                name="t",
                num_partitions=2,
                replication_factor=-1,
                configs=[cpb.TopicConfig(name="retention.ms", value="1")],
            ),
            True,
        ),
        (
            cpb.CreatableTopic(
                name="t",
                num_partitions=2,
                replication_factor=-1,
                configs=[cpb.TopicConfig(name="retention.ms", value="2")],
            ),
            False,
        ),
    ],
)
def test_matches_spec(wanted: cpb.CreatableTopic, matches: bool) -> None:
    topic = cpb.TopicDescription(
        name="t",
        configs=[cpb.TopicConfig(name="retention.ms", value="1")],
        partitions=[
            cpb.PartitionDescription(partition=1, replicas=[102, 101]),
            cpb.PartitionDescription(partition=0, replicas=[101, 102]),
        ],
    )
    assert matches_spec(wanted, topic) is matches
