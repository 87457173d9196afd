"""Deterministic simulation of 3 controllers + simulated brokers on the Raft simulator (tests/sim).

Each Raft node of :class:`sim.harness.Simulation` runs the production :class:`QuorumController` over a
:class:`SimRaftClient` (tests/sim/sim_raft_client.py), all on one :class:`VirtualTimeLoop` whose time is
the simulation's ManualClock: activation, the write path, the session checker, idle NoOps and the
listener callbacks are the real ones, and their timers fire at exact virtual times.  After every
simulation event each controller is handed what its node committed and its leader changes, then the loop
runs until idle.  A crashed node's controller is stopped; a restarted node gets a fresh one.  Simulated
brokers register and heartbeat to the active controller (the highest active epoch) through its
ControllerService methods, one request in flight each, with an RPC deadline.  A node can be paused
(SIGSTOP: its Raft core, its controller's own event loop and everything addressed to it wait until it
resumes; on resuming, network input is handled before expired timers and its Raft listener is
``RESUMED_LISTENER_LAG_MS`` behind, as a listener task that gets the loop after the driver).

Checked after every event: no live, reachable broker is ever fenced (a fence decision for a broker alive
and reachable for a whole session must never commit, also across controller failovers and partitions),
and the controller never mispredicts an offset.  Per scenario: a partitioned broker is fenced within
session timeout x 1.2, a zombie incarnation is only ever answered STALE_BROKER_EPOCH, a deposed (isolated
or paused) controller never acknowledges a write a newer leader overwrote, every acknowledged
CreateTopics is in the final image, and at the end every controller holds an identical committed image.

The paused-controller scenario is chaos ``pause`` seed 28: with both of its fixes undone (waiters that
check the epoch of the committing batch, and listeners that report a change to another leader before the
newer epoch's batches) it fails on every seed; with either one it holds.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import pytest

from kraft.clock import ManualClock
from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.controller_logic import CREATE_TOPIC_TRANSACTION, ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.raft.core_output import OutboundRequest
from kraft.raft.messages import RaftResponse
from kraft.v1 import controller_pb2 as cpb
from sim.harness import InvariantViolation, SimNode, Simulation
from sim.sim_raft_client import SimRaftClient, VirtualTimeLoop

CLUSTER = "sim-cluster"
SESSION_MS = 600  # scaled like the Raft timings (Kafka: 9000)
HEARTBEAT_MS = 100  # Kafka: 2000
BROKER_RPC_TIMEOUT_MS = 2 * HEARTBEAT_MS
BOUND_MS = 3000
RESUMED_LISTENER_LAG_MS = 50
CONTROLLER_SEEDS = 40
OPTIONS = ControllerOptions(
    session_timeout_ms=SESSION_MS,
    heartbeat_interval_ms=HEARTBEAT_MS,
    noop_interval_ms=100,
    commit_timeout_ms=1_500,  # Kafka-scale values / 20, like the Raft timings
    activation_wait_ms=250,
    leader_lease_ms=100,  # the simulated Raft's fetch timeout
    default_replication_factor=2,
    snapshot_max_bytes=1 << 40,
    snapshot_interval_ms=1 << 40,
    # tiny work units: every bulk operation of the scenarios runs in many slices, paced by commits
    max_work_unit_records=4,
    max_uncommitted_bulk_records=8,
    # topics of 3-4 partitions are prepared in bounded events and written in one (1-2 are written in
    # parts, 5+ in a transaction)
    prepared_topic_min_partitions=3,
)
BULK_PARTITIONS = 48
UNANSWERED = (ErrorCode.NOT_CONTROLLER, ErrorCode.REQUEST_TIMED_OUT)
"""Answers that say nothing about the request itself (it reached no active controller, or timed out)."""


@dataclass
class SimBroker:
    broker_id: int
    incarnation: str
    epoch: int = -1
    alive: bool = True
    reachable: bool = True
    zombie: bool = False
    in_flight: bool = False
    stale_answers: int = 0
    other_answers: int = 0
    previous_incarnation: str = ""
    """Named in its registration: a restart on the same log dirs (kraft.broker.incarnation)."""
    offline: tuple[tuple[str, int], ...] = ()
    """(topic, partition) on a log dir it took offline: carried by every heartbeat."""


@dataclass
class NodeController:
    incarnation: int
    raft: SimRaftClient
    controller: QuorumController
    loop: VirtualTimeLoop
    """Its own loop (all on the simulation's clock), so a paused node's controller stands still too."""


class ControllerSimulation(Simulation):
    def __init__(self, seed: int, brokers: int = 4, *, commit_now: bool = True) -> None:
        """``commit_now``: each leader hands a few committed batches to its controller in the step they
        commit (``handle_commit_now``), as the driver does; False: all through ``handle_commit``."""
        super().__init__(seed, voters=3)
        self.clock = ManualClock()
        self.commit_now = commit_now
        self._committed_now_stopped = 0
        self.controllers: dict[int, NodeController] = {}
        self.paused: set[int] = set()
        self._held: list[tuple[bool, Callable[[], None]]] = []
        """(is a timer, event) for paused nodes, run when they resume."""
        self._listeners_behind_until: dict[int, int] = {}
        for node in self.nodes.values():
            self._freeze_timers_while_paused(node)
        self.brokers = {b: SimBroker(b, f"inc-{b}-0") for b in range(101, 101 + brokers)}
        self._topic_ids = (f"topic-{seed}-{i}" for i in itertools.count())
        self.false_fencing: dict[tuple[int, bytes], str] = {}
        self.reachable_since: dict[int, int] = {}
        self.acked_topics: set[str] = set()
        self.answers: dict[str, cpb.CreateTopicsResponse] = {}
        self._wakeups: set[int] = set()
        self._fencing_checked: dict[int, int] = {}
        self._syncing = False

    @property
    def committed_now(self) -> int:
        """Batches the controllers took synchronously (``handle_commit_now``), stopped ones included."""
        return self._committed_now_stopped + sum(e.raft.committed_now for e in self.controllers.values())

    def close(self) -> None:
        self.paused.clear()
        for node_id in list(self.controllers):
            self._stop_controller(node_id)

    # ---- pausing a node (SIGSTOP): nothing of it runs, nothing addressed to it is lost ----

    def pause(self, node_id: int) -> None:
        self.paused.add(node_id)

    def resume(self, node_id: int) -> None:
        """Like an event loop after SIGCONT: what arrived on the network is handled before expired timers
        (asyncio processes I/O events of a turn before its timers)."""
        self.paused.discard(node_id)
        # Its Raft listener task gets the loop only after the driver caught up with what arrived: it then
        # sees the leader change and the newer epoch's batches together (the order they are handed over
        # in is the listener's rule, kraft.raft.listeners).
        self._listeners_behind_until[node_id] = self.now_ms + RESUMED_LISTENER_LAG_MS
        held, self._held = self._held, []
        for is_timer in (False, True):
            for timer, action in held:
                if timer == is_timer:
                    self.schedule(0, action)

    def _hold_while_paused(self, node_id: int, action: Callable[[], None], timer: bool = False) -> None:
        if node_id in self.paused:
            self._held.append((timer, lambda: self._hold_while_paused(node_id, action, timer)))
        else:
            action()

    def _freeze_timers_while_paused(self, node: SimNode) -> None:
        poll, flush = node._poll, node._flush

        def held_poll(deadline_ms: int, incarnation: int) -> None:
            self._hold_while_paused(node.node_id, lambda: poll(deadline_ms, incarnation), timer=True)

        def held_flush(incarnation: int) -> None:
            self._hold_while_paused(node.node_id, lambda: flush(incarnation), timer=True)

        node._poll = held_poll  # type: ignore[method-assign]
        node._flush = held_flush  # type: ignore[method-assign]

    def _deliver_request(self, src: int, incarnation: int, dst: int, message: OutboundRequest) -> None:
        deliver = super()._deliver_request
        self._hold_while_paused(dst, lambda: deliver(src, incarnation, dst, message))

    def _deliver_response(
        self, src: int, dst: int, incarnation: int, correlation_id: int, response: RaftResponse
    ) -> None:
        deliver = super()._deliver_response
        self._hold_while_paused(dst, lambda: deliver(src, dst, incarnation, correlation_id, response))

    def _deliver_refusal(self, src: int, dst: int, incarnation: int, correlation_id: int) -> None:
        deliver = super()._deliver_refusal
        self._hold_while_paused(dst, lambda: deliver(src, dst, incarnation, correlation_id))

    # ---- controllers follow their node ----

    def check_invariants(self) -> None:
        super().check_invariants()
        self._sync_controllers()

    def _sync_controllers(self) -> None:
        if self._syncing:
            return
        self._syncing = True
        try:
            now_ms = self.now_ms
            self.clock.now_ms = now_ms
            paused, controllers = self.paused, self.controllers
            for node_id, node in self.nodes.items():
                if node_id in paused:
                    continue
                current = controllers.get(node_id)
                if current is not None and (not node.running or current.incarnation != node.incarnation):
                    self._stop_controller(node_id)
                    current = None
                if current is None and node.running:
                    self._start_controller(node_id)
            self._check_committed_fencing()
            running = [e for n, e in controllers.items() if n not in paused]
            behind_until = self._listeners_behind_until
            for node_id, entry in controllers.items():
                if node_id not in paused and behind_until.get(node_id, 0) <= now_ms:
                    entry.raft.pump()
            for entry in running:
                entry.loop.run_ready()
            for entry in controllers.values():
                if entry.raft.resignations:
                    raise InvariantViolation(
                        f"seed {self.seed}: node {entry.raft.node_id} mispredicted an offset"
                    )
            self._schedule_wakeup()
        finally:
            self._syncing = False

    def _start_controller(self, node_id: int) -> None:
        node = self.nodes[node_id]
        raft = SimRaftClient(node, self._note_fencing_decisions, commit_now=self.commit_now)
        controller = QuorumController(
            raft, CLUSTER, {}, OPTIONS, clock=self.clock, new_topic_id=lambda: next(self._topic_ids)
        )
        loop = VirtualTimeLoop(self.clock)
        self.controllers[node_id] = NodeController(node.incarnation, raft, controller, loop)
        loop.run_until_complete(controller.start())

    def _stop_controller(self, node_id: int) -> None:
        entry = self.controllers.pop(node_id)
        entry.raft.stop()
        entry.loop.run_until_complete(entry.controller.stop())
        entry.loop.run_ready()
        entry.loop.close()
        self._committed_now_stopped += entry.raft.committed_now

    def _schedule_wakeup(self) -> None:
        """An event at the loop's next timer, so controller timers fire at their exact virtual time."""
        timers = [
            t
            for n, e in self.controllers.items()
            if n not in self.paused and (t := e.loop.next_timer_ms()) is not None
        ]
        next_ms = min(timers, default=None)
        if next_ms is None or next_ms in self._wakeups:
            return
        self._wakeups.add(next_ms)

        def wake() -> None:
            self._wakeups.discard(next_ms)

        self.schedule(max(0, next_ms - self.now_ms), wake)

    def _note_fencing_decisions(self, first_offset: int, values: Sequence[bytes]) -> None:
        """A fence of a broker that has been alive and reachable for a whole session is a false fencing;
        it is an error only if it commits (an isolated old leader may decide anything it likes)."""
        for index, value in enumerate(values):
            record = records.decode_value(value)
            change = record.broker_registration_change
            if records.kind(record) != "broker_registration_change" or change.fenced != 1:
                continue
            broker = self.brokers.get(change.broker_id)
            if broker is None or change.broker_epoch != broker.epoch or broker.zombie:
                continue
            reachable_ms = self.now_ms - self.reachable_since.get(broker.broker_id, 0)
            if broker.alive and broker.reachable and reachable_ms >= SESSION_MS:
                self.false_fencing[(first_offset + index, value)] = (
                    f"live broker {broker.broker_id} fenced by a decision at t={self.now_ms}"
                )

    def _check_committed_fencing(self) -> None:
        checked = self._fencing_checked
        for node_id, node in self.nodes.items():
            start = checked.get(node_id, 0)
            if start == node.applied_end:
                continue  # nothing applied since the last check (this runs after every event)
            start = min(start, node.applied_end)
            for offset in range(start, node.applied_end):
                value = node.values[offset]
                problem = self.false_fencing.get((offset, value)) if isinstance(value, bytes) else None
                if problem is not None:
                    raise InvariantViolation(f"seed {self.seed}: {problem}, committed at offset {offset}")
            self._fencing_checked[node_id] = node.applied_end

    def active_controller(self) -> tuple[int, QuorumController] | None:
        best: tuple[int, QuorumController] | None = None
        for node_id, entry in self.controllers.items():
            controller = entry.controller
            if not (controller.is_active and self.nodes[node_id].running) or node_id in self.paused:
                continue  # brokers time out on a paused controller and find the active one
            if best is None or controller.state.active_epoch > best[1].state.active_epoch:
                best = (node_id, controller)
        return best

    # ---- brokers ----

    def start_brokers(self) -> None:
        for broker in self.brokers.values():
            self.schedule(self.rng.randint(1, HEARTBEAT_MS), lambda b=broker: self._broker_tick(b))  # type: ignore[misc]

    def _broker_tick(self, broker: SimBroker) -> None:
        self.schedule(HEARTBEAT_MS, lambda: self._broker_tick(broker))
        if not broker.alive or not broker.reachable or broker.in_flight:
            return
        target = self.active_controller()
        if target is None:
            return
        broker.in_flight = True
        self.controllers[target[0]].loop.create_task(self._broker_call(broker, target[1]))

    async def _broker_call(self, broker: SimBroker, controller: QuorumController) -> None:
        timeout_s = BROKER_RPC_TIMEOUT_MS / 1000
        try:
            if broker.epoch < 0 and not broker.zombie:
                request = cpb.RegisterBrokerRequest(
                    cluster_id=CLUSTER,
                    broker_id=broker.broker_id,
                    incarnation_id=broker.incarnation,
                    previous_incarnation_id=broker.previous_incarnation,
                )
                request.listeners.add(name="PLAINTEXT", host="127.0.0.1", port=broker.broker_id)
                registered = await asyncio.wait_for(controller.register_broker(request), timeout_s)
                if registered.error_code == ErrorCode.NONE:
                    broker.epoch = registered.broker_epoch
                return
            heartbeat = cpb.BrokerHeartbeatRequest(
                cluster_id=CLUSTER,
                broker_id=broker.broker_id,
                broker_epoch=broker.epoch,
                current_metadata_offset=controller.committed.offset,
            )
            for topic, partition in broker.offline:
                heartbeat.offline_partitions.add(topic=topic, partition=partition)
            beat = await asyncio.wait_for(controller.broker_heartbeat(heartbeat), timeout_s)
            if beat.error_code == ErrorCode.STALE_BROKER_EPOCH:
                broker.stale_answers += 1
                if not broker.zombie:
                    broker.epoch = -1  # its registration never committed (failover): register again
            elif beat.error_code not in UNANSWERED:
                broker.other_answers += 1
        except TimeoutError:
            pass
        finally:
            broker.in_flight = False

    # ---- requests ----

    def create_topic(self, name: str, partitions: int, node_id: int | None = None) -> None:
        """CreateTopics on the active controller (or on ``node_id``'s); its answer lands in ``answers``."""
        if node_id is None:
            target = self.active_controller()
            if target is None:
                return
            node_id = target[0]
        controller = self.controllers[node_id].controller
        request = cpb.CreateTopicsRequest(
            cluster_id=CLUSTER,
            topics=[cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=2)],
        )

        async def call() -> None:
            response = await controller.create_topics(request)
            self.answers[name] = response
            if response.error_code == ErrorCode.NONE and response.topics[0].error_code == ErrorCode.NONE:
                self.acked_topics.add(name)

        self.controllers[node_id].loop.create_task(call())
        self._sync_controllers()

    # ---- checks ----

    def leader_image(self) -> MetadataImage:
        target = self.active_controller()
        if target is None:
            raise InvariantViolation(f"seed {self.seed}: no active controller")
        return target[1].committed

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
        final = f"final-{self.seed}"
        while final not in self.acked_topics:  # a last write: everything before it is settled once applied
            self.answers.pop(final, None)
            self.create_topic(final, 1)
            self.run_until_condition(lambda: final in self.answers, BOUND_MS, "an answer to the final write")
        target = self.active_controller()
        assert target is not None
        marker = target[1].committed.offset

        def converged() -> bool:
            return all(e.controller.committed.offset >= marker for e in self.controllers.values())

        self.run_until_condition(converged, BOUND_MS, "every controller applying the final write")
        # Idle NoOps keep committing: compare at an instant when no commit is on its way to a follower.
        self.run_until_condition(
            lambda: len({e.controller.committed.offset for e in self.controllers.values()}) == 1,
            BOUND_MS,
            "every controller at the same offset",
        )
        reference = target[1].committed
        for node_id, entry in self.controllers.items():
            if entry.controller.committed != reference:
                raise InvariantViolation(f"seed {self.seed}: controller {node_id} has a different image")
        lost = {name for name in self.acked_topics if reference.topic(name) is None}
        if lost:
            raise InvariantViolation(
                f"seed {self.seed}: acknowledged topics {sorted(lost)} are not committed"
            )


def _started(seed: int, brokers: int = 4) -> ControllerSimulation:
    return start_simulation(ControllerSimulation(seed, brokers))


def start_simulation(sim: ControllerSimulation) -> ControllerSimulation:
    """Start the controllers, wait for an active one, then start the brokers and wait until all are
    active."""
    sim.start_all()
    sim.run_until_condition(
        lambda: sim.active_controller() is not None, BOUND_MS, "the first active controller"
    )
    sim.start_brokers()
    sim.wait_all_active("every broker unfenced")
    return sim


def scenario_failover_never_fences_live_brokers(sim: ControllerSimulation) -> None:
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


def scenario_partitioned_controller_loses_its_pending_state(sim: ControllerSimulation) -> None:
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


def scenario_deposed_controller_never_acknowledges_its_write(sim: ControllerSimulation) -> None:
    """Chaos ``pause`` seed 28: an active controller cut off from its quorum appends a write, a newer
    leader commits its own records at those offsets, and the old controller rejoins, truncates and
    replays them.  Its write must be answered with an error — never acknowledged — and must not exist."""
    target = sim.active_controller()
    assert target is not None
    old = target[0]
    sim.router.isolate(old)
    sim.create_topic("deposed-write", 2, node_id=old)  # appended on the old leader only
    sim.run_until_condition(
        lambda: (t := sim.active_controller()) is not None and t[0] != old, BOUND_MS, "a majority leader"
    )
    sim.create_topic("new-leader-write", 2)  # the new leader's records take the truncated offsets
    sim.run_until_condition(lambda: "new-leader-write" in sim.answers, BOUND_MS, "the new leader's write")
    sim.router.heal()  # the old leader rejoins as a follower and replays the newer epoch's batches
    sim.run_until_condition(
        lambda: "deposed-write" in sim.answers, BOUND_MS, "an answer to the deposed write"
    )
    answer = sim.answers["deposed-write"]
    if "deposed-write" in sim.acked_topics:
        raise InvariantViolation(f"seed {sim.seed}: a deposed controller acknowledged a write: {answer}")
    sim.wait_all_active("brokers active after the old leader rejoined")
    sim.check_identical_images()
    if sim.leader_image().topic("deposed-write") is not None:
        raise InvariantViolation(f"seed {sim.seed}: the deposed controller's write was committed")


def scenario_partitioned_broker_is_fenced_within_the_session_timeout(sim: ControllerSimulation) -> None:
    seed = sim.seed
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


def scenario_zombie_broker_is_rejected_by_epoch(sim: ControllerSimulation) -> None:
    seed = sim.seed
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


def scenario_paused_controller_never_acknowledges_an_overwritten_write(sim: ControllerSimulation) -> None:
    """Chaos ``pause`` seed 28, as it happened: the active controller appends a write nobody replicates,
    then its process is paused (no check-quorum, no timers); a newer leader commits its own records at
    those offsets; on resuming, the old leader learns the newer epoch, truncates its write and replays
    the newer batches.  The write must be answered with an error, never acknowledged, never committed."""
    target = sim.active_controller()
    assert target is not None
    old = target[0]
    truncations = sim.nodes[old].stats.truncations
    sim.router.isolate(old)
    sim.create_topic("paused-write", 2, node_id=old)
    sim.run_for(5)  # the write is in the old leader's log, uncommitted
    sim.pause(old)
    sim.router.heal()
    sim.run_until_condition(
        lambda: (t := sim.active_controller()) is not None and t[0] != old,
        BOUND_MS,
        "a new active controller",
    )
    sim.create_topic("new-leader-write", 2)
    sim.run_until_condition(lambda: "new-leader-write" in sim.answers, BOUND_MS, "the new leader's write")
    sim.resume(old)
    sim.run_until_condition(lambda: "paused-write" in sim.answers, BOUND_MS, "an answer to the paused write")
    if "paused-write" in sim.acked_topics:
        answer = sim.answers["paused-write"]
        raise InvariantViolation(f"seed {sim.seed}: a deposed controller acknowledged a write: {answer}")
    sim.wait_all_active("brokers active after the paused controller resumed")
    sim.check_identical_images()
    if sim.leader_image().topic("paused-write") is not None:
        raise InvariantViolation(f"seed {sim.seed}: the paused controller's write was committed")
    assert sim.nodes[old].stats.truncations > truncations, "the old leader's write was never overwritten"


def _create_assigned(
    sim: ControllerSimulation, name: str, assignment: list[list[int]], configs: dict[str, str] | None = None
) -> None:
    """CreateTopics with an explicit assignment on the active controller; waits for the answer."""
    topic = cpb.CreatableTopic(name=name)
    for key, value in (configs or {}).items():
        topic.configs.add(name=key, value=value)
    for partition_id, replicas in enumerate(assignment):
        topic.assignments.add(partition=partition_id, broker_ids=replicas)
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
    while name not in sim.acked_topics:
        target = sim.active_controller()
        if target is None:
            sim.run_for(HEARTBEAT_MS)
            continue
        controller = target[1]

        async def call(controller: QuorumController = controller) -> None:
            response = await controller.create_topics(request)
            sim.answers[name] = response
            if response.error_code == ErrorCode.NONE and response.topics[0].error_code == ErrorCode.NONE:
                sim.acked_topics.add(name)

        sim.answers.pop(name, None)
        sim.controllers[target[0]].loop.create_task(call())
        sim._sync_controllers()
        sim.run_until_condition(lambda: name in sim.answers, BOUND_MS, f"an answer to creating {name}")


def _crash_active_mid_way(
    sim: ControllerSimulation, progress: Callable[[MetadataImage], int], what: str
) -> None:
    """Once the active controller's committed image shows the bulk operation partly done (0 < progress <
    BULK_PARTITIONS), crash it; then wait for another active controller."""
    sim.run_until_condition(
        lambda: 0 < progress(sim.leader_image()) < BULK_PARTITIONS, BOUND_MS, f"{what} partly committed"
    )
    target = sim.active_controller()
    assert target is not None
    sim.crash(target[0])
    sim.run_until_condition(
        lambda old=target[0]: (t := sim.active_controller()) is not None and t[0] != old,  # type: ignore[misc]
        BOUND_MS,
        "a new active controller",
    )
    sim.restart(target[0])


def scenario_sliced_controlled_shutdown_resumes_after_failover(sim: ControllerSimulation) -> None:
    """Broker 101 leads BULK_PARTITIONS partitions; its controlled shutdown moves them a work unit (4)
    at a time; the active controller crashes half-way.  The new one resumes from the image (leaderships
    still on a shutting-down broker) and the result is the unsliced operation's: 101 leads nothing and is
    in no shared ISR, every partition led by its first other replica, nothing else changed."""
    others = sorted(b for b in sim.brokers if b != 101)
    assignment = [
        [101, others[p % len(others)], others[(p + 1) % len(others)]] for p in range(BULK_PARTITIONS)
    ]
    _create_assigned(sim, "led-by-101", assignment)
    sim.brokers[101].alive = False  # the broker shuts down: it may (and will) be fenced
    target = sim.active_controller()
    assert target is not None
    request = cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=101)
    sim.controllers[target[0]].loop.create_task(target[1].shutdown_broker(request))
    sim._sync_controllers()

    def moved(image: MetadataImage) -> int:
        topic = image.topic("led-by-101")
        return 0 if topic is None else sum(1 for p in topic.partitions if p.leader != 101)

    _crash_active_mid_way(sim, moved, "the controlled shutdown")

    def done() -> bool:
        topic = sim.leader_image().topic("led-by-101")
        return topic is not None and all(101 not in p.isr for p in topic.partitions)

    # well before the dead broker's fresh session (from the new activation) expires: resumed, not redone
    # by the fence that expiry would bring
    sim.run_until_condition(done, SESSION_MS // 2, "the controlled shutdown resumed to its end")
    topic = sim.leader_image().topic("led-by-101")
    assert topic is not None
    for partition_id, partition in enumerate(topic.partitions):
        expected = tuple(assignment[partition_id][1:])
        if partition.isr != expected or partition.leader != expected[0]:
            raise InvariantViolation(
                f"seed {sim.seed}: partition {partition_id} is {partition}, expected isr {expected}"
            )
    sim.check_identical_images()


def scenario_sliced_unfence_elections_resume_after_failover(sim: ControllerSimulation) -> None:
    """Broker 101 is the only replica of BULK_PARTITIONS partitions: fenced, they go offline (leader -1,
    ISR kept); back, its unfence elects it for each, a work unit at a time; the active controller crashes
    half-way.  The new one finds the remaining elections in the image and runs them: all led by 101."""
    _create_assigned(sim, "only-101", [[101] for _ in range(BULK_PARTITIONS)])
    broker = sim.brokers[101]
    broker.reachable = False

    def offline() -> bool:
        topic = sim.leader_image().topic("only-101")
        return topic is not None and all(p.leader == -1 for p in topic.partitions)

    sim.run_until_condition(offline, BOUND_MS, "broker 101 fenced, its partitions offline")
    broker.reachable = True
    sim.reachable_since[101] = sim.now_ms

    def led(image: MetadataImage) -> int:
        topic = image.topic("only-101")
        return 0 if topic is None else sum(1 for p in topic.partitions if p.leader == 101)

    _crash_active_mid_way(sim, led, "the unfence elections")
    sim.run_until_condition(lambda: led(sim.leader_image()) == BULK_PARTITIONS, BOUND_MS, "every election")
    sim.wait_all_active("brokers active after the failover")
    sim.check_identical_images()


def scenario_unclean_reregistration_leaves_every_elr_across_failover(sim: ControllerSimulation) -> None:
    """KIP-966's unclean shutdown across a failover.  Brokers 101-103 hold BULK_PARTITIONS partitions
    (min ISR 2); 103 then 102 die: ISR (101,), ELR (102,).  102 comes back on wiped log dirs — a new
    incarnation naming no predecessor — so it must leave every ELR before its unfence, a work unit at a
    time; the active controller crashes half-way.  The new one knows from the registration record that the
    removal is unclean and finishes it; then 101 dies and no partition is ever led by 102 (every one waits
    offline for 101, its only eligible leader)."""
    _create_assigned(
        sim,
        "elr",
        [[101, 102, 103] for _ in range(BULK_PARTITIONS)],
        {"min.insync.replicas": "2"},
    )

    def partitions() -> Sequence[Any]:
        topic = sim.leader_image().topic("elr")
        assert topic is not None
        return topic.partitions

    for victim, isr, elr in ((103, (101, 102), ()), (102, (101,), (102,))):
        sim.brokers[victim].alive = False
        sim.run_until_condition(
            lambda isr=isr, elr=elr: all((p.isr, p.elr) == (isr, elr) for p in partitions()),  # type: ignore[misc]
            BOUND_MS,
            f"broker {victim} fenced out of the ISRs",
        )
    broker = sim.brokers[102]
    broker.incarnation, broker.epoch, broker.alive = "inc-102-wiped", -1, True
    sim.reachable_since[102] = sim.now_ms

    def left(image: MetadataImage) -> int:
        topic = image.topic("elr")
        return 0 if topic is None else sum(1 for p in topic.partitions if 102 not in p.elr)

    _crash_active_mid_way(sim, left, "the unclean ELR removal")
    sim.run_until_condition(
        lambda: left(sim.leader_image()) == BULK_PARTITIONS,
        BOUND_MS,
        "the unclean removal resumed to its end",
    )
    sim.wait_all_active("broker 102 unfenced after its removal")
    if sim.leader_image().brokers[102].unclean_shutdown:
        raise InvariantViolation(f"seed {sim.seed}: the unfence did not clear unclean_shutdown")
    sim.brokers[101].alive = False
    sim.run_until_condition(
        lambda: all(p.leader == -1 and p.elr == (101,) for p in partitions()),
        BOUND_MS,
        "every partition offline, waiting for 101",
    )
    led_by_102 = [i for i, p in enumerate(partitions()) if p.leader == 102 or 102 in p.isr]
    if led_by_102:
        raise InvariantViolation(f"seed {sim.seed}: wiped broker 102 elected for partitions {led_by_102}")
    sim.check_identical_images()


def scenario_offline_dir_replica_never_elected_across_failover(sim: ControllerSimulation) -> None:
    """A replica on an offline log dir (JBOD) is not elected, whichever controller is active.  Brokers
    101-103 hold BULK_PARTITIONS partitions (min ISR 2); 103 dies: ISR (101, 102).  102's dir holding them
    all goes offline while 102 stays live: ISR (101,), ELR (102,), and its registration lists them.  The
    active controller crashes; under the new one 101 dies: every partition waits offline, 102 (live,
    eligible) is never elected — its data is unreachable.  102 restarts on the repaired dir (same dirs:
    it names its incarnation) and, still in the ELR, leads every partition."""
    _create_assigned(
        sim,
        "jbod",
        [[101, 102, 103] for _ in range(BULK_PARTITIONS)],
        {"min.insync.replicas": "2"},
    )
    led_by_102: set[int] = set()

    def partitions() -> Sequence[Any]:
        topic = sim.leader_image().topic("jbod")
        assert topic is not None
        led_by_102.update(i for i, p in enumerate(topic.partitions) if p.leader == 102)
        return topic.partitions

    sim.brokers[103].alive = False
    sim.run_until_condition(
        lambda: all(p.isr == (101, 102) for p in partitions()), BOUND_MS, "broker 103 fenced out of the ISRs"
    )
    sim.brokers[102].offline = tuple(("jbod", p) for p in range(BULK_PARTITIONS))
    sim.run_until_condition(
        lambda: (
            all((p.isr, p.elr) == ((101,), (102,)) for p in partitions())
            and len(sim.leader_image().brokers[102].offline_replicas) == BULK_PARTITIONS
        ),
        BOUND_MS,
        "broker 102's offline replicas out of the ISRs, into the ELRs and its registration",
    )
    target = sim.active_controller()
    assert target is not None
    sim.crash(target[0])
    sim.run_until_condition(
        lambda old=target[0]: (t := sim.active_controller()) is not None and t[0] != old,  # type: ignore[misc]
        BOUND_MS,
        "a new active controller",
    )
    sim.restart(target[0])
    sim.brokers[101].alive = False
    sim.run_until_condition(
        lambda: all((p.leader, p.isr, p.elr) == (-1, (), (101, 102)) for p in partitions()),
        BOUND_MS,
        "every partition offline, 102 eligible but on an offline dir",
    )
    if led_by_102:
        raise InvariantViolation(f"seed {sim.seed}: 102 elected on its offline dir for {sorted(led_by_102)}")
    broker = sim.brokers[102]
    broker.previous_incarnation, broker.incarnation = broker.incarnation, "inc-102-repaired"
    broker.epoch, broker.offline = -1, ()
    sim.run_until_condition(
        lambda: all((p.leader, p.isr) == (102, (102,)) for p in partitions()),
        BOUND_MS,
        "102, restarted on the repaired dir, elected from the ELR",
    )
    sim.check_identical_images()


def _request_until(
    sim: ControllerSimulation, key: str, call: Callable[[QuorumController], Any], done: Callable[[], bool]
) -> None:
    """Send ``call`` to the active controller, again after each answer, until ``done()`` (a client that
    retries a request the failover interrupted)."""
    while not done():
        target = sim.active_controller()
        if target is None:
            sim.run_for(HEARTBEAT_MS)
            continue
        sim.answers.pop(key, None)

        async def send(controller: QuorumController = target[1]) -> None:
            sim.answers[key] = await call(controller)

        sim.controllers[target[0]].loop.create_task(send())
        sim._sync_controllers()
        sim.run_until_condition(lambda: key in sim.answers, BOUND_MS, f"an answer to {key}")


def scenario_sliced_topic_requests_finish_after_failover(sim: ControllerSimulation) -> None:
    """One CreateTopics of BULK_PARTITIONS / 2 two-partition topics is written in parts of a work unit (4
    records); the active controller crashes when some parts committed; the client retries on the new one
    (created topics answer TOPIC_ALREADY_EXISTS, the rest are created) — every topic exists exactly once,
    complete.  Then one DeleteTopics of all of them, sliced the same way, with a crash half-way and a retry
    (deleted ones answer UNKNOWN_TOPIC_OR_PARTITION): none is left."""
    names = [f"bulk-{i}" for i in range(BULK_PARTITIONS // 2)]
    create = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        topics=[cpb.CreatableTopic(name=n, num_partitions=2, replication_factor=2) for n in names],
    )

    def existing(image: MetadataImage) -> int:
        return sum(1 for n in names if image.topic(n) is not None)

    target = sim.active_controller()
    assert target is not None
    sim.controllers[target[0]].loop.create_task(target[1].create_topics(create))
    sim._sync_controllers()
    _crash_active_mid_way(sim, lambda image: existing(image) * 2, "the CreateTopics")
    _request_until(
        sim,
        "bulk-create",
        lambda c: c.create_topics(create),
        lambda: existing(sim.leader_image()) == len(names),
    )
    image = sim.leader_image()
    for name in names:
        topic = image.topic(name)
        assert topic is not None
        if len(topic.partitions) != 2 or any(len(set(p.replicas)) != 2 for p in topic.partitions):
            raise InvariantViolation(f"seed {sim.seed}: topic {name} is incomplete: {topic}")
    delete = cpb.DeleteTopicsRequest(cluster_id=CLUSTER, names=names)
    target = sim.active_controller()
    assert target is not None
    sim.controllers[target[0]].loop.create_task(target[1].delete_topics(delete))
    sim._sync_controllers()
    _crash_active_mid_way(sim, lambda image: (len(names) - existing(image)) * 2, "the DeleteTopics")
    _request_until(
        sim, "bulk-delete", lambda c: c.delete_topics(delete), lambda: existing(sim.leader_image()) == 0
    )
    sim.wait_all_active("brokers active after the failovers")
    sim.check_identical_images()


def scenario_sliced_big_topic_resumes_after_failover(sim: ControllerSimulation) -> None:
    """One CreateTopics of a single auto-placed topic of BULK_PARTITIONS partitions (12 work units of 4):
    planned, then written in slices inside a metadata transaction; the active controller crashes when
    part of it committed.  Nobody retries: the new active controller finds the open transaction in its
    image, resumes from its plan and closes it.  The topic equals the unsliced operation's — the
    placement and ISRs a single-event creation on the image before the request gives."""
    before = sim.leader_image()
    unsliced = ControllerLogic(
        ControllerSettings(CLUSTER, default_replication_factor=2, max_changes_per_write=10 * BULK_PARTITIONS),
        before,
        0,
        new_topic_id=lambda: "unsliced",
    )
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        topics=[cpb.CreatableTopic(name="big", num_partitions=BULK_PARTITIONS, replication_factor=2)],
    )
    expected = unsliced.create_topics(request, before.offset + 1)
    assert expected.response.topics[0].error_code == ErrorCode.NONE
    expected_topic = unsliced.image.topic("big")
    assert expected_topic is not None
    target = sim.active_controller()
    assert target is not None
    sim.controllers[target[0]].loop.create_task(target[1].create_topics(request))
    sim._sync_controllers()

    def written(image: MetadataImage) -> int:
        topic = image.topic("big")
        return 0 if topic is None else len(topic.partitions)

    _crash_active_mid_way(sim, written, "the big topic")
    if not sim.leader_image().transaction.startswith(CREATE_TOPIC_TRANSACTION):
        raise InvariantViolation(f"seed {sim.seed}: no open transaction after the crash mid-way")
    reserved_seen = False

    def reserves_the_rest() -> None:
        """The new active controller reserves the big topic's unwritten rest for the limits of other
        requests (rebuilt by its reset from the plan in the log) and nothing once it is written."""
        nonlocal reserved_seen
        active = sim.active_controller()
        logic = None if active is None else active[1].state.logic
        if logic is None:
            return
        rest = BULK_PARTITIONS - written(logic.image) if logic.image.transaction else 0
        if logic.reservations.partitions != rest:
            raise InvariantViolation(
                f"seed {sim.seed}: {logic.reservations.partitions} partitions reserved, {rest} unwritten"
            )
        reserved_seen = reserved_seen or rest > 0

    def done() -> bool:
        reserves_the_rest()
        image = sim.leader_image()
        return written(image) == BULK_PARTITIONS and not image.transaction

    sim.run_until_condition(done, BOUND_MS, "the big topic resumed to its end")
    if not reserved_seen:
        raise InvariantViolation(f"seed {sim.seed}: the resumed rest was never seen reserved")
    topic = sim.leader_image().topic("big")
    assert topic is not None
    if topic.partitions != expected_topic.partitions:
        raise InvariantViolation(
            f"seed {sim.seed}: the resumed topic differs from the unsliced one: {topic.partitions} != "
            f"{expected_topic.partitions}"
        )
    sim.wait_all_active("brokers active after the failover")
    sim.check_identical_images()


def scenario_sliced_explicit_big_topic_is_undone_and_retried_after_failover(
    sim: ControllerSimulation,
) -> None:
    """One CreateTopics of a single topic with an explicit assignment of BULK_PARTITIONS partitions: its
    entries checked and its records written in slices of a work unit (4) inside a metadata transaction;
    the active controller crashes when part of it committed.  The assignment is not in the log, so the
    new active controller removes what was written inside the transaction and closes it (no broker ever
    sees a partial topic); the client's retry creates it.  The topic then equals what one unsliced
    CreateTopics on the image before the request gives (replicas, ISRs, leaders)."""
    brokers = sorted(sim.brokers)
    assignment = [
        [brokers[p % len(brokers)], brokers[(p + 1) % len(brokers)]] for p in range(BULK_PARTITIONS)
    ]
    topic = cpb.CreatableTopic(name="big-assigned")
    for partition_id in reversed(range(BULK_PARTITIONS)):  # any order: entries name their partition
        topic.assignments.add(partition=partition_id, broker_ids=assignment[partition_id])
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
    before = sim.leader_image()
    unsliced = ControllerLogic(
        ControllerSettings(CLUSTER, max_changes_per_write=10 * BULK_PARTITIONS), before, 0
    )
    expected = unsliced.create_topics(request, before.offset + 1)
    assert expected.response.topics[0].error_code == ErrorCode.NONE
    expected_topic = unsliced.image.topic("big-assigned")
    assert expected_topic is not None
    target = sim.active_controller()
    assert target is not None
    sim.controllers[target[0]].loop.create_task(target[1].create_topics(request))
    sim._sync_controllers()

    def written(image: MetadataImage) -> int:
        found = image.topic("big-assigned")
        count = 0 if found is None else len(found.partitions)
        if 0 < count < BULK_PARTITIONS and not image.transaction.startswith(CREATE_TOPIC_TRANSACTION):
            raise InvariantViolation(f"seed {sim.seed}: a partial topic outside its transaction")
        return count

    _crash_active_mid_way(sim, written, "the explicit big topic")
    sim.run_until_condition(
        lambda: not sim.leader_image().transaction and written(sim.leader_image()) == 0,
        BOUND_MS,
        "the partial topic removed and its transaction closed",
    )
    _request_until(
        sim,
        "big-assigned",
        lambda c: c.create_topics(request),
        lambda: written(sim.leader_image()) == BULK_PARTITIONS and not sim.leader_image().transaction,
    )
    created = sim.leader_image().topic("big-assigned")
    assert created is not None
    if created.partitions != expected_topic.partitions:
        raise InvariantViolation(
            f"seed {sim.seed}: the retried topic differs from the unsliced one: {created.partitions} != "
            f"{expected_topic.partitions}"
        )
    sim.wait_all_active("brokers active after the failover")
    sim.check_identical_images()


def scenario_prepared_topics_are_whole_after_failover(sim: ControllerSimulation) -> None:
    """One CreateTopics of BULK_PARTITIONS / 4 topics of 4 partitions, each prepared (placed, its records
    built) in bounded events and written in one append, paced by commits; the active controller crashes
    when some are written.  Each topic is there complete or not at all; the client's retry creates the
    rest (that prepared topics equal unsliced ones is tests/unit/metadata/test_sliced_topics.py's)."""
    names = [f"prep-{i}" for i in range(BULK_PARTITIONS // 4)]
    create = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        topics=[cpb.CreatableTopic(name=n, num_partitions=4, replication_factor=2) for n in names],
    )

    def existing(image: MetadataImage) -> int:
        count = 0
        for name in names:
            topic = image.topic(name)
            if topic is None:
                continue
            if len(topic.partitions) != 4 or any(len(set(p.replicas)) != 2 for p in topic.partitions):
                raise InvariantViolation(f"seed {sim.seed}: topic {name} is partly written: {topic}")
            count += 1
        return count

    target = sim.active_controller()
    assert target is not None
    sim.controllers[target[0]].loop.create_task(target[1].create_topics(create))
    sim._sync_controllers()
    _crash_active_mid_way(sim, lambda image: existing(image) * 4, "the prepared topics")
    _request_until(
        sim, "prepared", lambda c: c.create_topics(create), lambda: existing(sim.leader_image()) == len(names)
    )
    sim.wait_all_active("brokers active after the failover")
    sim.check_identical_images()


SCENARIOS = {
    "sliced_big_topic_resumes_after_failover": scenario_sliced_big_topic_resumes_after_failover,
    "prepared_topics_are_whole_after_failover": scenario_prepared_topics_are_whole_after_failover,
    "sliced_explicit_big_topic_is_undone_and_retried_after_failover": (
        scenario_sliced_explicit_big_topic_is_undone_and_retried_after_failover
    ),
    "sliced_topic_requests_finish_after_failover": scenario_sliced_topic_requests_finish_after_failover,
    "sliced_controlled_shutdown_resumes_after_failover": (
        scenario_sliced_controlled_shutdown_resumes_after_failover
    ),
    "sliced_unfence_elections_resume_after_failover": scenario_sliced_unfence_elections_resume_after_failover,
    "failover_never_fences_live_brokers": scenario_failover_never_fences_live_brokers,
    "unclean_reregistration_leaves_every_elr_across_failover": (
        scenario_unclean_reregistration_leaves_every_elr_across_failover
    ),
    "offline_dir_replica_never_elected_across_failover": (
        scenario_offline_dir_replica_never_elected_across_failover
    ),
    "partitioned_controller_loses_its_pending_state": scenario_partitioned_controller_loses_its_pending_state,
    "deposed_controller_never_acknowledges_its_write": (
        scenario_deposed_controller_never_acknowledges_its_write
    ),
    "paused_controller_never_acknowledges_an_overwritten_write": (
        scenario_paused_controller_never_acknowledges_an_overwritten_write
    ),
    "partitioned_broker_is_fenced_within_the_session_timeout": (
        scenario_partitioned_broker_is_fenced_within_the_session_timeout
    ),
    "zombie_broker_is_rejected_by_epoch": scenario_zombie_broker_is_rejected_by_epoch,
}


def run_scenario(name: str, seed: int) -> None:
    sim = _started(seed)
    try:
        SCENARIOS[name](sim)
    finally:
        sim.close()


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_controller_scenario_holds_for_every_seed(name: str, sim_seeds: list[int]) -> None:
    seeds = sim_seeds if len(sim_seeds) == 1 else sim_seeds[:CONTROLLER_SEEDS]
    for seed in seeds:
        try:
            run_scenario(name, seed)
        except (InvariantViolation, AssertionError, KraftError) as exc:
            replay = f"pytest tests/sim -k {name} --seed {seed}"
            pytest.fail(f"scenario {name} failed with seed {seed}: {exc}\nreplay: {replay}")
