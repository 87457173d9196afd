"""The ControllerClient's rotation once it learned the quorum's voter set (KIP-853, from MetadataFetch).

The latest voter set wins, as on Kafka's brokers (which read it from the log they replicate): its voters
are the rotation, controllers learned from earlier hints are dropped, a removed controller leaves, and the
configured bootstrap servers are asked only when every voter's last attempt failed.  So a broker whose
bootstrap controller was removed and stopped still reaches a leader elected after that."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from kraft.client.controller import MAX_LEARNED_VOTERS, NO_VOTER_SET, ControllerClient, ControllerUnavailable
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc
from kraft.v1.common_pb2 import Endpoint, NodeRef

CALL_TIMEOUT_S = 10.0
"""Bounds a hang only: every call here is answered (or refused) by a local server at once."""


def quorum_voters(epoch: int, offset: int, voters: dict[int, str]) -> cpb.QuorumVoters:
    """A QuorumVoters message: ``voters`` id → ``host:port`` on the CONTROLLER listener."""
    message = cpb.QuorumVoters(version=cpb.VoterSetVersion(leader_epoch=epoch, offset=offset))
    for node_id, target in voters.items():
        host, port = target.rsplit(":", 1)
        message.voters.add(
            node_id=node_id, endpoints=[Endpoint(name="CONTROLLER", host=host, port=int(port))]
        )
    return message


def test_a_learned_voter_set_is_the_rotation_and_the_bootstrap_servers_its_last_resort() -> None:
    # Bootstrap servers: one that is also voter 1's address, one that the voter set does not name.
    client = ControllerClient([(-2, "10.0.0.1:9001"), (-3, "boot:9093")])
    client._learn(7, "10.0.0.7:9007")  # a hint from before: the voter set replaces it
    assert client.voter_set_version == NO_VOTER_SET
    assert client.learn_voter_set(
        quorum_voters(3, 10, {1: "10.0.0.1:9001", 2: "10.0.0.2:9002", 3: "10.0.0.3:9003"})
    )
    voters = [(1, "10.0.0.1:9001"), (2, "10.0.0.2:9002"), (3, "10.0.0.3:9003")]
    assert client.rotation == [*voters, (-3, "boot:9093")]
    # While a voter's last attempt did not fail, the bootstrap server is never picked.
    assert {client._next(None) for _ in range(9)} == set(voters)
    for _, target in voters[:2]:
        client._rotation.failed(target)
    assert {client._next(None) for _ in range(3)} == {voters[2]}
    client._rotation.failed(voters[2][1])
    assert client._next(None) == (-3, "boot:9093")  # every voter failed: the last resort
    client._rotation.failed("boot:9093")
    assert client._next(None) == voters[0]  # everything failed: start over, voters first


def test_an_older_voter_set_never_replaces_a_newer_one_and_a_removed_controller_leaves() -> None:
    client = ControllerClient([(-2, "boot:9093")])
    assert client.learn_voter_set(quorum_voters(3, 10, {1: "h1:1", 2: "h2:2", 3: "h3:3"}))
    # A deposed leader's answer (earlier epoch) or an earlier one of this leadership: ignored.
    assert not client.learn_voter_set(quorum_voters(3, 5, {1: "h1:1", 2: "h2:2"}))
    assert not client.learn_voter_set(quorum_voters(2, 99, {1: "h1:1", 2: "h2:2"}))
    assert client.voter_set == {1: "h1:1", 2: "h2:2", 3: "h3:3"}
    # Controller 1 removed (a later leadership, its snapshot's set: offset -1): out of the rotation.
    assert client.learn_voter_set(quorum_voters(4, -1, {2: "h2:2", 3: "h3:3"}))
    assert client.rotation == [(2, "h2:2"), (3, "h3:3"), (-2, "boot:9093")]
    # The same set under a newer version: taken (its version), nothing changed.
    assert not client.learn_voter_set(quorum_voters(5, -1, {2: "h2:2", 3: "h3:3"}))
    assert client.voter_set_version == (5, -1)
    # A set of voters without endpoints is nothing to dial: the rotation stays (its version is taken, so
    # that the controller does not send it with every answer).
    assert not client.learn_voter_set(cpb.QuorumVoters(version=cpb.VoterSetVersion(leader_epoch=9, offset=1)))
    assert client.voter_set_version == (9, 1) and client.voter_set == {2: "h2:2", 3: "h3:3"}


class _Lines:
    """A PoolLog that keeps its lines: (level, event, fields)."""

    def __init__(self) -> None:
        self.lines: list[tuple[str, str, dict[str, object]]] = []

    def info(self, event: str, **fields: object) -> None:
        self.lines.append(("info", event, fields))

    def warning(self, event: str, **fields: object) -> None:
        self.lines.append(("warning", event, fields))


def test_a_voter_set_listing_more_voters_than_a_quorum_may_have_is_refused_and_logged_once() -> None:
    lines = _Lines()
    client = ControllerClient([(-2, "boot:9093")], log=lines)
    assert client.learn_voter_set(quorum_voters(3, 10, {1: "h1:1", 2: "h2:2", 3: "h3:3"}))
    rotation = client.rotation
    many = {node_id: f"h{node_id}:{9000 + node_id}" for node_id in range(MAX_LEARNED_VOTERS + 1)}
    assert not client.learn_voter_set(quorum_voters(4, 20, many))
    assert client.rotation == rotation and client.voter_set == {1: "h1:1", 2: "h2:2", 3: "h3:3"}
    # Its version is taken: the same answer again (a controller sends it until the broker holds it) is
    # neither learned nor logged again.
    assert client.voter_set_version == (4, 20)
    assert not client.learn_voter_set(quorum_voters(4, 20, many))
    assert [(level, event) for level, event, _ in lines.lines] == [("warning", "controller_voters_refused")]
    assert lines.lines[0][2]["voters"] == MAX_LEARNED_VOTERS + 1
    # The bound itself is a quorum that is taken.
    del many[MAX_LEARNED_VOTERS]
    assert client.learn_voter_set(quorum_voters(5, 1, many))
    assert len(client.rotation) == MAX_LEARNED_VOTERS + 1  # the voters and the bootstrap server


def _with_voter(node_id: int, host: str, port: int) -> cpb.QuorumVoters:
    """A valid set of voters 1 and 2 to which one more voter is added as given."""
    message = quorum_voters(6, 1, {1: "h1:1", 2: "h2:2"})
    message.voters.add(node_id=node_id, endpoints=[Endpoint(name="CONTROLLER", host=host, port=port)])
    return message


@pytest.mark.parametrize(
    ("voters", "reason"),
    [
        (_with_voter(2, "h3", 3), "node id 2 is listed twice"),
        (_with_voter(-5, "h3", 3), "node id -5 is negative"),
        (_with_voter(3, "h 3", 3), "voter 3 has host 'h 3'"),
        (_with_voter(3, "evil/../h3", 3), "voter 3 has host"),
        (_with_voter(3, "a" * 254, 3), "voter 3 has host"),
        (_with_voter(3, "h3", 70_000), "voter 3 has port 70000"),
        (_with_voter(3, "h3", -1), "voter 3 has port -1"),
        (_with_voter(3, "H1", 1), "voters 1 and 3 both name H1:1"),
    ],
    ids=["repeated-id", "negative-id", "space", "slash", "too-long", "port-over", "port-negative", "shared"],
)
def test_a_voter_set_with_a_repeated_id_an_invalid_endpoint_or_a_shared_endpoint_is_refused(
    voters: cpb.QuorumVoters, reason: str
) -> None:
    lines = _Lines()
    client = ControllerClient([(-2, "boot:9093")], log=lines)
    assert not client.learn_voter_set(voters)
    assert client.voter_set == {} and client.rotation == [(-2, "boot:9093")]
    assert len(lines.lines) == 1 and lines.lines[0][1] == "controller_voters_refused"
    assert str(lines.lines[0][2]["reason"]).startswith(reason), lines.lines
    # What is valid stays taken: IP literals, a DNS name with '_', an endpoint that cannot be dialled.
    good = quorum_voters(7, 1, {1: "10.0.0.1:1", 2: "ctrl_2.example.com:2", 3: "::1:3"})
    good.voters.add(node_id=4, endpoints=[Endpoint(name="CONTROLLER", host="", port=0)])
    assert client.learn_voter_set(good)
    assert client.voter_set == {1: "10.0.0.1:1", 2: "ctrl_2.example.com:2", 3: "[::1]:3"}


def test_a_voters_endpoint_is_the_one_on_the_controller_listener() -> None:
    message = cpb.QuorumVoters(version=cpb.VoterSetVersion(leader_epoch=1, offset=-1))
    message.voters.add(
        node_id=1,
        endpoints=[
            Endpoint(name="REPLICATION", host="r1", port=1),
            Endpoint(name="CONTROLLER", host="c1", port=2),
        ],
    )
    message.voters.add(node_id=2, endpoints=[Endpoint(name="CONTROLLER", host="::1", port=3)])
    named = ControllerClient([(-2, "boot:9093")], listener_names=["controller"])
    assert named.learn_voter_set(message) and named.voter_set == {1: "c1:2", 2: "[::1]:3"}
    unnamed = ControllerClient([(-2, "boot:9093")])  # no listener names: a voter's first endpoint
    assert unnamed.learn_voter_set(message) and unnamed.voter_set == {1: "r1:1", 2: "[::1]:3"}


class _Controller(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self, active: bool, hint: NodeRef | None = None) -> None:
        self.active = active
        self.hint = hint  # the NOT_CONTROLLER answer's controller ref
        self.calls = 0

    async def DescribeCluster(self, request: Any, context: Any) -> cpb.DescribeClusterResponse:
        self.calls += 1
        if self.active:
            return cpb.DescribeClusterResponse(error_code=ErrorCode.NONE)
        return cpb.DescribeClusterResponse(error_code=ErrorCode.NOT_CONTROLLER, controller=self.hint)


async def _serve(servicer: _Controller) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
async def two() -> AsyncIterator[tuple[_Controller, grpc.aio.Server, str, _Controller, str]]:
    leader, other = _Controller(active=True), _Controller(active=False)  # type: ignore[abstract]
    leader_server, leader_target = await _serve(leader)
    other_server, other_target = await _serve(other)
    try:
        yield leader, leader_server, leader_target, other, other_target
    finally:
        for server in (leader_server, other_server):
            await server.stop(None)


@pytest.mark.parametrize("learned", [True, False])
async def test_a_broker_whose_bootstrap_controller_and_leader_are_gone_finds_the_next_leader(
    two: tuple[_Controller, grpc.aio.Server, str, _Controller, str], learned: bool
) -> None:
    """The bootstrap controller was removed and stopped (nothing listens at its address); the broker had
    reached leader 2 through a hint.  Then 2 stops too and 3 is elected: with the voter set learned the
    broker asks 3; with only its bootstrap server and the hinted leader it finds no controller (learned
    False: what the voter set is for)."""
    leader, leader_server, leader_target, other, other_target = two
    dead_bootstrap = f"127.0.0.1:{free_port()}"
    client = ControllerClient([(-2, dead_bootstrap)])
    client._learn(2, leader_target)  # what the NOT_CONTROLLER hint of the bootstrap controller taught it
    client._active, client._confirmed = (2, leader_target), True
    if learned:
        assert client.learn_voter_set(quorum_voters(5, 40, {2: leader_target, 3: other_target}))
    describe = cpb.DescribeClusterRequest()
    try:
        first = await client.call(lambda s: s.DescribeCluster, describe, timeout_s=CALL_TIMEOUT_S)
        assert first.error_code == ErrorCode.NONE and client.active_controller_id == 2
        await leader_server.stop(None)  # leader 2 gone; 3 wins the election
        other.active = True
        if not learned:
            with pytest.raises(ControllerUnavailable):
                await client.call(lambda s: s.DescribeCluster, describe, timeout_s=CALL_TIMEOUT_S)
            assert other.calls == 0
            return
        second = await client.call(lambda s: s.DescribeCluster, describe, timeout_s=CALL_TIMEOUT_S)
    finally:
        await client.close()
    assert second.error_code == ErrorCode.NONE and client.active_controller_id == 3
    assert other.calls == 1 and leader.calls == 1


@pytest.mark.parametrize("follow_moved", [True, False])
async def test_a_leader_that_moved_is_followed_at_the_hints_endpoint_once_its_learned_address_failed(
    two: tuple[_Controller, grpc.aio.Server, str, _Controller, str], follow_moved: bool
) -> None:
    """Voter 1 restarted on a new port and leads before the broker learned the set that records it (only
    the active controller sends the voter set).  Its learned address fails; voter 2 names it with its new
    endpoint: the client follows the hint there rather than the learned address, again and again
    (follow_moved False: the rule off — the call runs out of attempts)."""
    leader, _leader_server, leader_target, other, other_target = two
    host, port = leader_target.rsplit(":", 1)
    other.hint = NodeRef(node_id=1, endpoint=Endpoint(name="CONTROLLER", host=host, port=int(port)))
    old_address = f"127.0.0.1:{free_port()}"  # voter 1's endpoint before it moved: nothing listens
    client = ControllerClient([(-2, f"127.0.0.1:{free_port()}")])
    assert client.learn_voter_set(quorum_voters(5, 40, {1: old_address, 2: other_target}))
    if not follow_moved:
        client._moved = lambda hint, known: False  # type: ignore[method-assign]
    describe = cpb.DescribeClusterRequest()
    try:
        if not follow_moved:
            with pytest.raises(ControllerUnavailable):
                await client.call(lambda s: s.DescribeCluster, describe, timeout_s=CALL_TIMEOUT_S)
            assert leader.calls == 0
            return
        response = await client.call(lambda s: s.DescribeCluster, describe, timeout_s=CALL_TIMEOUT_S)
    finally:
        await client.close()
    assert response.error_code == ErrorCode.NONE and client.active_target == leader_target
    assert leader.calls == 1 and other.calls == 1
