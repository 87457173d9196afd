"""The leader's half of the core: replica progress, the high watermark, long-poll fetches, the append
accumulator, check-quorum and BeginQuorumEpoch announcements.

A :class:`LeaderRole` exists only while its core is Leader (one per epoch), so nothing here needs
resetting: a new epoch starts with a fresh object.  It emits effects through its core.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from kraft.errors import ErrorCode
from kraft.raft.core_output import AppendLeaderChange, AppendRecords, LogRead, SnapshotRead
from kraft.raft.messages import (
    BeginQuorumEpochRequest,
    DescribeQuorumResponse,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    ReplicaState,
    SnapshotId,
)
from kraft.raft.quorum import majority_offset

if TYPE_CHECKING:
    from kraft.raft.core import RaftCore

NEVER_MS = 1 << 62
"""A deadline that never comes."""


@dataclass(slots=True)
class ReplicaProgress:
    end_offset: int = -1
    """The replica's last fetch offset: durable on it (followers fetch only after flushing)."""
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1


@dataclass(slots=True)
class ParkedFetch:
    request_id: int
    request: FetchRequest
    deadline_ms: int


class LeaderRole:
    def __init__(self, core: RaftCore, granting_voters: tuple[int, ...]) -> None:
        self.core = core
        config = core.config
        self.granting_voters = granting_voters
        self.epoch_start_offset = core.log.end_offset
        self.replicas = {voter: ReplicaProgress() for voter in config.voters if voter != config.node_id}
        self.check_quorum_deadline_ms = NEVER_MS
        self.check_quorum_fetchers: set[int] = set()
        self.begin_unacked = {voter for voter in config.voters if voter != config.node_id}
        self.begin_next_send_ms: dict[int, int] = {}
        self.pending_records: list[bytes] = []
        self.pending_bytes = 0
        self.linger_deadline_ms = NEVER_MS
        self.parked: dict[int, ParkedFetch] = {}

    # -- lifecycle

    def start(self) -> None:
        """Open the epoch: append the LeaderChange batch and announce it with BeginQuorumEpoch."""
        core = self.core
        if len(core.config.voters) > 1:
            self.check_quorum_deadline_ms = core.now_ms + self._check_quorum_timeout_ms()
        op = AppendLeaderChange(
            core.log.end_offset,
            core.epoch,
            core.node_id,
            tuple(sorted(core.config.voters)),
            self.granting_voters,
        )
        core.log.append(op.base_offset, op.base_offset, core.epoch)
        core.out.log_ops.append(op)
        core.out.flush = True
        for voter in sorted(self.begin_unacked):
            self._send_begin_quorum(voter)

    def next_deadline_ms(self) -> int:
        deadline = min(self.check_quorum_deadline_ms, self.linger_deadline_ms)
        for parked in self.parked.values():
            deadline = min(deadline, parked.deadline_ms)
        for voter in self.begin_unacked:
            deadline = min(deadline, self.begin_next_send_ms.get(voter, NEVER_MS))
        return deadline

    def check_quorum_expired(self) -> bool:
        return self.core.now_ms >= self.check_quorum_deadline_ms

    def poll(self) -> None:
        now = self.core.now_ms
        if self.pending_records and now >= self.linger_deadline_ms:
            self.drain_accumulator()
        for request_id, parked in list(self.parked.items()):
            if parked.deadline_ms <= now:
                del self.parked[request_id]
                self._respond_with_data(request_id, parked.request)
        for voter in sorted(self.begin_unacked):
            if self.begin_next_send_ms.get(voter, NEVER_MS) <= now:
                self._send_begin_quorum(voter)

    def take_parked(self) -> list[ParkedFetch]:
        parked = list(self.parked.values())
        self.parked.clear()
        return parked

    def preferred_successors(self) -> tuple[int, ...]:
        """Other voters by descending fetch offset (EndQuorumEpoch's order)."""
        others = [voter for voter in self.core.config.voters if voter != self.core.node_id]
        others.sort(key=lambda voter: (-self.replicas.get(voter, ReplicaProgress()).end_offset, voter))
        return tuple(others)

    # -- BeginQuorumEpoch

    def _send_begin_quorum(self, voter: int) -> None:
        core = self.core
        request = BeginQuorumEpochRequest(core.config.cluster_id, core.node_id, core.epoch, voter)
        core.send(voter, request, after_persist=True)
        self.begin_next_send_ms[voter] = core.now_ms + max(1, core.config.fetch_timeout_ms // 2)

    def on_begin_quorum_acknowledged(self, voter: int) -> None:
        self.begin_unacked.discard(voter)

    def on_begin_quorum_failed(self, voter: int, retry_at_ms: int) -> None:
        if voter in self.begin_unacked:
            self.begin_next_send_ms[voter] = retry_at_ms

    # -- appends

    def append(self, records: Sequence[bytes]) -> int:
        config = self.core.config
        if not self.pending_records:
            self.linger_deadline_ms = self.core.now_ms + config.append_linger_ms
        self.pending_records.extend(records)
        self.pending_bytes += sum(len(record) for record in records)
        last_offset = self.core.log.end_offset + len(self.pending_records) - 1
        if (
            len(self.pending_records) >= config.max_batch_records
            or self.pending_bytes >= config.max_batch_bytes
        ):
            self.drain_accumulator()
        return last_offset

    def drain_accumulator(self) -> None:
        core = self.core
        records = tuple(self.pending_records)
        self.pending_records.clear()
        self.pending_bytes = 0
        self.linger_deadline_ms = NEVER_MS
        base = core.log.end_offset
        core.log.append(base, base + len(records) - 1, core.epoch)
        core.out.log_ops.append(AppendRecords(base, core.epoch, records))
        core.out.flush = True
        self._complete_parked(data_only=True)

    # -- high watermark and check-quorum

    def maybe_advance_high_watermark(self) -> None:
        """HWM = the offset a majority of voters (the leader by its *flushed* end) reached, once it is
        past the epoch start (this epoch's LeaderChange committed); it only grows."""
        core = self.core
        offsets = [
            core.log.flushed_end if voter == core.node_id else self.replicas[voter].end_offset
            for voter in core.config.voters
        ]
        candidate = majority_offset(offsets)
        if candidate > self.epoch_start_offset and candidate > core.high_watermark:
            core.high_watermark = candidate
            core.out.high_watermark = candidate
            self._complete_parked(data_only=False)

    def _check_quorum_timeout_ms(self) -> int:
        return self.core.config.fetch_timeout_ms * 3 // 2

    def record_voter_contact(self, replica_id: int) -> None:
        core = self.core
        if replica_id not in core.voters or replica_id == core.node_id:
            return
        self.begin_unacked.discard(replica_id)
        self.check_quorum_fetchers.add(replica_id)
        if len(self.check_quorum_fetchers) + 1 >= core.majority:
            self.check_quorum_fetchers.clear()
            self.check_quorum_deadline_ms = core.now_ms + self._check_quorum_timeout_ms()

    # -- Fetch / FetchSnapshot (epoch and leadership already validated by the core)

    def handle_fetch(self, request_id: int, request: FetchRequest) -> None:
        core = self.core
        log = core.log
        self.record_voter_contact(request.replica_id)
        if request.fetch_offset < log.start_offset and log.snapshot is not None:
            core.respond(request_id, self._fetch_response(snapshot_id=log.snapshot))
            return
        end_for_epoch = log.end_offset_for_epoch(request.last_fetched_epoch)
        if end_for_epoch is None and log.snapshot is not None:
            core.respond(request_id, self._fetch_response(snapshot_id=log.snapshot))
            return
        if end_for_epoch is not None and (
            end_for_epoch.epoch != request.last_fetched_epoch
            or end_for_epoch.end_offset < request.fetch_offset
        ):
            core.respond(request_id, self._fetch_response(diverging_epoch=end_for_epoch))
            return
        self._update_progress(request.replica_id, request.fetch_offset)
        if request.fetch_offset < log.end_offset or request.max_wait_ms == 0:
            self._respond_with_data(request_id, request)
        else:
            self.parked[request_id] = ParkedFetch(request_id, request, core.now_ms + request.max_wait_ms)

    def _fetch_response(
        self, *, diverging_epoch: EpochEndOffset | None = None, snapshot_id: SnapshotId | None = None
    ) -> FetchResponse:
        core = self.core
        return FetchResponse(
            ErrorCode.NONE,
            "",
            core.node_id,
            core.epoch,
            core.high_watermark,
            core.log.start_offset,
            b"",
            diverging_epoch,
            snapshot_id,
        )

    def _respond_with_data(self, request_id: int, request: FetchRequest) -> None:
        core = self.core
        read = None
        if request.fetch_offset < core.log.end_offset:
            read = LogRead(request.fetch_offset, min(request.max_bytes, core.config.fetch_max_bytes))
        core.respond(request_id, self._fetch_response(), read_log=read)

    def _update_progress(self, replica_id: int, fetch_offset: int) -> None:
        core = self.core
        progress = self.replicas.get(replica_id)
        if progress is None:
            progress = self.replicas[replica_id] = ReplicaProgress()
        progress.end_offset = fetch_offset
        progress.last_fetch_ms = core.now_ms
        if fetch_offset >= core.log.end_offset:
            progress.last_caught_up_ms = core.now_ms
        if replica_id in core.voters:
            self.maybe_advance_high_watermark()

    def _complete_parked(self, *, data_only: bool) -> None:
        for request_id, parked in list(self.parked.items()):
            if not data_only or parked.request.fetch_offset < self.core.log.end_offset:
                del self.parked[request_id]
                self._respond_with_data(request_id, parked.request)

    def handle_fetch_snapshot(self, request_id: int, request: FetchSnapshotRequest) -> None:
        core = self.core
        self.record_voter_contact(request.replica_id)
        if core.log.snapshot != request.snapshot_id:
            core.respond_error(
                request_id, request, ErrorCode.SNAPSHOT_NOT_FOUND, f"no snapshot {request.snapshot_id}"
            )
            return
        progress = self.replicas.setdefault(request.replica_id, ReplicaProgress())
        progress.last_fetch_ms = core.now_ms
        response = FetchSnapshotResponse(
            ErrorCode.NONE, "", core.node_id, core.epoch, request.snapshot_id, 0, request.position
        )
        max_bytes = min(request.max_bytes, core.config.fetch_max_bytes)
        core.respond(
            request_id, response, read_snapshot=SnapshotRead(request.snapshot_id, request.position, max_bytes)
        )

    # -- DescribeQuorum

    def describe(self) -> DescribeQuorumResponse:
        core = self.core
        now = core.now_ms
        voters: list[ReplicaState] = []
        observers: list[ReplicaState] = []
        for replica_id in sorted(set(self.replicas) | core.voters):
            if replica_id == core.node_id:
                voters.append(ReplicaState(replica_id, core.log.end_offset, now, now))
                continue
            progress = self.replicas.get(replica_id, ReplicaProgress())
            state = ReplicaState(
                replica_id, progress.end_offset, progress.last_fetch_ms, progress.last_caught_up_ms
            )
            if replica_id in core.voters:
                voters.append(state)
            elif now - progress.last_fetch_ms <= core.config.observer_expiry_ms:
                observers.append(state)
        return DescribeQuorumResponse(
            ErrorCode.NONE, "", core.node_id, core.epoch, core.high_watermark, tuple(voters), tuple(observers)
        )
