"""Partition replication on a broker: the shell around :mod:`kraft.replication` (issue #16).

Rules live in the pure package (docs/internals/replication.md); this module feeds them events and
carries their decisions out.  All on the broker's event loop, so no locks.

**Leader side** (a :class:`_Led` per partition this broker leads, created when the image says so):
- the leader's own position is its log's *flushed* offset — appends are flushed right after (one fsync
  per partition per loop turn, however many Produce requests came in it), so "in the high watermark"
  means "on disk on every ISR member";
- ``ReplicaFetch`` serves the leader's whole log, flushed or not (Kafka's followers fetch from the
  leader's log end): an append wakes the parked replica fetches at once, so the followers' append+fsync
  overlaps the leader's own flush instead of following it.  What *counts* stays durable: the leader by
  its flushed end, a follower by the ``durable_offset`` its fetch reports (its flushed end; it flushes
  before it fetches again once caught up).  A follower may so be durable past the leader's flushed end;
  the high watermark, the minimum over the ISR, never is.  A leader that crashes before its flush can
  lose only unacknowledged records, and a follower holding them truncates them by leader epoch when it
  next fetches (docs/internals/replication.md, "Serving unflushed batches");
- the fetch checks the follower's position against the leader's epochs (``diverging_epoch``), records
  it (``on_follower_fetch``) and answers with the high watermark.  A high watermark that advances does
  not wake parked replica fetches: followers learn it with the next batches or at the end of the
  long-poll (Kafka's: a follower's fetch is not completed by a high-watermark change), which spares two
  empty round trips per acks=all request;
- every ``replica.lag.time.max.ms / 2`` (Kafka's cadence) lagging ISR members are proposed out; after a
  follower fetch, caught-up replicas are proposed in (eligibility from the image: registered, unfenced, not
  shutting down, fetching with their registered broker epoch).  Proposals go to the active controller as
  AlterPartition; RETRY answers are resent after a backoff, the others settle with the next metadata;
- consumers read below the high watermark (:meth:`ReplicaManager.high_watermark`), and long-polling
  readers are woken when it advances; acks=all produce requests wait for it (:meth:`wait_for_acks`).

**Follower side**: one fetcher task per leader broker, one ``ReplicaFetch`` for all the partitions it
follows there (long-poll at the leader).  A response's batches are appended byte for byte (their offsets
and leader epochs: ``append_batches`` validates CRC, contiguity and epochs) and flushed before the next
fetch, whose offset is therefore a durable position.  A ``diverging_epoch`` answer truncates by leader
epoch (``next_truncation_step``; the next fetch carries the truncated log's last epoch, so a multi-step
KIP-279 conversation happens over successive fetches); a step below the follower's high watermark is
refused and the partition stops replicating, loudly — it would delete committed records — unless every
committed record it drops was written before the partition's latest unclean election (the image's
``last_unclean_leader_epoch``): the loss that election accepted, truncated with one warning
(:func:`kraft.replication.truncation.unclean_loss_allowed`).

**The heartbeat lease** (:class:`kraft.broker.status.BrokerStatus`; ``lease``): a broker whose lease has
lapsed may already be fenced, with a new leader taking writes, so while it lapsed this broker as leader
refuses replica fetches (NOT_LEADER_OR_FOLLOWER: the follower backs off ``replica.fetch.backoff.ms``),
holds every high watermark (``PartitionLeaderState.hold_high_watermark``: nothing more becomes committed
or visible), proposes no ISR shrink (its followers lag because it refuses them) and fails the acks=all
requests waiting (NOT_LEADER_OR_FOLLOWER, retriable; the records may or may not commit, as after a
leader change).  Every path that could advance a high watermark or answer a waiter checks the lease
first (:meth:`ReplicaManager.check_lease`), so correctness never depends on a timer; the lease watch in
:meth:`ReplicaManager.run` only makes the lapse (failing waiters) and the return (releasing held high
watermarks) prompt.

**High-watermark checkpoint** (:mod:`kraft.broker.hwm_checkpoint`): written every 5 s and at close; a
new leader state starts from max(HWM learned as a follower, checkpointed HWM), capped by the flushed end;
a followed partition's truncation floor starts from the checkpointed value, capped by its log end.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from operator import attrgetter
from pathlib import Path
from typing import Protocol

from kraft.broker import heap, hwm_checkpoint
from kraft.broker.partitions import Pacer, Partition, PartitionManager, in_order, is_storage_failure
from kraft.broker.replica_transport import (
    GrpcReplicaFetchTransport,
    ReplicaFetchFailed,
    ReplicaFetchTransport,
)
from kraft.broker.types import PartitionAssignment, ReplicaRole, TopicPartition
from kraft.client.channel import ChannelSecurity
from kraft.client.controller import ControllerUnavailable
from kraft.clock import CHECK_EVERY, DEFAULT_WORK_UNIT_MS, Clock
from kraft.config import REPLICA_FETCH_WAIT_MAX_MS
from kraft.errors import ErrorCode
from kraft.metadata.image import ConfigKey, MetadataImage
from kraft.metadata.records import ConfigResourceType
from kraft.observability.logging import get_logger
from kraft.observability.metrics import ReplicationMetrics
from kraft.replication.acks import Acks, AcksAllWaiters, Completion, admit_produce
from kraft.replication.epochs import (
    UNDEFINED_EPOCH,
    EpochEndOffset,
    diverging_epoch,
    with_leader_epoch,
)
from kraft.replication.leader_state import AlterPartitionFollowUp, HighWatermarkHold, PartitionLeaderState
from kraft.replication.truncation import (
    TruncationKind,
    TruncationStep,
    next_truncation_step,
    unclean_loss_allowed,
)
from kraft.replication.types import RECOVERING, AlterPartitionRequest, LeaderAndIsr
from kraft.storage.errors import FatalStorageError
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import controller_pb2 as cpb

MIN_INSYNC_REPLICAS = "min.insync.replicas"
_ORDER = attrgetter("topic", "partition")  # TopicPartition's order, compared in C
UNKNOWN_EPOCH_RETRY_MS = 50
# While the lease is lapsed (or not granted yet), how often the lease watch looks whether it is back.
LEASE_POLL_MS = 100
# Led states a lease change's walk looks at between two looks at its budget; at most this many are
# walked at once, in the lease change's own turn.
LEASE_WALK_STEP = 256

# Sends one AlterPartition to the active controller (ControllerClient.alter_partition); raises
# ControllerUnavailable when none answered.
AlterPartitionSender = Callable[[cpb.AlterPartitionRequest], Awaitable[cpb.AlterPartitionResponse]]


class Lease(Protocol):
    """The broker's heartbeat lease (:class:`kraft.broker.status.BrokerStatus`)."""

    def lease_valid(self) -> bool: ...

    def lease_expires_at_ms(self) -> int | None: ...


class FatalReporter(Protocol):
    """Reports a fatal condition to the process (``Supervisor.fail``): one ``event=fatal`` line, exit 70."""

    def __call__(self, reason: str, error: BaseException | None = None, **fields: object) -> None: ...


@dataclass(frozen=True, slots=True)
class ReplicationSettings:
    """The broker's replication settings: Kafka's names and defaults, read from the node config
    (``BrokerSettings.from_config``; docs/configuration.md)."""

    replica_lag_time_max_ms: int = 30_000  # replica.lag.time.max.ms (Kafka's default)
    fetch_max_wait_ms: int = 500  # replica.fetch.wait.max.ms
    fetch_max_bytes: int = 1 << 20  # replica.fetch.max.bytes (per partition)
    fetch_response_max_bytes: int = 10 << 20  # replica.fetch.response.max.bytes (per response)
    fetch_backoff_ms: int = 1_000  # replica.fetch.backoff.ms
    request_timeout_ms: int = 30_000  # replica.socket.timeout.ms
    alter_partition_backoff_ms: int = 100
    min_insync_replicas: int = 1  # min.insync.replicas, the broker default (topic config overrides)
    produce_timeout_ms: int = 30_000  # how long an acks=all produce waits (the producer's request timeout)
    hwm_checkpoint_interval_ms: int = 5_000  # replica.high.watermark.checkpoint.interval.ms
    # A follower behind its leader flushes once this much is appended unflushed (and whenever a fetch
    # leaves it caught up), not after every fetch; its fetches report the flushed offset as
    # durable_offset, which is what the leader counts.  kraft's own (Kafka followers never fsync).
    catch_up_flush_bytes: int = 8 << 20


TIMER_WORK_UNIT_MS = 2
"""The time budget of one loop turn of a periodic pass over the hosted partitions (the ISR shrink check,
the high-watermark checkpoint); the pass yields the loop between turns (issue #17, bounded work units).
Smaller than the 5 ms work unit: these passes are background work that nothing waits on."""

COLLECT_STEP = 256
"""Hosted partitions a checkpoint pass collects between two looks at its budget (~0.1 ms)."""

STEPPED_BUILD_MIN = heap.BIG_CHANGE
"""New leader/follower states an image must bring for them to be built in loop turns (the first image
after start-up, a bulk creation: ~9 µs a state, ~0.9 s in one stretch at 100,000); below, at once."""

BUILD_STEP = 64
"""New states a stepped build creates between two looks at its budget (~0.6 ms)."""


@dataclass(slots=True)
class _Led:
    partition: Partition
    assignment: PartitionAssignment
    state: PartitionLeaderState
    waiters: AcksAllWaiters = field(default_factory=AcksAllWaiters)
    futures: dict[int, asyncio.Future[ErrorCode]] = field(default_factory=dict)
    alter_task: asyncio.Task[None] | None = None
    # How the ISR gauges count it now: (under-replicated, -1/0/1 for below/at/above min ISR); None: not yet.
    counted: tuple[bool, int] | None = None
    # Set when the state is dropped (_drop_led): a paced pass holding it skips it without a dict look
    # (a TopicPartition hashes in Python: ~0.5 µs a look, 17 ms per pass over 33,000 led partitions).
    dropped: bool = False


@dataclass(slots=True)
class _Followed:
    partition: Partition
    leader: int
    leader_epoch: int
    high_watermark: int = 0
    retry_at_ms: int = 0
    leader_log_end: int = -1  # the leader's log end in its last answer, flushed or not (-1: none yet)
    stopped: bool = False  # a truncation below the high watermark was refused: never fetch again
    unflushed_bytes: int = 0  # appended since the last flush (catch_up_flush_bytes)


class _MaxLag:
    """The largest follower lag (the ``replica_fetcher_max_lag`` gauge), kept as single lags change: a
    max-heap with lazy deletion, so a fetch round updates the partitions it fetched, not every followed
    one.  Only known lags (0 or more) are kept: with none known the gauge is -1 while something is
    followed (a lag not known yet, as the gauge has always shown it) and 0 when nothing is."""

    __slots__ = ("_heap", "_lags")

    def __init__(self) -> None:
        self._lags: dict[TopicPartition, int] = {}
        self._heap: list[tuple[int, TopicPartition]] = []  # (-lag, partition); stale entries skipped

    def set(self, tp: TopicPartition, lag: int) -> None:
        if lag < 0:  # unknown
            self._lags.pop(tp, None)
            return
        if self._lags.get(tp) == lag:
            return
        self._lags[tp] = lag
        heapq.heappush(self._heap, (-lag, tp))
        if len(self._heap) > 2 * len(self._lags) + 64:  # stale entries: rebuild (amortized O(1) a set)
            self._heap = [(-value, key) for key, value in self._lags.items()]
            heapq.heapify(self._heap)

    def discard(self, tp: TopicPartition) -> None:
        self._lags.pop(tp, None)

    def clear(self) -> None:
        self._lags.clear()
        self._heap.clear()

    def max(self, followed: int) -> int:
        """The largest known lag; else -1 when ``followed`` (the number of followed partitions) > 0."""
        heap = self._heap
        while heap:
            negative, tp = heap[0]
            if self._lags.get(tp) == -negative:
                return -negative
            heapq.heappop(heap)
        return -1 if followed else 0


def min_isr_topics(before: MetadataImage, after: MetadataImage) -> set[str] | None:
    """The topics whose ``min.insync.replicas`` (as :meth:`ReplicaManager._min_insync_replicas` resolves
    it) may differ between the images; None: every topic's (the cluster-wide default changed).  Costs
    nothing when no config changed (the images share their configs) and a look per config resource
    otherwise — never a look per partition."""
    old, new = before.configs, after.configs
    if old is new:
        return set()
    default = ConfigKey(ConfigResourceType.BROKER, "")
    if _min_isr_value(old.get(default)) != _min_isr_value(new.get(default)):
        return None
    topics: set[str] = set()
    for key, values in new.items():
        changed = old.get(key) is not values and _min_isr_value(old.get(key)) != _min_isr_value(values)
        if key.resource_type == ConfigResourceType.TOPIC and changed:
            topics.add(key.resource_name)
    for key, values in old.items():
        gone = key not in new and _min_isr_value(values) is not None
        if key.resource_type == ConfigResourceType.TOPIC and gone:
            topics.add(key.resource_name)
    return topics


def _min_isr_value(values: Mapping[str, str] | None) -> str | None:
    return None if values is None else values.get(MIN_INSYNC_REPLICAS)


def leader_and_isr(assignment: PartitionAssignment) -> LeaderAndIsr:
    return LeaderAndIsr(
        assignment.leader,
        assignment.leader_epoch,
        assignment.partition_epoch,
        tuple(assignment.replicas),
        tuple(assignment.isr),
        assignment.leader_recovery_state,
    )


def _latest_epoch(entries: list[tuple[int, int]]) -> int:
    return entries[-1][0] if entries else UNDEFINED_EPOCH


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def _collect_led(by_dir: dict[Path, dict[tuple[TopicPartition, str], int]], states: Iterable[_Led]) -> None:
    """The led partitions' high watermarks into their log dirs' checkpoint entries."""
    for led in states:
        partition = led.partition
        by_dir.setdefault(partition.log_dir, {})[partition.checkpoint_key] = led.state.high_watermark


def _collect_followed(
    by_dir: dict[Path, dict[tuple[TopicPartition, str], int]], states: Iterable[_Followed]
) -> None:
    """The followed partitions' high watermarks into their log dirs' checkpoint entries."""
    for followed in states:
        partition = followed.partition
        by_dir.setdefault(partition.log_dir, {})[partition.checkpoint_key] = followed.high_watermark


class ReplicaManager:
    def __init__(
        self,
        broker_id: int,
        cluster_id: str,
        partitions: PartitionManager,
        *,
        clock: Clock,
        broker_epoch: Callable[[], int],
        send_alter_partition: AlterPartitionSender | None,
        settings: ReplicationSettings | None = None,
        listener: str = "PLAINTEXT",
        channel_options: Iterable[tuple[str, int]] = (),
        security: ChannelSecurity | None = None,
        on_fatal: FatalReporter | None = None,
        metrics: ReplicationMetrics | None = None,
        lease: Lease | None = None,
        transport: ReplicaFetchTransport | None = None,
    ) -> None:
        """``lease``: the broker's heartbeat lease; None (tests of other rules) leads as if always held.
        ``transport``: how this broker's fetchers reach their leaders; None: gRPC to the listener the
        image gives (the deterministic simulation passes its own network)."""
        self.broker_id = broker_id
        self._security = security
        self.cluster_id = cluster_id
        self.settings = settings or ReplicationSettings()
        self._partitions = partitions
        self._clock = clock
        self._broker_epoch = broker_epoch
        self._send_alter_partition = send_alter_partition
        self._listener = listener
        self._channel_options = list(channel_options)
        self._image = MetadataImage.empty()
        self._led: dict[TopicPartition, _Led] = {}
        self._followed: dict[TopicPartition, _Followed] = {}
        # Indexes kept with _led/_followed so that an image costs what it changed, not what is hosted:
        # the partitions whose hosting changed since the last image (filled by the partition manager),
        # states dropped outside on_image (looked at again by the next), the led partitions by topic
        # (a topic's min.insync.replicas changed), the RECOVERING ones (KIP-704 reports), the followed
        # ones by leader (each fetcher's share), the ISR gauges' counts and the follower lags.
        self._touched = partitions.watch_changes()
        self._revisit: set[TopicPartition] = set()
        # Hosted partitions whose new leader/follower state a stepped build (_build_states) has still to
        # create; none has a state meanwhile (leads() is False: nothing is served for them).
        self._pending: set[TopicPartition] = set()
        self._taken: set[TopicPartition] = set()  # (those the running build took and has not built yet)
        self._build: asyncio.Task[None] | None = None
        self.stepped_build_min = STEPPED_BUILD_MIN
        self.build_step = BUILD_STEP
        # The pacer of a stepped build's turns (tests give one that yields at every look).
        self.build_pacer: Callable[[], Pacer] = lambda: Pacer(clock, DEFAULT_WORK_UNIT_MS)
        self._led_by_topic: dict[str, dict[TopicPartition, _Led]] = {}
        self._recovering: dict[TopicPartition, None] = {}
        self._by_leader: dict[int, dict[TopicPartition, _Followed]] = {}
        self._under_replicated = 0
        self._under_min_isr = 0
        self._at_min_isr = 0
        self._lags = _MaxLag()
        self._fetchers: dict[int, asyncio.Task[None]] = {}
        self._fetcher_wake: dict[int, asyncio.Event] = {}
        self._transport: ReplicaFetchTransport = transport or GrpcReplicaFetchTransport(
            broker_id, self._endpoint_of, channel_options=self._channel_options, security=security
        )
        self._dirty: set[TopicPartition] = set()
        self._flush_scheduled = False
        # The replica fetches parked at this leader (long-poll); an append, a lease change or a storage
        # failure resolves them all (_wake_replica_fetches).  A dict (insertion-ordered), not a set: a set of
        # futures iterates in address order, which made wake order, and so the simulation, non-replayable.
        self._parked_fetches: dict[asyncio.Future[None], None] = {}
        self._next_request_id = 0
        self._restored: dict[tuple[TopicPartition, str], int] | None = None  # replication-offset-checkpoint
        # While a paced checkpoint pass runs: the high watermarks an unclean truncation lowered meanwhile,
        # by log dir, so the pass never writes a value it collected before the truncation (_settle).
        self._lowered: dict[Path, dict[tuple[TopicPartition, str], int]] | None = None
        self._checkpoint_passes = 0
        self.checkpoints = hwm_checkpoint.CheckpointWriter()
        self._closed = False
        self._on_fatal = on_fatal
        self.metrics = metrics or ReplicationMetrics.for_node(broker_id)
        # The first failed flush or write of a partition log (fsyncgate: the page cache state is unknown,
        # never retried).  From then on nothing is acknowledged, served or flushed; the process exits.
        self._storage_failure: BaseException | None = None
        self._lease = lease
        # What check_lease last applied; a lease not granted yet starts lapsed, without a log line.
        self._lease_lapsed = lease is not None and not lease.lease_valid()
        # Held while the lease is lapsed: shared by every leader state, so a lapse holds all their high
        # watermarks at once (one assignment), however many partitions this broker leads.
        self._hold = HighWatermarkHold(self._lease_lapsed)
        # The walk over the led states that a lease change starts (_lease_walk): failing the waiters on
        # a lapse, advancing the high watermarks on the return; a later change ends it (generation).
        self._lease_walk_task: asyncio.Task[None] | None = None
        self._lease_changes = 0
        # A lapse's walk in progress: its led states, from the index of the next one to fail waiters of.
        self._lapse_unfailed: list[_Led] = []
        self._lapse_next = 0
        self._lapse_failed = 0  # (the acks=all requests it failed so far: logged once at its end)
        self.lease_walk_pacer: Callable[[], Pacer] = lambda: Pacer(clock, TIMER_WORK_UNIT_MS)
        self._log = get_logger("broker.replication", node=broker_id)

    # --- the lease -------------------------------------------------------------------------------

    def check_lease(self) -> bool:
        """Apply the lease as it is now; True while it is held.  Called first by every path that could
        advance a high watermark, answer an acks=all waiter or serve a follower.

        On a lapse: every led partition's high watermark is held at once (the shared
        :class:`HighWatermarkHold`: nothing more is committed or acknowledged from this turn on) and its
        waiting acks=all requests fail with NOT_LEADER_OR_FOLLOWER — in this turn for up to
        :data:`LEASE_WALK_STEP` led partitions, else in the walk's turns (:meth:`_lease_walk`); parked
        replica fetches are woken (to be refused).  On its return: the high watermarks are released
        (advancing to what the followers' recorded positions allow), likewise."""
        held = self._lease is None or self._lease.lease_valid()
        if held != self._lease_lapsed:
            return held  # no change
        self._lease_lapsed = not held
        self._hold.held = not held  # every leader state's high watermark held, or no longer, at once
        self._lease_changes += 1
        if not held:
            self._log.warning(
                "replication_lease_lapsed",
                reason="no heartbeat accepted within the lease: this broker may be fenced; as leader it "
                "serves no follower fetch, holds its high watermarks and fails waiting acks=all requests",
                led_partitions=len(self._led),
            )
        else:
            self._log.info("replication_lease_held", led_partitions=len(self._led))
        unfailed, self._lapse_unfailed = self._lapse_unfailed, []
        if unfailed:  # a lapse's walk had not failed every waiter yet: they were waiting at the lapse
            self._lapse_failed += self._lease_walk_step(unfailed[self._lapse_next :], True)
            self._log_lapse_failed()
        states = list(self._led.values())
        if len(states) <= LEASE_WALK_STEP or not _loop_running():
            failed = self._lease_walk_step(states, not held)
            if not held:
                self._lapse_failed = failed
                self._log_lapse_failed()
        else:
            if not held:
                self._lapse_unfailed, self._lapse_next, self._lapse_failed = states, 0, 0
            self._lease_walk_task = asyncio.get_running_loop().create_task(
                self._lease_walk(states, not held, self._lease_changes), name="replication-lease-walk"
            )
        self._wake_replica_fetches()
        return held

    def _lease_walk_step(self, states: list[_Led], lapsed: bool) -> int:
        """On a lapse: fail the acks=all requests waiting on ``states`` (NOT_LEADER_OR_FOLLOWER), and
        return how many; on the return: advance their high watermarks to what the events recorded while
        held allow."""
        failed = 0
        for led in states:
            if led.dropped:
                continue  # (its waiters were failed when it was dropped)
            if lapsed:
                if led.waiters:
                    completions = led.waiters.fail_all(ErrorCode.NOT_LEADER_OR_FOLLOWER)
                    failed += len(completions)
                    self._complete(led, completions)
            elif led.state.release_high_watermark():
                self._high_watermark_advanced(led)
        return failed

    def _log_lapse_failed(self) -> None:
        self._log.info("replication_lease_acks_all_failed", acks_all_failed=self._lapse_failed)

    async def _lease_walk(self, states: list[_Led], lapsed: bool, change: int) -> None:
        """:meth:`_lease_walk_step` over many led states in loop turns of :data:`TIMER_WORK_UNIT_MS`
        (a lapse at 33,000 led partitions was a ~30 ms stretch, its return as much).  Nothing waits on
        the walk for safety: the shared hold stopped every high watermark (and so every acknowledgement)
        at the lapse itself, and no new waiter is taken while lapsed; the walk answers the requests that
        were waiting at most its few turns later, and a return's high watermarks advance at their next
        event anyway.  A later lease change ends it: the rest of a lapse's walk is done in that change's
        turn (every request waiting at a lapse fails), the rest of a return's is not needed."""
        pacer = self.lease_walk_pacer()
        for start in range(0, len(states), LEASE_WALK_STEP):
            if start:
                await pacer.tick()
            if change != self._lease_changes or self._closed:
                return
            failed = self._lease_walk_step(states[start : start + LEASE_WALK_STEP], lapsed)
            if lapsed:
                self._lapse_failed += failed
                self._lapse_next = start + LEASE_WALK_STEP
        if lapsed:
            self._lapse_unfailed = []
            self._log_lapse_failed()

    async def wait_lease_applied(self) -> None:
        """Until the walk of the last lease change is over (at once when none runs)."""
        while (walk := self._lease_walk_task) is not None and not walk.done():
            await asyncio.wait({walk})

    # --- queries ---------------------------------------------------------------------------------

    def leads(self, partition: Partition) -> bool:
        """True once this broker's leader state of ``partition`` is set up (its high watermark is known).

        False in the window where the partition manager already made the partition a leader but the
        image has not reached replication yet (a paced apply yields in between; after a restart the
        partitions are opened before the next image): the service answers NOT_LEADER_OR_FOLLOWER then,
        as Kafka does for a partition whose become-leader has not completed — never HWM 0."""
        led = self._led.get(partition.tp)
        return led is not None and led.partition is partition

    def high_watermark(self, partition: Partition) -> int:
        """Where consumers may read up to on a partition this broker leads (0 while it has no state:
        the service asks :meth:`leads` first)."""
        led = self._led.get(partition.tp)
        if led is None or led.partition is not partition:
            return 0
        return led.state.high_watermark

    def leader_state(self, tp: TopicPartition) -> PartitionLeaderState | None:
        led = self._led.get(tp)
        return None if led is None else led.state

    def follower_high_watermark(self, tp: TopicPartition) -> int | None:
        followed = self._followed.get(tp)
        return None if followed is None else followed.high_watermark

    def is_stopped(self, tp: TopicPartition) -> bool:
        followed = self._followed.get(tp)
        return followed is not None and followed.stopped

    def replica_lag(self, tp: TopicPartition) -> tuple[int, int, list[tuple[int, int, int, bool]]]:
        """``(high watermark, lag, followers)`` of a hosted partition for ``broker describe``: a leader's
        HWM, lag 0 and every other replica as ``(broker id, log end, lag, in ISR)`` (-1: not fetched in
        this leadership); a follower's learned HWM and lag behind the leader's end at its last fetch
        (-1: unknown), no followers."""
        led = self._led.get(tp)
        if led is not None:
            state = led.state
            progress = {f.replica_id: f for f in state.followers()}
            followers = []
            for replica in led.assignment.replicas:
                if replica == self.broker_id:
                    continue
                known = progress.get(replica)
                end = known.log_end_offset if known is not None and known.log_end_offset >= 0 else -1
                lag = max(state.leader_end_offset - end, 0) if end >= 0 else -1
                followers.append((replica, end, lag, replica in state.isr))
            return state.high_watermark, 0, followers
        followed = self._followed.get(tp)
        if followed is not None:
            return followed.high_watermark, self._follower_lag(followed), []
        return -1, -1, []

    @staticmethod
    def _follower_lag(followed: _Followed) -> int:
        if followed.leader_log_end < 0:
            return -1
        return max(followed.leader_log_end - followed.partition.log.log_end_offset, 0)

    def _update_gauges(self) -> None:
        """The partition-count gauges (after every image: ISRs and configs change only with metadata),
        from the counts :meth:`_count` keeps."""
        metrics = self.metrics
        metrics.leader_count.set(len(self._led))
        metrics.partition_count.set(len(self._led) + len(self._followed))
        metrics.under_replicated_partitions.set(self._under_replicated)
        metrics.under_min_isr_partition_count.set(self._under_min_isr)
        metrics.at_min_isr_partition_count.set(self._at_min_isr)
        self._update_fetcher_lag()

    def _update_fetcher_lag(self) -> None:
        self.metrics.replica_fetcher_max_lag.set(self._lags.max(len(self._followed)))

    def _count(self, led: _Led) -> None:
        """(Re)count ``led`` in the ISR gauges: its assignment or its topic's min ISR may have changed."""
        self._uncount(led)
        isr = len(led.assignment.isr)
        min_isr = self._min_insync_replicas(led.partition.tp.topic)
        counted = (isr < len(led.assignment.replicas), -1 if isr < min_isr else 0 if isr == min_isr else 1)
        led.counted = counted
        self._under_replicated += counted[0]
        self._under_min_isr += counted[1] == -1
        self._at_min_isr += counted[1] == 0

    def _uncount(self, led: _Led) -> None:
        counted, led.counted = led.counted, None
        if counted is not None:
            self._under_replicated -= counted[0]
            self._under_min_isr -= counted[1] == -1
            self._at_min_isr -= counted[1] == 0

    # --- metadata --------------------------------------------------------------------------------

    def on_image(self, image: MetadataImage) -> None:
        """Bring the replication state in line with the partition manager after an image was applied.

        Proportional to what changed, not to what is hosted (issue #17): the partitions whose hosting
        changed since the last image (:meth:`PartitionManager.watch_changes`) are visited; the min ISR is
        re-applied to those and to the led partitions of topics whose ``min.insync.replicas`` changed
        (all only when the cluster-wide default did); the gauges are counts kept as states change.  The
        result equals a visit of every hosted partition (tests/unit/broker/test_replica_image_incremental.py
        checks it against one after random image sequences)."""
        previous, self._image = self._image, image
        self.check_lease()  # a state created below starts held if the lease has lapsed
        now_ms = self._clock.monotonic_ms()
        touched = self._touched
        touched.update(self._revisit)
        self._revisit.clear()
        if self._build is not None or (len(touched) >= self.stepped_build_min and _loop_running()):
            self._on_image_stepped(previous, image, now_ms)
            return
        changed = sorted(touched, key=_ORDER)
        touched.clear()  # (the partition manager's own set: cleared, not replaced)
        # Thousands of new states at once (the first image, a bulk creation, without a running loop):
        # no full collection in the middle of them, and none walking them later (kraft.broker.heap).
        with heap.big_change(len(changed)):
            self._visit(previous, image, changed, now_ms)

    def _on_image_stepped(self, previous: MetadataImage, image: MetadataImage, now_ms: int) -> None:
        """An image that brings thousands of new states, or one applied while a stepped build runs.

        The partitions that have a state now are visited at once, as always: a revocation (a led
        partition demoted or removed, a followed one removed or now led) must never wait for a later
        turn, and an assignment change is applied with its image.  The partitions without a state join
        :attr:`_pending`, whose states :meth:`_build_states` creates in loop turns from what is hosted
        when their turn comes — so an image applied mid-way (a partition removed, its role changed)
        needs nothing more than its own visit.  Until its state exists a partition is not led
        (:meth:`leads` is False: NOT_LEADER_OR_FOLLOWER, as while ``apply_paced`` yields) and not
        fetched."""
        touched = self._touched
        with_state: set[TopicPartition] = set()
        if self._led:  # (sets built from dicts reuse the stored hashes: a TopicPartition hashes in Python)
            with_state = touched & set(self._led)
        if self._followed:
            with_state |= touched & set(self._followed)
        # The collected set becomes the new partitions' (no copy of 100,000 entries in this turn).
        self._touched = self._partitions.take_changes(touched)
        new = touched
        if with_state:
            new -= with_state
        if self._taken:
            new -= self._taken  # (taken by the build and still without a state: it builds them)
        changed = sorted(with_state, key=_ORDER)
        with heap.big_change(len(changed)):
            self._visit(previous, image, changed, now_ms)
        if not self._pending:
            self._pending = new
        else:
            self._pending |= new
        if self._pending and self._build is None:
            self._build = asyncio.get_running_loop().create_task(
                self._build_states(len(self._pending)), name="replica-state-build"
            )

    async def _build_states(self, count: int) -> None:
        """Create the pending partitions' leader/follower states, in loop turns of the work unit (the
        first image after start-up at 100,000 hosted partitions was ~0.9 s in one stretch).  In partition
        order, as an image's visit; each state from the partition as hosted at its turn (one removed
        since is skipped); each turn applies its new led states' min ISR and counts them in the gauges.
        Partitions added by a later image while it runs are built after those before.  With the
        collector paused throughout and the heap frozen at the end (:func:`heap.big_change`)."""
        pacer = self.build_pacer()
        try:
            if self._restored is None:
                # Parsing a checkpoint of 100,000 lines is 0.1-0.3 s of Python: on a worker thread (the
                # loop keeps its turns, the GIL passing every switch interval), not in a build turn.
                restored = await asyncio.to_thread(self._read_checkpoints)
                if self._restored is None:  # (a visit meanwhile may have read it: the same files)
                    self._restored = restored
            with heap.big_change(count):
                while self._pending:
                    # Taken whole (later images add to a new set); ordered, then built in steps.
                    self._taken, self._pending = self._pending, set()
                    ordered = await in_order(self._taken, pacer)
                    step = self.build_step
                    for start in range(0, len(ordered), step):
                        await pacer.tick()
                        self._build_some(ordered[start : start + step])
                    self._taken = set()
                # (no await between the last look at _pending and here: an image adding to it
                # meanwhile found this task running, and this loop saw its partitions)
                self._finish_recoveries()
                self._ensure_fetchers()
                self._update_gauges()
        except Exception as exc:  # (a bug: what one go would have raised into the publisher)
            if self._on_fatal is not None:
                self._on_fatal("replica_state_build_failed", exc)
            else:
                self._log.error("replica_state_build_failed", error=repr(exc))
            raise
        finally:
            self._build = None

    def _build_some(self, tps: list[TopicPartition]) -> None:
        """One turn of :meth:`_build_states`: the states of ``tps`` (taken, not built yet)."""
        self.check_lease()  # (a state created now starts held if the lease lapsed)
        now_ms = self._clock.monotonic_ms()
        partitions, taken = self._partitions, self._taken
        new_leds: list[_Led] = []
        for tp in tps:
            taken.discard(tp)
            hosted = partitions.get(tp)
            if hosted is None:
                continue  # removed by a later image before its turn
            if hosted.role is ReplicaRole.LEADER:
                new_leds.append(self._lead_as(hosted, None, now_ms, 0))
            else:
                self._follow_as(hosted, None)
        self._apply_min_isr(new_leds, set())
        self._update_gauges()

    @property
    def building(self) -> bool:
        """A stepped build of new states runs (some hosted partitions have no state yet)."""
        return self._build is not None

    async def wait_built(self) -> None:
        """Until no stepped build runs (at once when none does)."""
        while (build := self._build) is not None:
            await asyncio.wait({build})  # (a cancelled build, by close(), ends the wait too)
            error = None if build.cancelled() else build.exception()
            if error is not None:
                raise error

    def _visit(
        self, previous: MetadataImage, image: MetadataImage, changed: list[TopicPartition], now_ms: int
    ) -> None:
        partitions, led_states, followed_states = self._partitions, self._led, self._followed
        # (Each partition's states are looked up once: a TopicPartition hashes in Python, ~0.4 µs a look.)
        visits: list[tuple[Partition, _Led | None, _Followed | None]] = []
        for tp in changed:
            hosted = partitions.get(tp)
            led = led_states.get(tp)
            if led is not None and led.partition is not hosted:
                self._drop_led(tp, revisit=False)
                led = None
            followed = followed_states.get(tp)
            if followed is not None and followed.partition is not hosted:
                self._remove_followed(tp)
                followed = None
            if hosted is not None:
                visits.append((hosted, led, followed))
        touched_leds: list[_Led] = []
        for partition, led, followed in visits:
            tp = partition.tp
            if partition.role is ReplicaRole.LEADER:
                if followed is not None:
                    self._remove_followed(tp)
                # A follower that becomes leader starts from the high watermark it learned (Kafka's).
                hwm = 0 if followed is None else followed.high_watermark
                touched_leds.append(self._lead_as(partition, led, now_ms, hwm))
            else:
                if led is not None:
                    self._drop_led(tp, revisit=False)
                self._follow_as(partition, followed)
        self._apply_min_isr(touched_leds, min_isr_topics(previous, image))
        self._finish_recoveries()
        self._ensure_fetchers()
        self._update_gauges()

    def _finish_recoveries(self) -> None:
        """KIP-704: a leader from an unclean election (its partition RECOVERING) reports RECOVERED by an
        AlterPartition of its ISR (itself) before it may expand the ISR: its log is the partition's
        history from now on, there is nothing else to recover.  Retried with the next image while the
        answer is pending or refused."""
        for tp in list(self._recovering):
            led = self._led[tp]
            if led.state.recovery_report_needed():
                self._propose(led, led.state.isr)

    def _note_recovery(self, led: _Led) -> None:
        """Keep ``_recovering`` (the led partitions RECOVERING) after ``led``'s partition state changed."""
        if self._led.get(led.partition.tp) is not led:
            return  # dropped meanwhile (an answer that came back after a leader change)
        if led.state.partition.leader_recovery_state == RECOVERING:
            self._recovering[led.partition.tp] = None
        else:
            self._recovering.pop(led.partition.tp, None)

    def _ensure_fetchers(self) -> None:
        """A fetcher for every leader that this broker follows a partition of and that has none running
        (one that ended, e.g. when all its partitions were stopped): per leader, not per partition."""
        if self._closed or self._storage_failure is not None:
            return
        for leader, group in self._by_leader.items():
            task = self._fetchers.get(leader)
            idle = leader >= 0 and (task is None or task.done())
            if idle and any(not followed.stopped for followed in group.values()):
                self._ensure_fetcher(leader)

    def _truncate_below_high_watermark(
        self, followed: _Followed, tp: TopicPartition, diverging: EpochEndOffset, unclean_epoch: int
    ) -> TruncationStep:
        """An unclean election (at leader epoch ``unclean_epoch``, the image's
        ``last_unclean_leader_epoch``) made a replica without our committed tail leader, and that tail was
        written before it: truncate to it as Kafka's followers do, with a warning naming what is lost,
        and lower our HWM (and its checkpoint) with it.  Any other such step stays refused (a bug, never
        data loss; :func:`kraft.replication.truncation.unclean_loss_allowed`)."""
        log = followed.partition.log
        step = next_truncation_step(log.epoch_entries(), log.log_end_offset, 0, diverging)
        self._log.warning(
            "truncation_below_high_watermark",
            partition=str(tp),
            offset=step.offset,
            high_watermark=followed.high_watermark,
            lost_offsets=f"{step.offset}..{min(followed.high_watermark, log.log_end_offset) - 1}",
            unclean_leader_epoch=unclean_epoch,
            reason="unclean_election",
        )
        followed.high_watermark = min(followed.high_watermark, step.offset)
        if self._lowered is not None:
            key = followed.partition.checkpoint_key
            lowered = self._lowered.setdefault(followed.partition.log_dir, {})
            lowered[key] = min(lowered.get(key, followed.high_watermark), followed.high_watermark)
        return step

    def _apply_min_isr(self, touched: Iterable[_Led], topics: set[str] | None) -> None:
        """The effective min.insync.replicas into the states of the led partitions it may have changed
        for (ISRs and configs change only with metadata): ``touched`` (their replicas cap it), those of
        ``topics`` (their config changed), every one when ``topics`` is None (the cluster-wide default
        changed).  Below it the HWM is frozen (KIP-966, leader_state).  The ISR gauges count them again."""
        targets: Iterable[_Led]
        if topics is None:
            targets = list(self._led.values())
        elif not topics:
            targets = touched  # (each a current state: visited once, nothing dropped since)
        else:
            chosen = {led.partition.tp: led for led in touched}
            for topic in sorted(topics):
                chosen.update(self._led_by_topic.get(topic, {}))
            targets = chosen.values()
        for led in targets:
            if led.state.set_min_isr(self._min_insync_replicas(led.partition.tp.topic)):
                self._high_watermark_advanced(led)
            self._count(led)

    def _lead(self, partition: Partition, now_ms: int, followed_hwm: int) -> _Led:
        return self._lead_as(partition, self._led.get(partition.tp), now_ms, followed_hwm)

    def _lead_as(self, partition: Partition, led: _Led | None, now_ms: int, followed_hwm: int) -> _Led:
        """Lead ``partition``; ``led``: its leader state now (None: none)."""
        tp = partition.tp
        assignment = partition.assignment
        if led is not None:
            if led.assignment is assignment or led.assignment == assignment:
                return led
            before = led.state.high_watermark
            old_isr, new_isr = set(led.assignment.isr), set(assignment.isr)
            if old_isr - new_isr:
                self.metrics.isr_shrinks.inc()
            if new_isr - old_isr:
                self.metrics.isr_expands.inc()
            led.assignment = assignment
            led.state.on_metadata(leader_and_isr(assignment), now_ms)
            self._note_recovery(led)
            if led.state.high_watermark > before:
                self._high_watermark_advanced(led)
            return led
        log = partition.log
        flushed = log.flushed_offset
        followed_hwm = max(followed_hwm, self._restored_high_watermark(partition))
        led = _Led(
            partition,
            assignment,
            PartitionLeaderState(
                self.broker_id,
                leader_and_isr(assignment),
                leader_end_offset=flushed,
                high_watermark=min(followed_hwm, flushed),
                now_ms=now_ms,
                broker_epoch=self._broker_epoch(),
                min_isr=self._min_insync_replicas(tp.topic),
                hold=self._hold,  # (held from the start while the lease is lapsed)
            ),
        )
        self._led[tp] = led
        self._led_by_topic.setdefault(tp.topic, {})[tp] = led
        if assignment.leader_recovery_state == RECOVERING:  # (what the new state's partition says)
            self._recovering[tp] = None
        if log.log_end_offset > flushed:
            self._schedule_flush(tp)
        if led.state.high_watermark > 0:
            self._high_watermark_advanced(led)
        return led

    def _drop_led(self, tp: TopicPartition, *, revisit: bool = True) -> None:
        """Drop the leader state of ``tp``.  ``revisit``: the next image looks at ``tp`` again even if
        nothing about it changed (a state dropped outside :meth:`on_image` is set up again as before)."""
        led = self._led.pop(tp)
        led.dropped = True
        topic = self._led_by_topic.get(tp.topic)
        if topic is not None:
            topic.pop(tp, None)
            if not topic:
                del self._led_by_topic[tp.topic]
        self._recovering.pop(tp, None)
        self._uncount(led)
        if revisit:
            self._revisit.add(tp)
        if led.alter_task is not None:
            led.alter_task.cancel()
        self._complete(led, led.waiters.fail_all(ErrorCode.NOT_LEADER_OR_FOLLOWER))

    def _follow(self, partition: Partition) -> None:
        self._follow_as(partition, self._followed.get(partition.tp))

    def _follow_as(self, partition: Partition, followed: _Followed | None) -> None:
        """Follow ``partition``; ``followed``: its follower state now (None: none)."""
        tp = partition.tp
        assignment = partition.assignment
        if followed is None:
            followed = self._followed[tp] = _Followed(partition, assignment.leader, assignment.leader_epoch)
            followed.high_watermark = min(
                self._restored_high_watermark(partition), partition.log.log_end_offset
            )
            self._by_leader.setdefault(followed.leader, {})[tp] = followed
            # (its lag is not known before its first fetch: nothing to keep in _lags)
        else:
            if followed.leader != assignment.leader or followed.leader_epoch != assignment.leader_epoch:
                followed.retry_at_ms = 0  # a new leader or epoch: fetch at once
                # A refused truncation is decided again under the new epoch: the change may be an
                # unclean election that accepts the loss (last_unclean_leader_epoch); refused again if not.
                followed.stopped = False
                self._wake_fetcher(assignment.leader)
            if followed.leader != assignment.leader:
                self._leave_group(tp, followed)
                self._by_leader.setdefault(assignment.leader, {})[tp] = followed
            followed.leader = assignment.leader
            followed.leader_epoch = assignment.leader_epoch
            self._lags.set(tp, self._follower_lag(followed))
        if followed.leader >= 0 and not followed.stopped:
            self._ensure_fetcher(followed.leader)

    def _remove_followed(self, tp: TopicPartition) -> _Followed | None:
        followed = self._followed.pop(tp, None)
        if followed is not None:
            self._leave_group(tp, followed)
            self._lags.discard(tp)
        return followed

    def _leave_group(self, tp: TopicPartition, followed: _Followed) -> None:
        group = self._by_leader.get(followed.leader)
        if group is not None:
            group.pop(tp, None)
            if not group:
                del self._by_leader[followed.leader]

    # --- leader: appends, flushes, the high watermark --------------------------------------------

    def on_appended(self, partition: Partition) -> None:
        """A Produce appended to a led partition: wake the parked replica fetches (they serve unflushed
        batches), then flush it (coalesced per loop turn).  The wake comes first: the fetch handlers
        resume in the next loop turn ahead of the flush, so their answers are on the wire while this
        leader fsyncs."""
        self._wake_replica_fetches()
        self._schedule_flush(partition.tp)

    def _schedule_flush(self, tp: TopicPartition) -> None:
        self._dirty.add(tp)
        if not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush_dirty)

    def _flush_dirty(self) -> None:
        self._flush_scheduled = False
        self.check_lease()
        dirty, self._dirty = self._dirty, set()
        for tp in sorted(dirty):
            led = self._led.get(tp)
            if led is None or self._closed or self._storage_failure is not None:
                continue
            log = led.partition.log
            try:
                log.flush()
            except Exception as exc:  # whatever the log raised, what is on disk is unknown
                self.storage_failed(led.partition, exc, "partition_flush_failed")
                return
            if led.state.on_leader_end_offset(log.flushed_offset):
                self._high_watermark_advanced(led)

    @property
    def storage_failure(self) -> BaseException | None:
        return self._storage_failure

    def storage_failed(self, partition: Partition, error: BaseException, reason: str) -> None:
        """A partition log failed to flush or write: fail-stop.  Every acks=all request still waiting is
        answered KAFKA_STORAGE_ERROR, and from now on no produce is admitted, no acks=all answered, no
        replica fetch served and nothing flushed — a later fsync that "succeeds" proves nothing about the
        pages the failed one dropped — until the supervisor ends the process (``event=fatal``)."""
        if self._storage_failure is not None:
            return
        self._storage_failure = error
        for led in self._led.values():
            if led.alter_task is not None:
                led.alter_task.cancel()
            self._complete(led, led.waiters.fail_all(ErrorCode.KAFKA_STORAGE_ERROR))
        self._wake_replica_fetches()
        if self._on_fatal is not None:
            self._on_fatal(reason, error, partition=str(partition.tp), log_dir=str(partition.log_dir))
        else:  # no supervisor (tests of the serving rules): say it at least
            self._log.error(reason, partition=str(partition.tp), error=repr(error))

    def _high_watermark_advanced(self, led: _Led) -> None:
        state = led.state
        min_isr = self._min_insync_replicas(led.partition.tp.topic)
        self._complete(
            led, led.waiters.on_high_watermark(state.high_watermark, len(state.maximal_isr), min_isr)
        )
        led.partition.notify_appended()  # consumers long-polling at the old high watermark
        # Parked replica fetches are not woken: the followers learn the new high watermark with their
        # next batches or when the long-poll ends (as Kafka's), not with an empty round trip each.

    def _wake_replica_fetches(self) -> None:
        parked, self._parked_fetches = self._parked_fetches, {}
        for waiter in parked:
            if not waiter.done():
                waiter.set_result(None)

    # --- leader: produce acknowledgement ---------------------------------------------------------

    def _min_insync_replicas(self, topic: str) -> int:
        # The topic's own value, else the cluster-wide dynamic default, else the .properties: resolved as
        # the controller's elections resolve it (kraft.metadata.election_config), never from a per-broker
        # dynamic value.  ELR (KIP-966) is safe only if every leader freezes its HWM below the minimum the
        # controller used when a member left the ISR; a lower per-broker value would let the HWM pass
        # records an ELR member lacks.  Such values are refused when written (config_control) and one
        # stored before is ignored here.
        value = self._image.topic_or_cluster_config(topic, MIN_INSYNC_REPLICAS)
        if value is not None:
            with contextlib.suppress(ValueError):
                return max(1, int(value))
        return self.settings.min_insync_replicas

    def admit_produce(self, partition: Partition, acks: Acks) -> ErrorCode:
        """NOT_ENOUGH_REPLICAS for acks=all when the committed ISR is below min.insync.replicas."""
        if self._storage_failure is not None:
            return ErrorCode.KAFKA_STORAGE_ERROR
        led = self._led.get(partition.tp)
        if led is None or led.partition is not partition:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return admit_produce(acks, len(led.state.isr), self._min_insync_replicas(partition.tp.topic))

    async def wait_for_acks(self, partition: Partition, required_offset: int) -> ErrorCode:
        """Wait until the high watermark reaches ``required_offset`` (acks=all); the error to answer."""
        if self._storage_failure is not None:
            return ErrorCode.KAFKA_STORAGE_ERROR
        led = self._led.get(partition.tp)
        if led is None or led.partition is not partition or not self.check_lease():
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        request_id = self._next_request_id
        self._next_request_id += 1
        deadline_ms = self._clock.monotonic_ms() + self.settings.produce_timeout_ms
        state = led.state
        min_isr = self._min_insync_replicas(partition.tp.topic)
        done = led.waiters.add(
            request_id, required_offset, deadline_ms, state.high_watermark, len(state.maximal_isr), min_isr
        )
        if done:
            return done[0].error
        future: asyncio.Future[ErrorCode] = asyncio.get_running_loop().create_future()
        led.futures[request_id] = future
        try:
            return await asyncio.wait_for(asyncio.shield(future), self.settings.produce_timeout_ms / 1000.0)
        except TimeoutError:
            self._complete(led, led.waiters.expire(deadline_ms))
            return ErrorCode.REQUEST_TIMED_OUT
        finally:
            led.futures.pop(request_id, None)

    def _complete(self, led: _Led, completions: Iterable[Completion]) -> None:
        for completion in completions:
            future = led.futures.pop(completion.request_id, None)
            if future is not None and not future.done():
                future.set_result(completion.error)

    # --- leader: serving follower fetches ----------------------------------------------------------

    async def replica_fetch(self, request: pb.ReplicaFetchRequest) -> pb.ReplicaFetchResponse:
        """Answer a follower's fetch; long-poll while nothing is new for any of its partitions."""
        wait_ms = min(max(request.max_wait_ms, 0), REPLICA_FETCH_WAIT_MAX_MS)
        loop = asyncio.get_running_loop()
        # Parked before the first answer, so a wake while answering (a lease change) is not missed.  A
        # bare future and a timer, not wait_for over an Event: the handler resumes one loop turn after
        # the wake (ahead of the flush the same append scheduled) and no task is created per poll.
        waiter: asyncio.Future[None] = loop.create_future()
        self._parked_fetches[waiter] = None
        timer: asyncio.TimerHandle | None = None
        try:
            response, anything = self._answer_replica_fetch(request)
            if anything or wait_ms == 0:
                return response
            timer = loop.call_later(wait_ms / 1000.0, _resolve, waiter)
            await waiter
            return self._answer_replica_fetch(request)[0]
        finally:
            self._parked_fetches.pop(waiter, None)
            if timer is not None:
                timer.cancel()

    def _answer_replica_fetch(self, request: pb.ReplicaFetchRequest) -> tuple[pb.ReplicaFetchResponse, bool]:
        response = pb.ReplicaFetchResponse()
        if self._storage_failure is not None:
            response.error_code = ErrorCode.KAFKA_STORAGE_ERROR
            response.error_message = f"broker {self.broker_id}: a partition log failed; stopping"
            return response, True
        if not self.check_lease():
            # Per partition, as Kafka answers a broker that does not lead: the follower backs off
            # (replica.fetch.backoff.ms) and its position is not recorded (no HWM, no ISR change).
            for wanted in request.partitions:
                partition = self._partitions.get(TopicPartition(wanted.topic, wanted.partition))
                response.partitions.add(
                    topic=wanted.topic,
                    partition=wanted.partition,
                    high_watermark=-1,
                    leader_epoch=-1 if partition is None else partition.leader_epoch,
                    error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER,
                    error_message=f"broker {self.broker_id} has no live session: it may have been fenced",
                )
            return response, True
        # Kafka's fetch sizing: the response carries at most max_bytes, a partition at most its
        # partition_max_bytes — except the first batch of the first partition with records, which always
        # goes (a follower must never be stuck behind a batch larger than its limits); a later partition
        # whose first batch does not fit what is left gets nothing this time.
        budget = self.settings.fetch_response_max_bytes  # bounded by this broker's gRPC message limit
        if request.max_bytes > 0:
            budget = min(budget, request.max_bytes)
        now_ms = self._clock.monotonic_ms()
        anything = False
        carried = False
        for wanted in request.partitions:
            out = response.partitions.add(topic=wanted.topic, partition=wanted.partition, high_watermark=-1)
            limit = min(budget, wanted.partition_max_bytes) if wanted.partition_max_bytes > 0 else budget
            error = self._serve_partition(request, wanted, out, limit, now_ms)
            if error is not ErrorCode.NONE:
                out.error_code = int(error)
                anything = True
                continue
            if out.records and carried and len(out.records) > budget:
                out.records = b""
            if out.records or out.HasField("diverging_epoch"):
                anything = True
                carried = carried or bool(out.records)
                budget = max(budget - len(out.records), 0)
        return response, anything

    def _serve_partition(
        self,
        request: pb.ReplicaFetchRequest,
        wanted: pb.ReplicaFetchRequest.Partition,
        out: pb.ReplicaFetchResponse.Partition,
        budget: int,
        now_ms: int,
    ) -> ErrorCode:
        tp = TopicPartition(wanted.topic, wanted.partition)
        led = self._led.get(tp)
        partition = self._partitions.get(tp)
        if led is None or partition is None or led.partition is not partition:
            out.error_message = f"broker {self.broker_id} does not lead {tp}"
            if partition is not None:
                out.leader_epoch = partition.leader_epoch
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        state = led.state
        out.leader_epoch = state.leader_epoch
        error = state.check_fetch_epoch(request.replica_id, wanted.current_leader_epoch)
        if error is not ErrorCode.NONE:
            out.error_message = (
                f"{tp}: fetch in epoch {wanted.current_leader_epoch}, the leader's is {state.leader_epoch}"
            )
            return error
        log = partition.log
        log_end = log.log_end_offset
        out.log_start_offset = log.log_start_offset
        out.log_end_offset = log_end  # flushed or not: what the follower can fetch up to
        out.high_watermark = state.high_watermark
        if wanted.last_fetched_epoch != UNDEFINED_EPOCH:
            entries = with_leader_epoch(log.epoch_entries(), state.leader_epoch, log_end)
            diverged = diverging_epoch(entries, log_end, wanted.fetch_offset, wanted.last_fetched_epoch)
            if diverged is not None:
                out.diverging_epoch.epoch = diverged.epoch
                out.diverging_epoch.end_offset = diverged.end_offset
                return ErrorCode.NONE
        if wanted.fetch_offset < log.log_start_offset:
            out.error_message = f"{tp}: offset {wanted.fetch_offset} is below the log start"
            return ErrorCode.OFFSET_OUT_OF_RANGE
        before = state.high_watermark
        # The follower's durable position counts (its flushed offset; everything it fetched if it does
        # not say): below the fetch offset, which must itself be on this leader's log (flushed or not:
        # this leader serves its unflushed tail too).  The state keeps the high watermark at or below
        # this leader's own flushed end however far the follower is.
        durable = wanted.fetch_offset
        if wanted.HasField("durable_offset"):
            if not 0 <= wanted.fetch_offset <= log_end:
                out.error_message = f"{tp}: fetch at {wanted.fetch_offset} refused"
                return ErrorCode.OFFSET_OUT_OF_RANGE
            durable = min(max(wanted.durable_offset, 0), wanted.fetch_offset)
        result = state.on_follower_fetch(
            request.replica_id,
            durable,
            wanted.current_leader_epoch,
            now_ms,
            request.broker_epoch,
            leader_log_end=log_end,
        )
        if result.error is not ErrorCode.NONE:
            out.error_message = f"{tp}: fetch at {wanted.fetch_offset} refused"
            return result.error
        if state.high_watermark > before:
            self._high_watermark_advanced(led)
        out.high_watermark = state.high_watermark
        self._maybe_expand(led)
        if budget > 0 and wanted.fetch_offset < log_end:
            try:
                out.records = log.read_batches(wanted.fetch_offset, budget, log_end)
            except Exception as exc:
                if not is_storage_failure(exc):
                    raise
                # The log dir goes offline (the heartbeat tells the controller, which moves leadership).
                self._partitions.storage_failed(partition, exc)
                out.error_message = f"{tp}: {exc}"
                return ErrorCode.KAFKA_STORAGE_ERROR
        return ErrorCode.NONE

    # --- leader: ISR changes ---------------------------------------------------------------------

    def _eligible(self, replica_id: int, broker_epoch: int) -> bool:
        broker = self._image.brokers.get(replica_id)
        return (
            broker is not None
            and not broker.fenced
            and not broker.in_controlled_shutdown
            and broker.epoch == broker_epoch
        )

    def _maybe_expand(self, led: _Led) -> None:
        candidates = led.state.isr_expand_candidates(self._eligible)
        if candidates:
            self._propose(led, {*led.state.isr, *candidates})

    def check_isr_shrinks(self) -> None:
        """One pass of the periodic check, in one go: propose lagging ISR members out."""
        if not self.check_lease():
            return  # its followers lag because it refuses them: not theirs to pay for
        now_ms = self._clock.monotonic_ms()
        for led in list(self._led.values()):
            self._shrink_lagging(led, now_ms)

    async def check_isr_shrinks_paced(self, pacer: Pacer | None = None) -> None:
        """:meth:`check_isr_shrinks` in loop turns of :data:`TIMER_WORK_UNIT_MS` (what ``run`` does; at
        100,000 hosted partitions one go was a ~30 ms stretch of CPU).  The led partitions are those at
        the pass's start; one that is no longer led by the same state when its turn comes is skipped, one
        led since then was just given caught-up followers (the next pass sees it).  Each turn reads the
        clock and the lease anew: a follower that fell behind more than ``replica.lag.time.max.ms`` ago is
        proposed out as in one go, only the pass's few turns later; a lapsed lease or a close ends it."""
        pacer = pacer or Pacer(self._clock, TIMER_WORK_UNIT_MS)
        states = list(self._led.values())  # (not items(): 100,000 new tuples would feed the collector)
        for start in range(0, len(states), CHECK_EVERY):
            if start:
                await pacer.tick()
            if self._closed or not self.check_lease():
                return  # (lapsed: its followers lag because it refuses them, not theirs to pay for)
            now_ms = self._clock.monotonic_ms()
            for led in states[start : start + CHECK_EVERY]:
                if not led.dropped:
                    self._shrink_lagging(led, now_ms)

    def _shrink_lagging(self, led: _Led, now_ms: int) -> None:
        lagging = led.state.isr_shrink_candidates(now_ms, self.settings.replica_lag_time_max_ms)
        if lagging:
            self._propose(led, [r for r in led.state.isr if r not in lagging])

    async def run(self) -> None:
        """The periodic tasks: the ISR shrink check every ``replica.lag.time.max.ms / 2`` (Kafka's
        cadence), the high-watermark checkpoint and the lease watch."""
        await asyncio.gather(self._run_isr_checks(), self._run_checkpoints(), self._run_lease_watch())

    async def _run_lease_watch(self) -> None:
        """Apply the lease when it runs out (failing waiters at once, not at their timeout) and when it
        is back (releasing held high watermarks without waiting for the next fetch or flush)."""
        lease = self._lease
        if lease is None:
            return
        while True:
            self.check_lease()
            delay_ms = LEASE_POLL_MS
            expires_ms = lease.lease_expires_at_ms()
            if not self._lease_lapsed and expires_ms is not None:
                # Until the lease ends, but at least once a second: a revoked lease (re-registration)
                # has no end to wait for.
                delay_ms = min(max(expires_ms - self._clock.monotonic_ms(), 1), 1000)
            await asyncio.sleep(delay_ms / 1000.0)

    async def _run_isr_checks(self) -> None:
        interval_s = max(self.settings.replica_lag_time_max_ms / 2, 10) / 1000.0
        while True:
            await asyncio.sleep(interval_s)
            await self.check_isr_shrinks_paced()

    async def _run_checkpoints(self) -> None:
        interval_s = max(self.settings.hwm_checkpoint_interval_ms, 10) / 1000.0
        while True:
            await asyncio.sleep(interval_s)
            await self.write_checkpoints()

    # --- high-watermark checkpoint ---------------------------------------------------------------

    def _restored_high_watermark(self, partition: Partition) -> int:
        """The checkpointed HWM of this partition's log (same topic id), 0 when none."""
        if self._restored is None:
            self._restored = self._read_checkpoints()
        return max(self._restored.get((partition.tp, partition.topic_id), 0), 0)

    def _read_checkpoints(self) -> dict[tuple[TopicPartition, str], int]:
        """Every log dir's stored checkpoint (a worker thread may run it: it reads files and parses)."""
        restored: dict[tuple[TopicPartition, str], int] = {}
        for log_dir in list(self._partitions.log_dirs):
            restored.update(hwm_checkpoint.read(log_dir))
        return restored

    def checkpoint_high_watermarks(self) -> None:
        """Write every online log dir's ``replication-offset-checkpoint`` that changed since its last write
        (empty for a dir without partitions), after any periodic write still in progress."""
        self.checkpoints.write_now(self._checkpoint_entries())

    def _checkpoint_entries(self) -> dict[Path, dict[tuple[TopicPartition, str], int]]:
        """Every online log dir → its partitions' high watermarks (an offline dir is never written).
        Nothing before the stored checkpoint was read (no partition state yet, e.g. stopped during the
        start-up catch-up): the files on disk are still the latest word and must not be replaced."""
        if self._restored is None:
            return {}
        by_dir: dict[Path, dict[tuple[TopicPartition, str], int]] = {
            d: {} for d in self._partitions.online_dirs
        }
        self._collect_pending(by_dir, self._pending)
        self._collect_pending(by_dir, self._taken)
        _collect_led(by_dir, self._led.values())
        _collect_followed(by_dir, self._followed.values())
        return by_dir

    def _collect_pending(
        self, by_dir: dict[Path, dict[tuple[TopicPartition, str], int]], tps: Iterable[TopicPartition]
    ) -> None:
        """The checkpointed high watermarks of hosted partitions whose state a stepped build has not
        created yet: the value the file holds is kept (a state made since, collected after, overrides it;
        one removed since is left out).  ``_restored`` is read: a state exists."""
        restored = self._restored
        assert restored is not None
        partitions = self._partitions
        for tp in tps:
            partition = partitions.get(tp)
            if partition is not None:
                value = restored.get(partition.checkpoint_key)
                if value is not None:
                    by_dir.setdefault(partition.log_dir, {})[partition.checkpoint_key] = max(value, 0)

    async def write_checkpoints(self, pacer: Pacer | None = None) -> int:
        """The periodic checkpoint (what ``run`` does every ``replica.high.watermark.checkpoint.interval.ms``)
        with every loop turn bounded by :data:`TIMER_WORK_UNIT_MS` (at 100,000 hosted partitions one go
        was a 200-250 ms stretch of CPU): the high watermarks are collected in steps of
        :data:`COLLECT_STEP`, then compared with the last write and encoded in steps
        (:meth:`CheckpointWriter.write_changed_paced`), and written on the writer's thread; the number of
        files written.

        Each value is the partition's high watermark when its step read it — one it really had, as in one
        go (where the write, on its thread, also lands after the values were read).  The one exception to
        a high watermark only growing, an unclean truncation below it (``_truncate_below_high_watermark``),
        is recorded while the pass runs and applied to the collected values before they are written
        (``_settle``).  Nothing is written once the broker closed (its final write is the last) or to a
        dir that went offline meanwhile."""
        if self._restored is None:
            return 0  # the stored checkpoints were never read: they stay the latest word
        pacer = pacer or Pacer(self._clock, TIMER_WORK_UNIT_MS)
        # (Passes running side by side share one record, kept until the last ends: a value lowered
        # before a pass started lowers what it read at most to a high watermark the partition had.)
        if self._lowered is None:
            self._lowered = {}
        self._checkpoint_passes += 1
        try:
            by_dir: dict[Path, dict[tuple[TopicPartition, str], int]] = {
                d: {} for d in self._partitions.online_dirs
            }
            # Partitions whose state a stepped build has still to create, taken in the same turn as the
            # led states and before the followed ones: one built during the pass is in one of them.
            pending = [*self._pending, *self._taken]
            led = list(self._led.values())
            for start in range(0, len(pending), COLLECT_STEP):
                self._collect_pending(by_dir, pending[start : start + COLLECT_STEP])
                await pacer.tick()
            del pending
            for start in range(0, len(led), COLLECT_STEP):
                _collect_led(by_dir, led[start : start + COLLECT_STEP])
                await pacer.tick()
            del led
            followed = list(self._followed.values())
            for start in range(0, len(followed), COLLECT_STEP):
                _collect_followed(by_dir, followed[start : start + COLLECT_STEP])
                await pacer.tick()
            del followed
            return await self.checkpoints.write_changed_paced(
                by_dir,
                pacer,
                wanted=lambda log_dir: not self._closed and log_dir in self._partitions.online_dirs,
                settle=self._settle,
            )
        finally:
            self._checkpoint_passes -= 1
            if not self._checkpoint_passes:
                self._lowered = None

    def _settle(self, log_dir: Path, entries: dict[tuple[TopicPartition, str], int]) -> bool:
        """Lower the collected values that an unclean truncation lowered since the pass started; True when
        one changed (the dir's entries are compared and encoded again)."""
        lowered = self._lowered.get(log_dir) if self._lowered is not None else None
        changed = False
        for key, offset in (lowered or {}).items():
            if key in entries and entries[key] > offset:
                entries[key] = offset
                changed = True
        return changed

    def _propose(self, led: _Led, new_isr: Iterable[int]) -> None:
        if self._send_alter_partition is None or led.state.pending is not None:
            return
        request = led.state.propose_isr(new_isr)
        self._log.info(
            "isr_change_proposed",
            partition=str(led.partition.tp),
            isr=list(led.state.isr),
            proposed=list(request.new_isr_ids),
        )
        led.alter_task = asyncio.get_running_loop().create_task(self._alter(led, request))

    async def _alter(self, led: _Led, request: AlterPartitionRequest) -> None:
        assert self._send_alter_partition is not None
        backoff_s = self.settings.alter_partition_backoff_ms / 1000.0
        while led.state.pending is request and self._led.get(led.partition.tp) is led:
            result = await self._send_one_alter(led, request)
            self.check_lease()  # a lapse while the request was out holds the HWM before the answer
            before = led.state.high_watermark
            follow_up = led.state.on_alter_partition_response(request, result)
            self._note_recovery(led)  # an applied answer says RECOVERED
            if led.state.high_watermark > before:
                self._high_watermark_advanced(led)
            if follow_up is not AlterPartitionFollowUp.RETRY:
                self._log.info(
                    "isr_change_answered",
                    partition=str(led.partition.tp),
                    follow_up=follow_up.value,
                    answer=result.name if isinstance(result, ErrorCode) else list(result.isr),
                )
                return
            await asyncio.sleep(backoff_s)

    async def _send_one_alter(self, led: _Led, request: AlterPartitionRequest) -> LeaderAndIsr | ErrorCode:
        assert self._send_alter_partition is not None
        # The broker epoch is read now: a state created before registration holds -1.
        broker_epoch = self._broker_epoch()
        tp = led.partition.tp
        message = cpb.AlterPartitionRequest(
            cluster_id=self.cluster_id,
            broker_id=self.broker_id,
            broker_epoch=broker_epoch,
            partitions=[
                cpb.AlterPartitionRequest.PartitionData(
                    topic_id=led.partition.topic_id,
                    partition=tp.partition,
                    leader_epoch=request.leader_epoch,
                    partition_epoch=request.partition_epoch,
                    leader_recovery_state=request.leader_recovery_state,
                    new_isr=[
                        cpb.AlterPartitionRequest.IsrMember(
                            broker_id=m.broker_id,
                            broker_epoch=broker_epoch if m.broker_id == self.broker_id else m.broker_epoch,
                        )
                        for m in request.new_isr
                    ],
                )
            ],
        )
        try:
            response = await self._send_alter_partition(message)
        except ControllerUnavailable:
            return ErrorCode.REQUEST_TIMED_OUT  # retried
        if response.error_code != ErrorCode.NONE or not response.partitions:
            return (
                ErrorCode.from_wire(response.error_code)
                if response.error_code
                else ErrorCode.UNKNOWN_SERVER_ERROR
            )
        result = response.partitions[0]
        if result.error_code != ErrorCode.NONE:
            return ErrorCode.from_wire(result.error_code)
        return LeaderAndIsr(
            result.leader,
            result.leader_epoch,
            result.partition_epoch,
            tuple(led.assignment.replicas),
            tuple(result.isr),
        )

    # --- follower: fetchers ----------------------------------------------------------------------

    def _ensure_fetcher(self, leader_id: int) -> None:
        task = self._fetchers.get(leader_id)
        if (task is None or task.done()) and not self._closed:
            self._fetchers[leader_id] = asyncio.get_running_loop().create_task(
                self._run_fetcher(leader_id), name=f"replica-fetcher-{leader_id}"
            )

    def _wake_fetcher(self, leader_id: int) -> None:
        event = self._fetcher_wake.get(leader_id)
        if event is not None:
            event.set()

    async def _pause(self, leader_id: int, seconds: float) -> None:
        """Sleep up to ``seconds``; cut short by metadata that changes what this fetcher should do."""
        event = self._fetcher_wake.setdefault(leader_id, asyncio.Event())
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(event.wait(), max(seconds, 0.0))
        event.clear()

    def _endpoint_of(self, broker_id: int) -> str | None:
        """``host:port`` of the broker's client listener in the current image (None: unknown)."""
        registration = self._image.brokers.get(broker_id)
        if registration is None or not registration.endpoints:
            return None
        chosen = next((e for e in registration.endpoints if e.name == self._listener), None)
        chosen = chosen or registration.endpoints[0]
        return f"{chosen.host or '127.0.0.1'}:{chosen.port}"

    async def _run_fetcher(self, leader_id: int) -> None:
        backoff_s = self.settings.fetch_backoff_ms / 1000.0
        while not self._closed and self._storage_failure is None:
            now_ms = self._clock.monotonic_ms()
            group = self._by_leader.get(leader_id, {})
            mine = {tp: f for tp, f in group.items() if not f.stopped}
            if not mine:
                if self._fetchers.get(leader_id) is asyncio.current_task():
                    del self._fetchers[leader_id]
                return
            ready = {tp: f for tp, f in mine.items() if f.retry_at_ms <= now_ms}
            if not ready:
                first_ms = min(f.retry_at_ms for f in mine.values())
                await self._pause(leader_id, min((first_ms - now_ms) / 1000.0, backoff_s))
                continue
            request = pb.ReplicaFetchRequest(
                cluster_id=self.cluster_id,
                replica_id=self.broker_id,
                broker_epoch=self._broker_epoch(),
                max_wait_ms=self.settings.fetch_max_wait_ms,
                max_bytes=self.settings.fetch_response_max_bytes,
            )
            sent: dict[TopicPartition, tuple[_Followed, int, int]] = {}
            for tp, followed in sorted(ready.items()):
                log = followed.partition.log
                entries = log.epoch_entries()
                offset = log.log_end_offset
                request.partitions.add(
                    topic=tp.topic,
                    partition=tp.partition,
                    current_leader_epoch=followed.leader_epoch,
                    fetch_offset=offset,
                    last_fetched_epoch=_latest_epoch(entries),
                    partition_max_bytes=self.settings.fetch_max_bytes,
                    durable_offset=min(log.flushed_offset, offset),
                )
                sent[tp] = (followed, followed.leader_epoch, offset)
            timeout_s = (self.settings.fetch_max_wait_ms + self.settings.request_timeout_ms) / 1000.0
            try:
                response = await self._transport.replica_fetch(leader_id, request, timeout_s)
            except ReplicaFetchFailed as err:
                self._log.debug("replica_fetch_failed", leader=leader_id, code=err.code)
                await self._pause(leader_id, backoff_s)
                continue
            if response.error_code != ErrorCode.NONE:
                self._log.warning(
                    "replica_fetch_error",
                    leader=leader_id,
                    code=response.error_code,
                    message=response.error_message,
                )
                await self._pause(leader_id, backoff_s)
                continue
            for answer in response.partitions:
                tp = TopicPartition(answer.topic, answer.partition)
                entry = sent.get(tp)
                if entry is None:
                    continue
                try:
                    self._apply_fetched(tp, entry, answer)
                except (FatalStorageError, OSError) as exc:  # the disk failed a write: fail-stop
                    self.storage_failed(entry[0].partition, exc, "replica_append_failed")
                    return
                except Exception as exc:  # a bad batch: this partition backs off
                    self._log.error("replica_fetch_apply_failed", partition=str(tp), error=repr(exc))
                    entry[0].retry_at_ms = self._clock.monotonic_ms() + self.settings.fetch_backoff_ms
                    if is_storage_failure(exc):  # corrupt local data: its log dir goes offline
                        self._partitions.storage_failed(entry[0].partition, exc)
            for tp, (followed, _, _) in sent.items():  # only a fetch changes a followed log's lag
                if self._followed.get(tp) is followed:
                    self._lags.set(tp, self._follower_lag(followed))
            self._update_fetcher_lag()

    def _apply_fetched(
        self,
        tp: TopicPartition,
        sent: tuple[_Followed, int, int],
        answer: pb.ReplicaFetchResponse.Partition,
    ) -> None:
        followed, epoch, offset = sent
        partition = followed.partition
        # The answer is used only if nothing changed while it was in flight (role, leader, epoch, log).
        if (
            self._followed.get(tp) is not followed
            or self._partitions.get(tp) is not partition
            or partition.role is not ReplicaRole.FOLLOWER
            or followed.leader_epoch != epoch
            or partition.log.log_end_offset != offset
        ):
            return
        code = ErrorCode.from_wire(answer.error_code)
        if code is not ErrorCode.NONE:
            # FENCED_LEADER_EPOCH, NOT_LEADER_OR_FOLLOWER: the metadata will tell (it wakes the fetcher);
            # UNKNOWN_LEADER_EPOCH: the leader has not applied our epoch yet, it will in a moment.
            backoff_ms = self.settings.fetch_backoff_ms
            if code is ErrorCode.UNKNOWN_LEADER_EPOCH:
                backoff_ms = min(backoff_ms, UNKNOWN_EPOCH_RETRY_MS)
            followed.retry_at_ms = self._clock.monotonic_ms() + backoff_ms
            self._log.debug("replica_fetch_partition_error", partition=str(tp), code=code.name)
            return
        log = partition.log
        if answer.HasField("diverging_epoch"):
            step = next_truncation_step(
                log.epoch_entries(),
                log.log_end_offset,
                min(followed.high_watermark, log.log_end_offset),
                EpochEndOffset(answer.diverging_epoch.epoch, answer.diverging_epoch.end_offset),
            )
            unclean_epoch = partition.assignment.last_unclean_leader_epoch
            if step.kind is TruncationKind.BELOW_HIGH_WATERMARK and unclean_loss_allowed(
                log.epoch_entries(), log.log_end_offset, followed.high_watermark, step.offset, unclean_epoch
            ):
                step = self._truncate_below_high_watermark(
                    followed,
                    tp,
                    EpochEndOffset(answer.diverging_epoch.epoch, answer.diverging_epoch.end_offset),
                    unclean_epoch,
                )
            if step.kind is TruncationKind.BELOW_HIGH_WATERMARK:
                followed.stopped = True  # until a new leader epoch (another unclean election may allow it)
                self._log.error(
                    "truncation_below_high_watermark_refused",
                    partition=str(tp),
                    offset=step.offset,
                    high_watermark=followed.high_watermark,
                    last_unclean_leader_epoch=unclean_epoch,
                )
                return
            new_end = log.truncate_to(step.offset)
            self._log.info("follower_truncated", partition=str(tp), offset=new_end, leader_epoch=epoch)
            return
        followed.leader_log_end = answer.log_end_offset
        records = answer.records
        if records:
            self.metrics.replica_fetcher_bytes.inc(len(records))
            log.append_batches(records)
            followed.unflushed_bytes += len(records)
        # The next fetch reports the flushed offset as durable: flush once caught up (so acks=all never
        # waits on it) or every catch_up_flush_bytes while behind (one fsync per few MiB, not per fetch).
        # (The log, not unflushed_bytes, says whether anything is unflushed: a follower state created
        # for a new leader epoch starts at 0 over a log that may hold an unflushed tail.)
        if log.flushed_offset < log.log_end_offset and (
            log.log_end_offset >= answer.log_end_offset
            or followed.unflushed_bytes >= self.settings.catch_up_flush_bytes
        ):
            try:
                log.flush()
            except Exception as exc:  # whatever the log raised, what is on disk is unknown
                raise FatalStorageError(f"flush of {tp} failed: {exc!r}") from exc
            followed.unflushed_bytes = 0
        followed.high_watermark = max(followed.high_watermark, min(answer.high_watermark, log.log_end_offset))

    # --- shutdown --------------------------------------------------------------------------------

    async def close(self) -> None:
        if not self._closed:
            try:
                self.checkpoint_high_watermarks()
            except Exception as exc:  # a failing disk: the next start begins from older (lower) values
                self._log.error("hwm_checkpoint_failed", error=repr(exc))
        self._closed = True
        tasks = [*self._fetchers.values(), *(led.alter_task for led in self._led.values() if led.alter_task)]
        if self._build is not None:
            tasks.append(self._build)
        # (a later image sets up what a stepped build left, as it does the states dropped below)
        self._revisit.update(self._pending)
        self._revisit.update(self._taken)
        self._pending, self._taken = set(), set()
        for tp in list(self._led):
            self._drop_led(tp)
        self._revisit.update(self._followed)  # (a later image sets them up again, as it always did)
        self._followed.clear()
        self._by_leader.clear()
        self._lags.clear()
        self._fetchers.clear()
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._transport.close()
