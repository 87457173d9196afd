"""AlterPartition on the active controller: a leader's ISR proposal → an ISR-only PartitionChangeRecord.

Validation is :func:`kraft.replication.alter_partition.validate_alter_partition` (Kafka's
``ReplicationControlManager`` checks, in its order) against the *speculative* image — committed plus
pending records — so two proposals in flight are compared-and-set against each other, not only against
what has committed.  An accepted proposal writes a PartitionChangeRecord carrying the ISR only: no
election runs, so the requester stays leader (``partition_change.build_change`` is deliberately not used:
its preferred-leader restore would move the leadership away from the broker that asked).

KIP-966: the record also carries the ELR and last known ELR the new ISR implies
(:func:`kraft.metadata.partition_change.eligible_after`): a shrink below min.insync.replicas moves the
dropped members into the ELR (they hold everything below the frozen high watermark), an expansion takes
the joining members out of it, and an ISR back at min ISR clears both.

Replay bumps the leader epoch as well as the partition epoch (kraft bumps both on every change, see
docs/internals/replication.md, "Leader epoch bumps"): the answer carries the replayed partition, and the
leader waits for that metadata before it uses the new ISR.

Kept apart from :mod:`kraft.metadata.controller_logic` so that module's own evolution (incremental
indexes) and this one do not collide; it only reads the logic's image and acceptability rule and
replaces the image with the replayed one, as every request does.
"""

from __future__ import annotations

from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records as rec
from kraft.metadata.controller_logic import ControllerLogic, Outcome, error_response
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage, PartitionRegistration
from kraft.metadata.offline_replicas import OfflineReplicaGuard, guard_for
from kraft.metadata.partition_change import eligible_after
from kraft.replication.alter_partition import (
    AlterPartitionRejected,
    BrokerStatus,
    IsrChange,
    validate_alter_partition,
)
from kraft.replication.types import AlterPartitionRequest, IsrMember, LeaderAndIsr
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb


def leader_and_isr(partition: PartitionRegistration) -> LeaderAndIsr:
    return LeaderAndIsr(
        partition.leader,
        partition.leader_epoch,
        partition.partition_epoch,
        tuple(partition.replicas),
        tuple(partition.isr),
        partition.leader_recovery_state,
    )


def broker_statuses(logic: ControllerLogic, image: MetadataImage) -> dict[int, BrokerStatus]:
    """The registrations as AlterPartition sees them; a broker the controller is moving out of its ISRs
    (fenced, shutting down, unregistering: ``acceptable_in`` says no) is ineligible."""
    acceptable = logic.acceptable_in(image)
    return {
        broker_id: BrokerStatus(
            broker.epoch,
            fenced=broker.fenced or not acceptable(broker_id),
            in_controlled_shutdown=broker.in_controlled_shutdown,
        )
        for broker_id, broker in image.brokers.items()
    }


def _online_members(
    verdict: IsrChange, guard: OfflineReplicaGuard, topic_id: str, partition_id: int
) -> IsrChange | AlterPartitionRejected:
    """A replica on a log dir its broker took offline cannot be in sync (it is not fetching): refused
    like a fenced member (INELIGIBLE_REPLICA), after the checks of
    :func:`~kraft.replication.alter_partition.validate_alter_partition`."""
    offline = [r for r in verdict.new_isr if guard.offline(r, topic_id, partition_id)]
    if offline:
        return AlterPartitionRejected(
            ErrorCode.INELIGIBLE_REPLICA, "; ".join(f"{r}: replica on an offline log dir" for r in offline)
        )
    return verdict


def alter_partition(
    logic: ControllerLogic, req: cpb.AlterPartitionRequest, next_offset: int
) -> Outcome[cpb.AlterPartitionResponse]:
    """Validate every partition of ``req`` in order; accepted changes are replayed as they are added,
    so a later partition entry of the same request sees the earlier one's new partition epoch."""
    response = cpb.AlterPartitionResponse()
    try:
        logic.check_cluster_id(req.cluster_id)
    except KraftError as exc:
        return Outcome([], error_response(response, exc.code, exc.message))
    image = logic.image
    requester = image.brokers.get(req.broker_id)
    if requester is None or requester.epoch != req.broker_epoch:
        known = "not registered" if requester is None else f"registered with epoch {requester.epoch}"
        return Outcome(
            [],
            error_response(
                response,
                ErrorCode.STALE_BROKER_EPOCH,
                f"broker {req.broker_id} epoch {req.broker_epoch} is stale: {known}",
            ),
        )
    statuses = broker_statuses(logic, image)  # registrations do not change below, only partitions
    guard = guard_for(image)
    records: list[pb.MetadataRecord] = []
    for data in req.partitions:
        result = response.partitions.add(topic_id=data.topic_id, partition=data.partition)
        current = image.partition(data.topic_id, data.partition)
        request = AlterPartitionRequest(
            req.broker_id,
            req.broker_epoch,
            data.leader_epoch,
            data.partition_epoch,
            tuple(IsrMember(m.broker_id, m.broker_epoch) for m in data.new_isr),
            data.leader_recovery_state,
        )
        verdict = validate_alter_partition(
            request,
            None if current is None else leader_and_isr(current),
            statuses,
        )
        if not isinstance(verdict, AlterPartitionRejected) and guard.active:
            verdict = _online_members(verdict, guard, data.topic_id, data.partition)
        if isinstance(verdict, AlterPartitionRejected):
            result.error_code = int(verdict.error)
            result.error_message = f"{data.topic_id}-{data.partition}: {verdict.reason}"
            continue
        assert current is not None  # validation refuses an unknown partition
        topic = image.topics_by_id[data.topic_id]
        min_isr, _ = logic.election_rules(image, topic.name)
        elr, lke = eligible_after(current, verdict.new_isr, min_isr)
        elr_changed = tuple(elr) != tuple(current.elr)
        lke_changed = tuple(lke) != tuple(current.last_known_elr)
        isr_changed = verdict.new_isr != tuple(current.isr)
        recovered = data.leader_recovery_state != current.leader_recovery_state
        if isr_changed or recovered or elr_changed or lke_changed:
            change = pb.PartitionChangeRecord(topic_id=data.topic_id, partition_id=data.partition)
            if isr_changed:
                change.isr.ids.extend(verdict.new_isr)
            if recovered:  # KIP-704: the uncleanly elected leader reports its log consistent
                change.leader_recovery_state = data.leader_recovery_state
            if elr_changed:
                change.eligible_leader_replicas.SetInParent()
                change.eligible_leader_replicas.ids.extend(elr)
            if lke_changed:
                change.last_known_elr.SetInParent()
                change.last_known_elr.ids.extend(lke)
            record = rec.wrap(change)
            delta = MetadataDelta(image)
            delta.replay(record, next_offset + len(records))
            image = delta.apply()
            # Keep the rejoin index on the image (its flags, a running rejoin job's watch): left behind,
            # it went stale at every AlterPartition — the next unfence rebuilt it in slices (~1 s per
            # million partitions) and a rejoin job in progress fell back to scanning the rest.
            logic.rejoin_index.advance(delta, image.topics_by_id)
            records.append(record)
            replayed = image.partition(data.topic_id, data.partition)
            assert replayed is not None
            current = replayed
        result.leader = current.leader
        result.leader_epoch = current.leader_epoch
        result.partition_epoch = current.partition_epoch
        result.isr.extend(current.isr)
    logic.image = image
    return Outcome(records, response, next_offset)
