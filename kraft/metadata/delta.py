"""MetadataDelta: replay records on top of an image, then ``apply()`` the next image.

Only what changed is held here; ``apply()`` copies just the changed top-level maps (the two topic maps
are persistent, :mod:`kraft.metadata.pmap`: it sets just the touched topics) and, of each changed topic,
just the chunks of its partition sequence (:mod:`kraft.metadata.chunked`) that hold a changed partition,
so an image follows a log of any length at a cost proportional to the changes — also within
a topic of a million partitions.  ``local_changes(broker_id)`` tells a broker what to do with its
partition logs (Kafka's ``TopicsDelta.localChanges``): delete what it no longer hosts, then lead, then
follow.

A record that does not fit the image (a change for an unknown topic, an unregister with a stale epoch) is
skipped and described in ``replay_errors`` rather than raised, so a caller sees every problem of a batch;
the callers that replay *committed* data (the controller's listener, the broker's metadata fetcher) turn
any of them into :class:`UnreplayableRecordError` and stop the process (fail-stop, issue #14): a node that
skipped a committed record would serve an image that differs from every other node's.
"""

from __future__ import annotations

from collections.abc import (
    Callable,
    Generator,
    ItemsView,
    Iterable,
    Iterator,
    Mapping,
    MutableMapping,
    Sequence,
    ValuesView,
)
from dataclasses import dataclass, field
from itertools import chain, islice
from typing import Any, NamedTuple, TypeVar

from kraft.errors import ErrorCode, KraftError
from kraft.metadata.acl_records import acl_from_record
from kraft.metadata.change_decode import IsrLeaderChange, PlainPartition, ReplayRecord, decode_replay_values
from kraft.metadata.chunked import CHUNK, ChunkedSequence, with_changes
from kraft.metadata.election_config import MIN_INSYNC_REPLICAS
from kraft.metadata.elr_holders import elr_holders_of, next_elr_holders_steps
from kraft.metadata.image import (
    LEADER_RECOVERED,
    BrokerFeatureRange,
    BrokerRegistration,
    ConfigKey,
    Endpoint,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
from kraft.metadata.pmap import PersistentMap, persistent
from kraft.metadata.records import ConfigResourceType
from kraft.security.acl import AclError, StandardAcl
from kraft.sharded_map import SPLIT_AT, ShardedMap
from kraft.v1 import metadata_pb2 as pb

# Broker ids repeat across millions of replica lists; one shared int object per id keeps images small.
_ID_CACHE: dict[int, int] = {}
# Whole replica lists repeat too (a few thousand distinct lists cover a million partitions when brokers
# are few): one shared tuple per distinct list saves memory and re-building.  Bounded: cleared when full,
# which only costs sharing, never correctness.
_LIST_CACHE: dict[tuple[int, ...], tuple[int, ...]] = {}
_LIST_CACHE_MAX = 1 << 18
_new_tuple = tuple.__new__
_NO_IDS: tuple[int, ...] = ()
# A healthy partition's registration built in one C call: ``PartitionRegistration(...)`` runs the
# NamedTuple's generated ``__new__`` (a Python frame taking the four defaults) before the same
# ``tuple.__new__``; a follower replays one per new partition and per change (~0.3-0.4 µs of its ~5 µs
# a record, session 19).  Its last four fields are written out where it is built, as the NamedTuple's
# defaults give them (asserted here).
_HEALTHY_TAIL: tuple[tuple[int, ...], tuple[int, ...], int, int] = (_NO_IDS, _NO_IDS, LEADER_RECOVERED, 0)
assert PartitionRegistration._fields[5:] == (
    "elr",
    "last_known_elr",
    "leader_recovery_state",
    "last_unclean_leader_epoch",
), PartitionRegistration._fields
assert tuple(PartitionRegistration._field_defaults.values()) == _HEALTHY_TAIL, PartitionRegistration
LOCAL_CHANGES_STEP = 256
"""Partitions :meth:`MetadataDelta.local_changes_in_steps` looks at between two pauses (~20-80 µs)."""
CLEAR_ELR_STEP = 256
"""Partitions a ClearElrRecord's :meth:`MetadataDelta.replay_steps` looks at between two pauses."""
APPLY_STEP_WORK = 4_096
"""Work units :meth:`MetadataDelta.apply_steps` does between two pauses (~0.2-0.4 ms): one per
partition built, :data:`APPLY_TOPIC_WORK` per topic."""
APPLY_TOPIC_WORK = 64
"""A topic's own cost in :meth:`MetadataDelta.apply_steps` (~4 µs: its sequence and image), in
partitions (~0.05 µs each)."""
APPLY_STEP_TOPICS = 64
"""Topics set in a topic map between two pauses of :meth:`MetadataDelta.apply_steps` (~0.2-0.4 ms:
two HAMT inserts and a chunk copy per topic, plus a copy of the map's chunk index per call; 256 took
1.7-3.3 ms at 100,000 topics)."""
APPLY_STEP_NAMES = 1_024
"""Topic names :meth:`MetadataDelta.apply_steps` sorts into set and unset between two pauses."""
DROP_STEP_ITEMS = 1_024
"""Items of a big working list :meth:`MetadataDelta.apply_steps` frees between two pauses (~0.1 ms)."""
PART_BITS = 15
"""A topic's changed partitions past ``1 << PART_BITS`` (32,768) are kept in dicts of that many ids
each (:class:`_PartitionParts`): a dict rebuilds its table in one C call as it grows (~40 ns a key:
27-29 ms at 699,051 keys in a 1,000,000-partition topic's snapshot load), one of these never past
~1 ms.  A multiple of the image's chunk (1,024 partitions).  Looked at as a topic grows (a new
partition), not at a PartitionChangeRecord: a committed batch changes a bounded number."""
_PARTED_FROM = (1 << PART_BITS) - 1

K = TypeVar("K")
V = TypeVar("V")
T = TypeVar("T")
_ABSENT: Any = object()


def intern_ids(ids: Iterable[int]) -> tuple[int, ...]:
    cache = _ID_CACHE
    return tuple([cache.setdefault(i, i) for i in ids])


def shared_tuple(ids: tuple[int, ...]) -> tuple[int, ...]:
    """:func:`shared_ids` for a tuple whose ints are shared already (placement's: the registrations'
    broker ids): the tuple itself becomes the shared one when its list is new — no copy, no interning
    (the leader's bulk creation: with the ISR shortcut of ``_new_partitions``, 3.0 → 2.2 us a partition)."""
    shared = _LIST_CACHE.get(ids)
    if shared is None:
        if len(_LIST_CACHE) >= _LIST_CACHE_MAX:
            _LIST_CACHE.clear()
        shared = _LIST_CACHE[ids] = ids
    return shared


def shared_ids(ids: Iterable[int]) -> tuple[int, ...]:
    """``ids`` as the one shared tuple for that list, so equal lists replayed back to back (a
    partition's replicas and ISR) are the *same* object (``isr is replicas``)."""
    key = tuple(ids)
    shared = _LIST_CACHE.get(key)
    if shared is None:
        if len(_LIST_CACHE) >= _LIST_CACHE_MAX:
            _LIST_CACHE.clear()
        if len(key) == 3:
            # The common new list (a new partition of replication factor 3: nearly every one of a bulk
            # creation's is new to a follower) interned without intern_ids' call and list comprehension
            # (~0.9 -> ~0.6 us a list in one process at load 8, session 19).
            a, b, c = key
            intern = _ID_CACHE.setdefault
            shared = _LIST_CACHE[key] = (intern(a, a), intern(b, b), intern(c, c))
        else:
            shared = _LIST_CACHE[key] = intern_ids(key)
    return shared


def make_partition(
    replicas: tuple[int, ...],
    isr: tuple[int, ...],
    leader: int,
    leader_epoch: int,
    partition_epoch: int,
    elr: tuple[int, ...] = (),
    last_known_elr: tuple[int, ...] = (),
    leader_recovery_state: int = LEADER_RECOVERED,
    last_unclean_leader_epoch: int = 0,
) -> PartitionRegistration:
    """A registration whose ``isr`` shares the ``replicas`` tuple when they are equal."""
    if isr == replicas:
        isr = replicas
    if (
        not elr
        and not last_known_elr
        and leader_recovery_state == LEADER_RECOVERED
        and not last_unclean_leader_epoch
    ):
        return PartitionRegistration(replicas, isr, leader, leader_epoch, partition_epoch)
    return PartitionRegistration(
        replicas,
        isr,
        leader,
        leader_epoch,
        partition_epoch,
        elr,
        last_known_elr,
        leader_recovery_state,
        last_unclean_leader_epoch,
    )


def apply_partition_change(
    current: PartitionRegistration, r: pb.PartitionChangeRecord
) -> PartitionRegistration:
    """``current`` after ``r`` (absent fields unchanged).  kraft bumps both epochs on every change, not
    only on a leader change, so any change fences stale leaders."""
    # Every follower and broker replays each change (a controlled shutdown: ~100,000 in a few seconds),
    # and with upb each presence check and each sub-message read is a C call that builds a wrapper.  The
    # common shape — ISR and/or leader only, onto a registration holding no ELR, recovery state or
    # unclean epoch (every leave, rejoin and ISR change of a healthy cluster) — is built here with one
    # bound ``HasField`` and no ``make_partition`` branches (~17 % less per change, session 14); anything
    # else goes the general way below.  Both give the same registration (property-tested).
    has = r.HasField
    if not (
        has("replicas")
        or has("eligible_leader_replicas")
        or has("last_known_elr")
        or has("leader_recovery_state")
        or has("last_unclean_leader_epoch")
        or current.elr
        or current.last_known_elr
        or current.leader_recovery_state != LEADER_RECOVERED
        or current.last_unclean_leader_epoch
    ):
        replicas = current.replicas
        isr = shared_ids(r.isr.ids) if has("isr") else current.isr
        return PartitionRegistration(
            replicas,
            replicas if isr == replicas else isr,
            r.leader if has("leader") else current.leader,
            current.leader_epoch + 1,
            current.partition_epoch + 1,
        )
    replicas = shared_ids(r.replicas.ids) if r.HasField("replicas") else current.replicas
    isr = shared_ids(r.isr.ids) if r.HasField("isr") else current.isr
    leader = r.leader if r.HasField("leader") else current.leader
    elr = (
        shared_ids(r.eligible_leader_replicas.ids) if r.HasField("eligible_leader_replicas") else current.elr
    )
    lke = shared_ids(r.last_known_elr.ids) if r.HasField("last_known_elr") else current.last_known_elr
    recovery = (
        r.leader_recovery_state if r.HasField("leader_recovery_state") else current.leader_recovery_state
    )
    unclean_epoch = (
        r.last_unclean_leader_epoch
        if r.HasField("last_unclean_leader_epoch")
        else current.last_unclean_leader_epoch
    )
    return make_partition(
        replicas,
        isr,
        leader,
        current.leader_epoch + 1,
        current.partition_epoch + 1,
        elr,
        lke,
        recovery,
        unclean_epoch,
    )


def apply_isr_leader_change(
    current: PartitionRegistration, isr_ids: tuple[int, ...] | None, leader: int | None
) -> PartitionRegistration:
    """:func:`apply_partition_change` of a record setting only the ISR (``isr_ids``) and/or the leader
    (``None``: unchanged) — an :data:`IsrLeaderChange` read without protobuf.  Same registration."""
    if isr_ids is None:
        isr = current.isr
    else:  # shared_ids(isr_ids), its lookup inline (a shutdown's ISRs recur: nearly always a hit)
        isr = _LIST_CACHE.get(isr_ids) or shared_ids(isr_ids)
    if leader is None:
        leader = current.leader
    replicas = current.replicas
    if not (
        current.elr
        or current.last_known_elr
        or current.leader_recovery_state != LEADER_RECOVERED
        or current.last_unclean_leader_epoch
    ):
        return _new_tuple(
            PartitionRegistration,
            (
                replicas,
                replicas if isr == replicas else isr,
                leader,
                current.leader_epoch + 1,
                current.partition_epoch + 1,
                _NO_IDS,
                _NO_IDS,
                LEADER_RECOVERED,
                0,
            ),
        )
    return make_partition(
        replicas,
        isr,
        leader,
        current.leader_epoch + 1,
        current.partition_epoch + 1,
        current.elr,
        current.last_known_elr,
        current.leader_recovery_state,
        current.last_unclean_leader_epoch,
    )


class LocalPartition(NamedTuple):
    """One of a broker's changed partitions.  A NamedTuple, immutable as the frozen dataclass it was, at
    a third of its construction cost (~0.3 against ~1.1 us: a frozen dataclass sets each field through
    ``object.__setattr__``) — a broker hosting what a delta changes (a small cluster, a controlled
    shutdown's broker) builds one per changed partition (session 17)."""

    topic_name: str
    topic_id: str
    partition_id: int
    registration: PartitionRegistration


@dataclass(slots=True)
class LocalReplicaChanges:
    """What one broker must do after a delta, in this order: deletes, then leaders, then followers."""

    deletes: list[LocalPartition] = field(default_factory=list)
    leaders: list[LocalPartition] = field(default_factory=list)
    followers: list[LocalPartition] = field(default_factory=list)

    def is_empty(self) -> bool:
        return not (self.deletes or self.leaders or self.followers)


class _PartitionParts(MutableMapping[int, PartitionRegistration]):
    """A big topic's changed partitions (partition id -> registration), in dicts of ``1 << PART_BITS``
    consecutive ids (:data:`PART_BITS`): no table rebuild copies more than one of them.  What a
    ``_TopicDelta.changed`` dict becomes once it holds that many (:func:`_parted`); until then a plain
    dict (every topic of ordinary size, every committed batch).  Iterates part by part, each part in
    insertion order — ascending ids for a topic replayed in order (a snapshot, a creation).  Bulk reads
    (``items``, ``values``, iteration) run in C; a single lookup or store is a Python call (~0.15 us,
    paid only by topics this big)."""

    __slots__ = ("_len", "_parts")

    def __init__(self, first: dict[int, PartitionRegistration]) -> None:
        self._parts: list[dict[int, PartitionRegistration]] = []
        self._len = 0
        if not first:
            return
        if max(first) >> PART_BITS == 0 and min(first) >= 0:
            self._parts.append(first)  # (the common case: ids 0.. in one part, no copy)
            self._len = len(first)
            return
        if min(first) < 0:
            raise KeyError(min(first))
        # Ids spread over several parts (PartitionChangeRecords of a big topic, in any order): one pass
        # dealing them out (an inline store per id: ~3x what the dict's own table rebuild at this size
        # costs, ~1/3 of __setitem__ per id or of sorting them first; once per delta and topic).
        parts = self._parts
        parts.extend({} for _ in range((max(first) >> PART_BITS) + 1))
        bits = PART_BITS
        for partition_id, registration in first.items():
            parts[partition_id >> bits][partition_id] = registration
        self._len = len(first)

    def spans(self) -> list[tuple[range, dict[int, PartitionRegistration]]]:
        """Each part with the ids it may hold, in id order (a reader working a part at a time, as
        ``ElrHolders`` does; the dicts are not to be changed)."""
        bits = PART_BITS
        return [(range(i << bits, (i + 1) << bits), part) for i, part in enumerate(self._parts)]

    def part(self, partition_id: int) -> dict[int, PartitionRegistration]:
        """The dict holding ``partition_id``'s part (empty when none of it changed)."""
        index = partition_id >> PART_BITS
        return self._parts[index] if 0 <= index < len(self._parts) else {}

    def __getitem__(self, partition_id: int) -> PartitionRegistration:
        index = partition_id >> PART_BITS
        if index < 0 or index >= len(self._parts):
            raise KeyError(partition_id)
        return self._parts[index][partition_id]

    def get(self, partition_id: int, default: Any = None) -> Any:
        index = partition_id >> PART_BITS
        if index < 0 or index >= len(self._parts):
            return default
        return self._parts[index].get(partition_id, default)

    def __contains__(self, partition_id: object) -> bool:
        if not isinstance(partition_id, int):
            return False
        index = partition_id >> PART_BITS
        return 0 <= index < len(self._parts) and partition_id in self._parts[index]

    def __setitem__(self, partition_id: int, registration: PartitionRegistration) -> None:
        if partition_id < 0:
            raise KeyError(partition_id)
        index = partition_id >> PART_BITS
        parts = self._parts
        while len(parts) <= index:
            parts.append({})
        part = parts[index]
        if partition_id not in part:
            self._len += 1
        part[partition_id] = registration

    def __delitem__(self, partition_id: int) -> None:
        index = partition_id >> PART_BITS
        if index < 0 or index >= len(self._parts):
            raise KeyError(partition_id)
        del self._parts[index][partition_id]
        self._len -= 1

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(self._parts)

    def items(self) -> ItemsView[int, PartitionRegistration]:
        return _PartsItems(self)

    def values(self) -> ValuesView[PartitionRegistration]:
        return _PartsValues(self)

    def iter_items(self) -> Iterator[tuple[int, PartitionRegistration]]:
        return chain.from_iterable(map(dict.items, self._parts))

    def iter_values(self) -> Iterator[PartitionRegistration]:
        return chain.from_iterable(map(dict.values, self._parts))


class _PartsItems(ItemsView[int, PartitionRegistration]):
    __slots__ = ()
    _mapping: _PartitionParts

    def __iter__(self) -> Iterator[tuple[int, PartitionRegistration]]:
        return self._mapping.iter_items()


class _PartsValues(ValuesView[PartitionRegistration]):
    __slots__ = ()
    _mapping: _PartitionParts

    def __iter__(self) -> Iterator[PartitionRegistration]:
        return self._mapping.iter_values()


def _parted(topic: _TopicDelta) -> None:
    """``topic.changed`` as :class:`_PartitionParts` once a plain dict holds ``1 << PART_BITS`` ids (its
    next table rebuilds would copy them all, in one C call each)."""
    changed = topic.changed
    if type(changed) is dict and len(changed) >= 1 << PART_BITS:
        topic.changed = _PartitionParts(changed)


@dataclass(slots=True)
class _TopicDelta:
    name: str
    topic_id: str
    base: TopicImage | None  # None for a topic created in this delta
    count: int  # partitions after this delta
    changed: MutableMapping[int, PartitionRegistration] = field(default_factory=dict)
    """A dict; :class:`_PartitionParts` once it holds ``1 << PART_BITS`` partitions (:func:`_parted`)."""
    elr_set: bool = False
    """A partition of this topic may have come to hold an ELR or last known ELR in this delta (a new
    one holding either, or a change giving one to a partition that held neither; conservative).  False:
    every changed partition holding one now held one in the base image, so the image's ``elr_holders``
    index follows this topic by looking only at its changed holders (the common case: ISR and leader
    changes, new topics without ELRs — none at all)."""

    def current(self, partition_id: int) -> PartitionRegistration | None:
        got = self.changed.get(partition_id)
        return got if got is not None else self.before(partition_id)

    def before(self, partition_id: int) -> PartitionRegistration | None:
        """The registration in the base image (None for a new topic or partition)."""
        base = self.base
        if base is None or partition_id < 0:
            return None
        # One lookup, no len(): a big topic's partitions are a ChunkedSequence, whose __len__ is a Python
        # call too (a follower looks up every partition a controlled shutdown changes: session 19); past
        # the end both a tuple and a ChunkedSequence raise IndexError.
        try:
            return base.partitions[partition_id]
        except IndexError:
            return None


class UnreplayableRecordError(KraftError):
    """A committed record that cannot be decoded or applied: the state machine can never get past it."""

    def __init__(self, message: str) -> None:
        super().__init__(ErrorCode.CORRUPT_MESSAGE, message)


def unreplayable(
    what: str, last_offset: int, undecodable: list[tuple[int, str]], replay_errors: list[str]
) -> UnreplayableRecordError | None:
    """The error for a replay that left records out (None when every record applied): one line naming
    the first problem and how many there were."""
    if not undecodable and not replay_errors:
        return None
    problems = len(undecodable) + len(replay_errors)
    if undecodable:
        offset, error = undecodable[0]
        where = f" at offset {offset}" if offset >= 0 else ""
        first = f"record{where} does not decode: {error}"
    else:
        first = f"record in the batch ending at offset {last_offset} does not apply: {replay_errors[0]}"
    return UnreplayableRecordError(
        f"committed {what} cannot be replayed ({problems} bad record{'s' if problems > 1 else ''}; "
        f"first: {first})"
    )


class MetadataDelta:
    """Accumulates replayed records on top of ``image``; ``apply()`` returns the next image."""

    def __init__(self, image: MetadataImage) -> None:
        self.image = image
        self.offset = image.offset
        self.epoch = image.epoch
        self.transaction = image.transaction
        """The open metadata transaction's name ("" = none; kept across batches through the image)."""
        self.replay_errors: list[str] = []
        self._brokers: dict[int, BrokerRegistration | None] = {}
        # The three per-topic maps reach 100,000s of keys in a snapshot load; a dict rebuilds its table in
        # one C call as it passes 87,381 or 174,762 keys (7-18 ms of one work unit), a ShardedMap never
        # copies more than a shard (kraft.sharded_map).  Plain dicts until they pass SPLIT_AT keys
        # (_sharded): a committed batch's delta, the common case, pays nothing for it (3 ShardedMaps
        # from the start made a one-topic batch's delta 20 -> 29 us).
        self._topics: MutableMapping[str, _TopicDelta] = {}
        self._removed_topics: MutableMapping[str, TopicImage] = {}
        self._names: MutableMapping[str, str | None] = {}
        self._last_topic: _TopicDelta | None = None
        """The topic of the latest partition record (records of one topic come in runs: a snapshot, a
        creation), so the run's next records skip the map lookup; None after any removal from
        ``_topics``."""
        self._configs: dict[ConfigKey, dict[str, str]] = {}
        self._features: dict[str, int] = {}
        self._acls: dict[str, StandardAcl | None] = {}

    # ---- reading through the delta (committed image + what was replayed) ----

    def broker(self, broker_id: int) -> BrokerRegistration | None:
        if broker_id in self._brokers:
            return self._brokers[broker_id]
        return self.image.brokers.get(broker_id)

    def topic_id(self, name: str) -> str | None:
        replayed = self._names.get(name, _ABSENT)
        if replayed is not _ABSENT:
            return replayed  # type: ignore[no-any-return]
        return self.image.topic_ids_by_name.get(name)

    def acl(self, acl_id: str) -> StandardAcl | None:
        if acl_id in self._acls:
            return self._acls[acl_id]
        return self.image.acls.get(acl_id)

    def partition(self, topic_id: str, partition_id: int) -> PartitionRegistration | None:
        topic = self._topics.get(topic_id)
        if topic is not None:
            return topic.current(partition_id)
        if topic_id in self._removed_topics:
            return None
        return self.image.partition(topic_id, partition_id)

    # ---- replay ----

    def replay(self, record: pb.MetadataRecord, offset: int = -1, epoch: int = -1) -> None:
        """Apply one record; ``offset``/``epoch`` (when ≥ 0) advance the offset this delta reflects."""
        if offset >= 0:
            self.offset = offset
        if epoch >= 0:
            self.epoch = epoch
        kind = record.WhichOneof("record")
        handler = _HANDLERS.get(kind or "")
        if handler is not None:
            handler(self, getattr(record, kind or ""))

    def replay_values(
        self,
        values: Iterable[bytes],
        offset: int = -1,
        epoch: int = -1,
        on_error: Callable[[KraftError], None] | None = None,
    ) -> None:
        """Decode and replay encoded record values in bulk (a snapshot chunk, all at ``offset``/``epoch``).

        The result is exactly that of ``replay(decode_value(v), offset, epoch)`` for each value; the
        bulk path decodes headers by table lookup and dispatches PartitionRecords (the bulk of every
        snapshot) without the generic oneof dispatch.  A bad value raises ``KraftError`` as
        ``decode_value`` would, after the values before it were replayed — or, with ``on_error``, is
        reported there and skipped.
        """
        if offset >= 0:
            self.offset = offset
        if epoch >= 0:
            self.epoch = epoch
        self.replay_decoded(decode_replay_values(values, on_error))

    def set_partition(
        self, topic_id: str, partition_id: int, registration: PartitionRegistration, offset: int = -1
    ) -> bool:
        """What replaying a PartitionRecord/PartitionChangeRecord of this partition gives, when the
        caller already built the resulting ``registration`` (the controller's bulk writes: no protobuf
        round trip).  ``registration`` must be exactly what replay would build — its lists from
        :func:`shared_ids`, epochs bumped for a change.  False (nothing done) for an unknown topic or a
        partition id past the end."""
        if offset >= 0:
            self.offset = offset
        topic = self._topics.get(topic_id) or self._topic_delta(topic_id)
        if topic is None or partition_id > topic.count:
            return False
        if (registration.elr or registration.last_known_elr) and not topic.elr_set:
            before = topic.current(partition_id)  # looked up only for a registration holding one
            if before is None or not (before.elr or before.last_known_elr):
                topic.elr_set = True
        topic.changed[partition_id] = registration
        if partition_id >= topic.count:
            topic.count = partition_id + 1
            if partition_id >= _PARTED_FROM and type(topic.changed) is dict:
                _parted(topic)
        return True

    def replay_decoded(self, records: Iterable[ReplayRecord]) -> None:
        """``replay(record)`` for each record, with partition records dispatched directly (the bulk of
        every big batch); offsets are the caller's to set."""
        for _ in self.replay_decoded_steps(records):
            pass

    def replay_decoded_steps(self, records: Iterable[ReplayRecord]) -> Iterator[int]:
        """:meth:`replay_decoded`, pausing inside a ClearElrRecord after every :data:`CLEAR_ELR_STEP`
        partitions it looks at (yielding that count, what the caller counts against its slice): one
        record may clear a topic of 100,000 partitions.  Found in the one dispatch every record gets
        anyway, so a batch without one costs no extra pass.  The delta must not be used otherwise until
        the iterator is exhausted.  ``records`` as :func:`~kraft.metadata.change_decode.decode_replay_values`
        gives them: protobuf messages, and the common PartitionChangeRecords and PartitionRecords as plain
        tuples (four fields and seven)."""
        replay_partition = self._replay_partition
        replay_change = self._replay_partition_change
        replay_isr_leader = self._replay_isr_leader_change
        replay_plain = self._replay_plain_partition
        handlers = _HANDLERS
        for record in records:
            if type(record) is tuple:
                if len(record) == 4:
                    replay_isr_leader(record)
                else:
                    replay_plain(record)
                continue
            assert not isinstance(record, tuple)  # (for mypy: the check above is the fast one)
            kind = record.WhichOneof("record")
            if kind == "partition_change":
                replay_change(record.partition_change)
            elif kind == "partition":
                replay_partition(record.partition)
            elif kind == "clear_elr":
                for _ in self._clear_elr_steps(record.clear_elr):
                    yield CLEAR_ELR_STEP
            else:
                handler = handlers.get(kind or "")
                if handler is not None:
                    handler(self, getattr(record, kind or ""))

    def _replay_register_broker(self, r: pb.RegisterBrokerRecord) -> None:
        self._brokers[r.broker_id] = BrokerRegistration(
            broker_id=r.broker_id,
            epoch=r.broker_epoch,
            incarnation_id=r.incarnation_id,
            endpoints=tuple(
                Endpoint(e.name, e.host, e.port, e.security_protocol or "PLAINTEXT") for e in r.endpoints
            ),
            rack=r.rack if r.HasField("rack") else None,
            fenced=r.fenced,
            in_controlled_shutdown=r.in_controlled_shutdown,
            features=tuple(
                BrokerFeatureRange(f.name, f.min_supported_version, f.max_supported_version)
                for f in r.features
            ),
            log_dirs=tuple(r.log_dirs),
            unclean_shutdown=r.unclean_shutdown,
        )

    def _replay_unregister_broker(self, r: pb.UnregisterBrokerRecord) -> None:
        current = self.broker(r.broker_id)
        if current is None:
            self.replay_errors.append(f"unregister of unknown broker {r.broker_id}")
        elif current.epoch != r.broker_epoch:
            self.replay_errors.append(
                f"unregister of broker {r.broker_id} epoch {r.broker_epoch}, registered epoch {current.epoch}"
            )
        else:
            self._brokers[r.broker_id] = None

    def _change_broker(
        self,
        broker_id: int,
        epoch: int,
        fenced: bool | None,
        shutdown: bool | None,
        offline: Iterable[pb.OfflineReplicas] = (),
    ) -> None:
        current = self.broker(broker_id)
        if current is None or current.epoch != epoch:
            self.replay_errors.append(f"registration change for unknown broker {broker_id} epoch {epoch}")
            return
        new_fenced = current.fenced if fenced is None else fenced
        new_shutdown = current.in_controlled_shutdown if shutdown is None else shutdown
        self._brokers[broker_id] = BrokerRegistration(
            current.broker_id,
            current.epoch,
            current.incarnation_id,
            current.endpoints,
            current.rack,
            new_fenced,
            new_shutdown,
            current.features,
            current.log_dirs,
            # The unfence clears it: the controller unfences only a broker that left every ELR.
            current.unclean_shutdown and new_fenced,
            # Added to, never removed from: a log dir taken offline stays offline until a restart, which
            # re-registers (a RegisterBrokerRecord starts empty).
            current.offline_replicas.union(
                (o.topic_id, partition) for o in offline for partition in o.partitions
            )
            if offline
            else current.offline_replicas,
        )

    def _replay_fence_broker(self, r: pb.FenceBrokerRecord) -> None:
        self._change_broker(r.id, r.epoch, True, None)

    def _replay_unfence_broker(self, r: pb.UnfenceBrokerRecord) -> None:
        self._change_broker(r.id, r.epoch, False, None)

    def _replay_broker_registration_change(self, r: pb.BrokerRegistrationChangeRecord) -> None:
        fenced = None if r.fenced == 0 else r.fenced > 0
        shutdown = True if r.in_controlled_shutdown == 1 else None
        self._change_broker(r.broker_id, r.broker_epoch, fenced, shutdown, r.offline_replicas)

    def _replay_topic(self, r: pb.TopicRecord) -> None:
        if self.topic_id(r.name) is not None:
            self.replay_errors.append(f"topic {r.name} already exists")
            return
        self._last_topic = None  # (a repeated id replaces the topic's delta)
        # A live id under a new name (a log kraft never writes, which replay still follows): the id's
        # topic is replaced, so its old name no longer names it — else a later record by that name
        # would reach a removed or renamed topic ("partition 0 of unknown topic").
        in_delta = self._topics.get(r.topic_id)
        if in_delta is not None:
            replaced_name: str | None = in_delta.name
        elif r.topic_id in self._removed_topics:
            replaced_name = None  # (its name was unmapped by the removal)
        else:
            base = self.image.topics_by_id.get(r.topic_id)
            replaced_name = base.name if base is not None else None
        renamed = replaced_name is not None and replaced_name != r.name
        if renamed and replaced_name is not None and self.topic_id(replaced_name) == r.topic_id:
            self._names[replaced_name] = None
        self._topics[r.topic_id] = _TopicDelta(r.name, r.topic_id, None, 0)
        self._names[r.name] = r.topic_id
        if len(self._names) > SPLIT_AT:
            self._topics = _sharded(self._topics)
            self._names = _sharded(self._names)

    def _topic_delta(self, topic_id: str) -> _TopicDelta | None:
        topic = self._topics.get(topic_id)
        if topic is not None:
            return topic
        if topic_id in self._removed_topics:
            return None
        base = self.image.topics_by_id.get(topic_id)
        if base is None:
            return None
        topic = _TopicDelta(base.name, base.topic_id, base, len(base.partitions))
        self._topics[topic_id] = topic
        if len(self._topics) > SPLIT_AT:
            self._topics = _sharded(self._topics)
        return topic

    def _replay_partition(self, r: pb.PartitionRecord) -> None:
        # The hot path of every snapshot load (a million calls): keep it to plain lookups.
        topic_id = r.topic_id
        topic = self._last_topic
        if topic is None or topic.topic_id != topic_id:
            topic = self._last_topic = self._topics.get(topic_id) or self._topic_delta(topic_id)
        partition_id = r.partition_id
        if topic is None:
            self.replay_errors.append(f"partition {partition_id} of unknown topic {topic_id}")
            return
        if partition_id > topic.count:
            self.replay_errors.append(f"partition {partition_id} of {topic.name} skips ids ({topic.count})")
            return
        replicas = shared_ids(r.replicas)
        isr = shared_ids(r.isr)
        if (
            r.eligible_leader_replicas
            or r.last_known_elr
            or r.leader_recovery_state
            or r.last_unclean_leader_epoch
        ):
            registration = make_partition(
                replicas,
                isr,
                r.leader,
                r.leader_epoch,
                r.partition_epoch,
                shared_ids(r.eligible_leader_replicas),
                shared_ids(r.last_known_elr),
                r.leader_recovery_state,
                r.last_unclean_leader_epoch,
            )
            topic.changed[partition_id] = registration
            if registration.elr or registration.last_known_elr:
                topic.elr_set = True
        else:
            topic.changed[partition_id] = PartitionRegistration(
                replicas, isr, r.leader, r.leader_epoch, r.partition_epoch
            )
        if partition_id >= topic.count:
            topic.count = partition_id + 1
            if partition_id >= _PARTED_FROM and type(topic.changed) is dict:
                _parted(topic)

    def _replay_plain_partition(self, record: PlainPartition) -> None:
        """:meth:`_replay_partition` of a record read without protobuf (same registration, same errors):
        a new partition's — no ELR, recovered, never unclean, nothing the registration does not hold."""
        topic_id, partition_id, replicas, isr, leader, leader_epoch, partition_epoch = record
        topic = self._last_topic
        if topic is None or topic.topic_id != topic_id:
            topic = self._last_topic = self._topics.get(topic_id) or self._topic_delta(topic_id)
        if topic is None:
            self.replay_errors.append(f"partition {partition_id} of unknown topic {topic_id}")
            return
        if partition_id > topic.count:
            self.replay_errors.append(f"partition {partition_id} of {topic.name} skips ids ({topic.count})")
            return
        shared = _LIST_CACHE.get(replicas)  # shared_ids(replicas), its lookup inline (the decoder's tuple)
        if shared is None:
            shared = shared_ids(replicas)
        # (an ISR equal to the replicas is their shared tuple either way: shared_ids just cached it)
        topic.changed[partition_id] = _new_tuple(
            PartitionRegistration,
            (
                shared,
                shared if isr == shared else shared_ids(isr),
                leader,
                leader_epoch,
                partition_epoch,
                _NO_IDS,
                _NO_IDS,
                LEADER_RECOVERED,
                0,
            ),
        )
        if partition_id >= topic.count:
            topic.count = partition_id + 1
            if partition_id >= _PARTED_FROM and type(topic.changed) is dict:
                _parted(topic)

    def _replay_partition_change(self, r: pb.PartitionChangeRecord) -> None:
        topic_id = r.topic_id
        partition_id = r.partition_id
        topic = self._last_topic
        if topic is None or topic.topic_id != topic_id:
            topic = self._last_topic = self._topics.get(topic_id) or self._topic_delta(topic_id)
        current = None if topic is None else topic.current(partition_id)
        if topic is None or current is None:
            self.replay_errors.append(f"change of unknown partition {topic_id}/{partition_id}")
            return
        registration = apply_partition_change(current, r)
        changed = topic.changed
        changed[partition_id] = registration
        # A delta of many batches (a reader catching up, a controller's replay) may change more than a
        # part's worth of one topic: parted then, as a growing topic is (each table rebuild of one dict
        # would copy every id changed so far, in one C call).
        if type(changed) is dict and len(changed) >> PART_BITS:
            _parted(topic)
        # (~40 ns when the registration holds neither: the elr_holders index's cost per change)
        if (registration.elr or registration.last_known_elr) and not (current.elr or current.last_known_elr):
            topic.elr_set = True

    def replay_isr_leader_change(self, change: IsrLeaderChange, offset: int = -1, epoch: int = -1) -> None:
        """:meth:`replay` of the PartitionChangeRecord ``change`` was read from
        (:func:`~kraft.metadata.change_decode.isr_leader_change`): a broker's fetcher, record by record."""
        if offset >= 0:
            self.offset = offset
        if epoch >= 0:
            self.epoch = epoch
        self._replay_isr_leader_change(change)

    def _replay_isr_leader_change(self, change: IsrLeaderChange) -> None:
        """:meth:`_replay_partition_change` of a change read without protobuf (same result, same error)."""
        topic_id, partition_id, isr, leader = change
        topic = self._last_topic
        if topic is None or topic.topic_id != topic_id:
            topic = self._last_topic = self._topics.get(topic_id) or self._topic_delta(topic_id)
        if topic is None:
            self.replay_errors.append(f"change of unknown partition {topic_id}/{partition_id}")
            return
        changed = topic.changed
        # topic.current(partition_id), inline (a registration is a non-empty tuple: never false)
        current = changed.get(partition_id) or topic.before(partition_id)
        if current is None:
            self.replay_errors.append(f"change of unknown partition {topic_id}/{partition_id}")
            return
        changed[partition_id] = apply_isr_leader_change(current, isr, leader)
        if type(changed) is dict and len(changed) >> PART_BITS:
            _parted(topic)
        # (no ELR check: the change keeps the partition's ELR, so none can be new to it)

    def _replay_remove_topic(self, r: pb.RemoveTopicRecord) -> None:
        self._last_topic = None
        topic = self._topics.pop(r.topic_id, None)
        base = self.image.topics_by_id.get(r.topic_id)
        if topic is None and base is None:
            self.replay_errors.append(f"remove of unknown topic {r.topic_id}")
            return
        name = topic.name if topic is not None else base.name if base is not None else ""
        if base is not None:
            self._removed_topics[r.topic_id] = base
            self._removed_topics = _sharded(self._removed_topics)
        self._names[name] = None
        self._names = _sharded(self._names)
        # A topic's configs die with it; a topic re-created under the same name starts clean.
        self._configs[ConfigKey(ConfigResourceType.TOPIC, name)] = {}

    def replay_steps(self, record: pb.MetadataRecord, offset: int = -1, epoch: int = -1) -> Iterator[None]:
        """:meth:`replay` of ``record``, pausing (yielding) after every :data:`CLEAR_ELR_STEP`
        partitions a ClearElrRecord clears — one record may clear a topic of 100,000 partitions — so a
        caller can bound its event-loop turns (follower controllers, brokers).  Any other record is
        replayed at once.  The delta must not be used otherwise until the iterator is exhausted."""
        if record.WhichOneof("record") != "clear_elr":
            self.replay(record, offset, epoch)
            return
        if offset >= 0:
            self.offset = offset
        if epoch >= 0:
            self.epoch = epoch
        yield from self._clear_elr_steps(record.clear_elr)

    def _replay_clear_elr(self, r: pb.ClearElrRecord) -> None:
        for _ in self._clear_elr_steps(r):
            pass

    def _clear_elr_steps(self, r: pb.ClearElrRecord) -> Iterator[None]:
        """Empty the ELR and last known ELR of the named topic's partitions — or (no name) of every topic
        without a ``min.insync.replicas`` of its own — bumping both epochs of each partition changed, as
        the PartitionChangeRecord clearing them would.  Visits the partitions holding one (the base
        image's ``elr_holders``) and those this delta changed, not every partition."""
        if r.topic_name:
            topic_id = self.topic_id(r.topic_name)
            if topic_id is None:
                self.replay_errors.append(f"ELR clear of unknown topic {r.topic_name}")
                return
            yield from self._clear_topic_elr(topic_id)
            return
        holders = elr_holders_of(self.image)
        base_topics = self.image.topics_by_id
        # Base topics holding one (a removed one is skipped by _clear_topic_elr), then those only this
        # delta touched; sorted for one order on every reader.
        topic_ids = sorted(set(holders.topic_ids()).union(self._topics))
        for topic_id in topic_ids:
            topic = self._topics.get(topic_id)
            name = topic.name if topic is not None else base_topics[topic_id].name
            key = ConfigKey(ConfigResourceType.TOPIC, name)
            replayed = self._configs.get(key)
            configs = self.image.configs.get(key, {}) if replayed is None else replayed
            if MIN_INSYNC_REPLICAS not in configs:  # its own value hides the cluster-wide default
                yield from self._clear_topic_elr(topic_id)

    def _clear_topic_elr(self, topic_id: str) -> Iterator[None]:
        topic = self._topics.get(topic_id)
        if topic is None:
            if topic_id in self._removed_topics:
                return
            base_ids = elr_holders_of(self.image).partition_ids(topic_id)
            if not base_ids:
                return
            topic = self._topic_delta(topic_id)
            assert topic is not None  # a live base topic
            candidates: list[int] = base_ids
        elif topic.base is None:  # created in this delta: every partition is in ``changed``
            candidates = list(topic.changed)
        else:
            candidates = sorted(set(elr_holders_of(self.image).partition_ids(topic_id)).union(topic.changed))
        changed = topic.changed
        current_of = topic.current
        step = CLEAR_ELR_STEP
        for start in range(0, len(candidates), step):
            for partition_id in candidates[start : start + step]:
                current = current_of(partition_id)
                if current is None:
                    continue
                replicas, isr, leader, leader_epoch, partition_epoch, elr, lke, recovery, unclean_epoch = (
                    current
                )
                if elr or lke:
                    # What apply_partition_change gives for a change with an empty ELR and/or LKE (the
                    # record kraft wrote per partition before), built directly: the same tuple, sharing.
                    if isr == replicas:
                        isr = replicas
                    changed[partition_id] = PartitionRegistration(
                        replicas,
                        isr,
                        leader,
                        leader_epoch + 1,
                        partition_epoch + 1,
                        (),
                        (),
                        recovery,
                        unclean_epoch,
                    )
            yield

    def _replay_config(self, r: pb.ConfigRecord) -> None:
        key = ConfigKey(r.resource_type, r.resource_name)
        configs = self._configs.get(key)
        if configs is None:
            configs = dict(self.image.configs.get(key, {}))
            self._configs[key] = configs
        if r.HasField("value"):
            configs[r.name] = r.value
        else:
            configs.pop(r.name, None)

    def _replay_feature_level(self, r: pb.FeatureLevelRecord) -> None:
        self._features[r.name] = r.feature_level

    def _replay_access_control_entry(self, r: pb.AccessControlEntryRecord) -> None:
        try:
            acl = acl_from_record(r)
        except AclError as exc:
            self.replay_errors.append(str(exc))
            return
        if self.acl(r.id) is not None:
            self.replay_errors.append(f"ACL {r.id} already exists")
            return
        self._acls[r.id] = acl

    def _replay_remove_access_control_entry(self, r: pb.RemoveAccessControlEntryRecord) -> None:
        if self.acl(r.id) is None:
            self.replay_errors.append(f"remove of unknown ACL {r.id}")
            return
        self._acls[r.id] = None

    @property
    def in_transaction(self) -> bool:
        return bool(self.transaction)

    def _replay_begin_transaction(self, r: pb.BeginTransactionRecord) -> None:
        self.transaction = r.name or "unnamed"

    def _replay_end_transaction(self, r: pb.EndTransactionRecord) -> None:
        self.transaction = ""

    def _replay_abort_transaction(self, r: pb.AbortTransactionRecord) -> None:
        # Aborted groups are never written by kraft's controller; a reader only needs to leave the group.
        self.transaction = ""

    # ---- what changed (for indexes that follow images incrementally) ----

    def removed_topics(self) -> Mapping[str, TopicImage]:
        """Topics of the base image this delta removes (a re-created one also appears in
        :meth:`changed_topics`, with no base: ``apply()`` puts it last)."""
        return self._removed_topics

    def changed_topics(self) -> Iterator[tuple[str, TopicImage | None, Mapping[int, PartitionRegistration]]]:
        """(topic id, base topic or None when the topic is (re)created, changed partitions) in the
        order ``apply()`` inserts them."""
        for topic_id, topic in self._topics.items():
            yield topic_id, topic.base, topic.changed

    def elr_changed_topics(
        self,
    ) -> Iterator[tuple[str, TopicImage | None, Mapping[int, PartitionRegistration], bool]]:
        """:meth:`changed_topics` with, for each, whether a changed partition may hold an ELR or last
        known ELR (False: none does) — in no particular order (the ELR index is a set per topic): a
        split map's insertion order costs a shard lookup per topic, its shards' own order does not."""
        topics = self._topics
        items = topics.unordered_items() if isinstance(topics, ShardedMap) else topics.items()
        for topic_id, topic in items:
            yield topic_id, topic.base, topic.changed, topic.elr_set

    # ---- producing the next image ----

    def apply(self) -> MetadataImage:
        """The next image, in one go (:meth:`apply_steps` run to its end)."""
        return run_steps(self.apply_steps())

    def apply_steps(self) -> Generator[None, None, MetadataImage]:
        """:meth:`apply`, pausing (yielding) after about every :data:`APPLY_STEP_WORK` units of work, so
        a caller can bound its event-loop turns; the image is the generator's return value.

        Nothing is visible before the end: every piece is built off to the side and the image, made
        of them, is returned at once (a reader never sees half of it).  A snapshot's delta builds a
        whole image from the empty one — at a million partitions ~50-80 ms in one go, at 100,000 small
        topics ~0.7 s (per-topic sequences, the two topic maps, the ELR index) — while a committed
        batch's delta pauses rarely or never.  The delta must not change until the generator is
        exhausted."""
        base = self.image
        brokers: Mapping[int, BrokerRegistration] = base.brokers
        if self._brokers:
            new_brokers = dict(base.brokers)
            for broker_id, registration in self._brokers.items():
                if registration is None:
                    new_brokers.pop(broker_id, None)
                else:
                    new_brokers[broker_id] = registration
            brokers = new_brokers
        topics: Mapping[str, TopicImage] = base.topics_by_id
        names: Mapping[str, str] = base.topic_ids_by_name
        # Kept from the base image's count when it knows it (every image a delta built from the empty one
        # does): what the removed topics held out, what each built topic has more or less in.
        partition_total = base.partition_total
        base_topics = len(base.topics_by_id)  # (0: a snapshot's delta, no topic replaced by a TopicRecord)
        if self._topics or self._removed_topics:
            built: list[tuple[str, TopicImage]] = []
            work = 0
            for topic_id, topic in self._topics.items():
                if topic.base is None and topic.count > CHUNK:
                    built.append((topic_id, (yield from _build_new_topic_steps(topic))))
                elif topic.base is not None and isinstance(topic.changed, _PartitionParts):
                    built.append((topic_id, (yield from _build_changed_topic_steps(topic))))
                else:
                    built.append((topic_id, _build_topic(topic)))
                if partition_total is not None:
                    partition_total += topic.count - (
                        len(topic.base.partitions)
                        if topic.base is not None
                        else _replaced_count(base, topic, self._removed_topics)
                        if base_topics
                        else 0
                    )
                work += len(topic.changed) + APPLY_TOPIC_WORK
                if work >= APPLY_STEP_WORK:
                    work = 0
                    yield
            if partition_total is not None:
                for seen, removed in enumerate(self._removed_topics.values(), 1):
                    partition_total -= len(removed.partitions)
                    if seen % APPLY_STEP_NAMES == 0:
                        yield
            # Persistent maps (kraft.metadata.pmap): only the touched topics are set, O(k log n), in
            # batches (the result equals one call's: removals first, then the updates in order).
            topics = yield from _with_changes_steps(
                persistent(base.topics_by_id), self._removed_topics, built
            )
            yield from _drop_steps(built)
            unnamed: list[str] = []
            named: list[tuple[str, str]] = []
            # (100,000 new names: ~10 ms in one go; 4,096 a step took ~1 ms)
            for seen, (name, maybe_id) in enumerate(self._names.items(), 1):
                if maybe_id is None:
                    unnamed.append(name)
                else:
                    named.append((name, maybe_id))
                if seen % APPLY_STEP_NAMES == 0:
                    yield
            names = yield from _with_changes_steps(persistent(base.topic_ids_by_name), unnamed, named)
            yield from _drop_steps(named)
            yield from _drop_steps(unnamed)
        configs: Mapping[ConfigKey, Mapping[str, str]] = base.configs
        if self._configs:
            new_configs = dict(base.configs)
            for key, values in self._configs.items():
                if values:
                    new_configs[key] = values
                else:
                    new_configs.pop(key, None)
            configs = new_configs
        features: Mapping[str, int] = base.features
        if self._features:
            new_features = dict(base.features)
            for name, level in self._features.items():
                if level == 0:
                    new_features.pop(name, None)
                else:
                    new_features[name] = level
            features = new_features
        acls: Mapping[str, StandardAcl] = base.acls
        if self._acls:
            new_acls = dict(base.acls)
            for acl_id, acl in self._acls.items():
                if acl is None:
                    new_acls.pop(acl_id, None)
                else:
                    new_acls[acl_id] = acl
            acls = new_acls
        elr_holders = yield from next_elr_holders_steps(self)
        image = MetadataImage(
            offset=self.offset,
            epoch=self.epoch,
            brokers=brokers,
            topics_by_id=topics,
            topic_ids_by_name=names,
            configs=configs,
            features=features,
            acls=acls,
            transaction=self.transaction,
            elr_holders=elr_holders,
        )
        if partition_total is not None:
            image.set_partition_total(partition_total)
        return image

    def discard_steps(self) -> Generator[None, None, None]:
        """Empty this delta in steps, pausing (yielding) as :meth:`apply_steps` does: a snapshot's delta
        holds a dict entry per partition and an object and dict per topic (100,000 small topics: ~20-30
        ms of freeing in one go where the delta's last reference goes, the image it built keeping the
        registrations).  The delta is empty (and unusable) afterwards."""
        topics = self._topics
        self._last_topic = None
        work = 0
        while topics:
            _, topic = topics.popitem()
            work += len(topic.changed) + APPLY_TOPIC_WORK
            del topic  # (its dict of changed partitions goes here)
            if work >= APPLY_STEP_WORK:
                work = 0
                yield
        for entries in (self._names, self._removed_topics):
            while entries:
                for _ in range(min(len(entries), APPLY_STEP_WORK // 4)):
                    entries.popitem()
                yield

    # ---- what a broker must do ----

    def local_changes(self, broker_id: int) -> LocalReplicaChanges:
        changes = LocalReplicaChanges()
        for _ in self.local_changes_in_steps(broker_id, changes):
            pass
        return changes

    def local_changes_in_steps(self, broker_id: int, changes: LocalReplicaChanges) -> Iterator[None]:
        """:meth:`local_changes` into ``changes``, pausing (yielding) after every ``LOCAL_CHANGES_STEP``
        partitions looked at, so a caller can bound its event-loop turns: a removed topic of 100,000
        partitions is one RemoveTopicRecord but ~7 ms of scanning for the replicas a broker hosts.  The
        delta must not change until the iterator is exhausted."""
        step = LOCAL_CHANGES_STEP
        for topic_id, removed in self._removed_topics.items():
            partitions = removed.partitions
            count = len(partitions)
            walk = iter(partitions)  # iterated, not indexed: a chunked sequence iterates at tuple speed
            for start in range(0, count, step):
                # (zip takes from the range first: it stops at the step's end without consuming more)
                for partition_id, partition in zip(
                    range(start, min(start + step, count)), walk, strict=False
                ):
                    if broker_id in partition.replicas:
                        changes.deletes.append(
                            LocalPartition(removed.name, topic_id, partition_id, partition)
                        )
                yield
        # A broker hosts ~RF/brokers of the changed partitions (3 of 1,000 in bench.broker_apply), so the
        # loop tests membership first and builds a LocalPartition only for one hosted here now or in the
        # base image; the base's registration is read inline (``_TopicDelta.before`` is a method call per
        # partition).  Building one for every partition was ~1 us each, 12-15 % of a broker's loop after
        # bulk work (session 17).  Same lists, same order, same pauses as the old loop
        # (tests/unit/metadata/test_local_changes_skip.py keeps it as the reference).
        seen = 0
        for topic in self._topics.values():
            base = topic.base
            before: Sequence[PartitionRegistration] = () if base is None else base.partitions
            before_len = len(before)
            for partition_id, partition in topic.changed.items():
                seen += 1
                if seen % step == 0:
                    yield
                if broker_id in partition.replicas:
                    local = LocalPartition(topic.name, topic.topic_id, partition_id, partition)
                    if partition.leader == broker_id:
                        changes.leaders.append(local)
                    else:
                        changes.followers.append(local)
                elif partition_id < before_len and broker_id in before[partition_id].replicas:
                    changes.deletes.append(
                        LocalPartition(topic.name, topic.topic_id, partition_id, partition)
                    )


def _sharded(entries: MutableMapping[K, V]) -> MutableMapping[K, V]:
    """``entries`` as a :class:`ShardedMap` once a plain dict holds more than :data:`SPLIT_AT` keys (a copy
    of that many keys, ~0.5 ms, once per map); as it is otherwise."""
    if type(entries) is dict and len(entries) > SPLIT_AT:
        return ShardedMap.of_dict(entries)
    return entries


def _replaced_count(base: MetadataImage, topic: _TopicDelta, removed: Mapping[str, TopicImage]) -> int:
    """The partitions the base image's version of ``topic``, one this delta (re)created, held where the
    applied delta replaces it (0 when it is new): a TopicRecord naming a live topic's id replaces that
    topic without removing it."""
    replaced = base.topics_by_id.get(topic.topic_id)
    return 0 if replaced is None or topic.topic_id in removed else len(replaced.partitions)


def _build_topic(topic: _TopicDelta) -> TopicImage:
    base = topic.base
    if base is None:
        return TopicImage(topic.name, topic.topic_id, with_changes((), topic.changed, topic.count))
    if not topic.changed and topic.count == len(base.partitions):
        return base
    # Copies only the chunks of 1,024 partitions that changed (and the chunk index), so a slice of a big
    # topic creation, or a PartitionChangeRecord on a huge topic, costs what it changed, not the topic.
    return TopicImage(topic.name, topic.topic_id, with_changes(base.partitions, topic.changed, topic.count))


def _build_new_topic_steps(topic: _TopicDelta) -> Generator[None, None, TopicImage]:
    """:func:`_build_topic` for a topic created in this delta with more than one chunk of partitions,
    one chunk at a time (a snapshot's topic of a million partitions is ~30 ms of building in one go).
    The same sequence as ``with_changes((), changed, count)``: positions dense from 0, chunked."""
    changed, count = topic.changed, topic.count
    if len(changed) != count:
        raise ValueError(f"topic {topic.topic_id}: {len(changed)} partitions for a count of {count}")
    get = changed.__getitem__
    chunks: list[tuple[PartitionRegistration, ...]] = []
    work = 0
    for start in range(0, count, CHUNK):
        if isinstance(changed, _PartitionParts):  # (a chunk lies in one part: its dict's own lookups)
            get = changed.part(start).__getitem__
        chunks.append(tuple(map(get, range(start, min(start + CHUNK, count)))))  # (C-level lookups)
        work += CHUNK
        if work >= APPLY_STEP_WORK:
            work = 0
            yield
    return TopicImage(topic.name, topic.topic_id, ChunkedSequence.of_chunks(tuple(chunks), count))


def _build_changed_topic_steps(topic: _TopicDelta) -> Generator[None, None, TopicImage]:
    """:func:`_build_topic` for an existing topic whose changed partitions are in parts (more than
    ``1 << PART_BITS`` of them: a delta of many batches, a reader catching up over a controlled
    shutdown's leaderships), part by part and :data:`APPLY_STEP_WORK` changes at a time — one
    ``with_changes`` was 31-41 ms for 100,000 changes in one step.  A step's changes lie in one part, so
    it copies at most a part's chunks (32) and the chunk index, whatever order the ids came in; a chunk
    met by two steps of a part is copied twice.  The result equals the one call's.  Partitions appended
    (the topic grew) must come dense and last, so those go in one final call."""
    base = topic.base
    changed = topic.changed
    assert base is not None and isinstance(changed, _PartitionParts)
    count = topic.count
    base_len = len(base.partitions)
    partitions = base.partitions
    appended: dict[int, PartitionRegistration] = {}
    for ids, part in changed.spans():
        if not part:
            continue
        if ids.stop > base_len:  # the part holding the old end: its appended partitions set aside
            appended.update((i, p) for i, p in part.items() if i >= base_len)
            updates: Iterator[tuple[int, PartitionRegistration]] = (
                (i, p) for i, p in part.items() if i < base_len
            )
        else:
            updates = iter(part.items())
        while True:
            step = dict(islice(updates, APPLY_STEP_WORK))
            if not step:
                break
            partitions = with_changes(partitions, step, base_len)
            yield
    if count != base_len:
        partitions = with_changes(partitions, appended, count)
    return TopicImage(topic.name, topic.topic_id, partitions)


def _with_changes_steps(
    mapping: PersistentMap[K, V], removed: Iterable[K], updated: list[tuple[K, V]]
) -> Generator[None, None, PersistentMap[K, V]]:
    """``mapping.with_changes(removed, updated)`` in calls of :data:`APPLY_STEP_TOPICS` updates,
    yielding between them (~3 µs per new key)."""
    if len(updated) <= APPLY_STEP_TOPICS:
        return mapping.with_changes(removed, updated)
    for start in range(0, len(updated), APPLY_STEP_TOPICS):
        mapping = mapping.with_changes(
            removed if start == 0 else (), updated[start : start + APPLY_STEP_TOPICS]
        )
        yield
    return mapping


def _drop_steps(items: list[Any]) -> Generator[None, None, None]:
    """Empty a working list of :meth:`MetadataDelta.apply_steps` that holds the last references to its
    items (the ``(key, value)`` pairs set in a topic map), :data:`DROP_STEP_ITEMS` per step, when it is
    big: a snapshot's 100,000 topics leave two lists of 100,000 pairs, ~15-20 ms of freeing where the
    generator's frame goes, in the step that returns the image."""
    if len(items) <= DROP_STEP_ITEMS:
        return
    while items:
        del items[-DROP_STEP_ITEMS:]
        yield


def run_steps(steps: Generator[Any, None, T]) -> T:
    """Run a stepped computation (:meth:`MetadataDelta.apply_steps`) to its end in one go."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


_HANDLERS: dict[str, Callable[[MetadataDelta, Any], None]] = {
    "register_broker": MetadataDelta._replay_register_broker,
    "unregister_broker": MetadataDelta._replay_unregister_broker,
    "fence_broker": MetadataDelta._replay_fence_broker,
    "unfence_broker": MetadataDelta._replay_unfence_broker,
    "broker_registration_change": MetadataDelta._replay_broker_registration_change,
    "topic": MetadataDelta._replay_topic,
    "partition": MetadataDelta._replay_partition,
    "partition_change": MetadataDelta._replay_partition_change,
    "remove_topic": MetadataDelta._replay_remove_topic,
    "clear_elr": MetadataDelta._replay_clear_elr,
    "config": MetadataDelta._replay_config,
    "feature_level": MetadataDelta._replay_feature_level,
    "access_control_entry": MetadataDelta._replay_access_control_entry,
    "remove_access_control_entry": MetadataDelta._replay_remove_access_control_entry,
    "begin_transaction": MetadataDelta._replay_begin_transaction,
    "end_transaction": MetadataDelta._replay_end_transaction,
    "abort_transaction": MetadataDelta._replay_abort_transaction,
}
