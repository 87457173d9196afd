"""The clock port: every timer in kraft reads time through a :class:`Clock`, so tests run on a manual one.

Production code takes a ``Clock`` in its constructor and gets :class:`SystemClock` from the composition
root; unit tests pass :class:`ManualClock` and move it by hand, so nothing they assert depends on how
fast the host happens to be.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Generator
from typing import Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def monotonic_ms(self) -> int:
        """For timers: never goes back."""
        ...

    def wall_ms(self) -> int:
        """For record timestamps."""
        ...


class SystemClock:
    def monotonic_ms(self) -> int:
        return time.monotonic_ns() // 1_000_000

    def wall_ms(self) -> int:
        return time.time_ns() // 1_000_000


class ManualClock:
    """A clock tests move by hand."""

    def __init__(self, start_ms: int = 0, wall_start_ms: int = 1_700_000_000_000) -> None:
        self.now_ms = start_ms
        self._wall_offset = wall_start_ms - start_ms

    def monotonic_ms(self) -> int:
        return self.now_ms

    def wall_ms(self) -> int:
        return self.now_ms + self._wall_offset

    def advance(self, delta_ms: int) -> None:
        self.now_ms += delta_ms


DEFAULT_WORK_UNIT_MS = 5
"""The default time budget of one bounded work unit (``controller.max.event.time.ms``): an event of the
controller, a slice of a committed batch's replay, a slice of a broker's metadata replay."""

CHECK_EVERY = 32
"""Items a budgeted loop handles between two clock reads (a read costs ~0.2 µs, an item 2 to 20 µs)."""


class Deadline:
    """The time budget of one work unit, started on creation: :meth:`expired` once ``budget_ms`` have
    passed on ``clock``.  ``budget_ms <= 0`` (or no clock) never expires: the unit is bounded by its
    record count only.  A unit checks it between items, so it always makes progress (at least one item)
    and overruns by at most one item (or ``CHECK_EVERY`` of them where it checks less often)."""

    __slots__ = ("_clock", "_until_ms", "started_ms")

    def __init__(self, clock: Clock | None, budget_ms: int) -> None:
        self._clock = clock if budget_ms > 0 else None
        self.started_ms = 0 if self._clock is None else self._clock.monotonic_ms()
        self._until_ms = self.started_ms + budget_ms

    def expired(self, reserve_ms: float = 0.0) -> bool:
        """``reserve_ms``: time the unit will still spend after it stops (work it already took on and
        closes at the end, e.g. the speculative image of a bulk slice's changes), counted as spent now."""
        clock = self._clock
        return clock is not None and clock.monotonic_ms() + reserve_ms >= self._until_ms


async def run_paced(
    steps: Generator[None, None, T],
    clock: Clock,
    budget_ms: int,
    on_pause: Callable[[], None] | None = None,
) -> T:
    """Run a stepped computation (a generator that yields between steps and returns its result, as
    ``MetadataDelta.apply_steps``) to its end, yielding the event loop whenever ``budget_ms`` ran out
    (checked after each step); ``on_pause`` runs before each such yield."""
    deadline = Deadline(clock, budget_ms)
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]
        if deadline.expired():
            if on_pause is not None:
                on_pause()
            await asyncio.sleep(0)
            deadline = Deadline(clock, budget_ms)
