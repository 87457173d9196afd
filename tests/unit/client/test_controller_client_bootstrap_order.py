"""Which voter :class:`ControllerClient` asks while no active controller is known: the rotation starts at
``first_voter`` (the CLI's is random), and a voter whose attempt failed (here: black-holed) is not asked
again while a voter that has not failed is left.  Real grpc.aio servers; nothing asserts wall time.  The
voters that answer count what reached them; which voters the client asked is counted client-side
(:func:`_asking`), since a black hole's 0.2 s attempt may end, on a loaded host, before its request reached
the server (3 of 180 loaded runs failed so when the holes counted arrivals)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import pytest

from kraft.client.controller import ControllerClient, ControllerUnavailable
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc

HELD_AT_MOST_S = 10.0  # a black hole's handler ends by then, whatever the client did


class _Voter(controller_pb2_grpc.ControllerServiceServicer):
    """Answers NOT_CONTROLLER without a hint (an election in progress) or, when ``active``, as the active
    controller; ``hole``: takes the request and never answers."""

    def __init__(self, *, active: bool = False, hole: bool = False) -> None:
        self.active = active
        self.hole = hole
        self.calls = 0

    async def DescribeCluster(self, request: Any, context: Any) -> cpb.DescribeClusterResponse:
        self.calls += 1
        if self.hole:
            await asyncio.sleep(HELD_AT_MOST_S)
        code = ErrorCode.NONE if self.active else ErrorCode.NOT_CONTROLLER
        return cpb.DescribeClusterResponse(error_code=code, cluster_id="kc")


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[grpc.aio.Server] = []

    async def start(voter: _Voter) -> str:
        server = grpc.aio.server()
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(voter, server)
        port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
        await server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    try:
        yield start
    finally:
        for server in servers:
            await server.stop(None)


async def _describe(
    client: ControllerClient, timeout_s: float = 5.0, pick: Callable[[Any], Any] | None = None
) -> cpb.DescribeClusterResponse:
    return await client.call(
        pick or (lambda stub: stub.DescribeCluster), cpb.DescribeClusterRequest(), timeout_s=timeout_s
    )


async def _asking(client: ControllerClient, targets: list[str]) -> tuple[Callable[[Any], Any], list[str]]:
    """A DescribeCluster picker that notes the voter each attempt asks, and ``targets``' channels
    connected first (an attempt then needs no handshake within its short deadline)."""
    for target in targets:
        await asyncio.wait_for(client.channel(target).channel_ready(), HELD_AT_MOST_S)
    by_stub = {id(client._stub(target)): target for target in targets}
    asked: list[str] = []

    def pick(stub: Any) -> Any:
        asked.append(by_stub[id(stub)])
        return stub.DescribeCluster

    return pick, asked


async def test_the_rotation_starts_at_first_voter(serve: Any) -> None:
    voters = [_Voter(active=True), _Voter(active=True), _Voter(active=True)]  # type: ignore[abstract]
    targets = [await serve(v) for v in voters]
    client = ControllerClient(list(enumerate(targets, start=1)), first_voter=2)
    try:
        assert (await _describe(client)).error_code == ErrorCode.NONE
    finally:
        await client.close()
    assert [v.calls for v in voters] == [0, 0, 1]
    assert client.active_controller_id == 3


async def test_a_black_holed_voter_costs_one_attempt_not_one_per_rotation(serve: Any) -> None:
    hole, electing = _Voter(hole=True), _Voter()  # type: ignore[abstract]
    targets = [await serve(hole), await serve(electing)]
    # one attempt at most 0.3 s; the call's four attempts (two voters + two redirects) fit in its 5 s
    client = ControllerClient(list(enumerate(targets, start=1)), request_timeout_s=0.3)
    try:
        pick, asked = await _asking(client, targets)
        with pytest.raises(ControllerUnavailable, match="is not the active controller"):
            await _describe(client, pick=pick)
        assert asked == [targets[0]] + [targets[1]] * 3, "after the hole's one attempt, only the other voter"
        assert electing.calls == 3
        electing.active = True
        assert (await _describe(client, pick=pick)).error_code == ErrorCode.NONE
        assert asked[4:] == [targets[1]], "the next call, too, skips the voter that failed"
        assert electing.calls == 4
    finally:
        await client.close()


async def test_when_every_voter_failed_the_rotation_starts_over(serve: Any) -> None:
    holes = [_Voter(hole=True), _Voter(hole=True)]  # type: ignore[abstract]
    targets = [await serve(v) for v in holes]
    client = ControllerClient(list(enumerate(targets, start=1)), request_timeout_s=0.2)
    try:
        pick, asked = await _asking(client, targets)
        with pytest.raises(ControllerUnavailable, match="DEADLINE_EXCEEDED"):
            await _describe(client, timeout_s=2.0, pick=pick)
    finally:
        await client.close()
    assert asked == targets * 2, "both asked, then both again: a failure is not forever"
