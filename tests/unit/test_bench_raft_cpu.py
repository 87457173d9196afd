"""bench.raft_cpu's accounting: the kernel's share read from the right ``/proc`` field, and per-write rows for
every process with threads (followers included, session 19).  No benchmark runs here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from bench.raft_cpu import TICKS, _cpu_s, _summarize, _sys_s


def _stat(tmp_path: Path, utime: int, stime: int) -> Path:
    # /proc/PID/stat: pid (comm) state, then fields 4.. ; utime and stime are fields 14 and 15.
    after_comm = ["S", *["0"] * 10, str(utime), str(stime), *["0"] * 30]
    path = tmp_path / "stat"
    path.write_text(f"123 (python x) {' '.join(after_comm)}\n")
    return path


def test_the_kernel_share_is_stime_alone(tmp_path: Path) -> None:
    path = _stat(tmp_path, utime=3 * TICKS, stime=2 * TICKS)
    assert _cpu_s(path) == 5.0
    assert _sys_s(path) == 2.0
    assert _sys_s(tmp_path / "gone") == 0.0  # a task that ended reads as nothing


def test_rows_carry_the_kernel_share_and_the_followers_threads() -> None:
    window: dict[str, Any] = {
        "writes": 1000,
        "writes_per_s": 250.0,
        "seconds": 4.0,
        "errors": 0,
        "cpu_s": {"client": 0.2, "leader": 0.6, "follower_2": 0.1},
        "sys_s": {"client": 0.05, "leader": 0.2, "follower_2": 0.03},
        "threads": {
            "leader": {"main loop (MainThread) [1]": 0.1, "C: grpc-intake [2]": 0.4},
            "follower_2": {"main loop (MainThread) [5]": 0.08, "C: event_engine [6]": 0.01},
        },
        "switches": {"leader": {}, "follower_2": {}},
    }
    row = _summarize({"kraft_unary": [window]})["kraft_unary"][0]
    assert row["kernel_us_per_write"] == {"client": 50.0, "leader": 200.0, "follower_2": 30.0}
    assert row["cpu_us_per_write"]["follower_2"] == 100.0
    assert row["thread_groups_us_per_write"]["follower_2"] == {
        "main loop (MainThread)": 80.0,
        "C: event_engine": 10.0,
    }
