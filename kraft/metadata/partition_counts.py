"""Per-broker leader and replica counts of an image, maintained incrementally.

DescribeCluster shows each broker's leader and replica counts.  Counting from scratch scans every
partition — about 2 s of event-loop time for 1,000,000 partitions, long enough to stall Raft — so the
counts are kept per topic and only what changed since the last call is recounted: images share unchanged
topics by identity, and a changed big topic shares its untouched chunks (:mod:`kraft.metadata.chunked`),
so a change to k partitions of a 100,000-partition topic costs the chunks it fell into (~1,024
partitions each, compared by identity), not the topic.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from itertools import chain, compress
from operator import attrgetter, is_not

from kraft.metadata.chunked import chunks_of
from kraft.metadata.image import PartitionRegistration, TopicImage

_Chunk = Sequence[PartitionRegistration]


class _TopicCounts:
    """What is counted of one topic: ``chunks`` (by position) and their leader/replica counts.  ``topic``
    is the image's topic once every chunk of it is counted, None while a sliced recount is under way."""

    __slots__ = ("chunks", "leaders", "replicas", "topic")

    def __init__(self) -> None:
        self.topic: TopicImage | None = None
        self.chunks: tuple[_Chunk, ...] = ()
        self.leaders: Counter[int] = Counter()
        self.replicas: Counter[int] = Counter()


_LEADER = attrgetter("leader")
_REPLICAS = attrgetter("replicas")


def _diff(old: _Chunk, new: _Chunk, leaders: Counter[int], replicas: Counter[int]) -> None:
    """Add to ``leaders``/``replicas`` what replacing chunk ``old`` by ``new`` changes (partitions
    compared by identity: a delta builds a new registration only for a partition it changed).  Counted
    with C-level passes (``Counter.update`` of mapped iterables): a new topic's partitions are counted as
    fast as a whole-topic recount was, and a changed chunk costs one identity pass plus its changes."""
    if not old:
        leaders.update(map(_LEADER, new))
        replicas.update(chain.from_iterable(map(_REPLICAS, new)))
        return
    shared = min(len(old), len(new))
    gone = list(compress(old, map(is_not, old, new)))
    came = list(compress(new, map(is_not, old, new)))
    gone.extend(old[shared:])  # partitions never shrink; kept exact anyway
    came.extend(new[shared:])
    leaders.subtract(map(_LEADER, gone))
    replicas.subtract(chain.from_iterable(map(_REPLICAS, gone)))
    leaders.update(map(_LEADER, came))
    replicas.update(chain.from_iterable(map(_REPLICAS, came)))


class PartitionCounts:
    """``update(image.topics_by_id)`` then read ``leaders[broker_id]`` / ``replicas[broker_id]``."""

    def __init__(self) -> None:
        self.leaders: Counter[int] = Counter()
        self.replicas: Counter[int] = Counter()
        self.partitions = 0  # in the counted topics: CreateTopics' placement cursor without an O(topics) sum
        self._topics: Mapping[str, TopicImage] | None = None
        self._per_topic: dict[str, _TopicCounts] = {}

    def update(self, topics_by_id: Mapping[str, TopicImage], limit: int | None = None) -> bool:
        """Recount what changed; with ``limit``, stop once about that many partitions were recounted
        (at a chunk boundary, inside a big topic too) and return False (call again — e.g. after yielding
        to the event loop — to go on; the counts are exact once a call returns True)."""
        if topics_by_id is self._topics:
            return True
        for topic_id in [t for t in self._per_topic if t not in topics_by_id]:
            self._forget(topic_id)
        counted = 0
        for topic_id, topic in topics_by_id.items():
            known = self._per_topic.get(topic_id)
            if known is not None and known.topic is topic:
                continue
            if known is None:
                known = self._per_topic[topic_id] = _TopicCounts()
            new_chunks = chunks_of(topic.partitions)
            old_chunks = known.chunks
            counted_chunks = list(old_chunks)
            leaders: Counter[int] = Counter()
            replicas: Counter[int] = Counter()
            finished = True
            for index, chunk in enumerate(new_chunks):
                old: _Chunk = old_chunks[index] if index < len(old_chunks) else ()
                if old is chunk:
                    continue
                if limit is not None and counted and counted >= limit:
                    finished = False  # at least one chunk per call: every call makes progress
                    break
                _diff(old, chunk, leaders, replicas)
                self.partitions += len(chunk) - len(old)
                counted += len(chunk)
                if index < len(counted_chunks):
                    counted_chunks[index] = chunk
                else:
                    counted_chunks.append(chunk)
            if finished:
                for old in old_chunks[len(new_chunks) :]:
                    _diff(old, (), leaders, replicas)
                    self.partitions -= len(old)
                known.chunks, known.topic = new_chunks, topic
            else:
                known.chunks, known.topic = tuple(counted_chunks), None
            # Counter.update: a new topic's counts are copied at C level; the totals add only the
            # brokers this change touched (a changed chunk's few brokers, not every broker).
            known.leaders.update(leaders)
            known.replicas.update(replicas)
            self.leaders.update(leaders)
            self.replicas.update(replicas)
            if not finished:
                return False
        self._topics = topics_by_id
        return True

    def _forget(self, topic_id: str) -> None:
        known = self._per_topic.pop(topic_id)
        self.partitions -= sum(len(chunk) for chunk in known.chunks)
        self.leaders.subtract(known.leaders)
        self.replicas.subtract(known.replicas)
