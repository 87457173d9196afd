"""Shared by the chaos suite: run one scenario with a seed and fail with the command that reproduces it."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest

from chaos.checkers import Status
from chaos.report import RunReport
from chaos.runner import RunOptions, run_scenario

# Eight seconds of faults: with the short pace (``chaos.runner.SHORT_PACE``) that is two or three faults,
# each held past the fast profile's election timeout and often past the broker session timeout.
SUITE_DURATION_S = 8.0
# A generous bound: ~8 engineers share 2 cores, and a restarted Python node needs seconds to start.
SUITE_RECOVERY_S = 40.0


def suite_options(
    tmp_path: Path, scenario: str, seed: int, duration_s: float = SUITE_DURATION_S, brokers: int = 1
) -> RunOptions:
    return RunOptions(
        scenario=scenario,
        seed=seed,
        duration_s=duration_s,
        report_dir=tmp_path / scenario,
        brokers=brokers,
        recovery_bound_s=SUITE_RECOVERY_S,
    )


def violation_message(options: RunOptions, report: RunReport, progress: list[str]) -> str:
    """Everything needed to replay and read a failed run: seed, command, verdicts, report path."""
    bad = [
        f"  {v.checker}: {v.status.value.upper()} {v.summary} {list(v.offending[:5])}"
        for v in report.verdicts
        if v.status is not Status.PASS
    ]
    return "\n".join(
        [
            f"chaos scenario {options.scenario!r} seed {options.seed}: checkers did not all pass",
            *bad,
            f"reproduce: {options.reproduce_command()}",
            f"report: {options.report_dir / 'report.html'}",
            "progress:",
            *(f"  {line}" for line in progress[-30:]),
        ]
    )


async def run_checked(options: RunOptions) -> RunReport:
    """Run the scenario; fail the test (with the reproduce command) unless every checker PASSes."""
    progress: list[str] = []
    try:
        report = await run_scenario(options, progress.append)
    except BaseException:
        # A crash inside the harness must still name the seed and command.
        print(f"chaos run crashed; reproduce: {options.reproduce_command()}")
        print("\n".join(progress))
        raise
    if any(v.status is not Status.PASS for v in report.verdicts):
        kept = keep_failed_run(options)
        message = violation_message(options, report, progress)
        pytest.fail(f"{message}\nkept a copy (history, report, node logs) in {kept}", pytrace=False)
    return report


def keep_failed_run(options: RunOptions) -> Path:
    """Copy a failed run out of pytest's tmp_path, which later pytest runs on this machine recycle."""
    root = Path(os.environ.get("KRAFT_CHAOS_KEEP", Path(tempfile.gettempdir()) / "kraft-chaos-failures"))
    target = root / f"{options.scenario}-seed{options.seed}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    # Under 1 MB: keep everything (history, report, configs, node logs, metadata logs).
    shutil.copytree(options.report_dir, target, ignore=shutil.ignore_patterns("*.sqlite-wal", "*.sqlite-shm"))
    return target
