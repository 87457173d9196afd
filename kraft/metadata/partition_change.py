"""Partition change builder: ISR, ELR and leader decisions as PartitionChangeRecords (pure).

Rules (Kafka's PartitionChangeBuilder, KIP-631, with KIP-966's eligible leader replicas always on):

- the **ISR** is the current one less the replica leaving and plus the ones joining, in replica order; it
  may become empty;
- the **ELR** (eligible leader replicas) holds, while the ISR is below ``min.insync.replicas``, the
  members the ISR lost since it dropped below: every ISR member had every record below the high
  watermark, and the leader stops advancing the high watermark below min ISR (KIP-966), so an ELR member
  still has everything committed.  ``ELR = (ELR | old ISR) - new ISR - unclean`` where *unclean* are
  replicas whose data may be gone (a new broker incarnation that cannot prove it kept its log dirs,
  :mod:`kraft.metadata.controller_logic`).  An ISR back at min ISR clears the ELR;
- **last_known_elr** keeps, for operators and unclean recovery, the members that were eligible since
  the ISR dropped below min ISR and are no longer (``(ELR | old ISR | LKE) - new ISR - new ELR``);
  cleared with the ELR when the ISR reaches min ISR again;
- the **leader** is the first acceptable replica, in replica order, that is in the ISR — or in the ELR
  when the ISR is empty (then the ISR becomes that leader alone and it leaves the ELR).  The preferred
  leader (``replicas[0]``) is restored automatically whenever it is acceptable and eligible; an acceptable
  current leader is kept otherwise (no needless leadership churn);
- with ``unclean.leader.election.enable`` a partition left without an eligible acceptable replica elects
  the first acceptable replica (KIP-704): ISR = that leader, ELR and LKE cleared,
  ``leader_recovery_state`` RECOVERING until the new leader reports RECOVERED by AlterPartition, and
  ``last_unclean_leader_epoch`` the leader epoch of that change (kept until the next unclean election):
  followers truncate below their high watermark only records written before it;
- a record is produced only when something changes (each change bumps both epochs on replay).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable
from typing import Final, NamedTuple, cast

from kraft.metadata.delta import apply_isr_leader_change, apply_partition_change, make_partition, shared_ids
from kraft.metadata.image import (
    LEADER_RECOVERED,
    LEADER_RECOVERING,
    NO_PARTITION_LEADER,
    PartitionRegistration,
)
from kraft.metadata.partition_encode import change_value, full_change_value
from kraft.v1 import metadata_pb2 as pb

IsAcceptable = Callable[[int], bool]


def choose_leader(
    replicas: tuple[int, ...], isr: Iterable[int], current: int, acceptable: IsAcceptable
) -> int:
    in_isr = set(isr)
    candidates = [r for r in replicas if r in in_isr and acceptable(r)]
    if not candidates:
        return NO_PARTITION_LEADER
    if candidates[0] == replicas[0] or current not in candidates:
        return candidates[0]
    return current


def in_replica_order(replicas: tuple[int, ...], members: Iterable[int]) -> list[int]:
    """``members`` sorted by replica position (a repeated replica: its last position), non-replicas last
    in their order, so records are deterministic whatever order members came back in."""
    order = {r: i for i, r in enumerate(replicas)}
    try:
        return sorted(members, key=order.__getitem__)  # all replicas: the usual case, no Python key
    except KeyError:
        return sorted(members, key=lambda r: order.get(r, len(order)))


def eligible_after(
    current: PartitionRegistration,
    new_isr: Collection[int],
    min_isr: int,
    unclean: Collection[int] = (),
) -> tuple[list[int], list[int]]:
    """(ELR, last known ELR) once the ISR is ``new_isr`` (see the module docstring), in replica order.
    ``min_isr`` is capped at the replica count (Kafka's effective min ISR)."""
    if len(new_isr) >= effective_min_isr(min_isr, current.replicas):
        return [], []
    isr_set = set(new_isr)
    elr = [r for r in dict.fromkeys((*current.elr, *current.isr)) if r not in isr_set and r not in unclean]
    elr_set = set(elr)
    lke = [
        r
        for r in dict.fromkeys((*current.elr, *current.isr, *current.last_known_elr))
        if r not in isr_set and r not in elr_set
    ]
    return in_replica_order(current.replicas, elr), in_replica_order(current.replicas, lke)


def effective_min_isr(min_isr: int, replicas: tuple[int, ...]) -> int:
    return max(1, min(min_isr, len(replicas)))


class Target(NamedTuple):
    isr: tuple[int, ...]
    elr: tuple[int, ...]
    last_known_elr: tuple[int, ...]
    leader: int
    leader_recovery_state: int
    unclean: bool  # the leader comes from an unclean election


def target_state(
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    remove_from_isr: int | None = None,
    add_to_isr: Iterable[int] = (),
    *,
    min_isr: int = 1,
    unclean_shutdown: Collection[int] = (),
    unclean_election: bool = False,
) -> Target:
    """The state ``current`` moves to (the rules of the module docstring)."""
    replicas = current.replicas
    isr = [r for r in current.isr if r != remove_from_isr and r not in unclean_shutdown]
    for broker_id in add_to_isr:
        if broker_id in replicas and broker_id not in isr:
            isr.append(broker_id)
    isr = in_replica_order(replicas, isr)
    elr, lke = eligible_after(current, isr, min_isr, unclean_shutdown)
    recovery = current.leader_recovery_state
    if isr:
        leader = choose_leader(replicas, isr, current.leader, acceptable)
    else:
        leader = choose_leader(replicas, elr, current.leader, acceptable)
        if leader != NO_PARTITION_LEADER:  # elected from the ELR: it alone is in sync now
            isr = [leader]
            elr = [r for r in elr if r != leader]
            if len(isr) >= effective_min_isr(min_isr, replicas):  # min ISR 1: nothing to keep
                elr, lke = [], []
    unclean = False
    # Unclean only when nobody eligible is acceptable: an acceptable ELR member behind a not yet removed
    # ISR member is elected cleanly once the ISR empties (the member is being moved out right now).
    if leader == NO_PARTITION_LEADER and unclean_election and not any(acceptable(r) for r in (*isr, *elr)):
        live = [r for r in replicas if acceptable(r)]
        if live:
            leader, unclean = live[0], True
            isr, elr, lke = [leader], [], []
            recovery = LEADER_RECOVERING
    return Target(tuple(isr), tuple(elr), tuple(lke), leader, recovery, unclean)


def change_record(
    topic_id: str, partition_id: int, current: PartitionRegistration, target: Target
) -> pb.PartitionChangeRecord | None:
    """The PartitionChangeRecord moving ``current`` to ``target``; None when nothing changes."""
    isr_changed = target.isr != current.isr
    elr_changed = target.elr != current.elr
    lke_changed = target.last_known_elr != current.last_known_elr
    leader_changed = target.leader != current.leader
    recovery_changed = target.leader_recovery_state != current.leader_recovery_state
    if not (isr_changed or elr_changed or lke_changed or leader_changed or recovery_changed):
        return None
    record = pb.PartitionChangeRecord(partition_id=partition_id, topic_id=topic_id)
    if isr_changed:
        record.isr.SetInParent()  # an empty ISR is a change too (presence, not contents)
        record.isr.ids.extend(target.isr)
    if leader_changed:
        record.leader = target.leader
    if elr_changed:
        record.eligible_leader_replicas.SetInParent()
        record.eligible_leader_replicas.ids.extend(target.elr)
    if lke_changed:
        record.last_known_elr.SetInParent()
        record.last_known_elr.ids.extend(target.last_known_elr)
    if recovery_changed:
        record.leader_recovery_state = target.leader_recovery_state
    if target.unclean:
        # The durable marker of this election (the epoch the change gives the partition: every change
        # bumps it by one): followers may truncate below their HWM only what was written before it.
        record.last_unclean_leader_epoch = current.leader_epoch + 1
    return record


def _decide(
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    remove_from_isr: int | None,
    add_to_isr: Iterable[int],
    min_isr: int,
    unclean_shutdown: Collection[int],
    unclean_election: bool,
) -> Target | int | None:
    """:func:`build_change`'s decision: None when nothing changes, the new leader alone (an int) when
    only the leader changes, else the target state (which may still equal ``current``)."""
    replicas, isr = current.replicas, current.isr
    if (
        remove_from_isr is None
        and add_to_isr == ()
        and isr
        and not current.elr
        and not current.last_known_elr
        and current.leader_recovery_state == LEADER_RECOVERED
        and len(isr) >= effective_min_isr(min_isr, replicas)
        and (
            len(set(replicas)) == len(replicas)
            if isr is replicas or isr == replicas
            else in_replica_order(replicas, isr) == list(isr)
        )
    ):
        # Only the leader can change (the election of an unfence or a resumed job over a healthy ISR,
        # most of what a rejoin runs): decided without building the target (same decision, tested).
        leader = choose_leader(replicas, isr, current.leader, acceptable)
        if leader == current.leader and (leader != NO_PARTITION_LEADER or not unclean_election):
            return None  # (leaderless with unclean elections allowed: the full rules may elect)
        if leader != NO_PARTITION_LEADER or not unclean_election:
            return leader
    return target_state(
        current,
        acceptable,
        remove_from_isr,
        add_to_isr,
        min_isr=min_isr,
        unclean_shutdown=unclean_shutdown,
        unclean_election=unclean_election,
    )


def build_change(
    topic_id: str,
    partition_id: int,
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    remove_from_isr: int | None = None,
    add_to_isr: Iterable[int] = (),
    *,
    min_isr: int = 1,
    unclean_shutdown: Collection[int] = (),
    unclean_election: bool = False,
) -> pb.PartitionChangeRecord | None:
    """The record moving ``current`` to its next state, or None when nothing would change."""
    decision = _decide(
        current, acceptable, remove_from_isr, add_to_isr, min_isr, unclean_shutdown, unclean_election
    )
    if decision is None:
        return None
    if type(decision) is int:
        return pb.PartitionChangeRecord(partition_id=partition_id, topic_id=topic_id, leader=decision)
    return change_record(topic_id, partition_id, current, cast("Target", decision))


def build_change_encoded(
    topic: bytes,
    partition_id: int,
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    remove_from_isr: int | None = None,
    add_to_isr: Iterable[int] = (),
    *,
    min_isr: int = 1,
    unclean_shutdown: Collection[int] = (),
    unclean_election: bool = False,
) -> tuple[bytes, PartitionRegistration] | None:
    """:func:`build_change` as a batch of values takes it (session 19): the value ``encode_value`` gives
    its record, written from the decision's fields
    (:func:`~kraft.metadata.partition_encode.full_change_value`; ``topic`` is
    :func:`~kraft.metadata.partition_encode.topic_field`'s), and the registration replaying it gives
    (:func:`apply_partition_change`'s, built from the decision: no upb record either way); None when
    nothing would change.  Same bytes and registration as the record path (property-tested)."""
    decision = _decide(
        current, acceptable, remove_from_isr, add_to_isr, min_isr, unclean_shutdown, unclean_election
    )
    if decision is None:
        return None
    if type(decision) is int:
        # a leader-only change: the registration is what a follower's replay of it gives
        return change_value(topic, partition_id, None, decision), apply_isr_leader_change(
            current, None, decision
        )
    return change_encoded(topic, partition_id, current, cast("Target", decision))


def change_encoded(
    topic: bytes, partition_id: int, current: PartitionRegistration, target: Target
) -> tuple[bytes, PartitionRegistration] | None:
    """:func:`change_record`'s value (``topic``: :func:`~kraft.metadata.partition_encode.topic_field`'s)
    and the registration :func:`apply_partition_change` gives for it; None when nothing changes."""
    isr_changed = target.isr != current.isr
    elr_changed = target.elr != current.elr
    lke_changed = target.last_known_elr != current.last_known_elr
    leader_changed = target.leader != current.leader
    recovery_changed = target.leader_recovery_state != current.leader_recovery_state
    if not (isr_changed or elr_changed or lke_changed or leader_changed or recovery_changed):
        return None
    # (the unclean epoch: the leader epoch this change gives the partition, as change_record writes it)
    unclean_epoch = current.leader_epoch + 1 if target.unclean else None
    value = full_change_value(
        topic,
        partition_id,
        target.isr if isr_changed else None,
        target.leader if leader_changed else None,
        target.elr if elr_changed else None,
        target.last_known_elr if lke_changed else None,
        target.leader_recovery_state if recovery_changed else None,
        unclean_epoch,
    )
    registration = make_partition(
        current.replicas,
        shared_ids(target.isr) if isr_changed else current.isr,
        target.leader,
        current.leader_epoch + 1,
        current.partition_epoch + 1,
        shared_ids(target.elr) if elr_changed else current.elr,
        shared_ids(target.last_known_elr) if lke_changed else current.last_known_elr,
        target.leader_recovery_state,
        current.last_unclean_leader_epoch if unclean_epoch is None else unclean_epoch,
    )
    return value, registration


LeaveMemo = dict[tuple[tuple[int, ...], tuple[int, ...], int, int, bool], object]
""":func:`leave_change`'s decisions by (replicas, ISR, leader, min ISR, unclean election), for one leaving
broker and one acceptability: the caller makes one per (broker, ``acceptable``) and drops it as soon as
either may answer differently (a broker's registration changed, another broker started or ended leaving)."""

_LAST_MEMBER: Final = object()  # the ISR's only member leaves: _last_member_leave
_GENERAL: Final = object()  # the ELR or an unclean election is involved: _general_leave
_UNCHANGED: Final = object()  # nothing changes


def leave_change(
    topic_id: str,
    partition_id: int,
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    broker_id: int,
    *,
    min_isr: int = 1,
    unclean_shutdown: bool = False,
    unclean_election: bool = False,
    memo: LeaveMemo | None = None,
) -> tuple[pb.MetadataRecord, PartitionRegistration] | None:
    """:func:`leave_change_encoded` with every change as a upb record."""
    return cast(
        "tuple[pb.MetadataRecord, PartitionRegistration] | None",
        leave_change_encoded(
            topic_id,
            None,
            partition_id,
            current,
            acceptable,
            broker_id,
            min_isr=min_isr,
            unclean_shutdown=unclean_shutdown,
            unclean_election=unclean_election,
            memo=memo,
        ),
    )


def leave_change_encoded(
    topic_id: str,
    topic: bytes | None,
    partition_id: int,
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    broker_id: int,
    *,
    min_isr: int = 1,
    unclean_shutdown: bool = False,
    unclean_election: bool = False,
    memo: LeaveMemo | None = None,
) -> tuple[pb.MetadataRecord | bytes, PartitionRegistration] | None:
    """``build_change(..., remove_from_isr=broker_id)`` for the bulk path of a broker leaving its ISRs
        (``unclean_shutdown``: its data may be gone, it leaves the ELR too): the wrapped record and the
        registration replaying it gives (so the caller need not replay it), or None when nothing changes.
        Same decisions as :func:`build_change` (property-tested).  The common case — no ELR involved, the
        ISR stays at or above min ISR — is decided inline (a fence changes every partition of the broker).

        ``memo`` (:data:`LeaveMemo`): the decision is looked up by the partition's replicas, ISR and leader
        (shared tuples: a broker's partitions repeat a few thousand replica lists) instead of being made again
        (issue #17, session 15: the decision was half of this function's time; the leave scan -30 % in
        ``bench.shutdown_profile``).

        ``topic`` (:func:`~kraft.metadata.partition_encode.topic_field` of ``topic_id``, or None): the common
        change — only the ISR and the leader change — comes back as its value, encoded from its fields
        (:func:`~kraft.metadata.partition_encode.change_value`: the bytes ``encode_value`` gives the record,
        ~1 µs against ~3.4 to build and encode that record; session 18); since session 19 the rarer shapes too
    (a sole replica's leave, the ELR's: :func:`build_change_encoded`)."""
    if current.elr or current.last_known_elr or current.leader_recovery_state != LEADER_RECOVERED:
        return _general_leave(
            topic_id,
            topic,
            partition_id,
            current,
            acceptable,
            broker_id,
            min_isr,
            unclean_shutdown,
            unclean_election,
        )
    replicas = current.replicas
    if memo is None:
        decision = _leave_decision(
            replicas, current.isr, current.leader, acceptable, broker_id, min_isr, unclean_election
        )
    else:
        key = (replicas, current.isr, current.leader, min_isr, unclean_election)
        decision = memo.get(key)
        if decision is None:
            decision = memo[key] = _leave_decision(
                replicas, current.isr, current.leader, acceptable, broker_id, min_isr, unclean_election
            )
    if decision is _UNCHANGED:
        return None
    if decision is _LAST_MEMBER:
        return _last_member_leave(topic_id, topic, partition_id, current, broker_id, unclean_shutdown)
    if decision is _GENERAL:
        return _general_leave(
            topic_id,
            topic,
            partition_id,
            current,
            acceptable,
            broker_id,
            min_isr,
            unclean_shutdown,
            unclean_election,
        )
    new_isr, leader = cast("tuple[tuple[int, ...] | None, int]", decision)
    record: pb.MetadataRecord | bytes
    if topic is not None:
        record = change_value(topic, partition_id, new_isr, leader if leader != current.leader else None)
    else:
        record = pb.MetadataRecord()
        change = record.partition_change
        change.partition_id = partition_id
        change.topic_id = topic_id
        if new_isr is not None:
            change.isr.ids.extend(new_isr)
        if leader != current.leader:
            change.leader = leader
    isr = current.isr if new_isr is None else new_isr
    if current.last_unclean_leader_epoch:
        registration = make_partition(
            replicas,
            isr,
            leader,
            current.leader_epoch + 1,
            current.partition_epoch + 1,
            last_unclean_leader_epoch=current.last_unclean_leader_epoch,
        )
    else:  # make_partition's common case, without its checks
        registration = PartitionRegistration(
            replicas,
            replicas if isr == replicas else isr,
            leader,
            current.leader_epoch + 1,
            current.partition_epoch + 1,
        )
    return record, registration


def _leave_decision(
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    current_leader: int,
    acceptable: IsAcceptable,
    broker_id: int,
    min_isr: int,
    unclean_election: bool,
) -> object:
    """What :func:`leave_change` does with a partition holding no ELR or last known ELR, recovered:
    :data:`_LAST_MEMBER`, :data:`_GENERAL`, :data:`_UNCHANGED`, or (the new ISR as a shared tuple, or None
    when it stays, the new leader).  Reads nothing but its arguments (and ``acceptable``'s answers)."""
    if (
        isr == (broker_id,)
        and not acceptable(broker_id)
        and not (unclean_election and any(map(acceptable, replicas)))
    ):
        return _LAST_MEMBER
    kept = [r for r in isr if r != broker_id]
    if len(kept) < effective_min_isr(min_isr, replicas) or not kept:
        return _GENERAL
    # ISR in replica order (members that are not replicas last, in their order), as build_change.
    ordered = [r for r in replicas if r in kept]
    candidates = [r for r in ordered if acceptable(r)]  # replicas only, in replica order
    if len(ordered) != len(kept):
        ordered += [r for r in kept if r not in replicas]
    if not candidates:
        if unclean_election:  # no eligible leader: the general path runs the unclean election
            return _GENERAL
        leader = NO_PARTITION_LEADER
    elif candidates[0] == replicas[0] or current_leader not in candidates:
        leader = candidates[0]
    else:
        leader = current_leader
    new_isr = tuple(ordered)
    if new_isr == isr:
        return _UNCHANGED if leader == current_leader else (None, leader)
    return shared_ids(new_isr), leader


def rules_matter(current: PartitionRegistration, acceptable: IsAcceptable, broker_id: int) -> bool:
    """Whether :func:`leave_change` of ``broker_id`` may depend on ``min_isr`` / ``unclean_election``
    (the topic's election rules, two config lookups).  False only where it cannot: the broker is the ISR's
    only member, no ELR or last known ELR, recovered, and no replica acceptable — a sole replica's broker
    leaving (the one-partition topics a single-broker cluster created, ~9,000 in bench.controller's
    shutdown): the ISR empties, nobody is elected, and no unclean election has anyone to pick.  The caller
    then passes any rules (property-tested: the same result for every ``min_isr`` and
    ``unclean_election``)."""
    return not (
        current.isr == (broker_id,)
        and not current.elr
        and not current.last_known_elr
        and current.leader_recovery_state == LEADER_RECOVERED
        and not any(map(acceptable, current.replicas))
        and not acceptable(broker_id)
    )


def _last_member_leave(
    topic_id: str,
    topic: bytes | None,
    partition_id: int,
    current: PartitionRegistration,
    broker_id: int,
    unclean_shutdown: bool,
) -> tuple[pb.MetadataRecord | bytes, PartitionRegistration]:
    """:func:`leave_change` when ``broker_id`` is the ISR's only member and is not acceptable, with no ELR
    or last known ELR, recovered, and no unclean election to run: the ISR empties, the leader goes (none
    is eligible: the ELR is the broker alone), and the broker joins the ELR — or, its data maybe gone
    (``unclean_shutdown``), the last known ELR.  What :func:`target_state` decides for it, without the
    general path's lists and sets (a sole replica's leave costs ~4x a shared partition's there).  With
    ``topic`` (:func:`leave_change_encoded`'s) the change comes back as its value (session 19)."""
    left = shared_ids((broker_id,))
    elr: tuple[int, ...]
    lke: tuple[int, ...]
    elr, lke = ((), left) if unclean_shutdown else (left, ())
    registration = make_partition(
        current.replicas,
        shared_ids(()),
        NO_PARTITION_LEADER,
        current.leader_epoch + 1,
        current.partition_epoch + 1,
        elr,
        lke,
        LEADER_RECOVERED,
        current.last_unclean_leader_epoch,
    )
    leader = NO_PARTITION_LEADER if current.leader != NO_PARTITION_LEADER else None
    if topic is not None:
        value = full_change_value(
            topic, partition_id, (), leader, elr or None, lke or None, None, None
        )  # (the ISR present, emptied; the list the broker joins present, the other absent)
        return value, registration
    record = pb.MetadataRecord()
    change = record.partition_change
    change.partition_id = partition_id
    change.topic_id = topic_id
    change.isr.SetInParent()  # emptied: present with no ids
    if leader is not None:
        change.leader = leader
    if unclean_shutdown:
        change.last_known_elr.ids.append(broker_id)
    else:
        change.eligible_leader_replicas.ids.append(broker_id)
    return record, registration


def _general_leave(
    topic_id: str,
    topic: bytes | None,
    partition_id: int,
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    broker_id: int,
    min_isr: int,
    unclean_shutdown: bool,
    unclean_election: bool,
) -> tuple[pb.MetadataRecord | bytes, PartitionRegistration] | None:
    if topic is not None:  # a batch of values (session 19): no upb record
        return build_change_encoded(
            topic,
            partition_id,
            current,
            acceptable,
            remove_from_isr=broker_id,
            min_isr=min_isr,
            unclean_shutdown=(broker_id,) if unclean_shutdown else (),
            unclean_election=unclean_election,
        )
    change = build_change(
        topic_id,
        partition_id,
        current,
        acceptable,
        remove_from_isr=broker_id,
        min_isr=min_isr,
        unclean_shutdown=(broker_id,) if unclean_shutdown else (),
        unclean_election=unclean_election,
    )
    if change is None:
        return None
    record = pb.MetadataRecord()
    record.partition_change.CopyFrom(change)
    return record, apply_partition_change(current, change)
