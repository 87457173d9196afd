"""acks=0/1/all: the check before the append, the waiters, and the acknowledged-means-replicated property."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from replication_events import FIRST_FOUND, MIN_ISR, Event, Run, events, initial_isrs, run

import kraft.replication.acks as acks_module
from kraft.errors import ErrorCode
from kraft.replication.acks import Acks, AcksAllWaiters, Completion, admit_produce, answered_at_append
from kraft.replication.leader_state import PartitionLeaderState

PROPERTY = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SCRIPTS = st.tuples(events, initial_isrs)


@pytest.mark.parametrize(
    ("acks", "isr_size", "error"),
    [
        (Acks.ALL, 1, ErrorCode.NOT_ENOUGH_REPLICAS),
        (Acks.ALL, 2, ErrorCode.NONE),
        (Acks.LEADER, 1, ErrorCode.NONE),  # min.insync.replicas only guards acks=all
        (Acks.NONE, 1, ErrorCode.NONE),
    ],
)
def test_admission_before_the_append(acks: Acks, isr_size: int, error: ErrorCode) -> None:
    assert admit_produce(acks, isr_size, min_insync_replicas=2) is error


def test_only_acks_all_waits() -> None:
    assert answered_at_append(Acks.NONE) and answered_at_append(Acks.LEADER)
    assert not answered_at_append(Acks.ALL)


def test_a_waiter_is_answered_when_the_high_watermark_reaches_its_required_offset() -> None:
    waiters = AcksAllWaiters()
    assert (
        waiters.add(
            1,
            required_offset=10,
            deadline_ms=1000,
            high_watermark=5,
            maximal_isr_size=3,
            min_insync_replicas=2,
        )
        == []
    )
    assert waiters.add(2, 12, 1000, 5, 3, 2) == []
    assert waiters.on_high_watermark(9, 3, 2) == []
    assert waiters.on_high_watermark(11, 3, 2) == [Completion(1, ErrorCode.NONE)]
    assert waiters.on_high_watermark(12, 3, 2) == [Completion(2, ErrorCode.NONE)]
    assert len(waiters) == 0


def test_a_waiter_already_covered_is_answered_at_once() -> None:
    assert AcksAllWaiters().add(1, 10, 1000, 10, 3, 2) == [Completion(1, ErrorCode.NONE)]


def test_an_isr_shrunk_below_the_minimum_answers_not_enough_replicas_after_append() -> None:
    waiters = AcksAllWaiters()
    waiters.add(1, 10, 1000, 5, 3, 2)
    # the lagging member left the ISR, which let the HWM pass the request: replicated on 1 < 2 replicas
    assert waiters.on_high_watermark(10, 1, 2) == [Completion(1, ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND)]


def test_waiters_time_out_at_their_deadline() -> None:
    waiters = AcksAllWaiters()
    waiters.add(1, 10, 1000, 5, 3, 2)
    waiters.add(2, 11, 2000, 5, 3, 2)
    assert waiters.next_deadline_ms() == 1000
    assert waiters.expire(999) == []
    assert waiters.expire(1000) == [Completion(1, ErrorCode.REQUEST_TIMED_OUT)]
    assert waiters.next_deadline_ms() == 2000
    assert waiters.on_high_watermark(11, 3, 2) == [Completion(2, ErrorCode.NONE)]
    assert waiters.next_deadline_ms() is None
    assert waiters.expire(10_000) == []  # answered requests never time out afterwards


def test_losing_leadership_fails_every_waiter() -> None:
    waiters = AcksAllWaiters()
    waiters.add(2, 10, 1000, 5, 3, 2)
    waiters.add(1, 11, 1000, 5, 3, 2)
    assert waiters.fail_all(ErrorCode.NOT_LEADER_OR_FOLLOWER) == [
        Completion(1, ErrorCode.NOT_LEADER_OR_FOLLOWER),
        Completion(2, ErrorCode.NOT_LEADER_OR_FOLLOWER),
    ]
    assert len(waiters) == 0 and waiters.next_deadline_ms() is None


def test_a_request_id_waits_once() -> None:
    waiters = AcksAllWaiters()
    waiters.add(1, 10, 1000, 5, 3, 2)
    with pytest.raises(ValueError):
        waiters.add(1, 11, 1000, 5, 3, 2)


# --- properties with the leader state -------------------------------------------------------------------


def _ack_violations(result: Run) -> list[str]:
    problems: list[str] = []
    seen: set[int] = set()
    for answer in result.answers:
        request_id, error = answer.completion.request_id, answer.completion.error
        required, deadline_ms = result.produced[request_id]
        if request_id in seen:
            problems.append(f"request {request_id} answered twice")
        seen.add(request_id)
        if error is ErrorCode.REQUEST_TIMED_OUT:
            if answer.now_ms < deadline_ms:
                problems.append(f"request {request_id} timed out early")
            continue
        # NONE and NOT_ENOUGH_REPLICAS_AFTER_APPEND both mean: the records are on every ISR member
        lagging = {r: answer.log_ends[r] for r in answer.maximal_isr if answer.log_ends[r] < required}
        if lagging:
            problems.append(
                f"request {request_id} (needs {required}) answered {error.name}; lagging {lagging}"
            )
        if error is ErrorCode.NONE and len(answer.maximal_isr) < MIN_ISR:
            problems.append(f"request {request_id} acknowledged with an ISR of {len(answer.maximal_isr)}")
    return problems


@PROPERTY
@given(events, initial_isrs)
def test_an_acks_all_write_is_answered_only_once_every_isr_member_has_it(
    script: list[Event], initial_isr: tuple[int, ...]
) -> None:
    result = run(script, initial_isr, PartitionLeaderState)
    assert result.violations == []
    assert _ack_violations(result) == []


def test_the_acks_property_catches_answering_on_the_leaders_end() -> None:
    """Broken: waiters checked against the leader's own log end instead of the high watermark."""

    class LeaderEndHwm(PartitionLeaderState):
        @property
        def high_watermark(self) -> int:
            return self.leader_end_offset

    script, isr = find(
        SCRIPTS,
        lambda args: bool(_ack_violations(run(args[0], args[1], LeaderEndHwm))),
        settings=settings(
            max_examples=3000, database=None, deadline=None, derandomize=True, phases=FIRST_FOUND
        ),
    )
    assert _ack_violations(run(script, isr, LeaderEndHwm))


def test_the_acks_property_catches_ignoring_min_insync_replicas(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(acks_module, "_reached", lambda size, minimum: ErrorCode.NONE)
    script, isr = find(
        SCRIPTS,
        lambda args: bool(_ack_violations(run(args[0], args[1], PartitionLeaderState))),
        settings=settings(
            max_examples=3000, database=None, deadline=None, derandomize=True, phases=FIRST_FOUND
        ),
    )
    assert _ack_violations(run(script, isr, PartitionLeaderState))
