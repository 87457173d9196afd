"""The driver parks on its wake-up event with a loop timer for the deadline, not ``asyncio.timeout``
(issue #17, session 20: ~6 µs less of a follower's every round).  The timer sets the event; it must be
cancelled however the wait ends, or a wait that an event ended early would leave a timer that sets a
later wait's event — a spurious poll, and a driver that looks busy (``idle`` False) while parked.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from raft_helpers import LoopbackCluster


async def test_every_park_timer_but_the_current_ones_is_cancelled(monkeypatch: pytest.MonkeyPatch) -> None:
    loop = asyncio.get_running_loop()
    timers: list[asyncio.TimerHandle] = []
    call_later = loop.call_later

    def recording(delay: float, callback: Any, *args: Any, **kwargs: Any) -> asyncio.TimerHandle:
        handle = call_later(delay, callback, *args, **kwargs)
        if getattr(callback, "__name__", "") == "set":
            timers.append(handle)  # an Event.set: the driver's park timer
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
        # Each parked driver holds one live timer (its current wait); every earlier one was cancelled.
        live = [handle for handle in timers if not handle.cancelled()]
        assert len(live) == parked
    finally:
        await cluster.close()
    assert all(handle.cancelled() for handle in timers)  # stopping cancels the last waits' too
