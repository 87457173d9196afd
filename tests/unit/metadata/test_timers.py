"""Timers and commit waits: measured on the injected clock, stepped by hand, cancellable at any turn."""

from __future__ import annotations

import asyncio

import pytest

from kraft.clock import ManualClock
from kraft.metadata.controller_state import ControllerState, NotControllerError
from kraft.metadata.controller_writes import WritePath
from kraft.metadata.timers import Timers
from kraft.observability.logging import get_logger

from .fake_raft import FakeRaft
from .test_controller import settle


async def test_a_sleep_ends_only_once_the_clock_reaches_its_deadline() -> None:
    clock = ManualClock(start_ms=1_000)
    timers = Timers(clock)
    sleeping = asyncio.create_task(timers.sleep_until(1_100))
    clock.advance(99)
    timers.clock_moved()
    await settle()
    assert not sleeping.done()
    clock.advance(1)
    timers.clock_moved()
    await settle()
    assert sleeping.done()


async def test_a_sleep_ignores_wall_time_while_the_manual_clock_stands_still() -> None:
    timers = Timers(ManualClock())
    sleeping = asyncio.create_task(timers.sleep_ms(20))
    await asyncio.sleep(0.05)  # the loop timer fires, the clock says 20 ms are still left
    assert not sleeping.done()
    sleeping.cancel()


async def test_a_cancelled_sleep_is_cancelled_even_when_the_clock_moved_in_the_same_turn() -> None:
    clock = ManualClock()
    timers = Timers(clock)
    sleeping = asyncio.create_task(timers.sleep_ms(10))
    await settle()
    clock.advance(10)
    timers.clock_moved()
    sleeping.cancel()
    with pytest.raises(asyncio.CancelledError):
        await sleeping


async def test_a_commit_wait_cancelled_in_the_turn_its_offset_commits_is_cancelled() -> None:
    """stop() cancels the idle NoOp task; on Python 3.11 ``wait_for`` handed it the commit instead, the
    task went on sleeping and stop() never returned (found by the controller simulation)."""
    state = ControllerState(node_id=1)
    writes = WritePath(
        state,
        FakeRaft(1),
        Timers(ManualClock()),
        commit_timeout_ms=30_000,
        leader_lease_ms=2_000,
        on_not_leader=lambda leader_id: None,
        log=get_logger("test"),
    )
    waiting = asyncio.create_task(writes.wait_committed(5))
    await settle()
    writes.resolve_waiters(5, epoch=-1)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting


async def test_an_own_wait_returns_on_the_turn_after_its_future_completes() -> None:
    """wait_own awaits the future itself: one loop turn from the commit to the waiter, where wait() takes
    two (a done-callback, then the sleeper's wake-up)."""
    timers = Timers(ManualClock())
    loop = asyncio.get_running_loop()
    turns: dict[str, int] = {}
    for name in ("wait", "wait_own"):
        future: asyncio.Future[None] = loop.create_future()
        waiting = asyncio.create_task(getattr(timers, name)(future, 30_000))
        await settle()
        future.set_result(None)
        count = 0
        while not waiting.done():
            await asyncio.sleep(0)
            count += 1
        assert waiting.result() is True
        turns[name] = count
    assert turns == {"wait": 2, "wait_own": 1}


async def test_an_own_wait_ends_once_the_clock_reaches_its_deadline_and_cancels_the_future() -> None:
    clock = ManualClock(start_ms=1_000)
    timers = Timers(clock)
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(timers.wait_own(future, 1_100))
    await asyncio.sleep(0.05)  # the loop's timer may fire: the manual clock still says 100 ms are left
    clock.advance(99)
    timers.clock_moved()
    await settle()
    assert not waiting.done() and not future.done()
    clock.advance(1)
    timers.clock_moved()
    await settle()
    assert waiting.result() is False and future.cancelled()
    assert await timers.wait_own(asyncio.get_running_loop().create_future(), 1_000) is False  # already due


async def test_an_own_wait_leaves_the_futures_error_in_it() -> None:
    timers = Timers(ManualClock())
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(timers.wait_own(future, 30_000))
    await settle()
    future.set_exception(ValueError("newer leader"))
    assert await waiting is True
    with pytest.raises(ValueError, match="newer leader"):
        future.result()


@pytest.mark.parametrize("same_turn", ["nothing", "deadline", "completion"])
async def test_a_cancelled_own_wait_is_cancelled_whatever_else_happened_in_that_turn(same_turn: str) -> None:
    clock = ManualClock()
    timers = Timers(clock)
    future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    waiting = asyncio.create_task(timers.wait_own(future, 10))
    await settle()
    if same_turn == "deadline":
        clock.advance(10)
        timers.clock_moved()
    elif same_turn == "completion":
        future.set_result(None)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert future.done()


async def test_a_commit_wait_times_out_on_the_clock_and_answers_a_newer_leaders_commit() -> None:
    state = ControllerState(node_id=1)
    clock = ManualClock()
    timers = Timers(clock)
    writes = WritePath(
        state,
        FakeRaft(1),
        timers,
        commit_timeout_ms=30_000,
        leader_lease_ms=2_000,
        on_not_leader=lambda leader_id: None,
        log=get_logger("test"),
    )
    waiting = asyncio.create_task(writes.wait_committed(5))
    await settle()
    clock.advance(30_000)
    timers.clock_moved()
    with pytest.raises(TimeoutError):
        await waiting
    state.active_epoch = 3
    waiting = asyncio.create_task(writes.wait_committed(6))
    await settle()
    writes.resolve_waiters(6, epoch=4)  # a newer leader's batch committed at that offset
    with pytest.raises(NotControllerError):
        await waiting
    waiting = asyncio.create_task(writes.wait_committed(7))
    await settle()
    writes.resolve_waiters(7, epoch=3)
    await waiting  # answered: the write committed in its own epoch
