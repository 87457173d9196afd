"""Exclusive data-directory locks (kraft.storage.dir_lock): one process per role and directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kraft.config import NodeConfig
from kraft.netutil import free_port
from kraft.node.broker import BrokerStartupError, image_store_path, run_broker
from kraft.node.controller import ControllerNode, StartupError
from kraft.storage.dir_lock import DirectoryInUseError, DirectoryLocks, lock_file_name
from kraft.storage.errors import StorageStateError
from kraft.storage.ids import random_uuid
from kraft.storage.log import METADATA_LOG_DIR_NAME
from kraft.storage.meta_properties import format_log_dir

HOLDER = """
import sys, time
from pathlib import Path
from kraft.storage.dir_lock import DirectoryLocks
locks = DirectoryLocks.acquire([Path(sys.argv[1])], "controller")
print("locked", flush=True)
time.sleep(60)
"""


def test_a_second_holder_is_refused_with_the_first_ones_pid(tmp_path: Path) -> None:
    first = DirectoryLocks.acquire([tmp_path], "controller")
    with pytest.raises(DirectoryInUseError) as refused:
        DirectoryLocks.acquire([tmp_path], "controller")
    assert refused.value.holder_pid == os.getpid()
    assert str(refused.value.message) == (
        f"data directory {tmp_path} is in use by another process (pid {os.getpid()})"
    )
    first.release()
    DirectoryLocks.acquire([tmp_path], "controller").release()


def test_locking_is_all_or_nothing(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    with DirectoryLocks.acquire([b], "broker"), pytest.raises(DirectoryInUseError, match=str(b)):
        DirectoryLocks.acquire([a, b], "broker")
    # `a` was locked first and must have been released when `b` failed.
    with DirectoryLocks.acquire([a], "broker") as locks:
        assert locks.directories == (a,)


def test_a_controller_and_a_broker_share_a_directory(tmp_path: Path) -> None:
    # A combined node runs both processes over the same directories.
    with DirectoryLocks.acquire([tmp_path], "controller"), DirectoryLocks.acquire([tmp_path], "broker"):
        assert (tmp_path / lock_file_name("controller")).exists()
        assert (tmp_path / lock_file_name("broker")).exists()


def test_a_missing_directory_is_a_storage_error(tmp_path: Path) -> None:
    with pytest.raises(StorageStateError, match="cannot create the lock file"):
        DirectoryLocks.acquire([tmp_path / "nope"], "controller")


def test_the_lock_of_another_process_holds_until_it_is_killed(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3])}
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(tmp_path)], stdout=subprocess.PIPE, text=True, env=env
    )
    try:
        assert holder.stdout is not None
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(DirectoryInUseError) as refused:
            DirectoryLocks.acquire([tmp_path], "controller")
        assert refused.value.holder_pid == holder.pid
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        # The kernel dropped the flock with the process; the stale file does not block a restart.
        deadline = time.monotonic() + 5
        while True:
            try:
                DirectoryLocks.acquire([tmp_path], "controller").release()
                break
            except DirectoryInUseError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait(timeout=10)


def _node_config(tmp_path: Path, roles: str) -> NodeConfig:
    port, broker_port = free_port(), free_port()
    listeners = f"CONTROLLER://127.0.0.1:{port}"
    if "broker" in roles:
        listeners = f"PLAINTEXT://127.0.0.1:{broker_port}," + listeners
    config = NodeConfig.build(
        process_roles=roles,
        node_id=1,
        controller_quorum_voters=f"1@127.0.0.1:{port}",
        listeners=listeners,
        metadata_log_dir=tmp_path / "meta",
        log_dirs=str(tmp_path / "meta"),
    )
    format_log_dir(tmp_path / "meta", cluster_id=random_uuid(), node_id=1)
    return config


async def test_a_controller_on_a_locked_directory_opens_nothing(tmp_path: Path) -> None:
    config = _node_config(tmp_path, "controller")
    with DirectoryLocks.acquire([tmp_path / "meta"], "controller"):
        node = ControllerNode(config)
        with pytest.raises(StartupError, match="is in use by another process"):
            await node.start()
    assert not (tmp_path / "meta" / METADATA_LOG_DIR_NAME).exists()


async def test_a_broker_on_a_locked_directory_opens_nothing(tmp_path: Path) -> None:
    config = _node_config(tmp_path, "broker,controller")
    with (
        DirectoryLocks.acquire([tmp_path / "meta"], "broker"),
        pytest.raises(BrokerStartupError, match="is in use by another process"),
    ):
        await run_broker(config, "cluster")
    assert not image_store_path(config).exists()
