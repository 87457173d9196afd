"""Per-broker leader and replica counts of an image, maintained incrementally.

DescribeCluster shows each broker's leader and replica counts.  Counting from scratch scans every
partition — about 2 s of event-loop time for 1,000,000 partitions, long enough to stall Raft — so the
counts are kept per topic and only topics that changed since the last call (found by identity: images
share unchanged topics) are recounted.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping

from kraft.metadata.image import TopicImage


def _count(topic: TopicImage) -> tuple[Counter[int], Counter[int]]:
    leaders: Counter[int] = Counter(p.leader for p in topic.partitions)
    replicas: Counter[int] = Counter()
    for partition in topic.partitions:
        replicas.update(partition.replicas)
    return leaders, replicas


class PartitionCounts:
    """``update(image.topics_by_id)`` then read ``leaders[broker_id]`` / ``replicas[broker_id]``."""

    def __init__(self) -> None:
        self.leaders: Counter[int] = Counter()
        self.replicas: Counter[int] = Counter()
        self.partitions = 0  # in the counted topics: CreateTopics' placement cursor without an O(topics) sum
        self._topics: Mapping[str, TopicImage] | None = None
        self._per_topic: dict[str, tuple[TopicImage, Counter[int], Counter[int]]] = {}

    def update(self, topics_by_id: Mapping[str, TopicImage], limit: int | None = None) -> bool:
        """Recount the topics that changed; with ``limit``, stop once about that many partitions were
        recounted and return False (call again — e.g. after yielding to the event loop — to go on; the
        counts are exact once a call returns True)."""
        if topics_by_id is self._topics:
            return True
        for topic_id in [t for t in self._per_topic if t not in topics_by_id]:
            self._forget(topic_id)
        counted = 0
        for topic_id, topic in topics_by_id.items():
            known = self._per_topic.get(topic_id)
            if known is not None and known[0] is topic:
                continue
            if limit is not None and counted and counted >= limit:
                return False  # at least one topic per call: every call makes progress
            if known is not None:
                self._forget(topic_id)
            leaders, replicas = _count(topic)
            self.leaders.update(leaders)
            self.replicas.update(replicas)
            self._per_topic[topic_id] = (topic, leaders, replicas)
            self.partitions += len(topic.partitions)
            counted += len(topic.partitions)
        self._topics = topics_by_id
        return True

    def _forget(self, topic_id: str) -> None:
        topic, leaders, replicas = self._per_topic.pop(topic_id)
        self.partitions -= len(topic.partitions)
        self.leaders.subtract(leaders)
        self.replicas.subtract(replicas)
