"""bench.thread_sampler: stalls grouped from overlapping heartbeat waits, each thread's run and run-queue
time over an interval from synthetic snapshots, the nodes' sampler log lines read back, and one real
sample of this process (no timing asserted)."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from bench.thread_sampler import (
    USER_HZ,
    Snapshot,
    ThreadSampler,
    breakdown,
    host_busy_ticks,
    node_log_events,
    raw,
    slow_beat_report,
    stall_clusters,
    timeline,
    wchan_shares,
)

MS = 1_000_000


def test_overlapping_waits_make_one_stall_and_disjoint_ones_another() -> None:
    # the third overlaps the first, not the second: a stall reaches as far as its longest wait
    waits = [(1.00, 1.05), (1.01, 1.02), (1.03, 1.06), (2.0, 2.01), (1.07, 1.08)]
    assert stall_clusters(waits) == [
        [(1.00, 1.05), (1.01, 1.02), (1.03, 1.06)],
        [(1.07, 1.08)],
        [(2.0, 2.01)],
    ]
    # within the gap: joined
    assert len(stall_clusters(waits, gap_s=0.02)) == 2


def snapshots() -> list[Snapshot]:
    ticks_per_s = USER_HZ
    return [
        Snapshot(0.0, {("node-1", 10): (0, 0), ("node-1", 11): (0, 0)}, 0),
        # 0.1 s: the intake thread (11) queued 60 ms and ran 5; main (10) ran 90; the host 2 cores busy
        Snapshot(
            0.1,
            {("node-1", 10): (90 * MS, 0), ("node-1", 11): (5 * MS, 60 * MS), ("node-2", 20): (30 * MS, 0)},
            int(0.2 * ticks_per_s),
        ),
        Snapshot(0.2, {("node-1", 10): (100 * MS, 0)}, int(0.3 * ticks_per_s)),
    ]


NAMES = {("node-1", 10): "main", ("node-1", 11): "grpc-intake", ("node-2", 20): "image-store"}


def test_the_breakdown_is_each_threads_run_and_queue_time_and_the_others_cores() -> None:
    out = breakdown(snapshots(), NAMES, 0.02, 0.08)  # widened to the samples around: 0.0 .. 0.1
    assert out is not None
    assert out["span_ms"] == 100.0
    assert out["node-1"] == {"main": [90.0, 0.0], "grpc-intake": [5.0, 60.0]}
    # a thread first seen inside the span counts all its time
    assert out["node-2"] == {"image-store": [30.0, 0.0]}
    assert out["host_busy_cores"] == 2.0
    # 200 ms busy of which 125 ms by sampled threads: 0.75 of a core by others
    assert out["other_cores"] == 0.75


def test_an_interval_the_samples_do_not_cover_has_no_breakdown() -> None:
    assert breakdown(snapshots(), NAMES, -0.1, 0.05) is None
    assert breakdown(snapshots(), NAMES, 0.15, 0.3) is None


def test_wchan_samples_are_counted_per_thread_inside_the_interval() -> None:
    wchans = [
        (0.01, ("node-1", 11), "gil"),
        (0.03, ("node-1", 11), "gil"),
        (0.05, ("node-1", 11), "cpu"),
        (0.5, ("node-1", 11), "loop"),
    ]
    assert wchan_shares(wchans, NAMES, 0.0, 0.1) == {"node-1/grpc-intake": {"gil": 2, "cpu": 1}}


def test_the_nodes_sampler_lines_inside_the_interval_are_read(tmp_path: Path) -> None:
    log = tmp_path / "node1.log"
    log.write_text(
        "ts=x level=info logger=stall_sampler event=stall_sampled node=1 what=intake ms=37.3 "
        "ended_monotonic_s=100.05\n"
        "ts=x level=info logger=stall_sampler event=stall_sampled node=1 what=gil_sampler ms=30.0 "
        "ended_monotonic_s=100.07 gil_ms=25.0 run_queue_ms=5.0\n"
        "ts=x level=info logger=stall_sampler event=heartbeat_arrived_late node=1 broker=7 "
        "sent_monotonic_s=100.0 ms=40.0\n"
        "ts=x level=info logger=stall_sampler event=stall_sampled node=1 what=main ms=21.0 "
        "ended_monotonic_s=200.0\n"
        "ts=x level=info logger=controller event=other ms=99 ended_monotonic_s=100.05\n"
    )
    events = node_log_events({1: log}, 100.0, 100.1)
    assert events == [
        {"node": 1, "what": "arrived_late", "ms": 40.0, "ended_s": 100.04, "broker": 7.0},
        {"node": 1, "what": "intake", "ms": 37.3, "ended_s": 100.05},
        {
            "node": 1,
            "what": "gil_sampler",
            "ms": 30.0,
            "ended_s": 100.07,
            "gil_ms": 25.0,
            "run_queue_ms": 5.0,
        },
    ]


def test_the_report_groups_the_slowest_share_and_puts_the_longest_stall_first() -> None:
    sampler = ThreadSampler({})
    sampler.snapshots = snapshots()
    sampler.names = dict(NAMES)
    # 100 heartbeats of 1 ms from t=0 on; two slow ones overlap at 0.02 (60 ms), one alone at 0.15 (20 ms)
    beats = [(i / 1000, i / 1000 + 0.001) for i in range(100)]
    beats[20] = (0.020, 0.080)
    beats[21] = (0.021, 0.070)
    beats[99] = (0.099, 0.119)
    out = slow_beat_report(sampler, beats, 0.0, 0.1, share=0.03)
    assert out["heartbeats"] == 100
    assert out["slowest"] == 3
    assert out["stalls"] == 2
    first, second = out["longest"]
    assert (first["at_s"], first["heartbeats"], first["max_ms"]) == (0.02, 2, 60.0)
    assert first["threads"]["node-1"]["grpc-intake"] == [5.0, 60.0]
    assert (second["at_s"], second["heartbeats"], second["max_ms"]) == (0.099, 1, 20.0)
    assert out["window"]["span_ms"] == 100.0


def test_the_report_lists_sampler_lines_and_counts_late_arrivals(tmp_path: Path) -> None:
    log = tmp_path / "node1.log"
    log.write_text(
        "event=heartbeat_arrived_late node=1 broker=7 sent_monotonic_s=0.02 ms=30.0\n"
        "event=heartbeat_arrived_late node=1 broker=8 sent_monotonic_s=0.021 ms=45.0\n"
        "event=stall_sampled node=1 what=intake ms=40.0 ended_monotonic_s=0.06\n"
    )
    sampler = ThreadSampler({})
    sampler.snapshots = snapshots()
    beats = [(i / 1000, i / 1000 + 0.001) for i in range(100)]
    beats[20] = (0.020, 0.080)
    out = slow_beat_report(sampler, beats, 0.0, 0.1, share=0.01, logs={1: log})
    (stall,) = out["longest"]
    assert stall["node_logs"] == [{"node": 1, "what": "intake", "ms": 40.0, "ended_s": 0.06}]
    assert stall["arrived_late"] == {"node-1": [2, 45.0]}


def test_a_real_sample_of_this_process_names_its_main_thread() -> None:
    sampler = ThreadSampler({"bench": os.getpid()})
    sampler.sample(1.0)
    sampler.sample(2.0)
    main = ("bench", os.getpid())
    assert main in sampler.snapshots[-1].threads
    assert sampler.names[main] == "main"  # not its comm, "python", which unnamed threads share
    run0, _ = sampler.snapshots[0].threads[main]
    run1, _ = sampler.snapshots[1].threads[main]
    assert run1 >= run0  # cumulative
    assert sampler.snapshots[-1].host_busy_ticks >= 0


def test_the_timeline_sums_each_process_per_bin_and_names_a_save() -> None:
    rows = timeline(snapshots(), NAMES, 0.0, 0.2, 0.1)
    assert rows == [
        {"at_s": 0.0, "node-1": [95, 60], "node-2": [30, 0], "node-2/image-store": 30, "other_cores": 0.75},
        # node-2's thread is gone in the last snapshot: only node-1's main thread ran (10 ms)
        {"at_s": 0.1, "node-1": [10, 0], "other_cores": 0.9},
    ]


def test_the_raw_samples_are_json_lists_keyed_by_process_and_thread() -> None:
    sampler = ThreadSampler({})
    sampler.snapshots = snapshots()[:1]
    sampler.names = {("node-1", 10): "main"}
    sampler.wchans = [(0.5, ("node-1", 10), "gil")]
    assert raw(sampler) == {
        "names": {"node-1/10": "main"},
        "snapshots": [[0.0, 0, {"node-1/10": [0, 0], "node-1/11": [0, 0]}]],
        "wchans": [[0.5, "node-1/10", "gil"]],
    }


def test_the_sampler_thread_names_itself_and_reads_the_main_threads_wchan() -> None:
    sampler = ThreadSampler({"bench": os.getpid()}, interval_s=0.001)
    sampler.start()
    try:
        for _ in range(5000):  # bounded: until two snapshots, at most ~5 s
            if len(sampler.snapshots) >= 2:
                break
            time.sleep(0.001)
    finally:
        sampler.stop()
    assert "thread-sampler" in sampler.names.values()
    read = {key for _, key, _ in sampler.wchans}
    assert ("bench", os.getpid()) in read
    # only main and the wchan_comms threads (this test process may hold another test's grpc-intake thread:
    # the suite's workers run many tests in one process), never the sampler itself
    assert {sampler.names[key] for key in read} <= sampler.wchan_comms
    assert "thread-sampler" not in {sampler.names[key] for key in read}


def test_host_busy_ticks_leave_out_idle_iowait_and_steal(tmp_path: Path) -> None:
    stat = tmp_path / "stat"
    stat.write_text("cpu  100 20 30 5000 40 6 7 900 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n")
    fd = os.open(stat, os.O_RDONLY)
    try:
        assert host_busy_ticks(fd) == 100 + 20 + 30 + 6 + 7
        assert host_busy_ticks(fd) == 163  # re-read from the start each time
    finally:
        os.close(fd)
    assert host_busy_ticks() >= 0  # the real /proc/stat


def test_a_thread_started_later_is_sampled_from_the_next_listing_and_an_ended_one_dropped() -> None:
    sampler = ThreadSampler({"bench": os.getpid()}, rescan_every=2)
    release = threading.Event()
    worker = threading.Thread(target=release.wait, args=(10.0,), daemon=True)
    try:
        sampler.sample(0.0)  # a listing: the worker does not exist yet
        worker.start()
        key = ("bench", worker.native_id or -1)
        sampler.sample(1.0)  # no listing
        assert key not in sampler.snapshots[-1].threads
        sampler.sample(2.0)  # a listing: found
        assert key in sampler.snapshots[-1].threads
        release.set()
        worker.join(timeout=10.0)
        # join returns when Python's thread state is released; the OS thread still runs its exit for a moment
        # (CI once sampled it then), so wait, bounded, until the kernel has removed it
        task = Path(f"/proc/{os.getpid()}/task/{key[1]}")
        for _ in range(10_000):  # at most ~10 s
            if not task.exists():
                break
            time.sleep(0.001)
        assert not task.exists()
        sampler.sample(3.0)  # its files read nothing any more: dropped, closed
        assert key not in sampler.snapshots[-1].threads
        assert key not in sampler._fds
    finally:
        release.set()
        sampler.close()
