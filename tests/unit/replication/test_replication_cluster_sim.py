"""A seeded, message-level simulation of one partition on three brokers and a controller (issue #16).

Where ``test_replication_simulation.py`` steps the pure rules atomically, this one runs them the way the
broker shell does (``kraft/broker/replication.py``), on a virtual clock with a seeded event queue:

- every interaction is a message with a random delay over a network that can be **partitioned** (a cut
  link drops what is sent or delivered while it is cut) — heartbeats, follower fetches and their answers,
  AlterPartition and its answer, produce requests;
- brokers act on **stale metadata**: they learn the partition (LeaderAndIsr) only from heartbeat answers;
- the leader's appends are flushed **asynchronously** (a crash before the flush loses them) and only its
  flushed end counts (``on_leader_end_offset``); fetches serve the leader's whole log, **unflushed
  batches included** (so a follower may hold, even durably, records the leader loses in a crash);
  followers append, flush once caught up (or at random while behind, as the broker's
  ``catch_up_flush_bytes``) and report their flushed end as the durable position their fetch counts at;
- followers check ``diverging_epoch`` at fetch time and truncate with ``next_truncation_step``; a fetch
  answer is applied only if the follower's epoch and log end did not change while it was in flight;
- the controller fences a broker whose heartbeats stop (out of the ISR; a new leader from the ISR, else
  from the eligible leader replicas — KIP-966, kraft's own ``partition_change.target_state`` with
  min.insync.replicas 2), fences and removes a re-registered broker (new broker epoch: a crash keeps the
  flushed log, so it stays eligible as kraft's incarnation rule says), unfences on a heartbeat and brings
  an offline partition back with an ISR or ELR member, and answers AlterPartition with
  ``validate_alter_partition`` (Kafka's KIP-497 epochs, or kraft's bump-on-every-change) and the ELR
  ``eligible_after`` gives; leaders freeze their HWM below min ISR (``set_min_isr``);
- **crashes** (the unflushed tail is lost, a new broker epoch at restart) and **network partitions** are
  drawn from the seed; acks=all produces (min.insync.replicas 2) run throughout.

Checked after every event (a violation names the seed, so any failure replays exactly):
- every record answered NONE to acks=all is at its offset, flushed, on every ISR member and the leader;
- no offset ever holds two different records below a high watermark on any replica (the first record
  seen below any HWM at an offset is the only one any replica may hold there below its HWM);
- no two acknowledged records share an offset; no truncation is refused below a high watermark.
At the end the network heals and every broker restarts: the ISR is full again, the replicas are equal up
to the high watermark, which reaches the leader's end, and every acknowledged record is in it.

Mutation checks: a controller that elects outside the ISR and ELR (unclean election), followers that
fetch without their last epoch (so never truncate a diverged tail) and leaders that advance the HWM below
min ISR (what makes an ELR member a safe leader) must be caught within a few seeds.
``KRAFT_REPLICATION_SIM_SEEDS`` runs more seeds (12 by default).
"""

from __future__ import annotations

import functools
import heapq
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from replication_worlds import entries_of

from kraft.errors import ErrorCode
from kraft.metadata.image import PartitionRegistration
from kraft.metadata.partition_change import eligible_after, target_state
from kraft.replication.acks import Acks, AcksAllWaiters, Completion, admit_produce
from kraft.replication.alter_partition import BrokerStatus, IsrChange, validate_alter_partition
from kraft.replication.epochs import UNDEFINED_EPOCH, EpochEndOffset, diverging_epoch, with_leader_epoch
from kraft.replication.leader_state import AlterPartitionFollowUp, PartitionLeaderState
from kraft.replication.truncation import TruncationKind, next_truncation_step
from kraft.replication.types import AlterPartitionRequest, LeaderAndIsr

CONTROLLER = 0
BROKERS = (1, 2, 3)
MIN_ISR = 2
HEARTBEAT_MS = 50
SESSION_MS = 300
LAG_MS = 200
TICK_MS = 10
FETCH_BACKOFF_MS = 20
PRODUCE_TIMEOUT_MS = 800
ALTER_RETRY_MS = 150
RUN_MS = 20_000
HEAL_MS = 6_000
SEEDS = int(os.environ.get("KRAFT_REPLICATION_SIM_SEEDS", "12"))


class Violation(AssertionError):
    pass


@dataclass
class Broker:
    id: int
    broker_epoch: int
    alive: bool = True
    incarnation: int = 0
    log: list[tuple[int, int]] = field(default_factory=list)  # (leader epoch, record id) per offset
    flushed: int = 0
    hwm: int = 0  # the leader's HWM, or what a follower learned (the checkpoint survives crashes)
    view: LeaderAndIsr | None = None
    state: PartitionLeaderState | None = None
    waiters: AcksAllWaiters = field(default_factory=AcksAllWaiters)
    requests: dict[int, list[tuple[int, int]]] = field(default_factory=dict)  # request → (offset, id)
    flush_scheduled: bool = False
    fetching: bool = False
    fetch_seq: int = 0  # the fetch in flight (a timeout ends only that one)
    retry_at: int = 0
    next_heartbeat: int = 0
    next_shrink_check: int = 0
    shrinks: int = 0  # times the log lost a tail (crash, truncation): the invariant checks start over
    checked: int = 0  # offsets below this were compared with ``Sim.committed``

    def entries(self) -> tuple[tuple[int, int], ...]:
        return entries_of([epoch for epoch, _ in self.log])


@dataclass
class Controller:
    partition: LeaderAndIsr
    registered: dict[int, int]  # broker id → registered broker epoch
    fenced: dict[int, bool]
    last_heartbeat: dict[int, int]
    elr: tuple[int, ...] = ()  # KIP-966 eligible leader replicas
    last_known_elr: tuple[int, ...] = ()


@dataclass
class Sim:
    seed: int
    bump_leader_epoch_always: bool = False
    unclean: bool = False  # mutation: elect any unfenced replica when the ISR has none
    skip_divergence_check: bool = False  # mutation: followers fetch without their last epoch (no truncation)
    no_hwm_freeze: bool = False  # mutation: leaders advance the HWM below min ISR (unsafe with ELR)
    count_unflushed: bool = False  # mutation: the leader counts its appended end, not its flushed end
    now: int = 0
    rng: random.Random = field(init=False)
    queue: list[tuple[int, int, Callable[[], None]]] = field(default_factory=list)
    seq: int = 0
    cut: set[frozenset[int]] = field(default_factory=set)
    brokers: dict[int, Broker] = field(init=False)
    controller: Controller = field(init=False)
    next_record: int = 0
    next_request: int = 0
    acknowledged: dict[int, int] = field(default_factory=dict)  # offset → record id
    committed: dict[int, int] = field(default_factory=dict)  # offset → first record seen below a HWM
    new_acks: list[tuple[int, int]] = field(default_factory=list)  # acknowledged since the last check
    ack_checked: dict[int, int] = field(default_factory=dict)  # holder → its ``shrinks`` at the full check
    faults: bool = True
    stats: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.rng = random.Random(self.seed)
        self.brokers = {b: Broker(b, broker_epoch=100 * b) for b in BROKERS}
        initial = LeaderAndIsr(1, 0, 0, BROKERS, BROKERS)
        self.controller = Controller(
            initial, {b: 100 * b for b in BROKERS}, dict.fromkeys(BROKERS, False), dict.fromkeys(BROKERS, 0)
        )
        for b in BROKERS:
            self._apply_metadata(self.brokers[b], initial)

    # --- the event queue and the network -------------------------------------------------------------

    def at(self, time: int, action: Callable[[], None]) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (time, self.seq, action))

    def linked(self, a: int, b: int) -> bool:
        return frozenset((a, b)) not in self.cut

    def send(self, src: int, dst: int, deliver: Callable[[], None]) -> None:
        """Deliver after 1-6 ms unless the link is cut at either end of the trip or ``dst`` restarted."""
        if not self.linked(src, dst):
            return
        incarnation = self.brokers[dst].incarnation if dst in self.brokers else 0

        def arrive() -> None:
            if not self.linked(src, dst):
                return
            if dst in self.brokers:
                target = self.brokers[dst]
                if not target.alive or target.incarnation != incarnation:
                    return
            deliver()

        self.at(self.now + self.rng.randint(1, 6), arrive)

    def fail(self, message: str) -> None:
        raise Violation(f"seed {self.seed} at {self.now} ms: {message}")

    # --- controller ----------------------------------------------------------------------------------

    def _commit(self, p: LeaderAndIsr) -> None:
        self.controller.partition = p

    def _change(self, isr: tuple[int, ...], leader: int) -> None:
        p = self.controller.partition
        if isr == p.isr and leader == p.leader:
            return
        bump = leader != p.leader or self.bump_leader_epoch_always
        self._commit(LeaderAndIsr(leader, p.leader_epoch + int(bump), p.partition_epoch + 1, p.replicas, isr))

    def _registration(self) -> PartitionRegistration:
        c = self.controller
        p = c.partition
        return PartitionRegistration(
            p.replicas, p.isr, p.leader, p.leader_epoch, p.partition_epoch, c.elr, c.last_known_elr
        )

    def _elect(self, remove: int | None) -> None:
        """kraft's election rules (ISR, else ELR; ``unclean``: else any unfenced replica)."""
        c = self.controller
        before = self._registration()
        target = target_state(
            before,
            lambda r: not c.fenced[r],
            remove_from_isr=remove,
            min_isr=MIN_ISR,
            unclean_election=self.unclean,
        )
        c.elr, c.last_known_elr = target.elr, target.last_known_elr
        if (
            target.leader not in (-1, before.leader)
            and target.leader not in before.isr
            and not target.unclean
        ):
            self.stats["elr_elections"] = self.stats.get("elr_elections", 0) + 1
        self._change(target.isr, target.leader)

    def _fence(self, b: int, reason: str) -> None:
        self.controller.fenced[b] = True
        self._elect(b)
        self.stats[reason] = self.stats.get(reason, 0) + 1

    def controller_heartbeat(self, b: int, broker_epoch: int) -> None:
        c = self.controller
        if broker_epoch > c.registered[b]:  # a restarted broker re-registers: fenced, out of the ISR
            c.registered[b] = broker_epoch
            self._fence(b, "reregistered")
        elif broker_epoch < c.registered[b]:
            return
        c.last_heartbeat[b] = self.now
        if c.fenced[b]:
            c.fenced[b] = False
            if c.partition.leader == -1:  # an offline partition's election (kraft's rejoin path)
                self._elect(None)
        p = c.partition
        self.send(CONTROLLER, b, lambda: self._apply_metadata(self.brokers[b], p))

    def controller_session_check(self) -> None:
        c = self.controller
        for b in BROKERS:
            if not c.fenced[b] and self.now - c.last_heartbeat[b] > SESSION_MS:
                self._fence(b, "session_expired")

    def controller_alter_partition(self, leader: int, request: AlterPartitionRequest) -> None:
        c = self.controller
        statuses = {b: BrokerStatus(c.registered[b], fenced=c.fenced[b]) for b in BROKERS}
        result = validate_alter_partition(request, c.partition, statuses)
        answer: LeaderAndIsr | ErrorCode
        if isinstance(result, IsrChange):
            elr, lke = eligible_after(self._registration(), result.new_isr, MIN_ISR)
            c.elr, c.last_known_elr = tuple(elr), tuple(lke)
            if result.changed:
                p = c.partition
                bump = int(self.bump_leader_epoch_always)
                self._commit(
                    LeaderAndIsr(
                        p.leader, p.leader_epoch + bump, p.partition_epoch + 1, p.replicas, result.new_isr
                    )
                )
                self.stats["isr_changes"] = self.stats.get("isr_changes", 0) + 1
            answer = c.partition
        else:
            answer = result.error
        self.send(CONTROLLER, leader, lambda: self._alter_answered(self.brokers[leader], request, answer))

    # --- brokers: metadata ---------------------------------------------------------------------------

    def _apply_metadata(self, broker: Broker, p: LeaderAndIsr) -> None:
        if broker.view is not None and p.partition_epoch <= broker.view.partition_epoch:
            return
        broker.view = p
        if p.leader == broker.id:
            if broker.state is None or broker.state.leader_epoch != p.leader_epoch:
                self._drop_leadership(broker)
                broker.state = PartitionLeaderState(
                    broker.id,
                    p,
                    leader_end_offset=broker.flushed,
                    high_watermark=min(broker.hwm, broker.flushed),
                    now_ms=self.now,
                    broker_epoch=broker.broker_epoch,
                    min_isr=1 if self.no_hwm_freeze else MIN_ISR,
                )
                if len(broker.log) > broker.flushed:
                    self._schedule_flush(broker)
            elif broker.state.on_metadata(p, self.now):
                self._hwm_moved(broker)
            else:
                self._drop_leadership(broker)
        else:
            self._drop_leadership(broker)
            broker.retry_at = 0

    def _drop_leadership(self, broker: Broker) -> None:
        if broker.state is not None:
            broker.waiters.fail_all(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            broker.requests.clear()
            broker.state = None

    # --- brokers: the leader -------------------------------------------------------------------------

    def produce(self, broker: Broker, count: int) -> None:
        state = broker.state
        if state is None or admit_produce(Acks.ALL, len(state.isr), MIN_ISR) is not ErrorCode.NONE:
            return
        records = []
        for _ in range(count):
            records.append((len(broker.log), self.next_record))
            broker.log.append((state.leader_epoch, self.next_record))
            self.next_record += 1
        request = self.next_request
        self.next_request += 1
        broker.requests[request] = records
        if self.count_unflushed and state.on_leader_end_offset(len(broker.log)):
            self._hwm_moved(broker)
        self._schedule_flush(broker)
        done = broker.waiters.add(
            request, len(broker.log), self.now + PRODUCE_TIMEOUT_MS, state.high_watermark,
            len(state.maximal_isr), MIN_ISR,
        )  # fmt: skip
        self._answer(broker, done)

    def _schedule_flush(self, broker: Broker) -> None:
        if broker.flush_scheduled:
            return
        broker.flush_scheduled = True
        incarnation = broker.incarnation

        def flush() -> None:
            if not broker.alive or broker.incarnation != incarnation:
                return
            broker.flush_scheduled = False
            broker.flushed = len(broker.log)
            if broker.state is not None and broker.state.on_leader_end_offset(broker.flushed):
                self._hwm_moved(broker)

        # Sometimes slower than a fetch round trip: followers then hold (and flush) what the leader has
        # not flushed yet, the case serving unflushed batches creates.
        self.at(self.now + self.rng.randint(0, 12), flush)

    def _hwm_moved(self, broker: Broker) -> None:
        state = broker.state
        assert state is not None
        broker.hwm = max(broker.hwm, state.high_watermark)
        self._answer(
            broker, broker.waiters.on_high_watermark(state.high_watermark, len(state.maximal_isr), MIN_ISR)
        )

    def _answer(self, broker: Broker, completions: list[Completion]) -> None:
        for completion in completions:
            records = broker.requests.pop(completion.request_id, [])
            if completion.error is not ErrorCode.NONE:
                continue
            for offset, record in records:
                if self.acknowledged.get(offset, record) != record:
                    self.fail(
                        f"offset {offset} acknowledged for records {self.acknowledged[offset]} and {record}"
                    )
                self.acknowledged[offset] = record
                self.new_acks.append((offset, record))

    def serve_fetch(
        self,
        leader: Broker,
        follower: int,
        broker_epoch: int,
        epoch: int,
        offset: int,
        last: int,
        durable: int,
    ) -> None:
        state = leader.state
        target = self.brokers[follower]

        def reply(
            error: ErrorCode,
            diverged: EpochEndOffset | None = None,
            records: list[tuple[int, int]] | None = None,
            hwm: int = 0,
        ) -> None:
            leader_end = len(leader.log)
            self.send(
                leader.id,
                follower,
                lambda: self.fetched(target, epoch, offset, error, diverged, records, hwm, leader_end),
            )

        if state is None:
            reply(ErrorCode.NOT_LEADER_OR_FOLLOWER)
            return
        error = state.check_fetch_epoch(follower, epoch)
        if error is not ErrorCode.NONE:
            reply(error)
            return
        end = len(leader.log)
        if last != UNDEFINED_EPOCH:
            entries = with_leader_epoch(leader.entries(), state.leader_epoch, end)
            diverged = diverging_epoch(entries, end, offset, last)
            if diverged is not None:
                reply(ErrorCode.NONE, diverged)
                return
        if offset > end:
            reply(ErrorCode.OFFSET_OUT_OF_RANGE)
            return
        # The follower counts at its durable position; the leader's whole log bounds the fetch offset.
        result = state.on_follower_fetch(
            follower, min(durable, offset), epoch, self.now, broker_epoch, leader_log_end=end
        )
        if result.error is not ErrorCode.NONE:
            reply(result.error)
            return
        if result.high_watermark_advanced:
            self._hwm_moved(leader)
        joining = state.isr_expand_candidates(lambda r, e: e == self.brokers[r].broker_epoch)
        if joining:
            self._propose(leader, (*state.isr, min(joining)))
        # Unflushed batches are served too (Kafka's followers fetch from the leader's log end).
        records = leader.log[offset : min(end, offset + self.rng.randint(1, 6))]
        reply(ErrorCode.NONE, None, records, state.high_watermark)

    def _propose(self, leader: Broker, isr: tuple[int, ...]) -> None:
        state = leader.state
        if state is None or state.pending is not None:
            return
        request = state.propose_isr(isr)
        self._send_alter(leader, state, request)

    def _send_alter(
        self, leader: Broker, state: PartitionLeaderState, request: AlterPartitionRequest
    ) -> None:
        self.send(leader.id, CONTROLLER, lambda: self.controller_alter_partition(leader.id, request))

        def retry() -> None:  # the answer was lost: resend while it is still the pending proposal
            if leader.alive and leader.state is state and state.pending is request:
                self._send_alter(leader, state, request)

        self.at(self.now + ALTER_RETRY_MS, retry)

    def _alter_answered(
        self, leader: Broker, request: AlterPartitionRequest, answer: LeaderAndIsr | ErrorCode
    ) -> None:
        state = leader.state
        if state is None:
            return
        before = state.high_watermark
        if state.on_alter_partition_response(request, answer) is AlterPartitionFollowUp.RETRY:
            self._send_alter(leader, state, request)
        if state.high_watermark > before:
            self._hwm_moved(leader)

    # --- brokers: the follower -----------------------------------------------------------------------

    def fetched(
        self,
        follower: Broker,
        epoch: int,
        offset: int,
        error: ErrorCode,
        diverged: EpochEndOffset | None = None,
        records: list[tuple[int, int]] | None = None,
        hwm: int = 0,
        leader_end: int = 0,
    ) -> None:
        follower.fetching = False
        view = follower.view
        if (
            view is None
            or follower.state is not None
            or view.leader_epoch != epoch
            or len(follower.log) != offset
        ):
            return  # something changed while the fetch was in flight
        if error is not ErrorCode.NONE:
            follower.retry_at = self.now + FETCH_BACKOFF_MS
            return
        if diverged is not None:
            step = next_truncation_step(
                follower.entries(), len(follower.log), min(follower.hwm, len(follower.log)), diverged
            )
            if step.kind is TruncationKind.BELOW_HIGH_WATERMARK:
                self.fail(f"broker {follower.id} refused a truncation below its high watermark: {step}")
            del follower.log[step.offset :]
            follower.flushed = min(follower.flushed, len(follower.log))
            follower.shrinks += 1
            follower.checked = min(follower.checked, len(follower.log))
            self.stats["truncations"] = self.stats.get("truncations", 0) + 1
            return
        follower.log.extend(records or [])
        # Flushed once caught up with the leader's log end (so acks=all never waits on it), and now and
        # then while behind (the broker: every catch_up_flush_bytes); the next fetch reports it.
        if len(follower.log) >= leader_end or self.rng.random() < 0.5:
            follower.flushed = len(follower.log)
        follower.hwm = max(follower.hwm, min(hwm, len(follower.log)))

    def broker_tick(self, broker: Broker) -> None:
        if not broker.alive:
            return
        if self.now >= broker.next_heartbeat:
            broker.next_heartbeat = self.now + HEARTBEAT_MS
            registered = broker.broker_epoch
            self.send(broker.id, CONTROLLER, lambda: self.controller_heartbeat(broker.id, registered))
        view = broker.view
        following = view is not None and view.leader not in (-1, broker.id) and broker.state is None
        if view is not None and following and not broker.fetching and self.now >= broker.retry_at:
            broker.fetching = True
            broker.fetch_seq += 1
            seq = broker.fetch_seq
            leader = self.brokers[view.leader]
            offset = len(broker.log)
            last = broker.log[-1][0] if broker.log and not self.skip_divergence_check else UNDEFINED_EPOCH
            epoch, broker_epoch, durable = view.leader_epoch, broker.broker_epoch, broker.flushed
            self.send(
                broker.id,
                leader.id,
                lambda: self.serve_fetch(leader, broker.id, broker_epoch, epoch, offset, last, durable),
            )
            # A lost request or answer: fetch again after a timeout.
            self.at(self.now + 4 * HEARTBEAT_MS, lambda: self._fetch_timeout(broker, seq))
        state = broker.state
        if state is not None:
            self._answer(broker, broker.waiters.expire(self.now))
            if self.now >= broker.next_shrink_check:
                broker.next_shrink_check = self.now + LAG_MS // 2
                lagging = state.isr_shrink_candidates(self.now, LAG_MS)
                if lagging:
                    self._propose(broker, tuple(r for r in state.isr if r not in lagging))

    def _fetch_timeout(self, broker: Broker, seq: int) -> None:
        if broker.fetch_seq == seq:
            broker.fetching = False

    # --- faults --------------------------------------------------------------------------------------

    def crash(self, broker: Broker) -> None:
        if not broker.alive:
            return
        broker.alive = False
        broker.incarnation += 1
        del broker.log[broker.flushed :]
        broker.hwm = min(broker.hwm, len(broker.log))
        broker.shrinks += 1
        broker.checked = min(broker.checked, len(broker.log))
        self._drop_leadership(broker)
        broker.view = None
        broker.fetching = broker.flush_scheduled = False
        self.stats["crashes"] = self.stats.get("crashes", 0) + 1

    def restart(self, broker: Broker) -> None:
        if broker.alive:
            return
        broker.alive = True
        broker.broker_epoch += 1
        broker.next_heartbeat = broker.retry_at = 0

    def fault(self) -> None:
        if not self.faults:
            return
        kind = self.rng.choice(["crash", "crash", "isolate", "isolate", "split"])
        duration = self.rng.randint(50, 1_500)
        if kind == "crash":
            broker = self.brokers[self.rng.choice(BROKERS)]
            self.crash(broker)
            self.at(self.now + duration, lambda: self.restart(broker))
        else:
            nodes = (CONTROLLER, *BROKERS)
            if kind == "isolate":
                lone = self.rng.choice(nodes)
                links = {frozenset((lone, n)) for n in nodes if n != lone}
            else:
                side = set(self.rng.sample(nodes, 2))
                links = {frozenset((a, b)) for a in side for b in nodes if b not in side}
            added = links - self.cut
            self.cut |= added
            self.at(self.now + duration, lambda: self.cut.difference_update(added))
            self.stats["partitions"] = self.stats.get("partitions", 0) + 1

    # --- invariants ----------------------------------------------------------------------------------

    def check(self) -> None:
        """The invariants, incrementally: a holder is checked in full when it joins the ISR or its log lost
        a tail, else only against the records acknowledged since the last check (equivalent: nothing
        else can change what it holds)."""
        p = self.controller.partition
        holders = set(p.isr) | ({p.leader} - {-1})
        for b in list(self.ack_checked):
            if b not in holders:
                del self.ack_checked[b]
        for b in holders:
            broker = self.brokers[b]
            full = self.ack_checked.get(b) != broker.shrinks
            for offset, record in self.acknowledged.items() if full else self.new_acks:
                if offset >= broker.flushed or broker.log[offset][1] != record:
                    self.fail(
                        f"acknowledged record {record} at {offset} missing on ISR member {b} (ISR {p.isr})"
                    )
            self.ack_checked[b] = broker.shrinks
        self.new_acks.clear()
        for broker in self.brokers.values():
            below = min(broker.hwm, len(broker.log))
            if broker.state is not None:
                below = min(below, broker.state.high_watermark)
            for offset in range(min(broker.checked, below), below):
                record = broker.log[offset][1]
                first = self.committed.setdefault(offset, record)
                if first != record:
                    self.fail(
                        f"offset {offset} holds {record} on {broker.id} below its HWM, {first} elsewhere"
                    )
            broker.checked = max(broker.checked, below)

    # --- running -------------------------------------------------------------------------------------

    def run(self) -> None:
        for broker in self.brokers.values():
            self._every(TICK_MS, functools.partial(self.broker_tick, broker))
        self._every(50, self.controller_session_check)
        self._every(15, self._client)
        self._every(400, self.fault, jitter=400)
        self._until(RUN_MS)
        # Heal: no new faults, the network whole, every broker up; then the cluster must converge.
        self.faults = False
        self.cut.clear()
        for broker in self.brokers.values():
            self.restart(broker)
        self._until(RUN_MS + HEAL_MS)
        self.check_final()

    def _every(self, period: int, action: Callable[[], None], jitter: int = 0) -> None:
        def again() -> None:
            action()
            self.at(self.now + period + (self.rng.randint(0, jitter) if jitter else 0), again)

        self.at(self.now + self.rng.randint(0, period), again)

    def _client(self) -> None:
        if not self.faults and self.now > RUN_MS + HEAL_MS // 2:
            return  # the last part of the heal is quiet, so everything can commit
        # Sent to the broker the client believes leads: usually the controller's, sometimes a stale one.
        target = self.controller.partition.leader
        if target == -1 or self.rng.random() < 0.2:
            target = self.rng.choice(BROKERS)
        count = self.rng.randint(1, 3)
        self.send(CONTROLLER, target, lambda: self.produce(self.brokers[target], count))

    def _until(self, end: int) -> None:
        while self.queue and self.queue[0][0] <= end:
            self.now, _, action = heapq.heappop(self.queue)
            action()
            self.check()
        self.now = end

    def check_final(self) -> None:
        p = self.controller.partition
        if p.leader == -1 or sorted(p.isr) != list(BROKERS):
            self.fail(f"after healing the partition is {p}")
        leader = self.brokers[p.leader]
        assert leader.state is not None
        end = len(leader.log)
        if leader.state.high_watermark != end:
            self.fail(f"after healing the HWM {leader.state.high_watermark} is below the leader's end {end}")
        for broker in self.brokers.values():
            if broker.log != leader.log:
                self.fail(f"after healing broker {broker.id}'s log differs from the leader's")
        for offset, record in self.acknowledged.items():
            if leader.log[offset][1] != record:
                self.fail(f"acknowledged record {record} at {offset} is not in the final log")


def run(
    seed: int,
    *,
    bump: bool = False,
    unclean: bool = False,
    skip_divergence_check: bool = False,
    no_hwm_freeze: bool = False,
    count_unflushed: bool = False,
) -> Sim:
    sim = Sim(seed, bump, unclean, skip_divergence_check, no_hwm_freeze, count_unflushed)
    sim.run()
    return sim


@pytest.mark.parametrize("bump", [False, True], ids=["kafka-epochs", "bump-on-every-change"])
def test_no_acknowledged_record_is_lost_and_no_offset_diverges_below_the_hwm(bump: bool) -> None:
    acknowledged = crashes = partitions = truncations = elr_elections = 0
    for seed in range(SEEDS):
        sim = run(seed, bump=bump)
        acknowledged += len(sim.acknowledged)
        crashes += sim.stats.get("crashes", 0)
        partitions += sim.stats.get("partitions", 0)
        truncations += sim.stats.get("truncations", 0)
        elr_elections += sim.stats.get("elr_elections", 0)
    # Guards against passing vacuously: the runs acknowledge, crash, partition, truncate and elect from
    # the ELR.
    assert acknowledged > 100 * SEEDS and crashes > 5 * SEEDS and partitions > 5 * SEEDS
    assert truncations > 0 and elr_elections > 0


def test_a_run_replays_exactly_from_its_seed() -> None:
    first, second = run(7), run(7)
    assert first.acknowledged == second.acknowledged and first.stats == second.stats
    assert {b: x.log for b, x in first.brokers.items()} == {b: x.log for b, x in second.brokers.items()}


def _first_violation(
    *,
    unclean: bool = False,
    skip_divergence_check: bool = False,
    no_hwm_freeze: bool = False,
    count_unflushed: bool = False,
) -> str | None:
    for seed in range(60):
        try:
            run(
                seed,
                unclean=unclean,
                skip_divergence_check=skip_divergence_check,
                no_hwm_freeze=no_hwm_freeze,
                count_unflushed=count_unflushed,
            )
        except Violation as violation:
            return str(violation)
    return None


def test_the_simulation_catches_unclean_leader_election() -> None:
    found = _first_violation(unclean=True)
    assert found is not None and "after healing" not in found, found


def test_the_simulation_catches_followers_that_skip_the_divergence_check() -> None:
    found = _first_violation(skip_divergence_check=True)
    assert found is not None and "after healing" not in found, found  # a safety violation, not liveness


def test_the_simulation_catches_a_high_watermark_advancing_below_min_isr() -> None:
    """KIP-966's broker rule is what makes an ELR member a safe leader: without it, a leader alone in the
    ISR moves the HWM past what the eligible replicas hold, and electing one of them loses it."""
    found = _first_violation(no_hwm_freeze=True)
    assert found is not None and "after healing" not in found, found


def test_the_simulation_catches_a_leader_that_counts_its_unflushed_end() -> None:
    # Fetches serve unflushed batches, so only the flushed end may count: a leader counting what it
    # appended acknowledges records that its crash then loses.
    found = _first_violation(count_unflushed=True)
    assert found is not None and "after healing" not in found, found
