"""Raft Fetch on the request plane's own loop (kraft.node.intake.DriverBridge) and the driver's callback
answer it uses (RaftDriver.submit_request): the request crosses to the driver's loop once, the answer comes
back from inside the driver's output, on the intake loop; a stopped driver answers with its error."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from single_voter import ELECTION_TIMEOUT_S, leading, single_voter

from kraft.client.channel import open_channel
from kraft.config import NodeConfig
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.node.controller import ControllerNode
from kraft.node.intake import DriverBridge, HopInterceptor, IntakeLoop
from kraft.raft.api import RaftShutdownError
from kraft.raft.driver import RaftDriver
from kraft.raft.grpc_server import FETCH_METHODS
from kraft.raft.messages import (
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    FetchRequest,
    FetchResponse,
    RaftResponse,
)
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir
from kraft.v1 import raft_pb2, raft_pb2_grpc

TIMEOUT_S = 5.0


Answer = tuple[RaftResponse | None, BaseException | None]


async def test_submit_request_answers_through_the_callback_once() -> None:
    driver = single_voter()
    await leading(driver)
    try:
        last = await driver.append([b"a", b"b"])
        answers: list[Answer] = []
        done = asyncio.Event()

        def reply(response: RaftResponse | None, error: BaseException | None) -> None:
            answers.append((response, error))
            done.set()

        # An observer (id 9) fetching from offset 0: answered at once with the committed records.
        driver.submit_request(
            FetchRequest("c1", 9, driver.leader_and_epoch.epoch, 0, 0), peer_id=None, reply=reply
        )
        async with asyncio.timeout(TIMEOUT_S):
            await done.wait()
        await asyncio.sleep(0.01)  # nothing answers twice
        assert len(answers) == 1
        response, error = answers[0]
        assert error is None and isinstance(response, FetchResponse)
        assert (
            response.error_code is ErrorCode.NONE and response.records and response.high_watermark == last + 1
        )
    finally:
        await driver.stop()


async def test_submit_request_gives_describe_quorum_wall_clock_times_like_handle_request() -> None:
    driver = single_voter()
    await leading(driver)
    try:
        done: asyncio.Future[RaftResponse | None] = asyncio.get_running_loop().create_future()
        driver.submit_request(
            DescribeQuorumRequest("c1"), peer_id=None, reply=lambda r, _e: done.set_result(r)
        )
        async with asyncio.timeout(TIMEOUT_S):
            submitted = await done
        handled = await driver.handle_request(DescribeQuorumRequest("c1"))
        assert isinstance(submitted, DescribeQuorumResponse) and isinstance(handled, DescribeQuorumResponse)
        # wall-clock epoch milliseconds (this century), not the monotonic clock's
        stamps = [r.last_fetch_timestamp_ms for r in (*submitted.current_voters, *handled.current_voters)]
        assert all(stamp > 1_600_000_000_000 for stamp in stamps)
    finally:
        await driver.stop()


async def test_a_parked_fetch_is_answered_with_the_shutdown_error() -> None:
    driver = single_voter()
    await leading(driver)
    answers: list[Answer] = []
    try:
        # Its LeaderChange committed first: the driver takes a Fetch during that batch's fsync (issue #17,
        # session 13), and the high watermark that fsync raises would answer a Fetch parked before it.
        for _ in range(int(ELECTION_TIMEOUT_S / 0.005)):
            if driver.high_watermark >= driver.log_end_offset:
                break
            await asyncio.sleep(0.005)
        end, epoch = driver.log_end_offset, driver.leader_and_epoch.epoch
        assert driver.high_watermark == end
        # Caught up: the leader parks it (long poll) until records arrive or its wait ends.
        fetch = FetchRequest("c1", 9, epoch, end, epoch, max_wait_ms=10_000)
        driver.submit_request(fetch, peer_id=None, reply=lambda r, e: answers.append((r, e)))
        await asyncio.sleep(0.05)
        assert answers == []
    finally:
        await driver.stop()
    assert len(answers) == 1 and isinstance(answers[0][1], RaftShutdownError)
    stopped: list[Answer] = []
    driver.submit_request(fetch, peer_id=None, reply=lambda r, e: stopped.append((r, e)))
    assert len(stopped) == 1 and isinstance(stopped[0][1], RaftShutdownError)  # at once, in the call


async def test_the_bridge_submits_on_the_main_loop_and_answers_on_the_intake_loop() -> None:
    driver = single_voter()
    await leading(driver)
    intake = IntakeLoop(name="test-fetch-bridge")
    intake.start()
    main_thread = threading.get_ident()
    submitted_on: list[int] = []

    def submit(request: Any, *, peer_id: int | None, reply: Any) -> None:
        submitted_on.append(threading.get_ident())
        driver.submit_request(request, peer_id=peer_id, reply=reply)

    bridge = DriverBridge(asyncio.get_running_loop(), submit)

    async def on_intake() -> tuple[RaftResponse, int]:
        fetch = FetchRequest("c1", 9, driver.leader_and_epoch.epoch, 0, 0)
        response = await bridge.handle_request(fetch)
        return response, threading.get_ident()

    try:
        async with asyncio.timeout(TIMEOUT_S):
            response, answered_on = await intake.run(on_intake())
        assert isinstance(response, FetchResponse) and response.error_code is ErrorCode.NONE
        assert submitted_on == [main_thread] and answered_on != main_thread
        await driver.stop()
        with pytest.raises(RaftShutdownError):  # the driver's error comes back to the intake side
            async with asyncio.timeout(TIMEOUT_S):
                await intake.run(on_intake())
    finally:
        await driver.stop()
        intake.close()


async def test_native_methods_are_not_hopped_to_the_main_loop() -> None:
    intake = IntakeLoop(name="test-native-methods")
    intake.start()

    async def behavior(request: bytes, _context: Any) -> bytes:
        return request

    handler = grpc.unary_unary_rpc_method_handler(behavior)
    hop = HopInterceptor(asyncio.get_running_loop(), intake.loop, native=FETCH_METHODS)

    async def continuation(_details: Any) -> Any:
        return handler

    class Details:
        def __init__(self, method: str) -> None:
            self.method = method

    async def wrapped(method: str) -> Any:
        return await hop.intercept_service(continuation, Details(method))  # type: ignore[arg-type]

    try:
        assert {"/kraft.v1.RaftService/Fetch", "/kraft.v1.RaftService/FetchStream"} == FETCH_METHODS
        for method in FETCH_METHODS:
            assert await intake.run(wrapped(method)) is handler  # served on the intake loop as it is
        assert await intake.run(wrapped("/kraft.v1.RaftService/Vote")) is not handler  # hopped
    finally:
        intake.close()


@pytest.mark.parametrize("on_intake", [True, False])
async def test_the_config_switch_picks_the_bridge_or_the_hop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, on_intake: bool
) -> None:
    """``controller.raft.fetch.on.intake`` (bench A/B switch): on, a Fetch reaches the driver through the
    bridge (``submit_request``); off, it hops to the main loop like every other handler and reaches the
    driver through ``handle_request``; either way the Fetch is answered."""
    calls: list[str] = []
    submit, handle = RaftDriver.submit_request, RaftDriver.handle_request

    def counting_submit(self: RaftDriver, request: Any, **kwargs: Any) -> None:
        calls.append(f"submit:{type(request).__name__}")
        submit(self, request, **kwargs)

    async def counting_handle(self: RaftDriver, request: Any, **kwargs: Any) -> RaftResponse:
        calls.append(f"handle:{type(request).__name__}")
        return await handle(self, request, **kwargs)

    monkeypatch.setattr(RaftDriver, "submit_request", counting_submit)
    monkeypatch.setattr(RaftDriver, "handle_request", counting_handle)
    port = free_port()
    cluster_id = random_uuid()
    format_log_dir(tmp_path / "meta", cluster_id=cluster_id, node_id=1)
    config = NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=tmp_path / "meta",
        controller_raft_fetch_on_intake=on_intake,
    )
    node = ControllerNode(config)
    await node.start()
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = raft_pb2_grpc.RaftServiceStub(channel)
            deadline = time.monotonic() + TIMEOUT_S
            while True:  # bounded: the single voter elects itself on the system clock
                described = await stub.DescribeQuorum(
                    raft_pb2.DescribeQuorumRequest(cluster_id=cluster_id), timeout=TIMEOUT_S
                )
                if described.leader_id == 1 or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
            assert described.leader_id == 1
            fetch = raft_pb2.FetchRequest(
                cluster_id=cluster_id,
                replica_id=9,  # an observer
                current_leader_epoch=described.leader_epoch,
                max_wait_ms=0,
                max_bytes=1 << 20,
            )
            answer = await stub.Fetch(fetch, timeout=TIMEOUT_S)
            assert answer.error_code == ErrorCode.NONE
    finally:
        await node.stop(timeout_ms=2000)
    fetches = [call for call in calls if call.endswith(":FetchRequest")]
    assert fetches == (["submit:FetchRequest"] if on_intake else ["handle:FetchRequest"])
