"""A benchmark leaves no process behind however it ends (kraft.procutil.reap_children_on_exit): a
bench-like script starts children through the shared helpers (one with a grandchild in its process
group), then is stopped by SIGTERM (``timeout``), SIGINT (Ctrl-C), SIGHUP (a closed terminal), SIGKILL, or
ends normally; every child must be gone within a bounded wait.  Before, the children led their own
sessions and only an orderly exit of the benchmark stopped them (a killed ``bench.raft_cpu`` left a
3-controller quorum running for ~55 minutes)."""

from __future__ import annotations

import ast
import contextlib
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]

_BENCH_LIKE = """
import subprocess, sys
from pathlib import Path
from kraft.procutil import reap_children_on_exit, spawn_child, spawn_logged

reap_children_on_exit()
sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
children = [spawn_child(sleeper), spawn_logged(sleeper, Path(sys.argv[1]), banner="# sleeper")]
# a shell whose background sleep stays in its process group: a node's own children would
shell = spawn_child(["sh", "-c", "sleep 120 & echo $!; wait"], stdout=subprocess.PIPE)
grandchild = shell.stdout.readline().decode().strip()
pids = [str(c.pid) for c in children] + [str(shell.pid), grandchild]
print(" ".join(pids), flush=True)
sys.stdin.readline()  # the test's go (or its signal while waiting here)
sys.exit(0)
"""


def _start_time(pid: int) -> str | None:
    """The process's start time (/proc stat field 22), None once it is gone or a zombie: with it a pid
    reused by an unrelated process never counts as the child still running."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def _read_line(process: subprocess.Popen[bytes], timeout_s: float) -> str:
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], timeout_s)
    assert ready, f"the bench-like script printed nothing within {timeout_s} s"
    return process.stdout.readline().decode()


@pytest.mark.parametrize(
    "how", ["SIGTERM", "SIGINT", "SIGHUP", "SIGKILL", "exit"], ids=lambda how: f"ended-by-{how}"
)
def test_a_benchmark_ended_any_way_leaves_no_child_running(how: str, tmp_path: Path) -> None:
    script = subprocess.Popen(
        [sys.executable, "-c", _BENCH_LIKE, str(tmp_path / "sleeper.log")],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdout=subprocess.PIPE,
        stdin=subprocess.PIPE,
    )
    pids: list[int] = []
    try:
        pids = [int(p) for p in _read_line(script, 30).split()]
        assert len(pids) == 4, pids
        started = {pid: _start_time(pid) for pid in pids}
        assert all(started.values()), started
        if how == "exit":
            assert script.stdin is not None
            script.stdin.write(b"go\n")
            script.stdin.flush()
        else:
            os.kill(script.pid, getattr(signal, how))
        code = script.wait(timeout=30)
        if how == "exit":
            assert code == 0
        elif how != "SIGKILL":
            # the handler killed the children, then exited through SystemExit(128 + signal)
            assert code == 128 + getattr(signal, how), code
        # SIGKILL leaves the kernel's parent-death signal: it reaches the children the script started,
        # not the shell's own child (documented limit: kraft's nodes start none)
        expected = pids if how != "SIGKILL" else pids[:3]
        deadline = time.monotonic() + 10
        while any(_start_time(pid) == started[pid] for pid in expected):
            assert time.monotonic() < deadline, [p for p in expected if _start_time(p) == started[p]]
            time.sleep(0.02)
    finally:
        with contextlib.suppress(ProcessLookupError):
            script.kill()
        script.wait(timeout=10)
        for pid in pids[:3]:  # whatever a failure left, and the shell's group after SIGKILL
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def test_children_are_not_bound_without_reap_children_on_exit(tmp_path: Path) -> None:
    """``kraft cluster up`` starts nodes through the same helper and exits: they must keep running."""
    script = subprocess.run(
        [
            sys.executable,
            "-c",
            "import subprocess, sys; from kraft.procutil import spawn_child; "
            "print(spawn_child([sys.executable, '-c', 'import time; time.sleep(120)'], "
            "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).pid)",
        ],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        timeout=30,
        check=True,
    )
    pid = int(script.stdout.split()[0])
    try:
        time.sleep(0.2)
        assert _start_time(pid) is not None  # outlived its parent
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)


_FORK_HOOK_PROBE = """
import os, sys
from pathlib import Path
from kraft.procutil import reap_children_on_exit, spawn_child

marker = Path(sys.argv[1])
# what gRPC's fork support and any other library's at-fork hooks do: run Python in a forked child
os.register_at_fork(after_in_child=lambda: marker.write_text(str(os.getpid())))
reap_children_on_exit()
child = spawn_child([sys.executable, "-c", "pass"])
print(child.wait(timeout=30), flush=True)
"""


def test_a_bound_child_runs_no_python_of_its_parent_between_fork_and_exec(tmp_path: Path) -> None:
    """A ``preexec_fn`` (how the death signal used to be set) makes Popen fork and run the parent's
    at-fork hooks in the child; with gRPC running in the parent, ~1 child in 250 then aborted
    ("epoll_wait error: Bad file descriptor").  Bound children start through a trampoline instead."""
    marker = tmp_path / "forked-child-ran-a-hook"
    script = subprocess.run(
        [sys.executable, "-c", _FORK_HOOK_PROBE, str(marker)],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        capture_output=True,
        timeout=60,
        check=True,
    )
    assert script.stdout.split() == [b"0"], script.stderr
    assert not marker.exists(), "an at-fork hook of the parent ran in the child"


def test_a_bound_child_with_a_missing_program_fails_in_the_parent(monkeypatch: pytest.MonkeyPatch) -> None:
    """As Popen does: the error is raised where the child is started, not as the trampoline's exit code."""
    from kraft import procutil

    monkeypatch.setattr(procutil, "_reaping", True)
    monkeypatch.setattr(procutil, "_bound", [])
    with pytest.raises(FileNotFoundError):
        procutil.spawn_child(["kraft-no-such-program-on-path"], env={"PATH": str(REPO_ROOT)})


def _reaps_first(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    """Whether the function's first statement (after a docstring) is ``reap_children_on_exit()``."""
    body = function.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) and len(body) > 1:
        body = body[1:]  # after a docstring
    first = body[0]
    call = first.value if isinstance(first, ast.Expr) else None
    return (
        isinstance(call, ast.Call)
        and isinstance(call.func, ast.Name)
        and call.func.id == "reap_children_on_exit"
    )


def _functions(path: Path) -> list[ast.FunctionDef | ast.AsyncFunctionDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return [node for node in ast.walk(tree) if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)]


def test_every_benchmark_main_binds_its_children_first() -> None:
    """Each ``bench/*.py`` entry point (its ``main``) calls ``reap_children_on_exit()`` as its first
    statement, so what it starts — directly, or through ControllerQuorum, LocalCluster, FloorServer,
    EtcdCluster — is bound to it (a new benchmark is covered the day it is written)."""
    missing = []
    for path in sorted((REPO_ROOT / "bench").glob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) or node.name != "main":
                continue
            if not _reaps_first(node):
                missing.append(path.name)
    assert not missing, f"bench mains that do not call reap_children_on_exit() first: {missing}"


def _runs_scenarios(function: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "run_scenario"
        for node in ast.walk(function)
    )


def test_every_chaos_runner_main_binds_its_children_first() -> None:
    """The chaos runners' entry points — ``kraft chaos run`` (every command of kraft/cli/chaos.py that
    runs scenarios) and any ``main`` under chaos/ — call ``reap_children_on_exit()`` first: a run's
    LocalCluster nodes end with it however it ends.  The chaos test suite calls ``run_scenario`` from
    pytest and must not: a test process keeps its own signal handling."""
    cli = REPO_ROOT / "kraft" / "cli" / "chaos.py"
    runners = [(cli.name, f) for f in _functions(cli) if _runs_scenarios(f)]
    assert runners, "kraft/cli/chaos.py no longer runs scenarios: update this test"
    for path in sorted((REPO_ROOT / "chaos").rglob("*.py")):
        runners += [(path.name, f) for f in _functions(path) if f.name == "main"]
    missing = [f"{name}:{function.name}" for name, function in runners if not _reaps_first(function)]
    assert not missing, f"chaos runners that do not call reap_children_on_exit() first: {missing}"
