"""Deterministic simulation of partition replication: the real broker shell on a virtual-time loop.

Three brokers, each with the production pieces wired as ``kraft/node/broker.py`` wires them:

- a :class:`~kraft.broker.partitions.PartitionManager` over **real segmented logs** in a tmp dir (small
  segments, so logs roll), opened through the real open/recovery path
  (:func:`~kraft.broker.segmented_partition_log.segmented_log_opener`);
- the real :class:`~kraft.broker.replication.ReplicaManager` (its fetchers, leader states, acks=all
  waiters, ISR proposals, HWM checkpoint, heartbeat lease) with a :class:`SimTransport` instead of gRPC
  (the ``transport`` seam, :mod:`kraft.broker.replica_transport`);
- the real :class:`~kraft.broker.service.BrokerService` answering Produce (admission, append, acks=all)
  and a :class:`~kraft.broker.status.BrokerStatus` holding the lease.

The metadata quorum (the default, ``quorum=True``) is the controller simulation's
(tests/sim/test_controller_sim.py, :class:`ControllerQuorum`): three production
:class:`~kraft.metadata.controller.QuorumController` nodes over the Raft simulation (tests/sim/harness.py:
real ``RaftCore`` per node, a simulated log that loses unflushed batches on a crash, its own seeded
network), each on its own ``VirtualTimeLoop`` on the same clock.  Brokers register, heartbeat, send
AlterPartition and MetadataFetch to the node they believe active (the real ``ControllerService`` methods,
run as tasks of that node's loop: a paused node answers late, a crashed one never); NOT_CONTROLLER names
the active one, no answer moves them to the next node.  So what the real controller does on a failover
happens here: uncommitted records are truncated away, the new active controller activates through
``controller_activation`` (a NoOp committed, the logic rebuilt from the committed image, fresh broker
sessions, half-written bulk jobs resumed, the rejoin index rebuilt in slices), and requests in flight to
the old one are answered NOT_CONTROLLER / REQUEST_TIMED_OUT or not at all.  Records reach brokers only
once committed (the real fetch server serves the committed window); an answer only once its records
commit.  Not covered: controller snapshots (off: every broker fetches from the window), voter changes,
a controller's disk lost, and the metadata fetch's long-poll (brokers poll every 20 ms).  Both modes
give the controller the brokers' ``min.insync.replicas`` (2), as one shared .properties value does: with
the controller's default of 1 a member leaving an ISR of two was not kept as an eligible leader
(KIP-966), and a lost disk of the one left then took the partition offline although the leaver held
every acknowledged record (the first runs of the wipe fault, seeds 0 and 10).

``quorum=False`` keeps the earlier single controller: the active controller's state machine
(:class:`~kraft.metadata.controller_logic.ControllerLogic` and
:func:`kraft.metadata.isr_changes.alter_partition`) that never fails (it can be cut off), whose records
commit as they are written, behind the same requests (:class:`Controller`).  Either way brokers apply
what reached them (stale metadata) as the partition manager and replica manager are driven by the
publisher: ``reconcile`` then ``on_image``.

The brokers run on one :class:`~sim.sim_raft_client.VirtualTimeLoop`; every message (heartbeats, metadata
fetches, replica fetches and their answers, AlterPartition, produce requests) goes through a seeded
network with random delays that can cut links.  :meth:`ReplicationSim.step` runs the brokers' loop and the
controllers' loops in turn until all are idle, then moves the clock to the next timer of the brokers' loop
or event of the quorum's queue.  Faults drawn from the seed: **crashes** (the broker's tasks vanish, its
logs are abandoned without a flush, and every byte above the log's flushed offset may be lost: a random
number of unflushed batches is kept, sometimes with a torn batch after them; the restart reopens them
through the real recovery path), **lost disks** (quorum mode: 15 % of broker crashes also wipe the
broker's dir — logs, checkpoints, incarnation file, stored image — so its next incarnation names no
predecessor and the controller must judge it unclean: out of every ISR and ELR), **network partitions** (a
broker isolated, or one link cut) and, with the quorum, **controller faults** (a share of the fault
events): crash a controller (the active one 70 % of the time: a failover) and restart it, pause one
(SIGSTOP), isolate one, cut a controller-controller link; the active controller is also crashed around a
crashed broker's session expiry (30 % of broker crashes) and, 75 % of the time, at the moment the
committed metadata first names a fenced leader: the fence committed, the next slice of ISR removals (work
units of one record, one uncommitted bulk record at a time) appended on the active controller only, so the
crash loses it. Producers write with acks=all (min.insync.replicas 2).

Checked after every step of virtual time (:meth:`ReplicationSim.check`), read through the logs' real read
API (``read_records`` / ``read_batches``):
- every record acknowledged to a producer is at its offset, same value, on every live member of the
  controller's ISR and on the leader;
- the committed history: the current leader's batches below its high watermark are appended to a
  reference log the first time they are seen; what any current leader holds below its high watermark must
  equal it byte for byte, and so must every live ISR member's log below that high watermark;
- no offset is acknowledged twice with different records, and every acknowledged record is in the
  reference once the reference reaches it;
- a fenced broker leads a partition in the committed metadata for at most ``FENCED_LEADER_BOUND_MS``
  while one controller stays active (its ISR removal must reach it: a lost bulk job shows here);
- with the quorum, the Raft simulation's own invariant (committed data durable on a majority) after
  every Raft event.
A wiped broker's new incarnation counts as the replica the metadata names only once its registration is
unfenced (before that the ISR may still name the lost disk: :meth:`ReplicationSim._counts`).
At the end (:meth:`ReplicationSim.finish`) the network heals, every broker runs again, and within a bound
the ISR is full, every replica's log equals the leader's up to a high watermark that reached the log end,
and every acknowledged record is there — except in a partition left with no leader and an empty ISR and
ELR (KIP-966: offline rather than lose acknowledged records, unclean election being off), which is
accepted only where the committed record history proves that no eligible replica with the data remained:
each member left ISR and ELR either while the new ISR stayed at min ISR or by the unclean registration of
an incarnation whose disk was really wiped (:meth:`ReplicationSim._eligibility_lost`).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import functools
import random
import shutil
import traceback
import uuid
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from kraft.broker.image_adapter import ImageMetadataView
from kraft.broker.incarnation import accept_incarnation, take_over_incarnation
from kraft.broker.partition_log import PartitionLog, PartitionLogOpener
from kraft.broker.partitions import PartitionManager
from kraft.broker.publisher import MetadataPublisher
from kraft.broker.replica_transport import ReplicaFetchFailed
from kraft.broker.replication import ReplicaManager, ReplicationSettings
from kraft.broker.segmented_partition_log import SegmentedPartitionLog, segmented_log_opener
from kraft.broker.service import BrokerService
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState, ProducedRecord, StoredRecord, TopicPartition
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage, PartitionRegistration
from kraft.metadata.isr_changes import alter_partition
from kraft.metadata.partition_change import effective_min_isr
from kraft.metadata.records import decode_value, encode_value
from kraft.storage.batch import LOG_OVERHEAD, iter_batches, peek_batch_header
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb
from sim.harness import InvariantViolation
from sim.sim_raft_client import SimRaftClient, VirtualTimeLoop
from sim.test_controller_sim import ControllerSimulation, NodeController

T = TypeVar("T")

CLUSTER = "sim-replication"
CONTROLLER = 0  # the single controller's network id (and the owner of the simulation's own tasks)
PRODUCER = 9  # producers and the admin client that creates the topic
CONTROLLER_NODES = (1, 2, 3)  # the quorum's Raft node ids
CONTROLLER_NET = 100  # controller node n is network node CONTROLLER_NET + n
BROKERS = (1, 2, 3)
TOPIC = "orders"
TOPIC_ID = "orders-topic-id"
PARTITIONS = 2
MIN_ISR = 2
SESSION_MS = 600  # the lease: 540 ms
HEARTBEAT_MS = 50
METADATA_POLL_MS = 20
LAG_MS = 400  # replica.lag.time.max.ms: the shrink check runs every 200 ms
LEASE_CHECK_MS = 10
CHECKPOINT_MS = 300
PRODUCE_TIMEOUT_MS = 800
SEGMENT_BYTES = 2048
RUN_MS = 6_000
HEAL_BOUND_MS = 8_000
START_BOUND_MS = 3_000
RPC_TIMEOUT_MS = 300
MAX_STEPS = 2_000_000
FENCED_LEADER_BOUND_MS = 300
CONTROLLER_FAULT_SHARE = 0.35  # quorum mode: the share of fault events that hit a controller
WIPE_SHARE = 0.15  # quorum mode: the share of broker crashes that also lose the disk


def replication_settings() -> ReplicationSettings:
    """Kafka's settings scaled down (as the Raft simulation's): a run covers many ISR changes."""
    return ReplicationSettings(
        replica_lag_time_max_ms=LAG_MS,
        fetch_max_wait_ms=40,
        fetch_max_bytes=512,  # several fetches per catch-up
        fetch_response_max_bytes=2048,
        fetch_backoff_ms=30,
        request_timeout_ms=200,
        alter_partition_backoff_ms=40,
        min_insync_replicas=MIN_ISR,
        produce_timeout_ms=PRODUCE_TIMEOUT_MS,
        hwm_checkpoint_interval_ms=CHECKPOINT_MS,
        catch_up_flush_bytes=4096,  # a follower catching up holds unflushed fetches: what a crash loses
    )


class RpcFailed(Exception):
    """No answer: the link is cut, a side is down, or the answer came too late."""


# ------------------------------------------------------------------------------------------- logs


class TrackedLog:
    """The real :class:`SegmentedPartitionLog`, noting the lowest offset any truncation cut to (so the
    checker knows which verified prefixes still hold).  Every call goes to the real log."""

    def __init__(self, inner: SegmentedPartitionLog, on_truncate: Callable[[int], None]) -> None:
        self.inner = inner
        self._on_truncate = on_truncate

    @property
    def log_start_offset(self) -> int:
        return self.inner.log_start_offset

    @property
    def log_end_offset(self) -> int:
        return self.inner.log_end_offset

    @property
    def flushed_offset(self) -> int:
        return self.inner.flushed_offset

    def append_records(
        self, records: Sequence[ProducedRecord], leader_epoch: int, max_batch_bytes: int | None = None
    ) -> int:
        return self.inner.append_records(records, leader_epoch, max_batch_bytes)

    def read_records(self, offset: int, max_bytes: int) -> list[StoredRecord]:
        return self.inner.read_records(offset, max_bytes)

    def flush(self) -> None:
        self.inner.flush()

    def epoch_entries(self) -> list[tuple[int, int]]:
        return self.inner.epoch_entries()

    def read_batches(self, offset: int, max_bytes: int, max_offset: int) -> bytes:
        return self.inner.read_batches(offset, max_bytes, max_offset)

    def append_batches(self, data: bytes) -> int:
        return self.inner.append_batches(data)

    def truncate_to(self, offset: int) -> int:
        self._on_truncate(offset)
        return self.inner.truncate_to(offset)

    def close(self) -> None:
        self.inner.close()


def segment_batches(path: Path) -> list[tuple[int, int, int]]:
    """``(base offset, last offset, end position)`` of every whole batch in a segment file."""
    data = path.read_bytes()
    out: list[tuple[int, int, int]] = []
    position = 0
    while position + 61 <= len(data):
        header = peek_batch_header(data, position)
        if header.size_in_bytes < LOG_OVERHEAD or position + header.size_in_bytes > len(data):
            break
        position += header.size_in_bytes
        out.append((header.base_offset, header.last_offset, position))
    return out


def lose_unflushed(directory: Path, flushed: int, rng: random.Random) -> tuple[int, bool]:
    """A crash of the log in ``directory``: keep every batch below ``flushed`` and a random number of the
    batches above it (the page cache wrote some back, in order), sometimes a torn part of the next one;
    segment files that start above what is kept vanish.  Returns (offset kept up to, torn)."""
    segments = sorted(directory.glob("*.log"), key=lambda p: int(p.stem))
    batches = [(path, *b) for path in segments for b in segment_batches(path)]
    unflushed = [b for b in batches if b[2] >= flushed]
    keep = rng.randint(0, len(unflushed)) if unflushed and rng.random() < 0.5 else 0
    kept_end = unflushed[keep - 1][2] + 1 if keep else flushed
    cut = unflushed[keep] if keep < len(unflushed) else None
    torn = cut is not None and rng.random() < 0.3
    for path in segments:
        base = int(path.stem)
        if base >= kept_end and base != int(segments[0].stem) and not (torn and cut and cut[0] == path):
            for suffix in (".log", ".index", ".timeindex"):
                with contextlib.suppress(FileNotFoundError):
                    path.with_suffix(suffix).unlink()
            continue
        ends = [end for _, last, end in segment_batches(path) if last < kept_end]
        keep_bytes = ends[-1] if ends else 0
        if torn and cut is not None and cut[0] == path:
            start = keep_bytes
            keep_bytes = start + rng.randint(1, max(cut[3] - start - 1, 1))
        with open(path, "r+b") as f:
            f.truncate(keep_bytes)
    return kept_end, torn


# ---------------------------------------------------------------------------------------- network


@dataclass
class Network:
    rng: random.Random
    alive: Callable[[int, int], bool]  # (node, incarnation) is the same running process
    incarnation: Callable[[int], int]
    cut: set[frozenset[int]] = field(default_factory=set)
    isolated: set[int] = field(default_factory=set)
    # node → extra delay (ms) of every message it sends or receives: a stalled process or a congested
    # link, whose requests arrive (and are acted on) long after their sender gave up on them
    slow: dict[int, int] = field(default_factory=dict)
    drop_probability: float = 0.02

    def connected(self, a: int, b: int) -> bool:
        return a not in self.isolated and b not in self.isolated and frozenset((a, b)) not in self.cut

    def delay_s(self, a: int, b: int) -> float:
        ms = self.rng.randint(1, 5) if self.rng.random() < 0.9 else self.rng.randint(10, 40)
        extra = max(self.slow.get(a, 0), self.slow.get(b, 0))
        if extra:
            ms += self.rng.randint(0, extra)
        return ms / 1000.0

    def dropped(self) -> bool:
        return self.rng.random() < self.drop_probability

    async def call(
        self,
        src: int,
        dst: int,
        handler: Callable[[], Coroutine[Any, Any, T]],
        timeout_s: float,
        spawn: Callable[[int, Coroutine[Any, Any, None]], None],
    ) -> T:
        """One request from ``src`` to ``dst`` and its answer, each way after a random delay; the handler
        runs as a task of ``dst``'s process (a crash of ``dst`` cancels it)."""
        loop = asyncio.get_running_loop()
        answer: asyncio.Future[T] = loop.create_future()
        src_inc, dst_inc = self.incarnation(src), self.incarnation(dst)

        async def serve() -> None:
            result = await handler()
            if not self.alive(dst, dst_inc) or self.dropped():
                return  # what a process computed after it crashed is never sent
            await asyncio.sleep(self.delay_s(dst, src))
            if self.connected(src, dst) and self.alive(src, src_inc) and not answer.done():
                answer.set_result(result)

        def deliver() -> None:
            if self.connected(src, dst) and self.alive(dst, dst_inc):
                spawn(dst, serve())

        def expire() -> None:
            if not answer.done():
                answer.set_exception(RpcFailed(f"{src} -> {dst}: no answer"))

        if self.connected(src, dst) and not self.dropped():
            loop.call_later(self.delay_s(src, dst), deliver)
        # Not asyncio.wait_for: on Python 3.11 it can swallow a cancellation that arrives as the answer
        # does, and a crashed process's task would run on.
        timer = loop.call_later(timeout_s, expire)
        try:
            return await answer
        finally:
            timer.cancel()


# ------------------------------------------------------------------------------------------ nodes


class Controller:
    """The single-controller mode (``quorum=False``): the active controller's state machine without a
    quorum — it never fails (it can be cut off), and what the logic generates commits at once, in order.
    Serves the same requests as :class:`~kraft.metadata.controller.QuorumController` (the quorum mode), so
    the brokers' code is the same in both modes."""

    def __init__(self, logic: ControllerLogic, clock: ManualClock) -> None:
        self.logic = logic
        self.clock = clock
        self.records: list[mpb.MetadataRecord] = []

    @property
    def image(self) -> MetadataImage:
        return self.logic.image

    def write(self, records: Sequence[mpb.MetadataRecord]) -> None:
        self.records.extend(records)

    async def register_broker(self, request: cpb.RegisterBrokerRequest) -> cpb.RegisterBrokerResponse:
        outcome = self.logic.register_broker(request, self.clock.monotonic_ms(), len(self.records))
        self.write(outcome.records)
        return outcome.response

    async def broker_heartbeat(self, request: cpb.BrokerHeartbeatRequest) -> cpb.BrokerHeartbeatResponse:
        outcome = self.logic.broker_heartbeat(request, self.clock.monotonic_ms(), len(self.records))
        self.write(outcome.records)
        return outcome.response

    async def alter_partition(self, request: cpb.AlterPartitionRequest) -> cpb.AlterPartitionResponse:
        outcome = alter_partition(self.logic, request, len(self.records))
        self.write(outcome.records)
        return outcome.response

    async def create_topics(self, request: cpb.CreateTopicsRequest) -> cpb.CreateTopicsResponse:
        outcome = self.logic.create_topics(request, len(self.records))
        self.write(outcome.records)
        return outcome.response

    async def metadata_fetch(self, request: cpb.MetadataFetchRequest) -> cpb.MetadataFetchResponse:
        response = cpb.MetadataFetchResponse(high_watermark=len(self.records))
        for offset in range(request.fetch_offset, len(self.records)):
            response.records.add(offset=offset, value=encode_value(self.records[offset]))
        return response


ControllerApi = Controller | QuorumController
"""What a broker's controller RPC runs on: the single controller or one node's QuorumController."""


def quorum_options() -> ControllerOptions:
    """The production controller's knobs scaled like the Raft simulation's timings (and the controller
    simulation's, tests/sim/test_controller_sim.py): sessions and heartbeats are the replication sim's."""
    return ControllerOptions(
        session_timeout_ms=SESSION_MS,
        heartbeat_interval_ms=HEARTBEAT_MS,
        noop_interval_ms=100,
        commit_timeout_ms=1_500,
        activation_wait_ms=250,
        leader_lease_ms=100,  # the simulated Raft's fetch timeout
        default_replication_factor=3,
        # the brokers' min.insync.replicas (one .properties value, as a deployment shares it): the ELR
        # rule needs the controller's and the leaders' minimum to agree (kraft.metadata.election_config)
        min_insync_replicas=MIN_ISR,
        snapshot_max_bytes=1 << 40,  # no snapshots: MetadataFetch serves every record from its window
        snapshot_interval_ms=1 << 40,
        # small work units: a broker's ISR removals and unfence elections run in several slices, so a
        # failover can land between them and the new active controller must resume them
        max_work_unit_records=1,
        max_uncommitted_bulk_records=1,
    )


class ControllerQuorum(ControllerSimulation):
    """Three production :class:`QuorumController` nodes over the Raft simulation, as the controller
    simulation runs them (each on its own :class:`VirtualTimeLoop`, so a paused node stands still), on
    the replication simulation's clock; its event queue is driven by :meth:`ReplicationSim.step`."""

    def __init__(self, seed: int, clock: ManualClock) -> None:
        super().__init__(seed, brokers=0)
        self.clock = clock
        self.now_ms = clock.now_ms
        self.max_events = 50_000_000  # bounded by the replication sim's steps instead
        self.options = quorum_options()

    def _start_controller(self, node_id: int) -> None:
        node = self.nodes[node_id]
        raft = SimRaftClient(node, self._note_fencing_decisions, commit_now=self.commit_now)
        controller = QuorumController(
            raft, CLUSTER, {}, self.options, clock=self.clock, new_topic_id=lambda: TOPIC_ID
        )
        loop = VirtualTimeLoop(self.clock)
        self.controllers[node_id] = NodeController(node.incarnation, raft, controller, loop)
        loop.run_until_complete(controller.start())

    def has_ready(self) -> bool:
        return any(e.loop._has_ready() for n, e in self.controllers.items() if n not in self.paused)

    def next_event_ms(self) -> int | None:
        return self.events[0][0] if self.events else None

    def committed_image(self) -> MetadataImage | None:
        """The newest committed image any controller holds (they are prefixes of one log)."""
        images = [e.controller.committed for e in self.controllers.values()]
        return max(images, key=lambda image: image.offset, default=None)

    async def serve(
        self, node_id: int, incarnation: int, op: Callable[[ControllerApi], Coroutine[Any, Any, T]]
    ) -> T:
        """Run ``op`` on ``node_id``'s controller, as a task of that controller's own loop (it runs when
        the simulation runs that loop: never while the node is paused); a crash leaves it unanswered."""
        answer: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        entry = self.controllers.get(node_id)
        if entry is None or entry.incarnation != incarnation:
            return await answer  # the process is gone: no answer (the caller times out)
        task = entry.loop.create_task(op(entry.controller))

        def done(finished: asyncio.Task[T]) -> None:
            if answer.done() or finished.cancelled():
                return
            error = finished.exception()
            if error is not None:
                answer.set_exception(error)
            else:
                answer.set_result(finished.result())

        task.add_done_callback(done)
        return await answer


class SimTransport:
    """The replica fetch over the simulated network (the ReplicaManager's ``transport`` seam)."""

    def __init__(self, sim: ReplicationSim, broker_id: int) -> None:
        self._sim = sim
        self._broker_id = broker_id

    async def replica_fetch(
        self, leader_id: int, request: pb.ReplicaFetchRequest, timeout_s: float
    ) -> pb.ReplicaFetchResponse:
        sim = self._sim

        async def handle() -> pb.ReplicaFetchResponse:
            leader = sim.brokers[leader_id]
            assert leader.replicas is not None
            served = pb.ReplicaFetchRequest()
            served.CopyFrom(request)  # the leader must not share the follower's message object
            return await leader.replicas.replica_fetch(served)

        try:
            return await sim.network.call(self._broker_id, leader_id, handle, timeout_s, sim.spawn)
        except RpcFailed as exc:
            raise ReplicaFetchFailed("UNAVAILABLE") from exc

    async def close(self) -> None:
        return None


class MemoryImageStore:
    """The broker's image store (SQLite in a broker process): what was saved survives a crash."""

    def __init__(self) -> None:
        self.image = MetadataImage.empty()

    async def load(self) -> MetadataImage:
        return self.image

    async def save(self, image: MetadataImage) -> None:
        self.image = image

    async def close(self) -> None:
        return None


@dataclass
class Broker:
    id: int
    directory: Path
    incarnation: int = 0
    running: bool = False
    incarnation_id: str = ""
    partitions: PartitionManager | None = None
    replicas: ReplicaManager | None = None
    service: BrokerService | None = None
    status: BrokerStatus | None = None
    store: MemoryImageStore = field(default_factory=MemoryImageStore)
    publisher: MetadataPublisher | None = None
    metadata_offset: int = -1
    tasks: set[asyncio.Task[Any]] = field(default_factory=set)
    wiped: bool = False  # started on a wiped disk, until a registration of it is unfenced (_counts)
    disk: int = 0  # how many times this broker's disk was lost (the generation of its log dirs)
    # (tp) → offsets verified present with their acknowledged value in this incarnation's log
    verified: dict[TopicPartition, set[int]] = field(default_factory=dict)
    # (tp) → offset below which this incarnation's log equals the committed reference
    matched: dict[TopicPartition, int] = field(default_factory=dict)
    # (tp) → ReplicationSim.version when every acknowledged record was last found in this log
    checked_version: dict[TopicPartition, int] = field(default_factory=dict)


@dataclass
class Reference:
    """The committed history of one partition: batches as first seen below a leader's HWM."""

    batches: list[tuple[int, int, bytes]] = field(default_factory=list)  # (base, last, bytes)
    by_base: dict[int, int] = field(default_factory=dict)
    end: int = 0

    def add(self, data: bytes) -> None:
        for base, last, raw in split_batches(data):
            if base != self.end:
                raise InvariantViolation(f"reference gap: batch at {base}, reference ends at {self.end}")
            self.by_base[base] = len(self.batches)
            self.batches.append((base, last, raw))
            self.end = last + 1

    def bytes_between(self, start: int, end: int) -> bytes:
        """The committed batches from the one based at ``start`` up to the ones based below ``end``."""
        index = self.by_base.get(start)
        if index is None:
            raise InvariantViolation(f"offset {start} is not a committed batch boundary")
        out = bytearray()
        for base, _last, raw in self.batches[index:]:
            if base >= end:
                break
            out += raw
        return bytes(out)


def read_range(log: PartitionLog, start: int, upto: int) -> bytes:
    """The log's whole batches from the one holding ``start`` up to the ones based below ``upto``, through
    its replication read (``read_batches`` stops at a segment's end: read on from there)."""
    out = bytearray()
    offset = start
    while offset < upto:
        data = log.read_batches(offset, 1 << 30, upto)
        if not data:
            break
        out += data
        offset = split_batches(data)[-1][1] + 1
    return bytes(out)


def split_batches(data: bytes) -> list[tuple[int, int, bytes]]:
    out = []
    position = 0
    while position < len(data):
        header = peek_batch_header(data, position)
        out.append((header.base_offset, header.last_offset, data[position : position + header.size_in_bytes]))
        position += header.size_in_bytes
    return out


class ReplicationSim:
    def __init__(self, seed: int, root: Path, *, run_ms: int = RUN_MS, quorum: bool = True) -> None:
        self.seed = seed
        self.run_ms = run_ms
        self.root = root
        self.faults = True  # cleared for the final heal
        self.rng = random.Random(seed)
        self.clock = ManualClock(start_ms=1_000_000)
        self.loop = VirtualTimeLoop(self.clock)
        self.brokers = {b: Broker(b, root / f"broker-{b}") for b in BROKERS}
        self.network = Network(random.Random(seed * 7919 + 1), self._alive, self._incarnation_of)
        self.single: Controller | None = None
        self.quorum: ControllerQuorum | None = None
        if quorum:
            # Its own random stream: the Raft nodes' timers and the quorum's network draw from it.
            self.quorum = ControllerQuorum(seed * 104_729 + 3, self.clock)
        else:
            settings = ControllerSettings(
                cluster_id=CLUSTER, session_timeout_ms=SESSION_MS, min_insync_replicas=MIN_ISR
            )
            logic = ControllerLogic(
                settings, MetadataImage.empty(), self.clock.monotonic_ms(), lambda: TOPIC_ID
            )
            self.single = Controller(logic, self.clock)
            self.single.write(logic.bootstrap_records(0))
        self._image = MetadataImage.empty()
        self.active: tuple[int, int] | None = None  # (node, active epoch) of the quorum's active controller
        # requester (broker id or PRODUCER) → the controller node it sends requests to (quorum mode)
        self.controller_hint: dict[int, int] = {}
        self.acked: dict[TopicPartition, dict[int, bytes]] = {tp: {} for tp in self.tps}
        self.reference: dict[TopicPartition, Reference] = {tp: Reference() for tp in self.tps}
        self.next_value = 0
        self.stats: dict[str, int] = {}
        self.producing = False
        self.tasks: set[asyncio.Task[Any]] = set()  # the sim's own (producers, faults, controller)
        self.events: list[str] = []  # the last events, for a failure message
        self.error: BaseException | None = None  # the first exception a task raised
        # Acknowledged offsets not compared with the committed reference yet (it had not reached them).
        self.unreferenced: dict[TopicPartition, list[int]] = {tp: [] for tp in self.tps}
        # Bumped by every acknowledgement, truncation and restart: a replica whose acknowledged records
        # were verified at the current version need not be looked at again.
        self.version = 0
        # tp → (virtual ms, active controller) since when the committed image names a fenced leader
        self._fenced_leader: dict[TopicPartition, tuple[int, tuple[int, int] | None]] = {}
        # incarnation id → (broker, disk generation it started on): whether an unclean registration's
        # broker really lost its data (:meth:`_eligibility_lost`)
        self.incarnation_disk: dict[str, tuple[int, int]] = {}
        self.offline: list[TopicPartition] = []  # partitions finish() accepted as lost (see there)

    @property
    def controller(self) -> Controller:
        """The single controller (``quorum=False`` only)."""
        if self.single is None:
            raise AssertionError("this simulation runs a controller quorum")
        return self.single

    @property
    def image(self) -> MetadataImage:
        """The committed metadata: the single controller's, or the newest any quorum node applied."""
        if self.single is not None:
            return self.single.image
        assert self.quorum is not None
        image = self.quorum.committed_image()
        if image is not None and image.offset >= self._image.offset:
            self._image = image
        return self._image

    @property
    def tps(self) -> list[TopicPartition]:
        return [TopicPartition(TOPIC, p) for p in range(PARTITIONS)]

    def note(self, event: str) -> None:
        self.events.append(f"t={self.clock.now_ms - 1_000_000} {event}")
        del self.events[:-30]
        kind = event.split(maxsplit=1)[0]
        self.stats[kind] = self.stats.get(kind, 0) + 1

    def fail(self, message: str) -> InvariantViolation:
        recent = "\n  ".join(self.events[-15:])
        return InvariantViolation(
            f"seed {self.seed} at t={self.clock.now_ms - 1_000_000} ms: {message}\n"
            f"  recent events:\n  {recent}"
        )

    # --- processes ---------------------------------------------------------------------------------

    def _alive(self, node: int, incarnation: int) -> bool:
        if node in (CONTROLLER, PRODUCER):
            return True
        if node > CONTROLLER_NET:
            assert self.quorum is not None
            raft_node = self.quorum.nodes[node - CONTROLLER_NET]
            return raft_node.running and raft_node.incarnation == incarnation
        broker = self.brokers[node]
        return broker.running and broker.incarnation == incarnation

    def _incarnation_of(self, node: int) -> int:
        if node > CONTROLLER_NET:
            assert self.quorum is not None
            return self.quorum.nodes[node - CONTROLLER_NET].incarnation
        return self.brokers[node].incarnation if node in self.brokers else 0

    def spawn(self, node: int, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` as part of ``node``'s process: a crash cancels it."""
        task = self.loop.create_task(coro)
        owner = self.brokers[node].tasks if node in self.brokers else self.tasks
        owner.add(task)
        task.add_done_callback(owner.discard)
        task.add_done_callback(self._reraise)

    def _reraise(self, task: asyncio.Task[Any]) -> None:
        if not task.cancelled() and task.exception() is not None and self.error is None:
            self.error = task.exception()

    def start_broker(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        broker.incarnation += 1
        # A UUID, as a real broker's, fixed by (broker, incarnation) so a seed replays exactly.
        broker.incarnation_id = str(uuid.UUID(int=(broker_id << 64) | broker.incarnation))
        # run_broker's take-over of the incarnation file on the broker's log dir: the processes before
        # this one, including those that crashed before their registration was answered (none after a
        # wipe: the file went with the disk).
        predecessors = take_over_incarnation(broker.directory, broker.incarnation_id)
        self.incarnation_disk[broker.incarnation_id] = (broker_id, broker.disk)
        broker.running = True
        broker.verified = {}
        broker.matched = {}
        broker.checked_version = {}
        self.version += 1
        broker.metadata_offset = -1
        status = BrokerStatus(broker_id, CLUSTER, SESSION_MS, clock=self.clock)
        status.incarnation_id = broker.incarnation_id
        status.transition(BrokerState.STARTING)
        opener = self._opener(broker)
        partitions = PartitionManager(broker_id, [broker.directory], opener)
        replicas = ReplicaManager(
            broker_id,
            CLUSTER,
            partitions,
            clock=self.clock,
            broker_epoch=lambda: status.broker_epoch,
            send_alter_partition=lambda request: self._alter_partition(broker_id, request),
            settings=replication_settings(),
            lease=status,
            transport=SimTransport(self, broker_id),
        )
        service = BrokerService(
            status, partitions, ImageMetadataView(MetadataImage.empty()), replicas=replicas
        )
        broker.status, broker.partitions, broker.replicas, broker.service = (
            status,
            partitions,
            replicas,
            service,
        )

        def on_view(view: ImageMetadataView) -> None:  # BrokerServer._on_view
            service.set_view(view)
            replicas.on_image(view.image)

        broker.publisher = MetadataPublisher(
            broker_id, partitions, broker.store, "PLAINTEXT", on_view, clock=self.clock
        )
        self.note(f"start broker={broker_id} incarnation={broker.incarnation}")
        self.spawn(broker_id, self._start(broker, predecessors))

    async def _start(self, broker: Broker, predecessors: tuple[str, ...]) -> None:
        """BrokerServer.start's order: the stored image and a scan of the log dirs (no log opened), then
        registration, heartbeats and the metadata catch-up, which opens the partitions."""
        assert broker.publisher is not None
        await broker.publisher.start()
        broker.metadata_offset = broker.publisher.offset
        self.spawn(broker.id, self._lifecycle(broker, predecessors))
        self.spawn(broker.id, self._metadata_fetcher(broker))
        self.spawn(broker.id, self._periodic(broker))

    def _opener(self, broker: Broker) -> PartitionLogOpener:
        real = segmented_log_opener(SEGMENT_BYTES)

        def open_log(path: Path) -> PartitionLog:
            inner = real(path)
            assert isinstance(inner, SegmentedPartitionLog)
            tp = _tp_of(path)

            def on_truncate(offset: int) -> None:
                self.version += 1
                verified = broker.verified.get(tp)
                if verified is not None:
                    broker.verified[tp] = {o for o in verified if o < offset}
                if broker.matched.get(tp, 0) > offset:
                    broker.matched[tp] = 0  # re-compared from the start (cheap: a truncation is rare)

            return TrackedLog(inner, on_truncate)

        return open_log

    def crash_broker(self, broker_id: int) -> None:
        broker = self.brokers[broker_id]
        assert broker.partitions is not None and broker.replicas is not None
        broker.running = False
        for task in list(broker.tasks):
            task.cancel()
        replicas = broker.replicas
        # The process is gone: no checkpoint, no answer to anyone; its fetchers and AlterPartition
        # tasks die with it (close() would write the HWM checkpoint, which a crash does not).
        replicas._closed = True
        doomed: list[asyncio.Task[None] | None] = [*replicas._fetchers.values()]
        doomed += [led.alter_task for led in replicas._led.values()]
        for doomed_task in doomed:
            if doomed_task is not None:
                doomed_task.cancel()
        lost = []
        for partition in broker.partitions.partitions():
            log = partition.log
            assert isinstance(log, TrackedLog)
            segmented = log.inner._log
            flushed = segmented.flushed_offset
            end = segmented.end_offset
            segmented.abandon()
            kept, torn = lose_unflushed(segmented.dir, flushed, self.rng)
            if end > kept:
                self.stats["lost_unflushed_batches"] = self.stats.get("lost_unflushed_batches", 0) + 1
            if kept > flushed:
                self.stats["kept_unflushed_batches"] = self.stats.get("kept_unflushed_batches", 0) + 1
            if torn:
                self.stats["torn_batches"] = self.stats.get("torn_batches", 0) + 1
            lost.append(f"{partition.tp}:flushed={flushed},end={end},kept={kept}{',torn' if torn else ''}")
        broker.partitions = broker.replicas = broker.service = broker.status = None
        broker.publisher = None
        self.note(f"crash broker={broker_id} {' '.join(lost)}")

    # --- broker processes (the parts of kraft/node/broker.py this simulation drives) -----------------

    async def _rpc(self, src: int, dst: int, handler: Callable[[], Coroutine[Any, Any, T]]) -> T:
        return await self.network.call(src, dst, handler, RPC_TIMEOUT_MS / 1000.0, self.spawn)

    async def _controller_call(self, src: int, op: Callable[[ControllerApi], Coroutine[Any, Any, T]]) -> T:
        """One controller request from ``src`` (raises RpcFailed without an answer).  Quorum mode: to the
        controller ``src`` believes active, as the real ControllerClient does — a NOT_CONTROLLER answer
        names the active one (or none yet), no answer moves on to the next node."""
        if self.single is not None:
            single = self.single
            return await self._rpc(src, CONTROLLER, lambda: op(single))
        quorum = self.quorum
        assert quorum is not None
        node = self.controller_hint.get(src, CONTROLLER_NODES[src % len(CONTROLLER_NODES)])
        incarnation = quorum.nodes[node].incarnation
        try:
            answer = await self._rpc(src, CONTROLLER_NET + node, lambda: quorum.serve(node, incarnation, op))
        except RpcFailed:
            self.controller_hint[src] = CONTROLLER_NODES[node % len(CONTROLLER_NODES)]
            raise
        code = getattr(answer, "error_code", ErrorCode.NONE)
        if code in (ErrorCode.NOT_CONTROLLER, ErrorCode.REQUEST_TIMED_OUT):
            name = f"controller_answered_{ErrorCode(code).name}"
            self.stats[name] = self.stats.get(name, 0) + 1
        if code == ErrorCode.NOT_CONTROLLER:
            named = answer.controller.node_id  # type: ignore[attr-defined]  # every controller answer has it
            self.controller_hint[src] = (
                named if named in CONTROLLER_NODES else CONTROLLER_NODES[node % len(CONTROLLER_NODES)]
            )
        return answer

    async def _lifecycle(self, broker: Broker, predecessors: tuple[str, ...]) -> None:
        """Registration and heartbeats with the rules of :class:`kraft.broker.lifecycle.BrokerLifecycle`:
        the lease runs from when an accepted heartbeat was sent; fenced → RECOVERY, unfenced → RUNNING;
        STALE_BROKER_EPOCH / BROKER_ID_NOT_REGISTERED (the registration was replaced, e.g. by a request
        of this broker's previous process that arrived late) → stop serving at once and register again."""
        status = broker.status
        assert status is not None
        await self._register(broker, predecessors)
        while True:
            request = cpb.BrokerHeartbeatRequest(
                cluster_id=CLUSTER,
                broker_id=broker.id,
                broker_epoch=status.broker_epoch,
                current_metadata_offset=broker.metadata_offset,
                want_fence=not self._caught_up(broker),
            )
            sent_at = self.clock.monotonic_ms()

            async def do_heartbeat(
                controller: ControllerApi, request: cpb.BrokerHeartbeatRequest = request
            ) -> cpb.BrokerHeartbeatResponse:
                return await controller.broker_heartbeat(request)

            with contextlib.suppress(RpcFailed):
                beat = await self._controller_call(broker.id, do_heartbeat)
                assert broker.replicas is not None
                if beat.error_code in (ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED):
                    status.fenced = True
                    status.revoke_lease()
                    if status.state is BrokerState.RUNNING:
                        status.transition(BrokerState.RECOVERY)
                    broker.replicas.check_lease()
                    self.note(f"reregister broker={broker.id} stale_epoch={status.broker_epoch}")
                    await self._register(broker, predecessors)
                elif beat.error_code == ErrorCode.NONE:
                    status.heartbeat_accepted(sent_at)
                    if beat.is_fenced and not status.fenced:
                        status.fenced = True
                        status.transition(BrokerState.RECOVERY)
                        self.note(f"fenced broker={broker.id}")
                    elif not beat.is_fenced and status.fenced:
                        status.fenced = False
                        status.transition(BrokerState.RUNNING)
                        self.note(f"unfenced broker={broker.id}")
                    broker.replicas.check_lease()
            await asyncio.sleep(HEARTBEAT_MS / 1000.0)

    @staticmethod
    def _caught_up(broker: Broker) -> bool:
        """BrokerServer._caught_up: the image holds this broker's registration and its partitions are
        open (the real one also waits for a fence by the controller to show in the image)."""
        status, publisher = broker.status, broker.publisher
        assert status is not None and publisher is not None
        return 0 <= status.broker_epoch <= broker.metadata_offset and not publisher.deferred

    async def _register(self, broker: Broker, predecessors: tuple[str, ...]) -> None:
        """BrokerLifecycle.register, then BrokerServer's rewrite of the incarnation file once accepted (a
        crash before it keeps the chain)."""
        status = broker.status
        assert status is not None
        register = registration_request(
            broker, broker.incarnation_id, predecessors[0] if predecessors else "", predecessors[1:]
        )

        async def do_register(controller: ControllerApi) -> cpb.RegisterBrokerResponse:
            return await controller.register_broker(register)

        while True:
            with contextlib.suppress(RpcFailed):
                answer = await self._controller_call(broker.id, do_register)
                if answer.error_code == ErrorCode.NONE:
                    status.broker_epoch = answer.broker_epoch
                    if status.state is BrokerState.STARTING:
                        status.transition(BrokerState.RECOVERY)
                    accept_incarnation(broker.directory, broker.incarnation_id)
                    return
            await asyncio.sleep(HEARTBEAT_MS / 1000.0)

    async def _metadata_fetcher(self, broker: Broker) -> None:
        """The MetadataFetcher's part: MetadataFetch the committed records after the applied offset (the
        real controller's fetch server in quorum mode) and publish them (the real MetadataPublisher:
        revocations, image store, grants, view), a transaction's records only once it ends; once caught
        up with the high watermark, open the partitions (``open_partitions``)."""
        publisher = broker.publisher
        assert publisher is not None
        fetch_offset = publisher.offset + 1
        pending: MetadataDelta | None = None
        while True:
            request = cpb.MetadataFetchRequest(
                cluster_id=CLUSTER, broker_id=broker.id, fetch_offset=fetch_offset
            )

            async def fetch(
                controller: ControllerApi, request: cpb.MetadataFetchRequest = request
            ) -> cpb.MetadataFetchResponse:
                return await controller.metadata_fetch(request)

            with contextlib.suppress(RpcFailed):
                answer = await self._controller_call(broker.id, fetch)
                if answer.error_code == ErrorCode.NONE:
                    if answer.HasField("snapshot_id"):
                        raise self.fail(f"broker {broker.id} was offered a snapshot (snapshots are off)")
                    if answer.records:  # one fetch at a time: it answers from fetch_offset on
                        delta = pending or MetadataDelta(publisher.image)
                        for record in answer.records:
                            delta.replay(decode_value(record.value), record.offset, record.leader_epoch)
                        if delta.replay_errors:
                            raise self.fail(f"broker {broker.id} cannot replay: {list(delta.replay_errors)}")
                        fetch_offset = answer.records[-1].offset + 1
                        pending = delta if delta.in_transaction else None
                        if pending is None:
                            await publisher.publish(delta)
                            broker.metadata_offset = publisher.offset
                    if publisher.deferred and pending is None and fetch_offset >= answer.high_watermark:
                        await publisher.open_partitions()
                        self.note(f"partitions_opened broker={broker.id} offset={publisher.offset}")
            await asyncio.sleep(METADATA_POLL_MS / 1000.0)

    async def _periodic(self, broker: Broker) -> None:
        """ReplicaManager.run's duties (the ISR shrink check, the lease watch, the HWM checkpoint), with the
        checkpoint written on the loop's thread (its writer thread would make a run depend on timing)."""
        replicas = broker.replicas
        assert replicas is not None
        ticks = 0
        while True:
            await asyncio.sleep(LEASE_CHECK_MS / 1000.0)
            ticks += 1
            replicas.check_lease()
            if ticks % ((LAG_MS // 2) // LEASE_CHECK_MS) == 0:
                replicas.check_isr_shrinks()
            if ticks % (CHECKPOINT_MS // LEASE_CHECK_MS) == 0:
                replicas.checkpoint_high_watermarks()

    async def _alter_partition(
        self, broker_id: int, request: cpb.AlterPartitionRequest
    ) -> cpb.AlterPartitionResponse:
        async def handle(controller: ControllerApi) -> cpb.AlterPartitionResponse:
            return await controller.alter_partition(request)

        try:
            return await self._controller_call(broker_id, handle)
        except RpcFailed:
            return cpb.AlterPartitionResponse(error_code=ErrorCode.REQUEST_TIMED_OUT)

    # --- the controller's timers ---------------------------------------------------------------------

    async def _controller_timers(self) -> None:
        """The single controller's session checker and bulk job driver (a QuorumController has its own)."""
        logic = self.controller.logic
        while True:
            await asyncio.sleep(HEARTBEAT_MS / 1000.0 / 2)
            now = self.clock.monotonic_ms()
            while True:
                fenced, records = logic.fence_expired(now, len(self.controller.records))
                self.controller.write(records)
                if fenced >= 0:
                    self.note(f"session_expired broker={fenced}")
                if not records:
                    break
            while logic.has_bulk_jobs():
                self.controller.write(logic.continue_bulk_jobs(len(self.controller.records)))
            logic.index_some()

    # --- producers -------------------------------------------------------------------------------------

    async def _producer(self, tp: TopicPartition) -> None:
        while True:
            await asyncio.sleep(self.rng.randint(3, 25) / 1000.0)
            if not self.producing:
                continue
            self.spawn(PRODUCER, self._produce_once(tp))

    async def _produce_once(self, tp: TopicPartition) -> None:
        partition = self.image.partition(TOPIC_ID, tp.partition)
        leader = partition.leader if partition is not None else -1
        if self.rng.random() < 0.1 or leader < 0:
            leader = self.rng.choice(BROKERS)
        values = []
        for _ in range(self.rng.randint(1, 3)):
            values.append(f"{tp.partition}:{self.next_value}:".encode() + b"x" * self.rng.randint(0, 40))
            self.next_value += 1
        request = pb.ProduceRequest(
            cluster_id=CLUSTER,
            topic=tp.topic,
            partition=tp.partition,
            leader_epoch=-1,
            acks=-1,
            records=[pb.BrokerRecord(value=v, has_value=True) for v in values],
        )

        async def handle() -> pb.ProduceResponse:
            service = self.brokers[leader].service
            assert service is not None
            return await service.Produce(request, None)  # type: ignore[arg-type]  # no authorizer: unused

        try:
            answer = await self.network.call(
                PRODUCER, leader, handle, 2 * PRODUCE_TIMEOUT_MS / 1000.0, self.spawn
            )
        except RpcFailed:
            return
        if answer.error_code != ErrorCode.NONE:
            self.stats[f"produce_{ErrorCode(answer.error_code).name}"] = (
                self.stats.get(f"produce_{ErrorCode(answer.error_code).name}", 0) + 1
            )
            return
        acked = self.acked[tp]
        for i, value in enumerate(values):
            offset = answer.base_offset + i
            previous = acked.get(offset)
            if previous is not None and previous != value:
                raise self.fail(f"{tp} offset {offset} acknowledged twice: {previous!r} and {value!r}")
            if offset not in acked:
                self.unreferenced[tp].append(offset)
            acked[offset] = value
        self.version += 1
        self.note(
            f"acked {tp} offsets={answer.base_offset}..{answer.base_offset + len(values) - 1} leader={leader}"
        )

    # --- faults ------------------------------------------------------------------------------------------

    async def _faults(self) -> None:
        rng = self.rng
        while True:
            await asyncio.sleep(rng.randint(150, 700) / 1000.0)
            if not self.faults:
                continue
            if self.quorum is not None and rng.random() < CONTROLLER_FAULT_SHARE:
                self._controller_fault(self.quorum)
                continue
            running = [b for b in BROKERS if self.brokers[b].running]
            roll = rng.random()
            if roll < 0.3 and len(running) >= 2:
                victim = rng.choice(running)
                self.crash_broker(victim)
                if self.quorum is not None and rng.random() < WIPE_SHARE:
                    self.wipe_broker(victim)
                self.spawn(CONTROLLER, self._restart_later(victim, rng.randint(50, 1200)))
                if self.quorum is not None and rng.random() < 0.3:
                    # The active controller fails around the victim's session expiry: the new one finds
                    # the fence (or not) and the ISR removals half written, and must finish them.
                    delay = rng.randint(SESSION_MS - 200, SESSION_MS + 300)
                    self.quorum.schedule(delay, self._crash_active_controller)
            elif roll < 0.5:
                victim = rng.choice(BROKERS)
                self.network.isolated.add(victim)
                self.note(f"isolate broker={victim}")
                self.spawn(
                    CONTROLLER, self._heal_later(functools.partial(self.network.isolated.discard, victim))
                )
            elif roll < 0.7:
                a, b = rng.sample([*self._controller_net_ids(), *BROKERS], 2)
                link = frozenset((a, b))
                self.network.cut.add(link)
                self.note(f"cut {a}-{b}")
                self.spawn(CONTROLLER, self._heal_later(functools.partial(self.network.cut.discard, link)))
            elif roll < 0.8:
                victim = rng.choice(BROKERS)
                self.network.slow[victim] = rng.randint(100, 900)
                self.note(f"slow broker={victim} extra_ms={self.network.slow[victim]}")
                self.spawn(CONTROLLER, self._heal_later(functools.partial(self._unslow, victim)))
            elif roll < 0.9:
                self.network.cut.clear()
                self.network.isolated.clear()
                self.network.slow.clear()
                if self.quorum is not None:
                    self.quorum.schedule(0, self._heal_quorum)
                self.note("heal all")

    def wipe_broker(self, broker_id: int) -> None:
        """The crashed broker's disk is replaced: logs, checkpoints, incarnation file and stored image
        are gone.  Its next incarnation names no predecessor: the controller must treat it as an unclean
        shutdown (out of every ISR and ELR) before it counts for anything."""
        broker = self.brokers[broker_id]
        shutil.rmtree(broker.directory, ignore_errors=True)
        broker.directory.mkdir(parents=True)
        broker.store = MemoryImageStore()
        broker.wiped = True
        broker.disk += 1
        self.note(f"wipe broker={broker_id}")

    def _counts(self, broker_id: int, image: MetadataImage) -> bool:
        """Whether ``broker_id`` is the replica the metadata means: a wiped disk's incarnation only once
        the controller unfenced its registration — until then the image's ISR may name the lost disk (the
        registration is committed before the ISR removals of its unclean shutdown, in slices); from then
        on it may be elected, so it must hold everything acknowledged if it is still in an ISR."""
        broker = self.brokers[broker_id]
        if not broker.wiped:
            return True
        registration = image.brokers.get(broker_id)
        if (
            broker.running  # else incarnation_id is still the crashed one's, whose disk this is not
            and registration is not None
            and registration.incarnation_id == broker.incarnation_id
            and not registration.fenced
        ):
            broker.wiped = False
            return True
        return False

    def _controller_net_ids(self) -> list[int]:
        if self.quorum is None:
            return [CONTROLLER]
        return [CONTROLLER_NET + n for n in CONTROLLER_NODES]

    def _controller_fault(self, quorum: ControllerQuorum) -> None:
        """A fault of the metadata quorum: crash a controller (the active one more often than not: a
        failover) and restart it later, pause one (SIGSTOP: its requests wait, stale, until it resumes),
        isolate one from everyone, or cut one controller-controller link.  Acted on as events of the
        quorum's queue (outside every event loop), at most one controller down or paused at a time."""
        rng = self.rng
        roll = rng.random()
        up = [n for n in CONTROLLER_NODES if quorum.nodes[n].running and n not in quorum.paused]
        active = quorum.active_controller()
        target = active[0] if active is not None and rng.random() < 0.7 else rng.choice(CONTROLLER_NODES)
        if roll < 0.45:
            if len(up) < len(CONTROLLER_NODES):
                return
            self.note(f"controller_crash node={target} active={active[0] if active else None}")
            quorum.schedule(0, functools.partial(quorum.crash, target))
            quorum.schedule(rng.randint(50, 1500), functools.partial(self._start_controller_node, target))
        elif roll < 0.6:
            if len(up) < len(CONTROLLER_NODES):
                return
            self.note(f"controller_pause node={target}")
            quorum.schedule(0, functools.partial(quorum.pause, target))
            quorum.schedule(rng.randint(50, 1000), functools.partial(self._resume_controller, target))
        elif roll < 0.85:
            self.note(f"controller_isolate node={target}")
            quorum.schedule(0, functools.partial(self._isolate_controller, target, True))
            quorum.schedule(
                rng.randint(100, 1500), functools.partial(self._isolate_controller, target, False)
            )
        else:
            a, b = rng.sample(CONTROLLER_NODES, 2)
            self.note(f"controller_cut {a}-{b}")
            quorum.schedule(0, functools.partial(quorum.router.cut, {a}, {b}))
            quorum.schedule(rng.randint(100, 1500), functools.partial(self._uncut_controllers, a, b))

    def _crash_active_controller(self, why: str = "at a session expiry") -> None:
        quorum = self.quorum
        assert quorum is not None
        active = quorum.active_controller()
        up = [n for n in CONTROLLER_NODES if quorum.nodes[n].running and n not in quorum.paused]
        if not self.faults or active is None or len(up) < len(CONTROLLER_NODES):
            return
        self.note(f"controller_crash node={active[0]} active={active[0]} ({why})")
        quorum.crash(active[0])
        quorum.schedule(self.rng.randint(50, 1000), functools.partial(self._start_controller_node, active[0]))

    def _start_controller_node(self, node_id: int) -> None:
        assert self.quorum is not None
        if not self.quorum.nodes[node_id].running:
            self.quorum.nodes[node_id].start()
            self.note(f"controller_restart node={node_id}")

    def _resume_controller(self, node_id: int) -> None:
        assert self.quorum is not None
        if node_id in self.quorum.paused:
            self.quorum.resume(node_id)
            self.note(f"controller_resume node={node_id}")

    def _isolate_controller(self, node_id: int, isolated: bool) -> None:
        assert self.quorum is not None
        if isolated:
            self.quorum.router.isolated.add(node_id)
            self.network.isolated.add(CONTROLLER_NET + node_id)
        else:
            self.quorum.router.isolated.discard(node_id)
            self.network.isolated.discard(CONTROLLER_NET + node_id)

    def _uncut_controllers(self, a: int, b: int) -> None:
        assert self.quorum is not None
        self.quorum.router.blocked -= {(a, b), (b, a)}

    def _heal_quorum(self) -> None:
        assert self.quorum is not None
        self.quorum.router.isolated.clear()
        self.quorum.router.blocked.clear()

    def _unslow(self, broker_id: int) -> None:
        self.network.slow.pop(broker_id, None)

    async def _heal_later(self, heal: Callable[[], None]) -> None:
        await asyncio.sleep(self.rng.randint(100, 1500) / 1000.0)
        heal()
        self.note("heal one")

    async def _restart_later(self, broker_id: int, delay_ms: int) -> None:
        await asyncio.sleep(delay_ms / 1000.0)
        if self.brokers[broker_id].running:
            return
        self.start_broker(broker_id)
        if self.rng.random() < 0.4:
            # Crash it again while it recovers and catches up: a follower behind its leader holds fetched
            # batches it has not flushed yet (catch_up_flush_bytes), which is what a crash loses.
            await asyncio.sleep(self.rng.randint(20, 400) / 1000.0)
            running = [b for b in BROKERS if self.brokers[b].running]
            broker = self.brokers[broker_id]
            if self.faults and broker.running and len(running) >= 2:
                self.crash_broker(broker_id)
                self.spawn(CONTROLLER, self._restart_later(broker_id, self.rng.randint(50, 600)))

    # --- driving -----------------------------------------------------------------------------------------

    def step(self) -> None:
        """Run everything due now, check, then move the clock to the next timer (of the brokers' loop or
        the quorum's event queue, whose events — Raft messages and timers, the controllers' loops' timers —
        run at exactly their time)."""
        self._settle()
        if self.error is not None:
            where = "".join(traceback.format_exception(self.error)[-6:])
            raise self.fail(f"a task failed: {self.error!r}\n{where}") from self.error
        self.check()
        timers = [self.loop.next_timer_ms()]
        if self.quorum is not None:
            timers.append(self.quorum.next_event_ms())
        next_ms = min((t for t in timers if t is not None), default=None)
        if next_ms is None:
            raise self.fail("nothing left to run")
        next_ms = max(next_ms, self.clock.now_ms)
        if self.quorum is not None:
            try:
                self.quorum.run_until(next_ms)  # the events due then (each followed by the controllers' turn)
            except InvariantViolation as exc:
                raise self.fail(f"controller quorum: {exc}") from exc
        self.clock.now_ms = next_ms

    def _settle(self) -> None:
        """Run the brokers' loop and the controllers' loops in turn until none has anything ready now: a
        request to a controller is a task of its loop, its answer resolves a future of the brokers' loop."""
        quorum = self.quorum
        for _ in range(10_000):
            self.loop.run_ready()  # returns with nothing of the brokers' ready or due
            # Raft events sync the controllers themselves (ControllerSimulation.check_invariants): only
            # requests the brokers just handed to a controller's loop are left to run here.
            if quorum is None or not quorum.has_ready():
                if quorum is not None:
                    self._note_active(quorum)
                return
            quorum._sync_controllers()
        raise self.fail("the event loops never went idle")

    def _note_active(self, quorum: ControllerQuorum) -> None:
        active = quorum.active_controller()
        if active is not None and (self.active is None or active[1].state.active_epoch > self.active[1]):
            if self.active is not None:
                self.note(f"controller_failover node={active[0]} epoch={active[1].state.active_epoch}")
            self.active = (active[0], active[1].state.active_epoch)

    def run_for(self, ms: int, until: Callable[[], bool] | None = None) -> bool:
        deadline = self.clock.now_ms + ms
        steps = 0
        while self.clock.now_ms < deadline:
            self.step()
            steps += 1
            if steps > MAX_STEPS:
                raise self.fail("too many steps")
            if until is not None and until():
                return True
        return until is None

    def run(self, script: Callable[[ReplicationSim], None] | None = None) -> None:
        """Start, write with faults for ``run_ms`` (or run ``script`` instead of the random faults), then
        heal and check convergence."""
        if self.quorum is not None:
            self.quorum.start_all()
        else:
            self.spawn(CONTROLLER, self._controller_timers())
        for b in BROKERS:
            self.start_broker(b)
        if not self.run_for(START_BOUND_MS, self._all_unfenced):
            raise self.fail("the brokers never registered and unfenced")
        self.spawn(CONTROLLER, self._create_topic())
        if not self.run_for(START_BOUND_MS, self._converged):
            raise self.fail("the topic never became fully replicated")
        self.producing = True
        for tp in self.tps:
            self.spawn(CONTROLLER, self._producer(tp))
        if script is None:
            self.spawn(CONTROLLER, self._faults())
            self.run_for(self.run_ms)
        else:
            script(self)
        self.finish()

    def finish(self) -> None:
        self.faults = False
        self.producing = False
        self.network.cut.clear()
        self.network.isolated.clear()
        self.network.slow.clear()
        self.note("final heal")
        if self.quorum is not None:
            self._heal_quorum()
            for node_id in CONTROLLER_NODES:
                self._resume_controller(node_id)
                self._start_controller_node(node_id)
        for b in BROKERS:
            if not self.brokers[b].running:
                self.start_broker(b)
        if not self.run_for(HEAL_BOUND_MS, self._converged):
            raise self.fail(f"no convergence after healing: {self._convergence_report()}")
        self.check_final()
        if self.quorum is not None:
            truncations = sum(node.stats.truncations for node in self.quorum.nodes.values())
            self.stats["controller_log_truncations"] = truncations

    def close(self) -> None:
        """Stop every task and abandon the logs (the tmp dir goes away with them)."""
        for broker in self.brokers.values():
            broker.running = False
            if broker.replicas is not None:
                broker.replicas._closed = True
        for _ in range(10):
            pending = [t for t in asyncio.all_tasks(self.loop) if not t.done()]
            if not pending:
                break
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
        for broker in self.brokers.values():
            if broker.partitions is not None:
                for partition in broker.partitions.partitions():
                    log = partition.log
                    assert isinstance(log, TrackedLog)
                    log.inner._log.abandon()
        self.loop.close()
        if self.quorum is not None:
            self.quorum.close()
        shutil.rmtree(self.root, ignore_errors=True)

    def _all_unfenced(self) -> bool:
        brokers = self.image.brokers
        return all(b in brokers and not brokers[b].fenced for b in BROKERS) and all(
            self.brokers[b].status is not None and not self.brokers[b].status.fenced  # type: ignore[union-attr]
            for b in BROKERS
        )

    async def _create_topic(self) -> None:
        """The admin client's CreateTopics, retried until the topic is in the committed metadata (an
        answer lost to a failover says nothing about whether it was created)."""
        request = cpb.CreateTopicsRequest(
            cluster_id=CLUSTER,
            topics=[cpb.CreatableTopic(name=TOPIC, num_partitions=PARTITIONS, replication_factor=3)],
        )

        async def create(controller: ControllerApi) -> cpb.CreateTopicsResponse:
            return await controller.create_topics(request)

        while self.image.topic(TOPIC) is None:
            with contextlib.suppress(RpcFailed):
                answer = await self._controller_call(PRODUCER, create)
                if answer.topics and answer.topics[0].error_code not in (
                    ErrorCode.NONE,
                    ErrorCode.TOPIC_ALREADY_EXISTS,
                ):
                    raise self.fail(f"create topic failed: {answer}")
            await asyncio.sleep(HEARTBEAT_MS / 1000.0)

    # --- checks ------------------------------------------------------------------------------------------

    def _leader_of(self, tp: TopicPartition) -> tuple[Broker, Any] | None:
        """The broker the controller names leader of ``tp`` if it runs and leads that epoch."""
        registration = self.image.partition(TOPIC_ID, tp.partition)
        if registration is None or registration.leader < 0:
            return None
        broker = self.brokers[registration.leader]
        if not broker.running or broker.replicas is None:
            return None
        state = broker.replicas.leader_state(tp)
        if state is None or state.leader_epoch != registration.leader_epoch:
            return None
        return broker, state

    def _log_of(self, broker: Broker, tp: TopicPartition) -> TrackedLog | None:
        if not broker.running or broker.partitions is None:
            return None
        partition = broker.partitions.get(tp)
        if partition is None:
            return None
        log = partition.log
        assert isinstance(log, TrackedLog)
        return log

    def check(self) -> None:
        image = self.image
        active = self._active_key()
        for tp in self.tps:
            registration = image.partition(TOPIC_ID, tp.partition)
            if registration is None:
                continue
            self._check_fenced_leader(tp, image, registration.leader, active)
            reference = self.reference[tp]
            current = self._leader_of(tp)
            if current is not None:
                leader, state = current
                hwm = state.high_watermark
                log = self._log_of(leader, tp)
                assert log is not None
                if hwm > log.log_end_offset or hwm > log.flushed_offset:
                    raise self.fail(
                        f"{tp} leader {leader.id} HWM {hwm} above its log end {log.log_end_offset} "
                        f"or flushed offset {log.flushed_offset}"
                    )
                if hwm > reference.end:
                    reference.add(read_range(log, reference.end, hwm))
                members = {registration.leader, *registration.isr}
                for member in sorted(members):
                    if self._counts(member, image):
                        self._check_matches(self.brokers[member], tp, min(hwm, reference.end))
            acked = self.acked[tp]
            for member in sorted({*registration.isr, registration.leader} - {-1}):
                if self._counts(member, image):
                    self._check_acked(self.brokers[member], tp, acked)
            pending = self.unreferenced[tp]
            if pending and min(pending) < reference.end:
                for offset in [o for o in pending if o < reference.end]:
                    self._check_reference_holds(tp, offset, acked[offset])
                self.unreferenced[tp] = [o for o in pending if o >= reference.end]

    def _active_key(self) -> tuple[int, int] | None:
        """The controller that answers now: (node, active epoch); None while no controller is active."""
        if self.quorum is None:
            return (CONTROLLER, 0)
        active = self.quorum.active_controller()
        return None if active is None else (active[0], active[1].state.active_epoch)

    def _check_fenced_leader(
        self, tp: TopicPartition, image: MetadataImage, leader: int, active: tuple[int, int] | None
    ) -> None:
        """A fenced broker leads a partition only until the active controller's ISR removal reaches it
        (a slice of a bulk job): a controller that stays active for FENCED_LEADER_BOUND_MS with a fenced
        leader in the committed image lost that job (e.g. a new active controller that never resumed the
        ISR removals its predecessor left half written)."""
        broker = image.brokers.get(leader) if leader >= 0 else None
        if broker is None or not broker.fenced:
            self._fenced_leader.pop(tp, None)
            return
        since = self._fenced_leader.get(tp)
        now = self.clock.now_ms
        if since is None or since[1] != active or active is None:
            self._fenced_leader[tp] = (now, active)
            if since is None:
                self.note(f"fenced_leader {tp} broker={leader}")
            if since is None and self.quorum is not None and self.faults and self.rng.random() < 0.75:
                # The worst moment for a failover: the fence committed, the ISR removals are half
                # written.  The next active controller must find the job in the image and finish it.
                self.quorum.schedule(0, functools.partial(self._crash_active_controller, "mid ISR removal"))
        elif now - since[0] > FENCED_LEADER_BOUND_MS:
            raise self.fail(
                f"{tp} is led by fenced broker {leader} in the committed metadata for {now - since[0]} ms "
                f"while controller {active} is active"
            )

    def _check_matches(self, broker: Broker, tp: TopicPartition, upto: int) -> None:
        """``broker``'s log below ``upto`` (a committed batch boundary or the reference end) equals the
        committed reference byte for byte (checked incrementally: only what was not compared yet)."""
        log = self._log_of(broker, tp)
        if log is None:
            return
        start = broker.matched.get(tp, 0)
        if start >= upto:
            return
        if log.log_end_offset < upto:
            raise self.fail(
                f"{tp} ISR member {broker.id} ends at {log.log_end_offset}, below the leader's HWM {upto}"
            )
        mine = read_range(log, start, upto)
        expected = self.reference[tp].bytes_between(start, upto)
        if mine != expected:
            raise self.fail(
                f"{tp} broker {broker.id} differs from the committed log in [{start}, {upto}): "
                f"{_describe(mine)} vs {_describe(expected)}"
            )
        batches = split_batches(mine)
        broker.matched[tp] = batches[-1][1] + 1 if batches else start

    def _check_acked(self, broker: Broker, tp: TopicPartition, acked: dict[int, bytes]) -> None:
        log = self._log_of(broker, tp)
        if log is None or broker.checked_version.get(tp) == self.version:
            return
        verified = broker.verified.setdefault(tp, set())
        for offset in sorted(set(acked) - verified):
            if offset in verified:
                continue
            if offset >= log.log_end_offset:
                raise self.fail(
                    f"{tp} acknowledged offset {offset} is missing on ISR member {broker.id} "
                    f"(log end {log.log_end_offset})"
                )
            for record in log.read_records(offset, 1):
                if record.offset in acked:
                    if record.value != acked[record.offset]:
                        raise self.fail(
                            f"{tp} broker {broker.id} holds {record.value!r} at acknowledged offset "
                            f"{record.offset}, acknowledged as {acked[record.offset]!r}"
                        )
                    verified.add(record.offset)
            if offset not in verified:
                raise self.fail(f"{tp} acknowledged offset {offset} not readable on broker {broker.id}")
        broker.checked_version[tp] = self.version

    def _check_reference_holds(self, tp: TopicPartition, offset: int, value: bytes) -> None:
        reference = self.reference[tp]
        base_index = bisect.bisect_right([b for b, _, _ in reference.batches], offset) - 1
        base, last, raw = reference.batches[base_index]
        if not base <= offset <= last:
            raise self.fail(f"{tp} acknowledged offset {offset} not in the committed log")
        record = next(iter(iter_batches(raw))).records[offset - base]
        if record.value != value:
            raise self.fail(f"{tp} committed offset {offset} holds {record.value!r}, acknowledged {value!r}")

    def _converged(self) -> bool:
        image = self.image
        for tp in self.tps:
            registration = image.partition(TOPIC_ID, tp.partition)
            if registration is not None and _lost(registration):
                continue  # final: nothing re-enters an empty ISR and ELR (check_final judges it)
            if registration is None or sorted(registration.isr) != list(BROKERS):
                return False
            current = self._leader_of(tp)
            if current is None:
                return False
            leader, state = current
            log = self._log_of(leader, tp)
            assert log is not None
            if state.high_watermark != log.log_end_offset:
                return False
            for b in BROKERS:
                other = self._log_of(self.brokers[b], tp)
                if other is None or other.log_end_offset != log.log_end_offset:
                    return False
        return self._all_unfenced()

    def _convergence_report(self) -> str:
        image = self.image
        parts = []
        for tp in self.tps:
            registration = image.partition(TOPIC_ID, tp.partition)
            ends = {
                b: (lg.log_end_offset if (lg := self._log_of(self.brokers[b], tp)) else None) for b in BROKERS
            }
            current = self._leader_of(tp)
            hwm = current[1].high_watermark if current else None
            parts.append(f"{tp}: {registration} hwm={hwm} ends={ends}")
        return "; ".join(parts)

    def _committed_records(self) -> list[tuple[int, mpb.MetadataRecord]]:
        """The whole committed metadata log, in order: the single controller's records, or the quorum's
        (read from a node whose Raft log holds every committed offset: no snapshots here, so the log
        starts at 0, and committed entries are the same on every node that has them)."""
        if self.single is not None:
            return list(enumerate(self.single.records))
        assert self.quorum is not None
        last = self.image.offset
        for node in self.quorum.nodes.values():
            log = node.log
            if log.start_offset != 0 or log.end_offset <= last:
                continue
            out: list[tuple[int, mpb.MetadataRecord]] = []
            for base, _last, _epoch, values in log.batches:
                for offset, value in enumerate(values, base):
                    if offset <= last and isinstance(value, bytes):
                        out.append((offset, decode_value(value)))
            return out
        raise self.fail(f"no controller node holds the committed log up to {last}")

    def _eligibility_lost(self, tp: TopicPartition) -> list[str]:
        """Replays the committed log and returns every way ``tp``'s eligible replicas (ISR and ELR) lost a
        member that KIP-966 does not allow: an empty list proves that when the partition ended with no
        eligible replica, none that could hold the acknowledged records remained.  A member may leave
        only (a) with the new ISR at or above min ISR (records acknowledged from then on need that ISR,
        which holds every earlier one: the leaver may lack them), or (b) as the unclean shutdown of an
        incarnation that really lost the disk — started on a disk generation other than the broker's
        registration before it (``incarnation_disk``; a wipe in between).  An unclean judgement of a broker
        whose disk was intact, or any other drop, is reported: then data that survived was given up."""
        delta = MetadataDelta(MetadataImage.empty())
        registered: dict[int, str] = {}  # broker → incarnation of its latest RegisterBrokerRecord
        previous: dict[int, str] = {}  # broker → the incarnation registered before that one
        wrong: list[str] = []
        for offset, record in self._committed_records():
            kind = record.WhichOneof("record")
            if kind == "register_broker":
                r = record.register_broker
                if r.broker_id in registered:
                    previous[r.broker_id] = registered[r.broker_id]
                registered[r.broker_id] = r.incarnation_id
            before = delta.partition(TOPIC_ID, tp.partition)
            delta.replay(record, offset)
            after = delta.partition(TOPIC_ID, tp.partition)
            if before is None or after is None or after is before:
                continue
            lost = {*before.isr, *before.elr} - {*after.isr, *after.elr}
            if not lost or len(after.isr) >= effective_min_isr(MIN_ISR, after.replicas):
                continue  # (a)
            for member in sorted(lost):
                broker = delta.broker(member)
                now = registered.get(member)
                if broker is not None and broker.unclean_shutdown and now is not None:
                    disk_then = self.incarnation_disk.get(previous.get(member, ""), (member, 0))
                    disk_now = self.incarnation_disk.get(now)
                    if disk_now is not None and disk_now[1] != disk_then[1]:
                        continue  # (b)
                wrong.append(
                    f"offset {offset}: broker {member} left {tp}'s ISR/ELR "
                    f"({before.isr}/{before.elr} -> {after.isr}/{after.elr}) with its data"
                )
        return wrong

    def _check_lost(self, tp: TopicPartition) -> None:
        """``tp`` ended with no eligible replica (KIP-966: offline rather than lose acknowledged
        records, unclean election being off).  Accepted only where the record history proves it: every
        eligible replica it lost left legitimately (:meth:`_eligibility_lost`)."""
        wrong = self._eligibility_lost(tp)
        if wrong:
            raise self.fail(f"{tp} offline, but eligible replicas were dropped: " + "; ".join(wrong))
        self.offline.append(tp)
        self.note(f"offline {tp} (every replica that held its acknowledged records lost its disk)")

    def check_final(self) -> None:
        image = self.image
        for tp in self.tps:
            registration = image.partition(TOPIC_ID, tp.partition)
            if registration is not None and _lost(registration):
                self._check_lost(tp)
                continue
            current = self._leader_of(tp)
            assert current is not None
            leader, state = current
            log = self._log_of(leader, tp)
            assert log is not None
            end = log.log_end_offset
            everything = read_range(log, 0, end)
            for b in BROKERS:
                other = self._log_of(self.brokers[b], tp)
                assert other is not None
                if read_range(other, 0, end) != everything:
                    raise self.fail(f"{tp} broker {b} differs from leader {leader.id} after healing")
            self._check_matches(leader, tp, min(state.high_watermark, self.reference[tp].end))
            for b in BROKERS:
                self.brokers[b].verified.pop(tp, None)
                self.brokers[b].checked_version.pop(tp, None)
                self._check_acked(self.brokers[b], tp, self.acked[tp])


def _lost(registration: PartitionRegistration) -> bool:
    """No leader and nobody eligible (ISR and ELR empty): without unclean election (off here) nothing
    can elect a leader again, the state is final."""
    return registration.leader < 0 and not registration.isr and not registration.elr


def registration_request(
    broker: Broker, incarnation_id: str, previous: str, earlier: Sequence[str] = ()
) -> cpb.RegisterBrokerRequest:
    return cpb.RegisterBrokerRequest(
        cluster_id=CLUSTER,
        broker_id=broker.id,
        incarnation_id=incarnation_id,
        listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9000 + broker.id)],
        log_dirs=[str(broker.directory)],
        previous_broker_epoch=-1,
        previous_incarnation_id=previous,
        earlier_incarnation_ids=list(earlier),
    )


def _tp_of(path: Path) -> TopicPartition:
    topic, _, partition = path.name.rpartition("-")
    return TopicPartition(topic, int(partition))


def _describe(data: bytes) -> str:
    return str([(base, last, len(raw)) for base, last, raw in split_batches(data)])


def run_seed(seed: int, root: Path, *, quorum: bool = True) -> ReplicationSim:
    sim = ReplicationSim(seed, root, quorum=quorum)
    try:
        sim.run()
    finally:
        sim.close()
    return sim
