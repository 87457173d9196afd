"""The driver parks on its wake-up event with a loop timer for the deadline, not ``asyncio.timeout``
(issue #17, session 20: ~6 µs less of a follower's every round).  The timer sets the event; it must be
cancelled however the wait ends, or a wait that an event ended early would leave a timer that sets a
later wait's event — a spurious poll, and a driver that looks busy (``idle`` False) while parked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from raft_helpers import LoopbackCluster, wait_until


async def test_every_park_timer_but_the_current_ones_is_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    timers: list[asyncio.TimerHandle] = []
    fired: set[int] = set()  # indexes into timers of those that ran (a timer that ran is not live)
    call_later = loop.call_later

    def recording(delay: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        if getattr(callback, "__name__", "") != "_park_timer_fired":
            return call_later(delay, callback, *args, **kwargs)
        index = len(timers)

        def run() -> None:
            fired.add(index)
            callback(*args)

        handle = call_later(delay, run, **kwargs)
        timers.append(handle)
        return handle

    monkeypatch.setattr(loop, "call_later", recording)
    cluster = LoopbackCluster(3)
    await cluster.start_all()
    try:
        await cluster.elect()
        for _ in range(20):  # events end waits early: Fetch rounds, appends, manual-clock rechecks
            await cluster.advance(5)
        parked = len(cluster.drivers)
        assert len(timers) > 3 * parked
        assert all(driver.idle for driver in cluster.drivers.values())
        # Each parked driver holds one live timer (its current wait); every earlier one ran or was
        # cancelled.
        live = [handle for i, handle in enumerate(timers) if not handle.cancelled() and i not in fired]
        assert len(live) == parked
    finally:
        await cluster.close()
    # stopping cancels the last waits' too
    assert all(handle.cancelled() or i in fired for i, handle in enumerate(timers))


async def test_a_driver_parked_on_a_manual_clock_is_not_woken_by_the_loop_timer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A follower whose delayed listener wake-up is 1 manual ms away parks on a loop timer of 1 ms.  The
    # manual clock does not move with the loop, so when that timer runs the wake-up is still not due: the
    # driver must stay parked and idle, not poll once per real millisecond (which kept `settle` from ever
    # seeing it idle on a loaded host: tests/unit/raft/test_follower_listener_wake.py, session 21).
    cluster = LoopbackCluster(2)
    cluster.driver_options = {"follower_listener_delay_ms": 10}
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        follower = next(d for n, d in cluster.drivers.items() if n != leader.node_id)
        await cluster.advance(10)
        leader.schedule_append([b"a"])
        await cluster.settle()
        leader.schedule_append([b"b"])
        await cluster.settle()  # the follower learned a commit: its listeners' wake-up is 10 ms away
        await cluster.advance(9)
        core = follower._core
        polls = 0
        poll = core.poll

        def counting_poll(now_ms: int) -> Any:
            nonlocal polls
            polls += 1
            return poll(now_ms)

        monkeypatch.setattr(core, "poll", counting_poll)
        # Real time passes (the 1 ms loop timer runs, again and again); manual time does not.
        for _ in range(10):
            await asyncio.sleep(0.003)
            assert follower.idle
        assert polls == 0
        # Once the clock reaches the deadline, the loop timer wakes the driver by itself (no
        # recheck_timers): the re-armed timer still stands for the deadline.
        cluster.clock.advance(1)
        await wait_until(lambda: polls > 0, 5.0, "the follower woken by its park timer once due")
    finally:
        await cluster.close()
