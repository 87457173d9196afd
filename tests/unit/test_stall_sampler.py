"""kraft.observability.stall_sampler: a loop's lag and a sleeping thread's wake-up delay, split into the
wait for a core (the kernel's run-queue time) and the wait for the GIL.  Manual clocks: one sample at a
time, no thread, no real sleep."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import pytest

from kraft.observability.logging import _FIELDS_ATTR
from kraft.observability.stall_sampler import (
    HEARTBEAT_ARRIVAL_DELAY,
    SENT_METADATA_KEY,
    ArrivalProbe,
    GilSampler,
    LoopLagSampler,
    StallLog,
    stamp_sent,
)
from kraft.v1 import controller_pb2 as cpb


class Clock:
    def __init__(self) -> None:
        self.now_s = 100.0


def test_a_late_wake_up_is_split_into_run_queue_and_gil() -> None:
    clock = Clock()
    queued = [0.0]
    totals: list[float] = []
    gils: list[float] = []

    def sleep(period_s: float) -> None:  # woke 30 ms late, 10 ms of it runnable without a core
        clock.now_s += period_s + 0.030
        queued[0] += 0.010

    sampler = GilSampler(
        0.010, totals.append, gils.append, StallLog("1", 1.0), "t",
        now=lambda: clock.now_s, sleep=sleep, run_delay=lambda: queued[0],
    )  # fmt: skip
    sampler.sample()
    assert totals == [pytest.approx(0.030)]
    assert gils == [pytest.approx(0.020)]


def test_without_the_kernel_reading_the_whole_delay_counts_and_the_gil_part_is_never_negative() -> None:
    clock = Clock()
    readings = iter([None, None, 0.0, 0.5])
    totals: list[float] = []
    gils: list[float] = []

    def sleep(period_s: float) -> None:
        clock.now_s += period_s + 0.004

    sampler = GilSampler(
        0.010, totals.append, gils.append, StallLog("1", 1.0), "t",
        now=lambda: clock.now_s, sleep=sleep, run_delay=lambda: next(readings),
    )  # fmt: skip
    sampler.sample()  # no schedstat: all of it is reported as the GIL's
    sampler.sample()  # more run-queue time than the delay (it counts the sleep's edges too): GIL 0
    assert totals == [pytest.approx(0.004)] * 2
    assert gils == [pytest.approx(0.004), 0.0]


async def test_a_loop_lag_is_how_late_the_timer_ran_and_long_ones_are_logged(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = Clock()
    lags: list[float] = []
    sampler = LoopLagSampler(
        asyncio.get_running_loop(),
        0.010,
        lags.append,
        StallLog("1", 0.050),
        "intake",
        now=lambda: clock.now_s,
    )
    sampler._arm()
    clock.now_s += 0.010 + 0.002
    with caplog.at_level(logging.INFO):
        sampler._tick()  # 2 ms late: observed, not logged
        clock.now_s += 0.010 + 0.080
        sampler._tick()  # 80 ms late: logged with the time it ended
    sampler.stop()
    assert lags == [pytest.approx(0.002), pytest.approx(0.080)]
    lines = [getattr(r, _FIELDS_ATTR) for r in caplog.records if r.getMessage() == "stall_sampled"]
    assert lines == [{"node": "1", "what": "intake", "ms": 80.0, "ended_monotonic_s": round(clock.now_s, 4)}]


def test_a_call_that_carries_its_send_time_is_timed_to_its_arrival(caplog: pytest.LogCaptureFixture) -> None:
    histogram = HEARTBEAT_ARRIVAL_DELAY.labels("7")
    probe = ArrivalProbe(7, log_ms=20)
    now_ns = time.monotonic_ns()
    with caplog.at_level(logging.INFO):
        probe((("other", "x"),), 101)  # no send time: nothing
        probe(None, 101)
        probe(((SENT_METADATA_KEY, "not a number"),), 101)
        assert _observations(histogram) == 0
        probe((("other", "x"), (SENT_METADATA_KEY, str(now_ns - 500_000_000))), 101)  # sent 500 ms ago
    assert _observations(histogram) == 1 and histogram._sum.get() >= 0.5
    lines = [getattr(r, _FIELDS_ATTR) for r in caplog.records if r.getMessage() == "heartbeat_arrived_late"]
    assert len(lines) == 1 and lines[0]["broker"] == 101 and lines[0]["ms"] >= 500
    assert lines[0]["sent_monotonic_s"] == round((now_ns - 500_000_000) / 1e9, 4)


def _observations(histogram: Any) -> float:
    return float(sum(bucket.get() for bucket in histogram._buckets))


def test_a_stream_message_that_carries_its_send_time_is_timed_to_its_arrival(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A BrokerHeartbeatStream message has no metadata of its own: the send time rides in the message as a
    field no .proto declares, which survives the wire (serialized, parsed) among its unknown fields."""
    histogram = HEARTBEAT_ARRIVAL_DELAY.labels("8")
    probe = ArrivalProbe(8, log_ms=20)
    plain = cpb.BrokerHeartbeatRequest(broker_id=101, broker_epoch=3)
    stamped = cpb.BrokerHeartbeatRequest(broker_id=101, broker_epoch=3)
    sent_ns = time.monotonic_ns() - 500_000_000  # sent 500 ms ago
    stamp_sent(stamped, sent_ns)
    arrived = cpb.BrokerHeartbeatRequest.FromString(stamped.SerializeToString())
    assert arrived.broker_epoch == 3 and arrived != plain, "the declared fields as sent, the stamp kept"
    with caplog.at_level(logging.INFO):
        probe.message(cpb.BrokerHeartbeatRequest.FromString(plain.SerializeToString()), 101)  # none: nothing
        assert _observations(histogram) == 0
        probe.message(arrived, 101)
    assert _observations(histogram) == 1 and histogram._sum.get() >= 0.5
    lines = [getattr(r, _FIELDS_ATTR) for r in caplog.records if r.getMessage() == "heartbeat_arrived_late"]
    assert len(lines) == 1 and lines[0]["broker"] == 101 and lines[0]["ms"] >= 500
    assert lines[0]["sent_monotonic_s"] == round(sent_ns / 1e9, 4)
