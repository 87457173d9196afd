"""Produce acknowledgement: acks=0/1 answer at append, acks=all waits for the high watermark.

Rules (Kafka's ``Partition.appendRecordsToLeader``, ``checkEnoughReplicasReachOffset`` and
``DelayedProduce``):

- **Before the append**, acks=all is refused with NOT_ENOUGH_REPLICAS when the *committed* ISR is smaller
  than ``min.insync.replicas`` (nothing is written). acks=0/1 are never refused for that.
- acks=0/1 are answered as soon as the leader has appended.
- An acks=all request whose records end at ``last_offset`` waits for ``required_offset = last_offset + 1``
  and is answered when the high watermark reaches it — i.e. when every member of the (maximal) ISR has a
  log end past its last record. At that moment the *maximal* ISR (committed + pending additions) is
  compared with ``min.insync.replicas``: at least → NONE; fewer (the ISR shrank while it waited) →
  NOT_ENOUGH_REPLICAS_AFTER_APPEND: the records are on every ISR member, but on fewer than the minimum,
  so the producer is told (it may retry; it never was told "durable"). Kafka checks this when the HWM
  passes the offset, not when the ISR shrinks: a shrink that lets the HWM advance answers the waiters
  right away through this same check.
- At the request's deadline, still waiting → REQUEST_TIMED_OUT (the records may still commit later —
  Kafka's at-least-once contract for a timed-out produce).
- Leadership lost (a newer partition record names another leader) → every waiter gets
  NOT_LEADER_OR_FOLLOWER (:meth:`AcksAllWaiters.fail_all`).
"""

from __future__ import annotations

import enum
import heapq
from dataclasses import dataclass

from kraft.errors import ErrorCode


class Acks(enum.IntEnum):
    NONE = 0
    LEADER = 1
    ALL = -1


def admit_produce(acks: Acks, isr_size: int, min_insync_replicas: int) -> ErrorCode:
    """The check before the append: acks=all needs a committed ISR of at least ``min.insync.replicas``."""
    if acks is Acks.ALL and isr_size < min_insync_replicas:
        return ErrorCode.NOT_ENOUGH_REPLICAS
    return ErrorCode.NONE


def answered_at_append(acks: Acks) -> bool:
    """acks=0/1 are answered once the leader appended; acks=all waits (:class:`AcksAllWaiters`)."""
    return acks is not Acks.ALL


@dataclass(frozen=True, slots=True)
class Completion:
    request_id: int
    error: ErrorCode


@dataclass(frozen=True, slots=True)
class _Waiter:
    required_offset: int
    deadline_ms: int


class AcksAllWaiters:
    """The acks=all produce requests of one partition waiting for its high watermark (a purgatory).

    Waiters are kept in two heaps (by required offset, by deadline) with lazy removal, so each event
    costs O(log n) per completed request, whatever the number waiting.
    """

    def __init__(self) -> None:
        self._waiting: dict[int, _Waiter] = {}
        self._by_offset: list[tuple[int, int]] = []
        self._by_deadline: list[tuple[int, int]] = []

    def __len__(self) -> int:
        return len(self._waiting)

    def add(
        self,
        request_id: int,
        required_offset: int,
        deadline_ms: int,
        high_watermark: int,
        maximal_isr_size: int,
        min_insync_replicas: int,
    ) -> list[Completion]:
        """Wait for ``required_offset`` (= last appended offset + 1); answered at once if already there."""
        if request_id in self._waiting:
            raise ValueError(f"produce request {request_id} is already waiting")
        if high_watermark >= required_offset:
            return [Completion(request_id, _reached(maximal_isr_size, min_insync_replicas))]
        self._waiting[request_id] = _Waiter(required_offset, deadline_ms)
        heapq.heappush(self._by_offset, (required_offset, request_id))
        heapq.heappush(self._by_deadline, (deadline_ms, request_id))
        return []

    def on_high_watermark(
        self, high_watermark: int, maximal_isr_size: int, min_insync_replicas: int
    ) -> list[Completion]:
        """Answer every waiter whose required offset the high watermark has reached."""
        done: list[Completion] = []
        error = _reached(maximal_isr_size, min_insync_replicas)
        while self._by_offset and self._by_offset[0][0] <= high_watermark:
            _, request_id = heapq.heappop(self._by_offset)
            if self._waiting.pop(request_id, None) is not None:
                done.append(Completion(request_id, error))
        return done

    def expire(self, now_ms: int) -> list[Completion]:
        """Answer REQUEST_TIMED_OUT to every waiter whose deadline is ``now_ms`` or earlier."""
        done: list[Completion] = []
        while self._by_deadline and self._by_deadline[0][0] <= now_ms:
            _, request_id = heapq.heappop(self._by_deadline)
            if self._waiting.pop(request_id, None) is not None:
                done.append(Completion(request_id, ErrorCode.REQUEST_TIMED_OUT))
        return done

    def fail_all(self, error: ErrorCode) -> list[Completion]:
        """Answer every waiter with ``error`` (leadership lost: NOT_LEADER_OR_FOLLOWER)."""
        done = [Completion(request_id, error) for request_id in sorted(self._waiting)]
        self._waiting.clear()
        self._by_offset.clear()
        self._by_deadline.clear()
        return done

    def next_deadline_ms(self) -> int | None:
        """When :meth:`expire` next has something to do (None when nothing waits)."""
        while self._by_deadline and self._by_deadline[0][1] not in self._waiting:
            heapq.heappop(self._by_deadline)
        return self._by_deadline[0][0] if self._by_deadline else None


def _reached(maximal_isr_size: int, min_insync_replicas: int) -> ErrorCode:
    if maximal_isr_size >= min_insync_replicas:
        return ErrorCode.NONE
    return ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND
