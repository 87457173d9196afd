"""The heap freezer (kraft.metadata.heap_freezer): what it asks of the garbage collector, when — a full
collection walks every unfrozen object, a freshly loaded image of a million partitions 130-640 ms in one
go (issue #17), so a snapshot load must never end in one."""

from __future__ import annotations

import pytest

from kraft.clock import ManualClock
from kraft.metadata import heap_freezer
from kraft.metadata.heap_freezer import FREEZE_AFTER_RECORDS, FREEZE_MIN_INTERVAL_MS, HeapFreezer


class _Gc:
    """Records the collector calls instead of making them."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def collect(self, generation: int = 2) -> int:
        self.calls.append(f"collect({generation})")
        return 0

    def freeze(self) -> None:
        self.calls.append("freeze")

    def unfreeze(self) -> None:
        self.calls.append("unfreeze")


@pytest.fixture
def fake_gc(monkeypatch: pytest.MonkeyPatch) -> _Gc:
    fake = _Gc()
    monkeypatch.setattr(heap_freezer, "gc", fake)
    return fake


def test_a_snapshot_load_freezes_as_it_goes_and_ends_without_a_full_collection(fake_gc: _Gc) -> None:
    clock = ManualClock()
    freezer = HeapFreezer(clock)
    freezer.loading()  # a pause of the load: what it built so far is frozen
    freezer.loading()
    freezer.loaded()
    assert fake_gc.calls == ["collect(1)", "freeze"] * 3  # the young generations only, never collect(2)


def test_a_snapshot_load_starts_with_a_freeze_and_no_collection(fake_gc: _Gc) -> None:
    """The snapshot's fresh record list would be walked by the load's first young and middle collections
    (~13 ms each per million records): frozen at once instead, O(1), nothing collected."""
    HeapFreezer(ManualClock()).load_starting()
    assert fake_gc.calls == ["freeze"]


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
    clock.advance(FREEZE_MIN_INTERVAL_MS)
    freezer.applied(FREEZE_AFTER_RECORDS)
    assert fake_gc.calls == ["collect(2)", "freeze"]  # the periodic freeze as before (a full collection)
