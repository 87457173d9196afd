"""The image's kept partition count (``MetadataImage.partition_total``) against a walk of every topic,
over random chains of deltas: topics created (below and above a chunk of partitions), grown, changed,
removed and re-created under the same name, the same topic id removed and re-created in one delta, a
live topic's id taken by a new TopicRecord."""

from __future__ import annotations

import dataclasses

from hypothesis import example, given, settings
from hypothesis import strategies as st

from kraft.metadata import records
from kraft.metadata.chunked import CHUNK
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.sharded_map import SPLIT_AT, ShardedMap
from kraft.v1 import metadata_pb2 as pb

NAMES = st.sampled_from(["a", "b", "c", "d"])
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("create"), NAMES, st.sampled_from([1, 3, CHUNK, CHUNK + 5])),
        st.tuples(st.just("grow"), NAMES, st.integers(min_value=1, max_value=CHUNK + 2)),
        st.tuples(st.just("change"), NAMES, st.integers(min_value=0, max_value=CHUNK + 10)),
        st.tuples(st.just("remove"), NAMES, st.just(0)),
        st.tuples(st.just("steal"), NAMES, st.integers(min_value=0, max_value=3)),
        st.tuples(st.just("apply"), st.just(""), st.just(0)),
    ),
    max_size=40,
)


def _walk(image: MetadataImage) -> int:
    return sum(len(topic.partitions) for topic in image.topics_by_id.values())


def _partition(topic_id: str, partition_id: int) -> pb.PartitionRecord:
    return pb.PartitionRecord(topic_id=topic_id, partition_id=partition_id, replicas=[1], isr=[1], leader=1)


@settings(max_examples=150)
@given(OPS)
# Found by hypothesis (session 13): a TopicRecord taking a live id under a new name left the old name
# naming the id, so after the topic's removal a PartitionRecord by the old name hit "unknown topic".
@example(ops=[("create", "a", 1), ("steal", "a", 0), ("remove", "a", 0), ("grow", "a", 1)])
def test_kept_count_equals_the_walk(ops: list[tuple[str, str, int]]) -> None:
    image = MetadataImage.empty()
    assert image.partition_total == 0
    delta = MetadataDelta(image)
    created = 0
    last_ids: dict[str, str] = {}
    for op, name, n in ops:
        topic_id = delta.topic_id(name)
        count = 0
        if topic_id is not None:
            current = delta.partition(topic_id, 0)
            while current is not None:
                count += 1
                current = delta.partition(topic_id, count)
        if op == "create" and topic_id is None:
            created += 1
            # every other creation re-uses the id the name last had (removed: maybe in this very delta)
            new_id = last_ids[name] if created % 2 == 0 and name in last_ids else f"{name}-{created}"
            last_ids[name] = new_id
            delta.replay(records.wrap(pb.TopicRecord(name=name, topic_id=new_id)))
            for partition_id in range(n):
                delta.replay(records.wrap(_partition(new_id, partition_id)))
        elif op == "grow" and topic_id is not None:
            for partition_id in range(count, count + n):
                delta.replay(records.wrap(_partition(topic_id, partition_id)))
        elif op == "change" and topic_id is not None and n < count:
            change = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=n, leader=-1)
            delta.replay(records.wrap(change))
        elif op == "steal" and topic_id is not None:
            # a TopicRecord naming a live topic's id under a new name (a log kraft never writes, which
            # replay still follows: the id's topic is replaced, without a removal)
            created += 1
            delta.replay(records.wrap(pb.TopicRecord(name=f"{name}-stolen-{created}", topic_id=topic_id)))
            for partition_id in range(n):
                delta.replay(records.wrap(_partition(topic_id, partition_id)))
        elif op == "remove" and topic_id is not None:
            delta.replay(records.wrap(pb.RemoveTopicRecord(topic_id=topic_id)))
        elif op == "apply":
            assert not delta.replay_errors, delta.replay_errors
            image = delta.apply()
            assert image.partition_total == _walk(image)
            delta = MetadataDelta(image)
    assert not delta.replay_errors, delta.replay_errors
    image = delta.apply()
    assert image.partition_total is not None and image.partition_total == _walk(image)
    assert image.partition_count() == _walk(image)


def test_an_image_not_built_by_a_delta_counts_once_and_replace_never_carries_a_count() -> None:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.TopicRecord(name="t", topic_id="T")))
    for partition_id in range(3):
        delta.replay(records.wrap(_partition("T", partition_id)))
    built = delta.apply()
    assert built.partition_total == 3
    # replace() never passes the derived count on (the replaced fields may be other topics)
    other = dataclasses.replace(MetadataImage.empty(), topics_by_id=built.topics_by_id)
    assert other.partition_total is None
    assert other.partition_count() == 3 and other.partition_total == 3
    # an image whose count is unknown gives deltas an unknown count too: they count on first use
    delta = MetadataDelta(dataclasses.replace(built, offset=9))
    delta.replay(records.wrap(_partition("T", 3)))
    after = delta.apply()
    assert after.partition_total is None and after.partition_count() == 4


def test_a_delta_past_the_split_keeps_dict_order_and_counts() -> None:
    """A delta of more topics than SPLIT_AT moves its per-topic maps to ShardedMaps mid-replay: the image
    holds the topics in creation order (a removed one gone, a re-created topic last), as with dicts."""
    topics = SPLIT_AT + 700
    delta = MetadataDelta(MetadataImage.empty())
    for t in range(topics):
        delta.replay(records.wrap(pb.TopicRecord(name=f"t{t}", topic_id=f"T{t}")))
        delta.replay(records.wrap(_partition(f"T{t}", 0)))
    assert isinstance(delta._topics, ShardedMap) and isinstance(delta._names, ShardedMap)
    image = delta.apply()
    delta = MetadataDelta(image)
    for t in range(0, topics, 3):
        delta.replay(records.wrap(pb.RemoveTopicRecord(topic_id=f"T{t}")))
    delta.replay(records.wrap(pb.TopicRecord(name="t0", topic_id="again")))
    delta.replay(records.wrap(_partition("again", 0)))
    delta.replay(records.wrap(_partition("again", 1)))
    assert not delta.replay_errors
    after = delta.apply()
    expected = [f"T{t}" for t in range(topics) if t % 3] + ["again"]
    assert list(after.topics_by_id) == expected
    # (the name t0 was unset and set again in the delta: it keeps its place, as a dict key would)
    assert list(after.topic_ids_by_name.values()) == ["again", *expected[:-1]]
    assert after.partition_total == _walk(after) == len(expected) + 1
