"""MetadataPublisher: a snapshot that grants this broker nothing is stored in the background; one that
grants something is stored first; the next publish step waits for a background save."""

from __future__ import annotations

import asyncio
from pathlib import Path

from broker_fakes import MemoryImageStore, MemoryLogOpener, started_publisher
from loop_fakes import CostClock, LoopTurns

from kraft.broker.partitions import PartitionManager
from kraft.broker.publisher import MetadataPublisher
from kraft.broker.types import TopicPartition
from kraft.clock import ManualClock
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import wrap
from kraft.v1 import metadata_pb2 as mpb

ME = 4
WAIT_S = 5.0


class GatedStore(MemoryImageStore):
    """Saves block until :attr:`gate` is set (a slow disk); records the order of events."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.events: list[str] = []

    async def save(self, image: MetadataImage) -> None:
        self.events.append(f"save-start {image.offset}")
        await asyncio.wait_for(self.gate.wait(), WAIT_S)
        await super().save(image)
        self.events.append(f"save-done {image.offset}")


def _image(offset: int, leader: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(wrap(mpb.TopicRecord(name="orders", topic_id="T")))
    delta.replay(
        wrap(
            mpb.PartitionRecord(partition_id=0, topic_id="T", replicas=[leader], isr=[leader], leader=leader)
        )
    )
    delta.replay(wrap(mpb.NoOpRecord()), offset, 1)
    return delta.apply()


async def _let_tasks_run() -> None:
    """Enough loop turns for anything not blocked on the store to finish (deterministic, no timing)."""
    for _ in range(20):
        await asyncio.sleep(0)


async def test_a_snapshot_granting_nothing_is_served_before_it_is_stored(tmp_path: Path) -> None:
    store = GatedStore()
    clock = ManualClock()
    manager, publisher = await started_publisher(ME, tmp_path, store, clock)
    try:
        await asyncio.wait_for(publisher.load_snapshot(_image(10, leader=1)), WAIT_S)
        assert publisher.image.offset == 10 and store.saves == 0  # served, not stored yet
        assert publisher.last_snapshot_apply_s == 0.0  # served without waiting for the store
        clock.advance(250)  # the slow disk: the background save takes 250 ms
        # The next step (it grants this broker a leadership) waits for the background save first.
        delta = MetadataDelta(publisher.image)
        delta.replay(
            wrap(
                mpb.PartitionChangeRecord(
                    topic_id="T",
                    partition_id=0,
                    replicas=mpb.BrokerIdList(ids=[ME]),
                    isr=mpb.BrokerIdList(ids=[ME]),
                    leader=ME,
                )
            ),
            11,
            1,
        )
        step = asyncio.create_task(publisher.publish(delta))
        await _let_tasks_run()
        assert not step.done() and manager.get(TopicPartition("orders", 0)) is None
        store.gate.set()
        await asyncio.wait_for(step, WAIT_S)
        assert store.events == ["save-start 10", "save-done 10", "save-start 11", "save-done 11"]
        assert publisher.last_snapshot_store_s == 0.25
        assert manager.get(TopicPartition("orders", 0)) is not None
    finally:
        store.gate.set()
        await publisher.flush()
        manager.close()


async def test_a_snapshot_granting_a_partition_is_stored_before_it_is_served(tmp_path: Path) -> None:
    store = GatedStore()
    clock = ManualClock()
    manager, publisher = await started_publisher(ME, tmp_path, store, clock)
    try:
        load = asyncio.create_task(publisher.load_snapshot(_image(10, leader=ME)))
        await _let_tasks_run()
        assert not load.done() and publisher.image.offset == -1
        assert manager.get(TopicPartition("orders", 0)) is None
        clock.advance(300)  # the slow disk: serving waits for the whole save
        store.gate.set()
        await asyncio.wait_for(load, WAIT_S)
        assert store.saves == 1 and publisher.image.offset == 10
        assert (publisher.last_snapshot_store_s, publisher.last_snapshot_apply_s) == (0.3, 0.3)
        assert manager.get(TopicPartition("orders", 0)) is not None
    finally:
        store.gate.set()
        manager.close()


async def test_opening_the_partitions_shows_the_view_again_with_them_open(tmp_path: Path) -> None:
    """After a restart the stored image reached the view callback while no partition was open; once
    they are, the callback runs again (replication sets up leader state at once, not at the next delta)."""
    store = MemoryImageStore()
    store.image = _image(10, leader=ME)
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener())
    seen: list[tuple[int, int]] = []  # (image offset, partitions open) at each view
    publisher = MetadataPublisher(
        ME, manager, store, "PLAINTEXT", lambda view: seen.append((view.image.offset, len(manager))),
        clock=ManualClock(),
    )  # fmt: skip
    await publisher.start()
    assert seen == [(10, 0)]
    await publisher.open_partitions()
    assert seen == [(10, 0), (10, 1)]
    manager.close()


async def test_a_big_topic_deletion_is_looked_through_in_bounded_turns(tmp_path: Path) -> None:
    """One RemoveTopicRecord of a big topic: the scan for this broker's replicas (a few of its thousands
    of partitions) yields the event loop whenever the work-unit budget ran out, and finds what the
    one-go ``local_changes`` finds."""
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(wrap(mpb.TopicRecord(name="big", topic_id="B")))
    for partition_id in range(5000):
        replicas = [ME, 1, 2] if partition_id % 10 == 0 else [1, 2, 3]
        delta.replay(
            wrap(
                mpb.PartitionRecord(partition_id=partition_id, topic_id="B", replicas=replicas, isr=replicas)
            )
        )
    delta.replay(wrap(mpb.NoOpRecord()), 1, 1)
    image = delta.apply()
    clock = CostClock()
    _, publisher = await started_publisher(ME, tmp_path, GatedStore(), clock)
    removal = MetadataDelta(image)
    removal.replay(wrap(mpb.RemoveTopicRecord(topic_id="B")), 2, 1)
    loop = LoopTurns()
    changes = await loop.during(publisher._local_changes(removal))
    assert loop.turns >= 2  # the loop ran other tasks while the scan was under way
    assert changes.deletes == {TopicPartition("big", p): "B" for p in range(0, 5000, 10)}
    assert not changes.leaders and not changes.followers
