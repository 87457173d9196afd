"""A busy active controller is not forgotten after one slow answer.

Under bulk writes a controller can take longer than a heartbeat's attempt timeout to pick up a call.
The client then asks another voter within the same call, but keeps the active controller for its other
calls: forgetting it sent every following call of the process round-robin to followers first (one
shared client in the controller benchmark plays 1,000 brokers), which are busy too."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

import grpc

from kraft.client.controller import ControllerClient, ControllerUnavailable
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc
from kraft.v1.common_pb2 import NodeRef

CALL_TIMEOUT_S = 10.0
"""For calls that must succeed: only bounds a hang (a loaded host must not turn them into timeouts)."""
SLOW_ATTEMPT_S = 0.5


class _Controller(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self, redirect_to: int | None, delay_s: float = 0.0) -> None:
        self.redirect_to = redirect_to
        self.delay_s = delay_s
        self.calls = 0

    async def DescribeCluster(self, request: Any, context: Any) -> cpb.DescribeClusterResponse:
        self.calls += 1
        await asyncio.sleep(self.delay_s)
        if self.redirect_to is not None:
            return cpb.DescribeClusterResponse(
                error_code=ErrorCode.NOT_CONTROLLER, controller=NodeRef(node_id=self.redirect_to)
            )
        return cpb.DescribeClusterResponse(error_code=ErrorCode.NONE)


async def _serve(servicer: _Controller) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    return server, f"127.0.0.1:{port}"


async def test_a_slow_active_controller_stays_active_and_a_dead_one_is_left() -> None:
    leader = _Controller(None, delay_s=0.0)  # type: ignore[abstract]
    follower = _Controller(redirect_to=1)  # type: ignore[abstract]
    leader_server, leader_target = await _serve(leader)
    follower_server, follower_target = await _serve(follower)
    client = ControllerClient([(1, leader_target), (2, follower_target)])
    try:
        describe = cpb.DescribeClusterRequest()
        await client.call(lambda s: s.DescribeCluster, describe, timeout_s=CALL_TIMEOUT_S)
        assert client.active_controller_id == 1

        leader.delay_s = 60.0  # busy: no answer within any attempt (server.stop cancels these calls)
        # Every attempt at it times out (ControllerUnavailable): the point is whom the client keeps.  The
        # attempt timeout need only let the idle follower answer, so it is generous, not a race; the call's
        # deadline (which every attempt shares) leaves room for the follower after the leader's attempt.
        with contextlib.suppress(ControllerUnavailable):
            await client.call(
                lambda s: s.DescribeCluster,
                describe,
                timeout_s=CALL_TIMEOUT_S,
                attempt_timeout_s=SLOW_ATTEMPT_S,
            )
        assert follower.calls >= 1  # the slow call asked the other voter ...
        assert client.active_controller_id == 1  # ... and the busy controller stays the active one

        leader.delay_s = 0.0
        before = follower.calls
        await client.call(lambda s: s.DescribeCluster, describe, timeout_s=CALL_TIMEOUT_S)
        assert follower.calls == before  # straight to the active controller

        await leader_server.stop(None)  # gone (UNAVAILABLE), not slow: forgotten
        follower.redirect_to = None  # the other voter took over
        await client.call(lambda s: s.DescribeCluster, describe, timeout_s=CALL_TIMEOUT_S)
        assert client.active_controller_id == 2
    finally:
        await client.close()
        await leader_server.stop(None)
        await follower_server.stop(None)
