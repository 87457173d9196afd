"""How Raft messages leave and enter a node.

Outbound: the driver calls :meth:`Transport.send` with a voter id (or the leader id, for an observer) and
a request; it returns the peer's response or raises :class:`TransportError` (timeout, peer unavailable,
unknown destination).  A response whose ``error_code`` is not NONE is *not* an exception: Raft handles
those itself.

Inbound: the transport's server calls :meth:`RequestHandler.handle_request` on the driver and returns
what it resolves to.  That await may take a while on purpose: a Fetch long-polls up to ``max_wait_ms``
and a granted Vote answers only after the vote is persisted.  The transport must give each inbound call
its own task (grpc.aio does) so a parked fetch never blocks a vote.
"""

from __future__ import annotations

from typing import Protocol

from kraft.raft.api import LeaderAndEpoch
from kraft.raft.messages import RaftRequest, RaftResponse
from kraft.raft.voters import Endpoint, Voter, VoterSet


class TransportError(Exception):
    """A request got no response: the peer is unknown, unreachable, or did not answer in time."""

    def __init__(self, dest: int, reason: str) -> None:
        super().__init__(f"raft request to node {dest} failed: {reason}")
        self.dest = dest
        self.reason = reason


class Transport(Protocol):
    async def send(self, dest: int, request: RaftRequest, timeout_ms: int) -> RaftResponse:
        """Send ``request`` to node ``dest`` and return its response.

        ``timeout_ms`` bounds the whole call (for a Fetch the driver passes ``max_wait_ms`` plus the
        request timeout).  Raises :class:`TransportError` on timeout or when the peer is unavailable;
        never raises for a response that carries an error code.
        """
        ...

    async def close(self) -> None:
        """Release channels; pending sends fail with :class:`TransportError`."""
        ...


class VoterChangeHandler(Protocol):
    """The admin side of KIP-853 (implemented by :class:`kraft.raft.driver.RaftDriver`): each call
    resolves with the offset of the VotersRecord once it is committed, or raises
    :class:`kraft.raft.api.VoterChangeError` / :class:`kraft.raft.api.NotLeaderError`."""

    @property
    def voter_set(self) -> VoterSet: ...

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch: ...

    async def add_voter(self, voter: Voter) -> int: ...

    async def remove_voter(self, node_id: int, directory_id: str) -> int: ...

    async def update_voter(self, node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...]) -> int: ...


class RequestHandler(Protocol):
    async def handle_request(self, request: RaftRequest, *, peer_id: int | None = None) -> RaftResponse:
        """Answer one inbound request (the sender's id is inside it: candidate_id, leader_id, replica_id).

        ``peer_id`` is the node id the transport authenticated the caller as (mTLS client certificate),
        or None when it cannot tell (plaintext: then any caller can claim any node id).  When set, a
        request whose sender id differs is refused by the core.

        Never raises for protocol-level problems (wrong cluster id, stale epoch, …): those come back as a
        response with an error code.  Raises only if the node is shutting down
        (:class:`kraft.raft.api.RaftShutdownError`), which the transport maps to UNAVAILABLE.
        """
        ...
