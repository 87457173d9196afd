"""Partition change builder: ISR and leader decisions as PartitionChangeRecords (pure).

Rules (Kafka's PartitionChangeBuilder, KIP-631):
- the leader is the first acceptable replica, in replica order, that is in the ISR — so the preferred
  leader (``replicas[0]``) is restored automatically whenever it is acceptable and in the ISR; an
  acceptable current leader is kept otherwise (no needless leadership churn);
- the ISR is never shrunk to empty: removing its last member leaves it in place with leader -1
  (an offline partition) until it comes back;
- a record is produced only when something changes (each change bumps both epochs on replay).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from kraft.metadata.delta import make_partition, shared_ids
from kraft.metadata.image import NO_PARTITION_LEADER, PartitionRegistration
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


def build_change(
    topic_id: str,
    partition_id: int,
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    remove_from_isr: int | None = None,
    add_to_isr: Iterable[int] = (),
) -> pb.PartitionChangeRecord | None:
    """The record moving ``current`` to its next state, or None when nothing would change."""
    isr = [r for r in current.isr if r != remove_from_isr]
    if not isr:
        isr = list(current.isr)  # never empty: keep the last member, the partition goes offline
    for broker_id in add_to_isr:
        if broker_id in current.replicas and broker_id not in isr:
            isr.append(broker_id)
    # Keep the ISR in replica order so records are deterministic whatever order members came back in.
    order = {r: i for i, r in enumerate(current.replicas)}
    isr.sort(key=lambda r: order.get(r, len(order)))
    leader = choose_leader(current.replicas, isr, current.leader, acceptable)
    isr_changed = tuple(isr) != current.isr
    if not isr_changed and leader == current.leader:
        return None
    record = pb.PartitionChangeRecord(partition_id=partition_id, topic_id=topic_id)
    if isr_changed:
        record.isr.ids.extend(isr)
    if leader != current.leader:
        record.leader = leader
    return record


def leave_change(
    topic_id: str,
    partition_id: int,
    current: PartitionRegistration,
    acceptable: IsAcceptable,
    broker_id: int,
) -> tuple[pb.MetadataRecord, PartitionRegistration] | None:
    """``build_change(..., remove_from_isr=broker_id)`` for the bulk path of a broker leaving its ISRs:
    the wrapped record and the registration replaying it gives (so the caller need not replay it), or
    None when nothing changes.  Same decisions as :func:`build_change` (property-tested)."""
    replicas = current.replicas
    isr = current.isr
    if broker_id in isr and len(isr) > 1:
        kept = [r for r in isr if r != broker_id]
    else:
        kept = list(isr)  # never empty: the last member stays, the partition goes offline
    # ISR in replica order (members that are not replicas last, in their order), as build_change.
    ordered = [r for r in replicas if r in kept]
    candidates = [r for r in ordered if acceptable(r)]  # replicas only, in replica order
    if len(ordered) != len(kept):
        ordered += [r for r in kept if r not in replicas]
    if not candidates:
        leader = NO_PARTITION_LEADER
    elif candidates[0] == replicas[0] or current.leader not in candidates:
        leader = candidates[0]
    else:
        leader = current.leader
    new_isr = tuple(ordered)
    isr_changed = new_isr != isr
    if not isr_changed and leader == current.leader:
        return None
    record = pb.MetadataRecord()
    change = record.partition_change
    change.partition_id = partition_id
    change.topic_id = topic_id
    if isr_changed:
        change.isr.ids.extend(new_isr)
        isr = shared_ids(new_isr)
    if leader != current.leader:
        change.leader = leader
    registration = make_partition(
        replicas, isr, leader, current.leader_epoch + 1, current.partition_epoch + 1
    )
    return record, registration
