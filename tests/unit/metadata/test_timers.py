"""Timers and commit waits: measured on the injected clock, stepped by hand, cancellable at any turn."""

from __future__ import annotations

import asyncio

import pytest

from kraft.clock import ManualClock
from kraft.metadata.controller_state import ControllerState
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
