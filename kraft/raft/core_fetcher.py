"""The fetching half of the core: a follower (or observer) pulling from its leader, the snapshot download
of a follower below the leader's log start, and an observer's leader discovery.

A :class:`FetcherRole` exists while its core is a Follower (``leader_id`` set) or an observer without a
leader (``leader_id`` None: it asks a random voter, whose answer names the leader).  It keeps at most one
Fetch/FetchSnapshot in flight and sends the next one only after what it appended is flushed.  It returns
its log writes, high-watermark moves and requests as decisions; its responses end with
:class:`~kraft.raft.core_decisions.FetchAgain` where the next fetch must see the log after them.
"""

from __future__ import annotations

from dataclasses import dataclass

from kraft.raft.core_decisions import (
    AdvanceHighWatermark,
    AppendToLog,
    Decisions,
    FetchAgain,
    ResetElectionRetries,
    ResetToSnapshot,
    SendFetch,
    TruncateLog,
    WriteChunk,
)
from kraft.raft.core_log import LogInvariantError, LogMeta
from kraft.raft.core_output import AppendFetched, WriteSnapshotChunk
from kraft.raft.core_timers import NEVER_MS
from kraft.raft.core_types import BatchInfo, BatchScanner, RaftConfig
from kraft.raft.messages import (
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    RaftRequest,
    SnapshotId,
)
from kraft.raft.quorum import Rng, random_election_timeout_ms

UNREACHABLE_MIN_FAILURES = 3
"""Fast dead-leader detection: this many consecutive fetches refused outright (the transport saw
UNAVAILABLE — the leader's process is gone, not slow), spread over at least half an election timeout,
end the fetch timeout early.  What follows is a pre-vote, which a healthy leader's other followers
reject while they still fetch from it, so a false alarm cannot depose anyone."""


@dataclass(slots=True)
class SnapshotDownload:
    snapshot_id: SnapshotId
    position: int = 0


def truncation_offset(log: LogMeta, diverging: EpochEndOffset, high_watermark: int) -> int:
    """Where to cut after a DivergingEpoch answer: ``min(local end of the epoch, leader's end)``.

    Raises :class:`LogInvariantError` rather than truncating committed data (below the high watermark).
    """
    local = log.end_offset_for_epoch(diverging.epoch)
    offset = diverging.end_offset if local is None else min(local.end_offset, diverging.end_offset)
    offset = max(offset, log.start_offset)
    if offset < high_watermark:
        raise LogInvariantError(f"asked to truncate to {offset}, below the high watermark {high_watermark}")
    return offset


def continues_log(batches: list[BatchInfo], end_offset: int, last_epoch: int, leader_epoch: int) -> bool:
    """Fetched batches must start at our end, be contiguous, and carry non-decreasing epochs no newer
    than the leader's."""
    if not batches:
        return False
    expected = end_offset
    for batch in batches:
        if batch.base_offset != expected or batch.epoch < last_epoch or batch.epoch > leader_epoch:
            return False
        expected = batch.last_offset + 1
        last_epoch = batch.epoch
    return True


class FetcherRole:
    def __init__(
        self,
        config: RaftConfig,
        epoch: int,
        rng: Rng,
        leader_id: int | None,
        *,
        is_voter: bool | None = None,
        voter_ids: tuple[int, ...] | None = None,
    ) -> None:
        self.config = config
        self.is_voter = config.is_voter if is_voter is None else is_voter
        """Whether this node is a voter of the set in force (the core updates it as the log changes)."""
        self.voter_ids = config.voters if voter_ids is None else voter_ids
        """Whom a leaderless observer asks for the leader."""
        self.epoch = epoch
        self.rng = rng
        self.leader_id = leader_id
        self.inflight: int | None = None
        self.retry_at_ms = NEVER_MS
        self.has_fetched_from_leader = False
        self.last_success_ms = NEVER_MS
        """When we last took an answer from the leader: we promised (its lease counts on it) to refuse
        votes for ``config.vote_protection_ms`` from then on, whatever happens to our fetches."""
        self.leader_resigned = False
        self.download: SnapshotDownload | None = None
        self.fetch_deadline_ms = NEVER_MS
        self.unreachable_until_ms: int | None = None
        """When the streak of refused fetches may end the fetch timeout (first refusal + grace)."""
        self.unreachable_failures = 0
        self.unreachable_deadline_ms = NEVER_MS
        self.read_round = 0
        """The highest leadership-confirmation round the leader of ``epoch`` sent us: echoed in every
        Fetch, which is how that leader confirms its rounds (``LeaderRole.request_read_round``)."""
        self.sent_read_round = 0
        """The highest round a Fetch sent to this leader carried (an ordinary one or an echo)."""
        self.echo_inflight: int | None = None
        """The correlation id of the read-round echo in flight (at most one, beside ``inflight``)."""
        self.durable_position: tuple[int, int] | None = None
        """(fetch_offset, last_fetched_epoch) of the last ordinary Fetch sent: durable here (it went only
        once everything fetched before was flushed), so an echo may carry it."""

    def start(
        self,
        now_ms: int,
        log: LogMeta,
        high_watermark: int,
        *,
        leader_resigned_backoff_ms: int | None = None,
    ) -> Decisions:
        """Begin fetching.  ``leader_resigned_backoff_ms`` is set when this leader already announced its
        resignation (EndQuorumEpoch) and our pre-election failed: campaign again after that backoff
        instead of waiting out a whole fetch timeout for a leader that will not come back."""
        if self.leader_id is None:
            self.retry_at_ms = now_ms  # discover the leader at the next poll
            return []
        if leader_resigned_backoff_ms is None:
            self.fetch_deadline_ms = now_ms + self.config.fetch_timeout_ms
        else:
            self.leader_resigned = True
            self.fetch_deadline_ms = now_ms + leader_resigned_backoff_ms
        return self.next_fetch(now_ms, log, high_watermark)

    def next_deadline_ms(self) -> int:
        return min(self.fetch_deadline_ms, self.unreachable_deadline_ms, self.retry_at_ms)

    def fetch_timed_out(self, now_ms: int) -> bool:
        return now_ms >= min(self.fetch_deadline_ms, self.unreachable_deadline_ms)

    def poll(self, now_ms: int, log: LogMeta, high_watermark: int) -> Decisions:
        if now_ms < self.retry_at_ms:
            return []
        self.retry_at_ms = NEVER_MS
        if self.leader_id is None:
            if not any(voter != self.config.node_id for voter in self.voter_ids):
                self.retry_at_ms = now_ms + self.config.fetch_timeout_ms  # nobody to ask (yet)
                return []
            return [self._discovery_fetch(log)]
        return self.next_fetch(now_ms, log, high_watermark)

    def can_grant_pre_vote(self, now_ms: int) -> bool:
        # KIP-996: a follower that hears from a live leader protects it from a disruptive rejoiner.
        # One whose own fetches are being refused (the leader's process is gone) has nothing to protect,
        # but only once the vote protection since its last answer from the leader is over: the leader's
        # lease counts on that promise, and refusals alone do not prove the leader is gone (issue #17).
        return (
            self.leader_resigned
            or not self.has_fetched_from_leader
            or (
                self.unreachable_failures >= UNREACHABLE_MIN_FAILURES
                and now_ms >= self.last_success_ms + self.config.vote_protection_ms
            )
        )

    def on_leader_resigned(self, backoff_ms: int, now_ms: int) -> None:
        self.leader_resigned = True
        self.fetch_deadline_ms = min(self.fetch_deadline_ms, now_ms + backoff_ms)

    def on_sent(self, correlation_id: int) -> None:
        """The core sent our :class:`SendFetch` under ``correlation_id``."""
        self.inflight = correlation_id

    def on_echo_sent(self, correlation_id: int) -> None:
        """The core sent our read-round echo (``SendFetch(echo=True)``) under ``correlation_id``."""
        self.echo_inflight = correlation_id

    def on_failed(self, correlation_id: int, retry_at_ms: int, now_ms: int, *, unreachable: bool) -> None:
        if self.echo_inflight == correlation_id:
            # The ordinary fetch carries the round too, once the flush allows it; its own failures are
            # what retries and leader-death detection go by.
            self.echo_inflight = None
            return
        if self.inflight == correlation_id:
            self.inflight = None
            self.retry_at_ms = retry_at_ms
            if unreachable and self.leader_id is not None:
                self._note_leader_unreachable(now_ms)
            else:
                self._clear_unreachable()

    def _note_leader_unreachable(self, now_ms: int) -> None:
        if self.unreachable_until_ms is None:
            # Randomized in [T/2, T) like an election timeout: every follower sees the same crash at
            # the same moment, and identical deadlines would split the vote.
            grace_ms = random_election_timeout_ms(self.config.election_timeout_ms, self.rng) // 2
            self.unreachable_until_ms = now_ms + grace_ms
        self.unreachable_failures += 1
        if self.unreachable_failures >= UNREACHABLE_MIN_FAILURES and self.is_voter:
            # The grace (>= T/2) already starts after the last answer; the explicit bound keeps the
            # vote protection whatever the grace becomes.
            protected_until = (
                self.last_success_ms + self.config.vote_protection_ms if self.has_fetched_from_leader else 0
            )
            self.unreachable_deadline_ms = max(now_ms, self.unreachable_until_ms, protected_until)

    def _clear_unreachable(self) -> None:
        """Any answer (or a mere timeout, which a slow leader also causes) ends the evidence."""
        self.unreachable_until_ms = None
        self.unreachable_failures = 0
        self.unreachable_deadline_ms = NEVER_MS

    def abandon_download(self) -> None:
        self.download = None

    # -- sending

    def next_fetch(self, now_ms: int, log: LogMeta, high_watermark: int) -> Decisions:
        """The next Fetch or FetchSnapshot, if one may go now (none in flight, no retry pending, and
        everything fetched so far is durable).  ``high_watermark``: the one this node knows, which the
        Fetch carries so that a leader with a higher one answers at once (:class:`FetchRequest`)."""
        if self.leader_id is None or self.inflight is not None:
            return []
        if self.retry_at_ms != NEVER_MS and self.retry_at_ms > now_ms:
            return []
        config = self.config
        if self.download is not None:
            snapshot_request = FetchSnapshotRequest(
                config.cluster_id,
                config.node_id,
                self.epoch,
                self.download.snapshot_id,
                self.download.position,
                config.fetch_max_bytes,
            )
            return [SendFetch(self.leader_id, snapshot_request)]
        if log.flushed_end < log.end_offset:
            return []  # fetch the next offset only once what we have is durable (on_flushed resumes)
        request = FetchRequest(
            config.cluster_id,
            config.node_id,
            self.epoch,
            log.end_offset,
            log.last_epoch,
            config.fetch_max_wait_ms,
            config.fetch_max_bytes,
            config.directory_id,
            self.read_round,
            high_watermark=high_watermark,
        )
        self.sent_read_round = max(self.sent_read_round, self.read_round)
        self.durable_position = (request.fetch_offset, request.last_fetched_epoch)
        return [SendFetch(self.leader_id, request, extra_timeout_ms=config.fetch_max_wait_ms)]

    def _echo_if_blocked(self, log: LogMeta, *, appending: bool = False) -> Decisions:
        """A read-round echo, sent now, when this voter holds a round it has not echoed yet and its next
        Fetch must wait for a flush (``appending``: a batch just fetched is about to be written).

        The echo proves only that this voter, after receiving the round, still followed this leader's
        epoch — it needs nothing durable, so it need not wait for the write, the flush or the listeners'
        replay of a big batch (docs/internals/raft.md, "Confirming leadership").  It carries the last
        offset reported durable, which the leader does not take as progress anyway.
        """
        if (
            not self.is_voter  # an observer's echo counts for nothing
            or self.leader_id is None
            or self.echo_inflight is not None
            or self.inflight is not None
            or self.download is not None
            or self.durable_position is None
            or self.read_round <= self.sent_read_round
            or not (appending or log.flushed_end < log.end_offset)
        ):
            return []
        config = self.config
        fetch_offset, last_fetched_epoch = self.durable_position
        self.sent_read_round = self.read_round
        request = FetchRequest(
            config.cluster_id,
            config.node_id,
            self.epoch,
            fetch_offset,
            last_fetched_epoch,
            0,
            config.fetch_max_bytes,
            config.directory_id,
            self.read_round,
            echo_only=True,
        )
        return [SendFetch(self.leader_id, request, echo=True)]

    def _discovery_fetch(self, log: LogMeta) -> SendFetch:
        voters = sorted(voter for voter in self.voter_ids if voter != self.config.node_id)
        voter = voters[int(self.rng.random() * len(voters))]
        request = FetchRequest(
            self.config.cluster_id,
            self.config.node_id,
            self.epoch,
            log.end_offset,
            log.last_epoch,
            0,
            self.config.fetch_max_bytes,
            self.config.directory_id,
        )
        return SendFetch(voter, request)

    # -- responses

    def _note_success(self, now_ms: int) -> ResetElectionRetries:
        self.has_fetched_from_leader = True
        self.last_success_ms = now_ms
        self._clear_unreachable()
        if not self.leader_resigned:  # a late answer from a resigned leader must not delay the election
            self.fetch_deadline_ms = now_ms + self.config.fetch_timeout_ms
        return ResetElectionRetries()

    def handle_fetch_response(
        self,
        correlation_id: int,
        dest: int,
        request: RaftRequest,
        response: FetchResponse,
        now_ms: int,
        log: LogMeta,
        high_watermark: int,
        scan_batches: BatchScanner,
    ) -> Decisions:
        if correlation_id == self.echo_inflight:
            return self._handle_echo_response(dest, response, now_ms, log)
        if self.inflight != correlation_id:
            return []
        self.inflight = None
        if dest != self.leader_id or not isinstance(request, FetchRequest):
            self.retry_at_ms = now_ms
            return []
        decisions: Decisions = [self._note_success(now_ms)]
        if response.leader_epoch == self.epoch:
            # Only our leader's rounds: this fetcher lives for one epoch, the rounds' ids are its leader's.
            self.read_round = max(self.read_round, response.read_round)
        if request.fetch_offset != log.end_offset:
            decisions.append(FetchAgain())
        elif response.diverging_epoch is not None:
            offset = truncation_offset(log, response.diverging_epoch, high_watermark)
            decisions += [TruncateLog(offset), FetchAgain()]
        elif response.snapshot_id is not None:
            self.download = SnapshotDownload(response.snapshot_id)
            decisions.append(FetchAgain())
        else:
            end_offset = log.end_offset
            if response.records:
                append = self._append(response.records, log, response.leader_epoch, scan_batches)
                if append is None:
                    self.retry_at_ms = now_ms + self.config.retry_backoff_ms
                    return decisions
                decisions.append(append)
                # Before the batch's write: the echo goes out in this same output, ahead of its flush.
                decisions += self._echo_if_blocked(log, appending=True)
                end_offset = append.batches[-1].last_offset + 1
            decisions += [AdvanceHighWatermark(min(response.high_watermark, end_offset)), FetchAgain()]
        return decisions

    def _handle_echo_response(
        self, dest: int, response: FetchResponse, now_ms: int, log: LogMeta
    ) -> Decisions:
        """The answer to a read-round echo: no records, only the leader's latest round (which may call
        for another echo while the flush still holds the ordinary fetch back)."""
        self.echo_inflight = None
        if dest != self.leader_id:
            return []
        decisions: Decisions = [self._note_success(now_ms)]
        if response.leader_epoch == self.epoch:
            self.read_round = max(self.read_round, response.read_round)
        return decisions + self._echo_if_blocked(log)

    def _append(
        self, data: bytes, log: LogMeta, leader_epoch: int, scan_batches: BatchScanner
    ) -> AppendToLog | None:
        try:
            batches = scan_batches(data)
        except Exception:  # corrupt bytes from the network: drop them and fetch again
            return None
        if not continues_log(batches, log.end_offset, log.last_epoch, leader_epoch):
            return None
        return AppendToLog(
            AppendFetched(batches[0].base_offset, batches[-1].last_offset, data), tuple(batches)
        )

    def handle_fetch_snapshot_response(
        self, correlation_id: int, response: FetchSnapshotResponse, now_ms: int
    ) -> Decisions:
        if self.inflight != correlation_id:
            return []
        self.inflight = None
        download = self.download
        if download is None:
            return []
        decisions: Decisions = [self._note_success(now_ms)]
        if response.snapshot_id != download.snapshot_id or response.position != download.position:
            self.download = None
            decisions.append(FetchAgain())
            return decisions
        data = response.unaligned_records
        if data:
            decisions.append(WriteChunk(WriteSnapshotChunk(download.snapshot_id, download.position, data)))
            download.position += len(data)
        if download.position >= response.size:
            self.download = None
            end_offset = download.snapshot_id.end_offset
            decisions += [ResetToSnapshot(download.snapshot_id), AdvanceHighWatermark(end_offset)]
        elif not data:
            self.download = None  # a leader that sends nothing would loop forever: start over
        decisions.append(FetchAgain())
        return decisions
