"""bench.replay_lag: the two gauges read from a metrics page, and a follower's lag, catch-up and main
thread's running and run-queue shares from synthetic samples (no processes)."""

from __future__ import annotations

from bench.replay_lag import APPLIED, HIGH_WATERMARK, gauge, summarize, wait_class

PAGE = (
    "\n# HELP kraft_controller_last_applied_record_offset_x other\n"
    'kraft_controller_last_applied_record_offset_x{node="1"} 7.0\n'
    'kraft_controller_last_applied_record_offset{node="1"} 1234.0\n'
    'kraft_raft_high_watermark{node="1"} 1240.0\n'
)


def test_a_gauge_is_read_by_its_exact_name() -> None:
    assert gauge(PAGE, APPLIED) == 1234
    assert gauge(PAGE, HIGH_WATERMARK) == 1240
    assert gauge(PAGE, "kraft_absent") == -1


def test_a_lagging_follower_is_summarized_against_the_leader() -> None:
    # leader 1 applies at once; follower 2 lags and catches up 1.6 s after the bulk phase's end (t=1.9)
    # applied: the last record's offset; the high watermark: the offset after it
    leader = [(t / 2, 100 * t - 1, 100 * t, 0, 0) for t in range(0, 9)]  # hwm 0..800, every 0.5 s
    leader += [(5.0, 799, 800, 0, 0)]
    ms = 1_000_000
    follower = [
        (0.0, -1, 0, 0, 0),
        (1.0, 49, 200, 250 * ms, 500 * ms),  # in the bulk phase's first 1 s: ran 0.25, queued 0.5
        (2.0, 199, 400, 500 * ms, 600 * ms),
        (2.5, 299, 500, 1000 * ms, 600 * ms),  # after the bulk phase: running all the time
        (3.0, 389, 500, 1500 * ms, 600 * ms),
        (3.5, 399, 500, 2000 * ms, 600 * ms),
        (4.0, 799, 800, 2500 * ms, 600 * ms),
    ]
    out = summarize({1: leader, 2: follower}, 1, 0.0, 1.9)
    # the leader's high watermark asked for first at or after the bulk phase's end: 400 (at t=2.0), not
    # the 300 of its sample before it
    assert out["leader_hwm_after_bulk_end"] == 400
    two = out["node-2"]
    assert (two["max_lag_records"], two["max_lag_at_s"]) == (300, 3.5)  # 400 applied, the leader at 700
    assert two["caught_up_after_bulk_s"] == 1.6
    assert two["main_thread"] == {
        "bulk": {"running": 0.25, "runqueue": 0.5},
        "until_caught_up": {"running": 1.0, "runqueue": 0.0},
    }
    assert out["node-1"]["max_lag_records"] == 0
    assert out["node-1"]["caught_up_after_bulk_s"] == 0.1  # its first sample after the end: up to date


def test_a_wait_is_classed_by_its_kernel_function() -> None:
    assert wait_class("0") == "cpu"
    assert wait_class("") == "cpu"
    assert wait_class("futex_wait_queue") == "gil"
    assert wait_class("futex_wait_queue_me\n") == "gil"
    assert wait_class("do_epoll_wait") == "loop"
    assert wait_class("ep_poll") == "loop"
    assert wait_class("pipe_read") == "other"


def test_the_main_thread_waits_are_shared_out_per_window() -> None:
    leader = [(0.0, 0, 1, 0, 0), (1.0, 99, 100, 0, 0), (3.0, 99, 100, 0, 0)]
    follower = [(0.0, 0, 1, 0, 0), (1.0, 9, 100, 0, 0), (2.0, 99, 100, 0, 0), (3.0, 99, 100, 0, 0)]
    # bulk phase [0, 1]: 3 cpu, 1 loop; then until caught up at t=2: 1 gil, 1 cpu, 2 loop; one sample after
    waits = {
        2: [
            (0.1, "cpu"),
            (0.4, "cpu"),
            (0.7, "loop"),
            (0.9, "cpu"),
            (1.2, "gil"),
            (1.4, "cpu"),
            (1.6, "loop"),
            (1.9, "loop"),
            (2.5, "gil"),
        ]
    }
    out = summarize({1: leader, 2: follower}, 1, 0.0, 1.0, waits)
    two = out["node-2"]
    assert two["caught_up_after_bulk_s"] == 1.0
    assert two["main_thread_waits"] == {
        "bulk": {"cpu": 0.75, "gil": 0.0, "loop": 0.25, "other": 0.0},
        "until_caught_up": {"cpu": 0.25, "gil": 0.25, "loop": 0.5, "other": 0.0},
    }
    assert "main_thread_waits" not in out["node-1"]  # no samples of it
    assert "main_thread_waits" not in summarize({1: leader, 2: follower}, 1, 0.0, 1.0)["node-2"]
