"""The shutdown/startup protocol of many logs (close_logs, the clean-shutdown marker, deferred recovery
syncs): its order, and that a crash at any point of it loses no acknowledged (flushed) record and leaves
no file trusted without verification.

A crash is simulated by raising out of close_logs at a phase boundary, abandoning the logs, and then
putting every file the interrupted phase wrote *without* a sync into each state a power loss could leave
it in (as written, as before, empty, cut short, garbage); the reopened logs must hold every acknowledged
record, read back verified.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from kraft.storage import fileio, shutdown_marker
from kraft.storage import log as log_module
from kraft.storage.errors import FatalStorageError
from kraft.storage.fileio import SyncBarrier
from kraft.storage.log import (
    CLEAN_SHUTDOWN_FILE,
    RECOVERY_POINT_FILE,
    LogConfig,
    SegmentedLog,
    close_logs,
    sync_recovered_logs,
)

CONFIG = LogConfig(segment_bytes=4096, index_interval_bytes=200)
DEFERRED = LogConfig(segment_bytes=4096, index_interval_bytes=200, defer_recovery_sync=True)


class Crash(BaseException):
    """The process dies here (not an Exception: nothing on the way may handle it)."""


def _fill(log: SegmentedLog, batches: int, size: int = 150) -> None:
    for _ in range(batches):
        log.append_records([(None, b"r" * size)] * 2, leader_epoch=1, timestamp_ms=1_000)


def _read_verified(log: SegmentedLog) -> bytes:
    """Every batch from the start, through read() (which verifies CRCs, chaining and epochs)."""
    out: list[bytes] = []
    offset = log.start_offset
    while offset < log.end_offset:
        result = log.read(offset, 1 << 20)
        out.append(result.records)
        offset = result.next_offset
    return b"".join(out)


def _setup(root: Path, count: int) -> tuple[list[SegmentedLog], list[bytes]]:
    """``count`` logs, each with acknowledged (flushed) batches over two segments and an unflushed tail."""
    logs = [SegmentedLog.open(root / f"t-{i}", CONFIG) for i in range(count)]
    acked: list[bytes] = []
    for log in logs:
        _fill(log, 20 + len(acked))
        log.flush()
        acked.append(log.read_all_batches())
        _fill(log, 3)  # produced, not flushed: not acknowledged (a crash may lose it)
    return logs, acked


def _check_reopened(root: Path, acked: list[bytes]) -> list[SegmentedLog]:
    reopened = []
    for i, expected in enumerate(acked):
        log = SegmentedLog.open(root / f"t-{i}", CONFIG)
        data = _read_verified(log)
        assert data.startswith(expected), f"log {i} lost acknowledged records"
        assert data == log.read_all_batches()
        reopened.append(log)
    return reopened


def _damage_variants(path: Path, before: bytes | None) -> Iterator[str]:
    """Put ``path`` in each state a crash could leave an unsynced rewrite in; yields the state's name."""
    written = path.read_bytes()
    yield "as written"
    if before is not None:
        path.write_bytes(before)
        yield "as before"
    path.write_bytes(b"")
    yield "empty"
    if len(written) > 1:
        path.write_bytes(written[: len(written) // 2])
        yield "cut short"
    path.write_bytes(b"\xff" * max(len(written), 8))
    yield "garbage"
    path.write_bytes(written)


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


def test_close_runs_data_syncs_then_a_barrier_then_the_markers_then_a_barrier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, _acked = _setup(tmp_path, 20)  # 20 directories: the syncfs barrier
    events: list[str] = []
    real_fdatasync, real_write = os.fdatasync, shutdown_marker.write
    real_sync, real_overwrite = SyncBarrier.sync, fileio.overwrite_unsynced

    def fdatasync(fd: int) -> None:
        events.append("data")
        real_fdatasync(fd)

    def overwrite(path: Path, data: bytes) -> None:
        events.append("recovery point" if path.name == RECOVERY_POINT_FILE else "index")
        real_overwrite(path, data)

    def sync(self: SyncBarrier) -> None:
        assert self.uses_syncfs
        events.append("barrier")
        real_sync(self)

    def marker(directory: Path, *, clean: bool, end_offset: int, sync: bool) -> Path:
        events.append("clean marker" if clean else "dirty marker")
        return real_write(directory, clean=clean, end_offset=end_offset, sync=sync)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    monkeypatch.setattr(log_module, "overwrite_unsynced", overwrite)
    monkeypatch.setattr(SyncBarrier, "sync", sync)
    monkeypatch.setattr(shutdown_marker, "write", marker)
    close_logs(logs)
    first_barrier = events.index("barrier")
    # Phase 1: the unflushed tails of all 20 logs are synced before any metadata is written ...
    assert events[:first_barrier].count("data") >= 20
    assert max(i for i, e in enumerate(events) if e == "data") < events.index("index")
    assert events.index("data") < events.index("recovery point")
    # ... phase 2's rewrites come before the first barrier, the clean markers only after it, and a
    # second barrier follows them.  Two barriers in all, whatever the number of logs.
    assert "clean marker" not in events[:first_barrier]
    assert events[first_barrier + 1 :].count("clean marker") == 20
    assert events[-1] == "barrier"
    assert events.count("barrier") == 2
    assert all(shutdown_marker.read(log.dir).clean for log in logs)


def test_an_unchanged_log_closes_without_rewriting_anything_but_its_marker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, acked = _setup(tmp_path, 3)
    close_logs(logs)
    logs = _check_reopened(tmp_path, acked)
    rewrites: list[Path] = []
    syncs: list[int] = []
    real_overwrite = fileio.overwrite_unsynced

    def overwrite(path: Path, data: bytes) -> None:
        rewrites.append(path)
        real_overwrite(path, data)

    monkeypatch.setattr(log_module, "overwrite_unsynced", overwrite)
    monkeypatch.setattr(os, "fdatasync", syncs.append)
    close_logs(logs)
    assert rewrites == []
    assert syncs == []  # nothing was written since the open: no data sync
    assert all(shutdown_marker.read(log.dir).clean for log in logs)


def test_a_crash_after_the_data_syncs_loses_nothing_acknowledged(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, acked = _setup(tmp_path, 3)

    def crash(*_args: Any) -> None:
        raise Crash

    monkeypatch.setattr(SyncBarrier, "__init__", crash)  # phase 2 starts by creating its barrier
    with pytest.raises(Crash):
        close_logs(logs)
    monkeypatch.undo()
    for log in logs:
        log.abandon()
        assert not shutdown_marker.read(log.dir).clean
    for i, log in enumerate(_check_reopened(tmp_path, acked)):
        # Phase 1 synced the unflushed tails too: nothing at all was lost.
        assert log.end_offset == 2 * (20 + i + 3)
        log.close()


def test_a_crash_before_the_metadata_barrier_leaves_only_files_that_are_verified(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, acked = _setup(tmp_path, 2)
    before = _snapshot(tmp_path)
    unsynced: list[Path] = []
    real_overwrite = fileio.overwrite_unsynced

    def overwrite(path: Path, data: bytes) -> None:
        unsynced.append(path)
        real_overwrite(path, data)

    def crash(_self: SyncBarrier) -> None:
        raise Crash

    monkeypatch.setattr(log_module, "overwrite_unsynced", overwrite)
    monkeypatch.setattr(SyncBarrier, "sync", crash)
    with pytest.raises(Crash):
        close_logs(logs)
    monkeypatch.undo()
    for log in logs:
        log.abandon()
    names = {p.name for p in unsynced}
    assert RECOVERY_POINT_FILE in names
    assert any(name.endswith(".index") for name in names)
    assert any(name.endswith(".timeindex") for name in names)
    assert not any(shutdown_marker.read(log.dir).clean for log in logs)
    states = 0
    for path in unsynced:
        for _state in _damage_variants(path, before.get(path)):
            saved = _snapshot(tmp_path)
            for log in _check_reopened(tmp_path, acked):
                log.abandon()  # keep the files as the crash left them for the next variant
            for p, data in saved.items():  # an open may repair; every variant starts from the crash
                p.write_bytes(data)
            states += 1
    assert states >= 4 * len(unsynced)


def test_a_crash_among_the_marker_writes_recovers_the_unmarked_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, acked = _setup(tmp_path, 3)
    real_write = shutdown_marker.write
    written: list[Path] = []

    def marker(directory: Path, *, clean: bool, end_offset: int, sync: bool) -> Path:
        if clean and written:
            raise Crash  # the second log's marker is never written
        path = real_write(directory, clean=clean, end_offset=end_offset, sync=sync)
        written.append(path)
        return path

    monkeypatch.setattr(shutdown_marker, "write", marker)
    with pytest.raises(Crash):
        close_logs(logs)
    monkeypatch.undo()
    for log in logs:
        log.abandon()
    assert [shutdown_marker.read(log.dir).clean for log in logs] == [True, False, False]
    marker_path = written[0]
    for _state in _damage_variants(marker_path, None):
        for log in _check_reopened(tmp_path, acked):
            log.abandon()
    for log in _check_reopened(tmp_path, acked):
        log.close()


def test_a_clean_marker_never_outlives_a_change_after_the_open(tmp_path: Path) -> None:
    logs, acked = _setup(tmp_path, 1)
    close_logs(logs)
    log = SegmentedLog.open(tmp_path / "t-0", CONFIG)
    assert shutdown_marker.read(log.dir).clean  # a clean open writes (and syncs) nothing ...
    _fill(log, 2)  # ... but the first change rewrites the marker dirty (synced) before its bytes
    assert not shutdown_marker.read(log.dir).clean
    newest = log.segments()[-1].path
    log.abandon()
    with newest.open("ab") as f:  # the crash tore the unflushed tail
        f.write(b"\x00\x00\x00\x00\x00\x00\x00\x99torn")
    reopened = SegmentedLog.open(tmp_path / "t-0", CONFIG)  # recovered, not trusted: no CorruptLogError
    assert reopened.recovered_bytes_truncated == 12
    assert _read_verified(reopened).startswith(acked[0])
    reopened.close()


@pytest.mark.parametrize(
    "damage",
    [
        lambda raw: raw[:-1],  # torn
        lambda raw: raw[:8] + b"D" + raw[9:],  # the state byte flipped (CRC mismatch)
        lambda raw: raw[:12] + bytes([raw[12] ^ 1]) + raw[13:],  # a bit of the end offset (CRC)
        lambda raw: b"",  # an older version's empty marker
        lambda raw: raw + b"x",  # too long
    ],
    ids=["torn", "flipped", "offset-bit", "empty", "long"],
)
def test_a_damaged_marker_means_recover(tmp_path: Path, damage: Callable[[bytes], bytes]) -> None:
    logs, acked = _setup(tmp_path, 1)
    close_logs(logs)
    marker = tmp_path / "t-0" / CLEAN_SHUTDOWN_FILE
    marker.write_bytes(damage(marker.read_bytes()))
    assert not shutdown_marker.read(tmp_path / "t-0").clean
    newest = sorted((tmp_path / "t-0").glob("*.log"))[-1]
    with newest.open("ab") as f:  # a tail no clean close would leave: only a recovery may cut it
        f.write(b"\x01" * 7)
    log = SegmentedLog.open(tmp_path / "t-0", CONFIG)
    assert log.recovered_bytes_truncated == 7
    assert _read_verified(log).startswith(acked[0])
    log.close()
    assert shutdown_marker.read(tmp_path / "t-0").clean


def test_a_failed_data_sync_leaves_that_log_unmarked_and_closes_the_others(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, acked = _setup(tmp_path, 3)
    bad = logs[1]._segments[-1].file_descriptor()
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        if fd == bad:
            raise OSError(5, "Input/output error")
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    with pytest.raises(FatalStorageError, match="Input/output error"):
        close_logs(logs)
    monkeypatch.undo()
    assert [shutdown_marker.read(log.dir).clean for log in logs] == [True, False, True]
    for log in _check_reopened(tmp_path, acked):
        log.close()


def test_a_failed_barrier_marks_no_log_clean(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    logs, acked = _setup(tmp_path, 20)
    monkeypatch.setattr(fileio, "_SYNCFS", lambda fd: -1)
    with pytest.raises(FatalStorageError, match="syncfs failed"):
        close_logs(logs)
    monkeypatch.undo()
    assert not any(shutdown_marker.read(log.dir).clean for log in logs)
    for log in _check_reopened(tmp_path, acked):
        log.close()


def test_few_logs_fsync_each_rewritten_file_instead_of_the_filesystem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, _acked = _setup(tmp_path, 2)
    fsynced: list[str] = []
    real_fsync = os.fsync
    monkeypatch.setattr(fileio, "_SYNCFS", None)  # any call would fail: must not be used

    def fsync(fd: int) -> None:
        fsynced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    close_logs(logs)
    names = {Path(p).name for p in fsynced}
    assert {RECOVERY_POINT_FILE, CLEAN_SHUTDOWN_FILE, "t-0", "t-1"} <= names


def test_a_crash_open_defers_the_recovery_syncs_to_one_parallel_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, acked = _setup(tmp_path, 4)
    for log in logs:
        log.abandon()  # kill -9: no marker, unflushed tails
    synced: list[int] = []
    real_fdatasync = os.fdatasync

    def fdatasync(fd: int) -> None:
        synced.append(fd)
        real_fdatasync(fd)

    monkeypatch.setattr(os, "fdatasync", fdatasync)
    reopened = [SegmentedLog.open(tmp_path / f"t-{i}", DEFERRED) for i in range(4)]
    assert synced == []
    pending = sum(len(log._unsynced) for log in reopened)
    assert pending >= 4  # at least each log's newest segment
    for log in reopened:
        # Until synced, only the recovery point counts as flushed (nothing is claimed durable early).
        assert log._flushed_offset == log.recovery_point < log.end_offset
    assert sync_recovered_logs(reopened) == {}
    assert len(synced) == pending
    for log, expected in zip(reopened, acked, strict=True):
        assert log.flushed_offset == log.end_offset
        assert _read_verified(log).startswith(expected)
        log.close()


def test_a_deferred_recovery_sync_runs_on_first_use_and_its_failure_is_fatal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    logs, _acked = _setup(tmp_path, 2)
    for log in logs:
        log.abandon()
    first, second = (SegmentedLog.open(tmp_path / f"t-{i}", DEFERRED) for i in range(2))
    # Never synced by sync_recovered_logs: the first use syncs it.
    assert first.flushed_offset == first.end_offset

    def failing(_fd: int) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(os, "fdatasync", failing)
    failed = sync_recovered_logs([second])
    assert list(failed) == [second]
    monkeypatch.undo()
    with pytest.raises(FatalStorageError, match="failed earlier"):
        second.read(0, 100)
    second.close()  # a failed log is never marked clean
    assert not shutdown_marker.read(second.dir).clean
    first.close()
