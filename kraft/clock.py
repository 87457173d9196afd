"""The clock port: every timer in kraft reads time through a :class:`Clock`, so tests run on a manual one.

Production code takes a ``Clock`` in its constructor and gets :class:`SystemClock` from the composition
root; unit tests pass :class:`ManualClock` and move it by hand, so nothing they assert depends on how
fast the host happens to be.
"""

from __future__ import annotations

import time
from typing import Protocol


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
