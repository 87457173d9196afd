"""A (pre-)election in progress: who was asked, who granted, who refused, whom to ask again.

An :class:`ElectionRole` exists while its core is Prospective (``pre_vote=True``, asking about
``epoch + 1`` without changing anyone's state) or Candidate (standard votes for its own, already bumped
epoch).  It returns the vote requests to send as decisions; the core turns :meth:`ElectionRole.tally`
outcomes into transitions.
"""

from __future__ import annotations

import enum

from kraft.raft.core_decisions import BecomeCandidate, BecomeLeader, Decisions, SendRequest
from kraft.raft.core_log import LogMeta
from kraft.raft.core_timers import NEVER_MS
from kraft.raft.core_types import RaftConfig
from kraft.raft.messages import VoteRequest, VoteResponse
from kraft.raft.voters import VoterSet


class ElectionOutcome(enum.Enum):
    PENDING = "pending"
    WON = "won"
    LOST = "lost"


class ElectionRole:
    def __init__(
        self, config: RaftConfig, epoch: int, *, pre_vote: bool, voter_set: VoterSet | None = None
    ) -> None:
        """``voter_set``: the set in force (default: the static ``config.voters``)."""
        voter_set = voter_set if voter_set is not None else VoterSet.static(config.voters)
        self.config = config
        self.pre_vote = pre_vote
        self.vote_epoch = epoch + 1 if pre_vote else epoch
        self.voter_set = voter_set
        """The voter set in force when the election started (a candidate appends nothing, so only a
        loaded snapshot could change it, and the core then ends the election)."""
        self.voters = frozenset(voter_set.ids)
        self.majority = voter_set.majority
        self.granted: set[int] = {config.node_id}
        self.rejected: set[int] = set()
        self.retry_at_ms: dict[int, int] = {}
        self.lost = False
        """Lost and waiting out the backoff: ask nobody again."""

    def outcome(self) -> ElectionOutcome:
        if len(self.granted) >= self.majority:
            return ElectionOutcome.WON
        if len(self.voters) - len(self.rejected) < self.majority:
            return ElectionOutcome.LOST
        return ElectionOutcome.PENDING

    def start(self, log: LogMeta) -> Decisions:
        return [self._ask(voter, log) for voter in sorted(self.voters - {self.config.node_id})]

    def _ask(self, voter: int, log: LogMeta) -> SendRequest:
        known = self.voter_set.get(voter)
        voter_directory_id = known.directory_id if known is not None else ""
        request = VoteRequest(
            self.config.cluster_id,
            self.vote_epoch,
            self.config.node_id,
            voter,
            log.last_epoch,
            log.end_offset,
            self.pre_vote,
            self.config.directory_id,
            voter_directory_id,
        )
        self.retry_at_ms.pop(voter, None)
        # A standard vote request relies on our own persisted vote; a pre-vote relies on nothing.
        return SendRequest(voter, request, after_persist=not self.pre_vote)

    def is_for_this_election(self, request: VoteRequest) -> bool:
        return request.pre_vote == self.pre_vote and request.candidate_epoch == self.vote_epoch

    def tally(self, voter: int, response: VoteResponse) -> ElectionOutcome:
        if voter not in self.voters:
            return self.outcome()
        (self.granted if response.vote_granted else self.rejected).add(voter)
        return self.outcome()

    def transition_for_win(self) -> BecomeCandidate | BecomeLeader:
        """A won pre-vote leads to a real vote; a won vote to leadership."""
        return BecomeCandidate() if self.pre_vote else BecomeLeader(tuple(sorted(self.granted)))

    def concede(self) -> None:
        """A lost candidacy: stop asking (the core waits out the backoff, then goes back to pre-vote)."""
        self.lost = True
        self.retry_at_ms.clear()

    def on_failed(self, voter: int, retry_at_ms: int) -> None:
        if not self.lost:
            self.retry_at_ms[voter] = retry_at_ms

    def poll(self, now_ms: int, log: LogMeta) -> Decisions:
        if self.lost:
            return []
        decisions: Decisions = []
        due = [voter for voter, at_ms in self.retry_at_ms.items() if at_ms <= now_ms]
        for voter in due:
            if voter in self.granted or voter in self.rejected:
                self.retry_at_ms.pop(voter, None)
            else:
                decisions.append(self._ask(voter, log))
        return decisions

    def next_deadline_ms(self) -> int:
        return min(self.retry_at_ms.values(), default=NEVER_MS)
