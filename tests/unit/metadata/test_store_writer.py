"""The store writer's saves during bulk work (issue #17, session 15): while the committed log moves at a
bulk rate a save waits, at most ``STORE_MAX_DEFER_MS`` after the last one; below that rate it saves at
most once per ``STORE_MIN_INTERVAL_MS``, as before.  On a manual clock: each step moves the clock, commits
records and marks the store dirty, as ``QuorumController`` does on every commit."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import logging
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from google.protobuf.message import Message

from kraft.clock import ManualClock
from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.metadata.store_writer import (
    SAVE_BULK_ENDED,
    STORE_BULK_RECORDS_PER_S,
    STORE_BULK_STAGGER_MS,
    STORE_LEADER_SLOT,
    STORE_MAX_DEFER_MS,
    STORE_MIN_INTERVAL_MS,
    StoreWriter,
    save_slot,
)
from kraft.metadata.timers import Timers
from kraft.observability.logging import _FIELDS_ATTR, get_logger
from kraft.observability.metrics import ControllerMetrics
from kraft.v1 import metadata_pb2 as pb

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
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    max_defer_ms: int = STORE_MAX_DEFER_MS,
    *,
    slot: int = 0,
    stagger_ms: int = STORE_BULK_STAGGER_MS,
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
        stagger_ms=stagger_ms,
        save_slot=lambda: slot,
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


# ---- session 16: the quorum's deferred saves staggered (followers first, the active controller last) ----

BULK = 4 * STORE_BULK_RECORDS_PER_S


@pytest.mark.parametrize("slot", [0, 1, STORE_LEADER_SLOT])
async def test_after_bulk_work_each_slot_saves_its_stagger_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, slot: int
) -> None:
    async with running_writer(tmp_path, monkeypatch, slot=slot) as harness:
        await harness.step(10)
        await harness.run(3_000, BULK)
        ended_ms, final = harness.clock.monotonic_ms(), harness.image.offset
        await harness.run(slot * STORE_BULK_STAGGER_MS - STEP_MS, 0)
        assert len(harness.saves) == 1, f"slot {slot} saved before its stagger ran out"
        await harness.run(2 * STORE_MIN_INTERVAL_MS, 0)
        assert len(harness.saves) == 2, harness.saves
        saved_ms, offset = harness.saves[1]
        assert offset == final
        waited_ms = saved_ms - ended_ms
        stagger_ms = slot * STORE_BULK_STAGGER_MS
        assert stagger_ms <= waited_ms <= stagger_ms + STORE_MIN_INTERVAL_MS + STEP_MS


async def test_bulk_work_resuming_inside_the_stagger_defers_the_save_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_writer(tmp_path, monkeypatch, slot=STORE_LEADER_SLOT) as harness:
        await harness.step(10)
        await harness.run(3_000, BULK)  # a bulk creation
        await harness.run(STORE_BULK_STAGGER_MS, 0)  # a pause shorter than the leader's stagger
        await harness.run(3_000, BULK)  # a controlled shutdown
        assert len(harness.saves) == 1, "the quiet before the stagger ran out must not count"
        ended_ms = harness.clock.monotonic_ms()
        await harness.run(STORE_LEADER_SLOT * STORE_BULK_STAGGER_MS + 2 * STORE_MIN_INTERVAL_MS, 0)
        assert len(harness.saves) == 2, harness.saves
        assert harness.saves[1][0] - ended_ms >= STORE_LEADER_SLOT * STORE_BULK_STAGGER_MS


async def test_the_cap_during_a_long_stream_is_staggered_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without it the three controllers' caps run out together mid-stream: one burst on all three.
    firsts: list[int] = []
    for slot in (0, 1, STORE_LEADER_SLOT):
        async with running_writer(tmp_path / str(slot), monkeypatch, slot=slot) as harness:
            await harness.step(10)
            started_ms = harness.saves[0][0]
            # long enough for the last slot's staggered cap, and not for a third save
            await harness.run(STORE_MAX_DEFER_MS + STORE_LEADER_SLOT * STORE_BULK_STAGGER_MS + 2_000, BULK)
            assert len(harness.saves) == 2, harness.saves
            firsts.append(harness.saves[1][0] - started_ms)
    for slot, waited_ms in enumerate(firsts):
        lower = STORE_MAX_DEFER_MS + slot * STORE_BULK_STAGGER_MS
        assert lower <= waited_ms <= lower + STORE_MIN_INTERVAL_MS, firsts


async def test_with_no_stagger_configured_every_slot_saves_once_bulk_work_ends(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # controller.image.store.bulk.save.stagger.ms=0: session 15's schedule
    async with running_writer(tmp_path, monkeypatch, slot=STORE_LEADER_SLOT, stagger_ms=0) as harness:
        await harness.step(10)
        await harness.run(3_000, BULK)
        ended_ms = harness.clock.monotonic_ms()
        await harness.run(2 * STORE_MIN_INTERVAL_MS, 0)
        assert len(harness.saves) == 2
        assert harness.saves[1][0] - ended_ms <= STORE_MIN_INTERVAL_MS + STEP_MS


async def test_below_the_bulk_rate_a_later_slot_does_not_wait(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Admin work (16 clients ~1,500 records/s) saves every 500 ms on every controller, as before.
    async with running_writer(tmp_path, monkeypatch, slot=STORE_LEADER_SLOT) as harness:
        await harness.step(10)
        await harness.run(3_000, STORE_BULK_RECORDS_PER_S // 2)
        times = [ms for ms, _ in harness.saves]
        assert len(times) == 1 + 3_000 // STORE_MIN_INTERVAL_MS, harness.saves


@pytest.mark.parametrize("ids", [(1, 2, 3), (0, 1, 2), (3000, 3001, 3002)])
def test_three_consecutive_voters_get_three_slots_whichever_leads(ids: tuple[int, int, int]) -> None:
    for leader in ids:
        slots = {node: save_slot(node, leader) for node in ids}
        assert slots[leader] == STORE_LEADER_SLOT
        assert sorted(slots.values()) == [0, 1, STORE_LEADER_SLOT], slots
    assert save_slot(ids[0], None) == 0  # no leader known: no wait


async def test_a_deferred_save_says_why_it_ran_and_what_it_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    # One image_store_saved line per save that waited (or wrote many rows): bench.store_saves places the
    # saves against a benchmark's phases by these fields (issue #17, session 16).
    caplog.set_level(logging.INFO, logger="kraft.controller")
    async with running_writer(tmp_path, monkeypatch, slot=1) as harness:
        await harness.step(10)
        await harness.run(3_000, BULK)
        final = harness.image.offset
        await harness.run(STORE_BULK_STAGGER_MS + 2 * STORE_MIN_INTERVAL_MS, 0)
        started_ms = harness.saves[1][0]
    [line] = [r for r in caplog.records if r.getMessage() == "image_store_saved"]
    fields = getattr(line, _FIELDS_ATTR)
    assert fields["why"] == SAVE_BULK_ENDED and fields["slot"] == 1
    assert (fields["offset"], fields["records"]) == (final, final - 9)
    assert fields["start_mono_ms"] == started_ms
    # from the first commit after the last save's interval (~3 s of stream) to the end of the stagger
    assert fields["waited_ms"] >= 3_000 - STORE_MIN_INTERVAL_MS + STORE_BULK_STAGGER_MS


async def test_a_saves_rows_and_its_thread_cpu_are_measured(tmp_path: Path) -> None:
    store = await SqliteImageStore.open(tmp_path / "metadata-image.sqlite", clock=ManualClock())
    try:
        image = MetadataImage.empty()
        for t in range(3):
            image = _with_topic(image, f"T{t}", partitions=40)
        before = store.thread_cpu_s()
        await store.save(image)
        assert store.last_save_rows == 3 + 3 * 40  # topic rows and partition rows
        after = store.thread_cpu_s()
        assert before is not None and after is not None and after > before
        await store.save(image)
        assert store.last_save_rows == 0  # nothing changed
    finally:
        await store.close()


def _with_topic(image: MetadataImage, topic_id: str, *, partitions: int) -> MetadataImage:
    delta = MetadataDelta(image)
    payloads: list[Message] = [pb.TopicRecord(name=topic_id.lower(), topic_id=topic_id)]
    for p in range(partitions):
        payloads.append(
            pb.PartitionRecord(partition_id=p, topic_id=topic_id, replicas=[1], isr=[1], leader=1)
        )
    for i, payload in enumerate(payloads):
        delta.replay(records.wrap(payload), image.offset + 1 + i, 1)
    return delta.apply()


async def test_a_restart_while_a_staggered_save_waits_loads_the_last_finished_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The store is a cache of the log: a process gone while its save waits for bulk work to end (and for its
    # stagger) leaves the previous save, whole; the next start loads that and replays the rest of the log.
    real_save = SqliteImageStore.save
    idle = asyncio.Event()
    idle.set()

    async def save(self: SqliteImageStore, image: MetadataImage) -> None:  # the real one, watched
        idle.clear()
        try:
            await real_save(self, image)
        finally:
            idle.set()

    monkeypatch.setattr(SqliteImageStore, "save", save)
    clock = ManualClock()
    timers = Timers(clock)
    path = tmp_path / "metadata-image.sqlite"
    images = [_with_topic(MetadataImage.empty(), "T0", partitions=5)]
    writer = StoreWriter(
        path,
        timers,
        lambda: images[-1],
        metrics=ControllerMetrics.for_node(1),
        log=get_logger("controller", node=1),
        save_slot=lambda: STORE_LEADER_SLOT,
    )
    await writer.open()
    task = asyncio.create_task(writer.run())
    harness = Harness(clock, timers, writer)

    async def moved(ms: int, records: int) -> None:
        for _ in range(ms // STEP_MS):
            offset = images[-1].offset + records * STEP_MS // 1000
            images.append(
                dataclasses.replace(_with_topic(images[-1], f"T{len(images)}", partitions=1), offset=offset)
            )
            await harness.step(0)
            writer.mark_dirty()
            for _ in range(20):
                await asyncio.sleep(0)
            # a save the writer began (on the SQLite thread) ends before the clock moves on
            await asyncio.wait_for(idle.wait(), timeout=10)

    writer.mark_dirty()
    await moved(STEP_MS, 10)  # quiet: saved at once
    saved = images[-1].offset
    await moved(3_000, BULK)  # bulk work, then part of the leader's stagger
    await moved(STORE_BULK_STAGGER_MS, 0)
    assert images[-1].offset > saved
    task.cancel()  # the process is gone: no last save (close() would make one)
    with pytest.raises(asyncio.CancelledError):
        await task
    store = await SqliteImageStore.open(path, clock=clock)
    try:
        loaded = await store.load()
        assert store.discarded is None
        assert loaded.offset == saved, "only the last finished save, whole"
        assert set(loaded.topics_by_id) == set(images_at(images, saved).topics_by_id)
    finally:
        await store.close()
    await writer.close()  # (its last save comes after the check above)


def images_at(images: list[MetadataImage], offset: int) -> MetadataImage:
    return next(image for image in images if image.offset == offset)
