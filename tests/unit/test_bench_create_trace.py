"""bench.create_trace reads a request's steps as its docs say: inside the request's own window, the first
probe of each step after the previous step, the followers' steps from the follower whose next Fetch left
first; and its probes exist only in a process that installs them (a node started any other way runs the
shipped code).  No timing is asserted: synthetic times in, exact durations out."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.create_trace import (
    STEPS,
    analyse,
    cores_used,
    nodes_grpc_io,
    read_traces,
    run_and_wait,
    thread_times,
)
from kraft.runtime import GRPC_EXPERIMENTS_ENV, GRPC_IO_ENV, IOMGR_EXPERIMENTS

REPO = Path(__file__).resolve().parents[2]


def _leader_and_followers(
    start: int,
) -> tuple[list[tuple[int, str]], list[tuple[int, str]], list[tuple[int, str]]]:
    """One request's probes from ``start``: every step 10 µs after the previous one; follower 2's chain
    is 5 µs slower at each of its steps (its next Fetch leaves last), and noise no step asks for."""
    leader: list[tuple[int, str]] = [(start + 1_000, "hw")]  # before intake.in: not this request's hw
    fast: list[tuple[int, str]] = []
    slow: list[tuple[int, str]] = []
    at = start
    for role, probe, _label in STEPS[1:-1]:
        at += 10_000
        if role == "L":
            leader.append((at, probe))
            leader.append((at + 1, "park"))  # noise
        else:
            fast.append((at, probe))
            slow.append((at + 5_000, probe))
    return leader, fast, slow


def _as_trace(entries: list[tuple[int, str]]) -> tuple[list[int], list[str]]:
    entries = sorted(entries)
    return [ns for ns, _ in entries], [name for _, name in entries]


def test_each_step_is_the_first_probe_after_the_previous_one_in_the_request_window() -> None:
    leader: list[tuple[int, str]] = []
    fast: list[tuple[int, str]] = []
    slow: list[tuple[int, str]] = []
    requests = []
    for request in range(3):
        start = request * 10_000_000
        one = _leader_and_followers(start)
        leader += one[0]
        # the fast follower is pid 2 in even requests, pid 3 in odd ones: chosen per request
        (fast if request % 2 == 0 else slow).extend(one[1])
        (slow if request % 2 == 0 else fast).extend(one[2])
        requests.append((start, start + 10_000 * (len(STEPS) - 1)))
    # a request whose leader never raised the high watermark is left out, not misread
    broken = _leader_and_followers(50_000_000)
    leader += [entry for entry in broken[0] if entry[1] != "hw"]
    fast += broken[1]
    requests.append((50_000_000, 50_000_000 + 10_000 * (len(STEPS) - 1)))
    result = analyse(requests, {1: _as_trace(leader), 2: _as_trace(fast), 3: _as_trace(slow)}, 1)
    assert result["requests"] == 4 and result["traced"] == 3
    assert [row["probe"] for row in result["steps"]] == [probe for _role, probe, _label in STEPS[1:]]
    assert all(row["p50_us"] == 10.0 for row in result["steps"]), result["steps"]
    assert result["sum_of_step_p50s_us"] == 10.0 * (len(STEPS) - 1)


def test_probes_are_installed_only_where_asked() -> None:
    script = (
        "import bench.create_trace as trace\n"
        "from kraft.raft.driver import RaftDriver\n"
        "from kraft.metadata.service import ControllerServicer\n"
        "from kraft.node import intake\n"
        "names = [(RaftDriver, '_push'), (RaftDriver, '_on_high_watermark'), (RaftDriver, 'schedule_append'),"
        " (ControllerServicer, '_call'), (intake, '_hop_answer')]\n"
        "before = [getattr(getattr(o, n), trace.PROBE_FLAG, False) for o, n in names]\n"
        "trace.install_probes()\n"
        "after = [getattr(getattr(o, n), trace.PROBE_FLAG, False) for o, n in names]\n"
        "print(sorted(set(before)), sorted(set(after)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.split() == ["[False]", "[True]"]  # importing changes nothing; installing wraps all


def test_a_trace_read_while_its_node_writes_skips_the_partial_last_line(tmp_path: Path) -> None:
    (tmp_path / "41.trace").write_text("20 svc.in\n10 intake.in\n3")  # "3..." is still being written
    assert read_traces(tmp_path) == {41: ([10, 20], ["intake.in", "svc.in"])}


def test_nodes_grpc_io_sets_the_nodes_experiments_only_while_they_start(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The nodes inherit os.environ at their spawn; the benchmark's client must stay on its own choice.
    monkeypatch.delenv(GRPC_IO_ENV, raising=False)
    monkeypatch.setenv(GRPC_EXPERIMENTS_ENV, "operator-choice")
    with nodes_grpc_io(None):
        assert os.environ[GRPC_EXPERIMENTS_ENV] == "operator-choice"
    monkeypatch.delenv(GRPC_EXPERIMENTS_ENV)
    with nodes_grpc_io("iomgr"):
        assert os.environ[GRPC_IO_ENV] == "iomgr"
        assert os.environ[GRPC_EXPERIMENTS_ENV] == IOMGR_EXPERIMENTS
    assert GRPC_IO_ENV not in os.environ and GRPC_EXPERIMENTS_ENV not in os.environ
    monkeypatch.setenv(GRPC_EXPERIMENTS_ENV, IOMGR_EXPERIMENTS)  # inherited from a parent on iomgr
    with nodes_grpc_io("event-engine"):
        assert GRPC_EXPERIMENTS_ENV not in os.environ
    assert os.environ[GRPC_EXPERIMENTS_ENV] == IOMGR_EXPERIMENTS


def test_cores_used_gives_each_threads_run_and_wait_per_second_between_two_readings() -> None:
    ms = 1_000_000
    before = {("leader", "main"): (100 * ms, 50 * ms), ("leader", "grpc-intake"): (0, 0)}
    after = {
        ("leader", "main"): (500 * ms, 1_050 * ms),
        ("leader", "grpc-intake"): (ms // 2, ms // 4),  # below 1 ms/s of both over 2 s: left out
        ("follower-2", "main"): (900 * ms, 900 * ms),  # not in the first reading: left out
    }
    assert cores_used(before, after, 2.0) == {"leader": {"main": [200.0, 500.0]}}


def test_thread_times_reads_every_thread_of_a_process_its_main_thread_named_main() -> None:
    import threading

    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        # the helper under its kernel name (CPython 3.11 names no OS thread: the main thread's name too),
        # so the main thread must be told apart by its id
        helper_name = Path(f"/proc/{os.getpid()}/task/{helper.native_id}/comm").read_text().strip()
        times = thread_times({os.getpid(): "self", 2**22 + 7: "gone"})  # (a pid above pid_max: no process)
    finally:
        stop.set()
        helper.join(timeout=5)
    assert times[("self", "main")][0] > 0  # this thread has run
    assert ("self", helper_name) in times
    assert {role for role, _name in times} == {"self"}
    assert run_and_wait("123 456 7\n") == (123, 456)  # run first, then the wait for a core
