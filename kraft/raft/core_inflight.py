"""The core's outstanding requests: correlation ids, destinations and request deadlines.

Owned by :class:`~kraft.raft.core.RaftCore`; cleared on every transition, since answers to requests of
an old state mean nothing in the new one.  Correlation ids keep counting across transitions so a late
answer can never be mistaken for a new request's.
"""

from __future__ import annotations

from dataclasses import dataclass

from kraft.raft.core_timers import NEVER_MS
from kraft.raft.messages import RaftRequest


@dataclass(slots=True)
class Inflight:
    dest: int
    request: RaftRequest
    deadline_ms: int


class InflightRequests:
    def __init__(self) -> None:
        self._next_correlation = 1
        self._requests: dict[int, Inflight] = {}

    def add(self, dest: int, request: RaftRequest, deadline_ms: int) -> int:
        """Track a request until ``deadline_ms``; returns its correlation id."""
        correlation_id = self._next_correlation
        self._next_correlation += 1
        self._requests[correlation_id] = Inflight(dest, request, deadline_ms)
        return correlation_id

    def pop(self, correlation_id: int) -> Inflight | None:
        return self._requests.pop(correlation_id, None)

    def pop_expired(self, now_ms: int) -> list[tuple[int, Inflight]]:
        """Remove and return the requests whose deadline passed, oldest correlation id first."""
        expired = [cid for cid, inflight in self._requests.items() if inflight.deadline_ms <= now_ms]
        return [(cid, self._requests.pop(cid)) for cid in expired]

    def clear(self) -> None:
        self._requests.clear()

    def next_deadline_ms(self) -> int:
        deadline = NEVER_MS
        for inflight in self._requests.values():  # no generator: this runs after every input
            deadline = min(deadline, inflight.deadline_ms)
        return deadline
