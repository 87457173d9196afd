"""A voter whose endpoint moved tells the leader (KIP-853 UpdateRaftVoter, as Kafka's voters do).

The voter set in the log records each voter's endpoints as they were when it was added (or last
updated).  A controller restarted on another host or port keeps its node id and directory id, so it is
still that voter, but the others would dial its old address (votes, BeginQuorumEpoch, redirects).  This
task watches the voter set in force and the leader: when this node is a voter — same node id *and*
directory id — and the endpoints recorded for it differ from its own listener, it sends UpdateRaftVoter
to the leader (or, when it leads itself, appends the change directly) once a leader is known.

Bounded: at most ``max_attempts`` tries per leader epoch with a doubling backoff; every try is logged
(``voter_endpoint_update`` with ``outcome``), and ``voter_endpoint_update_gave_up`` says when it stops.
A newer leader epoch allows another round (a new leader may answer where the old one could not).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Protocol

import grpc

from kraft.errors import ErrorCode
from kraft.observability.logging import get_logger
from kraft.raft.api import LeaderAndEpoch, NotLeaderError, VoterChangeError
from kraft.raft.voters import Endpoint, VoterSet
from kraft.v1 import raft_pb2

UpdateSender = Callable[
    [str, raft_pb2.UpdateRaftVoterRequest, float], Awaitable[raft_pb2.RaftVoterChangeResponse]
]
"""Send an UpdateRaftVoter to ``target`` (``host:port``) with a deadline in seconds."""


class VoterView(Protocol):
    """What the updater reads from (and, when leading, asks of) the Raft driver."""

    @property
    def voter_set(self) -> VoterSet: ...

    @property
    def leader_and_epoch(self) -> LeaderAndEpoch: ...

    async def update_voter(self, node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...]) -> int: ...


@dataclass(frozen=True, slots=True)
class UpdaterSettings:
    poll_s: float = 0.5
    """How often the voter set and leader are looked at (no IO: two attribute reads)."""
    max_attempts: int = 8
    """Tries per leader epoch before giving up (logged) until the next epoch."""
    backoff_s: float = 0.5
    max_backoff_s: float = 5.0
    request_timeout_s: float = 10.0


class VoterEndpointUpdater:
    def __init__(
        self,
        raft: VoterView,
        *,
        node_id: int,
        directory_id: str,
        cluster_id: str,
        endpoints: Callable[[], tuple[Endpoint, ...]],
        resolve: Callable[[int], str | None],
        send: UpdateSender,
        settings: UpdaterSettings | None = None,
    ) -> None:
        """``endpoints``: this node's own controller endpoints (called when needed: the bound port is
        known only after start); ``resolve``: a voter's ``host:port`` from the voter set in force."""
        self._raft = raft
        self._node_id = node_id
        self._directory_id = directory_id
        self._cluster_id = cluster_id
        self._endpoints = endpoints
        self._resolve = resolve
        self._send = send
        self._settings = settings or UpdaterSettings()
        self._log = get_logger("voter_endpoint", node=node_id)
        self.updates = 0
        """Successful updates (for tests and diagnostics)."""

    def stale_endpoints(self) -> tuple[Endpoint, ...] | None:
        """The endpoints the voter set records for this node when they are not its own; None when this
        node is not a voter with its directory id (an observer, a wiped disk, a static quorum) or the
        recorded endpoints are right."""
        if not self._directory_id:
            return None
        voter = self._raft.voter_set.get(self._node_id)
        # A static voter (NO_DIRECTORY) never matches: its endpoints are the config's, not the log's.
        if voter is None or voter.directory_id != self._directory_id:
            return None
        return voter.endpoints if voter.endpoints != self._endpoints() else None

    async def run(self) -> None:
        """Until cancelled; never raises (a failed try is logged and retried within the bound)."""
        settings = self._settings
        epoch_tried = -1
        attempts = 0
        while True:
            await asyncio.sleep(settings.poll_s)
            recorded = self.stale_endpoints()
            leader = self._raft.leader_and_epoch
            if recorded is None or leader.leader_id < 0:
                continue
            if leader.epoch != epoch_tried:
                epoch_tried, attempts = leader.epoch, 0
            if attempts >= settings.max_attempts:
                continue
            attempts += 1
            outcome = await self._try_once(leader, recorded, attempts)
            if outcome:
                self.updates += 1
                continue
            if attempts >= settings.max_attempts:
                self._log.error(
                    "voter_endpoint_update_gave_up",
                    attempts=attempts,
                    leader=leader.leader_id,
                    epoch=leader.epoch,
                    reason="no leader of this epoch took the update; a newer epoch tries again",
                )
                continue
            await asyncio.sleep(min(settings.backoff_s * 2 ** (attempts - 1), settings.max_backoff_s))

    async def _try_once(self, leader: LeaderAndEpoch, recorded: tuple[Endpoint, ...], attempt: int) -> bool:
        mine = self._endpoints()
        fields = {
            "attempt": attempt,
            "leader": leader.leader_id,
            "epoch": leader.epoch,
            "recorded": _text(recorded),
            "endpoints": _text(mine),
        }
        try:
            if leader.leader_id == self._node_id:
                offset = await asyncio.wait_for(
                    self._raft.update_voter(self._node_id, self._directory_id, mine),
                    self._settings.request_timeout_s,
                )
            else:
                target = self._resolve(leader.leader_id)
                if target is None:
                    self._log.warning("voter_endpoint_update", outcome="leader_unknown_endpoint", **fields)
                    return False
                request = raft_pb2.UpdateRaftVoterRequest(
                    cluster_id=self._cluster_id,
                    voter_id=self._node_id,
                    voter_directory_id=self._directory_id,
                    listeners=[
                        raft_pb2.RaftVoterEndpoint(name=e.name, host=e.host, port=e.port) for e in mine
                    ],
                    timeout_ms=int(self._settings.request_timeout_s * 1000),
                )
                response = await self._send(target, request, self._settings.request_timeout_s + 1.0)
                code = ErrorCode.from_wire(response.error_code)
                if code is not ErrorCode.NONE:
                    self._log.warning(
                        "voter_endpoint_update",
                        outcome="refused",
                        error=code.name,
                        message=response.error_message,
                        **fields,
                    )
                    return False
                offset = response.offset
        except (VoterChangeError, NotLeaderError, TimeoutError, OSError, grpc.RpcError) as exc:
            self._log.warning("voter_endpoint_update", outcome="failed", error=repr(exc), **fields)
            return False
        self._log.info("voter_endpoint_update", outcome="updated", offset=offset, **fields)
        return True


def _text(endpoints: tuple[Endpoint, ...]) -> str:
    return ",".join(f"{e.name}://{e.host}:{e.port}" for e in endpoints) or "-"
