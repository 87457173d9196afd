"""Short checked chaos runs against a real 3-controller, 1-broker cluster with every link proxied."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from chaos.checkers import Status
from chaos.history import load_events, pair_operations
from chaos.runner import RunOptions, run_scenario

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(180)]


def _options(tmp_path: Path, scenario: str, seed: int) -> RunOptions:
    return RunOptions(
        scenario=scenario,
        seed=seed,
        duration_s=6.0,
        report_dir=tmp_path / scenario,
        brokers=1,
        recovery_bound_s=30.0,
        quiet_s=(0.3, 1.0),
        fault_s=(1.5, 2.5),
    )


@pytest.mark.parametrize(("scenario", "seed"), [("isolate-leader", 11), ("kill", 12)])
async def test_checked_run_finds_no_violation(tmp_path: Path, scenario: str, seed: int) -> None:
    lines: list[str] = []
    report = await run_scenario(_options(tmp_path, scenario, seed), lines.append)
    by_checker = {v.checker: v for v in report.verdicts}
    failures = [
        f"{v.checker}: {v.summary} {list(v.offending[:5])}"
        for v in report.verdicts
        if v.status is Status.FAIL
    ]
    assert not failures, failures
    assert by_checker["linearizable-topic"].status is Status.PASS
    assert by_checker["liveness-after-heal"].status is Status.PASS
    assert by_checker["committed-logs-identical"].status is Status.PASS
    assert by_checker["broker-image-equals-controller"].status is Status.PASS
    assert by_checker["fenced-broker-never-acks"].status is Status.PASS
    assert any(op.f == "produce" and op.outcome.value == "ok" for op in report.operations)
    assert any(e.action == "start" for e in report.nemesis_events), lines
    acknowledged = [op for op in report.operations if op.outcome.value == "ok"]
    assert len(acknowledged) >= 10, "the workload made almost no progress"
    directory = tmp_path / scenario
    summary = json.loads((directory / "report.json").read_text())
    assert summary["valid"] is True and summary["scenario"] == scenario
    assert (directory / "report.html").read_text().count("<tr") > len(report.verdicts)
    assert (directory / "operations.png").stat().st_size > 0 and (
        directory / "leaders.png"
    ).stat().st_size > 0
    assert pair_operations(await load_events(directory / "history.sqlite")) == report.operations
