"""Small value types of the core: its configuration and what it needs to know about fetched batches."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from kraft.raft.voters import VoterSet

LEASE_DRIFT_MARGIN_DIVISOR = 5
"""The leader lease is the vote protection minus a fifth of it: the margin for clocks that run at
different rates (a lease of 0.8 P measured on the leader's clock ends before a protection of P measured
on a voter's clock as long as each rate is within 1/9 of real time)."""


@dataclass(frozen=True, slots=True)
class RaftConfig:
    """Raft settings, named after Kafka's ``controller.quorum.*`` keys (all times in ms)."""

    node_id: int
    voters: tuple[int, ...]
    """The static voters (``controller.quorum.voters``, kraft.version 0): the voter set in force until
    the log (or its snapshot, or the bootstrap checkpoint) holds a VotersRecord — see
    :mod:`kraft.raft.voters`.  Empty with a dynamic quorum: the log decides."""
    cluster_id: str
    election_timeout_ms: int = 1000
    fetch_timeout_ms: int = 2000
    election_backoff_max_ms: int = 1000
    election_backoff_base_ms: int = 100
    append_linger_ms: int = 25
    """Group commit's bound: the longest pending appends wait for a flush in flight (0 = never wait);
    with no flush in flight they are written at once (``LeaderRole.batch_due``)."""
    request_timeout_ms: int = 2000
    retry_backoff_ms: int = 20
    fetch_max_wait_ms: int = 500
    fetch_high_watermark_wait_ms: int = 10
    """The longest the leader holds a Fetch with nothing new to send whose fetcher would learn a higher
    high watermark from the answer (``LeaderRole._owes_high_watermark``): the next batch, when it comes
    within this, carries the high watermark with its records (no extra round trip per commit under
    steady writes); else the answer goes with the high watermark alone.  0: at once (Kafka 4.1's rule)."""
    fetch_max_bytes: int = 8 * 1024 * 1024
    max_batch_records: int = 2000
    max_batch_bytes: int = 1024 * 1024
    observer_expiry_ms: int = 300_000
    max_observers: int = 1000
    """The leader tracks at most this many observers (non-voters that fetch); more are served but not
    tracked, after forgetting those not seen for :attr:`observer_forget_ms`."""
    max_epoch_jump: int = 1 << 20
    """A request or response may move our epoch at most this far at once.  One election moves it by one;
    the bound must still let a voter that was down through many elections rejoin (2^20 elections at
    one per second is 12 days of uninterrupted churn), while a forged message cannot leap to the top."""
    directory_id: str = ""
    """This node's metadata ``directory.id`` (meta.properties): with the node id, its replica key."""
    leader_lease_ms: int | None = None
    """Check-quorum leader lease (issue #17): how long after the start of a leadership round that a
    majority of voters echoed the leader may confirm its leadership without a new round
    (``RaftCore.confirm_leadership(lease=True)``).  None: :attr:`vote_protection_ms` minus the clock-drift
    margin (:attr:`lease_ms`); 0: no lease, every confirmation is a round.  Never more than that bound."""
    bootstrap_ids: tuple[int, ...] = ()
    """The pseudo node ids (negative, ``controller.quorum.bootstrap.servers``) a leaderless observer asks
    for the leader while it knows no voter (KIP-853: a node formatted with ``--no-initial-controllers``)."""

    def __post_init__(self) -> None:
        if len(set(self.voters)) != len(self.voters):
            raise ValueError(f"duplicate voter ids in {self.voters}")
        if any(pseudo >= -1 for pseudo in self.bootstrap_ids):
            raise ValueError(f"bootstrap server ids must be below -1, not {self.bootstrap_ids}")
        if min(self.election_timeout_ms, self.fetch_timeout_ms, self.request_timeout_ms) <= 0:
            raise ValueError("election, fetch and request timeouts must be positive")
        if self.max_observers < 0 or self.max_epoch_jump < 1:
            raise ValueError("max observers must not be negative and the epoch jump must be positive")
        if (
            min(
                self.append_linger_ms,
                self.retry_backoff_ms,
                self.fetch_max_wait_ms,
                self.fetch_high_watermark_wait_ms,
            )
            < 0
        ):
            raise ValueError("linger, retry backoff and fetch waits must not be negative")
        if self.leader_lease_ms is not None and not 0 <= self.leader_lease_ms <= self.max_lease_ms:
            raise ValueError(
                f"leader lease {self.leader_lease_ms} ms must be between 0 and {self.max_lease_ms} ms "
                "(the vote protection minus its clock-drift margin)"
            )

    @property
    def vote_protection_ms(self) -> int:
        """The least time a voter refuses every (pre-)vote and does not campaign after it took a response
        from its leader (its fetch timeout, or the refused-fetch path's bound of half an election
        timeout, whichever is shorter), and after it starts (a restarted voter forgot whom it protected).
        The leader lease is built on this promise (docs/internals/raft.md, "Leader lease")."""
        return min(self.fetch_timeout_ms, self.election_timeout_ms // 2)

    @property
    def max_lease_ms(self) -> int:
        """:attr:`vote_protection_ms` minus the clock-drift margin (a fifth of it): safe while every clock
        runs at a rate within r = 1/9 of real time (L / (1 - r) <= P / (1 + r): the leader's L ms of a
        slow clock end before a voter's P ms of a fast one)."""
        protection = self.vote_protection_ms
        return protection - protection // LEASE_DRIFT_MARGIN_DIVISOR

    @property
    def lease_ms(self) -> int:
        """The leader lease in force (0: none)."""
        return self.max_lease_ms if self.leader_lease_ms is None else self.leader_lease_ms

    @property
    def is_voter(self) -> bool:
        """Whether this node is a *static* voter; the core asks its voter set in force instead."""
        return self.node_id in self.voters

    @property
    def observer_forget_ms(self) -> int:
        """An observer not seen for this long is gone (a live one fetches at least every max wait)."""
        return 3 * self.fetch_timeout_ms


class BatchInfo(NamedTuple):
    """What the core needs of one fetched batch (the driver's codec reads it from the header, and
    decodes the records of a control batch only)."""

    base_offset: int
    last_offset: int
    epoch: int
    voters: VoterSet | None = None
    """The last VotersRecord of a control batch: the voter set it puts in force."""


BatchScanner = Callable[[bytes], list[BatchInfo]]
"""Reads the headers of every whole batch in a buffer; raises ``ValueError`` (or a ``KraftError``) on
corrupt or partial data.  Injected so the core never depends on the byte format."""
