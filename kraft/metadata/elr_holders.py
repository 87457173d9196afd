"""Which partitions hold an ELR or a last known ELR, per topic — kept with every image.

A ``ClearElrRecord`` (KIP-966: a changed ``min.insync.replicas``) clears the ELR and last known ELR of a
topic's (or every topic's) partitions.  Scanning for them would cost every partition of the topic — of
the cluster for the cluster-wide default — in one replay on every reader (the active controller's
speculative image, follower controllers, brokers); this index makes that replay cost the partitions
that hold one, none in a healthy cluster.

:class:`ElrHolders` is immutable, like the image that carries it (``MetadataImage.elr_holders``), and
follows image to image in ``MetadataDelta.apply()`` at a cost in proportion to the changed partitions:
per topic the partition ids are kept in *chunks* of :data:`CHUNK` ids (a frozenset each), so a change
copies the topic's small chunk map and the chunks it touches, never a set as big as the topic (a topic of
100,000 partitions all in ELR would otherwise copy 100,000 ids for each that leaves it).  A topic whose
holders do not change keeps its chunk map (shared with the previous image).  The topic map itself is a
shared *base* dict plus a small *overlay* of the topics changed since (:data:`OVERLAY_SHARE`): the next
index copies the overlay, not every topic, and folds it into a new base once it outgrows its share —
a dict copied whole by every delta that changed a holder made a fence of 30,000 one-partition topics
(~150 slices) spend ~30 of its ~80 ms of ``advance_steps`` copying (session 20;
docs/internals/raft-performance.md).  A delta's base image keeps its index as it was (neither dict of an
index is changed once it is built).

Images built without it (tests constructing ``MetadataImage`` directly) compute it by one scan on first
use (:func:`elr_holders_of`, memoized on the image); the store loads it from its ``partition_elr`` rows
and the empty image starts with an empty one, so real readers never scan.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping
from itertools import chain, compress, islice, repeat
from operator import attrgetter, or_, rshift
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from kraft.metadata.delta import MetadataDelta
    from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage

CHUNK_BITS: Final = 10
CHUNK: Final = 1 << CHUNK_BITS
"""Partition ids per chunk: a change copies at most this many ids, plus one entry per chunk of the topic
holding any (at most ~100 for a topic of 100,000 partitions)."""

ADVANCE_STEP_WORK = 1_024
"""Topics plus changed partitions :meth:`ElrHolders.advance_steps` looks at between two pauses (~0.5 µs
a topic without ELRs: 4,096 of a snapshot's new topics took 1.9-2.4 ms)."""
BULK_CHANGES = 1024
"""Changed partitions of one topic from which :meth:`ElrHolders.advance` uses set operations per chunk
(C-level) instead of a Python step per partition (a clear of 100,000 partitions: ~3x faster)."""

BULK_STEP_CHANGES = 4_096
"""Changed partitions of a big topic (in parts) :meth:`ElrHolders.advance_steps` takes between two
pauses."""

OVERLAY_SHARE = 8
"""An index's overlay (topics changed since its base) is folded into a new base once it holds more than
1/``OVERLAY_SHARE`` of the base's topics (and :data:`OVERLAY_MIN`): each delta copies at most that many
entries instead of every topic, and the fold (a copy of every topic) comes once per that many changed
topics — amortized O(``OVERLAY_SHARE``) entries a change."""
OVERLAY_MIN = 1_024

_Chunks = Mapping[int, frozenset[int]]  # chunk number → partition ids of that chunk holding an ELR/LKE
_NO_CHUNKS: Final[_Chunks] = {}


def holds_elr(partition: PartitionRegistration) -> bool:
    """A ClearElrRecord changes this partition (an empty ELR and last known ELR are left as they are)."""
    return bool(partition.elr or partition.last_known_elr)


_elr_of = attrgetter("elr")
_lke_of = attrgetter("last_known_elr")


def _chunked(partition_ids: Iterable[int]) -> dict[int, frozenset[int]]:
    """Sorted (linear for the usual ascending input), then cut at chunk boundaries: C-level work, not a
    Python step per id (a topic of 100,000 partitions all in ELR, loaded from a snapshot)."""
    ids = sorted(partition_ids)
    chunks: dict[int, frozenset[int]] = {}
    start = 0
    while start < len(ids):
        chunk = ids[start] >> CHUNK_BITS
        end = bisect_left(ids, (chunk + 1) << CHUNK_BITS, start)
        chunks[chunk] = frozenset(ids[start:end])
        start = end
    return chunks


def _holders_of_new_topic(partitions: Mapping[int, PartitionRegistration]) -> list[int]:
    """The ids holding one among a (re)created topic's partitions — every partition of a snapshot's
    topic, so the common case (none holds one) is two C-level passes, not a Python loop (~3x faster)."""
    values = partitions.values()
    if not (any(map(_elr_of, values)) or any(map(_lke_of, values))):
        return []
    return [p for p, partition in partitions.items() if partition.elr or partition.last_known_elr]


def _bulk_advance(old: _Chunks, partitions: Mapping[int, PartitionRegistration]) -> dict[int, frozenset[int]]:
    """:meth:`ElrHolders.advance` of one topic for many changed partitions, in set operations: each old
    chunk loses the changed ids (a C-level pass over the chunk), then the changed partitions holding
    one now are added (found by C-level passes).  A chunk left equal stays the same object.  (A dict of
    at most a part's ids; bigger changes go through :func:`_bulk_advance_steps`.)"""
    chunks = dict(old)
    changed = partitions if isinstance(partitions, dict) else dict.fromkeys(partitions)
    _bulk_advance_part(chunks, partitions, changed, None)
    return chunks


def _bulk_advance_steps(
    old: _Chunks, partitions: Mapping[int, PartitionRegistration]
) -> Generator[None, None, dict[int, frozenset[int]]]:
    """:func:`_bulk_advance` of a big topic's changes in parts (the delta's ``_PartitionParts``: more than
    32,768 of them), part by part and :data:`BULK_STEP_CHANGES` at a time, pausing (yielding) between
    steps: nothing is copied into one dict as big as the changes (session 13: that copy, and the whole
    topic in one step — ~29 ms for 100,000 changes — were the costs not in proportion to a step), and
    each step meets only the chunks of its part's span."""
    chunks = dict(old)
    spans: Callable[[], list[tuple[range, dict[int, PartitionRegistration]]]] | None = getattr(
        partitions, "spans", None
    )
    assert spans is not None
    for ids, part in spans():
        if not part:
            continue
        span = range(ids.start >> CHUNK_BITS, ((ids.stop - 1) >> CHUNK_BITS) + 1)
        items = iter(part.items())
        while True:
            step = dict(islice(items, BULK_STEP_CHANGES))
            if not step:
                break
            _bulk_advance_part(chunks, step, step, span)
            yield
    return chunks


def _bulk_advance_part(
    chunks: dict[int, frozenset[int]],
    partitions: Mapping[int, PartitionRegistration],
    changed: Mapping[int, object],
    span: range | None,
) -> None:
    """:func:`_bulk_advance` of ``partitions`` (keys ``changed``), editing ``chunks`` in place; ``span``:
    the chunk numbers they fall in (a part's), None when any.  Reads ``chunks`` as edited so far, so
    parts sharing a chunk (parts smaller than a chunk, in tests) compose."""
    values = partitions.values()
    flags = map(or_, map(bool, map(_elr_of, values)), map(bool, map(_lke_of, values)))
    added = _chunked(compress(partitions.keys(), flags))
    # The chunks a changed partition falls in — computed (~0.1 µs per changed partition) only when they
    # are few against the holders; otherwise every chunk (of the span) is looked at (~0.03 µs per
    # holder, an untouched one stays the same object).
    held: Iterable[int] = chunks.keys() if span is None else [c for c in span if c in chunks]
    if len(changed) * 3 < sum(map(len, map(chunks.__getitem__, held))):
        touched: Iterable[int] = set(map(rshift, changed, repeat(CHUNK_BITS)))
    else:
        touched = set(held).union(added)
    for chunk_no in touched:
        ids = chunks.get(chunk_no)
        kept = frozenset() if ids is None else ids.difference(changed)  # C-level dict lookups
        more = added.get(chunk_no)
        if more:
            kept |= more
        if kept:
            if ids is None or kept != ids:
                chunks[chunk_no] = kept
        elif ids is not None:
            del chunks[chunk_no]


def _after_changes(old: _Chunks, partitions: Mapping[int, PartitionRegistration]) -> _Chunks:
    """``old`` after ``partitions`` changed, none of which came to hold one that did not before: the
    changed holders that hold none now are dropped; ``old`` itself when none did.  Each chunk holding
    any meets the changed ids by a C-level intersection over the smaller side (or, when the holders
    outnumber the changed ids, only the chunks a changed id falls in do); then a Python step per changed
    holder — the cost is what holds ELRs."""
    keys = partitions.keys()
    chunk_nos: Iterable[int] = old
    if len(keys) * 2 < sum(map(len, old.values())):
        chunk_nos = set(map(rshift, keys, repeat(CHUNK_BITS))).intersection(old)
    chunks: dict[int, frozenset[int]] | None = None
    for chunk_no in chunk_nos:
        ids = old[chunk_no]
        lost = [p for p in keys & ids if not holds_elr(partitions[p])]
        if not lost:
            continue
        if chunks is None:
            chunks = dict(old)
        kept = ids.difference(lost)
        if kept:
            chunks[chunk_no] = kept
        else:
            del chunks[chunk_no]
    return old if chunks is None else chunks


def _step_advance(old: _Chunks, partitions: Mapping[int, PartitionRegistration]) -> _Chunks:
    """:meth:`ElrHolders.advance` of one topic for a few changed partitions: a Python step each, each
    touched chunk copied once; ``old`` itself when no partition's standing changed."""
    edits: dict[int, set[int]] = {}  # chunk → its ids after this delta (copied on first edit)
    for partition_id, partition in partitions.items():
        chunk_no = partition_id >> CHUNK_BITS
        now = bool(partition.elr or partition.last_known_elr)
        edited = edits.get(chunk_no)
        current = edited if edited is not None else old.get(chunk_no, ())
        if (partition_id in current) == now:
            continue
        if edited is None:
            edited = edits[chunk_no] = set(old.get(chunk_no, ()))
        if now:
            edited.add(partition_id)
        else:
            edited.discard(partition_id)
    if not edits:
        return old
    chunks = dict(old)
    for chunk_no, kept in edits.items():
        if kept:
            chunks[chunk_no] = frozenset(kept)
        else:
            chunks.pop(chunk_no, None)
    return chunks


class ElrHolders:
    """Topic id → the ids of its partitions holding an ELR or a last known ELR (topics holding none are
    absent).  Immutable: :meth:`advance` returns a new index sharing what did not change.

    Kept as ``_base`` (topic → chunks) and ``_overlay`` (topic → chunks, or None where the topic left the
    base), the overlay read first; neither dict is changed once the index is built (see the module
    doc)."""

    __slots__ = ("_base", "_overlay")

    def __init__(
        self, topics: Mapping[str, _Chunks], overlay: Mapping[str, _Chunks | None] | None = None
    ) -> None:
        self._base = topics
        self._overlay: Mapping[str, _Chunks | None] = overlay if overlay is not None else {}

    @staticmethod
    def from_partitions(pairs: Iterable[tuple[str, int]]) -> ElrHolders:
        """From (topic id, partition id) pairs of the partitions holding one (the image store's rows)."""
        by_topic: dict[str, list[int]] = {}
        for topic_id, partition_id in pairs:
            by_topic.setdefault(topic_id, []).append(partition_id)
        return ElrHolders({topic_id: _chunked(ids) for topic_id, ids in by_topic.items()})

    @staticmethod
    def scan(topics_by_id: Mapping[str, TopicImage]) -> ElrHolders:
        """By one pass over every partition (an image built without the index)."""
        return ElrHolders.from_partitions(
            (topic_id, partition_id)
            for topic_id, topic in topics_by_id.items()
            for partition_id, partition in enumerate(topic.partitions)
            if partition.elr or partition.last_known_elr
        )

    def _chunks(self, topic_id: str) -> _Chunks:
        """The topic's chunks (empty when it holds none)."""
        chunks = self._overlay.get(topic_id, _NO_CHUNKS)
        if chunks is _NO_CHUNKS:
            chunks = self._base.get(topic_id, _NO_CHUNKS)
        return _NO_CHUNKS if chunks is None else chunks

    @property
    def _topics(self) -> dict[str, _Chunks]:
        """Every topic holding any and its chunks, merged (O(topics): equality, tests)."""
        overlay = self._overlay
        if not overlay:
            return dict(self._base)
        merged = {t: c for t, c in self._base.items() if t not in overlay}
        merged.update((t, c) for t, c in overlay.items() if c is not None)
        return merged

    def topic_ids(self) -> Iterator[str]:
        """The topics holding any (in no particular order)."""
        overlay = self._overlay
        if not overlay:
            return iter(self._base)
        return chain(
            (t for t in self._base if t not in overlay), (t for t, c in overlay.items() if c is not None)
        )

    def partition_ids(self, topic_id: str) -> list[int]:
        """The partitions of ``topic_id`` holding one, ascending."""
        chunks = self._chunks(topic_id)
        if not chunks:
            return []
        return sorted(p for chunk in chunks.values() for p in chunk)

    def topic_count(self, topic_id: str) -> int:
        """How many partitions of ``topic_id`` hold one."""
        return sum(map(len, self._chunks(topic_id).values()))

    def count(self) -> int:
        return sum(len(chunk) for topic_id in self.topic_ids() for chunk in self._chunks(topic_id).values())

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ElrHolders) and self._topics == other._topics

    __hash__ = None  # type: ignore[assignment]  # mutable-looking equality; never a dict key

    def __repr__(self) -> str:
        return f"ElrHolders({ {t: self.partition_ids(t) for t in self.topic_ids()} })"

    def advance(self, delta: MetadataDelta) -> ElrHolders:
        """:meth:`advance_steps` in one go."""
        steps = self.advance_steps(delta)
        while True:
            try:
                next(steps)
            except StopIteration as done:
                return done.value  # type: ignore[no-any-return]

    def advance_steps(self, delta: MetadataDelta) -> Generator[None, None, ElrHolders]:
        """The index of ``delta.apply()``'s image, this being the index of ``delta.image``.  A topic in
        which no partition came to hold one (``elr_set`` false: ISR and leader changes — a controlled
        shutdown's 100,000 — new topics without ELRs, changes of partitions keeping theirs) takes no
        step per changed partition: skipped when it holds none, else only its changed holders are looked
        at (found by C-level set operations over the smaller side).  Otherwise each changed partition is
        looked at once and each touched chunk copied once.  Pauses (yields) after about every
        :data:`ADVANCE_STEP_WORK` topics and changed partitions looked at (a snapshot's 100,000 new
        topics: ~20 ms in one go)."""
        # The next overlay, copied from this one on the first change (often there is none); the base is
        # shared (a removed base topic is a None entry).
        shared = self._base
        topics: dict[str, _Chunks | None] | None = None
        for topic_id in delta.removed_topics():
            if self._chunks(topic_id):
                if topics is None:
                    topics = dict(self._overlay)
                if topic_id in shared:
                    topics[topic_id] = None
                else:
                    del topics[topic_id]
        work = 0
        for topic_id, base, partitions, elr_set in delta.elr_changed_topics():
            work += 1 + (len(partitions) if elr_set else 0)  # (a topic skipped: ~0.2 µs)
            if work >= ADVANCE_STEP_WORK:
                work = 0
                yield
            if topics is None:
                old = self._chunks(topic_id)
            else:
                found = topics.get(topic_id, _NO_CHUNKS)
                if found is _NO_CHUNKS:
                    found = shared.get(topic_id, _NO_CHUNKS)
                old = _NO_CHUNKS if found is None else found
            chunks: _Chunks
            if base is None:  # (re)created in this delta: every partition it has is in ``partitions``
                ids = _holders_of_new_topic(partitions) if elr_set else []
                chunks = _chunked(ids) if ids else _NO_CHUNKS
                if not chunks and not old:
                    continue
            elif not elr_set:
                if not old:
                    continue
                chunks = _after_changes(old, partitions)
            elif not old and not (
                any(map(_elr_of, partitions.values())) or any(map(_lke_of, partitions.values()))
            ):
                # A topic holding none (``elr_set`` is conservative): two C-level passes say whether
                # any changed partition now holds one, instead of a Python step each.
                continue
            elif hasattr(partitions, "spans"):  # more than a part's worth: in steps
                chunks = yield from _bulk_advance_steps(old, partitions)
            elif len(partitions) >= BULK_CHANGES:
                chunks = _bulk_advance(old, partitions)
            else:
                chunks = _step_advance(old, partitions)
            if chunks is old:
                continue
            if topics is None:
                topics = dict(self._overlay)
            if chunks:
                topics[topic_id] = chunks
            elif topic_id in shared:
                topics[topic_id] = None
            else:
                topics.pop(topic_id, None)
        if topics is None:
            return self
        if len(topics) > max(OVERLAY_MIN, len(shared) // OVERLAY_SHARE):
            # Folded into a new base: one copy of every topic per ~1/OVERLAY_SHARE of them changed.
            folded = dict(shared)
            for topic_id, kept in topics.items():
                if kept is None:
                    folded.pop(topic_id, None)
                else:
                    folded[topic_id] = kept
            return ElrHolders(folded)
        return ElrHolders(shared, topics)


EMPTY_ELR_HOLDERS: Final = ElrHolders({})


def elr_holders_of(image: MetadataImage) -> ElrHolders:
    """``image.elr_holders``, computed by one scan (and kept on the image) when it was built without."""
    holders = image.elr_holders
    if holders is None:
        holders = ElrHolders.scan(image.topics_by_id)
        object.__setattr__(image, "elr_holders", holders)  # a derived cache on a frozen dataclass
    return holders


def next_elr_holders(delta: MetadataDelta) -> ElrHolders | None:
    """The index for ``delta.apply()``'s image: followed from the base image's, or None (computed on first
    use) when the base has none either."""
    base = delta.image.elr_holders
    return None if base is None else base.advance(delta)


def next_elr_holders_steps(delta: MetadataDelta) -> Generator[None, None, ElrHolders | None]:
    """:func:`next_elr_holders`, pausing (yielding) between steps (``MetadataDelta.apply_steps``)."""
    base = delta.image.elr_holders
    if base is None:
        return None
    return (yield from base.advance_steps(delta))
