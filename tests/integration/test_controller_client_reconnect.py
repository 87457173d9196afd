"""A controller that comes back after being down is reachable again within about a second.

With gRPC's default reconnect backoff a kept channel stayed in TRANSIENT_FAILURE for 3-4 s after a
controller that had been down ~6 s was back (calls fail fast with UNAVAILABLE "failed to connect to all
addresses"); if that controller had just become active, it fenced the broker for a missed session
meanwhile (seen in the chaos kill scenario: 2.6 s of UNAVAILABLE after the new leader's activation).

Real sockets and gRPC's own reconnect timers, so it runs on the wall clock: it lives with the integration
tests (moved from tests/unit/broker, where it took 6+ s of every unit run).
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import pytest

from kraft.client.controller import ControllerClient, ControllerUnavailable
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc

pytestmark = pytest.mark.integration

DOWN_S = 6.0
BACK_WITHIN_S = 2.0  # bounded backoff: ~1.2 s at most; gRPC's defaults: 3-4 s


class _Controller(controller_pb2_grpc.ControllerServiceServicer):
    async def DescribeCluster(self, request: Any, context: Any) -> cpb.DescribeClusterResponse:
        return cpb.DescribeClusterResponse(error_code=ErrorCode.NONE)


async def _describe(client: ControllerClient) -> bool:
    try:
        await client.call(lambda stub: stub.DescribeCluster, cpb.DescribeClusterRequest(), timeout_s=1.0)
    except ControllerUnavailable:
        return False
    return True


async def test_a_controller_back_from_the_dead_is_reached_within_a_second_or_so() -> None:
    target = f"127.0.0.1:{free_port()}"
    client = ControllerClient([(1, target)])
    server: grpc.aio.Server | None = None
    try:
        deadline = time.monotonic() + DOWN_S
        while time.monotonic() < deadline:  # heartbeats to a dead controller, as a broker sends them
            assert not await _describe(client)
            await asyncio.sleep(0.3)
        server = grpc.aio.server()
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(_Controller(), server)  # type: ignore[abstract]
        server.add_insecure_port(target)
        await server.start()
        back = time.monotonic()
        while not await _describe(client):
            assert time.monotonic() - back < BACK_WITHIN_S, "still in gRPC reconnect backoff"
            await asyncio.sleep(0.1)
    finally:
        await client.close()
        if server is not None:
            await server.stop(None)
