"""The active controller: the asyncio shell around :class:`ControllerLogic` and a :class:`RaftClient`.

:class:`QuorumController` composes the parts below and handles ControllerService requests.  Tasks and
what they own (all on one event loop, so no locks; shared state in :class:`ControllerState`):

- **Raft listener** (driven by Raft's own per-listener task; this class): ``handle_commit`` replays
  committed batches into ``committed`` (the committed image; :mod:`commit_replay`), hands them to the
  fetch window, resolves write waiters; ``handle_leader_change`` activates or deactivates.  Its own
  small batches the leader's driver hands over in the step they commit (``handle_commit_now``).  A committed
  record (or snapshot record) that does not decode or apply raises ``UnreplayableRecordError``: the Raft
  listener then fails and the node stops (``reason=raft_listener_failed``), never leading or serving an
  image without it.
- **Activation** (:mod:`controller_activation`, one task per won epoch): appends a NoOp, waits for it to
  commit — so ``committed`` holds everything of earlier epochs — then resets the logic from it (fresh
  heartbeat sessions for every broker) and starts answering.
- **Write path** (:mod:`controller_writes`): runs requests as events of the queue, appends at predicted
  offsets, the bulk job driver, commit waiters, leader lease.
- **Session checker** (:mod:`session_checker`): every ``session_timeout/8`` fences at most one expired
  broker per write; a stalled event loop pushes every deadline back instead of blaming brokers.
- **Idle NoOp** (:mod:`idle_noops`): a NoOp record every ``metadata.max.idle.interval.ms`` without other
  writes.
- **Store writer** (:mod:`store_writer`): saves ``committed`` to the image store (coalescing), never on the
  commit path.
- **Snapshotter** (:mod:`snapshotter`): a Raft snapshot of ``committed`` every N bytes of records / interval.
- **MetadataFetch** (:mod:`fetch_server`): committed records from a window of recent batches, long-polls,
  snapshot downloads.
- **Gauges** (:mod:`controller_gauges`) and **heap freezing** (:mod:`heap_freezer`).

Every timer and timeout reads the injected :class:`~kraft.clock.Clock` through
:class:`~kraft.metadata.timers.Timers`: unit tests step a ManualClock, and the controller simulation
(tests/sim/test_controller_sim.py) runs three of these controllers on a virtual-time event loop.

Every computation on the logic is one event of the **event queue** (:mod:`event_queue`, the single
writer): the logic computes records synchronously (validated against the speculative image) and they are
scheduled on Raft at the offsets it predicted, in the same event; BrokerHeartbeat and RegisterBroker use
the urgent lane, so they never wait behind bulk work.  The answer is sent from the request's own task
once the high watermark passes its records.  A request that produced no records still waits for every
earlier pending write, so an answer never reflects uncommitted state.  Bulk work (a broker leaving its
ISRs, unfence elections) continues in slices of ``max_work_unit_records`` from the write path's job
driver; big CreateTopics / DeleteTopics are written in parts of that size.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path
from typing import Any, NoReturn, Protocol, TypeVar

from google.protobuf.message import Message

from kraft.clock import CHECK_EVERY, DEFAULT_WORK_UNIT_MS, Clock, Deadline, run_paced
from kraft.config import DEFAULT_MAX_PARKED_FETCHES
from kraft.errors import ErrorCode, KraftError
from kraft.features import LATEST_METADATA_VERSION, METADATA_VERSION_FEATURE
from kraft.metadata import acl_control, config_control, feature_control, partition_growth
from kraft.metadata.commit_replay import replay_batch, replay_known_commits
from kraft.metadata.controller_activation import Activation
from kraft.metadata.controller_gauges import ControllerGauges
from kraft.metadata.controller_logic import (
    DEFAULT_MAX_BROKER_PARTITIONS,
    DEFAULT_MAX_PARTITIONS,
    PREPARED_TOPIC_MIN_PARTITIONS,
    ControllerLogic,
    ControllerSettings,
    CreateTally,
    Outcome,
    TopicPlan,
    TopicTransactionBusy,
    UncleanElectionScan,
    describe_topic,
    error_response,
    is_big_topic,
    is_prepared_topic,
    merge_election_parts,
)
from kraft.metadata.controller_state import (
    YIELD_EVERY_RECORDS,
    ControllerState,
    NotControllerError,
    WriteOutcomeUnknown,
)
from kraft.metadata.controller_writes import LeadershipNotConfirmed, WritePath
from kraft.metadata.delta import MetadataDelta, unreplayable
from kraft.metadata.election_config import UNCLEAN_ELECTION
from kraft.metadata.event_queue import EventPriority, EventQueueClosedError
from kraft.metadata.event_timings import EventTimings
from kraft.metadata.fetch_server import FetchServer, VotersInForce
from kraft.metadata.fetch_window import WindowBatch
from kraft.metadata.heap_freezer import HeapFreezer
from kraft.metadata.heartbeat_lane import SLOW_REASONS, HeartbeatLane
from kraft.metadata.idle_noops import IdleNoOps
from kraft.metadata.image import MetadataImage
from kraft.metadata.isr_changes import alter_partition
from kraft.metadata.partition_reservations import RequestOrder
from kraft.metadata.request_limits import RequestLimits, check_create_topics
from kraft.metadata.session_checker import SessionChecker
from kraft.metadata.snapshotter import Snapshotter
from kraft.metadata.store_writer import (
    STORE_BULK_STAGGER_MS,
    STORE_MAX_DEFER_MS,
    FatalReporter,
    StoreWriter,
    save_slot,
)
from kraft.metadata.timers import Timers
from kraft.observability.logging import get_logger
from kraft.observability.metrics import ControllerMetrics
from kraft.raft.api import (
    CommittedBatch,
    LeaderAndEpoch,
    LoadedSnapshot,
    NotLeaderError,
    RaftClient,
    RaftShutdownError,
    offset_values,
)
from kraft.raft.messages import NO_LEADER
from kraft.reaper import MIN_ITEMS, release_later, release_replaced_maps, release_replaced_topics
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb

R = TypeVar("R", bound=Message)

COUNT_SLICE_PARTITIONS = 1_000  # per-broker partition counts: recounted this many per loop turn
# A loaded snapshot is replayed this many records between budget checks (~0.1-0.3 ms: a piece that
# starts just before the budget runs out ends at most that far past it; 200 overran it by 1-2 ms).
SNAPSHOT_PIECE_RECORDS = CHECK_EVERY
STOP_CATCH_UP_BUDGET_MS = 1_000
"""A graceful stop replays the commits Raft knows of but the listener had not applied for at most this
long before the image store's last save (well inside the node's 5 s stop-hook bound)."""
RELEASE_STEP_TOPICS = 2_000  # topics of a replaced image looked at between budget checks (~0.1 ms)


async def _reraise(exc: BaseException) -> NoReturn:
    raise exc


async def _returning(work: Awaitable[None], result: R) -> R:
    await work
    return result


def _copy(response: R) -> R:
    copy = type(response)()
    copy.CopyFrom(response)
    return copy


def _ignore_result(future: asyncio.Future[None]) -> None:
    """A lease note's confirmation: nobody waits for it (a lost leadership is heard elsewhere)."""
    if not future.cancelled():
        future.exception()


async def _next_loop_turn() -> None:
    await asyncio.sleep(0)


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """Timing and sizing knobs (config keys in brackets)."""

    session_timeout_ms: int = 9000  # broker.session.timeout.ms
    heartbeat_interval_ms: int = 2000  # broker.heartbeat.interval.ms (what brokers are expected to send)
    noop_interval_ms: int = 500  # metadata.max.idle.interval.ms (0 = off)
    # controller.image.store.bulk.defer.max.ms: the longest the image store's save waits for bulk work to
    # end (kraft.metadata.store_writer; 0 = saves never wait)
    store_bulk_defer_max_ms: int = STORE_MAX_DEFER_MS
    # controller.image.store.save.pause.percent: a save's pause after each 2,000-row chunk, in percent of
    # the chunk's time (kraft.metadata.store; 0 = none)
    store_save_pause_percent: int = 0
    # controller.image.store.bulk.save.stagger.ms: after bulk work, how much longer each later slot's save
    # waits (kraft.metadata.store_writer; 0 = none)
    store_bulk_save_stagger_ms: int = STORE_BULK_STAGGER_MS
    # controller.create.topics.preparing.max: the most prepared topics of one CreateTopics placed and built
    # at once, the rest waiting (planned) in the request's order; 0 = all at once.  All at once interleaves
    # every topic's preparing events, so the request's first write comes only after ~all of its records
    # were built: the followers idled through the first ~45 % of bench.controller's 100,000-partition
    # creation (sampled, session 16) and the leader through its last part, waiting for their replay.  With
    # 2, one topic is built while the one before it is written and replicated.  Off by default: not shown
    # faster end to end yet (raft-performance.md, session 16's bulk creation).
    create_topics_preparing_max: int = 0
    snapshot_max_bytes: int = 20 * 1024 * 1024  # metadata.log.max.record.bytes.between.snapshots
    snapshot_interval_ms: int = 3_600_000  # metadata.log.max.snapshot.interval.ms
    commit_timeout_ms: int = 30_000  # how long a request waits for its commit
    activation_wait_ms: int = 5_000  # a request arriving mid-activation waits this long
    leader_lease_ms: int = 2_000  # controller.quorum.fetch.timeout.ms: no commit for this long → step aside
    fetch_window_records: int = 200_000  # recent committed records kept for MetadataFetch
    # controller.max.work.unit.records: the most records one event of the controller computes and appends
    # (CreateTopics parts, DeleteTopics parts by partitions removed, slices of ISR removals and unfence
    # elections); bulk work continues in further events, behind heartbeats
    max_work_unit_records: int = 1_000
    # controller.max.event.time.ms: the time budget of one such event (and of each slice of a committed
    # batch's replay), on the injected clock; whichever bound comes first ends the slice (0 = records only)
    max_event_time_ms: int = DEFAULT_WORK_UNIT_MS
    # bulk work computes no further slice while this many appended records are not committed yet
    max_uncommitted_bulk_records: int = 10_000
    # a topic of this many partitions or more (up to a work unit) is placed and built in bounded events
    # and written in one (not a config key; the simulation lowers it)
    prepared_topic_min_partitions: int = PREPARED_TOPIC_MIN_PARTITIONS
    default_num_partitions: int = 1  # num.partitions
    default_replication_factor: int = 1  # default.replication.factor
    max_partitions: int = DEFAULT_MAX_PARTITIONS  # max.partitions
    max_broker_partitions: int = DEFAULT_MAX_BROKER_PARTITIONS  # max.broker.partitions
    min_insync_replicas: int = (
        1  # min.insync.replicas: the ELR rule's default (kraft.metadata.election_config)
    )
    unclean_leader_election_enable: bool = False  # unclean.leader.election.enable: its default
    # max.request.topics / max.request.partitions
    request_limits: RequestLimits = field(default_factory=RequestLimits)
    metadata_fetch_max_wait_ms: int = 10_000  # metadata.fetch.max.wait.ms: cap of a MetadataFetch long-poll
    max_parked_fetches: int = DEFAULT_MAX_PARKED_FETCHES  # fetch.max.parked.requests
    # the controller listener redirects (NodeRefs) name: controller.listener.names[0] and its protocol in
    # listener.security.protocol.map
    controller_listener_name: str = "CONTROLLER"
    controller_security_protocol: str = "PLAINTEXT"
    # the levels a brand-new cluster starts at: the bootstrap checkpoint (kraft storage format
    # --release-version / --feature, kraft.metadata.bootstrap), else the latest metadata.version
    bootstrap_features: Mapping[str, int] = field(
        default_factory=lambda: {METADATA_VERSION_FEATURE: LATEST_METADATA_VERSION}
    )


def _topic_chunks(req: cpb.CreateTopicsRequest, max_records: int) -> list[list[cpb.CreatableTopic]]:
    chunks: list[list[cpb.CreatableTopic]] = [[]]
    weight = 0
    for topic in req.topics:
        size = len(topic.assignments) or max(topic.num_partitions, 1)
        if chunks[-1] and weight + size > max_records:
            chunks.append([])
            weight = 0
        chunks[-1].append(topic)
        weight += size
    return chunks


class QuorumController:
    """Serves ControllerService on one controller node; only the Raft leader acts."""

    def __init__(
        self,
        raft: RaftClient,
        cluster_id: str,
        endpoints: Mapping[int, tuple[str, int]],
        options: ControllerOptions | None = None,
        store_path: Path | None = None,
        *,
        clock: Clock,
        new_topic_id: Callable[[], str] | None = None,
        on_fatal: FatalReporter | None = None,
        lease_expiry_ms: Callable[[], int] | None = None,
        endpoint_of: Callable[[int], tuple[str, int] | None] | None = None,
        voters_in_force: VotersInForce | None = None,
    ) -> None:
        """``endpoints``: the static quorum's voter id → (host, port) (``controller.quorum.voters``);
        ``endpoint_of`` looks up a voter the static map lacks — in a dynamic quorum every voter's endpoint
        lives in the log's voter set, so a NOT_CONTROLLER hint without it would name the new leader with no
        address, and a broker that knows only a bootstrap controller removed from the quorum could never
        reach it (it heartbeated the removed one until its session ran out).  ``voters_in_force``: the
        voter set (and its VotersRecord's offset) that MetadataFetch answers carry to brokers (None, or a
        static quorum: none; kraft.metadata.fetch_server).
        ``new_topic_id`` makes topic ids deterministic (the simulation); random UUIDs by default.
        ``on_fatal`` (the node's ``Supervisor.fail``) is told when the image store or a snapshot cannot be
        written (fail-stop, issue #14).  ``lease_expiry_ms`` (the Raft driver's leader lease end on
        ``clock``) turns on the heartbeat fast lane, :attr:`lane` (controller.broker.heartbeats.fast.lane)."""
        self.raft = raft
        self.node_id = raft.node_id
        self.cluster_id = cluster_id
        self.options = options = options or ControllerOptions()
        self.endpoints = dict(endpoints)
        self._endpoint_of = endpoint_of
        self.clock = clock
        self.timers = Timers(clock)
        self.metrics = metrics = ControllerMetrics.for_node(self.node_id)
        self.log = log = get_logger("controller", node=self.node_id)
        self.state = state = ControllerState(self.node_id)
        settings = ControllerSettings(
            cluster_id,
            session_timeout_ms=options.session_timeout_ms,
            default_num_partitions=options.default_num_partitions,
            default_replication_factor=options.default_replication_factor,
            max_partitions=options.max_partitions,
            max_broker_partitions=options.max_broker_partitions,
            request_limits=options.request_limits,
            max_changes_per_write=options.max_work_unit_records,
            max_event_time_ms=options.max_event_time_ms,
            bootstrap_features=dict(options.bootstrap_features),
            min_insync_replicas=options.min_insync_replicas,
            unclean_leader_election_enable=options.unclean_leader_election_enable,
        )
        self._prepared_writes = asyncio.Lock()  # prepared topics append one after the other (paced)
        self.writes = WritePath(
            state,
            raft,
            self.timers,
            commit_timeout_ms=options.commit_timeout_ms,
            leader_lease_ms=options.leader_lease_ms,
            on_not_leader=self._deactivate,
            log=log,
            max_uncommitted_records=options.max_uncommitted_bulk_records,
        )
        self.event_timings = EventTimings(self.node_id, clock, options.max_event_time_ms, log)
        self.writes.queue.observe(clock, self._event_ran, self.event_timings.start)
        self.activation = Activation(
            state,
            raft,
            self.writes,
            settings,
            self.timers,
            activation_wait_ms=options.activation_wait_ms,
            new_topic_id=new_topic_id,
            metrics=metrics,
            log=log,
        )
        self.sessions = SessionChecker(
            state,
            self.writes,
            self.timers,
            session_timeout_ms=options.session_timeout_ms,
            heartbeat_interval_ms=options.heartbeat_interval_ms,
            metrics=metrics,
            log=log,
        )
        self.noops = IdleNoOps(state, self.writes, self.timers, interval_ms=options.noop_interval_ms)
        self.store = StoreWriter(
            store_path,
            self.timers,
            lambda: state.committed,
            metrics=metrics,
            log=log,
            on_fatal=on_fatal,
            max_defer_ms=options.store_bulk_defer_max_ms,
            save_pause_percent=options.store_save_pause_percent,
            stagger_ms=options.store_bulk_save_stagger_ms,
            save_slot=self._store_save_slot,
        )
        self.snapshotter = Snapshotter(
            raft,
            clock,
            max_bytes=options.snapshot_max_bytes,
            interval_ms=options.snapshot_interval_ms,
            metrics=metrics,
            log=log,
            on_fatal=on_fatal,
        )
        self.fetches = FetchServer(
            state,
            self.timers,
            cluster_id=cluster_id,
            window_records=options.fetch_window_records,
            max_wait_ms=options.metadata_fetch_max_wait_ms,
            max_parked=options.max_parked_fetches,
            active_logic=self.activation.active_logic,
            not_controller=self._not_controller,
            voters=voters_in_force,
        )
        self.gauges = ControllerGauges(state, self.timers, metrics)
        self.heap = HeapFreezer(clock)
        self._tasks: list[asyncio.Task[Any]] = []
        self.lane: HeartbeatLane | None = None  # steady heartbeats answered on the intake thread
        self._lane_logged: ControllerLogic | None = None  # the leadership whose lane use was logged
        if lease_expiry_ms is not None:
            self.lane = HeartbeatLane(
                clock,
                cluster_id,
                lease_expiry_ms,
                # Raft's lease is at most this long (0.8 x min(fetch timeout, election timeout / 2)): a
                # note every eighth of it, at most every 100 ms (10 cross-thread posts a second).
                note_interval_ms=min(options.leader_lease_ms // 8, 100),
                on_answer=metrics.heartbeats_fast_lane.inc,
                on_slow=_count_by_reason(metrics.heartbeats_slow_path),
                on_slow_answered=metrics.heartbeat_slow_path_seconds.observe,
            )
            self.sessions.take_touches = self._take_touches
            self.sessions.leave_steady = self.lane.unpublish

    # ---- lifecycle ----

    async def start(self) -> None:
        """Load the image store (if any), listen to Raft, start the periodic tasks."""
        loaded = await self.store.open()
        if loaded is not None:
            self.state.committed = loaded
            self.log.info("image_loaded", offset=loaded.offset, topics=len(loaded.topics_by_id))
            gc.freeze()  # the loaded image (see heap_freezer); startup leaves little garbage behind
        self.raft.register_listener(self)
        if self.lane is not None:
            main = asyncio.get_running_loop()

            def notify() -> None:  # on the intake thread
                with contextlib.suppress(RuntimeError):  # the main loop is closed: the node stops
                    main.call_soon_threadsafe(self._lane_note)

            self.lane.bind(notify)
        self._tasks = [
            asyncio.create_task(self.sessions.run(), name="controller-sessions"),
            asyncio.create_task(self.noops.run(), name="controller-noops"),
            asyncio.create_task(self.store.run(), name="controller-store"),
            asyncio.create_task(self.gauges.run_partition_scans(), name="controller-metrics"),
            asyncio.create_task(self.heap.run(self.timers), name="controller-heap"),
        ]

    async def stop(self) -> None:
        self.state.stopping = True
        if self.lane is not None:
            self.lane.bind(None)
            self.lane.clear()
        self.raft.unregister_listener(self)
        self.activation.deactivate(NO_LEADER)
        await self.writes.queue.close()
        tasks = [
            *self._tasks,
            *self.writes.resignations,
            *(t for t in (self.writes.driver, self.writes.settler) if t is not None),
            *(
                t
                for t in (self.activation.task, self.activation.index_task, self.snapshotter.task)
                if t is not None
            ),
        ]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await self._apply_known_commits()
        await self.store.close()

    async def _apply_known_commits(self) -> None:
        """Before the store's last save: the commits this node knew of that its listener (a follower's
        runs ``controller.quorum.follower.listener.delay.ms`` late) had not applied yet — else the store
        stayed behind the log and the next start replayed them (issue #17, a flaky broker test) — and,
        within the same budget, those in its log it had not learned committed yet (the leader's next Fetch
        answer tells).  Only for a store: nothing else outlives the stop."""
        if not self.store.is_open:
            return
        before = self.state.committed
        started_ms = self.clock.monotonic_ms()
        reached = await replay_known_commits(
            self.raft,
            before,
            self.clock,
            STOP_CATCH_UP_BUDGET_MS,
            piece_budget_ms=self.options.max_event_time_ms,
        )
        if reached.batches:
            self.state.committed = reached.image
        self.log.info(
            "stop_commits_applied",
            from_offset=before.offset,
            to_offset=reached.image.offset,
            high_watermark=reached.high_watermark,
            known_high_watermark=reached.known_high_watermark,
            batches=reached.batches,
            stopped=reached.stopped,
            elapsed_ms=self.clock.monotonic_ms() - started_ms,
        )

    @property
    def background_tasks(self) -> tuple[asyncio.Task[Any], ...]:
        """The tasks :meth:`start` created, meant to run until :meth:`stop` (the node watches them)."""
        return tuple(self._tasks)

    @property
    def committed(self) -> MetadataImage:
        """The committed image."""
        return self.state.committed

    @property
    def logic(self) -> ControllerLogic | None:
        """The logic (committed + pending writes); set only while active."""
        return self.state.logic

    @property
    def is_active(self) -> bool:
        return self.state.logic is not None

    def _store_save_slot(self) -> int:
        """This controller's place among the quorum's deferred image-store saves (:func:`save_slot`)."""
        leader = self.state.leader.leader_id
        return save_slot(self.node_id, None if leader == NO_LEADER else leader)

    # ---- Raft listener ----

    def handle_commit_now(self, batch: CommittedBatch) -> bool:
        """The synchronous part of :meth:`handle_commit` (:class:`~kraft.raft.api.CommitNowListener`): a
        batch already in the image, or one this controller wrote whole and holds the image of, is applied
        here and True returned — Raft's leader calls this in the step its high watermark passes the batch,
        so the write's answer is released a loop turn (and the listener task's catch-up) sooner.  False
        for a batch that must be replayed (another epoch's, a follower's, anything that does not line up
        with its own appends): :meth:`handle_commit` replays it.  Looking up the own image drops it when it
        does not fit, and :meth:`handle_commit` would find none then either."""
        if batch.last_offset <= self.state.committed.offset:
            return True  # already in the image loaded from the store
        own = self.writes.own_image(batch)
        if own is None:
            return False
        # This controller wrote the whole batch and already holds the image it leads to (and, almost
        # always, the values: then the batch's records are never decoded).
        values = self.writes.own_values(batch)
        if values is None:
            values = offset_values(batch.records)
        self._apply_committed(batch, own, values)
        return True

    async def handle_commit(self, batch: CommittedBatch) -> None:
        if self.handle_commit_now(batch):
            return
        state = self.state
        self.writes.forget_own_values_below(batch.last_offset + 1)  # replayed instead
        replayed = await replay_batch(
            state.committed, batch, self.clock, self.options.max_event_time_ms, self.raft.yield_turn
        )
        problems = len(replayed.undecodable) + len(replayed.replay_errors)
        if problems:
            # Fatal: the listener fails, the node stops (one event=fatal line) instead of running with an
            # image that lacks committed records (the committed image is left as it was).
            self.metrics.metadata_errors.inc(problems)
            replayed.check(batch.last_offset)
        self._apply_committed(batch, replayed.image, replayed.values)

    def _apply_committed(
        self, batch: CommittedBatch, image: MetadataImage, values: list[tuple[int, bytes]]
    ) -> None:
        self.state.committed = image
        self.snapshotter.count_committed(sum(len(v) for _, v in values))
        self.fetches.remember(
            WindowBatch(
                batch.base_offset, batch.last_offset, batch.epoch, batch.append_timestamp_ms, tuple(values)
            )
        )
        self.writes.on_committed(batch.last_offset, batch.epoch)
        if self.lane is not None:
            self.lane.publish(self.state.logic, image.offset)
        self.state.signal_commit()
        self.store.mark_dirty()
        self.gauges.on_commit()
        self.snapshotter.maybe_snapshot(image)
        self.heap.applied(len(values))

    async def handle_load_snapshot(self, reader: LoadedSnapshot) -> None:
        if reader.snapshot_id.end_offset - 1 <= self.state.committed.offset:
            return
        with self.heap.load():  # (the records frozen, automatic collections paused: see there)
            await self._load_snapshot(reader)

    async def _load_snapshot(self, reader: LoadedSnapshot) -> None:
        state = self.state
        last = reader.snapshot_id.end_offset - 1
        delta = MetadataDelta(MetadataImage.empty())
        errors: list[KraftError] = []  # values that are not metadata records
        values = reader.records
        deadline = Deadline(self.clock, self.options.max_event_time_ms)
        since_yield = 0
        for start in range(0, len(values), SNAPSHOT_PIECE_RECORDS):
            # Bulk replay in bounded chunks (records and time): a million-partition snapshot must not
            # stall Raft for seconds.
            piece = values[start : start + SNAPSHOT_PIECE_RECORDS]
            delta.replay_values(piece, on_error=errors.append)
            since_yield += len(piece)
            if since_yield >= YIELD_EVERY_RECORDS or deadline.expired():
                self.heap.loading()
                await asyncio.sleep(0)
                deadline = Deadline(self.clock, self.options.max_event_time_ms)
                since_yield = 0
        await self._between_load_phases()
        if last <= state.committed.offset:
            return  # commits arrived while this ran (they are newer than the snapshot)
        problems = len(errors) + len(delta.replay_errors)
        if problems:
            # As for a committed batch: a snapshot the image cannot take whole is fatal (fail-stop).
            self.metrics.metadata_errors.inc(problems)
            error = unreplayable(
                f"snapshot {reader.snapshot_id.end_offset}-{reader.snapshot_id.epoch}",
                last,
                [(-1, e.message) for e in errors],
                list(delta.replay_errors),
            )
            assert error is not None
            raise error
        delta.offset = last
        delta.epoch = reader.snapshot_id.epoch
        # The image is built off to the side in steps (a million partitions: ~50-80 ms in one go, 100,000
        # small topics ~0.7 s) and published at once below: nothing reads it before.
        image = await run_paced(
            delta.apply_steps(), self.clock, self.options.max_event_time_ms, self.heap.loading
        )
        await self._between_load_phases()
        await run_paced(delta.discard_steps(), self.clock, self.options.max_event_time_ms)
        del delta
        await self._between_load_phases()
        if last <= state.committed.offset:
            # Commits arrived while it was built (they are newer than the snapshot): the built image
            # goes unused, and in slices too.
            await self._release_replaced(image)
            return
        replaced, state.committed = state.committed, image
        self.fetches.forget_all()
        self.snapshotter.forget_counted()
        self.writes.resolve_waiters(last, reader.snapshot_id.epoch)
        self.store.mark_dirty()
        self.heap.loaded()
        self.log.info(
            "snapshot_loaded", end_offset=reader.snapshot_id.end_offset, epoch=reader.snapshot_id.epoch
        )
        await self._release_replaced(replaced)
        if len(values) >= MIN_ITEMS:
            # The snapshot's records (a million bytes objects: ~20-30 ms to free) go when Raft's
            # listener lets go of the snapshot: in slices.
            release_later([values])
        await self._between_load_phases()  # (the listener goes on to the next batch without a turn)

    async def _between_load_phases(self) -> None:
        """A loop turn between two paced phases of a snapshot load: each phase starts its own budget, so
        without one the end of a phase and the start of the next ran as one stretch (up to twice the
        budget: 7-9 ms at the replay/apply, apply/discard and discard/publish seams)."""
        self.heap.loading()
        await _next_loop_turn()

    async def _release_replaced(self, replaced: MetadataImage) -> None:
        """Hand the topics of an image a snapshot replaced, and its topic maps, to the reaper
        (:mod:`kraft.reaper`).

        The snapshot's image was built from the empty one, so it shares nothing with ``replaced``: when
        the last holder of ``replaced`` (this frame, the image store's last save, a fetch) lets go, every
        topic of it would be freed in one go — ~5 ms per 100,000 partitions, 50-56 ms at a million — and
        its two topic maps with them (~40-60 ms at 100,000 topics).  Big topics go alone, small ones in
        groups of about a reaper chunk of partitions, then the maps.  ``replaced`` is held here until all
        is handed over, so nothing is freed before; the topics are looked at in steps (200,000 small
        topics are an ~11 ms walk)."""
        topics = iter(replaced.topics_by_id.values())
        deadline = Deadline(self.clock, self.options.max_event_time_ms)
        while step := list(islice(topics, RELEASE_STEP_TOPICS)):
            release_replaced_topics(step)
            if deadline.expired():
                await asyncio.sleep(0)
                deadline = Deadline(self.clock, self.options.max_event_time_ms)
        release_replaced_maps((replaced.topics_by_id, replaced.topic_ids_by_name))

    def _deactivate(self, leader_id: int) -> None:
        """Raft refused an append: leadership is gone (Activation exists only after the write path)."""
        if self.lane is not None:
            self.lane.clear()
        self.activation.deactivate(leader_id)

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        if self.lane is not None:
            self.lane.clear()  # republished by the next event of a new activation
        self.state.leader = leader
        self.activation.on_leader_change(leader)

    # ---- the heartbeat fast lane (kraft.metadata.heartbeat_lane) ----

    def _event_ran(self, name: str, duration_ms: int) -> None:
        """After every event, in the same synchronous stretch: a broker the event fenced, shut down or
        re-registered leaves the lane's snapshot before the loop runs anything else."""
        self.event_timings.record(name, duration_ms)
        if self.lane is not None:
            self.lane.publish(self.state.logic, self.state.committed.offset)

    def _take_touches(self, logic: ControllerLogic | None) -> None:
        """The heartbeats the lane answered since the last call, as contact in ``logic``'s sessions (only
        those of the broker's current epoch), and as arrivals for the session checker's intake count."""
        assert self.lane is not None
        touches = self.lane.drain()
        if not touches:
            return
        sessions = self.sessions
        for broker_id, _, now_ms, _ in touches:
            sessions.heartbeat_arrived(broker_id, now_ms)
        if logic is None:
            return
        brokers = logic.image.brokers
        heartbeats = logic.heartbeats
        for broker_id, epoch, now_ms, offset in touches:
            broker = brokers.get(broker_id)
            if broker is not None and broker.epoch == epoch:
                heartbeats.touch(broker_id, now_ms, offset)

    def _lane_note(self) -> None:
        """On main, posted by the lane at most every ``leader_lease_ms / 8`` of fast answers: take their
        touches, ask Raft for the lease as a caller (the renewal of a lease in use needs callers: without
        this the lease lapses under fast-lane traffic alone), and republish its expiry."""
        lane = self.lane
        if lane is None:
            return
        logic = self.state.logic
        self._take_touches(logic)
        if logic is not None:
            try:
                confirmation = asyncio.ensure_future(self.raft.confirm_leadership(lease=True))
            except (NotLeaderError, RaftShutdownError):
                lane.clear()
                return
            confirmation.add_done_callback(_ignore_result)
            if self._lane_logged is not logic:  # once per leadership: the lane is in use
                self._lane_logged = logic
                self.log.info("heartbeat_fast_lane_serving", answered=lane.answered)
        lane.publish(logic, self.state.committed.offset)

    # ---- request plumbing ----

    def _controller_ref(self, leader_id: int | None = None) -> common_pb2.NodeRef:
        leader = self.state.leader.leader_id if leader_id is None else leader_id
        ref = common_pb2.NodeRef(node_id=leader)
        endpoint = self.endpoints.get(leader)
        if endpoint is None and self._endpoint_of is not None and leader >= 0:
            endpoint = self._endpoint_of(leader)
        if endpoint is not None:
            ref.endpoint.CopyFrom(
                common_pb2.Endpoint(
                    name=self.options.controller_listener_name,
                    host=endpoint[0],
                    port=endpoint[1],
                    security_protocol=self.options.controller_security_protocol,
                )
            )
        return ref

    async def _serve(
        self,
        response: R,
        build: Callable[[ControllerLogic], Outcome[R]],
        *,
        priority: EventPriority = EventPriority.NORMAL,
        name: str = "request",
        wait_for_jobs: bool = True,
        confirm_unchanged: bool = False,
    ) -> R:
        """Run one mutating request as an event of the queue: activation check, logic, append, wait for
        the commit (or, with ``confirm_unchanged``, Raft's confirmation of leadership when it appends
        nothing: ``WritePath.write``), map errors."""
        return await self._answered(
            response,
            self._write(
                build,
                priority=priority,
                name=name,
                wait_for_jobs=wait_for_jobs,
                confirm_unchanged=confirm_unchanged,
            ),
        )

    async def _write(self, build: Callable[[ControllerLogic], Outcome[R]], **options: Any) -> R:
        await self.activation.active_logic()
        return await self.writes.write(build, **options)

    async def _answered(self, response: R, work: Awaitable[R]) -> R:
        """``work``'s answer, or ``response`` carrying the error a write raised (see :meth:`_serve`)."""
        try:
            return await work
        except WriteOutcomeUnknown as exc:
            return self._outcome_unknown(response, exc.leader_id)
        except (NotControllerError, EventQueueClosedError) as exc:
            leader = exc.leader_id if isinstance(exc, NotControllerError) else self.state.leader.leader_id
            return self._not_controller(response, leader)
        except TimeoutError:
            return error_response(
                response,
                ErrorCode.REQUEST_TIMED_OUT,
                f"controller {self.node_id}: the metadata write did not commit in time; outcome unknown",
            )
        except LeadershipNotConfirmed:
            return error_response(
                response,
                ErrorCode.REQUEST_TIMED_OUT,
                f"controller {self.node_id}: a majority of the quorum did not confirm it is still the active"
                " controller in time; retry",
            )
        except KraftError as exc:
            return error_response(response, exc.code, exc.message)

    def _outcome_unknown(self, response: R, leader_id: int) -> R:
        """REQUEST_TIMED_OUT with the new controller's ref: the write was appended, then leadership was
        lost before it committed (kraft.errors: only idempotent requests may be resent as they are)."""
        error_response(
            response,
            ErrorCode.REQUEST_TIMED_OUT,
            f"controller {self.node_id} appended the write, then lost leadership"
            + (f" to {leader_id}" if leader_id != NO_LEADER else "")
            + " before it committed; outcome unknown",
        )
        response.controller.CopyFrom(self._controller_ref(leader_id))  # type: ignore[attr-defined]
        return response

    def _not_controller(self, response: R, leader_id: int) -> R:
        error_response(
            response,
            ErrorCode.NOT_CONTROLLER,
            f"controller {self.node_id} is not the active controller"
            + (
                f"; the active controller is {leader_id}" if leader_id != NO_LEADER else "; none is known yet"
            ),
        )
        response.controller.CopyFrom(self._controller_ref(leader_id))  # type: ignore[attr-defined]
        return response

    # ---- ControllerService operations ----

    async def register_broker(self, req: cpb.RegisterBrokerRequest) -> cpb.RegisterBrokerResponse:
        if self.lane is not None:
            self._take_touches(self.state.logic)  # a live session refuses a duplicate registration
        return await self._serve(
            cpb.RegisterBrokerResponse(),
            lambda lg: lg.register_broker(req, self.clock.monotonic_ms(), self.writes.next_offset),
            priority=EventPriority.URGENT,
            name="register-broker",
            wait_for_jobs=False,
            confirm_unchanged=True,
        )

    def _heartbeat_arrived(self, req: cpb.BrokerHeartbeatRequest) -> None:
        # Contact is recorded on arrival, before waiting for anything (see heartbeats.py).
        self.sessions.heartbeat_arrived(req.broker_id, self.clock.monotonic_ms())
        logic = self.state.logic
        if self.lane is not None:
            self._take_touches(logic)  # the fast lane's first: none is handled before they are seen
        if logic is not None and req.cluster_id == self.cluster_id:
            broker = logic.image.brokers.get(req.broker_id)
            if broker is not None and broker.epoch == req.broker_epoch:
                logic.heartbeats.touch(req.broker_id, self.clock.monotonic_ms(), req.current_metadata_offset)

    async def broker_heartbeat(self, req: cpb.BrokerHeartbeatRequest) -> cpb.BrokerHeartbeatResponse:
        self._heartbeat_arrived(req)
        return await self._serve(
            cpb.BrokerHeartbeatResponse(),
            lambda lg: lg.broker_heartbeat(req, self.clock.monotonic_ms(), self.writes.next_offset),
            priority=EventPriority.URGENT,
            name="broker-heartbeat",
            wait_for_jobs=False,
            confirm_unchanged=True,
        )

    async def broker_heartbeats(
        self, reqs: Sequence[cpb.BrokerHeartbeatRequest]
    ) -> AsyncIterator[list[tuple[int, cpb.BrokerHeartbeatResponse]]]:
        """Heartbeats that arrived together (an intake process's batch, :mod:`kraft.node.intake_batch`) as
        ONE urgent event instead of one each; every heartbeat gets the answer it would have had alone.
        Yields ``(index in reqs, answer)`` lists as they are ready.

        In the event each heartbeat runs in turn on the offsets the ones before it appended.  Then each
        waits for what it depends on, as alone: its own records' commit, or — it appended nothing — the
        commit of what its answer read plus a leadership confirmation (the lease path: Raft confirms at
        once while its check-quorum lease holds).  Commits come in offset order, so the heartbeats are
        answered in the order of the offsets they wait for, those waiting for the same offset together
        (one wait, one confirmation) — never one heartbeat held for another's later offset."""
        for req in reqs:
            self._heartbeat_arrived(req)
        writes = self.writes
        now_ms = self.clock.monotonic_ms()
        Done = tuple[Outcome[cpb.BrokerHeartbeatResponse], int | None, int]

        def run_all() -> tuple[ControllerLogic, list[Done | NotControllerError]]:
            logic = self.state.logic
            if logic is None:
                raise NotControllerError(self.state.leader.leader_id)
            done: list[Done | NotControllerError] = []
            for req in reqs:
                outcome = logic.broker_heartbeat(req, now_ms, writes.next_offset)
                values = outcome.encoded()
                try:
                    last = writes.append_values(values, outcome.first_offset) if values else None
                except NotControllerError as exc:  # nothing of this one was appended
                    done.append(exc)
                    continue
                wait = outcome.wait_offset if outcome.wait_offset is not None else writes.next_offset - 1
                done.append((outcome, last, wait))
            return logic, done

        async def event() -> tuple[ControllerLogic, list[Done | NotControllerError]]:
            await self.activation.active_logic()
            return await writes.queue.run(EventPriority.URGENT, "broker-heartbeats", run_all)

        try:
            logic, done = await event()
        except Exception as exc:  # mapped (or re-raised) as _serve would, the same answer for each
            failed = await self._answered(cpb.BrokerHeartbeatResponse(), _reraise(exc))
            yield [(index, _copy(failed)) for index in range(len(reqs))]
            return

        async def committed(last: int) -> None:
            try:
                if logic.has_bulk_jobs():
                    writes.drive_jobs(logic)  # never waited for: a heartbeat's answer skips bulk work
                await writes.wait_committed(last)
            except NotControllerError as exc:
                raise WriteOutcomeUnknown(exc.leader_id) from exc

        groups: dict[tuple[int, bool], list[int]] = {}
        for index, item in enumerate(done):
            if isinstance(item, NotControllerError):
                yield [(index, await self._answered(cpb.BrokerHeartbeatResponse(), _reraise(item)))]
                continue
            _, last, wait = item
            groups.setdefault((last, True) if last is not None else (wait, False), []).append(index)
        for (offset, appended), indices in sorted(groups.items()):
            waited = cpb.BrokerHeartbeatResponse()
            work = committed(offset) if appended else writes._committed_and_confirmed(offset)
            got = await self._answered(cpb.BrokerHeartbeatResponse(), _returning(work, waited))
            answers = []
            for index in indices:
                item = done[index]
                assert not isinstance(item, NotControllerError)
                answers.append((index, item[0].response if got is waited else _copy(got)))
            yield answers

    async def unregister_broker(self, req: cpb.UnregisterBrokerRequest) -> cpb.UnregisterBrokerResponse:
        return await self._serve(
            cpb.UnregisterBrokerResponse(),
            lambda lg: lg.unregister_broker(req, self.writes.next_offset),
            name="unregister-broker",
        )

    async def _count_speculative(self) -> None:
        logic = self.state.logic
        while (
            logic is not None
            and logic is self.state.logic
            and not logic.count_some(None, COUNT_SLICE_PARTITIONS)
        ):
            await _next_loop_turn()

    async def shutdown_broker(self, req: cpb.ShutdownBrokerRequest) -> cpb.ShutdownBrokerResponse:
        await self._count_speculative()  # its answer counts leaderships: do most of that in slices
        response = await self._serve(
            cpb.ShutdownBrokerResponse(),
            lambda lg: lg.shutdown_broker(req, self.writes.next_offset),
            name="shutdown-broker",
        )
        await self._count_speculative()
        logic = self.state.logic
        if response.error_code == ErrorCode.NONE and logic is not None:
            response.leaderships_remaining = logic.leader_count(req.broker_id)  # after every chunk
        return response

    async def create_topics(
        self, req: cpb.CreateTopicsRequest, order: RequestOrder | None = None
    ) -> cpb.CreateTopicsResponse:
        """``order``: set for the rest of a request whose big or prepared topics go apart (below)."""
        # Shape limits before anything else (the chunking below is a pass over every topic); the logic
        # checks the cluster id and the limits again for each part.
        try:
            if req.cluster_id != self.cluster_id:
                raise KraftError(
                    ErrorCode.INCONSISTENT_CLUSTER_ID,
                    f"request cluster id {req.cluster_id!r} does not match this cluster {self.cluster_id!r}",
                )
            check_create_topics(req, self.options.request_limits, self.options.default_num_partitions)
        except KraftError as exc:
            return error_response(cpb.CreateTopicsResponse(), exc.code, exc.message)
        counts = Counter(t.name for t in req.topics)
        options = self.options
        big = [
            t
            for t in req.topics
            if counts[t.name] == 1
            and is_big_topic(t, options.max_work_unit_records, options.default_num_partitions)
        ]
        prepared = [
            t
            for t in req.topics
            if counts[t.name] == 1
            and is_prepared_topic(
                t,
                options.max_work_unit_records,
                options.default_num_partitions,
                options.prepared_topic_min_partitions,
            )
        ]
        if big or prepared:
            # A topic bigger than a work unit is planned and written in slices of its own (see
            # _create_big_topic), one of a few hundred partitions or more is prepared in bounded events
            # and written in one (_create_prepared_topic); the others go in parts as below, all at once.
            own_names = {t.name for t in big} | {t.name for t in prepared}
            # The request's positions: its plans reserve their partitions, and a topic listed before one
            # (or a plan made before it) does not count it — the request's order, as if unsliced.
            order = RequestOrder({t.name: i for i, t in enumerate(req.topics) if counts[t.name] == 1})
            rest = cpb.CreateTopicsRequest(
                cluster_id=req.cluster_id,
                topics=[t for t in req.topics if t.name not in own_names],
                validate_only=req.validate_only,
            )
            # wakes its waiters in order; 0 = no limit (every prepared topic of the request at once)
            preparing = asyncio.Semaphore(options.create_topics_preparing_max or max(len(prepared), 1))
            answers = await asyncio.gather(
                *(self._create_big_topic(req, t, order) for t in big),
                *(self._create_prepared_topic(req, t, order, preparing) for t in prepared),
                *([self.create_topics(rest, order)] if rest.topics else []),
            )
            by_name: dict[str, cpb.CreatableTopicResult] = {}
            duplicates: list[cpb.CreatableTopicResult] = []
            for answer in answers:
                if answer.error_code != ErrorCode.NONE:
                    return answer
                for result in answer.topics:
                    if counts[result.name] > 1:
                        duplicates.append(result)
                    else:
                        by_name[result.name] = result
            response = cpb.CreateTopicsResponse()
            for topic in req.topics:
                response.topics.append(by_name[topic.name] if counts[topic.name] == 1 else duplicates.pop(0))
            return response
        chunks = _topic_chunks(req, self.options.max_work_unit_records)
        if len(chunks) == 1 and len(counts) == len(req.topics):
            # One part, every name once (a lone CreateTopics): the part is the request itself and its
            # answer lists the topics in the request's order — no copy of either (issue #17).
            return await self._create_part(req, CreateTally(), order)
        # A big request is written as several appends, each computed when it is its turn, so the event
        # loop (heartbeats, Raft fetches) runs between them, and paced so that at most about
        # MAX_UNCOMMITTED_RECORDS are in flight; topics are independent, as in Kafka.
        tally = CreateTally()  # a dry run's parts see what the earlier parts would have created
        parts = [
            cpb.CreateTopicsRequest(cluster_id=req.cluster_id, topics=topics, validate_only=req.validate_only)
            for topics in ([t for t in chunk if counts[t.name] == 1] for chunk in chunks)
            if topics
        ] or [cpb.CreateTopicsRequest(cluster_id=req.cluster_id, validate_only=req.validate_only)]
        if len(parts) == 1:
            answers = [await self._create_part(parts[0], tally, order)]
        else:
            writes = []
            for part in parts:
                # Yields first, so the previous part computes and appends; on a timeout this part's own
                # commit wait answers REQUEST_TIMED_OUT.
                with contextlib.suppress(TimeoutError):
                    await self.writes.wait_for_room()
                writes.append(asyncio.ensure_future(self._create_part(part, tally, order)))
            answers = await asyncio.gather(*writes)
        results: dict[str, cpb.CreatableTopicResult] = {}
        for answer in answers:
            if answer.error_code != ErrorCode.NONE:
                return answer
            results.update((r.name, r) for r in answer.topics)
        response = cpb.CreateTopicsResponse()
        for topic in req.topics:
            if counts[topic.name] > 1:
                result = response.topics.add(name=topic.name)
                error_response(
                    result, ErrorCode.INVALID_REQUEST, f"topic {topic.name!r} appears more than once"
                )
            else:
                response.topics.append(results[topic.name])
        return response

    async def _plan_topic(
        self,
        req: cpb.CreateTopicsRequest,
        topic: cpb.CreatableTopic,
        order: RequestOrder,
        *,
        prepared: bool,
    ) -> tuple[cpb.CreateTopicsResponse, TopicPlan | None]:
        """The checks and plan of one big or prepared topic, as one event that writes nothing: the
        answer, and the plan (None: the answer is final — refused, validate-only, or not active)."""
        one = cpb.CreateTopicsRequest(
            cluster_id=req.cluster_id, topics=[topic], validate_only=req.validate_only
        )
        plans: list[TopicPlan] = []

        def plan(logic: ControllerLogic) -> Outcome[cpb.CreateTopicsResponse]:
            outcome, planned = logic.plan_topic(one, self.writes.next_offset, prepared, order)
            if planned is not None:
                plans.append(planned)
            return outcome

        try:
            answer = await self._serve(cpb.CreateTopicsResponse(), plan, name="create-topic-plan")
        except BaseException:
            # cancelled (or failed) after the event made the plan: it reserved partitions nobody will write
            for planned in plans:
                planned.release()
            raise
        return answer, (plans[0] if plans else None)

    async def _create_big_topic(
        self, req: cpb.CreateTopicsRequest, topic: cpb.CreatableTopic, order: RequestOrder
    ) -> cpb.CreateTopicsResponse:
        """One topic of more partitions than a work unit: checks and plan (one event, nothing written),
        placement counted per broker (an explicit assignment's entries checked) in events of at most a
        work unit (records and time), then the limits again and the records — BeginTransaction, the
        topic, configs, the first partitions — with the
        rest written by the bulk job driver, EndTransaction last; answered once that committed.  A
        failover before the first records: nothing was written, the client retries.  After: the new
        active controller finishes the transaction from its plan (ControllerLogic._resume_transaction)."""
        answer, topic_plan = await self._plan_topic(req, topic, order, prepared=False)
        if topic_plan is None:
            return answer
        try:
            return await self._place_and_write_big_topic(req, topic, topic_plan)
        finally:
            # Its reservation of partitions ends with its write's check; a plan given up before (the call
            # cancelled, not active any more) must not keep reserving them.
            topic_plan.release()

    async def _place_and_write_big_topic(
        self, req: cpb.CreateTopicsRequest, topic: cpb.CreatableTopic, topic_plan: TopicPlan
    ) -> cpb.CreateTopicsResponse:
        budget_ms = self.options.max_event_time_ms
        limit = self.options.max_work_unit_records
        try:
            while not await self.writes.queue.run(
                EventPriority.NORMAL,
                "create-topic-plan",
                lambda: topic_plan.place_some(Deadline(self.clock, budget_ms), limit),
            ):
                pass
        except EventQueueClosedError:
            return self._not_controller(cpb.CreateTopicsResponse(), self.state.leader.leader_id)
        except KraftError as exc:  # an explicit assignment's entry refused (checked while placing)
            response = cpb.CreateTopicsResponse()
            error_response(response.topics.add(name=topic.name), exc.code, exc.message)
            return response
        while True:
            try:
                return await self._serve(
                    cpb.CreateTopicsResponse(),
                    lambda lg: lg.create_planned_topic(
                        topic_plan, req.validate_only, self.writes.next_offset
                    ),
                    name="create-topics",
                )
            except TopicTransactionBusy:
                # One big topic at a time (transactions never interleave): its slices commit often; try
                # again after the next commit, or give up when none comes within the commit timeout.
                now_ms = self.timers.now_ms()
                if not await self.timers.wait(
                    self.state.next_commit(), now_ms + self.options.commit_timeout_ms
                ):
                    return error_response(
                        cpb.CreateTopicsResponse(),
                        ErrorCode.REQUEST_TIMED_OUT,
                        f"controller {self.node_id}: another big topic was still being created; retry",
                    )

    async def _create_prepared_topic(
        self,
        req: cpb.CreateTopicsRequest,
        topic: cpb.CreatableTopic,
        order: RequestOrder,
        preparing: asyncio.Semaphore,
    ) -> cpb.CreateTopicsResponse:
        """One topic of a few hundred partitions up to a work unit: checks and plan (one event, nothing
        written), then placement (or the explicit assignment's checks) and its records built in events of
        at most a work unit's time, then the checks again and every record in one append — one event of
        ~2-3 ms instead of ~10 ms for 1,000 partitions.  A failover before the append: nothing was
        written, the client retries; after it: the topic is there, whole."""
        answer, topic_plan = await self._plan_topic(req, topic, order, prepared=True)
        if topic_plan is None:
            return answer
        try:
            return await self._prepare_and_write_topic(req, topic, topic_plan, preparing)
        finally:
            topic_plan.release()  # as for a big topic: a plan given up stops reserving its partitions

    async def _prepare_and_write_topic(
        self,
        req: cpb.CreateTopicsRequest,
        topic: cpb.CreatableTopic,
        topic_plan: TopicPlan,
        preparing: asyncio.Semaphore,
    ) -> cpb.CreateTopicsResponse:
        budget_ms = self.options.max_event_time_ms
        limit = self.options.max_work_unit_records

        def prepare() -> bool:
            logic = self.state.logic
            if logic is None:
                raise EventQueueClosedError("not active")
            before = topic_plan.planned
            done = logic.prepare_some(topic_plan, Deadline(self.clock, budget_ms), limit)
            self.heap.built(topic_plan.planned - before)
            return done

        try:
            async with preparing:  # controller.create.topics.preparing.max topics of the request at a time
                while not await self.writes.queue.run(EventPriority.NORMAL, "create-topic-prepare", prepare):
                    pass
        except EventQueueClosedError:
            return self._not_controller(cpb.CreateTopicsResponse(), self.state.leader.leader_id)
        except KraftError as exc:  # an explicit assignment's entry refused
            response = cpb.CreateTopicsResponse()
            error_response(response.topics.add(name=topic.name), exc.code, exc.message)
            return response
        # Paced like the parts of a big request — many prepared topics (one request of 100) must not
        # append far ahead of the commits: one at a time, each waits for room and for the previous one's
        # append (so the room it sees counts it); on a timeout the write's own commit wait answers.
        async with self._prepared_writes:
            with contextlib.suppress(TimeoutError):
                await self.writes.wait_for_room()
            ran = asyncio.Event()

            def build(logic: ControllerLogic) -> Outcome[cpb.CreateTopicsResponse]:
                ran.set()  # the append follows in the same event
                return logic.create_prepared_topic(topic_plan, req.validate_only, self.writes.next_offset)

            write = asyncio.ensure_future(
                self._serve(cpb.CreateTopicsResponse(), build, name="create-topics")
            )
            appended = asyncio.ensure_future(ran.wait())
            await asyncio.wait({write, appended}, return_when=asyncio.FIRST_COMPLETED)
            appended.cancel()
        return await write

    async def _create_part(
        self,
        req: cpb.CreateTopicsRequest,
        tally: CreateTally | None = None,
        order: RequestOrder | None = None,
    ) -> cpb.CreateTopicsResponse:
        """One part (names unique), as one event; when the event's time budget ends it before its last
        topic, the rest is queued as a further part from inside the event (behind whatever is queued
        already) and its answer is merged into this one."""
        rest: list[asyncio.Task[cpb.CreateTopicsResponse]] = []

        def build(logic: ControllerLogic) -> Outcome[cpb.CreateTopicsResponse]:
            outcome = logic.create_topics(req, self.writes.next_offset, tally, order)
            done = len(outcome.response.topics)
            if outcome.response.error_code == ErrorCode.NONE and 0 < done < len(req.topics):
                leftover = cpb.CreateTopicsRequest(
                    cluster_id=req.cluster_id, topics=req.topics[done:], validate_only=req.validate_only
                )
                rest.append(asyncio.ensure_future(self._create_part(leftover, tally, order)))
            return outcome

        answer = await self._serve(cpb.CreateTopicsResponse(), build, name="create-topics")
        for task in rest:
            more = await task
            if answer.error_code == ErrorCode.NONE:
                if more.error_code != ErrorCode.NONE:
                    answer = more
                else:
                    answer.topics.extend(more.topics)
        return answer

    async def delete_topics(self, req: cpb.DeleteTopicsRequest) -> cpb.DeleteTopicsResponse:
        names = list(dict.fromkeys(req.names))
        chunks = self._delete_chunks(names)
        if len(chunks) <= 1:
            return await self._delete_part(req)
        # Like CreateTopics: parts of about max.work.unit.records partitions each, one event each (a
        # removed partition costs its replay and index updates), paced by the uncommitted records; each
        # topic is removed by one record, so a failover leaves every topic either there or gone and a
        # retry deletes what is left.
        writes = []
        for chunk in chunks:
            with contextlib.suppress(TimeoutError):
                await self.writes.wait_for_room()
            part = cpb.DeleteTopicsRequest(cluster_id=req.cluster_id, names=chunk)
            writes.append(asyncio.ensure_future(self._delete_part(part)))
        results: dict[str, cpb.DeletableTopicResult] = {}
        for answer in await asyncio.gather(*writes):
            if answer.error_code != ErrorCode.NONE:
                return answer
            results.update((r.name, r) for r in answer.topics)
        response = cpb.DeleteTopicsResponse()
        response.topics.extend(results[name] for name in req.names)
        return response

    def _delete_chunks(self, names: list[str]) -> list[list[str]]:
        """Names in parts of about ``max_work_unit_records`` partitions (by the speculative image; an
        unknown name weighs 1)."""
        logic = self.state.logic
        if logic is None:
            return [names]
        image = logic.image
        limit = self.options.max_work_unit_records
        chunks: list[list[str]] = [[]]
        weight = 0
        for name in names:
            topic = image.topic(name)
            size = max(1, len(topic.partitions)) if topic is not None else 1
            if chunks[-1] and weight + size > limit:
                chunks.append([])
                weight = 0
            chunks[-1].append(name)
            weight += size
        return chunks

    async def _delete_part(self, req: cpb.DeleteTopicsRequest) -> cpb.DeleteTopicsResponse:
        return await self._serve(
            cpb.DeleteTopicsResponse(),
            lambda lg: lg.delete_topics(req, self.writes.next_offset),
            name="delete-topics",
        )

    async def elect_leaders(self, req: cpb.ElectLeadersRequest) -> cpb.ElectLeadersResponse:
        if req.election_type == UNCLEAN_ELECTION and not req.topic_partitions:
            return await self._elect_unclean_part(req, UncleanElectionScan())
        return await self._serve(
            cpb.ElectLeadersResponse(),
            lambda lg: lg.elect_leaders(req, self.writes.next_offset),
            name="elect-leaders",
        )

    async def _elect_unclean_part(
        self, req: cpb.ElectLeadersRequest, scan: UncleanElectionScan
    ) -> cpb.ElectLeadersResponse:
        """One part of an implicit UNCLEAN ElectLeaders (every leaderless partition), as one event of
        bounded work (``ControllerLogic._elect_unclean_part``); unless it was the last, the next part is
        queued from inside the event (behind whatever is queued already, as CreateTopics' parts) and
        its answer merged into this one — a topic's results cut between two parts are one group again.
        The first part that fails (NOT_CONTROLLER after a failover) is the answer: the client retries
        the whole request, which elects only what is still leaderless."""
        if scan.parts:
            # paced like DeleteTopics' parts: at most max.uncommitted.bulk.records ahead of the commits
            with contextlib.suppress(TimeoutError):
                await self.writes.wait_for_room()
        rest: list[asyncio.Task[cpb.ElectLeadersResponse]] = []

        def build(logic: ControllerLogic) -> Outcome[cpb.ElectLeadersResponse]:
            outcome = logic.elect_leaders(req, self.writes.next_offset, scan)
            if outcome.response.error_code == ErrorCode.NONE and not scan.done:
                rest.append(asyncio.ensure_future(self._elect_unclean_part(req, scan)))
            return outcome

        answer = await self._serve(cpb.ElectLeadersResponse(), build, name="elect-leaders")
        for task in rest:
            more = await task
            if answer.error_code != ErrorCode.NONE:
                continue
            if more.error_code != ErrorCode.NONE:
                answer = more
                continue
            merge_election_parts(answer, more)
        return answer

    async def alter_partition(self, req: cpb.AlterPartitionRequest) -> cpb.AlterPartitionResponse:
        return await self._serve(
            cpb.AlterPartitionResponse(),
            lambda lg: alter_partition(lg, req, self.writes.next_offset),
            name="alter-partition",
        )

    async def create_acls(self, req: cpb.CreateAclsRequest) -> cpb.CreateAclsResponse:
        return await self._serve(
            cpb.CreateAclsResponse(), lambda lg: acl_control.create_acls(lg, req, self.writes.next_offset)
        )

    async def delete_acls(self, req: cpb.DeleteAclsRequest) -> cpb.DeleteAclsResponse:
        return await self._serve(
            cpb.DeleteAclsResponse(), lambda lg: acl_control.delete_acls(lg, req, self.writes.next_offset)
        )

    async def create_partitions(self, req: cpb.CreatePartitionsRequest) -> cpb.CreatePartitionsResponse:
        return await self._serve(
            cpb.CreatePartitionsResponse(),
            lambda lg: partition_growth.create_partitions(lg, req, self.writes.next_offset),
            name="create-partitions",
        )

    async def incremental_alter_configs(
        self, req: cpb.IncrementalAlterConfigsRequest
    ) -> cpb.IncrementalAlterConfigsResponse:
        return await self._serve(
            cpb.IncrementalAlterConfigsResponse(),
            lambda lg: config_control.incremental_alter_configs(lg, req, self.writes.next_offset),
            name="alter-configs",
        )

    async def update_features(self, req: cpb.UpdateFeaturesRequest) -> cpb.UpdateFeaturesResponse:
        return await self._serve(
            cpb.UpdateFeaturesResponse(),
            lambda lg: feature_control.update_features(lg, req, self.writes.next_offset),
            name="update-features",
        )

    async def describe_configs(self, req: cpb.DescribeConfigsRequest) -> cpb.DescribeConfigsResponse:
        got = await self._read(cpb.DescribeConfigsResponse(), req.cluster_id)
        if not isinstance(got, tuple):
            return got
        _, image = got
        return config_control.describe_configs(image, req)

    async def describe_acls(self, req: cpb.DescribeAclsRequest) -> cpb.DescribeAclsResponse:
        got = await self._read(cpb.DescribeAclsResponse(), req.cluster_id)
        if not isinstance(got, tuple):
            return got
        _, image = got
        return acl_control.describe_acls(image.acls, req)

    async def _read(self, response: R, cluster_id: str) -> tuple[ControllerLogic, MetadataImage] | R:
        """Reads answer from the committed image, after every pending write committed and after Raft
        confirmed that this node still leads (a ReadIndex round started after the request arrived, shared
        by every caller waiting at the time): reads are linearizable.  Without the round, a deposed
        controller that does not know it yet would answer from an image the new controller has moved on
        from (e.g. a broker shown unfenced that the new controller fenced, an ISR that has shrunk)."""
        try:
            logic = await self.activation.active_logic()
            logic.check_cluster_id(cluster_id)
            await self.writes.wait_committed(self.writes.next_offset - 1)
            await self.writes.confirm_leadership()
        except NotControllerError as exc:
            return self._not_controller(response, exc.leader_id)
        except TimeoutError:
            return error_response(
                response, ErrorCode.REQUEST_TIMED_OUT, "pending metadata writes did not commit"
            )
        except LeadershipNotConfirmed:
            return error_response(
                response,
                ErrorCode.REQUEST_TIMED_OUT,
                f"controller {self.node_id}: a majority of the quorum did not confirm it is still the active"
                " controller in time; retry",
            )
        except KraftError as exc:
            return error_response(response, exc.code, exc.message)
        return logic, self.committed

    async def describe_cluster(self, req: cpb.DescribeClusterRequest) -> cpb.DescribeClusterResponse:
        response = cpb.DescribeClusterResponse(cluster_id=self.cluster_id)
        got = await self._read(response, req.cluster_id)
        if not isinstance(got, tuple):
            return got
        logic, image = got
        while not logic.count_some(image, COUNT_SLICE_PARTITIONS):
            await _next_loop_turn()  # after bulk writes: recount changed topics a slice per loop turn
        response.controller.CopyFrom(self._controller_ref(self.node_id))
        response.controller_id = self.node_id
        response.controller_epoch = self.state.leader.epoch
        response.brokers.extend(
            logic.describe_brokers(image, self.clock.monotonic_ms(), self.writes.next_offset)
        )
        response.metadata_offset = image.offset
        response.high_watermark = self.raft.high_watermark
        return response

    async def describe_topics(self, req: cpb.DescribeTopicsRequest) -> cpb.DescribeTopicsResponse:
        response = cpb.DescribeTopicsResponse()
        got = await self._read(response, req.cluster_id)
        if not isinstance(got, tuple):
            return got
        _, image = got
        response.metadata_offset = image.offset
        if req.names:
            for name in req.names:
                topic = image.topic(name)
                if topic is None:
                    response.topics.add(
                        name=name,
                        error_code=int(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
                        error_message=f"topic {name!r} does not exist",
                    )
                else:
                    response.topics.append(describe_topic(image, topic, req.include_partitions))
        else:
            for topic in sorted(image.topics_by_id.values(), key=lambda t: t.name):
                response.topics.append(describe_topic(image, topic, req.include_partitions))
        return response

    async def metadata_fetch(self, req: cpb.MetadataFetchRequest) -> cpb.MetadataFetchResponse:
        return await self.fetches.serve(req)


class _Counts(Protocol):
    def inc(self) -> None: ...


def _count_by_reason(counter: Callable[[str], _Counts]) -> Callable[[str], None]:
    """``on_slow`` for the lane: each reason's counter child bound once (the intake thread increments)."""
    children = {reason: counter(reason) for reason in SLOW_REASONS}
    return lambda reason: children[reason].inc()
