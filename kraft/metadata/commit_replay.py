"""Replay of a committed batch the controller did not build itself (followers, other epochs, anything
that does not line up with its own appends) into the next committed image.

A committed record that does not decode or does not fit the image (its CRC was fine: it was written like
that, or damaged before the CRC was computed) can never be applied; a controller or broker that skipped it
would serve an image that differs from every other node's.  :meth:`ReplayedBatch.check` turns such a
batch into :class:`~kraft.metadata.delta.UnreplayableRecordError`, which is fatal (fail-stop, issue #14),
as a replay failure is on Kafka's controllers (``fatalFaultHandler``).

:func:`replay_known_commits` is the graceful stop's catch-up: the batches below Raft's high watermark that
the listener had not applied yet, replayed (within a time budget) so the image store's last save is not
behind a commit the node already knew — then, with what is left of the budget, those a follower holds in
its log whose commit the leader's next Fetch answer would tell it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kraft.clock import Clock, Deadline
from kraft.errors import KraftError
from kraft.metadata import records as rec
from kraft.metadata.change_decode import ReplayRecord, decode_replay_values
from kraft.metadata.delta import MetadataDelta, unreplayable
from kraft.metadata.image import MetadataImage
from kraft.raft.api import CommittedBatch, RaftClient, offset_values
from kraft.raft.listeners import LazyRecords
from kraft.reaper import release_removed_topics
from kraft.storage.batch import iter_batch_headers

# Big batches are decoded and replayed at most this many records per loop turn (and for at most the
# time budget, checked every REPLAY_PIECE_RECORDS), so heartbeats and Raft fetches get in meanwhile.
REPLAY_SLICE_RECORDS = 200
REPLAY_PIECE_RECORDS = 50


@dataclass(frozen=True, slots=True)
class ReplayedBatch:
    image: MetadataImage
    values: list[tuple[int, bytes]]
    """(offset, value) of every record that decoded (what the fetch window serves)."""
    undecodable: list[tuple[int, str]]
    """(offset, error) of values that are not metadata records (e.g. the test-only raw append RPC)."""
    replay_errors: list[str]
    """Records that decoded but did not fit the image (skipped by the delta)."""

    def check(self, last_offset: int) -> None:
        """Raise :class:`UnreplayableRecordError` if any record was left out."""
        error = unreplayable("batch", last_offset, self.undecodable, self.replay_errors)
        if error is not None:
            raise error


async def _next_turn() -> None:
    await asyncio.sleep(0)


async def replay_batch(
    committed: MetadataImage,
    batch: CommittedBatch,
    clock: Clock | None = None,
    budget_ms: int = 0,
    pause: Callable[[], Awaitable[None]] = _next_turn,
) -> ReplayedBatch:
    """Replay ``batch`` on ``committed``, awaiting ``pause`` (one loop turn; a controller passes Raft's
    ``yield_turn``, so a follower's next Fetch goes first) after every ``REPLAY_SLICE_RECORDS`` records
    or ``budget_ms`` on ``clock``, whichever comes first."""
    after = committed.offset
    fresh = [pair for pair in offset_values(batch.records) if pair[0] > after]
    delta = MetadataDelta(committed)
    values: list[tuple[int, bytes]] = []
    undecodable: list[tuple[int, str]] = []
    deadline = Deadline(clock, budget_ms)
    since_yield = 0
    for start in range(0, len(fresh), REPLAY_PIECE_RECORDS):
        if since_yield >= REPLAY_SLICE_RECORDS or (since_yield and deadline.expired()):
            await pause()
            deadline = Deadline(clock, budget_ms)
            since_yield = 0
        piece = fresh[start : start + REPLAY_PIECE_RECORDS]
        since_yield += len(piece)
        decoded: list[ReplayRecord]
        try:  # the bulk decoder first; a slice with a bad value is redone record by record
            decoded = list(decode_replay_values([value for _, value in piece]))
        except KraftError:
            decoded = []
            for offset, value in piece:
                try:
                    decoded.append(rec.decode_value(value))
                except KraftError as exc:
                    undecodable.append((offset, exc.message))
                    continue
                values.append((offset, value))
        else:
            values.extend(piece)
        # A ClearElrRecord may clear thousands of partitions: replayed in steps of CLEAR_ELR_STEP, each
        # counted as that many records against the slice (and within the time budget).
        for step in delta.replay_decoded_steps(decoded):
            since_yield += step
            if since_yield >= REPLAY_SLICE_RECORDS or deadline.expired():
                await pause()
                deadline = Deadline(clock, budget_ms)
                since_yield = 0
    delta.offset = batch.last_offset
    delta.epoch = batch.epoch
    image = delta.apply()
    # A deleted big topic's partitions are freed in slices once the last image holding it goes.
    release_removed_topics(delta.removed_topics().values())
    return ReplayedBatch(image, values, undecodable, list(delta.replay_errors))


STOP_CATCH_UP_READ_BYTES = 1024 * 1024
"""Committed log bytes read per step of :func:`replay_known_commits` (the Raft listener reads as much)."""


@dataclass(frozen=True, slots=True)
class KnownCommits:
    """What :func:`replay_known_commits` reached."""

    image: MetadataImage
    """The newest image outside a metadata transaction (the image store saves no other)."""
    batches: int
    """Batches replayed (some may lie past ``image``, inside a transaction left open)."""
    high_watermark: int
    stopped: str
    """Why it ended: ``caught_up``, ``budget`` (time ran out), ``unreplayable`` (a batch that does not
    apply: left to the next start, where the listener fails on it), or ``error`` (the log read failed)."""
    known_high_watermark: int = -1
    """The high watermark the node knew when the catch-up began (after the driver's output in flight);
    ``high_watermark`` is above it when the wait for the leader's (:meth:`RaftClient.learn_log_end_commit`)
    moved it.  -1: the catch-up ended before reading it."""


async def replay_known_commits(
    raft: RaftClient,
    committed: MetadataImage,
    clock: Clock,
    budget_ms: int,
    *,
    piece_budget_ms: int = 0,
    learn: bool = True,
) -> KnownCommits:
    """Replay on ``committed`` the batches Raft knows committed (below its high watermark, read back from
    the local log as the listener reads them) that it has not been handed yet.

    For a graceful stop, after the listener was unregistered: a follower applies a commit
    ``controller.quorum.follower.listener.delay.ms`` after it learns it, so a stop right after a commit
    saved an image store behind the node's own log.  Then (``learn``), with what is left of the budget, a
    follower whose log holds records above its high watermark waits for the leader's next Fetch answer
    to tell it whether they committed (:meth:`RaftClient.learn_log_end_commit`: the Fetch that committed
    them at the leader was answered before, and the next answer comes with the next write or after the
    leader's long-poll wait, ``controller.quorum.fetch.max.wait.ms``), and replays those too.  Bounded by
    ``budget_ms`` on ``clock``, checked before each read and after each batch (so it overruns by at most
    one batch's replay), the waits by what is left of it: a stop never waits long, and whatever is left
    is replayed from the log at the next start, as before.  Never raises for the log or a record: a stop
    goes on with what was reached."""
    until_ms = clock.monotonic_ms() + budget_ms
    deadline = Deadline(clock, budget_ms)
    progress = _Progress(committed)
    # A follower learns a high watermark with the Fetch answer that brings the next records, and may
    # stop while those records' fsync is in flight; its listener is handed them only once that output
    # ran to its end.  Wait for the same (yield_turn: until the driver parks), within the budget, so what
    # is replayed is on disk.  (Strictly: a Fetch answer handled between the driver parking and this task
    # resuming could still move the high watermark over records being flushed; the node's next start
    # discards a store ahead of its log, so that race costs a full replay, never a wrong image.)
    if not await _bounded(raft.yield_turn(), _left_s(clock, until_ms, budget_ms)):
        return progress.reached(raft.high_watermark, "budget", -1)
    known = raft.high_watermark
    stopped = await _replay_below(raft, progress, known, deadline, clock, piece_budget_ms)
    if stopped != "caught_up" or not learn or deadline.expired():
        return progress.reached(known, stopped, known)
    # The commits the node has not learned yet: records in its log the leader may already count as
    # committed.  The wait and the driver's output that brings the answer (the records' fsync) are both
    # bounded by what is left of the budget; a leader, a follower without a leader or with nothing above
    # its high watermark returns at once.
    left_s = _left_s(clock, until_ms, budget_ms)
    if not await _bounded(raft.learn_log_end_commit(), left_s):
        return progress.reached(known, "budget", known)
    if raft.high_watermark <= known:
        return progress.reached(known, "caught_up", known)
    if not await _bounded(raft.yield_turn(), _left_s(clock, until_ms, budget_ms)):
        return progress.reached(known, "budget", known)
    learned = raft.high_watermark
    stopped = await _replay_below(raft, progress, learned, deadline, clock, piece_budget_ms)
    return progress.reached(learned, stopped, known)


def _left_s(clock: Clock, until_ms: int, budget_ms: int) -> float | None:
    """Seconds left of the budget for a wait (on the event loop's time; None: no budget)."""
    if budget_ms <= 0:
        return None
    return max(0.0, (until_ms - clock.monotonic_ms()) / 1000)


async def _bounded(wait: Awaitable[object], timeout_s: float | None) -> bool:
    """Await ``wait`` for at most ``timeout_s``; False when it ran out (the wait is cancelled)."""
    try:
        await asyncio.wait_for(wait, timeout_s)
    except TimeoutError:
        return False
    return True


class _Progress:
    """The catch-up's position: the image replayed so far and the last one outside a transaction."""

    __slots__ = ("batches", "image", "saved")

    def __init__(self, committed: MetadataImage) -> None:
        self.image = committed
        self.saved = committed
        self.batches = 0

    def reached(self, high_watermark: int, stopped: str, known: int) -> KnownCommits:
        return KnownCommits(self.saved, self.batches, high_watermark, stopped, known)


async def _replay_below(
    raft: RaftClient,
    progress: _Progress,
    high_watermark: int,
    deadline: Deadline,
    clock: Clock,
    piece_budget_ms: int,
) -> str:
    """Replay the batches from ``progress`` up to ``high_watermark``; returns why it stopped (as
    :attr:`KnownCommits.stopped`)."""
    while True:
        if progress.image.offset + 1 >= high_watermark:
            return "caught_up"
        if deadline.expired():
            return "budget"
        try:
            piece = await raft.read_committed(progress.image.offset + 1, STOP_CATCH_UP_READ_BYTES)
        except Exception:  # below the log start (a snapshot), shut down, a damaged segment: stop here
            return "error"
        if not piece.records:
            return "caught_up"
        try:
            headers = list(iter_batch_headers(piece.records))
        except Exception:  # a batch that fails its CRC: the next start's listener meets it too
            return "error"
        progressed = False
        for position, header in headers:
            if header.last_offset <= progress.image.offset:
                continue
            if header.last_offset >= high_watermark:
                break  # committed (and flushed) after the wait above: the next start replays it
            batch = CommittedBatch(
                header.base_offset,
                header.last_offset,
                header.partition_leader_epoch,
                () if header.is_control else LazyRecords(piece.records, position),
                header.max_timestamp,
                header.is_control,
            )
            replayed = await replay_batch(progress.image, batch, clock, piece_budget_ms)
            if replayed.undecodable or replayed.replay_errors:
                return "unreplayable"
            progress.image = replayed.image
            progress.batches += 1
            progressed = True
            if not progress.image.transaction:
                progress.saved = progress.image
            if deadline.expired():
                return "budget"
        if not progressed:  # nothing below the high watermark in what was read (never expected): no spin
            return "caught_up"
