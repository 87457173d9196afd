"""Bounded work units in the controller simulation (issue #17, session 13): the rejoin index's *dirty*
flags (``RejoinIndex.lazy_min_changes``, 64 changed partitions in production — never reached by the
simulation's work units of 4) made reachable by lowering the threshold to 1, so every bulk slice of
the scenario leaves its changes dirty; then an implicit UNCLEAN ElectLeaders, run in parts of a work
unit each (``UncleanElectionScan``), loses its active controller half-way.  The client's retry on the
new controller must end in the image the unsliced request gives on the image it was sent on.

Runs on the controller simulation of test_controller_sim.py (its helpers, its options: work units of
4 records).  Every seed is checked to reach dirty flags during the request's parts (so a change that
stops reaching them fails here instead of passing quietly); ``SEED_REACHING_DIRT`` is kept as the one
to replay.  What the dirt does *not* reach here: a leaderless partition whose stale flags say settled
(the simulation's unclean candidates are flagged before they go offline: a live replica out of the
ISR); tests/unit/metadata/test_unclean_election_parts.py builds that state directly."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from kraft.errors import KraftError
from kraft.metadata import rejoin_index
from kraft.metadata.controller import QuorumController
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.election_config import UNCLEAN_ELECTION
from kraft.metadata.image import MetadataImage
from kraft.v1 import controller_pb2 as cpb
from sim.harness import InvariantViolation

from .test_controller_sim import (
    BOUND_MS,
    BULK_PARTITIONS,
    CLUSTER,
    CONTROLLER_SEEDS,
    ControllerSimulation,
    _crash_active_mid_way,
    _create_assigned,
    _request_until,
    _started,
)

SEED_REACHING_DIRT = 0


def _state(image: MetadataImage) -> list[tuple[object, ...]]:
    topic = image.topic("offline")
    assert topic is not None
    return [
        (p.leader, p.isr, p.elr, p.last_known_elr, p.leader_recovery_state, p.leader_epoch)
        for p in topic.partitions
    ]


def scenario_dirty_flags_and_a_sliced_unclean_election_across_failover(
    sim: ControllerSimulation, patch: pytest.MonkeyPatch
) -> bool:
    """Brokers 101 and 102 hold BULK_PARTITIONS partitions; 101 dies (102 leads alone), then 102: every
    partition offline with ISR (102,).  101 comes back — not in any ISR, so no clean election.  Broker
    103, leading BULK_PARTITIONS partitions of another topic, shuts down (a leave job: its slices leave
    their changes dirty) and, in the same turn, an implicit UNCLEAN ElectLeaders elects 101 for each
    offline partition, a work unit per part, among the leave job's slices.  The active controller crashes
    when some elections committed; the client retries on the new one.  The offline topic ends as the
    unsliced request leaves it on the image it was sent on (each partition elected once: same epochs);
    the shutdown ends too.  Returns whether a part of the request ran with dirty flags in the index."""
    _create_assigned(sim, "offline", [[101, 102] for _ in range(BULK_PARTITIONS)])
    _create_assigned(sim, "led-by-103", [[103, 104] for _ in range(BULK_PARTITIONS)])
    dirt: list[bool] = []
    elect = ControllerLogic.elect_leaders

    def watched(logic: ControllerLogic, *args: Any, **kwargs: Any) -> Any:
        dirt.append(logic.rejoin_index.settling)
        return elect(logic, *args, **kwargs)

    patch.setattr(ControllerLogic, "elect_leaders", watched)

    def partitions() -> list[tuple[object, ...]]:
        return _state(sim.leader_image())

    sim.brokers[101].alive = False
    sim.run_until_condition(
        lambda: all(state[0] != 101 and 101 not in state[1] for state in partitions()),  # type: ignore[operator]
        BOUND_MS,
        "broker 101 fenced out of the ISRs",
    )
    sim.brokers[102].alive = False
    sim.run_until_condition(
        lambda: all(state[0] == -1 for state in partitions()), BOUND_MS, "every partition offline"
    )
    sim.brokers[101].alive = True
    sim.reachable_since[101] = sim.now_ms
    sim.run_until_condition(
        lambda: not sim.leader_image().brokers[101].fenced, BOUND_MS, "broker 101 unfenced (in no ISR)"
    )
    if any(state[0] != -1 for state in partitions()):
        raise InvariantViolation(f"seed {sim.seed}: a partition was elected cleanly without an ISR member")
    target = sim.active_controller()
    assert target is not None
    logic = target[1].logic
    assert logic is not None
    # The unsliced request on the image it is sent on (the speculative image: nothing is pending now).
    sent_on = logic.image
    reference = ControllerLogic(
        ControllerSettings(CLUSTER, default_replication_factor=2, max_changes_per_write=10 * BULK_PARTITIONS),
        sent_on,
        0,
    )
    request = cpb.ElectLeadersRequest(cluster_id=CLUSTER, election_type=UNCLEAN_ELECTION)
    reference.elect_leaders(request, sent_on.offset + 1)
    expected = _state(reference.image)
    assert all(state[0] == 101 for state in expected)

    def led(image: MetadataImage) -> int:
        return sum(1 for state in _state(image) if state[0] == 101)

    sim.brokers[103].alive = False
    shutdown = cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=103)
    sim.controllers[target[0]].loop.create_task(target[1].shutdown_broker(shutdown))
    sim.controllers[target[0]].loop.create_task(target[1].elect_leaders(request))
    sim._sync_controllers()
    _crash_active_mid_way(sim, led, "the unclean ElectLeaders")
    key = "unclean-elect"

    def call(controller: QuorumController) -> object:
        return controller.elect_leaders(request)

    _request_until(sim, key, call, lambda: led(sim.leader_image()) == BULK_PARTITIONS)
    got = partitions()
    if got != expected:
        wrong = [i for i, (a, b) in enumerate(zip(got, expected, strict=True)) if a != b]
        raise InvariantViolation(f"seed {sim.seed}: partitions {wrong} differ from the unsliced election")
    sim.run_until_condition(
        lambda: all(103 not in p.isr for p in other_partitions(sim)), BOUND_MS, "the shutdown of 103 ended"
    )
    # the leave job's slices (each left dirty) across the same failover: the unsliced shutdown's result
    moved = [(p.leader, p.isr) for p in other_partitions(sim)]
    if moved != [(104, (104,))] * BULK_PARTITIONS:
        raise InvariantViolation(f"seed {sim.seed}: broker 103's shutdown ended as {moved}")
    sim.check_identical_images()
    return any(dirt)


def other_partitions(sim: ControllerSimulation) -> Sequence[Any]:
    topic = sim.leader_image().topic("led-by-103")
    assert topic is not None
    return topic.partitions


def _run(seed: int) -> bool:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rejoin_index, "LAZY_MIN_CHANGES", 1)  # every bulk slice leaves its changes dirty
        sim = _started(seed)
        try:
            return scenario_dirty_flags_and_a_sliced_unclean_election_across_failover(sim, patch)
        finally:
            sim.close()


def test_dirty_flags_and_a_sliced_unclean_election_across_failover(sim_seeds: list[int]) -> None:
    seeds = sim_seeds if len(sim_seeds) == 1 else sim_seeds[:CONTROLLER_SEEDS]
    reached = []
    for seed in seeds:
        try:
            reached.append(_run(seed))
        except (InvariantViolation, AssertionError, KraftError) as exc:
            replay = f"pytest tests/sim/test_bounded_work_sim.py --seed {seed}"
            pytest.fail(f"seed {seed}: {exc}\nreplay: {replay}")
    missed = [seed for seed, dirty in zip(seeds, reached, strict=True) if not dirty]
    assert not missed, f"seeds {missed}: no part of the request found dirty flags (the path is not reached)"


def test_the_kept_seed_reaches_dirty_flags() -> None:
    assert _run(SEED_REACHING_DIRT), f"seed {SEED_REACHING_DIRT} no longer finds dirty flags"
