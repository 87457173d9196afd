"""BrokerStatus: the lifecycle table, the lease and the resync rule that gate serving."""

from __future__ import annotations

import pytest

from kraft.broker.status import BrokerStatus, IllegalStateTransition
from kraft.broker.types import BrokerState
from kraft.errors import ErrorCode


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def running_status(clock: Clock) -> BrokerStatus:
    status = BrokerStatus(1, "c", session_timeout_ms=3000, clock=clock)
    for state in (BrokerState.STARTING, BrokerState.RECOVERY, BrokerState.RUNNING):
        status.transition(state)
    status.fenced = False
    status.heartbeat_accepted(clock.now)
    return status


def test_only_the_lifecycle_transitions_are_allowed() -> None:
    status = BrokerStatus(1, "c", session_timeout_ms=3000)
    seen: list[tuple[BrokerState, BrokerState]] = []
    status.on_transition(lambda old, new: seen.append((old, new)))
    with pytest.raises(IllegalStateTransition):
        status.transition(BrokerState.RUNNING)  # NOT_RUNNING cannot jump to RUNNING
    status.transition(BrokerState.STARTING)
    status.transition(BrokerState.RECOVERY)
    status.transition(BrokerState.RUNNING)
    status.transition(BrokerState.RECOVERY)  # fenced by the controller
    status.transition(BrokerState.PENDING_CONTROLLED_SHUTDOWN)
    with pytest.raises(IllegalStateTransition):
        status.transition(BrokerState.RUNNING)
    status.transition(BrokerState.SHUTTING_DOWN)
    status.transition(BrokerState.NOT_RUNNING)
    assert [new for _, new in seen] == [
        BrokerState.STARTING,
        BrokerState.RECOVERY,
        BrokerState.RUNNING,
        BrokerState.RECOVERY,
        BrokerState.PENDING_CONTROLLED_SHUTDOWN,
        BrokerState.SHUTTING_DOWN,
        BrokerState.NOT_RUNNING,
    ]


def test_the_lease_runs_from_when_the_accepted_heartbeat_was_sent() -> None:
    clock = Clock()
    status = running_status(clock)
    assert status.serving_error() is None
    clock.now += 2.9
    assert status.serving_error() is None and not status.lease_lapsed()
    clock.now += 0.2
    error = status.serving_error()
    assert error is not None and error[0] is ErrorCode.BROKER_NOT_AVAILABLE
    assert status.lease_lapsed()
    status.heartbeat_accepted(clock.now - 10)  # an old heartbeat's answer never shortens or revives it
    assert status.lease_lapsed()


def test_a_resync_is_only_ended_by_a_fetch_sent_after_it_began() -> None:
    clock = Clock()
    status = running_status(clock)
    before = status.resync_generation
    status.begin_resync()
    assert status.serving_error() is not None
    assert not status.end_resync(before)  # that fetch was already in flight
    assert status.resync_required
    assert status.end_resync(status.resync_generation)
    assert status.serving_error() is None
