"""bench.device_suite: its plan (order, each step's timeout inside the budget), the summary's met / not met
rows from result documents of the benchmarks' shape, and that a run writes the summary after every step
and stops an overrunning step.  No benchmark runs here: the steps are tiny stand-in modules."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

from bench import device_suite
from bench.device_suite import (
    RESERVE_S,
    STEPS,
    Step,
    comparison_checks,
    controller_checks,
    create_trace_checks,
    plan,
    raft_checks,
    raft_cpu_checks,
    step_timeout,
    summarize,
)


def _rows(checks: list[device_suite.Check]) -> dict[str, tuple[float | None, bool | None]]:
    return {c.measure: (c.value, c.met) for c in checks}


def test_the_most_important_measures_come_first_and_fit_in_eight_minutes() -> None:
    names = [s.name for s in STEPS]
    assert names == [
        "raft",
        "controller",
        "raft_cpu_intake0",
        "raft_cpu_intake3x",
        "create_trace",
        "controller_intake3x",
    ]
    # raft, controller and the raft_cpu pair: each run to its own timeout, still inside 8 minutes
    assert sum(s.timeout_s for s in STEPS[:4]) <= 480
    assert all(s.min_s <= s.timeout_s for s in STEPS)


def test_the_worst_case_plan_of_the_default_budget_leaves_out_only_the_last_step() -> None:
    assert plan(STEPS, device_suite.DEFAULT_BUDGET_S) == [
        ("raft", 120.0),
        ("controller", 180.0),
        ("raft_cpu_intake0", 90.0),
        ("raft_cpu_intake3x", 90.0),
        ("create_trace", 50.0),  # what the first four leave it (above its 40-s minimum)
        ("controller_intake3x", None),
    ]
    assert all(timeout is not None for _, timeout in plan(STEPS, 800.0))


@pytest.mark.parametrize("budget_s", [0.0, 5.0, 11.0, 60.0, 75.0, 130.0, 200.0, 333.0, 481.0, 540.0, 1000.0])
@pytest.mark.parametrize("smoke", [False, True])
def test_no_plan_runs_past_its_budget(budget_s: float, smoke: bool) -> None:
    planned = plan(STEPS, budget_s, smoke)
    ran = [timeout for _, timeout in planned if timeout is not None]
    # every step started keeps the reserve for the suite after it
    assert sum(ran) + RESERVE_S * (1 if ran else 0) <= max(budget_s, RESERVE_S)
    for (name, timeout), step in zip(planned, STEPS, strict=True):
        assert name == step.name
        if timeout is not None:
            assert timeout <= step.timeout_s
            assert smoke or timeout >= step.min_s


def test_a_step_gets_what_is_left_but_is_skipped_below_its_minimum() -> None:
    controller = STEPS[1]
    assert step_timeout(controller, 1000.0) == controller.timeout_s
    assert step_timeout(controller, controller.min_s + RESERVE_S + 5) == controller.min_s + 5
    assert step_timeout(controller, controller.min_s + RESERVE_S - 1) is None
    # a smoke run has no minimum, but never runs past the budget
    assert step_timeout(controller, RESERVE_S + 3, smoke=True) == 3
    assert step_timeout(controller, RESERVE_S, smoke=True) is None


def _points(rates: dict[int, float], p50s: dict[int, float]) -> list[dict[str, Any]]:
    return [{"clients": c, "writes_per_s": rates[c], "p50_ms": p50s[c]} for c in rates]


def test_raft_rows_compare_unary_with_the_floor_and_etcd_of_the_same_run() -> None:
    doc: dict[str, Any] = {
        "throughput": {
            "kraft": {
                "points": _points({1: 500, 64: 9000}, {1: 1.2, 64: 6.0}),
                "stream_points": _points({1: 600, 64: 12000}, {1: 1.0, 64: 5.0}),
            },
            "etcd": _points({1: 1300, 64: 15000}, {1: 0.76, 64: 4.1}),
            "grpc_aio_floor": _points({1: 1600, 64: 10000}, {1: 0.6, 64: 6.6}),
        }
    }
    rows = _rows(raft_checks("raft", doc, 16))
    assert rows["unary_64_clients_over_floor"] == (0.9, True)  # the target's edge counts as met
    assert rows["unary_1_client_p50_over_etcd"] == (1.579, False)
    assert rows["moonshot_unary_64_clients_over_etcd"] == (0.6, False)
    assert rows["stream_64_clients_writes_per_s"] == (12000.0, None)
    # no etcd in the run (not installed): the etcd rows say unknown, not met or failed
    doc["throughput"]["etcd"] = None
    rows = _rows(raft_checks("raft", doc, 16))
    assert rows["unary_1_client_p50_over_etcd"] == (None, None)
    assert rows["moonshot_unary_64_clients_over_etcd"] == (None, None)
    assert rows["unary_64_clients_over_floor"] == (0.9, True)


def _controller_doc(bulk_p99: float, errors: int = 0) -> dict[str, Any]:
    return {
        "heartbeats": {
            "errors": errors,
            "false_fencing": 0,
            "idle": {"p99_ms": 2.0},
            "during_bulk_operations": {"p50_ms": 10.0, "p99_ms": bulk_p99},
            "after_bulk_operations": {"p99_ms": 9.0},
        },
        "controller_epochs": {"leader_changes_during_bulk": 0},
        "controlled_shutdown": {"seconds": 3.6},
        "create_partitions": {"seconds": 5.8},
        "admin_ops_one_client": {"p50_ms": 2.9},
        "admin_ops": {"p50_ms": 16.9, "ops_per_second": 936.0},
    }


def test_controller_rows_use_the_heartbeat_target_of_the_machine() -> None:
    rows16 = _rows(controller_checks("controller", _controller_doc(120.0), 16))
    rows2 = _rows(controller_checks("controller", _controller_doc(120.0), 2))
    assert rows16["heartbeat_p99_during_bulk_ms"] == (120.0, False)  # <= 50 ms on 16 cores
    assert rows2["heartbeat_p99_during_bulk_ms"] == (120.0, True)  # <= 250 ms on 2 cores
    assert rows16["heartbeat_errors"] == (0, True)
    assert rows16["controlled_shutdown_s"] == (3.6, True)
    assert rows16["create_partitions_s"] == (5.8, False)
    assert rows16["create_topics_1_client_p50_ms"] == (2.9, True)
    # an older result without the 1,000-broker measurement: unknown
    assert rows16["create_topics_1_client_all_brokers_p50_ms"] == (None, None)
    rows = _rows(controller_checks("controller", _controller_doc(20.0, errors=3), 16))
    assert rows["heartbeat_p99_during_bulk_ms"] == (20.0, True)
    assert rows["heartbeat_errors"] == (3, False)


def _cpu_doc(unary: list[float], floor: list[float]) -> dict[str, Any]:
    return {
        "systems": {
            "floor": [{"writes_per_s": r} for r in floor],
            "kraft_unary": [
                {"writes_per_s": r, "leader_with_intake_us_per_write": 500.0, "cpu_us_per_write_all": 900.0}
                for r in unary
            ],
            "kraft_stream": [{"writes_per_s": 2 * r} for r in unary],
        }
    }


def test_raft_cpu_rows_take_the_median_round_and_compare_the_intake_runs() -> None:
    rows = _rows(raft_cpu_checks("raft_cpu_intake0", _cpu_doc([1000, 5000], [8000, 2000]), 16))
    assert rows["unary_writes_per_s"] == (3000.0, None)
    assert rows["unary_64_clients_over_floor"] == (0.6, False)
    docs = {
        "raft_cpu_intake0": _cpu_doc([1000, 1000], [2000, 2000]),
        "raft_cpu_intake3x": _cpu_doc([2500, 2500], [2000, 2000]),
    }
    compared = _rows(comparison_checks(docs))
    assert compared["unary_writes_per_s_intake3x_over_0"] == (2.5, None)
    assert "heartbeat_p99_during_bulk_intake3x_over_0" not in compared  # the controller pair did not run


def test_create_trace_rows_group_its_steps_by_what_they_are() -> None:
    from bench.create_trace import STEPS as TRACE_STEPS

    probes = [probe for _role, probe, _label in TRACE_STEPS[1:]]
    # the groups name steps the trace has (a renamed probe would silently leave its group)
    assert set(device_suite.TRACE_GRPC_PROBES) | set(device_suite.TRACE_FSYNC_PROBES) <= set(probes)
    doc = {
        "rounds": [
            {"client_p50_ms": ms, "steps": [{"probe": probe, "p50_us": 10.0} for probe in probes]}
            for ms in (3.5, 2.5, 4.0)
        ]
        + [{"client_p50_ms": None, "steps": []}]  # a window with nothing traced counts for nothing
    }
    rows = _rows(create_trace_checks("create_trace", doc, 16))
    total = 10.0 * len(probes)
    assert rows["create_topics_1_client_p50_ms"] == (3.5, False)
    assert rows["grpc_messages_us"] == (40.0, None)
    assert rows["follower_fdatasync_us"] == (10.0, None)
    assert rows["sum_of_step_p50s_us"] == (total, None)
    assert rows["python_steps_us"] == (total - 50.0, None)
    assert _rows(create_trace_checks("create_trace", {}, 16))["create_topics_1_client_p50_ms"] == (None, None)


def test_the_summary_counts_only_rows_with_a_target() -> None:
    record = device_suite.StepRecord("controller", ["x"], "ok", 180.0)
    summary = summarize([record], {"controller": _controller_doc(120.0)}, STEPS, 16, {"commit": "c"})
    assert summary["commit"] == "c"
    assert summary["targets_met"] == 5  # errors, fencing, leader changes, shutdown, one-client p50
    assert summary["targets_not_met"] == 2  # bulk p99 on 16 cores, creation 5.8 s
    assert summary["targets_unknown"] == 1  # the 1,000-broker CreateTopics p50
    assert summary["steps"][0]["status"] == "ok"


_FAKE_BENCH = """
import json, os, sys, time
args = sys.argv[1:]
out = args[args.index("--out") + 1]
if "--hang" in args:
    time.sleep(60)
if "--fail" in args:
    sys.exit(3)
json.dump({"systems": {"floor": [{"writes_per_s": 100}], "kraft_unary": [{"writes_per_s": 95}]},
           "etcd_install": os.environ.get("KRAFT_BENCH_ETCD_INSTALL")}, open(out, "w"))
print("fake bench done")
"""


def test_a_run_writes_the_summary_after_every_step_and_stops_an_overrunning_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "fakebench.py").write_text(_FAKE_BENCH)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", f"{tmp_path}:{Path(__file__).resolve().parents[2]}")
    monkeypatch.setattr(device_suite, "RESERVE_S", 0.5)
    monkeypatch.setattr(device_suite, "TERM_GRACE_S", 2.0)
    steps = (
        Step("raft_cpu_intake0", "fakebench", (), (), timeout_s=20.0, min_s=0.1, checks=raft_cpu_checks),
        Step("hangs", "fakebench", ("--hang",), (), timeout_s=1.0, min_s=0.1, checks=raft_cpu_checks),
        Step("fails", "fakebench", ("--fail",), (), timeout_s=20.0, min_s=0.1, checks=raft_cpu_checks),
        Step("too_big", "fakebench", (), (), timeout_s=20.0, min_s=1000.0, checks=raft_cpu_checks),
    )
    monkeypatch.setattr(device_suite, "STEPS", steps)
    out = tmp_path / "out"
    summary = device_suite.run_suite(out, tmp_path / "logs", budget_s=60.0, smoke=False, commit="abc")
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk == json.loads(json.dumps(summary))
    statuses = {r["name"]: r["status"] for r in on_disk["steps"]}
    assert statuses == {"raft_cpu_intake0": "ok", "hangs": "timeout", "fails": "failed", "too_big": "skipped"}
    assert "fake bench done" in on_disk["steps"][0]["output_tail"]
    assert sorted(p.name for p in out.iterdir()) == ["raft_cpu_intake0.json", "summary.json"]
    assert _rows([device_suite.Check(**c) for c in on_disk["checks"]])["unary_64_clients_over_floor"] == (
        0.95,
        True,
    )
    assert sys.executable in on_disk["steps"][0]["command"]
    # no network on the device: a step never tries to apt-get etcd (it waits out apt's timeout there)
    assert json.loads((out / "raft_cpu_intake0.json").read_text())["etcd_install"] == "0"
