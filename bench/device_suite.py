"""Issue #17's 16-core measurements as ONE command inside a fixed time budget (a lent device machine).

A device machine is lent for 15 minutes of device time in all, its start-up included, and one command may
run 10 minutes; a step that runs past that limit loses everything it had not written.  So this runs
every measure issue #17 asks for on the 16-core machine, most important first, each as its own process
with its own timeout (never past what is left of ``--budget-s``), and writes as it goes:

- ``DIR/<step>.json``: the benchmark's own result document (what ``--out`` of that benchmark writes);
- ``DIR/summary.json``: rewritten after every step: per step its status (``ok``, ``failed``,
  ``timeout``, ``skipped``), seconds, load average and output tail, and one row per target — the
  measure, the number, the target, met or not (``met`` is null where the number is missing) — so a
  kill of the whole command keeps every step that finished.

Steps (order = priority; the timeouts of the first four sum to 480 s, so the three most important
measures fit in 8 minutes even when every one of them runs to its timeout):

1. ``raft``: ``bench.raft --quick`` — kraft unary and stream, etcd and the no-op grpc.aio floor at 1, 16
   and 64 clients (targets: unary 64 clients >= 0.9x floor, 1-client unary p50 <= 1.5x etcd, moonshot
   unary 64 clients >= 1.0x etcd);
2. ``controller``: ``bench.controller --no-image-memory --cpu`` — 1,000 brokers, 100,000-partition bulk
   phase (heartbeat p99 during bulk <= 50 ms on 16 cores, <= 250 ms on fewer, 0 errors, no false fencing,
   no leader change, controlled shutdown and creation <= 5 s, 1-client CreateTopics p50 <= 3 ms);
3. ``raft_cpu_intake0`` / 4. ``raft_cpu_intake3x``: ``bench.raft_cpu --connections 64`` with intake
   processes 0, then 3 exclusive — CPU per write and writes/s against the floor of the same run;
5. ``create_trace``: ``bench.create_trace`` — a lone CreateTopics' per-step table (where the ≤ 3 ms
   target's time goes: the gRPC messages, the follower's fdatasync, the Python steps; ~30 s);
6. ``controller_intake3x``: ``bench.controller`` again with 3 exclusive intake processes, budget allowing.

At most 8 files come back from a device run ($OUT), so the step logs stay out of ``DIR`` (``--log-dir``,
default a temporary folder; their last lines are in the summary).  ``--smoke`` runs every step at its
smallest size (minutes on a 2-core host; for checking the suite, not for numbers).

Run on the device (see docs/operations.md, "Device run"):
``bash .devpack/run.sh python -m bench.device_suite --out-dir $OUT --budget-s 540``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.raft_etcd import etcd_available
from kraft.procutil import reap_children_on_exit, spawn_child

SUMMARY_NAME = "summary.json"
DEFAULT_BUDGET_S = 540.0
# Seconds kept back from every step's timeout for the suite itself (killing a step, writing the summary).
RESERVE_S = 10.0
# A step that overran gets SIGTERM (its benchmark kills its quorum and exits through its finally blocks),
# then SIGKILL of its whole process group after this long.
TERM_GRACE_S = 10.0
INTAKE_3X = ("--set", "controller.intake.processes=3", "--set", "controller.intake.exclusive=true")
INTAKE_0 = ("--set", "controller.intake.processes=0")
# issue #17: heartbeat p99 during the bulk phase <= 50 ms on 16 cores, <= 250 ms on 2 cores
MANY_CORES = 16


@dataclass(frozen=True, slots=True)
class Check:
    """One row of the summary: a measured number against its target (``met`` None: no number, or the
    row only reports a number that has no target)."""

    step: str
    measure: str
    value: float | None
    target: str
    met: bool | None


@dataclass(frozen=True, slots=True)
class Step:
    name: str
    module: str
    args: tuple[str, ...]
    smoke_args: tuple[str, ...]
    # Seconds the step may take at full size on 16 cores.  This host (2 loaded cores) took: bench.raft
    # --quick 56 s, bench.controller --no-image-memory ~100 s, bench.raft_cpu ~45 s; most of each is
    # fixed-length windows, so 16 cores shorten them less than the 2-4x of CPU-bound work.
    timeout_s: float
    # Below this many seconds left the step is not started: it could not finish.
    min_s: float
    checks: Callable[[str, Mapping[str, Any], int], list[Check]]


def _by_clients(points: Sequence[Mapping[str, Any]] | None) -> dict[int, Mapping[str, Any]]:
    return {int(p["clients"]): p for p in points or ()}


def _ratio(numerator: float | None, denominator: float | None) -> float | None:
    if numerator is None or not denominator:
        return None
    return round(numerator / denominator, 3)


def _at_most(value: float | None, limit: float) -> bool | None:
    return None if value is None else value <= limit


def _at_least(value: float | None, limit: float) -> bool | None:
    return None if value is None else value >= limit


def _get(doc: Mapping[str, Any], *path: str) -> Any:
    """``doc[path[0]][path[1]]...`` or None where any key is missing."""
    value: Any = doc
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    return value


def raft_checks(step: str, doc: Mapping[str, Any], _cpus: int) -> list[Check]:
    """bench.raft: kraft unary against the no-op floor and etcd of the same run."""
    throughput = doc.get("throughput", {})
    unary = _by_clients(_get(throughput, "kraft", "points"))
    stream = _by_clients(_get(throughput, "kraft", "stream_points"))
    etcd = _by_clients(throughput.get("etcd"))
    floor = _by_clients(throughput.get("grpc_aio_floor"))

    def rate(points: dict[int, Mapping[str, Any]], clients: int) -> float | None:
        point = points.get(clients)
        return None if point is None else float(point["writes_per_s"])

    def p50(points: dict[int, Mapping[str, Any]], clients: int) -> float | None:
        point = points.get(clients)
        return None if point is None else float(point["p50_ms"])

    unary_floor = _ratio(rate(unary, 64), rate(floor, 64))
    unary_etcd_p50 = _ratio(p50(unary, 1), p50(etcd, 1))
    unary_etcd = _ratio(rate(unary, 64), rate(etcd, 64))
    return [
        Check(step, "unary_64_clients_over_floor", unary_floor, ">= 0.9", _at_least(unary_floor, 0.9)),
        Check(step, "unary_1_client_p50_over_etcd", unary_etcd_p50, "<= 1.5", _at_most(unary_etcd_p50, 1.5)),
        Check(step, "moonshot_unary_64_clients_over_etcd", unary_etcd, ">= 1.0", _at_least(unary_etcd, 1.0)),
        Check(step, "unary_64_clients_writes_per_s", rate(unary, 64), "", None),
        Check(step, "stream_64_clients_writes_per_s", rate(stream, 64), "", None),
        Check(step, "etcd_64_clients_writes_per_s", rate(etcd, 64), "", None),
        Check(step, "floor_64_clients_writes_per_s", rate(floor, 64), "", None),
        Check(step, "unary_1_client_p50_ms", p50(unary, 1), "", None),
        Check(step, "stream_1_client_p50_ms", p50(stream, 1), "", None),
        Check(step, "etcd_1_client_p50_ms", p50(etcd, 1), "", None),
        Check(step, "floor_1_client_p50_ms", p50(floor, 1), "", None),
    ]


def heartbeat_p99_limit_ms(cpus: int) -> float:
    return 50.0 if cpus >= MANY_CORES else 250.0


def controller_checks(step: str, doc: Mapping[str, Any], cpus: int) -> list[Check]:
    """bench.controller: issue #17's heartbeat, bulk and CreateTopics targets."""
    limit = heartbeat_p99_limit_ms(cpus)
    bulk_p99 = _get(doc, "heartbeats", "during_bulk_operations", "p99_ms")
    errors = _get(doc, "heartbeats", "errors")
    fencing = _get(doc, "heartbeats", "false_fencing")
    leader_changes = _get(doc, "controller_epochs", "leader_changes_during_bulk")
    shutdown_s = _get(doc, "controlled_shutdown", "seconds")
    create_s = _get(doc, "create_partitions", "seconds")
    one_client = _get(doc, "admin_ops_one_client", "p50_ms")
    all_brokers = _get(doc, "admin_ops_one_client_all_brokers", "p50_ms")
    return [
        Check(step, "heartbeat_p99_during_bulk_ms", bulk_p99, f"<= {limit:g}", _at_most(bulk_p99, limit)),
        Check(step, "heartbeat_errors", errors, "== 0", _at_most(errors, 0)),
        Check(step, "false_fencing", fencing, "== 0", _at_most(fencing, 0)),
        Check(step, "leader_changes_during_bulk", leader_changes, "== 0", _at_most(leader_changes, 0)),
        Check(step, "controlled_shutdown_s", shutdown_s, "<= 5", _at_most(shutdown_s, 5.0)),
        Check(step, "create_partitions_s", create_s, "<= 5", _at_most(create_s, 5.0)),
        Check(step, "create_topics_1_client_p50_ms", one_client, "<= 3", _at_most(one_client, 3.0)),
        Check(
            step, "create_topics_1_client_all_brokers_p50_ms", all_brokers, "<= 3", _at_most(all_brokers, 3.0)
        ),
        Check(
            step,
            "heartbeat_p50_during_bulk_ms",
            _get(doc, "heartbeats", "during_bulk_operations", "p50_ms"),
            "",
            None,
        ),
        Check(step, "heartbeat_p99_idle_ms", _get(doc, "heartbeats", "idle", "p99_ms"), "", None),
        Check(
            step,
            "heartbeat_p99_after_bulk_ms",
            _get(doc, "heartbeats", "after_bulk_operations", "p99_ms"),
            "",
            None,
        ),
        Check(step, "create_topics_16_clients_p50_ms", _get(doc, "admin_ops", "p50_ms"), "", None),
        Check(step, "create_topics_16_clients_ops_per_s", _get(doc, "admin_ops", "ops_per_second"), "", None),
    ]


def _median_of(rows: Sequence[Mapping[str, Any]] | None, key: str) -> float | None:
    values = [float(row[key]) for row in rows or () if row.get(key) is not None]
    return round(statistics.median(values), 1) if values else None


def raft_cpu_checks(step: str, doc: Mapping[str, Any], _cpus: int) -> list[Check]:
    """bench.raft_cpu: writes/s of kraft unary against the floor of the same run (median over rounds),
    and the leader's CPU per write (its intake processes included)."""
    systems = doc.get("systems", {})
    unary = _median_of(systems.get("kraft_unary"), "writes_per_s")
    floor = _median_of(systems.get("floor"), "writes_per_s")
    over_floor = _ratio(unary, floor)
    return [
        Check(step, "unary_64_clients_over_floor", over_floor, ">= 0.9", _at_least(over_floor, 0.9)),
        Check(step, "unary_writes_per_s", unary, "", None),
        Check(step, "stream_writes_per_s", _median_of(systems.get("kraft_stream"), "writes_per_s"), "", None),
        Check(step, "floor_writes_per_s", floor, "", None),
        Check(
            step,
            "unary_leader_with_intake_us_per_write",
            _median_of(systems.get("kraft_unary"), "leader_with_intake_us_per_write"),
            "",
            None,
        ),
        Check(
            step,
            "unary_all_processes_us_per_write",
            _median_of(systems.get("kraft_unary"), "cpu_us_per_write_all"),
            "",
            None,
        ),
    ]


# bench.create_trace's steps by what they are (its STEPS' probes): the four gRPC messages of a lone
# CreateTopics, and the follower's fdatasync; the rest is the leader's and the follower's Python.
TRACE_GRPC_PROBES = ("intake.in", "push.Response.FetchResponse", "push.Inbound.FetchRequest", "recv")
TRACE_FSYNC_PROBES = ("fsync.out",)


def create_trace_checks(step: str, doc: Mapping[str, Any], _cpus: int) -> list[Check]:
    """bench.create_trace: a lone CreateTopics' client p50 (median over its windows) and where its time goes
    (medians over windows of the summed step p50s, in µs; numbers only)."""
    rounds = [r for r in doc.get("rounds", ()) if r.get("steps")]

    def median_of(values: list[float], digits: int = 1) -> float | None:
        return round(statistics.median(values), digits) if values else None

    def summed(probes: Sequence[str] | None) -> float | None:
        return median_of(
            [
                sum(row["p50_us"] for row in r["steps"] if probes is None or row["probe"] in probes)
                for r in rounds
            ]
        )

    client = median_of([float(r["client_p50_ms"]) for r in rounds if r.get("client_p50_ms") is not None], 3)
    grpc, fsync, total = summed(TRACE_GRPC_PROBES), summed(TRACE_FSYNC_PROBES), summed(None)
    python = None if None in (grpc, fsync, total) else round(total - grpc - fsync, 1)  # type: ignore[operator]
    return [
        Check(step, "create_topics_1_client_p50_ms", client, "<= 3", _at_most(client, 3.0)),
        Check(step, "grpc_messages_us", grpc, "", None),
        Check(step, "follower_fdatasync_us", fsync, "", None),
        Check(step, "python_steps_us", python, "", None),
        Check(step, "sum_of_step_p50s_us", total, "", None),
    ]


STEPS: tuple[Step, ...] = (
    Step(
        "raft",
        "bench.raft",
        ("--quick",),
        ("--quick", "--point-s", "0.3", "--failover-trials", "1"),
        timeout_s=120.0,
        min_s=60.0,
        checks=raft_checks,
    ),
    Step(
        "controller",
        "bench.controller",
        ("--no-image-memory", "--cpu"),
        ("--quick", "--brokers", "12", "--partitions", "600", "--no-image-memory", "--no-cpu-probe"),
        timeout_s=180.0,
        min_s=90.0,
        checks=controller_checks,
    ),
    Step(
        "raft_cpu_intake0",
        "bench.raft_cpu",
        ("--connections", "64", *INTAKE_0),
        ("--connections", "4", "--rounds", "1", "--warmup", "0.2", "--window", "0.5", *INTAKE_0),
        timeout_s=90.0,
        min_s=45.0,
        checks=raft_cpu_checks,
    ),
    Step(
        "raft_cpu_intake3x",
        "bench.raft_cpu",
        ("--connections", "64", *INTAKE_3X),
        ("--connections", "4", "--rounds", "1", "--warmup", "0.2", "--window", "0.5", *INTAKE_3X),
        timeout_s=90.0,
        min_s=45.0,
        checks=raft_cpu_checks,
    ),
    Step(
        "create_trace",
        "bench.create_trace",
        ("--prefill", "5", "--seconds", "3", "--rounds", "2"),
        ("--seconds", "0.5", "--skip", "5"),
        timeout_s=60.0,
        min_s=40.0,
        checks=create_trace_checks,
    ),
    Step(
        "controller_intake3x",
        "bench.controller",
        ("--no-image-memory", "--cpu", *INTAKE_3X),
        (
            "--quick",
            "--brokers",
            "12",
            "--partitions",
            "600",
            "--no-image-memory",
            "--no-cpu-probe",
            *INTAKE_3X,
        ),
        timeout_s=180.0,
        min_s=90.0,
        checks=controller_checks,
    ),
)


def step_timeout(step: Step, remaining_s: float, smoke: bool = False) -> float | None:
    """The timeout the step runs under with ``remaining_s`` of the budget left, or None (skip it) when
    what is left after the suite's reserve is less than the step needs to finish.  A smoke run has no
    minimum (it runs at its smallest size); it still never runs past the budget."""
    available = remaining_s - RESERVE_S
    if available <= 0 or (not smoke and available < step.min_s):
        return None
    return min(step.timeout_s, available)


def plan(steps: Sequence[Step], budget_s: float, smoke: bool = False) -> list[tuple[str, float | None]]:
    """The worst case of a run: each step in order with the timeout it would get if every step before
    it ran to its own timeout (None: skipped).  A real run re-plans after each step from the time
    actually left, so steps that finish early leave more to the later ones."""
    remaining = budget_s
    out: list[tuple[str, float | None]] = []
    for step in steps:
        timeout = step_timeout(step, remaining, smoke)
        out.append((step.name, timeout))
        if timeout is not None:
            remaining -= timeout
    return out


def comparison_checks(docs: Mapping[str, Mapping[str, Any]]) -> list[Check]:
    """Rows across steps: 3 exclusive intake processes against none (numbers only: the design question
    of whether intake processes pay on 16 cores; no target)."""
    rows: list[Check] = []
    for base, other, measure, key in (
        ("raft_cpu_intake0", "raft_cpu_intake3x", "unary_writes_per_s_intake3x_over_0", "kraft_unary"),
        ("raft_cpu_intake0", "raft_cpu_intake3x", "stream_writes_per_s_intake3x_over_0", "kraft_stream"),
    ):
        if base in docs and other in docs:
            a = _median_of(docs[base].get("systems", {}).get(key), "writes_per_s")
            b = _median_of(docs[other].get("systems", {}).get(key), "writes_per_s")
            rows.append(Check("compare", measure, _ratio(b, a), "", None))
    if "controller" in docs and "controller_intake3x" in docs:
        a = _get(docs["controller"], "heartbeats", "during_bulk_operations", "p99_ms")
        b = _get(docs["controller_intake3x"], "heartbeats", "during_bulk_operations", "p99_ms")
        rows.append(Check("compare", "heartbeat_p99_during_bulk_intake3x_over_0", _ratio(b, a), "", None))
    return rows


@dataclass(slots=True)
class StepRecord:
    name: str
    command: list[str]
    status: str  # ok | failed | timeout | skipped | no-result
    timeout_s: float | None
    seconds: float = 0.0
    returncode: int | None = None
    load_average_before: list[float] | None = None
    load_average_after: list[float] | None = None
    result: str | None = None
    output_tail: str = ""


def summarize(
    records: Sequence[StepRecord],
    docs: Mapping[str, Mapping[str, Any]],
    steps: Sequence[Step],
    cpus: int,
    header: Mapping[str, Any],
) -> dict[str, Any]:
    """The summary document: the run's header, every step's record, and the target rows."""
    by_name = {step.name: step for step in steps}
    checks: list[Check] = []
    for name, doc in docs.items():
        checks.extend(by_name[name].checks(name, doc, cpus))
    checks.extend(comparison_checks(docs))
    targets = [c for c in checks if c.target]
    return {
        **header,
        "steps": [asdict(r) for r in records],
        "targets_met": sum(1 for c in targets if c.met is True),
        "targets_not_met": sum(1 for c in targets if c.met is False),
        "targets_unknown": sum(1 for c in targets if c.met is None),
        "checks": [{**asdict(c), "value": _rounded(c.value)} for c in checks],
    }


def _rounded(value: float | None) -> float | None:
    return value if value is None or isinstance(value, int) else round(value, 3)


def _write_json(path: Path, doc: Mapping[str, Any]) -> None:
    """Write by rename, so a kill in the middle leaves the previous complete file."""
    temporary = path.with_name(f".{path.name}.partial")
    temporary.write_text(json.dumps(doc, indent=2) + "\n")
    temporary.replace(path)


def _tail(path: Path, chars: int = 2000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def _run_step(step: Step, command: list[str], timeout_s: float, log_path: Path) -> tuple[str, int | None]:
    """Run one benchmark in its own process group; on a timeout SIGTERM (the benchmark reaps its own
    children and exits), then SIGKILL of the whole group after TERM_GRACE_S."""
    # the device has no network: a missing etcd is reported (bench.raft's etcd_note), never apt-get'ed
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KRAFT_BENCH_ETCD_INSTALL": "0"}
    with log_path.open("wb") as log:
        process = spawn_child(
            command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env
        )
        try:
            return ("ok" if process.wait(timeout=timeout_s) == 0 else "failed"), process.returncode
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=TERM_GRACE_S)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait()
            return "timeout", process.returncode


def _commit(root: Path) -> str | None:
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        done = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
        if done.returncode == 0:
            return done.stdout.strip()
    return None


def run_suite(
    out_dir: Path,
    log_dir: Path,
    budget_s: float,
    smoke: bool,
    only: Sequence[str] | None = None,
    commit: str | None = None,
) -> dict[str, Any]:
    started = time.monotonic()
    cpus = os.cpu_count() or 1
    steps = [s for s in STEPS if not only or s.name in only]
    header = {
        "benchmark": "device-suite",
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "commit": commit or _commit(Path(__file__).resolve().parents[1]),
        "smoke": smoke,
        "budget_s": budget_s,
        "machine": {"cpus": cpus, "python": platform.python_version(), "platform": platform.platform()},
        "heartbeat_p99_target_ms": heartbeat_p99_limit_ms(cpus),
        "etcd_available": etcd_available(),
        "plan_worst_case": plan(steps, budget_s, smoke),
    }
    out_dir.mkdir(parents=True, exist_ok=True)
    log_dir.mkdir(parents=True, exist_ok=True)
    records: list[StepRecord] = []
    docs: dict[str, dict[str, Any]] = {}
    summary: dict[str, Any] = {}
    for step in steps:
        remaining = budget_s - (time.monotonic() - started)
        timeout = step_timeout(step, remaining, smoke)
        result_path = out_dir / f"{step.name}.json"
        command = [sys.executable, "-m", step.module, *(step.smoke_args if smoke else step.args)]
        command += ["--out", str(result_path)]
        record = StepRecord(step.name, command, "skipped", timeout)
        if timeout is not None:
            print(f"device_suite step={step.name} timeout_s={timeout:.0f} left_s={remaining:.0f}", flush=True)
            record.load_average_before = [round(v, 2) for v in os.getloadavg()]
            began = time.monotonic()
            log_path = log_dir / f"{step.name}.log"
            record.status, record.returncode = _run_step(step, command, timeout, log_path)
            record.seconds = round(time.monotonic() - began, 1)
            record.load_average_after = [round(v, 2) for v in os.getloadavg()]
            record.output_tail = _tail(log_path)
            if record.status == "ok":
                try:
                    docs[step.name] = json.loads(result_path.read_text())
                    record.result = result_path.name
                except (OSError, ValueError):
                    record.status = "no-result"
        print(f"device_suite step={step.name} status={record.status} seconds={record.seconds}", flush=True)
        records.append(record)
        header["seconds"] = round(time.monotonic() - started, 1)
        summary = summarize(records, docs, steps, cpus, header)
        _write_json(out_dir / SUMMARY_NAME, summary)
    return summary


def format_summary(summary: Mapping[str, Any]) -> str:
    lines = [
        f"device suite: cpus={summary['machine']['cpus']} commit={summary['commit']} "
        f"seconds={summary.get('seconds')} met={summary['targets_met']} not_met={summary['targets_not_met']} "
        f"unknown={summary['targets_unknown']}"
    ]
    for record in summary["steps"]:
        lines.append(f"  step {record['name']:<20} {record['status']:<9} {record['seconds']:>6} s")
    for check in summary["checks"]:
        met = {True: "met", False: "NOT MET", None: "-"}[check["met"]]
        lines.append(
            f"  {check['step']:<20} {check['measure']:<44} {check['value']!s:>10} {check['target']:<7} {met}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no benchmark (nor its quorum) outlives the suite (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.device_suite", description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", type=Path, required=True, help="one JSON per step and summary.json")
    parser.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S, help="seconds for all steps")
    parser.add_argument("--smoke", action="store_true", help="every step at its smallest size (a check)")
    parser.add_argument("--log-dir", type=Path, help="the steps' output (default: a temporary folder)")
    parser.add_argument("--only", action="append", choices=[s.name for s in STEPS], help="(repeatable)")
    parser.add_argument("--commit", help="recorded in the summary (default: git rev-parse HEAD, if any)")
    parser.add_argument("--plan", action="store_true", help="print the worst-case plan and exit")
    args = parser.parse_args(argv)
    if args.budget_s <= RESERVE_S:
        parser.error(f"--budget-s must be more than {RESERVE_S:g}")
    if args.plan:
        for name, timeout in plan(
            [s for s in STEPS if not args.only or s.name in args.only], args.budget_s, args.smoke
        ):
            print(f"{name:<20} {'skipped' if timeout is None else f'{timeout:.0f} s'}")
        return 0
    with tempfile.TemporaryDirectory(prefix="kraft-device-suite-") as tmp:
        summary = run_suite(
            args.out_dir, args.log_dir or Path(tmp), args.budget_s, args.smoke, args.only, args.commit
        )
    print(format_summary(summary))
    print(f"results: {args.out_dir}")
    return 0 if all(r["status"] in ("ok", "skipped") for r in summary["steps"]) else 1


if __name__ == "__main__":
    raise SystemExit(main())
