"""The IO-free KRaft state machine.

:class:`RaftCore` takes inputs — a received request or response, a failed send, a tick (``poll``), a
local append, a finished flush — each with the current monotonic time, and returns an
:class:`~kraft.raft.core_output.Output` of effects plus the next deadline.  It reads no clock, does no
IO and draws randomness only from the injected :class:`~kraft.raft.quorum.Rng`, so the same code runs in
production (``kraft.raft.driver``) and in the deterministic simulation (``tests/sim``).

Layout: this module owns the election state, transitions (table in :mod:`kraft.raft.state`), request
dispatch and KRaft's shared response rules; per-state behaviour lives in role objects that exist only
while the core is in that state — :class:`~kraft.raft.core_election.ElectionRole` (Prospective,
Candidate), :class:`~kraft.raft.core_leader.LeaderRole`, :class:`~kraft.raft.core_fetcher.FetcherRole`
(Follower, leaderless observer).  Roles emit effects through the core's ``send`` / ``respond`` / ``out``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from kraft.errors import ErrorCode
from kraft.raft.api import LeaderAndEpoch, NotLeaderError
from kraft.raft.core_election import ElectionOutcome, ElectionRole
from kraft.raft.core_fetcher import FetcherRole
from kraft.raft.core_leader import NEVER_MS, LeaderRole
from kraft.raft.core_log import LogInvariantError, LogMeta
from kraft.raft.core_output import LogRead, Outbound, OutboundRequest, OutboundResponse, Output, SnapshotRead
from kraft.raft.core_types import BatchScanner, RaftConfig
from kraft.raft.messages import (
    NO_LEADER,
    BeginQuorumEpochRequest,
    BeginQuorumEpochResponse,
    DescribeQuorumResponse,
    EndQuorumEpochRequest,
    EndQuorumEpochResponse,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    RaftRequest,
    RaftResponse,
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
    random_election_timeout_ms,
)
from kraft.raft.state import PERSISTED_STATES, ElectionState, StateKind, check_transition

_REQUEST_ERRORS = frozenset(
    {
        ErrorCode.INCONSISTENT_CLUSTER_ID,
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INCONSISTENT_VOTER_SET,
        ErrorCode.UNKNOWN_SERVER_ERROR,
    }
)
"""Answers that say our request was wrong: retry after the backoff, learn nothing from them."""


@dataclass(slots=True)
class _Inflight:
    dest: int
    request: RaftRequest
    deadline_ms: int


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
        self.rng = rng
        self.scan_batches = scan_batches
        self.voters = frozenset(config.voters)
        self.majority = majority(len(config.voters))
        self.log = log
        self.high_watermark = log.start_offset if log.snapshot is not None else 0
        self.now_ms = 0
        self.out = Output()
        self.election_retries = 0
        self._persisted = election
        self._next_correlation = 1
        self._inflight: dict[int, _Inflight] = {}
        self._election_deadline_ms = NEVER_MS
        self._election: ElectionRole | None = None
        self._leader: LeaderRole | None = None
        self._fetcher: FetcherRole | None = None
        self._last_epoch_start_offset = -1
        self._granting_voters: tuple[int, ...] = ()
        self._resigned_leader: tuple[int, int] | None = None
        """(leader id, epoch) of the last EndQuorumEpoch received: that leader will not come back."""

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
        """Offset of the LeaderChange batch that opened this node's latest leadership (-1 if never)."""
        return self._leader.epoch_start_offset if self._leader is not None else self._last_epoch_start_offset

    # ------------------------------------------------------------------ inputs

    def start(self, now_ms: int) -> Output:
        """Run the entry actions of the initial state; call once before anything else."""
        self.now_ms = now_ms
        if self.election != self._persisted and self.state in PERSISTED_STATES:
            self._persist(self.election)
        self._enter_state()
        return self._take_output()

    def poll(self, now_ms: int) -> Output:
        """Fire every timer that is due and drain the append accumulator when its linger expired."""
        self._advance(now_ms)
        self._expire_inflight()
        self._poll_state()
        return self._take_output()

    def handle_request(self, request_id: int, request: RaftRequest, now_ms: int) -> Output:
        """Take one inbound request; its response comes back as an :class:`OutboundResponse` with
        ``request_id`` (now, after persistence, or later for a long-poll fetch)."""
        self._advance(now_ms)
        if request.cluster_id and request.cluster_id != self.config.cluster_id:
            self.respond_error(
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
            self.respond(request_id, self.describe_quorum(self.now_ms))
        return self._take_output()

    def handle_response(self, correlation_id: int, response: RaftResponse, now_ms: int) -> Output:
        """Take the response to one of our requests (unknown or superseded correlation ids are ignored)."""
        self._advance(now_ms)
        inflight = self._inflight.pop(correlation_id, None)
        if inflight is None:
            return self._take_output()
        if (
            isinstance(response, FetchSnapshotResponse)
            and response.error_code in (ErrorCode.SNAPSHOT_NOT_FOUND, ErrorCode.POSITION_OUT_OF_RANGE)
            and self._fetcher is not None
        ):
            self._fetcher.abandon_download()  # the leader moved on to a newer snapshot: start over
        if self._handle_common_response(inflight, response) or response.error_code is not ErrorCode.NONE:
            self._on_request_failed(correlation_id, inflight)
        elif isinstance(response, VoteResponse):
            self._handle_vote_response(inflight, response)
        elif isinstance(response, BeginQuorumEpochResponse):
            if self._leader is not None:
                self._leader.on_begin_quorum_acknowledged(inflight.dest)
        elif isinstance(response, FetchResponse):
            if self._fetcher is not None:
                self._fetcher.handle_fetch_response(correlation_id, inflight.dest, inflight.request, response)
        elif isinstance(response, FetchSnapshotResponse) and self._fetcher is not None:
            self._fetcher.handle_fetch_snapshot_response(correlation_id, response)
        return self._take_output()

    def handle_send_failure(self, correlation_id: int, now_ms: int, *, unreachable: bool = False) -> Output:
        """A request got no response (timeout, peer unavailable).  ``unreachable``: the transport was
        refused outright (the peer's process is gone, not slow) — evidence for fast leader-death detection."""
        self._advance(now_ms)
        inflight = self._inflight.pop(correlation_id, None)
        if inflight is not None:
            self._on_request_failed(correlation_id, inflight, unreachable=unreachable)
        return self._take_output()

    def append(self, records: Sequence[bytes], now_ms: int) -> int:
        """Accumulate records for the next batch (leader only); returns the offset of the last one.

        The batch is cut when the linger expires (:meth:`poll`) or it is full; effects land in the next
        output (:meth:`take_output`).
        """
        self._advance(now_ms)
        if self._leader is None:
            raise NotLeaderError(self.leader_and_epoch)
        if not records:
            raise ValueError("append needs at least one record")
        return self._leader.append(records)

    def take_output(self, now_ms: int) -> Output:
        """Effects produced by :meth:`append` (or nothing) with a fresh deadline."""
        self._advance(now_ms)
        return self._take_output()

    def on_flushed(self, end_offset: int, now_ms: int) -> Output:
        """The log is durable up to ``end_offset``."""
        self._advance(now_ms)
        self.log.mark_flushed(end_offset)
        if self._leader is not None:
            self._leader.maybe_advance_high_watermark()
        elif self._fetcher is not None:
            self._fetcher.maybe_send_fetch()
        return self._take_output()

    def resign(self, now_ms: int) -> Output:
        """Graceful resignation: a leader stops accepting appends and sends EndQuorumEpoch."""
        self._advance(now_ms)
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
        self._advance(now_ms)
        if self.log.snapshot is None or snapshot_id.end_offset > self.log.snapshot.end_offset:
            self.log.snapshot = snapshot_id
        self.log.advance_start(min(log_start_offset, snapshot_id.end_offset))
        return self._take_output()

    def describe_quorum(self, now_ms: int) -> DescribeQuorumResponse:
        self._advance(now_ms)
        if self._leader is None:
            leader = self.leader_and_epoch
            return DescribeQuorumResponse(
                ErrorCode.NOT_LEADER_OR_FOLLOWER, "not the leader", leader.leader_id, leader.epoch
            )
        return self._leader.describe()

    # ------------------------------------------------------------------ effects (also used by roles)

    def _advance(self, now_ms: int) -> None:
        self.now_ms = max(self.now_ms, now_ms)

    def _take_output(self) -> Output:
        out = self.out
        self.out = Output()
        out.next_deadline_ms = self._next_deadline_ms()
        return out

    def _next_deadline_ms(self) -> int:
        deadline = self._election_deadline_ms
        for role in (self._election, self._leader, self._fetcher):
            if role is not None:
                deadline = min(deadline, role.next_deadline_ms())
        for inflight in self._inflight.values():
            deadline = min(deadline, inflight.deadline_ms)
        return deadline

    def _persist(self, election: ElectionState) -> None:
        if election != self._persisted:
            self._persisted = election
            self.out.election_state = election

    def send(self, dest: int, request: RaftRequest, *, after_persist: bool, extra_timeout_ms: int = 0) -> int:
        """Queue a request; returns its correlation id (the response comes back through
        :meth:`handle_response`, a failure through :meth:`handle_send_failure` or the request timeout)."""
        correlation_id = self._next_correlation
        self._next_correlation += 1
        timeout_ms = self.config.request_timeout_ms + extra_timeout_ms
        self._inflight[correlation_id] = _Inflight(dest, request, self.now_ms + timeout_ms)
        message = OutboundRequest(dest, correlation_id, request, timeout_ms)
        (self.out.send_after_persist if after_persist else self.out.send_now).append(message)
        return correlation_id

    def respond(
        self,
        request_id: int,
        response: RaftResponse,
        *,
        after_persist: bool = False,
        read_log: LogRead | None = None,
        read_snapshot: SnapshotRead | None = None,
    ) -> None:
        message: Outbound = OutboundResponse(request_id, response, read_log, read_snapshot)
        (self.out.send_after_persist if after_persist else self.out.send_now).append(message)

    def respond_error(self, request_id: int, request: RaftRequest, code: ErrorCode, message: str) -> None:
        leader = self.leader_and_epoch.leader_id
        self.respond(request_id, error_response_for(request, code, message, leader, self.epoch))

    def raise_high_watermark(self, candidate: int) -> None:
        """Follower side: adopt a higher high watermark (never lower it)."""
        if candidate > self.high_watermark:
            self.high_watermark = candidate
            self.out.high_watermark = candidate

    # ------------------------------------------------------------------ transitions

    def _transition(self, target: StateKind, election: ElectionState) -> None:
        check_transition(self.state, target, is_voter=self.is_voter)
        if election.epoch < self.election.epoch:
            raise LogInvariantError(f"epoch would go back from {self.election.epoch} to {election.epoch}")
        if election.epoch == self.election.epoch and self.election.has_voted and not election.has_voted:
            # Never forget a vote cast in this epoch.
            election = replace(election, voted_id=self.election.voted_id)
        before = self.leader_and_epoch
        old_leader = self._leader
        self._exit_state()
        self.state = target
        self.election = election
        if target in PERSISTED_STATES:
            self._persist(election)
        if old_leader is not None:
            self.out.lost_leadership = True
        after = self.leader_and_epoch
        if after != before:
            self.out.leader_change = after
        self._enter_state(old_leader)
        if old_leader is not None:
            # Parked long-polls answer now, with the new leader or an epoch error.
            for parked in old_leader.take_parked():
                self._handle_fetch_request(parked.request_id, parked.request)

    def _exit_state(self) -> None:
        self._election_deadline_ms = NEVER_MS
        if self._leader is not None:
            self._last_epoch_start_offset = self._leader.epoch_start_offset
        self._election = None
        self._leader = None
        self._fetcher = None
        # Responses to requests of the old state are meaningless now.
        self._inflight.clear()

    def _enter_state(self, old_leader: LeaderRole | None = None) -> None:
        now = self.now_ms
        state = self.state
        if state is StateKind.UNATTACHED:
            if not self.is_voter:
                self._fetcher = FetcherRole(self, None)
                self._fetcher.start()
            elif len(self.voters) == 1:
                self._election_deadline_ms = now
            else:
                self._election_deadline_ms = now + self._election_timeout_ms()
        elif state in (StateKind.PROSPECTIVE, StateKind.CANDIDATE):
            self._election_deadline_ms = now + self._election_timeout_ms()
            self._election = ElectionRole(self, pre_vote=state is StateKind.PROSPECTIVE)
            if self._election.outcome() is ElectionOutcome.WON:
                self._on_election_won(self._election)
            else:
                self._election.start()
        elif state is StateKind.LEADER:
            self.election_retries = 0
            self._leader = LeaderRole(self, self._granting_voters)
            self._leader.start()
        elif state is StateKind.FOLLOWER:
            self._fetcher = FetcherRole(self, self.election.leader_id)
            resigned = self._resigned_leader == (self.election.leader_id, self.epoch)
            self._fetcher.start(leader_resigned_backoff_ms=self._backoff_ms() if resigned else None)
        else:  # RESIGNED
            # A sole voter has nobody to hand over to: re-elect itself at once (cf. KAFKA-19130).
            self._election_deadline_ms = now if len(self.voters) == 1 else now + self._election_timeout_ms()
            successors = old_leader.preferred_successors() if old_leader is not None else ()
            for voter in sorted(self.voters - {self.node_id}):
                request = EndQuorumEpochRequest(
                    self.config.cluster_id, self.node_id, self.epoch, voter, successors
                )
                self.send(voter, request, after_persist=True)

    def _become_unattached(self, epoch: int) -> None:
        self._transition(StateKind.UNATTACHED, ElectionState(epoch))

    def _become_follower(self, leader_id: int, epoch: int) -> None:
        voted = self.election.voted_id if epoch == self.epoch else NO_LEADER
        self._transition(StateKind.FOLLOWER, ElectionState(epoch, leader_id, voted))

    def _become_prospective(self) -> None:
        self._transition(StateKind.PROSPECTIVE, self.election)

    def _become_resigned(self) -> None:
        self._transition(StateKind.RESIGNED, self.election)

    def _on_election_won(self, election: ElectionRole) -> None:
        if election.pre_vote:
            self._transition(StateKind.CANDIDATE, ElectionState(self.epoch + 1, NO_LEADER, self.node_id))
        else:
            self._granting_voters = tuple(sorted(election.granted))
            self._transition(StateKind.LEADER, ElectionState(self.epoch, self.node_id, self.node_id))

    def _back_off_after_failed_election(self) -> None:
        """Lost a (pre-)election: fall back and wait a randomized, growing backoff."""
        self.election_retries += 1
        retained_leader = self.election.leader_id
        if self.state is StateKind.PROSPECTIVE and retained_leader not in (NO_LEADER, self.node_id):
            self._become_follower(retained_leader, self.epoch)
        elif self.state is StateKind.PROSPECTIVE:
            self._transition(
                StateKind.UNATTACHED, ElectionState(self.epoch, NO_LEADER, self.election.voted_id)
            )
            self._election_deadline_ms = self.now_ms + self._backoff_ms()
        elif self._election is not None:
            # A candidate that lost waits out the backoff, then goes back to pre-vote.
            self._election.lost = True
            self._election.retry_at_ms.clear()
            self._election_deadline_ms = self.now_ms + self._backoff_ms()

    def _election_timeout_ms(self) -> int:
        return random_election_timeout_ms(self.config.election_timeout_ms, self.rng)

    def _backoff_ms(self) -> int:
        return election_backoff_ms(
            self.election_retries,
            self.config.election_backoff_base_ms,
            self.config.election_backoff_max_ms,
            self.rng,
        )

    # ------------------------------------------------------------------ timers

    def _poll_state(self) -> None:
        now = self.now_ms
        state = self.state
        if self._leader is not None:
            if self._leader.check_quorum_expired():
                self._become_resigned()
            else:
                self._leader.poll()
        elif state is StateKind.FOLLOWER and self._fetcher is not None:
            if self._fetcher.fetch_timed_out():
                if self.is_voter:
                    self._become_prospective()
                else:
                    self._transition(StateKind.UNATTACHED, ElectionState(self.epoch))
            else:
                self._fetcher.poll()
        elif state is StateKind.UNATTACHED:
            if self._fetcher is not None:
                self._fetcher.poll()
            elif now >= self._election_deadline_ms:
                self._become_prospective()
        elif state is StateKind.PROSPECTIVE:
            if now >= self._election_deadline_ms:
                self._back_off_after_failed_election()
            elif self._election is not None:
                self._election.poll()
        elif state is StateKind.CANDIDATE:
            if now >= self._election_deadline_ms:
                self._become_prospective()
            elif self._election is not None:
                self._election.poll()
        elif state is StateKind.RESIGNED and now >= self._election_deadline_ms:
            self._become_unattached(self.epoch + 1)

    def _expire_inflight(self) -> None:
        expired = [cid for cid, inflight in self._inflight.items() if inflight.deadline_ms <= self.now_ms]
        for correlation_id in expired:
            self._on_request_failed(correlation_id, self._inflight.pop(correlation_id))

    def _on_request_failed(
        self, correlation_id: int, inflight: _Inflight, *, unreachable: bool = False
    ) -> None:
        retry_at = self.now_ms + self.config.retry_backoff_ms
        request = inflight.request
        if isinstance(request, FetchRequest | FetchSnapshotRequest):
            if self._fetcher is not None:
                self._fetcher.on_failed(correlation_id, retry_at, unreachable=unreachable)
        elif isinstance(request, VoteRequest):
            if self._election is not None and self._election.is_for_this_election(request):
                self._election.on_failed(inflight.dest, retry_at)
        elif isinstance(request, BeginQuorumEpochRequest) and self._leader is not None:
            self._leader.on_begin_quorum_failed(inflight.dest, retry_at)

    # ------------------------------------------------------------------ common response rules

    def _handle_common_response(self, inflight: _Inflight, response: RaftResponse) -> bool:
        """Apply KRaft's shared response rules; True when the payload must not be processed further."""
        if response.error_code in _REQUEST_ERRORS:
            return True
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
            # Same epoch, a leader we did not know: follow it (this is how observers find the leader).
            self._become_follower(leader, epoch)
            return response.error_code is not ErrorCode.NONE or not isinstance(response, FetchResponse)
        return False

    # ------------------------------------------------------------------ Vote

    def _handle_vote_request(self, request_id: int, request: VoteRequest) -> None:
        if (
            request.candidate_id < 0
            or request.last_offset < 0
            or request.last_offset_epoch < 0
            or request.last_offset_epoch >= request.candidate_epoch
        ):
            self.respond_error(request_id, request, ErrorCode.INVALID_REQUEST, "invalid vote request")
            return
        if not self.is_voter or request.voter_id != self.node_id or request.candidate_id not in self.voters:
            self.respond_error(
                request_id, request, ErrorCode.INCONSISTENT_VOTER_SET, "candidate or receiver is not a voter"
            )
            return
        if request.candidate_epoch < self.epoch:
            self.respond_error(request_id, request, ErrorCode.FENCED_LEADER_EPOCH, "stale candidate epoch")
            return
        up_to_date = is_log_up_to_date(
            request.last_offset_epoch, request.last_offset, self.log.last_epoch, self.log.end_offset
        )
        if request.pre_vote:
            granted = up_to_date and self._can_grant_pre_vote()
            leader = self.leader_and_epoch.leader_id
            self.respond(request_id, VoteResponse(ErrorCode.NONE, "", leader, self.epoch, granted, True))
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
                self._election_deadline_ms = self.now_ms + self._election_timeout_ms()
        leader = self.leader_and_epoch.leader_id
        response = VoteResponse(ErrorCode.NONE, "", leader, self.epoch, granted, False)
        self.respond(request_id, response, after_persist=granted)

    def _can_grant_pre_vote(self) -> bool:
        if self.state is StateKind.LEADER:
            return False
        if self.state is StateKind.FOLLOWER and self._fetcher is not None:
            return self._fetcher.can_grant_pre_vote()
        return True

    def _handle_vote_response(self, inflight: _Inflight, response: VoteResponse) -> None:
        election = self._election
        request = inflight.request
        if (
            election is None
            or not isinstance(request, VoteRequest)
            or not election.is_for_this_election(request)
        ):
            return
        outcome = election.tally(inflight.dest, response)
        if outcome is ElectionOutcome.WON:
            self._on_election_won(election)
        elif outcome is ElectionOutcome.LOST and not election.lost:
            self._back_off_after_failed_election()

    # ------------------------------------------------------------------ Begin/EndQuorumEpoch

    def _handle_begin_quorum_request(self, request_id: int, request: BeginQuorumEpochRequest) -> None:
        if request.voter_id != self.node_id or request.leader_id not in self.voters:
            self.respond_error(
                request_id, request, ErrorCode.INCONSISTENT_VOTER_SET, "leader or receiver is not a voter"
            )
            return
        if request.leader_epoch < self.epoch:
            self.respond_error(request_id, request, ErrorCode.FENCED_LEADER_EPOCH, "stale leader epoch")
            return
        if request.leader_epoch > self.epoch or (
            self.state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE, StateKind.CANDIDATE)
        ):
            self._become_follower(request.leader_id, request.leader_epoch)
        elif self.election.leader_id != request.leader_id:
            self.respond_error(
                request_id, request, ErrorCode.INVALID_REQUEST, "another leader already holds this epoch"
            )
            return
        leader = self.leader_and_epoch.leader_id
        response = BeginQuorumEpochResponse(ErrorCode.NONE, "", leader, self.epoch)
        self.respond(request_id, response, after_persist=True)

    def _handle_end_quorum_request(self, request_id: int, request: EndQuorumEpochRequest) -> None:
        if request.voter_id != self.node_id or request.leader_id not in self.voters:
            self.respond_error(
                request_id, request, ErrorCode.INCONSISTENT_VOTER_SET, "leader or receiver is not a voter"
            )
            return
        if request.leader_epoch < self.epoch:
            self.respond_error(request_id, request, ErrorCode.FENCED_LEADER_EPOCH, "stale leader epoch")
            return
        if request.leader_epoch > self.epoch:
            self._become_follower(request.leader_id, request.leader_epoch)
        backoff_ms = end_quorum_backoff_ms(
            self.node_id, request.preferred_successors, self.config.election_backoff_max_ms
        )
        self._resigned_leader = (request.leader_id, request.leader_epoch)
        if self._fetcher is not None and self.election.leader_id == request.leader_id:
            self._fetcher.on_leader_resigned(backoff_ms)
        elif self.state is StateKind.UNATTACHED and self.is_voter:
            self._election_deadline_ms = min(self._election_deadline_ms, self.now_ms + backoff_ms)
        leader = self.leader_and_epoch.leader_id
        response = EndQuorumEpochResponse(ErrorCode.NONE, "", leader, self.epoch)
        self.respond(request_id, response, after_persist=True)

    # ------------------------------------------------------------------ leader-only requests

    def _leader_for(self, request_id: int, request: RaftRequest, epoch: int) -> LeaderRole | None:
        """The leader role if ``epoch`` is ours and we lead it; otherwise answer with KRaft's error."""
        if epoch < self.epoch:
            code, message = ErrorCode.FENCED_LEADER_EPOCH, f"epoch {epoch} is older than {self.epoch}"
        elif epoch > self.epoch:
            code, message = ErrorCode.UNKNOWN_LEADER_EPOCH, f"epoch {epoch} is newer than {self.epoch}"
        elif self._leader is None:
            code, message = ErrorCode.NOT_LEADER_OR_FOLLOWER, f"node {self.node_id} is not the leader"
        else:
            return self._leader
        self.respond_error(request_id, request, code, message)
        return None

    def _handle_fetch_request(self, request_id: int, request: FetchRequest) -> None:
        if (
            request.fetch_offset < 0
            or request.last_fetched_epoch < 0
            or request.current_leader_epoch < 0
            or request.last_fetched_epoch > request.current_leader_epoch
            or request.max_bytes <= 0
        ):
            self.respond_error(request_id, request, ErrorCode.INVALID_REQUEST, "invalid fetch request")
            return
        leader = self._leader_for(request_id, request, request.current_leader_epoch)
        if leader is not None:
            leader.handle_fetch(request_id, request)

    def _handle_fetch_snapshot_request(self, request_id: int, request: FetchSnapshotRequest) -> None:
        if request.position < 0 or request.max_bytes <= 0 or request.current_leader_epoch < 0:
            self.respond_error(
                request_id, request, ErrorCode.INVALID_REQUEST, "invalid fetch-snapshot request"
            )
            return
        leader = self._leader_for(request_id, request, request.current_leader_epoch)
        if leader is not None:
            leader.handle_fetch_snapshot(request_id, request)


__all__ = ["RaftConfig", "RaftCore"]
