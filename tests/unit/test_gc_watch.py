"""The GC pause watch (kraft.observability.gc_watch): every collection timed by generation, a running
total that a slow controller event's log line reads as ``gc_ms``."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import pytest

from kraft.observability.gc_watch import (
    GC_THRESHOLD_ENV,
    GC_WATCH,
    NODE_GC_THRESHOLD,
    GcThresholdError,
    GcWatch,
    node_gc_threshold,
    tune_node_gc,
)
from kraft.observability.metrics import GC_PAUSE_SECONDS, render_metrics


class SteppingTimer:
    """Each read is ``step`` seconds after the previous one: a collection timed by it lasts ``step``."""

    def __init__(self, step: float) -> None:
        self.step = step
        self.now = 0.0

    def __call__(self) -> float:
        self.now += self.step
        return self.now


@pytest.fixture
def watch() -> Iterator[GcWatch]:
    watch = GcWatch(SteppingTimer(0.030))
    enabled = gc.isenabled()
    gc.disable()  # only the tests' own collections: an automatic one would be counted too
    watch.install()
    try:
        yield watch
    finally:
        watch.uninstall()
        if enabled:
            gc.enable()


def _count(generation: str) -> float:
    for metric in GC_PAUSE_SECONDS.collect():
        for sample in metric.samples:
            if sample.name.endswith("_count") and sample.labels["generation"] == generation:
                return sample.value
    return 0.0


def test_a_full_collection_is_timed_counted_and_observed(watch: GcWatch) -> None:
    before = _count("2")
    gc.collect()
    assert watch.collections[2] == 1
    assert watch.pause_s_total == pytest.approx(0.030)
    # the histogram is the process's: the node's own watch observes too once a test in this worker
    # started a node in process (run_controller / run_broker install it)
    assert _count("2") == before + 1 + GC_WATCH.installed
    assert "kraft_gc_pause_seconds_bucket" in render_metrics()


def test_young_collections_count_under_their_generation(watch: GcWatch) -> None:
    gc.collect(0)
    gc.collect(1)
    assert watch.collections == [1, 1, 0]
    assert watch.pause_s_total == pytest.approx(0.060)


def test_installing_twice_times_a_collection_once_and_uninstalled_it_times_none(watch: GcWatch) -> None:
    watch.install()
    gc.collect()
    assert watch.collections[2] == 1
    watch.uninstall()
    gc.collect()
    assert watch.collections[2] == 1 and watch.pause_s_total == pytest.approx(0.030)


def test_a_node_sets_the_shipped_thresholds_unless_the_environment_names_others() -> None:
    """Controller and broker processes set :data:`NODE_GC_THRESHOLD` (measured, raft-performance.md
    session 12); ``$KRAFT_GC_THRESHOLD`` overrides it for A/B runs; anything but three non-negative
    integers is refused (the node does not start: test_cli_usage)."""
    before = gc.get_threshold()
    try:
        assert tune_node_gc({}) == NODE_GC_THRESHOLD
        assert gc.get_threshold() == NODE_GC_THRESHOLD
        assert tune_node_gc({GC_THRESHOLD_ENV: " 700,10,10 "}) == (700, 10, 10)
        assert gc.get_threshold() == (700, 10, 10)
    finally:
        gc.set_threshold(*before)
    assert node_gc_threshold({GC_THRESHOLD_ENV: ""}) == NODE_GC_THRESHOLD
    for bad in ("50000,10", "1,2,3,4", "a,b,c", "700,-1,10", "700;10;10"):
        with pytest.raises(GcThresholdError, match=GC_THRESHOLD_ENV):
            node_gc_threshold({GC_THRESHOLD_ENV: bad})
