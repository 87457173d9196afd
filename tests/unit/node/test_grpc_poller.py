"""kraft/node/grpc_poller.py: the main loop taken off grpc.aio's completion-queue wake-up socket while a
server runs on the intake loop — its own calls still complete (the intake loop's reader posts their
events), it is put back before the intake loop stops, and it is off only while leading."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import grpc
import grpc.aio
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer

from kraft.client.channel import open_channel
from kraft.config import NodeConfig
from kraft.netutil import free_port
from kraft.node.controller import ControllerNode
from kraft.node.grpc_poller import PollerReader, loop_binding, poller_queue
from kraft.node.intake import IntakeLoop
from kraft.observability.logging import get_logger
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir
from kraft.v1 import raft_pb2, raft_pb2_grpc

TIMEOUT_S = 10.0


class Plane:
    """A grpc.aio server on an intake loop and a channel to it on the test's (main) loop."""

    def __init__(self, intake: IntakeLoop, server: grpc.aio.Server, port: int) -> None:
        self.intake = intake
        self.server = server
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self._stopped = False

    async def stop(self) -> None:
        """The server, then the intake loop and its thread (once)."""
        if not self._stopped:
            self._stopped = True
            await self.intake.run(self.server.stop(grace=None))
            self.intake.close()

    async def check(self) -> None:
        """One call from the main loop: its events must reach the main loop."""
        stub = health_pb2_grpc.HealthStub(self.channel)
        async with asyncio.timeout(TIMEOUT_S):
            answer = await stub.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S)
        assert answer.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
async def plane() -> AsyncIterator[Plane]:
    intake = IntakeLoop(name="test-grpc-poller")
    intake.start()

    async def start() -> tuple[grpc.aio.Server, int]:
        server = grpc.aio.server()
        health_pb2_grpc.add_HealthServicer_to_server(HealthServicer(), server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        return server, port

    server, port = await intake.run(start())
    made = Plane(intake, server, port)
    try:
        await made.check()  # the main loop is bound to the poller queue now
        yield made
    finally:
        await made.channel.close(None)
        await made.stop()


def _watched_by_main(loop: asyncio.AbstractEventLoop) -> bool:
    """Whether ``loop`` has a reader on the poller's wake-up socket (checked by taking it off and back;
    asyncio's remove_reader answers that, uvloop's does not — the tests run on asyncio loops)."""
    queue = poller_queue()
    bound = loop_binding(queue, loop)
    assert bound is not None
    if not loop.remove_reader(bound.read_socket):
        return False
    loop.add_reader(bound.read_socket, functools.partial(queue._handle_events, loop))  # as grpc.aio does
    return True


async def test_the_main_loop_is_taken_off_the_wake_up_socket_and_its_own_calls_still_complete(
    plane: Plane,
) -> None:
    loop = asyncio.get_running_loop()
    assert _watched_by_main(loop)  # grpc.aio by itself: every bound loop watches the one socket
    reader = PollerReader(loop, get_logger("test"))
    assert reader.detach() and reader.detached
    assert not _watched_by_main(loop)  # off: the intake's events no longer wake this loop
    for _ in range(3):
        await plane.check()  # the intake loop's reader posts this loop's events to it
    assert reader.detach()  # idempotent
    reader.attach()
    assert not reader.detached and _watched_by_main(loop)
    await plane.check()


async def test_the_reader_is_back_before_the_intake_loop_stops(plane: Plane) -> None:
    """With the server and the intake loop stopped, only the main loop's own reader can deliver its
    events: a reader not put back leaves this call (refused: nobody listens) waiting until the timeout."""
    loop = asyncio.get_running_loop()
    reader = PollerReader(loop, get_logger("test"))
    assert reader.detach()
    reader.attach()
    await plane.stop()
    stub = health_pb2_grpc.HealthStub(plane.channel)
    with pytest.raises(grpc.aio.AioRpcError) as refused:
        async with asyncio.timeout(TIMEOUT_S):
            await stub.Check(health_pb2.HealthCheckRequest(), timeout=TIMEOUT_S, wait_for_ready=False)
    assert refused.value.code() == grpc.StatusCode.UNAVAILABLE


async def test_off_only_while_leading(plane: Plane) -> None:
    loop = asyncio.get_running_loop()
    reader = PollerReader(loop, get_logger("test"))
    reader.follow(leading=True)
    assert reader.detached and not _watched_by_main(loop)
    reader.follow(leading=True)
    assert reader.detached
    reader.follow(leading=False)
    assert not reader.detached and _watched_by_main(loop)
    await plane.check()


def _node_config(tmp_path: Path, port: int, **extra: object) -> NodeConfig:
    return NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=tmp_path / "meta",
        **extra,
    )


async def _until(condition: Callable[[], bool]) -> bool:
    deadline = time.monotonic() + TIMEOUT_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        await asyncio.sleep(0.02)
    return True


@pytest.mark.parametrize("on", [True, False])
async def test_a_leading_node_takes_its_main_loop_off_and_puts_it_back_when_it_stops(
    tmp_path: Path, on: bool
) -> None:
    """A one-voter node leads: its main loop (here the test's loop, bound to the poller by the test's own
    channel) is off the wake-up socket while it runs (with controller.leader.grpc.events.on.intake) and
    watches it again once the node stopped, its intake loop with it."""
    loop = asyncio.get_running_loop()
    port = free_port()
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=1)
    async with open_channel(f"127.0.0.1:{port}") as channel:
        node = ControllerNode(_node_config(tmp_path, port, controller_leader_grpc_events_on_intake=on))
        await node.start()
        try:
            if on:  # the node's leadership check (every 0.1 s) finds it leading
                assert await _until(lambda: not _watched_by_main(loop))
            else:
                assert await _until(lambda: node.raft.leader_and_epoch.leader_id == 1)
                assert node._poller_reader is None and _watched_by_main(loop)
            described = await raft_pb2_grpc.RaftServiceStub(channel).DescribeQuorum(
                raft_pb2.DescribeQuorumRequest(cluster_id="x"), timeout=TIMEOUT_S
            )
            assert described.error_code != 0  # answered (another cluster id): the call's events arrived
        finally:
            await node.stop(timeout_ms=2000)
        assert _watched_by_main(loop)
