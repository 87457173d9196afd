"""Snapshot files: naming, header/footer, chunked reads, raw download + freeze, superseded deletion."""

from __future__ import annotations

from pathlib import Path

import pytest
from kafka.record.memory_records import MemoryRecords

from kraft.storage.batch import SnapshotFooterRecord, SnapshotHeaderRecord
from kraft.storage.errors import CorruptRecordError, InvalidAppendError, StorageStateError
from kraft.storage.snapshot import (
    SnapshotDirectory,
    SnapshotFileId,
    parse_snapshot_file_name,
    snapshot_file_name,
)


def _write(store: SnapshotDirectory, snapshot_id: SnapshotFileId, batches: int = 3) -> Path:
    writer = store.create(snapshot_id, last_contained_log_timestamp=777, timestamp_ms=5)
    for i in range(batches):
        writer.append_records([(b"k%d" % i, b"v" * 100), (None, b"w")])
    return writer.freeze()


def test_file_names_follow_kafka() -> None:
    snapshot_id = SnapshotFileId(end_offset=1234, epoch=7)
    assert snapshot_file_name(snapshot_id) == "00000000000000001234-0000000007.checkpoint"
    assert parse_snapshot_file_name(snapshot_file_name(snapshot_id)) == snapshot_id
    assert parse_snapshot_file_name("00000000000000001234-0000000007.checkpoint.part") is None


def test_written_snapshot_has_header_data_and_footer(tmp_path: Path) -> None:
    store = SnapshotDirectory(tmp_path)
    path = _write(store, SnapshotFileId(100, 3))
    assert path.name == "00000000000000000100-0000000003.checkpoint"
    assert not list(tmp_path.glob("*.part"))
    with store.open(SnapshotFileId(100, 3)) as reader:
        batches = list(reader.batches())
        assert batches[0].control_messages() == [SnapshotHeaderRecord(last_contained_log_timestamp=777)]
        assert batches[-1].control_messages() == [SnapshotFooterRecord()]
        assert [b.base_offset for b in batches] == [0, 1, 3, 5, 7]
        assert all(b.partition_leader_epoch == 3 for b in batches)
        assert reader.header().last_contained_log_timestamp == 777
        reader.validate()
    # An independent parser reads the same file.
    records = MemoryRecords(path.read_bytes())
    count = 0
    while records.has_next():
        assert records.next_batch().validate_crc()
        count += 1
    assert count == 5


def test_chunked_reads_reassemble_the_file_and_raw_download_freezes(tmp_path: Path) -> None:
    source = SnapshotDirectory(tmp_path / "leader")
    path = _write(source, SnapshotFileId(50, 2), batches=10)
    target = SnapshotDirectory(tmp_path / "follower")
    with source.open(SnapshotFileId(50, 2)) as reader:
        download = target.create_raw(SnapshotFileId(50, 2))
        while download.size < reader.size:
            download.write(download.size, reader.read_chunk(download.size, 100))
        with pytest.raises(StorageStateError, match="outside snapshot"):
            reader.read_chunk(reader.size, 100)
    frozen = download.freeze()
    assert frozen.read_bytes() == path.read_bytes()
    assert target.latest() == SnapshotFileId(50, 2)


def test_raw_download_out_of_order_chunk_is_refused(tmp_path: Path) -> None:
    download = SnapshotDirectory(tmp_path).create_raw(SnapshotFileId(1, 1))
    with pytest.raises(InvalidAppendError, match="expected 0"):
        download.write(10, b"x")
    download.abort()
    assert not list(tmp_path.iterdir())


def test_corrupt_download_is_rejected_and_nothing_is_published(tmp_path: Path) -> None:
    source = SnapshotDirectory(tmp_path / "leader")
    data = bytearray(_write(source, SnapshotFileId(9, 1)).read_bytes())
    data[len(data) // 2] ^= 0xFF
    target = SnapshotDirectory(tmp_path / "follower")
    download = target.create_raw(SnapshotFileId(9, 1))
    download.write(0, bytes(data))
    with pytest.raises(CorruptRecordError):
        download.freeze()
    assert target.snapshot_ids() == []
    assert not list((tmp_path / "follower").iterdir())


def test_snapshot_without_footer_is_rejected(tmp_path: Path) -> None:
    source = SnapshotDirectory(tmp_path / "leader")
    full = _write(source, SnapshotFileId(9, 1)).read_bytes()
    with source.open(SnapshotFileId(9, 1)) as reader:
        footer_size = next(iter(reversed(list(reader.batches())))).size_in_bytes
    download = SnapshotDirectory(tmp_path / "follower").create_raw(SnapshotFileId(9, 1))
    download.write(0, full[:-footer_size])
    with pytest.raises(CorruptRecordError, match="SnapshotFooter"):
        download.freeze()


def test_listing_ordering_and_deleting_superseded_snapshots(tmp_path: Path) -> None:
    store = SnapshotDirectory(tmp_path)
    for snapshot_id in (SnapshotFileId(30, 2), SnapshotFileId(10, 1), SnapshotFileId(30, 1)):
        _write(store, snapshot_id, batches=1)
    assert store.snapshot_ids() == [SnapshotFileId(10, 1), SnapshotFileId(30, 1), SnapshotFileId(30, 2)]
    assert (store.earliest(), store.latest()) == (SnapshotFileId(10, 1), SnapshotFileId(30, 2))
    assert store.delete_before(SnapshotFileId(30, 2)) == [SnapshotFileId(10, 1), SnapshotFileId(30, 1)]
    assert store.snapshot_ids() == [SnapshotFileId(30, 2)]
    assert not store.delete(SnapshotFileId(10, 1))


def test_an_existing_snapshot_is_never_overwritten(tmp_path: Path) -> None:
    store = SnapshotDirectory(tmp_path)
    path = _write(store, SnapshotFileId(5, 1))
    before = path.read_bytes()
    with pytest.raises(StorageStateError, match="already exists"):
        store.create(SnapshotFileId(5, 1), last_contained_log_timestamp=0, timestamp_ms=0)
    assert path.read_bytes() == before


def test_leftover_part_files_are_removed_on_open(tmp_path: Path) -> None:
    store = SnapshotDirectory(tmp_path)
    writer = store.create(SnapshotFileId(7, 1), last_contained_log_timestamp=0, timestamp_ms=0)
    writer.append_records([(None, b"x")])
    assert list(tmp_path.glob("*.checkpoint.part"))
    SnapshotDirectory(tmp_path)  # a restart after a crash mid-write
    assert not list(tmp_path.glob("*.checkpoint.part"))
    assert store.snapshot_ids() == []
