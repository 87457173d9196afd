"""A CPU-speed probe to run beside a benchmark: how fast was the host's CPU during each measured phase?

On the shared 2-core VM the same fixed CPU work takes ~1.7x as long in stretches of seconds, on one vCPU
at a time (docs/internals/raft-performance.md, "CPU-speed probe (session 10)"), so an end-to-end number
means little without the speed it was taken at.  The probe is a child process (bound to the benchmark
and reaped with it: :func:`kraft.procutil.spawn_child`) that every ``interval_s`` pins itself to the next
allowed CPU in turn and runs a fixed pure-Python loop, recording (monotonic time, CPU ms of the loop,
CPU).  It measures the loop's *CPU time* (``time.process_time``), not its wall time: a CPU busy with the
benchmark delays the loop but does not make it cost more CPU; a slow CPU does.  With each sample it also
reads the host's busy and steal time (``/proc/stat``) and the CPU time of the benchmark's process tree
(its parent and every descendant, from ``/proc``), so a phase also says how many CPUs *others* kept busy:
the competition, which slows a benchmark without changing the speed factor.

API (a benchmark's whole use of it)::

    probe = CpuProbe().start()            # or ``with CpuProbe() as probe:``
    with probe.phase("create_partitions"):
        ...                               # or probe.mark(name, start, end) with time.monotonic() values
    report = probe.report()               # stops it; a JSON-ready dict (see :func:`summarize`)

Per phase: the samples inside it, their mean / median / p10 / p90 ms, the share of samples in the slow
mode, ``speed_factor`` = mean sample ms / reference ms (1.0 = the reference speed, 1.7 = the same CPU
work took 1.7x as long), and :func:`host_load` (``host_busy_cpus``, ``bench_busy_cpus``,
``others_busy_cpus``, ``steal_share``, ``probe_wall_over_cpu``).  The reference is the run's 10th
percentile of all samples (the fast mode, provided the run spent >= ~10 % of its samples in it) unless a
fixed ``reference_ms`` is given, which a series of runs should share to be comparable.

Cost: one loop (~5 ms of CPU at fast speed) per ``interval_s`` = 0.25 s plus a ``/proc`` walk (~2 ms),
~3 % of one core; ``report()["probe_cpu_share"]`` says what it was.

``python -m bench.cpu_probe [--seconds S]`` runs the probe alone and prints its samples and summary.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from kraft.procutil import reap_children_on_exit, spawn_child

REPO_ROOT = Path(__file__).resolve().parents[1]
TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")

LOOP_ITERATIONS = 150_000
"""Iterations of the fixed loop per sample: ~5.4 ms of CPU in the fast mode of the 2-core host (Python
3.12), ~9 ms in its slow mode."""
INTERVAL_S = 0.25
SLOW_RATIO = 1.3
"""A sample counts as slow (``slow_share``) when it took more than this times the reference: the two
modes seen on the 2-core host are ~1.0x and ~1.7x, mixed samples fall between."""


@dataclass(frozen=True, slots=True)
class Sample:
    at: float
    """``time.monotonic()`` at the loop's middle (system-wide on Linux: comparable with the benchmark's)."""
    cpu_ms: float
    """CPU time the fixed loop took."""
    cpu: int
    """The CPU the probe was pinned to for it (-1: not pinned)."""
    wall_ms: float = 0.0
    """Wall time the loop took (more than ``cpu_ms`` when the CPU was shared: not a speed measure)."""
    busy_ticks: int = -1
    """The host's busy CPU time so far (``/proc/stat``: all but idle and iowait), clock ticks; -1 unknown."""
    steal_ticks: int = -1
    """The host's steal time so far (time a vCPU waited for the hypervisor), in clock ticks; -1 unknown."""
    bench_ticks: int = -1
    """CPU time so far of the benchmark's process tree (the probe's parent and all its descendants, the
    probe included), in clock ticks; -1 unknown."""


@dataclass(frozen=True, slots=True)
class Phase:
    name: str
    start: float
    end: float


# ------------------------------------------------------------------------------------------------ stats


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in [0, 1]) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def reference_of(samples: Sequence[Sample]) -> float | None:
    """The default reference: the 10th percentile of all samples (the fast mode), None without samples."""
    return percentile([s.cpu_ms for s in samples], 0.10) if samples else None


def in_phase(samples: Sequence[Sample], start: float, end: float) -> tuple[list[Sample], bool]:
    """The samples taken in [start, end); for a phase too short to hold one, the nearest sample on each
    side of it instead (second value True: "bracketing", a coarser reading)."""
    inside = [s for s in samples if start <= s.at < end]
    if inside or not samples:
        return inside, False
    before = [s for s in samples if s.at < start]
    after = [s for s in samples if s.at >= end]
    around = ([max(before, key=lambda s: s.at)] if before else []) + (
        [min(after, key=lambda s: s.at)] if after else []
    )
    return around, True


def host_load(samples: Sequence[Sample]) -> dict[str, float | None]:
    """The competition for the CPUs from the first to the last of ``samples`` (in time order), which the
    speed factor does not see (a shared CPU delays work without making it cost more CPU): on average how
    many CPUs the whole host kept busy (steal included), how many of them this benchmark's process tree,
    how many everybody else (the difference), the share of each vCPU's time lost to steal, and how much
    longer the probe's loops took in wall time than in CPU time (they waited for a CPU: the benchmark's
    own processes count here too)."""
    known = [s for s in samples if s.busy_ticks >= 0]
    out: dict[str, float | None] = {
        "host_busy_cpus": None,
        "bench_busy_cpus": None,
        "others_busy_cpus": None,
        "steal_share": None,
    }
    if len(known) >= 2 and known[-1].at > known[0].at:
        first, last = known[0], known[-1]
        span_ticks = (last.at - first.at) / TICK_S
        cpus = os.cpu_count() or 1
        host = (last.busy_ticks - first.busy_ticks) / span_ticks
        out["host_busy_cpus"] = round(host, 2)
        if first.bench_ticks >= 0 and last.bench_ticks >= 0:
            bench = (last.bench_ticks - first.bench_ticks) / span_ticks
            out["bench_busy_cpus"] = round(bench, 2)
            # everybody else on the host: the competition this benchmark had for its CPUs
            out["others_busy_cpus"] = round(max(0.0, host - bench), 2)
        out["steal_share"] = round((last.steal_ticks - first.steal_ticks) / span_ticks / cpus, 3)
    cpu_ms = sum(s.cpu_ms for s in samples)
    out["probe_wall_over_cpu"] = round(sum(s.wall_ms for s in samples) / cpu_ms, 2) if cpu_ms > 0 else None
    return out


def stats(samples: Sequence[Sample], reference_ms: float | None) -> dict[str, Any]:
    """Statistics of a set of samples against a reference (ms per sample at the reference speed), and
    the host's load over them (:func:`host_load`)."""
    if not samples:
        return {"samples": 0, "speed_factor": None}
    ms = [s.cpu_ms for s in samples]
    mean = sum(ms) / len(ms)
    per_cpu: dict[str, list[float]] = {}
    for sample in samples:
        per_cpu.setdefault(str(sample.cpu), []).append(sample.cpu_ms)
    out: dict[str, Any] = {
        "samples": len(ms),
        "mean_ms": round(mean, 2),
        "median_ms": round(percentile(ms, 0.5), 2),
        "p10_ms": round(percentile(ms, 0.1), 2),
        "p90_ms": round(percentile(ms, 0.9), 2),
        # mean, not median: the work of an unpinned process lands on every CPU and mode, and the modes
        # are ~1.7x apart, so a median would report one mode for a phase split 55/45
        "speed_factor": round(mean / reference_ms, 3) if reference_ms else None,
        "slow_share": (
            round(sum(1 for v in ms if v > SLOW_RATIO * reference_ms) / len(ms), 2) if reference_ms else None
        ),
        "per_cpu_mean_ms": {cpu: round(sum(v) / len(v), 2) for cpu, v in sorted(per_cpu.items())},
        **host_load(samples),
    }
    return out


def summarize(
    samples: Sequence[Sample],
    phases: Sequence[Phase],
    reference_ms: float | None = None,
    *,
    probe_cpu_s: float | None = None,
    wall_s: float | None = None,
    loop_iterations: int = LOOP_ITERATIONS,
) -> dict[str, Any]:
    """The probe's report: the reference, the whole run's statistics, and each phase's (a phase marked
    twice under one name is reported as ``name#2``, ...)."""
    reference = reference_ms if reference_ms is not None else reference_of(samples)
    phases_out: dict[str, Any] = {}
    for phase in phases:
        name, n = phase.name, 2
        while name in phases_out:
            name, n = f"{phase.name}#{n}", n + 1
        chosen, bracketing = in_phase(samples, phase.start, phase.end)
        entry = {"wall_s": round(phase.end - phase.start, 3), **stats(chosen, reference)}
        if bracketing:
            entry["bracketing"] = True
        phases_out[name] = entry
    return {
        "loop_iterations": loop_iterations,
        "reference_ms": round(reference, 3) if reference is not None else None,
        "reference": "fixed" if reference_ms is not None else "run_p10",
        "slow_ratio": SLOW_RATIO,
        "probe_cpu_s": round(probe_cpu_s, 3) if probe_cpu_s is not None else None,
        "probe_cpu_share": round(probe_cpu_s / wall_s, 4) if probe_cpu_s is not None and wall_s else None,
        "run": stats(samples, reference),
        "phases": phases_out,
    }


# ------------------------------------------------------------------------------------------------ child


def probe_loop(iterations: int) -> float:
    """The fixed work of one sample: interpreter dispatch and float arithmetic, no memory to speak of."""
    x = 0.0
    for i in range(iterations):
        x = x * 0.999 + i
    return x


def _host_ticks() -> tuple[int, int]:
    """(busy, steal) clock ticks of the whole host so far from ``/proc/stat``'s ``cpu`` line; (-1, -1)
    where there is none."""
    try:
        with open("/proc/stat") as stat:
            fields = [int(v) for v in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return -1, -1
    # user nice system idle iowait irq softirq steal guest guest_nice; guest time is inside user
    busy = sum(fields[:8]) - fields[3] - fields[4]
    return busy, fields[7] if len(fields) > 7 else 0


class _TreeCpu:
    """CPU ticks used so far by a process and all its descendants (read from ``/proc``, ~2 ms per
    reading with ~100 processes on the host).  A process that started since the last reading counts
    with all its ticks, one that ended since counts up to the last reading."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.total = 0
        self.seen: dict[int, int] = {}

    def ticks(self) -> int:
        children: dict[int, list[int]] = {}
        own: dict[int, int] = {}
        try:
            names = os.listdir("/proc")
        except OSError:
            return -1
        for name in names:
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as stat:
                    text = stat.read()
                # comm is in parentheses and may hold anything: the fields start after the last ')'
                fields = text[text.rindex(b")") + 2 :].split()
                pid = int(name)
                children.setdefault(int(fields[1]), []).append(pid)
                own[pid] = int(fields[11]) + int(fields[12])
            except (OSError, ValueError, IndexError):
                continue  # gone meanwhile
        current: dict[int, int] = {}
        stack = [self.root]
        while stack:
            pid = stack.pop()
            if pid in own:
                current[pid] = own[pid]
            stack.extend(children.get(pid, ()))
        for pid, ticks in current.items():
            self.total += max(0, ticks - self.seen.get(pid, 0))
        self.seen = current
        return self.total


def parse_samples(text: str) -> tuple[list[Sample], float | None]:
    """The samples of a probe's output file and its own total CPU seconds (its last line, once it ended
    cleanly); a line cut short by a kill is skipped."""
    samples: list[Sample] = []
    total: float | None = None
    for line in text.splitlines():
        fields = line.split()
        try:
            if len(fields) == 2 and fields[0] == "end":
                total = float(fields[1])
            elif len(fields) in (4, 6, 7):
                ticks = tuple(int(v) for v in fields[4:]) + (-1,) * (7 - len(fields))
                samples.append(
                    Sample(float(fields[0]), float(fields[1]), int(fields[2]), float(fields[3]), *ticks)
                )
        except ValueError:
            continue
    return samples, total


def child_main(out_path: Path, interval_s: float, iterations: int, pin: bool) -> int:
    """The probe process: sample until SIGTERM (or until its parent is gone), then write its total CPU."""
    stopping = False

    def stop(_signum: int, _frame: FrameType | None) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    parent = os.getppid()
    tree = _TreeCpu(parent)
    cpus = sorted(os.sched_getaffinity(0)) if pin and hasattr(os, "sched_setaffinity") else []
    turn = 0
    fd = os.open(out_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        probe_loop(iterations)  # warm up (first-call costs) before the first recorded sample
        while not stopping and os.getppid() == parent:  # an orphan stops: never outlive the benchmark
            cpu = -1
            if cpus:
                cpu = cpus[turn % len(cpus)]
                turn += 1
                with contextlib.suppress(OSError):  # a CPU taken offline: sample unpinned
                    os.sched_setaffinity(0, {cpu})
            time.sleep(interval_s)  # wakes on the pinned CPU
            if stopping:
                break
            wall0, cpu0 = time.monotonic(), time.process_time()
            probe_loop(iterations)
            cpu1, wall1 = time.process_time(), time.monotonic()
            # one write per line: a kill leaves at most the last line cut short
            at, cpu_ms, wall_ms = (wall0 + wall1) / 2, (cpu1 - cpu0) * 1000, (wall1 - wall0) * 1000
            busy, steal = _host_ticks()
            bench = tree.ticks()
            os.write(fd, f"{at:.4f} {cpu_ms:.3f} {cpu} {wall_ms:.3f} {busy} {steal} {bench}\n".encode())
        os.write(fd, f"end {time.process_time():.4f}\n".encode())
    finally:
        os.close(fd)
    return 0


# ----------------------------------------------------------------------------------------------- parent


class CpuProbe:
    """The probe process of one benchmark run, and the phases the benchmark marks (see the module doc)."""

    def __init__(
        self, *, interval_s: float = INTERVAL_S, iterations: int = LOOP_ITERATIONS, pin: bool = True
    ) -> None:
        self.interval_s = interval_s
        self.iterations = iterations
        self.pin = pin
        self.phases: list[Phase] = []
        self.samples: list[Sample] = []
        self.probe_cpu_s: float | None = None
        self.process: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._started_at: float | None = None
        self._stopped_at: float | None = None

    @property
    def out_path(self) -> Path:
        assert self._dir is not None, "probe not started"
        return Path(self._dir.name) / "samples.txt"

    def start(self) -> CpuProbe:
        """Start the probe process (bound to this process and reaped with it once the benchmark called
        :func:`kraft.procutil.reap_children_on_exit`; an orphaned probe also stops by itself)."""
        if self.process is not None:
            raise RuntimeError("probe already started")
        self._dir = tempfile.TemporaryDirectory(prefix="kraft-cpu-probe-")
        command = [
            sys.executable,
            "-m",
            "bench.cpu_probe",
            "--child",
            str(self.out_path),
            "--interval",
            str(self.interval_s),
            "--iterations",
            str(self.iterations),
        ]
        if not self.pin:
            command.append("--no-pin")
        self._started_at = time.monotonic()
        self.process = spawn_child(
            command, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL
        )
        return self

    def mark(self, name: str, start: float, end: float) -> None:
        """Record a phase by its ``time.monotonic()`` bounds."""
        self.phases.append(Phase(name, start, end))

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Mark the body as phase ``name`` (marked also when it raises)."""
        start = time.monotonic()
        try:
            yield
        finally:
            self.mark(name, start, time.monotonic())

    def stop(self, timeout_s: float = 5.0) -> list[Sample]:
        """Stop the probe (SIGTERM; SIGKILL to its group past ``timeout_s``), reap it, read its samples.
        Safe to call more than once."""
        process, self.process = self.process, None
        if process is None:
            return self.samples
        self._stopped_at = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        assert self._dir is not None
        try:
            text = self.out_path.read_text()
        except OSError:
            text = ""
        self.samples, self.probe_cpu_s = parse_samples(text)
        self._dir.cleanup()
        return self.samples

    def report(self, reference_ms: float | None = None) -> dict[str, Any]:
        """Stop the probe and :func:`summarize` its samples over the marked phases."""
        self.stop()
        wall_s = None
        if self._started_at is not None and self._stopped_at is not None:
            wall_s = self._stopped_at - self._started_at
        return summarize(
            self.samples,
            self.phases,
            reference_ms,
            probe_cpu_s=self.probe_cpu_s,
            wall_s=wall_s,
            loop_iterations=self.iterations,
        )

    def __enter__(self) -> CpuProbe:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> int:
    # as every benchmark's main (the probe child's own SIGTERM / SIGINT handlers replace these after)
    reap_children_on_exit()
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_probe", description=__doc__.splitlines()[0])
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--interval", type=float, default=INTERVAL_S, help="seconds between samples")
    parser.add_argument("--iterations", type=int, default=LOOP_ITERATIONS, help="loop iterations per sample")
    parser.add_argument("--no-pin", action="store_true", help="do not rotate the probe over the CPUs")
    parser.add_argument("--seconds", type=float, default=10.0, help="standalone: how long to sample")
    parser.add_argument("--reference-ms", type=float, help="standalone: a fixed reference")
    args = parser.parse_args(argv)
    if args.child is not None:
        return child_main(args.child, args.interval, args.iterations, not args.no_pin)
    probe = CpuProbe(interval_s=args.interval, iterations=args.iterations, pin=not args.no_pin).start()
    with probe.phase("all"):
        time.sleep(args.seconds)
    report = probe.report(args.reference_ms)
    report["samples"] = [[round(s.at, 3), s.cpu_ms, s.cpu, s.wall_ms] for s in probe.samples]
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
