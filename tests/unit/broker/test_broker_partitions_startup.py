"""Partition manager startup and log dir failure (issue #14): scan without opening, open only what the
caught-up image assigns, paced directory work, one failing log dir taken offline instead of a crash."""

from __future__ import annotations

import errno
import os
import threading
from pathlib import Path

import pytest
from broker_fakes import MemoryLogOpener, MemoryPartitionLog
from loop_fakes import LoopTurns

from kraft.broker.partitions import PARTITIONS_PER_TURN, AllLogDirsOfflineError, PartitionManager
from kraft.broker.segmented_partition_log import SegmentedPartitionLog, segmented_log_opener
from kraft.broker.types import LocalChanges, PartitionAssignment, ProducedRecord, TopicPartition
from kraft.storage import shutdown_marker

ME = 1


def assignment(topic_id: str = "id-a") -> PartitionAssignment:
    return PartitionAssignment(topic_id, ME, 0, 0, (ME,), (ME,))


class FailingOpener(MemoryLogOpener):
    """Raises EIO for every partition under ``bad_dir`` (a failed disk)."""

    def __init__(self, bad_dir: Path) -> None:
        super().__init__()
        self.bad_dir = bad_dir

    def __call__(self, path: Path) -> MemoryPartitionLog:
        if path.parent == self.bad_dir:
            raise OSError(errno.EIO, "Input/output error", str(path))
        return super().__call__(path)


async def test_scan_opens_nothing_and_open_to_removes_what_the_image_no_longer_has(tmp_path: Path) -> None:
    opener = MemoryLogOpener()
    first = PartitionManager(ME, [tmp_path / "logs"], opener)
    first.load()
    first.apply(LocalChanges(leaders={TopicPartition("gone", 0): assignment("id-gone")}))
    first.apply(LocalChanges(leaders={TopicPartition("kept", 0): assignment("id-kept")}))
    first.close()
    opener.opened.clear()

    again = PartitionManager(ME, [tmp_path / "logs"], opener)
    assert again.scan() == 2
    assert not opener.opened and len(again) == 0
    await again.open_to({TopicPartition("kept", 0): assignment("id-kept")})
    assert opener.opened == [tmp_path / "logs" / "kept-0"]
    assert not (tmp_path / "logs" / "gone-0").exists()
    assert [p.tp for p in again.partitions()] == [TopicPartition("kept", 0)]


async def test_bulk_creation_is_paced_so_other_tasks_run_in_between(tmp_path: Path) -> None:
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener())
    manager.load()
    count = PARTITIONS_PER_TURN * 5
    changes = LocalChanges(leaders={TopicPartition("bulk", p): assignment() for p in range(count)})
    loop = LoopTurns()
    applied = await loop.during(manager.apply_paced(changes))
    assert len(applied.created) == count == len(manager)
    assert loop.turns >= 5  # the other task ran at least once per chunk


async def test_a_failing_log_dir_goes_offline_and_the_other_dir_keeps_serving(tmp_path: Path) -> None:
    good, bad = tmp_path / "good", tmp_path / "bad"
    manager = PartitionManager(ME, [bad, good], FailingOpener(bad))
    manager.load()
    applied = manager.apply(LocalChanges(leaders={TopicPartition("t", p): assignment() for p in range(4)}))
    # The first partition went to the (empty, so preferred) bad dir and failed: that dir is offline and
    # every other partition was placed on the good one.
    assert bad in manager.offline_dirs and good not in manager.offline_dirs
    assert TopicPartition("t", 0) in manager.offline
    assert set(applied.created) == {TopicPartition("t", p) for p in (1, 2, 3)}
    assert all(p.log_dir == good for p in manager.partitions())


async def test_no_log_dir_left_is_fatal(tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    manager = PartitionManager(ME, [bad], FailingOpener(bad))
    manager.load()
    with pytest.raises(AllLogDirsOfflineError, match="every log dir is offline"):
        manager.apply(LocalChanges(leaders={TopicPartition("t", 0): assignment()}))


async def test_segmented_logs_restart_after_a_crash_with_one_parallel_sync_pass_then_close_clean(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    opener = segmented_log_opener(1 << 20)
    first = PartitionManager(ME, [tmp_path / "logs"], opener)
    first.load()
    tps = [TopicPartition("t", p) for p in range(4)]
    first.apply(LocalChanges(leaders={tp: assignment() for tp in tps}))
    for partition in first.partitions():
        partition.log.append_records([ProducedRecord(b"k", b"v", 0)], leader_epoch=0)
        partition.log.flush()
        partition.log.append_records([ProducedRecord(b"k", b"unflushed", 0)], leader_epoch=0)
    for partition in first.partitions():  # kill -9: no close, no marker
        log = partition.log
        assert isinstance(log, SegmentedPartitionLog)
        log._log.abandon()

    synced_in: list[str] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced_in.append(threading.current_thread().name)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    again = PartitionManager(ME, [tmp_path / "logs"], opener)
    assert again.scan() == 4
    await again.open_to({tp: assignment() for tp in tps})
    # Each recovered newest segment synced once, by the parallel pass, before anything used the logs.
    assert len(synced_in) == 4
    assert all(name.startswith("log-sync") for name in synced_in)
    for partition in again.partitions():
        assert partition.log.flushed_offset == partition.log.log_end_offset == 2
    monkeypatch.undo()
    again.close()
    for tp in tps:
        assert shutdown_marker.read(tmp_path / "logs" / tp.dir_name).clean


async def test_a_log_dir_unreadable_at_start_up_holds_back_what_it_may_hold(tmp_path: Path) -> None:
    """A dir the scan cannot read may hold partitions the image assigns here: they are reported offline on
    it (so the controller never elects this replica) instead of being created empty on another dir, where
    they would pass for the replica that holds the data."""
    good, bad = tmp_path / "good", tmp_path / "bad"
    opener = MemoryLogOpener()
    first = PartitionManager(ME, [good, bad], opener)
    first.load()
    first.apply(LocalChanges(leaders={TopicPartition("t", p): assignment() for p in range(4)}))
    on_bad = {p.tp for p in first.partitions() if p.log_dir == bad}
    assert on_bad and len(on_bad) < 4  # spread over both dirs
    first.close()
    os.rename(bad, tmp_path / "bad-disk")
    bad.write_bytes(b"")  # the dir's path cannot be listed (a failed mount): taken offline by the scan

    again = PartitionManager(ME, [good, bad], opener)
    again.scan()
    assert bad in again.offline_dirs
    desired = {TopicPartition("t", p): assignment() for p in range(4)}
    applied = await again.open_to(desired)
    assert not applied.created, "nothing re-created empty"
    assert {p.tp for p in again.partitions()} == set(desired) - on_bad
    assert on_bad <= again.offline.keys()
    dirs, partitions = again.offline_report()
    assert dirs == [str(bad)] and {TopicPartition(t, p) for t, p in partitions} == on_bad
    # repaired, restarted: found again, opened where they are
    bad.unlink()
    os.rename(tmp_path / "bad-disk", bad)
    repaired = PartitionManager(ME, [good, bad], opener)
    repaired.scan()
    applied = await repaired.open_to(desired)
    assert not applied.created and not repaired.offline
    assert {p.tp: p.log_dir for p in repaired.partitions() if p.tp in on_bad} == dict.fromkeys(on_bad, bad)
