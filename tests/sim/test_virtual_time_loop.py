"""The simulations' :class:`VirtualTimeLoop` with thread work in play (``asyncio.to_thread``,
``run_in_executor``): the work runs on the loop's own thread and its answer is ready within the same
:meth:`~VirtualTimeLoop.run_ready`, so no virtual time passes while it is pending and a seed replays
whatever a real thread's speed would have been."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from collections.abc import Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from kraft.clock import ManualClock
from sim.sim_raft_client import VirtualTimeLoop

_T = TypeVar("_T")


@pytest.fixture
def loop() -> Iterator[VirtualTimeLoop]:
    created = VirtualTimeLoop(ManualClock(start_ms=1_000))
    yield created
    created.close()


def _run(loop: VirtualTimeLoop, work: Coroutine[Any, Any, _T]) -> asyncio.Task[_T]:
    task = loop.create_task(work)
    loop.run_ready()
    return task


def _where() -> str:
    return threading.current_thread().name


def test_to_thread_work_runs_on_the_loops_thread_and_is_answered_before_the_loop_counts_idle(
    loop: VirtualTimeLoop,
) -> None:
    steps: list[str] = []

    async def work() -> str:
        steps.append("before")
        where = await asyncio.to_thread(_where)
        steps.append("after")
        return where

    # Another task runs while the first awaits its thread's answer: the awaiter still gives way.
    async def other() -> None:
        steps.append("other")

    task = loop.create_task(work())
    loop.create_task(other())
    loop.run_ready()
    assert task.done()  # answered within the one run_ready: the clock was never free to move on
    assert task.result() == threading.main_thread().name
    assert steps == ["before", "other", "after"]
    assert loop.time() == 1.0  # no virtual time passed


def test_an_explicit_executor_is_not_used_either(loop: VirtualTimeLoop) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        task = _run(loop, _in_executor(pool))
    assert task.done() and task.result() == threading.main_thread().name


async def _in_executor(pool: concurrent.futures.Executor) -> str:
    return await asyncio.get_running_loop().run_in_executor(pool, _where)


def test_the_works_error_reaches_its_awaiter(loop: VirtualTimeLoop) -> None:
    def failing() -> None:
        raise OSError(5, "Input/output error")

    task = _run(loop, asyncio.to_thread(failing))
    assert task.done()
    with pytest.raises(OSError, match="Input/output error"):
        task.result()


def test_an_awaiter_cancelled_before_the_answer_is_handed_over_stays_cancelled(loop: VirtualTimeLoop) -> None:
    errors: list[dict[str, Any]] = []
    loop.set_exception_handler(lambda _loop, context: errors.append(context))
    future = loop.run_in_executor(None, _where)
    future.cancel()
    loop.run_ready()
    assert future.cancelled()
    assert errors == []  # the hand-over found it cancelled (no InvalidStateError in a callback)


def test_run_ready_runs_exactly_the_timers_due_and_skips_cancelled_and_run_ones() -> None:
    """``run_ready`` leaves an idle loop alone but not one with a timer due (nothing else ready), runs
    what a due callback schedules for now in the same call, and ``next_timer_ms`` (the simulation's next
    wake-up) never names a cancelled timer or one that already ran."""
    clock = ManualClock(start_ms=1_000)
    loop = VirtualTimeLoop(clock)
    ran: list[str] = []

    def at_5ms() -> None:
        ran.append("5ms")
        loop.call_later(0, ran.append, "then now")

    try:
        loop.call_later(0.005, at_5ms)
        loop.call_later(0.002, ran.append, "cancelled").cancel()
        loop.call_later(0.010, ran.append, "10ms")
        loop.run_ready()
        assert ran == []
        assert loop.next_timer_ms() == 1_005
        clock.now_ms = 1_005
        loop.run_ready()
        assert ran == ["5ms", "then now"]
        assert loop.next_timer_ms() == 1_010
        clock.now_ms = 1_010
        loop.run_ready()
        assert ran == ["5ms", "then now", "10ms"]
        assert loop.next_timer_ms() is None
    finally:
        loop.close()
