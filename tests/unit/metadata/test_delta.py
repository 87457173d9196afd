"""MetadataDelta replay → image, copy-on-write sharing, and broker-local changes."""

from __future__ import annotations

import inspect

import pytest
from google.protobuf.message import Message

from kraft import sharded_map
from kraft.metadata import delta as delta_module
from kraft.metadata import elr_holders as elr_holders_module
from kraft.metadata import records
from kraft.metadata.chunked import CHUNK, ChunkedSequence, chunks_of
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.elr_holders import ElrHolders
from kraft.metadata.image import ConfigKey, MetadataImage
from kraft.metadata.records import ConfigResourceType
from kraft.sharded_map import ShardedMap
from kraft.v1 import common_pb2
from kraft.v1 import metadata_pb2 as pb


def _apply(image: MetadataImage, *payloads: Message, start: int | None = None) -> MetadataImage:
    delta = MetadataDelta(image)
    offset = image.offset + 1 if start is None else start
    for i, payload in enumerate(payloads):
        delta.replay(records.wrap(payload), offset + i, 1)
    assert not delta.replay_errors, delta.replay_errors
    return delta.apply()


def _register(broker_id: int, epoch: int, rack: str | None = None) -> pb.RegisterBrokerRecord:
    record = pb.RegisterBrokerRecord(
        broker_id=broker_id,
        incarnation_id=f"inc-{broker_id}",
        broker_epoch=epoch,
        fenced=True,
        endpoints=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9000 + broker_id)],
    )
    if rack is not None:
        record.rack = rack
    return record


def _cluster() -> MetadataImage:
    image = _apply(MetadataImage.empty(), _register(1, 0), _register(2, 1, "r2"), _register(3, 2))
    return _apply(
        image,
        pb.TopicRecord(name="orders", topic_id="T1"),
        pb.PartitionRecord(partition_id=0, topic_id="T1", replicas=[1, 2], isr=[1, 2], leader=1),
        pb.PartitionRecord(partition_id=1, topic_id="T1", replicas=[2, 3], isr=[2, 3], leader=2),
        pb.TopicRecord(name="audit", topic_id="T2"),
        pb.PartitionRecord(partition_id=0, topic_id="T2", replicas=[3], isr=[3], leader=3),
    )


def test_register_broker_builds_a_fenced_registration_with_its_epoch() -> None:
    image = _apply(MetadataImage.empty(), _register(1, 0), _register(2, 1, "rack-b"))
    assert image.offset == 1
    assert image.brokers[1].fenced and image.brokers[1].epoch == 0
    assert image.brokers[2].rack == "rack-b" and image.brokers[1].rack is None
    assert image.brokers[1].endpoints[0].port == 9001


def test_fence_unfence_and_registration_change_flip_broker_state() -> None:
    image = _apply(MetadataImage.empty(), _register(1, 0))
    image = _apply(image, pb.UnfenceBrokerRecord(id=1, epoch=0))
    assert not image.brokers[1].fenced
    image = _apply(
        image, pb.BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=0, in_controlled_shutdown=1)
    )
    assert image.brokers[1].in_controlled_shutdown and not image.brokers[1].fenced
    image = _apply(image, pb.BrokerRegistrationChangeRecord(broker_id=1, broker_epoch=0, fenced=1))
    assert image.brokers[1].fenced
    image = _apply(image, pb.FenceBrokerRecord(id=1, epoch=0))
    assert image.brokers[1].fenced


def test_unregister_with_a_stale_epoch_is_skipped_and_reported() -> None:
    image = _apply(MetadataImage.empty(), _register(1, 5))
    delta = MetadataDelta(image)
    delta.replay(records.wrap(pb.UnregisterBrokerRecord(broker_id=1, broker_epoch=4)), 6)
    assert delta.replay_errors
    assert 1 in delta.apply().brokers
    assert 1 not in _apply(image, pb.UnregisterBrokerRecord(broker_id=1, broker_epoch=5)).brokers


def test_topics_and_partitions_are_indexed_by_name_and_id() -> None:
    image = _cluster()
    topic = image.topic("orders")
    assert topic is not None and topic.topic_id == "T1"
    assert [p.leader for p in topic.partitions] == [1, 2]
    assert image.partition("T1", 1) is not None
    assert image.partition("T1", 2) is None
    assert image.partition_count() == 3
    first = topic.partitions[0]
    assert first.isr is first.replicas  # equal lists share one tuple


def test_partition_change_bumps_both_epochs_and_keeps_absent_fields() -> None:
    image = _cluster()
    image = _apply(
        image, pb.PartitionChangeRecord(topic_id="T1", partition_id=0, isr=pb.BrokerIdList(ids=[2]))
    )
    partition = image.partition("T1", 0)
    assert partition is not None
    assert partition.isr == (2,) and partition.leader == 1 and partition.replicas == (1, 2)
    assert (partition.leader_epoch, partition.partition_epoch) == (1, 1)
    image = _apply(image, pb.PartitionChangeRecord(topic_id="T1", partition_id=0, leader=-1))
    partition = image.partition("T1", 0)
    assert partition is not None and partition.leader == -1 and partition.leader_epoch == 2


def test_unchanged_maps_and_topics_are_shared_between_images() -> None:
    image = _cluster()
    after = _apply(image, pb.PartitionChangeRecord(topic_id="T1", partition_id=0, leader=2))
    assert after.brokers is image.brokers
    assert after.topics_by_id["T2"] is image.topics_by_id["T2"]
    assert after.topics_by_id["T1"] is not image.topics_by_id["T1"]
    assert after.topics_by_id["T1"].partitions[1] is image.topics_by_id["T1"].partitions[1]
    assert image.partition("T1", 0) is not None and image.partition("T1", 0).leader == 1  # type: ignore[union-attr]
    noop = _apply(after, pb.NoOpRecord())
    assert noop.topics_by_id is after.topics_by_id and noop.offset == after.offset + 1


def test_remove_topic_drops_it_with_its_configs_and_frees_the_name() -> None:
    image = _cluster()
    image = _apply(
        image, pb.ConfigRecord(resource_type=2, resource_name="orders", name="retention.ms", value="5")
    )
    assert image.topic_configs("orders") == {"retention.ms": "5"}
    image = _apply(
        image,
        pb.RemoveTopicRecord(topic_id="T1"),
        pb.TopicRecord(name="orders", topic_id="T9"),
        pb.PartitionRecord(partition_id=0, topic_id="T9", replicas=[1], isr=[1], leader=1),
    )
    assert "T1" not in image.topics_by_id
    assert image.topic_ids_by_name["orders"] == "T9"
    assert image.topic_configs("orders") == {}


def test_config_delete_and_feature_levels() -> None:
    key = ConfigKey(ConfigResourceType.BROKER, "1")
    image = _apply(
        MetadataImage.empty(),
        pb.ConfigRecord(resource_type=4, resource_name="1", name="a", value="x"),
        pb.FeatureLevelRecord(name="metadata.version", feature_level=3),
    )
    assert image.configs[key] == {"a": "x"} and image.features == {"metadata.version": 3}
    image = _apply(
        image,
        pb.ConfigRecord(resource_type=4, resource_name="1", name="a"),
        pb.FeatureLevelRecord(name="metadata.version", feature_level=0),
    )
    assert key not in image.configs and image.features == {}


def test_records_for_unknown_things_are_skipped_not_raised() -> None:
    delta = MetadataDelta(MetadataImage.empty())
    for payload in (
        pb.PartitionRecord(partition_id=0, topic_id="nope"),
        pb.PartitionChangeRecord(partition_id=0, topic_id="nope", leader=1),
        pb.RemoveTopicRecord(topic_id="nope"),
        pb.FenceBrokerRecord(id=9, epoch=1),
    ):
        delta.replay(records.wrap(payload))
    assert len(delta.replay_errors) == 4
    assert delta.apply().topics_by_id == {}


def test_transaction_markers_are_tracked() -> None:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.BeginTransactionRecord(name="x")))
    assert delta.in_transaction
    delta.replay(records.wrap(pb.EndTransactionRecord()))
    assert not delta.in_transaction


def test_local_changes_split_deletes_leaders_and_followers() -> None:
    image = _cluster()
    delta = MetadataDelta(image)
    for payload in (
        pb.PartitionChangeRecord(topic_id="T1", partition_id=0, leader=2),  # 1 follows, 2 leads
        pb.PartitionChangeRecord(
            topic_id="T1",
            partition_id=1,
            replicas=pb.BrokerIdList(ids=[1, 2]),
            isr=pb.BrokerIdList(ids=[1, 2]),
            leader=1,
        ),  # 3 loses it
        pb.RemoveTopicRecord(topic_id="T2"),  # 3 deletes
        pb.TopicRecord(name="new", topic_id="T3"),
        pb.PartitionRecord(partition_id=0, topic_id="T3", replicas=[3, 1], isr=[3, 1], leader=3),
    ):
        delta.replay(records.wrap(payload))
    one = delta.local_changes(1)
    assert [(p.topic_name, p.partition_id) for p in one.leaders] == [("orders", 1)]
    assert sorted((p.topic_name, p.partition_id) for p in one.followers) == [("new", 0), ("orders", 0)]
    assert one.deletes == []
    three = delta.local_changes(3)
    assert sorted((p.topic_name, p.partition_id) for p in three.deletes) == [("audit", 0), ("orders", 1)]
    assert [(p.topic_name, p.registration.leader_epoch) for p in three.leaders] == [("new", 0)]
    assert delta.local_changes(7).is_empty()


def _snapshot_records() -> list[pb.MetadataRecord]:
    """A snapshot's worth: brokers, many small topics (some partitions holding an ELR or last known
    ELR), one topic of several chunks, and a config."""
    out = [records.wrap(_register(b, b)) for b in (1, 2, 3)]
    for t in range(700):
        out.append(records.wrap(pb.TopicRecord(name=f"t{t}", topic_id=f"T{t}")))
        for p in range(3):
            elr = [3] if (t + p) % 7 == 0 else []
            lke = [2] if (t + p) % 11 == 0 else []
            out.append(
                records.wrap(
                    pb.PartitionRecord(
                        partition_id=p,
                        topic_id=f"T{t}",
                        replicas=[1, 2, 3],
                        isr=[1],
                        leader=1,
                        eligible_leader_replicas=elr,
                        last_known_elr=lke,
                    )
                )
            )
    out.append(records.wrap(pb.TopicRecord(name="big", topic_id="B")))
    for p in range(3 * CHUNK + 5):
        out.append(records.wrap(pb.PartitionRecord(partition_id=p, topic_id="B", replicas=[1, 2], leader=1)))
    out.append(records.wrap(pb.ConfigRecord(resource_type=2, resource_name="t1", name="k", value="v")))
    return out


@pytest.mark.parametrize(
    ("small_steps", "split", "parted"),
    [
        (False, False, False),
        (True, False, False),
        (False, True, False),
        (False, False, True),
        (True, False, True),
    ],
)
def test_apply_steps_builds_the_image_off_to_the_side_and_equals_the_record_by_record_image(
    small_steps: bool, split: bool, parted: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue #17: a snapshot's delta builds a whole image; ``apply_steps`` pauses between pieces (topics,
    chunks of a big topic, batches of the topic maps, the ELR index) and returns it only at the end —
    the same image as replaying the records batch by batch, each batch applied.  With tiny steps every
    kind of pause happens many times (the ELR index's too).  ``split``: the delta's per-topic maps
    become ShardedMaps (at 100 keys here), whose ELR pass reads the shards in no particular order.
    ``parted``: the big topic's changed partitions go into parts of 1,024 ids (``_PartitionParts``; the
    shipped part is 32,768) once it holds that many."""
    if parted:
        monkeypatch.setattr(delta_module, "PART_BITS", 10)
        monkeypatch.setattr(delta_module, "_PARTED_FROM", (1 << 10) - 1)
    if split:
        monkeypatch.setattr(delta_module, "SPLIT_AT", 100)
        monkeypatch.setattr(sharded_map, "SPLIT_AT", 100)
    if small_steps:
        monkeypatch.setattr(delta_module, "APPLY_STEP_WORK", 100)
        monkeypatch.setattr(delta_module, "APPLY_STEP_TOPICS", 7)
        monkeypatch.setattr(delta_module, "APPLY_STEP_NAMES", 5)
        monkeypatch.setattr(delta_module, "DROP_STEP_ITEMS", 3)
        monkeypatch.setattr(elr_holders_module, "ADVANCE_STEP_WORK", 30)
    snapshot = _snapshot_records()
    reference = MetadataImage.empty()
    for start in range(0, len(snapshot), 97):  # committed batches, each its own delta
        batch = MetadataDelta(reference)
        batch.replay_decoded(snapshot[start : start + 97])
        assert not batch.replay_errors
        reference = batch.apply()

    delta = MetadataDelta(MetadataImage.empty())
    delta.replay_decoded(snapshot)
    assert isinstance(delta._topics, ShardedMap) is split
    big = delta._topics["B"].changed
    assert isinstance(big, delta_module._PartitionParts) is parted
    assert list(big.items()) == [(p, delta.partition("B", p)) for p in range(3 * CHUNK + 5)]
    steps = delta.apply_steps()
    pauses = 0
    while True:
        try:
            next(steps)
        except StopIteration as done:
            image: MetadataImage = done.value
            break
        pauses += 1
        assert delta.image is MetadataImage.empty()  # nothing is published while it is built
    assert pauses >= (300 if small_steps else 4)
    assert image == reference
    assert list(image.topics_by_id) == list(reference.topics_by_id)  # the same order
    assert image.elr_holders == ElrHolders.scan(image.topics_by_id) == reference.elr_holders
    assert isinstance(image.topics_by_id["B"].partitions, ChunkedSequence)
    assert image.topics_by_id["B"].partitions.chunks() == chunks_of(reference.topics_by_id["B"].partitions)
    # Emptied in steps afterwards (its per-partition entries are ~10-30 ms of freeing at a million):
    # the image it built keeps everything.
    assert sum(1 for _ in delta.discard_steps()) >= (100 if small_steps else 1)
    assert delta.partition("B", 0) is None and delta.topic_id("t1") is None
    assert image == reference


def test_apply_steps_lets_go_of_its_working_lists_in_steps_before_the_image_is_returned(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Issue #17: the ``(key, value)`` pairs set in the two topic maps (100,000 each for a snapshot of
    100,000 topics) were freed all at once where the generator's frame went — in the step returning the
    image, ~15-20 ms.  They are dropped in steps of DROP_STEP_ITEMS before it: at the last pause the
    lists are empty, and the image is the same."""
    monkeypatch.setattr(delta_module, "DROP_STEP_ITEMS", 4)
    snapshot = _snapshot_records()
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay_decoded(snapshot)
    assert sum(1 for _ in delta.changed_topics()) > 4 * 4  # several steps of dropping
    steps = delta.apply_steps()
    held: dict[str, int] = {}
    while True:
        try:
            next(steps)
        except StopIteration as done:
            image: MetadataImage = done.value
            break
        local = inspect.getgeneratorlocals(steps)
        held = {name: len(local[name]) for name in ("built", "named") if name in local}
    assert held == {"built": 0, "named": 0}  # (at the last pause)
    reference = MetadataDelta(MetadataImage.empty())
    reference.replay_decoded(snapshot)
    assert image == reference.apply()


def test_a_small_delta_applies_without_a_pause() -> None:
    """A committed batch's delta (a few topics) costs no extra step: ``apply`` runs the same code."""
    delta = MetadataDelta(_cluster())
    delta.replay(records.wrap(pb.TopicRecord(name="x", topic_id="X")))
    delta.replay(records.wrap(pb.PartitionRecord(partition_id=0, topic_id="X", replicas=[1], leader=1)))
    assert list(delta.apply_steps()) == []
    assert delta.apply().partition("X", 0) is not None
