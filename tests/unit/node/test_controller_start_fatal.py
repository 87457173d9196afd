"""``run_controller`` (issue #14): a start hook that fails once Raft runs — the image store cannot be opened
on a full disk — ends the process through the fail-stop path (one ``event=fatal`` line, exit 70, the port
released), never with a traceback and exit 1."""

from __future__ import annotations

import io
import socket
import sqlite3
from collections.abc import Iterator
from pathlib import Path
from typing import NoReturn

import pytest

from kraft.clock import Clock
from kraft.config import NodeConfig
from kraft.metadata.store import SqliteImageStore
from kraft.netutil import free_port
from kraft.node import controller as controller_module
from kraft.node.supervisor import EXIT_FATAL, Supervisor
from kraft.observability.logging import configure_logging
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir


class Exited(BaseException):
    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


def fake_exit(code: int) -> NoReturn:
    raise Exited(code)


class NoWatchdog:
    def cancel(self) -> None:
        return None


@pytest.fixture
def log_stream() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("INFO", stream)
    try:
        yield stream
    finally:
        configure_logging("INFO")


async def test_an_image_store_that_cannot_be_opened_at_start_is_fatal_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, log_stream: io.StringIO
) -> None:
    port = free_port()
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=1)
    config = NodeConfig.build(
        process_roles="controller",
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=f"CONTROLLER://127.0.0.1:{port}",
        metadata_log_dir=tmp_path / "meta",
    )

    async def no_room(cls: type[SqliteImageStore], path: Path, clock: Clock) -> SqliteImageStore:
        error = sqlite3.OperationalError("database or disk is full")
        error.sqlite_errorcode, error.sqlite_errorname = sqlite3.SQLITE_FULL, "SQLITE_FULL"
        raise error

    monkeypatch.setattr(SqliteImageStore, "_open", classmethod(no_room))
    monkeypatch.setattr(
        controller_module,
        "Supervisor",
        lambda logger: Supervisor(
            logger, exit_process=fake_exit, start_watchdog=lambda _deadline, _fire: NoWatchdog()
        ),
    )
    with pytest.raises(Exited) as exited:
        await controller_module.run_controller(config)
    assert exited.value.code == EXIT_FATAL
    lines = log_stream.getvalue().splitlines()
    [line] = [line for line in lines if " event=fatal " in line]
    assert "reason=image_store_write_failed" in line and "op=open" in line, line
    assert "sqlite_error=SQLITE_FULL" in line and "metadata-image.sqlite" in line, line
    assert not any("Traceback" in line for line in lines)
    with socket.socket() as probe:  # abort released the listener
        probe.bind(("127.0.0.1", port))
