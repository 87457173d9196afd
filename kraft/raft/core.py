"""The IO-free KRaft state machine.

:class:`RaftCore` takes inputs — a received request or response, a failed send, a tick (``poll``), a
local append, a finished flush — each with the current monotonic time, and returns an
:class:`~kraft.raft.core_output.Output` of effects plus the next deadline.  It reads no clock, does no
IO and draws randomness only from the injected :class:`~kraft.raft.quorum.Rng`, so the same code runs in
production (``kraft.raft.driver``) and in the deterministic simulation (``tests/sim``).

States and allowed transitions are in :mod:`kraft.raft.state`; log bookkeeping in
:mod:`kraft.raft.core_log`.  Names follow etcd's verb habit: ``_become_*`` switch state, ``_handle_*``
take one message, ``_maybe_*`` act only when a condition holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kraft.errors import ErrorCode
from kraft.raft.client import LeaderAndEpoch, NotLeaderError
from kraft.raft.core_log import LogInvariantError, LogMeta
from kraft.raft.core_output import (
    AppendFetched,
    AppendLeaderChange,
    AppendRecords,
    InstallSnapshot,
    LogRead,
    Outbound,
    OutboundRequest,
    OutboundResponse,
    Output,
    SnapshotRead,
    TruncateTo,
    WriteSnapshotChunk,
)
from kraft.raft.core_types import BatchScanner, RaftConfig
from kraft.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    DescribeQuorumResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    RaftRequest,
    RaftResponse,
    ReplicaState,
    SnapshotId,
    VoteRequest,
    VoteResponse,
    error_response_for,
)
from kraft.raft.quorum import (
    Rng,
    election_backoff_ms,
    end_quorum_backoff_ms,
    is_log_up_to_date,
    majority,
    majority_offset,
    random_election_timeout_ms,
)
from kraft.raft.state import PERSISTED_STATES, ElectionState, StateKind, check_transition

_NEVER = 1 << 62
"""A deadline that never comes."""


@dataclass(slots=True)
class _Inflight:
    dest: int
    request: RaftRequest
    deadline_ms: int


@dataclass(slots=True)
class _ReplicaProgress:
    end_offset: int = -1
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1


@dataclass(slots=True)
class _ParkedFetch:
    request_id: int
    request: FetchRequest
    deadline_ms: int


@dataclass(slots=True)
class _SnapshotDownload:
    snapshot_id: SnapshotId
    position: int = 0


class RaftCore:
    """One Raft node's decisions.  Every public method returns the effects it produced."""

    def __init__(
        self,
        config: RaftConfig,
        rng: Rng,
        scan_batches: BatchScanner,
        election: ElectionState,
        log: LogMeta,
    ) -> None:
        self.config = config
        self._rng = rng
        self._scan = scan_batches
        self._voters = frozenset(config.voters)
        self._majority = majority(len(config.voters))
        self.log = log
        self.high_watermark = log.start_offset if log.snapshot is not None else 0
        self._now_ms = 0
        self._out = Output()
        self._persisted = election
        self._next_correlation = 1
        self._inflight: dict[int, _Inflight] = {}
        self._retries = 0
        self._started = False
        # Timers: one per concern; _NEVER when not armed.
        self._election_deadline_ms = _NEVER
        self._fetch_deadline_ms = _NEVER
        # Prospective / Candidate.
        self._granted: set[int] = set()
        self._rejected: set[int] = set()
        self._vote_retry_ms: dict[int, int] = {}
        self._election_lost = False
        # Leader.
        self._epoch_start_offset = 0
        self._granting_voters: tuple[int, ...] = ()
        self._replicas: dict[int, _ReplicaProgress] = {}
        self._check_quorum_deadline_ms = _NEVER
        self._check_quorum_fetchers: set[int] = set()
        self._begin_unacked: set[int] = set()
        self._begin_next_send_ms: dict[int, int] = {}
        self._pending_records: list[bytes] = []
        self._pending_bytes = 0
        self._linger_deadline_ms = _NEVER
        self._parked: dict[int, _ParkedFetch] = {}
        # Follower / observer.
        self._fetch_inflight: int | None = None
        self._fetch_retry_ms = _NEVER
        self._has_fetched_from_leader = False
        self._leader_resigned = False
        self._download: _SnapshotDownload | None = None

        # Startup rules (KRaft QuorumState.initialize).
        if election.epoch < log.last_epoch:
            self.election = ElectionState(log.last_epoch)
            self.state = StateKind.UNATTACHED
        elif election.leader_id == config.node_id and config.is_voter:
            # Led this epoch before a restart: it voted for itself, so it must not vote again here.
            self.election = election
            self.state = StateKind.RESIGNED
        elif election.has_leader and election.leader_id != config.node_id:
            self.election = election
            self.state = StateKind.FOLLOWER
        else:
            self.election = ElectionState(election.epoch, NO_LEADER, election.voted_id)
            self.state = StateKind.UNATTACHED

    # ------------------------------------------------------------------ read-only views

    @property
    def node_id(self) -> int:
        return self.config.node_id

    @property
    def is_voter(self) -> bool:
        return self.config.is_voter

    @property
    def epoch(self) -> int:
        return self.election.epoch

    @property
    def is_leader(self) -> bool:
        return self.state is StateKind.LEADER

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch:
        if self.state in (StateKind.LEADER, StateKind.FOLLOWER):
            return LeaderAndEpoch(self.election.leader_id, self.election.epoch)
        return LeaderAndEpoch(NO_LEADER, self.election.epoch)

    @property
    def persisted_election(self) -> ElectionState:
        return self._persisted

    @property
    def epoch_start_offset(self) -> int:
        return self._epoch_start_offset

    # ------------------------------------------------------------------ inputs

    def start(self, now_ms: int) -> Output:
        """Run the entry actions of the initial state; call once before anything else."""
        self._now_ms = now_ms
        self._started = True
        if self.election != self._persisted and self.state in PERSISTED_STATES:
            self._persist(self.election)
        self._enter_state()
        return self._take_output()

    def poll(self, now_ms: int) -> Output:
        """Fire every timer that is due and drain the append accumulator when its linger expired."""
        self._now_ms = max(self._now_ms, now_ms)
        self._expire_inflight()
        self._poll_state()
        return self._take_output()

    def handle_request(self, request_id: int, request: RaftRequest, now_ms: int) -> Output:
        """Take one inbound request; its response comes back as an :class:`OutboundResponse` with
        ``request_id`` (now, after persistence, or later for a long-poll fetch)."""
        self._now_ms = max(self._now_ms, now_ms)
        if request.cluster_id and request.cluster_id != self.config.cluster_id:
            self._respond_error(
                request_id,
                request,
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"cluster id {request.cluster_id!r} is not {self.config.cluster_id!r}",
            )
        elif isinstance(request, VoteRequest):
            self._handle_vote_request(request_id, request)
        elif isinstance(request, BeginQuorumEpochRequest):
            self._handle_begin_quorum_request(request_id, request)
        elif isinstance(request, EndQuorumEpochRequest):
            self._handle_end_quorum_request(request_id, request)
        elif isinstance(request, FetchRequest):
            self._handle_fetch_request(request_id, request)
        elif isinstance(request, FetchSnapshotRequest):
            self._handle_fetch_snapshot_request(request_id, request)
        else:
            self._respond(request_id, self.describe_quorum(self._now_ms))
        return self._take_output()

    def handle_response(self, correlation_id: int, response: RaftResponse, now_ms: int) -> Output:
        """Take the response to one of our requests (unknown or superseded correlation ids are ignored)."""
        self._now_ms = max(self._now_ms, now_ms)
        inflight = self._inflight.pop(correlation_id, None)
        if inflight is None:
            return self._take_output()
        if isinstance(response, FetchSnapshotResponse) and response.error_code in (
            ErrorCode.SNAPSHOT_NOT_FOUND,
            ErrorCode.POSITION_OUT_OF_RANGE,
        ):
            self._download = None  # the leader moved on to a newer snapshot: ask again from scratch
        if not self._handle_common_response(correlation_id, inflight, response):
            if response.error_code is not ErrorCode.NONE:
                self._on_request_failed(correlation_id, inflight)
            elif isinstance(response, VoteResponse):
                self._handle_vote_response(inflight, response)
            elif isinstance(response, BeginQuorumEpochResponse):
                self._begin_unacked.discard(inflight.dest)
            elif isinstance(response, FetchResponse):
                self._handle_fetch_response(correlation_id, inflight, response)
            elif isinstance(response, FetchSnapshotResponse):
                self._handle_fetch_snapshot_response(correlation_id, inflight, response)
        else:
            self._on_request_failed(correlation_id, inflight)
        return self._take_output()

    def handle_send_failure(self, correlation_id: int, now_ms: int) -> Output:
        """A request got no response (timeout, peer unavailable)."""
        self._now_ms = max(self._now_ms, now_ms)
        inflight = self._inflight.pop(correlation_id, None)
        if inflight is not None:
            self._on_request_failed(correlation_id, inflight)
        return self._take_output()

    def append(self, records: Sequence[bytes], now_ms: int) -> int:
        """Accumulate records for the next batch (leader only); returns the offset of the last one.

        The batch is cut when the linger expires (:meth:`poll`) or it is full; effects land in the next
        output.
        """
        self._now_ms = max(self._now_ms, now_ms)
        if self.state is not StateKind.LEADER:
            raise NotLeaderError(self.leader_and_epoch)
        if not records:
            raise ValueError("append needs at least one record")
        if not self._pending_records:
            self._linger_deadline_ms = self._now_ms + self.config.append_linger_ms
        self._pending_records.extend(records)
        self._pending_bytes += sum(len(record) for record in records)
        last_offset = self.log.end_offset + len(self._pending_records) - 1
        if (
            len(self._pending_records) >= self.config.max_batch_records
            or self._pending_bytes >= self.config.max_batch_bytes
        ):
            self._drain_accumulator()
        return last_offset

    def take_output(self, now_ms: int) -> Output:
        """Effects produced by :meth:`append` (or nothing) with a fresh deadline."""
        self._now_ms = max(self._now_ms, now_ms)
        return self._take_output()

    def on_flushed(self, end_offset: int, now_ms: int) -> Output:
        """The log is durable up to ``end_offset``."""
        self._now_ms = max(self._now_ms, now_ms)
        self.log.mark_flushed(end_offset)
        if self.state is StateKind.LEADER:
            self._maybe_advance_high_watermark()
        elif self.state is StateKind.FOLLOWER:
            self._maybe_send_fetch()
        return self._take_output()

    def resign(self, now_ms: int) -> Output:
        """Graceful resignation: a leader stops accepting appends and sends EndQuorumEpoch."""
        self._now_ms = max(self._now_ms, now_ms)
        if self.state is StateKind.LEADER:
            self._become_resigned()
        return self._take_output()

    def validate_snapshot_id(self, end_offset: int, epoch: int) -> None:
        """Raise ``ValueError`` unless a snapshot at (``end_offset``, ``epoch``) is allowed now."""
        if end_offset > self.high_watermark:
            raise ValueError(f"snapshot end {end_offset} is beyond the high watermark {self.high_watermark}")
        if end_offset <= 0:
            raise ValueError("a snapshot must contain at least one record")
        actual = self.log.epoch_at(end_offset - 1)
        if actual is None:
            raise ValueError(f"offset {end_offset - 1} is not in the log")
        if actual != epoch:
            raise ValueError(f"the record at {end_offset - 1} has epoch {actual}, not {epoch}")

    def on_snapshot_frozen(self, snapshot_id: SnapshotId, log_start_offset: int, now_ms: int) -> Output:
        """A local snapshot was written; the driver deleted the log below ``log_start_offset``."""
        self._now_ms = max(self._now_ms, now_ms)
        if self.log.snapshot is None or snapshot_id.end_offset > self.log.snapshot.end_offset:
            self.log.snapshot = snapshot_id
        self.log.advance_start(min(log_start_offset, snapshot_id.end_offset))
        return self._take_output()

    def describe_quorum(self, now_ms: int) -> DescribeQuorumResponse:
        self._now_ms = max(self._now_ms, now_ms)
        if self.state is not StateKind.LEADER:
            leader = self.leader_and_epoch
            return DescribeQuorumResponse(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, "not the leader", leader.leader_id, leader.epoch
            )
        voters: list[ReplicaState] = []
        observers: list[ReplicaState] = []
        for replica_id in sorted(set(self._replicas) | self._voters):
            if replica_id == self.node_id:
                voters.append(ReplicaState(replica_id, self.log.end_offset, self._now_ms, self._now_ms))
                continue
            progress = self._replicas.get(replica_id, _ReplicaProgress())
            state = ReplicaState(
                replica_id, progress.end_offset, progress.last_fetch_ms, progress.last_caught_up_ms
            )
            if replica_id in self._voters:
                voters.append(state)
            elif self._now_ms - progress.last_fetch_ms <= self.config.observer_expiry_ms:
                observers.append(state)
        return DescribeQuorumResponse(
            ErrorCode.NONE,
            "",
            self.node_id,
            self.epoch,
            self.high_watermark,
            tuple(voters),
            tuple(observers),
        )

    # ------------------------------------------------------------------ output plumbing

    def _take_output(self) -> Output:
        out = self._out
        self._out = Output()
        out.next_deadline_ms = self._next_deadline_ms()
        return out

    def _next_deadline_ms(self) -> int:
        deadline = min(
            self._election_deadline_ms,
            self._fetch_deadline_ms,
            self._check_quorum_deadline_ms,
            self._linger_deadline_ms,
            self._fetch_retry_ms,
        )
        for inflight in self._inflight.values():
            deadline = min(deadline, inflight.deadline_ms)
        for parked in self._parked.values():
            deadline = min(deadline, parked.deadline_ms)
        for at_ms in self._vote_retry_ms.values():
            deadline = min(deadline, at_ms)
        for voter in self._begin_unacked:
            deadline = min(deadline, self._begin_next_send_ms.get(voter, _NEVER))
        return deadline

    def _persist(self, election: ElectionState) -> None:
        if election != self._persisted:
            self._persisted = election
            self._out.election_state = election

    def _send(
        self, dest: int, request: RaftRequest, *, after_persist: bool, extra_timeout_ms: int = 0
    ) -> int:
        correlation_id = self._next_correlation
        self._next_correlation += 1
        timeout_ms = self.config.request_timeout_ms + extra_timeout_ms
        self._inflight[correlation_id] = _Inflight(dest, request, self._now_ms + timeout_ms)
        message = OutboundRequest(dest, correlation_id, request, timeout_ms)
        (self._out.send_after_persist if after_persist else self._out.send_now).append(message)
        return correlation_id

    def _respond(
        self,
        request_id: int,
        response: RaftResponse,
        *,
        after_persist: bool = False,
        read_log: LogRead | None = None,
        read_snapshot: SnapshotRead | None = None,
    ) -> None:
        message: Outbound = OutboundResponse(request_id, response, read_log, read_snapshot)
        (self._out.send_after_persist if after_persist else self._out.send_now).append(message)

    def _respond_error(self, request_id: int, request: RaftRequest, code: ErrorCode, message: str) -> None:
        leader = self._reported_leader()
        self._respond(request_id, error_response_for(request, code, message, leader, self.epoch))

    def _reported_leader(self) -> int:
        return self.leader_and_epoch.leader_id

    # ------------------------------------------------------------------ transitions

    def _transition(self, target: StateKind, election: ElectionState) -> None:
        check_transition(self.state, target, is_voter=self.is_voter)
        if election.epoch < self.election.epoch:
            raise LogInvariantError(f"epoch would go back from {self.election.epoch} to {election.epoch}")
        if election.epoch == self.election.epoch and self.election.has_voted and not election.has_voted:
            # Never forget a vote cast in this epoch.
            election = replace(election, voted_id=self.election.voted_id)
        before = self.leader_and_epoch
        was_leader = self.state is StateKind.LEADER
        self._exit_state()
        self.state = target
        self.election = election
        if target in PERSISTED_STATES:
            self._persist(election)
        if was_leader:
            self._out.lost_leadership = True
        after = self.leader_and_epoch
        if after != before:
            self._out.leader_change = after
        self._enter_state()
        if was_leader:
            # Parked long-polls answer now, with the new leader or an epoch error.
            parked = list(self._parked.values())
            self._parked.clear()
            for fetch in parked:
                self._handle_fetch_request(fetch.request_id, fetch.request)

    def _exit_state(self) -> None:
        self._election_deadline_ms = _NEVER
        self._fetch_deadline_ms = _NEVER
        self._check_quorum_deadline_ms = _NEVER
        self._linger_deadline_ms = _NEVER
        self._fetch_retry_ms = _NEVER
        self._granted.clear()
        self._rejected.clear()
        self._vote_retry_ms.clear()
        self._election_lost = False
        self._pending_records.clear()
        self._pending_bytes = 0
        self._begin_unacked.clear()
        self._begin_next_send_ms.clear()
        self._check_quorum_fetchers.clear()
        self._fetch_inflight = None
        self._download = None
        self._has_fetched_from_leader = False
        self._leader_resigned = False
        # Responses to requests of the old state are meaningless now.
        self._inflight.clear()

    def _enter_state(self) -> None:
        now = self._now_ms
        if self.state is StateKind.UNATTACHED:
            if self.is_voter:
                if len(self._voters) == 1:
                    self._election_deadline_ms = now
                else:
                    self._election_deadline_ms = now + self._election_timeout_ms()
            else:
                self._fetch_retry_ms = now
        elif self.state is StateKind.PROSPECTIVE:
            self._granted.add(self.node_id)
            self._election_deadline_ms = now + self._election_timeout_ms()
            if not self._maybe_win_pre_vote():
                for voter in self._voters - {self.node_id}:
                    self._send_vote_request(voter, pre_vote=True)
        elif self.state is StateKind.CANDIDATE:
            self._granted.add(self.node_id)
            self._election_deadline_ms = now + self._election_timeout_ms()
            if not self._maybe_win_election():
                for voter in self._voters - {self.node_id}:
                    self._send_vote_request(voter, pre_vote=False)
        elif self.state is StateKind.LEADER:
            self._enter_leader()
        elif self.state is StateKind.FOLLOWER:
            self._fetch_deadline_ms = now + self.config.fetch_timeout_ms
            self._maybe_send_fetch()
        elif self.state is StateKind.RESIGNED:
            self._election_deadline_ms = now + self._election_timeout_ms()
            preferred = self._preferred_successors()
            for voter in self._voters - {self.node_id}:
                request = EndQuorumEpochRequest(
                    self.config.cluster_id, self.node_id, self.epoch, voter, preferred
                )
                self._send(voter, request, after_persist=True)

    def _become_unattached(self, epoch: int) -> None:
        self._transition(StateKind.UNATTACHED, ElectionState(epoch))

    def _become_follower(self, leader_id: int, epoch: int) -> None:
        voted = self.election.voted_id if epoch == self.epoch else NO_LEADER
        self._transition(StateKind.FOLLOWER, ElectionState(epoch, leader_id, voted))

    def _become_prospective(self) -> None:
        self._transition(StateKind.PROSPECTIVE, self.election)

    def _become_candidate(self) -> None:
        self._transition(StateKind.CANDIDATE, ElectionState(self.epoch + 1, NO_LEADER, self.node_id))

    def _become_leader(self) -> None:
        self._transition(StateKind.LEADER, ElectionState(self.epoch, self.node_id, self.node_id))

    def _become_resigned(self) -> None:
        self._transition(StateKind.RESIGNED, self.election)

    def _back_off_after_failed_election(self) -> None:
        """Lost a (pre-)election: fall back and wait a randomized, growing backoff."""
        self._retries += 1
        retained_leader = self.election.leader_id
        if self.state is StateKind.PROSPECTIVE and retained_leader not in (NO_LEADER, self.node_id):
            self._become_follower(retained_leader, self.epoch)
        elif self.state is StateKind.PROSPECTIVE:
            self._transition(
                StateKind.UNATTACHED, ElectionState(self.epoch, NO_LEADER, self.election.voted_id)
            )
            self._election_deadline_ms = self._now_ms + self._backoff_ms()
        else:
            # A candidate that lost waits out the backoff, then goes back to pre-vote.
            self._election_lost = True
            self._election_deadline_ms = self._now_ms + self._backoff_ms()
            self._vote_retry_ms.clear()

    def _election_timeout_ms(self) -> int:
        return random_election_timeout_ms(self.config.election_timeout_ms, self._rng)

    def _backoff_ms(self) -> int:
        return election_backoff_ms(
            self._retries,
            self.config.election_backoff_base_ms,
            self.config.election_backoff_max_ms,
            self._rng,
        )

    # ------------------------------------------------------------------ timers

    def _poll_state(self) -> None:
        now = self._now_ms
        state = self.state
        if state is StateKind.LEADER:
            if now >= self._check_quorum_deadline_ms:
                self._become_resigned()
                return
            if self._pending_records and now >= self._linger_deadline_ms:
                self._drain_accumulator()
            self._expire_parked_fetches()
            self._maybe_send_begin_quorum()
        elif state is StateKind.FOLLOWER:
            if now >= self._fetch_deadline_ms:
                if self.is_voter:
                    self._become_prospective()
                else:
                    self._transition(StateKind.UNATTACHED, ElectionState(self.epoch))
                return
            if now >= self._fetch_retry_ms:
                self._fetch_retry_ms = _NEVER
                self._maybe_send_fetch()
        elif state is StateKind.UNATTACHED:
            if self.is_voter and now >= self._election_deadline_ms:
                self._become_prospective()
            elif not self.is_voter and now >= self._fetch_retry_ms:
                self._fetch_retry_ms = _NEVER
                self._send_discovery_fetch()
        elif state is StateKind.PROSPECTIVE:
            if now >= self._election_deadline_ms:
                self._back_off_after_failed_election()
            else:
                self._resend_votes(pre_vote=True)
        elif state is StateKind.CANDIDATE:
            if now >= self._election_deadline_ms:
                self._become_prospective()
            elif not self._election_lost:
                self._resend_votes(pre_vote=False)
        elif state is StateKind.RESIGNED and now >= self._election_deadline_ms:
            self._become_unattached(self.epoch + 1)

    def _expire_inflight(self) -> None:
        expired = [cid for cid, inflight in self._inflight.items() if inflight.deadline_ms <= self._now_ms]
        for correlation_id in expired:
            inflight = self._inflight.pop(correlation_id)
            self._on_request_failed(correlation_id, inflight)

    def _on_request_failed(self, correlation_id: int, inflight: _Inflight) -> None:
        retry_at = self._now_ms + self.config.retry_backoff_ms
        request = inflight.request
        if isinstance(request, FetchRequest | FetchSnapshotRequest):
            if self._fetch_inflight == correlation_id:
                self._fetch_inflight = None
                self._fetch_retry_ms = retry_at
        elif isinstance(request, VoteRequest):
            if request.candidate_epoch == self._vote_epoch(request.pre_vote):
                self._vote_retry_ms[inflight.dest] = retry_at
        elif isinstance(request, BeginQuorumEpochRequest) and inflight.dest in self._begin_unacked:
            self._begin_next_send_ms[inflight.dest] = retry_at

    # ------------------------------------------------------------------ common response rules

    def _handle_common_response(
        self, correlation_id: int, inflight: _Inflight, response: RaftResponse
    ) -> bool:
        """Apply KRaft's shared response rules; True when the payload must not be processed further."""
        code = response.error_code
        if code in (
            ErrorCode.INCONSISTENT_CLUSTER_ID,
            ErrorCode.INVALID_REQUEST,
            ErrorCode.INCONSISTENT_VOTER_SET,
            ErrorCode.UNKNOWN_SERVER_ERROR,
        ):
            return True  # the caller retries after the backoff
        epoch = response.leader_epoch
        leader = response.leader_id
        if epoch > self.epoch:
            if leader not in (NO_LEADER, self.node_id):
                self._become_follower(leader, epoch)
            else:
                self._become_unattached(epoch)
            return True
        if epoch < self.epoch:
            # A pre-vote answer from a voter still at an older epoch counts; nothing else does.
            return not (isinstance(response, VoteResponse) and response.pre_vote)
        newly_learned = leader not in (NO_LEADER, self.node_id, self.election.leader_id)
        if newly_learned and self.state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE, StateKind.CANDIDATE):
            self._become_follower(leader, epoch)
            return code is not ErrorCode.NONE or not isinstance(response, FetchResponse)
        return False

    # ------------------------------------------------------------------ Vote

    def _vote_epoch(self, pre_vote: bool) -> int:
        if pre_vote:
            return self.epoch + 1 if self.state is StateKind.PROSPECTIVE else -1
        return self.epoch if self.state is StateKind.CANDIDATE else -1

    def _send_vote_request(self, voter: int, *, pre_vote: bool) -> None:
        request = VoteRequest(
            self.config.cluster_id,
            self.epoch + 1 if pre_vote else self.epoch,
            self.node_id,
            voter,
            self.log.last_epoch,
            self.log.end_offset,
            pre_vote,
        )
        self._vote_retry_ms.pop(voter, None)
        self._send(voter, request, after_persist=not pre_vote)

    def _resend_votes(self, *, pre_vote: bool) -> None:
        due = [voter for voter, at_ms in self._vote_retry_ms.items() if at_ms <= self._now_ms]
        for voter in due:
            if voter not in self._granted and voter not in self._rejected:
                self._send_vote_request(voter, pre_vote=pre_vote)
            else:
                self._vote_retry_ms.pop(voter, None)

    def _handle_vote_request(self, request_id: int, request: VoteRequest) -> None:
        if (
            request.candidate_id < 0
            or request.last_offset < 0
            or request.last_offset_epoch < 0
            or request.last_offset_epoch >= request.candidate_epoch
        ):
            self._respond_error(request_id, request, ErrorCode.INVALID_REQUEST, "invalid vote request")
            return
        if not self.is_voter or request.voter_id != self.node_id or request.candidate_id not in self._voters:
            self._respond_error(
                request_id, request, ErrorCode.INCONSISTENT_VOTER_SET, "candidate or receiver is not a voter"
            )
            return
        if request.candidate_epoch < self.epoch:
            self._respond_error(request_id, request, ErrorCode.FENCED_LEADER_EPOCH, "stale candidate epoch")
            return
        up_to_date = is_log_up_to_date(
            request.last_offset_epoch, request.last_offset, self.log.last_epoch, self.log.end_offset
        )
        if request.pre_vote:
            granted = up_to_date and self._can_grant_pre_vote()
            self._respond(
                request_id,
                VoteResponse(ErrorCode.NONE, "", self._reported_leader(), self.epoch, granted, True),
            )
            return
        if request.candidate_epoch > self.epoch:
            self._become_unattached(request.candidate_epoch)
        granted = (
            up_to_date
            and self.state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE)
            and not self.election.has_leader
            and self.election.voted_id in (NO_LEADER, request.candidate_id)
        )
        if granted:
            voted = ElectionState(self.epoch, NO_LEADER, request.candidate_id)
            if self.state is StateKind.PROSPECTIVE:
                self._transition(StateKind.UNATTACHED, voted)
            else:
                self.election = voted
                self._persist(voted)
                self._election_deadline_ms = self._now_ms + self._election_timeout_ms()
        self._respond(
            request_id,
            VoteResponse(ErrorCode.NONE, "", self._reported_leader(), self.epoch, granted, False),
            after_persist=granted,
        )

    def _can_grant_pre_vote(self) -> bool:
        if self.state is StateKind.LEADER:
            return False
        if self.state is StateKind.FOLLOWER:
            # KIP-996: a follower that hears from a live leader protects it from a disruptive rejoiner.
            return self._leader_resigned or not self._has_fetched_from_leader
        return True

    def _handle_vote_response(self, inflight: _Inflight, response: VoteResponse) -> None:
        request = inflight.request
        if not isinstance(request, VoteRequest) or request.candidate_epoch != self._vote_epoch(
            request.pre_vote
        ):
            return
        if response.vote_granted:
            self._granted.add(inflight.dest)
            if request.pre_vote:
                self._maybe_win_pre_vote()
            else:
                self._maybe_win_election()
            return
        self._rejected.add(inflight.dest)
        if len(self._voters) - len(self._rejected) < self._majority and not self._election_lost:
            self._back_off_after_failed_election()

    def _maybe_win_pre_vote(self) -> bool:
        if len(self._granted) >= self._majority:
            self._become_candidate()
            return True
        return False

    def _maybe_win_election(self) -> bool:
        if len(self._granted) >= self._majority:
            self._granting_voters = tuple(sorted(self._granted))
            self._become_leader()
            return True
        return False

    # ------------------------------------------------------------------ Begin/EndQuorumEpoch

    def _handle_begin_quorum_request(self, request_id: int, request: BeginQuorumEpochRequest) -> None:
        if request.voter_id != self.node_id or request.leader_id not in self._voters:
            self._respond_error(
                request_id, request, ErrorCode.INCONSISTENT_VOTER_SET, "leader or receiver is not a voter"
            )
            return
        if request.leader_epoch < self.epoch:
            self._respond_error(request_id, request, ErrorCode.FENCED_LEADER_EPOCH, "stale leader epoch")
            return
        if request.leader_epoch > self.epoch or (
            self.state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE, StateKind.CANDIDATE)
        ):
            self._become_follower(request.leader_id, request.leader_epoch)
        elif self.election.leader_id != request.leader_id:
            self._respond_error(
                request_id, request, ErrorCode.INVALID_REQUEST, "another leader already holds this epoch"
            )
            return
        self._respond(
            request_id,
            BeginQuorumEpochResponse(ErrorCode.NONE, "", self._reported_leader(), self.epoch),
            after_persist=True,
        )

    def _handle_end_quorum_request(self, request_id: int, request: EndQuorumEpochRequest) -> None:
        if request.voter_id != self.node_id or request.leader_id not in self._voters:
            self._respond_error(
                request_id, request, ErrorCode.INCONSISTENT_VOTER_SET, "leader or receiver is not a voter"
            )
            return
        if request.leader_epoch < self.epoch:
            self._respond_error(request_id, request, ErrorCode.FENCED_LEADER_EPOCH, "stale leader epoch")
            return
        if request.leader_epoch > self.epoch:
            self._become_follower(request.leader_id, request.leader_epoch)
        backoff_ms = end_quorum_backoff_ms(
            self.node_id, request.preferred_successors, self.config.election_backoff_max_ms
        )
        if self.state is StateKind.FOLLOWER and self.election.leader_id == request.leader_id:
            self._leader_resigned = True
            self._fetch_deadline_ms = min(self._fetch_deadline_ms, self._now_ms + backoff_ms)
        elif self.state is StateKind.UNATTACHED:
            self._election_deadline_ms = min(self._election_deadline_ms, self._now_ms + backoff_ms)
        self._respond(
            request_id,
            EndQuorumEpochResponse(ErrorCode.NONE, "", self._reported_leader(), self.epoch),
            after_persist=True,
        )

    def _preferred_successors(self) -> tuple[int, ...]:
        others = [voter for voter in self._voters if voter != self.node_id]
        others.sort(key=lambda voter: (-self._replicas.get(voter, _ReplicaProgress()).end_offset, voter))
        return tuple(others)

    # ------------------------------------------------------------------ Leader

    def _enter_leader(self) -> None:
        now = self._now_ms
        self._retries = 0
        self._epoch_start_offset = self.log.end_offset
        self._replicas = {voter: _ReplicaProgress() for voter in self._voters if voter != self.node_id}
        if len(self._voters) > 1:
            self._check_quorum_deadline_ms = now + self._check_quorum_timeout_ms()
        granting = self._granting_voters
        op = AppendLeaderChange(
            self.log.end_offset, self.epoch, self.node_id, tuple(sorted(self._voters)), granting
        )
        self.log.append(op.base_offset, op.base_offset, self.epoch)
        self._out.log_ops.append(op)
        self._out.flush = True
        self._begin_unacked = set(self._voters) - {self.node_id}
        for voter in self._begin_unacked:
            self._send_begin_quorum(voter)

    def _check_quorum_timeout_ms(self) -> int:
        return self.config.fetch_timeout_ms * 3 // 2

    def _send_begin_quorum(self, voter: int) -> None:
        request = BeginQuorumEpochRequest(self.config.cluster_id, self.node_id, self.epoch, voter)
        self._send(voter, request, after_persist=True)
        self._begin_next_send_ms[voter] = self._now_ms + max(1, self.config.fetch_timeout_ms // 2)

    def _maybe_send_begin_quorum(self) -> None:
        for voter in list(self._begin_unacked):
            if self._begin_next_send_ms.get(voter, _NEVER) <= self._now_ms:
                self._send_begin_quorum(voter)

    def _drain_accumulator(self) -> None:
        records = tuple(self._pending_records)
        self._pending_records.clear()
        self._pending_bytes = 0
        self._linger_deadline_ms = _NEVER
        base = self.log.end_offset
        self.log.append(base, base + len(records) - 1, self.epoch)
        self._out.log_ops.append(AppendRecords(base, self.epoch, records))
        self._out.flush = True
        self._complete_parked_fetches(data_only=True)

    def _maybe_advance_high_watermark(self) -> None:
        offsets = [
            self.log.flushed_end if voter == self.node_id else self._replicas[voter].end_offset
            for voter in self._voters
        ]
        candidate = majority_offset(offsets)
        if candidate > self._epoch_start_offset and candidate > self.high_watermark:
            self.high_watermark = candidate
            self._out.high_watermark = candidate
            self._complete_parked_fetches(data_only=False)

    def _record_voter_contact(self, replica_id: int) -> None:
        if replica_id not in self._voters or replica_id == self.node_id:
            return
        self._begin_unacked.discard(replica_id)
        self._check_quorum_fetchers.add(replica_id)
        if len(self._check_quorum_fetchers) + 1 >= self._majority:
            self._check_quorum_fetchers.clear()
            self._check_quorum_deadline_ms = self._now_ms + self._check_quorum_timeout_ms()

    def _leader_request_error(self, epoch: int) -> tuple[ErrorCode, str] | None:
        if epoch < self.epoch:
            return ErrorCode.FENCED_LEADER_EPOCH, f"epoch {epoch} is older than {self.epoch}"
        if epoch > self.epoch:
            return ErrorCode.UNKNOWN_LEADER_EPOCH, f"epoch {epoch} is newer than {self.epoch}"
        if self.state is not StateKind.LEADER:
            return ErrorCode.NOT_LEADER_OR_FOLLOWER, f"node {self.node_id} is not the leader"
        return None

    def _handle_fetch_request(self, request_id: int, request: FetchRequest) -> None:
        if (
            request.fetch_offset < 0
            or request.last_fetched_epoch < 0
            or request.current_leader_epoch < 0
            or request.last_fetched_epoch > request.current_leader_epoch
            or request.max_bytes <= 0
        ):
            self._respond_error(request_id, request, ErrorCode.INVALID_REQUEST, "invalid fetch request")
            return
        error = self._leader_request_error(request.current_leader_epoch)
        if error is not None:
            self._respond_error(request_id, request, *error)
            return
        self._record_voter_contact(request.replica_id)
        log = self.log
        if request.fetch_offset < log.start_offset and log.snapshot is not None:
            self._respond(request_id, self._fetch_response(snapshot_id=log.snapshot))
            return
        end_for_epoch = log.end_offset_for_epoch(request.last_fetched_epoch)
        if end_for_epoch is None and log.snapshot is not None:
            self._respond(request_id, self._fetch_response(snapshot_id=log.snapshot))
            return
        if end_for_epoch is not None and (
            end_for_epoch.epoch != request.last_fetched_epoch
            or end_for_epoch.end_offset < request.fetch_offset
        ):
            self._respond(request_id, self._fetch_response(diverging_epoch=end_for_epoch))
            return
        self._update_replica_progress(request.replica_id, request.fetch_offset)
        if request.fetch_offset < log.end_offset or request.max_wait_ms == 0:
            self._respond_fetch_with_data(request_id, request)
        else:
            self._parked[request_id] = _ParkedFetch(request_id, request, self._now_ms + request.max_wait_ms)

    def _fetch_response(
        self, *, diverging_epoch: EpochEndOffset | None = None, snapshot_id: SnapshotId | None = None
    ) -> FetchResponse:
        return FetchResponse(
            ErrorCode.NONE,
            "",
            self.node_id,
            self.epoch,
            self.high_watermark,
            self.log.start_offset,
            b"",
            diverging_epoch,
            snapshot_id,
        )

    def _respond_fetch_with_data(self, request_id: int, request: FetchRequest) -> None:
        read = None
        if request.fetch_offset < self.log.end_offset:
            read = LogRead(request.fetch_offset, min(request.max_bytes, self.config.fetch_max_bytes))
        self._respond(request_id, self._fetch_response(), read_log=read)

    def _update_replica_progress(self, replica_id: int, fetch_offset: int) -> None:
        progress = self._replicas.get(replica_id)
        if progress is None:
            progress = self._replicas[replica_id] = _ReplicaProgress()
        progress.end_offset = fetch_offset
        progress.last_fetch_ms = self._now_ms
        if fetch_offset >= self.log.end_offset:
            progress.last_caught_up_ms = self._now_ms
        if replica_id in self._voters:
            self._maybe_advance_high_watermark()

    def _complete_parked_fetches(self, *, data_only: bool) -> None:
        for request_id, parked in list(self._parked.items()):
            if not data_only or parked.request.fetch_offset < self.log.end_offset:
                del self._parked[request_id]
                self._respond_fetch_with_data(request_id, parked.request)

    def _expire_parked_fetches(self) -> None:
        for request_id, parked in list(self._parked.items()):
            if parked.deadline_ms <= self._now_ms:
                del self._parked[request_id]
                self._respond_fetch_with_data(request_id, parked.request)

    def _handle_fetch_snapshot_request(self, request_id: int, request: FetchSnapshotRequest) -> None:
        if request.position < 0 or request.max_bytes <= 0 or request.current_leader_epoch < 0:
            self._respond_error(
                request_id, request, ErrorCode.INVALID_REQUEST, "invalid fetch-snapshot request"
            )
            return
        error = self._leader_request_error(request.current_leader_epoch)
        if error is not None:
            self._respond_error(request_id, request, *error)
            return
        self._record_voter_contact(request.replica_id)
        if self.log.snapshot != request.snapshot_id:
            self._respond_error(
                request_id, request, ErrorCode.SNAPSHOT_NOT_FOUND, f"no snapshot {request.snapshot_id}"
            )
            return
        progress = self._replicas.setdefault(request.replica_id, _ReplicaProgress())
        progress.last_fetch_ms = self._now_ms
        response = FetchSnapshotResponse(
            ErrorCode.NONE, "", self.node_id, self.epoch, request.snapshot_id, 0, request.position
        )
        read = SnapshotRead(
            request.snapshot_id, request.position, min(request.max_bytes, self.config.fetch_max_bytes)
        )
        self._respond(request_id, response, read_snapshot=read)

    # ------------------------------------------------------------------ Follower / observer

    def _maybe_send_fetch(self) -> None:
        if self.state is not StateKind.FOLLOWER or self._fetch_inflight is not None:
            return
        if self._fetch_retry_ms != _NEVER and self._fetch_retry_ms > self._now_ms:
            return
        leader = self.election.leader_id
        if self._download is not None:
            request: RaftRequest = FetchSnapshotRequest(
                self.config.cluster_id,
                self.node_id,
                self.epoch,
                self._download.snapshot_id,
                self._download.position,
                self.config.fetch_max_bytes,
            )
            self._fetch_inflight = self._send(leader, request, after_persist=False)
            return
        if self.log.flushed_end < self.log.end_offset:
            return  # fetch the next offset only once what we have is durable (on_flushed resumes)
        request = FetchRequest(
            self.config.cluster_id,
            self.node_id,
            self.epoch,
            self.log.end_offset,
            self.log.last_epoch,
            self.config.fetch_max_wait_ms,
            self.config.fetch_max_bytes,
        )
        self._fetch_inflight = self._send(
            leader, request, after_persist=False, extra_timeout_ms=self.config.fetch_max_wait_ms
        )

    def _send_discovery_fetch(self) -> None:
        """An observer without a leader asks a random voter; the answer names the leader."""
        voters = sorted(self._voters)
        voter = voters[int(self._rng.random() * len(voters))]
        request = FetchRequest(
            self.config.cluster_id,
            self.node_id,
            self.epoch,
            self.log.end_offset,
            self.log.last_epoch,
            0,
            self.config.fetch_max_bytes,
        )
        self._fetch_inflight = self._send(voter, request, after_persist=False)

    def _note_fetch_success(self) -> None:
        self._has_fetched_from_leader = True
        self._retries = 0
        self._fetch_deadline_ms = self._now_ms + self.config.fetch_timeout_ms

    def _handle_fetch_response(
        self, correlation_id: int, inflight: _Inflight, response: FetchResponse
    ) -> None:
        if self._fetch_inflight != correlation_id:
            return
        self._fetch_inflight = None
        request = inflight.request
        if (
            self.state is not StateKind.FOLLOWER
            or inflight.dest != self.election.leader_id
            or not isinstance(request, FetchRequest)
        ):
            self._fetch_retry_ms = self._now_ms
            return
        self._note_fetch_success()
        if request.fetch_offset != self.log.end_offset:
            self._maybe_send_fetch()
            return
        if response.diverging_epoch is not None:
            diverging = response.diverging_epoch
            local = self.log.end_offset_for_epoch(diverging.epoch)
            truncate_to = (
                diverging.end_offset if local is None else min(local.end_offset, diverging.end_offset)
            )
            truncate_to = max(truncate_to, self.log.start_offset)
            if truncate_to < self.high_watermark:
                raise LogInvariantError(
                    f"leader asked node {self.node_id} to truncate to {truncate_to}, below its high "
                    f"watermark {self.high_watermark}"
                )
            self.log.truncate_to(truncate_to)
            self._out.log_ops.append(TruncateTo(truncate_to))
            self._maybe_send_fetch()
            return
        if response.snapshot_id is not None:
            self._download = _SnapshotDownload(response.snapshot_id)
            self._maybe_send_fetch()
            return
        if response.records and not self._append_fetched(response.records, response.leader_epoch):
            self._fetch_retry_ms = self._now_ms + self.config.retry_backoff_ms
            return
        self._maybe_update_follower_high_watermark(response.high_watermark)
        self._maybe_send_fetch()

    def _append_fetched(self, data: bytes, leader_epoch: int) -> bool:
        try:
            batches = self._scan(data)
        except Exception:  # corrupt bytes from the network: drop them and fetch again
            return False
        if not batches or batches[0].base_offset != self.log.end_offset:
            return False
        expected = self.log.end_offset
        last_epoch = self.log.last_epoch
        for batch in batches:
            if batch.base_offset != expected or batch.epoch < last_epoch or batch.epoch > leader_epoch:
                return False
            expected = batch.last_offset + 1
            last_epoch = batch.epoch
        for batch in batches:
            self.log.append(batch.base_offset, batch.last_offset, batch.epoch)
        self._out.log_ops.append(AppendFetched(batches[0].base_offset, batches[-1].last_offset, data))
        self._out.flush = True
        return True

    def _maybe_update_follower_high_watermark(self, leader_high_watermark: int) -> None:
        candidate = min(leader_high_watermark, self.log.end_offset)
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            self._out.high_watermark = candidate

    def _handle_fetch_snapshot_response(
        self, correlation_id: int, inflight: _Inflight, response: FetchSnapshotResponse
    ) -> None:
        if self._fetch_inflight != correlation_id:
            return
        self._fetch_inflight = None
        download = self._download
        if self.state is not StateKind.FOLLOWER or download is None:
            return
        self._note_fetch_success()
        if response.snapshot_id != download.snapshot_id or response.position != download.position:
            self._download = None
            self._maybe_send_fetch()
            return
        if response.unaligned_records:
            self._out.log_ops.append(
                WriteSnapshotChunk(download.snapshot_id, download.position, response.unaligned_records)
            )
            download.position += len(response.unaligned_records)
        if download.position >= response.size:
            self._download = None
            self.log.reset_to_snapshot(download.snapshot_id)
            self._out.log_ops.append(InstallSnapshot(download.snapshot_id))
            self._out.installed_snapshot = download.snapshot_id
            if download.snapshot_id.end_offset > self.high_watermark:
                self.high_watermark = download.snapshot_id.end_offset
                self._out.high_watermark = self.high_watermark
        elif not response.unaligned_records:
            self._download = None  # a leader that sends nothing would loop forever: start over
        self._maybe_send_fetch()


def poll_until_quiet(core: RaftCore, now_ms: int) -> list[Output]:
    """Test helper: ``poll`` until an output is empty (bounded), returning the non-empty ones."""
    outputs: list[Output] = []
    for _ in range(100):
        out = core.poll(now_ms)
        if out.is_empty():
            return outputs
        outputs.append(out)
    raise RuntimeError("core kept producing output at a fixed time")


__all__ = ["RaftConfig", "RaftCore", "poll_until_quiet"]
