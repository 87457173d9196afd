"""The fetching half of the core: a follower (or observer) pulling from its leader, the snapshot download
of a follower below the leader's log start, and an observer's leader discovery.

A :class:`FetcherRole` exists while its core is a Follower (``leader_id`` set) or an observer without a
leader (``leader_id`` None: it asks a random voter, whose answer names the leader).  It keeps at most one
Fetch/FetchSnapshot in flight and sends the next one only after what it appended is flushed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from kraft.raft.core_log import LogInvariantError
from kraft.raft.core_output import AppendFetched, InstallSnapshot, TruncateTo, WriteSnapshotChunk
from kraft.raft.core_types import BatchInfo
from kraft.raft.messages import (
    EpochEndOffset,
    FetchRequest,
    FetchResponse,
    FetchSnapshotRequest,
    FetchSnapshotResponse,
    RaftRequest,
    SnapshotId,
)
from kraft.raft.quorum import random_election_timeout_ms

if TYPE_CHECKING:
    from kraft.raft.core import RaftCore
    from kraft.raft.core_log import LogMeta

NEVER_MS = 1 << 62

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
    def __init__(self, core: RaftCore, leader_id: int | None) -> None:
        self.core = core
        self.leader_id = leader_id
        self.inflight: int | None = None
        self.retry_at_ms = NEVER_MS
        self.has_fetched_from_leader = False
        self.leader_resigned = False
        self.download: SnapshotDownload | None = None
        self.fetch_deadline_ms = NEVER_MS
        self.unreachable_until_ms: int | None = None
        """When the streak of refused fetches may end the fetch timeout (first refusal + grace)."""
        self.unreachable_failures = 0
        self.unreachable_deadline_ms = NEVER_MS

    def start(self, *, leader_resigned_backoff_ms: int | None = None) -> None:
        """Begin fetching.  ``leader_resigned_backoff_ms`` is set when this leader already announced its
        resignation (EndQuorumEpoch) and our pre-election failed: campaign again after that backoff
        instead of waiting out a whole fetch timeout for a leader that will not come back."""
        if self.leader_id is None:
            self.retry_at_ms = self.core.now_ms  # discover the leader at the next poll
            return
        if leader_resigned_backoff_ms is None:
            self.fetch_deadline_ms = self.core.now_ms + self.core.config.fetch_timeout_ms
        else:
            self.leader_resigned = True
            self.fetch_deadline_ms = self.core.now_ms + leader_resigned_backoff_ms
        self.maybe_send_fetch()

    def next_deadline_ms(self) -> int:
        return min(self.fetch_deadline_ms, self.unreachable_deadline_ms, self.retry_at_ms)

    def fetch_timed_out(self) -> bool:
        return self.core.now_ms >= min(self.fetch_deadline_ms, self.unreachable_deadline_ms)

    def poll(self) -> None:
        if self.core.now_ms < self.retry_at_ms:
            return
        self.retry_at_ms = NEVER_MS
        if self.leader_id is None:
            self._send_discovery_fetch()
        else:
            self.maybe_send_fetch()

    def can_grant_pre_vote(self) -> bool:
        # KIP-996: a follower that hears from a live leader protects it from a disruptive rejoiner.
        # One whose own fetches are being refused (the leader's process is gone) has nothing to protect;
        # a granted pre-vote changes no state, the real vote still decides.
        return (
            self.leader_resigned
            or not self.has_fetched_from_leader
            or self.unreachable_failures >= UNREACHABLE_MIN_FAILURES
        )

    def on_leader_resigned(self, backoff_ms: int) -> None:
        self.leader_resigned = True
        self.fetch_deadline_ms = min(self.fetch_deadline_ms, self.core.now_ms + backoff_ms)

    def on_failed(self, correlation_id: int, retry_at_ms: int, *, unreachable: bool) -> None:
        if self.inflight == correlation_id:
            self.inflight = None
            self.retry_at_ms = retry_at_ms
            if unreachable and self.leader_id is not None:
                self._note_leader_unreachable()
            else:
                self._clear_unreachable()

    def _note_leader_unreachable(self) -> None:
        core = self.core
        if self.unreachable_until_ms is None:
            # Randomized in [T/2, T) like an election timeout: every follower sees the same crash at
            # the same moment, and identical deadlines would split the vote.
            grace_ms = random_election_timeout_ms(core.config.election_timeout_ms, core.rng) // 2
            self.unreachable_until_ms = core.now_ms + grace_ms
        self.unreachable_failures += 1
        if self.unreachable_failures >= UNREACHABLE_MIN_FAILURES and core.is_voter:
            self.unreachable_deadline_ms = max(core.now_ms, self.unreachable_until_ms)

    def _clear_unreachable(self) -> None:
        """Any answer (or a mere timeout, which a slow leader also causes) ends the evidence."""
        self.unreachable_until_ms = None
        self.unreachable_failures = 0
        self.unreachable_deadline_ms = NEVER_MS

    def abandon_download(self) -> None:
        self.download = None

    # -- sending

    def maybe_send_fetch(self) -> None:
        core = self.core
        if self.leader_id is None or self.inflight is not None:
            return
        if self.retry_at_ms != NEVER_MS and self.retry_at_ms > core.now_ms:
            return
        config = core.config
        if self.download is not None:
            request: RaftRequest = FetchSnapshotRequest(
                config.cluster_id,
                config.node_id,
                core.epoch,
                self.download.snapshot_id,
                self.download.position,
                config.fetch_max_bytes,
            )
            self.inflight = core.send(self.leader_id, request, after_persist=False)
            return
        if core.log.flushed_end < core.log.end_offset:
            return  # fetch the next offset only once what we have is durable (on_flushed resumes)
        request = FetchRequest(
            config.cluster_id,
            config.node_id,
            core.epoch,
            core.log.end_offset,
            core.log.last_epoch,
            config.fetch_max_wait_ms,
            config.fetch_max_bytes,
        )
        self.inflight = core.send(
            self.leader_id, request, after_persist=False, extra_timeout_ms=config.fetch_max_wait_ms
        )

    def _send_discovery_fetch(self) -> None:
        core = self.core
        voters = sorted(core.voters)
        voter = voters[int(core.rng.random() * len(voters))]
        request = FetchRequest(
            core.config.cluster_id,
            core.node_id,
            core.epoch,
            core.log.end_offset,
            core.log.last_epoch,
            0,
            core.config.fetch_max_bytes,
        )
        self.inflight = core.send(voter, request, after_persist=False)

    # -- responses

    def _note_success(self) -> None:
        self.has_fetched_from_leader = True
        self._clear_unreachable()
        self.core.election_retries = 0
        if not self.leader_resigned:  # a late answer from a resigned leader must not delay the election
            self.fetch_deadline_ms = self.core.now_ms + self.core.config.fetch_timeout_ms

    def handle_fetch_response(
        self, correlation_id: int, dest: int, request: RaftRequest, response: FetchResponse
    ) -> None:
        if self.inflight != correlation_id:
            return
        self.inflight = None
        core = self.core
        if dest != self.leader_id or not isinstance(request, FetchRequest):
            self.retry_at_ms = core.now_ms
            return
        self._note_success()
        log = core.log
        if request.fetch_offset != log.end_offset:
            self.maybe_send_fetch()
            return
        if response.diverging_epoch is not None:
            offset = truncation_offset(log, response.diverging_epoch, core.high_watermark)
            log.truncate_to(offset)
            core.out.log_ops.append(TruncateTo(offset))
            self.maybe_send_fetch()
            return
        if response.snapshot_id is not None:
            self.download = SnapshotDownload(response.snapshot_id)
            self.maybe_send_fetch()
            return
        if response.records and not self._append(response.records, response.leader_epoch):
            self.retry_at_ms = core.now_ms + core.config.retry_backoff_ms
            return
        core.raise_high_watermark(min(response.high_watermark, log.end_offset))
        self.maybe_send_fetch()

    def _append(self, data: bytes, leader_epoch: int) -> bool:
        core = self.core
        try:
            batches = core.scan_batches(data)
        except Exception:  # corrupt bytes from the network: drop them and fetch again
            return False
        if not continues_log(batches, core.log.end_offset, core.log.last_epoch, leader_epoch):
            return False
        for batch in batches:
            core.log.append(batch.base_offset, batch.last_offset, batch.epoch)
        core.out.log_ops.append(AppendFetched(batches[0].base_offset, batches[-1].last_offset, data))
        core.out.flush = True
        return True

    def handle_fetch_snapshot_response(self, correlation_id: int, response: FetchSnapshotResponse) -> None:
        if self.inflight != correlation_id:
            return
        self.inflight = None
        download = self.download
        if download is None:
            return
        core = self.core
        self._note_success()
        if response.snapshot_id != download.snapshot_id or response.position != download.position:
            self.download = None
            self.maybe_send_fetch()
            return
        data = response.unaligned_records
        if data:
            core.out.log_ops.append(WriteSnapshotChunk(download.snapshot_id, download.position, data))
            download.position += len(data)
        if download.position >= response.size:
            self.download = None
            core.log.reset_to_snapshot(download.snapshot_id)
            core.out.log_ops.append(InstallSnapshot(download.snapshot_id))
            core.out.installed_snapshot = download.snapshot_id
            core.raise_high_watermark(download.snapshot_id.end_offset)
        elif not data:
            self.download = None  # a leader that sends nothing would loop forever: start over
        self.maybe_send_fetch()
