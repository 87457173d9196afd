"""The simulation itself: deterministic per seed, its invariant checks do fire, and it runs the driver's
executor of the core's Output."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from kraft.raft.core_output import AppendFetched, AppendLeaderChange, AppendRecords, Output
from kraft.raft.executor import OutputPorts, execute_output_now
from kraft.raft.state import ElectionState
from sim import harness
from sim.harness import InvariantViolation, Simulation, SimValue


def _run(seed: int) -> tuple[int, dict[int, SimValue], int]:
    sim = Simulation(seed, voters=3)
    sim.start_all()
    sim.start_workload()
    sim.run_for(500)
    return sim.event_count, dict(sim.committed), sim.now_ms


def test_a_seed_replays_exactly() -> None:
    assert _run(42) == _run(42)


@pytest.mark.parametrize("rate", [Fraction(9, 10), Fraction(1), Fraction(11, 10), Fraction(107, 100)])
def test_a_drifting_clock_reads_floor_of_time_times_rate_and_sim_time_of_inverts_it(rate: Fraction) -> None:
    """The node clock (kept as the rate's two integers) is ``offset + floor(now * rate)``, and
    ``sim_time_of(c)`` is the first simulation millisecond at which it reads at least ``c``."""
    sim = Simulation(7, voters=1)
    node = sim.nodes[1]
    node.clock_rate, node.clock_offset_ms = rate, 1_234
    assert node.clock_rate == rate
    for now_ms in range(0, 2_000, 7):
        sim.now_ms = now_ms
        assert node.clock_ms() == 1_234 + math.floor(now_ms * rate)
    sim.now_ms = 0
    for target in range(1_234, 3_500, 11):
        at = node.sim_time_of(target)
        sim.now_ms = at
        assert node.clock_ms() >= target
        if at > 0:
            sim.now_ms = at - 1
            assert node.clock_ms() < target
        sim.now_ms = 0


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


def _durable_everywhere(sim: Simulation, end: int) -> None:
    for node in sim.nodes.values():
        node.log.append((0, end - 1, 1, tuple(b"v" for _ in range(end))))
        node.log.flush()


def test_a_durable_end_lowered_after_the_check_held_is_detected() -> None:
    """The check counts the holders again after any change that may lower a durable end (it skips the
    count only while the high watermark, the voter set and every durable end stayed where it held)."""
    sim = Simulation(0)
    _durable_everywhere(sim, 10)
    sim.max_high_watermark = 10
    sim.check_invariants()
    sim.nodes[1].log.truncate_to(0)
    sim.check_invariants()  # two of three still hold it
    sim.nodes[2].log.truncate_to(0)
    with pytest.raises(InvariantViolation, match="durable on only 1 voters"):
        sim.check_invariants()


def test_wiped_holders_after_the_check_held_are_detected() -> None:
    sim = Simulation(0)
    _durable_everywhere(sim, 10)
    sim.max_high_watermark = 10
    sim.check_invariants()
    sim.nodes[1].wipe()
    sim.nodes[3].wipe()
    with pytest.raises(InvariantViolation, match="durable on only 1 voters"):
        sim.check_invariants()


def test_a_persisted_epoch_going_back_is_detected() -> None:
    sim = Simulation(0)
    node = sim.nodes[1]
    node.start()
    node.process(Output(election_state=ElectionState(5)))
    with pytest.raises(InvariantViolation, match="persisted epoch 4 after 5"):
        node.process(Output(election_state=ElectionState(4)))


def test_a_high_watermark_going_back_is_detected() -> None:
    sim = Simulation(0)
    node = sim.nodes[1]
    node.start()
    node.high_watermark = 3
    with pytest.raises(InvariantViolation, match="went back 3 -> 2"):
        node.process(Output(high_watermark=2))


def test_the_simulation_executes_every_output_through_the_drivers_executor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    executed: list[Output] = []

    def recording_execute(out: Output, ports: OutputPorts) -> None:
        executed.append(out)
        execute_output_now(out, ports)

    monkeypatch.setattr(harness, "execute_output_now", recording_execute)
    sim = Simulation(42, voters=3)
    sim.start_all()
    sim.start_workload()
    sim.run_for(500)
    assert sim.committed
    ops = [op for out in executed for op in out.log_ops]
    assert any(isinstance(op, AppendLeaderChange) for op in ops)
    assert any(isinstance(op, AppendRecords) for op in ops)
    assert any(isinstance(op, AppendFetched) for op in ops)
    assert any(out.election_state is not None for out in executed)
    assert any(out.send_after_persist for out in executed)
    assert any(out.flush for out in executed)
    assert max(out.high_watermark or 0 for out in executed) == sim.max_high_watermark
