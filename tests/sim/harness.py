"""Deterministic whole-cluster simulation of the Raft core (no asyncio, no IO).

A :class:`Simulation` runs N :class:`~kraft.raft.core.RaftCore` instances on a seeded event queue with a
virtual clock.  Each :class:`SimNode` executes its core's effects with the production driver's executor,
:func:`kraft.raft.executor.execute_output` (one order of effects for both), through ports over an
in-memory log that loses unflushed batches on a crash; a flush completes 0-2 virtual ms later, with other
events in between (a slow disk).  A :class:`Router` delivers messages with random delay and applies network
filters (isolate, one-way drop, random drop, duplicate, reorder through jitter).

Invariants are checked after **every** event (:meth:`Simulation.check_invariants`); any violation raises
:class:`InvariantViolation` naming the seed.  :meth:`Simulation.check_final` heals everything and checks
that committed data is identical on every node and no acknowledged append was lost.

The state machine of every node is a list of committed values indexed by offset (``None`` for control
records); snapshots hold that list.  Batches travel as pickled tuples — the byte format is the driver's
business and is tested there; pickle keeps the simulation fast.
"""

from __future__ import annotations

import bisect
import heapq
import pickle
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, ClassVar

from kraft.raft.api import LeaderAndEpoch
from kraft.raft.core import RaftCore
from kraft.raft.core_log import EpochEntry, LogMeta
from kraft.raft.core_output import (
    AppendFetched,
    AppendLeaderChange,
    AppendRecords,
    AppendVoters,
    InstallSnapshot,
    LogOp,
    Outbound,
    OutboundRequest,
    OutboundResponse,
    Output,
    TruncateTo,
    WriteSnapshotChunk,
)
from kraft.raft.core_types import BatchInfo, RaftConfig
from kraft.raft.executor import OutputPorts, execute_output_now
from kraft.raft.messages import (
    NO_LEADER,
    FetchResponse,
    FetchSnapshotResponse,
    RaftRequest,
    RaftResponse,
    SnapshotId,
    VoteRequest,
    VoteResponse,
)
from kraft.raft.state import ElectionState, StateKind
from kraft.raft.voters import Voter, VoterSet, VoterSetHistory

SimValue = bytes | VoterSet | None
"""A record: data bytes, a VotersRecord (the voter set itself), or ``None`` for other control records."""

SimBatch = tuple[int, int, int, tuple[SimValue, ...]]
"""(base_offset, last_offset, epoch, values)."""


class InvariantViolation(AssertionError):
    pass


def encode_batches(batches: list[SimBatch]) -> bytes:
    return pickle.dumps(batches, protocol=pickle.HIGHEST_PROTOCOL)


_last_decoded: list[tuple[bytes, tuple[SimBatch, ...]]] = []
"""The bytes :func:`decode_batches` read last and what they held: a follower's core scans fetched bytes
(``scan_batches``) and the same bytes object comes back to be written (``AppendFetched``)."""


def decode_batches(data: bytes) -> tuple[SimBatch, ...]:
    if _last_decoded and _last_decoded[0][0] is data:
        return _last_decoded[0][1]
    batches: tuple[SimBatch, ...] = tuple(pickle.loads(data))
    _last_decoded[:] = [(data, batches)]
    return batches


def batch_voters(values: tuple[SimValue, ...]) -> VoterSet | None:
    """The batch's last VotersRecord (None: it has none)."""
    for value in reversed(values):
        if isinstance(value, VoterSet):
            return value
    return None


def scan_batches(data: bytes) -> list[BatchInfo]:
    return [
        BatchInfo(base, last, epoch, batch_voters(values))
        for base, last, epoch, values in decode_batches(data)
    ]


def sim_config(node_id: int, voters: tuple[int, ...], directory_id: str = "", **overrides: int) -> RaftConfig:
    """Timings scaled down ~20x from Kafka's defaults so a run covers many elections quickly."""
    settings: dict[str, Any] = {  # Any: RaftConfig(**settings) fills int fields only
        "election_timeout_ms": 50,
        "fetch_timeout_ms": 100,
        "election_backoff_max_ms": 50,
        "election_backoff_base_ms": 5,
        "append_linger_ms": 2,
        "request_timeout_ms": 40,
        "retry_backoff_ms": 5,
        "fetch_max_wait_ms": 20,
        "fetch_max_bytes": 4096,
    }
    settings.update(overrides)
    return RaftConfig(
        node_id=node_id, voters=voters, cluster_id="sim-cluster", directory_id=directory_id, **settings
    )


# ---------------------------------------------------------------------------------------------- storage


@dataclass
class SimLog:
    """An in-memory log: batches plus how many of them are durable."""

    start_offset: int = 0
    batches: list[SimBatch] = field(default_factory=list)
    bases: list[int] = field(default_factory=list)
    durable_batches: int = 0

    shrinks: ClassVar[int] = 0
    """Counts, over every log, the changes that may lower a log's durable end: a truncation, a reset to
    a snapshot, a new log (a node's first, or a wiped one's).  Nothing else lowers it — a flush raises
    it, a crash drops only unflushed batches, deleting below a snapshot leaves it at or above where it
    was — so :meth:`Simulation.check_invariants` counts the holders again only after one of these."""

    def __post_init__(self) -> None:
        SimLog.shrinks += 1

    @property
    def end_offset(self) -> int:
        return self.batches[-1][1] + 1 if self.batches else self.start_offset

    @property
    def durable_end(self) -> int:
        return self.batches[self.durable_batches - 1][1] + 1 if self.durable_batches else self.start_offset

    def append(self, batch: SimBatch) -> None:
        if batch[0] != self.end_offset:
            raise InvariantViolation(f"append at {batch[0]} but the log ends at {self.end_offset}")
        self.batches.append(batch)
        self.bases.append(batch[0])

    def truncate_to(self, offset: int) -> None:
        SimLog.shrinks += 1
        index = bisect.bisect_left(self.bases, offset)
        if index < len(self.batches) and self.batches[index][0] != offset:
            raise InvariantViolation(f"truncation at {offset} is not a batch boundary")
        del self.batches[index:]
        del self.bases[index:]
        self.durable_batches = min(self.durable_batches, len(self.batches))

    def flush(self) -> int:
        self.durable_batches = len(self.batches)
        return self.end_offset

    def crash(self) -> None:
        del self.batches[self.durable_batches :]
        del self.bases[self.durable_batches :]

    def read(self, offset: int, max_bytes: int) -> bytes:
        index = bisect.bisect_left(self.bases, offset)
        if index >= len(self.batches) or self.batches[index][0] != offset:
            raise InvariantViolation(f"read at {offset} is not a batch boundary")
        out: list[SimBatch] = []
        size = 0
        while index < len(self.batches):
            batch = self.batches[index]
            batch_size = 24 + sum(len(v) if isinstance(v, bytes) else 8 for v in batch[3])
            if out and size + batch_size > max_bytes:
                break
            out.append(batch)
            size += batch_size
            index += 1
        return encode_batches(out)

    def delete_before(self, offset: int) -> None:
        drop = 0
        while drop < len(self.batches) and self.batches[drop][1] < offset:
            drop += 1
        del self.batches[:drop]
        del self.bases[:drop]
        self.durable_batches = max(0, self.durable_batches - drop)
        self.start_offset = offset

    def reset(self, start_offset: int) -> None:
        SimLog.shrinks += 1
        self.batches.clear()
        self.bases.clear()
        self.durable_batches = 0
        self.start_offset = start_offset

    def meta(self, snapshot: SnapshotId | None, base_voters: VoterSet | None = None) -> LogMeta:
        """What a restarting driver rebuilds: offsets, epochs and — with a dynamic quorum (a bootstrap
        or snapshot voter set) — the voter history from every VotersRecord in the log."""
        epochs: list[EpochEntry] = []
        history = VoterSetHistory(base_voters) if base_voters is not None else None
        for base, _last, epoch, values in self.batches:
            if not epochs or epochs[-1].epoch != epoch:
                epochs.append(EpochEntry(epoch, base))
            voters = batch_voters(values)
            if voters is not None and history is not None:
                history.add_at(base, voters)
        end = self.end_offset
        return LogMeta(self.start_offset, end, end, epochs, snapshot, history)

    def values(self, start: int, end: int) -> list[SimValue]:
        out: list[SimValue] = []
        index = max(0, bisect.bisect_right(self.bases, start) - 1)
        while index < len(self.batches) and self.batches[index][0] < end:
            base, _last, _epoch, values = self.batches[index]
            for position, value in enumerate(values):
                if start <= base + position < end:
                    out.append(value)
            index += 1
        return out


@dataclass
class SimSnapshot:
    snapshot_id: SnapshotId
    values: tuple[SimValue, ...]
    data: bytes
    voters: VoterSet | None = None
    """The voter set at the snapshot's end (a dynamic quorum writes it into every snapshot)."""


# ---------------------------------------------------------------------------------------------- network


@dataclass
class Router:
    """Message delivery with filters.  Filters are checked when a message is sent and when it arrives."""

    rng: random.Random
    min_delay_ms: int = 1
    max_delay_ms: int = 3
    drop_probability: float = 0.0
    duplicate_probability: float = 0.0
    isolated: set[int] = field(default_factory=set)
    blocked: set[tuple[int, int]] = field(default_factory=set)
    """One-way (src, dst) links that drop everything."""
    refusing: set[tuple[int, int]] = field(default_factory=set)
    """One-way (src, dst) links whose requests come back refused (``refuses``)."""

    def refuses(self, src: int, dst: int) -> bool:
        """Requests on this link come back refused (connection refused or reset) although ``dst`` runs:
        what a follower sees of a live leader behind a broken proxy or a full accept queue."""
        return (src, dst) in self.refusing

    def allows(self, src: int, dst: int) -> bool:
        return src not in self.isolated and dst not in self.isolated and (src, dst) not in self.blocked

    def delays_ms(self, src: int, dst: int) -> list[int]:
        """Delivery delays for one message: empty when dropped, two entries when duplicated."""
        if not self.allows(src, dst) or (self.drop_probability and self.rng.random() < self.drop_probability):
            return []
        delays = [self.rng.randint(self.min_delay_ms, self.max_delay_ms)]
        if self.duplicate_probability and self.rng.random() < self.duplicate_probability:
            delays.append(self.rng.randint(self.min_delay_ms, self.max_delay_ms * 3))
        return delays

    def isolate(self, node_id: int) -> None:
        self.isolated.add(node_id)

    def cut(self, side_a: set[int], side_b: set[int]) -> None:
        for a in side_a:
            for b in side_b:
                self.blocked.add((a, b))
                self.blocked.add((b, a))

    def heal(self) -> None:
        self.isolated.clear()
        self.blocked.clear()
        self.refusing.clear()
        self.drop_probability = 0.0
        self.duplicate_probability = 0.0


# ---------------------------------------------------------------------------------------------- node


@dataclass
class NodeStats:
    truncations: int = 0
    diverging_responses: int = 0
    snapshots_installed: int = 0
    elections_won: int = 0
    refusals: int = 0
    inputs_during_flush: int = 0


@dataclass(slots=True)
class _Input:
    """One input to a node's core, as the driver queues it (``driver_ordering``)."""

    kind: str
    run: Callable[[], None]
    request: RaftRequest | None = None
    correlation_id: int | None = None
    dispatch: Callable[[], Output] | None = None
    """Feed the core and return its output, unexecuted (the inputs a flush may let through)."""
    seq: int = 0
    """Arrival order on its node."""

    def takes_during_flush(self, core: RaftCore, now_ms: int) -> bool:
        if self.kind == "request" and self.request is not None:
            return core.takes_request_during_flush(self.request)
        if self.kind == "wakeup":
            return core.takes_output_during_flush(now_ms)
        return False


class SimNode:
    def __init__(
        self, sim: Simulation, node_id: int, voters: tuple[int, ...], bootstrap: VoterSet | None = None
    ) -> None:
        self.sim = sim
        self.node_id = node_id
        self.voters = voters
        self.bootstrap = bootstrap
        """The voter set this node was formatted with (dynamic quorum); None: static ``voters``."""
        self.wipes = 0
        self.directory_id = self._directory_id()
        self.log = SimLog()
        self.election = ElectionState(0)
        self.snapshot: SimSnapshot | None = None
        self.download = bytearray()
        self.running = False
        self.incarnation = 0
        self.core: RaftCore | None = None
        self.values: list[SimValue] = []
        """The state machine: committed values by offset (index = offset)."""
        self.applied_end = 0
        self.high_watermark = 0
        self.pending_appends: dict[int, bytes] = {}
        self.pending_requests: dict[int, tuple[int, int, int]] = {}
        self.pending_votes: dict[int, VoteRequest] = {}
        """Vote requests being answered, so a grant can be checked against the key it was asked for."""
        self.next_request_id = 1
        self.scheduled_polls: set[int] = set()
        self.stats = NodeStats()
        self.snapshot_every = 0
        self._rate_numerator = self._rate_denominator = 1
        self.clock_rate = Fraction(1)
        self.clock_offset_ms = 0
        self.driver_ordering = False
        """Feed inputs in the asyncio driver's order (issue #17, session 13): one flush at a time, and
        while it is in flight only the inputs the core takes during a flush
        (``RaftCore.takes_request_during_flush`` and siblings — the driver's ``_take_flush_input``)
        reach the core; the rest wait in :attr:`queued`, in arrival order, and run after the flush's
        own output.  Off (the default): every input may arrive while a flush is in flight (a superset
        of the driver's orders, so the core's rules are checked against more than production does)."""
        self.flush_delay_ms = (0, 2)
        """How long a flush takes (virtual ms, drawn uniformly): a slow disk, as under bulk work."""
        self.flushing = False
        """A flush is in flight (``driver_ordering`` only)."""
        self.queued: list[_Input] = []
        """Inputs that arrived while a flush was in flight and the core does not take then."""
        self.wakeup_queued = False
        """A wake-up is queued (``driver_ordering``): later direct calls need no other."""
        self.poll_due = False
        """A poll fell due while inputs waited (``driver_ordering``): run it once they ran."""
        self.input_seq = 0
        self.round_end = 0
        """The last input of the driver's current round (``driver_ordering``): a poll comes after it."""
        self.round_polled = True
        """The poll after the current round ran (or was not due)."""
        """Create a snapshot (and delete the log below it) every this many applied offsets; 0 = never."""
        self.ports = OutputPorts(
            write_log=self._write_log,
            send=self._dispatch,
            persist_election=self._persist_election,
            load_snapshot=self._load_snapshot,
            commit=self._commit,
            fail_pending_appends=self.pending_appends.clear,
            announce_leader=self._announce_leader,
            wait_until=self._wait_until,
            flush=self._start_flush,
        )

    # -- the node's own clock (drift)

    @property
    def clock_rate(self) -> Fraction:
        """How fast this node's clock runs against the simulation's time (see :meth:`clock_ms`)."""
        return Fraction(self._rate_numerator, self._rate_denominator)

    @clock_rate.setter
    def clock_rate(self, rate: Fraction) -> None:
        # Kept as the fraction's two integers: the clock is read several times per event, and Fraction
        # arithmetic there cost the lease simulation ~15 % of its time; floor and ceil over integers
        # give exactly the values the Fraction did.
        self._rate_numerator, self._rate_denominator = rate.numerator, rate.denominator

    def clock_ms(self) -> int:
        """This node's monotonic clock: ``clock_offset_ms + floor(sim time * clock_rate)``.  Rate 1 and
        offset 0 (the default) is the simulation's time; other values model clocks that drift apart, which
        only the leader lease relies on being bounded (``RaftConfig.max_lease_ms``)."""
        return self.clock_offset_ms + self.sim.now_ms * self._rate_numerator // self._rate_denominator

    def sim_time_of(self, clock_ms: int) -> int:
        """The first simulation millisecond at which :meth:`clock_ms` reads at least ``clock_ms``."""
        # ceil(a / (n / d)) = -((-a * d) // n), n > 0
        elapsed = -((self.clock_offset_ms - clock_ms) * self._rate_denominator // self._rate_numerator)
        return max(self.sim.now_ms, elapsed)

    # -- lifecycle

    def start(self) -> None:
        self.incarnation += 1
        self.running = True
        snapshot_id = self.snapshot.snapshot_id if self.snapshot else None
        static = self.voters if self.bootstrap is None else ()
        config = sim_config(self.node_id, static, self.directory_id, **self.sim.config_overrides)
        base = self.snapshot.voters if self.snapshot and self.snapshot.voters else self.bootstrap
        self.core = RaftCore(
            config,
            random.Random(self.sim.rng.random()),
            scan_batches,
            self.election,
            self.log.meta(snapshot_id, base),
        )
        self.values = list(self.snapshot.values) if self.snapshot else []
        self.applied_end = len(self.values)
        self.high_watermark = self.core.high_watermark
        self.pending_appends.clear()
        self.pending_requests.clear()
        self.pending_votes.clear()
        self.scheduled_polls.clear()
        self.flushing = False
        self.queued.clear()
        self.wakeup_queued = False
        self.poll_due = False
        self.round_polled = True
        self.download = bytearray()
        self.process(self.core.start(self.clock_ms()))

    def crash(self) -> None:
        """Stop without warning: unflushed batches are lost, pending work vanishes; requests it was
        holding (long-poll fetches) see their connection reset."""
        self.running = False
        self.core = None
        self.log.crash()
        self.pending_appends.clear()
        for origin in self.pending_requests.values():
            self.sim.refuse(self.node_id, origin)
        self.pending_requests.clear()
        self.pending_votes.clear()
        self.flushing = False
        self.queued.clear()
        self.wakeup_queued = False
        self.poll_due = False
        self.round_polled = True

    def _directory_id(self) -> str:
        """A fresh directory id per format (a wiped disk is reformatted with a new one)."""
        return f"dir-{self.node_id}-{self.wipes}" if self.bootstrap is not None else ""

    @property
    def key(self) -> Voter:
        return Voter(self.node_id, self.directory_id)

    def wipe(self) -> None:
        """Crash and lose the disk: log, snapshots and quorum-state (and, with a dynamic quorum, get a
        new directory id: the reformatted node is an observer until it is added again)."""
        self.crash()
        self.wipes += 1
        self.directory_id = self._directory_id()
        self.log = SimLog()
        self.snapshot = None
        self.election = ElectionState(0)
        self.values = []
        self.applied_end = 0

    # -- effects

    @property
    def live_core(self) -> RaftCore:
        if self.core is None:
            raise InvariantViolation(f"node {self.node_id} is not running")
        return self.core

    def process(self, out: Output) -> None:
        """Execute ``out`` in the production order (:func:`~kraft.raft.executor.execute_output`)."""
        if self.core is None:
            raise InvariantViolation(f"node {self.node_id} is not running")
        execute_output_now(out, self.ports)

    async def _write_log(self, op: LogOp) -> None:
        if isinstance(op, AppendRecords):
            self.log.append((op.base_offset, op.base_offset + len(op.records) - 1, op.epoch, op.records))
        elif isinstance(op, AppendLeaderChange):
            self.log.append((op.base_offset, op.base_offset, op.epoch, (None,)))
            self.stats.elections_won += 1
        elif isinstance(op, AppendVoters):
            self.log.append((op.base_offset, op.base_offset, op.epoch, (op.voters,)))
        elif isinstance(op, AppendFetched):
            for batch in decode_batches(op.data):
                self.log.append(batch)
        elif isinstance(op, TruncateTo):
            if op.end_offset < self.high_watermark:
                raise InvariantViolation(f"node {self.node_id} truncates below its high watermark")
            self.log.truncate_to(op.end_offset)
            self.stats.truncations += 1
        elif isinstance(op, WriteSnapshotChunk):
            if op.position == 0:
                self.download = bytearray()
            if op.position != len(self.download):
                raise InvariantViolation("snapshot chunk out of order")
            self.download += op.data
        elif isinstance(op, InstallSnapshot):
            end, epoch, values, voters = pickle.loads(bytes(self.download))
            if SnapshotId(end, epoch) != op.snapshot_id:
                raise InvariantViolation("downloaded snapshot does not match its id")
            self.snapshot = SimSnapshot(op.snapshot_id, values, bytes(self.download), voters)
            self.log.reset(op.snapshot_id.end_offset)
            self.stats.snapshots_installed += 1
            if voters is not None:
                # As the driver does: the installed snapshot's voter set reaches the core as its own input.
                incarnation = self.incarnation
                self.sim.schedule(0, lambda: self._snapshot_voters(op.snapshot_id, voters, incarnation))

    async def _persist_election(self, election: ElectionState) -> None:
        if election.epoch < self.election.epoch:
            raise InvariantViolation(
                f"node {self.node_id} persisted epoch {election.epoch} after {self.election.epoch}"
            )
        self.election = election

    async def _start_flush(self) -> None:
        incarnation = self.incarnation
        if self.driver_ordering:
            if self.flushing:
                raise InvariantViolation(f"node {self.node_id} started a flush while one was in flight")
            self.flushing = True
        self.sim.schedule(self.sim.rng.randint(*self.flush_delay_ms), lambda: self._flush(incarnation))

    def _commit(self, high_watermark: int) -> None:
        if high_watermark < self.high_watermark:
            raise InvariantViolation(
                f"node {self.node_id} high watermark went back {self.high_watermark} -> {high_watermark}"
            )
        self.high_watermark = high_watermark
        self._apply_committed()

    def _announce_leader(self, leader: LeaderAndEpoch) -> None:
        """Nothing to do: the invariants read leadership from the cores themselves."""

    def _wait_until(self, deadline_ms: int) -> None:
        self.sim.after_node_event(self)
        self._schedule_poll(deadline_ms)

    def _load_snapshot(self, snapshot_id: SnapshotId) -> None:
        if self.snapshot is None or self.snapshot.snapshot_id != snapshot_id:
            raise InvariantViolation(f"node {self.node_id} was told to load snapshot {snapshot_id} it lacks")
        values = self.snapshot.values
        for offset, value in enumerate(values):
            self.sim.check_committed(self.node_id, offset, value)
        self.values = list(values)
        self.applied_end = len(values)

    def _snapshot_voters(self, snapshot_id: SnapshotId, voters: VoterSet, incarnation: int) -> None:
        if self.running and incarnation == self.incarnation:
            self.process(self.live_core.on_snapshot_voters(snapshot_id, voters, self.clock_ms()))

    def _flush(self, incarnation: int) -> None:
        if not self.running or incarnation != self.incarnation:
            return
        end = self.log.flush()
        self.process(self.live_core.on_flushed(end, self.clock_ms()))
        if self.driver_ordering:
            self.flushing = False
            self._pump()

    def _apply_committed(self) -> None:
        if self.high_watermark <= self.applied_end:
            return
        values = self.log.values(self.applied_end, self.high_watermark)
        if len(values) != self.high_watermark - self.applied_end:
            raise InvariantViolation(
                f"node {self.node_id} cannot apply [{self.applied_end}, {self.high_watermark}): log holds "
                f"{len(values)} of them (log start {self.log.start_offset}, end {self.log.end_offset})"
            )
        for offset, value in enumerate(values, start=self.applied_end):
            self.sim.check_committed(self.node_id, offset, value)
        self.values.extend(values)
        self.applied_end = self.high_watermark
        core = self.live_core
        if core.is_leader:
            for offset in [o for o in self.pending_appends if o < self.high_watermark]:
                self.sim.acknowledge(offset, self.pending_appends.pop(offset))
        if self.snapshot_every and self.applied_end - self._snapshot_end() >= self.snapshot_every:
            self._take_snapshot()

    def _snapshot_end(self) -> int:
        return self.snapshot.snapshot_id.end_offset if self.snapshot else 0

    def _take_snapshot(self) -> None:
        core = self.live_core
        end = self.applied_end
        epoch = core.log.epoch_at(end - 1)
        if epoch is None:
            return
        values = tuple(self.values[:end])
        snapshot_id = SnapshotId(end, epoch)
        history = core.voter_history
        voters = None if history.static else history.voters_at(end - 1)
        data = pickle.dumps((end, epoch, values, voters), protocol=pickle.HIGHEST_PROTOCOL)
        self.snapshot = SimSnapshot(snapshot_id, values, data, voters)
        self.log.delete_before(end)
        self.process(core.on_snapshot_frozen(snapshot_id, end, self.clock_ms()))

    def _dispatch(self, message: Outbound) -> None:
        if isinstance(message, OutboundRequest):
            self.sim.send_request(self.node_id, message)
            return
        origin = self.pending_requests.pop(message.request_id, None)
        if origin is None:
            raise InvariantViolation(f"node {self.node_id} answered unknown request {message.request_id}")
        vote = self.pending_votes.pop(message.request_id, None)
        if vote is not None and isinstance(message.response, VoteResponse) and message.response.vote_granted:
            self.sim.record_vote_grant(self, vote)
        response = self._fill_reads(message)
        self.sim.send_response(self.node_id, origin, response)

    def _fill_reads(self, message: OutboundResponse) -> RaftResponse:
        response = message.response
        if message.read_log is not None and isinstance(response, FetchResponse):
            data = self.log.read(message.read_log.offset, message.read_log.max_bytes)
            return FetchResponse(
                response.error_code,
                response.error_message,
                response.leader_id,
                response.leader_epoch,
                response.high_watermark,
                response.log_start_offset,
                data,
                response.diverging_epoch,
                response.snapshot_id,
                response.read_round,
            )
        if message.read_snapshot is not None and isinstance(response, FetchSnapshotResponse):
            read = message.read_snapshot
            if self.snapshot is None or self.snapshot.snapshot_id != read.snapshot_id:
                raise InvariantViolation("core asked to serve a snapshot the node does not have")
            data = self.snapshot.data
            chunk = data[read.position : read.position + read.max_bytes]
            return FetchSnapshotResponse(
                response.error_code,
                response.error_message,
                response.leader_id,
                response.leader_epoch,
                read.snapshot_id,
                len(data),
                read.position,
                chunk,
            )
        return response

    def _schedule_poll(self, deadline_ms: int) -> None:
        if deadline_ms >= 1 << 60:
            return
        # clock_ms(), inline: this runs after every output
        now_ms = self.clock_offset_ms + self.sim.now_ms * self._rate_numerator // self._rate_denominator
        deadline_ms = max(deadline_ms, now_ms)
        if deadline_ms in self.scheduled_polls:
            return
        self.scheduled_polls.add(deadline_ms)
        incarnation = self.incarnation
        delay_ms = self.sim_time_of(deadline_ms) - self.sim.now_ms
        self.sim.schedule(delay_ms, lambda: self._poll(deadline_ms, incarnation))

    def _poll(self, deadline_ms: int, incarnation: int) -> None:
        if not self.running or incarnation != self.incarnation:
            return
        self.scheduled_polls.discard(deadline_ms)
        if self.driver_ordering and (self.flushing or self.queued):
            # The driver polls after its current round of events (and the flush): not a queued input.
            self.poll_due = True
            return
        self.process(self.live_core.poll(self.clock_ms()))

    # -- the driver's input order (driver_ordering)

    def _input(self, item: _Input) -> None:
        if not self.driver_ordering:
            item.run()
            return
        self.input_seq += 1
        item.seq = self.input_seq
        self.queued.append(item)
        self._pump()

    def _pump(self) -> None:
        """Feed queued inputs as the driver does (``RaftDriver._run``): in rounds — the inputs queued when
        a round starts, in order, each run to its end (its flush included), then a poll if one fell due
        meanwhile; during a flush, the first the core takes then, again and again
        (``RaftDriver._take_flush_input``)."""
        while self.running:
            if self.flushing:
                if not self._take_one_during_flush():
                    return
                continue
            if self.queued and self.queued[0].seq <= self.round_end:
                self.queued.pop(0).run()
                continue
            if not self.round_polled:  # the round is over: the driver polls (its flush included)
                self.round_polled = True
                if self.poll_due:
                    self.poll_due = False
                    self.process(self.live_core.poll(self.clock_ms()))
                    continue
            if not self.queued:
                return
            self.round_end = self.queued[-1].seq  # the next round: what is queued now
            self.round_polled = False

    def _take_one_during_flush(self) -> bool:
        core = self.live_core
        now_ms = self.clock_ms()
        for index, item in enumerate(self.queued):
            if item.takes_during_flush(core, now_ms):
                del self.queued[index]
                self.stats.inputs_during_flush += 1
                out = item.dispatch() if item.dispatch is not None else None
                if out is not None and (out.log_ops or out.flush):
                    raise InvariantViolation(
                        f"node {self.node_id}: a {item.kind} taken during a flush wrote the log"
                    )
                if out is not None:
                    self.process(out)
                return True
        return False

    def wake(self) -> None:
        """The driver's wake-up after a direct call (an append, a leadership confirmation): its output.
        One at a time, as ``RaftDriver._wakeup_queued``: a wake-up queued serves every call before it runs."""
        if self.wakeup_queued:
            return

        if not self.driver_ordering:  # (as _input would run it, without building the queue entry)
            self.process(self.live_core.take_output(self.clock_ms()))
            return

        def dispatch() -> Output:
            self.wakeup_queued = False
            return self.live_core.take_output(self.clock_ms())

        self.wakeup_queued = True
        self._input(_Input("wakeup", lambda: self.process(dispatch()), dispatch=dispatch))

    # -- inbound

    def receive_request(
        self, src: int, src_incarnation: int, correlation_id: int, request: RaftRequest
    ) -> None:
        request_id = self.next_request_id
        self.next_request_id += 1
        self.pending_requests[request_id] = (src, src_incarnation, correlation_id)
        if isinstance(request, VoteRequest):
            self.pending_votes[request_id] = request

        def dispatch() -> Output:
            # The simulated network knows the sender: every request is checked as mTLS would check it.
            return self.live_core.handle_request(request_id, request, self.clock_ms(), peer_id=src)

        if not self.driver_ordering:
            self.process(dispatch())
            return
        self._input(_Input("request", lambda: self.process(dispatch()), request=request, dispatch=dispatch))

    def receive_response(self, correlation_id: int, response: RaftResponse) -> None:
        if response.error_code == 0 and isinstance(response, FetchResponse) and response.diverging_epoch:
            self.stats.diverging_responses += 1

        def dispatch() -> Output:
            return self.live_core.handle_response(correlation_id, response, self.clock_ms())

        if not self.driver_ordering:
            self.process(dispatch())
            return
        self._input(
            _Input(
                "response", lambda: self.process(dispatch()), correlation_id=correlation_id, dispatch=dispatch
            )
        )

    def receive_refusal(self, correlation_id: int) -> None:
        self.stats.refusals += 1

        def run() -> None:
            core = self.live_core
            self.process(core.handle_send_failure(correlation_id, self.clock_ms(), unreachable=True))

        self._input(_Input("refusal", run))

    def client_append(self, value: bytes) -> int:
        core = self.live_core
        offset = core.append([value], self.clock_ms())  # a direct call, as RaftDriver.schedule_append
        self.pending_appends[offset] = value
        self.wake()
        return offset


# ---------------------------------------------------------------------------------------------- cluster


class Simulation:
    def __init__(
        self,
        seed: int,
        voters: int = 3,
        observers: int = 0,
        max_events: int = 200_000,
        **config_overrides: int,
    ) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.now_ms = 0
        self.events: list[tuple[int, int, Callable[[], None]]] = []
        self.sequence = 0
        self.event_count = 0
        self.max_events = max_events
        self.config_overrides = config_overrides
        voter_ids = tuple(range(1, voters + 1))
        self.dynamic = False
        self.nodes: dict[int, SimNode] = {}
        for node_id in range(1, voters + observers + 1):
            self.nodes[node_id] = SimNode(self, node_id, voter_ids)
        self.voter_ids = voter_ids
        self.majority = voters // 2 + 1
        self.committed_voters: dict[int, VoterSet] = {}
        """Offset -> the VotersRecord committed there (every node must agree)."""
        self.hwm_voters: VoterSet = VoterSet.static(voter_ids)
        """The voter set (keys) the leader counted when it reached :attr:`max_high_watermark`."""
        self.vote_grants: dict[tuple[int, int], set[tuple[int, str]]] = {}
        """(epoch, candidate) -> the replicas (id, directory id at the time) that granted it a standard
        vote (dynamic quorum only)."""
        self.router = Router(self.rng)
        self.committed: dict[int, SimValue] = {}
        self.acked: dict[int, bytes] = {}
        self.leaders_by_epoch: dict[int, int] = {}
        self.checked_leaders: dict[int, set[int]] = {}
        self.max_high_watermark = 0
        self.next_value = 0
        self.append_interval_ms = 4
        self._held_target = 0
        self._held_voters: VoterSet | None = None
        self._held_shrinks = -1
        """The high watermark, voter set and :attr:`SimLog.shrinks` at which :meth:`check_invariants` last
        found the high watermark durable on a majority."""

    @classmethod
    def dynamic_quorum(
        cls, seed: int, voters: int = 1, observers: int = 2, **config_overrides: int
    ) -> Simulation:
        """A KIP-853 quorum: every node is formatted with the first ``voters`` nodes (and their directory
        ids) as its bootstrap voter set; the others start as observers that may be added."""
        sim = cls(seed, voters=voters, observers=observers, **config_overrides)
        sim.dynamic = True
        bootstrap = VoterSet(tuple(Voter(i, f"dir-{i}-0") for i in sim.voter_ids))
        for node in sim.nodes.values():
            node.bootstrap = bootstrap
            node.directory_id = node._directory_id()
        return sim

    # -- scheduling

    def schedule(self, delay_ms: int, action: Callable[[], None]) -> None:
        self.sequence += 1
        heapq.heappush(self.events, (self.now_ms + delay_ms, self.sequence, action))

    def run_until(self, time_ms: int) -> None:
        events, pop, check = self.events, heapq.heappop, self.check_invariants
        while events and events[0][0] <= time_ms:
            at_ms, _seq, action = pop(events)
            self.now_ms = at_ms
            self.event_count += 1
            if self.event_count > self.max_events:
                raise InvariantViolation(f"seed {self.seed}: more than {self.max_events} events")
            action()
            check()
        self.now_ms = max(self.now_ms, time_ms)

    def run_for(self, duration_ms: int) -> None:
        self.run_until(self.now_ms + duration_ms)

    def run_until_condition(self, condition: Callable[[], bool], timeout_ms: int, what: str) -> None:
        """Advance virtual time until ``condition`` holds; fail after ``timeout_ms`` of virtual time."""
        deadline = self.now_ms + timeout_ms
        while not condition():
            if self.now_ms >= deadline:
                raise InvariantViolation(f"seed {self.seed}: {what} did not happen within {timeout_ms} ms")
            self.run_until(min(deadline, self.now_ms + 5))

    # -- cluster control

    def start_all(self) -> None:
        for node in self.nodes.values():
            node.start()

    def start_workload(self) -> None:
        """Every ``append_interval_ms`` each leader appends the next counter value."""

        def tick() -> None:
            for node in self.nodes.values():
                if node.running and node.core is not None and node.core.is_leader:
                    self.next_value += 1
                    node.client_append(b"v%d" % self.next_value)
            self.schedule(self.append_interval_ms, tick)

        self.schedule(self.append_interval_ms, tick)

    def leader(self) -> SimNode | None:
        """The running node that is leader at the highest epoch, if any."""
        best: SimNode | None = None
        for node in self.nodes.values():
            core = node.core
            if (
                node.running
                and core is not None
                and core.is_leader
                and (best is None or core.epoch > best.live_core.epoch)
            ):
                best = node
        return best

    def has_stable_leader(self) -> bool:
        """A leader whose epoch every running voter knows, with a high watermark in its epoch."""
        leader = self.leader()
        if leader is None:
            return False
        core = leader.live_core
        if core.high_watermark <= core.epoch_start_offset:
            return False
        voter_ids = core.voter_set.ids if self.dynamic else self.voter_ids
        for node in self.nodes.values():
            if node.running and node is not leader and node.node_id in voter_ids:
                other = node.live_core
                if other.epoch != core.epoch or other.election.leader_id != leader.node_id:
                    return False
        return True

    def crash(self, node_id: int) -> None:
        self.nodes[node_id].crash()

    # -- voter changes (dynamic quorum)

    def add_voter(self, node_id: int) -> int:
        """Ask the leader to add ``node_id`` under its current directory id; returns the offset of the
        VotersRecord.  Raises ``VoterChangeError`` / ``NotLeaderError`` as the core does."""
        leader = self.leader()
        if leader is None:
            raise InvariantViolation(f"seed {self.seed}: no leader to add voter {node_id}")
        core = leader.live_core
        offset = core.add_voter(self.nodes[node_id].key, leader.clock_ms())
        leader.process(core.take_output(leader.clock_ms()))
        return offset

    def remove_voter(self, node_id: int, directory_id: str | None = None) -> int:
        leader = self.leader()
        if leader is None:
            raise InvariantViolation(f"seed {self.seed}: no leader to remove voter {node_id}")
        core = leader.live_core
        voter = core.voter_set.get(node_id)
        directory = directory_id if directory_id is not None else voter.directory_id if voter else ""
        offset = core.remove_voter(node_id, directory, leader.clock_ms())
        leader.process(core.take_output(leader.clock_ms()))
        return offset

    def voter_change_committed(self, offset: int) -> bool:
        """Whether the VotersRecord at ``offset`` is committed (some leader's high watermark passed it)."""
        return self.max_high_watermark > offset and offset in self.committed

    def restart(self, node_id: int) -> None:
        node = self.nodes[node_id]
        if node.running:
            node.crash()
        node.start()

    # -- messaging

    def send_request(self, src: int, message: OutboundRequest) -> None:
        dst = message.dest
        incarnation = self.nodes[src].incarnation
        target = self.nodes.get(dst)
        if target is None:
            return
        for delay in self.router.delays_ms(src, dst):
            self.schedule(delay, lambda: self._deliver_request(src, incarnation, dst, message))

    def _deliver_request(self, src: int, incarnation: int, dst: int, message: OutboundRequest) -> None:
        node = self.nodes[dst]
        if not self.router.allows(src, dst):
            return
        if node.running and not self.router.refuses(src, dst):
            node.receive_request(src, incarnation, message.correlation_id, message.request)
        else:
            self.refuse(dst, (src, incarnation, message.correlation_id))

    def refuse(self, src: int, origin: tuple[int, int, int]) -> None:
        """``src``'s process is gone: the sender's transport sees the connection refused or reset (a
        failure reported as unreachable), unless the network loses that too (then it times out)."""
        dst, incarnation, correlation_id = origin
        delays = self.router.delays_ms(src, dst)
        if delays:
            self.schedule(delays[0], lambda: self._deliver_refusal(src, dst, incarnation, correlation_id))

    def _deliver_refusal(self, src: int, dst: int, incarnation: int, correlation_id: int) -> None:
        node = self.nodes[dst]
        if node.running and node.incarnation == incarnation and self.router.allows(src, dst):
            node.receive_refusal(correlation_id)

    def send_response(self, src: int, origin: tuple[int, int, int], response: RaftResponse) -> None:
        dst, incarnation, correlation_id = origin
        for delay in self.router.delays_ms(src, dst):
            self.schedule(
                delay, lambda: self._deliver_response(src, dst, incarnation, correlation_id, response)
            )

    def _deliver_response(
        self, src: int, dst: int, incarnation: int, correlation_id: int, response: RaftResponse
    ) -> None:
        node = self.nodes[dst]
        if node.running and node.incarnation == incarnation and self.router.allows(src, dst):
            node.receive_response(correlation_id, response)

    # -- invariants

    def check_committed(self, node_id: int, offset: int, value: SimValue) -> None:
        previous = self.committed.setdefault(offset, value)
        if previous != value:
            raise InvariantViolation(
                f"seed {self.seed}: node {node_id} committed {value!r} at {offset}, another node {previous!r}"
            )

    def acknowledge(self, offset: int, value: bytes) -> None:
        self.acked[offset] = value

    def after_node_event(self, node: SimNode) -> None:
        core = node.core
        if core is None or not core.is_leader:
            return
        epoch = core.epoch
        holder = self.leaders_by_epoch.setdefault(epoch, node.node_id)
        if holder != node.node_id:
            raise InvariantViolation(
                f"seed {self.seed}: nodes {holder} and {node.node_id} both lead epoch {epoch}"
            )
        checked = self.checked_leaders.get(epoch)
        if checked is None or node.node_id not in checked:
            self.checked_leaders.setdefault(epoch, set()).add(node.node_id)
            self.check_election(node)
        # A voter's high watermark, or (dynamic quorum) also that of a leader that removed itself: it
        # commits with the others' majority.  The cheap comparison first: this runs after every output.
        if core.high_watermark > self.max_high_watermark and (self.dynamic or core.is_voter):
            self.max_high_watermark = core.high_watermark
            self.hwm_voters = core.voter_set

    def record_vote_grant(self, node: SimNode, request: VoteRequest) -> None:
        """A (pre-)vote granted by ``node``: with a dynamic quorum it must answer for the replica the
        candidate asked — its current directory id.  A wiped and reformatted voter (new directory id)
        that granted a vote meant for its old one would count a copy of the log that no longer exists."""
        if not self.dynamic:
            return
        if request.voter_directory_id != node.directory_id:
            kind = "pre-vote" if request.pre_vote else "vote"
            raise InvariantViolation(
                f"seed {self.seed}: node {node.node_id} (directory {node.directory_id}, wiped {node.wipes}x)"
                f" granted a {kind} in epoch {request.candidate_epoch} to {request.candidate_id} asked"
                f" for directory {request.voter_directory_id!r}"
            )
        if not request.pre_vote:
            key = (request.candidate_epoch, request.candidate_id)
            self.vote_grants.setdefault(key, set()).add(node.key.key)

    def check_election(self, leader: SimNode) -> None:
        """A new leader (dynamic quorum): it is a voter under its current directory id, and a majority of
        the voter set in force — keys with directory ids — granted it this epoch's vote (or is itself):
        no vote of a stale (wiped) replica, nor of a node outside that set, made it leader."""
        if not self.dynamic:
            return
        core = leader.live_core
        voters = core.voter_set
        if not voters.is_voter(leader.node_id, leader.directory_id):
            raise InvariantViolation(
                f"seed {self.seed}: node {leader.node_id} leads epoch {core.epoch} but"
                f" ({leader.node_id}, {leader.directory_id}) is not a voter of {voters}"
            )
        granted = self.vote_grants.get((core.epoch, leader.node_id), set()) | {leader.key.key}
        counted = [voter for voter in voters if voter.key in granted]
        if len(counted) < voters.majority:
            raise InvariantViolation(
                f"seed {self.seed}: node {leader.node_id} leads epoch {core.epoch} with votes of"
                f" {sorted(granted)}, not a majority of {voters}"
            )

    def check_invariants(self) -> None:
        """After every event: committed data (high watermark) is durable on a majority of the voters
        that committed it — counted by key: a wiped node (new directory id) is not the voter it was."""
        target = self.max_high_watermark
        if target == 0:
            return
        voters = self.hwm_voters
        shrinks = SimLog.shrinks
        if target == self._held_target and voters is self._held_voters and shrinks == self._held_shrinks:
            # It held for this high watermark and voter set, and no durable end went down since (nor did a
            # directory id change: only a wipe does, with a new log): it holds.  This runs after every
            # event; most events move none of these.
            return
        missing = voters.majority
        nodes = self.nodes
        for voter in voters:
            node = nodes[voter.node_id]
            if voter.matches(node.node_id, node.directory_id) and node.log.durable_end >= target:
                missing -= 1
                if missing == 0:  # a majority holds it: stop counting there
                    self._held_target, self._held_voters, self._held_shrinks = target, voters, shrinks
                    return
        holders = voters.majority - missing
        raise InvariantViolation(
            f"seed {self.seed}: high watermark {target} is durable on only {holders} voters of {voters}"
        )

    def check_final(self, settle_ms: int = 3000) -> None:
        """Heal, restart every node, let the cluster converge, then compare all committed data."""
        self.router.heal()
        for node in self.nodes.values():
            if not node.running:
                node.start()
        self.run_until_condition(self.has_stable_leader, settle_ms, "a stable leader after healing")
        leader = self.leader()
        assert leader is not None
        # Append one more value and wait until every node has applied it: everything before is settled.
        marker = b"final-%d" % self.seed
        target = max(leader.client_append(marker), max(self.acked, default=0))

        def all_applied() -> bool:
            return all(node.applied_end > target for node in self.nodes.values())

        self.run_until_condition(all_applied, settle_ms, "every node applying the final marker")
        reference = max((node.values for node in self.nodes.values()), key=len)
        for node in self.nodes.values():
            common = min(len(node.values), len(reference))
            if node.values[:common] != reference[:common]:
                raise InvariantViolation(f"seed {self.seed}: node {node.node_id} committed different data")
        for offset, value in self.acked.items():
            if offset >= len(reference) or reference[offset] != value:
                raise InvariantViolation(f"seed {self.seed}: acknowledged {value!r} at {offset} was lost")


def leader_id_of(node: SimNode) -> int:
    core = node.core
    return NO_LEADER if core is None else core.leader_and_epoch.leader_id


def state_of(node: SimNode) -> StateKind | None:
    return None if node.core is None else node.core.state
