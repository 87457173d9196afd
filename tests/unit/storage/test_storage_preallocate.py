"""Preallocated segments: the metadata log keeps zero-filled space ahead of its data so a flush is an
fdatasync that never grows the file.  The zeros must never be read as data, must be trimmed when a
segment stops being active or the log closes cleanly, and must not count as damage after a crash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kraft.storage.dump import dump_file, format_file_dump
from kraft.storage.log import LogConfig, SegmentedLog

PREALLOCATED = LogConfig(segment_bytes=64 * 1024, index_interval_bytes=256, preallocate_bytes=8192)


def _append(log: SegmentedLog, count: int, size: int = 100) -> None:
    for i in range(count):
        log.append_records([(b"k", bytes([i % 251]) * size)], leader_epoch=1, timestamp_ms=1000 + i)


def _segment_files(directory: Path) -> list[Path]:
    return sorted(directory.glob("*.log"))


def test_active_segment_runs_ahead_of_its_data_and_reads_stop_at_the_data(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "m-0", PREALLOCATED) as log:
        _append(log, 5)
        (info,) = log.segments()
        physical = info.path.stat().st_size
        assert physical >= info.size_in_bytes + PREALLOCATED.preallocate_bytes
        assert physical % 4096 == 0
        assert len(log.read_all_batches()) == info.size_in_bytes
        assert log.read(log.end_offset, 1 << 20).records == b""


def test_flushes_within_the_preallocated_space_use_fdatasync_and_keep_the_file_size(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with SegmentedLog.open(tmp_path / "m-0", PREALLOCATED) as log:
        _append(log, 1)
        log.flush()
        (info,) = log.segments()
        physical = info.path.stat().st_size
        calls: list[str] = []
        real_fsync, real_fdatasync = os.fsync, os.fdatasync

        def fsync(fd: int) -> None:
            calls.append("fsync")
            real_fsync(fd)

        def fdatasync(fd: int) -> None:
            calls.append("fdatasync")
            real_fdatasync(fd)

        monkeypatch.setattr(os, "fsync", fsync)
        monkeypatch.setattr(os, "fdatasync", fdatasync)
        for _ in range(10):
            _append(log, 3)
            log.flush()
        assert calls == ["fdatasync"] * 10
        assert info.path.stat().st_size == physical  # 30 small batches fit in the zero-filled space


def test_crash_leaves_a_zero_tail_that_recovery_cuts_without_reporting_damage(tmp_path: Path) -> None:
    directory = tmp_path / "m-0"
    log = SegmentedLog.open(directory, PREALLOCATED)
    _append(log, 40)
    log.flush()
    end, size = log.end_offset, log.size_in_bytes
    log.abandon()  # crash: no trim, no clean-shutdown marker
    (path,) = _segment_files(directory)
    assert path.stat().st_size > size
    dumped = dump_file(path, with_records=False)
    assert dumped["error"] is None
    assert dumped["validBytes"] == size
    assert dumped["preallocatedBytes"] == path.stat().st_size - size
    assert any("Preallocated" in line for line in format_file_dump(dumped))

    with SegmentedLog.open(directory, PREALLOCATED) as reopened:
        assert reopened.end_offset == end
        assert reopened.recovered_bytes_truncated == 0
        _append(reopened, 1)  # and the log keeps working (preallocating again)
        assert reopened.end_offset == end + 1


def test_torn_batch_before_the_zeros_is_still_damage(tmp_path: Path) -> None:
    directory = tmp_path / "m-0"
    log = SegmentedLog.open(directory, PREALLOCATED)
    _append(log, 10)
    log.flush()
    size = log.size_in_bytes
    log.abandon()
    (path,) = _segment_files(directory)
    with open(path, "r+b") as f:  # half a header where the next batch would start
        f.seek(size)
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x0a\x00\x00\x01")
    with SegmentedLog.open(directory, PREALLOCATED) as reopened:
        assert reopened.end_offset == 10
        assert reopened.recovered_bytes_truncated > 0


def test_roll_and_clean_close_trim_every_segment_to_its_batches(tmp_path: Path) -> None:
    directory = tmp_path / "m-0"
    with SegmentedLog.open(directory, PREALLOCATED) as log:
        _append(log, 5)
        log.roll()
        _append(log, 5)
        first, second = log.segments()
        assert first.path.stat().st_size == first.size_in_bytes  # no longer active: trimmed
        assert second.path.stat().st_size > second.size_in_bytes
    for info_path, batches in zip(_segment_files(directory), (5, 5), strict=True):
        dumped = dump_file(info_path, with_records=False)
        assert dumped["preallocatedBytes"] == 0
        assert dumped["size"] == dumped["validBytes"]
        assert len(dumped["batches"]) == batches
    with SegmentedLog.open(directory, PREALLOCATED) as reopened:  # the trusted (clean) path
        assert reopened.end_offset == 10


def test_truncation_inside_the_active_segment_then_appends(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "m-0", PREALLOCATED) as log:
        _append(log, 20)
        log.truncate_to(7)
        assert log.end_offset == 7
        _append(log, 3)
        assert log.end_offset == 10
        assert log.read(7, 1).first_offset == 7
        assert len(log.read_all_batches()) == log.size_in_bytes


def test_negative_preallocation_is_rejected() -> None:
    with pytest.raises(ValueError, match="preallocate_bytes"):
        LogConfig(preallocate_bytes=-1)
