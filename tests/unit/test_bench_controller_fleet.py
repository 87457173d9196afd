"""bench.controller_fleet: the benchmark client's own lateness on synthetic heartbeats and loop stalls, and
the merge of worker processes' heartbeats into the one fleet the windows are computed from.  No timing is
asserted: the numbers are read by the benchmark, not checked here."""

from __future__ import annotations

import asyncio
import io
import json
import subprocess
import time
from types import SimpleNamespace
from typing import Any, cast

import pytest
from google.protobuf.unknown_fields import UnknownFieldSet

from bench.controller_fleet import (
    Beat,
    Fleet,
    FleetWorkers,
    LoopLagTicker,
    beat_offset_s,
    error_kind,
    next_send_at,
)
from kraft.client.admin import AdminClient
from kraft.client.heartbeat_stream import HeartbeatStream
from kraft.errors import ErrorCode, KraftError
from kraft.observability.stall_sampler import SENT_FIELD_NUMBER
from kraft.v1 import controller_pb2 as cpb


def _fleet() -> Fleet:
    # window() and the merge never call the clients
    return Fleet(cast(AdminClient, None), cast(AdminClient, None), "c", interval_s=2.0)


def test_the_client_lag_is_the_stall_an_answer_was_noticed_after() -> None:
    ticker = LoopLagTicker(stalls=[(10.0, 0.05), (10.5, 0.2), (12.0, 0.03)])
    assert ticker.lag_at_notice(9.0, 9.9) == 0.0  # noticed before every stall
    assert ticker.lag_at_notice(9.9, 10.001) == 0.05  # noticed as the first stall (9.95-10.0) ended
    assert ticker.lag_at_notice(10.45, 10.49) == pytest.approx(
        0.04
    )  # at most the round trip, however long the stall
    assert ticker.lag_at_notice(9.0, 10.6) == 0.0  # a stall in the middle of the round trip: not the client's
    assert ticker.lag_at_notice(11.0, 12.015) == pytest.approx(0.03)  # within the slack after the stall's end


def test_a_window_keeps_its_latency_statistics_and_adds_the_clients_lateness() -> None:
    fleet = _fleet()
    # 100 heartbeats in [0, 100): 98 fast, two slow — the slowest while the client's loop stalled
    fleet.latencies = [Beat(i * 1.0, 0.002, 0.001) for i in range(98)]
    fleet.latencies += [Beat(99.0, 0.400, 0.0), Beat(99.5, 0.300, 0.050)]
    ticker = LoopLagTicker(stalls=[(99.39, 0.25), (50.0, 0.01)])  # the 400 ms answer came in the first
    fleet.tag_client_lags(ticker)
    window = fleet.window(0.0, 100.0)
    stats = (window["heartbeats"], window["p50_ms"], window["p99_ms"], window["max_ms"])
    assert stats == (100, 2.0, 400.0, 400.0)
    client = window["client"]
    assert client["loop_stalls_over_20ms"] == 1 and client["loop_stall_ms_over_20ms"] == 250.0
    assert client["loop_stall_max_ms"] == 250.0
    assert client["send_late_max_ms"] == 50.0
    assert client["slowest_1pct"] == 1 and client["slowest_1pct_during_client_lag"] == 1
    # without the heartbeat the client's own stall delayed, the slowest is the 300 ms one
    assert client["heartbeats_without_client_lag"] == 99 and client["p99_ms_without_client_lag"] == 300.0
    assert client["p99_ms_less_client_lag"] == 300.0  # 400 ms less its 250 ms stall is 150 ms
    assert fleet.window(200.0, 300.0) == {"heartbeats": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}


def test_the_fleet_is_spread_over_the_interval_as_before() -> None:
    assert beat_offset_s(1, 1000, 2.0) == 0.002
    assert beat_offset_s(500, 1000, 2.0) == 1.0
    assert beat_offset_s(1000, 1000, 2.0) == 0.0
    assert beat_offset_s(100, 200, 2.0) == 1.0


def test_a_slot_missed_in_a_stall_is_skipped_not_sent_late() -> None:
    assert next_send_at(10.0, 10.5, 2.0) == 12.0  # on schedule: the next slot, as before
    assert next_send_at(10.0, 12.0, 2.0) == 12.0  # exactly at the slot: sent now
    assert next_send_at(10.0, 12.5, 2.0) == 14.0  # 12 went by during a slow answer
    assert next_send_at(10.0, 17.5, 2.0) == 18.0  # 12, 14 and 16 went by: none of them sent late


class _Clock:
    """Time for Fleet.run_one: only the patched sleep and the fake heartbeat move it."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def test_a_broker_sends_no_burst_after_a_slow_heartbeat(monkeypatch: pytest.MonkeyPatch) -> None:
    """One heartbeat takes 7 s (a stalled quorum or client): the broker's next one goes at its next slot
    (8 s), not the three it missed at once — a fleet of 1,000 doing that was a burst that kept a
    saturated host saturated after the stall had ended (raft-performance.md, session 14)."""
    clock = _Clock()
    monkeypatch.setattr("bench.controller_fleet.time.monotonic", clock.monotonic)
    monkeypatch.setattr("bench.controller_fleet.asyncio.sleep", clock.sleep)
    fleet = _fleet()
    fleet.epochs[1] = 1
    sent: list[float] = []

    async def beat(broker_id: int, patient: bool = False) -> Any:
        sent.append(clock.now)
        clock.now += 7.0 if len(sent) == 1 else 0.01
        if len(sent) == 4:
            fleet.stopped.add(broker_id)
        raise TimeoutError("no answer")  # counted as an error, and the broker goes on

    monkeypatch.setattr(fleet, "beat", beat)
    asyncio.run(fleet.run_one(1, 0.0))
    assert sent == pytest.approx([0.0, 8.0, 10.0, 12.0])
    assert fleet.errors == 4
    assert fleet.error_kinds == {"TimeoutError": 4}


def test_an_error_kind_names_the_status_a_timed_out_call_quoted() -> None:
    stalled = KraftError(
        ErrorCode.NOT_CONTROLLER,
        "no active controller answered within 2s: controller 1 at 127.0.0.1:1: DEADLINE_EXCEEDED Deadline",
    )
    assert error_kind(stalled) == "KraftError:NOT_CONTROLLER:DEADLINE_EXCEEDED"
    assert error_kind(
        KraftError(ErrorCode.NOT_CONTROLLER, "controller at x is not the active controller")
    ) == ("KraftError:NOT_CONTROLLER")
    assert error_kind(TimeoutError()) == "TimeoutError"


class _FakeChild:
    """What FleetWorkers reads of a worker process: its answer lines."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.stdin = io.StringIO()
        self.stdout = io.StringIO("".join(json.dumps(answer) + "\n" for answer in answers))
        self.returncode: int | None = None
        self.pid = 0

    def poll(self) -> int | None:
        return self.returncode

    def kill(self) -> None:
        self.returncode = -9

    def wait(self) -> int:
        return self.returncode or 0


def test_workers_heartbeats_are_merged_into_the_fleet_in_send_order() -> None:
    fleet = _fleet()
    fleet.latencies = [Beat(1.0, 0.01, 0.0, 0.0)]  # broker 1, from the benchmark's own process
    fleet.errors = 1
    answers = [
        {
            "beats": [[3.0, 0.02, 0.001, 0.0], [0.5, 0.03, 0.0, 0.025]],
            "stalls": [[0.52, 0.025]],
            "errors": 2,
            "fenced_after_unfence": [7],
        },
        {"beats": [[2.0, 0.04, 0.0, 0.0]], "stalls": [], "errors": 0, "fenced_after_unfence": []},
    ]
    workers = FleetWorkers(["t"], "c", [2, 3, 4], 4, 2.0, 2, "uvloop")
    children = [_FakeChild([answer]) for answer in answers]
    workers._children = cast(list[subprocess.Popen[str]], children)
    asyncio.run(workers.stop(fleet))
    assert [beat.sent for beat in fleet.latencies] == [0.5, 1.0, 2.0, 3.0]
    assert fleet.latencies[0] == Beat(0.5, 0.03, 0.0, 0.025)
    assert fleet.stalls == [(0.52, 0.025)]
    assert fleet.errors == 3 and fleet.fenced_after_unfence == {7}
    assert all(json.loads(child.stdin.getvalue()) == "stop" for child in children)
    assert workers._children == [] and all(child.returncode == -9 for child in children)


def test_a_streamed_heartbeat_carries_its_send_time_in_the_message() -> None:
    """A stream's metadata is sent once: the fleet stamps each message (stall_sampler.SENT_FIELD_NUMBER),
    which a node with observability.stall.sampler.ms reads back as the message's arrival delay."""
    sent: list[cpb.BrokerHeartbeatRequest] = []

    class Stream:
        async def heartbeat(self, request: cpb.BrokerHeartbeatRequest, timeout_s: float) -> Any:
            sent.append(cpb.BrokerHeartbeatRequest.FromString(request.SerializeToString()))  # over the wire
            return cpb.BrokerHeartbeatResponse()

    beats = cast(AdminClient, SimpleNamespace(timeout_s=2.0))  # the stream reads only its timeout
    fleet = Fleet(cast(AdminClient, None), beats, "c", interval_s=2.0, heartbeat_stream=True)
    fleet.epochs[101] = 5
    fleet._streams[101] = cast(HeartbeatStream, Stream())
    before_ns = time.monotonic_ns()
    asyncio.run(fleet.beat(101))
    assert len(sent) == 1 and (sent[0].broker_id, sent[0].broker_epoch) == (101, 5)
    fields = UnknownFieldSet(sent[0])
    stamps = [fields[i].data for i in range(len(fields)) if fields[i].field_number == SENT_FIELD_NUMBER]
    assert len(stamps) == 1 and before_ns <= stamps[0] <= time.monotonic_ns()
