"""The aiosqlite image store: round trip, incremental saves, one consistent offset, plain SQL tables."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from google.protobuf.message import Message

from kraft.clock import ManualClock
from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.v1 import common_pb2
from kraft.v1 import metadata_pb2 as pb


def _apply(image: MetadataImage, *payloads: Message) -> MetadataImage:
    delta = MetadataDelta(image)
    for i, payload in enumerate(payloads):
        delta.replay(records.wrap(payload), image.offset + 1 + i, 3)
    return delta.apply()


def _sample() -> MetadataImage:
    return _apply(
        MetadataImage.empty(),
        pb.RegisterBrokerRecord(
            broker_id=1,
            incarnation_id="i1",
            broker_epoch=0,
            fenced=False,
            rack="r1",
            log_dirs=["/d"],
            endpoints=[
                common_pb2.Endpoint(name="PLAINTEXT", host="h", port=1, security_protocol="PLAINTEXT")
            ],
            features=[
                pb.BrokerFeature(name="metadata.version", min_supported_version=1, max_supported_version=1)
            ],
        ),
        pb.RegisterBrokerRecord(broker_id=2, incarnation_id="i2", broker_epoch=1, fenced=True),
        pb.TopicRecord(name="t", topic_id="T"),
        pb.PartitionRecord(partition_id=0, topic_id="T", replicas=[1, 2], isr=[1, 2], leader=1),
        pb.PartitionRecord(partition_id=1, topic_id="T", replicas=[2, 1], isr=[2], leader=2),
        pb.ConfigRecord(resource_type=2, resource_name="t", name="retention.ms", value="10"),
        pb.FeatureLevelRecord(name="metadata.version", feature_level=1),
    )


async def test_a_saved_image_loads_back_equal(tmp_path: Path) -> None:
    image = _sample()
    store = await SqliteImageStore.open(tmp_path / "image.sqlite", clock=ManualClock())
    try:
        assert (await store.load()).offset == -1
        await store.save(image)
    finally:
        await store.close()
    store = await SqliteImageStore.open(tmp_path / "image.sqlite", clock=ManualClock())
    try:
        loaded = await store.load()
    finally:
        await store.close()
    assert loaded == image
    assert loaded.offset == 6 and loaded.epoch == 3


async def test_incremental_saves_follow_changes_and_deletions(tmp_path: Path) -> None:
    path = tmp_path / "image.sqlite"
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        image = _sample()
        await store.save(image)
        image = _apply(
            image,
            pb.PartitionChangeRecord(topic_id="T", partition_id=1, isr=pb.BrokerIdList(ids=[2, 1])),
            pb.UnregisterBrokerRecord(broker_id=2, broker_epoch=1),
            pb.ConfigRecord(resource_type=2, resource_name="t", name="retention.ms"),
            pb.TopicRecord(name="u", topic_id="U"),
            pb.PartitionRecord(partition_id=0, topic_id="U", replicas=[1], isr=[1], leader=1),
        )
        await store.save(image)
        image = _apply(image, pb.RemoveTopicRecord(topic_id="T"))
        await store.save(image)
        assert store.saved_offset == image.offset
    finally:
        await store.close()
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        assert await store.load() == image
    finally:
        await store.close()


async def test_tables_are_plain_sql_for_operators(tmp_path: Path) -> None:
    path = tmp_path / "image.sqlite"
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        await store.save(_sample())
    finally:
        await store.close()
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        assert db.execute("SELECT value FROM meta WHERE key='offset'").fetchone() == ("6",)
        rows = db.execute("SELECT partition_id, leader, isr FROM partitions ORDER BY partition_id").fetchall()
        assert rows == [(0, 1, "[1,2]"), (1, 2, "[2]")]
        assert db.execute("SELECT broker_id, fenced FROM brokers ORDER BY 1").fetchall() == [(1, 0), (2, 1)]
