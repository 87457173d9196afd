"""Raw-record appends from the request plane's loop (kraft.node.intake.AppendBridge) and the driver's
callback commit wait it uses (RaftDriver.append_callback): the calls that arrive while a hand-off waits for
the main loop reach the driver as ONE append; each caller gets its own offsets, and only once committed."""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from single_voter import leading, single_voter

from kraft.client.channel import open_channel
from kraft.config import NodeConfig
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.node.controller import ControllerNode
from kraft.node.intake import AppendBridge, HopInterceptor, IntakeLoop
from kraft.raft.api import LeaderAndEpoch, NotLeaderError, RaftShutdownError
from kraft.raft.driver import PullSource, RaftDriver
from kraft.raft.grpc_test_service import APPEND_METHODS
from kraft.raft.memory import MemoryLogStore
from kraft.storage.batch import iter_batches
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir
from kraft.v1 import raft_pb2, raft_pb2_grpc

TIMEOUT_S = 5.0

Commit = Callable[[int | None, BaseException | None], None]


class FakeDriver:
    """A :class:`~kraft.node.intake.DriverAppend` whose commits the test releases by hand."""

    def __init__(self) -> None:
        self.leader = LeaderAndEpoch(1, 3)
        self.leader_reads: list[int] = []  # the thread of each read of leader_and_epoch
        self.end = 10  # the next offset
        self.calls: list[tuple[list[bytes], int]] = []  # (records, thread) per append_callback
        self.waiting: list[tuple[int, Commit]] = []
        self.refuse: BaseException | None = None
        self.sources: list[PullSource] = []  # registered by the bridges (pull_during_flush)

    def pull_during_flush(self, source: PullSource) -> None:
        self.sources.append(source)

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch:
        self.leader_reads.append(threading.get_ident())
        return self.leader

    def append_callback(self, records: Sequence[bytes], on_commit: Commit) -> int:
        if self.refuse is not None:
            raise self.refuse
        self.calls.append((list(records), threading.get_ident()))
        self.end += len(records)
        self.waiting.append((self.end - 1, on_commit))
        return self.end - 1

    def commit_all(self) -> None:
        waiting, self.waiting = self.waiting, []
        for offset, on_commit in waiting:
            on_commit(offset, None)

    def fail_all(self, error: BaseException) -> None:
        waiting, self.waiting = self.waiting, []
        for _offset, on_commit in waiting:
            on_commit(None, error)


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():  # noqa: ASYNC110 - another thread's state, no event to wait on
            await asyncio.sleep(0.001)


def _queue_while_main_waits(
    intake: IntakeLoop, bridge: AppendBridge, values: list[list[bytes]]
) -> list[asyncio.Task[tuple[int, LeaderAndEpoch]]]:
    """Start one append per entry of ``values`` on the intake loop while the main loop is held (this call
    blocks it), so every one of them is queued before the main loop can take a hand-off."""

    async def start() -> list[asyncio.Task[tuple[int, LeaderAndEpoch]]]:
        tasks = [asyncio.get_running_loop().create_task(bridge.append(each)) for each in values]
        async with asyncio.timeout(TIMEOUT_S):
            while len(bridge._queued) < len(values):  # noqa: ASYNC110 - each sleep lets one task queue
                await asyncio.sleep(0)
        return tasks

    return asyncio.run_coroutine_threadsafe(start(), intake.loop).result(TIMEOUT_S)


async def test_calls_waiting_for_one_handoff_share_one_append_and_get_their_own_offsets() -> None:
    intake = IntakeLoop(name="test-append-bridge")
    intake.start()
    driver = FakeDriver()
    bridge = AppendBridge(asyncio.get_running_loop(), driver)
    values = [[b"a"], [b"b", b"c"], [b"d"], [b"e", b"f", b"g"]]

    try:
        tasks = _queue_while_main_waits(intake, bridge, values)
        await _until(lambda: len(driver.waiting) == 1)
        await asyncio.sleep(0.02)
        assert driver.calls == [([b"a", b"b", b"c", b"d", b"e", b"f", b"g"], threading.get_ident())]
        assert bridge.handoffs == 1
        assert not any(task.done() for task in tasks)  # acknowledged means durable: nothing before the commit
        driver.commit_all()

        async def results() -> list[tuple[int, LeaderAndEpoch]]:
            return list(await asyncio.gather(*tasks))

        async with asyncio.timeout(TIMEOUT_S):
            answers = await intake.run(results())
        # offsets 10..16 in arrival order: each caller's last one
        leader = LeaderAndEpoch(1, 3)
        assert answers == [(10, leader), (12, leader), (13, leader), (16, leader)]
    finally:
        intake.close()


async def test_a_failed_wait_fails_every_caller_of_the_handoff_and_a_refusal_comes_back_at_once() -> None:
    intake = IntakeLoop(name="test-append-bridge-fail")
    intake.start()
    driver = FakeDriver()
    bridge = AppendBridge(asyncio.get_running_loop(), driver)
    lost = NotLeaderError(LeaderAndEpoch(2, 4), "leadership lost before the append committed")

    async def outcomes(tasks: list[asyncio.Task[Any]]) -> list[Any]:
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    try:
        tasks = _queue_while_main_waits(intake, bridge, [[b"x"], [b"y"]])
        await _until(lambda: len(driver.waiting) == 1)
        driver.fail_all(lost)
        async with asyncio.timeout(TIMEOUT_S):
            failed = await intake.run(outcomes(tasks))
        assert failed == [lost, lost] and failed[0].leader == LeaderAndEpoch(2, 4)

        driver.refuse = RaftShutdownError("raft is shut down")
        async with asyncio.timeout(TIMEOUT_S):
            refused = await intake.run(outcomes(_queue_while_main_waits(intake, bridge, [[b"x"], [b"y"]])))
        assert all(isinstance(each, RaftShutdownError) for each in refused) and len(refused) == 2
    finally:
        intake.close()


async def test_a_cancelled_caller_leaves_the_others_answered() -> None:
    intake = IntakeLoop(name="test-append-bridge-cancel")
    intake.start()
    driver = FakeDriver()
    bridge = AppendBridge(asyncio.get_running_loop(), driver)

    async def cancel_middle_then_gather(tasks: list[asyncio.Task[Any]]) -> list[Any]:
        tasks[1].cancel()
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    try:
        tasks = _queue_while_main_waits(intake, bridge, [[b"1"], [b"2"], [b"3"]])
        await _until(lambda: len(driver.waiting) == 1)
        gathered = asyncio.ensure_future(intake.run(cancel_middle_then_gather(tasks)))
        await asyncio.sleep(0.02)
        driver.commit_all()
        async with asyncio.timeout(TIMEOUT_S):
            answers = await gathered
        assert answers[0] == (10, LeaderAndEpoch(1, 3)) and answers[2] == (12, LeaderAndEpoch(1, 3))
        assert isinstance(answers[1], asyncio.CancelledError)
    finally:
        intake.close()


async def test_appends_fail_with_the_shutdown_error_once_the_main_loop_is_closed() -> None:
    closed = asyncio.new_event_loop()
    closed.close()
    bridge = AppendBridge(closed, FakeDriver())
    with pytest.raises(RaftShutdownError):
        async with asyncio.timeout(TIMEOUT_S):
            await bridge.append([b"x"])
    with pytest.raises(RaftShutdownError):  # and again: the hand-off flag was reset with the queue
        async with asyncio.timeout(TIMEOUT_S):
            await bridge.append([b"y"])


async def test_leader_and_epoch_is_read_on_the_main_loop() -> None:
    intake = IntakeLoop(name="test-append-bridge-leader")
    intake.start()
    main_thread = threading.get_ident()

    driver = FakeDriver()
    driver.leader = LeaderAndEpoch(5, 6)
    bridge = AppendBridge(asyncio.get_running_loop(), driver)
    try:
        async with asyncio.timeout(TIMEOUT_S):
            assert await intake.run(bridge.leader_and_epoch()) == LeaderAndEpoch(5, 6)
        assert driver.leader_reads == [main_thread]
    finally:
        intake.close()


async def test_append_callback_calls_back_once_committed_and_with_the_error_that_ends_the_wait() -> None:
    driver = single_voter()
    await leading(driver)
    answers: list[tuple[int | None, BaseException | None]] = []
    done = asyncio.Event()

    def on_commit(offset: int | None, error: BaseException | None) -> None:
        answers.append((offset, error))
        done.set()

    try:
        last = driver.append_callback([b"a", b"b", b"c"], on_commit)
        async with asyncio.timeout(TIMEOUT_S):
            await done.wait()
        assert answers == [(last, None)] and driver.high_watermark > last
        await asyncio.sleep(0.01)
        assert len(answers) == 1  # called once
        # A wait that the stop ends hears the stop.
        answers.clear()
        done.clear()
        driver.append_callback([b"d"], on_commit)
        await driver.stop()
        assert len(answers) == 1 and answers[0][0] is None and isinstance(answers[0][1], RaftShutdownError)
        with pytest.raises(RaftShutdownError):  # refused at once, never called back
            driver.append_callback([b"e"], on_commit)
        assert len(answers) == 1
    finally:
        await driver.stop()


async def test_the_bridge_over_a_real_driver_commits_each_callers_records_in_order() -> None:
    log = MemoryLogStore()
    driver = single_voter(log)
    await leading(driver)
    intake = IntakeLoop(name="test-append-bridge-driver")
    intake.start()
    bridge = AppendBridge(asyncio.get_running_loop(), driver)
    values = [[f"{caller}-{i}".encode() for i in range(caller % 3 + 1)] for caller in range(40)]

    async def all_callers() -> list[tuple[int, LeaderAndEpoch]]:
        return list(await asyncio.gather(*(bridge.append(each) for each in values)))

    try:
        async with asyncio.timeout(TIMEOUT_S):
            answers = await intake.run(all_callers())
        assert bridge.handoffs < len(values)  # calls shared hand-offs
        by_offset: dict[int, bytes] = {}
        for batch in iter_batches(log.read(0, 1 << 20)):
            if not batch.is_control:
                for record in batch.records:
                    assert record.value is not None
                    by_offset[batch.base_offset + record.offset_delta] = record.value
        high_watermark = driver.high_watermark
        for each, (last, leader) in zip(values, answers, strict=True):
            assert last < high_watermark and leader == LeaderAndEpoch(1, driver.leader_and_epoch.epoch)
            assert [by_offset[offset] for offset in range(last - len(each) + 1, last + 1)] == each
        assert len({last for last, _leader in answers}) == len(values)  # no offset given twice
    finally:
        intake.close()
        await driver.stop()


async def test_append_methods_are_native_with_the_bridge_only() -> None:
    intake = IntakeLoop(name="test-append-native")
    intake.start()
    handler = object()

    async def continuation(_details: Any) -> Any:
        return handler

    class Details:
        def __init__(self, method: str) -> None:
            self.method = method

    try:
        assert {
            "/kraft.v1.RaftTestService/TestAppend",
            "/kraft.v1.RaftTestService/TestAppendStream",
        } == APPEND_METHODS
        hop = HopInterceptor(asyncio.get_running_loop(), intake.loop, native=APPEND_METHODS)
        for method in APPEND_METHODS:
            served = await intake.run(hop.intercept_service(continuation, Details(method)))  # type: ignore[arg-type]
            assert served is handler
    finally:
        intake.close()


@pytest.mark.parametrize("on_intake", [True, False])
async def test_the_config_switch_picks_the_bridge_or_the_hop(tmp_path: Path, on_intake: bool) -> None:
    """``controller.raft.test.append.on.intake`` (bench A/B switch): on, TestAppend and TestAppendStream
    reach the driver through ``append_callback`` (the bridge); off, through ``append`` on the main loop;
    either way every caller gets its own committed offsets, and the errors are the same."""
    calls: list[str] = []
    port = free_port()
    cluster_id = random_uuid()
    format_log_dir(tmp_path / "meta", cluster_id=cluster_id, node_id=1)
    config = NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=tmp_path / "meta",
        kraft_test_append_enable=True,
        controller_raft_test_append_on_intake=on_intake,
    )
    node = ControllerNode(config)
    await node.start()
    raft = node._raft
    assert isinstance(raft, RaftDriver)
    append_callback, append = raft.append_callback, raft.append
    # Both bridges hold their hand-offs during the leader's fsync (the Fetch bridge: fetch.on.intake)
    pulled = sorted(type(source).__name__ for source in raft._pull_sources)
    assert pulled == (["AppendBridge", "DriverBridge"] if on_intake else ["DriverBridge"])

    def counting_callback(records: Sequence[bytes], on_commit: Commit) -> int:
        calls.append("append_callback")
        return append_callback(records, on_commit)

    async def counting_append(records: Sequence[bytes]) -> int:
        calls.append("append")
        return await append(records)

    raft.append_callback = counting_callback  # type: ignore[method-assign]
    raft.append = counting_append  # type: ignore[method-assign]
    try:
        async with open_channel(f"127.0.0.1:{port}") as channel:
            stub = raft_pb2_grpc.RaftTestServiceStub(channel)
            deadline = time.monotonic() + TIMEOUT_S
            while True:  # bounded: the single voter elects itself on the system clock
                answer = await stub.TestAppend(
                    raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[b"first"]), timeout=TIMEOUT_S
                )
                if answer.error_code == ErrorCode.NONE or time.monotonic() > deadline:
                    break
                await asyncio.sleep(0.01)
            assert answer.error_code == ErrorCode.NONE and answer.leader_id == 1
            requests = [
                raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[b"v"] * n) for n in (1, 2, 3, 4)
            ]
            answers = await asyncio.gather(*(stub.TestAppend(r, timeout=TIMEOUT_S) for r in requests))
            spans = sorted((a.base_offset, a.last_offset) for a in answers)
            assert all(a.error_code == ErrorCode.NONE and a.leader_id == 1 for a in answers)
            assert sorted(b - a + 1 for a, b in spans) == [1, 2, 3, 4]
            assert all(later[0] > earlier[1] for earlier, later in itertools.pairwise(spans))
            assert all(span[0] > answer.last_offset for span in spans)  # after the first write's offsets
            stream = stub.TestAppendStream(None)
            await stream.write(raft_pb2.TestAppendRequest(cluster_id=cluster_id, values=[b"s1", b"s2"]))
            streamed = await stream.read()
            assert isinstance(streamed, raft_pb2.TestAppendResponse) and streamed.error_code == ErrorCode.NONE
            assert streamed.last_offset - streamed.base_offset == 1 and streamed.base_offset > spans[-1][1]
            await stream.done_writing()
            wrong = await stub.TestAppend(
                raft_pb2.TestAppendRequest(cluster_id="another", values=[b"x"]), timeout=TIMEOUT_S
            )
            assert wrong.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID and wrong.leader_id == 1
            empty = await stub.TestAppend(
                raft_pb2.TestAppendRequest(cluster_id=cluster_id), timeout=TIMEOUT_S
            )
            assert empty.error_code == ErrorCode.INVALID_REQUEST and empty.leader_id == 1
    finally:
        await node.stop(timeout_ms=2000)
    assert calls and set(calls) == ({"append_callback"} if on_intake else {"append"})
