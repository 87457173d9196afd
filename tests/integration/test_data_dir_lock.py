"""A second process with the config of a running node fails at once and touches nothing (issue #19).

Before the directory lock, ``kraft controller start`` with a running controller's config opened and
recovered the same metadata log before failing to bind the port — truncating the running node's
preallocated active segment under it."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kraft.cluster.quorum import REPO_ROOT, QuorumFactory, run_kraft
from kraft.netutil import free_port
from kraft.storage.dir_lock import DirectoryLocks
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir

pytestmark = pytest.mark.integration

# `kraft` under a Python audit hook: every file the process opens under ROOT ("open r NAME", or
# "open w NAME" with any flag that may change it) and every directory it lists there is written to the fd
# of REPORT (os.write raises no audit event, so the hook cannot recurse).  argv: ROOT REPORT kraft-args...
AUDITED_KRAFT = """
import os, runpy, sys
root, report = os.path.abspath(sys.argv[1]), sys.argv[2]
fd = os.open(report, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
del sys.argv[1:3]
WRITE = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
def hook(event, args):
    if event in ("open", "os.listdir", "os.scandir") and isinstance(args[0], (str, bytes, os.PathLike)):
        path = os.path.abspath(os.fsdecode(args[0]))
        if path == root or path.startswith(root + os.sep):
            how = ("w" if args[2] & WRITE else "r") + " " if event == "open" else ""
            os.write(fd, (event + " " + how + os.path.relpath(path, root) + "\\n").encode())
sys.addaudithook(hook)
runpy.run_module("kraft.cli.main", run_name="__main__", alter_sys=True)
"""


def run_kraft_audited(args: list[str], root: Path, report: Path) -> subprocess.CompletedProcess[str]:
    """``kraft args`` (as :func:`run_kraft`, bounded), recording what it opens or lists under ``root``."""
    return subprocess.run(
        [sys.executable, "-c", AUDITED_KRAFT, str(root), str(report), *args],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO_ROOT,
        check=False,
    )


def tree_digest(root: Path) -> dict[str, tuple[int, str]]:
    """Every file under ``root``: its size and SHA-256 (sizes catch a truncated preallocation)."""
    return {
        str(path.relative_to(root)): (path.stat().st_size, hashlib.sha256(path.read_bytes()).hexdigest())
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def test_a_second_controller_on_a_running_nodes_data_exits_and_changes_no_byte(
    quorum_factory: QuorumFactory,
) -> None:
    # The test-append quorum is quiet when idle (no no-op records), so its files must not change at all.
    quorum = quorum_factory(size=1, test_append=True)
    quorum.start()
    quorum.wait_for_leader(timeout_s=30)
    quorum.append([b"one", b"two", b"three"])
    node = quorum.nodes[1]
    before = tree_digest(node.metadata_dir)
    assert any(name.endswith(".log") for name in before)
    report = quorum.base_dir / "second-opened.txt"
    second = run_kraft_audited(
        ["controller", "start", "--config", str(node.config_path)], node.metadata_dir, report
    )
    assert second.returncode == 1, second.stderr
    lines = second.stderr.strip().splitlines()
    assert lines == [
        f"error: data directory {node.metadata_dir} is in use by another process (pid {node.pid})"
    ], second.stderr
    # Nothing of the running node's storage was opened, not even listed: it read its identity
    # (meta.properties, read-only) and tried the lock, which the kernel refused at once (non-blocking).
    opened = report.read_text(encoding="utf-8").splitlines()
    assert opened == ["open r meta.properties", "open w .controller.lock"], opened
    assert tree_digest(node.metadata_dir) == before
    # The running node is unharmed: it still commits.
    quorum.append([b"four"])
    assert node.alive


def test_a_second_broker_on_locked_log_dirs_exits_before_opening_anything(tmp_path: Path) -> None:
    data = tmp_path / "data"
    format_log_dir(data, cluster_id=random_uuid(), node_id=101)
    config = tmp_path / "broker.properties"
    config.write_text(
        "process.roles=broker\n"
        "node.id=101\n"
        f"controller.quorum.voters=1@127.0.0.1:{free_port()}\n"
        f"listeners=PLAINTEXT://127.0.0.1:{free_port()}\n"
        f"log.dirs={data}\n",
        encoding="utf-8",
    )
    with DirectoryLocks.acquire([data], "broker"):  # as a running broker holds it
        before = tree_digest(data)
        second = run_kraft(["broker", "start", "--config", str(config)], timeout_s=60)
        assert tree_digest(data) == before
    assert second.returncode == 1, second.stderr
    # One error line (an info line about the open-file limit may come before it, nothing else).
    lines = second.stderr.strip().splitlines()
    assert [line for line in lines if "event=open_file_limit" not in line] == [
        f"error: data directory {data} is in use by another process (pid {os.getpid()})"
    ], second.stderr
