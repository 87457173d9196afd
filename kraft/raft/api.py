"""The interface the metadata layer uses to talk to Raft (Kafka's ``RaftClient``).

:class:`RaftClient` is implemented by :class:`kraft.raft.driver.RaftDriver`.  A one-voter driver with the
in-memory stores (``kraft.raft.memory``) elects itself at once and is the intended test double for code
built on top of Raft — no fakes of this interface needed.

Semantics:

- :meth:`RaftClient.append` assigns offsets immediately (group commit: an idle leader writes at once;
  appends that arrive while a flush is in flight share the next batch and its fsync, waiting at most
  ``controller.quorum.append.linger.ms``) and resolves with the last
  offset once the high watermark has passed it; it raises :class:`NotLeaderError` when this node is not
  the leader, or when leadership is lost before the records committed (they may still commit later —
  listeners are the source of truth).
- Listeners see, in log order and exactly once per registration: a snapshot (``handle_load_snapshot``)
  when they are behind the log start, then every committed batch (``handle_commit``), including control
  batches (``control=True``, no records) so offsets stay contiguous.  ``handle_leader_change`` is called
  on every leader/epoch change, after the commits of the previous epoch that this node knows about.
  Each listener is driven by its own task; a slow listener delays only itself.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from kraft.errors import ErrorCode
from kraft.raft.messages import NO_LEADER, DescribeQuorumResponse, SnapshotId


@dataclass(frozen=True, slots=True)
class LeaderAndEpoch:
    leader_id: int
    """``NO_LEADER`` (-1) while unknown."""
    epoch: int

    @property
    def has_leader(self) -> bool:
        return self.leader_id != NO_LEADER


@dataclass(frozen=True, slots=True)
class CommittedRecord:
    offset: int
    value: bytes


def offset_values(records: Sequence[CommittedRecord]) -> list[tuple[int, bytes]]:
    """``(offset, value)`` of ``records``; a log-backed sequence (:class:`kraft.raft.listeners.LazyRecords`)
    decodes them without building a :class:`CommittedRecord` per record (a follower's replay reads every
    record of every batch once: ~1 µs a record saved in the decoding)."""
    fast: Callable[[], list[tuple[int, bytes]]] | None = getattr(records, "offset_values", None)
    if fast is not None:
        return fast()
    return [(r.offset, r.value) for r in records]


@dataclass(frozen=True, slots=True)
class CommittedBatch:
    base_offset: int
    last_offset: int
    epoch: int
    records: Sequence[CommittedRecord]
    """Decoded from the log on first use: a listener that already knows them (the active controller, for
    the batches it wrote) never pays for decoding."""
    append_timestamp_ms: int
    control: bool = False
    """A Raft control batch (LeaderChange, …): ``records`` is empty, only its offsets matter."""


@dataclass(frozen=True, slots=True)
class LoadedSnapshot:
    """A frozen snapshot, fully read: every record below ``snapshot_id.end_offset``."""

    snapshot_id: SnapshotId
    last_contained_timestamp_ms: int
    records: list[bytes]


@dataclass(frozen=True, slots=True)
class CommittedSlice:
    """Committed log bytes for a MetadataFetch: whole record batches, all below ``high_watermark``."""

    records: bytes
    next_offset: int
    """Offset the reader should ask for next (equals the requested offset when nothing was read)."""
    high_watermark: int
    log_start_offset: int


@dataclass(frozen=True, slots=True)
class SnapshotChunk:
    snapshot_id: SnapshotId
    size: int
    position: int
    data: bytes


class RaftError(Exception):
    """Base of the errors this interface raises."""


class NotLeaderError(RaftError):
    """This node is not (or no longer) the leader; ``leader`` is the best current knowledge."""

    def __init__(self, leader: LeaderAndEpoch, message: str = "not the raft leader") -> None:
        super().__init__(f"{message} (leader={leader.leader_id}, epoch={leader.epoch})")
        self.leader = leader


class VoterChangeError(RaftError):
    """A voter change (AddRaftVoter / RemoveRaftVoter / UpdateRaftVoter, KIP-853) was refused: ``code``
    says why (DUPLICATE_VOTER, VOTER_NOT_FOUND, REQUEST_TIMED_OUT for "not yet, retry", ...)."""

    def __init__(self, code: ErrorCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


class RaftShutdownError(RaftError):
    """The Raft node is shutting down or stopped."""


class OffsetBelowLogStartError(RaftError):
    """The requested offset was deleted after a snapshot; load ``snapshot_id`` first."""

    def __init__(self, offset: int, log_start_offset: int, snapshot_id: SnapshotId | None) -> None:
        super().__init__(f"offset {offset} is below the log start {log_start_offset}")
        self.offset = offset
        self.log_start_offset = log_start_offset
        self.snapshot_id = snapshot_id


class SnapshotNotFoundError(RaftError):
    """No snapshot with that id (it may have been superseded and deleted)."""


class RaftListener(Protocol):
    async def handle_commit(self, batch: CommittedBatch) -> None: ...

    async def handle_load_snapshot(self, reader: LoadedSnapshot) -> None: ...

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None: ...


@runtime_checkable
class CommitNowListener(Protocol):
    """A :class:`RaftListener` that may also be handed a small committed batch synchronously, in the
    event-loop step in which a *leader*'s high watermark passes it (``kraft.raft.listeners``'s
    ``ListenerSet.deliver_now``), instead of one loop turn later by its task.  Only the leader's: commit
    answers wait on its listener (the active controller's), so each turn there is on every write's path."""

    def handle_commit_now(self, batch: CommittedBatch) -> bool:
        """Apply ``batch`` in this call, without suspending, and return True; or return False and leave
        it to :meth:`RaftListener.handle_commit` (called for the same batch later, as if this call had not
        happened: whatever it looked at, it left as ``handle_commit`` needs it).  Called only between two
        of the listener's own deliveries (never while a ``handle_commit`` of it is suspended), in offset
        order, and must not block or call back into Raft's driver (it runs inside the driver's step)."""
        ...


class SnapshotWriter(Protocol):
    """Collects the state machine's records for one snapshot; nothing is visible until :meth:`freeze`."""

    @property
    def snapshot_id(self) -> SnapshotId: ...

    def append(self, records: Sequence[bytes]) -> None: ...

    async def freeze(self) -> SnapshotId:
        """Write, fsync and publish the snapshot; afterwards the log below it may be deleted."""
        ...

    async def close(self) -> None:
        """Discard the snapshot if it was not frozen."""
        ...


class RaftClient(Protocol):
    @property
    def node_id(self) -> int: ...

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch: ...

    @property
    def high_watermark(self) -> int:
        """Offsets below this are committed (0 when nothing is known to be committed)."""
        ...

    def register_listener(self, listener: RaftListener) -> None: ...

    def unregister_listener(self, listener: RaftListener) -> None: ...

    async def yield_turn(self) -> None:
        """What a listener awaits between the steps of applying a batch: at least one event-loop turn;
        on a follower, also until Raft's own pending work (the turnaround of a Fetch response into the
        next Fetch) is done, so a long replay never delays the follower's next Fetch."""
        ...

    async def learn_log_end_commit(self) -> int:
        """On a follower whose local log holds records above the high watermark it knows: wait until it
        learns a high watermark at or above that log end (as it is now; the leader's next Fetch answer
        brings it: the records' own Fetch committed them at the leader but was answered before), or
        until the leader changes, the log is cut below it, or Raft stops.  Returns the high watermark
        then; at once on a leader, without a leader, or with nothing above the high watermark.  The
        caller bounds the wait (a graceful stop's catch-up, ``commit_replay.replay_known_commits``)."""
        ...

    @property
    def next_append_offset(self) -> int:
        """The offset :meth:`schedule_append` would give the next record now (leader: log end plus the
        records waiting for the next batch).  Raft appends control records of its own (a VotersRecord
        for a voter change), so a writer predicting its offsets must read this rather than count."""
        ...

    def schedule_append(self, records: Sequence[bytes], *, hold: bool = False) -> int:
        """Queue records for the next batch; returns the offset the last one will get.

        ``hold``: bulk records that may wait (up to the append linger bound) for later bulk records to
        share their batch, instead of being cut at the next output; any other append ends the wait.

        Raises :class:`NotLeaderError` when not the leader and ``ValueError`` for an empty sequence.
        """
        ...

    def end_hold(self) -> None:
        """Records appended with ``hold`` are waited on no longer: they are cut like any append (at
        the next output, or once the flush in flight completes).  For a writer whose bulk work ended
        without a last append (its last slice wrote nothing): the held records would otherwise wait for
        the linger bound.  A no-op when nothing is held or this node does not lead."""
        ...

    async def append(self, records: Sequence[bytes]) -> int:
        """:meth:`schedule_append` and wait until committed; returns the last record's offset."""
        ...

    def confirm_leadership(self, *, lease: bool = False) -> Awaitable[None]:
        """An awaitable (a future, in every implementation) that completes once a majority of voters
        confirmed, after this call, that this node still leads its epoch (a ReadIndex round: no clock is
        trusted); until then no newer leader can have been elected before the call.  The round is asked
        for in this call, not when the result is first awaited (issue #17: a task in between costs loop
        turns).  Raises :class:`NotLeaderError` when not the leader; the awaitable fails with it when
        leadership is lost first.  It may wait as long as a majority is out of reach: bound it with the
        caller's deadline; cancelling the future gives up the wait.

        ``lease=True``: answered at once (a completed future) while the leader's check-quorum lease holds
        — a majority of voters is provably still refusing to vote for anyone else; docs/internals/raft.md
        "Leader lease" — else by a round as above (never stale: without a lease the caller waits)."""
        ...

    def create_snapshot(
        self, end_offset: int, epoch: int, last_contained_timestamp_ms: int
    ) -> SnapshotWriter:
        """Start a snapshot of the state after applying every record below ``end_offset``.

        ``end_offset`` must be a committed batch boundary and ``epoch`` the epoch of the record at
        ``end_offset - 1``; otherwise ``ValueError``.
        """
        ...

    async def read_committed(self, offset: int, max_bytes: int) -> CommittedSlice:
        """Committed batches starting at ``offset`` (a batch boundary, as handed out by listeners).

        Raises :class:`OffsetBelowLogStartError` when ``offset`` was deleted after a snapshot.
        """
        ...

    def latest_snapshot_id(self) -> SnapshotId | None: ...

    async def read_snapshot(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> SnapshotChunk:
        """A byte range of a snapshot file; raises :class:`SnapshotNotFoundError` or ``ValueError``."""
        ...

    def describe_quorum(self) -> DescribeQuorumResponse:
        """The leader's replication view; a non-leader answers NOT_LEADER_OR_FOLLOWER in the response."""
        ...

    async def resign(self) -> None:
        """If leader: stop accepting appends and hand leadership over (EndQuorumEpoch)."""
        ...

    async def shutdown(self, timeout_ms: int) -> None:
        """Resign if leader, wait up to ``timeout_ms`` for a successor, stop every task."""
        ...
