"""Fail-stop of the controller's own disk writes outside the Raft log (issue #14): the image store
(``metadata-image.sqlite``) and metadata snapshots.  A full disk or an I/O error there reports one fatal
reason to the node's supervisor (one ``event=fatal`` line, exit 70) instead of a retry loop in a process
that looks alive, a deleted store, or a traceback."""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import io
import sqlite3
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from kraft.clock import ManualClock
from kraft.metadata.controller import QuorumController
from kraft.metadata.image import MetadataImage
from kraft.metadata.snapshotter import SNAPSHOT_FATAL, Snapshotter
from kraft.metadata.store import SqliteImageStore, is_storage_failure
from kraft.metadata.store_writer import IMAGE_STORE_FATAL
from kraft.node.supervisor import EXIT_FATAL, Supervisor
from kraft.observability.logging import configure_logging, get_logger
from kraft.observability.metrics import ControllerMetrics
from kraft.raft.api import SnapshotWriter
from kraft.raft.messages import SnapshotId

from .fake_raft import FakeRaft, FakeSnapshotWriter

CLUSTER = "c1"
ENDPOINTS = {1: ("127.0.0.1", 9101)}


def full_disk() -> sqlite3.OperationalError:
    """The error SQLite raises when a write finds no room (SQLITE_FULL), with the codes Python sets."""
    error = sqlite3.OperationalError("database or disk is full")
    error.sqlite_errorcode = sqlite3.SQLITE_FULL
    error.sqlite_errorname = "SQLITE_FULL"
    return error


class Exited(BaseException):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def fake_exit(code: int) -> NoReturn:
    raise Exited(code)


class NoWatchdog:
    def cancel(self) -> None:
        return None


def supervisor() -> Supervisor:
    return Supervisor(
        get_logger("controller", node=1),
        exit_process=fake_exit,
        start_watchdog=lambda _deadline, _fire: NoWatchdog(),
    )


class Reports:
    """Records what would be reported to ``Supervisor.fail``."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, BaseException | None, dict[str, object]]] = []

    def __call__(self, reason: str, error: BaseException | None = None, **fields: object) -> None:
        self.calls.append((reason, error, fields))


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("INFO", stream)
    try:
        yield stream
    finally:
        configure_logging("INFO")


def failing_save(calls: list[int], error: Callable[[], BaseException]) -> object:
    async def save(self: SqliteImageStore, image: MetadataImage) -> None:
        calls.append(image.offset)
        raise error()

    return save


def store_task(controller: QuorumController) -> asyncio.Task[object]:
    [task] = [t for t in controller.background_tasks if t.get_name() == "controller-store"]
    return task


async def test_a_full_disk_on_an_image_store_save_is_one_fatal_line_and_exit_70(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_stream: io.StringIO
) -> None:
    sup = supervisor()
    path = tmp_path / "metadata-image.sqlite"
    controller = QuorumController(
        FakeRaft(1), CLUSTER, ENDPOINTS, store_path=path, clock=ManualClock(), on_fatal=sup.fail
    )
    await controller.start()
    saves: list[int] = []
    monkeypatch.setattr(SqliteImageStore, "save", failing_save(saves, full_disk))
    try:
        controller.store.mark_dirty()
        failure = await asyncio.wait_for(sup.wait(asyncio.Event().wait()), 5)
        assert failure is not None and failure.reason == IMAGE_STORE_FATAL
        await asyncio.wait_for(store_task(controller), 5)  # the writer stopped: no retry loop left behind
        assert saves == [-1]
        with pytest.raises(Exited) as exited:
            await sup.fail_stop()
        assert exited.value.code == EXIT_FATAL
    finally:
        await controller.stop()
    lines = log_stream.getvalue().splitlines()
    [line] = [line for line in lines if " event=fatal " in line]
    assert "reason=image_store_write_failed" in line and "op=save" in line, line
    assert "sqlite_error=SQLITE_FULL" in line and "database or disk is full" in line, line
    assert f"file={path}" in line and "exit_code=70" in line, line
    assert not any("Traceback" in line or "image_store_save_failed" in line for line in lines)


async def test_an_os_error_on_a_save_names_its_errno_and_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reports = Reports()
    wal = tmp_path / "metadata-image.sqlite-wal"
    controller = QuorumController(
        FakeRaft(1),
        CLUSTER,
        ENDPOINTS,
        store_path=tmp_path / "metadata-image.sqlite",
        clock=ManualClock(),
        on_fatal=reports,
    )
    await controller.start()
    saves: list[int] = []
    monkeypatch.setattr(
        SqliteImageStore,
        "save",
        failing_save(saves, lambda: OSError(errno.ENOSPC, "No space left on device", str(wal))),
    )
    try:
        controller.store.mark_dirty()
        await asyncio.wait_for(store_task(controller), 5)
    finally:
        await controller.stop()
    [(reason, error, fields)] = reports.calls
    assert reason == IMAGE_STORE_FATAL and isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert fields["op"] == "save" and fields["offset"] == -1
    sup = supervisor()
    sup.fail(reason, error, **fields)
    assert sup.failure is not None
    assert sup.failure.fields["errno"] == "ENOSPC" and sup.failure.fields["file"] == str(wal)


async def test_without_a_supervisor_a_failed_save_ends_the_writer_with_the_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    controller = QuorumController(
        FakeRaft(1), CLUSTER, ENDPOINTS, store_path=tmp_path / "image.sqlite", clock=ManualClock()
    )
    await controller.start()
    monkeypatch.setattr(SqliteImageStore, "save", failing_save([], full_disk))
    try:
        controller.store.mark_dirty()
        with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
            await asyncio.wait_for(store_task(controller), 5)
    finally:
        await controller.stop()


async def test_a_store_that_cannot_be_opened_for_a_full_disk_is_fatal_and_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SQLITE_FULL while opening is not corruption: the (good) store file is not discarded, the open
    fails with op=open — before this, open deleted the file, failed again and died with a traceback."""
    path = tmp_path / "metadata-image.sqlite"
    store = await SqliteImageStore.open(path, clock=ManualClock())
    await store.save(MetadataImage.empty())
    await store.close()
    before = path.read_bytes()

    async def no_room(cls: type[SqliteImageStore], path: Path, clock: ManualClock) -> SqliteImageStore:
        raise full_disk()

    monkeypatch.setattr(SqliteImageStore, "_open", classmethod(no_room))
    reports = Reports()
    controller = QuorumController(
        FakeRaft(1), CLUSTER, ENDPOINTS, store_path=path, clock=ManualClock(), on_fatal=reports
    )
    with pytest.raises(sqlite3.OperationalError, match="database or disk is full"):
        await controller.start()
    [(reason, _error, fields)] = reports.calls
    assert reason == IMAGE_STORE_FATAL and fields["op"] == "open"
    assert fields["sqlite_error"] == "SQLITE_FULL" and fields["file"] == str(path)
    assert path.read_bytes() == before


def test_only_disk_failures_count_as_storage_failures() -> None:
    assert is_storage_failure(full_disk())
    assert is_storage_failure(OSError(errno.EIO, "Input/output error"))
    wrapped = RuntimeError("snapshot write failed")
    wrapped.__cause__ = OSError(errno.ENOSPC, "No space left on device")
    assert is_storage_failure(wrapped)
    assert not is_storage_failure(sqlite3.DatabaseError("file is not a database"))
    assert not is_storage_failure(sqlite3.OperationalError("no such column: value"))
    assert not is_storage_failure(ValueError("bad checksum"))


class BrokenSnapshotWriter(FakeSnapshotWriter):
    def __init__(self, raft: FakeRaft, snapshot_id: SnapshotId, error: Exception) -> None:
        super().__init__(raft, snapshot_id)
        self._error = error

    async def freeze(self) -> SnapshotId:
        raise self._error


@pytest.mark.parametrize(
    ("error", "fatal"),
    [
        (
            OSError(errno.ENOSPC, "No space left on device", "00000000000000000010-0000000001.checkpoint"),
            True,
        ),
        (ValueError("snapshot id no longer valid"), False),
    ],
)
async def test_a_snapshot_that_cannot_be_written_for_the_disk_is_fatal(
    error: Exception, fatal: bool, log_stream: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    raft = FakeRaft(1)

    def create(end_offset: int, epoch: int, _last_ms: int) -> SnapshotWriter:
        return BrokenSnapshotWriter(raft, SnapshotId(end_offset, epoch), error)

    monkeypatch.setattr(raft, "create_snapshot", create)
    reports = Reports()
    snapshotter = Snapshotter(
        raft,
        ManualClock(),
        max_bytes=1,
        interval_ms=3_600_000,
        metrics=ControllerMetrics.for_node(1),
        log=get_logger("controller", node=1),
        on_fatal=reports,
    )
    snapshotter.count_committed(10)
    snapshotter.maybe_snapshot(dataclasses.replace(MetadataImage.empty(), offset=9, epoch=1))
    assert snapshotter.task is not None
    await asyncio.wait_for(snapshotter.task, 5)
    if fatal:
        [(reason, reported, fields)] = reports.calls
        assert reason == SNAPSHOT_FATAL and reported is error and fields == {"end_offset": 10}
    else:
        assert reports.calls == []
        assert "event=snapshot_failed" in log_stream.getvalue()
