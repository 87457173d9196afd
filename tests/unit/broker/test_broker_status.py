"""BrokerStatus: the lifecycle table, the lease and the resync rule that gate serving."""

from __future__ import annotations

import pytest

from kraft.broker.status import BrokerStatus, IllegalStateTransition, lease_duration_ms
from kraft.broker.types import BrokerState
from kraft.clock import ManualClock
from kraft.errors import ErrorCode


def running_status(clock: ManualClock) -> BrokerStatus:
    status = BrokerStatus(1, "c", session_timeout_ms=3000, clock=clock)
    for state in (BrokerState.STARTING, BrokerState.RECOVERY, BrokerState.RUNNING):
        status.transition(state)
    status.fenced = False
    status.heartbeat_accepted(clock.monotonic_ms())
    return status


def test_only_the_lifecycle_transitions_are_allowed() -> None:
    status = BrokerStatus(1, "c", session_timeout_ms=3000, clock=ManualClock())
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


def test_the_lease_is_the_session_timeout_less_a_tenth_for_clock_drift() -> None:
    assert lease_duration_ms(3000) == 2700
    assert lease_duration_ms(9000) == 8100  # Kafka's default session: 900 ms earlier than the controller
    assert lease_duration_ms(5) == 4  # at least 1 ms earlier, however short the session
    assert BrokerStatus(1, "c", session_timeout_ms=3000, clock=ManualClock()).lease_duration_ms == 2700


def test_the_lease_runs_from_when_the_accepted_heartbeat_was_sent() -> None:
    clock = ManualClock(start_ms=100_000)
    status = running_status(clock)
    assert status.serving_error() is None
    assert status.lease_expires_at_ms() == 102_700
    clock.advance(2699)  # the last millisecond of the lease: 10% before the 3000 ms session ends
    assert status.serving_error() is None and not status.lease_lapsed()
    clock.advance(1)
    error = status.serving_error()
    assert error is not None and error[0] is ErrorCode.BROKER_NOT_AVAILABLE
    assert status.lease_lapsed()
    status.heartbeat_accepted(clock.monotonic_ms() - 2700)  # an old heartbeat's answer never revives it
    assert status.lease_lapsed()


def test_a_later_heartbeat_extends_the_lease_and_an_earlier_one_never_shortens_it() -> None:
    clock = ManualClock(start_ms=100_000)
    status = running_status(clock)  # lease until 102_700
    clock.advance(1000)
    status.heartbeat_accepted(clock.monotonic_ms())  # lease until 103_700
    status.heartbeat_accepted(100_500)  # a late answer to an older heartbeat: would end at 103_200
    clock.advance(2699)
    assert status.serving_error() is None
    clock.advance(1)
    assert status.lease_lapsed()


def test_a_revoked_lease_stops_serving_but_is_not_a_lapse() -> None:
    clock = ManualClock()
    status = running_status(clock)
    status.revoke_lease()
    assert status.serving_error() is not None
    assert status.lease_expires_at_ms() is None
    assert not status.lease_lapsed()  # re-registration, not a missed session: the lifecycle decides


def test_record_timestamps_come_from_the_wall_clock_and_the_lease_from_the_monotonic_one() -> None:
    clock = ManualClock(start_ms=5, wall_start_ms=1_700_000_000_005)
    status = running_status(clock)
    assert (status.monotonic_ms(), status.now_ms()) == (5, 1_700_000_000_005)


def test_a_resync_is_only_ended_by_a_fetch_sent_after_it_began() -> None:
    clock = ManualClock()
    status = running_status(clock)
    before = status.resync_generation
    status.begin_resync()
    assert status.serving_error() is not None
    assert not status.end_resync(before)  # that fetch was already in flight
    assert status.resync_required
    assert status.end_resync(status.resync_generation)
    assert status.serving_error() is None
