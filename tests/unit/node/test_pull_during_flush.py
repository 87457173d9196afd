"""The pull path (issue #17 session 12, kraft.raft.driver.PullSource): while the leader's fsync runs, the
request plane's bridges (kraft.node.intake.AppendBridge, DriverBridge) keep what arrives instead of waking
the main loop per hand-off, and the driver takes it all when the fsync returns.  A lone write is still
handed off at once; nobody is answered before the commit; offsets keep arrival order; a stop, a failed
fsync or a lost leadership reaches every held caller."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from typing import Any

from single_voter import leading, single_voter
from test_append_bridge import FakeDriver

from kraft.node.intake import AppendBridge, DriverBridge, IntakeLoop
from kraft.raft.api import LeaderAndEpoch, NotLeaderError, RaftShutdownError
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import MemoryLogStore
from kraft.raft.messages import FetchRequest, FetchResponse, RaftResponse
from kraft.storage.batch import iter_batches
from kraft.storage.errors import FatalStorageError

TIMEOUT_S = 5.0

Appended = tuple[int, LeaderAndEpoch]


class GatedLog(MemoryLogStore):
    """A log whose fsync (on the driver's fsync thread) waits while the gate is closed, so a test can hold
    the leader in "flush in flight" as long as it needs; ``fail`` makes the next flush raise."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.gate.set()
        self.flushing = threading.Event()  # set while a flush waits at the closed gate
        self.fail: BaseException | None = None

    def flush(self) -> int:
        if not self.gate.is_set():
            self.flushing.set()
            if not self.gate.wait(TIMEOUT_S):
                raise AssertionError("the test never opened the gate")
            self.flushing.clear()
        if self.fail is not None:
            raise self.fail
        return super().flush()


async def _until(condition: Callable[[], bool]) -> None:
    async with asyncio.timeout(TIMEOUT_S):
        while not condition():  # noqa: ASYNC110 - another thread's state, no event to wait on
            await asyncio.sleep(0.001)


def _start(intake: IntakeLoop, bridge: AppendBridge, values: Sequence[list[bytes]]) -> list[Any]:
    """Start one append per entry of ``values`` on the intake loop, in order, and wait until all are
    queued in the bridge or handed off (each task runs to its await in the order it was created)."""

    async def start() -> list[asyncio.Task[Appended]]:
        tasks = [asyncio.get_running_loop().create_task(bridge.append(each)) for each in values]
        await asyncio.sleep(0)  # every task runs up to its await: queued, in creation order
        return tasks

    return asyncio.run_coroutine_threadsafe(start(), intake.loop).result(TIMEOUT_S)


async def _outcomes(intake: IntakeLoop, tasks: list[Any]) -> list[Any]:
    async def gather() -> list[Any]:
        return list(await asyncio.gather(*tasks, return_exceptions=True))

    async with asyncio.timeout(TIMEOUT_S):
        return await intake.run(gather())


def _values_by_batch(log: MemoryLogStore) -> list[list[bytes]]:
    batches = []
    for batch in iter_batches(log.read(0, 1 << 20)):
        if not batch.is_control:
            batches.append([record.value for record in batch.records if record.value is not None])
    return batches


async def _gated_leader() -> tuple[GatedLog, RaftDriver, IntakeLoop, AppendBridge]:
    log = GatedLog()
    driver = single_voter(log)
    await leading(driver)
    intake = IntakeLoop(name="test-pull")
    intake.start()
    return log, driver, intake, AppendBridge(asyncio.get_running_loop(), driver)


async def test_appends_during_the_leaders_fsync_wait_unposted_and_are_cut_as_one_batch_after_it() -> None:
    log, driver, intake, bridge = await _gated_leader()
    try:
        log.gate.clear()
        first = _start(intake, bridge, [[b"first"]])
        # A lone write is handed off and written at once: its fsync is what now waits at the gate.
        await _until(log.flushing.is_set)
        assert bridge.handoffs == 1 and bridge.pulled == 0
        next_offset = driver.next_append_offset
        held = _start(intake, bridge, [[b"a"], [b"b", b"c"], [b"d"]])
        await asyncio.sleep(0.02)  # main-loop turns: nothing may reach the driver while its fsync runs
        assert driver.next_append_offset == next_offset and bridge.handoffs == 1 and bridge.pulled == 0
        assert len(bridge._queued) == 3
        assert not any(task.done() for task in first + held)  # acknowledged means committed: not yet
        log.gate.set()
        answers = await _outcomes(intake, first + held)
        assert bridge.pulled == 1 and bridge.handoffs == 2  # the three held calls: one driver append
        epoch = driver.leader_and_epoch.epoch
        leader = LeaderAndEpoch(1, epoch)
        start = answers[0][0]
        # Each caller's last offset, in arrival order, all committed.
        assert answers == [(start, leader), (start + 1, leader), (start + 3, leader), (start + 4, leader)]
        assert all(last < driver.high_watermark for last, _leader in answers)
        assert _values_by_batch(log)[-2:] == [
            [b"first"],
            [b"a", b"b", b"c", b"d"],
        ]  # one batch after the fsync
    finally:
        log.gate.set()
        intake.close()
        await driver.stop()


async def test_a_lone_write_on_an_idle_leader_is_handed_off_at_once() -> None:
    log, driver, intake, bridge = await _gated_leader()
    try:
        for round_ in range(3):  # each waits for nothing but its own commit
            answers = await _outcomes(intake, _start(intake, bridge, [[b"w%d" % round_]]))
            assert isinstance(answers[0], tuple) and answers[0][0] < driver.high_watermark
        assert bridge.handoffs == 3 and bridge.pulled == 0
        assert _values_by_batch(log)[-3:] == [[b"w0"], [b"w1"], [b"w2"]]
    finally:
        intake.close()
        await driver.stop()


async def test_a_stop_during_the_fsync_fails_the_held_callers_with_the_shutdown_error() -> None:
    log, driver, intake, bridge = await _gated_leader()
    try:
        log.gate.clear()
        first = _start(intake, bridge, [[b"first"]])
        await _until(log.flushing.is_set)
        held = _start(intake, bridge, [[b"x"], [b"y"]])
        await asyncio.sleep(0.01)
        await driver.stop()
        answers = await _outcomes(intake, first + held)
        assert all(isinstance(answer, RaftShutdownError) for answer in answers), answers
        assert bridge._queued == [] and not bridge._held
    finally:
        log.gate.set()
        intake.close()
        await driver.stop()


async def test_a_failed_fsync_fails_the_held_callers_too() -> None:
    log, driver, intake, bridge = await _gated_leader()
    fatal: list[str] = []
    driver.on_fatal(lambda reason, _error: fatal.append(reason))
    try:
        log.gate.clear()
        first = _start(intake, bridge, [[b"first"]])
        await _until(log.flushing.is_set)
        held = _start(intake, bridge, [[b"x"], [b"y"]])
        await asyncio.sleep(0.01)
        log.fail = FatalStorageError("fsync failed")
        log.gate.set()
        answers = await _outcomes(intake, first + held)
        assert all(isinstance(answer, RaftShutdownError) for answer in answers), answers
        assert fatal == ["raft_driver_failed"]
    finally:
        log.gate.set()
        intake.close()
        await driver.stop()


async def test_held_appends_follow_a_posted_hand_off_in_arrival_order_and_hear_a_refusal() -> None:
    """An append posted before the hold and appends held after it share the queue: the posted hand-off
    (run during the fsync) takes what is queued by then, the release the rest — offsets in arrival order."""
    intake = IntakeLoop(name="test-pull-order")
    intake.start()
    driver = FakeDriver()
    bridge = AppendBridge(asyncio.get_running_loop(), driver)
    assert driver.sources == [bridge]  # the bridge registered itself with the driver
    try:
        # The main loop does not yield between these: the first hand-off is posted but not yet run.
        posted = _start(intake, bridge, [[b"a"], [b"b"]])
        bridge.hold()
        joined = _start(intake, bridge, [[b"c"]])
        await _until(lambda: len(driver.calls) == 1)  # the posted hand-off takes a, b and c
        later = _start(intake, bridge, [[b"d", b"e"], [b"f"]])
        await asyncio.sleep(0.02)
        assert [records for records, _thread in driver.calls] == [[b"a", b"b", b"c"]]  # d..f held
        bridge.release()
        assert [records for records, _thread in driver.calls] == [[b"a", b"b", b"c"], [b"d", b"e", b"f"]]
        assert bridge.handoffs == 2 and bridge.pulled == 1
        driver.commit_all()
        answers = await _outcomes(intake, posted + joined + later)
        assert [offset for offset, _leader in answers] == [10, 11, 12, 14, 15]

        # Not leader: the held callers hear the refusal when the driver takes them.
        driver.refuse = NotLeaderError(LeaderAndEpoch(2, 4), "not the leader")
        bridge.hold()
        refused = _start(intake, bridge, [[b"x"], [b"y"]])
        await asyncio.sleep(0.01)
        assert not any(task.done() for task in refused)
        bridge.release()
        outcomes = await _outcomes(intake, refused)
        assert all(
            isinstance(each, NotLeaderError) and each.leader == LeaderAndEpoch(2, 4) for each in outcomes
        )
    finally:
        intake.close()


async def test_fetches_during_a_hold_are_submitted_in_arrival_order_on_release() -> None:
    driver = single_voter()
    await leading(driver)
    intake = IntakeLoop(name="test-pull-fetch")
    intake.start()
    main_thread = threading.get_ident()
    submitted: list[tuple[int, int]] = []  # (replica id, thread)

    def submit(request: Any, *, peer_id: int | None, reply: Any) -> None:
        submitted.append((request.replica_id, threading.get_ident()))
        driver.submit_request(request, peer_id=peer_id, reply=reply)

    bridge = DriverBridge(asyncio.get_running_loop(), submit)
    epoch = driver.leader_and_epoch.epoch

    async def fetch(replica: int) -> RaftResponse:
        return await bridge.handle_request(FetchRequest("c1", replica, epoch, 0, 0))

    async def start(replicas: Sequence[int]) -> list[asyncio.Task[RaftResponse]]:
        tasks = [asyncio.get_running_loop().create_task(fetch(each)) for each in replicas]
        await asyncio.sleep(0)
        return tasks

    try:
        bridge.hold()
        tasks = asyncio.run_coroutine_threadsafe(start([7, 8, 9]), intake.loop).result(TIMEOUT_S)
        await asyncio.sleep(0.02)
        assert submitted == [] and bridge.pulled == 0  # none posted while held
        bridge.release()
        assert submitted == [(7, main_thread), (8, main_thread), (9, main_thread)] and bridge.pulled == 3
        answers = await _outcomes(intake, tasks)
        assert all(isinstance(each, FetchResponse) for each in answers)
        # Released, the bridge posts at once again.
        async with asyncio.timeout(TIMEOUT_S):
            assert isinstance(await intake.run(fetch(10)), FetchResponse)
        assert submitted[-1] == (10, main_thread) and bridge.pulled == 3
    finally:
        intake.close()
        await driver.stop()


async def test_the_driver_releases_every_hold_after_the_flush_and_its_output() -> None:
    _log, driver, intake, bridge = await _gated_leader()
    seen: list[str] = []

    class Recorder:
        def hold(self) -> None:
            seen.append(f"hold flushed={driver.high_watermark}")

        def release(self) -> None:
            seen.append(f"release flushed={driver.high_watermark}")

    try:
        driver.pull_during_flush(Recorder())
        answers = await _outcomes(intake, _start(intake, bridge, [[b"v"]]))
        assert isinstance(answers[0], tuple)
        last = answers[0][0]
        # One hold per flush, each released — after on_flushed's output committed the batch it covered.
        assert f"release flushed={last + 1}" in seen
        assert [line.split()[0] for line in seen] == ["hold", "release"] * (len(seen) // 2)
    finally:
        intake.close()
        await driver.stop()
