"""Replay of a committed batch the controller did not build itself (followers, other epochs, anything
that does not line up with its own appends) into the next committed image.

A committed record that does not decode or does not fit the image (its CRC was fine: it was written like
that, or damaged before the CRC was computed) can never be applied; a controller or broker that skipped it
would serve an image that differs from every other node's.  :meth:`ReplayedBatch.check` turns such a
batch into :class:`~kraft.metadata.delta.UnreplayableRecordError`, which is fatal (fail-stop, issue #14),
as a replay failure is on Kafka's controllers (``fatalFaultHandler``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kraft.clock import Clock, Deadline
from kraft.errors import KraftError
from kraft.metadata import records as rec
from kraft.metadata.delta import MetadataDelta, unreplayable
from kraft.metadata.image import MetadataImage
from kraft.raft.api import CommittedBatch, offset_values
from kraft.reaper import release_removed_topics

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
        try:  # the bulk decoder first; a slice with a bad value is redone record by record
            decoded = list(rec.decode_values([value for _, value in piece]))
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
