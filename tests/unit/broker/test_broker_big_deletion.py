"""A broker hosting most of a deleted big topic (issue #17, bounded work units): its deletes are converted
(``to_local_changes_in_steps``), ordered (``in_order``) and applied (``apply_paced``) in steps that yield
the event loop when the work unit's budget ran out — with the same deletions, in the same order, as the
one-go code; a re-created topic of the same name is left alone, and a crash mid-way is finished on
restart. Manual clocks only: :class:`CostClock` makes every clock read cost 1 ms."""

from __future__ import annotations

import asyncio
import os
import random
from pathlib import Path

import pytest
from broker_fakes import MemoryImageStore, MemoryLogOpener, started_publisher
from loop_fakes import CostClock, LoopTurns

from kraft.broker.image_adapter import to_local_changes_in_steps
from kraft.broker.partitions import PARTITIONS_PER_TURN, Pacer, PartitionManager, in_order
from kraft.broker.publisher import MetadataPublisher
from kraft.broker.segmented_partition_log import segmented_log_opener
from kraft.broker.types import LocalChanges, PartitionAssignment, ProducedRecord, TopicPartition
from kraft.clock import DEFAULT_WORK_UNIT_MS
from kraft.metadata.delta import LocalPartition, LocalReplicaChanges, MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import wrap
from kraft.reaper import reaper_of
from kraft.v1 import metadata_pb2 as mpb

ME = 1
WAIT_S = 10.0


def _assignment(topic_id: str) -> PartitionAssignment:
    return PartitionAssignment(topic_id, ME, 1, 1, (ME, 2, 3), (ME, 2, 3))


def _image_with(topics: dict[str, tuple[str, int]], offset: int) -> MetadataImage:
    """Topics name → (id, partitions), every partition led by this broker, replicas (ME, 2, 3)."""
    delta = MetadataDelta(MetadataImage.empty())
    for name, (topic_id, count) in topics.items():
        delta.replay(wrap(mpb.TopicRecord(name=name, topic_id=topic_id)))
        for p in range(count):
            record = mpb.PartitionRecord(
                partition_id=p, topic_id=topic_id, replicas=[ME, 2, 3], isr=[ME, 2, 3], leader=ME
            )
            delta.replay(wrap(record))
    delta.replay(wrap(mpb.NoOpRecord()), offset, 1)
    return delta.apply()


def _one_go(changes: LocalReplicaChanges) -> LocalChanges:
    """The conversion as it was before it was sliced (the reference the steps must match)."""

    def entry(p: LocalPartition) -> tuple[TopicPartition, PartitionAssignment]:
        r = p.registration
        assignment = PartitionAssignment(
            p.topic_id,
            r.leader,
            r.leader_epoch,
            r.partition_epoch,
            r.replicas,
            r.isr,
            r.leader_recovery_state,
            r.last_unclean_leader_epoch,
        )
        return TopicPartition(p.topic_name, p.partition_id), assignment

    return LocalChanges(
        deletes={TopicPartition(p.topic_name, p.partition_id): p.topic_id for p in changes.deletes},
        leaders=dict(entry(p) for p in changes.leaders),
        followers=dict(entry(p) for p in changes.followers),
    )


def test_the_sliced_conversion_pauses_and_converts_what_the_one_go_code_did() -> None:
    image = _image_with({"big": ("B", 3000), "moved": ("M", 40)}, offset=5)
    delta = MetadataDelta(image)
    delta.replay(wrap(mpb.RemoveTopicRecord(topic_id="B")))
    for p in range(40):  # this broker: leader of some, follower of others, gone from the rest
        replicas = [ME, 2, 3] if p % 3 == 0 else [2, ME, 3] if p % 3 == 1 else [2, 3, 4]
        ids = mpb.BrokerIdList(ids=replicas)
        change = mpb.PartitionChangeRecord(
            topic_id="M", partition_id=p, replicas=ids, isr=ids, leader=replicas[0]
        )
        delta.replay(wrap(change))
    delta.replay(wrap(mpb.NoOpRecord()), 6, 1)
    expected = _one_go(delta.local_changes(ME))
    changes = delta.local_changes(ME)
    out = LocalChanges({}, {}, {})
    steps = sum(1 for _ in to_local_changes_in_steps(changes, out))
    assert steps >= 3000 // 256  # at most 256 partitions between two pauses
    assert not changes.deletes and not changes.leaders and not changes.followers  # freed as it went
    for got, want in (
        (out.deletes, expected.deletes),
        (out.leaders, expected.leaders),
        (out.followers, expected.followers),
    ):
        assert list(got.items()) == list(want.items())  # same entries, same order
    assert len(out.deletes) == 3000 + 40 // 3 and len(out.leaders) == 14 and len(out.followers) == 13


async def test_ordering_in_steps_gives_what_sorted_gives() -> None:
    names = ["a", "big", "zz-topic"]
    partitions = [TopicPartition(name, p) for name in names for p in range(4000)]
    in_partition_order = await in_order(dict.fromkeys(partitions), Pacer(CostClock(), 5))
    assert in_partition_order == sorted(partitions)
    shuffled = list(partitions)
    random.Random(17).shuffle(shuffled)
    pacer = Pacer(CostClock(), 5)
    assert await in_order(dict.fromkeys(shuffled), pacer) == sorted(partitions)  # runs merged
    assert pacer.pauses >= 2  # it yielded while sorting and merging
    assert await in_order({}, pacer) == []


async def test_paced_deletion_yields_deletes_in_order_and_spares_a_recreated_topic(tmp_path: Path) -> None:
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener(), clock=CostClock())
    manager.load()
    count = 600
    # big-0..9 belong to a re-created topic of the same name (a new id): their logs must stay.
    manager.apply(
        LocalChanges(
            leaders={TopicPartition("big", p): _assignment("new" if p < 10 else "old") for p in range(count)}
        )
    )
    loop = LoopTurns()
    deletes = {TopicPartition("big", p): "old" for p in reversed(range(count))}  # any order in
    applied = await loop.during(manager.apply_paced(LocalChanges(deletes=deletes)))
    # What the one-go code deleted, in its order (sorted by partition), without the re-created ones.
    assert applied.deleted == tuple(sorted(TopicPartition("big", p) for p in range(10, count)))
    assert loop.turns >= (count - 10) // PARTITIONS_PER_TURN  # the loop ran other tasks between turns
    assert [p.tp.partition for p in manager.partitions()] == list(range(10))
    assert all(p.topic_id == "new" for p in manager.partitions())
    left = sorted(d.name for d in (tmp_path / "logs").iterdir())
    assert left == sorted(f"big-{p}" for p in range(10))


async def test_a_deletion_cut_short_by_a_crash_is_finished_on_restart(tmp_path: Path) -> None:
    store = MemoryImageStore()
    opener = MemoryLogOpener()
    manager, publisher = await started_publisher(ME, tmp_path, store, CostClock(), CostClock(), opener)
    created = MetadataDelta(publisher.image)
    for record in _records_of(_image_with({"big": ("B", 1000), "kept": ("K", 3)}, offset=1)):
        created.replay(record)
    created.replay(wrap(mpb.NoOpRecord()), 1, 1)
    await publisher.publish(created)
    assert len(manager) == 1003
    removal = MetadataDelta(publisher.image)
    removal.replay(wrap(mpb.RemoveTopicRecord(topic_id="B")), 2, 1)
    publishing = asyncio.create_task(publisher.publish(removal))
    for _ in range(10_000):  # until the paced deletion is under way, not finished
        await asyncio.sleep(0)
        if len(manager) < 900:
            break
    publishing.cancel()  # the process dies mid-way
    await asyncio.gather(publishing, return_exceptions=True)
    assert 3 < len(manager) < 1003
    assert store.image.topic("big") is not None  # the image without it was never stored
    # Restart: the stored image still has the topic; catching up replays the removal (deferred: no
    # partition touched), then opening the partitions removes what the deletion had not reached.
    again = PartitionManager(ME, [tmp_path / "logs"], opener, clock=CostClock())
    restarted = MetadataPublisher(ME, again, store, "PLAINTEXT", lambda view: None, clock=CostClock())
    await restarted.start()
    caught_up = MetadataDelta(restarted.image)
    caught_up.replay(wrap(mpb.RemoveTopicRecord(topic_id="B")), 2, 1)
    await restarted.publish(caught_up)
    await restarted.open_partitions()
    assert sorted(d.name for d in (tmp_path / "logs").iterdir()) == ["kept-0", "kept-1", "kept-2"]
    assert [p.tp.partition for p in again.partitions()] == [0, 1, 2]
    again.close()


def _records_of(image: MetadataImage) -> list[mpb.MetadataRecord]:
    out: list[mpb.MetadataRecord] = []
    for topic in image.topics_by_id.values():
        out.append(wrap(mpb.TopicRecord(name=topic.name, topic_id=topic.topic_id)))
        for p, r in enumerate(topic.partitions):
            record = mpb.PartitionRecord(
                partition_id=p, topic_id=topic.topic_id, replicas=r.replicas, isr=r.isr, leader=r.leader
            )
            out.append(wrap(record))
    return out


async def test_a_big_deletion_is_published_in_bounded_turns_and_its_objects_go_to_the_reaper(
    tmp_path: Path,
) -> None:
    count = 5000  # above kraft.reaper.MIN_ITEMS: the topic and the broker's changes are handed over
    store = MemoryImageStore()
    clock = CostClock()  # one clock: the publisher's and the manager's reads are one budget's cost
    manager, publisher = await started_publisher(ME, tmp_path, store, clock, clock)
    created = MetadataDelta(publisher.image)
    for record in _records_of(_image_with({"big": ("B", count)}, offset=1)):
        created.replay(record)
    created.replay(wrap(mpb.NoOpRecord()), 1, 1)
    await publisher.publish(created)
    del created
    removal = MetadataDelta(publisher.image)
    removal.replay(wrap(mpb.RemoveTopicRecord(topic_id="B")), 2, 1)
    loop = LoopTurns(clock)  # and the clock reads (1 ms each) between two turns
    applied = await loop.during(publisher.publish(removal))
    assert len(applied.deleted) == count and len(manager) == 0
    assert not any((tmp_path / "logs").iterdir())
    assert loop.turns >= count // PARTITIONS_PER_TURN
    # Scan, conversion, ordering and deletion share one budget: no stretch spans two (the budget, plus
    # the read that found it spent and the next turn's start).
    assert max(loop.stretches) <= DEFAULT_WORK_UNIT_MS + 2
    reaper = reaper_of(asyncio.get_running_loop())
    assert reaper.waiting >= 2  # the removed topic, the broker's changes (and what it applied)
    del removal, applied
    # Nothing else holds them now: the reaper takes them apart, a slice per loop turn.
    for _ in range(int(WAIT_S / 0.01)):  # (it looks every POLL_S for holders gone)
        if reaper.idle:
            break
        await asyncio.sleep(0.01)
    assert reaper.idle, f"waiting={reaper.waiting} pieces={reaper.pieces}"
    assert reaper.pieces >= count // 512
    manager.close()


def test_a_segmented_log_is_deleted_without_syncing_and_a_recreated_topic_starts_empty(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Deleting a partition closes its log without the flush/fsyncs/clean marker of ``close`` (its data is
    going), and the directory goes; the same name under a new topic id starts from an empty log."""
    manager = PartitionManager(ME, [tmp_path / "logs"], segmented_log_opener(1 << 20))
    manager.load()
    tp = TopicPartition("big", 0)
    manager.apply(LocalChanges(leaders={tp: _assignment("old")}))
    partition = manager.get(tp)
    assert partition is not None
    partition.log.append_records([ProducedRecord(None, b"v", 0)], leader_epoch=1)  # not flushed
    syncs: list[int] = []
    real_fsync = os.fsync

    def counted(fd: int) -> None:
        syncs.append(fd)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", counted)
    monkeypatch.setattr(os, "fdatasync", counted)
    applied = manager.apply(LocalChanges(deletes={tp: "old"}))
    assert applied.deleted == (tp,) and not syncs
    assert not any((tmp_path / "logs").iterdir())
    monkeypatch.undo()
    manager.apply(LocalChanges(leaders={tp: _assignment("new")}))
    recreated = manager.get(tp)
    assert recreated is not None and recreated.log.log_end_offset == 0
    manager.close()
