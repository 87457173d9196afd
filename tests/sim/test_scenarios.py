"""Every simulation scenario over many seeds; a failure names the seed and how to replay it."""

from __future__ import annotations

import pytest

from sim.harness import InvariantViolation
from sim.scenarios import SCENARIOS

# Seeds that once failed, kept forever as regression tests: (scenario, seed, what went wrong).
REGRESSION_SEEDS: list[tuple[str, int]] = [
    # A prospective node fell back to following a dead leader when a pre-vote answer named that leader.
    ("back_to_back_leader_failures", 0),
    # The wiped node's last reported offset still counted towards the high watermark.
    ("committed_data_lost_on_one_node", 3),
    # Final check compared against a leader that had not yet applied every acknowledged offset.
    ("figure8_churn_on_unreliable_network", 4),
    # A minority follower may still learn commits the majority side acknowledged before the cut.
    ("no_commit_without_majority", 3),
    # A follower removed by a VotersRecord it never got reached candidate at a higher epoch as the
    # partitioned leader healed; the live leader refused its vote and never announced to a non-voter, so
    # it stayed stuck at that epoch and could never be added back.
    ("dynamic_leader_lost_during_remove", 187),
]


def _run(name: str, seed: int) -> None:
    try:
        SCENARIOS[name](seed)
    except (InvariantViolation, AssertionError, RuntimeError, ValueError) as exc:
        pytest.fail(
            f"scenario {name} failed with seed {seed}: {exc}\n"
            f"replay: pytest tests/sim -k {name} --seed {seed}",
            pytrace=True,
        )


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_scenario_holds_for_every_seed(name: str, sim_seeds: list[int]) -> None:
    for seed in sim_seeds:
        _run(name, seed)


@pytest.mark.parametrize(("name", "seed"), REGRESSION_SEEDS)
def test_regression_seed(name: str, seed: int) -> None:
    _run(name, seed)
