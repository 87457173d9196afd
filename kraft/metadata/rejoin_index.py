"""Per-broker index of the partitions an unfence may change, maintained incrementally.

Unfencing broker B runs an election — ``build_change(...)`` with nothing added to the ISR (leaders add
caught-up replicas back by AlterPartition) — on every partition listing B as a replica; a full scan costs
~1 s per million partitions although almost every partition is left as it is.  This index holds, per
broker, the partitions such an election may change whatever the brokers' states:

- **flagged** (every replica of the partition): the partition is *unsettled* — leaderless, its leader
  not a replica in the ISR, the ISR out of replica order, an ELR or last known ELR (KIP-966: an ELR
  member returning leads a partition whose ISR is empty; min ISR, a topic config, decides whether the
  ELR is kept), or the preferred leader (``replicas[0]``) in the ISR but not leading (restored once it
  is acceptable).
- the rest (*stable*: a replica in the ISR leads, the ISR in replica order, no ELR or last known ELR,
  and the preferred replica leads or is out of the ISR) keep their leader and ISR unless that leader is
  *not acceptable*: a broker being moved out of its ISRs right now, or one not registered.  Acceptability
  is the controller's state, so these are found at unfence time: :attr:`RejoinIndex.leader_counts` says
  whether any unacceptable broker leads anything at all (almost never, outside a leave job), and only
  then is there one pass over the partitions (what every unfence cost before).

Stable includes what a fence leaves (session 20): broker B out of the ISR of every partition it led, the
next replica leading.  An election cannot give B the leadership back (B is not in the ISR) nor move it
elsewhere, so B's unfence has nothing to do there; until then the index flagged each such partition for
every replica (B was "a replica not in the ISR", a rule of unfences that re-added B to the ISR) and the
unfence after a fence of 100,000 RF-3 leaderships ran ~100,000 elections that changed nothing (~0.42 s).

A superset is harmless (``build_change`` returns None for a partition that does not change); candidates
come back in scan order (``topics_by_id`` order, then partition id), so the records are the scan's.

**The rejoin job's walk** (:class:`RejoinWalk`, session 21).  The job does not elect on the image of the
unfence but on the image of each of its slices, and the scan it replaces visits every partition of B
*when its slice reaches it*: a partition stable at the unfence that another event changes before the
job gets there (an AlterPartition putting the preferred replica back, another writer's record, a leader
fenced meanwhile) is elected inside B's job.  Candidates taken once at the unfence would miss it, which
did not show while every partition B was missing from was flagged (all of them, after its fence).  So
the walk hands out, one at a time and in scan order, the flagged partitions of the unfence merged with
every partition of B changed since (a per-walk *watch* :meth:`RejoinIndex.advance` fills) that lies
past the last one handed out; and it falls back to the scan of the rest (B's partitions of the unfence's
image, in order) when the watch may have missed something — the index stopped following the image (a
rebuild, an ``alter_partition`` write that replaced the image behind it) — or a broker that was
acceptable at the unfence and still leads something is not any more (its partitions left unchanged were
not candidates).  A stable partition left unchanged whose leader is acceptable is left alone by any
election (:func:`flagged_replicas`), so the walk's slices elect exactly what the scan's do.

Kept along, as cheaply: partitions led and replicas hosted per broker and the partition total, which
the controller reads for controlled shutdown and CreateTopics while the index follows its image
(PartitionCounts recounts every changed topic, and fencing a broker changes nearly all of them).

The index follows one image lineage: :meth:`advance` consumes each delta (cost in proportion to the
changed partitions); anything else (a reset to the committed image) makes it stale, and the next query
rebuilds it with one full pass.  Healthy clusters flag nothing: the index is as small as what is wrong.

A newly active controller builds it in slices instead (:meth:`start_rebuild`, then
:meth:`rebuild_some` once per event of the controller's queue, ~1 s per million partitions in all): the
topics not indexed yet are *pending*; a delta arriving meanwhile drops the indexed version of every topic
it touches and makes it pending again, so what is indexed always matches the image, and once nothing is
pending the index follows the image like after a full rebuild.  Until then queries fall back (counts from
PartitionCounts; :meth:`candidates` finishes the build at once).

Bulk deltas (:data:`LAZY_MIN_CHANGES`) leave their changed partitions *dirty*: counts exact, flags of
those partitions possibly stale, and the shell settles them in slices meanwhile (:meth:`settle_some`).
No query reads a stale flag: :meth:`candidates` settles what is dirty first (:meth:`_follow`) — the
controller asks it only once :meth:`ready_for` holds, getting there in bounded slices
(:meth:`catch_up`, an unfence's rejoin job) — and :meth:`unsettled` asks each dirty partition itself.
Invariant: a partition not dirty has the flags :func:`flagged_replicas` gives for the image the index
follows (property-tested against a rebuild, with settle slices of any size between deltas).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from heapq import heappop, heappush
from itertools import chain, islice, pairwise, repeat
from operator import attrgetter, is_
from weakref import WeakSet

from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import NO_PARTITION_LEADER, PartitionRegistration, TopicImage

_leader_of = attrgetter("leader")
_replicas_of = attrgetter("replicas")

LAZY_MIN_CHANGES = 64
"""A delta changing at least this many partitions that already existed (a bulk slice: a leave job's
~300-1,000 leaderships moved, unfence elections) does not recompute their flags: it marks them *dirty*
(one C-level ``set.update`` per topic) and moves only the counts (C-level maps over the changed
partitions).  Their flags are recomputed later — :meth:`RejoinIndex.settle_some` slices, which the shell
runs as events of its own once the bulk work is done, or all at once before any query that reads flags
(an unfence, an election).  The flag work (~1.5 µs a change, ~90 % of a leave-job slice's closing) thus
leaves the controlled shutdown's slices; a partition changed by several slices is settled once.  Smaller
deltas (an AlterPartition, one election) are flagged at once: nothing dirty piles up between bulk jobs."""

SETTLE_CHECK_EVERY = 128
"""Partitions :meth:`RejoinIndex.settle_some` settles between two questions to its ``expired`` (a
partition's flags cost ~1-4 µs: at most ~0.5 ms past the event's budget)."""

TOPIC_COUNTS_MIN_PARTITIONS = 4096
"""Topics of at least this many partitions keep their own leader and replica counts, so removing one
(DeleteTopics: one RemoveTopicRecord) subtracts two per-broker counters instead of walking every
partition — 50-80 ms of one event for 100,000 partitions before.  Smaller topics are walked (≤ ~3 ms);
counters for every topic would cost ~70 KB per topic at 1,000 brokers."""


UNSETTLED_WINDOW = 4_096
"""Partition ids :meth:`RejoinIndex.unsettled_ids` reads of a big topic at a time (~0.1-0.3 ms)."""
GAP = -1
"""The partition id of an item :meth:`RejoinIndex.unsettled_ids` yields (``gaps=True``) after a window
read with nothing in it: no partition; it only hands the caller its turn."""
_NO_FLAGS: Mapping[int, tuple[int, ...]] = {}
_NO_DIRT: frozenset[int] = frozenset()


def _count_topic(partitions: Sequence[PartitionRegistration]) -> tuple[Counter[int], Counter[int]]:
    return (
        Counter(map(_leader_of, partitions)),
        Counter(chain.from_iterable(map(_replicas_of, partitions))),
    )


def _distinct(replicas: tuple[int, ...]) -> bool:
    """No broker listed twice (then an ISR equal to the replicas is in replica order).  Not cached: with
    1,000 brokers a million partitions have about as many distinct replica lists; comparisons for the
    usual replication factors (a set costs twice as much)."""
    size = len(replicas)
    if size == 3:
        first, second, third = replicas
        return first != second and third not in (first, second)
    if size < 2:
        return True
    if size == 2:
        return replicas[0] != replicas[1]
    return len(set(replicas)) == size


def _isr_in_replica_order(replicas: tuple[int, ...], isr: tuple[int, ...]) -> bool:
    """Whether build_change's sort (replica order, last index of a repeated replica, non-replicas last
    in their order) leaves ``isr`` as it is."""
    if (isr is replicas or isr == replicas) and _distinct(replicas):
        return True
    size = len(isr)
    if size < 2:  # nothing to reorder (an ISR shrunk to its leader: the common unsettled case)
        return True
    if size == 2 and _distinct(replicas):
        # One member short of RF 3 (what a fence leaves: stable, so every fenced leadership's flags are
        # recomputed through here): two C-level lookups, not the dict below (~0.3 µs a partition).
        first, second = isr
        end = len(replicas)
        return (replicas.index(first) if first in replicas else end) <= (
            replicas.index(second) if second in replicas else end
        )
    order = {r: i for i, r in enumerate(replicas)}
    keys = [order.get(r, len(order)) for r in isr]
    return all(a <= b for a, b in pairwise(keys))


SHIFT_IN_C = 8  # changed partitions of a topic from which _shift counts in C


def _shift(counts: Counter[int], old: list[int], new: list[int]) -> None:
    """``counts`` minus one per item of ``old``, plus one per item of ``new``.  Many items (a leave job's
    slice of a big topic): ``update`` counts the list in C and the old side (one leader, mostly) is
    subtracted per distinct value; a few (a one-partition topic): a step each, cheaper than building
    a Counter."""
    if len(new) < SHIFT_IN_C:
        for key in new:
            counts[key] += 1
    else:
        counts.update(new)
    if len(old) < SHIFT_IN_C:
        for key in old:
            counts[key] -= 1
    else:
        for key, count in Counter(old).items():
            counts[key] -= count


def flagged_replicas(partition: PartitionRegistration) -> tuple[int, ...]:
    """The replicas whose unfence may change ``partition`` whatever the brokers' states (see module doc):
    every replica (each once, in replica order) of an unsettled partition, none of a stable one."""
    replicas, isr, leader = partition.replicas, partition.isr, partition.leader
    if not replicas:
        return ()  # nobody's unfence looks at it
    stable = (
        not partition.elr  # an ELR (or its trace) may be recomputed by any election: unsettled
        and not partition.last_known_elr
        and leader != NO_PARTITION_LEADER
        and leader in isr
        # the election keeps an acceptable current leader unless the preferred replica is an acceptable
        # ISR member (then it takes over): out of the ISR, it cannot
        and (leader == replicas[0] or (replicas[0] not in isr and leader in replicas))
        and _isr_in_replica_order(replicas, isr)
    )
    return () if stable else tuple(dict.fromkeys(replicas))


class RejoinIndex:
    """``candidates(topics_by_id, broker_id)``: the flagged partitions of one broker, in scan order."""

    def __init__(self) -> None:
        self._topics: Mapping[str, TopicImage] | None = None  # the topics map the index reflects
        self._flags: dict[str, dict[int, tuple[int, ...]]] = {}  # topic id → partition id → flagged
        self._by_broker: dict[int, dict[str, set[int]]] = {}  # broker → topic id → partition ids
        # increases with the topic's position in topics_by_id; its insertion order is the ordinals' order
        self._ordinal: dict[str, int] = {}
        self._next_ordinal = 0
        self.leader_counts: Counter[int] = Counter()  # partitions led, per leader id (-1 included)
        # Replicas per broker and partitions in all: CreateTopics' per-broker limits and placement cursor,
        # kept delta by delta (PartitionCounts recounts every changed topic — after a fence, all of them).
        self.replica_counts: Counter[int] = Counter()
        self.partitions = 0
        # Leaders and replicas of each big topic (TOPIC_COUNTS_MIN_PARTITIONS): its removal is O(brokers).
        self._topic_counts: dict[str, tuple[Counter[int], Counter[int]]] = {}
        # A sliced rebuild in progress: topic ids not indexed yet (ordered), and the image it follows.
        self._pending: dict[str, None] | None = None
        self._building_for: Mapping[str, TopicImage] | None = None
        # Partitions of bulk deltas whose flags are not recomputed yet (LAZY_MIN_CHANGES): topic id → ids.
        self._dirty: dict[str, set[int]] = {}
        self.lazy_min_changes = LAZY_MIN_CHANGES  # (tests set 0 or 1: every delta's changes left dirty)
        # The walks of rejoin jobs in progress (each watches the partitions changed since its query); weak:
        # a job dropped (done, its broker fenced again, a reset) takes its walk with it.
        self._walks: WeakSet[RejoinWalk] = WeakSet()

    @property
    def current_for(self) -> Mapping[str, TopicImage] | None:
        return self._topics

    @property
    def building(self) -> bool:
        """A sliced rebuild is in progress (:meth:`rebuild_some` has work left)."""
        return self._pending is not None

    @property
    def settling(self) -> bool:
        """Some partitions' flags wait for :meth:`settle_some` (a bulk delta's changes)."""
        return bool(self._dirty)

    def invalidate(self) -> None:
        """The image was replaced by something other than a delta (a reset): rebuild on next use."""
        self._lose_walks()
        self._topics = None
        self._pending = self._building_for = None
        self._dirty.clear()

    # ---- maintenance ----

    def _lose_walks(self) -> None:
        """The index no longer sees every change since the walks' queries: they scan the rest."""
        for walk in list(self._walks):
            walk.lost = True
        self._walks.clear()

    def _clear(self) -> None:
        self._lose_walks()
        self._topic_counts.clear()
        self._flags.clear()
        self._by_broker.clear()
        self._ordinal.clear()
        self._dirty.clear()
        self.leader_counts = Counter()
        self.replica_counts = Counter()
        self.partitions = 0
        self._next_ordinal = 0

    def rebuild(self, topics_by_id: Mapping[str, TopicImage]) -> None:
        self._clear()
        self._pending = self._building_for = None
        for topic_id, topic in topics_by_id.items():
            self._ordinal[topic_id] = self._next_ordinal
            self._next_ordinal += 1
            self._add_topic(topic_id, topic.partitions)
        self._topics = topics_by_id

    def start_rebuild(self, topics_by_id: Mapping[str, TopicImage]) -> None:
        """Begin a sliced rebuild for ``topics_by_id`` (see the module docstring)."""
        self._clear()
        self._topics = None
        self._pending = dict.fromkeys(topics_by_id)
        self._building_for = topics_by_id

    def rebuild_some(self, topics_by_id: Mapping[str, TopicImage], limit: int) -> bool:
        """Index pending topics of ``topics_by_id`` (the image the build follows) until about ``limit``
        partitions were indexed; True once the index follows ``topics_by_id`` (nothing pending)."""
        if self._pending is None:
            return self._topics is topics_by_id
        if topics_by_id is not self._building_for:
            self.start_rebuild(topics_by_id)  # the image was replaced behind the build: start over
        pending = self._pending
        assert pending is not None
        done = 0
        while pending and done < limit:
            topic_id = next(iter(pending))
            del pending[topic_id]
            topic = topics_by_id.get(topic_id)
            if topic is not None:
                self._add_topic(topic_id, topic.partitions)
                done += len(topic.partitions) + 1
        if pending:
            return False
        self._ordinal = {topic_id: ordinal for ordinal, topic_id in enumerate(topics_by_id)}
        self._next_ordinal = len(self._ordinal)
        self._pending = self._building_for = None
        self._topics = topics_by_id
        return True

    def _advance_building(self, delta: MetadataDelta, topics_by_id: Mapping[str, TopicImage]) -> None:
        pending = self._pending
        assert pending is not None
        if delta.image.topics_by_id is not self._building_for:
            self.start_rebuild(topics_by_id)
            return
        old_topics = delta.image.topics_by_id
        removed = delta.removed_topics()
        for topic_id, gone in removed.items():
            if topic_id in pending:
                del pending[topic_id]
            else:  # indexed: drop the version indexed (unchanged since, or it would be pending)
                self._drop_topic(topic_id, gone.partitions)
        for topic_id, _, _ in delta.changed_topics():
            if topic_id in pending:
                continue
            old = None if topic_id in removed else old_topics.get(topic_id)
            if old is not None:
                self._drop_topic(topic_id, old.partitions)
            pending[topic_id] = None
        self._building_for = topics_by_id

    def advance(self, delta: MetadataDelta, topics_by_id: Mapping[str, TopicImage]) -> None:
        """Follow ``delta`` (whose ``apply()`` gave ``topics_by_id``) when the index reflects its base
        image (or is being rebuilt in slices for it); otherwise stay stale (cheap: nothing is done until
        a query rebuilds)."""
        if self._pending is not None:
            self._advance_building(delta, topics_by_id)
            return
        if self._topics is None or self._topics is not delta.image.topics_by_id:
            self._lose_walks()
            self._topics = None
            self._dirty.clear()  # the rebuild before the next use starts from nothing
            return
        if topics_by_id is self._topics:
            return
        old_topics = delta.image.topics_by_id
        removed = delta.removed_topics()
        changed_topics = list(delta.changed_topics())
        lazy = (
            sum(len(changed) for _, base, changed in changed_topics if base is not None)
            >= self.lazy_min_changes
        )
        for topic_id in removed:
            self._drop_topic(topic_id, removed[topic_id].partitions)
            del self._ordinal[topic_id]
        # apply() keeps the position of a topic it already had and appends new ones in delta order.
        for topic_id, base, changed in changed_topics:
            if base is None:
                old = None if topic_id in removed else old_topics.get(topic_id)
                if old is not None:  # a TopicRecord replacing a live topic's content, same position
                    self._drop_topic(topic_id, old.partitions)
                else:
                    self._ordinal[topic_id] = self._next_ordinal
                    self._next_ordinal += 1
                self._add_topic(topic_id, topics_by_id[topic_id].partitions)
                continue
            if self._change_partitions(topic_id, base.partitions, changed, lazy):
                grown = topics_by_id[topic_id].partitions
                if len(grown) >= TOPIC_COUNTS_MIN_PARTITIONS and topic_id not in self._topic_counts:
                    # grew past the line (a big topic written in slices, CreatePartitions): counted once
                    self._topic_counts[topic_id] = _count_topic(grown)
        if self._walks:
            for walk in self._walks:
                walk.note(changed_topics)
        self._topics = topics_by_id

    def _add_topic(self, topic_id: str, partitions: Sequence[PartitionRegistration]) -> None:
        if len(partitions) >= TOPIC_COUNTS_MIN_PARTITIONS:
            own = self._topic_counts[topic_id] = _count_topic(partitions)
            self.leader_counts.update(own[0])
            self.replica_counts.update(own[1])
        else:
            self.leader_counts.update(map(_leader_of, partitions))
            self.replica_counts.update(chain.from_iterable(map(_replicas_of, partitions)))
        self.partitions += len(partitions)
        flags: dict[int, tuple[int, ...]] = {}
        for partition_id, partition in enumerate(partitions):
            # flagged_replicas' common case inlined: a rebuild visits every partition (a million).
            replicas, isr, leader, _, _, elr, lke, _, _ = partition
            if isr is replicas and leader != NO_PARTITION_LEADER and not elr and not lke:
                if len(replicas) == 3:  # replication factor 3 without a call
                    first, second, third = replicas
                    if leader == first and first != second and third not in (first, second):
                        continue
                elif replicas and leader == replicas[0] and _distinct(replicas):
                    continue
            brokers = flagged_replicas(partition)
            if brokers:
                flags[partition_id] = brokers
                self._flag(topic_id, partition_id, brokers)
        if flags:
            self._flags[topic_id] = flags

    def _drop_topic(self, topic_id: str, partitions: Sequence[PartitionRegistration]) -> None:
        counts = self._topic_counts.pop(topic_id, None)
        if counts is not None:
            self.leader_counts.subtract(counts[0])
            self.replica_counts.subtract(counts[1])
        else:
            self.leader_counts.subtract(map(_leader_of, partitions))
            self.replica_counts.subtract(chain.from_iterable(map(_replicas_of, partitions)))
        self.partitions -= len(partitions)
        self._dirty.pop(topic_id, None)  # its flags below are what by_broker holds, dirty or not
        flags = self._flags.pop(topic_id, {})
        if len(flags) > len(self._by_broker):
            # many flagged partitions (an offline big topic): drop the topic from each broker's map
            for broker_id in list(self._by_broker):
                by_topic = self._by_broker[broker_id]
                if by_topic.pop(topic_id, None) is not None and not by_topic:
                    del self._by_broker[broker_id]
            return
        for partition_id, brokers in flags.items():
            self._unflag(topic_id, partition_id, brokers)

    def _change_partitions(
        self,
        topic_id: str,
        base: Sequence[PartitionRegistration],
        changed: Mapping[int, PartitionRegistration],
        lazy: bool,
    ) -> bool:
        """Follow the topic's changed partitions; True when partitions were added (the topic grew).

        Counts move by C-level maps over the changed partitions (a leave job changes ~1,000 of a topic
        per slice); flags are recomputed here (:meth:`_reflag`) or, for a bulk delta (``lazy``), the
        partitions that existed before are marked dirty and settled later (LAZY_MIN_CHANGES)."""
        own = self._topic_counts.get(topic_id)
        replica_counts = self.replica_counts
        size = len(base)
        if len(changed) == 1:  # one partition (a one-partition topic's leave: ~9,000 in a shutdown)
            for partition_id, partition in changed.items():
                if partition_id < size:
                    self._change_one(topic_id, partition_id, base[partition_id], partition, own, lazy)
                    return False
        ids = list(changed)
        now = list(changed.values())
        if ids and max(ids) >= size:  # partitions added (a big topic written in slices, CreatePartitions)
            grown = [(i, p) for i, p in zip(ids, now, strict=True) if i >= size]
            pairs = [(i, p) for i, p in zip(ids, now, strict=True) if i < size]
            ids, now = [i for i, _ in pairs], [p for _, p in pairs]
            added = [p for _, p in grown]
            self.partitions += len(added)
            added_replicas = list(chain.from_iterable(map(_replicas_of, added)))
            replica_counts.update(added_replicas)
            if own is not None:
                own[1].update(added_replicas)
            self._reflag(topic_id, [i for i, _ in grown], added)
        else:
            added = []
        before = list(map(base.__getitem__, ids))
        new_leaders = list(map(_leader_of, now))
        new_leaders.extend(map(_leader_of, added))
        old_leaders = list(map(_leader_of, before))
        _shift(self.leader_counts, old_leaders, new_leaders)
        if own is not None:
            _shift(own[0], old_leaders, new_leaders)
        old_replicas = list(map(_replicas_of, before))
        new_replicas = list(map(_replicas_of, now))
        if not all(map(is_, old_replicas, new_replicas)):  # a reassignment (rare): per partition
            for old, new in zip(old_replicas, new_replicas, strict=True):
                if old is not new:
                    replica_counts.subtract(old)
                    replica_counts.update(new)
                    if own is not None:
                        own[1].subtract(old)
                        own[1].update(new)
        if ids:
            if lazy:
                dirty = self._dirty.get(topic_id)
                if dirty is None:
                    self._dirty[topic_id] = set(ids)
                else:
                    dirty.update(ids)
            else:
                self._reflag(topic_id, ids, now)
        return bool(added)

    def _change_one(
        self,
        topic_id: str,
        partition_id: int,
        before: PartitionRegistration,
        partition: PartitionRegistration,
        own: tuple[Counter[int], Counter[int]] | None,
        lazy: bool,
    ) -> None:
        """:meth:`_change_partitions` for a single partition that existed, without its lists."""
        old_leader, new_leader = before.leader, partition.leader
        if old_leader != new_leader:
            leaders = self.leader_counts
            leaders[old_leader] -= 1
            leaders[new_leader] += 1
            if own is not None:
                own[0][old_leader] -= 1
                own[0][new_leader] += 1
        if before.replicas is not partition.replicas:  # a reassignment (rare)
            self.replica_counts.subtract(before.replicas)
            self.replica_counts.update(partition.replicas)
            if own is not None:
                own[1].subtract(before.replicas)
                own[1].update(partition.replicas)
        if lazy:
            dirty = self._dirty.get(topic_id)
            if dirty is None:
                self._dirty[topic_id] = {partition_id}
            else:
                dirty.add(partition_id)
        else:
            self._reflag_one(topic_id, partition_id, partition)

    def _reflag_one(self, topic_id: str, partition_id: int, partition: PartitionRegistration) -> None:
        """:meth:`_reflag` of one partition, without its lists (a one-partition topic's change)."""
        flags = self._flags.get(topic_id)
        old = () if flags is None else flags.get(partition_id, ())
        new = flagged_replicas(partition)
        if old == new:
            return
        if old:
            self._unflag(topic_id, partition_id, [b for b in old if b not in new] if new else old)
        if new:
            self._flag(topic_id, partition_id, [b for b in new if b not in old] if old else new)
            if flags is None:
                flags = self._flags[topic_id] = {}
            flags[partition_id] = new
        else:
            assert flags is not None
            del flags[partition_id]
            if not flags:
                del self._flags[topic_id]

    def _reflag(self, topic_id: str, ids: Sequence[int], partitions: Sequence[PartitionRegistration]) -> None:
        """Recompute the flags of partitions ``ids`` of the topic, now ``partitions`` (same order).  The
        newly flagged ids join each broker's set in one update; unflags are inline (each partition id
        comes once, so a broker's flags end the same whether they interleave or not)."""
        flags = self._flags.get(topic_id)
        flagged: dict[int, list[int]] = {}  # broker → partition ids newly flagged for it
        for partition_id, partition in zip(ids, partitions, strict=True):
            old = () if flags is None else flags.get(partition_id, ())
            new = flagged_replicas(partition)
            if old == new:
                continue
            # Only the brokers that differ (an ELR cleared unflags the leader, keeps the others).
            if old:
                self._unflag(topic_id, partition_id, [b for b in old if b not in new] if new else old)
            if new:
                for broker_id in [b for b in new if b not in old] if old else new:
                    got = flagged.get(broker_id)
                    if got is None:
                        flagged[broker_id] = [partition_id]
                    else:
                        got.append(partition_id)
                if flags is None:
                    flags = self._flags[topic_id] = {}
                flags[partition_id] = new
            else:
                assert flags is not None
                del flags[partition_id]
        by_broker = self._by_broker
        for broker_id, got in flagged.items():
            by_topic = by_broker.get(broker_id)
            if by_topic is None:
                by_topic = by_broker[broker_id] = {}
            present = by_topic.get(topic_id)
            if present is None:
                by_topic[topic_id] = set(got)
            else:
                present.update(got)
        if flags is not None and not flags:
            del self._flags[topic_id]

    def settle_some(self, limit: int, expired: Callable[[], bool] | None = None) -> bool:
        """Recompute the flags of up to ~``limit`` dirty partitions, or until ``expired()`` (asked about
        every :data:`SETTLE_CHECK_EVERY` partitions: a bounded event of the shell's queue, after bulk
        work); True once nothing is dirty."""
        topics = self._topics
        dirty = self._dirty
        if topics is None:  # stale: the rebuild before the next use recomputes everything
            dirty.clear()
            return True
        done = 0
        checked = 0
        while dirty and done < limit:
            topic_id = next(iter(dirty))
            ids = dirty[topic_id]
            if len(ids) == 1:  # a one-partition topic's (or a lone partition's) change
                del dirty[topic_id]
                for partition_id in ids:
                    self._reflag_one(topic_id, partition_id, topics[topic_id].partitions[partition_id])
                done += 1
            else:
                room = min(limit - done, SETTLE_CHECK_EVERY)
                if len(ids) <= room:
                    del dirty[topic_id]
                    taken = list(ids)
                else:
                    taken = [ids.pop() for _ in range(room)]
                partitions = topics[topic_id].partitions
                self._reflag(topic_id, taken, list(map(partitions.__getitem__, taken)))
                done += len(taken)
            if expired is not None and done - checked >= SETTLE_CHECK_EVERY:
                checked = done
                if expired():
                    break
        return not dirty

    def ready_for(self, topics_by_id: Mapping[str, TopicImage]) -> bool:
        """Whether a flag query for ``topics_by_id`` costs only what it reads (nothing to build or settle
        first: :meth:`_follow` would do nothing)."""
        return self._topics is topics_by_id and not self._dirty

    def catch_up(
        self,
        topics_by_id: Mapping[str, TopicImage],
        limit: int,
        expired: Callable[[], bool] | None = None,
    ) -> bool:
        """One bounded step of what :meth:`_follow` does at once: index up to ~``limit`` pending topics'
        partitions (starting a sliced rebuild when the index is stale), then settle up to ``limit`` dirty
        partitions or until ``expired()``; True once :meth:`ready_for` ``topics_by_id``.  An unfence
        waits for this in slices (the controller's rejoin job) instead of settling a whole bulk job's
        changes in its own event (0.2-0.3 s after a 109k-leadership shutdown)."""
        if not self.follow_some(topics_by_id, limit):
            return False
        return self.settle_some(limit, expired)

    def follow_some(self, topics_by_id: Mapping[str, TopicImage], limit: int) -> bool:
        """The first half of :meth:`catch_up`: one bounded step of making the index follow
        ``topics_by_id`` (a sliced rebuild when stale), dirty flags left as they are; True once it does."""
        if self._topics is topics_by_id:
            return True
        if self._pending is None:
            self.start_rebuild(topics_by_id)  # stale: rebuild in slices, not in one pass
        return self.rebuild_some(topics_by_id, limit)

    def _flag(self, topic_id: str, partition_id: int, brokers: Iterable[int]) -> None:
        for broker_id in brokers:
            by_topic = self._by_broker.get(broker_id)
            if by_topic is None:
                by_topic = self._by_broker[broker_id] = {}
            ids = by_topic.get(topic_id)
            if ids is None:
                ids = by_topic[topic_id] = set()
            ids.add(partition_id)

    def _unflag(self, topic_id: str, partition_id: int, brokers: Iterable[int]) -> None:
        for broker_id in brokers:
            by_topic = self._by_broker[broker_id]
            ids = by_topic[topic_id]
            ids.discard(partition_id)
            if not ids:
                del by_topic[topic_id]
                if not by_topic:
                    del self._by_broker[broker_id]

    # ---- queries ----

    def flagged_count(self, broker_id: int) -> int:
        if self._dirty:
            self.settle_some(1 << 62)
        return sum(len(ids) for ids in self._by_broker.get(broker_id, {}).values())

    def _follow(self, topics_by_id: Mapping[str, TopicImage]) -> None:
        """Make the index reflect ``topics_by_id`` before a query (finish a sliced build, or rebuild)."""
        if self._topics is not topics_by_id:
            if self._pending is not None and self._building_for is topics_by_id:
                self.rebuild_some(topics_by_id, 1 << 62)  # a query mid-build: finish it now
            else:
                self.rebuild(topics_by_id)
        if self._dirty:  # a bulk delta's flags not settled yet: all of them now (as a scan would cost)
            self.settle_some(1 << 62)

    def unsettled(
        self,
        topics_by_id: Mapping[str, TopicImage],
        wanted: Callable[[PartitionRegistration], bool],
        topic_ids: Collection[str] | None = None,
    ) -> list[tuple[TopicImage, int, PartitionRegistration]]:
        """The ``wanted`` unsettled partitions (of ``topic_ids``; None = all topics), in scan order.
        Unsettled is a superset of the partitions without a leader or holding an ELR or a last known
        ELR (see :func:`flagged_replicas`), so ``wanted`` picks those without a scan of every partition:
        the cost is the flagged partitions (~0.5 µs each), none in a healthy cluster.

        Dirty partitions (a bulk delta's, not settled yet) are not settled here: ``wanted`` is asked of
        each of them as it is now (~0.1-0.2 µs, against 1.5-4 µs to settle one), since a partition that
        ``wanted`` picks is unsettled whatever its stale flags say (session 12: an unclean ElectLeaders
        right after a 109k-leadership shutdown no longer settles all of them in its event)."""
        if self._topics is not topics_by_id:
            self._follow(topics_by_id)  # (a rebuild settles nothing: it starts with nothing dirty)
        flags = self._flags
        dirty = self._dirty
        picked = self._picked(topic_ids)
        ordinal = self._ordinal
        found = []
        for topic_id in sorted(picked, key=ordinal.__getitem__):
            topic = topics_by_id[topic_id]
            partitions = topic.partitions
            flagged = flags.get(topic_id)
            stale = dirty.get(topic_id)
            if stale is None:
                ids: Iterable[int] = flagged if flagged is not None else ()
            else:
                ids = stale if flagged is None else stale.union(flagged)
            for partition_id in sorted(ids):
                partition = partitions[partition_id]
                if wanted(partition):
                    found.append((topic, partition_id, partition))
        return found

    def _picked(self, topic_ids: Collection[str] | None) -> set[str]:
        """The topics (of ``topic_ids``; None: all) with a flagged or a dirty partition."""
        flags = self._flags
        dirty = self._dirty
        if topic_ids is None:
            return set(flags).union(dirty)
        return {t for t in topic_ids if t in flags or t in dirty}

    def unsettled_ids(
        self, topic_ids: Collection[str] | None = None, *, gaps: bool = False
    ) -> Iterator[tuple[str, int]]:
        """:meth:`unsettled` taken lazily, for a caller that works in bounded slices (an implicit UNCLEAN
        ElectLeaders, session 13): (topic id, partition id) of every partition that was flagged or
        dirty when the iteration reached it, in scan order; the caller asks its own ``wanted`` of each
        on its current image.  The caller must keep the index following its image between two
        ``next()`` calls (:meth:`follow_some`): each topic's ids are read from the index as it is when
        the iteration reaches them — a topic with at most :data:`UNSETTLED_WINDOW` of them copied at
        once (sorted), a bigger one :data:`UNSETTLED_WINDOW` ids of its range at a time (C-level
        membership tests), so no step copies or sorts a whole big topic's flags (~1-4 ms at 100,000).
        A partition that became unsettled after the iteration passed it is not seen (it was settled
        then).

        Topics: with ``topic_ids``, those of them with a flagged or dirty partition at the first
        ``next()``, in ordinal order.  Without (every topic; session 14), the topics map the index
        follows at the first ``next()`` — immutable, in scan order — is walked by a cursor,
        :data:`UNSETTLED_WINDOW` topics at a time, each asked whether it has a flagged or dirty
        partition when the walk reaches it: no step copies the set of flagged topics or every topic's
        ordinal (~2-3 ms per 100,000 topics before), and a topic created after the first ``next()`` is
        not seen (it had no partition then).  ``gaps``: after each window of topics, and after each
        window of a big topic's range, with nothing to yield, yield ``(topic id, GAP)`` (a negative
        partition id), so a caller taking a bounded number of items bounds its time as well."""
        flags = self._flags
        dirty = self._dirty
        order: Iterable[str | None]
        if topic_ids is not None:
            listed: list[str] = sorted(self._picked(topic_ids), key=self._ordinal.__getitem__)
            order = listed
        else:
            order = self._unsettled_topics(gaps)
        for topic_id in order:
            if topic_id is None:  # a window of topics with nothing unsettled
                yield "", GAP
                continue
            flagged: Mapping[int, tuple[int, ...]] = flags.get(topic_id, _NO_FLAGS)
            stale: Collection[int] = dirty.get(topic_id, _NO_DIRT)
            if len(flagged) + len(stale) <= UNSETTLED_WINDOW:
                yield from zip(repeat(topic_id), sorted(flagged.keys() | stale))
                continue
            low = 0
            while True:
                topics = self._topics
                topic = None if topics is None else topics.get(topic_id)
                if topic is None or low >= len(topic.partitions):
                    break
                high = min(low + UNSETTLED_WINDOW, len(topic.partitions))
                flagged = flags.get(topic_id, _NO_FLAGS)  # (as they are now: replaced or gone meanwhile)
                stale = dirty.get(topic_id, _NO_DIRT)
                window = range(low, high)
                found = set(filter(flagged.__contains__, window))
                found.update(filter(stale.__contains__, window))
                if found:
                    yield from zip(repeat(topic_id), sorted(found))
                elif gaps:
                    yield topic_id, GAP
                low = high

    def _unsettled_topics(self, gaps: bool) -> Iterator[str | None]:
        """The topics with a flagged or dirty partition, in scan order, walking the topics map the
        index follows now by a cursor (:meth:`unsettled_ids`); ``gaps``: None after each window of
        topics that held none."""
        flags = self._flags
        dirty = self._dirty
        topics = self._topics
        walk = iter(topics if topics is not None else ())
        while True:
            window = list(islice(walk, UNSETTLED_WINDOW))
            if not window:
                return
            hits = [t for t in window if t in flags or t in dirty]
            if hits:
                yield from hits
            elif gaps:
                yield None
            if len(window) < UNSETTLED_WINDOW:
                return

    def _unacceptable_leaders(self, acceptable: Callable[[int], bool]) -> set[int]:
        """The brokers that lead something and are not acceptable (none outside a leave job)."""
        return {
            leader
            for leader, count in self.leader_counts.items()
            if count > 0 and leader != NO_PARTITION_LEADER and not acceptable(leader)
        }

    def _candidate_ids(
        self, topics_by_id: Mapping[str, TopicImage], broker_id: int, acceptable: Callable[[int], bool]
    ) -> tuple[dict[str, set[int]], set[int]]:
        """:meth:`candidates` unsorted (topic id → partition ids), and the unacceptable leaders."""
        self._follow(topics_by_id)  # an unfence mid-build finishes the build at once
        picked: dict[str, set[int]] = {
            topic_id: set(ids) for topic_id, ids in self._by_broker.get(broker_id, {}).items()
        }
        # Stable partitions (see the module doc) change only when their leader is not acceptable;
        # leaderless partitions are flagged already.
        unacceptable = self._unacceptable_leaders(acceptable)
        if unacceptable:
            # Only while a broker that still leads is being moved out (a leave job in progress): one pass
            # like the scan this index replaces — never worse than before, and rare.  (A per-leader
            # topic index would cost an entry per leader and topic: a million at 1,000 x 1,000.)
            for topic_id, topic in topics_by_id.items():
                for partition_id, partition in enumerate(topic.partitions):
                    if partition.leader in unacceptable and broker_id in partition.replicas:
                        picked.setdefault(topic_id, set()).add(partition_id)
        return picked, unacceptable

    def candidates(
        self, topics_by_id: Mapping[str, TopicImage], broker_id: int, acceptable: Callable[[int], bool]
    ) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
        """A superset, in scan order, of the partitions listing ``broker_id`` as a replica that the
        unfence's election (``build_change``, nothing added to the ISR) changes on ``topics_by_id``, given
        that ``broker_id`` is acceptable (a rejoin job takes a :meth:`walk`: its slices come later)."""
        picked, _ = self._candidate_ids(topics_by_id, broker_id, acceptable)
        ordinal = self._ordinal
        for topic_id in sorted(picked, key=ordinal.__getitem__):
            topic = topics_by_id[topic_id]
            for partition_id in sorted(picked[topic_id]):
                yield topic, partition_id, topic.partitions[partition_id]

    def walk(
        self, topics_by_id: Mapping[str, TopicImage], broker_id: int, acceptable: Callable[[int], bool]
    ) -> RejoinWalk:
        """The candidates of ``broker_id``'s unfence on ``topics_by_id`` for a rejoin job that elects on
        later images, slice by slice (see :class:`RejoinWalk`)."""
        picked, unacceptable = self._candidate_ids(topics_by_id, broker_id, acceptable)
        walk = RejoinWalk(self, topics_by_id, broker_id, picked, unacceptable)
        self._walks.add(walk)
        return walk


_Key = tuple[int, int, str]  # (topic ordinal, partition id, topic id): scan order while the index follows


class RejoinWalk:
    """An unfence's rejoin-job candidates, handed out one at a time when the job reaches them (module
    doc, "The rejoin job's walk"): the partitions flagged at the query merged with the partitions of
    the broker changed since, past the last one handed out, in scan order — or, once :meth:`at_slice`
    finds the watch not enough, every partition of the broker in the query's image past it (the scan).

    Exhaustion is not final: a ``next()`` that finds nothing may find a partition changed later, as the
    scan's next slice would visit the rest of the broker's partitions.  The job therefore ends only when
    a slice with room left finds nothing (then the scan, visiting the same partitions, would have found
    its end too)."""

    __slots__ = (
        "__weakref__",
        "_broker_id",
        "_changed",
        "_flagged",
        "_head",
        "_index",
        "_last",
        "_leaders_acceptable",
        "_rest",
        "_topics",
        "_watched",
        "lost",
    )

    def __init__(
        self,
        index: RejoinIndex,
        topics_by_id: Mapping[str, TopicImage],
        broker_id: int,
        picked: dict[str, set[int]],
        unacceptable: set[int],
    ) -> None:
        self._index = index
        self._topics = topics_by_id  # the query's image: the scan's partitions and order
        self._broker_id = broker_id
        # Leaders acceptable at the query: one not acceptable any more moves its partitions unchanged since,
        # which were not picked.  (Those not acceptable then had theirs picked; a broker leading nothing
        # then leads only partitions changed since.)
        self._leaders_acceptable = {
            leader
            for leader, count in index.leader_counts.items()
            if count > 0 and leader != NO_PARTITION_LEADER and leader not in unacceptable
        }
        self._flagged = _flagged_keys(index._ordinal, picked)  # (no reference back: freed with its job)
        self._head = next(self._flagged, None)
        self._watched: list[_Key] = []  # a heap: partitions changed since, past ``_last``
        self._changed: dict[str, set[int]] = {}  # noted by the index, not looked at yet
        self._last: _Key | None = None  # the partition handed out last
        self._rest: Iterator[tuple[TopicImage, int, PartitionRegistration]] | None = None  # the scan
        self.lost = False  # the index missed changes since the query (set by the index)

    def __iter__(self) -> RejoinWalk:
        return self

    def note(self, changed_topics: Iterable[tuple[str, TopicImage | None, Mapping[int, object]]]) -> None:
        """The partitions a delta changed (the index's :meth:`~RejoinIndex.advance`); topics the query's
        image lacks are not the scan's (created since) and are left out."""
        if self._rest is not None:
            return
        topics = self._topics
        changed = self._changed
        ordinal = self._index._ordinal
        last = self._last
        behind = -1 if last is None else last[0]  # topics before the last one handed out: never again
        for topic_id, base, partitions in changed_topics:
            if topic_id not in topics:
                continue
            if base is None:
                # A TopicRecord for an id of the query's image (its content replaced, or the id re-created
                # after a removal, then at a new ordinal): never written by this controller (topic ids are
                # not reused), so no watch for it — the scan of the rest, as the scan would visit it.
                self.lost = True
                return
            topic_ordinal = ordinal.get(topic_id)
            if topic_ordinal is None or topic_ordinal < behind:
                continue  # deleted (the scan's election finds nothing), or behind (the job's own elections)
            ids = changed.get(topic_id)
            if ids is None:
                changed[topic_id] = set(partitions)
            else:
                ids.update(partitions)

    def at_slice(self, topics_by_id: Mapping[str, TopicImage], acceptable: Callable[[int], bool]) -> None:
        """Called by the job at the start of each slice, with the slice's image and acceptability: fall
        back to the scan when the watch may have missed a partition this slice's election changes."""
        if self._rest is not None:
            return
        index = self._index
        if self.lost or index.current_for is not topics_by_id:
            self._fall_back()  # changes since the query not all noted
        elif not self._leaders_acceptable.isdisjoint(index._unacceptable_leaders(acceptable)):
            self._fall_back()  # a leader acceptable at the query is not now: its unchanged partitions move

    def _fall_back(self) -> None:
        self._index._walks.discard(self)
        self._changed.clear()
        self._watched.clear()
        self._rest = _scan_after(self._topics, self._broker_id, self._last)

    def _take_changed(self) -> None:
        """Move the noted changes past ``_last`` that list the broker in the query's image to the heap."""
        changed, self._changed = self._changed, {}
        ordinal = self._index._ordinal
        topics = self._topics
        broker_id = self._broker_id
        last = self._last
        watched = self._watched
        for topic_id, ids in changed.items():
            topic_ordinal = ordinal.get(topic_id)
            if topic_ordinal is None:
                continue  # deleted since: the scan's election finds nothing there
            if last is not None and topic_ordinal < last[0]:
                continue
            partitions = topics[topic_id].partitions
            for partition_id in ids:
                if partition_id >= len(partitions) or broker_id not in partitions[partition_id].replicas:
                    continue  # added since, or not the broker's at the query: not the scan's
                key = (topic_ordinal, partition_id, topic_id)
                if last is None or key > last:
                    heappush(watched, key)

    def __next__(self) -> tuple[TopicImage, int, PartitionRegistration]:
        if self._rest is not None:
            return next(self._rest)
        if self._changed:
            self._take_changed()
        last = self._last
        watched = self._watched
        head = self._head
        if not watched and head is not None and (last is None or head > last):  # (the common case)
            self._head = next(self._flagged, None)
            self._last = head
            topic = self._topics[head[2]]
            return topic, head[1], topic.partitions[head[1]]
        while True:
            head = self._head
            if watched and (head is None or watched[0] < head):
                key = heappop(watched)
            elif head is not None:
                key = head
                self._head = next(self._flagged, None)
            else:
                raise StopIteration
            if last is None or key > last:  # (a partition both flagged and changed comes once)
                break
        self._last = key
        topic = self._topics[key[2]]
        return topic, key[1], topic.partitions[key[1]]


def _flagged_keys(ordinal: Mapping[str, int], picked: dict[str, set[int]]) -> Iterator[_Key]:
    """The keys of ``picked`` in scan order (the ordinals as they are at the first ``next()``)."""
    ordered = sorted((ordinal[topic_id], topic_id) for topic_id in picked)
    for topic_ordinal, topic_id in ordered:
        for partition_id in sorted(picked[topic_id]):
            yield topic_ordinal, partition_id, topic_id


def _scan_after(
    topics_by_id: Mapping[str, TopicImage], broker_id: int, last: _Key | None
) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
    """The broker's partitions in ``topics_by_id`` (a walk's query image) past ``last``, in its order (no
    ordinals: the index may have been rebuilt since)."""
    topics = iter(topics_by_id.items())
    if last is not None:
        _, last_partition, last_topic = last
        for topic_id, topic in topics:
            if topic_id == last_topic:
                partitions = topic.partitions
                for partition_id in range(last_partition + 1, len(partitions)):
                    if broker_id in partitions[partition_id].replicas:
                        yield topic, partition_id, partitions[partition_id]
                break
    for _, topic in topics:
        for partition_id, partition in enumerate(topic.partitions):
            if broker_id in partition.replicas:
                yield topic, partition_id, partition
