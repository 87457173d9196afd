"""The segmented log's driver port answers reads of its newest batches from memory
(:class:`kraft.raft.log_tail.LogTail`): the same bytes the disk would give, never stale ones."""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import cast

import pytest
from raft_helpers import LoopbackCluster, NodeStores

from kraft.raft.log_tail import LogTail
from kraft.raft.memory import MemoryLogStore
from kraft.raft.storage_adapters import SegmentedLogStore
from kraft.storage.batch import build_batch, iter_batch_headers
from kraft.storage.errors import CorruptLogError, OffsetOutOfRangeError, StorageStateError
from kraft.storage.log import ReadResult, SegmentedLog


def _batch(base: int, count: int, epoch: int = 1, size: int = 40) -> bytes:
    return build_batch(
        base, [(None, bytes([base % 251]) * size) for _ in range(count)], leader_epoch=epoch, timestamp_ms=0
    )


def _bases(data: bytes) -> list[int]:
    return [header.base_offset for _pos, header in iter_batch_headers(data)]


def _fill(stores: list[SegmentedLogStore], seed: int, appends: int) -> int:
    """The same appends to every store: single batches (a leader's) and runs of them (fetched)."""
    rnd = random.Random(seed)
    offset = 0
    for _ in range(appends):
        data = b""
        for _ in range(rnd.choice((1, 1, 2, 3))):
            count = rnd.randint(1, 6)
            data += _batch(offset, count, size=rnd.randint(1, 200))
            offset += count
        for store in stores:
            store.append(data, built=len(_bases(data)) == 1)
    return offset


def test_reads_from_the_tail_equal_reads_from_disk(tmp_path: Path) -> None:
    """Every offset, size bound and upper bound, with part of the log out of the tail (3 KiB kept)."""
    cached = SegmentedLogStore.open(tmp_path / "cached", tail_bytes=3000)
    disk = SegmentedLogStore.open(tmp_path / "disk", tail_bytes=0)
    end = _fill([cached, disk], seed=7, appends=60)
    start = cached.tail.start_offset
    assert start is not None and 0 < start < end - 5  # some batches fell out of the tail
    for offset in range(end + 1):
        sizes = [header.size_in_bytes for _pos, header in iter_batch_headers(disk.read(offset, 1 << 20))]
        exact = sum(sizes[:2])  # a bound two batches fill exactly: both fit
        for max_bytes in (1, 300, 1500, exact, exact - 1, 1 << 20):
            for max_offset in (None, offset, offset + 4, end):
                assert cached.read(offset, max_bytes, max_offset) == disk.read(offset, max_bytes, max_offset)
    assert cached.tail.hits >= (end - start) * 6 * 2  # ... and the tail answered its part
    assert disk.tail.hits == 0


def test_the_tail_answers_without_reading_the_file(tmp_path: Path) -> None:
    """Damage the file under the kept batches: the tail still serves what was written, and a batch no
    longer kept is read from the file and its damage found, as before."""
    store = SegmentedLogStore.open(tmp_path / "log", tail_bytes=1100)
    first, second, third = _batch(0, 2, size=200), _batch(2, 2, size=200), _batch(4, 1, size=200)
    for data in (first, second, third):
        store.append(data, built=True)
    store.flush()
    assert store.tail.start_offset == 2  # the first fell out (1,100 bytes kept)
    segment = next((tmp_path / "log").glob("*.log"))
    fd = os.open(segment, os.O_RDWR)
    try:
        for position in (100, len(first) + 100, len(first) + len(second) + 100):
            os.pwrite(fd, b"\xff\xff", position)  # inside each batch's records (under its CRC)
    finally:
        os.close(fd)
    assert store.read(2, 1 << 20) == second + third
    assert store.read(4, 1 << 20) == third
    with pytest.raises(CorruptLogError):
        store.read(0, 1 << 20)


def test_a_truncated_tail_serves_nothing_stale(tmp_path: Path) -> None:
    store = SegmentedLogStore.open(tmp_path / "log")
    store.append(_batch(0, 3) + _batch(3, 3) + _batch(6, 3), built=False)
    store.truncate_to(3)
    with pytest.raises(OffsetOutOfRangeError):
        store.read(6, 1 << 20)  # the log's end is 3 now
    assert store.read(3, 1 << 20) == b""
    replacement = _batch(3, 2, epoch=2)
    store.append(replacement, built=True)
    assert store.read(3, 1 << 20) == replacement
    assert store.read(0, 1 << 20) == _batch(0, 3) + replacement  # from disk: the tail starts at 3
    assert store.tail.start_offset == 3


def test_deleted_prefix_and_reset_are_not_served(tmp_path: Path) -> None:
    store = SegmentedLogStore.open(tmp_path / "log")
    store.append(_batch(0, 3) + _batch(3, 3), built=False)
    store.flush()
    store.delete_before(3)
    with pytest.raises(OffsetOutOfRangeError):
        store.read(0, 1 << 20)  # below the log start, although the tail still holds it
    assert store.read(3, 1 << 20) == _batch(3, 3)
    store.reset_to(100)
    assert store.tail.start_offset is None
    with pytest.raises(OffsetOutOfRangeError):
        store.read(3, 1 << 20)


def test_a_failed_or_closed_log_is_not_read_around(tmp_path: Path) -> None:
    """Fail-stop: once the log refuses use, so do reads the tail could answer."""
    log = SegmentedLog.open(tmp_path / "log")
    store = SegmentedLogStore(log)
    store.append(_batch(0, 2), built=True)
    log.close()  # as a failed write or flush does, the log raises on every use from now on
    with pytest.raises(StorageStateError):
        store.read(0, 1 << 20)


def test_the_tail_keeps_its_bound_and_always_the_newest_batch() -> None:
    tail = LogTail(max_bytes=1000)
    big = _batch(0, 1, size=3000)
    tail.appended(big, 0)
    assert tail.read(0, 1) == big  # larger than the bound: kept anyway, alone
    small = [_batch(1 + i, 1, size=100) for i in range(20)]
    for index, data in enumerate(small):
        tail.appended(data, 1 + index)
    assert tail.read(0, 1 << 20) is None  # the big one went first
    start = tail.start_offset
    assert start is not None
    kept = tail.read(start, 1 << 20)
    assert kept is not None and 800 < len(kept) <= 1000
    assert kept.endswith(small[-1])
    tail.appended(_batch(50, 1), 50)  # not a continuation: starts over
    assert tail.start_offset == 50
    assert tail.read(21, 1 << 20) is None


def test_a_tail_of_zero_bytes_keeps_nothing() -> None:
    tail = LogTail(max_bytes=0)
    tail.appended(_batch(0, 2), 0)
    assert tail.start_offset is None
    assert tail.read(0, 1 << 20) is None


async def test_a_leader_answers_its_followers_from_the_tail(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three drivers on segmented logs: once elected, every Fetch answer the leader fills is read from
    the tail, not the file, and the followers' logs hold exactly the leader's bytes."""
    disk_reads: dict[Path, int] = {}
    segment_read = SegmentedLog.read

    def counting_read(log: SegmentedLog, offset: int, max_bytes: int, **kwargs: int | None) -> ReadResult:
        disk_reads[log.dir] = disk_reads.get(log.dir, 0) + 1
        return segment_read(log, offset, max_bytes, **kwargs)

    monkeypatch.setattr(SegmentedLog, "read", counting_read)
    cluster = LoopbackCluster(3)
    stores = {node_id: SegmentedLogStore.open(tmp_path / f"node{node_id}") for node_id in cluster.voters}
    for node_id, store in stores.items():
        cluster.stores[node_id] = NodeStores(log=cast(MemoryLogStore, store))  # any LogStore will do
    await cluster.start_all()
    try:
        leader = await cluster.elect()
        await cluster.settle()
        disk_reads.clear()
        hits = stores[leader.node_id].tail.hits
        for index in range(20):
            offset = leader.schedule_append([b"value-%d" % index] * (1 + index % 3))
            await cluster.settle()
            assert leader.high_watermark > offset
        await cluster.advance(50)  # the followers' last Fetches bring them the high watermark too
        assert stores[leader.node_id].tail.hits - hits >= 20 * 2  # each batch, to each follower
        assert disk_reads.get(tmp_path / f"node{leader.node_id}", 0) == 0
        end = stores[leader.node_id].end_offset
        whole = stores[leader.node_id].read(0, 1 << 20)
        for node_id, store in stores.items():
            assert store.end_offset == end, node_id
            assert store.read(0, 1 << 20) == whole, node_id
    finally:
        await cluster.close()
        for store in stores.values():
            store.close()
