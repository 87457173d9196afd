"""The reproduce command a run prints replays the same options through ``kraft chaos run``."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

import chaos.runner
from chaos.checkers import Status, Verdict
from chaos.report import RunReport
from chaos.runner import LONG_PACE, SHORT_PACE, RunOptions, pace_for
from kraft.cli.chaos import app


def test_short_runs_use_the_short_pace() -> None:
    assert pace_for(8.0) == SHORT_PACE
    assert pace_for(12.0) == SHORT_PACE
    assert pace_for(12.5) == LONG_PACE
    assert RunOptions("kill", 1, 8.0, Path("r")).pace() == SHORT_PACE
    explicit = RunOptions("kill", 1, 8.0, Path("r"), quiet_s=(5.0, 6.0))
    assert explicit.pace().quiet_s == (5.0, 6.0) and explicit.pace().fault_s == SHORT_PACE.fault_s


def test_the_command_names_only_what_differs_from_the_cli_defaults() -> None:
    plain = RunOptions("kill", 12, 8.0, Path("r"), brokers=1)
    assert plain.reproduce_command() == "kraft chaos run --scenario kill --seed 12 --duration 8"
    tuned = RunOptions("flaky", 3, 7.5, Path("r"), brokers=0, controllers=5, recovery_bound_s=40.0)
    assert tuned.reproduce_command() == (
        "kraft chaos run --scenario flaky --seed 3 --duration 7.5 --controllers 5 --brokers 0 --recovery 40"
    )


def test_a_schedule_the_cli_cannot_express_is_flagged() -> None:
    odd = RunOptions("kill", 1, 8.0, Path("r"), brokers=1, fault_s=(9.0, 9.5))
    assert "# plus" in odd.reproduce_command() and "(9.0, 9.5)" in odd.reproduce_command()


def _failing_report(options: RunOptions) -> RunReport:
    verdict = Verdict("linearizable-topic", Status.FAIL, "not linearizable", ("op#1",), {})
    return RunReport(options.scenario, options.seed, options.duration_s, 0.0, [verdict])


def test_the_cli_rebuilds_the_same_options_and_prints_the_command_on_failure(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    original = RunOptions("pause", 7, 6.0, tmp_path / "first" / "pause", brokers=1, recovery_bound_s=40.0)
    seen: list[RunOptions] = []

    async def fake_run(options: RunOptions, progress: object) -> RunReport:
        seen.append(options)
        return _failing_report(options)

    monkeypatch.setattr(chaos.runner, "run_scenario", fake_run)
    argv = shlex.split(original.reproduce_command())[3:]  # drop "kraft chaos run"
    result = CliRunner().invoke(app, ["run", *argv, "--report", str(tmp_path / "first")])
    assert result.exit_code == 1
    assert seen == [original]
    assert f"reproduce with: {original.reproduce_command()}" in result.stderr
    assert "violations found in pause" in result.stderr
