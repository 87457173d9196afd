"""The store writer's saves during bulk work (issue #17, session 15): while the committed log moves at a
bulk rate a save waits, at most ``STORE_MAX_DEFER_MS`` after the last one; below that rate it saves at
most once per ``STORE_MIN_INTERVAL_MS``, as before.  On a manual clock: each step moves the clock, commits
records and marks the store dirty, as ``QuorumController`` does on every commit."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kraft.clock import ManualClock
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.metadata.store_writer import (
    STORE_BULK_RECORDS_PER_S,
    STORE_MAX_DEFER_MS,
    STORE_MIN_INTERVAL_MS,
    StoreWriter,
)
from kraft.metadata.timers import Timers
from kraft.observability.logging import get_logger
from kraft.observability.metrics import ControllerMetrics

STEP_MS = 100


class Harness:
    def __init__(self, clock: ManualClock, timers: Timers, writer: StoreWriter) -> None:
        self.clock = clock
        self.timers = timers
        self.writer = writer
        self.image = MetadataImage.empty()
        self.saves: list[tuple[int, int]] = []  # (clock ms, offset saved)

    async def step(self, records: int) -> None:
        """``STEP_MS`` later, ``records`` more committed (a commit marks the store dirty)."""
        self.clock.advance(STEP_MS)
        if records:
            self.image = dataclasses.replace(self.image, offset=self.image.offset + records)
            self.writer.mark_dirty()
        self.timers.clock_moved()
        for _ in range(20):  # the writer's wake-ups: a bounded number of loop turns, no wall time
            await asyncio.sleep(0)

    async def run(self, duration_ms: int, records_per_s: int) -> None:
        for _ in range(duration_ms // STEP_MS):
            await self.step(records_per_s * STEP_MS // 1000)


@contextlib.asynccontextmanager
async def running_writer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, max_defer_ms: int = STORE_MAX_DEFER_MS
) -> AsyncIterator[Harness]:
    clock = ManualClock()
    timers = Timers(clock)
    holder: list[Harness] = []
    writer = StoreWriter(
        tmp_path / "metadata-image.sqlite",
        timers,
        lambda: holder[0].image,
        metrics=ControllerMetrics.for_node(1),
        log=get_logger("controller", node=1),
        max_defer_ms=max_defer_ms,
    )
    holder.append(Harness(clock, timers, writer))

    async def save(self: SqliteImageStore, image: MetadataImage) -> None:
        holder[0].saves.append((clock.monotonic_ms(), image.offset))

    monkeypatch.setattr(SqliteImageStore, "save", save)
    await writer.open()
    task = asyncio.create_task(writer.run())
    try:
        yield holder[0]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await writer.close()


@pytest.fixture
async def harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Harness]:
    async with running_writer(tmp_path, monkeypatch) as running:
        yield running


async def test_a_bulk_stream_is_saved_once_it_ends(harness: Harness) -> None:
    await harness.step(10)  # the first commit after a quiet spell: saved at once
    assert harness.saves == [(STEP_MS, 9)]
    stream_ms = 3_000  # a controlled shutdown's length on 2 cores
    await harness.run(stream_ms, 4 * STORE_BULK_RECORDS_PER_S)
    assert harness.saves == [(STEP_MS, 9)], "no save while the bulk work runs"
    ended_ms, final = harness.clock.monotonic_ms(), harness.image.offset
    await harness.run(2 * STORE_MIN_INTERVAL_MS, 0)
    assert len(harness.saves) == 2
    saved_ms, offset = harness.saves[1]
    assert offset == final
    assert saved_ms - ended_ms <= STORE_MIN_INTERVAL_MS + STEP_MS  # the first check after it ended


async def test_a_long_bulk_stream_is_saved_every_max_defer(harness: Harness) -> None:
    await harness.step(10)
    await harness.run(2 * STORE_MAX_DEFER_MS + 3_000, 4 * STORE_BULK_RECORDS_PER_S)
    times = [ms for ms, _ in harness.saves]
    assert len(times) == 3, harness.saves  # the first, then one per STORE_MAX_DEFER_MS
    assert all(b - a <= STORE_MAX_DEFER_MS + STORE_MIN_INTERVAL_MS for a, b in itertools.pairwise(times))


async def test_below_the_bulk_rate_saves_keep_their_interval(harness: Harness) -> None:
    await harness.step(10)
    await harness.run(3_000, STORE_BULK_RECORDS_PER_S // 2)
    times = [ms for ms, _ in harness.saves]
    assert len(times) == 1 + 3_000 // STORE_MIN_INTERVAL_MS, harness.saves
    assert all(b - a == STORE_MIN_INTERVAL_MS for a, b in itertools.pairwise(times))


async def test_with_no_deferral_configured_bulk_saves_keep_their_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # controller.image.store.bulk.defer.max.ms=0: saves as before session 15, whatever the rate
    async with running_writer(tmp_path, monkeypatch, max_defer_ms=0) as harness:
        await harness.step(10)
        await harness.run(3_000, 4 * STORE_BULK_RECORDS_PER_S)
        times = [ms for ms, _ in harness.saves]
        assert len(times) == 1 + 3_000 // STORE_MIN_INTERVAL_MS, harness.saves
        assert all(b - a == STORE_MIN_INTERVAL_MS for a, b in itertools.pairwise(times))


async def test_the_configured_save_pause_reaches_the_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # controller.image.store.save.pause.percent=150: the store pauses 1.5 times each chunk's time
    ratios: list[float] = []

    async def save(self: SqliteImageStore, image: MetadataImage) -> None:
        ratios.append(self.pause_ratio)

    monkeypatch.setattr(SqliteImageStore, "save", save)
    writer = StoreWriter(
        tmp_path / "metadata-image.sqlite",
        Timers(ManualClock()),
        MetadataImage.empty,
        metrics=ControllerMetrics.for_node(1),
        log=get_logger("controller", node=1),
        save_pause_percent=150,
    )
    await writer.open()
    await writer.close()  # its last save
    assert ratios == [1.5]
