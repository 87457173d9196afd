"""PartitionCounts: incremental per-broker leader/replica counts equal a full recount after any change."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import chunked, partition_counts
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


@settings(max_examples=150, deadline=None)
@given(
    initial=st.lists(PARTITIONS, min_size=1, max_size=3),
    steps=st.lists(
        st.lists(st.tuples(st.integers(0, 2), st.integers(0, 30), PARTITIONS.filter(bool)), max_size=4),
        min_size=1,
        max_size=6,
    ),
    limit=st.none() | st.integers(0, 6),
)
def test_chunked_topics_recount_only_changed_chunks_and_match_a_full_recount(
    initial: list[list[PartitionRegistration]],
    steps: list[list[tuple[int, int, list[PartitionRegistration]]]],
    limit: int | None,
) -> None:
    """Big topics (chunks of 4 here) change a few partitions or grow per step, as deltas build them
    (``with_changes`` shares untouched chunks); a recount — in slices that may stop inside a topic —
    equals a full recount, and a topic whose chunks all stayed is not looked at."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(chunked, "SHIFT", 2)
        patch.setattr(chunked, "CHUNK", 4)
        patch.setattr(chunked, "_MASK", 3)
        counts = PartitionCounts()
        topics = {f"t{i}": TopicImage(f"t{i}", f"t{i}", chunked.compact(p)) for i, p in enumerate(initial)}
        for step in [[], *steps]:
            topics = dict(topics)
            for topic_index, position, partitions in step:
                topic_id = f"t{topic_index % len(initial)}"
                topic = topics[topic_id]
                start = min(position, len(topic.partitions))  # change in place or append at the end
                changes = {start + i: p for i, p in enumerate(partitions)}
                topics[topic_id] = TopicImage(
                    topic_id, topic_id, chunked.with_changes(topic.partitions, changes)
                )
            calls = 1
            while not counts.update(topics, limit):
                calls += 1
                assert calls <= sum(len(t.partitions) for t in topics.values()) + 2
            leaders, replicas = _full_count(topics)
            assert counts.partitions == sum(len(t.partitions) for t in topics.values())
            for broker_id in range(-1, 7):
                assert counts.leaders[broker_id] == leaders[broker_id]
                assert counts.replicas[broker_id] == replicas[broker_id]


def test_a_change_to_one_partition_of_a_big_topic_recounts_one_chunk(monkeypatch: pytest.MonkeyPatch) -> None:
    partitions = [PartitionRegistration((1, 2), (1, 2), 1, 0, 0) for _ in range(10 * chunked.CHUNK)]
    topic = TopicImage("big", "big", chunked.compact(partitions))
    counts = PartitionCounts()
    assert counts.update({"big": topic})
    recounted: list[int] = []
    diff = partition_counts._diff

    def counting_diff(*args: Any) -> None:
        recounted.append(len(args[1]))
        diff(*args)

    monkeypatch.setattr(partition_counts, "_diff", counting_diff)
    moved = PartitionRegistration((1, 2), (1, 2), 2, 1, 1)
    changed = TopicImage("big", "big", chunked.with_changes(topic.partitions, {5 * chunked.CHUNK + 3: moved}))
    assert counts.update({"big": changed})
    assert recounted == [chunked.CHUNK]  # the chunk holding the change, not the topic's ten
    assert counts.leaders[1] == 10 * chunked.CHUNK - 1 and counts.leaders[2] == 1
    assert counts.update({"big": changed, "other": TopicImage("other", "other", (moved,))})
    assert recounted == [chunked.CHUNK, 1]
