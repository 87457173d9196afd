"""Deterministic simulation of 3 controllers + simulated brokers on the Raft simulator (tests/sim).

Each Raft node of :class:`sim.harness.Simulation` carries a controller: its committed image follows the
node's committed values, and while the node leads (with an entry of its own epoch committed) a
:class:`ControllerLogic` is active on it — reset from the committed image, exactly as the asyncio shell
does.  Simulated brokers register and heartbeat to the active controller on the same virtual clock.

Checked after every event: no live, reachable broker is ever fenced (also across controller failovers
and controller partitions).  Per scenario: a partitioned broker is fenced within session timeout x 1.2,
a zombie incarnation only ever gets STALE_BROKER_EPOCH, and at the end every controller holds an
identical committed image.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb
from sim.harness import InvariantViolation, SimNode, Simulation

CLUSTER = "sim-cluster"
SESSION_MS = 600  # scaled like the Raft timings (Kafka: 9000)
HEARTBEAT_MS = 100  # Kafka: 2000
CHECK_MS = SESSION_MS // 8
BOUND_MS = 3000
CONTROLLER_SEEDS = 40


@dataclass
class SimBroker:
    broker_id: int
    incarnation: str
    epoch: int = -1
    alive: bool = True
    reachable: bool = True
    zombie: bool = False
    stale_answers: int = 0
    other_answers: int = 0


@dataclass
class Active:
    epoch: int
    logic: ControllerLogic
    next_offset: int


@dataclass
class NodeView:
    incarnation: int = -1
    applied: int = 0
    image: MetadataImage = field(default_factory=MetadataImage.empty)


class ControllerSimulation(Simulation):
    def __init__(self, seed: int, brokers: int = 4) -> None:
        super().__init__(seed, voters=3)
        self.views: dict[int, NodeView] = {n: NodeView() for n in self.nodes}
        self.active: dict[int, Active] = {}
        self.brokers = {b: SimBroker(b, f"inc-{b}-0") for b in range(101, 101 + brokers)}
        self.topic_ids = (f"topic-{seed}-{i}" for i in range(1_000_000))
        self.false_fencing: dict[tuple[int, bytes], str] = {}
        self.reachable_since: dict[int, int] = {}

    # ---- controllers follow their node ----

    def check_invariants(self) -> None:
        super().check_invariants()
        for node in self.nodes.values():
            self._follow(node)

    def _follow(self, node: SimNode) -> None:
        view = self.views[node.node_id]
        if not node.running or node.core is None:
            self.active.pop(node.node_id, None)
            return
        if view.incarnation != node.incarnation:
            # restarted: rebuild the image from what the node has committed (its snapshot + log)
            self.views[node.node_id] = view = NodeView(node.incarnation)
            self.active.pop(node.node_id, None)
        if node.applied_end > view.applied:
            delta = MetadataDelta(view.image)
            for offset in range(view.applied, node.applied_end):
                value = node.values[offset]
                if value is not None:
                    delta.replay(records.decode_value(value), offset)
                    problem = self.false_fencing.get((offset, value))
                    if problem is not None:
                        raise InvariantViolation(f"seed {self.seed}: {problem}, committed at offset {offset}")
            delta.offset = node.applied_end - 1
            view.image = delta.apply()
            view.applied = node.applied_end
        core = node.core
        active = self.active.get(node.node_id)
        if active is not None and (not core.is_leader or core.epoch != active.epoch):
            del self.active[node.node_id]
        elif (
            active is None
            and core.is_leader
            and node.applied_end == core.high_watermark > core.epoch_start_offset
        ):
            # Like the shell: active once an entry of its own epoch committed and everything is applied.
            logic = ControllerLogic(
                ControllerSettings(CLUSTER, session_timeout_ms=SESSION_MS, default_replication_factor=2),
                view.image,
                self.now_ms,
                new_topic_id=lambda: next(self.topic_ids),
            )
            active = self.active[node.node_id] = Active(core.epoch, logic, core.log.end_offset)
            first = active.next_offset
            self._append(node.node_id, active, first, logic.continue_leave_jobs(first))

    def _note_fencing_decisions(self, first_offset: int, batch: list[pb.MetadataRecord]) -> None:
        """A fence of a broker that has been alive and reachable for a whole session is a false fencing;
        it is an error only if it commits (an isolated old leader may decide anything it likes)."""
        for index, record in enumerate(batch):
            change = record.broker_registration_change
            if records.kind(record) != "broker_registration_change" or change.fenced != 1:
                continue
            broker = self.brokers.get(change.broker_id)
            if broker is None or change.broker_epoch != broker.epoch or broker.zombie:
                continue
            reachable_ms = self.now_ms - self.reachable_since.get(broker.broker_id, 0)
            if broker.alive and broker.reachable and reachable_ms >= SESSION_MS:
                key = (first_offset + index, records.encode_value(record))
                self.false_fencing[key] = (
                    f"live broker {broker.broker_id} fenced by a decision at t={self.now_ms}"
                )

    def active_controller(self) -> tuple[int, Active] | None:
        best: tuple[int, Active] | None = None
        for node_id, active in self.active.items():
            if best is None or active.epoch > best[1].epoch:
                best = (node_id, active)
        return best

    def _append(
        self, node_id: int, active: Active, first_offset: int, batch: list[pb.MetadataRecord]
    ) -> None:
        if not batch:
            return
        self._note_fencing_decisions(first_offset, batch)
        node = self.nodes[node_id]
        last = node.live_core.append([records.encode_value(r) for r in batch], self.now_ms)
        node.process(node.live_core.take_output(self.now_ms))
        if last != first_offset + len(batch) - 1:
            raise InvariantViolation(f"seed {self.seed}: predicted offset {first_offset}, raft gave {last}")
        active.next_offset = last + 1
        if active.logic.has_leave_jobs():  # the rest of a broker leaving its ISRs, like the shell does
            first = active.next_offset
            self._append(node_id, active, first, active.logic.continue_leave_jobs(first))

    # ---- brokers and periodic controller work ----

    def start_brokers(self) -> None:
        for broker in self.brokers.values():
            self.schedule(self.rng.randint(1, HEARTBEAT_MS), lambda b=broker: self._broker_tick(b))  # type: ignore[misc]
        self.schedule(CHECK_MS, self._session_tick)

    def _broker_tick(self, broker: SimBroker) -> None:
        self.schedule(HEARTBEAT_MS, lambda: self._broker_tick(broker))
        if not broker.alive or not broker.reachable:
            return
        target = self.active_controller()
        if target is None:
            return
        node_id, active = target
        if not self.nodes[node_id].running:
            return
        logic, first = active.logic, active.next_offset
        if broker.epoch < 0 and not broker.zombie:
            request = cpb.RegisterBrokerRequest(
                cluster_id=CLUSTER, broker_id=broker.broker_id, incarnation_id=broker.incarnation
            )
            request.listeners.add(name="PLAINTEXT", host="127.0.0.1", port=broker.broker_id)
            out = logic.register_broker(request, self.now_ms, first)
            self._append(node_id, active, first, out.records)
            if out.response.error_code == ErrorCode.NONE:
                broker.epoch = out.response.broker_epoch
            return
        applied = self.views[node_id].image.offset
        heartbeat = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker.broker_id,
            broker_epoch=broker.epoch,
            current_metadata_offset=applied,
        )
        beat = logic.broker_heartbeat(heartbeat, self.now_ms, first)
        self._append(node_id, active, first, beat.records)
        if beat.response.error_code == ErrorCode.STALE_BROKER_EPOCH:
            broker.stale_answers += 1
            if not broker.zombie:
                broker.epoch = -1  # its registration never committed (failover): register again
        else:
            broker.other_answers += 1

    def _session_tick(self) -> None:
        self.schedule(CHECK_MS, self._session_tick)
        for node_id, active in list(self.active.items()):
            if self.nodes[node_id].running:
                first = active.next_offset
                _, batch = active.logic.fence_expired(self.now_ms, first)
                self._append(node_id, active, first, batch)

    def create_topic(self, name: str, partitions: int) -> None:
        target = self.active_controller()
        if target is None:
            return
        node_id, active = target
        first = active.next_offset
        request = cpb.CreateTopicsRequest(
            cluster_id=CLUSTER,
            topics=[cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=2)],
        )
        out = active.logic.create_topics(request, first)
        self._append(node_id, active, first, out.records)

    # ---- checks ----

    def leader_image(self) -> MetadataImage:
        target = self.active_controller()
        if target is None:
            raise InvariantViolation(f"seed {self.seed}: no active controller")
        return self.views[target[0]].image

    def wait_all_active(self, what: str) -> None:
        def all_active() -> bool:
            if self.active_controller() is None:
                return False
            image = self.leader_image()
            return all(
                (b := image.brokers.get(broker.broker_id)) is not None
                and not b.fenced
                and b.epoch == broker.epoch
                for broker in self.brokers.values()
                if broker.alive and broker.reachable and not broker.zombie
            )

        self.run_until_condition(all_active, BOUND_MS, what)

    def check_identical_images(self) -> None:
        self.router.heal()
        for node in self.nodes.values():
            if not node.running:
                node.start()
        self.run_until_condition(
            lambda: self.active_controller() is not None, BOUND_MS, "an active controller"
        )
        self.create_topic(
            f"final-{self.seed}", 1
        )  # a last write: everything before it is settled once applied
        target = self.active_controller()
        assert target is not None
        marker = target[1].next_offset - 1

        def converged() -> bool:
            return all(v.image.offset >= marker for v in self.views.values())

        self.run_until_condition(converged, BOUND_MS, "every controller applying the final write")
        self.run_for(50)
        reference = self.views[target[0]].image
        for node_id, view in self.views.items():
            if view.image.offset == reference.offset and view.image != reference:
                raise InvariantViolation(f"seed {self.seed}: controller {node_id} has a different image")
        offsets = {v.image.offset for v in self.views.values()}
        if len(offsets) != 1:
            raise InvariantViolation(f"seed {self.seed}: controllers stopped at different offsets {offsets}")


def _started(seed: int, brokers: int = 4) -> ControllerSimulation:
    sim = ControllerSimulation(seed, brokers)
    sim.start_all()
    sim.run_until_condition(
        lambda: sim.active_controller() is not None, BOUND_MS, "the first active controller"
    )
    sim.start_brokers()
    sim.wait_all_active("every broker unfenced")
    return sim


def scenario_failover_never_fences_live_brokers(seed: int) -> None:
    sim = _started(seed)
    for round_number in range(4):
        sim.create_topic(f"t{round_number}", 1 + sim.rng.randint(0, 5))
        target = sim.active_controller()
        assert target is not None
        sim.run_for(sim.rng.randint(0, HEARTBEAT_MS * 3))
        sim.crash(target[0])
        sim.run_until_condition(
            lambda old=target[0]: (t := sim.active_controller()) is not None and t[0] != old,  # type: ignore[misc]
            BOUND_MS,
            "a new active controller",
        )
        sim.run_for(SESSION_MS * 2)  # long enough for any wrongly tracked deadline to expire
        sim.restart(target[0])
        sim.wait_all_active("brokers active after failover")
    sim.check_identical_images()


def scenario_partitioned_controller_loses_its_pending_state(seed: int) -> None:
    sim = _started(seed)
    target = sim.active_controller()
    assert target is not None
    sim.router.isolate(target[0])  # the old leader keeps running, cut off, until check-quorum resigns it
    sim.run_until_condition(
        lambda: (t := sim.active_controller()) is not None and t[0] != target[0],
        BOUND_MS,
        "a majority leader",
    )
    sim.create_topic("after-partition", 3)
    sim.run_for(SESSION_MS * 2)
    sim.wait_all_active("brokers active on the majority side")
    sim.check_identical_images()


def scenario_partitioned_broker_is_fenced_within_the_session_timeout(seed: int) -> None:
    sim = _started(seed)
    sim.create_topic("data", 4)
    sim.run_for(HEARTBEAT_MS * 3)
    victim = sim.brokers[101 + sim.rng.randrange(len(sim.brokers))]
    victim.reachable = False
    cut_at = sim.now_ms

    def fenced() -> bool:
        broker = sim.leader_image().brokers.get(victim.broker_id)
        return broker is not None and broker.fenced

    sim.run_until_condition(fenced, int(SESSION_MS * 1.2), "fencing the partitioned broker")
    image = sim.leader_image()
    for topic in image.topics_by_id.values():
        for partition in topic.partitions:
            if victim.broker_id in partition.isr and len(partition.isr) > 1:
                raise InvariantViolation(f"seed {seed}: fenced broker still in a shared ISR")
            if partition.leader == victim.broker_id:
                raise InvariantViolation(f"seed {seed}: fenced broker still leads")
    assert sim.now_ms - cut_at <= SESSION_MS * 1.2
    victim.reachable = True
    sim.reachable_since[victim.broker_id] = sim.now_ms
    sim.wait_all_active("the healed broker unfenced again")
    sim.check_identical_images()


def scenario_zombie_broker_is_rejected_by_epoch(seed: int) -> None:
    sim = _started(seed)
    old = sim.brokers[101]
    old.alive = False  # the process hangs; its session expires and it is fenced
    sim.run_until_condition(
        lambda: (b := sim.leader_image().brokers.get(101)) is not None and b.fenced,
        BOUND_MS,
        "fencing the hung broker",
    )
    replacement = SimBroker(101, "inc-101-1")
    sim.brokers[101] = replacement
    sim.schedule(1, lambda: sim._broker_tick(replacement))
    sim.wait_all_active("the new incarnation unfenced")
    zombie = SimBroker(101, old.incarnation, epoch=old.epoch, zombie=True)
    sim.schedule(1, lambda: sim._broker_tick(zombie))
    sim.run_for(HEARTBEAT_MS * 5)
    if zombie.stale_answers == 0 or zombie.other_answers:
        raise InvariantViolation(
            f"seed {seed}: zombie got {zombie.stale_answers} stale / {zombie.other_answers} other answers"
        )
    current = sim.leader_image().brokers[101]
    if current.incarnation_id != "inc-101-1" or current.fenced:
        raise InvariantViolation(f"seed {seed}: the zombie disturbed the live incarnation")
    sim.check_identical_images()


SCENARIOS = {
    "failover_never_fences_live_brokers": scenario_failover_never_fences_live_brokers,
    "partitioned_controller_loses_its_pending_state": scenario_partitioned_controller_loses_its_pending_state,
    "partitioned_broker_is_fenced_within_the_session_timeout": (
        scenario_partitioned_broker_is_fenced_within_the_session_timeout
    ),
    "zombie_broker_is_rejected_by_epoch": scenario_zombie_broker_is_rejected_by_epoch,
}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_controller_scenario_holds_for_every_seed(name: str, sim_seeds: list[int]) -> None:
    seeds = sim_seeds if len(sim_seeds) == 1 else sim_seeds[:CONTROLLER_SEEDS]
    for seed in seeds:
        try:
            SCENARIOS[name](seed)
        except (InvariantViolation, AssertionError, KraftError) as exc:
            replay = f"pytest tests/sim -k {name} --seed {seed}"
            pytest.fail(f"scenario {name} failed with seed {seed}: {exc}\nreplay: {replay}")
