"""Sleeps of the controller's timer tasks, measured on an injected :class:`~kraft.clock.Clock`.

A timer task computes its next deadline from the clock and calls :meth:`Timers.sleep_until`, which waits
on the event loop for the time the clock says is left and then asks the clock again.  With
:class:`~kraft.clock.SystemClock` that is an ordinary sleep.  With :class:`~kraft.clock.ManualClock` the
loop's own time means nothing: a test moves the clock and calls :meth:`Timers.clock_moved`, and every
sleeper whose deadline has passed returns on its next loop turn, so session expiry, idle NoOps and
snapshot intervals are tested without waiting for wall time.  (The controller simulation instead runs
the event loop on virtual time, so the loop's timers and the ManualClock agree.)
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from kraft.clock import Clock


def _wake(sleeper: asyncio.Future[None]) -> None:
    if not sleeper.done():
        sleeper.set_result(None)


def _waker(sleeper: asyncio.Future[None]) -> Callable[[asyncio.Future[None]], None]:
    return lambda _event: _wake(sleeper)


class Timers:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._sleepers: set[asyncio.Future[None]] = set()

    def now_ms(self) -> int:
        return self.clock.monotonic_ms()

    async def sleep_until(self, deadline_ms: int) -> None:
        """Return once the clock reads ``deadline_ms`` or later.

        A bare future and a loop timer, like ``asyncio.sleep``: cancelling the sleeping task cancels the
        sleep (``wait_for`` on an event could swallow a cancellation that raced with its wake-up).
        """
        loop = asyncio.get_running_loop()
        while (remaining_ms := deadline_ms - self.clock.monotonic_ms()) > 0:
            sleeper = loop.create_future()
            timer = loop.call_later(remaining_ms / 1000, _wake, sleeper)
            self._sleepers.add(sleeper)
            try:
                await sleeper
            finally:
                timer.cancel()
                self._sleepers.discard(sleeper)

    async def wait(self, event: asyncio.Future[None], deadline_ms: int) -> bool:
        """Wait until ``event`` completes (True) or the clock reaches ``deadline_ms`` (False).

        ``event`` is only watched, never awaited: it may be shared by many waiters, and cancelling one of
        them must not cancel it.
        """
        loop = asyncio.get_running_loop()
        while not event.done():
            remaining_ms = deadline_ms - self.clock.monotonic_ms()
            if remaining_ms <= 0:
                return False
            sleeper = loop.create_future()
            timer = loop.call_later(remaining_ms / 1000, _wake, sleeper)
            self._sleepers.add(sleeper)
            event.add_done_callback(sleeper_waker := _waker(sleeper))
            try:
                await sleeper
            finally:
                timer.cancel()
                self._sleepers.discard(sleeper)
                event.remove_done_callback(sleeper_waker)
        return True

    async def sleep_ms(self, delay_ms: int) -> None:
        await self.sleep_until(self.clock.monotonic_ms() + delay_ms)

    def clock_moved(self) -> None:
        """The clock jumped (a test moved a ManualClock): every sleeper checks its deadline again."""
        for sleeper in list(self._sleepers):
            _wake(sleeper)
