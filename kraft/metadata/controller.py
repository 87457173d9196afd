"""The active controller: the asyncio shell around :class:`ControllerLogic` and a :class:`RaftClient`.

Tasks and what they own (all on one event loop, so no locks):

- **Raft listener** (driven by Raft's own per-listener task): ``handle_commit`` replays committed batches
  into ``committed`` (the committed image), keeps a bounded window of recent batches for MetadataFetch,
  wakes long-polls and resolves write waiters; ``handle_leader_change`` activates or deactivates.
- **Activation** (one task per won epoch): appends a NoOp, waits for it to commit — so ``committed``
  holds everything of earlier epochs — then resets the logic from it (fresh heartbeat sessions for every
  broker) and starts answering.
- **Session checker**: every ``session_timeout/8`` fences at most one expired broker per write; a stalled
  event loop pushes every deadline back instead of blaming brokers.
- **Idle NoOp**: a NoOp record every ``metadata.max.idle.interval.ms`` without other writes.
- **Store writer**: saves ``committed`` to the image store (coalescing), never on the commit path.
- **Snapshotter**: a Raft snapshot of ``committed`` every N bytes of records / interval.

Requests run in their gRPC task: the logic computes records synchronously (validated against the
speculative image), they are scheduled on Raft at the offsets the logic predicted, and the answer is sent
once the high watermark passes them.  A request that produced no records still waits for every earlier
pending write, so an answer never reflects uncommitted state.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import heapq
import itertools
from collections import Counter, deque
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from google.protobuf.message import Message

from kraft.clock import Clock
from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records as rec
from kraft.metadata.controller_logic import (
    ControllerLogic,
    ControllerSettings,
    Outcome,
    describe_topic,
    error_response,
)
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.fetch_window import FetchWindow, WindowBatch
from kraft.metadata.image import NO_LEADER, MetadataImage
from kraft.metadata.image_records import image_values
from kraft.metadata.store import ImageStore
from kraft.metadata.timers import Timers
from kraft.observability.logging import get_logger
from kraft.observability.metrics import ControllerMetrics
from kraft.raft.client import (
    CommittedBatch,
    LeaderAndEpoch,
    NotLeaderError,
    RaftClient,
    RaftError,
    SnapshotReader,
)
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

R = TypeVar("R", bound=Message)

SNAPSHOT_CHUNK_RECORDS = 20_000
# Long loops over records/partitions yield to the event loop this often: gRPC accepts about one new
# call per loop turn, so a turn must stay short (a few ms) for heartbeats to keep flowing.
YIELD_EVERY_RECORDS = 2_000
# Heartbeat intake check (see _intake_stalled): with at least this many unfenced brokers, a session
# check that saw fewer than this fraction of the heartbeats they send extends deadlines instead of
# fencing, at most this many checks in a row.
INTAKE_MIN_BROKERS = 8
INTAKE_STALL_FRACTION = 0.25
INTAKE_STALL_MAX_CHECKS = 16
COUNT_SLICE_PARTITIONS = 1_000  # per-broker partition counts: recounted this many per loop turn
DEFAULT_FETCH_RECORDS = 10_000
PARTITION_METRICS_INTERVAL_MS = 5_000
REPLAY_SLICE_RECORDS = 200
# Bulk writes (leave jobs, big CreateTopics) stop computing further appends while this many records
# are appended but not committed: Raft batches stay small and the event loop serves heartbeats and
# fetches in between, instead of the leader racing far ahead of its followers.
MAX_UNCOMMITTED_RECORDS = 10_000
# After this many records were applied, the heap is frozen (see _freeze_heap).
FREEZE_AFTER_RECORDS = 20_000
FREEZE_MIN_INTERVAL_MS = 2_000
THAW_EVERY_FREEZES = 30
STORE_MIN_INTERVAL_MS = 500
STORE_RETRY_MS = 1_000


async def _next_loop_turn() -> None:
    await asyncio.sleep(0)


def _freeze_heap() -> None:
    """Move everything alive into the GC's permanent generation.

    An image holds one GC-tracked object per partition (a NamedTuple is never untracked), so every
    full collection walked the whole image: 100-400 ms pauses, many of them during bulk writes, enough
    to delay heartbeats past their deadline and Raft fetches past ``fetch.timeout``.  Frozen objects are
    still freed by reference counting (images hold no cycles); collections then walk only what is newer.
    A full collection first, so no cyclic garbage is frozen; it walks only objects created since the
    previous freeze.
    """
    gc.collect()
    gc.freeze()


def _thaw_heap() -> None:
    """Give frozen objects back to the collector: an object frozen while alive that later ends up in a
    reference cycle (a finished task holding its exception) is only reclaimed once thawed."""
    gc.unfreeze()


@dataclass(frozen=True, slots=True)
class ControllerOptions:
    """Timing and sizing knobs (config keys in brackets)."""

    session_timeout_ms: int = 9000  # broker.session.timeout.ms
    heartbeat_interval_ms: int = 2000  # broker.heartbeat.interval.ms (what brokers are expected to send)
    noop_interval_ms: int = 500  # metadata.max.idle.interval.ms (0 = off)
    snapshot_max_bytes: int = 20 * 1024 * 1024  # metadata.log.max.record.bytes.between.snapshots
    snapshot_interval_ms: int = 3_600_000  # metadata.log.max.snapshot.interval.ms
    commit_timeout_ms: int = 30_000  # how long a request waits for its commit
    activation_wait_ms: int = 5_000  # a request arriving mid-activation waits this long
    leader_lease_ms: int = 2_000  # controller.quorum.fetch.timeout.ms: no commit for this long → step aside
    fetch_window_records: int = 200_000  # recent committed records kept for MetadataFetch
    partitions_per_write: int = 1_000  # CreateTopics is split into appends of about this many partitions
    default_num_partitions: int = 1  # num.partitions
    default_replication_factor: int = 1  # default.replication.factor


def _topic_chunks(req: cpb.CreateTopicsRequest, partitions_per_write: int) -> list[list[cpb.CreatableTopic]]:
    chunks: list[list[cpb.CreatableTopic]] = [[]]
    weight = 0
    for topic in req.topics:
        size = len(topic.assignments) or max(topic.num_partitions, 1)
        if chunks[-1] and weight + size > partitions_per_write:
            chunks.append([])
            weight = 0
        chunks[-1].append(topic)
        weight += size
    return chunks


class NotControllerError(Exception):
    def __init__(self, leader_id: int) -> None:
        super().__init__(f"not the active controller (active: {leader_id})")
        self.leader_id = leader_id


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
    ) -> None:
        self.raft = raft
        self.node_id = raft.node_id
        self.cluster_id = cluster_id
        self.options = options or ControllerOptions()
        self.endpoints = dict(endpoints)
        self.clock = clock
        self.timers = Timers(clock)
        self.settings = ControllerSettings(
            cluster_id,
            session_timeout_ms=self.options.session_timeout_ms,
            default_num_partitions=self.options.default_num_partitions,
            default_replication_factor=self.options.default_replication_factor,
        )
        self.committed = MetadataImage.empty()
        self.logic: ControllerLogic | None = None  # set only while active
        self.active_epoch = -1
        self._leader = LeaderAndEpoch(NO_LEADER, -1)
        self._next_offset = 0
        self._last_write_ms = 0
        self._oldest_pending_ms: int | None = None
        # (offset, seq, epoch the offset was appended in, future): a waiter resolves when its offset commits
        # in a batch of its own epoch, and fails when a newer leader's batch commits there instead.
        self._waiters: list[tuple[int, int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._activated = asyncio.Event()
        self._commit_event = asyncio.Event()
        self._window = FetchWindow(self.options.fetch_window_records)
        self._fetch_snapshot: tuple[cpb.SnapshotRef, list[bytes]] | None = None
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = clock.monotonic_ms()
        self._snapshot_task: asyncio.Task[None] | None = None
        self._store_path = store_path
        self._store: ImageStore | None = None
        self._store_dirty = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._activation: asyncio.Task[None] | None = None
        self._stopping = False
        self._applied_since_freeze = 0
        self._last_freeze_ms: int | None = None
        self._freezes = 0
        self._heartbeats_received = 0  # since the last session check (see _intake_stalled)
        self._intake_stalls = 0
        # last offset of each append of this epoch → the logic's image right after it (see _own_image)
        self._own_images: dict[int, MetadataImage] = {}
        self._own_values: deque[tuple[int, list[bytes]]] = deque()
        """(first offset, values) of each append whose image is in ``_own_images``, in offset order."""
        self.metrics = ControllerMetrics.for_node(self.node_id)
        self.log = get_logger("controller", node=self.node_id)

    # ---- lifecycle ----

    async def start(self) -> None:
        """Load the image store (if any), listen to Raft, start the periodic tasks."""
        if self._store_path is not None:
            self._store = await ImageStore.open(self._store_path)
            self.committed = await self._store.load()
            self.log.info(
                "image_loaded", offset=self.committed.offset, topics=len(self.committed.topics_by_id)
            )
            gc.freeze()  # the loaded image (see _freeze_heap); startup leaves little garbage behind
        self.raft.register_listener(self)
        self._tasks = [
            asyncio.create_task(self._session_checker(), name="controller-sessions"),
            asyncio.create_task(self._idle_noops(), name="controller-noops"),
            asyncio.create_task(self._store_writer(), name="controller-store"),
            asyncio.create_task(self._partition_metrics(), name="controller-metrics"),
        ]

    async def stop(self) -> None:
        self._stopping = True
        self.raft.unregister_listener(self)
        self._deactivate(NO_LEADER)
        tasks = [*self._tasks, *(t for t in (self._activation, self._snapshot_task) if t is not None)]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._store is not None:
            with contextlib.suppress(Exception):
                await self._store.save(self.committed)
            await self._store.close()
            self._store = None

    @property
    def is_active(self) -> bool:
        return self.logic is not None

    # ---- Raft listener ----

    async def handle_commit(self, batch: CommittedBatch) -> None:
        if batch.last_offset <= self.committed.offset:
            return  # already in the image loaded from the store
        own = self._own_image(batch)
        if own is not None:
            # This controller wrote the whole batch and already holds the image it leads to (and, almost
            # always, the values: then the batch's records are never decoded).
            values = self._own_values_of(batch)
            if values is None:
                values = [(r.offset, r.value) for r in batch.records]
            self._bytes_since_snapshot += sum(len(v) for _, v in values)
            self._apply_committed(batch, own, values)
            return
        self._forget_own_values_below(batch.last_offset + 1)  # replayed instead
        fresh = [r for r in batch.records if r.offset > self.committed.offset]
        delta = MetadataDelta(self.committed)
        values = []
        undecodable: list[tuple[int, str]] = []
        for start in range(0, len(fresh), REPLAY_SLICE_RECORDS):
            if start:
                await asyncio.sleep(0)  # big batches: let heartbeats and Raft fetches in meanwhile
            piece = fresh[start : start + REPLAY_SLICE_RECORDS]
            try:  # the bulk decoder first; a slice with a bad value is redone record by record
                decoded = list(rec.decode_values([r.value for r in piece]))
            except KraftError:
                decoded = []
                for record in piece:
                    try:
                        decoded.append(rec.decode_value(record.value))
                    except KraftError as exc:
                        # e.g. values of the test-only raw append RPC: skipped, reported once per batch
                        undecodable.append((record.offset, exc.message))
                        continue
                    values.append((record.offset, record.value))
            else:
                values.extend((r.offset, r.value) for r in piece)
            delta.replay_decoded(decoded)
        self._bytes_since_snapshot += sum(len(v) for _, v in values)
        if undecodable:
            self.metrics.metadata_errors.inc(len(undecodable))
            first_offset, first_error = undecodable[0]
            self.log.warning(
                "undecodable_records", count=len(undecodable), first_offset=first_offset, error=first_error
            )
        for error in delta.replay_errors:
            self.metrics.metadata_errors.inc()
            self.log.warning("replay_error", offset=batch.last_offset, error=error)
        delta.offset = batch.last_offset
        delta.epoch = batch.epoch
        self._apply_committed(batch, delta.apply(), values)

    def _own_values_of(self, batch: CommittedBatch) -> list[tuple[int, bytes]] | None:
        """(offset, value) of every record of ``batch`` from what :meth:`_append` scheduled, or None if
        some are not known (the caller then decodes the batch)."""
        self._forget_own_values_below(batch.base_offset)
        pending = self._own_values
        out: list[tuple[int, bytes]] = []
        offset = batch.base_offset
        while pending and offset <= batch.last_offset:
            first, values = pending[0]
            if first > offset:
                return None
            index = offset - first
            take = values[index : index + batch.last_offset - offset + 1]
            if not take:
                return None  # appends overlap (never expected): decode instead
            out.extend(zip(range(offset, offset + len(take)), take, strict=True))
            offset += len(take)
            if index + len(take) == len(values):
                pending.popleft()
        return out if offset == batch.last_offset + 1 else None

    def _forget_own_values_below(self, offset: int) -> None:
        pending = self._own_values
        while pending and pending[0][0] + len(pending[0][1]) <= offset:
            pending.popleft()

    def _own_image(self, batch: CommittedBatch) -> MetadataImage | None:
        """The image the active logic built for exactly this batch (records it appended in this epoch
        on top of the committed image), or None: then the batch is replayed."""
        images = self._own_images
        if not images:
            return None
        image = images.pop(batch.last_offset, None)
        for offset in [o for o in images if o < batch.last_offset]:
            del images[offset]
        if (
            image is None
            or self.logic is None
            or batch.epoch != self.active_epoch
            or batch.base_offset != self.committed.offset + 1
            or image.offset != batch.last_offset
        ):
            return None
        return image if image.epoch == batch.epoch else dataclasses.replace(image, epoch=batch.epoch)

    def _apply_committed(
        self, batch: CommittedBatch, image: MetadataImage, values: list[tuple[int, bytes]]
    ) -> None:
        self.committed = image
        self._remember(
            WindowBatch(
                batch.base_offset, batch.last_offset, batch.epoch, batch.append_timestamp_ms, tuple(values)
            )
        )
        self._resolve_waiters(batch.last_offset, batch.epoch)
        if self.committed.offset >= self._next_offset - 1:
            self._oldest_pending_ms = None
        elif self._oldest_pending_ms is not None:
            self._oldest_pending_ms = self.clock.monotonic_ms()  # progress renews the lease
        self._commit_event.set()
        self._commit_event = asyncio.Event()
        self._store_dirty.set()
        self._update_metrics()
        self._maybe_snapshot()
        self._maybe_freeze(len(values))

    def _maybe_freeze(self, applied: int) -> None:
        self._applied_since_freeze += applied
        if self._applied_since_freeze < FREEZE_AFTER_RECORDS:
            return
        now_ms = self.clock.monotonic_ms()
        if self._last_freeze_ms is not None and now_ms - self._last_freeze_ms < FREEZE_MIN_INTERVAL_MS:
            return
        self._applied_since_freeze = 0
        self._last_freeze_ms = now_ms
        self._freezes += 1
        if self._freezes % THAW_EVERY_FREEZES == 0:
            _thaw_heap()  # bounded leak of frozen cycles; the next full collection walks everything once
        else:
            _freeze_heap()

    async def handle_load_snapshot(self, reader: SnapshotReader) -> None:
        last = reader.snapshot_id.end_offset - 1
        if last <= self.committed.offset:
            return
        delta = MetadataDelta(MetadataImage.empty())
        errors: list[KraftError] = []  # values that are not metadata records (test-only raw appends)
        values = reader.records
        for start in range(0, len(values), YIELD_EVERY_RECORDS):
            # Bulk replay in bounded chunks: a million-partition snapshot must not stall Raft for seconds.
            delta.replay_values(values[start : start + YIELD_EVERY_RECORDS], on_error=errors.append)
            await asyncio.sleep(0)
        if last <= self.committed.offset:
            return  # commits arrived while this ran (they are newer than the snapshot)
        undecodable = len(errors)
        if undecodable:
            self.metrics.metadata_errors.inc(undecodable)
            self.log.warning("undecodable_snapshot_records", count=undecodable)
        delta.offset = last
        delta.epoch = reader.snapshot_id.epoch
        self.committed = delta.apply()
        self._window.clear()
        self._bytes_since_snapshot = 0
        self._resolve_waiters(last, reader.snapshot_id.epoch)
        self._store_dirty.set()
        self._maybe_freeze(len(values))
        self.log.info(
            "snapshot_loaded", end_offset=reader.snapshot_id.end_offset, epoch=reader.snapshot_id.epoch
        )

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self._leader = leader
        if leader.leader_id == self.node_id and not self._stopping:
            if self.active_epoch != leader.epoch:
                self._deactivate(leader.leader_id)
                self.active_epoch = leader.epoch
                self._activation = asyncio.create_task(
                    self._activate(leader.epoch), name="controller-activate"
                )
        else:
            self._deactivate(leader.leader_id)

    async def _activate(self, epoch: int) -> None:
        while True:
            try:
                last = self.raft.schedule_append([rec.encode_value(rec.wrap(pb.NoOpRecord()))])
                await self._wait_committed(last)
                break
            except (NotLeaderError, NotControllerError, RaftError):
                return
            except TimeoutError:
                # no majority for a while; Raft resigns on check-quorum, otherwise try again
                if self.active_epoch != epoch:
                    return
        if self.active_epoch != epoch or self._leader.leader_id != self.node_id:
            return
        self._next_offset = self.committed.offset + 1
        logic = ControllerLogic(self.settings, self.committed, self.clock.monotonic_ms())
        self.logic = logic
        self._activated.set()
        self.metrics.active_controller_count.set(1)
        self.metrics.new_active_controllers.inc()
        self.log.info(
            "became_active", epoch=epoch, offset=self.committed.offset, brokers=len(self.committed.brokers)
        )
        resumed = logic.continue_leave_jobs(self._next_offset)
        while not resumed and logic.has_leave_jobs():  # chunks that only scanned
            resumed = logic.continue_leave_jobs(self._next_offset)
        if resumed:
            self.log.info("resuming_isr_removals", records=len(resumed))
            with contextlib.suppress(NotControllerError, KraftError, TimeoutError):
                await self._write(Outcome(resumed, cpb.DescribeClusterResponse(), self._next_offset))
        records = logic.bootstrap_records(self._next_offset)
        if records:
            with contextlib.suppress(NotControllerError, KraftError, TimeoutError):
                await self._write(Outcome(records, cpb.DescribeClusterResponse(), self._next_offset))

    def _deactivate(self, leader_id: int) -> None:
        if self._activation is not None and not self._activation.done():
            self._activation.cancel()
        was_active = self.logic is not None
        self.logic = None
        self._own_images.clear()
        self._own_values.clear()
        self._oldest_pending_ms = None
        self.active_epoch = -1 if leader_id != self.node_id else self.active_epoch
        self._activated.clear()
        self._fail_waiters(leader_id)
        self.metrics.active_controller_count.set(0)
        if was_active:
            self.log.info("resigned_active", leader=leader_id)

    # ---- commit bookkeeping ----

    def _remember(self, batch: WindowBatch) -> None:
        self._window.append(batch)

    def _resolve_waiters(self, offset: int, epoch: int) -> None:
        # A record this controller appended in epoch E can only commit inside a batch of epoch E.  If a
        # batch of a newer epoch commits at its offset, a newer leader truncated ours (e.g. we were paused
        # and deposed): fail the waiter, never acknowledge a write no log holds.
        while self._waiters and self._waiters[0][0] <= offset:
            _, _, append_epoch, future = heapq.heappop(self._waiters)
            if future.done():
                continue
            if epoch > append_epoch:
                future.set_exception(NotControllerError(self._leader.leader_id))
            else:
                future.set_result(None)

    def _fail_waiters(self, leader_id: int) -> None:
        waiters, self._waiters = self._waiters, []
        for _, _, _, future in waiters:
            if not future.done():
                future.set_exception(NotControllerError(leader_id))

    async def _wait_committed(self, offset: int) -> None:
        if offset <= self.committed.offset:
            return
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._waiters, (offset, next(self._seq), self.active_epoch, future))
        await asyncio.wait_for(future, self.options.commit_timeout_ms / 1000)

    def _append(self, records: list[pb.MetadataRecord], first_offset: int) -> int:
        """Schedule records at the offsets the logic predicted; returns the last offset."""
        values = [rec.encode_value(r) for r in records]
        try:
            last = self.raft.schedule_append(values)
        except NotLeaderError as exc:
            self._deactivate(exc.leader.leader_id)
            raise NotControllerError(exc.leader.leader_id) from exc
        expected = first_offset + len(values) - 1
        self._next_offset = last + 1
        self._last_write_ms = self.clock.monotonic_ms()
        if self._oldest_pending_ms is None:
            self._oldest_pending_ms = self._last_write_ms
        if last != expected:
            # Broker epochs inside these records assumed other offsets; let a new leader rebuild.
            self.log.error("offset_prediction_mismatch", expected=expected, got=last)
            self._tasks.append(asyncio.get_running_loop().create_task(self.raft.resign()))
        elif self.logic is not None and self.logic.image.offset == last:
            self._own_images[last] = self.logic.image
            self._own_values.append((last - len(values) + 1, values))
        return last

    async def _write(self, outcome: Outcome[R]) -> R:
        """Append the outcome's records and answer once they (and everything before) committed.

        Brokers leaving their ISRs (fence, shutdown, unregister) continue in further appends of bounded
        size, with the event loop free in between; the answer waits for the last of them.
        """
        if outcome.records:
            last = self._append(outcome.records, outcome.first_offset)
            logic = self.logic
            while logic is not None and logic is self.logic and logic.has_leave_jobs():
                await self._wait_for_room()
                if logic is not self.logic:
                    raise NotControllerError(self._leader.leader_id)
                first = self._next_offset
                more = logic.continue_leave_jobs(first)
                if more:
                    last = self._append(more, first)
            await self._wait_committed(last)
        else:
            depends_on = outcome.wait_offset if outcome.wait_offset is not None else self._next_offset - 1
            await self._wait_committed(depends_on)
        return outcome.response

    async def _wait_for_room(self) -> None:
        """Yield, then wait while too many appended records are not committed yet (bulk writes only)."""
        await asyncio.sleep(0)
        deadline = self.clock.monotonic_ms() + self.options.commit_timeout_ms
        while (
            self.logic is not None and self._next_offset - 1 - self.committed.offset > MAX_UNCOMMITTED_RECORDS
        ):
            remaining = deadline - self.clock.monotonic_ms()
            if remaining <= 0:
                raise TimeoutError
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._commit_event.wait(), remaining / 1000)

    # ---- request plumbing ----

    def _controller_ref(self, leader_id: int | None = None) -> common_pb2.NodeRef:
        leader = self._leader.leader_id if leader_id is None else leader_id
        ref = common_pb2.NodeRef(node_id=leader)
        endpoint = self.endpoints.get(leader)
        if endpoint is not None:
            ref.endpoint.CopyFrom(
                common_pb2.Endpoint(
                    name="CONTROLLER", host=endpoint[0], port=endpoint[1], security_protocol="PLAINTEXT"
                )
            )
        return ref

    def _lease_expired(self) -> bool:
        """True when a write has waited longer than the lease: this node may have been deposed without
        knowing it yet, and must not keep brokers talking to it (they would miss the real leader)."""
        pending_since = self._oldest_pending_ms
        return (
            pending_since is not None
            and self.clock.monotonic_ms() - pending_since > self.options.leader_lease_ms
        )

    async def _active_logic(self) -> ControllerLogic:
        if self.logic is not None:
            if self._lease_expired():
                raise NotControllerError(NO_LEADER)
            return self.logic
        if self._leader.leader_id == self.node_id and not self._stopping:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._activated.wait(), self.options.activation_wait_ms / 1000)
            if self.logic is not None:
                return self.logic
        raise NotControllerError(self._leader.leader_id)

    async def _serve(self, response: R, build: Callable[[ControllerLogic], Outcome[R]]) -> R:
        """Run one mutating request: activation check, logic, append, wait for commit, map errors."""
        try:
            logic = await self._active_logic()
            return await self._write(build(logic))
        except NotControllerError as exc:
            return self._not_controller(response, exc.leader_id)
        except TimeoutError:
            return error_response(
                response, ErrorCode.REQUEST_TIMED_OUT, "the metadata write did not commit in time"
            )
        except KraftError as exc:
            return error_response(response, exc.code, exc.message)

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
        return await self._serve(
            cpb.RegisterBrokerResponse(),
            lambda lg: lg.register_broker(req, self.clock.monotonic_ms(), self._next_offset),
        )

    async def broker_heartbeat(self, req: cpb.BrokerHeartbeatRequest) -> cpb.BrokerHeartbeatResponse:
        # Contact is recorded on arrival, before waiting for anything (see heartbeats.py).
        self._heartbeats_received += 1
        logic = self.logic
        if logic is not None and req.cluster_id == self.cluster_id:
            broker = logic.image.brokers.get(req.broker_id)
            if broker is not None and broker.epoch == req.broker_epoch:
                logic.heartbeats.touch(req.broker_id, self.clock.monotonic_ms(), req.current_metadata_offset)
        return await self._serve(
            cpb.BrokerHeartbeatResponse(),
            lambda lg: lg.broker_heartbeat(req, self.clock.monotonic_ms(), self._next_offset),
        )

    async def unregister_broker(self, req: cpb.UnregisterBrokerRequest) -> cpb.UnregisterBrokerResponse:
        return await self._serve(
            cpb.UnregisterBrokerResponse(), lambda lg: lg.unregister_broker(req, self._next_offset)
        )

    async def _count_speculative(self) -> None:
        logic = self.logic
        while (
            logic is not None and logic is self.logic and not logic.count_some(None, COUNT_SLICE_PARTITIONS)
        ):
            await _next_loop_turn()

    async def shutdown_broker(self, req: cpb.ShutdownBrokerRequest) -> cpb.ShutdownBrokerResponse:
        await self._count_speculative()  # its answer counts leaderships: do most of that in slices
        response = await self._serve(
            cpb.ShutdownBrokerResponse(), lambda lg: lg.shutdown_broker(req, self._next_offset)
        )
        await self._count_speculative()
        logic = self.logic
        if response.error_code == ErrorCode.NONE and logic is not None:
            response.leaderships_remaining = logic.leader_count(req.broker_id)  # after every chunk
        return response

    async def create_topics(self, req: cpb.CreateTopicsRequest) -> cpb.CreateTopicsResponse:
        chunks = _topic_chunks(req, self.options.partitions_per_write)
        if len(chunks) == 1:
            return await self._create_part(req)
        # A big request is written as several appends, each computed when it is its turn, so the event
        # loop (heartbeats, Raft fetches) runs between them, and paced so that at most about
        # MAX_UNCOMMITTED_RECORDS are in flight; topics are independent, as in Kafka.
        counts = Counter(t.name for t in req.topics)
        writes = []
        for chunk in chunks:
            topics = [t for t in chunk if counts[t.name] == 1]
            part = cpb.CreateTopicsRequest(
                cluster_id=req.cluster_id, topics=topics, validate_only=req.validate_only
            )
            # Yields first, so the previous part computes and appends; on a timeout this part's own
            # commit wait answers REQUEST_TIMED_OUT.
            with contextlib.suppress(TimeoutError):
                await self._wait_for_room()
            writes.append(asyncio.ensure_future(self._create_part(part)))
        results: dict[str, cpb.CreatableTopicResult] = {}
        for answer in await asyncio.gather(*writes):
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

    async def _create_part(self, req: cpb.CreateTopicsRequest) -> cpb.CreateTopicsResponse:
        return await self._serve(
            cpb.CreateTopicsResponse(), lambda lg: lg.create_topics(req, self._next_offset)
        )

    async def delete_topics(self, req: cpb.DeleteTopicsRequest) -> cpb.DeleteTopicsResponse:
        return await self._serve(
            cpb.DeleteTopicsResponse(), lambda lg: lg.delete_topics(req, self._next_offset)
        )

    async def elect_leaders(self, req: cpb.ElectLeadersRequest) -> cpb.ElectLeadersResponse:
        return await self._serve(
            cpb.ElectLeadersResponse(), lambda lg: lg.elect_leaders(req, self._next_offset)
        )

    async def _read(self, response: R, cluster_id: str) -> tuple[ControllerLogic, MetadataImage] | R:
        """Reads answer from the committed image, after every pending write committed."""
        try:
            logic = await self._active_logic()
            logic.check_cluster_id(cluster_id)
            await self._wait_committed(self._next_offset - 1)
        except NotControllerError as exc:
            return self._not_controller(response, exc.leader_id)
        except TimeoutError:
            return error_response(
                response, ErrorCode.REQUEST_TIMED_OUT, "pending metadata writes did not commit"
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
        response.controller_epoch = self._leader.epoch
        response.brokers.extend(logic.describe_brokers(image, self.clock.monotonic_ms()))
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

    # ---- MetadataFetch ----

    async def metadata_fetch(self, req: cpb.MetadataFetchRequest) -> cpb.MetadataFetchResponse:
        response = cpb.MetadataFetchResponse()
        if req.cluster_id and req.cluster_id != self.cluster_id:
            return error_response(
                response,
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"cluster id {req.cluster_id!r} is not {self.cluster_id!r}",
            )
        try:
            await self._active_logic()
        except NotControllerError as exc:
            return self._not_controller(response, exc.leader_id)
        response.controller_epoch = self._leader.epoch
        if req.HasField("snapshot_id"):
            return self._snapshot_chunk(req, response)
        deadline = self.clock.monotonic_ms() + max(0, req.max_wait_ms)
        while True:
            start = self._window.start_offset(self.committed.offset + 1)
            if req.fetch_offset < start:
                return await self._offer_snapshot(response)
            if req.fetch_offset <= self.committed.offset:
                self._fill_records(req, response)
                if response.records:
                    break
            remaining = deadline - self.clock.monotonic_ms()
            if remaining <= 0 or self.logic is None:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._commit_event.wait(), remaining / 1000)
        response.high_watermark = self.committed.offset + 1
        response.log_start_offset = self._window.start_offset(self.committed.offset + 1)
        if self.logic is None:
            return self._not_controller(response, self._leader.leader_id)
        return response

    def _fill_records(self, req: cpb.MetadataFetchRequest, response: cpb.MetadataFetchResponse) -> None:
        limit = req.max_records if req.max_records > 0 else DEFAULT_FETCH_RECORDS
        for r in self._window.read(req.fetch_offset, limit):
            response.records.add(
                offset=r.offset, leader_epoch=r.epoch, append_time_ms=r.append_time_ms, value=r.value
            )

    async def _offer_snapshot(self, response: cpb.MetadataFetchResponse) -> cpb.MetadataFetchResponse:
        cached = self._fetch_snapshot
        image = self.committed
        # A broker resumes at the snapshot's end offset, so that must still be inside the window.
        if cached is None or cached[0].end_offset < self._window.start_offset(image.offset + 1):
            ref = cpb.SnapshotRef(end_offset=image.offset + 1, epoch=image.epoch)
            values: list[bytes] = []
            for i, value in enumerate(image_values(image)):
                values.append(value)
                if i % YIELD_EVERY_RECORDS == YIELD_EVERY_RECORDS - 1:
                    await asyncio.sleep(0)
            cached = (ref, values)
            self._fetch_snapshot = cached
        response.snapshot_id.CopyFrom(cached[0])
        response.high_watermark = self.committed.offset + 1
        response.log_start_offset = self._window.start_offset(self.committed.offset + 1)
        return response

    def _snapshot_chunk(
        self, req: cpb.MetadataFetchRequest, response: cpb.MetadataFetchResponse
    ) -> cpb.MetadataFetchResponse:
        cached = self._fetch_snapshot
        if cached is None or cached[0] != req.snapshot_id:
            return error_response(
                response,
                ErrorCode.SNAPSHOT_NOT_FOUND,
                "that snapshot is no longer served; fetch from your offset again",
            )
        ref, values = cached
        if not 0 <= req.snapshot_position <= len(values):
            return error_response(
                response,
                ErrorCode.POSITION_OUT_OF_RANGE,
                f"position {req.snapshot_position} not in 0..{len(values)}",
            )
        limit = req.max_records if req.max_records > 0 else SNAPSHOT_CHUNK_RECORDS
        end = min(len(values), req.snapshot_position + limit)
        response.snapshot_id.CopyFrom(ref)
        response.snapshot_records.extend(values[req.snapshot_position : end])
        response.next_snapshot_position = end
        response.snapshot_done = end == len(values)
        response.high_watermark = self.committed.offset + 1
        return response

    # ---- periodic tasks ----

    async def _session_checker(self) -> None:
        interval_ms = max(10, self.options.session_timeout_ms // 8)
        last_ms = self.clock.monotonic_ms()
        while True:
            await self.timers.sleep_ms(interval_ms)
            now = self.clock.monotonic_ms()
            stall = now - last_ms - interval_ms
            last_ms = now
            logic = self.logic
            if logic is None:
                continue
            received, self._heartbeats_received = self._heartbeats_received, 0
            if stall > interval_ms:
                # The loop itself was blocked: heartbeats may be queued unread, so nobody expires now.
                logic.heartbeats.extend_all(stall)
                self.log.warning("controller_stalled", stall_ms=stall)
                continue
            if self._intake_stalled(logic, received, interval_ms + max(0, stall)):
                logic.heartbeats.extend_all(interval_ms + max(0, stall))
                continue
            await self._fence_expired(logic, now)

    def _intake_stalled(self, logic: ControllerLogic, received: int, elapsed_ms: int) -> bool:
        """True when far fewer heartbeats arrived than the unfenced brokers send: the controller is not
        getting them (gRPC starved by a busy process), so their silence proves nothing about the brokers.

        A loop that keeps turning can still starve gRPC's intake (seen under bulk writes on a saturated
        machine); fencing then would fence live brokers.  Bounded: after INTAKE_STALL_MAX_CHECKS checks
        in a row (about two session timeouts) expiry resumes, so a real mass failure is still fenced.
        """
        unfenced = logic.heartbeats.unfenced_count()
        if unfenced < INTAKE_MIN_BROKERS:
            self._intake_stalls = 0
            return False
        expected = unfenced * elapsed_ms / max(1, self.options.heartbeat_interval_ms)
        if received >= expected * INTAKE_STALL_FRACTION:
            self._intake_stalls = 0
            return False
        if self._intake_stalls >= INTAKE_STALL_MAX_CHECKS:
            return False
        self._intake_stalls += 1
        self.log.warning(
            "heartbeat_intake_stalled",
            received=received,
            expected=round(expected),
            checks=self._intake_stalls,
        )
        return True

    async def _fence_expired(self, logic: ControllerLogic, now: int) -> None:
        while self.logic is logic:
            broker_id, records = logic.fence_expired(now, self._next_offset)
            if broker_id < 0:
                return
            self.metrics.timed_out_broker_heartbeats.inc()
            self.log.info("broker_session_expired", broker=broker_id)
            try:
                await self._write(Outcome(records, cpb.BrokerHeartbeatResponse(), self._next_offset))
            except (NotControllerError, TimeoutError):
                return

    async def _idle_noops(self) -> None:
        interval_ms = self.options.noop_interval_ms
        if interval_ms <= 0:
            return
        while True:
            await self.timers.sleep_ms(interval_ms)
            logic = self.logic
            if logic is None or self.clock.monotonic_ms() - self._last_write_ms < interval_ms:
                continue
            with contextlib.suppress(NotControllerError, TimeoutError):
                await self._write(
                    Outcome(
                        logic.noop_records(self._next_offset),
                        cpb.BrokerHeartbeatResponse(),
                        self._next_offset,
                    )
                )

    async def _store_writer(self) -> None:
        if self._store is None:
            return
        while True:
            await self._store_dirty.wait()
            self._store_dirty.clear()
            image = self.committed
            started_ms = self.clock.monotonic_ms()
            try:
                await self._store.save(image)
            except Exception as exc:
                self.metrics.metadata_errors.inc()
                self.log.error("image_store_save_failed", offset=image.offset, error=str(exc))
                await self.timers.sleep_ms(STORE_RETRY_MS)
                self._store_dirty.set()
            # Coalesce: during bulk writes one save per interval covers many batches (the store only
            # shortens a restart's replay; the Raft log stays the source of truth).
            await self.timers.sleep_until(started_ms + STORE_MIN_INTERVAL_MS)

    def _maybe_snapshot(self) -> None:
        if self._snapshot_task is not None and not self._snapshot_task.done():
            return
        now = self.clock.monotonic_ms()
        due_bytes = self._bytes_since_snapshot >= self.options.snapshot_max_bytes
        due_time = (
            self._bytes_since_snapshot > 0
            and now - self._last_snapshot_ms >= self.options.snapshot_interval_ms
        )
        if not (due_bytes or due_time):
            return
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = now
        self._snapshot_task = asyncio.get_running_loop().create_task(self._snapshot(self.committed))

    async def _snapshot(self, image: MetadataImage) -> None:
        """Write a Raft snapshot of a committed image; Raft may then delete the log below it."""
        try:
            writer = self.raft.create_snapshot(image.offset + 1, image.epoch, self.clock.wall_ms())
        except (ValueError, RaftError) as exc:
            self.log.warning("snapshot_skipped", end_offset=image.offset + 1, error=str(exc))
            return
        try:
            chunk: list[bytes] = []
            for value in image_values(image):
                chunk.append(value)
                if len(chunk) >= YIELD_EVERY_RECORDS:
                    writer.append(chunk)
                    chunk = []
                    await asyncio.sleep(0)
            if chunk:
                writer.append(chunk)
            snapshot_id = await writer.freeze()
            self.log.info("snapshot_written", end_offset=snapshot_id.end_offset, epoch=snapshot_id.epoch)
        except Exception as exc:
            self.metrics.metadata_errors.inc()
            self.log.error("snapshot_failed", end_offset=image.offset + 1, error=str(exc))
        finally:
            await writer.close()

    def _update_metrics(self) -> None:
        image = self.committed
        m = self.metrics
        m.last_applied_record_offset.set(image.offset)
        m.last_committed_record_offset.set(image.offset)
        if image.brokers is not getattr(self, "_metrics_brokers", None):
            self._metrics_brokers = image.brokers
            fenced = sum(1 for b in image.brokers.values() if b.fenced)
            m.fenced_broker_count.set(fenced)
            m.active_broker_count.set(len(image.brokers) - fenced)
        m.global_topic_count.set(len(image.topics_by_id))

    async def _partition_metrics(self) -> None:
        """Partition gauges need a full scan: done every few seconds, yielding while it runs."""
        scanned_topics: object = None
        while True:
            await self.timers.sleep_ms(PARTITION_METRICS_INTERVAL_MS)
            image = self.committed
            if image.topics_by_id is scanned_topics:
                continue
            scanned_topics = image.topics_by_id
            partitions = offline = imbalance = 0
            for topic in image.topics_by_id.values():
                for p in topic.partitions:
                    offline += p.leader == NO_LEADER
                    imbalance += p.leader != p.preferred_leader
                partitions += len(topic.partitions)
                if partitions % YIELD_EVERY_RECORDS < len(topic.partitions):
                    await asyncio.sleep(0)
            self.metrics.global_partition_count.set(partitions)
            self.metrics.offline_partitions_count.set(offline)
            self.metrics.preferred_replica_imbalance_count.set(imbalance)


async def gather_bounded(calls: Sequence[Awaitable[Any]], limit: int) -> list[Any]:
    """Run awaitables with at most ``limit`` in flight (used by tools and benchmarks)."""
    semaphore = asyncio.Semaphore(limit)

    async def one(call: Awaitable[Any]) -> Any:
        async with semaphore:
            return await call

    return list(await asyncio.gather(*(one(c) for c in calls)))
