"""Sleeps of the controller's timer tasks, measured on an injected :class:`~kraft.clock.Clock`.

A timer task computes its next deadline from the clock and calls :meth:`Timers.sleep_until`, which waits
on the event loop for the time the clock says is left and then asks the clock again.  With
:class:`~kraft.clock.SystemClock` that is an ordinary sleep.  With :class:`~kraft.clock.ManualClock` the
loop's own time means nothing: a test moves the clock and calls :meth:`Timers.clock_moved`, and every
sleeper whose deadline has passed returns on its next loop turn, so session expiry, idle NoOps and
snapshot intervals are tested without waiting for wall time.
"""

from __future__ import annotations

import asyncio
import contextlib

from kraft.clock import Clock


class Timers:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._moved = asyncio.Event()

    def now_ms(self) -> int:
        return self.clock.monotonic_ms()

    async def sleep_until(self, deadline_ms: int) -> None:
        """Return once the clock reads ``deadline_ms`` or later."""
        while (remaining_ms := deadline_ms - self.clock.monotonic_ms()) > 0:
            moved = self._moved
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(moved.wait(), remaining_ms / 1000)

    async def sleep_ms(self, delay_ms: int) -> None:
        await self.sleep_until(self.clock.monotonic_ms() + delay_ms)

    def clock_moved(self) -> None:
        """The clock jumped (a test moved a ManualClock): every sleeper checks its deadline again."""
        moved, self._moved = self._moved, asyncio.Event()
        moved.set()
