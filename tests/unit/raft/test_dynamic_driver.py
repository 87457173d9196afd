"""KIP-853 through the asyncio driver on in-memory stores: a one-voter quorum grows to two, the voter set
survives a restart (rebuilt from the log), and a leader that removes itself hands over."""

from __future__ import annotations

import pytest
from raft_helpers import LoopbackCluster

from kraft.errors import ErrorCode
from kraft.raft.api import VoterChangeError
from kraft.raft.control_codec import voters_record_of
from kraft.raft.driver import RaftDriver
from kraft.raft.voters import Endpoint, Voter, VoterSet
from kraft.storage.batch import build_control_batch
from kraft.storage.ids import random_uuid


def bootstrapped(cluster: LoopbackCluster, voters: VoterSet) -> None:
    """Every node's log starts with the same VotersRecord: a dynamic quorum formatted with ``voters``."""
    for stores in cluster.stores.values():
        stores.log.append(build_control_batch(0, [voters_record_of(voters)], leader_epoch=0, timestamp_ms=0))
        stores.log.flush()


async def add_when_caught_up(cluster: LoopbackCluster, leader: RaftDriver, voter: Voter) -> int:
    """AddRaftVoter as a tool retries it: "not yet" (the observer has not caught up) is asked again."""
    for _ in range(100):
        try:
            return await cluster.complete(leader.add_voter(voter), "the voter change to commit")
        except VoterChangeError as exc:
            if exc.code is not ErrorCode.REQUEST_TIMED_OUT:
                raise
            await cluster.advance(20)
    raise AssertionError(f"voter {voter} was never added")


async def test_a_one_voter_quorum_grows_survives_a_restart_and_its_leader_hands_over() -> None:
    cluster = LoopbackCluster(2)
    directories = {1: random_uuid(), 2: random_uuid()}
    cluster.directory_ids = directories
    bootstrapped(cluster, VoterSet((Voter(1, directories[1]),)))
    try:
        await cluster.start_all()
        await cluster.run_until(lambda: cluster.leader() is not None, "node 1 leading alone", 2000)
        leader = cluster.drivers[1]
        assert leader.kraft_version == 1 and leader.voter_set.ids == (1,)
        assert not cluster.drivers[2].voter_set.is_voter(2, directories[2])

        with pytest.raises(VoterChangeError, match="UUID") as bad:
            await leader.add_voter(Voter(2, "not-a-uuid"))
        assert bad.value.code is ErrorCode.INVALID_REQUEST
        endpoints = (Endpoint("CONTROLLER", "localhost", 9093),)
        offset = await add_when_caught_up(cluster, leader, Voter(2, directories[2], endpoints))
        assert leader.high_watermark > offset
        await cluster.run_until(
            lambda: cluster.drivers[2].voter_set.ids == (1, 2), "node 2 seeing itself added", 2000
        )
        described = leader.describe_quorum()
        assert [(r.replica_id, r.directory_id) for r in described.current_voters] == [
            (1, directories[1]),
            (2, directories[2]),
        ]

        await cluster.stop(2)
        await cluster.start(2)  # rebuilds the voter set from its own log
        assert cluster.drivers[2].voter_set == leader.voter_set

        await cluster.complete(leader.remove_voter(1, directories[1]), "the leader's removal to commit")
        await cluster.run_until(lambda: cluster.leader() is cluster.drivers[2], "node 2 leading alone", 3000)
        assert cluster.drivers[2].voter_set.ids == (2,)
        assert not cluster.drivers[1].voter_set.is_voter(1, directories[1])
    finally:
        await cluster.close()


async def test_a_joiner_without_a_voter_set_finds_the_quorum_through_a_bootstrap_server() -> None:
    """``--no-initial-controllers``: no static voters, no voter set in its log; it asks a bootstrap
    server (pseudo id -2) for the leader, learns the voter set from the log it fetches, never campaigns
    while it is no voter, and votes once it is added."""
    cluster = LoopbackCluster(2)
    directories = {1: random_uuid(), 2: random_uuid()}
    cluster.directory_ids = directories
    endpoints = (Endpoint("CONTROLLER", "localhost", 9093),)
    cluster.config_overrides = {1: {"voters": ()}, 2: {"voters": (), "bootstrap_ids": (-2,)}}
    first = VoterSet((Voter(1, directories[1], endpoints),))
    cluster.stores[1].log.append(
        build_control_batch(0, [voters_record_of(first)], leader_epoch=0, timestamp_ms=0)
    )
    cluster.stores[1].log.flush()  # node 2's log stays empty: a joiner
    try:
        await cluster.start(1)
        await cluster.run_until(lambda: cluster.leader() is not None, "node 1 leading alone", 2000)
        leader = cluster.drivers[1]
        cluster.network.register(-2, leader)  # controller.quorum.bootstrap.servers names node 1
        joiner = await cluster.start(2)  # its first discovery Fetch already went out while starting
        await cluster.run_until(
            lambda: joiner.voter_set.ids == (1,) and joiner.leader_and_epoch.leader_id == 1,
            "the joiner learning the leader and the voter set",
            2000,
        )
        await cluster.advance(1000)  # several election timeouts: an observer never campaigns
        assert leader.leader_and_epoch.epoch == joiner.leader_and_epoch.epoch
        assert not joiner.voter_set.is_voter(2, directories[2])

        await add_when_caught_up(cluster, leader, Voter(2, directories[2], endpoints))
        await cluster.run_until(
            lambda: joiner.voter_set.ids == (1, 2), "the joiner seeing itself added", 2000
        )
        await cluster.stop(2)
        await cluster.start(2)  # restarts as a voter: the set is in its own log now
        assert cluster.drivers[2].voter_set == leader.voter_set and cluster.drivers[2].kraft_version == 1
        await cluster.complete(leader.remove_voter(1, directories[1]), "node 1's removal to commit")
        await cluster.run_until(lambda: cluster.leader() is cluster.drivers[2], "node 2 leading alone", 3000)
    finally:
        await cluster.close()
