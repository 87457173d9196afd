"""AlterPartition validation on the controller: Kafka's checks in Kafka's order, and ISR-change fencing."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st
from replication_events import FIRST_FOUND

from kraft.errors import ErrorCode
from kraft.replication.alter_partition import (
    CHECKS,
    AlterPartitionCheck,
    AlterPartitionRejected,
    BrokerStatus,
    IsrChange,
    validate_alter_partition,
)
from kraft.replication.types import AlterPartitionRequest, IsrMember, LeaderAndIsr

PROPERTY = settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])

PARTITION = LeaderAndIsr(leader=1, leader_epoch=5, partition_epoch=9, replicas=(1, 2, 3), isr=(1, 2))
BROKERS = {1: BrokerStatus(100), 2: BrokerStatus(200), 3: BrokerStatus(300), 4: BrokerStatus(400)}


def request(
    *,
    broker_id: int = 1,
    broker_epoch: int = 100,
    leader_epoch: int = 5,
    partition_epoch: int = 9,
    isr: tuple[int, ...] = (1, 2, 3),
    epochs: dict[int, int] | None = None,
) -> AlterPartitionRequest:
    members = tuple(IsrMember(r, (epochs or {}).get(r, -1)) for r in isr)
    return AlterPartitionRequest(broker_id, broker_epoch, leader_epoch, partition_epoch, members)


def error_of(result: IsrChange | AlterPartitionRejected) -> ErrorCode:
    return result.error if isinstance(result, AlterPartitionRejected) else ErrorCode.NONE


def test_a_valid_expansion_is_accepted_in_replica_order() -> None:
    result = validate_alter_partition(request(isr=(3, 1, 2)), PARTITION, BROKERS)
    assert result == IsrChange((1, 2, 3), changed=True)


def test_an_unchanged_isr_is_accepted_without_a_change() -> None:
    assert validate_alter_partition(request(isr=(1, 2)), PARTITION, BROKERS) == IsrChange((1, 2), False)


@pytest.mark.parametrize(
    ("req", "partition", "brokers", "error"),
    [
        (request(broker_epoch=99), PARTITION, BROKERS, ErrorCode.STALE_BROKER_EPOCH),
        (request(broker_id=7, broker_epoch=1), PARTITION, BROKERS, ErrorCode.STALE_BROKER_EPOCH),
        (request(), None, BROKERS, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        (request(leader_epoch=6), PARTITION, BROKERS, ErrorCode.NOT_CONTROLLER),
        (request(partition_epoch=10), PARTITION, BROKERS, ErrorCode.NOT_CONTROLLER),
        (request(leader_epoch=4), PARTITION, BROKERS, ErrorCode.FENCED_LEADER_EPOCH),
        (request(broker_id=2, broker_epoch=200), PARTITION, BROKERS, ErrorCode.INVALID_REQUEST),
        (request(partition_epoch=8), PARTITION, BROKERS, ErrorCode.INVALID_UPDATE_VERSION),
        (request(isr=()), PARTITION, BROKERS, ErrorCode.INVALID_REQUEST),
        (request(isr=(1, 2, 2)), PARTITION, BROKERS, ErrorCode.INVALID_REQUEST),
        (request(isr=(1, 4)), PARTITION, BROKERS, ErrorCode.INVALID_REQUEST),  # 4 is not a replica
        (request(isr=(2, 3)), PARTITION, BROKERS, ErrorCode.INVALID_REQUEST),  # drops the leader
        (request(), PARTITION, {**BROKERS, 3: BrokerStatus(300, fenced=True)}, ErrorCode.INELIGIBLE_REPLICA),
        (
            request(),
            PARTITION,
            {**BROKERS, 3: BrokerStatus(300, in_controlled_shutdown=True)},
            ErrorCode.INELIGIBLE_REPLICA,
        ),
        (request(), PARTITION, {1: BROKERS[1], 2: BROKERS[2]}, ErrorCode.INELIGIBLE_REPLICA),  # 3 gone
        (request(epochs={3: 299}), PARTITION, BROKERS, ErrorCode.INELIGIBLE_REPLICA),  # KIP-903
        (request(epochs={3: 300}), PARTITION, BROKERS, ErrorCode.NONE),
        # a fenced member that the request drops is no obstacle (shrinking away from it)
        (request(isr=(1,)), PARTITION, {**BROKERS, 2: BrokerStatus(200, fenced=True)}, ErrorCode.NONE),
    ],
)
def test_each_refusal(
    req: AlterPartitionRequest,
    partition: LeaderAndIsr | None,
    brokers: dict[int, BrokerStatus],
    error: ErrorCode,
) -> None:
    assert error_of(validate_alter_partition(req, partition, brokers)) is error


def test_checks_run_in_kafkas_order() -> None:
    # stale leader epoch AND stale partition epoch AND a fenced member: the leader epoch answers
    req = request(leader_epoch=4, partition_epoch=8)
    brokers = {**BROKERS, 3: BrokerStatus(300, fenced=True)}
    assert error_of(validate_alter_partition(req, PARTITION, brokers)) is ErrorCode.FENCED_LEADER_EPOCH
    # a stale partition epoch answers before an ineligible member
    req = request(partition_epoch=8)
    assert error_of(validate_alter_partition(req, PARTITION, brokers)) is ErrorCode.INVALID_UPDATE_VERSION


def test_two_proposals_from_the_same_partition_epoch_cannot_both_commit() -> None:
    shrink = request(isr=(1,))
    expand = request(isr=(1, 2, 3))
    assert isinstance(validate_alter_partition(shrink, PARTITION, BROKERS), IsrChange)
    after = LeaderAndIsr(1, 5, 10, (1, 2, 3), (1,))  # replayed: the partition epoch moved
    result = validate_alter_partition(expand, after, BROKERS)
    assert error_of(result) is ErrorCode.INVALID_UPDATE_VERSION


# --- properties ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Case:
    partition: LeaderAndIsr
    brokers: dict[int, BrokerStatus]
    request: AlterPartitionRequest


@st.composite
def cases(draw: st.DrawFn) -> Case:
    replicas = tuple(draw(st.permutations((1, 2, 3, 4)))[: draw(st.integers(1, 4))])
    leader = draw(st.sampled_from(replicas))
    isr = tuple(r for r in replicas if r == leader or draw(st.booleans()))
    partition = LeaderAndIsr(leader, draw(st.integers(0, 3)), draw(st.integers(0, 3)), replicas, isr)
    brokers = {
        b: BrokerStatus(
            10 * b,
            fenced=draw(st.integers(0, 4)) == 0,
            in_controlled_shutdown=draw(st.integers(0, 4)) == 0,
        )
        for b in (1, 2, 3, 4, 5)
        if draw(st.integers(0, 7)) > 0
    }
    requester = draw(st.sampled_from((leader, leader, leader, 1, 5)))
    # mostly well-formed ISRs (the leader and other replicas, each once), sometimes not
    members = [leader, *(r for r in replicas if r != leader and draw(st.booleans()))]
    if draw(st.integers(0, 4)) == 0:
        members = draw(st.lists(st.sampled_from((1, 2, 3, 4, 5)), max_size=4))
    new_isr = tuple(IsrMember(m, draw(st.sampled_from((-1, 10 * m, 10 * m, 10 * m + 1)))) for m in members)
    req = AlterPartitionRequest(
        requester,
        draw(st.sampled_from((10 * requester, 10 * requester, 10 * requester, 10 * requester - 1))),
        partition.leader_epoch + draw(st.sampled_from((0, 0, 0, -1, 1))),
        partition.partition_epoch + draw(st.sampled_from((0, 0, 0, -1, 1))),
        new_isr,
    )
    return Case(partition, brokers, req)


def _acceptance_is_safe(case: Case, checks: tuple[AlterPartitionCheck, ...] = CHECKS) -> bool:
    result = validate_alter_partition(case.request, case.partition, case.brokers, checks)
    if not isinstance(result, IsrChange):
        return True
    p, req = case.partition, case.request
    requester = case.brokers.get(req.broker_id)
    return (
        requester is not None
        and requester.broker_epoch == req.broker_epoch
        and req.broker_id == p.leader
        and (req.leader_epoch, req.partition_epoch) == (p.leader_epoch, p.partition_epoch)  # fencing
        and p.leader in result.new_isr
        and set(result.new_isr) <= set(p.replicas)
        and sorted(result.new_isr) == sorted(set(req.new_isr_ids))
        and all(
            (s := case.brokers.get(m.broker_id)) is not None
            and not s.fenced
            and not s.in_controlled_shutdown
            and m.broker_epoch in (-1, s.broker_epoch)
            for m in req.new_isr
        )
    )


@PROPERTY
@given(cases())
def test_an_accepted_change_is_fenced_by_both_epochs_and_admits_only_eligible_replicas(case: Case) -> None:
    assert _acceptance_is_safe(case)


@PROPERTY
@given(cases())
def test_a_stale_partition_epoch_is_never_accepted(case: Case) -> None:
    result = validate_alter_partition(case.request, case.partition, case.brokers)
    if case.request.partition_epoch < case.partition.partition_epoch:
        assert isinstance(result, AlterPartitionRejected)
        assert result.error in {
            ErrorCode.STALE_BROKER_EPOCH,
            ErrorCode.NOT_CONTROLLER,
            ErrorCode.FENCED_LEADER_EPOCH,
            ErrorCode.INVALID_REQUEST,
            ErrorCode.INVALID_UPDATE_VERSION,
        }


@pytest.mark.parametrize(
    "dropped", ["_partition_epoch_current", "_members_eligible", "_leader_epoch_current"]
)
def test_the_safety_property_catches_a_missing_check(dropped: str) -> None:
    broken = tuple(check for check in CHECKS if check.__name__ != dropped)
    assert len(broken) == len(CHECKS) - 1
    counterexample = find(
        cases(),
        lambda case: not _acceptance_is_safe(case, broken),
        settings=settings(
            max_examples=3000, database=None, deadline=None, derandomize=True, phases=FIRST_FOUND
        ),
    )
    assert not _acceptance_is_safe(counterexample, broken)


def test_leader_recovery_state_kip_704() -> None:
    """A RECOVERING partition (unclean election): RECOVERED with the ISR as it is is a change; RECOVERING
    may not expand; a RECOVERED partition may not go back; unknown states are refused."""
    from dataclasses import replace

    recovering = LeaderAndIsr(leader=1, leader_epoch=5, partition_epoch=9, replicas=(1, 2, 3), isr=(1,))
    recovering = replace(recovering, leader_recovery_state=1)
    alone = request(isr=(1,))
    assert validate_alter_partition(alone, recovering, BROKERS) == IsrChange((1,), changed=True)
    still = replace(alone, leader_recovery_state=1)
    assert validate_alter_partition(still, recovering, BROKERS) == IsrChange((1,), changed=False)
    grow = replace(request(isr=(1, 2)), leader_recovery_state=1)
    assert error_of(validate_alter_partition(grow, recovering, BROKERS)) is ErrorCode.INVALID_REQUEST
    back = replace(request(isr=(1, 2)), leader_recovery_state=1)
    assert error_of(validate_alter_partition(back, PARTITION, BROKERS)) is ErrorCode.INVALID_REQUEST
    odd = replace(request(isr=(1, 2)), leader_recovery_state=7)
    assert error_of(validate_alter_partition(odd, PARTITION, BROKERS)) is ErrorCode.INVALID_REQUEST
