"""BrokerLifecycle on a manual clock: the registration deadline and the heartbeat lease are measured on the
broker's injected clock, so the exact instants can be asserted (the waits between tries stay tiny)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, cast

import pytest

from kraft.broker.lifecycle import BrokerLifecycle, LifecycleTimings, RegistrationFailed, RegistrationInfo
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState
from kraft.client.controller import ControllerClient, ControllerUnavailable
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.observability.logging import KeyValueFormatter
from kraft.v1 import controller_pb2 as cpb

SESSION_MS = 3000


class ScriptedClient:
    """Stands in for ControllerClient: each call takes ``call_ms`` on the manual clock, then answers with
    ``answer(request)`` (which may raise ControllerUnavailable)."""

    def __init__(self, clock: ManualClock, call_ms: int, answer: Callable[[Any], Any]) -> None:
        self.clock = clock
        self.call_ms = call_ms
        self.answer = answer
        self.sent_at_ms: list[int] = []
        self.active_controller_id = 1

    async def call(self, pick: Any, request: Any, timeout_s: float) -> Any:
        self.sent_at_ms.append(self.clock.monotonic_ms())
        self.clock.advance(self.call_ms)
        return self.answer(request)


def _lifecycle(clock: ManualClock, client: ScriptedClient, registration_timeout_s: float) -> BrokerLifecycle:
    status = BrokerStatus(1, "c", session_timeout_ms=SESSION_MS, clock=clock)
    status.transition(BrokerState.STARTING)
    timings = LifecycleTimings(
        heartbeat_interval_s=0.001,
        request_timeout_s=1.0,
        registration_timeout_s=registration_timeout_s,
        retry_backoff_s=0.001,  # real sleeps between tries, kept negligible: time is the manual clock's
    )
    info = RegistrationInfo(listeners=(), rack=None, log_dirs=())
    return BrokerLifecycle(status, cast(ControllerClient, client), info, timings, caught_up=lambda: True)


def _unavailable(request: Any) -> Any:
    raise ControllerUnavailable("no controller")


async def test_registration_gives_up_on_the_first_failure_at_or_after_its_deadline() -> None:
    clock = ManualClock()
    client = ScriptedClient(clock, call_ms=500, answer=_unavailable)
    lifecycle = _lifecycle(clock, client, registration_timeout_s=1.0)
    with pytest.raises(RegistrationFailed, match="not registered within 1 s"):
        await lifecycle.register()
    # Failures answered at 500 (< 1000: retry) and at exactly 1000 (the deadline: give up).
    assert client.sent_at_ms == [0, 500]


async def test_the_lease_runs_from_when_the_accepted_heartbeat_was_sent_not_answered() -> None:
    clock = ManualClock()

    def answer(request: Any) -> Any:
        if isinstance(request, cpb.RegisterBrokerRequest):
            return cpb.RegisterBrokerResponse(error_code=ErrorCode.NONE, broker_epoch=7)
        return cpb.BrokerHeartbeatResponse(error_code=ErrorCode.NONE, is_fenced=False)

    client = ScriptedClient(clock, call_ms=500, answer=answer)
    lifecycle = _lifecycle(clock, client, registration_timeout_s=10.0)
    await lifecycle.register()
    status = lifecycle._status
    assert (status.state, status.broker_epoch) == (BrokerState.RECOVERY, 7)
    assert await lifecycle._heartbeat_once()
    heartbeat_sent_ms = client.sent_at_ms[-1]
    assert clock.monotonic_ms() == heartbeat_sent_ms + 500  # the answer came 500 ms after it was sent
    assert status.state is BrokerState.RUNNING and status.serving_error() is None
    clock.advance(status.lease_duration_ms - 500 - 1)
    assert status.serving_error() is None
    clock.advance(1)  # the lease after the *send*, 500 ms before send + lease + latency
    assert status.lease_lapsed()


async def test_fenced_by_controller_says_why_with_the_heartbeat_gap_and_session_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    clock = ManualClock()
    fenced = [False]

    def answer(request: Any) -> Any:
        if isinstance(request, cpb.RegisterBrokerRequest):
            return cpb.RegisterBrokerResponse(error_code=ErrorCode.NONE, broker_epoch=7)
        return cpb.BrokerHeartbeatResponse(error_code=ErrorCode.NONE, is_fenced=fenced[0])

    client = ScriptedClient(clock, call_ms=100, answer=answer)
    lifecycle = _lifecycle(clock, client, registration_timeout_s=10.0)
    await lifecycle.register()
    assert await lifecycle._heartbeat_once()  # unfenced, sent at 100
    clock.advance(4_000)  # silent past the session: the controller fenced us meanwhile
    fenced[0] = True
    caplog.set_level(logging.WARNING, logger="kraft")
    assert await lifecycle._heartbeat_once()
    formatter = KeyValueFormatter()
    lines = [formatter.format(r) for r in caplog.records if r.getMessage() == "fenced_by_controller"]
    assert len(lines) == 1, caplog.records
    assert "reason=" in lines[0] and "session" in lines[0]
    assert "ms_since_previous_accepted_heartbeat=4100" in lines[0]
    assert f"session_timeout_ms={SESSION_MS}" in lines[0]


async def test_a_heartbeat_sent_before_the_lease_lapsed_and_answered_after_it_needs_a_resync() -> None:
    """Sent while the lease held, answered once it had run out: the controller may have fenced the broker
    and moved its leaderships in between, and unfenced it again on this heartbeat; the answer must not
    let the broker serve before a metadata fetch sent after the lapse has been applied."""
    clock = ManualClock()

    def answer(request: Any) -> Any:
        if isinstance(request, cpb.RegisterBrokerRequest):
            return cpb.RegisterBrokerResponse(error_code=ErrorCode.NONE, broker_epoch=7)
        return cpb.BrokerHeartbeatResponse(error_code=ErrorCode.NONE, is_fenced=False)

    client = ScriptedClient(clock, call_ms=100, answer=answer)
    lifecycle = _lifecycle(clock, client, registration_timeout_s=10.0)
    await lifecycle.register()
    status = lifecycle._status
    assert await lifecycle._heartbeat_once()
    assert status.serving_error() is None and not status.resync_required
    clock.advance(status.lease_duration_ms - 200)  # 100 ms of lease left when the next one is sent
    client.call_ms = 1_000  # ... and it is answered 900 ms after the lease ran out
    assert await lifecycle._heartbeat_once()
    assert status.lease_valid(), "the answer extends the lease from the send, as always"
    assert status.resync_required and status.serving_error() is not None, "but no serving before a resync"
