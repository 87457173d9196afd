"""Leadership confirmation (ReadIndex) in the deterministic Raft simulation, over many seeds.

Every few virtual milliseconds each node that believes it leads asks for a leadership-confirmation round
(``RaftCore.confirm_leadership``).  Invariant, checked whenever a node reports a confirmed round: a
superseded leader never confirms a round started after a newer epoch's leader was elected — the
guarantee the active controller relies on to answer heartbeats only while no other controller can have
fenced the broker (docs/internals/raft.md "Confirming leadership").  Order is by simulation event, not
by time, so two events at the same virtual millisecond are still ordered.  Liveness: once the cluster is
healed, a round asked of the stable leader confirms.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pytest

from sim.harness import InvariantViolation, Router, SimNode, Simulation

ASK_INTERVAL_MS = 3
ELECTION_BOUND_MS = 2000


@dataclasses.dataclass
class AskedRound:
    epoch: int
    started_event: int
    """The simulation event in which it was asked for (it started then or later: a conservative bound)."""


@dataclasses.dataclass
class SlowLinkRouter(Router):
    """A router with one-way links that deliver everything late (a congested or half-broken link)."""

    extra_delay_ms: dict[tuple[int, int], int] = dataclasses.field(default_factory=dict)

    def delays_ms(self, src: int, dst: int) -> list[int]:
        extra = self.extra_delay_ms.get((src, dst), 0)
        return [delay + extra for delay in super().delays_ms(src, dst)]


class ReadIndexSimulation(Simulation):
    def __init__(self, seed: int, voters: int = 3, **config_overrides: int) -> None:
        super().__init__(seed, voters=voters, **config_overrides)
        self.elected_event: dict[int, int] = {}
        """Epoch -> the simulation event in which its leader first led."""
        self.asked: dict[tuple[int, int], dict[int, AskedRound]] = {}
        """(node, incarnation) -> round id -> the round, until it is confirmed."""
        self.confirmed: dict[tuple[int, int], int] = {}
        """(node, incarnation) -> the highest round it reported confirmed."""
        self.confirmations = 0
        self.router = SlowLinkRouter(self.rng)
        for node in self.nodes.values():
            node.ports = dataclasses.replace(node.ports, confirm_read_round=self._confirmer(node))

    def _confirmer(self, node: SimNode) -> Callable[[int], None]:
        return lambda read_round: self._on_confirmed(node, read_round)

    def after_node_event(self, node: SimNode) -> None:
        super().after_node_event(node)
        core = node.core
        if core is not None and core.is_leader:
            self.elected_event.setdefault(core.epoch, self.event_count)

    def start_asking(self) -> None:
        def tick() -> None:
            for node in self.nodes.values():
                core = node.core
                if node.running and core is not None and core.is_leader:
                    read_round = core.confirm_leadership(self.now_ms)
                    rounds = self.asked.setdefault((node.node_id, node.incarnation), {})
                    rounds.setdefault(read_round, AskedRound(core.epoch, self.event_count))
                    node.process(core.take_output(self.now_ms))
            self.schedule(ASK_INTERVAL_MS, tick)

        self.schedule(ASK_INTERVAL_MS, tick)

    def _on_confirmed(self, node: SimNode, read_round: int) -> None:
        key = (node.node_id, node.incarnation)
        if read_round <= self.confirmed.get(key, 0):
            raise InvariantViolation(
                f"seed {self.seed}: node {node.node_id} confirmed round {read_round} again"
            )
        self.confirmed[key] = read_round
        rounds = self.asked.get(key, {})
        current_epoch = node.live_core.epoch
        for asked_id in sorted(r for r in rounds if r <= read_round):
            asked = rounds.pop(asked_id)
            if asked.epoch != current_epoch:
                # Asked while leading an earlier epoch: leadership was lost before it confirmed, which
                # failed it (the driver's lost_leadership).  Ids never repeat, so a later epoch's
                # confirmation covers it only numerically: it answers nobody.
                continue
            self.confirmations += 1
            for epoch, elected in self.elected_event.items():
                if epoch > asked.epoch and elected < asked.started_event:
                    raise InvariantViolation(
                        f"seed {self.seed}: node {node.node_id} confirmed round {asked_id} of epoch "
                        f"{asked.epoch}, asked in event {asked.started_event}, but epoch {epoch} had a "
                        f"leader since event {elected}"
                    )

    def check_live_confirmation(self) -> None:
        """Healed and stable: a round asked of the leader now confirms."""
        leader = self.leader()
        assert leader is not None
        core = leader.live_core
        # On the leader's own clock: a lease simulation's clocks drift, and a core handed the simulation's
        # time while its clock runs far behind jumps ahead past its check-quorum deadline and resigns.
        read_round = core.confirm_leadership(leader.clock_ms())
        leader.wake()  # its output now, or as the driver takes it (SimNode.driver_ordering)
        key = (leader.node_id, leader.incarnation)
        self.run_until_condition(
            lambda: self.confirmed.get(key, 0) >= read_round, 1000, f"round {read_round} confirmed"
        )


def _started(seed: int, voters: int = 3, **overrides: int) -> ReadIndexSimulation:
    sim = ReadIndexSimulation(seed, voters=voters, **overrides)
    sim.start_all()
    sim.start_workload()
    sim.start_asking()
    sim.run_until_condition(sim.has_stable_leader, ELECTION_BOUND_MS, "the initial election")
    return sim


def isolated_leader_keeps_asking(seed: int) -> None:
    """The old leader asks until check-quorum resigns it, while a new leader is elected and asks too."""
    sim = _started(seed)
    old = sim.leader()
    assert old is not None
    old_epoch = old.live_core.epoch
    sim.router.isolate(old.node_id)

    def newer_leader() -> bool:
        leader = sim.leader()
        return leader is not None and leader.node_id != old.node_id and leader.live_core.epoch > old_epoch

    sim.run_until_condition(newer_leader, ELECTION_BOUND_MS, "a leader after the isolated one")
    sim.run_for(sim.rng.randint(0, 400))
    sim.router.heal()
    sim.run_for(200)
    sim.check_final()
    sim.check_live_confirmation()


def slow_links_and_churn(seed: int) -> None:
    """Five voters, messages delayed (late echoes, fetches answered long after they were sent), dropped
    and duplicated; crashes, restarts (round ids start over per incarnation), isolations and cuts."""
    sim = _started(seed, voters=5)
    sim.router.max_delay_ms = 25
    sim.router.drop_probability = 0.05
    sim.router.duplicate_probability = 0.05
    down: set[int] = set()
    for _ in range(10):
        action = sim.rng.random()
        up = [n for n in sim.voter_ids if n not in down]
        if action < 0.25 and len(down) < 2:
            victim = sim.rng.choice(up)
            sim.crash(victim)
            down.add(victim)
        elif action < 0.45 and down:
            revived = sim.rng.choice(sorted(down))
            sim.restart(revived)
            down.discard(revived)
        elif action < 0.65:
            leader = sim.leader()
            sim.router.isolate(leader.node_id if leader is not None else sim.rng.choice(up))
        elif action < 0.85:
            side = set(sim.rng.sample(list(sim.voter_ids), 2))
            sim.router.cut(side, set(sim.voter_ids) - side)
        else:
            sim.router.isolated.clear()
            sim.router.blocked.clear()
        sim.run_for(sim.rng.randint(20, 200))
    sim.check_final()
    sim.check_live_confirmation()


def stale_fetches_reach_a_deposed_leader(seed: int) -> None:
    """The race the echo exists for: one follower's fetches reach the leader hundreds of milliseconds late
    and the other is cut off, so the two elect a new leader while the old one keeps receiving Fetches of
    its own epoch — sent before that election, arriving after the old leader asked for new rounds.  A
    round counted by fetches merely arriving after it started would confirm here; echoes never do."""
    sim = _started(seed)
    old = sim.leader()
    assert old is not None
    old_epoch = old.live_core.epoch
    slow, cut = sim.rng.sample([n for n in sim.voter_ids if n != old.node_id], 2)
    assert isinstance(sim.router, SlowLinkRouter)
    sim.router.extra_delay_ms[(slow, old.node_id)] = sim.rng.randint(100, 400)
    sim.router.cut({cut}, {old.node_id})

    def newer_leader() -> bool:
        leader = sim.leader()
        return leader is not None and leader.node_id != old.node_id and leader.live_core.epoch > old_epoch

    sim.run_until_condition(newer_leader, ELECTION_BOUND_MS, "a leader after the slow one")
    sim.run_for(sim.rng.randint(0, 400))
    sim.router.extra_delay_ms.clear()
    sim.router.heal()
    sim.run_for(200)
    sim.check_final()
    sim.check_live_confirmation()


SCENARIOS: dict[str, Callable[[int], None]] = {
    "stale_fetches_reach_a_deposed_leader": stale_fetches_reach_a_deposed_leader,
    "isolated_leader_keeps_asking": isolated_leader_keeps_asking,
    "slow_links_and_churn": slow_links_and_churn,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_read_index_holds_for_every_seed(name: str, sim_seeds: list[int]) -> None:
    for seed in sim_seeds:
        try:
            SCENARIOS[name](seed)
        except (InvariantViolation, AssertionError) as exc:
            replay = f"pytest tests/sim -k {name} --seed {seed}"
            pytest.fail(f"scenario {name} failed with seed {seed}: {exc}\nreplay: {replay}")


def test_the_invariant_catches_a_round_confirmed_after_a_newer_election() -> None:
    """The check itself: a confirmation reported for a round asked after a newer epoch's election fails."""
    sim = _started(0)
    leader = sim.leader()
    assert leader is not None
    key = (leader.node_id, leader.incarnation)
    epoch = leader.live_core.epoch
    sim.elected_event[epoch + 1] = sim.event_count
    sim.asked.setdefault(key, {})[10_000] = AskedRound(epoch, sim.event_count + 1)
    with pytest.raises(InvariantViolation, match="had a leader since"):
        sim._on_confirmed(leader, 10_000)
