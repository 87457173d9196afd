"""``kraft acl add | list | remove`` on a real local cluster (PLAINTEXT, no authorizer configured): the
ACLs go through the metadata log, survive a controller restart (image store + log replay), and bad options
are one-line errors that send nothing."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.cluster.manager import LocalCluster

REPO_ROOT = Path(__file__).resolve().parents[2]
UP_TIMEOUT_S = 120
CALL_TIMEOUT_S = 60.0


def kraft(*args: str, timeout_s: float = CALL_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "kraft.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        check=False,
    )
    print(f"[{time.monotonic() - started:5.1f} s] exit {result.returncode}: kraft {' '.join(args)}")
    return result


def ok(*args: str) -> str:
    result = kraft(*args)
    assert result.returncode == 0, f"kraft {' '.join(args)} failed: {result.stderr}"
    return result.stdout


def acl_list(controllers: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = json.loads(
        ok("acl", "list", "--json", "--bootstrap-controller", controllers)
    )
    return rows


@pytest.fixture
def cluster_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "cluster"
    try:
        yield directory
    finally:
        if (directory / "cluster.json").exists():
            LocalCluster.open(directory).down(timeout_s=5)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_acls_round_trip_through_the_log_and_survive_a_controller_restart(cluster_dir: Path) -> None:
    d = str(cluster_dir)
    up = kraft(
        "cluster", "up", "--dir", d, "--controllers", "1", "--brokers", "0", "--profile", "fast",
        "--timeout", str(UP_TIMEOUT_S), "--json", timeout_s=UP_TIMEOUT_S + 30,
    )  # fmt: skip
    assert up.returncode == 0, up.stderr
    controllers = ",".join(n["endpoint"] for n in json.loads(up.stdout)["nodes"] if n["role"] == "controller")

    added = ok(
        "acl", "add", "--bootstrap-controller", controllers, "--allow-principal", "User:alice",
        "--operation", "Read", "--operation", "Describe", "--topic", "orders",
    )  # fmt: skip
    assert added.count("ACL ") == 2 and "ALLOW User:alice READ from * on TOPIC:LITERAL:orders" in added
    ok(
        "acl", "add", "--bootstrap-controller", controllers, "--deny-principal", "User:*",
        "--operation", "All", "--topic", "etl-", "--resource-pattern-type", "prefixed", "--host", "10.0.0.9",
    )  # fmt: skip
    before = acl_list(controllers)
    assert sorted(
        (r["principal"], r["operation"], r["permission_type"], r["pattern_type"]) for r in before
    ) == [
        ("User:*", "ALL", "DENY", "PREFIXED"),
        ("User:alice", "DESCRIBE", "ALLOW", "LITERAL"),
        ("User:alice", "READ", "ALLOW", "LITERAL"),
    ]
    match_args = ["--topic", "etl-daily", "--resource-pattern-type", "match"]
    match = json.loads(ok("acl", "list", "--json", "--bootstrap-controller", controllers, *match_args))
    assert [(r["resource_name"], r["host"]) for r in match] == [("etl-", "10.0.0.9")]

    restarted = kraft("cluster", "restart", "1", "--dir", d, timeout_s=UP_TIMEOUT_S)
    assert restarted.returncode == 0, restarted.stderr
    assert acl_list(controllers) == before  # same ids, same bindings, from the store and the log

    removed = ok(
        "acl", "remove", "--bootstrap-controller", controllers, "--allow-principal", "User:alice",
        "--operation", "Read", "--topic", "orders",
    )  # fmt: skip
    assert removed.strip().endswith("1 ACL removed")
    assert [r["operation"] for r in acl_list(controllers) if r["principal"] == "User:alice"] == ["DESCRIBE"]
    assert ok("acl", "remove", "--bootstrap-controller", controllers, "--topic", "nothing").strip() == (
        "0 ACLs removed"
    )


def test_bad_acl_options_are_one_line_errors_that_send_nothing() -> None:
    # The controller address is never dialled: each option is refused before a request is built.
    for args, fragment in (
        (["--allow-principal", "alice", "--operation", "Read", "--topic", "t"], "TYPE:NAME"),
        (
            ["--allow-principal", "User:a", "--operation", "Reed", "--topic", "t"],
            "unknown AclOperation 'Reed'",
        ),
        (["--allow-principal", "User:a", "--operation", "Read"], "name a resource"),
        (["--allow-principal", "User:a", "--topic", "t"], "name an operation"),
        (
            [
                "--allow-principal",
                "User:a",
                "--operation",
                "Read",
                "--topic",
                "t",
                "--resource-pattern-type",
                "match",
            ],
            "must be one of literal, prefixed",
        ),
    ):
        result = CliRunner().invoke(app, ["acl", "add", "--bootstrap-controller", "127.0.0.1:1", *args])
        assert result.exit_code == 1, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and fragment in lines[0], result.stderr
