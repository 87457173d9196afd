"""How long the controller's events ran: the per-kind histogram and longest-event gauge, and the
``controller_event_slow`` log line for an event far over the work-unit budget.

The event queue times each event on the injected clock (:meth:`ControllerEventQueue.observe`) and calls
:meth:`EventTimings.start` before and :meth:`EventTimings.record` after it; a ManualClock moved inside an
event makes it "slow" deterministically.  A slow line also says how much of the event was the loop
thread's own CPU (``cpu_ms``: less than ``duration_ms`` when the thread waited for a core or the GIL) and
how much the cyclic GC (``gc_ms``: a collection the event's allocations happened to trigger), so a long
event is told apart from a starved or collecting one without a profiler.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from kraft.clock import Clock
from kraft.observability.gc_watch import GC_WATCH, GcWatch
from kraft.observability.logging import StructLogger
from kraft.observability.metrics import CONTROLLER_EVENT_LONGEST, CONTROLLER_EVENT_PROCESSING_TIME

SLOW_FACTOR = 4
"""An event is logged as slow when it ran at least this many times the work-unit budget."""
SLOW_MIN_MS = 20
"""… and at least this long (a budget of 1 or 2 ms would otherwise log ordinary scheduling noise)."""
SLOW_LOG_INTERVAL_MS = 1_000
"""At most one ``controller_event_slow`` line per this interval; the others are counted in the next."""
LONGEST_WINDOW_MS = 60_000


@dataclass(slots=True)
class _Longest:
    window_start_ms: int
    longest_ms: int


_Observe = Callable[[float], None]
_Set = Callable[[float], None]


class EventTimings:
    def __init__(
        self,
        node: int,
        clock: Clock,
        budget_ms: int,
        log: StructLogger,
        cpu_clock: Callable[[], float] = time.thread_time,
        gc_watch: GcWatch = GC_WATCH,
    ) -> None:
        self._node = str(node)
        self._cpu_clock = cpu_clock
        self._gc_watch = gc_watch
        self._started_cpu_s = 0.0
        self._started_gc_s = 0.0
        self._clock = clock
        self._budget_ms = budget_ms
        self.slow_threshold_ms = max(SLOW_MIN_MS, SLOW_FACTOR * budget_ms)
        self._log = log
        self._longest: dict[str, _Longest] = {}
        self._series: dict[str, tuple[_Observe, _Set]] = {}
        """Per event kind, its histogram's ``observe`` and longest gauge's ``set``: ``labels()`` looks the
        series up under a lock each call, once per event — per heartbeat at 500 a second (issue #17)."""
        self._last_slow_log_ms: int | None = None
        self._slow_unlogged = 0
        self.slow_events = 0
        """Events at or over the slow threshold so far (logged or not)."""

    def start(self) -> None:
        """Right before an event runs: the loop thread's CPU and the GC's running total."""
        self._started_cpu_s = self._cpu_clock()
        self._started_gc_s = self._gc_watch.pause_s_total

    def record(self, kind: str, duration_ms: int) -> None:
        series = self._series.get(kind)
        if series is None:
            series = self._series[kind] = (
                CONTROLLER_EVENT_PROCESSING_TIME.labels(self._node, kind).observe,
                CONTROLLER_EVENT_LONGEST.labels(self._node, kind).set,
            )
        observe, set_longest = series
        observe(duration_ms / 1000)
        now_ms = self._clock.monotonic_ms()
        longest = self._longest.get(kind)
        if longest is None or now_ms - longest.window_start_ms >= LONGEST_WINDOW_MS:
            longest = self._longest[kind] = _Longest(now_ms, duration_ms)
            set_longest(duration_ms / 1000)
        elif duration_ms > longest.longest_ms:
            longest.longest_ms = duration_ms
            set_longest(duration_ms / 1000)
        if duration_ms < self.slow_threshold_ms:
            return
        cpu_ms = round((self._cpu_clock() - self._started_cpu_s) * 1000)
        gc_ms = round((self._gc_watch.pause_s_total - self._started_gc_s) * 1000)
        self.slow_events += 1
        last = self._last_slow_log_ms
        if last is not None and now_ms - last < SLOW_LOG_INTERVAL_MS:
            self._slow_unlogged += 1
            return
        self._last_slow_log_ms = now_ms
        self._log.warning(
            "controller_event_slow",
            kind=kind,
            duration_ms=duration_ms,
            budget_ms=self._budget_ms,
            cpu_ms=cpu_ms,
            gc_ms=gc_ms,
            slow_since_last_line=self._slow_unlogged,
        )
        self._slow_unlogged = 0
