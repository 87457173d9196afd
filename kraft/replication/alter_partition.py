"""The controller's validation of an AlterPartition request (Kafka's ReplicationControlManager).

A partition leader asks to change its ISR: ``(broker id, broker epoch, leader epoch, partition epoch,
new ISR with each member's broker epoch)``. The controller checks it against the partition as committed
(plus pending) and the broker registrations, and either refuses it with one error or accepts the new ISR
(a PartitionChangeRecord when it differs). The checks run in Kafka's order — ``alterPartition`` then
``validateAlterPartitionData`` and ``ineligibleReplicasForIsr`` — and the first failing one answers:

1. the requester is not registered, or with another broker epoch → STALE_BROKER_EPOCH (the whole
   request; ``ClusterControlManager.checkBrokerEpoch``);
2. unknown partition → UNKNOWN_TOPIC_OR_PARTITION;
3. a leader epoch or partition epoch *newer* than the controller's → NOT_CONTROLLER (this controller is
   behind: the leader should find the active one);
4. an older leader epoch → FENCED_LEADER_EPOCH (the requester was deposed);
5. the requester is not the partition's leader → INVALID_REQUEST (Kafka's code; same epoch, another
   leader can only be a malformed request);
6. an older partition epoch → INVALID_UPDATE_VERSION (the compare-and-set: the ISR changed since the
   leader read it — it waits for the metadata and decides again);
7. a new ISR that is empty, has duplicates or non-replicas, or lacks the leader → INVALID_REQUEST;
8. leader recovery state (KIP-704): a request that says RECOVERING for a RECOVERED partition, or a
   RECOVERING request whose ISR is not the leader alone → INVALID_REQUEST (a leader elected uncleanly
   first reports RECOVERED, then expands);
9. a member that is not registered, fenced, in controlled shutdown, or whose broker epoch (when given,
   KIP-903) is not its registered one → INELIGIBLE_REPLICA (KIP-841: the leader's view of a broker may
   be stale; the controller's is not).

Accepted: the new ISR in replica order (kraft keeps ISRs in replica order, see
:mod:`kraft.metadata.partition_change`) and whether it changes anything. Kafka then writes a
PartitionChangeRecord with the ISR only — the leader and its epoch stay (only the partition epoch moves)
and no election runs; a wiring must not reuse ``partition_change.build_change``, whose preferred-leader
restore would move the leadership away from the requester.

Not modelled here: ELR (KIP-966: the controller derives it from the accepted ISR,
``kraft.metadata.isr_changes``), reassignment.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kraft.errors import ErrorCode
from kraft.replication.types import (
    NO_BROKER_EPOCH,
    RECOVERED,
    RECOVERING,
    AlterPartitionRequest,
    LeaderAndIsr,
)


@dataclass(frozen=True, slots=True)
class BrokerStatus:
    """The controller's view of one registered broker."""

    broker_epoch: int
    fenced: bool = False
    in_controlled_shutdown: bool = False


@dataclass(frozen=True, slots=True)
class IsrChange:
    new_isr: tuple[int, ...]  # in replica order
    changed: bool  # False: nothing to write (ISR and leader recovery state as they are)


@dataclass(frozen=True, slots=True)
class AlterPartitionRejected:
    error: ErrorCode
    reason: str


@dataclass(frozen=True, slots=True)
class _Context:
    request: AlterPartitionRequest
    partition: LeaderAndIsr | None
    brokers: Mapping[int, BrokerStatus]


AlterPartitionCheck = Callable[[_Context], AlterPartitionRejected | None]


def _requester_registered(ctx: _Context) -> AlterPartitionRejected | None:
    status = ctx.brokers.get(ctx.request.broker_id)
    if status is None or status.broker_epoch != ctx.request.broker_epoch:
        return AlterPartitionRejected(
            ErrorCode.STALE_BROKER_EPOCH,
            f"broker {ctx.request.broker_id} epoch {ctx.request.broker_epoch} is not registered",
        )
    return None


def _partition_known(ctx: _Context) -> AlterPartitionRejected | None:
    if ctx.partition is None:
        return AlterPartitionRejected(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "unknown partition")
    return None


def _controller_not_behind(ctx: _Context) -> AlterPartitionRejected | None:
    assert ctx.partition is not None
    if (
        ctx.request.leader_epoch > ctx.partition.leader_epoch
        or ctx.request.partition_epoch > ctx.partition.partition_epoch
    ):
        return AlterPartitionRejected(ErrorCode.NOT_CONTROLLER, "the request is newer than this controller")
    return None


def _leader_epoch_current(ctx: _Context) -> AlterPartitionRejected | None:
    assert ctx.partition is not None
    if ctx.request.leader_epoch < ctx.partition.leader_epoch:
        return AlterPartitionRejected(
            ErrorCode.FENCED_LEADER_EPOCH,
            f"leader epoch {ctx.request.leader_epoch} < {ctx.partition.leader_epoch}",
        )
    return None


def _requester_is_leader(ctx: _Context) -> AlterPartitionRejected | None:
    assert ctx.partition is not None
    if ctx.request.broker_id != ctx.partition.leader:
        return AlterPartitionRejected(
            ErrorCode.INVALID_REQUEST, f"the leader is {ctx.partition.leader}, not {ctx.request.broker_id}"
        )
    return None


def _partition_epoch_current(ctx: _Context) -> AlterPartitionRejected | None:
    assert ctx.partition is not None
    if ctx.request.partition_epoch < ctx.partition.partition_epoch:
        return AlterPartitionRejected(
            ErrorCode.INVALID_UPDATE_VERSION,
            f"partition epoch {ctx.request.partition_epoch} < {ctx.partition.partition_epoch}",
        )
    return None


def _isr_well_formed(ctx: _Context) -> AlterPartitionRejected | None:
    assert ctx.partition is not None
    ids = ctx.request.new_isr_ids
    if not ids or len(set(ids)) != len(ids) or not set(ids) <= set(ctx.partition.replicas):
        return AlterPartitionRejected(ErrorCode.INVALID_REQUEST, f"invalid ISR {list(ids)}")
    if ctx.partition.leader not in ids:
        return AlterPartitionRejected(ErrorCode.INVALID_REQUEST, f"ISR {list(ids)} lacks the leader")
    return None


def _recovery_state_valid(ctx: _Context) -> AlterPartitionRejected | None:
    assert ctx.partition is not None
    state = ctx.request.leader_recovery_state
    if state not in (RECOVERED, RECOVERING):
        return AlterPartitionRejected(ErrorCode.INVALID_REQUEST, f"unknown leader recovery state {state}")
    if state == RECOVERING and ctx.partition.leader_recovery_state == RECOVERED:
        return AlterPartitionRejected(
            ErrorCode.INVALID_REQUEST, "a recovered partition cannot go back to RECOVERING"
        )
    if state == RECOVERING and len(ctx.request.new_isr) > 1:
        return AlterPartitionRejected(
            ErrorCode.INVALID_REQUEST, "the ISR cannot expand while the leader is RECOVERING"
        )
    return None


def _members_eligible(ctx: _Context) -> AlterPartitionRejected | None:
    reasons: list[str] = []
    for member in ctx.request.new_isr:
        status = ctx.brokers.get(member.broker_id)
        if status is None:
            reasons.append(f"{member.broker_id}: not registered")
        elif status.in_controlled_shutdown:
            reasons.append(f"{member.broker_id}: shutting down")
        elif status.fenced:
            reasons.append(f"{member.broker_id}: fenced")
        elif member.broker_epoch not in (NO_BROKER_EPOCH, status.broker_epoch):
            reasons.append(f"{member.broker_id}: broker epoch {member.broker_epoch} != {status.broker_epoch}")
    if reasons:
        return AlterPartitionRejected(ErrorCode.INELIGIBLE_REPLICA, "; ".join(reasons))
    return None


# The checks in Kafka's order: the first refusal answers.
CHECKS: tuple[AlterPartitionCheck, ...] = (
    _requester_registered,
    _partition_known,
    _controller_not_behind,
    _leader_epoch_current,
    _requester_is_leader,
    _partition_epoch_current,
    _isr_well_formed,
    _recovery_state_valid,
    _members_eligible,
)


def validate_alter_partition(
    request: AlterPartitionRequest,
    partition: LeaderAndIsr | None,
    brokers: Mapping[int, BrokerStatus],
    checks: tuple[AlterPartitionCheck, ...] = CHECKS,
) -> IsrChange | AlterPartitionRejected:
    """Validate ``request`` against ``partition`` (None: unknown) and the broker registrations."""
    ctx = _Context(request, partition, brokers)
    for check in checks:
        refused = check(ctx)
        if refused is not None:
            return refused
    assert partition is not None
    order = {replica: index for index, replica in enumerate(partition.replicas)}
    new_isr = tuple(sorted(request.new_isr_ids, key=order.__getitem__))
    recovered = request.leader_recovery_state != partition.leader_recovery_state
    return IsrChange(new_isr, changed=new_isr != partition.isr or recovered)
