"""Small value types shared by the broker modules: partitions, roles, lifecycle states, local changes.

They are frozen, slotted dataclasses and enums so the hot paths (Produce/Fetch, delta application) never
touch pydantic.  The metadata module's image and delta are translated into these at one boundary
(:mod:`kraft.broker.image_adapter`) so the partition manager can be tested without a controller.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field


class BrokerState(enum.IntEnum):
    """Kafka's ``BrokerState`` with its numbers (KRaft reference §4)."""

    NOT_RUNNING = 0
    STARTING = 1
    RECOVERY = 2
    RUNNING = 3
    PENDING_CONTROLLED_SHUTDOWN = 6
    SHUTTING_DOWN = 7


class ReplicaRole(enum.Enum):
    LEADER = "LEADER"
    FOLLOWER = "FOLLOWER"


@dataclass(frozen=True, slots=True, order=True)
class TopicPartition:
    topic: str
    partition: int

    @property
    def dir_name(self) -> str:
        """Kafka's partition directory name, ``<topic>-<partition>``."""
        return f"{self.topic}-{self.partition}"

    def __str__(self) -> str:
        return self.dir_name


@dataclass(frozen=True, slots=True)
class PartitionAssignment:
    """What the metadata image says about one partition (only the fields a broker acts on)."""

    topic_id: str
    leader: int
    leader_epoch: int
    partition_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_recovery_state: int = 0  # KIP-704: 1 = RECOVERING after an unclean election (not persisted)
    # The leader epoch of the partition's latest unclean election (0 = none): a follower may truncate
    # below its high watermark only records written in an older epoch (kraft.replication.truncation).
    last_unclean_leader_epoch: int = 0


@dataclass(frozen=True, slots=True)
class LocalChanges:
    """The part of a metadata delta that concerns one broker's replicas (Kafka's LocalReplicaChanges).

    ``deletes`` maps partitions this broker no longer hosts (topic deleted or replica moved away) to the
    topic id whose log must go — a log of another topic id under the same name is kept, which keeps
    re-applying a delta idempotent when a topic was deleted and re-created;
    ``leaders`` / ``followers`` are partitions it hosts whose assignment is new or changed.  A
    partition is in at most one of ``leaders`` / ``followers``; it is in ``deletes`` as well only when its
    topic was re-created under the same name (new topic id): the old log goes first, then the new one.
    """

    deletes: Mapping[TopicPartition, str] = field(default_factory=dict)
    leaders: Mapping[TopicPartition, PartitionAssignment] = field(default_factory=dict)
    followers: Mapping[TopicPartition, PartitionAssignment] = field(default_factory=dict)

    def is_empty(self) -> bool:
        return not (self.deletes or self.leaders or self.followers)


def local_changes_between(
    broker_id: int,
    before: Mapping[TopicPartition, PartitionAssignment],
    after: Mapping[TopicPartition, PartitionAssignment],
) -> LocalChanges:
    """Local changes that take a broker hosting ``before`` to hosting ``after``.

    Both maps hold only the partitions the broker is a replica of.  Used for full reconciliation (after a
    snapshot load or at startup), where there is no incremental delta to read the changes from.
    """
    deletes = {
        tp: old.topic_id
        for tp, old in before.items()
        if tp not in after or after[tp].topic_id != old.topic_id
    }
    leaders: dict[TopicPartition, PartitionAssignment] = {}
    followers: dict[TopicPartition, PartitionAssignment] = {}
    for tp, new in after.items():
        old = before.get(tp)
        if old == new and tp not in deletes:
            continue
        if new.leader == broker_id:
            leaders[tp] = new
        else:
            followers[tp] = new
    return LocalChanges(deletes=deletes, leaders=leaders, followers=followers)


CHANGES_STEP = 1024
"""Partitions :func:`local_changes_between_in_steps` compares between two pauses (~1-2 ms)."""


def local_changes_between_in_steps(
    broker_id: int,
    before: Mapping[TopicPartition, PartitionAssignment],
    after: Mapping[TopicPartition, PartitionAssignment],
    out: LocalChanges,
) -> Iterator[None]:
    """:func:`local_changes_between` into ``out`` (whose mappings must be empty dicts), pausing (yielding)
    after every :data:`CHANGES_STEP` partitions compared: a broker's start-up reconciliation of 100,000
    partitions is ~160 ms in one go (bench/broker_open.py).  Neither map may change until the iterator is
    exhausted; the result (and each mapping's order) equals the one-go function's."""
    deletes, leaders, followers = out.deletes, out.leaders, out.followers
    assert isinstance(deletes, dict) and isinstance(leaders, dict) and isinstance(followers, dict)
    for count, (tp, old) in enumerate(before.items(), 1):
        new_of = after.get(tp)
        if new_of is None or new_of.topic_id != old.topic_id:
            deletes[tp] = old.topic_id
        if count % CHANGES_STEP == 0:
            yield
    for count, (tp, new) in enumerate(after.items(), 1):
        if count % CHANGES_STEP == 0:
            yield
        if before.get(tp) == new and tp not in deletes:
            continue
        if new.leader == broker_id:
            leaders[tp] = new
        else:
            followers[tp] = new


@dataclass(frozen=True, slots=True)
class ProducedRecord:
    """A record as a client hands it to Produce (``None`` = a null key / value, as in Kafka)."""

    key: bytes | None
    value: bytes | None
    timestamp_ms: int


@dataclass(frozen=True, slots=True)
class StoredRecord:
    """A record read back from a partition log."""

    offset: int
    timestamp_ms: int
    key: bytes | None
    value: bytes | None
    leader_epoch: int
