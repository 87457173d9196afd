"""The asyncio driver: the only place Raft meets the event loop, the network and the disk.

Task ownership (who touches what):

- **raft-driver** (one task, :meth:`RaftDriver._run`) owns the :class:`~kraft.raft.core.RaftCore` and the
  log.  It waits for the next event or the core's next deadline, feeds the core, then executes the
  output with :func:`~kraft.raft.executor.execute_output` (the one order of effects, shared with the
  simulation): log writes → send-now messages → quorum-state write (fsync) → send-after-persist
  messages → notifications → next deadline → log fsync, whose ``on_flushed`` output it executes before
  taking the next event — meanwhile it feeds the core only the inputs whose outputs write nothing (a
  leader's Fetches and its answers to parked Fetches: :meth:`RaftDriver._serve_during_flush`; a
  follower's fsync runs inline, taking nothing).  It takes the
  events queued when a round starts, then polls the core, so a stream of events cannot starve its
  timers.  Nothing else calls the core except :meth:`RaftDriver.schedule_append` (adds records to the
  accumulator, no IO) and read-only views.
- **raft-send** tasks, one per outbound request: ``transport.send`` and push the outcome back as an
  event; they never touch the core.
- **inbound RPC tasks** (the transport's): :meth:`RaftDriver.handle_request` queues the request and awaits
  a future the driver task resolves (at once, after persistence, or after a long poll).
- **raft-listener** tasks, one per registered listener (:mod:`kraft.raft.listeners`): read committed
  batches from the log and call the listener.  A leader wakes them as soon as the high watermark rises
  (commit answers wait on them) — or, for a few records and a listener that takes them synchronously,
  hands them over itself in that step (``ListenerSet.deliver_now``); a follower only once the output
  that raised it ran to its end, log fsync and next Fetch included (:meth:`RaftDriver._on_high_watermark`).
- a leader's log fsyncs run on one dedicated thread (:class:`~kraft.raft.sync_worker.SyncWorker`: fewer
  hand-offs than the default executor), snapshot/quorum-state writes in worker threads
  (``asyncio.to_thread``); the driver task awaits both, so the leader's event loop never blocks on disk.
  Any other role's log fsync runs inline on the loop (see :meth:`RaftDriver._flush`).  While a
  leader's fsync runs, the request plane's bridges (:class:`PullSource`) hold what they are handed and
  the driver takes it when the fsync returns: no main-loop wake-up per hand-off meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from kraft.clock import Clock
from kraft.errors import ErrorCode
from kraft.observability.logging import StructLogger, get_logger
from kraft.observability.metrics import RaftMetrics
from kraft.raft.api import (
    CommittedBatch,
    CommittedSlice,
    LeaderAndEpoch,
    NotLeaderError,
    OffsetBelowLogStartError,
    RaftListener,
    RaftShutdownError,
    SnapshotChunk,
    SnapshotNotFoundError,
    VoterChangeError,
)
from kraft.raft.control_codec import voter_problem, voters_in_batch, voters_record_of
from kraft.raft.core import RaftCore
from kraft.raft.core_log import EpochEntry, LogInvariantError, LogMeta
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
from kraft.raft.executor import OutputPorts, execute_output
from kraft.raft.listeners import SYNC_DELIVERY_MAX_RECORDS, BuiltRecords, CommitView, ListenerSet
from kraft.raft.messages import (
    DescribeQuorumRequest,
    DescribeQuorumResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    RaftRequest,
    RaftResponse,
    ReplicaState,
    SnapshotId,
)
from kraft.raft.ports import ElectionStore, LogStore, SnapshotStore
from kraft.raft.state import ElectionState, StateKind
from kraft.raft.sync_worker import SyncWorker
from kraft.raft.transport import Transport, TransportError
from kraft.raft.voters import Endpoint, Voter, VoterSet, VoterSetHistory
from kraft.storage.batch import (
    BatchHeader,
    LeaderChangeMessage,
    build_batch,
    build_control_batch,
    decode_batch,
    iter_batch_headers,
)
from kraft.storage.errors import CorruptLogError, OffsetOutOfRangeError


def scan_kafka_batches(data: bytes) -> list[BatchInfo]:
    """The core's batch scanner for Kafka v2 bytes (CRC-checked: the bytes come from the network).
    Only control batches are decoded, for the voter set of a VotersRecord (KIP-853)."""
    return _scan(data, [])


def _scan(data: bytes, headers: list[BatchHeader]) -> list[BatchInfo]:
    """:func:`scan_kafka_batches`, each batch's checked header also added to ``headers``."""
    out: list[BatchInfo] = []
    for position, header in iter_batch_headers(data):
        voters = None
        if header.is_control:
            batch, _ = decode_batch(data, position)
            voters = voters_in_batch(batch)
        headers.append(header)
        out.append(BatchInfo(header.base_offset, header.last_offset, header.partition_leader_epoch, voters))
    return out


class FetchedBatchScan:
    """The driver's batch scanner (:func:`scan_kafka_batches`) that keeps the checked headers of the
    buffer it scanned last, for the append of those very bytes.

    A follower's round scans the fetched bytes in the core (CRC, magic, offsets) and, when they continue
    its log, appends them in the same step; before, the log then ran the CRC pass over every batch again
    and the log's tail read every header a third time.  :meth:`headers_for` hands the scan's headers to
    that append (``LogStore.append(checked=...)``) only for the same ``bytes`` object (immutable: the
    bytes checked are the bytes written), once; anything else appends with the store's own checks."""

    __slots__ = ("_data", "_headers")

    def __init__(self) -> None:
        self._data: bytes | None = None
        self._headers: list[BatchHeader] = []

    def __call__(self, data: bytes) -> list[BatchInfo]:
        self._data = None  # a scan that raises leaves nothing to hand over
        headers: list[BatchHeader] = []
        out = _scan(data, headers)
        if type(data) is bytes:
            self._data, self._headers = data, headers
        return out

    def headers_for(self, data: bytes) -> list[BatchHeader] | None:
        """The checked headers of ``data`` if it is the buffer scanned last (then forgotten), else None."""
        if data is not self._data:
            return None
        headers = self._headers
        self._data, self._headers = None, []
        return headers


def voter_history_of(
    log: LogStore, snapshots: SnapshotStore, snapshot: SnapshotId | None
) -> VoterSetHistory | None:
    """The voter history a restarting node rebuilds (Kafka's KRaftControlRecordStateMachine): the
    snapshot's voter set, then every VotersRecord in the log.  None when neither holds one: a static
    quorum (kraft.version 0).  Reads the whole log once; only control batches are decoded."""
    base = snapshots.read_voters(snapshot) if snapshot is not None else None
    history = VoterSetHistory(base) if base is not None else None
    offset, end = log.start_offset, log.end_offset
    while offset < end:
        data = log.read(offset, 1 << 20)
        if not data:
            break
        for position, header in iter_batch_headers(data):
            offset = header.next_offset
            if not header.is_control:
                continue
            voters = voters_in_batch(decode_batch(data, position)[0])
            if voters is None:
                continue
            if history is None:
                history = VoterSetHistory(voters)
            history.add_at(header.base_offset, voters)
    return history


def _check_voter(node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...] = ()) -> None:
    problem = voter_problem(node_id, directory_id, endpoints)
    if problem is not None:
        raise VoterChangeError(ErrorCode.INVALID_REQUEST, problem)


# --- events the driver task consumes ---


@dataclass(frozen=True, slots=True)
class _Inbound:
    request_id: int
    request: RaftRequest
    peer_id: int | None = None


@dataclass(frozen=True, slots=True)
class _Response:
    correlation_id: int
    response: RaftResponse


@dataclass(frozen=True, slots=True)
class _SendFailed:
    correlation_id: int
    unreachable: bool = False
    """The peer refused the connection (its process is gone), as opposed to a timeout."""


_UNREACHABLE_REASONS = ("UNAVAILABLE", "fetch stream closed")
"""TransportError reasons that mean the peer answered nothing because it is not there (connection
refused / reset), as opposed to DEADLINE_EXCEEDED, which a slow but live peer also causes."""


def is_unreachable(error: TransportError) -> bool:
    return error.reason.startswith(_UNREACHABLE_REASONS)


SPIN_REPORT_POLLS = 10_000
"""Polls in a row with an already-due deadline and no event after which ``raft_poll_spinning`` is logged."""

PEER_WARNING_INTERVAL_MS = 30_000
PEER_FAILURES_BEFORE_WARNING = 3
CLOSE_FLUSH_WAIT_S = 30.0
BUILT_BATCHES_KEPT = 64
"""At most this many uncommitted batches a leader keeps for handing over at commit (RaftDriver._built)."""
"""How long :meth:`RaftDriver.close` waits for a flush still running on the fsync thread (a hung disk)."""
_REFUSALS = frozenset(
    {ErrorCode.INCONSISTENT_CLUSTER_ID, ErrorCode.INCONSISTENT_VOTER_SET, ErrorCode.INVALID_REQUEST}
)
"""Answers that mean a peer refuses our requests for good (a configuration problem, not a race)."""


@dataclass(frozen=True, slots=True)
class PeerProblem:
    """What is wrong with one peer right now: ``kind`` is ``unreachable`` or the refusal's error code name."""

    peer_id: int
    address: str
    kind: str
    detail: str

    def __str__(self) -> str:
        if self.kind == UNREACHABLE:
            return f"unreachable at {self.address}: {self.detail}"
        return f"{self.kind} from {self.address}: {self.detail}"


UNREACHABLE = "unreachable"


class PeerProblems:
    """Warnings about peers this node cannot use, so misconfiguration is visible within seconds instead
    of an election loop with no explanation.

    * ``raft_peer_unreachable peer= address= failures= reason=`` after ``PEER_FAILURES_BEFORE_WARNING``
      consecutive transport failures, then at most once per ``PEER_WARNING_INTERVAL_MS`` per peer;
      ``raft_peer_reachable`` once it answers again;
    * ``raft_peer_refused peer= address= code= message=`` for INCONSISTENT_CLUSTER_ID /
      INCONSISTENT_VOTER_SET / INVALID_REQUEST answers (a data dir of another cluster, different
      ``controller.quorum.voters``, a port that belongs to another voter), rate-limited the same way.

    :meth:`problems` is the latest problem per peer (DescribeQuorum's ``peer_problems``, so that
    ``kraft quorum describe --status`` and ``kraft cluster status`` show it).  Pure bookkeeping on a clock the
    caller passes; logging through ``logger``.
    """

    def __init__(
        self,
        logger: StructLogger,
        address_of: Callable[[int], str | None],
        interval_ms: int = PEER_WARNING_INTERVAL_MS,
    ) -> None:
        self._logger = logger
        self._address_of = address_of
        self._interval_ms = interval_ms
        self._failures: dict[int, int] = {}
        self._last_warning_ms: dict[tuple[int, str], int] = {}
        self._warned_unreachable: set[int] = set()
        self._problems: dict[int, PeerProblem] = {}

    def problems(self) -> dict[int, str]:
        """Peer id → one line saying what is wrong with it."""
        return {peer: str(problem) for peer, problem in self._problems.items()}

    def reports(self) -> tuple[PeerProblem, ...]:
        """The current problems, by peer id."""
        return tuple(self._problems[peer] for peer in sorted(self._problems))

    def _due(self, key: tuple[int, str], now_ms: int) -> bool:
        last = self._last_warning_ms.get(key)
        if last is not None and now_ms - last < self._interval_ms:
            return False
        self._last_warning_ms[key] = now_ms
        return True

    def send_failed(self, dest: int, reason: str, now_ms: int) -> None:
        failures = self._failures.get(dest, 0) + 1
        self._failures[dest] = failures
        address = self._address_of(dest) or "unknown"
        if failures < PEER_FAILURES_BEFORE_WARNING:
            return
        self._problems[dest] = PeerProblem(dest, address, UNREACHABLE, reason)
        if self._due((dest, "unreachable"), now_ms):
            self._warned_unreachable.add(dest)
            self._logger.warning(
                "raft_peer_unreachable", peer=dest, address=address, failures=failures, reason=reason
            )

    def answered(self, dest: int, code: ErrorCode, message: str, now_ms: int) -> None:
        failures = self._failures.pop(dest, 0)
        if dest in self._warned_unreachable:
            self._warned_unreachable.discard(dest)
            self._last_warning_ms.pop((dest, "unreachable"), None)
            self._logger.info(
                "raft_peer_reachable",
                peer=dest,
                address=self._address_of(dest) or "unknown",
                after_failures=failures,
            )
        if code not in _REFUSALS:
            self._problems.pop(dest, None)
            return
        address = self._address_of(dest) or "unknown"
        self._problems[dest] = PeerProblem(dest, address, code.name, message)
        if self._due((dest, code.name), now_ms):
            self._logger.warning(
                "raft_peer_refused", peer=dest, address=address, code=code.name, message=message
            )


@dataclass(frozen=True, slots=True)
class _Wakeup:
    pass


@dataclass(frozen=True, slots=True)
class _SnapshotFrozen:
    snapshot_id: SnapshotId
    done: asyncio.Future[None]


@dataclass(frozen=True, slots=True)
class _Resign:
    pass


@dataclass(frozen=True, slots=True)
class _SnapshotVoters:
    """The voter set of a snapshot just installed (read from its file), for the core."""

    snapshot_id: SnapshotId
    voters: VoterSet | None


class _CallbackReply:
    """Where :meth:`RaftDriver.submit_request` answers: the callback is called on the driver's loop at
    the moment the core's output answers the request (no task to wake, no loop turn in between)."""

    __slots__ = ("_callback", "_done")

    def __init__(self, callback: ReplyCallback) -> None:
        self._callback = callback
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, response: RaftResponse) -> None:
        self._done = True
        self._callback(response, None)

    def set_exception(self, error: BaseException) -> None:
        self._done = True
        self._callback(None, error)


ReplyCallback = Callable[[RaftResponse | None, BaseException | None], None]
"""``(response, None)`` or ``(None, error)``; called once, on the driver's loop, and must not block."""


CommitCallback = Callable[[int | None, BaseException | None], None]
"""``(last_offset, None)`` once committed or ``(None, error)``; called once, on the driver's loop, and must
not block (:meth:`RaftDriver.append_callback`)."""


class PullSource(Protocol):
    """Work handed to the driver from another thread (:class:`kraft.node.intake.AppendBridge`,
    :class:`kraft.node.intake.DriverBridge`) that the driver *pulls* while its leader fsync runs.

    A hand-off wakes the driver's loop (a cross-thread post, a context switch and a GIL hand-over on the
    main thread); while the leader awaits its fsync no append it is handed is cut into a batch before the
    fsync returns anyway (the driver feeds the core only Fetches and round answers meanwhile:
    :meth:`RaftDriver._serve_during_flush`), so the wake-up buys nothing.  Between
    :meth:`hold` and :meth:`release` the source therefore keeps what arrives, and the driver takes it all
    at once when the flush is done — in the loop turn the fsync's completion wakes anyway.  With no flush
    in flight (an idle leader) the source hands off at once, so a lone write is still written at once
    (group commit: ``LeaderRole.batch_due``).  Both are called on the driver's loop, must not block, and
    :meth:`release` follows every :meth:`hold` (also when the flush fails or the driver stops: what was
    held then meets a driver that refuses it, and its callers hear why)."""

    def hold(self) -> None:
        """A leader fsync starts: keep what arrives until :meth:`release` (idempotent)."""

    def release(self) -> None:
        """The fsync returned: hand everything held to the driver now, and hand off at once again."""


class _CommitWaiter:
    """An :meth:`RaftDriver.append_callback` caller among the pending appends: settled like their futures,
    but by calling back at the moment the high watermark passes it (no future, no task to wake)."""

    __slots__ = ("_callback", "_done")

    def __init__(self, callback: CommitCallback) -> None:
        self._callback = callback
        self._done = False

    def done(self) -> bool:
        return self._done

    def set_result(self, offset: int) -> None:
        self._done = True
        self._callback(offset, None)

    def set_exception(self, error: BaseException) -> None:
        self._done = True
        self._callback(None, error)


_Event = _Inbound | _Response | _SendFailed | _Wakeup | _SnapshotFrozen | _Resign | _SnapshotVoters


class _DriverSnapshotWriter:
    """:class:`~kraft.raft.api.SnapshotWriter` over the driver's snapshot store."""

    def __init__(self, driver: RaftDriver, snapshot_id: SnapshotId, last_contained_timestamp_ms: int) -> None:
        self._driver = driver
        self._snapshot_id = snapshot_id
        self._last_contained_ms = last_contained_timestamp_ms
        self._records: list[bytes] = []
        self._frozen = False

    @property
    def snapshot_id(self) -> SnapshotId:
        return self._snapshot_id

    def append(self, records: Sequence[bytes]) -> None:
        if self._frozen:
            raise ValueError("the snapshot is already frozen")
        self._records.extend(records)

    async def freeze(self) -> SnapshotId:
        if self._frozen:
            return self._snapshot_id
        await self._driver._write_snapshot(self._snapshot_id, self._last_contained_ms, self._records)
        self._frozen = True
        self._records = []
        return self._snapshot_id

    async def close(self) -> None:
        self._records = []


class RaftDriver:
    """Runs a :class:`RaftCore` for real; implements :class:`~kraft.raft.api.RaftClient` and the
    transport's :class:`~kraft.raft.transport.RequestHandler`."""

    def __init__(
        self,
        config: RaftConfig,
        *,
        transport: Transport,
        log: LogStore,
        elections: ElectionStore,
        snapshots: SnapshotStore,
        clock: Clock,
        rng: random.Random | None = None,
        follower_listener_delay_ms: int = 0,
    ) -> None:
        """``follower_listener_delay_ms``: while a follower, hand newly committed batches to the listeners
        this long after the first of them committed, all at once, instead of right after the output that
        raised the high watermark (0).  Nothing waits on a follower's listeners but its own state machine;
        a leader, and a follower becoming one, wakes them at once."""
        if follower_listener_delay_ms < 0:
            raise ValueError("follower_listener_delay_ms must be >= 0")
        self.config = config
        self._transport = transport
        self._log = log
        self._scan = FetchedBatchScan()
        self._elections = elections
        self._snapshots = snapshots
        self._clock = clock
        self._rng = rng or random.Random()
        self._logger = get_logger("raft", node=config.node_id)
        address_of = getattr(transport, "address_of", None)
        self.peer_problems = PeerProblems(
            self._logger, address_of if callable(address_of) else (lambda _dest: None)
        )
        self._metrics = RaftMetrics.for_node(config.node_id)
        self._core = self._build_core()
        self._events: deque[_Event] = deque()
        self._wake = asyncio.Event()
        self._inbound: dict[int, asyncio.Future[RaftResponse] | _CallbackReply] = {}
        self._next_request_id = 1
        # (last offset, future, monotonic ms of the append) of append() callers waiting on commit, in
        # offset order: offsets are handed out in increasing order, so commits pop from the left.
        self._pending_appends: deque[tuple[int, asyncio.Future[int] | _CommitWaiter, int]] = deque()
        # confirm_leadership() callers by the round that answers them (round ids only grow).
        self._read_waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._read_round_asked_ms: dict[int, int] = {}  # when each waited-on round was first asked for
        # when the lease last answered a caller, None once a caller found it lapsed (the lease_lapsed line)
        self._lease_last_hit_ms: int | None = None
        self._wakeup_queued = False
        self._listeners_due = False  # a follower's high watermark rose: wake the listeners after the output
        self._follower_listener_delay_ms = follower_listener_delay_ms
        self._listeners_wake_ms: int | None = None  # a follower's delayed listener wake-up is due then
        self._fetch_answered_ms: int | None = None  # when the last Fetch response came (fetch_turnaround)
        self._election_started_ms: int | None = None
        self._send_tasks: set[asyncio.Task[None]] = set()
        self._sync = SyncWorker(f"raft-fsync-{config.node_id}")  # the log's fsyncs (_flush)
        self._pull_sources: list[PullSource] = []  # held while a leader fsync runs (pull_during_flush)
        # Small batches this leader wrote and that have not committed yet, in offset order (gaps where a
        # batch was not kept): handed to listeners in the step they commit (ListenerSet.deliver_now).
        self._built: deque[CommittedBatch] = deque()
        self._task: asyncio.Task[None] | None = None
        self._deadline_ms = 0
        self._parked = False  # waiting in _sleep_until_deadline (read by the ``idle`` test seam)
        self._park_until_ms = 0  # the clock time the current park ends at (its deadline)
        self._park_timer: asyncio.TimerHandle | None = None  # the loop timer standing for it
        # Set while the driver has nothing to do (parked, stopped or failed); cleared by every event it is
        # handed.  A follower's listeners wait for it between their steps (yield_turn).
        self._quiet = asyncio.Event()
        self._quiet.set()
        self._stopped = False
        self._fatal: BaseException | None = None
        self._leader_changed = asyncio.Event()
        # learn_log_end_commit() callers: (the log end they wait for the high watermark to reach, future)
        self._log_end_waiters: list[tuple[int, asyncio.Future[int]]] = []
        self._last_state: StateKind | None = None
        self._fatal_callbacks: list[Callable[[str, BaseException], None]] = []
        self._listeners = ListenerSet(
            log,
            snapshots,
            self._commit_view,
            self._logger,
            on_failure=self._listener_failed,
            pause=self.yield_turn,
        )
        self._ports = OutputPorts(
            write_log=self._apply_log_op,
            send=self._deliver,
            persist_election=self._persist_election,
            load_snapshot=self._on_snapshot_installed,
            commit=self._on_high_watermark,
            fail_pending_appends=self._fail_pending_appends,
            confirm_read_round=self._on_read_round_confirmed,
            announce_leader=self._on_leader_change,
            wait_until=self._wait_until,
            flush=self._flush,
        )

    def _build_core(self) -> RaftCore:
        snapshot = self._snapshots.latest()
        if snapshot is not None and self._log.end_offset < snapshot.end_offset:
            # A crash between freezing a downloaded snapshot and resetting the log: finish the reset.
            self._log.reset_to(snapshot.end_offset)
        end = self._log.end_offset
        epochs = [EpochEntry(epoch, start) for epoch, start in self._log.epoch_entries() if start < end]
        voters = voter_history_of(self._log, self._snapshots, snapshot)
        meta = LogMeta(self._log.start_offset, end, end, epochs, snapshot, voters)
        election = self._elections.read() or ElectionState(0)
        return RaftCore(self.config, self._rng, self._scan, election, meta)

    # ------------------------------------------------------------------ lifecycle

    async def start(self) -> None:
        if self._task is not None:
            return
        self._task = asyncio.get_running_loop().create_task(self._run(), name="raft-driver")

    async def shutdown(self, timeout_ms: int) -> None:
        """Resign if leader, wait up to ``timeout_ms`` (on the driver's clock) for another leader, then stop
        every task."""
        if self._stopped:
            return
        if self._core.is_leader and self._core.voters - {self.node_id} and self._task is not None:
            self._push(_Resign())
            deadline = self._clock.monotonic_ms() + timeout_ms
            while self._clock.monotonic_ms() < deadline:
                leader = self._core.leader_and_epoch.leader_id
                if leader not in (-1, self.node_id) and not self._core.is_leader:
                    break
                self._leader_changed.clear()
                remaining_s = max(0.0, (deadline - self._clock.monotonic_ms()) / 1000)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(remaining_s):
                        await self._leader_changed.wait()
        await self.stop()

    async def stop(self) -> None:
        """Stop without resigning (a crash-like stop; the log is not closed)."""
        if self._stopped:
            return
        self._stopped = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        for task in list(self._send_tasks):
            task.cancel()
        self._sync.stop()  # a flush already handed over still runs to its end
        await self._listeners.close()
        self._fail_everything(RaftShutdownError("raft is shut down"))

    def on_fatal(self, callback: Callable[[str, BaseException], None]) -> None:
        """Call ``callback(reason, error)`` when the driver task fails (``raft_driver_failed``: storage
        write/fsync failure, broken invariant) or a listener cannot load or apply committed data
        (``raft_listener_failed``); the process owner stops the process then (fail-stop, issue #14).
        Called at once when the driver already failed."""
        self._fatal_callbacks.append(callback)
        if self._fatal is not None:
            callback("raft_driver_failed", self._fatal)

    def _report_fatal(self, reason: str, error: BaseException) -> None:
        for callback in list(self._fatal_callbacks):
            try:
                callback(reason, error)
            except Exception:
                self._logger.exception("fatal_callback_failed")

    def _listener_failed(self, error: BaseException) -> None:
        self._report_fatal("raft_listener_failed", error)

    def close(self) -> None:
        """Close the log (flush + clean-shutdown marker).  Call after :meth:`shutdown`/:meth:`stop`."""
        # A flush the stopped driver handed over may still run: let it end before the log closes.
        self._sync.stop()
        self._sync.join(CLOSE_FLUSH_WAIT_S)
        self._log.close()

    def _fail_everything(self, error: BaseException) -> None:
        self._quiet.set()  # nothing more will run: a listener waiting in yield_turn goes on
        self._answer_log_end_waiters(self._core.high_watermark, all_of_them=True)
        for future in self._inbound.values():
            if not future.done():
                future.set_exception(error)
        self._inbound.clear()
        for _offset, pending, _appended_ms in self._pending_appends:
            if not pending.done():
                pending.set_exception(error)
        self._pending_appends.clear()
        self._fail_read_waiters(error)

    # ------------------------------------------------------------------ RaftClient: views

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch:
        return self._core.leader_and_epoch

    @property
    def high_watermark(self) -> int:
        return self._core.high_watermark

    @property
    def next_append_offset(self) -> int:
        return self._core.next_append_offset

    @property
    def log_end_offset(self) -> int:
        """The local log's end offset (nothing at or above it was ever committed through this log)."""
        return self._log.end_offset

    @property
    def state(self) -> StateKind:
        return self._core.state

    @property
    def idle(self) -> bool:
        """Parked until its next event or deadline with nothing left to do.  Tests on a manual clock wait
        for this after :meth:`recheck_timers`, so "the deadline has not fired yet" is asserted after the
        driver looked at the new time, not after some wall-clock sleep.  A failed driver does nothing more:
        it is idle."""
        if self._fatal is not None:
            return True
        return self._parked and not self._wake.is_set() and not self._events

    def recheck_timers(self) -> None:
        """Poll the core now instead of at the next deadline.  Only a manual clock needs this: the driver
        sleeps on the event loop until the deadline it computed, which a clock moved by hand does not
        shorten.  (Production never calls it, so it costs nothing there.)"""
        self._wake.set()
        self._leader_changed.set()  # so shutdown() also looks at the clock: its deadline is on it too

    def register_listener(self, listener: RaftListener) -> None:
        self._listeners.register(listener)

    async def yield_turn(self) -> None:
        """Give the event loop a turn; on a follower, also wait until the driver has nothing to do.

        A follower's listener (the metadata replay, in steps of a few ms) calls this between its steps.
        Every event the driver is handed — above all the Fetch response that brings the next records —
        is then handled to its end (append, fsync, the next Fetch sent) before the replay takes another
        step: otherwise each hop of that turnaround (response, driver, flush thread, send task) waited
        behind a replay step, and on 2 busy cores the follower's next Fetch, which the leader's lease
        and its next commit wait on, came tens of ms later (docs/internals/raft-performance.md,
        "Follower turns during bulk work").  The driver never waits on a listener, so this ends when
        the driver parks, stops or fails.  A leader's listeners only take the loop turn: the active
        controller's commit answers wait on them."""
        await asyncio.sleep(0)
        if not self._quiet.is_set() and not self._core.is_leader:
            await self._quiet.wait()

    def unregister_listener(self, listener: RaftListener) -> None:
        self._listeners.unregister(listener)

    async def learn_log_end_commit(self) -> int:
        core = self._core
        target = self._log.end_offset
        if (
            self._stopped
            or self._fatal is not None
            or core.is_leader
            or core.leader_and_epoch.leader_id < 0
            or core.high_watermark >= target
        ):
            return core.high_watermark
        waiter: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        entry = (target, waiter)
        self._log_end_waiters.append(entry)
        try:
            return await waiter
        finally:
            if entry in self._log_end_waiters:  # the caller's bound ran out (cancelled)
                self._log_end_waiters.remove(entry)

    def _answer_log_end_waiters(self, high_watermark: int, *, all_of_them: bool) -> None:
        """Answer the learn_log_end_commit() callers whose wait is over: the high watermark reached their
        log end (or the log's end now, if a diverging leader cut it), or ``all_of_them`` (a new leader,
        a stop: what they waited for may never come)."""
        end = self._log.end_offset
        waiting: list[tuple[int, asyncio.Future[int]]] = []
        for target, waiter in self._log_end_waiters:
            if all_of_them or high_watermark >= min(target, end):
                if not waiter.done():
                    waiter.set_result(high_watermark)
            else:
                waiting.append((target, waiter))
        self._log_end_waiters = waiting

    def describe_quorum(self) -> DescribeQuorumResponse:
        return self._wall_clock_timestamps(self._core.describe_quorum(self._clock.monotonic_ms()))

    def _wall_clock_timestamps(self, response: DescribeQuorumResponse) -> DescribeQuorumResponse:
        """The core keeps fetch times on the monotonic clock; operators (and Kafka's DescribeQuorum) see
        wall-clock epoch milliseconds, so translate at this edge (-1 = never stays -1)."""
        offset_ms = self._clock.wall_ms() - self._clock.monotonic_ms()

        def wall(replica: ReplicaState) -> ReplicaState:
            return replace(
                replica,
                last_fetch_timestamp_ms=_shift(replica.last_fetch_timestamp_ms, offset_ms),
                last_caught_up_timestamp_ms=_shift(replica.last_caught_up_timestamp_ms, offset_ms),
            )

        return replace(
            response,
            current_voters=tuple(wall(r) for r in response.current_voters),
            observers=tuple(wall(r) for r in response.observers),
        )

    def latest_snapshot_id(self) -> SnapshotId | None:
        return self._snapshots.latest()

    def _commit_view(self) -> CommitView:
        core = self._core
        start = core.epoch_start_offset if core.is_leader else -1
        return CommitView(core.high_watermark, core.leader_and_epoch, start)

    # ------------------------------------------------------------------ RaftClient: writes

    def schedule_append(self, records: Sequence[bytes], *, hold: bool = False) -> int:
        self._check_running()
        # No copy: the core copies the records into its accumulator (extend) in this call.
        offset = self._core.append(records, self._clock.monotonic_ms(), hold=hold)
        if not self._wakeup_queued:  # one wake-up serves any number of appends
            self._wakeup_queued = True
            self._push(_Wakeup())
        return offset

    def end_hold(self) -> None:
        if self._stopped or self._fatal is not None:
            return
        self._core.end_hold(self._clock.monotonic_ms())
        if not self._wakeup_queued:  # the driver's next output cuts what was held
            self._wakeup_queued = True
            self._push(_Wakeup())

    async def append(self, records: Sequence[bytes]) -> int:
        offset = self.schedule_append(records)
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending_appends.append((offset, future, self._clock.monotonic_ms()))
        return await future

    def append_callback(self, records: Sequence[bytes], on_commit: CommitCallback) -> int:
        """:meth:`append` without a future: schedules ``records`` and returns the last one's offset
        (raising :class:`NotLeaderError` / :class:`RaftShutdownError` at once, as :meth:`schedule_append`),
        then calls ``on_commit`` on this loop exactly once, when the high watermark passes that offset (the
        records are on a majority's disks) or with the error that ends the wait.  For callers that gather
        many writers' records into one call and answer them from another thread
        (:class:`kraft.node.intake.AppendBridge`): one waiter per call instead of a future and a task per
        writer."""
        offset = self.schedule_append(records)
        self._pending_appends.append((offset, _CommitWaiter(on_commit), self._clock.monotonic_ms()))
        return offset

    def pull_during_flush(self, source: PullSource) -> None:
        """Let ``source`` hold its hand-offs while this node's leader fsync runs and take them when it
        returns (:class:`PullSource`).  Call on the driver's loop, before the source is used."""
        if source not in self._pull_sources:
            self._pull_sources.append(source)

    def leader_lease_expiry_ms(self) -> int:
        """When this leader's check-quorum lease ends on the driver's clock (-1: none, or not leader):
        what the heartbeat fast lane answers under (kraft.metadata.heartbeat_lane).  A read, on its loop."""
        return self._core.leader_lease_expiry_ms()

    def confirm_leadership(self, *, lease: bool = False) -> asyncio.Future[None]:
        self._check_running()
        now_ms = self._clock.monotonic_ms()
        # The lease's state before this call starts a round, for the lease_lapsed line below (only when
        # it has lapsed: rare while callers keep it renewed, and two small reads then).
        lapsed = (
            self._core.leader_lease_ages_ms(now_ms)
            if lease and self._core.leader_lease_expiry_ms() <= now_ms
            else None
        )
        read_round = self._core.confirm_leadership(now_ms, lease=lease)
        future: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if read_round == 0:  # the lease holds: confirmed now (a renewal round may have started)
            self._metrics.confirmations_lease.inc()
            self._lease_last_hit_ms = now_ms
            future.set_result(None)
            # A driver turn only when the call changed the core's output or deadline (a renewal round
            # started, or the renewal timer armed): otherwise it takes an empty output and re-arms its
            # sleep, once per heartbeat at 500 heartbeats a second (issue #17, session 12).
            if not self._core.lease_hit_quiet and not self._wakeup_queued:
                self._wakeup_queued = True
                self._push(_Wakeup())
            return future
        # lease_lapsed: what makes a heartbeat that changes nothing slow during bulk work (issue #17)
        (self._metrics.confirmations_lease_lapsed if lease else self._metrics.confirmations_round).inc()
        self._read_round_asked_ms.setdefault(read_round, now_ms)
        if lapsed is not None:
            # Once per lease lost while in use: the previous lease caller was answered from it.  A lease
            # that lapses because callers come further apart than the lease (a few brokers' heartbeats)
            # is lost every time and says nothing.  The ages tell a leader whose own loop stalled (the
            # last hit and the latest round both old: nothing ran here) from voters slow to echo (a
            # recent round, old bases).
            if self._lease_last_hit_ms is not None:
                self._logger.info(
                    "lease_lapsed",
                    read_round=read_round,
                    last_hit_age_ms=now_ms - self._lease_last_hit_ms,
                    latest_round_age_ms=lapsed[0],
                    basis_age_ms=lapsed[1],
                    lease_ms=self._core.config.lease_ms,
                )
            self._lease_last_hit_ms = None
        waiters = self._read_waiters.setdefault(read_round, [])
        waiters[:] = [waiter for waiter in waiters if not waiter.done()]  # callers that gave up
        waiters.append(future)
        if not self._wakeup_queued:  # the round's effects (answered long polls) are in the next output
            self._wakeup_queued = True
            self._push(_Wakeup())
        return future

    def _on_read_round_confirmed(self, read_round: int) -> None:
        now_ms = self._clock.monotonic_ms()
        for waiting in sorted(r for r in self._read_waiters if r <= read_round):
            asked_ms = self._read_round_asked_ms.pop(waiting, None)
            if asked_ms is not None:
                self._metrics.confirmation_round.observe(max(0, now_ms - asked_ms) / 1000)
            for future in self._read_waiters.pop(waiting):
                if not future.done():
                    future.set_result(None)

    def _fail_read_waiters(self, error: BaseException) -> None:
        for waiters in self._read_waiters.values():
            for future in waiters:
                if not future.done():
                    future.set_exception(error)
        self._read_waiters.clear()
        self._read_round_asked_ms.clear()
        self._lease_last_hit_ms = None  # a later leadership's lease starts unused

    # ------------------------------------------------------------------ voter changes (KIP-853)

    @property
    def voter_set(self) -> VoterSet:
        """The voter set in force (the last in the log, committed or not)."""
        return self._core.voter_set

    @property
    def voter_set_offset(self) -> int:
        """The offset of the VotersRecord that introduced :attr:`voter_set` (-1: the set of the snapshot,
        the bootstrap checkpoint or the static configuration)."""
        return self._core.voter_history.latest_offset

    @property
    def kraft_version(self) -> int:
        return self._core.kraft_version

    async def add_voter(self, voter: Voter) -> int:
        """Add ``voter`` (it must be fetching as an observer and caught up); resolves with the offset of
        the VotersRecord once it is committed.  Raises :class:`VoterChangeError`, :class:`NotLeaderError`."""
        self._check_running()
        _check_voter(voter.node_id, voter.directory_id, voter.endpoints)
        offset = self._core.add_voter(voter, self._clock.monotonic_ms())
        return await self._await_voter_change(offset, "added", voter.node_id, voter.directory_id)

    async def remove_voter(self, node_id: int, directory_id: str) -> int:
        """Remove voter (``node_id``, ``directory_id``); a leader removing itself resigns once committed."""
        self._check_running()
        _check_voter(node_id, directory_id)
        offset = self._core.remove_voter(node_id, directory_id, self._clock.monotonic_ms())
        return await self._await_voter_change(offset, "removed", node_id, directory_id)

    async def update_voter(self, node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...]) -> int:
        """Record new endpoints for voter (``node_id``, ``directory_id``) (after it moved)."""
        self._check_running()
        _check_voter(node_id, directory_id, endpoints)
        offset = self._core.update_voter(node_id, directory_id, endpoints, self._clock.monotonic_ms())
        return await self._await_voter_change(offset, "updated", node_id, directory_id)

    async def _await_voter_change(self, offset: int, action: str, node_id: int, directory_id: str) -> int:
        self._logger.info(
            "voter_change_appended", action=action, voter=node_id, directory_id=directory_id, offset=offset
        )
        if offset < self._core.high_watermark:
            return offset  # nothing to change (the same endpoints): that record is committed already
        future: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._pending_appends.append((offset, future, self._clock.monotonic_ms()))
        if not self._wakeup_queued:
            self._wakeup_queued = True
            self._push(_Wakeup())
        return await future

    def create_snapshot(
        self, end_offset: int, epoch: int, last_contained_timestamp_ms: int
    ) -> _DriverSnapshotWriter:
        self._core.validate_snapshot_id(end_offset, epoch)
        latest = self._snapshots.latest()
        if latest is not None and end_offset <= latest.end_offset:
            raise ValueError(f"a snapshot at or after offset {end_offset} already exists ({latest})")
        return _DriverSnapshotWriter(self, SnapshotId(end_offset, epoch), last_contained_timestamp_ms)

    async def _write_snapshot(
        self, snapshot_id: SnapshotId, last_contained_ms: int, records: list[bytes]
    ) -> None:
        self._check_running()
        history = self._core.voter_history
        voters = None if history.static else history.voters_at(snapshot_id.end_offset - 1)
        await asyncio.to_thread(
            self._snapshots.write, snapshot_id, last_contained_ms, records, self._clock.wall_ms(), voters
        )
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._push(_SnapshotFrozen(snapshot_id, done))
        await done

    async def resign(self) -> None:
        self._check_running()
        self._push(_Resign())

    # ------------------------------------------------------------------ RaftClient: reads

    async def read_committed(self, offset: int, max_bytes: int) -> CommittedSlice:
        high_watermark = self._core.high_watermark
        start = self._log.start_offset
        if offset < start:
            raise OffsetBelowLogStartError(offset, start, self._snapshots.latest())
        if offset >= high_watermark:
            return CommittedSlice(b"", offset, high_watermark, start)
        try:
            data = self._log.read(offset, max_bytes, high_watermark)
        except CorruptLogError as exc:
            # Committed data that no longer verifies (a broker's MetadataFetch read it): fail-stop.
            self._report_fatal("raft_log_corrupt", exc)
            raise
        next_offset = offset
        for _position, header in iter_batch_headers(data):
            next_offset = header.next_offset
        return CommittedSlice(data, next_offset, high_watermark, start)

    async def read_snapshot(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> SnapshotChunk:
        try:
            size = self._snapshots.size(snapshot_id)
            data = await asyncio.to_thread(self._snapshots.read_chunk, snapshot_id, position, max_bytes)
        except KeyError:
            raise SnapshotNotFoundError(f"no snapshot {snapshot_id}") from None
        return SnapshotChunk(snapshot_id, size, position, data)

    # ------------------------------------------------------------------ RequestHandler

    async def handle_request(self, request: RaftRequest, *, peer_id: int | None = None) -> RaftResponse:
        self._check_running()
        request_id = self._next_request_id
        self._next_request_id += 1
        future: asyncio.Future[RaftResponse] = asyncio.get_running_loop().create_future()
        self._inbound[request_id] = future
        self._push(_Inbound(request_id, request, peer_id))
        try:
            response = await future
        finally:
            self._inbound.pop(request_id, None)
        if isinstance(response, DescribeQuorumResponse):
            return self._wall_clock_timestamps(response)
        return response

    def submit_request(self, request: RaftRequest, *, peer_id: int | None, reply: ReplyCallback) -> None:
        """:meth:`handle_request` without a task: ``reply`` is called (on this loop) as soon as the core
        answers.  For a request plane on another thread (kraft.node.intake): its callback posts the answer
        to that loop at once, before this driver goes on to fsync the batch the answer carries — through
        :meth:`handle_request` the answer waited for the handler's task to be woken on a later turn of this
        loop, after the fsync was handed to its thread (docs/internals/raft-performance.md, "A lone
        write's path").  Must be called on the driver's loop; a driver shut down answers with the error."""
        try:
            self._check_running()
        except RaftShutdownError as exc:
            reply(None, exc)
            return
        request_id = self._next_request_id
        self._next_request_id += 1
        if isinstance(request, DescribeQuorumRequest):

            def wall_clock(response: RaftResponse | None, error: BaseException | None) -> None:
                if isinstance(response, DescribeQuorumResponse):
                    response = self._wall_clock_timestamps(response)
                reply(response, error)

            self._inbound[request_id] = _CallbackReply(wall_clock)
        else:
            self._inbound[request_id] = _CallbackReply(reply)
        self._push(_Inbound(request_id, request, peer_id))

    # ------------------------------------------------------------------ the driver task

    def _check_running(self) -> None:
        if self._stopped or self._fatal is not None:
            raise RaftShutdownError(
                "raft is shut down" if self._fatal is None else f"raft failed: {self._fatal}"
            )

    def _push(self, event: _Event) -> None:
        self._events.append(event)
        self._quiet.clear()
        self._wake.set()

    async def _run(self) -> None:
        try:
            await execute_output(self._core.start(self._clock.monotonic_ms()), self._ports)
            self._wake_due_listeners()
            due_polls = 0  # polls in a row whose deadline was already due with no event queued
            while True:
                if not self._events:
                    if await self._sleep_until_deadline():
                        due_polls = 0
                    else:
                        # The core asked to be polled now.  Give the event loop one turn first: a core
                        # that kept handing out a due deadline would otherwise spin here without ever
                        # yielding (no log line, no SIGTERM handling: a frozen-looking node).  Say so if
                        # it lasts, with what the deadline is, instead of hiding it.
                        due_polls += 1
                        if due_polls == SPIN_REPORT_POLLS:
                            self._logger.error(
                                "raft_poll_spinning",
                                polls=due_polls,
                                deadline_ms=self._deadline_ms,
                                now_ms=self._clock.monotonic_ms(),
                                state=self._core.state.name,
                            )
                        await asyncio.sleep(0)
                else:
                    due_polls = 0
                # The events queued now, then a poll: not `while self._events`, which never polled while
                # each event's flush let the next one arrive (a leader under bulk appends: a wake-up per
                # fsync) — its timers starved: check-quorum, the lease's renewal, the linger bound (issue
                # #17, session 13; found by the simulation's driver ordering, tests/sim).
                for _ in range(len(self._events)):
                    if not self._events:
                        break
                    event = self._events.popleft()
                    await execute_output(self._dispatch(event, self._clock.monotonic_ms()), self._ports)
                    self._wake_due_listeners()
                await execute_output(self._core.poll(self._clock.monotonic_ms()), self._ports)
                self._wake_due_listeners()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            # Storage failures (fsync) and core invariant violations are fatal: stop, never guess.
            self._fatal = exc
            self._logger.exception("raft_driver_failed", error=str(exc))
            self._fail_everything(RaftShutdownError(f"raft failed: {exc}"))
            self._report_fatal("raft_driver_failed", exc)

    async def _sleep_until_deadline(self) -> bool:
        """Wait for the core's deadline (or a follower's delayed listener wake-up) or an event; False
        without waiting when the deadline is due."""
        deadline_ms = self._deadline_ms
        if self._listeners_wake_ms is not None:
            deadline_ms = min(deadline_ms, self._listeners_wake_ms)
        timeout_s = max(0.0, (deadline_ms - self._clock.monotonic_ms()) / 1000)
        if timeout_s <= 0:
            return False
        started_ms = self._clock.monotonic_ms()
        self._wake.clear()
        if not self._events:
            self._parked = True
            self._quiet.set()
            # The deadline sets the wake-up event itself: no asyncio.timeout (a context object, the
            # task's cancellation and its bookkeeping: ~6 µs of a follower's every round, measured in
            # process, session 20) and no wait_for (3.11's can swallow a cancellation, gh-86296).  The
            # timer is cancelled however the wait ends, so it never sets a later wait's event.
            self._park_until_ms = deadline_ms
            self._park_timer = asyncio.get_running_loop().call_later(timeout_s, self._park_timer_fired)
            try:
                await self._wake.wait()
            finally:
                if self._park_timer is not None:
                    self._park_timer.cancel()
                    self._park_timer = None
                self._parked = False
        self._metrics.poll_idle_seconds.inc(max(0, self._clock.monotonic_ms() - started_ms) / 1000)
        return True

    def _park_timer_fired(self) -> None:
        """The loop timer of a park ran out: wake the driver if its clock says the deadline is due, else
        wait out the rest.  The loop's timers and the clock can disagree: libuv rounds a timer to the
        millisecond and may run it just before the clock reaches the deadline (a poll that would find
        nothing due), and a manual clock does not move with the loop at all — there the timer stands for
        nothing, and waking on it would make a parked driver busy once per real millisecond until a test
        moves the clock (tests' ``settle`` then never saw it idle on a loaded host: session 21)."""
        remaining_ms = self._park_until_ms - self._clock.monotonic_ms()
        if remaining_ms <= 0:
            self._park_timer = None
            self._wake.set()
        else:
            self._park_timer = asyncio.get_running_loop().call_later(
                remaining_ms / 1000, self._park_timer_fired
            )

    def _dispatch(self, event: _Event, now_ms: int) -> Output:
        core = self._core
        if isinstance(event, _Inbound):
            return core.handle_request(event.request_id, event.request, now_ms, peer_id=event.peer_id)
        if isinstance(event, _Response):
            return core.handle_response(event.correlation_id, event.response, now_ms)
        if isinstance(event, _SendFailed):
            return core.handle_send_failure(event.correlation_id, now_ms, unreachable=event.unreachable)
        if isinstance(event, _SnapshotFrozen):
            start = self._log.delete_before(event.snapshot_id.end_offset)
            self._snapshots.delete_before(event.snapshot_id)
            out = core.on_snapshot_frozen(event.snapshot_id, start, now_ms)
            if not event.done.done():
                event.done.set_result(None)
            self._listeners.wake_all()
            return out
        if isinstance(event, _Resign):
            return core.resign(now_ms)
        if isinstance(event, _SnapshotVoters):
            return core.on_snapshot_voters(event.snapshot_id, event.voters, now_ms)
        self._wakeup_queued = False
        return core.take_output(now_ms)

    # ------------------------------------------------------------------ effects (the ports of execute_output)

    async def _persist_election(self, election: ElectionState) -> None:
        await asyncio.to_thread(self._elections.write, election)

    async def _flush(self) -> None:
        # Awaited by the driver task: nothing writes the log while the fsync runs (no truncation races
        # it), and the flush's own output is executed before the next event is fed to the core.
        # A leader's pull sources hold what arrives meanwhile (PullSource) and hand it over once the
        # flush's output ran: released after it, not before, so appends that fill a batch are cut by the
        # next output of _run (after the events that queued) — never inside this flush's output, which
        # would chain fsyncs here without taking events.
        sources = tuple(self._pull_sources) if self._core.is_leader else ()
        try:
            for source in sources:
                source.hold()
            if self._core.is_leader:
                end = await self._serve_during_flush(self._sync.run(self._log.flush))
            else:
                # Not a leader: inline.  A follower's fsync is on every write's critical path (records
                # in -> fsync -> next Fetch, which commits them), and its thread hop cost two GIL
                # hand-overs and a loop wake-up there (~90 us of CPU per batch, 0.3-0.5 ms of p50 on 2
                # busy cores: raft-performance.md "A lone CreateTopics, session 13").  A follower
                # controller serves no client request but NOT_CONTROLLER answers, and fdatasync releases
                # the GIL (the intake thread runs meanwhile).  The cost: a leader's answer to the
                # follower's echo (sent before this flush, FetcherRole._echo_if_blocked) is read only
                # after it — the simulation's lease measure moved with the leader's feed alone
                # (raft-performance.md "The lease's echo path (session 13)").  A leader's loop serves
                # the controller's requests and its followers' Fetches during its fsync, so it keeps
                # the thread.
                end = self._log.flush()
            self._metrics.log_end_offset.set(end)
            await execute_output(self._core.on_flushed(end, self._clock.monotonic_ms()), self._ports)
        finally:
            for source in sources:
                source.release()

    async def _serve_during_flush(self, fsync: asyncio.Future[int]) -> int:
        """Await ``fsync`` while feeding the core the queued inputs it takes during a flush (the lease's
        echo path, issue #17 session 13: a leader's inbound Fetches and the answers to its parked ones
        when a round starts — :meth:`RaftCore.takes_request_during_flush`; a follower's fsync runs
        inline, see :meth:`_flush`).
        Everything else stays queued, in order, for :meth:`_run` after the flush's own output.  Before, a
        Fetch that arrived during a leader's fsync waited for it (up to ~200 ms under bulk work), and with
        it the echo that renews the lease and the progress that commits."""
        fsync.add_done_callback(self._wake_on_fsync)
        try:
            while not fsync.done():
                self._wake.clear()
                while True:
                    now_ms = self._clock.monotonic_ms()
                    event = self._take_flush_input(now_ms)
                    if event is None:
                        break
                    out = self._dispatch(event, now_ms)
                    if out.log_ops or out.flush:
                        # The core promised neither for these inputs; writing now would race the fsync.
                        raise LogInvariantError(f"{type(event).__name__} wrote the log during a flush")
                    self._metrics.inputs_during_flush.inc()
                    # Not followed by _wake_due_listeners: a follower's listeners wait for the end of the
                    # output this flush belongs to (a leader's were woken by the commit itself).
                    await execute_output(out, self._ports)
                if not fsync.done():
                    await self._wake.wait()
        finally:
            fsync.cancel()  # the driver stopped (cancelled) meanwhile: nobody awaits it (no-op if done)
        return fsync.result()

    def _wake_on_fsync(self, _fsync: asyncio.Future[int]) -> None:
        self._wake.set()

    def _take_flush_input(self, now_ms: int) -> _Event | None:
        """Remove and return the first queued input the core takes during a flush (None: none)."""
        core = self._core
        for index, event in enumerate(self._events):
            if isinstance(event, _SnapshotVoters):
                return None  # fed before any other input (see _apply_log_op): nothing may pass it
            if (isinstance(event, _Inbound) and core.takes_request_during_flush(event.request)) or (
                isinstance(event, _Wakeup) and core.takes_output_during_flush(now_ms)
            ):
                del self._events[index]
                return event
        return None

    def _wait_until(self, deadline_ms: int) -> None:
        self._observe_state()
        self._deadline_ms = deadline_ms
        for age_ms in self._core.take_lease_echo_ages_ms():
            self._metrics.lease_echo_basis_age.observe(age_ms / 1000)

    async def _apply_log_op(self, op: LogOp) -> None:
        if isinstance(op, AppendRecords):
            timestamp_ms = self._clock.wall_ms()
            data = build_batch(
                op.base_offset,
                [(None, value) for value in op.records],
                leader_epoch=op.epoch,
                timestamp_ms=timestamp_ms,
            )
            self._log.append(data, built=True)
            self._metrics.append_records.inc(len(op.records))
            self._remember_built(op, timestamp_ms)
        elif isinstance(op, AppendLeaderChange):
            message = LeaderChangeMessage(op.leader_id, op.voters, op.granting_voters)
            data = build_control_batch(
                op.base_offset, [message], leader_epoch=op.epoch, timestamp_ms=self._clock.wall_ms()
            )
            self._log.append(data, built=True)
        elif isinstance(op, AppendVoters):
            data = build_control_batch(
                op.base_offset,
                [voters_record_of(op.voters)],
                leader_epoch=op.epoch,
                timestamp_ms=self._clock.wall_ms(),
            )
            self._log.append(data, built=True)
        elif isinstance(op, AppendFetched):
            self._built.clear()  # (a follower now: it delivers through the listeners' tasks)
            self._log.append(op.data, checked=self._scan.headers_for(op.data))
            self._metrics.fetch_records.inc(op.last_offset - op.base_offset + 1)
        elif isinstance(op, TruncateTo):
            self._built.clear()
            self._log.truncate_to(op.end_offset)
            self._logger.info("log_truncated", end_offset=op.end_offset, epoch=self._core.epoch)
        elif isinstance(op, WriteSnapshotChunk):
            await asyncio.to_thread(self._snapshots.write_chunk, op.snapshot_id, op.position, op.data)
        else:
            self._built.clear()
            voters = await asyncio.to_thread(self._install_snapshot, op)
            # Fed to the core before any other event: until then it keeps the voter set it had.
            self._events.appendleft(_SnapshotVoters(op.snapshot_id, voters))
            self._wake.set()

    def _remember_built(self, op: AppendRecords, timestamp_ms: int) -> None:
        """Keep a small batch just written as leader for :meth:`ListenerSet.deliver_now` (until it commits):
        the values and header fields the log's batch holds, byte for byte what a read would decode."""
        count = len(op.records)
        if count > SYNC_DELIVERY_MAX_RECORDS:
            return  # never handed over in the driver's step: the listener's task reads it
        built = self._built
        if len(built) >= BUILT_BATCHES_KEPT:
            built.popleft()  # commits stalled: the oldest go through the listeners' tasks
        last = op.base_offset + count - 1
        built.append(
            CommittedBatch(
                op.base_offset, last, op.epoch, BuiltRecords(op.base_offset, op.records), timestamp_ms
            )
        )

    def _install_snapshot(self, op: InstallSnapshot) -> VoterSet | None:
        self._snapshots.finish_download(op.snapshot_id)
        self._log.reset_to(op.snapshot_id.end_offset)
        self._snapshots.delete_before(op.snapshot_id)
        self._logger.info(
            "snapshot_installed", end_offset=op.snapshot_id.end_offset, snapshot_epoch=op.snapshot_id.epoch
        )
        return self._snapshots.read_voters(op.snapshot_id)

    def _deliver(self, message: Outbound) -> None:
        if isinstance(message, OutboundRequest):
            if isinstance(message.request, FetchRequest) and self._fetch_answered_ms is not None:
                # How long this follower took to turn the last Fetch response into this Fetch: while it
                # runs the leader hears nothing from it (its lease and its commits wait on the next one).
                turnaround_ms = self._clock.monotonic_ms() - self._fetch_answered_ms
                self._metrics.fetch_turnaround.observe(max(0, turnaround_ms) / 1000)
                self._fetch_answered_ms = None
            elif isinstance(message.request, FetchSnapshotRequest):
                self._fetch_answered_ms = None  # a snapshot download in between is not a turnaround
            task = asyncio.get_running_loop().create_task(self._send(message), name="raft-send")
            self._send_tasks.add(task)
            task.add_done_callback(self._send_tasks.discard)
            return
        future = self._inbound.pop(message.request_id, None)
        if future is None or future.done():
            return  # the caller gave up (deadline) — nothing to answer
        future.set_result(self._fill_reads(message))

    async def _send(self, message: OutboundRequest) -> None:
        try:
            response = await self._transport.send(message.dest, message.request, message.timeout_ms)
        except TransportError as exc:
            self.peer_problems.send_failed(message.dest, exc.reason, self._clock.monotonic_ms())
            self._push(_SendFailed(message.correlation_id, is_unreachable(exc)))
        except Exception as exc:  # a transport bug must look like a lost request, not kill Raft
            self._logger.warning("raft_send_failed", dest=message.dest, error=f"{type(exc).__name__}: {exc}")
            self._push(_SendFailed(message.correlation_id))
        else:
            now_ms = self._clock.monotonic_ms()
            self.peer_problems.answered(message.dest, response.error_code, response.error_message, now_ms)
            if isinstance(response, FetchResponse) and response.error_code == ErrorCode.NONE:
                self._fetch_answered_ms = now_ms
            self._push(_Response(message.correlation_id, response))

    def _fill_reads(self, message: OutboundResponse) -> RaftResponse:
        response = message.response
        if message.read_log is not None and isinstance(response, FetchResponse):
            try:
                data = self._log.read(message.read_log.offset, message.read_log.max_bytes)
            except (OffsetOutOfRangeError, ValueError) as exc:  # the file log's / the memory log's
                # The log moved under the fetch (e.g. prefix deleted): an empty answer makes it fetch again.
                # Anything else — CorruptLogError above all — fails the driver (fail-stop, issue #14): a
                # leader must not go on serving around committed data it can no longer read.
                self._logger.warning("fetch_read_failed", offset=message.read_log.offset, error=str(exc))
                data = b""
            return replace(response, records=data)
        if message.read_snapshot is not None and isinstance(response, FetchSnapshotResponse):
            read = message.read_snapshot
            try:
                size = self._snapshots.size(read.snapshot_id)
                data = self._snapshots.read_chunk(read.snapshot_id, read.position, read.max_bytes)
            except KeyError:
                return replace(
                    response,
                    error_code=ErrorCode.SNAPSHOT_NOT_FOUND,
                    error_message=f"no snapshot {read.snapshot_id}",
                )
            except ValueError as exc:
                return replace(response, error_code=ErrorCode.POSITION_OUT_OF_RANGE, error_message=str(exc))
            return replace(response, size=size, unaligned_records=data)
        return response

    # ------------------------------------------------------------------ notifications

    def _on_high_watermark(self, high_watermark: int) -> None:
        self._metrics.high_watermark.set(high_watermark)
        if self._log_end_waiters:
            self._answer_log_end_waiters(high_watermark, all_of_them=False)
        now_ms = self._clock.monotonic_ms()
        pending = self._pending_appends
        while pending and pending[0][0] < high_watermark:
            offset, future, appended_ms = pending.popleft()
            self._metrics.commit_latency.observe(max(0, now_ms - appended_ms) / 1000)
            if not future.done():
                future.set_result(offset)
        if self._core.is_leader:
            # Commit answers (the controller's) wait on the listener: a few records are handed over now, in
            # this step, from the batches this leader built, instead of a loop turn later by the listener's
            # task reading them back from the log (ListenerSet.deliver_now).
            built = self._built
            self._listeners.deliver_now(built)
            while built and built[0].last_offset < high_watermark:
                built.popleft()
        else:
            # A follower learns the high watermark from the Fetch answer that brings the next records: a
            # listener woken now applies the newly committed batches (a metadata replay: ~0.5 ms at
            # thousands of topics) while this output still has to fsync those records and send the next
            # Fetch — holding the GIL and the loop, it delayed both, and with them the leader's next
            # commit, by ~0.8 ms (docs/internals/raft-performance.md, "Where a lone CreateTopics' time
            # goes").  Woken once the output ran to its end (_wake_due_listeners); nothing waits on a
            # follower's listeners but the state machine itself.
            self._listeners_due = True

    def _wake_due_listeners(self) -> None:
        if self._listeners_due:
            self._listeners_due = False
            if self._follower_listener_delay_ms == 0 or self._core.is_leader:
                self._listeners.wake_all()
            elif self._listeners_wake_ms is None:
                # A follower's replay (~0.2 ms of CPU per batch in a metadata controller) started right
                # after it sent its next Fetch — the moment the leader needs a core to take that Fetch and
                # answer the client: on 2 cores three processes then competed for them on every lone
                # write.  Delayed, the batches committed meanwhile are replayed in one wake-up, at some
                # other moment (docs/internals/raft-performance.md, "A lone write's path", session 9).
                self._listeners_wake_ms = self._clock.monotonic_ms() + self._follower_listener_delay_ms
        if self._listeners_wake_ms is not None and (
            self._core.is_leader or self._clock.monotonic_ms() >= self._listeners_wake_ms
        ):
            self._listeners_wake_ms = None
            self._listeners.wake_all()

    def _fail_pending_appends(self) -> None:
        error = NotLeaderError(self._core.leader_and_epoch, "leadership lost before the append committed")
        for _offset, future, _appended_ms in self._pending_appends:
            if not future.done():
                future.set_exception(error)
        self._pending_appends.clear()
        self._fail_read_waiters(
            NotLeaderError(self._core.leader_and_epoch, "leadership lost before it was confirmed")
        )

    def _on_snapshot_installed(self, _snapshot_id: SnapshotId) -> None:
        self._listeners.wake_all()  # each listener sees it is behind the log start and loads the snapshot

    def _on_leader_change(self, leader: LeaderAndEpoch) -> None:
        self._built.clear()  # (a new leader keeps only what it builds in its own epoch)
        self._logger.info("leader_changed", leader=leader.leader_id, epoch=leader.epoch)
        self._metrics.current_leader.set(leader.leader_id)
        self._leader_changed.set()
        self._listeners.wake_all()
        if self._log_end_waiters:
            self._answer_log_end_waiters(self._core.high_watermark, all_of_them=True)

    def _observe_state(self) -> None:
        core = self._core
        if core.state is self._last_state:
            return
        self._last_state = core.state
        if core.state is StateKind.PROSPECTIVE and self._election_started_ms is None:
            self._election_started_ms = self._clock.monotonic_ms()
        elif core.state is StateKind.LEADER and self._election_started_ms is not None:
            elapsed_ms = self._clock.monotonic_ms() - self._election_started_ms
            self._metrics.election_latency.observe(max(0, elapsed_ms) / 1000)
        if core.state in (StateKind.LEADER, StateKind.FOLLOWER):
            self._election_started_ms = None
        self._metrics.set_state(core.state.value)
        self._metrics.current_epoch.set(core.epoch)
        self._metrics.current_vote.set(core.election.voted_id)
        self._logger.info(
            "state_changed", state=core.state.value, epoch=core.epoch, leader=core.election.leader_id
        )
        self._leader_changed.set()


def _shift(timestamp_ms: int, offset_ms: int) -> int:
    return timestamp_ms if timestamp_ms < 0 else timestamp_ms + offset_ms
