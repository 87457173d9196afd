"""kraft.broker.heap.big_change: the collector paused during a big change and the heap frozen after it
(every THAW_EVERY_FREEZES-th time thawed instead); a small change leaves the collector alone."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kraft.broker import heap


@pytest.fixture(autouse=True)
def _restore_collector() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    gc.unfreeze()
    if enabled:
        gc.enable()
    else:
        gc.disable()


def test_a_small_change_leaves_the_collector_as_it_was() -> None:
    gc.enable()
    # Start from nothing frozen: objects frozen by earlier tests of this worker may be freed by reference
    # counting meanwhile (the count then drops), so only an empty permanent generation is a fixed point.
    gc.unfreeze()
    with heap.big_change(heap.BIG_CHANGE - 1):
        assert gc.isenabled()
    assert gc.isenabled() and gc.get_freeze_count() == 0


def test_a_big_change_runs_without_the_collector_and_freezes_what_it_made() -> None:
    gc.enable()
    gc.unfreeze()
    made: list[list[object]] = []
    with heap.big_change(heap.BIG_CHANGE):
        assert not gc.isenabled()
        made.extend([[]] for _ in range(1000))
    assert gc.isenabled()
    if heap._freezes % heap.THAW_EVERY_FREEZES:  # (this call froze)
        assert gc.get_freeze_count() >= 1000
    # Nothing is lost by freezing: reference counting still frees frozen objects.
    made.clear()


def test_a_big_change_keeps_a_disabled_collector_disabled_and_a_failure_still_restores() -> None:
    gc.disable()
    with pytest.raises(RuntimeError), heap.big_change(heap.BIG_CHANGE):
        raise RuntimeError("visit failed")
    assert not gc.isenabled()
    gc.enable()
    with pytest.raises(RuntimeError), heap.big_change(heap.BIG_CHANGE):
        raise RuntimeError("visit failed")
    assert gc.isenabled()


def test_every_thaw_every_freezes_th_big_change_thaws_instead(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heap, "_freezes", heap.THAW_EVERY_FREEZES - 1)
    gc.freeze()
    assert gc.get_freeze_count() > 0
    with heap.big_change(heap.BIG_CHANGE):
        pass
    assert gc.get_freeze_count() == 0
    with heap.big_change(heap.BIG_CHANGE):
        pass
    assert gc.get_freeze_count() > 0


def test_settle_freezes_what_is_alive_after_a_young_collection_only() -> None:
    """No full collection (a fresh image of 100,000 partitions would be one long walk); what is alive
    is frozen, and reference counting still frees it."""
    gc.unfreeze()
    generations: list[int] = []

    def seen(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            generations.append(info["generation"])

    made = [[index] for index in range(1000)]
    gc.callbacks.append(seen)
    try:
        heap.settle()
    finally:
        gc.callbacks.remove(seen)
    assert generations and max(generations) <= 1
    assert gc.get_freeze_count() >= 1000
    made.clear()
