"""Options of the deterministic simulation: ``--seed N`` replays one seed, ``--sim-seeds N`` sets how many
seeds each scenario runs (CI default 200; ``make sim SEEDS=N`` runs more).  The replication simulation
(test_replication_sim.py, seconds per seed) takes its count from ``KRAFT_REPLICATION_SIM_SEEDS`` instead
and replays with ``--seed N`` too."""

from __future__ import annotations

import pytest

DEFAULT_SEEDS_PER_SCENARIO = 200


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("sim", "deterministic Raft simulation")
    group.addoption("--seed", type=int, default=None, help="replay exactly this simulation seed")
    group.addoption(
        "--sim-seeds",
        type=int,
        default=DEFAULT_SEEDS_PER_SCENARIO,
        help=f"seeds per simulation scenario (default {DEFAULT_SEEDS_PER_SCENARIO})",
    )


@pytest.fixture
def sim_seeds(request: pytest.FixtureRequest) -> list[int]:
    """The seeds to run: the replayed one, or ``range(--sim-seeds)``."""
    replay: int | None = request.config.getoption("--seed")
    if replay is not None:
        return [replay]
    count: int = request.config.getoption("--sim-seeds")
    return list(range(count))
