"""Sparse indexes and the leader-epoch checkpoint: Kafka file formats, lookups, validation."""

from __future__ import annotations

import struct
from pathlib import Path

from kraft.storage.epoch_cache import LeaderEpochCache
from kraft.storage.index import OffsetIndex, TimeIndex


def test_offset_index_file_is_kafkas_big_endian_pairs(tmp_path: Path) -> None:
    index = OffsetIndex(tmp_path / "00000000000000000100.index", 100)
    index.append(last_offset=109, position=4100)
    index.append(last_offset=130, position=8300)
    index.write()
    raw = (tmp_path / "00000000000000000100.index").read_bytes()
    assert raw == struct.pack(">iiii", 9, 4100, 30, 8300)
    loaded = OffsetIndex(tmp_path / "00000000000000000100.index", 100)
    assert loaded.load(segment_size=10_000)
    assert loaded.last_entry() == (130, 8300)


def test_offset_index_lookup_returns_a_safe_scan_start() -> None:
    index = OffsetIndex(Path("unused"), 0)
    index.append(last_offset=9, position=1000)  # batch at 1000 ends at 9
    index.append(last_offset=19, position=2000)
    assert index.lookup(5) == 0  # before the first entry: scan from the start
    assert index.lookup(9) == 1000  # the batch at 1000 holds 9
    assert index.lookup(15) == 1000  # 15 is after 9: somewhere after position 1000
    assert index.lookup(25) == 2000
    index.truncate_to_position(2000)
    assert index.last_entry() == (9, 1000)


def test_offset_index_rejects_entries_that_cannot_belong_to_the_segment(tmp_path: Path) -> None:
    path = tmp_path / "00000000000000000000.index"
    for raw in (struct.pack(">ii", 5, 900), struct.pack(">iiii", 5, 100, 4, 200), b"\x00" * 7):
        path.write_bytes(raw)
        assert not OffsetIndex(path, 0).load(segment_size=500)


def test_time_index_round_trips_and_answers_timestamp_lookups(tmp_path: Path) -> None:
    index = TimeIndex(tmp_path / "00000000000000000000.timeindex", 0)
    index.maybe_append(1000, 9)
    index.maybe_append(1000, 12)  # not an increase: ignored
    index.maybe_append(2000, 19)
    index.write()
    assert (tmp_path / "00000000000000000000.timeindex").read_bytes() == struct.pack(
        ">qiqi", 1000, 9, 2000, 19
    )
    loaded = TimeIndex(tmp_path / "00000000000000000000.timeindex", 0)
    assert loaded.load()
    assert loaded.lookup(500) == 0
    assert loaded.lookup(1500) == 10  # the first batch with a timestamp >= 1500 starts after offset 9
    assert loaded.lookup(2500) is None


def test_epoch_checkpoint_is_kafkas_text_format(tmp_path: Path) -> None:
    cache = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    assert cache.assign(1, 0) and cache.assign(4, 17)
    assert not cache.assign(3, 20)  # older than the latest epoch
    cache.save()
    assert (tmp_path / "leader-epoch-checkpoint").read_text() == "0\n2\n1 0\n4 17\n"
    loaded = LeaderEpochCache(tmp_path / "leader-epoch-checkpoint")
    assert loaded.load()
    assert loaded.entries() == [(1, 0), (4, 17)]


def test_corrupt_epoch_checkpoints_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "leader-epoch-checkpoint"
    for text in ("1\n1\n1 0\n", "0\n2\n1 0\n", "0\n2\n3 5\n2 9\n", "0\n1\n1\n", "0\nx\n", "\xff"):
        path.write_text(text, encoding="latin-1")
        cache = LeaderEpochCache(path)
        assert not cache.load()
        assert cache.entries() == []


def test_truncating_the_epoch_cache_from_either_end() -> None:
    cache = LeaderEpochCache(Path("unused"))
    for epoch, start in ((1, 0), (3, 10), (5, 20)):
        cache.assign(epoch, start)
    assert cache.truncate_from_start(12)
    assert cache.entries() == [(3, 12), (5, 20)]
    assert cache.truncate_from_end(20)
    assert cache.entries() == [(3, 12)]
    assert not cache.truncate_from_end(13)
    assert cache.end_offset_for(3, log_end_offset=15) == (3, 15)
