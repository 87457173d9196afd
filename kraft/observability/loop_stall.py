"""Notice an event loop that stopped turning, and say where it is stuck.

A long-running node does all of its work on one asyncio loop: Raft, the controller, heartbeats, signal
handling and its log lines.  If that loop stops turning (a callback that never returns, a spin that never
yields, a C call that blocks), the process looks alive to its supervisor but does nothing and logs
nothing — the failure mode seen once in the pause chaos scenario (a controller resumed from SIGSTOP went
silent).  :class:`LoopStallMonitor` is a daemon thread that watches a beat the loop itself schedules; when
the beat is older than ``threshold_s`` it logs one ``event_loop_stalled`` line and dumps every thread's
stack (faulthandler, from C, so it works whatever the loop is doing), and ``event_loop_recovered`` when
the loop turns again.  It reports; it never kills: fail-stop decisions stay with the supervisor.

A process that was itself suspended (SIGSTOP, a paused VM) is not stalled: on resume the beat is old only
because nothing ran.  The watcher notices its own late wake-up and measures from the resume instead.
:class:`StallDetector` holds that logic as a pure class over given times, so it is tested without threads.
"""

from __future__ import annotations

import asyncio
import contextlib
import faulthandler
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from kraft.observability.logging import StructLogger
from kraft.observability.thread_names import named_target

STALL_THRESHOLD_S = 5.0
"""A loop that has not turned for this long is reported (well above any bounded work unit)."""

CHECK_INTERVAL_S = 0.5
"""How often the loop beats and the watcher looks."""

SUSPEND_FACTOR = 4
"""A watcher wake-up later than this many intervals means the whole process was suspended."""


@dataclass(frozen=True, slots=True)
class StallReport:
    """What the detector saw at one check: ``stalled`` (a new stall) or ``recovered`` (it ended)."""

    kind: str
    stalled_s: float


class StallDetector:
    """The monitor's decisions over times in seconds (monotonic); no threads, no clock of its own."""

    def __init__(self, now_s: float, *, threshold_s: float, interval_s: float) -> None:
        self.threshold_s = threshold_s
        self.interval_s = interval_s
        self.last_beat_s = now_s
        self._last_check_s = now_s
        self._measure_from_s = now_s  # the later of the last beat and the last resume
        self._stalled_since_s: float | None = None

    def beat(self, now_s: float) -> None:
        """The loop turned (called on the loop's thread)."""
        self.last_beat_s = now_s

    def check(self, now_s: float) -> StallReport | None:
        """Called by the watcher thread every ``interval_s``."""
        if now_s - self._last_check_s > SUSPEND_FACTOR * self.interval_s:
            # The watcher itself did not run: the process was suspended, so nothing could beat.
            self._measure_from_s = now_s
        self._last_check_s = now_s
        since_s = max(self.last_beat_s, self._measure_from_s)
        if self._stalled_since_s is not None:
            if self.last_beat_s > self._stalled_since_s:
                report = StallReport("recovered", self.last_beat_s - self._stalled_since_s)
                self._stalled_since_s = None
                return report
            return None
        if now_s - since_s > self.threshold_s:
            self._stalled_since_s = since_s
            return StallReport("stalled", now_s - since_s)
        return None


class LoopStallMonitor:
    """Runs a :class:`StallDetector` for ``loop``: the loop beats every ``interval_s`` through
    ``call_later``; a daemon thread checks and reports."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        logger: StructLogger,
        *,
        threshold_s: float = STALL_THRESHOLD_S,
        interval_s: float = CHECK_INTERVAL_S,
        dump_stacks: Callable[[], None] | None = None,
    ) -> None:
        self._loop = loop
        self._logger = logger
        self._detector = StallDetector(time.monotonic(), threshold_s=threshold_s, interval_s=interval_s)
        self._interval_s = interval_s
        self._dump_stacks = dump_stacks or _dump_all_stacks
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._beat_handle: asyncio.TimerHandle | None = None

    def start(self) -> None:
        self._beat()
        name = "kraft-loop-stall-monitor"
        self._thread = threading.Thread(target=named_target(name, self._watch), name=name, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._beat_handle is not None:
            self._beat_handle.cancel()

    def _beat(self) -> None:
        self._detector.beat(time.monotonic())
        if not self._stop.is_set():
            self._beat_handle = self._loop.call_later(self._interval_s, self._beat)

    def _watch(self) -> None:
        while not self._stop.wait(self._interval_s):
            report = self._detector.check(time.monotonic())
            if report is None:
                continue
            if report.kind == "stalled":
                self._logger.error(
                    "event_loop_stalled",
                    stalled_s=round(report.stalled_s, 1),
                    threshold_s=self._detector.threshold_s,
                    action="stacks dumped to stderr",
                )
                self._dump_stacks()
            else:
                self._logger.warning("event_loop_recovered", stalled_s=round(report.stalled_s, 1))


def _dump_all_stacks() -> None:
    # stderr may be no real file (an in-process test capturing it): then there is nothing to dump into.
    with contextlib.suppress(OSError, ValueError, AttributeError):
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
