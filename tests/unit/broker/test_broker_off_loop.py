"""Broker work kept off the event loop or cut into turns (issue #17, bounded work units): a paced apply
removes deleted partition directories on a worker thread; start-up orders what the scan found and
compares it with the image in steps; a snapshot load hands the replaced image's big topics to the
reaper.  Manual clocks, no timing."""

from __future__ import annotations

import asyncio
import os
import shutil
import threading
from pathlib import Path
from typing import Any

import pytest
from broker_fakes import MemoryImageStore, MemoryLogOpener
from hypothesis import given, settings
from hypothesis import strategies as st
from loop_fakes import CostClock, LoopTurns

from kraft.broker import partitions as partitions_module
from kraft.broker import publisher as publisher_module
from kraft.broker import types as types_module
from kraft.broker.partitions import Pacer, Partition, PartitionManager, read_partition_state
from kraft.broker.publisher import MetadataPublisher
from kraft.broker.types import (
    LocalChanges,
    PartitionAssignment,
    ReplicaRole,
    TopicPartition,
    local_changes_between,
    local_changes_between_in_steps,
)
from kraft.clock import DEFAULT_WORK_UNIT_MS
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import wrap
from kraft.reaper import MIN_ITEMS, reaper_of
from kraft.v1 import metadata_pb2 as mpb

ME = 1
WAIT_S = 10.0


def _assignment(topic_id: str = "T") -> PartitionAssignment:
    return PartitionAssignment(topic_id, ME, 1, 1, (ME, 2, 3), (ME, 2, 3))


async def test_a_paced_deletion_removes_the_directories_on_a_worker_thread_before_it_returns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    manager = PartitionManager(ME, [tmp_path], MemoryLogOpener(), clock=CostClock())
    tps = [TopicPartition("t", p) for p in range(150)]
    manager.apply(LocalChanges(leaders=dict.fromkeys(tps, _assignment())))
    removed_on: list[str] = []
    rmtree = shutil.rmtree

    def recording_rmtree(path: Path, ignore_errors: bool = False) -> None:
        removed_on.append(threading.current_thread().name)
        rmtree(path, ignore_errors=ignore_errors)

    monkeypatch.setattr(shutil, "rmtree", recording_rmtree)  # (partitions calls shutil.rmtree)
    applied = await manager.apply_paced(LocalChanges(deletes=dict.fromkeys(tps, "T")))
    assert list(applied.deleted) == tps
    assert not os.listdir(tmp_path)  # renamed and removed, all of them, before it returned
    assert len(removed_on) == len(tps)
    assert threading.main_thread().name not in removed_on  # never on the event loop's thread
    # A plain (synchronous) apply still removes at once, on the caller's thread.
    manager.apply(LocalChanges(leaders={TopicPartition("u", 0): _assignment("U")}))
    manager.apply(LocalChanges(deletes={TopicPartition("u", 0): "U"}))
    assert removed_on[-1] == threading.main_thread().name and not os.listdir(tmp_path)


async def test_a_paced_switch_writes_the_state_files_on_a_worker_thread_one_batch_a_turn(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A controlled shutdown turns every leadership of the broker into a following: each switch
    rewrites the partition's state file (~0.4 ms of system time), so a paced apply writes a turn's
    files in one batch on a worker thread — all written, with the new role and epoch, when it returns."""
    manager = PartitionManager(ME, [tmp_path], MemoryLogOpener(), clock=CostClock())
    tps = [TopicPartition("t", p) for p in range(150)]
    manager.apply(LocalChanges(leaders=dict.fromkeys(tps, _assignment())))
    batches: list[tuple[str, int]] = []
    write_states = partitions_module._write_states

    def recording_write_states(restated: list[Partition]) -> list[BaseException | None]:
        batches.append((threading.current_thread().name, len(restated)))
        return write_states(restated)

    monkeypatch.setattr(partitions_module, "_write_states", recording_write_states)
    written_on: list[str] = []
    write_state = partitions_module._write_state

    def recording_write_state(*args: Any) -> None:
        written_on.append(threading.current_thread().name)
        write_state(*args)

    monkeypatch.setattr(partitions_module, "_write_state", recording_write_state)
    demoted = PartitionAssignment("T", 2, 2, 2, (ME, 2, 3), (ME, 2, 3))
    applied = await manager.apply_paced(LocalChanges(followers=dict.fromkeys(tps, demoted)))

    assert list(applied.became_follower) == tps
    per_turn = partitions_module.PARTITIONS_PER_TURN
    assert [n for _, n in batches] == [per_turn, per_turn, len(tps) - 2 * per_turn]  # one batch a turn
    assert len(written_on) == len(tps)
    assert threading.main_thread().name not in written_on  # never on the event loop's thread
    for tp in tps:
        state = read_partition_state(tmp_path / tp.dir_name)
        assert state is not None and state[1] == demoted and state[2] is ReplicaRole.FOLLOWER
    # A plain (synchronous) apply still writes at once, on the caller's thread.
    manager.apply(LocalChanges(leaders={tps[0]: PartitionAssignment("T", ME, 3, 3, (ME, 2, 3), (ME, 2, 3))}))
    assert written_on[-1] == threading.main_thread().name and len(batches) == 3
    state = read_partition_state(tmp_path / tps[0].dir_name)
    assert state is not None and state[1].leader_epoch == 3 and state[2] is ReplicaRole.LEADER


async def test_a_state_file_that_cannot_be_written_in_a_paced_switch_takes_its_log_dir_offline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As a failed write in place did: the partition's log dir goes offline, and what went with it is
    not reported as followed (no fetcher starts for a partition no longer hosted)."""
    dirs = [tmp_path / "a", tmp_path / "b"]
    manager = PartitionManager(ME, dirs, MemoryLogOpener(), clock=CostClock())
    tps = [TopicPartition("t", p) for p in range(10)]
    manager.apply(LocalChanges(leaders=dict.fromkeys(tps, _assignment())))
    broken = manager.get(tps[3])
    assert broken is not None
    on_broken_dir = {tp for tp in tps if (p := manager.get(tp)) is not None and p.log_dir == broken.log_dir}
    assert 0 < len(on_broken_dir) < len(tps)
    write_state = partitions_module._write_state

    def failing_write_state(directory: Path, *args: Any) -> None:
        if directory == broken.path:
            raise OSError(5, "Input/output error")
        write_state(directory, *args)

    monkeypatch.setattr(partitions_module, "_write_state", failing_write_state)
    demoted = PartitionAssignment("T", 2, 2, 2, (ME, 2, 3), (ME, 2, 3))
    applied = await manager.apply_paced(LocalChanges(followers=dict.fromkeys(tps, demoted)))

    assert broken.log_dir in manager.offline_dirs
    assert set(manager.offline) == on_broken_dir
    assert list(applied.became_follower) == [tp for tp in tps if tp not in on_broken_dir]
    for tp in applied.became_follower:
        partition = manager.get(tp)
        assert partition is not None and partition.role is ReplicaRole.FOLLOWER


async def test_start_up_orders_the_partitions_it_found_in_steps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    count = partitions_module.SORT_RUN + 500  # two sorted runs, joined in a later step
    tps = [TopicPartition("t", p) for p in range(count)]
    first = PartitionManager(ME, [tmp_path], MemoryLogOpener())
    first.apply(LocalChanges(leaders=dict.fromkeys(tps, _assignment())))
    first.close()
    pacers: list[Pacer] = []
    in_order = partitions_module.in_order

    async def recording_in_order(found: object, pacer: Pacer) -> list[TopicPartition]:
        pacers.append(pacer)
        return await in_order(found, pacer)  # type: ignore[arg-type]

    monkeypatch.setattr(partitions_module, "in_order", recording_in_order)
    opener = MemoryLogOpener()
    manager = PartitionManager(ME, [tmp_path], opener, clock=CostClock())
    assert manager.scan() == count
    await manager.open_to(dict.fromkeys(tps, _assignment()))
    assert opener.opened == [tmp_path / tp.dir_name for tp in sorted(tps)]  # in partition order
    assert pacers and pacers[0].pauses >= 1  # the ordering yielded the loop between its steps
    manager.close()


def _big_image(count: int, offset: int) -> MetadataImage:
    """A topic of ``count`` partitions none of which is this broker's (replicas on broker 2)."""
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(wrap(mpb.TopicRecord(name="big", topic_id="B")))
    for p in range(count):
        delta.replay(wrap(mpb.PartitionRecord(partition_id=p, topic_id="B", replicas=[2], isr=[2], leader=2)))
    delta.replay(wrap(mpb.NoOpRecord()), offset, 1)
    return delta.apply()


async def test_a_snapshot_load_hands_the_replaced_images_big_topics_to_the_reaper(tmp_path: Path) -> None:
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener())
    publisher = MetadataPublisher(ME, manager, MemoryImageStore(), "PLAINTEXT", lambda view: None)
    await publisher.start()
    await publisher.open_partitions()
    await publisher.load_snapshot(_big_image(MIN_ITEMS + 10, offset=5))
    reaper = reaper_of(asyncio.get_running_loop())
    waiting, pieces = reaper.waiting, reaper.pieces
    # A later snapshot (the broker fell below the log start again) holds its own copy of the topic.
    await publisher.load_snapshot(_big_image(MIN_ITEMS + 10, offset=9))
    await publisher.flush()
    assert reaper.waiting == waiting + 1  # the first snapshot's topic, not freed in one go
    for _ in range(int(WAIT_S / 0.01)):  # (it looks every POLL_S whether it is the last holder)
        if reaper.idle:
            break
        await asyncio.sleep(0.01)
    assert reaper.idle, f"waiting={reaper.waiting}"
    assert reaper.pieces - pieces >= MIN_ITEMS // 512  # taken apart in pieces
    manager.close()


async def test_a_discarded_image_hands_its_big_topics_to_the_reaper(tmp_path: Path) -> None:
    """The stored image ahead of the controller's log is replaced by the empty one: its big topics go to
    the reaper too instead of being freed in one go."""
    store = MemoryImageStore()
    store.image = _big_image(MIN_ITEMS + 10, offset=5)
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener())
    publisher = MetadataPublisher(ME, manager, store, "PLAINTEXT", lambda view: None)
    await publisher.start()
    big = publisher.image.topic("big")
    assert big is not None
    reaper = reaper_of(asyncio.get_running_loop())
    waiting, pieces = reaper.waiting, reaper.pieces
    await publisher.discard_image("ahead of the controller")
    assert publisher.image.offset == -1 and store.image.offset == -1
    assert reaper.waiting == waiting + 1  # held by this test and the reaper
    del big
    assert reaper.release_some()  # (driven here: no waiting for the loop's turns)
    assert reaper.idle
    assert reaper.pieces - pieces >= MIN_ITEMS // 512
    manager.close()


def _small_topics(count: int, offset: int, shared: MetadataImage | None = None) -> MetadataImage:
    """``count`` one-partition topics hosted elsewhere; those of ``shared`` (the same ids) kept as
    they are (the same objects: an image built on ``shared``)."""
    delta = MetadataDelta(shared or MetadataImage.empty())
    for index in range(count):
        topic_id = f"id-{index}"
        if shared is not None and topic_id in shared.topics_by_id:
            continue
        delta.replay(wrap(mpb.TopicRecord(name=f"t{index}", topic_id=topic_id)))
        delta.replay(
            wrap(mpb.PartitionRecord(partition_id=0, topic_id=topic_id, replicas=[2], isr=[2], leader=2))
        )
    delta.replay(wrap(mpb.NoOpRecord()), offset, 1)
    return delta.apply()


async def test_a_snapshot_load_hands_the_replaced_topics_to_the_reaper_in_turns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The old image's topics that the snapshot does not share are walked RELEASE_STEP at a time, the
    loop yielded between (every clock read costs the whole budget: each look at it ends the turn); every
    one is handed over, none that the new image shares."""
    monkeypatch.setattr(publisher_module, "RELEASE_STEP", 8)
    handed: list[list[object]] = []
    monkeypatch.setattr(
        publisher_module, "release_replaced_topics", lambda topics: handed.append(list(topics))
    )
    clock = CostClock(DEFAULT_WORK_UNIT_MS)
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener())
    publisher = MetadataPublisher(
        ME, manager, MemoryImageStore(), "PLAINTEXT", lambda view: None, clock=clock
    )
    await publisher.start()
    await publisher.open_partitions()
    old = _small_topics(100, offset=5)
    await publisher.load_snapshot(old)
    handed.clear()
    new = _small_topics(100, offset=9, shared=_small_topics(30, offset=7))  # shares none of old's
    turns = LoopTurns()
    await turns.during(publisher.load_snapshot(new))
    assert turns.turns >= 100 // 8 - 1
    assert all(len(group) <= 8 for group in handed)
    assert {id(topic) for group in handed for topic in group} == {id(t) for t in old.topics_by_id.values()}
    handed.clear()
    await publisher.load_snapshot(_small_topics(100, offset=11, shared=new))  # shares all of new's
    assert not [topic for group in handed for topic in group]
    manager.close()


_ASSIGNMENTS = st.sampled_from(
    [
        PartitionAssignment("T", ME, 1, 1, (ME, 2), (ME, 2)),
        PartitionAssignment("T", 2, 2, 2, (ME, 2), (ME, 2)),
        PartitionAssignment("U", ME, 1, 1, (ME, 2), (ME,)),
        PartitionAssignment("U", 2, 1, 1, (ME, 2), (2,)),
    ]
)
_MAPS = st.dictionaries(st.builds(TopicPartition, st.sampled_from("ab"), st.integers(0, 40)), _ASSIGNMENTS)


@settings(max_examples=100, deadline=None)
@given(_MAPS, _MAPS, st.integers(1, 8))
def test_local_changes_in_steps_equal_the_one_go_comparison(
    before: dict[TopicPartition, PartitionAssignment],
    after: dict[TopicPartition, PartitionAssignment],
    step: int,
) -> None:
    expected = local_changes_between(ME, before, after)
    out = LocalChanges({}, {}, {})
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(types_module, "CHANGES_STEP", step)
        pauses = sum(1 for _ in local_changes_between_in_steps(ME, before, after, out))
    assert pauses == len(before) // step + len(after) // step
    for mine, theirs in ((out.deletes, expected.deletes), (out.leaders, expected.leaders)):
        assert list(mine.items()) == list(theirs.items())  # same entries, same order
    assert list(out.followers.items()) == list(expected.followers.items())
