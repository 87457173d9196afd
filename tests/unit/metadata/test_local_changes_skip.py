"""``MetadataDelta.local_changes_in_steps`` builds a ``LocalPartition`` only for a partition hosted here now
or in the base image (session 17): the same lists, in the same order, with the same pauses, as the loop
that built one for every changed partition — kept here (``_reference``) as the definition."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import delta as delta_module
from kraft.metadata import records
from kraft.metadata.chunked import CHUNK, ChunkedSequence
from kraft.metadata.delta import LocalPartition, LocalReplicaChanges, MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.v1 import metadata_pb2 as pb

BROKERS = (1, 2, 3, 4)
BIG = CHUNK + 76  # a ChunkedSequence in the image: the base registration read through its indexing
SIZES = {"T0": 3, "T1": 5, "BIG": BIG}


def _reference(
    delta: MetadataDelta, broker_id: int, changes: LocalReplicaChanges, step: int
) -> Iterator[None]:
    """The session-16 loop, verbatim but for ``step`` (a LocalPartition for every changed partition)."""
    for topic_id, removed in delta._removed_topics.items():
        partitions = removed.partitions
        count = len(partitions)
        walk = iter(partitions)
        for start in range(0, count, step):
            for partition_id, partition in zip(range(start, min(start + step, count)), walk, strict=False):
                if broker_id in partition.replicas:
                    changes.deletes.append(LocalPartition(removed.name, topic_id, partition_id, partition))
            yield
    seen = 0
    for topic in delta._topics.values():
        for partition_id, partition in topic.changed.items():
            seen += 1
            if seen % step == 0:
                yield
            local = LocalPartition(topic.name, topic.topic_id, partition_id, partition)
            if broker_id in partition.replicas:
                if partition.leader == broker_id:
                    changes.leaders.append(local)
                else:
                    changes.followers.append(local)
            else:
                before = topic.before(partition_id)
                if before is not None and broker_id in before.replicas:
                    changes.deletes.append(local)


def _replicas(topic: str, partition_id: int) -> list[int]:
    first = (partition_id + len(topic)) % len(BROKERS)
    return [BROKERS[first], BROKERS[(first + 1) % len(BROKERS)]]


def _base() -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    offset = 0
    for name, size in SIZES.items():
        payloads: list[pb.TopicRecord | pb.PartitionRecord] = [
            pb.TopicRecord(name=name.lower(), topic_id=name)
        ]
        for p in range(size):
            replicas = _replicas(name, p)
            payloads.append(
                pb.PartitionRecord(
                    topic_id=name, partition_id=p, replicas=replicas, isr=replicas, leader=replicas[0]
                )
            )
        for payload in payloads:
            delta.replay(records.wrap(payload), offset, 1)
            offset += 1
    assert not delta.replay_errors
    return delta.apply()


BASE = _base()

_TOPICS = st.sampled_from(["T0", "T1", "BIG", "N1", "N2"])
_REPLICAS = st.lists(st.sampled_from(BROKERS), min_size=1, max_size=3, unique=True)
_OPS = st.one_of(
    st.tuples(
        st.just("change"),
        _TOPICS,
        st.integers(0, 7),
        st.none() | _REPLICAS,
        st.none() | st.sampled_from(BROKERS),
    ),
    st.tuples(
        st.just("change"), st.just("BIG"), st.integers(BIG - 40, BIG + 1), st.none() | _REPLICAS, st.none()
    ),
    st.tuples(st.just("partition"), _TOPICS, st.integers(0, 7), _REPLICAS, st.none()),
    st.tuples(st.just("topic"), st.sampled_from(["N1", "N2", "T1"]), st.just(0), st.none(), st.none()),
    st.tuples(st.just("remove"), _TOPICS, st.just(0), st.none(), st.none()),
)


def _payload(op: tuple[str, str, int, list[int] | None, int | None]) -> pb.MetadataRecord:
    kind, topic, partition_id, replicas, leader = op
    if kind == "change":
        change = pb.PartitionChangeRecord(topic_id=topic, partition_id=partition_id)
        if replicas is not None:
            change.replicas.ids[:] = replicas
            change.isr.ids[:] = replicas
            change.leader = replicas[-1]
        if leader is not None:
            change.leader = leader
        return records.wrap(change)
    if kind == "partition":
        assert replicas is not None
        return records.wrap(
            pb.PartitionRecord(
                topic_id=topic, partition_id=partition_id, replicas=replicas, isr=replicas, leader=replicas[0]
            )
        )
    if kind == "topic":
        return records.wrap(pb.TopicRecord(name=topic.lower(), topic_id=topic))
    return records.wrap(pb.RemoveTopicRecord(topic_id=topic))


def _delta(ops: list[tuple[str, str, int, list[int] | None, int | None]]) -> MetadataDelta:
    delta = MetadataDelta(BASE)
    for i, op in enumerate(ops):
        delta.replay(_payload(op), BASE.offset + 1 + i, 1)  # (a record that does not fit is skipped)
    return delta


def _run(steps: Iterator[None]) -> int:
    return sum(1 for _ in steps)


@settings(max_examples=300, deadline=None)
@given(st.lists(_OPS, max_size=30), st.sampled_from((*BROKERS, 9)), st.integers(1, 9))
def test_local_changes_in_steps_equal_the_loop_that_built_every_local_partition(
    ops: list[tuple[str, str, int, list[int] | None, int | None]], broker_id: int, step: int
) -> None:
    delta = _delta(ops)
    expected = LocalReplicaChanges()
    expected_pauses = _run(_reference(delta, broker_id, expected, step))
    changes = LocalReplicaChanges()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(delta_module, "LOCAL_CHANGES_STEP", step)
        pauses = _run(delta.local_changes_in_steps(broker_id, changes))
    assert changes == expected  # same partitions, same order, in each list
    assert pauses == expected_pauses
    for mine, theirs in zip(
        (*changes.deletes, *changes.leaders, *changes.followers),
        (*expected.deletes, *expected.leaders, *expected.followers),
        strict=True,
    ):
        assert mine.registration is theirs.registration


def test_each_branch_is_taken_the_base_read_through_a_chunked_sequence() -> None:
    assert isinstance(BASE.topics_by_id["BIG"].partitions, ChunkedSequence)
    me = 1
    hosted_big = next(p for p in range(BIG - 40, BIG) if me in _replicas("BIG", p))
    ops: list[tuple[str, str, int, list[int] | None, int | None]] = [
        ("change", "BIG", hosted_big, [2, 3], None),  # moved off me: a delete read from the chunked base
        ("partition", "BIG", BIG, [me, 2], None),  # a new partition past the base's end: I lead it
        ("partition", "T1", 5, [3, 4], None),  # past the base's end, not mine: neither (no base read)
        ("change", "T0", 0, None, 4),  # not mine before or after: skipped
        ("topic", "N1", 0, None, None),
        ("partition", "N1", 0, [2, me], None),  # a new topic's partition: I follow
    ]
    delta = _delta(ops)
    assert not delta.replay_errors
    changes = delta.local_changes(me)
    assert [(p.topic_id, p.partition_id) for p in changes.deletes] == [("BIG", hosted_big)]
    assert [(p.topic_id, p.partition_id) for p in changes.leaders] == [("BIG", BIG)]
    assert [(p.topic_id, p.partition_id) for p in changes.followers] == [("N1", 0)]
    expected = LocalReplicaChanges()
    _run(_reference(delta, me, expected, delta_module.LOCAL_CHANGES_STEP))
    assert changes == expected


def test_a_local_partition_cannot_be_changed() -> None:
    delta = _delta([("change", "T0", 0, [1, 2], None)])
    (local,) = delta.local_changes(1).leaders + delta.local_changes(1).followers
    assert (local.topic_name, local.topic_id, local.partition_id) == ("t0", "T0", 0)
    with pytest.raises(AttributeError):
        local.partition_id = 1  # type: ignore[misc]
    with pytest.raises(AttributeError):
        local.registration = BASE.topics_by_id["T0"].partitions[1]  # type: ignore[misc]
