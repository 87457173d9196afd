"""How long the cyclic garbage collector held this process: a pause histogram per generation and a
running total that a slow event's log line reads (``controller_event_slow gc_ms=``).

A collection runs inside whatever code allocated the object that crossed a generation's threshold, so a
bulk work unit or a heartbeat that happened to trigger a full collection looks slow for a reason that is
not its own; with the pause counted, an operator reading a slow-event line can tell the two apart
(the JVM's GC logs and ``jvm_gc_collection_seconds`` are the model).  One ``gc.callbacks`` entry per
process, installed by the node at start (:func:`install`); its cost is two ``perf_counter`` reads per
collection and one histogram observation, paid by collections only, never by code that does not allocate.
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Mapping
from typing import Any, Final

from kraft.observability.metrics import GC_PAUSE_SECONDS
from kraft.runtime import RuntimeChoiceError


class GcWatch:
    """Times every collection of this process's cyclic GC (``gc.callbacks``)."""

    def __init__(self, timer: Callable[[], float] = time.perf_counter) -> None:
        self._timer = timer
        self.pause_s_total = 0.0
        """Seconds spent in collections since :meth:`install` (read before and after a piece of work)."""
        self.collections = [0, 0, 0]
        self._started: float | None = None
        self._histograms = [GC_PAUSE_SECONDS.labels(str(generation)) for generation in range(3)]
        self._installed = False

    @property
    def installed(self) -> bool:
        return self._installed

    def install(self) -> None:
        if not self._installed:
            gc.callbacks.append(self._callback)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            gc.callbacks.remove(self._callback)
            self._installed = False
            self._started = None

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = self._timer()
            return
        started = self._started
        if started is None:  # installed between a collection's start and its stop
            return
        self._started = None
        pause = self._timer() - started
        self.pause_s_total += pause
        generation = info.get("generation", 2)
        if 0 <= generation <= 2:
            self.collections[generation] += 1
            self._histograms[generation].observe(pause)


GC_WATCH = GcWatch()
"""The process's one watch (``gc.callbacks`` is per process)."""


def install() -> GcWatch:
    GC_WATCH.install()
    return GC_WATCH


GC_THRESHOLD_ENV: Final = "KRAFT_GC_THRESHOLD"
NODE_GC_THRESHOLD: Final = (700, 10, 100)
"""The collector's thresholds in controller and broker processes (``gc.set_threshold``), unless
``$KRAFT_GC_THRESHOLD`` says ``A,B,C`` (A/B runs).  CPython's default is (700, 10, 10); only the oldest
generation's changes: a full collection after 100 middle ones instead of 10.  The heap freezer
(``kraft.metadata.heap_freezer``, ``kraft.broker.heap``) already keeps the image out of the collector's
way, so what a full collection between two freezes walks is the bulk work's own recent objects, twice
walked already by the young collections — and a leader ran 11 of them in a 100,000-partition bulk phase,
0 with this.  Bigger young thresholds were measured and rejected: a young collection's cost per object
grows with its size (cache misses), so (2000, 50, 10) halved the leader's GC time but doubled the
followers'.  docs/internals/raft-performance.md, "The leader's CPU in the bulk phase (session 12)"."""


class GcThresholdError(RuntimeChoiceError):
    """``$KRAFT_GC_THRESHOLD`` is not three non-negative integers (``kraft.runtime.check_choices``
    refuses to start a node with it, one line, exit code 1)."""


def node_gc_threshold(environ: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """The thresholds a node sets: ``$KRAFT_GC_THRESHOLD`` (``A,B,C``) or :data:`NODE_GC_THRESHOLD`."""
    text = (os.environ if environ is None else environ).get(GC_THRESHOLD_ENV, "").strip()
    if not text:
        return NODE_GC_THRESHOLD
    parts = text.split(",")
    try:
        values = tuple(int(part) for part in parts)
    except ValueError:
        values = ()
    if len(values) != 3 or min(values) < 0:
        raise GcThresholdError(f"{GC_THRESHOLD_ENV}={text!r}: want three non-negative integers A,B,C")
    return values[0], values[1], values[2]


def tune_node_gc(environ: Mapping[str, str] | None = None) -> tuple[int, int, int]:
    """Set this node process's collector thresholds (:func:`node_gc_threshold`); returns them."""
    threshold = node_gc_threshold(environ)
    gc.set_threshold(*threshold)
    return threshold
