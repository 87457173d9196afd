"""One partition on its leader: follower progress, the ISR, the high watermark (Kafka's Partition/Replica).

Theory of operation
-------------------
Events in — the leader's own log end moving (``on_leader_end_offset``), a follower's fetch
(``on_follower_fetch``), a newer partition record (``on_metadata``), the answer to an AlterPartition
(``on_alter_partition_response``) — and decisions out: the fetch's error, whether the high watermark
advanced, which ISR members to drop or add (``isr_shrink_candidates``, ``isr_expand_candidates``), the
AlterPartition request to send (``propose_isr``). Time comes in as ``now_ms``.

Rules and their source (Kafka's ``Partition.scala`` / ``Replica`` as of 3.x to 4.x):

- **Follower fetch epoch check** (KIP-320): a fetch carrying an older leader epoch → FENCED_LEADER_EPOCH,
  a newer one → UNKNOWN_LEADER_EPOCH (the leader has not seen that metadata yet); a fetch from a broker
  that is not a replica → UNKNOWN_LEADER_EPOCH when it carries an epoch, NOT_LEADER_OR_FOLLOWER when it
  does not (Kafka's ``followerReplicaOrThrow``: the (replica, epoch) pair may just not be known yet); a
  fetch offset past the leader's log end → OFFSET_OUT_OF_RANGE. A refused fetch changes nothing.
- **lastCaughtUpTimeMs** (``Replica.updateFetchStateOrThrow``): a fetch at or past the leader's current
  log end means the follower is caught up *now*; a fetch at or past the leader's log end *at the time of
  the follower's previous fetch* means it was caught up *then*. Never moves backwards.
- **ISR shrink** (``Partition.getOutOfSyncReplicas``, ``replica.lag.time.max.ms``): an ISR member other
  than the leader whose log end is below the leader's (durable) end — not "differs": a leader that serves
  unflushed batches can have followers durable past its own flushed end — and that has not been caught
  up for more than the maximum lag. Nothing is proposed while an AlterPartition is in flight.
- **ISR expand** (``Partition.isFollowerInSync`` + ``isReplicaIsrEligible``, KAFKA-7128, KIP-841): a
  replica outside the ISR whose log end ≥ the high watermark *and* ≥ the start offset of the current
  leader epoch (it has caught up into this leadership — otherwise committed data between the HWM and the
  leader's log end could be lost if it became leader), and that the broker's metadata says is eligible
  (not fenced, not in controlled shutdown, the broker epoch it fetched with is its registered one).
- **High watermark** (``Partition.maybeIncrementLeaderHW``): the minimum log end over the *maximal ISR* —
  the committed ISR plus the members a pending AlterPartition would add (KIP-497: a pending expansion is
  counted at once, which only makes the HWM more conservative; a pending shrink is not applied until the
  controller commits it, because the request may fail). It never decreases. A follower whose log end is
  not known yet in this leadership holds it where it is; a leader whose ISR is only itself advances it
  alone.  It does not advance while the committed ISR is below the effective ``min.insync.replicas``
  (KIP-966, ``set_min_isr``): the eligible leader replicas the controller keeps then (members that left
  the ISR since it dropped below min ISR) hold everything below it, so electing one loses nothing a
  consumer has read.
- **acks=all** (``Partition.checkEnoughReplicasReachOffset``): see :mod:`kraft.replication.acks`; it reads
  the committed ISR size before the append (:attr:`~PartitionLeaderState.isr`) and the maximal ISR size
  when the HWM passes the request (:attr:`~PartitionLeaderState.maximal_isr`).
- **AlterPartition answers** (``Partition.handleAlterPartitionUpdate/Error``): a success at the same or a
  newer partition epoch in our leader epoch commits the ISR (the same: the ISR asked for was already
  the committed one); INELIGIBLE_REPLICA (or OPERATION_NOT_ATTEMPTED)
  reverts to the committed ISR (the controller says it did not apply it); FENCED_LEADER_EPOCH,
  INVALID_UPDATE_VERSION, UNKNOWN_TOPIC_OR_PARTITION keep the change pending until the metadata brings
  the truth; anything else is retried as is. A newer partition record always replaces the pending state.

kraft deviation to know when wiring: kraft's controller bumps the leader epoch on *every* partition
change (docs/internals/metadata.md), so even a successful AlterPartition comes back in a new leader epoch;
this state then waits for that metadata (``WAIT_FOR_METADATA``) instead of applying the answer, and the
new epoch restarts the "caught up into this leadership" bar at the leader's log end.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

from kraft.errors import ErrorCode
from kraft.replication.types import (
    NO_BROKER_EPOCH,
    NO_LEADER_EPOCH,
    RECOVERING,
    UNKNOWN_OFFSET,
    AlterPartitionRequest,
    IsrMember,
    LeaderAndIsr,
)

# Is this replica allowed into the ISR? (replica id, broker epoch it fetched with) → bool; the shell
# answers from its metadata image: registered, not fenced, not in controlled shutdown, epoch matches.
IsrEligibility = Callable[[int, int], bool]


def _always_eligible(replica_id: int, broker_epoch: int) -> bool:
    return True


@dataclass(frozen=True, slots=True)
class FollowerProgress:
    """What the leader knows about one follower in this leadership (Kafka's ``ReplicaState``)."""

    replica_id: int
    log_end_offset: int = UNKNOWN_OFFSET  # its last fetch offset: everything below is on its disk
    last_caught_up_time_ms: int = 0
    last_fetch_time_ms: int = 0
    last_fetch_leader_log_end: int = UNKNOWN_OFFSET  # the leader's log end when it last fetched
    broker_epoch: int = NO_BROKER_EPOCH  # the broker epoch its last fetch carried

    def is_caught_up(self, leader_end_offset: int, now_ms: int, max_lag_ms: int) -> bool:
        """Kafka's ``ReplicaState.isCaughtUp``: at (or past: it may hold batches the leader has not
        flushed yet) the leader's durable end, or caught up within the lag."""
        return self.log_end_offset >= leader_end_offset or now_ms - self.last_caught_up_time_ms <= max_lag_ms

    def after_fetch(
        self, fetch_offset: int, now_ms: int, leader_end_offset: int, broker_epoch: int
    ) -> FollowerProgress:
        caught_up_ms = self.last_caught_up_time_ms
        if fetch_offset >= leader_end_offset:
            caught_up_ms = max(caught_up_ms, now_ms)
        elif fetch_offset >= self.last_fetch_leader_log_end:
            caught_up_ms = max(caught_up_ms, self.last_fetch_time_ms)
        return FollowerProgress(
            self.replica_id, fetch_offset, caught_up_ms, now_ms, leader_end_offset, broker_epoch
        )


@dataclass(frozen=True, slots=True)
class FetchResult:
    error: ErrorCode
    high_watermark_advanced: bool = False


class AlterPartitionFollowUp(enum.Enum):
    APPLIED = "applied"  # the committed ISR is now the proposed one
    REVERTED = "reverted"  # the controller refused it for good; back to the committed ISR
    WAIT_FOR_METADATA = "wait_for_metadata"  # stays pending until a newer partition record arrives
    RETRY = "retry"  # send the same request again (after a backoff)
    IGNORED = "ignored"  # an answer to a request that is no longer the pending one


_WAIT_FOR_METADATA_ERRORS = frozenset(
    {ErrorCode.FENCED_LEADER_EPOCH, ErrorCode.INVALID_UPDATE_VERSION, ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
)
_REVERT_ERRORS = frozenset({ErrorCode.INELIGIBLE_REPLICA})


class HighWatermarkHold:
    """One hold shared by the leader states of a broker (its heartbeat lease lapsed): setting
    :attr:`held` holds every state's high watermark at once, however many partitions it leads."""

    __slots__ = ("held",)

    def __init__(self, held: bool = False) -> None:
        self.held = held


_NO_SHARED_HOLD = HighWatermarkHold()  # (never held: the states created without a shared hold)


class PartitionLeaderState:
    """Replication state of one partition led by ``broker_id``; created when it becomes leader."""

    def __init__(
        self,
        broker_id: int,
        partition: LeaderAndIsr,
        *,
        leader_end_offset: int,
        high_watermark: int,
        now_ms: int,
        broker_epoch: int = NO_BROKER_EPOCH,
        high_watermark_held: bool = False,
        min_isr: int = 1,
        hold: HighWatermarkHold | None = None,
    ) -> None:
        """Kafka's ``makeLeader`` for a new leader: the epoch starts at the log end; every follower's
        position is unknown; ISR members count as caught up now (so they are not dropped at once),
        the others as never caught up.  ``high_watermark_held``: start held (the lease has lapsed).
        ``hold``: a hold shared with other states (held while it is, besides this state's own).
        ``min_isr``: the topic's min.insync.replicas (``set_min_isr``) — given here, not after: a leader
        alone in its ISR (elected from the ELR) would otherwise advance the HWM to its log end at once."""
        if partition.leader != broker_id:
            raise ValueError(f"broker {broker_id} is not the leader of {partition}")
        if not 0 <= high_watermark <= leader_end_offset:
            raise ValueError(f"high watermark {high_watermark} outside [0, {leader_end_offset}]")
        self.broker_id = broker_id
        self.broker_epoch = broker_epoch
        self._partition = partition
        self._leader_end_offset = leader_end_offset
        self._high_watermark = high_watermark
        self._epoch_start_offset = leader_end_offset
        self._pending: AlterPartitionRequest | None = None
        self._held = high_watermark_held
        self._hold = hold if hold is not None else _NO_SHARED_HOLD
        # effective min.insync.replicas (set_min_isr): the HWM is frozen below it
        self._min_isr = max(1, min(min_isr, len(partition.replicas)))
        self._followers: dict[int, FollowerProgress] = {
            replica: FollowerProgress(
                replica, last_caught_up_time_ms=now_ms if replica in partition.isr else 0
            )
            for replica in partition.replicas
            if replica != broker_id
        }
        self._maybe_advance_high_watermark()

    # --- queries ---------------------------------------------------------------------------------

    @property
    def partition(self) -> LeaderAndIsr:
        return self._partition

    @property
    def leader_epoch(self) -> int:
        return self._partition.leader_epoch

    @property
    def partition_epoch(self) -> int:
        return self._partition.partition_epoch

    @property
    def isr(self) -> tuple[int, ...]:
        """The committed ISR (what the controller has accepted)."""
        return self._partition.isr

    @property
    def maximal_isr(self) -> frozenset[int]:
        """The committed ISR plus the members a pending AlterPartition adds (KIP-497)."""
        if self._pending is None:
            return frozenset(self._partition.isr)
        return frozenset(self._partition.isr) | frozenset(self._pending.new_isr_ids)

    @property
    def pending(self) -> AlterPartitionRequest | None:
        return self._pending

    @property
    def high_watermark(self) -> int:
        return self._high_watermark

    @property
    def high_watermark_held(self) -> bool:
        return self._held or self._hold.held

    @property
    def leader_end_offset(self) -> int:
        return self._leader_end_offset

    @property
    def leader_epoch_start_offset(self) -> int:
        return self._epoch_start_offset

    def follower(self, replica_id: int) -> FollowerProgress | None:
        return self._followers.get(replica_id)

    def followers(self) -> list[FollowerProgress]:
        return [self._followers[r] for r in sorted(self._followers)]

    # --- events ----------------------------------------------------------------------------------

    def hold_high_watermark(self) -> None:
        """Stop advancing the high watermark (the broker's lease lapsed); events are still recorded."""
        self._held = True

    def set_min_isr(self, min_isr: int) -> bool:
        """The topic's min.insync.replicas (capped at the replication factor, as Kafka's effective min ISR);
        returns whether the high watermark advanced at once (a lowered minimum)."""
        self._min_isr = max(1, min(min_isr, len(self._partition.replicas)))
        return self._maybe_advance_high_watermark()

    def release_high_watermark(self) -> bool:
        """Advance again (the lease is back): returns whether the high watermark moved at once, to what
        the events recorded while held allow (nothing while the shared hold is still held)."""
        self._held = False
        return self._maybe_advance_high_watermark()

    def on_leader_end_offset(self, end_offset: int) -> bool:
        """The leader's own log end moved (append, or flush — see docs: what counts is what is durable).

        Returns whether the high watermark advanced. A leader never truncates its own log.
        """
        if end_offset < self._leader_end_offset:
            raise ValueError(f"leader log end went back from {self._leader_end_offset} to {end_offset}")
        self._leader_end_offset = end_offset
        return self._maybe_advance_high_watermark()

    def check_fetch_epoch(self, replica_id: int, leader_epoch: int) -> ErrorCode:
        """The epoch and membership checks of a follower fetch, without recording anything."""
        if leader_epoch != NO_LEADER_EPOCH:
            if leader_epoch < self.leader_epoch:
                return ErrorCode.FENCED_LEADER_EPOCH
            if leader_epoch > self.leader_epoch:
                return ErrorCode.UNKNOWN_LEADER_EPOCH
        if replica_id not in self._followers:
            if leader_epoch != NO_LEADER_EPOCH:
                return ErrorCode.UNKNOWN_LEADER_EPOCH
            return ErrorCode.NOT_LEADER_OR_FOLLOWER
        return ErrorCode.NONE

    def on_follower_fetch(
        self,
        replica_id: int,
        fetch_offset: int,
        leader_epoch: int,
        now_ms: int,
        broker_epoch: int = NO_BROKER_EPOCH,
        leader_log_end: int | None = None,
    ) -> FetchResult:
        """Record a follower's fetch at ``fetch_offset`` (its durable position: everything below is on
        its disk).

        ``leader_log_end``: the leader's whole log end, flushed or not, when it serves batches above its
        durable end (Kafka's followers fetch from the leader's log end): a follower may then be durable
        past the leader's :attr:`leader_end_offset`.  Its position is recorded as it is, but the high
        watermark still never passes the leader's durable end (it is one of the minimum's terms).
        None: the leader serves only durable batches, so a position past its durable end is refused.

        Call it only for a fetch whose position passed the divergence check
        (:func:`kraft.replication.epochs.diverging_epoch`), as Kafka does.
        """
        error = self.check_fetch_epoch(replica_id, leader_epoch)
        if error is not ErrorCode.NONE:
            return FetchResult(error)
        highest = (
            self._leader_end_offset
            if leader_log_end is None
            else max(leader_log_end, self._leader_end_offset)
        )
        if not 0 <= fetch_offset <= highest:
            return FetchResult(ErrorCode.OFFSET_OUT_OF_RANGE)
        progress = self._followers[replica_id]
        self._followers[replica_id] = progress.after_fetch(
            fetch_offset, now_ms, self._leader_end_offset, broker_epoch
        )
        return FetchResult(ErrorCode.NONE, self._maybe_advance_high_watermark())

    def on_metadata(self, partition: LeaderAndIsr, now_ms: int) -> bool:
        """A newer partition record while leading. Returns False when this broker no longer leads it
        (the caller drops this state and fails waiting produce requests with NOT_LEADER_OR_FOLLOWER).

        A record not newer than the one applied is ignored — also an *equal* one: a late copy of the
        record this state already applied from the AlterPartition answer must not clear a proposal made
        since (a pending expansion bounds the HWM; the controller may already have committed it, and an
        HWM past the new member's log end would acknowledge records it lacks — found by
        ``test_replication_cluster_sim.py``). A new leader epoch restarts the epoch at the leader's log
        end and resets the followers' catch-up clocks as Kafka's ``resetReplicaState`` does for a
        re-elected leader (their positions are kept). The pending AlterPartition, if any, is replaced by
        the record's committed ISR.
        """
        if partition.partition_epoch <= self._partition.partition_epoch:
            return True
        if partition.leader != self.broker_id:
            return False
        new_epoch = partition.leader_epoch > self._partition.leader_epoch
        followers: dict[int, FollowerProgress] = {}
        for replica in partition.replicas:
            if replica == self.broker_id:
                continue
            progress = self._followers.get(replica, FollowerProgress(replica))
            if new_epoch:
                in_sync = replica in partition.isr
                progress = replace(
                    progress,
                    last_fetch_leader_log_end=self._leader_end_offset,
                    last_fetch_time_ms=now_ms if in_sync else 0,
                    last_caught_up_time_ms=now_ms if in_sync else 0,
                )
            followers[replica] = progress
        if new_epoch:
            self._epoch_start_offset = self._leader_end_offset
        self._followers = followers
        self._partition = partition
        self._pending = None
        self._maybe_advance_high_watermark()
        return True

    # --- ISR decisions ---------------------------------------------------------------------------

    def isr_shrink_candidates(self, now_ms: int, replica_lag_time_max_ms: int) -> frozenset[int]:
        """ISR members that fell out of sync (none while an AlterPartition is in flight)."""
        if self._pending is not None:
            return frozenset()
        return frozenset(
            replica
            for replica in self._partition.isr
            if replica != self.broker_id
            and replica in self._followers
            and not self._followers[replica].is_caught_up(
                self._leader_end_offset, now_ms, replica_lag_time_max_ms
            )
        )

    def recovery_report_needed(self) -> bool:
        """The partition is RECOVERING (KIP-704, after an unclean election) and no AlterPartition is in
        flight: propose the ISR as it is; every proposal says RECOVERED (``propose_isr``)."""
        return self._pending is None and self._partition.leader_recovery_state == RECOVERING

    def isr_expand_candidates(self, eligible: IsrEligibility = _always_eligible) -> frozenset[int]:
        """Replicas outside the ISR that may join it now (none while an AlterPartition is in flight, nor
        while the partition is RECOVERING: the leader first reports RECOVERED)."""
        if self._pending is not None or self._partition.leader_recovery_state == RECOVERING:
            return frozenset()
        isr = frozenset(self._partition.isr)
        return frozenset(
            progress.replica_id
            for progress in self._followers.values()
            if progress.replica_id not in isr
            and progress.log_end_offset >= self._high_watermark
            and progress.log_end_offset >= self._epoch_start_offset
            and eligible(progress.replica_id, progress.broker_epoch)
        )

    def propose_isr(self, new_isr: Iterable[int]) -> AlterPartitionRequest:
        """Start an ISR change: the request to send; it stays pending until answered or superseded.  It
        says RECOVERED: a leader's log is the partition's history, so a leader elected uncleanly has
        nothing to recover before its first proposal (KIP-704; ``recovery_report_needed``)."""
        if self._pending is not None:
            raise ValueError("an AlterPartition is already in flight")
        ids = tuple(dict.fromkeys(new_isr))
        if self.broker_id not in ids:
            raise ValueError(f"the ISR must keep its leader {self.broker_id}: {ids}")
        unknown = [r for r in ids if r != self.broker_id and r not in self._followers]
        if unknown:
            raise ValueError(f"not replicas of this partition: {unknown}")
        order = {r: i for i, r in enumerate(self._partition.replicas)}
        ids = tuple(sorted(ids, key=lambda r: order.get(r, len(order))))
        members = tuple(
            IsrMember(r, self.broker_epoch if r == self.broker_id else self._followers[r].broker_epoch)
            for r in ids
        )
        self._pending = AlterPartitionRequest(
            self.broker_id, self.broker_epoch, self.leader_epoch, self.partition_epoch, members
        )
        self._maybe_advance_high_watermark()
        return self._pending

    def on_alter_partition_response(
        self, request: AlterPartitionRequest, result: LeaderAndIsr | ErrorCode
    ) -> AlterPartitionFollowUp:
        """Apply the controller's answer to ``request`` (see the module docstring for the rules)."""
        if request is not self._pending:
            return AlterPartitionFollowUp.IGNORED
        if isinstance(result, ErrorCode):
            if result in _REVERT_ERRORS:
                self._pending = None
                return AlterPartitionFollowUp.REVERTED
            if result in _WAIT_FOR_METADATA_ERRORS:
                return AlterPartitionFollowUp.WAIT_FOR_METADATA
            return AlterPartitionFollowUp.RETRY
        # Equal is applied (Kafka's handleAlterPartitionUpdate): the controller answers an ISR that
        # changes nothing with the partition as it is, and that answer must end the pending state.
        if result.partition_epoch < self._partition.partition_epoch:
            return AlterPartitionFollowUp.IGNORED
        if result.leader != self.broker_id or result.leader_epoch != self.leader_epoch:
            return AlterPartitionFollowUp.WAIT_FOR_METADATA
        self._partition = result
        self._pending = None
        self._maybe_advance_high_watermark()
        return AlterPartitionFollowUp.APPLIED

    # --- the high watermark ----------------------------------------------------------------------

    def _high_watermark_members(self) -> frozenset[int]:
        """Whose log end bounds the high watermark: the maximal ISR."""
        return self.maximal_isr

    def _high_watermark_candidate(self) -> int:
        candidate = self._leader_end_offset
        for replica in self._high_watermark_members():
            if replica == self.broker_id:
                continue
            progress = self._followers.get(replica)
            candidate = min(candidate, progress.log_end_offset if progress else UNKNOWN_OFFSET)
        return candidate

    def _maybe_advance_high_watermark(self) -> bool:
        if self._held or self._hold.held or len(self._partition.isr) < self._min_isr:
            return False
        candidate = self._high_watermark_candidate()
        if candidate > self._high_watermark:
            self._high_watermark = candidate
            return True
        return False
