"""Fakes for measuring how work shares the event loop, shared by every test suite (importable as
``loop_fakes``: pytest puts this directory, the one of the rootmost conftest.py, on ``sys.path``, and the
lint's MYPYPATH starts with it).

Tests of paced, budgeted work (a broker's metadata replay, the controller's replay of a committed batch,
a paced deletion) run it on a clock whose reads cost time and count the loop turns other tasks get."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from kraft.clock import ManualClock

T = TypeVar("T")


class CostClock(ManualClock):
    """Every read of the clock costs ``cost_ms`` (1 ms unless told: as if each step of work took that
    long; budgeted loops read it once per ``CHECK_EVERY`` items)."""

    def __init__(self, cost_ms: int = 1) -> None:
        super().__init__()
        self.cost_ms = cost_ms

    def monotonic_ms(self) -> int:
        self.advance(self.cost_ms)
        return super().monotonic_ms()


class LoopTurns:
    """The event loop's turns while some work is awaited, counted by a task that ticks once per turn:
    work that yields the loop (paced, bounded work units) lets it tick in between.  With a ``clock``,
    also how far the clock moved between two ticks (the longest stretch of work without a yield)."""

    def __init__(self, clock: ManualClock | None = None) -> None:
        self.clock = clock
        self.turns = 0
        self.stretches: list[int] = []

    async def during(self, work: Awaitable[T]) -> T:
        done = False

        async def ticker() -> None:
            last = self.clock.now_ms if self.clock is not None else 0
            while not done:
                self.turns += 1
                await asyncio.sleep(0)
                if self.clock is not None:
                    self.stretches.append(self.clock.now_ms - last)
                    last = self.clock.now_ms

        ticking = asyncio.create_task(ticker())
        try:
            return await work
        finally:
            done = True
            await ticking
