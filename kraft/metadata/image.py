"""The immutable metadata image: what the committed metadata log says, as of one offset.

Images are never mutated.  A :class:`~kraft.metadata.delta.MetadataDelta` produces the next image and
shares every unchanged sub-map and every unchanged topic with the previous one (the two topic maps are
:class:`~kraft.metadata.pmap.PersistentMap` objects: a new topic costs O(log n), not a copy of every
topic), so building a new image costs in proportion to what changed — down to within a topic: a topic's
partitions (indexed by partition id, dense 0..n-1) above 1,024 are a
:class:`~kraft.metadata.chunked.ChunkedSequence` of chunks of 1,024 (a tuple below), and the next
version of a topic shares every chunk the delta did not touch.  Each
partition is a :class:`PartitionRegistration` named tuple — about 150 bytes per partition, which is what
keeps an image of 1,000,000 partitions far below 1 GiB.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from kraft.metadata.chunked import Compact, compact
from kraft.metadata.elr_holders import EMPTY_ELR_HOLDERS, ElrHolders
from kraft.metadata.pmap import persistent
from kraft.metadata.records import ConfigResourceType
from kraft.security.acl import StandardAcl

NO_PARTITION_LEADER = -1
"""A partition's ``leader`` when no replica leads it (Kafka's ``LeaderConstants.NO_LEADER``); the Raft
quorum's "no leader known" is :data:`kraft.raft.messages.NO_LEADER`."""

LEADER_RECOVERED = 0
"""``leader_recovery_state`` (Kafka's LeaderRecoveryState, KIP-704): the leader's log is consistent."""
LEADER_RECOVERING = 1
"""The leader came from an unclean election and has not yet reported RECOVERED by AlterPartition: it
must not expand the ISR, and followers must not fetch from it as if its log were committed history."""


class BrokerRegistrationState(enum.Enum):
    """The state ``kraft broker list`` shows; OFFLINE (session expired) needs heartbeats, see controller."""

    FENCED = "FENCED"
    ACTIVE = "ACTIVE"
    CONTROLLED_SHUTDOWN = "CONTROLLED_SHUTDOWN"
    OFFLINE = "OFFLINE"


@dataclass(frozen=True, slots=True)
class Endpoint:
    name: str
    host: str
    port: int
    security_protocol: str = "PLAINTEXT"


@dataclass(frozen=True, slots=True)
class BrokerFeatureRange:
    name: str
    min_version: int
    max_version: int


@dataclass(frozen=True, slots=True)
class BrokerRegistration:
    broker_id: int
    epoch: int  # offset of its RegisterBroker record
    incarnation_id: str
    endpoints: tuple[Endpoint, ...]
    rack: str | None
    fenced: bool
    in_controlled_shutdown: bool
    features: tuple[BrokerFeatureRange, ...] = ()
    log_dirs: tuple[str, ...] = ()
    unclean_shutdown: bool = False
    """KIP-966: registered by an incarnation that could not prove it kept the log dirs (its data may be
    gone).  Only while fenced: the controller takes it out of every ISR and ELR before the unfence, which
    clears it — in the log, so a new active controller resumes that removal (controller_logic)."""
    offline_replicas: frozenset[tuple[str, int]] = frozenset()
    """(topic id, partition) of this registration's replicas on a log dir the broker took offline
    (BrokerRegistrationChangeRecord.offline_replicas, kraft's stand-in for KIP-858's replica directories):
    never elected nor let into an ISR while it holds them; empty again once the broker re-registers.  A
    set, so the election's check per candidate is one lookup (controller_logic's ``OfflineReplicaGuard``)."""


class PartitionRegistration(NamedTuple):
    """One partition's replica set and leadership.  ``isr`` is usually the very same tuple as
    ``replicas`` (shared, not copied) — the common case costs one tuple.

    ``elr``/``last_known_elr`` (KIP-966, :mod:`kraft.metadata.partition_change`) are the shared empty
    tuple unless the ISR is below min.insync.replicas; ``leader_recovery_state`` is
    :data:`LEADER_RECOVERING` only after an unclean election.  ``last_unclean_leader_epoch`` is the leader
    epoch the partition's latest unclean election gave it (0 = never: every election bumps the epoch past
    0): a follower may truncate below its high watermark only records of an older epoch — the loss that
    election accepted (:meth:`kraft.broker.replication.ReplicaManager` ``_apply_fetched``)."""

    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader: int
    leader_epoch: int
    partition_epoch: int
    elr: tuple[int, ...] = ()
    last_known_elr: tuple[int, ...] = ()
    leader_recovery_state: int = LEADER_RECOVERED
    last_unclean_leader_epoch: int = 0

    @property
    def preferred_leader(self) -> int:
        return self.replicas[0] if self.replicas else NO_PARTITION_LEADER


Partitions = Compact[PartitionRegistration]
"""A topic's partitions: a tuple, or a ChunkedSequence above 1,024 (``kraft.metadata.chunked.compact``)."""


class TopicImage:
    """One topic: its partitions indexed by partition id (dense, 0..n-1).

    ``partitions`` is kept :func:`~kraft.metadata.chunked.compact` (any iterable given is made so): a
    tuple up to 1,024 partitions, above that a :class:`~kraft.metadata.chunked.ChunkedSequence`, so the
    next image's version of a topic of a million partitions shares every chunk of 1,024 partitions that
    the delta did not touch: applying a change of k partitions costs O(k), not the topic's size (a
    sliced topic creation, a PartitionChangeRecord on a huge topic).  Read it as a Sequence (len,
    index, iteration, slices); :func:`~kraft.metadata.chunked.chunks_of` gives its chunks.  Immutable."""

    __slots__ = ("name", "partitions", "topic_id")

    name: str
    topic_id: str
    partitions: Partitions

    def __init__(self, name: str, topic_id: str, partitions: Iterable[PartitionRegistration]) -> None:
        set_ = object.__setattr__
        set_(self, "name", name)
        set_(self, "topic_id", topic_id)
        set_(self, "partitions", compact(partitions))

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError(f"TopicImage is immutable (cannot set {name})")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"TopicImage is immutable (cannot delete {name})")

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, TopicImage):
            return NotImplemented
        return self is other or (
            self.name == other.name
            and self.topic_id == other.topic_id
            and self.partitions == other.partitions
        )

    def __hash__(self) -> int:
        return hash((self.name, self.topic_id, self.partitions))

    def __repr__(self) -> str:
        return f"TopicImage(name={self.name!r}, topic_id={self.topic_id!r}, partitions={self.partitions!r})"

    def __reduce__(self) -> tuple[object, ...]:
        return (TopicImage, (self.name, self.topic_id, self.partitions))


class ConfigKey(NamedTuple):
    resource_type: int  # records.ConfigResourceType
    resource_name: str


@dataclass(frozen=True, slots=True)
class MetadataImage:
    """Everything committed up to and including ``offset`` (``-1`` = nothing yet).

    The mappings are read-only by convention: never mutate them, build a delta instead.
    """

    offset: int
    epoch: int  # leader epoch of the record at ``offset``
    brokers: Mapping[int, BrokerRegistration]
    topics_by_id: Mapping[str, TopicImage]
    topic_ids_by_name: Mapping[str, str]
    configs: Mapping[ConfigKey, Mapping[str, str]]
    features: Mapping[str, int]
    acls: Mapping[str, StandardAcl] = field(default_factory=dict)
    """ACL id (a UUID string) → binding, from AccessControlEntryRecords (kraft.security.authorizer reads
    them); the mapping is shared by every image until an ACL record changes it."""
    transaction: str = ""
    """The name of the metadata transaction open at ``offset`` (its BeginTransactionRecord's), "" when
    none is: a reader publishes nothing inside one; the controller resumes it (controller_logic)."""
    elr_holders: ElrHolders | None = field(default=None, compare=False, repr=False)
    """The partitions holding an ELR or last known ELR (:mod:`kraft.metadata.elr_holders`, what a
    ClearElrRecord's replay visits); derived from ``topics_by_id``, so not compared.  None: computed on
    first use (``elr_holders_of``)."""
    partition_total: int | None = field(default=None, init=False, compare=False, repr=False)
    """How many partitions ``topics_by_id`` holds, set by :meth:`MetadataDelta.apply_steps` from the base
    image's (what it removed and what it built) and by the image store's load, so
    :meth:`partition_count` is O(1) instead of a walk of every topic (100,000 topics: ~10-20 ms).
    Derived: not compared, and not an ``__init__`` argument, so ``dataclasses.replace`` never carries a
    count over to other topics (it starts unknown); None: counted on first use."""

    def __post_init__(self) -> None:
        # The two topic maps are persistent (kraft.metadata.pmap, structure-sharing, dict order): the next
        # image's apply() sets just the touched topics instead of copying two dicts of every topic.
        set_ = object.__setattr__
        set_(self, "topics_by_id", persistent(self.topics_by_id))
        set_(self, "topic_ids_by_name", persistent(self.topic_ids_by_name))

    @staticmethod
    def empty() -> MetadataImage:
        return EMPTY_IMAGE

    def topic(self, name: str) -> TopicImage | None:
        topic_id = self.topic_ids_by_name.get(name)
        return None if topic_id is None else self.topics_by_id[topic_id]

    def partition(self, topic_id: str, partition_id: int) -> PartitionRegistration | None:
        topic = self.topics_by_id.get(topic_id)
        if topic is None or partition_id < 0:
            return None
        try:  # one lookup (a chunked sequence's len() would be a second Python-level call)
            return topic.partitions[partition_id]
        except IndexError:
            return None

    def partition_count(self) -> int:
        """Partitions of every topic (kept, see ``partition_total``; counted once when not known)."""
        total = self.partition_total
        if total is None:
            total = sum(len(t.partitions) for t in self.topics_by_id.values())
            self.set_partition_total(total)
        return total

    def set_partition_total(self, total: int) -> None:
        """Record :attr:`partition_total` (derived: the image stays what it was)."""
        object.__setattr__(self, "partition_total", total)

    def iter_partitions(self) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
        for topic in self.topics_by_id.values():
            for partition_id, partition in enumerate(topic.partitions):
                yield topic, partition_id, partition

    def topic_configs(self, name: str) -> Mapping[str, str]:
        return self.configs.get(ConfigKey(ConfigResourceType.TOPIC, name), {})

    def topic_or_cluster_config(self, topic_name: str, name: str) -> str | None:
        """The topic's own value, else the cluster-wide dynamic broker default (``--entity-default``) —
        never a per-broker value: what the controller's elections and every broker agree on (a topic's
        ``min.insync.replicas``, kraft.metadata.election_config), else None (the .properties decide)."""
        value = self.configs.get(ConfigKey(ConfigResourceType.TOPIC, topic_name), {}).get(name)
        if value is None:
            value = self.configs.get(ConfigKey(ConfigResourceType.BROKER, ""), {}).get(name)
        return value

    def broker_config(self, broker_id: int, name: str) -> str | None:
        """A dynamic broker config (``kraft config alter --entity-type brokers``): the broker's own value,
        else the cluster-wide default (resource name ``""``), else None (the broker's .properties decide)."""
        value = self.configs.get(ConfigKey(ConfigResourceType.BROKER, str(broker_id)), {}).get(name)
        if value is None:
            value = self.configs.get(ConfigKey(ConfigResourceType.BROKER, ""), {}).get(name)
        return value


EMPTY_IMAGE = MetadataImage(
    offset=-1,
    epoch=-1,
    brokers={},
    topics_by_id={},
    topic_ids_by_name={},
    configs={},
    features={},
    elr_holders=EMPTY_ELR_HOLDERS,
)
object.__setattr__(EMPTY_IMAGE, "partition_total", 0)
