"""Where a follower truncates its log before fetching from a new leader (KIP-101, KIP-279).

The follower asks the leader OffsetsForLeaderEpoch(its latest epoch) — or gets the same answer as a
Fetch ``DivergingEpoch`` — and compares the answer ``(epoch', end')`` with its own entries, exactly as
Kafka's ``AbstractFetcherThread.getOffsetTruncationState``:

- the answer is UNDEFINED (the leader cannot place the epoch): truncate to the high watermark, the
  pre-KIP-101 rule, which keeps every committed record;
- the follower has ``epoch'`` too: truncate to ``min(its end of epoch', end', log end)`` — done;
- the follower's largest epoch ≤ ``epoch'`` is a smaller one ``f`` (it never had ``epoch'``): truncate to
  the end of ``f`` and ask again with ``f`` (KIP-279: one answer is not enough when the two logs went
  through different epochs); the requested epoch strictly decreases, so this ends;
- the follower has no epoch ≤ ``epoch'`` at all: truncate to ``min(end', log end)`` (Kafka's rule for a
  follower that did not track epochs; kraft's logs always do, so the branch above handles a follower
  whose whole log is in epochs the leader never had: its own epoch lookup answers
  ``(epoch', start of its first epoch)``, which removes all of it).

**The high-watermark rule.** Truncation is decided by epochs alone — KIP-101 replaced truncating to the
high watermark, which lost acknowledged records and let replicas diverge. The high watermark is only a
floor: a step that would truncate below the follower's high watermark is *refused*
(:attr:`TruncationKind.BELOW_HIGH_WATERMARK`) instead of applied. With clean elections — kraft elects only
ISR members, and a replica joins the ISR only once its log end reaches the high watermark — every record
below a follower's high watermark is on every later leader, so the epoch rule never lands below it. If
it does, acknowledged records would be deleted: Kafka's data plane warns and truncates anyway; KRaft's
own log treats it as fatal (KafkaRaftClient). kraft promises that acknowledged means durable, so it takes
KRaft's rule — the caller stops replicating the partition and reports it — with one exception,
:func:`unclean_loss_allowed`: an unclean election (``unclean.leader.election.enable`` or ElectLeaders
UNCLEAN) elected a replica that may lack committed records, and the metadata records its leader epoch
``E`` (``PartitionRegistration.last_unclean_leader_epoch``). A follower may drop committed records written
in an epoch older than ``E`` — the loss that election accepted, as Kafka's followers do — and never a
committed record of epoch ``E`` or later: after the unclean election only clean ones (ISR/ELR members)
follow until the next unclean one, so such a divergence is a bug, not an accepted loss.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Callable
from dataclasses import dataclass

from kraft.replication.epochs import (
    UNDEFINED_EPOCH,
    EpochEndOffset,
    EpochEntries,
    end_offset_for_epoch,
    entries_truncated_to,
    latest_epoch,
)


class TruncationKind(enum.Enum):
    DONE = "done"  # truncate to `offset`, then fetch from it
    ASK_AGAIN = "ask_again"  # truncate to `offset`, then ask OffsetsForLeaderEpoch(next_epoch)
    BELOW_HIGH_WATERMARK = "below_high_watermark"  # refused: would delete committed records


@dataclass(frozen=True, slots=True)
class TruncationStep:
    kind: TruncationKind
    offset: int  # the follower's log end after this step (= its log end when nothing goes)
    next_epoch: int = UNDEFINED_EPOCH  # only for ASK_AGAIN


def next_truncation_step(
    entries: EpochEntries, log_end: int, high_watermark: int, answer: EpochEndOffset
) -> TruncationStep:
    """The follower's decision for one leader answer (see the module docstring for the rules)."""
    if answer.is_undefined:
        return TruncationStep(TruncationKind.DONE, min(high_watermark, log_end))
    mine = end_offset_for_epoch(entries, log_end, answer.epoch)
    if mine.is_undefined:
        step = TruncationStep(TruncationKind.DONE, min(answer.end_offset, log_end))
    elif mine.epoch != answer.epoch:
        offset = min(mine.end_offset, log_end)
        step = TruncationStep(TruncationKind.ASK_AGAIN, offset, mine.epoch)
    else:
        step = TruncationStep(TruncationKind.DONE, min(mine.end_offset, answer.end_offset, log_end))
    if step.offset < high_watermark:
        return TruncationStep(TruncationKind.BELOW_HIGH_WATERMARK, step.offset)
    return step


def epoch_at(entries: EpochEntries, offset: int) -> int:
    """The leader epoch the record at ``offset`` was written in (UNDEFINED when no entry covers it)."""
    index = bisect.bisect_right(entries, offset, key=lambda entry: entry[1]) - 1
    return entries[index][0] if index >= 0 else UNDEFINED_EPOCH


def unclean_loss_allowed(
    entries: EpochEntries,
    log_end: int,
    high_watermark: int,
    truncate_to: int,
    last_unclean_leader_epoch: int,
) -> bool:
    """Whether truncating to ``truncate_to`` drops only committed records (below ``high_watermark``) that
    were written in an epoch older than the partition's latest unclean election (0 = none: never).
    Epochs only grow along a log, so the last committed record dropped has the largest epoch of them."""
    last_dropped = min(high_watermark, log_end) - 1
    if truncate_to > last_dropped:
        return True  # nothing committed goes
    epoch = epoch_at(entries, last_dropped)
    return epoch != UNDEFINED_EPOCH and epoch < last_unclean_leader_epoch


def find_truncation(
    entries: EpochEntries,
    log_end: int,
    high_watermark: int,
    ask_leader: Callable[[int], EpochEndOffset],
) -> TruncationStep:
    """The whole conversation: ask with the latest epoch, apply intermediate steps, stop when done.

    ``ask_leader(epoch)`` is the leader's OffsetsForLeaderEpoch answer. The result is DONE (truncate to
    ``offset``; intermediate truncations are all at or above it, so applying only the last one is the
    same) or BELOW_HIGH_WATERMARK. An empty log has nothing to truncate.
    """
    epoch = latest_epoch(entries)
    if epoch == UNDEFINED_EPOCH:
        return TruncationStep(TruncationKind.DONE, log_end)
    while True:
        step = next_truncation_step(entries, log_end, high_watermark, ask_leader(epoch))
        if step.kind is not TruncationKind.ASK_AGAIN:
            return step
        if step.next_epoch >= epoch:
            raise ValueError(f"the leader answered epoch {epoch} with a larger epoch; no progress possible")
        entries, log_end, epoch = entries_truncated_to(entries, step.offset), step.offset, step.next_epoch
