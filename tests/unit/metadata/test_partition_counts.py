"""PartitionCounts: incremental per-broker leader/replica counts equal a full recount after any change."""

from __future__ import annotations

from collections import Counter

from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.metadata.partition_counts import PartitionCounts

REPLICAS = st.lists(st.integers(1, 6), min_size=1, max_size=3, unique=True)
PARTITIONS = st.lists(
    st.builds(
        lambda r, lead: PartitionRegistration(tuple(r), tuple(r), r[0] if lead else -1, 0, 0),
        REPLICAS,
        st.booleans(),
    ),
    max_size=6,
)
TOPIC_MAPS = st.dictionaries(st.sampled_from(["a", "b", "c", "d"]), PARTITIONS, max_size=4)


def _full_count(topics: dict[str, TopicImage]) -> tuple[Counter[int], Counter[int]]:
    image = MetadataImage(0, 0, {}, topics, {}, {}, {})
    leaders: Counter[int] = Counter(p.leader for _, _, p in image.iter_partitions())
    replicas: Counter[int] = Counter(r for _, _, p in image.iter_partitions() for r in p.replicas)
    return leaders, replicas


@settings(max_examples=100, deadline=None)
@given(
    steps=st.lists(TOPIC_MAPS, min_size=1, max_size=6),
    keep=st.lists(st.booleans(), min_size=4, max_size=4),
    limit=st.none() | st.integers(0, 4),
)
def test_incremental_counts_match_a_full_recount(
    steps: list[dict[str, list[PartitionRegistration]]], keep: list[bool], limit: int | None
) -> None:
    counts = PartitionCounts()
    previous: dict[str, TopicImage] = {}
    for step in steps:
        topics: dict[str, TopicImage] = {}
        for index, (topic_id, partitions) in enumerate(sorted(step.items())):
            old = previous.get(topic_id)
            # Unchanged topics are shared by identity between images, as deltas do.
            topics[topic_id] = (
                old if old is not None and keep[index] else TopicImage(topic_id, topic_id, tuple(partitions))
            )
        if limit is None:
            assert counts.update(topics)
        else:  # in slices, as the controller does between event-loop turns
            calls = 1
            while not counts.update(topics, limit):
                calls += 1
                assert calls <= len(topics) + 1
        leaders, replicas = _full_count(topics)
        for broker_id in range(-1, 7):
            assert counts.leaders[broker_id] == leaders[broker_id]
            assert counts.replicas[broker_id] == replicas[broker_id]
        previous = topics
