"""CPU time of processes and their threads from ``/proc`` (Linux), for per-phase accounting in benchmarks.

``bench.controller --cpu`` takes a :func:`snapshot` of the three controller processes and the harness
before and after a phase (the bulk CreateTopics, the controlled shutdown) and reports :func:`spent`: who
was busy, and for how much of the phase's wall time — the way "Bulk creation slowdown, found"
(docs/internals/raft-performance.md) found the active controller to be the bottleneck.  Ticks are
``SC_CLK_TCK`` (10 ms on Linux), enough for phases of seconds.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


def _stat_ticks(path: Path) -> tuple[str, int, int] | None:
    """(comm, utime + stime, stime) of one ``/proc/.../stat``; None once the process or thread is gone."""
    try:
        text = path.read_text()
    except OSError:
        return None
    # comm is in parentheses and may itself hold spaces or parentheses: split after the last ')'
    left, right = text.index("("), text.rindex(")")
    fields = text[right + 2 :].split()
    # fields[0] is the state (stat field 3): utime and stime are stat fields 14 and 15
    return text[left + 1 : right], int(fields[11]) + int(fields[12]), int(fields[12])


@dataclass(frozen=True, slots=True)
class ProcessCpu:
    ticks: int
    system_ticks: int = 0
    """Of ``ticks``, those in the kernel (stime: system calls such as fsync and socket I/O)."""
    threads: dict[str, tuple[int, int]] = field(default_factory=dict)
    """(ticks, system ticks) per thread, keyed ``comm:tid`` (``main`` for the main thread: Python names
    no OS thread)."""


def snapshot(pid: int) -> ProcessCpu | None:
    """CPU ticks of ``pid`` (all its threads) and per thread; None if it is gone."""
    whole = _stat_ticks(Path(f"/proc/{pid}/stat"))
    if whole is None:
        return None
    threads: dict[str, tuple[int, int]] = {}
    task_dir = Path(f"/proc/{pid}/task")
    try:
        tids = [entry.name for entry in task_dir.iterdir()]
    except OSError:
        tids = []
    for tid in tids:
        one = _stat_ticks(task_dir / tid / "stat")
        if one is not None:
            threads["main" if tid == str(pid) else f"{one[0]}:{tid}"] = one[1], one[2]
    return ProcessCpu(whole[1], whole[2], threads)


def spent(before: ProcessCpu | None, after: ProcessCpu | None, wall_s: float) -> dict[str, object]:
    """CPU seconds between two snapshots (and of them in the kernel), its share of ``wall_s``, and the
    threads that used ≥ 20 ms."""
    if before is None or after is None:
        return {"cpu_s": None}
    cpu_s = (after.ticks - before.ticks) * TICK_S
    threads = {}
    for name, (ticks, system) in after.threads.items():
        was, was_system = before.threads.get(name, (0, 0))
        if (ticks - was) * TICK_S >= 0.02:
            threads[name] = [round((ticks - was) * TICK_S, 2), round((system - was_system) * TICK_S, 2)]
    return {
        "cpu_s": round(cpu_s, 2),
        "system_cpu_s": round((after.system_ticks - before.system_ticks) * TICK_S, 2),
        "busy_share": round(cpu_s / wall_s, 2) if wall_s > 0 else None,
        # [cpu, of it in the kernel] per thread, busiest first
        "threads_cpu_s": dict(sorted(threads.items(), key=lambda kv: -kv[1][0])),
    }
