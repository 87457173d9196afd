"""A (pre-)election in progress: who was asked, who granted, who refused, whom to ask again.

An :class:`ElectionRole` exists while its core is Prospective (``pre_vote=True``, asking about
``epoch + 1`` without changing anyone's state) or Candidate (standard votes for its own, already bumped
epoch).  The core turns :meth:`ElectionRole.tally` outcomes into transitions.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING

from kraft.raft.messages import VoteRequest, VoteResponse

if TYPE_CHECKING:
    from kraft.raft.core import RaftCore

NEVER_MS = 1 << 62


class ElectionOutcome(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


class ElectionRole:
    def __init__(self, core: RaftCore, *, pre_vote: bool) -> None:
        self.core = core
        self.pre_vote = pre_vote
        self.vote_epoch = core.epoch + 1 if pre_vote else core.epoch
        self.granted: set[int] = {core.node_id}
        self.rejected: set[int] = set()
        self.retry_at_ms: dict[int, int] = {}
        self.lost = False

    def outcome(self) -> ElectionOutcome:
        if len(self.granted) >= self.core.majority:
            return ElectionOutcome.WON
        if len(self.core.voters) - len(self.rejected) < self.core.majority:
            return ElectionOutcome.LOST
        return ElectionOutcome.PENDING

    def start(self) -> None:
        for voter in sorted(self.core.voters - {self.core.node_id}):
            self._ask(voter)

    def _ask(self, voter: int) -> None:
        core = self.core
        request = VoteRequest(
            core.config.cluster_id,
            self.vote_epoch,
            core.node_id,
            voter,
            core.log.last_epoch,
            core.log.end_offset,
            self.pre_vote,
        )
        self.retry_at_ms.pop(voter, None)
        # A standard vote request relies on our own persisted vote; a pre-vote relies on nothing.
        core.send(voter, request, after_persist=not self.pre_vote)

    def is_for_this_election(self, request: VoteRequest) -> bool:
        return request.pre_vote == self.pre_vote and request.candidate_epoch == self.vote_epoch

    def tally(self, voter: int, response: VoteResponse) -> ElectionOutcome:
        (self.granted if response.vote_granted else self.rejected).add(voter)
        return self.outcome()

    def on_failed(self, voter: int, retry_at_ms: int) -> None:
        if not self.lost:
            self.retry_at_ms[voter] = retry_at_ms

    def poll(self) -> None:
        if self.lost:
            return
        due = [voter for voter, at_ms in self.retry_at_ms.items() if at_ms <= self.core.now_ms]
        for voter in due:
            if voter in self.granted or voter in self.rejected:
                self.retry_at_ms.pop(voter, None)
            else:
                self._ask(voter)

    def next_deadline_ms(self) -> int:
        return min(self.retry_at_ms.values(), default=NEVER_MS)
