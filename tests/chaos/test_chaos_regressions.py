"""Replays every seed in chaos_regressions.REGRESSIONS; each must pass every checker."""

from __future__ import annotations

from pathlib import Path

import pytest
from chaos_checked_run import run_checked, suite_options
from chaos_regressions import REGRESSIONS, Regression

from chaos.scenarios import SCENARIOS

pytestmark = [pytest.mark.chaos, pytest.mark.integration, pytest.mark.timeout(150)]


def _param(regression: Regression) -> object:
    marks = [pytest.mark.xfail(reason=regression.xfail, strict=False)] if regression.xfail else []
    return pytest.param(regression, id=regression.test_id, marks=marks)


def test_regression_rows_are_well_formed() -> None:
    for regression in REGRESSIONS:
        assert regression.scenario in SCENARIOS, regression
        assert regression.note.strip(), f"{regression.test_id}: say what the seed found"
        assert 1.0 <= regression.duration_s <= 20.0, f"{regression.test_id}: keep suite runs short"
    assert len({r.test_id for r in REGRESSIONS}) == len(REGRESSIONS), "duplicate regression rows"


@pytest.mark.parametrize("regression", [_param(r) for r in REGRESSIONS])
async def test_regression_seed_passes(tmp_path: Path, regression: Regression) -> None:
    await run_checked(suite_options(tmp_path, regression.scenario, regression.seed, regression.duration_s))
