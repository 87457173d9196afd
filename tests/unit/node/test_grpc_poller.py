"""kraft/node/grpc_poller.py: the main loop taken off grpc.aio's completion-queue wake-up socket while a
server runs on the intake loop — its own calls still complete (the intake loop's reader posts their
events), it is put back before the intake loop stops, and it is off only while leading; the intake loop's
reader off while not leading (LoopReaders), never both, and both back on restore()."""

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
from kraft.node.grpc_poller import LoopReaders, PollerReader, loop_binding, poller_queue
from kraft.node.intake import IntakeLoop
from kraft.observability.logging import get_logger
from kraft.runtime import EVENT_LOOP_ENV
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
async def plane(monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Plane]:
    # an asyncio intake loop, as the test's own: its remove_reader answers whether it watched (uvloop's
    # answers None), which _watched_by_main reads
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
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


async def _intake_watched(plane: Plane) -> bool:
    """Whether the intake loop watches the wake-up socket (checked on its own thread)."""

    async def check() -> bool:
        return _watched_by_main(plane.intake.loop)

    return await plane.intake.run(check())


def _readers(plane: Plane, main_loop: asyncio.AbstractEventLoop | None = None) -> LoopReaders:
    async def on_intake(call: Callable[[], object]) -> object:
        return call()

    return LoopReaders(
        main_loop or asyncio.get_running_loop(),
        plane.intake.loop,
        lambda call: plane.intake.run(on_intake(call)),
        get_logger("test"),
        leader_off=True,
        follower_off=True,
    )


async def test_one_reader_per_role_through_role_changes_and_both_back_on_restore(plane: Plane) -> None:
    """Following: only the main loop reads (the fetch client's events no longer wake the intake loop) and the
    intake server's calls still complete (the main loop posts their events); leading: only the intake loop;
    a role change puts the other reader on before it takes one off; restore() puts both back for good."""
    loop = asyncio.get_running_loop()
    readers = _readers(plane)
    for leading in (False, True, False, False, True, False):
        await readers.follow(leading)
        assert _watched_by_main(loop) == (not leading)
        assert await _intake_watched(plane) == leading
        for _ in range(2):
            await plane.check()  # a call from the main loop, served on the intake loop: both loops' events
    await readers.restore()
    assert _watched_by_main(loop) and await _intake_watched(plane)
    await readers.follow(False)  # nothing is taken off after restore()
    assert _watched_by_main(loop) and await _intake_watched(plane)
    await plane.check()


async def test_the_intake_loop_keeps_its_reader_while_the_main_loop_is_not_bound(plane: Plane) -> None:
    """A main loop that never made a grpc.aio object does not watch the socket: taking the intake loop's
    reader off then would leave the intake's events unread."""
    unbound = asyncio.new_event_loop()
    try:
        readers = _readers(plane, main_loop=unbound)
        await readers.follow(False)
        assert readers.intake is not None and not readers.intake.detached
        assert await _intake_watched(plane)
        await plane.check()
    finally:
        unbound.close()


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
                readers = node._poller_readers
                assert (readers is None or readers.main is None) and _watched_by_main(loop)
            described = await raft_pb2_grpc.RaftServiceStub(channel).DescribeQuorum(
                raft_pb2.DescribeQuorumRequest(cluster_id="x"), timeout=TIMEOUT_S
            )
            assert described.error_code != 0  # answered (another cluster id): the call's events arrived
        finally:
            await node.stop(timeout_ms=2000)
        assert _watched_by_main(loop)


async def test_a_node_that_does_not_lead_takes_its_intake_loop_off_and_puts_it_back_when_it_stops(
    tmp_path: Path,
) -> None:
    """Voter 1 of two, the other absent: it never leads (its main loop sends vote requests, so it is bound);
    with controller.follower.grpc.events.on.main its intake loop's reader comes off, and is back once the
    node stopped (before its intake loop did)."""
    port, absent = free_port(), free_port()
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=1)
    config = NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port},2@127.0.0.1:{absent}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=tmp_path / "meta",
    )
    node = ControllerNode(config)
    await node.start()
    readers = node._poller_readers
    try:
        assert readers is not None and readers.intake is not None
        intake = readers.intake
        assert await _until(lambda: intake.detached)
        assert node.raft.leader_and_epoch.leader_id != 1
    finally:
        await node.stop(timeout_ms=2000)
    assert not intake.detached
