"""``kraft demo`` (what ``make demo`` runs): the real path once, its re-runs, and its failure handling.

The integration test runs the demo exactly as ``make demo`` does (a subprocess), runs it again to check
it re-uses the running cluster, refuses a half-running one, and always brings the cluster down.  The unit
tests drive :class:`kraft.cluster.demo.Demo` with a scripted step runner (no processes).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from kraft.cluster.demo import DEMO_TOPIC, Demo, DemoError, StepResult
from kraft.cluster.manager import LocalCluster
from kraft.cluster.process import pid_alive

REPO_ROOT = Path(__file__).resolve().parents[2]
DEMO_TIMEOUT_S = 240  # `cluster up` (bounded at 120 s inside) plus a handful of one-second commands


def run_demo(directory: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "kraft.cli.main", "demo", "--dir", str(directory), *extra],
        capture_output=True,
        text=True,
        timeout=DEMO_TIMEOUT_S,
        cwd=REPO_ROOT,
        stdin=subprocess.DEVNULL,
        check=False,
    )


@pytest.fixture
def demo_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "demo-cluster"
    try:
        yield directory
    finally:
        if (directory / "cluster.json").exists():
            LocalCluster.open(directory).down(timeout_s=5)


def _consumed_values(stdout: str) -> list[str]:
    return re.findall(r"^hello kraft #\d \(\d\d:\d\d:\d\d\)$", stdout, flags=re.MULTILINE)


@pytest.mark.integration
def test_demo_runs_end_to_end_reuses_its_cluster_and_refuses_a_half_running_one(demo_dir: Path) -> None:
    first = run_demo(demo_dir, "--brokers", "1")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr
    out = first.stdout
    for step in ("[1/7] starting a new local cluster", "[7/7] done", "$ kraft topic create demo-events"):
        assert step in out
    # Every record produced was read back (each value appears once as a command arg, once consumed).
    assert len(_consumed_values(out)) == 5
    assert re.search(r"^LeaderId:\s+[123]$", out, flags=re.MULTILINE)
    assert re.search(r"^CurrentVoters:\s+\[1,2,3\]$", out, flags=re.MULTILINE)
    assert "Follower" in out and "ACTIVE" in out  # --replication table, broker list
    assert f"kraft cluster down --dir {demo_dir}" in out
    cluster = LocalCluster.open(demo_dir)
    pids = dict(cluster.running())
    assert set(pids) == {"controller-1", "controller-2", "controller-3", "broker-101"}

    second = run_demo(demo_dir, "--brokers", "1")
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr
    assert f"re-using the demo cluster already running in {demo_dir}" in second.stdout
    assert "topic demo-events already exists" in second.stdout
    assert len(_consumed_values(second.stdout)) == 5  # only this run's records, read from their offset
    assert cluster.running() == pids  # the same processes

    assert cluster.stop(101) == "stopped"
    third = run_demo(demo_dir)
    assert third.returncode == 1
    assert third.stderr.splitlines() == [
        f"error: the demo cluster in {demo_dir} is only partly running (broker-101 stopped); "
        f"stop it with `kraft cluster down --dir {demo_dir}` (or start the missing nodes with "
        f"`kraft cluster start NODE --dir {demo_dir}`) and run the demo again"
    ]

    cluster.down(timeout_s=15)
    assert not [pid for pid in pids.values() if pid_alive(pid)]
    assert cluster.running() == {}


# --- without processes: a scripted step runner ---------------------------------------------------------


class ScriptedSteps:
    """Answers each ``kraft`` command like the real CLI would; records what was run."""

    def __init__(self, directory: Path, fail_on: str | None = None) -> None:
        self.directory = directory
        self.fail_on = fail_on
        self.commands: list[list[str]] = []
        self.produced: list[str] = []

    def __call__(self, args: Sequence[str], capture: bool, timeout_s: float) -> StepResult:
        args = list(args)
        self.commands.append(args)
        name = " ".join(args[:2])
        if name == self.fail_on:
            return StepResult(1, "", "error: NOT_CONTROLLER: no active controller answered within 15s\n")
        if name == "cluster up":
            LocalCluster.create(self.directory, controllers=3, brokers=1)  # configs only, no processes
            return StepResult(0, "", "")
        if args[0] == "produce":
            self.produced = [args[i + 1] for i, arg in enumerate(args) if arg == "--value"]
            return StepResult(0, json.dumps({"base_offset": 7, "last_offset": 11}), "")
        if args[0] == "consume":
            assert args[args.index("--offset") + 1] == "7"
            return StepResult(0, "".join(f"{v}\n" for v in self.produced), "")
        return StepResult(0, f"output of {name}\n", "")


def test_demo_steps_are_the_user_commands_in_order(tmp_path: Path) -> None:
    steps = ScriptedSteps(tmp_path / "d")
    out = io.StringIO()
    Demo(tmp_path / "d", brokers=1, run_step=steps, out=out).run()
    assert [" ".join(c[:2]) for c in steps.commands] == [
        "cluster up",
        "topic create",
        "topic describe",
        "produce --bootstrap-server",
        "consume --bootstrap-server",
        "quorum describe",
        "quorum describe",
        "broker list",
    ]
    assert steps.commands[1][2] == DEMO_TOPIC and "--if-not-exists" in steps.commands[1]
    assert steps.commands[1][steps.commands[1].index("--replication-factor") + 1] == "1"
    text = out.getvalue()
    assert text.count("==> [") == Demo.STEPS
    assert "$ kraft broker list --bootstrap-controller" in text


def test_a_failing_step_stops_the_demo_with_one_line_naming_it(tmp_path: Path) -> None:
    steps = ScriptedSteps(tmp_path / "d", fail_on="broker list")
    with pytest.raises(DemoError) as caught:
        Demo(tmp_path / "d", brokers=1, run_step=steps, out=io.StringIO()).run()
    message = str(caught.value)
    assert message.startswith("`kraft broker list` failed: NOT_CONTROLLER: no active controller answered")
    assert f"kraft cluster down --dir {tmp_path / 'd'}" in message
    assert "\n" not in message


def test_the_demo_needs_a_broker_and_refuses_a_concurrent_run(tmp_path: Path) -> None:
    with pytest.raises(DemoError, match="at least one broker"):
        Demo(tmp_path / "d", brokers=0, out=io.StringIO()).run()

    def nested(args: Sequence[str], capture: bool, timeout_s: float) -> StepResult:
        # A second demo on the same directory while the first holds the lock.
        Demo(tmp_path / "d", brokers=1, out=io.StringIO()).run()
        raise AssertionError("the second demo should not get past the lock")

    with pytest.raises(DemoError, match="another `kraft demo` is running"):
        Demo(tmp_path / "d", brokers=1, run_step=nested, out=io.StringIO()).run()
