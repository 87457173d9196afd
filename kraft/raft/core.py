"""The IO-free KRaft state machine.

:class:`RaftCore` takes inputs — a received request or response, a failed send, a tick (``poll``), a
local append, a finished flush — each with the current monotonic time, and returns an
:class:`~kraft.raft.core_output.Output` of effects plus the next deadline.  It reads no clock, does no
IO and draws randomness only from the injected :class:`~kraft.raft.quorum.Rng`, so the same code runs in
production (``kraft.raft.driver``) and in the deterministic simulation (``tests/sim``).

Layout: this module is the orchestrator and the single owner of mutable state — the election state,
the high watermark, the log metadata, in-flight requests and the Output being built.  It dispatches
inputs by message and state, picks transitions (table in :mod:`kraft.raft.state`) and applies
decisions in one place (:meth:`RaftCore._apply`, :meth:`RaftCore._become`).  The rest lives in units
that read what they are given and return decisions (:mod:`kraft.raft.core_decisions`):

- role objects that exist only while the core is in their state —
  :class:`~kraft.raft.core_election.ElectionRole` (Prospective, Candidate),
  :class:`~kraft.raft.core_leader.LeaderRole`, :class:`~kraft.raft.core_fetcher.FetcherRole` (Follower,
  leaderless observer);
- :mod:`kraft.raft.core_rules`: request validation, vote granting and the shared response rules;
- :class:`~kraft.raft.core_inflight.InflightRequests`: correlation ids and request deadlines;
- :class:`~kraft.raft.core_timers.ElectionTimer`: the core's own election timer and lost-election backoff.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import assert_never

from kraft.errors import ErrorCode
from kraft.raft.api import LeaderAndEpoch, NotLeaderError, VoterChangeError
from kraft.raft.core_decisions import (
    AdvanceHighWatermark,
    AppendToLog,
    BecomeCandidate,
    BecomeFollower,
    BecomeLeader,
    BecomeProspective,
    BecomeResigned,
    BecomeUnattached,
    ConfirmReadRound,
    Decisions,
    FetchAgain,
    ResetElectionRetries,
    ResetToSnapshot,
    Respond,
    RespondError,
    SendFetch,
    SendRequest,
    Transition,
    TruncateLog,
    WriteChunk,
)
from kraft.raft.core_election import ElectionOutcome, ElectionRole
from kraft.raft.core_fetcher import FetcherRole
from kraft.raft.core_inflight import Inflight, InflightRequests
from kraft.raft.core_leader import LeaderRole
from kraft.raft.core_log import LogInvariantError, LogMeta
from kraft.raft.core_output import InstallSnapshot, OutboundRequest, OutboundResponse, Output, TruncateTo
from kraft.raft.core_rules import (
    common_response_verdict,
    fetch_request_error,
    leader_epoch_error,
    may_grant_pre_vote,
    may_grant_vote,
    quorum_epoch_request_error,
    sender_error,
    vote_request_error,
)
from kraft.raft.core_timers import NEVER_MS, ElectionTimer
from kraft.raft.core_types import BatchScanner, RaftConfig
from kraft.raft.messages import (
    MAX_EPOCH,
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
from kraft.raft.quorum import Rng, end_quorum_backoff_ms, is_log_up_to_date
from kraft.raft.state import (
    PERSISTED_STATES,
    ElectionState,
    ImpossibleElectionStateError,
    StateKind,
    check_transition,
)
from kraft.raft.voters import Endpoint, Voter, VoterSet, VoterSetHistory


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
        if log.voters is None and not config.voters and config.bootstrap_ids:
            # A dynamic quorum's joiner (--no-initial-controllers): an observer that learns the voter
            # set from the log it fetches through a bootstrap server.
            log.voters = VoterSetHistory(VoterSet.unknown())
        elif log.voters is None:
            # No VotersRecord in the log, its snapshot or a bootstrap checkpoint: the static quorum.
            if not config.voters:
                raise ValueError(
                    "a Raft quorum needs at least one voter (controller.quorum.voters) or, for a node "
                    "that joins a dynamic quorum, bootstrap servers"
                )
            log.voters = VoterSetHistory(VoterSet.static(config.voters), static=True)
        self.log = log
        self.high_watermark = log.start_offset if log.snapshot is not None else 0
        self.now_ms = 0
        self._timer = ElectionTimer(config, rng)
        self._out = Output()
        self.lease_hit_quiet = False
        """Whether the last :meth:`confirm_leadership` answered from the lease changed nothing a driver
        must act on: no round started (no parked fetch to answer) and the next deadline did not move
        earlier (the renewal timer a first lease caller arms).  A driver then need not take an output for
        it — at 500 heartbeats a second, a driver turn (output, empty execution, a new sleep) each
        (issue #17, docs/internals/raft-performance.md "What a heartbeat costs the leader")."""
        self._persisted = election
        self._inflight = InflightRequests()
        self._election: ElectionRole | None = None
        self._leader: LeaderRole | None = None
        self._fetcher: FetcherRole | None = None
        self._last_epoch_start_offset = -1
        self._resigned_leader: tuple[int, int] | None = None
        """(leader id, epoch) of the last EndQuorumEpoch received: that leader will not come back."""
        self._last_read_round = 0
        self._vote_embargo_until_ms = 0
        """Until then (set at :meth:`start`) this node grants no (pre-)vote: before a restart it may have
        taken a response from a leader that counts it in its lease, and it forgot that (issue #17)."""
        """The last leadership-confirmation round id handed out: ids never repeat on this node, so a
        caller's round of a lost epoch cannot be mistaken for a later epoch's."""

        if not 0 <= election.epoch <= MAX_EPOCH + 1 or not 0 <= log.last_epoch <= MAX_EPOCH:
            # Only a forged or corrupt quorum-state (or log) holds such an epoch — a node itself reaches
            # at most MAX_EPOCH + 1, as a candidate nobody votes for: refuse to start with one clear
            # error instead of running a node that cannot encode its next vote request.
            raise ImpossibleElectionStateError(
                f"impossible epoch {max(election.epoch, log.last_epoch)} in the stored election state"
                f" or log (the maximum is {MAX_EPOCH})"
            )
        # Startup rules (KRaft QuorumState.initialize).
        if election.epoch < log.last_epoch:
            self.election = ElectionState(log.last_epoch)
            self.state = StateKind.UNATTACHED
        elif election.leader_id == config.node_id and self.is_voter:
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
    def voter_history(self) -> VoterSetHistory:
        return self.log.voter_history

    @property
    def voter_set(self) -> VoterSet:
        """The voter set in force: the last one in the log, committed or not (KIP-853)."""
        return self.log.voter_history.latest

    @property
    def voters(self) -> frozenset[int]:
        return frozenset(self.voter_set.ids)

    @property
    def is_voter(self) -> bool:
        """Whether this replica — node id *and* directory id — is a voter of the set in force."""
        return self.voter_set.is_voter(self.node_id, self.config.directory_id)

    @property
    def kraft_version(self) -> int:
        """0: static voters (``controller.quorum.voters``); 1: the voter set lives in the log."""
        return self.log.voter_history.kraft_version

    @property
    def epoch(self) -> int:
        return self.election.epoch

    @property
    def is_leader(self) -> bool:
        return self.state is StateKind.LEADER

    @property
    def next_append_offset(self) -> int:
        """The offset the next appended record gets: the log end plus, on a leader, the records
        accumulated for the next batch.  Control records the leader appends itself (VotersRecord, KIP-853)
        take offsets too, so a writer that predicts its offsets reads this instead of counting its own."""
        pending = len(self._leader.pending_records) if self._leader is not None else 0
        return self.log.end_offset + pending

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
        if self.voters != {self.node_id}:
            # A sole voter protects nobody's lease; anyone else may have, before this start.
            self._vote_embargo_until_ms = now_ms + self.config.vote_protection_ms
        if self.election != self._persisted and self.state in PERSISTED_STATES:
            self._persist(self.election)
        self._enter_state()
        # Nor does it campaign (vote for itself) before then.  Every start state's own timer fires
        # later anyway (election timeout >= T, fetch timeout); this keeps it so if those change.
        self._timer.not_before(self._vote_embargo_until_ms)
        return self._take_output()

    def poll(self, now_ms: int) -> Output:
        """Fire every timer that is due and cut the pending appends into a batch when they are due (no
        flush in flight, or the linger bound expired)."""
        self._advance(now_ms)
        for correlation_id, inflight in self._inflight.pop_expired(self.now_ms):
            self._on_request_failed(correlation_id, inflight)
        self._poll_state()
        return self._take_output()

    def handle_request(
        self, request_id: int, request: RaftRequest, now_ms: int, *, peer_id: int | None = None
    ) -> Output:
        """Take one inbound request; its response comes back as an :class:`OutboundResponse` with
        ``request_id`` (now, after persistence, or later for a long-poll fetch).

        ``peer_id`` is the node id the transport *authenticated* the sender as (mTLS), or None for an
        unauthenticated peer; with it, a request naming another sender is refused (never counted)."""
        self._advance(now_ms)
        sender = sender_error(request, self.config, peer_id)
        if request.cluster_id != self.config.cluster_id:
            # An empty cluster id is refused too (issue #15): every kraft node sends its own.
            message = f"cluster id {request.cluster_id!r} is not {self.config.cluster_id!r}"
            self._respond_error(request_id, request, ErrorCode.INCONSISTENT_CLUSTER_ID, message)
        elif sender is not None:
            self._respond_error(request_id, request, *sender)
        elif isinstance(request, VoteRequest):
            self._handle_vote_request(request_id, request)
        elif isinstance(request, BeginQuorumEpochRequest | EndQuorumEpochRequest):
            self._handle_quorum_epoch_request(request_id, request)
        elif isinstance(request, FetchRequest | FetchSnapshotRequest):
            self._handle_leader_request(request_id, request)
        else:
            self._respond(Respond(request_id, self.describe_quorum(self.now_ms)))
        return self._take_output()

    def handle_response(self, correlation_id: int, response: RaftResponse, now_ms: int) -> Output:
        """Take the response to one of our requests (unknown or superseded correlation ids are ignored)."""
        self._advance(now_ms)
        inflight = self._inflight.pop(correlation_id)
        if inflight is None:
            return self._take_output()
        if (
            isinstance(response, FetchSnapshotResponse)
            and response.error_code in (ErrorCode.SNAPSHOT_NOT_FOUND, ErrorCode.POSITION_OUT_OF_RANGE)
            and self._fetcher is not None
        ):
            self._fetcher.abandon_download()  # the leader moved on to a newer snapshot: start over
        verdict = common_response_verdict(
            response,
            self.epoch,
            self.node_id,
            self.election.leader_id,
            self.state,
            self.config,
            voters=self.log.voters,
        )
        if verdict.transition is not None:
            self._become(verdict.transition)
        if not verdict.usable or response.error_code is not ErrorCode.NONE:
            self._on_request_failed(correlation_id, inflight)
        elif isinstance(response, VoteResponse):
            self._handle_vote_response(inflight, response)
        elif isinstance(response, BeginQuorumEpochResponse):
            if self._leader is not None:
                self._leader.on_begin_quorum_acknowledged(inflight.dest, self.now_ms)
        elif isinstance(response, FetchResponse):
            if self._fetcher is not None:
                self._apply(
                    self._fetcher.handle_fetch_response(
                        correlation_id,
                        inflight.dest,
                        inflight.request,
                        response,
                        self.now_ms,
                        self.log,
                        self.high_watermark,
                        self.scan_batches,
                    )
                )
        elif isinstance(response, FetchSnapshotResponse) and self._fetcher is not None:
            self._apply(self._fetcher.handle_fetch_snapshot_response(correlation_id, response, self.now_ms))
        return self._take_output()

    def handle_send_failure(self, correlation_id: int, now_ms: int, *, unreachable: bool = False) -> Output:
        """A request got no response (timeout, peer unavailable).  ``unreachable``: the transport was
        refused outright (the peer's process is gone, not slow) — evidence for fast leader-death detection."""
        self._advance(now_ms)
        inflight = self._inflight.pop(correlation_id)
        if inflight is not None:
            self._on_request_failed(correlation_id, inflight, unreachable=unreachable)
        return self._take_output()

    # -- inputs a driver may feed while its log flush is in flight (issue #17, session 13)
    #
    # The driver awaits each fsync before the next input, so that nothing writes the log while it runs.
    # The inputs below, when these say yes, hand out an output with no log op and no flush, whatever
    # the core's state: a leader's Fetch (epoch checks, progress, the high watermark — which counts the
    # leader by its *flushed* end, moved by ``on_flushed`` alone —, echoes, answers, at most a
    # resignation); a leader's
    # ``take_output`` when no batch is due (it only hands out what callers decided meanwhile: answers to
    # parked fetches when a round started).  Each also needs the output being built to hold no log op
    # yet: an append that filled a batch, or a voter change, during the flush cut one into it, and the
    # next output carries it.  They are the lease's echo path: the followers' echoes and a round reaching
    # parked voters.  Only a leader's fsync has them: a follower's runs inline on its loop (nothing is
    # fed meanwhile; its echo was sent before the flush).  Taking them ahead of other queued inputs reorders
    # independent arrivals, which the network does anyway (the simulation reorders, and in its default
    # mode feeds every input while a flush is in flight).

    def _output_writes_nothing(self) -> bool:
        return not self._out.log_ops and not self._out.flush

    def takes_request_during_flush(self, request: RaftRequest) -> bool:
        """May ``request`` be handled (:meth:`handle_request`) before the flush in flight is reported?
        A leader's Fetch (not FetchSnapshot): its output has no ``log_ops`` and no ``flush``."""
        leader = self._leader
        return leader is not None and isinstance(request, FetchRequest) and self._output_writes_nothing()

    def takes_output_during_flush(self, now_ms: int) -> bool:
        """May :meth:`take_output` at ``now_ms`` run before the flush in flight is reported, and is there
        something to send?  A leader's, while no batch is due (the flush holds the pending records back
        until the linger bound) and a caller decided messages meanwhile (a round answering parked
        fetches): an append's wake-up alone waits for the flush, as before, so appends during a flush
        cost no empty output each."""
        leader = self._leader
        out = self._out
        return (
            leader is not None
            and bool(out.send_now or out.send_after_persist)
            and not leader.batch_due(max(self.now_ms, now_ms), self.log)
            and self._output_writes_nothing()
        )

    def append(self, records: Sequence[bytes], now_ms: int, *, hold: bool = False) -> int:
        """Accumulate records for the next batch (leader only); returns the offset of the last one.

        Group commit: the batch is cut at the next :meth:`take_output` / :meth:`poll` when no flush is in
        flight, else when that flush completes (the first output after :meth:`on_flushed`, which asks to
        be polled at once) or the linger bound expires; a full batch is cut at once.  ``hold`` (bulk work):
        while only held records are pending they wait for the linger bound or a full batch even with no
        flush in flight, so consecutive bulk appends share a batch; any other append ends the hold.
        Effects land in the next output (:meth:`take_output`).
        """
        self._advance(now_ms)
        if self._leader is None:
            raise NotLeaderError(self.leader_and_epoch)
        if not records:
            raise ValueError("append needs at least one record")
        last_offset, decisions = self._leader.append(
            records, self.now_ms, self.log, self.high_watermark, hold=hold
        )
        self._apply(decisions)
        return last_offset

    def end_hold(self, now_ms: int) -> None:
        """Held records (``append(hold=True)``) wait no longer: they are cut like any append, at the next
        :meth:`take_output` / :meth:`poll` with no flush in flight (the writer's bulk work ended without
        a last append).  A no-op when not leader or nothing is held."""
        self._advance(now_ms)
        if self._leader is not None:
            self._leader.end_hold()

    def confirm_leadership(self, now_ms: int, *, lease: bool = False) -> int:
        """Ask for this leader's leadership to be confirmed (ReadIndex, Raft dissertation §6.4): returns
        the id of the round that answers it, one no voter can have echoed before this call.  Its confirmation
        arrives as ``Output.confirmed_read_round`` >= that id once a majority of voters (this leader
        included) fetched at this epoch echoing it — proof that no newer leader was elected before the
        call.  Losing leadership first ends every round unconfirmed (``Output.lost_leadership``).
        A caller joins the latest round while no response carried it yet, else starts the next one at
        once (rounds overlap; an echo of a round confirms every earlier one).  Effects (answers to the
        parked fetches of voters, or a confirmation at once for a sole voter) land in the next output
        (:meth:`take_output`).  Raises :class:`NotLeaderError` unless leader.

        ``lease``: a caller that may be answered from the check-quorum leader lease gets 0 — confirmed
        now, no round — while it holds (a majority of voters echoed a round started less than
        ``config.lease_ms`` ago: docs/internals/raft.md "Leader lease"); a round then starts in the
        background once a quarter of the lease is spent, so the lease is kept.  Without a lease it gets
        a round like any caller: a leader never answers stale, it waits."""
        self._advance(now_ms)
        leader = self._leader
        if leader is None:
            raise NotLeaderError(self.leader_and_epoch)
        renewal_before = NEVER_MS
        if lease:
            # The renewal timer only moves earlier when the lease was not in use (or not long enough to
            # reach it) before this caller: read it before and, only then, after (below).
            renewal_before = leader.lease_renewal_due_ms(self.now_ms)
            leader.note_lease_caller(self.now_ms)
        if lease and leader.lease_holds(self.now_ms):
            started = leader.read_round_started
            if leader.lease_wants_renewal(self.now_ms):
                self._apply(leader.request_read_round(self.log, self.high_watermark, self.now_ms)[1])
            self.lease_hit_quiet = leader.read_round_started == started and (
                renewal_before != NEVER_MS or leader.lease_renewal_due_ms(self.now_ms) == NEVER_MS
            )
            return 0
        read_round, decisions = leader.request_read_round(self.log, self.high_watermark, self.now_ms)
        self._apply(decisions)
        return read_round

    def leader_lease_ages_ms(self, now_ms: int) -> tuple[int, dict[int, int]]:
        """A leader's :meth:`LeaderRole.lease_ages_ms` at ``now_ms`` ((-1, {}) unless leader); reads only."""
        return self._leader.lease_ages_ms(max(self.now_ms, now_ms)) if self._leader is not None else (-1, {})

    def take_lease_echo_ages_ms(self) -> list[int]:
        """The ages of the lease bases renewed since the last call (``LeaderRole.echo_basis_ages_ms``;
        empty unless leader), oldest first; a read for metrics, no state the core decides by."""
        leader = self._leader
        if leader is None or not leader.echo_basis_ages_ms:
            return []
        ages = list(leader.echo_basis_ages_ms)
        leader.echo_basis_ages_ms.clear()
        return ages

    def leader_lease_expiry_ms(self) -> int:
        """When this leader's lease ends on its clock (-1: none; never while not leader)."""
        return self._leader.lease_expiry_ms() if self._leader is not None else -1

    def take_output(self, now_ms: int) -> Output:
        """Effects produced by :meth:`append` (the pending batch when it is due) with a fresh deadline."""
        self._advance(now_ms)
        if self._leader is not None:
            self._apply(self._leader.cut_if_due(self.now_ms, self.log, self.high_watermark))
        return self._take_output()

    def on_flushed(self, end_offset: int, now_ms: int) -> Output:
        """The log is durable up to ``end_offset``.  Appends held while the flush ran are not cut here:
        the output asks to be polled at once, and that poll (or the next :meth:`take_output`) cuts them."""
        self._advance(now_ms)
        self.log.mark_flushed(end_offset)
        if self._leader is not None:
            self._apply(self._leader.maybe_advance_high_watermark(self.log, self.high_watermark)[0])
        elif self._fetcher is not None:
            self._apply(self._fetcher.next_fetch(self.now_ms, self.log, self.high_watermark))
        return self._take_output()

    def resign(self, now_ms: int) -> Output:
        """Graceful resignation: a leader stops accepting appends and sends EndQuorumEpoch."""
        self._advance(now_ms)
        if self.state is StateKind.LEADER:
            self._become(BecomeResigned())
        return self._take_output()

    # ------------------------------------------------------------------ voter changes (KIP-853)

    def add_voter(self, voter: Voter, now_ms: int) -> int:
        """Leader: append a VotersRecord adding ``voter``; returns its offset (the change is done when
        the high watermark passes it).  Effects land in the next :meth:`take_output`.  Raises
        :class:`NotLeaderError` or :class:`VoterChangeError` (see :meth:`_check_voter_change`)."""
        self._advance(now_ms)
        leader = self._check_voter_change()
        if not voter.directory_id:
            raise VoterChangeError(ErrorCode.INVALID_REQUEST, "a new voter needs its directory id")
        if voter.node_id in self.voter_set:
            raise VoterChangeError(ErrorCode.DUPLICATE_VOTER, f"node {voter.node_id} is already a voter")
        if not leader.caught_up(voter.node_id, voter.directory_id, self.log, self.now_ms):
            message = (
                f"replica ({voter.node_id}, {voter.directory_id}) has not caught up with the leader's log"
                " (it must fetch as an observer first)"
            )
            raise VoterChangeError(ErrorCode.REQUEST_TIMED_OUT, message)
        return self._append_voters(leader, self.voter_set.with_voter(voter))

    def remove_voter(self, node_id: int, directory_id: str, now_ms: int) -> int:
        """Leader: append a VotersRecord without voter (``node_id``, ``directory_id``); returns its
        offset.  A leader that removes itself resigns once the change commits."""
        self._advance(now_ms)
        leader = self._check_voter_change()
        if not self.voter_set.is_voter(node_id, directory_id) or not directory_id:
            raise VoterChangeError(ErrorCode.VOTER_NOT_FOUND, f"({node_id}, {directory_id}) is not a voter")
        if len(self.voter_set) == 1:
            raise VoterChangeError(ErrorCode.INVALID_REQUEST, "cannot remove the last voter")
        return self._append_voters(leader, self.voter_set.without_voter(node_id, directory_id))

    def update_voter(
        self, node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...], now_ms: int
    ) -> int:
        """Leader: append a VotersRecord with new endpoints for an existing voter (after a move)."""
        self._advance(now_ms)
        leader = self._check_voter_change()
        voter = self.voter_set.get(node_id)
        if voter is None or voter.directory_id != directory_id or not directory_id:
            raise VoterChangeError(ErrorCode.VOTER_NOT_FOUND, f"({node_id}, {directory_id}) is not a voter")
        if voter.endpoints == endpoints:
            return self.voter_history.latest_offset
        return self._append_voters(leader, self.voter_set.with_endpoints(node_id, directory_id, endpoints))

    def _check_voter_change(self) -> LeaderRole:
        """The rules every voter change follows (KIP-853, Raft dissertation §4.1, Ongaro's single-server
        change bug): only the leader; only a dynamic quorum; the leader has committed an entry of its own
        epoch (its LeaderChange), so no change of an older leader is pending unseen; one change at a time
        (the last VotersRecord is committed)."""
        leader = self._leader
        if leader is None:
            raise NotLeaderError(self.leader_and_epoch)
        if self.voter_history.static:
            raise VoterChangeError(
                ErrorCode.UNSUPPORTED_VERSION,
                "the voter set is static (controller.quorum.voters, kraft.version 0)",
            )
        if self.high_watermark <= leader.epoch_start_offset:
            raise VoterChangeError(ErrorCode.REQUEST_TIMED_OUT, "the leader has not committed its epoch yet")
        if self.voter_history.latest_offset >= self.high_watermark:
            raise VoterChangeError(ErrorCode.REQUEST_TIMED_OUT, "another voter change is not committed yet")
        return leader

    def _append_voters(self, leader: LeaderRole, voter_set: VoterSet) -> int:
        decisions = leader.append_voters(voter_set, self.log, self.high_watermark)
        self._apply(decisions)
        return self.voter_history.latest_offset

    def on_snapshot_voters(self, snapshot_id: SnapshotId, voters: VoterSet | None, now_ms: int) -> Output:
        """The driver loaded the voter set of a snapshot it installed (``InstallSnapshot``): it is the
        base of the voter history.  Until this input the set in force before the install stays."""
        self._advance(now_ms)
        history = self.voter_history
        if voters is not None and self.log.snapshot == snapshot_id and history.base != voters:
            before = self.voter_set
            history.replace_base(voters)
            if self.voter_set != before:
                self._on_voters_changed()
        return self._take_output()

    def _on_voters_changed(self) -> None:
        """The voter set in force changed (a VotersRecord appended or truncated, a snapshot loaded)."""
        voter_set = self.voter_set
        is_voter = self.is_voter
        if self._leader is not None:
            self._apply(self._leader.update_voters(voter_set, self.now_ms))
        if self._fetcher is not None:
            self._fetcher.is_voter = is_voter
            self._fetcher.voter_ids = self._discovery_ids()
        if self.state in (StateKind.PROSPECTIVE, StateKind.CANDIDATE) and not is_voter:
            self._become(BecomeUnattached(self.epoch, self.election.voted_id))
        elif self.state is StateKind.UNATTACHED and is_voter == (self._fetcher is not None):
            # An observer that became a voter starts its election timer; a voter that became an
            # observer starts fetching.  Same state and epoch: nothing to persist.
            self._exit_state()
            self._enter_state()

    def _discovery_ids(self) -> tuple[int, ...]:
        """Whom a leaderless observer asks for the leader: the other voters in force, else (a joiner that
        knows none yet) the bootstrap servers."""
        ids = tuple(voter for voter in self.voter_set.ids if voter != self.node_id)
        return ids or self.config.bootstrap_ids

    def _removed_leader_due(self) -> bool:
        """A leader that removed itself hands over once the VotersRecord without it is committed."""
        return (
            self._leader is not None
            and not self.is_voter
            and self.voter_history.latest_offset < self.high_watermark
        )

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
        return self._leader.describe(self.now_ms, self.log, self.high_watermark)

    # ------------------------------------------------------------------ applying decisions, building Output

    def _advance(self, now_ms: int) -> None:
        self.now_ms = max(self.now_ms, now_ms)
        if self._leader is not None:
            self._leader.now_ms = self.now_ms  # responses built in this input are stamped with it

    def _take_output(self) -> Output:
        out = self._out
        self._out = Output()
        deadline = min(self._timer.deadline_ms, self._inflight.next_deadline_ms())
        for role in (self._election, self._leader, self._fetcher):
            if role is not None:
                deadline = min(deadline, role.next_deadline_ms())
        if self._leader is not None and self._leader.batch_due(self.now_ms, self.log):
            # Appends held while a flush was in flight (on_flushed): cut them at the very next poll, not
            # inside this output, so the driver first takes the events queued during the fsync (follower
            # acks advance the high watermark) and its flush port does not recurse into another fsync.
            deadline = self.now_ms
        out.next_deadline_ms = deadline
        return out

    def _apply(self, decisions: Decisions) -> None:
        """The one place where a role's decisions change state and become effects, in order."""
        out = self._out
        voters_before = self.voter_set
        for decision in decisions:
            match decision:
                case SendRequest(dest, request, after_persist):
                    self._send(dest, request, after_persist=after_persist)
                case SendFetch(dest, request, extra_timeout_ms, echo):
                    correlation_id = self._send(
                        dest, request, after_persist=False, extra_timeout_ms=extra_timeout_ms
                    )
                    if self._fetcher is not None:
                        if echo:
                            self._fetcher.on_echo_sent(correlation_id)
                        else:
                            self._fetcher.on_sent(correlation_id)
                case Respond():
                    self._respond(decision)
                case RespondError(request_id, request, code, message):
                    self._respond_error(request_id, request, code, message)
                case AppendToLog(op, batches):
                    for batch in batches:
                        self.log.append(batch.base_offset, batch.last_offset, batch.epoch, batch.voters)
                    out.log_ops.append(op)
                    out.flush = True
                    if self.voter_set != voters_before:
                        voters_before = self.voter_set
                        self._on_voters_changed()
                case TruncateLog(end_offset):
                    self.log.truncate_to(end_offset)
                    out.log_ops.append(TruncateTo(end_offset))
                    if self.voter_set != voters_before:
                        voters_before = self.voter_set
                        self._on_voters_changed()
                case WriteChunk(op):
                    out.log_ops.append(op)
                case ResetToSnapshot(snapshot_id):
                    self.log.reset_to_snapshot(snapshot_id)
                    out.log_ops.append(InstallSnapshot(snapshot_id))
                    out.installed_snapshot = snapshot_id
                case AdvanceHighWatermark(offset):
                    if offset > self.high_watermark:  # it never goes back
                        self.high_watermark = offset
                        out.high_watermark = offset
                        if self._removed_leader_due():
                            self._become(BecomeResigned())
                case ResetElectionRetries():
                    self._timer.lost_elections = 0
                case FetchAgain():
                    if self._fetcher is not None:
                        self._apply(self._fetcher.next_fetch(self.now_ms, self.log, self.high_watermark))
                case ConfirmReadRound(read_round):
                    out.confirmed_read_round = max(out.confirmed_read_round or 0, read_round)
                case _:
                    assert_never(decision)

    def _persist(self, election: ElectionState) -> None:
        if election != self._persisted:
            self._persisted = election
            self._out.election_state = election

    def _send(
        self, dest: int, request: RaftRequest, *, after_persist: bool, extra_timeout_ms: int = 0
    ) -> int:
        """Queue a request; returns its correlation id (the response comes back through
        :meth:`handle_response`, a failure through :meth:`handle_send_failure` or the request timeout)."""
        timeout_ms = self.config.request_timeout_ms + extra_timeout_ms
        correlation_id = self._inflight.add(dest, request, self.now_ms + timeout_ms)
        message = OutboundRequest(dest, correlation_id, request, timeout_ms)
        (self._out.send_after_persist if after_persist else self._out.send_now).append(message)
        return correlation_id

    def _respond(self, decision: Respond) -> None:
        message = OutboundResponse(
            decision.request_id, decision.response, decision.read_log, decision.read_snapshot
        )
        (self._out.send_after_persist if decision.after_persist else self._out.send_now).append(message)

    def _respond_error(self, request_id: int, request: RaftRequest, code: ErrorCode, message: str) -> None:
        leader = self.leader_and_epoch.leader_id
        self._respond(Respond(request_id, error_response_for(request, code, message, leader, self.epoch)))

    # ------------------------------------------------------------------ transitions

    def _become(self, transition: Transition) -> None:
        """Apply a transition decision: the target state and its election state."""
        election = self.election
        match transition:
            case BecomeUnattached(epoch, voted_id):
                self._transition(StateKind.UNATTACHED, ElectionState(epoch, NO_LEADER, voted_id))
            case BecomeFollower(leader_id, epoch):
                voted = election.voted_id if epoch == election.epoch else NO_LEADER
                self._transition(StateKind.FOLLOWER, ElectionState(epoch, leader_id, voted))
            case BecomeProspective():
                self._transition(StateKind.PROSPECTIVE, election)
            case BecomeCandidate():
                self._transition(
                    StateKind.CANDIDATE, ElectionState(election.epoch + 1, NO_LEADER, self.node_id)
                )
            case BecomeLeader(granting_voters):
                self._transition(
                    StateKind.LEADER,
                    ElectionState(election.epoch, self.node_id, self.node_id),
                    granting_voters,
                )
            case BecomeResigned():
                self._transition(StateKind.RESIGNED, election)
            case _:
                assert_never(transition)

    def _transition(
        self, target: StateKind, election: ElectionState, granting_voters: tuple[int, ...] = ()
    ) -> None:
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
            self._out.lost_leadership = True
        after = self.leader_and_epoch
        if after != before:
            self._out.leader_change = after
        self._enter_state(old_leader, granting_voters)
        if old_leader is not None:
            # Parked long-polls answer now, with the new leader or an epoch error.
            for parked in old_leader.take_parked():
                self._handle_leader_request(parked.request_id, parked.request)

    def _exit_state(self) -> None:
        self._timer.stop()
        if self._leader is not None:
            self._last_epoch_start_offset = self._leader.epoch_start_offset
            leader = self._leader
            self._last_read_round = leader.read_round_started
        self._election = None
        self._leader = None
        self._fetcher = None
        # Responses to requests of the old state are meaningless now.
        self._inflight.clear()

    def _enter_state(
        self, old_leader: LeaderRole | None = None, granting_voters: tuple[int, ...] = ()
    ) -> None:
        now = self.now_ms
        state = self.state
        if state is StateKind.UNATTACHED:
            if not self.is_voter:
                self._fetcher = FetcherRole(
                    self.config, self.epoch, self.rng, None, is_voter=False, voter_ids=self._discovery_ids()
                )
                self._apply(self._fetcher.start(now, self.log, self.high_watermark))
            elif self.voters == {self.node_id}:
                self._timer.fire_now(now)
            else:
                self._timer.restart(now)
        elif state in (StateKind.PROSPECTIVE, StateKind.CANDIDATE):
            self._timer.restart(now)
            election = self._election = ElectionRole(
                self.config, self.epoch, pre_vote=state is StateKind.PROSPECTIVE, voter_set=self.voter_set
            )
            if election.outcome() is ElectionOutcome.WON:
                self._become(election.transition_for_win())
            else:
                self._apply(election.start(self.log))
        elif state is StateKind.LEADER:
            self._timer.lost_elections = 0
            self._leader = LeaderRole(
                self.config,
                self.epoch,
                self.log.end_offset,
                granting_voters,
                self.voter_set,
                last_read_round=self._last_read_round,
            )
            self._leader.now_ms = now
            history = self.voter_history
            # Formatted with a voter set the log does not hold yet (the bootstrap checkpoint): write it.
            unwritten = not history.static and history.latest_offset < 0 and self.log.start_offset == 0
            self._apply(self._leader.start(now, self.voter_set if unwritten else None))
        elif state is StateKind.FOLLOWER:
            fetcher = self._fetcher = FetcherRole(
                self.config,
                self.epoch,
                self.rng,
                self.election.leader_id,
                is_voter=self.is_voter,
                voter_ids=self._discovery_ids(),
            )
            resigned = self._resigned_leader == (self.election.leader_id, self.epoch)
            backoff_ms = self._timer.backoff_ms() if resigned else None
            self._apply(
                fetcher.start(now, self.log, self.high_watermark, leader_resigned_backoff_ms=backoff_ms)
            )
        else:  # RESIGNED
            # A sole voter has nobody to hand over to: re-elect itself at once (cf. KAFKA-19130).
            if self.voters == {self.node_id}:
                self._timer.fire_now(now)
            else:
                self._timer.restart(now)
            successors = old_leader.preferred_successors() if old_leader is not None else ()
            for voter in sorted(self.voters - {self.node_id}):
                request = EndQuorumEpochRequest(
                    self.config.cluster_id, self.node_id, self.epoch, voter, successors
                )
                self._send(voter, request, after_persist=True)

    def _back_off_after_failed_election(self) -> None:
        """Lost a (pre-)election: fall back and wait a randomized, growing backoff."""
        self._timer.lost_elections += 1
        retained_leader = self.election.leader_id
        if self.state is StateKind.PROSPECTIVE and retained_leader not in (NO_LEADER, self.node_id):
            self._become(BecomeFollower(retained_leader, self.epoch))
        elif self.state is StateKind.PROSPECTIVE:
            self._become(BecomeUnattached(self.epoch, self.election.voted_id))
            self._timer.back_off(self.now_ms)
        elif self._election is not None:
            # A candidate that lost waits out the backoff, then goes back to pre-vote.
            self._election.concede()
            self._timer.back_off(self.now_ms)

    # ------------------------------------------------------------------ timers and failed requests

    def _poll_state(self) -> None:
        now = self.now_ms
        state = self.state
        if self._leader is not None:
            if self._leader.check_quorum_expired(now):
                self._become(BecomeResigned())
            else:
                self._apply(self._leader.poll(now, self.log, self.high_watermark))
        elif state is StateKind.FOLLOWER and self._fetcher is not None:
            if not self._fetcher.fetch_timed_out(now):
                self._apply(self._fetcher.poll(now, self.log, self.high_watermark))
            elif self.is_voter:
                self._become(BecomeProspective())
            else:
                self._become(BecomeUnattached(self.epoch))
        elif state is StateKind.UNATTACHED:
            if self._fetcher is None:
                if self._timer.expired(now):
                    self._become(BecomeProspective())
            elif self._timer.expired(now) and self.is_voter:
                self._become(BecomeProspective())  # became a voter while unattached: campaign
            else:
                if self._timer.expired(now):
                    # A non-voter never campaigns: the timer a vote it granted armed (KIP-853 lets
                    # non-voters vote) is moot.  Left armed, its past deadline would be handed out on
                    # every poll, and the driver would poll again at once, forever.
                    self._timer.stop()
                self._apply(self._fetcher.poll(now, self.log, self.high_watermark))
        elif state is StateKind.PROSPECTIVE:
            if self._timer.expired(now):
                self._back_off_after_failed_election()
            elif self._election is not None:
                self._apply(self._election.poll(now, self.log))
        elif state is StateKind.CANDIDATE:
            if self._timer.expired(now):
                self._become(BecomeProspective())
            elif self._election is not None:
                self._apply(self._election.poll(now, self.log))
        elif state is StateKind.RESIGNED and self._timer.expired(now):
            self._become(BecomeUnattached(self.epoch + 1))

    def _on_request_failed(
        self, correlation_id: int, inflight: Inflight, *, unreachable: bool = False
    ) -> None:
        retry_at = self.now_ms + self.config.retry_backoff_ms
        request = inflight.request
        if isinstance(request, FetchRequest | FetchSnapshotRequest):
            if self._fetcher is not None:
                self._fetcher.on_failed(correlation_id, retry_at, self.now_ms, unreachable=unreachable)
        elif isinstance(request, VoteRequest):
            if self._election is not None and self._election.is_for_this_election(request):
                self._election.on_failed(inflight.dest, retry_at)
        elif isinstance(request, BeginQuorumEpochRequest) and self._leader is not None:
            self._leader.on_begin_quorum_failed(inflight.dest, retry_at)

    # ------------------------------------------------------------------ requests and vote responses

    def _handle_vote_request(self, request_id: int, request: VoteRequest) -> None:
        error = vote_request_error(request, self.config, self.epoch, voters=self.log.voters)
        if error is not None:
            self._respond_error(request_id, request, *error)
            return
        if self.now_ms < self._vote_embargo_until_ms:
            # Started less than the vote protection ago: it may have protected a leader's lease before.
            # Refuse like a protecting follower: nothing adopted or persisted.
            message = f"node {self.node_id} started less than {self.config.vote_protection_ms} ms ago"
            leader = self.leader_and_epoch.leader_id
            response = VoteResponse(ErrorCode.NONE, message, leader, self.epoch, False, request.pre_vote)
            self._respond(Respond(request_id, response))
            return
        if not request.pre_vote and request.candidate_epoch > self.epoch and self._protects_live_leader():
            # KIP-996 / etcd's leader lease: while we hear from a live leader a standard vote would only
            # depose it (issue #15: one forged Vote did).  Refuse without adopting the candidate's epoch
            # or persisting anything; our older epoch in the answer tells the candidate it is a refusal.
            leader = self.leader_and_epoch.leader_id
            message = f"leader {leader} of epoch {self.epoch} is live"
            if self._leader is not None:
                self._leader.announce_to_refused_candidate(request.candidate_id, self.now_ms)
            self._respond(
                Respond(request_id, VoteResponse(ErrorCode.NONE, message, leader, self.epoch, False, False))
            )
            return
        up_to_date = is_log_up_to_date(
            request.last_offset_epoch, request.last_offset, self.log.last_epoch, self.log.end_offset
        )
        if request.pre_vote:
            protects = self._fetcher is not None and not self._fetcher.can_grant_pre_vote(self.now_ms)
            granted = up_to_date and may_grant_pre_vote(self.state, protects)
            leader = self.leader_and_epoch.leader_id
            self._respond(
                Respond(request_id, VoteResponse(ErrorCode.NONE, "", leader, self.epoch, granted, True))
            )
            return
        if request.candidate_epoch > self.epoch:
            self._become(BecomeUnattached(request.candidate_epoch))
        granted = up_to_date and may_grant_vote(self.state, self.election, request.candidate_id)
        if granted:
            if self.state is StateKind.PROSPECTIVE:
                self._become(BecomeUnattached(self.epoch, request.candidate_id))
            else:
                self.election = ElectionState(self.epoch, NO_LEADER, request.candidate_id)
                self._persist(self.election)
                self._timer.restart(self.now_ms)
        leader = self.leader_and_epoch.leader_id
        response = VoteResponse(ErrorCode.NONE, "", leader, self.epoch, granted, False)
        self._respond(Respond(request_id, response, after_persist=granted))

    def _protects_live_leader(self) -> bool:
        """Whether a live leader exists that a standard vote at a higher epoch would depose: we lead and
        check-quorum holds (a majority fetched within its window), or we follow a leader we fetched from
        in this follower state that has not resigned (EndQuorumEpoch: the graceful handover) and whose
        fetches are not being refused — the same test that refuses pre-votes (KIP-996)."""
        if self._leader is not None:
            return self._leader.has_other_voters() and not self._leader.check_quorum_expired(self.now_ms)
        fetcher = self._fetcher
        return (
            self.state is StateKind.FOLLOWER
            and fetcher is not None
            and not fetcher.can_grant_pre_vote(self.now_ms)
            and not fetcher.fetch_timed_out(self.now_ms)
        )

    def _handle_vote_response(self, inflight: Inflight, response: VoteResponse) -> None:
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
            self._become(election.transition_for_win())
        elif outcome is ElectionOutcome.LOST and not election.lost:
            self._back_off_after_failed_election()

    def _handle_quorum_epoch_request(
        self, request_id: int, request: BeginQuorumEpochRequest | EndQuorumEpochRequest
    ) -> None:
        error = quorum_epoch_request_error(request, self.config, self.epoch, voters=self.log.voters)
        if error is not None:
            self._respond_error(request_id, request, *error)
            return
        if isinstance(request, BeginQuorumEpochRequest):
            leaderless = self.state in (StateKind.UNATTACHED, StateKind.PROSPECTIVE, StateKind.CANDIDATE)
            if request.leader_epoch > self.epoch or leaderless:
                self._become(BecomeFollower(request.leader_id, request.leader_epoch))
            elif self.election.leader_id != request.leader_id:
                message = "another leader already holds this epoch"
                self._respond_error(request_id, request, ErrorCode.INVALID_REQUEST, message)
                return
            response: RaftResponse = BeginQuorumEpochResponse(
                ErrorCode.NONE, "", self.leader_and_epoch.leader_id, self.epoch
            )
        else:
            if request.leader_epoch > self.epoch:
                self._become(BecomeFollower(request.leader_id, request.leader_epoch))
            backoff_ms = end_quorum_backoff_ms(
                self.node_id, request.preferred_successors, self.config.election_backoff_max_ms
            )
            self._resigned_leader = (request.leader_id, request.leader_epoch)
            if self._fetcher is not None and self.election.leader_id == request.leader_id:
                self._fetcher.on_leader_resigned(backoff_ms, self.now_ms)
            elif self.state is StateKind.UNATTACHED and self.is_voter:
                self._timer.fire_by(self.now_ms + backoff_ms)
            response = EndQuorumEpochResponse(ErrorCode.NONE, "", self.leader_and_epoch.leader_id, self.epoch)
        self._respond(Respond(request_id, response, after_persist=True))

    def _handle_leader_request(self, request_id: int, request: FetchRequest | FetchSnapshotRequest) -> None:
        """Fetch and FetchSnapshot: validated here, answered by the leader role."""
        leader = self._leader
        error = fetch_request_error(request) or leader_epoch_error(
            request.current_leader_epoch, self.epoch, leader is not None, self.node_id
        )
        if error is not None:
            self._respond_error(request_id, request, *error)
        elif leader is not None and isinstance(request, FetchRequest):
            self._apply(leader.handle_fetch(request_id, request, self.now_ms, self.log, self.high_watermark))
        elif leader is not None and isinstance(request, FetchSnapshotRequest):
            self._apply(leader.handle_fetch_snapshot(request_id, request, self.now_ms, self.log))


__all__ = ["RaftConfig", "RaftCore"]
