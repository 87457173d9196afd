"""A NOT_CONTROLLER hint is resolved through the broker's own voter list, not the hint's endpoint.

The endpoint in a hint is how controllers reach each other; under a proxy (chaos harness) or NAT it is not
how a broker reaches them.  Kafka resolves the controller id through its own configuration too."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from kraft.client.controller import MAX_LEARNED_CONTROLLERS, ControllerClient
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc
from kraft.v1.common_pb2 import Endpoint, NodeRef


class _Controller(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self, redirect_to: NodeRef | None) -> None:
        self.redirect_to = redirect_to
        self.calls = 0
        self.not_controller_at: set[int] = set()  # calls (1-based) answered NOT_CONTROLLER without a hint

    async def DescribeCluster(self, request: Any, context: Any) -> cpb.DescribeClusterResponse:
        self.calls += 1
        if self.calls in self.not_controller_at:
            return cpb.DescribeClusterResponse(
                error_code=ErrorCode.NOT_CONTROLLER, controller=NodeRef(node_id=-1)
            )
        if self.redirect_to is not None:
            return cpb.DescribeClusterResponse(
                error_code=ErrorCode.NOT_CONTROLLER, controller=self.redirect_to
            )
        return cpb.DescribeClusterResponse(error_code=ErrorCode.NONE)


async def _serve(servicer: _Controller) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def servers() -> AsyncIterator[tuple[_Controller, _Controller, _Controller, str, str]]:
    # "inner" is the active controller as the controllers see it (e.g. a controller-to-controller proxy);
    # "outer" is the same controller as this broker must reach it.
    inner, outer = _Controller(None), _Controller(None)  # type: ignore[abstract]
    inner_server, inner_target = await _serve(inner)
    outer_server, outer_target = await _serve(outer)
    host, port = inner_target.split(":")
    follower = _Controller(NodeRef(node_id=2, endpoint=Endpoint(host=host, port=int(port))))  # type: ignore[abstract]
    follower_server, follower_target = await _serve(follower)
    try:
        yield follower, inner, outer, follower_target, outer_target
    finally:
        for server in (inner_server, outer_server, follower_server):
            await server.stop(None)


async def test_not_controller_hint_is_resolved_through_the_own_voter_list(
    servers: tuple[_Controller, _Controller, _Controller, str, str],
) -> None:
    follower, inner, outer, follower_target, outer_target = servers
    client = ControllerClient([(1, follower_target), (2, outer_target)])
    try:
        response = await client.call(
            lambda stub: stub.DescribeCluster, cpb.DescribeClusterRequest(), timeout_s=5.0
        )
    finally:
        await client.close()
    assert response.error_code == ErrorCode.NONE
    assert follower.calls == 1 and outer.calls == 1
    assert inner.calls == 0, "the hint's endpoint must not be dialled when the id is a known voter"
    assert client.active_controller_id == 2


async def test_a_hinted_controller_missing_from_the_voter_list_stays_in_the_rotation(
    servers: tuple[_Controller, _Controller, _Controller, str, str],
) -> None:
    # A dynamic quorum's broker knows one bootstrap controller (id unknown: -1), which names the leader
    # (2, at "inner").  Later the bootstrap controller is gone and the leader, for one call, knows of no
    # leader (an election): the client must ask it again rather than only the dead bootstrap address.
    follower, inner, _outer, follower_target, _outer_target = servers
    client = ControllerClient([(-1, follower_target)])
    try:
        first = await client.call(
            lambda stub: stub.DescribeCluster, cpb.DescribeClusterRequest(), timeout_s=5.0
        )
        assert first.error_code == ErrorCode.NONE and inner.calls == 1 and client.active_controller_id == 2
        follower.redirect_to = None
        follower.not_controller_at = set(range(2, 100))  # it was removed: never the active one again
        inner.not_controller_at = {2}  # the election: one NOT_CONTROLLER with no hint
        second = await client.call(
            lambda stub: stub.DescribeCluster, cpb.DescribeClusterRequest(), timeout_s=5.0
        )
    finally:
        await client.close()
    assert second.error_code == ErrorCode.NONE
    assert inner.calls == 3, "the learned controller is asked again after the bootstrap one"


def test_controllers_learned_from_hints_are_bounded_and_keep_their_latest_address() -> None:
    client = ControllerClient([(-1, "127.0.0.1:1")])
    for node_id in range(1000):  # a peer naming ever new controllers cannot grow the rotation without end
        client._learn(node_id, f"10.0.0.{node_id % 250}:{9000 + node_id}")
    assert len(client._learned) == MAX_LEARNED_CONTROLLERS
    assert len(client._rotation.nodes) == 1 + MAX_LEARNED_CONTROLLERS
    client._learn(999, "10.0.0.9:1")  # a learned controller's address follows the latest hint
    assert client._learned[999] == "10.0.0.9:1" and len(client._learned) == MAX_LEARNED_CONTROLLERS
    client._learn(5, "127.0.0.1:1")  # a configured address is never learned again
    assert 5 not in client._learned
