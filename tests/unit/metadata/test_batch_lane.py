"""Heartbeats of an intake process's CallBatch and the heartbeat fast lane (kraft.node.batch_lane): the
batch's steady heartbeats answered on the intake loop by the lane, the rest of the batch — heartbeats that
are not steady, and other calls — on the main loop as one controller event, as before; a lapsed lease sends
the whole batch the normal way; a caller's identity and ACL check keep the main loop's guard's semantics
(an ACL decision only from a grant the guard made for that principal and forwarded host, under the ACLs in
force); and a batch off the unix socket is refused before the lane answers anything.  A real
QuorumController on a FakeRaft and a manual clock (tests/unit/metadata/test_heartbeat_lane.py)."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import grpc.aio
import pytest

from kraft.errors import ErrorCode
from kraft.metadata.controller import QuorumController
from kraft.metadata.service import ControllerServicer
from kraft.node.batch_lane import BatchLane
from kraft.node.controller_bridge import HeartbeatBridge
from kraft.node.intake_batch import HEARTBEAT_METHOD, CallBatchServicer
from kraft.security.authorizer import AuthorizerSettings
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import intake_pb2

from .test_controller import registration
from .test_heartbeat_lane import LEASE_MS, _beat, _controller, _lane, _unfenced
from .test_heartbeat_lane_reasons import _counted, _counts
from .test_intake_batch import (  # noqa: F401 - trusting_tls is a fixture
    ADMIN,
    BROKER_101,
    BROKER_102,
    CREATE_METHOD,
    BatchContext,
    _as,
    _create,
    trusting_tls,
)

TIMEOUT_S = 10.0


@dataclasses.dataclass
class Node:
    """The node's side of CallBatch with the lane: the servicer on main, the lane on the intake loop (one
    loop here: the hops still go through ``call_soon_threadsafe``, as between two threads)."""

    controller: QuorumController
    lane: BatchLane
    bridge: HeartbeatBridge
    events: list[int]

    async def batch(
        self, *calls: intake_pb2.BatchedCall, context: BatchContext | None = None
    ) -> dict[int, intake_pb2.CallResult]:
        context = context or BatchContext()
        request = intake_pb2.CallBatchRequest(calls=list(calls))
        await asyncio.wait_for(self.lane.call_batch(_raw(request), context), TIMEOUT_S)  # type: ignore[arg-type]
        results = [r for message in context.written for r in message.results]
        assert sorted(r.index for r in results) == list(range(len(calls))), "each call answered once"
        return context.results()


def _node(controller: QuorumController, settings: AuthorizerSettings | None = None) -> Node:
    servicer = ControllerServicer(controller, authorizer=settings)
    loop = asyncio.get_running_loop()
    bridge = HeartbeatBridge(loop, lambda: servicer.guard, lambda: controller)
    batches = CallBatchServicer(servicer, lambda: controller, node="batch-lane-test")
    lane = BatchLane(batches, lambda: bridge, lambda: controller)
    batches.on_admitted = lane.grant
    lane.handler(loop)
    events: list[int] = []
    alone = controller.broker_heartbeats

    def counted(reqs: Any) -> AsyncIterator[list[tuple[int, cpb.BrokerHeartbeatResponse]]]:
        events.append(len(reqs))
        return alone(reqs)

    controller.broker_heartbeats = counted  # type: ignore[method-assign]
    return Node(controller, lane, bridge, events)


async def _raw(*messages: intake_pb2.CallBatchRequest) -> AsyncIterator[bytes]:
    for message in messages:
        yield message.SerializeToString()


def _hb(
    request: cpb.BrokerHeartbeatRequest | bytes, auth: dict[str, list[bytes]], host: str = "10.1.1.1"
) -> intake_pb2.BatchedCall:
    raw = request if isinstance(request, bytes) else request.SerializeToString()
    return intake_pb2.BatchedCall(
        method=HEARTBEAT_METHOD, request=raw, metadata=_as(auth, f"ipv4:{host}:5000")
    )


def _answer(result: intake_pb2.CallResult) -> cpb.BrokerHeartbeatResponse:
    assert result.status_code == 0, result.details
    return cpb.BrokerHeartbeatResponse.FromString(result.response)


@pytest.fixture
def tls(trusting_tls: None) -> Iterator[None]:  # noqa: F811 - the imported fixture
    yield


@pytest.mark.usefixtures("tls")
async def test_steady_heartbeats_of_a_batch_are_answered_by_the_lane_and_the_rest_by_one_event() -> None:
    _, controller, _, _ = await _controller()
    try:
        epochs = {b: await _unfenced(controller, b) for b in (101, 102)}
        fenced = (await controller.register_broker(registration(103))).broker_epoch  # its first beat unfences
        node = _node(controller)
        lane = _lane(controller)
        answered = lane.answered
        broker_103 = {"transport_security_type": [b"ssl"], "x509_subject": [b"CN=broker-103,O=kraft"]}
        results = await node.batch(
            _hb(_beat(101, epochs[101]), BROKER_101),  # 0: steady → lane
            _hb(_beat(102, epochs[102]), BROKER_102),  # 1: steady → lane
            _hb(_beat(103, fenced), broker_103),  # 2: fenced → unfenced: the normal path
            _hb(_beat(102, epochs[102], want_shut_down=True), BROKER_102),  # 3: asks for something
            _hb(_beat(101, epochs[101] + 7), BROKER_101),  # 4: stale epoch
            _hb(b"\xff\xff not a message", BROKER_101),  # 5: undecodable: refused on main as before
            intake_pb2.BatchedCall(
                method=CREATE_METHOD, request=_create("orders").SerializeToString(), metadata=_as(ADMIN)
            ),  # 6: not a heartbeat
        )
        assert lane.answered == answered + 2 and node.lane.fast == 2
        assert node.events == [3], "the heartbeats the lane did not answer (2, 3, 4) as one event"
        assert (node.lane.whole, node.lane.handed) == (0, 1)
        for index in (0, 1):
            fast = _answer(results[index])
            assert fast.error_code == ErrorCode.NONE and not fast.is_fenced and fast.is_caught_up
        assert not _answer(results[2]).is_fenced
        assert _answer(results[3]).should_shut_down
        assert _answer(results[4]).error_code == ErrorCode.STALE_BROKER_EPOCH
        assert results[5].status_code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        created = cpb.CreateTopicsResponse.FromString(results[6].response)
        assert created.topics[0].error_code == ErrorCode.NONE
        # a batch of steady heartbeats only never reaches the main loop
        processed = len(controller.writes.queue.processed)
        results = await node.batch(
            _hb(_beat(101, epochs[101]), BROKER_101), _hb(_beat(103, fenced), broker_103)
        )
        assert all(_answer(r).error_code == ErrorCode.NONE for r in results.values())
        assert node.events == [3] and (node.lane.whole, node.lane.handed) == (1, 1)
        assert len(controller.writes.queue.processed) == processed
        assert lane.answered == answered + 4
    finally:
        await controller.stop()


@pytest.mark.usefixtures("tls")
async def test_with_the_lease_lapsed_the_whole_batch_goes_the_normal_path() -> None:
    _, controller, clock, lease = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        node = _node(controller)
        lane = _lane(controller)
        steady = [_hb(_beat(101, epoch), BROKER_101) for _ in range(3)]
        fast = await node.batch(*steady)
        assert lane.answered == 3 and node.events == []
        clock.advance(LEASE_MS)  # the published lease ends now
        slow = await node.batch(*steady)
        assert lane.answered == 3 and node.events == [3], "one event for the batch, as before the lane"
        assert [_answer(r) for r in slow.values()] == [_answer(r) for r in fast.values()]
        lease.hold()
        controller._event_ran("test", 0)  # (what every event's end republishes)
        await node.batch(*steady)
        assert lane.answered == 6 and node.events == [3]
    finally:
        await controller.stop()


@pytest.mark.usefixtures("tls")
async def test_acl_decisions_of_batched_heartbeats_are_the_guards() -> None:
    """A batched caller is answered by the lane only when the main loop's guard would let it through: the
    identity binding on the spot, an ACL decision only from a grant the guard made on the batch path for
    that principal and forwarded host under the ACLs in force; a refused caller is refused as before."""
    _, controller, _, _ = await _controller()
    settings = AuthorizerSettings(enabled=True, super_users=frozenset({"User:CN=admin,O=kraft"}))
    try:
        epoch = await _unfenced(controller, 101)
        node = _node(controller, settings)
        lane = _lane(controller)

        def calls(host: str = "10.1.1.1") -> list[intake_pb2.BatchedCall]:
            return [
                _hb(_beat(101, epoch), ADMIN, host),  # 0: super user: allowed by the guard
                _hb(_beat(101, epoch), BROKER_101, host),  # 1: node principal without CLUSTER_ACTION
                _hb(_beat(102, epoch), BROKER_101, host),  # 2: speaks for another broker
            ]

        def refused(results: dict[int, intake_pb2.CallResult]) -> None:
            for index in (1, 2):
                assert results[index].status_code == grpc.StatusCode.PERMISSION_DENIED.value[0]
                assert results[index].details.startswith("CLUSTER_AUTHORIZATION_FAILED")

        before = _counts()
        first = await node.batch(*calls())  # no grant yet: the guard decides on main, and grants admin
        refused(first)
        assert _answer(first[0]).error_code == ErrorCode.NONE
        assert lane.answered == 0 and node.events == [1]
        assert _counted(before) == {"not_allowed": 3}, "each undecidable caller counted, as a lone call is"
        before = _counts()
        second = await node.batch(*calls())
        refused(second)
        assert _answer(second[0]) == _answer(first[0])
        assert lane.answered == 1 and node.events == [1], "admin answered by the lane, on its grant"
        assert _counted(before) == {"not_allowed": 2}
        elsewhere = await node.batch(*calls("10.9.9.9"))  # the same principal from another host: no grant
        refused(elsewhere)
        assert lane.answered == 1 and node.events == [1, 1]
        controller.state.committed = dataclasses.replace(controller.state.committed, acls={})
        third = await node.batch(*calls())  # the ACLs changed: no grant holds until the guard decided
        refused(third)
        assert lane.answered == 1 and node.events == [1, 1, 1]
        await node.batch(*calls())
        assert lane.answered == 2 and node.events == [1, 1, 1]
    finally:
        await controller.stop()


@pytest.mark.usefixtures("tls")
async def test_a_batch_off_the_unix_socket_is_refused_before_the_lane_answers() -> None:
    _, controller, _, _ = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        node = _node(controller)
        context = BatchContext(peer="ipv4:10.1.1.1:4000")
        request = intake_pb2.CallBatchRequest(calls=[_hb(_beat(101, epoch), BROKER_101)])
        with pytest.raises(grpc.aio.AbortError, match="PERMISSION_DENIED"):
            await node.lane.call_batch(_raw(request), context)  # type: ignore[arg-type]
        assert context.written == [] and _lane(controller).answered == 0
    finally:
        await controller.stop()
