"""VoterEndpointUpdater: a voter whose recorded endpoint is stale sends UpdateRaftVoter to the leader
(bounded retries per leader epoch), appends directly when it leads, and does nothing as an observer,
with a wiped disk (another directory id) or when the recorded endpoint is right."""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from kraft.errors import ErrorCode
from kraft.node.voter_endpoint import UpdaterSettings, VoterEndpointUpdater
from kraft.raft.api import LeaderAndEpoch
from kraft.raft.voters import Endpoint, Voter, VoterSet
from kraft.v1 import raft_pb2

OLD = (Endpoint("CONTROLLER", "127.0.0.1", 9001),)
NEW = (Endpoint("CONTROLLER", "127.0.0.1", 9101),)
DIR_2 = "AAAAAAAAAAAAAAAAAAAAAg"
FAST = UpdaterSettings(poll_s=0.001, max_attempts=3, backoff_s=0.001, max_backoff_s=0.002)


@dataclass
class FakeRaft:
    voter_set: VoterSet
    leader_and_epoch: LeaderAndEpoch
    appended: list[tuple[int, str, tuple[Endpoint, ...]]] = field(default_factory=list)

    async def update_voter(self, node_id: int, directory_id: str, endpoints: tuple[Endpoint, ...]) -> int:
        self.appended.append((node_id, directory_id, endpoints))
        self.voter_set = self.voter_set.with_endpoints(node_id, directory_id, endpoints)
        return 7


def voters(endpoints_of_2: tuple[Endpoint, ...], directory_of_2: str = DIR_2) -> VoterSet:
    return VoterSet(
        (
            Voter(1, "AAAAAAAAAAAAAAAAAAAAAQ", (Endpoint("CONTROLLER", "127.0.0.1", 9000),)),
            Voter(2, directory_of_2, endpoints_of_2),
        )
    )


class FakeLeader:
    """The leader's UpdateRaftVoter: refuses ``refusals`` times, then applies the change to ``raft``."""

    def __init__(self, raft: FakeRaft, refusals: int) -> None:
        self.raft = raft
        self.refusals = refusals
        self.requests: list[tuple[str, raft_pb2.UpdateRaftVoterRequest]] = []

    async def __call__(
        self, target: str, request: raft_pb2.UpdateRaftVoterRequest, timeout_s: float
    ) -> raft_pb2.RaftVoterChangeResponse:
        self.requests.append((target, request))
        if len(self.requests) <= self.refusals:
            return raft_pb2.RaftVoterChangeResponse(
                error_code=int(ErrorCode.REQUEST_TIMED_OUT), error_message="not yet"
            )
        endpoints = tuple(Endpoint(e.name, e.host, e.port) for e in request.listeners)
        self.raft.voter_set = self.raft.voter_set.with_endpoints(
            request.voter_id, request.voter_directory_id, endpoints
        )
        return raft_pb2.RaftVoterChangeResponse(offset=42)


def updater(raft: FakeRaft, send: FakeLeader, directory_id: str = DIR_2) -> VoterEndpointUpdater:
    return VoterEndpointUpdater(
        raft,
        node_id=2,
        directory_id=directory_id,
        cluster_id="c",
        endpoints=lambda: NEW,
        resolve=lambda node_id: f"127.0.0.1:{9000 + node_id - 1}",
        send=send,
        settings=FAST,
    )


async def eventually(predicate: Callable[[], bool], limit_s: float = 5.0) -> None:
    """Yield to the updater until ``predicate`` holds (bounded)."""
    async with asyncio.timeout(limit_s):
        for _ in itertools.count():
            if predicate():
                return
            await asyncio.sleep(0.001)


async def run_until(moved: VoterEndpointUpdater, predicate: Callable[[], bool]) -> None:
    task = asyncio.create_task(moved.run())
    try:
        await eventually(predicate)
    finally:
        task.cancel()


def test_stale_only_for_this_voter_with_its_own_directory_id() -> None:
    raft = FakeRaft(voters(OLD), LeaderAndEpoch(1, 3))
    send = FakeLeader(raft, 0)
    assert updater(raft, send).stale_endpoints() == OLD
    assert updater(raft, send, directory_id="AAAAAAAAAAAAAAAAAAAAAw").stale_endpoints() is None  # wiped
    raft.voter_set = voters(NEW)
    assert updater(raft, send).stale_endpoints() is None  # already right
    raft.voter_set = VoterSet((Voter(1, "AAAAAAAAAAAAAAAAAAAAAQ", OLD),))
    assert updater(raft, send).stale_endpoints() is None  # an observer
    raft.voter_set = VoterSet((Voter(1, "", OLD), Voter(2, "", OLD)))
    assert updater(raft, send).stale_endpoints() is None  # a static quorum


async def test_a_follower_retries_then_updates_through_the_leader() -> None:
    raft = FakeRaft(voters(OLD), LeaderAndEpoch(1, 3))
    send = FakeLeader(raft, refusals=2)
    moved = updater(raft, send)
    await run_until(moved, lambda: moved.updates == 1)
    assert len(send.requests) == 3
    target, request = send.requests[-1]
    assert target == "127.0.0.1:9000"  # the leader, where the voter set says it is
    assert (request.voter_id, request.voter_directory_id, request.cluster_id) == (2, DIR_2, "c")
    assert raft.voter_set.get(2) == Voter(2, DIR_2, NEW)
    await asyncio.sleep(0.02)
    assert len(send.requests) == 3  # nothing more to do


async def test_retries_are_bounded_per_leader_epoch() -> None:
    raft = FakeRaft(voters(OLD), LeaderAndEpoch(1, 3))
    send = FakeLeader(raft, refusals=10)
    moved = updater(raft, send)
    task = asyncio.create_task(moved.run())
    try:
        await eventually(lambda: len(send.requests) >= FAST.max_attempts)
        await asyncio.sleep(0.05)  # fifty polls
        assert len(send.requests) == FAST.max_attempts  # gave up for epoch 3
        send.refusals = 0
        raft.leader_and_epoch = LeaderAndEpoch(1, 4)  # a new epoch: another round, which succeeds
        await eventually(lambda: moved.updates >= 1)
    finally:
        task.cancel()
    assert len(send.requests) == FAST.max_attempts + 1
    assert raft.voter_set.get(2) == Voter(2, DIR_2, NEW)


async def test_a_leader_appends_its_own_update() -> None:
    raft = FakeRaft(voters(OLD), LeaderAndEpoch(2, 5))
    send = FakeLeader(raft, refusals=0)
    moved = updater(raft, send)
    await run_until(moved, lambda: moved.updates == 1)
    assert raft.appended == [(2, DIR_2, NEW)] and not send.requests
