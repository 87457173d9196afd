"""The event-loop stall monitor: its decisions over given times, and one real loop it watches."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest

from kraft.observability.logging import get_logger
from kraft.observability.loop_stall import LoopStallMonitor, StallDetector, StallReport


def _detector() -> StallDetector:
    return StallDetector(100.0, threshold_s=5.0, interval_s=0.5)


def test_a_loop_that_keeps_beating_is_never_reported() -> None:
    detector = _detector()
    now = 100.0
    for _ in range(100):
        now += 0.5
        detector.beat(now - 0.1)
        assert detector.check(now) is None


def test_a_loop_that_stops_beating_is_reported_once_past_the_threshold_then_recovers() -> None:
    detector = _detector()
    detector.beat(100.0)
    reports = []
    now = 100.0
    for _ in range(12):  # the watcher keeps running while the loop is stuck
        now += 0.5
        reports.append(detector.check(now))
    assert [r for r in reports if r is not None] == [StallReport("stalled", 5.5)]
    assert reports.index(StallReport("stalled", 5.5)) == 10  # 5.5 s: the first check past 5 s
    detector.beat(106.2)
    assert detector.check(106.5) == StallReport("recovered", pytest.approx(6.2))  # type: ignore[arg-type]
    assert detector.check(107.0) is None


def test_a_suspended_process_is_not_a_stalled_loop() -> None:
    # SIGSTOP for 30 s: on resume neither the watcher nor the loop ran; the beat is old but nothing stalled.
    detector = _detector()
    detector.beat(100.0)
    assert detector.check(100.5) is None
    assert detector.check(130.5) is None  # the watcher's own late wake-up marks a resume
    detector.beat(130.6)
    for now in (131.0, 131.5, 132.0):
        assert detector.check(now) is None


def test_a_loop_stuck_after_a_resume_is_still_reported() -> None:
    detector = _detector()
    detector.beat(100.0)
    assert detector.check(130.0) is None  # resumed at 130; the loop never turns again
    now = 130.0
    reports = []
    while now < 136.0:
        now += 0.5
        reports.append(detector.check(now))
    assert [r.kind for r in reports if r is not None] == ["stalled"]


async def test_the_monitor_reports_a_blocked_loop_with_the_stacks(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="kraft.stall-test")
    dumped = threading.Event()
    recovered = threading.Event()

    class _Recovered(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "event_loop_recovered" in record.getMessage():
                recovered.set()

    handler = _Recovered()
    logging.getLogger("kraft.stall-test").addHandler(handler)
    monitor = LoopStallMonitor(
        asyncio.get_running_loop(),
        get_logger("stall-test"),
        threshold_s=0.2,
        interval_s=0.05,
        dump_stacks=dumped.set,
    )
    monitor.start()
    try:
        # Block the loop itself (as a callback that never yields would) until the watcher has reported,
        # bounded: the watcher thread runs meanwhile.
        assert dumped.wait(timeout=10), "no stall reported for a loop blocked past the threshold"
        # The loop turns again: the watcher's next look reports the recovery.
        assert await asyncio.to_thread(recovered.wait, 10), "no recovery reported"
    finally:
        monitor.stop()
        logging.getLogger("kraft.stall-test").removeHandler(handler)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("event_loop_stalled" in m for m in messages) == 1, messages
