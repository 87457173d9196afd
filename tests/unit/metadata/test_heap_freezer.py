"""The heap freezer (kraft.metadata.heap_freezer): what it asks of the garbage collector, when — a full
collection walks every unfrozen object, a freshly loaded image of a million partitions 130-640 ms in one
go (issue #17), so a snapshot load must never end in one."""

from __future__ import annotations

import asyncio

import pytest

from kraft.clock import ManualClock
from kraft.metadata import heap_freezer
from kraft.metadata.heap_freezer import (
    FREEZE_AFTER_RECORDS,
    FREEZE_MIN_INTERVAL_MS,
    IDLE_CHECK_MS,
    IDLE_RECORDS,
    THAW_EVERY_FREEZES,
    THAW_OVERDUE_FREEZES,
    HeapFreezer,
)
from kraft.metadata.timers import Timers


class _Gc:
    """Records the collector calls instead of making them."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.enabled = True

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect({generation})")
        return 0

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")

    def isenabled(self) -> bool:
        return self.enabled

    def disable(self) -> None:
        self.calls.append("disable")
        self.enabled = False

    def enable(self) -> None:
        self.calls.append("enable")
        self.enabled = True


@pytest.fixture
def fake_gc(monkeypatch: pytest.MonkeyPatch) -> _Gc:
    fake = _Gc()
    monkeypatch.setattr(heap_freezer, "gc", fake)
    return fake


def test_a_snapshot_load_freezes_as_it_goes_and_never_collects(fake_gc: _Gc) -> None:
    """Issue #17: the load starts with a freeze (the snapshot's fresh record list: the load's first young
    collections would walk it, ~13-23 ms each per million records) and pauses the automatic
    collections (each young one walks references all over the heap); its pauses and its end freeze,
    collecting nothing.  The collector is enabled again however the load ends."""
    freezer = HeapFreezer(ManualClock())
    with freezer.load():
        freezer.loading()  # a pause of the load: what it built so far is frozen
        freezer.loading()
        freezer.loaded()
    assert fake_gc.calls == ["freeze", "disable", "freeze", "freeze", "freeze", "enable"]
    assert not any(call.startswith("collect") for call in fake_gc.calls)
    fake_gc.calls.clear()
    with pytest.raises(RuntimeError), freezer.load():
        raise RuntimeError("the snapshot does not replay")
    assert fake_gc.calls == ["freeze", "disable", "enable"] and fake_gc.enabled


def test_a_load_leaves_a_paused_collector_paused(fake_gc: _Gc) -> None:
    """Whoever paused the collector before the load (the broker's big changes) resumes it, not the load."""
    fake_gc.enabled = False
    with HeapFreezer(ManualClock()).load():
        pass
    assert "enable" not in fake_gc.calls and not fake_gc.enabled


def _freeze_once(freezer: HeapFreezer, clock: ManualClock) -> None:
    clock.advance(FREEZE_MIN_INTERVAL_MS)
    freezer.applied(FREEZE_AFTER_RECORDS)


def test_a_load_counts_as_the_periodic_freeze(fake_gc: _Gc) -> None:
    clock = ManualClock()
    freezer = HeapFreezer(clock)
    freezer.applied(FREEZE_AFTER_RECORDS - 1)
    freezer.loaded()
    fake_gc.calls.clear()
    freezer.applied(FREEZE_AFTER_RECORDS - 1)  # counted from the load: not yet
    assert fake_gc.calls == []
    freezer.applied(1)  # enough records, but within the interval of the load's freeze
    assert fake_gc.calls == []
    _freeze_once(freezer, clock)
    # The periodic freeze: the young generations only (a full collection walked everything unfrozen
    # since the previous freeze: 20,000+ records' registrations, tens of ms).
    assert fake_gc.calls == ["collect(1)", "freeze"]


def test_a_due_thaw_waits_for_an_idle_moment(fake_gc: _Gc) -> None:
    """The thaw's full collection walks the whole heap (100-600 ms at a million partitions): it runs at
    the first idle check that finds at most IDLE_RECORDS records applied since the previous one, not in
    the middle of the bulk write whose records made the freeze due."""
    clock = ManualClock()
    freezer = HeapFreezer(clock)
    for _ in range(THAW_EVERY_FREEZES):
        _freeze_once(freezer, clock)
    assert fake_gc.calls == ["collect(1)", "freeze"] * THAW_EVERY_FREEZES  # no thaw at the freeze
    assert freezer.thaw_due_since == THAW_EVERY_FREEZES
    fake_gc.calls.clear()
    freezer.idle_check()  # records were applied since the last look (the bulk write): not idle
    freezer.applied(IDLE_RECORDS + 1)
    freezer.idle_check()
    assert fake_gc.calls == []
    freezer.applied(IDLE_RECORDS)  # idle NoOps and the odd change: idle
    freezer.idle_check()
    assert fake_gc.calls == ["unfreeze", "collect(2)"] and freezer.thaws == 1
    assert freezer.thaw_due_since is None
    fake_gc.calls.clear()
    freezer.idle_check()  # nothing due: nothing done
    assert fake_gc.calls == []


def test_a_thaw_never_idle_for_long_runs_at_a_freeze(fake_gc: _Gc) -> None:
    """A controller never idle at a check still thaws, THAW_OVERDUE_FREEZES freezes after the thaw fell
    due: the garbage cycles frozen meanwhile stay bounded."""
    clock = ManualClock()
    freezer = HeapFreezer(clock)
    for _ in range(THAW_EVERY_FREEZES + THAW_OVERDUE_FREEZES - 1):
        _freeze_once(freezer, clock)
        freezer.idle_check()  # (each look saw the 20,000 records: busy)
    assert "unfreeze" not in fake_gc.calls
    fake_gc.calls.clear()
    _freeze_once(freezer, clock)
    assert fake_gc.calls == ["unfreeze", "collect(2)"] and freezer.thaws == 1
    assert freezer.thaw_due_since is None


async def test_the_idle_checks_run_on_the_controllers_timers(fake_gc: _Gc) -> None:
    clock = ManualClock()
    timers = Timers(clock)
    freezer = HeapFreezer(clock)
    freezer.thaw_due_since = 0
    task = asyncio.create_task(freezer.run(timers))
    try:
        await asyncio.sleep(0)
        assert fake_gc.calls == []
        clock.advance(IDLE_CHECK_MS)
        timers.clock_moved()
        for _ in range(3):
            await asyncio.sleep(0)
        assert fake_gc.calls == ["unfreeze", "collect(2)"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


def test_partitions_prepared_ahead_of_any_append_count_toward_the_freeze(fake_gc: _Gc) -> None:
    """A 100-topic CreateTopics prepares 100,000 partitions' records before its first append: counted
    like applied records, so the full collections meanwhile walk at most one freeze's worth of them
    (a 71-94 ms collection inside one preparing event end to end before, session 11)."""
    clock = ManualClock()
    freezer = HeapFreezer(clock)
    clock.advance(FREEZE_MIN_INTERVAL_MS)
    freezer.built(FREEZE_AFTER_RECORDS - 1)
    assert fake_gc.calls == []
    freezer.built(1)
    assert fake_gc.calls == ["collect(1)", "freeze"]
    fake_gc.calls.clear()
    freezer.built(FREEZE_AFTER_RECORDS)  # enough again, but within the minimum interval
    assert fake_gc.calls == []
    clock.advance(FREEZE_MIN_INTERVAL_MS)
    freezer.applied(1)
    assert fake_gc.calls == ["collect(1)", "freeze"]
