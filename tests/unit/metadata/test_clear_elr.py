"""ClearElrRecord (KIP-966) against what it replaces: one PartitionChangeRecord per partition holding an
ELR or last known ELR (empty ELR and/or LKE, both epochs bumped), for any image, any records replayed
before it in the same delta, a named topic or every topic without its own min.insync.replicas; and the
image's ElrHolders index (what that replay visits) against a full scan, delta after delta, through
snapshots and the image store."""

from __future__ import annotations

import asyncio
import functools
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_fakes import CostClock, LoopTurns

from kraft.clock import ManualClock
from kraft.metadata import elr_holders as elr_holders_module
from kraft.metadata import records
from kraft.metadata.commit_replay import replay_batch
from kraft.metadata.delta import CLEAR_ELR_STEP, LocalPartition, MetadataDelta, make_partition, shared_ids
from kraft.metadata.election_config import MIN_INSYNC_REPLICAS
from kraft.metadata.elr_holders import ElrHolders, elr_holders_of
from kraft.metadata.image import MetadataImage, PartitionRegistration
from kraft.metadata.image_records import image_records
from kraft.metadata.records import ConfigResourceType
from kraft.metadata.store import SqliteImageStore
from kraft.raft.api import CommittedBatch, CommittedRecord
from kraft.v1 import metadata_pb2 as pb

TOPIC_IDS = ["t0", "t1", "t2", "t3"]
ID_LISTS = st.lists(st.integers(0, 4), max_size=3)


def _name(topic_id: str) -> str:
    return f"n{topic_id}"


# The strategies the composites draw from, built once: one built inside a composite is a new object at
# every draw, which Hypothesis validates again each time (sampled_from of a list and a composite's call
# are never cached by Hypothesis).  The same strategies: the same examples.
_UNCLEAN_EPOCHS = st.sampled_from([0, 3])
_TOPIC_ID_DRAWS = st.sampled_from(TOPIC_IDS)
_LATER_KINDS = st.sampled_from(["change", "change", "change", "partition", "config", "remove", "topic"])
_CLEAR_NAMES = st.sampled_from(["", "", *map(_name, TOPIC_IDS)])
_STEP_KINDS = st.sampled_from(
    ["isr", "isr", "isr", "elr", "set", "set", "append", "remove", "recreate", "clear"]
)


@functools.cache
def partition_record(topic_id: str, partition_id: int) -> st.SearchStrategy[pb.MetadataRecord]:
    """One strategy per partition (see above)."""
    return _partition_record(topic_id, partition_id)


@functools.cache
def topic_records(topic_id: str, name: str) -> st.SearchStrategy[list[pb.MetadataRecord]]:
    return _topic_records(topic_id, name)


@st.composite
def _partition_record(draw: st.DrawFn, topic_id: str, partition_id: int) -> pb.MetadataRecord:
    holds = draw(st.integers(0, 2))  # a third without, the rest with an ELR and/or an LKE
    return records.wrap(
        pb.PartitionRecord(
            topic_id=topic_id,
            partition_id=partition_id,
            replicas=[1, 2, 3],
            isr=draw(ID_LISTS),
            leader=draw(st.integers(-1, 3)),
            leader_epoch=draw(st.integers(0, 5)),
            partition_epoch=draw(st.integers(0, 5)),
            eligible_leader_replicas=draw(ID_LISTS) if holds else [],
            last_known_elr=draw(ID_LISTS) if holds else [],
            leader_recovery_state=draw(st.integers(0, 1)),
            last_unclean_leader_epoch=draw(_UNCLEAN_EPOCHS),
        )
    )


@st.composite
def _topic_records(draw: st.DrawFn, topic_id: str, name: str) -> list[pb.MetadataRecord]:
    created = [records.wrap(pb.TopicRecord(name=name, topic_id=topic_id))]
    for partition_id in range(draw(st.integers(0, 5))):
        created.append(draw(partition_record(topic_id, partition_id)))
    return created


@st.composite
def later_records(draw: st.DrawFn) -> list[pb.MetadataRecord]:
    """What may precede the clear in the same delta: changes setting or clearing ELRs, new partitions,
    topic configs, removals and re-creations."""
    topic_id = draw(_TOPIC_ID_DRAWS)
    kind = draw(_LATER_KINDS)
    if kind == "remove":
        return [records.wrap(pb.RemoveTopicRecord(topic_id=topic_id))]
    if kind == "topic":  # a re-creation under a new id (the old name, if it is free)
        return draw(topic_records(f"{topic_id}-new", _name(topic_id)))
    if kind == "config":
        config = pb.ConfigRecord(
            resource_type=ConfigResourceType.TOPIC, resource_name=_name(topic_id), name=MIN_INSYNC_REPLICAS
        )
        if draw(st.booleans()):
            config.value = "2"
        return [records.wrap(config)]
    partition_id = draw(st.integers(0, 5))  # past the end: a replay error on both sides, or a new one
    if kind == "partition":
        return [draw(partition_record(topic_id, partition_id))]
    change = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=partition_id)
    if draw(st.booleans()):
        change.eligible_leader_replicas.SetInParent()
        change.eligible_leader_replicas.ids.extend(draw(ID_LISTS))
    if draw(st.booleans()):
        change.last_known_elr.SetInParent()
        change.last_known_elr.ids.extend(draw(ID_LISTS))
    if draw(st.booleans()):
        change.leader = draw(st.integers(-1, 3))
    return [records.wrap(change)]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[list[pb.MetadataRecord], list[pb.MetadataRecord], str]:
    base: list[pb.MetadataRecord] = []
    for topic_id in TOPIC_IDS:
        if draw(st.integers(0, 4)):
            base.extend(draw(topic_records(topic_id, _name(topic_id))))
            if draw(st.booleans()):  # the topic's own minimum (hides the cluster-wide default)
                base.append(
                    records.wrap(
                        pb.ConfigRecord(
                            resource_type=ConfigResourceType.TOPIC,
                            resource_name=_name(topic_id),
                            name=MIN_INSYNC_REPLICAS,
                            value="2",
                        )
                    )
                )
    before: list[pb.MetadataRecord] = []
    for _ in range(draw(st.integers(0, 6))):
        before.extend(draw(later_records()))
    topic_name = draw(_CLEAR_NAMES)
    return base, before, topic_name


def _replay(image: MetadataImage, batch: list[pb.MetadataRecord]) -> MetadataDelta:
    delta = MetadataDelta(image)
    for offset, record in enumerate(batch, image.offset + 1):
        delta.replay(record, offset, 1)
    return delta


def per_partition_changes(image: MetadataImage, topic_name: str) -> list[pb.MetadataRecord]:
    """The oracle: the records ControllerLogic.clear_elr wrote before ClearElrRecord, on the image the
    clear applies to (a named topic; no name: every topic without its own min.insync.replicas)."""
    if topic_name:
        topic = image.topic(topic_name)
        topics = [] if topic is None else [topic]
    else:
        topics = [
            t for t in image.topics_by_id.values() if MIN_INSYNC_REPLICAS not in image.topic_configs(t.name)
        ]
    written = []
    for topic in topics:
        for partition_id, partition in enumerate(topic.partitions):
            change = pb.PartitionChangeRecord(topic_id=topic.topic_id, partition_id=partition_id)
            if partition.elr:
                change.eligible_leader_replicas.SetInParent()
            if partition.last_known_elr:
                change.last_known_elr.SetInParent()
            if partition.elr or partition.last_known_elr:
                written.append(records.wrap(change))
    return written


def _where(local: LocalPartition) -> tuple[str, int]:
    return local.topic_id, local.partition_id


def _assert_index_follows(image: MetadataImage) -> None:
    """The image's index (followed delta by delta, or computed on first use) is what a scan finds."""
    assert elr_holders_of(image) == ElrHolders.scan(image.topics_by_id)


@settings(max_examples=400, deadline=None)
@given(scenario=scenarios(), index_on_base=st.booleans(), stepped=st.booleans())
def test_a_clear_elr_record_gives_what_the_per_partition_records_gave(
    scenario: tuple[list[pb.MetadataRecord], list[pb.MetadataRecord], str], index_on_base: bool, stepped: bool
) -> None:
    base_records, before, topic_name = scenario
    base = _replay(MetadataImage.empty(), base_records).apply()
    assert base.elr_holders is not None  # followed from the empty image's
    _assert_index_follows(base)
    if not index_on_base:  # an image built without the index (computed by a scan on first use)
        base = MetadataImage(
            base.offset,
            base.epoch,
            base.brokers,
            base.topics_by_id,
            base.topic_ids_by_name,
            base.configs,
            base.features,
        )
    clear = records.wrap(pb.ClearElrRecord(topic_name=topic_name))
    if stepped:  # as follower controllers and brokers replay it: in steps
        new = _replay(base, before)
        for _ in new.replay_steps(clear, base.offset + len(before) + 1, 1):
            pass
    else:
        new = _replay(base, [*before, clear])
    # the oracle: the same records before, applied, then one change per partition holding one
    old_first = _replay(base, before)
    view = old_first.apply()
    changes = per_partition_changes(view, topic_name)
    old = _replay(view, changes)
    unknown = bool(topic_name) and view.topic(topic_name) is None
    assert new.replay_errors == old_first.replay_errors + (
        [f"ELR clear of unknown topic {topic_name}"] if unknown else []
    )
    assert old.replay_errors == []
    got, expected = new.apply(), old.apply()
    assert got.topics_by_id == expected.topics_by_id
    # everything else too (names, configs, …); the offsets differ by the records written
    assert replace(got, offset=0, epoch=0) == replace(expected, offset=0, epoch=0)
    if index_on_base:
        assert got.elr_holders is not None and expected.elr_holders is not None  # followed, not scanned
    _assert_index_follows(got)
    _assert_index_follows(expected)
    if not before:  # the clear alone: the same local work for each broker as the records gave
        for broker_id in (1, 2, 3):
            mine, theirs = new.local_changes(broker_id), old.local_changes(broker_id)
            for kind in ("deletes", "leaders", "followers"):
                assert sorted(getattr(mine, kind), key=_where) == sorted(getattr(theirs, kind), key=_where)


@settings(max_examples=300, deadline=None)
@given(
    batches=st.lists(st.lists(later_records(), max_size=4), min_size=1, max_size=8),
    data=st.data(),
    bulk_from=st.sampled_from([1, 2, elr_holders_module.BULK_CHANGES]),
)
def test_the_index_follows_every_delta_as_a_full_scan_would(
    batches: list[list[list[pb.MetadataRecord]]], data: st.DataObject, bulk_from: int
) -> None:
    """Both ways of following a changed topic (a step per partition; set operations per chunk from
    ``BULK_CHANGES`` changed partitions, lowered here so small topics take it too)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(elr_holders_module, "BULK_CHANGES", bulk_from)
        image = _replay(MetadataImage.empty(), data.draw(scenarios())[0]).apply()
        for batch in batches:
            flat = [record for group in batch for record in group]
            if data.draw(st.booleans()):
                name = data.draw(st.sampled_from(["", "nt0"]))
                flat.append(records.wrap(pb.ClearElrRecord(topic_name=name)))
            image = _replay(image, flat).apply()
            _assert_index_follows(image)


_BIG_IDS = st.lists(st.integers(1, 4), max_size=2)


@st.composite
def _registration_of(draw: st.DrawFn, current: PartitionRegistration | None) -> PartitionRegistration:
    """What the controller hands ``MetadataDelta.set_partition``: the next registration of a partition,
    holding an ELR / LKE or not (often neither, as most controller changes)."""
    replicas = current.replicas if current is not None else shared_ids([1, 2, 3])
    holds = draw(st.integers(0, 3)) == 0
    return make_partition(
        replicas,
        shared_ids(draw(_BIG_IDS)),
        draw(st.integers(-1, 3)),
        (current.leader_epoch + 1) if current is not None else 0,
        (current.partition_epoch + 1) if current is not None else 0,
        shared_ids(draw(_BIG_IDS)) if holds and draw(st.booleans()) else (),
        shared_ids(draw(_BIG_IDS)) if holds and draw(st.booleans()) else (),
    )


@st.composite
def _big_topic_step(draw: st.DrawFn, delta: MetadataDelta, sizes: dict[str, int], made: list[str]) -> None:
    """One random step on ``delta`` through each way a partition changes: a replayed PartitionChange
    (ISR-only mostly; sometimes setting or emptying the ELR / LKE), the controller's ``set_partition``,
    a new partition, a removal, a re-creation, a ClearElrRecord."""
    topic_id = draw(st.sampled_from(sorted(sizes)))
    size = sizes[topic_id]
    kind = draw(_STEP_KINDS)
    if kind == "remove":
        delta.replay(records.wrap(pb.RemoveTopicRecord(topic_id=topic_id)))
        sizes.pop(topic_id)
        return
    if kind == "recreate":  # a new id, under a name nobody held
        new_id = f"r{len(made)}"
        made.append(new_id)
        delta.replay(records.wrap(pb.TopicRecord(name=f"n{new_id}", topic_id=new_id)))
        sizes[new_id] = 0
        for _ in range(draw(st.integers(0, 9))):
            delta.replay(draw(partition_record(new_id, sizes[new_id])))
            sizes[new_id] += 1
        return
    if kind == "clear":
        delta.replay(records.wrap(pb.ClearElrRecord(topic_name=draw(st.sampled_from(["", _name(topic_id)])))))
        return
    if kind == "append" or not size:
        delta.replay(draw(partition_record(topic_id, size)))
        sizes[topic_id] = size + 1
        return
    # several partitions of the topic, spread over its chunks
    for partition_id in draw(st.lists(st.integers(0, size - 1), min_size=1, max_size=6)):
        if kind == "set":
            current = delta.partition(topic_id, partition_id)
            assert delta.set_partition(topic_id, partition_id, draw(_registration_of(current)))
            continue
        change = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=partition_id)
        change.isr.ids.extend(draw(_BIG_IDS))
        if kind == "elr":
            if draw(st.booleans()):
                change.eligible_leader_replicas.SetInParent()
                change.eligible_leader_replicas.ids.extend(draw(_BIG_IDS))
            if draw(st.booleans()):
                change.last_known_elr.SetInParent()
                change.last_known_elr.ids.extend(draw(_BIG_IDS))
        delta.replay(records.wrap(change))


@settings(max_examples=300, deadline=None)
@given(
    data=st.data(),
    chunk_bits=st.sampled_from([0, 1, 2, elr_holders_module.CHUNK_BITS]),
    bulk_from=st.sampled_from([1, 4, elr_holders_module.BULK_CHANGES]),
    deltas=st.integers(1, 8),
)
def test_the_index_equals_a_brute_force_scan_after_random_changes_through_every_path(
    data: st.DataObject, chunk_bits: int, bulk_from: int, deltas: int
) -> None:
    """Topics spanning several chunks (chunks shrunk to 1-4 ids here), changed delta after delta by
    replayed records and the controller's ``set_partition``: the index each ``apply()`` follows (taking
    the no-ELR shortcut where no changed partition holds one) equals a full scan of the image."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(elr_holders_module, "CHUNK_BITS", chunk_bits)
        patch.setattr(elr_holders_module, "BULK_CHANGES", bulk_from)
        delta = MetadataDelta(MetadataImage.empty())
        sizes: dict[str, int] = {}
        made: list[str] = []
        for topic_id in ("b0", "b1", "b2"):
            delta.replay(records.wrap(pb.TopicRecord(name=_name(topic_id), topic_id=topic_id)))
            sizes[topic_id] = data.draw(st.integers(0, 12))
            for partition_id in range(sizes[topic_id]):
                delta.replay(data.draw(partition_record(topic_id, partition_id)))
        image = delta.apply()
        _assert_index_follows(image)
        for _ in range(deltas):
            delta = MetadataDelta(image)
            for _ in range(data.draw(st.integers(1, 5))):
                if not sizes:
                    break
                data.draw(_big_topic_step(delta, sizes, made))
            assert delta.replay_errors == []
            image = delta.apply()
            assert image.elr_holders is not None  # followed, not scanned
            _assert_index_follows(image)


@pytest.mark.parametrize("bulk_from", [1, elr_holders_module.BULK_CHANGES])
def test_chunks_far_apart_are_kept_and_dropped_one_by_one(
    bulk_from: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Partition ids in several chunks of a big topic: a change copies only the chunks it touches (the
    others are the very same frozensets), and a chunk left empty disappears."""
    monkeypatch.setattr(elr_holders_module, "BULK_CHANGES", bulk_from)
    chunk = elr_holders_module.CHUNK
    size = 3 * chunk + 5
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.TopicRecord(name="big", topic_id="B")))
    holders = {3, chunk + 1, 2 * chunk + 7, 3 * chunk + 4}
    for partition_id in range(size):
        delta.replay(
            records.wrap(
                pb.PartitionRecord(
                    topic_id="B",
                    partition_id=partition_id,
                    replicas=[1, 2],
                    isr=[2],
                    leader=2,
                    eligible_leader_replicas=[1] if partition_id in holders else [],
                )
            )
        )
    image = delta.apply()
    index = elr_holders_of(image)
    assert index.partition_ids("B") == sorted(holders) and index.topic_count("B") == 4
    delta = MetadataDelta(image)
    change = pb.PartitionChangeRecord(topic_id="B", partition_id=chunk + 1)
    change.eligible_leader_replicas.SetInParent()
    delta.replay(records.wrap(change))
    grown = pb.PartitionChangeRecord(topic_id="B", partition_id=chunk + 2)
    grown.last_known_elr.ids.append(1)
    delta.replay(records.wrap(grown))
    after = delta.apply()
    moved = elr_holders_of(after)
    assert moved.partition_ids("B") == sorted(holders - {chunk + 1} | {chunk + 2})
    assert moved == ElrHolders.scan(after.topics_by_id)
    old_chunks, new_chunks = index._topics["B"], moved._topics["B"]
    assert all(new_chunks[c] is old_chunks[c] for c in (0, 2, 3))  # untouched: shared
    delta = MetadataDelta(after)
    delta.replay(records.wrap(pb.ClearElrRecord(topic_name="big")))
    cleared = delta.apply()
    index = elr_holders_of(cleared)
    assert index.topic_count("B") == 0 and "B" not in set(index.topic_ids())
    assert all(not (p.elr or p.last_known_elr) for p in cleared.topics_by_id["B"].partitions)
    # an untouched partition is the very same object; a cleared one has both epochs bumped
    assert cleared.topics_by_id["B"].partitions[0] is after.topics_by_id["B"].partitions[0]
    bumped = cleared.topics_by_id["B"].partitions[3]
    assert (bumped.leader_epoch, bumped.partition_epoch) == (1, 1)


def test_an_unknown_topic_is_a_replay_error_and_a_clear_without_holders_changes_nothing() -> None:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.TopicRecord(name="a", topic_id="A")))
    delta.replay(
        records.wrap(pb.PartitionRecord(topic_id="A", partition_id=0, replicas=[1], isr=[1], leader=1))
    )
    image = delta.apply()
    delta = MetadataDelta(image)
    delta.replay(records.wrap(pb.ClearElrRecord(topic_name="nope")))
    assert delta.replay_errors == ["ELR clear of unknown topic nope"]
    delta = MetadataDelta(image)
    delta.replay(records.wrap(pb.ClearElrRecord(topic_name="a")))
    delta.replay(records.wrap(pb.ClearElrRecord()))
    assert delta.replay_errors == [] and list(delta.changed_topics()) == []
    assert delta.apply().topics_by_id is image.topics_by_id


def _elr_image() -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for topic_id, name in (("A", "a"), ("O", "o")):
        delta.replay(records.wrap(pb.TopicRecord(name=name, topic_id=topic_id)))
        for partition_id in range(4):
            delta.replay(
                records.wrap(
                    pb.PartitionRecord(
                        topic_id=topic_id,
                        partition_id=partition_id,
                        replicas=[1, 2, 3],
                        isr=[3],
                        leader=3,
                        leader_epoch=2,
                        partition_epoch=2,
                        eligible_leader_replicas=[1] if partition_id % 2 else [],
                        last_known_elr=[2] if partition_id < 2 else [],
                    )
                )
            )
    own = pb.ConfigRecord(resource_type=ConfigResourceType.TOPIC, resource_name="o", name=MIN_INSYNC_REPLICAS)
    own.value = "2"
    delta.replay(records.wrap(own), 40, 1)
    return delta.apply()


@pytest.mark.parametrize("topic_name", ["", "a", "o"])
def test_a_cleared_image_round_trips_through_snapshot_records_and_the_image_store(
    tmp_path: Path, topic_name: str
) -> None:
    image = _elr_image()
    delta = MetadataDelta(image)
    delta.replay(records.wrap(pb.ClearElrRecord(topic_name=topic_name)), 41, 1)
    cleared = delta.apply()
    assert cleared != image
    # a snapshot (what brokers and followers load) rebuilds the same image and the same index
    loaded = _replay(MetadataImage.empty(), list(image_records(cleared))).apply()
    assert loaded.topics_by_id == cleared.topics_by_id
    _assert_index_follows(loaded)

    async def scenario() -> None:
        path = tmp_path / "store.sqlite"
        store = await SqliteImageStore.open(path, clock=ManualClock())
        await store.save(image)
        await store.save(cleared)  # the cleared rows leave the side table, the checksum still holds
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        again = await store.load()
        assert store.discarded is None
        assert again == cleared
        assert again.elr_holders is not None  # loaded from the partition_elr rows, not scanned
        _assert_index_follows(again)
        # and a later clear on the loaded image (index from the store) clears what is left
        more = MetadataDelta(again)
        more.replay(records.wrap(pb.ClearElrRecord()), 42, 1)
        more.replay(records.wrap(pb.ClearElrRecord(topic_name="o")), 43, 1)
        final = more.apply()
        assert all(not (p.elr or p.last_known_elr) for _, _, p in final.iter_partitions())
        await store.save(final)
        await store.close()
        store = await SqliteImageStore.open(path, clock=ManualClock())
        assert await store.load() == final and store.discarded is None
        await store.close()

    asyncio.run(scenario())


def test_the_record_is_shown_by_metadata_dump() -> None:
    shown = records.describe_value(records.encode_value(records.wrap(pb.ClearElrRecord(topic_name="a"))))
    assert shown == {"type": "ClearElrRecord", "api_key": 28, "version": 0, "data": {"topic_name": "a"}}


def _many_holders(partitions: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.TopicRecord(name="big", topic_id="B")), 0, 1)
    for partition_id in range(partitions):
        delta.replay(
            records.wrap(
                pb.PartitionRecord(
                    topic_id="B",
                    partition_id=partition_id,
                    replicas=[1, 2, 3],
                    isr=[1],
                    leader=1,
                    eligible_leader_replicas=[2],
                    last_known_elr=[3] if partition_id % 2 else [],
                )
            ),
            partition_id + 1,
            1,
        )
    return delta.apply()


def test_a_clear_of_many_partitions_is_replayed_in_steps() -> None:
    image = _many_holders(3 * CLEAR_ELR_STEP + 1)
    delta = MetadataDelta(image)
    steps = delta.replay_steps(records.wrap(pb.ClearElrRecord(topic_name="big")), 9000, 2)
    next(steps)  # the first step cleared one step's worth, not the topic
    assert sum(1 for p in delta.changed_topics() for _ in p[2]) == CLEAR_ELR_STEP
    assert sum(1 for _ in steps) == 3
    stepped = delta.apply()
    assert (stepped.offset, stepped.epoch) == (9000, 2)
    at_once = MetadataDelta(image)
    at_once.replay(records.wrap(pb.ClearElrRecord(topic_name="big")), 9000, 2)
    assert stepped == at_once.apply()
    assert not any(p.elr or p.last_known_elr for _, _, p in stepped.iter_partitions())
    # any other record: replayed at once, nothing to step through
    other = MetadataDelta(image)
    assert list(other.replay_steps(records.wrap(pb.NoOpRecord()), 9001, 2)) == []
    assert other.offset == 9001


async def _replay_turns(
    image: MetadataImage, batch: CommittedBatch, clock: ManualClock, budget_ms: int
) -> tuple[MetadataImage, int]:
    loop = LoopTurns()
    replayed = await loop.during(replay_batch(image, batch, clock, budget_ms))
    replayed.check(batch.last_offset)
    return replayed.image, loop.turns


def test_a_follower_controller_replays_a_big_clear_over_several_loop_turns() -> None:
    """commit_replay: the ConfigRecord and one ClearElrRecord of 2,000 partitions are one batch of two
    records, yet the loop gets turns in the middle of the clear (each step counts as CLEAR_ELR_STEP
    records against the slice); the image is the one replay gives at once."""
    image = _many_holders(2000)
    config = pb.ConfigRecord(
        resource_type=ConfigResourceType.TOPIC, resource_name="big", name=MIN_INSYNC_REPLICAS
    )
    config.value = "1"
    written = [records.wrap(config), records.wrap(pb.ClearElrRecord(topic_name="big"))]
    base = image.offset + 1
    batch = CommittedBatch(
        base,
        base + 1,
        1,
        [CommittedRecord(base + i, records.encode_value(r)) for i, r in enumerate(written)],
        0,
    )
    at_once = _replay(image, written).apply()

    async def scenario() -> None:
        for clock, budget_ms in ((ManualClock(), 0), (CostClock(1), 5)):
            replayed, turns = await _replay_turns(image, batch, clock, budget_ms)
            assert replayed == at_once
            assert turns >= 2000 // CLEAR_ELR_STEP, turns

    asyncio.run(scenario())


def test_a_fence_of_one_partition_topics_in_slices_keeps_every_index_exact_and_shares_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A fence's shape (session 20): many one-partition topics, a slice of them entering the ELR per
    delta, then leaving it.  After each slice the new index is a scan's, the base image's index is
    still its own image's scan (a delta's base stays valid: no index's dicts are edited), and every
    topic the slice left alone keeps its very chunk map (shared, not copied).  A small overlay bound,
    so that slices land in the overlay and folds into a new base both happen."""
    monkeypatch.setattr(elr_holders_module, "OVERLAY_MIN", 8)
    topics = 40
    delta = MetadataDelta(MetadataImage.empty())
    for t in range(topics):
        delta.replay(records.wrap(pb.TopicRecord(name=f"n{t}", topic_id=f"T{t}")))
        delta.replay(
            records.wrap(pb.PartitionRecord(topic_id=f"T{t}", partition_id=0, replicas=[1, 2], isr=[1, 2]))
        )
    image = delta.apply()
    images = [image]
    for elr in ([1], []):  # into the ELR, then out of it (ISR back)
        for start in range(0, topics, 7):
            delta = MetadataDelta(image)
            for t in range(start, min(start + 7, topics)):
                change = pb.PartitionChangeRecord(topic_id=f"T{t}", partition_id=0)
                change.eligible_leader_replicas.SetInParent()
                change.eligible_leader_replicas.ids.extend(elr)
                delta.replay(records.wrap(change))
            after = delta.apply()
            before, now = elr_holders_of(image), elr_holders_of(after)
            assert after.elr_holders is not None  # followed from the base's, not scanned
            assert now == ElrHolders.scan(after.topics_by_id)
            touched = {f"T{t}" for t in range(start, start + 7)}
            assert all(now._topics[t] is before._topics[t] for t in before.topic_ids() if t not in touched)
            images.append(after)
            image = after
    for seen in images:  # every index still the scan of its own image
        assert elr_holders_of(seen) == ElrHolders.scan(seen.topics_by_id)
    assert elr_holders_of(images[len(images) // 2]).count() == topics and elr_holders_of(image).count() == 0
    indexes = [elr_holders_of(seen) for seen in images]
    assert any(index._overlay for index in indexes)  # slices kept in an overlay
    assert len({id(index._base) for index in indexes}) > 2  # and folded into new bases
