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
        self._checks: set[Callable[[], None]] = set()  # deadline checks of wait_own()

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

    async def wait_own(self, future: asyncio.Future[None], deadline_ms: int) -> bool:
        """:meth:`wait` for a future that only the caller waits on (a commit waiter's): True once it
        completes (its exception, if any, stays in it), False once the clock reaches ``deadline_ms``
        (``future`` is then cancelled).  ``future`` itself is awaited, so its completion resumes the
        caller on the next loop turn; :meth:`wait` goes through a second future and a done-callback, a
        turn more between a commit and the request's answer (issue #17, a lone write's path).

        Cancelling the caller cancels ``future`` and raises, even when the deadline passed or the
        future completed in the same turn (``asyncio.wait_for`` on Python 3.11 swallowed such a
        cancellation: see :meth:`wait`)."""
        loop = asyncio.get_running_loop()
        expired = False
        handle: asyncio.TimerHandle | None = None

        def check() -> None:
            # the loop's timer fired, or the clock moved: expire once the clock says so, else re-arm
            nonlocal expired, handle
            if future.done():
                return
            remaining_ms = deadline_ms - self.clock.monotonic_ms()
            if remaining_ms > 0:
                if handle is not None:
                    handle.cancel()
                handle = loop.call_later(remaining_ms / 1000, check)
                return
            expired = True
            future.cancel()

        check()
        if expired:
            return False
        self._checks.add(check)
        try:
            await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if expired and (task is None or not task.cancelling()):
                return False
            future.cancel()
            raise
        except Exception:  # completed with an error: it stays in the future, for the caller
            pass
        finally:
            self._checks.discard(check)
            if handle is not None:
                handle.cancel()
        return True

    async def sleep_ms(self, delay_ms: int) -> None:
        await self.sleep_until(self.clock.monotonic_ms() + delay_ms)

    def clock_moved(self) -> None:
        """The clock jumped (a test moved a ManualClock): every sleeper checks its deadline again."""
        for sleeper in list(self._sleepers):
            _wake(sleeper)
        for check in list(self._checks):
            check()
