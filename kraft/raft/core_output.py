"""What the core asks its driver to do: effects, grouped in one :class:`Output` per step.

One function performs an Output: :func:`kraft.raft.executor.execute_output`, used by the asyncio driver
and by the simulation alike.  Its order, justified in :mod:`kraft.raft.executor`:

1. ``log_ops`` in order (append / truncate / snapshot chunk / install snapshot) — buffered writes;
2. ``send_now`` — messages that depend on nothing durable (``read_log`` / ``read_snapshot`` are filled
   from the log *after* step 1);
3. ``election_state`` — write ``quorum-state`` (fsync) if set;
4. ``send_after_persist`` — messages that must not leave before step 3 (votes, vote requests,
   BeginQuorumEpoch);
5. notify: ``installed_snapshot`` (listeners reload), ``high_watermark`` (deliver committed batches,
   complete pending appends), ``lost_leadership`` (fail pending appends), ``leader_change``;
6. ``next_deadline_ms`` — when to poll the core next;
7. ``flush`` — fsync the log, then feed ``core.on_flushed(end_offset)`` and execute its Output the same way.

Notifying before this Output's flush is safe because a high watermark never depends on it: the leader
counts itself only by its flushed end, and followers report only flushed offsets.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kraft.raft.api import LeaderAndEpoch
from kraft.raft.messages import RaftRequest, RaftResponse, SnapshotId
from kraft.raft.state import ElectionState
from kraft.raft.voters import VoterSet


@dataclass(frozen=True, slots=True)
class AppendRecords:
    """Leader: build one batch of data records at ``base_offset`` stamped with ``epoch`` and append it."""

    base_offset: int
    epoch: int
    records: tuple[bytes, ...]


@dataclass(frozen=True, slots=True)
class AppendLeaderChange:
    """Leader: append the LeaderChange control batch (one record) that opens its epoch."""

    base_offset: int
    epoch: int
    leader_id: int
    voters: tuple[int, ...]
    granting_voters: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class AppendVoters:
    """Leader: append a control batch with one VotersRecord (KIP-853) that puts ``voters`` in force."""

    base_offset: int
    epoch: int
    voters: VoterSet


@dataclass(frozen=True, slots=True)
class AppendFetched:
    """Follower: append whole batches received from the leader, covering ``[base_offset, last_offset]``."""

    base_offset: int
    last_offset: int
    data: bytes


@dataclass(frozen=True, slots=True)
class TruncateTo:
    """Delete every record at or after ``end_offset`` (never below the high watermark)."""

    end_offset: int


@dataclass(frozen=True, slots=True)
class WriteSnapshotChunk:
    """Follower: write bytes of a snapshot being downloaded into its pending (``.part``) file."""

    snapshot_id: SnapshotId
    position: int
    data: bytes


@dataclass(frozen=True, slots=True)
class InstallSnapshot:
    """Follower: freeze the downloaded snapshot and replace the whole log by it (start = end = its end)."""

    snapshot_id: SnapshotId


LogOp = (
    AppendRecords
    | AppendLeaderChange
    | AppendVoters
    | AppendFetched
    | TruncateTo
    | WriteSnapshotChunk
    | InstallSnapshot
)


@dataclass(frozen=True, slots=True)
class OutboundRequest:
    dest: int
    correlation_id: int
    request: RaftRequest
    timeout_ms: int


@dataclass(frozen=True, slots=True)
class LogRead:
    """Fill ``FetchResponse.records`` with whole batches from ``offset``, up to ``max_bytes``."""

    offset: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class SnapshotRead:
    """Fill a FetchSnapshotResponse's ``size``/``position``/``unaligned_records`` from a snapshot file."""

    snapshot_id: SnapshotId
    position: int
    max_bytes: int


@dataclass(frozen=True, slots=True)
class OutboundResponse:
    request_id: int
    response: RaftResponse
    read_log: LogRead | None = None
    read_snapshot: SnapshotRead | None = None


Outbound = OutboundRequest | OutboundResponse


@dataclass(slots=True)
class Output:
    log_ops: list[LogOp] = field(default_factory=list)
    send_now: list[Outbound] = field(default_factory=list)
    election_state: ElectionState | None = None
    send_after_persist: list[Outbound] = field(default_factory=list)
    flush: bool = False
    high_watermark: int | None = None
    leader_change: LeaderAndEpoch | None = None
    lost_leadership: bool = False
    installed_snapshot: SnapshotId | None = None
    confirmed_read_round: int | None = None
    """Every leadership-confirmation round up to this one is confirmed (``RaftCore.confirm_leadership``)."""
    next_deadline_ms: int = 0

    def is_empty(self) -> bool:
        return not (
            self.log_ops
            or self.send_now
            or self.election_state is not None
            or self.send_after_persist
            or self.flush
            or self.high_watermark is not None
            or self.leader_change is not None
            or self.lost_leadership
            or self.installed_snapshot is not None
            or self.confirmed_read_round is not None
        )
