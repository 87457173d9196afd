"""Value types shared by the replication rules: a partition's leader/ISR state and AlterPartition."""

from __future__ import annotations

from dataclasses import dataclass

UNKNOWN_OFFSET = -1  # a follower's log end before its first fetch in this leadership
NO_BROKER_EPOCH = -1  # "do not check the broker epoch" (KIP-903's wildcard)
NO_LEADER_EPOCH = -1  # a request that carries no leader epoch (skips the epoch check, as in Kafka)
RECOVERED = 0  # leader recovery state (KIP-704, Kafka's LeaderRecoveryState): the usual one
RECOVERING = 1  # after an unclean election, until the leader reports RECOVERED by AlterPartition


@dataclass(frozen=True, slots=True)
class LeaderAndIsr:
    """What the metadata says about one partition — the fields replication acts on (Kafka's name).

    ``isr`` ⊆ ``replicas``; the leader is in the ISR. Epochs as in the PartitionRecord /
    PartitionChangeRecord: the leader epoch fences old leaders and stale fetches, the partition epoch
    versions every change of the partition (AlterPartition's compare-and-set).
    """

    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_recovery_state: int = RECOVERED


@dataclass(frozen=True, slots=True)
class IsrMember:
    """One member of a proposed ISR with the broker epoch the leader saw in its fetches (KIP-903)."""

    broker_id: int
    broker_epoch: int = NO_BROKER_EPOCH


@dataclass(frozen=True, slots=True)
class AlterPartitionRequest:
    """A leader's request to change one partition's ISR (Kafka's AlterPartition, one partition)."""

    broker_id: int  # the leader asking
    broker_epoch: int
    leader_epoch: int  # the leader epoch the leader is in
    partition_epoch: int  # the partition epoch the proposal is based on (compare-and-set)
    new_isr: tuple[IsrMember, ...]
    leader_recovery_state: int = RECOVERED  # RECOVERED ends an unclean election's RECOVERING

    @property
    def new_isr_ids(self) -> tuple[int, ...]:
        return tuple(member.broker_id for member in self.new_isr)
