"""The simulation itself: deterministic per seed, and its invariant checks do fire."""

from __future__ import annotations

import pytest

from sim.harness import InvariantViolation, Simulation


def _run(seed: int) -> tuple[int, dict[int, bytes | None], int]:
    sim = Simulation(seed, voters=3)
    sim.start_all()
    sim.start_workload()
    sim.run_for(500)
    return sim.event_count, dict(sim.committed), sim.now_ms


def test_a_seed_replays_exactly() -> None:
    assert _run(42) == _run(42)


def test_different_seeds_explore_different_schedules() -> None:
    assert _run(1)[0] != _run(2)[0] or _run(1)[1] != _run(2)[1]


def test_conflicting_commits_are_detected() -> None:
    sim = Simulation(0)
    sim.check_committed(1, 5, b"a")
    with pytest.raises(InvariantViolation, match="committed"):
        sim.check_committed(2, 5, b"b")


def test_a_high_watermark_not_durable_on_a_majority_is_detected() -> None:
    sim = Simulation(0)
    sim.max_high_watermark = 10
    with pytest.raises(InvariantViolation, match="durable on only"):
        sim.check_invariants()
