"""Partition manager startup and log dir failure (issue #14): scan without opening, open only what the
caught-up image assigns, paced directory work, one failing log dir taken offline instead of a crash."""

from __future__ import annotations

import asyncio
import errno
from pathlib import Path

import pytest
from broker_fakes import MemoryLogOpener, MemoryPartitionLog

from kraft.broker.partitions import PARTITIONS_PER_TURN, AllLogDirsOfflineError, PartitionManager
from kraft.broker.types import LocalChanges, PartitionAssignment, TopicPartition

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
    ticks = 0
    done = False

    async def heartbeat() -> None:
        nonlocal ticks
        while not done:
            ticks += 1
            await asyncio.sleep(0)

    beat = asyncio.create_task(heartbeat())
    applied = await manager.apply_paced(changes)
    done = True
    await beat
    assert len(applied.created) == count == len(manager)
    assert ticks >= 5  # the other task ran at least once per chunk


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
