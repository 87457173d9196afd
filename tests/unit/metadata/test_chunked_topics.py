"""Topics bigger than one chunk of partitions (kraft.metadata.chunked, 1,024 per chunk) through
MetadataDelta: a delta's image copies only the chunks it touches, every older image stays as it was, the
result equals replaying everything at once, and the image store's saves (which skip shared chunks) load
back equal."""

from __future__ import annotations

from pathlib import Path

from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.clock import ManualClock
from kraft.metadata import records
from kraft.metadata.chunked import CHUNK, ChunkedSequence, chunks_of
from kraft.metadata.delta import LOCAL_CHANGES_STEP, LocalReplicaChanges, MetadataDelta
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.metadata.store import SqliteImageStore
from kraft.v1 import metadata_pb2 as pb

BIG = 2 * CHUNK + 300  # three chunks, the last one partly filled


def _apply(image: MetadataImage, payloads: list[Message]) -> MetadataImage:
    delta = MetadataDelta(image)
    for i, payload in enumerate(payloads):
        delta.replay(records.wrap(payload), image.offset + 1 + i, 1)
    assert not delta.replay_errors, delta.replay_errors
    return delta.apply()


def _replicas(partition_id: int) -> list[int]:
    return [partition_id % 5 + 1, (partition_id + 1) % 5 + 1, (partition_id + 2) % 5 + 1]


def _partitions(first: int, count: int) -> list[Message]:
    return [
        pb.PartitionRecord(
            partition_id=p, topic_id="B", replicas=_replicas(p), isr=_replicas(p), leader=_replicas(p)[0]
        )
        for p in range(first, first + count)
    ]


def _big_topic(count: int = BIG) -> MetadataImage:
    return _apply(MetadataImage.empty(), [pb.TopicRecord(name="big", topic_id="B"), *_partitions(0, count)])


def _topic(image: MetadataImage) -> TopicImage:
    topic = image.topic("big")
    assert topic is not None
    return topic


def test_a_slice_appended_to_a_big_topic_shares_every_full_chunk() -> None:
    image = _big_topic()
    before = _topic(image)
    kept = tuple(before.partitions)
    grown = _apply(image, _partitions(BIG, 1000))
    after = _topic(grown)
    assert len(after.partitions) == BIG + 1000 and len(before.partitions) == BIG
    assert tuple(before.partitions) == kept  # the old image is unchanged
    old_chunks, new_chunks = chunks_of(before.partitions), chunks_of(after.partitions)
    assert new_chunks[0] is old_chunks[0] and new_chunks[1] is old_chunks[1]  # untouched: shared
    assert new_chunks[2] is not old_chunks[2]  # the partly filled chunk took the first appended ones
    assert after.partitions[:BIG] == kept
    assert [p.replicas for p in after.partitions[BIG:]] == [
        tuple(_replicas(p)) for p in range(BIG, BIG + 1000)
    ]


def test_a_partition_change_on_a_big_topic_replaces_one_chunk_only() -> None:
    image = _big_topic()
    before = _topic(image)
    target = CHUNK + 7
    old_registration = before.partitions[target]
    changed = _apply(
        image, [pb.PartitionChangeRecord(topic_id="B", partition_id=target, leader=_replicas(target)[1])]
    )
    after = _topic(changed)
    assert after.partitions[target].leader == _replicas(target)[1]
    assert after.partitions[target].leader_epoch == old_registration.leader_epoch + 1
    assert before.partitions[target] is old_registration  # the older image still has the old one
    old_chunks, new_chunks = chunks_of(before.partitions), chunks_of(after.partitions)
    assert new_chunks[0] is old_chunks[0] and new_chunks[2] is old_chunks[2]
    assert new_chunks[1] is not old_chunks[1]
    assert all(
        new is old for i, (new, old) in enumerate(zip(new_chunks[1], old_chunks[1], strict=True)) if i != 7
    )
    # images and topics compare by content, whatever the chunks' identity
    assert changed != image and _apply(image, []) == image
    assert TopicImage("big", "B", tuple(after.partitions)) == after


@st.composite
def deltas(draw: st.DrawFn) -> list[list[tuple[str, int, int]]]:
    """Deltas of appends ("add", count) and leader changes ("change", partition seed, leader)."""
    out = []
    for _ in range(draw(st.integers(1, 6))):
        ops = draw(
            st.lists(
                st.one_of(
                    st.tuples(st.just("add"), st.integers(1, 700), st.just(0)),
                    st.tuples(st.just("change"), st.integers(0, 10**6), st.integers(1, 5)),
                ),
                max_size=6,
            )
        )
        out.append(ops)
    return out


@settings(max_examples=40, deadline=None)
@given(st.integers(1, BIG), deltas())
def test_images_follow_a_plain_list_model_and_older_images_never_change(
    initial: int, plan: list[list[tuple[str, int, int]]]
) -> None:
    image = _big_topic(initial)
    model: list[PartitionRegistration] = list(_topic(image).partitions)
    history = [(image, list(model))]
    everything: list[Message] = []
    for ops in plan:
        payloads: list[Message] = []
        for op, a, b in ops:
            if op == "add":
                payloads.extend(_partitions(len(model), a))
                for p in range(len(model), len(model) + a):
                    model.append(
                        PartitionRegistration(tuple(_replicas(p)), tuple(_replicas(p)), _replicas(p)[0], 0, 0)
                    )
            else:
                p = a % len(model)
                payloads.append(pb.PartitionChangeRecord(topic_id="B", partition_id=p, leader=b))
                old = model[p]
                model[p] = old._replace(
                    leader=b, leader_epoch=old.leader_epoch + 1, partition_epoch=old.partition_epoch + 1
                )
        image = _apply(image, payloads)
        everything.extend(payloads)
        topic = _topic(image)
        assert list(topic.partitions) == model
        assert topic.partitions == ChunkedSequence(model) == tuple(model)
        assert isinstance(topic.partitions, tuple) == (len(model) <= CHUNK)  # compact: a tuple up to a chunk
        history.append((image, list(model)))
    for old_image, snapshot in history:
        assert list(_topic(old_image).partitions) == snapshot
    # the same records in one delta give the same topic
    at_once = _apply(_big_topic(initial), everything)
    assert _topic(at_once) == _topic(image)


def test_removing_a_big_topic_finds_the_broker_deletes_in_bounded_steps() -> None:
    image = _big_topic()
    delta = MetadataDelta(image)
    delta.replay(records.wrap(pb.RemoveTopicRecord(topic_id="B")), image.offset + 1, 1)
    changes = LocalReplicaChanges()
    steps = sum(1 for _ in delta.local_changes_in_steps(1, changes))
    assert steps == -(-BIG // LOCAL_CHANGES_STEP)
    expected = [p for p in range(BIG) if 1 in _replicas(p)]
    assert [d.partition_id for d in changes.deletes] == expected
    assert all(d.registration is _topic(image).partitions[d.partition_id] for d in changes.deletes)


async def test_saves_of_a_big_topic_changed_in_a_few_chunks_load_back_equal(tmp_path: Path) -> None:
    path = tmp_path / "image.sqlite"
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        image = _big_topic()
        await store.save(image)
        image = _apply(
            image,
            [
                pb.PartitionChangeRecord(topic_id="B", partition_id=3, leader=_replicas(3)[1]),
                # an ELR row appears (ISR below min), in the last chunk
                pb.PartitionChangeRecord(
                    topic_id="B",
                    partition_id=BIG - 1,
                    isr=pb.BrokerIdList(ids=_replicas(BIG - 1)[:1]),
                    eligible_leader_replicas=pb.BrokerIdList(ids=_replicas(BIG - 1)[1:2]),
                ),
                *_partitions(BIG, 900),
            ],
        )
        await store.save(image)
        # the ELR row goes again; a partition of the middle chunk changes
        image = _apply(
            image,
            [
                pb.PartitionChangeRecord(
                    topic_id="B",
                    partition_id=BIG - 1,
                    isr=pb.BrokerIdList(ids=_replicas(BIG - 1)),
                    eligible_leader_replicas=pb.BrokerIdList(ids=[]),
                ),
                pb.PartitionChangeRecord(
                    topic_id="B", partition_id=CHUNK + 1, leader=_replicas(CHUNK + 1)[2]
                ),
            ],
        )
        await store.save(image)
    finally:
        await store.close()
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        loaded = await store.load()
    finally:
        await store.close()
    assert loaded == image
    assert list(_topic(loaded).partitions) == list(_topic(image).partitions)
