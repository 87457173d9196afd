"""The leader's half of the core: replica progress, the high watermark, long-poll fetches, the append
accumulator (group commit), check-quorum and BeginQuorumEpoch announcements.

A :class:`LeaderRole` exists only while its core is Leader (one per epoch), so nothing here needs
resetting: a new epoch starts with a fresh object.  It keeps its own bookkeeping (replica progress,
parked fetches, the accumulator) and returns everything else as decisions; the log, the high watermark
and the clock are passed in, read-only.  While it leads, only its own :class:`AppendToLog` decisions
move the log's end, so where a method appends and then answers fetches it computes the new end itself.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from kraft.errors import ErrorCode
from kraft.raft.core_decisions import (
    AdvanceHighWatermark,
    AppendToLog,
    ConfirmReadRound,
    Decisions,
    Respond,
    RespondError,
    SendRequest,
)
from kraft.raft.core_log import LogMeta
from kraft.raft.core_output import AppendLeaderChange, AppendRecords, AppendVoters, LogRead, SnapshotRead
from kraft.raft.core_timers import NEVER_MS
from kraft.raft.core_types import BatchInfo, RaftConfig
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
from kraft.raft.voters import VoterSet


@dataclass(slots=True)
class ReplicaProgress:
    end_offset: int = -1
    """The replica's last fetch offset: durable on it (followers fetch only after flushing)."""
    last_fetch_ms: int = -1
    last_caught_up_ms: int = -1
    directory_id: str = ""
    """The directory id of the replica's last fetch: a voter's offset counts only under its own."""


@dataclass(slots=True)
class ParkedFetch:
    request_id: int
    request: FetchRequest
    deadline_ms: int


LEASE_ROUND_MEMORY = 1024
"""Round start times a leader keeps for its lease: far more than are ever in flight at once."""


def next_high_watermark(
    voter_end_offsets: Sequence[int], epoch_start_offset: int, high_watermark: int
) -> int | None:
    """The leader's HWM rule: the offset a majority of voters reached, once it is past the epoch start
    (this epoch's LeaderChange committed); None unless that is higher than ``high_watermark``."""
    candidate = majority_offset(voter_end_offsets)
    if candidate > epoch_start_offset and candidate > high_watermark:
        return candidate
    return None


class LeaderRole:
    def __init__(
        self,
        config: RaftConfig,
        epoch: int,
        log_end_offset: int,
        granting_voters: tuple[int, ...],
        voter_set: VoterSet | None = None,
        last_read_round: int = 0,
    ):
        """``voter_set``: the set in force (default: the static ``config.voters``); ``last_read_round``:
        the last leadership-confirmation round id this node handed out (ids never repeat on a node)."""
        self.config = config
        self.node_id = config.node_id
        self.epoch = epoch
        self.granting_voters = granting_voters
        self.epoch_start_offset = log_end_offset
        self.replicas: dict[int, ReplicaProgress] = {}
        self.check_quorum_deadline_ms = NEVER_MS
        self.check_quorum_fetchers: set[int] = set()
        self.begin_unacked: set[int] = set()
        self.begin_next_send_ms: dict[int, int] = {}
        self.last_contact_ms: dict[int, int] = {}
        """When each other voter last fetched (or the epoch started): one silent for a fetch timeout gets
        BeginQuorumEpoch again."""
        self.pending_records: list[bytes] = []
        self.pending_bytes = 0
        self.linger_deadline_ms = NEVER_MS
        """When the pending records are cut even if a flush is still in flight (the linger bound)."""
        self.holding = False
        """Every pending record was appended with ``hold`` (bulk work): they wait for the linger bound or
        a full batch even with no flush in flight, so several bulk slices share one batch."""
        self.parked: dict[int, ParkedFetch] = {}
        # Leadership confirmation (ReadIndex, Raft dissertation §6.4; docs/internals/raft.md).
        self.read_round_started = last_read_round
        """The latest round started (every FetchResponse carries it); rounds up to it are handed out."""
        self.read_round_confirmed = last_read_round
        """Every round up to this one is confirmed (those up to ``last_read_round`` belonged to earlier
        epochs: nobody waits for them any more)."""
        self.read_round_published = last_read_round
        """The latest round a FetchResponse carried.  While the latest round started is not published yet,
        no voter can echo it, so a new caller may join it instead of starting another."""
        self.read_echo: dict[int, int] = {}
        """Per voter (counted under its directory id): the highest round it echoed in this epoch."""
        # Check-quorum leader lease (issue #17; docs/internals/raft.md "Leader lease").
        self.round_started_ms: dict[int, int] = {}
        """When each recent round of this epoch started, on this leader's clock: a voter's echo of round R
        proves it took a response written after that time, and from then on refuses votes for at least
        ``config.vote_protection_ms`` of its own clock.  Bounded (:data:`LEASE_ROUND_MEMORY`); an echo of a
        forgotten round only renews nothing."""
        self.lease_basis_ms: dict[int, int] = {}
        """Per voter of the set in force: a time (the leader's clock) after which it took the response that
        brought it the latest round it echoed — that round's start, or later the first response to it that
        carried the round (:attr:`first_carried_ms`), whichever is later."""
        self._lease_expiry: int | None = None
        """:meth:`lease_expiry_ms` until a basis or the voters change (it is read several times per lease
        caller — each heartbeat that changes nothing, 500 a second with 1,000 brokers: issue #17)."""
        self.first_carried_ms: dict[int, dict[int, int]] = {}
        """Per voter: when the first response to it carrying each round it has not echoed yet was built.
        During bulk work a voter's next Fetch comes long after a round starts (it is writing and replaying
        a big batch), so the response's time is a much later — still sound — basis than the start."""
        self.echo_basis_ages_ms: deque[int] = deque(maxlen=LEASE_ROUND_MEMORY)
        """For each echo that renewed a voter's basis, how old that basis was then (``now_ms - basis``):
        the lease's echo path, for the driver's histogram (it drains them; bounded, as nothing else does)."""
        self.lease_caller_ms = NEVER_MS
        """When a caller last asked for the lease (answered from it or not): while one did within the last
        ``config.lease_ms``, the lease is in use and :meth:`poll` renews it without waiting for the next
        caller (:meth:`lease_renewal_due_ms`)."""
        self.now_ms = 0
        """The time of the input being handled (the core sets it before every input): responses built now
        were built no earlier than this."""
        self.voter_set = voter_set if voter_set is not None else VoterSet.static(config.voters)
        self.voters: frozenset[int] = frozenset()
        self.majority = 1
        self.is_voter = False
        self._set_voters(self.voter_set, None)

    def _set_voters(self, voter_set: VoterSet, now_ms: int | None) -> list[int]:
        """Adopt ``voter_set`` (the last in the log); returns the voters new to this leader, which get
        BeginQuorumEpoch.  Voters that left keep their progress as observers."""
        self.voter_set = voter_set
        old = self.voters
        self.voters = frozenset(voter_set.ids)
        self.majority = voter_set.majority
        self.is_voter = voter_set.is_voter(self.node_id, self.config.directory_id)
        others = self.voters - {self.node_id}
        for voter in others:
            self.replicas.setdefault(voter, ReplicaProgress())
        added = sorted(others - old)
        self.begin_unacked &= others
        self.check_quorum_fetchers &= others
        # A voter re-added under another directory id must earn its echo again.
        self.read_echo.clear()
        self.lease_basis_ms.clear()  # a new majority must echo again before a lease counts it
        self._lease_expiry = None
        self.first_carried_ms.clear()
        for gone in set(self.last_contact_ms) - others:
            del self.last_contact_ms[gone]
        if now_ms is not None:
            for voter in added:
                self.begin_unacked.add(voter)
                self.last_contact_ms[voter] = now_ms
        else:
            self.begin_unacked = set(others)
        return added

    def update_voters(self, voter_set: VoterSet, now_ms: int) -> Decisions:
        """The voter set in force changed (this leader appended a VotersRecord): new voters get
        BeginQuorumEpoch, majorities count the new set at once (KIP-853, dissertation §4.1)."""
        added = self._set_voters(voter_set, now_ms)
        if not self.has_other_voters():
            self.check_quorum_deadline_ms = NEVER_MS
        elif self.check_quorum_deadline_ms == NEVER_MS:
            self.check_quorum_deadline_ms = now_ms + self._check_quorum_timeout_ms()
        return [self._send_begin_quorum(voter, now_ms) for voter in added]

    def has_other_voters(self) -> bool:
        return bool(self.voters - {self.node_id})

    def counts_toward_quorum(self, replica_id: int, directory_id: str) -> bool:
        """Whether a fetch from this replica counts: a voter of the set in force, under its directory id."""
        return replica_id != self.node_id and self.voter_set.is_voter(replica_id, directory_id)

    # -- lifecycle

    def start(self, now_ms: int, bootstrap_voters: VoterSet | None = None) -> Decisions:
        """Open the epoch: append the LeaderChange batch and announce it with BeginQuorumEpoch.

        ``bootstrap_voters``: the voter set this node was formatted with, when no VotersRecord is in the
        log yet — appended right after the LeaderChange, so that a node formatted without initial
        controllers learns it by fetching (as Kafka's first leader writes its bootstrap records)."""
        if self.has_other_voters():
            self.check_quorum_deadline_ms = now_ms + self._check_quorum_timeout_ms()
        self.last_contact_ms = dict.fromkeys(self.begin_unacked, now_ms)
        base = self.epoch_start_offset
        op = AppendLeaderChange(
            base, self.epoch, self.node_id, tuple(sorted(self.voters)), self.granting_voters
        )
        decisions: Decisions = [AppendToLog(op, (BatchInfo(base, base, self.epoch),))]
        if bootstrap_voters is not None:
            at = base + 1
            voters_op = AppendVoters(at, self.epoch, bootstrap_voters)
            decisions.append(AppendToLog(voters_op, (BatchInfo(at, at, self.epoch, bootstrap_voters),)))
        decisions.extend(self._send_begin_quorum(voter, now_ms) for voter in sorted(self.begin_unacked))
        return decisions

    def next_deadline_ms(self) -> int:
        deadline = min(self.check_quorum_deadline_ms, self.linger_deadline_ms)
        for parked in self.parked.values():
            deadline = min(deadline, parked.deadline_ms)
        for voter in self.begin_unacked:
            deadline = min(deadline, self.begin_next_send_ms.get(voter, NEVER_MS))
        fetch_timeout_ms = self.config.fetch_timeout_ms  # (the core asks this after every input it leads)
        for voter, contact_ms in self.last_contact_ms.items():
            if voter not in self.begin_unacked:
                deadline = min(deadline, contact_ms + fetch_timeout_ms)
        return min(deadline, self.lease_renewal_due_ms(self.now_ms))

    def check_quorum_expired(self, now_ms: int) -> bool:
        return now_ms >= self.check_quorum_deadline_ms

    def poll(self, now_ms: int, log: LogMeta, high_watermark: int) -> Decisions:
        decisions: Decisions = []
        end_offset = log.end_offset
        if self.batch_due(now_ms, log):
            decisions, end_offset = self.drain_accumulator(log, high_watermark)
        for request_id, parked in list(self.parked.items()):
            if parked.deadline_ms <= now_ms:
                del self.parked[request_id]
                decisions.append(
                    self._data_response(request_id, parked.request, log, end_offset, high_watermark)
                )
        for voter, contact_ms in self.last_contact_ms.items():
            if voter not in self.begin_unacked and now_ms >= contact_ms + self.config.fetch_timeout_ms:
                # A voter silent for a fetch timeout may have moved to a higher epoch without a leader
                # (it lost an election while we stayed live).  Since live leaders are protected from
                # standard votes, announce ourselves again: its FENCED_LEADER_EPOCH answer carries its
                # epoch and makes us step down, the way etcd's check-quorum leader learns a higher term
                # from a heartbeat response.  Only our own outbound request can do that, never a forgery.
                self.begin_unacked.add(voter)
                self.begin_next_send_ms[voter] = now_ms
        for voter in sorted(self.begin_unacked):
            if self.begin_next_send_ms.get(voter, NEVER_MS) <= now_ms:
                decisions.append(self._send_begin_quorum(voter, now_ms))
        if now_ms >= self.lease_renewal_due_ms(now_ms):
            # The lease in use is renewed on time even when no caller comes at the moment (issue #17,
            # session 12: during bulk work the heartbeats arrive in bursts, with gaps of 100-300 ms
            # while the client or this loop waits for a core, and a renewal that only a caller starts
            # let the lease run out in such a gap with the voters' long polls parked, idle).
            decisions += self._start_read_round(log, high_watermark, now_ms)
        return decisions

    def take_parked(self) -> list[ParkedFetch]:
        parked = list(self.parked.values())
        self.parked.clear()
        return parked

    def preferred_successors(self) -> tuple[int, ...]:
        """Other voters by descending fetch offset (EndQuorumEpoch's order)."""
        others = [voter for voter in self.voter_set.ids if voter != self.node_id]
        others.sort(key=lambda voter: (-self.replicas.get(voter, ReplicaProgress()).end_offset, voter))
        return tuple(others)

    # -- BeginQuorumEpoch

    def _send_begin_quorum(self, voter: int, now_ms: int) -> SendRequest:
        known = self.voter_set.get(voter)
        directory_id = known.directory_id if known is not None else ""
        request = BeginQuorumEpochRequest(
            self.config.cluster_id, self.node_id, self.epoch, voter, directory_id
        )
        self.begin_next_send_ms[voter] = now_ms + max(1, self.config.fetch_timeout_ms // 2)
        return SendRequest(voter, request, after_persist=True)

    def announce_to_refused_candidate(self, candidate_id: int, now_ms: int) -> None:
        """A standard vote at a higher epoch was refused because we are live: announce ourselves to that
        candidate too, voter of our set or not.  A voter removed by a VotersRecord its log never got
        still thinks it votes; if it reached candidate (a pre-vote granted just before a partition
        healed) its epoch passed ours, and no leader of ours ever announces to a non-voter, so it could
        never follow or be added again.  Its FENCED_LEADER_EPOCH answer makes us step down and the next
        epoch reaches it; a forged vote gets an honest answer from the real node and changes nothing."""
        if candidate_id == self.node_id:
            return
        self.begin_unacked.add(candidate_id)
        self.begin_next_send_ms[candidate_id] = now_ms

    def on_begin_quorum_acknowledged(self, voter: int, now_ms: int) -> None:
        self.begin_unacked.discard(voter)
        if voter in self.last_contact_ms:
            self.last_contact_ms[voter] = now_ms

    def on_begin_quorum_failed(self, voter: int, retry_at_ms: int) -> None:
        if voter not in self.voters:
            self.begin_unacked.discard(voter)  # a refused non-voter candidate is told once, not chased
        elif voter in self.begin_unacked:
            self.begin_next_send_ms[voter] = retry_at_ms

    # -- appends: group commit
    #
    # A batch costs one fsync, and the driver runs one flush at a time.  So records wait only while there
    # is something to wait for: when no flush is in flight (the log is durable up to its end) the pending
    # records are cut at the next output the core hands out (``RaftCore.take_output`` / ``poll``) — a
    # lone write pays no delay; while a flush is in flight they gather and are cut once it completes,
    # as one batch; a full batch is cut at once; and ``append_linger_ms`` (counted from the first pending
    # record) bounds the wait, so a slow flush cannot hold appends longer than that (0: never wait).
    # Records appended with ``hold`` (the controller's bulk slices, each a few hundred records computed in
    # a few ms: a batch each cost a fsync per node, a fetch round and a commit) wait for that bound or a
    # full batch even with no flush in flight, while nothing else is pending; any other append ends the
    # hold (a heartbeat's record is never delayed by bulk work).

    @staticmethod
    def flush_in_flight(log: LogMeta) -> bool:
        """Part of the log is written but not yet reported durable: every append asks for a flush, and
        ``on_flushed`` reports how far it got, so this is exactly "a flush was asked for and has not come
        back" (two may be in flight in the simulation; the first to complete may cover both)."""
        return log.flushed_end < log.end_offset

    def batch_due(self, now_ms: int, log: LogMeta) -> bool:
        """Cut the pending records now?  Yes with no flush to wait for (unless they are all held), or
        once the linger bound ran out."""
        return bool(self.pending_records) and (
            (not self.holding and not self.flush_in_flight(log)) or now_ms >= self.linger_deadline_ms
        )

    def cut_if_due(self, now_ms: int, log: LogMeta, high_watermark: int) -> Decisions:
        """The batch to append now under the group-commit rule (see :meth:`batch_due`), or nothing."""
        if not self.batch_due(now_ms, log):
            return []
        return self.drain_accumulator(log, high_watermark)[0]

    def append(
        self, records: Sequence[bytes], now_ms: int, log: LogMeta, high_watermark: int, *, hold: bool = False
    ) -> tuple[int, Decisions]:
        """Accumulate ``records``; returns the offset of the last one and the batch to append if full.

        A batch that is not full is cut later, by :meth:`cut_if_due` or :meth:`poll`: deferring the cut to
        the next output lets every append that arrives before the driver takes it share one batch.
        ``hold``: bulk records, kept for later bulk records up to the linger bound (see above)."""
        config = self.config
        if not self.pending_records:
            self.linger_deadline_ms = now_ms + config.append_linger_ms
            self.holding = hold
        elif not hold:
            self.holding = False
        self.pending_records.extend(records)
        self.pending_bytes += sum(map(len, records))  # no generator frame per record (a hot path)
        last_offset = log.end_offset + len(self.pending_records) - 1
        if (
            len(self.pending_records) >= config.max_batch_records
            or self.pending_bytes >= config.max_batch_bytes
        ):
            return last_offset, self.drain_accumulator(log, high_watermark)[0]
        return last_offset, []

    def end_hold(self) -> None:
        """Pending held records are cut like any append from now on (see :meth:`batch_due`)."""
        self.holding = False

    def drain_accumulator(self, log: LogMeta, high_watermark: int) -> tuple[Decisions, int]:
        """Cut the pending records into one batch; returns the decisions and the log end after it."""
        records = tuple(self.pending_records)
        self.pending_records.clear()
        self.pending_bytes = 0
        self.linger_deadline_ms = NEVER_MS
        self.holding = False
        base = log.end_offset
        end_offset = base + len(records)
        batch = BatchInfo(base, end_offset - 1, self.epoch)
        decisions: Decisions = [AppendToLog(AppendRecords(base, self.epoch, records), (batch,))]
        decisions.extend(self._complete_parked(log, end_offset, high_watermark, data_only=True))
        return decisions, end_offset

    def append_voters(self, voter_set: VoterSet, log: LogMeta, high_watermark: int) -> Decisions:
        """Append a VotersRecord for ``voter_set`` (after any pending records, which are cut first so
        offsets stay in order); the core validated the change (:mod:`kraft.raft.voters`)."""
        decisions: Decisions = []
        end_offset = log.end_offset
        if self.pending_records:
            decisions, end_offset = self.drain_accumulator(log, high_watermark)
        batch = BatchInfo(end_offset, end_offset, self.epoch, voter_set)
        decisions.append(AppendToLog(AppendVoters(end_offset, self.epoch, voter_set), (batch,)))
        decisions.extend(self._complete_parked(log, end_offset + 1, high_watermark, data_only=True))
        return decisions

    def caught_up(self, replica_id: int, directory_id: str, log: LogMeta, now_ms: int) -> bool:
        """Whether a replica may join the voters: within the last fetch timeout it fetched under
        ``directory_id`` from the log end as it was then (Kafka's ``isReplicaCaughtUp``), so adding it
        cannot stall the high watermark behind a voter far behind."""
        progress = self.replicas.get(replica_id)
        return (
            progress is not None
            and progress.directory_id == directory_id
            and progress.last_caught_up_ms >= 0
            and now_ms - progress.last_caught_up_ms <= self.config.fetch_timeout_ms
        )

    # -- high watermark and check-quorum

    def maybe_advance_high_watermark(self, log: LogMeta, high_watermark: int) -> tuple[Decisions, int]:
        """Advance the HWM by :func:`next_high_watermark`, counting the leader by its *flushed* end;
        long polls answer once it moves.  Returns the decisions and the high watermark after them."""
        offsets = [self._counted_offset(voter.node_id, voter.directory_id, log) for voter in self.voter_set]
        advanced = next_high_watermark(offsets, self.epoch_start_offset, high_watermark)
        if advanced is None:
            return [], high_watermark
        decisions: Decisions = [AdvanceHighWatermark(advanced)]
        decisions.extend(self._complete_parked(log, log.end_offset, advanced, data_only=False))
        return decisions, advanced

    def _counted_offset(self, voter_id: int, directory_id: str, log: LogMeta) -> int:
        """A voter's durable end as the HWM counts it: the leader's flushed end (when it is that voter),
        a follower's last fetch offset only under the voter's own directory id, else -1."""
        if voter_id == self.node_id:
            return log.flushed_end if self.is_voter else -1
        progress = self.replicas.get(voter_id)
        if progress is None or directory_id not in ("", progress.directory_id):
            return -1
        return progress.end_offset

    def _check_quorum_timeout_ms(self) -> int:
        return self.config.fetch_timeout_ms * 3 // 2

    def record_voter_contact(self, replica_id: int, directory_id: str, now_ms: int) -> None:
        if not self.counts_toward_quorum(replica_id, directory_id):
            return
        self.begin_unacked.discard(replica_id)
        self.last_contact_ms[replica_id] = now_ms
        self.check_quorum_fetchers.add(replica_id)
        if len(self.check_quorum_fetchers) + (1 if self.is_voter else 0) >= self.majority:
            self.check_quorum_fetchers.clear()
            self.check_quorum_deadline_ms = now_ms + self._check_quorum_timeout_ms()

    # -- Fetch / FetchSnapshot (epoch and leadership already validated by the core)

    def handle_fetch(
        self, request_id: int, request: FetchRequest, now_ms: int, log: LogMeta, high_watermark: int
    ) -> Decisions:
        if request.read_round > self.read_round_started:
            # No leader of this epoch handed that round out (ids are this node's, and it alone leads
            # the epoch): a forged echo must not confirm a round nobody acknowledged.
            message = f"read round {request.read_round} was never started (latest {self.read_round_started})"
            return [RespondError(request_id, request, ErrorCode.INVALID_REQUEST, message)]
        self.record_voter_contact(request.replica_id, request.replica_directory_id, now_ms)
        confirmed = self._record_read_echo(request)
        if request.echo_only:
            # The fetcher is still writing what it fetched: its fetch_offset is behind its log, so it is
            # no progress report (it would move the replica's end back), and it wants no records.
            return [
                *confirmed,
                Respond(request_id, self._fetch_response(request.replica_id, log, high_watermark)),
            ]
        return confirmed + self._handle_fetch(request_id, request, now_ms, log, high_watermark)

    def _handle_fetch(
        self, request_id: int, request: FetchRequest, now_ms: int, log: LogMeta, high_watermark: int
    ) -> Decisions:
        if request.fetch_offset < log.start_offset and log.snapshot is not None:
            return [
                Respond(
                    request_id,
                    self._fetch_response(request.replica_id, log, high_watermark, snapshot_id=log.snapshot),
                )
            ]
        end_for_epoch = log.end_offset_for_epoch(request.last_fetched_epoch)
        if end_for_epoch is None and log.snapshot is not None:
            return [
                Respond(
                    request_id,
                    self._fetch_response(request.replica_id, log, high_watermark, snapshot_id=log.snapshot),
                )
            ]
        if end_for_epoch is not None and (
            end_for_epoch.epoch != request.last_fetched_epoch
            or end_for_epoch.end_offset < request.fetch_offset
        ):
            response = self._fetch_response(
                request.replica_id, log, high_watermark, diverging_epoch=end_for_epoch
            )
            return [Respond(request_id, response)]
        decisions, advanced = self._update_progress(
            request.replica_id,
            request.replica_directory_id,
            request.fetch_offset,
            now_ms,
            log,
            high_watermark,
        )
        wait_ms = request.max_wait_ms
        if self._owes_high_watermark(request, high_watermark, advanced):
            # Held briefly for the next batch, which then carries the high watermark with its records
            # (a commit costs no extra round trip under steady writes); else answered with it alone.
            wait_ms = min(wait_ms, self.config.fetch_high_watermark_wait_ms)
        if (
            request.fetch_offset < log.end_offset
            or wait_ms == 0
            or self._owes_read_echo(request.replica_id, request.replica_directory_id, request.read_round)
        ):
            decisions.append(self._data_response(request_id, request, log, log.end_offset, advanced))
        else:
            self.parked[request_id] = ParkedFetch(request_id, request, now_ms + wait_ms)
        return decisions

    @staticmethod
    def _owes_high_watermark(request: FetchRequest, before: int, high_watermark: int) -> bool:
        """A Fetch with nothing new to send is still answered soon (``config.fetch_high_watermark_wait_ms``)
        when its fetcher would learn a higher high watermark from the answer (docs/internals/raft.md "Long
        polls and the high watermark"); parked for its whole wait, it would learn the commit only with the
        next write or the long poll's end.

        A fetcher that says which one it knows (``request.high_watermark``, KIP-1166) is answered when it
        knows less than it can take: it caps what it takes at its log end, here ``fetch_offset`` (a
        behind fetcher gets records anyway), so once answered its next Fetch knows enough to park — no
        answer loop.  One that does not say (an older version) is answered when its own Fetch moved the
        high watermark, Kafka's older rule: it then knows the old one at best.  A fetcher of that kind
        arriving after someone else's Fetch moved it still parks (the leader has no way to tell)."""
        known = request.high_watermark
        if known is None:
            return high_watermark > before
        return known < min(high_watermark, request.fetch_offset)

    # -- leadership confirmation (ReadIndex)
    #
    # A round R started at time T is confirmed once a majority of voters — the leader counts itself —
    # sent a Fetch at this epoch echoing a round >= R.  The echo matters: it proves the Fetch was sent
    # after the voter received a response written after T, so at some moment after T that voter was still
    # in this epoch; a newer leader needs the vote of one of them (quorum intersection), hence was elected
    # after T.  No clock is trusted: a paused leader confirms nothing new, whatever it believes.

    @property
    def read_round_in_flight(self) -> int:
        """The latest round started and not yet confirmed (0: none)."""
        return self.read_round_started if self.read_round_started > self.read_round_confirmed else 0

    def request_read_round(
        self, log: LogMeta, high_watermark: int, now_ms: int | None = None
    ) -> tuple[int, Decisions]:
        """A caller wants leadership confirmed from now on: the id of the round that answers it.

        Rounds overlap (issue #17): a caller arriving while a round is in flight starts the next one at
        once rather than waiting for the one in flight to confirm first — a round's confirmation only
        needs echoes of it or of any later round, so the earlier one confirms no later than before.
        Callers still share rounds: one that arrives before any FetchResponse carried the latest round
        joins it, since every echo of that round is then sent after this call.

        ``now_ms``: when the round starts, kept for the lease (None: the round renews no lease)."""
        if self.read_round_in_flight and self.read_round_published < self.read_round_started:
            return self.read_round_started, []
        return self.read_round_started + 1, self._start_read_round(log, high_watermark, now_ms)

    def _start_read_round(self, log: LogMeta, high_watermark: int, now_ms: int | None) -> Decisions:
        self.read_round_started += 1
        if now_ms is not None and self.config.lease_ms > 0:
            started = self.round_started_ms
            started[self.read_round_started] = now_ms
            if len(started) > LEASE_ROUND_MEMORY:
                del started[min(started)]
        decisions = self._check_read_round()
        if self.read_round_in_flight:
            # Voters' parked long polls answer now, carrying the round, so they echo it at once instead
            # of after their max wait.
            for request_id, parked in list(self.parked.items()):
                request = parked.request
                if self.counts_toward_quorum(request.replica_id, request.replica_directory_id):
                    del self.parked[request_id]
                    decisions.append(
                        self._data_response(request_id, request, log, log.end_offset, high_watermark)
                    )
        return decisions

    def _owes_read_echo(self, replica_id: int, directory_id: str, read_round: int) -> bool:
        """A voter that has not yet seen the round in flight gets an answer now, not a long poll."""
        return (
            self.read_round_in_flight > 0
            and read_round < self.read_round_in_flight
            and self.counts_toward_quorum(replica_id, directory_id)
        )

    def _record_read_echo(self, request: FetchRequest) -> Decisions:
        if request.read_round <= 0 or not self.counts_toward_quorum(
            request.replica_id, request.replica_directory_id
        ):
            return []
        echoed = self.read_echo.get(request.replica_id, 0)
        if request.read_round <= echoed:
            return []
        self.read_echo[request.replica_id] = request.read_round
        self._renew_lease_basis(request.replica_id, request.read_round)
        return self._check_read_round()

    def _renew_lease_basis(self, voter: int, echoed: int) -> None:
        """The echoed round is the highest this voter took, so it took a response carrying it: one written
        after the round started, and no earlier than the first response to this voter that carried it."""
        carried = self.first_carried_ms.get(voter, {})
        basis = max(self.round_started_ms.get(echoed, -1), carried.get(echoed, -1))
        for read_round in [r for r in carried if r <= echoed]:
            del carried[read_round]
        if basis >= 0:
            self.lease_basis_ms[voter] = basis
            self._lease_expiry = None
            self.echo_basis_ages_ms.append(self.now_ms - basis)

    # -- check-quorum leader lease (issue #17)
    #
    # A voter that takes a response from its leader refuses every (pre-)vote and does not campaign for at
    # least ``vote_protection_ms`` of its own clock (its fetch timeout; the refused-fetch path and a
    # restart are bounded to the same; core_fetcher.py, RaftCore.start).  Its echo of round R proves it
    # took a response written after R started, so no vote of it for a newer epoch can exist before
    # ``start(R) + vote_protection_ms``.  A majority of such voters (the leader counts itself: it votes
    # for nobody while it leads) means no newer leader before the majority-th latest such start plus the
    # protection; the lease ends a clock-drift margin earlier (``RaftConfig.max_lease_ms``).

    def lease_expiry_ms(self) -> int:
        """When the lease ends on this leader's clock (-1: no lease: not enough voters echoed a round of
        this epoch with a known start, or the lease is off)."""
        if self._lease_expiry is None:
            self._lease_expiry = self._compute_lease_expiry_ms()
        return self._lease_expiry

    def _compute_lease_expiry_ms(self) -> int:
        lease_ms = self.config.lease_ms
        if lease_ms <= 0:
            return -1
        basis = self.lease_basis_ms
        bases = sorted(
            (basis[voter] for voter in self.voters if voter != self.node_id and voter in basis), reverse=True
        )
        needed = self.majority - (1 if self.is_voter else 0)
        if needed <= 0:
            return NEVER_MS  # a sole voter: nobody else can be elected
        if len(bases) < needed:
            return -1
        return bases[needed - 1] + lease_ms

    def lease_ages_ms(self, now_ms: int) -> tuple[int, dict[int, int]]:
        """Why a lease is what it is, for a log line: how long ago the latest round started (-1: none
        kept), and per other voter how long ago its lease basis is (a voter with none is left out).  A
        lapse with a recent round but old bases: the voters were slow to echo; with no recent round: no
        caller asked for one (rounds are started by callers, :meth:`lease_wants_renewal`)."""
        latest = self.round_started_ms.get(self.read_round_started)
        bases = {voter: now_ms - basis for voter, basis in sorted(self.lease_basis_ms.items())}
        return (-1 if latest is None else now_ms - latest), bases

    def lease_holds(self, now_ms: int) -> bool:
        return now_ms < self.lease_expiry_ms()

    def lease_wants_renewal(self, now_ms: int) -> bool:
        """Start a round in the background once a quarter of the lease is spent, so a leader answering
        from its lease keeps it without callers waiting for a round.  Rounds overlap (the lease counts
        the latest round each voter echoed), so a slow round does not hold the next one back — under
        bulk work an echo takes hundreds of ms, and rounds one after the other would let the lease lapse
        (issue #17) — but one starts at most every eighth of the lease."""
        return now_ms >= self._renewal_time_ms()

    def _renewal_time_ms(self) -> int:
        """When the lease wants its next round: a quarter of it spent, and an eighth since the latest
        round started (NEVER_MS: the lease is off or needs nobody)."""
        lease_ms = self.config.lease_ms
        expiry = self.lease_expiry_ms()
        if lease_ms <= 0 or expiry == NEVER_MS:
            return NEVER_MS
        due = expiry - lease_ms * 3 // 4 + 1 if expiry >= 0 else 0
        latest = self.round_started_ms.get(self.read_round_started)
        if latest is not None:
            due = max(due, latest + max(1, lease_ms // 8))
        return due

    def note_lease_caller(self, now_ms: int) -> None:
        """A caller asked for the lease now (:attr:`lease_caller_ms`)."""
        self.lease_caller_ms = now_ms

    def lease_renewal_due_ms(self, now_ms: int) -> int:
        """When :meth:`poll` starts a renewal round of the lease in use (NEVER_MS: none due).

        Only while a caller asked within the last lease (an idle leader starts no rounds: its voters'
        long polls stay parked), and never while the latest round has not been published: no voter can
        echo it yet, the next response carries it, and a new round would only join it.  So a due renewal
        never turns into a poll that repeats at once: it starts a round, which moves the next one an
        eighth of the lease on, or leaves one unpublished."""
        if self.lease_caller_ms == NEVER_MS:  # no caller yet: first, before the config's lease arithmetic
            return NEVER_MS
        in_use_until = self.lease_caller_ms + self.config.lease_ms
        if now_ms >= in_use_until:
            return NEVER_MS
        if self.read_round_in_flight and self.read_round_published < self.read_round_started:
            return NEVER_MS
        due = self._renewal_time_ms()
        return due if due < in_use_until else NEVER_MS

    def _check_read_round(self) -> Decisions:
        """Confirm the latest round a majority echoed (an echo of round R also echoes every round before
        it: the response that carried R was written after they started)."""
        if not self.read_round_in_flight:
            return []
        echoes = sorted(
            (self.read_echo.get(voter, 0) for voter in self.voters if voter != self.node_id), reverse=True
        )
        if self.is_voter:
            echoes.insert(0, self.read_round_started)
        if len(echoes) < self.majority:
            return []
        confirmed = echoes[self.majority - 1]
        if confirmed <= self.read_round_confirmed:
            return []
        self.read_round_confirmed = confirmed
        return [ConfirmReadRound(confirmed)]

    def _publish_read_round(self) -> int:
        """The round a FetchResponse carries: the latest started, which from now on a voter may echo."""
        self.read_round_published = self.read_round_started
        return self.read_round_started

    def _fetch_response(
        self,
        to: int,
        log: LogMeta,
        high_watermark: int,
        *,
        diverging_epoch: EpochEndOffset | None = None,
        snapshot_id: SnapshotId | None = None,
    ) -> FetchResponse:
        """A FetchResponse to replica ``to``; the first one to a voter carrying a round is remembered
        for the lease (:meth:`_renew_lease_basis`)."""
        read_round = self._publish_read_round()
        if read_round > 0 and to in self.voters and to != self.node_id and self.config.lease_ms > 0:
            carried = self.first_carried_ms.setdefault(to, {})
            if read_round not in carried:
                carried[read_round] = self.now_ms
                if len(carried) > LEASE_ROUND_MEMORY:
                    del carried[min(carried)]
        return FetchResponse(
            ErrorCode.NONE,
            "",
            self.node_id,
            self.epoch,
            high_watermark,
            log.start_offset,
            b"",
            diverging_epoch,
            snapshot_id,
            read_round,
        )

    def _data_response(
        self, request_id: int, request: FetchRequest, log: LogMeta, end_offset: int, high_watermark: int
    ) -> Respond:
        read = None
        if request.fetch_offset < end_offset:
            read = LogRead(request.fetch_offset, min(request.max_bytes, self.config.fetch_max_bytes))
        return Respond(
            request_id, self._fetch_response(request.replica_id, log, high_watermark), read_log=read
        )

    def _progress_of(self, replica_id: int, now_ms: int) -> ReplicaProgress | None:
        """The tracked progress of ``replica_id``, or None for an observer that does not fit.

        Voters are always tracked.  Observers are bounded (issue #15: 5,000 fake observers filled
        DescribeQuorum): a newcomer first makes room by forgetting observers not seen for
        ``observer_forget_ms``; at ``max_observers`` it is served but not tracked."""
        progress = self.replicas.get(replica_id)
        if progress is not None:
            return progress
        if self._observer_count() >= self.config.max_observers:
            self.forget_observers(now_ms - self.config.observer_forget_ms)
            if self._observer_count() >= self.config.max_observers:
                return None
        progress = self.replicas[replica_id] = ReplicaProgress()
        return progress

    def _observer_count(self) -> int:
        # replicas holds every other voter (see _set_voters); the rest are observers.
        return len(self.replicas) - len(self.voters - {self.node_id})

    def forget_observers(self, seen_before_ms: int) -> None:
        """Drop the observers last seen before ``seen_before_ms``."""
        gone = [
            r for r, p in self.replicas.items() if r not in self.voters and p.last_fetch_ms < seen_before_ms
        ]
        for replica_id in gone:
            del self.replicas[replica_id]

    def _update_progress(
        self,
        replica_id: int,
        directory_id: str,
        fetch_offset: int,
        now_ms: int,
        log: LogMeta,
        high_watermark: int,
    ) -> tuple[Decisions, int]:
        progress = self._progress_of(replica_id, now_ms)
        if progress is None:
            return [], high_watermark
        progress.end_offset = fetch_offset
        progress.last_fetch_ms = now_ms
        progress.directory_id = directory_id
        if fetch_offset >= log.end_offset:
            progress.last_caught_up_ms = now_ms
        if replica_id in self.voters:
            return self.maybe_advance_high_watermark(log, high_watermark)
        return [], high_watermark

    def _complete_parked(
        self, log: LogMeta, end_offset: int, high_watermark: int, *, data_only: bool
    ) -> Decisions:
        decisions: Decisions = []
        for request_id, parked in list(self.parked.items()):
            if not data_only or parked.request.fetch_offset < end_offset:
                del self.parked[request_id]
                decisions.append(
                    self._data_response(request_id, parked.request, log, end_offset, high_watermark)
                )
        return decisions

    def handle_fetch_snapshot(
        self, request_id: int, request: FetchSnapshotRequest, now_ms: int, log: LogMeta
    ) -> Decisions:
        progress = self.replicas.get(request.replica_id)
        # FetchSnapshot carries no directory id: it counts as the directory the replica last fetched with.
        self.record_voter_contact(request.replica_id, progress.directory_id if progress else "", now_ms)
        if log.snapshot != request.snapshot_id:
            message = f"no snapshot {request.snapshot_id}"
            return [RespondError(request_id, request, ErrorCode.SNAPSHOT_NOT_FOUND, message)]
        progress = self._progress_of(request.replica_id, now_ms)
        if progress is not None:
            progress.last_fetch_ms = now_ms
        response = FetchSnapshotResponse(
            ErrorCode.NONE, "", self.node_id, self.epoch, request.snapshot_id, 0, request.position
        )
        max_bytes = min(request.max_bytes, self.config.fetch_max_bytes)
        read = SnapshotRead(request.snapshot_id, request.position, max_bytes)
        return [Respond(request_id, response, read_snapshot=read)]

    # -- DescribeQuorum

    def describe(self, now_ms: int, log: LogMeta, high_watermark: int) -> DescribeQuorumResponse:
        # Kafka's display window (300 s) also bounds how long a departed observer is remembered.
        self.forget_observers(now_ms - self.config.observer_expiry_ms)
        voters: list[ReplicaState] = []
        observers: list[ReplicaState] = []
        own_directory = self.config.directory_id
        for voter in self.voter_set:
            if voter.node_id == self.node_id and self.is_voter:
                voters.append(ReplicaState(voter.node_id, log.end_offset, now_ms, now_ms, own_directory))
                continue
            progress = self.replicas.get(voter.node_id, ReplicaProgress())
            if voter.directory_id not in ("", progress.directory_id):
                progress = ReplicaProgress()  # that id fetches under another directory: an observer
            directory_id = voter.directory_id or progress.directory_id
            voters.append(
                ReplicaState(
                    voter.node_id,
                    progress.end_offset,
                    progress.last_fetch_ms,
                    progress.last_caught_up_ms,
                    directory_id,
                )
            )
        if not self.is_voter:
            observers.append(ReplicaState(self.node_id, log.end_offset, now_ms, now_ms, own_directory))
        for replica_id in sorted(self.replicas):
            progress = self.replicas[replica_id]
            if self.voter_set.is_voter(replica_id, progress.directory_id) or progress.last_fetch_ms < 0:
                continue
            if now_ms - progress.last_fetch_ms <= self.config.observer_expiry_ms:
                observers.append(
                    ReplicaState(
                        replica_id,
                        progress.end_offset,
                        progress.last_fetch_ms,
                        progress.last_caught_up_ms,
                        progress.directory_id,
                    )
                )
        return DescribeQuorumResponse(
            ErrorCode.NONE, "", self.node_id, self.epoch, high_watermark, tuple(voters), tuple(observers)
        )
