"""bench.cpu_probe: its statistics on synthetic samples (phase splitting, reference, speed factor), the
parsing of its output, and that its process never outlives the benchmark that started it.  No timing is
asserted: the probe's numbers are read by benchmarks, not checked here."""

from __future__ import annotations

import os
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from bench.cpu_probe import (
    TICK_S,
    CpuProbe,
    Phase,
    Sample,
    _TreeCpu,
    host_load,
    in_phase,
    parse_samples,
    percentile,
    reference_of,
    stats,
    summarize,
)

REPO_ROOT = Path(__file__).resolve().parents[2]


def samples_at(values: list[tuple[float, float]], cpus: int = 2) -> list[Sample]:
    """Samples at the given (time, ms), pinned round-robin over ``cpus`` CPUs as the probe pins them."""
    return [Sample(at, ms, index % cpus) for index, (at, ms) in enumerate(values)]


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 11)]  # 1..10
    assert percentile(values, 0.1) == 1.0
    assert percentile(values, 0.5) == 5.0
    assert percentile(values, 0.9) == 9.0
    assert percentile(values, 1.0) == 10.0
    assert percentile([7.0], 0.1) == 7.0


def test_the_default_reference_is_the_fast_mode_of_the_run() -> None:
    # 20 samples: 4 fast (5 ms), 16 slow (8.5 ms): the 10th percentile is the fast mode
    run = samples_at([(float(i), 5.0 if i < 4 else 8.5) for i in range(20)])
    assert reference_of(run) == 5.0
    assert reference_of([]) is None


def test_a_phase_takes_the_samples_inside_its_bounds() -> None:
    run = samples_at([(t * 0.25, 5.0) for t in range(40)])  # 0.0 .. 9.75 s
    inside, bracketing = in_phase(run, 2.0, 3.0)
    assert [s.at for s in inside] == [2.0, 2.25, 2.5, 2.75]  # start inclusive, end exclusive
    assert not bracketing


def test_a_phase_shorter_than_the_interval_reads_its_two_neighbours() -> None:
    run = samples_at([(1.0, 5.0), (2.0, 9.0), (3.0, 6.0)])
    around, bracketing = in_phase(run, 2.1, 2.4)
    assert bracketing
    assert [s.at for s in around] == [2.0, 3.0]
    # before the first sample: only the one after
    assert [s.at for s in in_phase(run, 0.1, 0.2)[0]] == [1.0]
    assert in_phase([], 0.0, 1.0) == ([], False)


def test_speed_factor_is_the_mean_over_the_reference_and_counts_slow_samples() -> None:
    # a phase half in each mode: the median would name one mode, the mean gives the average cost
    phase = samples_at([(0.0, 5.0), (0.25, 8.5), (0.5, 5.0), (0.75, 8.5)])
    out = stats(phase, reference_ms=5.0)
    assert out["samples"] == 4
    assert out["mean_ms"] == 6.75
    assert out["speed_factor"] == 1.35
    assert out["slow_share"] == 0.5  # 8.5 > 1.3 x 5.0; 5.0 is not
    assert out["p10_ms"] == 5.0 and out["p90_ms"] == 8.5
    # round-robin pinning put the fast samples on CPU 0, the slow ones on CPU 1
    assert out["per_cpu_mean_ms"] == {"0": 5.0, "1": 8.5}
    assert stats([], 5.0) == {"samples": 0, "speed_factor": None}
    assert stats(phase, None)["speed_factor"] is None


def test_summarize_splits_phases_and_names_repeated_ones() -> None:
    # 0-5 s fast (5 ms), 5-10 s slow (8.5 ms), one sample every 0.25 s
    run = samples_at([(t * 0.25, 5.0 if t < 20 else 8.5) for t in range(40)])
    phases = [Phase("idle", 0.0, 5.0), Phase("bulk", 5.0, 10.0), Phase("bulk", 4.0, 6.0)]
    report = summarize(run, phases, probe_cpu_s=0.2, wall_s=10.0)
    assert report["reference"] == "run_p10" and report["reference_ms"] == 5.0
    assert report["probe_cpu_share"] == 0.02
    assert report["phases"]["idle"]["speed_factor"] == 1.0
    assert report["phases"]["bulk"]["speed_factor"] == 1.7
    assert report["phases"]["bulk"]["wall_s"] == 5.0
    straddling = report["phases"]["bulk#2"]  # 4 fast + 4 slow samples
    assert straddling["samples"] == 8 and straddling["speed_factor"] == 1.35
    assert report["run"]["samples"] == 40


def test_a_fixed_reference_replaces_the_run_p10() -> None:
    # a run entirely in the slow mode: against its own p10 it reads 1.0, against a fixed fast reference 1.7
    run = samples_at([(t * 0.25, 8.5) for t in range(20)])
    assert summarize(run, [Phase("all", 0.0, 5.0)])["phases"]["all"]["speed_factor"] == 1.0
    fixed = summarize(run, [Phase("all", 0.0, 5.0)], reference_ms=5.0)
    assert fixed["reference"] == "fixed" and fixed["phases"]["all"]["speed_factor"] == 1.7


def test_host_load_reads_busy_cpus_steal_and_the_probes_wait() -> None:
    ticks_per_s = round(1 / TICK_S)
    cpus = os.cpu_count() or 1
    # over 2 s the host used 3 CPU-seconds (1.5 CPUs busy) and lost 0.2 s to steal per CPU
    first = Sample(10.0, 5.0, 0, 5.0, busy_ticks=1000, steal_ticks=50, bench_ticks=0)
    last = Sample(
        12.0,
        5.0,
        1,
        15.0,
        busy_ticks=1000 + 3 * ticks_per_s,
        steal_ticks=50 + round(0.2 * cpus * ticks_per_s),
        bench_ticks=2 * ticks_per_s,  # of the 3 CPU-seconds, 2 were the benchmark's own
    )
    load = host_load([first, last])
    assert load["host_busy_cpus"] == 1.5
    assert load["bench_busy_cpus"] == 1.0 and load["others_busy_cpus"] == 0.5
    assert load["steal_share"] == 0.1
    assert load["probe_wall_over_cpu"] == 2.0  # 20 ms of wall for 10 ms of CPU: it waited for a CPU
    # unknown host ticks (an old sample format) or a single sample: no rate
    assert host_load([Sample(10.0, 5.0, 0, 5.0), Sample(12.0, 5.0, 1, 5.0)])["host_busy_cpus"] is None
    assert host_load([first])["host_busy_cpus"] is None


_BURNER = """
import sys, time
start = time.process_time()
while time.process_time() - start < 0.3:  # 0.3 s of CPU, however long that takes
    pass
print("burnt", flush=True)
sys.stdin.readline()
"""


def test_the_bench_tree_counts_its_descendants_cpu_and_not_the_hosts() -> None:
    tree = _TreeCpu(os.getpid())
    before = tree.ticks()
    burner = subprocess.Popen([sys.executable, "-c", _BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert burner.stdout is not None and burner.stdin is not None
    try:
        ready, _, _ = select.select([burner.stdout], [], [], 60.0)
        assert ready and burner.stdout.readline() == b"burnt\n", "the child burnt no CPU within 60 s"
        during = tree.ticks()  # the child still runs: its 0.3 CPU-seconds count (10 ms ticks)
        assert (during - before) * TICK_S >= 0.25
        assert burner.pid in tree.seen
    finally:
        burner.stdin.close()
        burner.wait(timeout=30)
    after = tree.ticks()  # ended: counted once, not lost, not counted again
    assert after >= during and burner.pid not in tree.seen
    assert _TreeCpu(-5).ticks() == 0  # no such process: nothing counted


def test_parse_samples_skips_a_line_cut_short_and_reads_the_total() -> None:
    text = "100.5 5.250 0 5.400\n100.75 8.000 1 12.000\nend 0.3100\n101.0 5.1"
    samples, total = parse_samples(text)
    assert samples == [Sample(100.5, 5.25, 0, 5.4), Sample(100.75, 8.0, 1, 12.0)]
    assert total == 0.31
    assert parse_samples("100.5 5.250 0 5.4") == ([Sample(100.5, 5.25, 0, 5.4)], None)
    assert parse_samples("100.5 5.250 0 5.4 700 3")[0] == [Sample(100.5, 5.25, 0, 5.4, 700, 3)]


def test_the_probe_samples_marks_phases_and_stops() -> None:
    probe = CpuProbe(interval_s=0.02, iterations=1000)
    with probe:
        with probe.phase("sleep"):
            deadline = time.monotonic() + 30.0
            while not os.path.exists(probe.out_path) or probe.out_path.read_text().count("\n") < 3:
                assert time.monotonic() < deadline, "the probe wrote no samples within 30 s"
                time.sleep(0.02)
        process = probe.process
        assert process is not None
    assert process.returncode is not None  # reaped
    assert probe.process is None and len(probe.samples) >= 3
    assert probe.probe_cpu_s is not None  # it ended cleanly on SIGTERM and wrote its total
    assert all(min(s.busy_ticks, s.steal_ticks, s.bench_ticks) >= 0 for s in probe.samples)  # /proc read
    report = probe.report()
    assert report["phases"]["sleep"]["samples"] >= 1
    allowed = {-1, *os.sched_getaffinity(0)}
    assert {s.cpu for s in probe.samples} <= allowed
    assert probe.stop() == probe.samples  # idempotent


_BENCH_WITH_PROBE = """
import sys
from bench.cpu_probe import CpuProbe
from kraft.procutil import reap_children_on_exit

reap_children_on_exit()
probe = CpuProbe(interval_s=0.05, iterations=1000).start()
print(probe.process.pid, flush=True)
sys.stdin.readline()  # the test's go; never stops the probe itself
if sys.argv[1] == "crash":
    raise RuntimeError("benchmark failed")
"""


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :].split()[0] != "Z"


@pytest.mark.parametrize("how", ["exit", "crash", "SIGTERM", "SIGKILL"])
def test_a_benchmark_ending_any_way_takes_its_probe_with_it(how: str) -> None:
    bench = subprocess.Popen(
        [sys.executable, "-c", _BENCH_WITH_PROBE, how],
        cwd=REPO_ROOT,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert bench.stdout is not None and bench.stdin is not None
    try:
        ready, _, _ = select.select([bench.stdout], [], [], 30.0)
        assert ready, "the bench-like script printed nothing within 30 s"
        probe_pid = int(bench.stdout.readline())
        assert _alive(probe_pid)
        if how == "SIGKILL":  # the kernel's death signal (procutil's trampoline), or the orphan check
            bench.kill()
        elif how == "SIGTERM":  # a `timeout`: reap_children_on_exit's handler kills the probe's group
            bench.terminate()
        else:
            bench.stdin.write(b"go\n")
            bench.stdin.flush()
        bench.wait(timeout=30)
        deadline = time.monotonic() + 10.0
        while _alive(probe_pid):
            assert time.monotonic() < deadline, f"probe {probe_pid} outlived the benchmark ({how})"
            time.sleep(0.05)
    finally:
        bench.kill()
        bench.wait(timeout=30)


def test_the_check_bins_triples_by_the_loops_factor_and_normalises_units() -> None:
    from bench.cpu_probe_check import analyse

    rows: list[tuple[int, float, float, float]] = []
    for i in range(100):
        slow = i % 5 == 0  # a fifth of the triples (at both positions) slow: the loop and both units 1.6x
        position = i % 2  # the logic unit costs twice as much at cycle position 1: normalised away
        factor = 1.6 if slow else 1.0
        rows.append((position, 5.0 * factor, (1.0 + position) * factor, 0.5 * factor))
    result = analyse(rows)
    assert result["triples"] == 100 and result["loop_reference_ms"] == 5.0
    fast, slow_bin = result["bins"]
    assert (fast["loop_factor_from"], fast["triples"]) == (0.0, 80)
    assert (fast["loop"], fast["controller_logic"], fast["protobuf_parse"]) == (1.0, 1.0, 1.0)
    assert (slow_bin["loop_factor_from"], slow_bin["loop_factor_below"]) == (1.5, None)
    assert slow_bin["triples"] == 20
    assert (slow_bin["loop"], slow_bin["controller_logic"], slow_bin["protobuf_parse"]) == (1.6, 1.6, 1.6)
    assert result["pearson_loop_protobuf"] == 1.0
    assert analyse([(0, 5.0, 1.0, 0.5)])["pearson_loop_protobuf"] is None  # one triple: no correlation
