"""SegmentedLog: appends, reads, rolls, truncation, retention, epoch cache, durability errors."""

from __future__ import annotations

import errno
import os
import tempfile
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from storage_helpers import LogModel, scan_batches

from kraft.storage import shutdown_marker
from kraft.storage.batch import build_batch, iter_batches, peek_batch_header
from kraft.storage.epoch_cache import LeaderEpochCache
from kraft.storage.errors import (
    CorruptRecordError,
    FatalStorageError,
    InvalidAppendError,
    OffsetOutOfRangeError,
    RecordTooLargeError,
    StorageStateError,
)
from kraft.storage.log import CLEAN_SHUTDOWN_FILE, LogConfig, SegmentedLog

SMALL = LogConfig(segment_bytes=2048, index_interval_bytes=200)


def _fill(log: SegmentedLog, batches: int, *, epoch: int = 1, size: int = 100) -> None:
    for _ in range(batches):
        log.append_records([(None, b"x" * size)] * 2, leader_epoch=epoch, timestamp_ms=0)


def test_append_assigns_offsets_and_reads_return_whole_batches(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        assert (log.start_offset, log.end_offset, log.last_epoch) == (0, 0, -1)
        assert log.append_records([(b"a", b"1"), (b"b", b"2")], leader_epoch=3, timestamp_ms=10) == (0, 1)
        assert log.append_records([(b"c", b"3")], leader_epoch=3, timestamp_ms=11) == (2, 2)
        read = log.read(1, 10_000)
        assert (read.first_offset, read.next_offset) == (0, 3)
        assert [b.base_offset for b in iter_batches(read.records)] == [0, 2]
        assert log.read(3, 100) == (b"", 3, 3)
        assert log.last_epoch == 3


def test_read_returns_at_least_one_batch_and_respects_max_bytes_and_max_offset(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "p-0", LogConfig()) as log:
        _fill(log, 5, size=300)
        one = log.read(0, 10)  # smaller than a batch: still the whole first batch
        assert (one.first_offset, one.next_offset) == (0, 2)
        two = log.read(0, 2 * len(one.records))
        assert two.next_offset == 4
        capped = log.read(0, 1 << 20, max_offset=4)
        assert capped.next_offset == 4
        assert log.read(4, 1 << 20, max_offset=4).records == b""


def test_reads_outside_the_log_raise_offset_out_of_range(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        _fill(log, 2)
        with pytest.raises(OffsetOutOfRangeError, match=r"offset 5 is outside the log range \[0, 4\]"):
            log.read(5, 100)


def test_segments_roll_by_size_and_time(tmp_path: Path) -> None:
    config = LogConfig(segment_bytes=2048, segment_ms=1000, index_interval_bytes=200)
    with SegmentedLog.open(tmp_path / "p-0", config) as log:
        _fill(log, 10, size=200)
        by_size = log.segments()
        assert len(by_size) > 1
        assert all(s.size_in_bytes <= 2048 for s in by_size)
        log.append_records([(None, b"t")], leader_epoch=1, timestamp_ms=5000)  # 5 s after the segment's first
        assert log.segments()[-1].base_offset == log.end_offset - 1
        names = sorted(p.name for p in (tmp_path / "p-0").glob("*.log"))
        assert names == [f"{s.base_offset:020d}.log" for s in log.segments()]


def test_append_batch_validates_before_writing_anything(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "p-0", LogConfig(max_batch_bytes=1000)) as log:
        _fill(log, 1, size=10)
        good = build_batch(2, [(None, b"ok")], leader_epoch=1, timestamp_ms=0)
        corrupt = bytearray(build_batch(3, [(None, b"bad")], leader_epoch=1, timestamp_ms=0))
        corrupt[-1] ^= 1
        with pytest.raises(CorruptRecordError):
            log.append_batch(good + bytes(corrupt))
        wrong_magic = bytearray(build_batch(2, [(None, b"m")], leader_epoch=1, timestamp_ms=0))
        wrong_magic[16] = 1
        with pytest.raises(CorruptRecordError, match="magic 1, expected 2"):
            log.append_batch(bytes(wrong_magic))
        with pytest.raises(InvalidAppendError, match="does not continue the log at 2"):
            log.append_batch(build_batch(7, [(None, b"x")], leader_epoch=1, timestamp_ms=0))
        with pytest.raises(RecordTooLargeError):
            log.append_batch(build_batch(2, [(None, b"x" * 2000)], leader_epoch=1, timestamp_ms=0))
        with pytest.raises(InvalidAppendError, match="below the log's latest epoch 1"):
            log.append_batch(build_batch(2, [(None, b"x")], leader_epoch=0, timestamp_ms=0))
        with pytest.raises(CorruptRecordError, match="truncated batch header at position"):
            log.append_batch(good + b"\x00" * 10)
        assert log.end_offset == 2
        assert log.append_batch(good + build_batch(3, [(None, b"y")], leader_epoch=2, timestamp_ms=0)) == (
            2,
            3,
        )
        assert log.epoch_entries() == [(1, 0), (2, 3)]


def test_end_offset_for_epoch_follows_kafka_semantics(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        for epoch, count in ((2, 3), (4, 2), (7, 1)):
            for _ in range(count):
                log.append_records([(None, b"v")], leader_epoch=epoch, timestamp_ms=0)
        assert log.epoch_entries() == [(2, 0), (4, 3), (7, 5)]
        assert log.end_offset_for_epoch(7) == (7, 6)  # latest → log end
        assert log.end_offset_for_epoch(4) == (4, 5)
        assert log.end_offset_for_epoch(5) == (4, 5)  # unknown → largest epoch below it
        assert log.end_offset_for_epoch(1) == (1, 0)  # below the first epoch
        assert log.end_offset_for_epoch(8) == (-1, -1)  # newer than anything
        assert log.epoch_for_offset(4) == 4


def test_flush_covers_many_batches_with_one_fsync(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with SegmentedLog.open(tmp_path / "p-0", LogConfig()) as log:
        _fill(log, 20)
        calls: list[int] = []
        real_fsync = os.fsync

        def counting_fsync(fd: int) -> None:
            calls.append(fd)
            real_fsync(fd)

        monkeypatch.setattr(os, "fsync", counting_fsync)
        monkeypatch.setattr(os, "fdatasync", counting_fsync)
        assert log.flushed_offset == 0
        assert log.flush() == 40
        assert len(calls) == 1
        assert log.flushed_offset == 40
        assert log.flush() == 40
        assert len(calls) == 1  # nothing new to make durable


def test_failed_fsync_is_fatal_and_never_retried(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = SegmentedLog.open(tmp_path / "p-0", SMALL)
    _fill(log, 1)

    def failing_fsync(_fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    monkeypatch.setattr(os, "fdatasync", failing_fsync)
    with pytest.raises(FatalStorageError, match=r"f(data)?sync of .* failed \(Input/output error\)"):
        log.flush()
    monkeypatch.undo()
    with pytest.raises(FatalStorageError, match="failed earlier"):
        log.flush()
    with pytest.raises(FatalStorageError):
        log.append_records([(None, b"x")], leader_epoch=1, timestamp_ms=0)
    assert log.flushed_offset == 0
    log.close()  # a failed log is never marked clean: the next open recovers it
    assert not shutdown_marker.read(tmp_path / "p-0").clean


def test_flush_may_run_in_a_worker_thread_while_appends_continue(tmp_path: Path) -> None:
    log = SegmentedLog.open(tmp_path / "p-0", SMALL)
    stop = threading.Event()
    flushed: list[int] = []
    errors: list[BaseException] = []

    def flusher() -> None:
        try:
            while not stop.is_set():
                flushed.append(log.flush())
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    worker = threading.Thread(target=flusher, daemon=True)
    worker.start()
    try:
        for i in range(200):
            log.append_records([(None, b"c" * 50)], leader_epoch=1 + i // 50, timestamp_ms=i)
    finally:
        stop.set()
        worker.join(timeout=30)
    assert not worker.is_alive() and not errors
    assert flushed == sorted(flushed) and all(f <= 200 for f in flushed)
    assert log.flush() == 200
    log.abandon()  # crash right after the last flush: everything must come back
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as reopened:
        assert reopened.end_offset == 200
        assert [b.base_offset for b in iter_batches(reopened.read_all_batches())] == list(range(200))
        assert reopened.epoch_entries() == [(1, 0), (2, 50), (3, 100), (4, 150)]


def test_truncate_to_removes_whole_batches_and_trims_the_epoch_cache(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        for epoch in (1, 1, 2, 2, 3):
            log.append_records([(None, b"a" * 150)] * 3, leader_epoch=epoch, timestamp_ms=0)
        log.flush()
        assert log.truncate_to(10) == 9  # offset 10 sits in batch [9, 12), which goes entirely
        assert log.epoch_entries() == [(1, 0), (2, 6)]
        assert log.flushed_offset == 9
        assert log.truncate_to(6) == 6
        assert log.epoch_entries() == [(1, 0)]
        assert log.end_offset_for_epoch(1) == (1, 6)
        log.append_records([(None, b"new")], leader_epoch=5, timestamp_ms=0)
        assert log.epoch_entries() == [(1, 0), (5, 6)]
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        assert (log.end_offset, log.epoch_entries()) == (7, [(1, 0), (5, 6)])


def test_delete_before_removes_whole_segments_and_moves_the_log_start(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        for epoch in range(1, 11):
            log.append_records([(None, b"z" * 300)] * 2, leader_epoch=epoch, timestamp_ms=0)
        segments = log.segments()
        assert len(segments) >= 3
        target = segments[2].base_offset + 1
        assert log.delete_before(target) == 2
        assert log.start_offset == target
        assert log.segments()[0].base_offset == segments[2].base_offset
        assert log.epoch_entries()[0] == (log.epoch_for_offset(target), target)
        with pytest.raises(OffsetOutOfRangeError):
            log.read(target - 1, 10)
        assert log.read(target, 10).first_offset <= target
        with pytest.raises(OffsetOutOfRangeError, match="beyond its end"):
            log.delete_before(log.end_offset + 1)
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        assert log.start_offset == target


def test_truncate_fully_and_start_at_restarts_an_empty_log(tmp_path: Path) -> None:
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        _fill(log, 12)
        log.truncate_fully_and_start_at(1000)
        assert (log.start_offset, log.end_offset, log.flushed_offset, log.last_epoch) == (
            1000,
            1000,
            1000,
            -1,
        )
        assert [s.base_offset for s in log.segments()] == [1000]
        assert log.append_records([(None, b"x")], leader_epoch=9, timestamp_ms=0) == (1000, 1000)
    with SegmentedLog.open(tmp_path / "p-0", SMALL) as log:
        assert (log.start_offset, log.end_offset, log.epoch_entries()) == (1000, 1001, [(9, 1000)])


def test_clean_shutdown_marker_says_clean_only_while_closed_and_unchanged(tmp_path: Path) -> None:
    directory = tmp_path / "p-0"
    log = SegmentedLog.open(directory, SMALL)
    assert (directory / CLEAN_SHUTDOWN_FILE).exists()  # created once, dirty
    assert not shutdown_marker.read(directory).clean
    _fill(log, 3)
    log.close()
    assert shutdown_marker.read(directory) == (True, 6, True)
    log = SegmentedLog.open(directory, SMALL)
    # Still clean on disk while nothing changed (a clean open syncs nothing) ...
    assert shutdown_marker.read(directory).clean
    assert log.read(0, 1 << 20).next_offset > 0
    # ... and dirty, durably, before the first change.
    _fill(log, 1)
    assert not shutdown_marker.read(directory).clean
    assert log.end_offset == 8
    log.close()
    assert shutdown_marker.read(directory) == (True, 8, True)


def test_missing_epoch_checkpoint_is_rebuilt_from_the_segments(tmp_path: Path) -> None:
    directory = tmp_path / "p-0"
    with SegmentedLog.open(directory, SMALL) as log:
        for epoch in (1, 2, 2, 4):
            log.append_records([(None, b"e" * 400)], leader_epoch=epoch, timestamp_ms=0)
        expected = log.epoch_entries()
    (directory / "leader-epoch-checkpoint").write_text("garbage")
    with SegmentedLog.open(directory, SMALL) as log:
        assert log.epoch_entries() == expected
    assert LeaderEpochCache(directory / "leader-epoch-checkpoint").load()


def test_opening_a_missing_directory_without_create_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(StorageStateError, match="does not exist"):
        SegmentedLog.open(tmp_path / "nope", create=False)


def test_unexpected_segment_names_are_refused(tmp_path: Path) -> None:
    directory = tmp_path / "p-0"
    directory.mkdir()
    (directory / "12.log").write_bytes(b"")
    with pytest.raises(StorageStateError, match="unexpected segment file name"):
        SegmentedLog.open(directory)
    assert (directory / "12.log").exists()


ops = st.lists(
    st.one_of(
        st.tuples(st.just("append"), st.integers(1, 3), st.integers(0, 250), st.booleans()),
        st.tuples(st.just("truncate"), st.floats(0, 1)),
        st.tuples(st.just("delete_before"), st.floats(0, 1)),
        st.tuples(st.just("reopen"), st.booleans()),
        st.just(("flush",)),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_truncate_and_delete_before_keep_offsets_and_epochs_consistent(
    operations: list[tuple[Any, ...]],
) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp) / "p-0"
        log = SegmentedLog.open(directory, SMALL)
        model = LogModel()
        epoch = 1
        try:
            for op in operations:
                span = model.end_offset - model.start_offset
                if op[0] == "append":
                    _, count, size, bump = op
                    epoch += int(bump)
                    base = log.end_offset
                    log.append_records([(None, b"v" * size)] * count, leader_epoch=epoch, timestamp_ms=base)
                    data = log.read(base, 1).records
                    model.add(data, peek_batch_header(data))
                elif op[0] == "truncate":
                    target = model.start_offset + int(op[1] * span)
                    new_end = log.truncate_to(target)
                    model.truncate_to(target)
                    assert new_end == model.end_offset
                elif op[0] == "delete_before":
                    target = model.start_offset + int(op[1] * span)
                    log.delete_before(target)
                    model.delete_before(target)
                elif op[0] == "reopen":
                    if op[1]:
                        log.close()
                    else:
                        log.flush()
                        log.abandon()
                    log = SegmentedLog.open(directory, SMALL)
                else:
                    log.flush()
                assert (log.start_offset, log.end_offset) == (model.start_offset, model.end_offset)
                assert log.epoch_entries() == model.epoch_entries()
                present = {h.base_offset: raw for h, raw in scan_batches(log)}
                live = [b for b in model.batches if b.next_offset > model.start_offset]
                for batch in live:
                    assert present[batch.base_offset] == batch.data
                    assert log.read(max(batch.base_offset, model.start_offset), 1).records == batch.data
        finally:
            log.close()
