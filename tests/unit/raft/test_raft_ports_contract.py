"""One contract suite for each driver port, run against the in-memory fake and the storage adapter."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kraft.raft.memory import MemoryElectionStore, MemoryLogStore, MemorySnapshotStore
from kraft.raft.messages import SnapshotId
from kraft.raft.ports import ElectionStore, LogStore, SnapshotStore
from kraft.raft.state import ElectionState
from kraft.raft.storage_adapters import FileElectionStore, FileSnapshotStore, SegmentedLogStore
from kraft.storage.batch import build_batch, iter_batch_headers


def _batch(base: int, count: int, epoch: int) -> bytes:
    return build_batch(
        base, [(None, b"r%d" % (base + i)) for i in range(count)], leader_epoch=epoch, timestamp_ms=0
    )


@pytest.fixture(params=["memory", "storage", "storage-disk-reads"])
def log_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[LogStore]:
    # "storage" answers reads of the newest batches from memory (kraft.raft.log_tail); the other reads disk.
    store: LogStore = (
        MemoryLogStore()
        if request.param == "memory"
        else SegmentedLogStore.open(
            tmp_path / "log", tail_bytes=0 if request.param.endswith("reads") else 1 << 20
        )
    )
    yield store
    store.close()


@pytest.fixture(params=["memory", "storage"])
def election_store(request: pytest.FixtureRequest, tmp_path: Path) -> ElectionStore:
    return MemoryElectionStore() if request.param == "memory" else FileElectionStore(tmp_path)


@pytest.fixture(params=["memory", "storage"])
def snapshot_store(request: pytest.FixtureRequest, tmp_path: Path) -> SnapshotStore:
    return MemorySnapshotStore() if request.param == "memory" else FileSnapshotStore(tmp_path)


def _bases(data: bytes) -> list[int]:
    return [header.base_offset for _pos, header in iter_batch_headers(data)]


def test_log_appends_reads_and_tracks_epochs(log_store: LogStore) -> None:
    log_store.append(_batch(0, 3, 1))
    log_store.append(_batch(3, 2, 1) + _batch(5, 1, 2))
    assert (log_store.start_offset, log_store.end_offset) == (0, 6)
    assert log_store.epoch_entries() == [(1, 0), (2, 5)]
    assert log_store.flush() == 6
    assert _bases(log_store.read(0, 1 << 20)) == [0, 3, 5]
    assert _bases(log_store.read(3, 1)) == [3]  # at least one batch even past max_bytes
    assert _bases(log_store.read(0, 1 << 20, max_offset=5)) == [0, 3]
    assert log_store.read(6, 1024) == b""


def test_log_refuses_an_append_that_does_not_continue_it(log_store: LogStore) -> None:
    log_store.append(_batch(0, 2, 1))
    with pytest.raises(Exception, match="continue"):
        log_store.append(_batch(5, 1, 1))
    assert log_store.end_offset == 2


def test_log_truncation_drops_later_batches_and_epochs(log_store: LogStore) -> None:
    log_store.append(_batch(0, 3, 1) + _batch(3, 2, 2))
    log_store.truncate_to(3)
    assert log_store.end_offset == 3
    assert log_store.epoch_entries() == [(1, 0)]
    log_store.append(_batch(3, 1, 3))
    assert log_store.epoch_entries() == [(1, 0), (3, 3)]


def test_log_prefix_deletion_and_reset(log_store: LogStore) -> None:
    log_store.append(_batch(0, 3, 1) + _batch(3, 3, 2))
    log_store.flush()
    assert log_store.delete_before(3) == 3
    assert log_store.start_offset == 3
    assert _bases(log_store.read(3, 1 << 20)) == [3]
    log_store.reset_to(100)
    assert (log_store.start_offset, log_store.end_offset) == (100, 100)
    log_store.append(_batch(100, 1, 5))
    assert log_store.epoch_entries() == [(5, 100)]


def test_election_state_round_trips(election_store: ElectionStore) -> None:
    assert election_store.read() is None
    election_store.write(ElectionState(3, -1, 2))
    assert election_store.read() == ElectionState(3, -1, 2)
    election_store.write(ElectionState(4, 1, 1))
    assert election_store.read() == ElectionState(4, 1, 1)


def test_snapshots_are_written_read_and_superseded(snapshot_store: SnapshotStore) -> None:
    assert snapshot_store.latest() is None
    first, second = SnapshotId(10, 1), SnapshotId(20, 2)
    snapshot_store.write(first, 111, [b"a", b"b"], 0)
    snapshot_store.write(second, 222, [b"c"], 0)
    assert snapshot_store.latest() == second
    assert snapshot_store.read_records(first) == (111, [b"a", b"b"])
    size = snapshot_store.size(second)
    whole = snapshot_store.read_chunk(second, 0, size)
    assert len(whole) == size
    assert snapshot_store.read_chunk(second, 5, 3) == whole[5:8]
    with pytest.raises(ValueError):
        snapshot_store.read_chunk(second, size, 10)
    snapshot_store.delete_before(second)
    with pytest.raises(KeyError):
        snapshot_store.size(first)


def test_a_downloaded_snapshot_is_validated_then_frozen(snapshot_store: SnapshotStore) -> None:
    source = MemorySnapshotStore()
    snapshot_id = SnapshotId(7, 3)
    source.write(snapshot_id, 5, [b"x", b"y"], 0)
    data = source.read_chunk(snapshot_id, 0, source.size(snapshot_id))
    snapshot_store.write_chunk(snapshot_id, 0, data[:10])
    snapshot_store.write_chunk(snapshot_id, 10, data[10:])
    snapshot_store.finish_download(snapshot_id)
    assert snapshot_store.latest() == snapshot_id
    assert snapshot_store.read_records(snapshot_id) == (5, [b"x", b"y"])


def test_a_corrupt_download_is_refused(snapshot_store: SnapshotStore) -> None:
    snapshot_id = SnapshotId(7, 3)
    snapshot_store.write_chunk(snapshot_id, 0, b"\x00" * 80)
    with pytest.raises(Exception):  # noqa: B017 - each store raises its codec's corruption error
        snapshot_store.finish_download(snapshot_id)
    assert snapshot_store.latest() is None
