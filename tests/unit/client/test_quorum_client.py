"""`kraft quorum describe` views computed from a DescribeQuorum answer, and leader discovery."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc.aio
import pytest

from kraft.client.quorum import describe_quorum, describe_quorum_at, quorum_status, replication_rows
from kraft.errors import ErrorCode, KraftError
from kraft.netutil import free_port
from kraft.raft import messages as m
from kraft.raft.grpc_server import RaftServicer, node_refs
from kraft.v1 import common_pb2, raft_pb2, raft_pb2_grpc


def _replica(
    node_id: int, end: int, fetch_ms: int, caught_up_ms: int, dir_id: str = ""
) -> raft_pb2.ReplicaState:
    return raft_pb2.ReplicaState(
        replica_id=node_id,
        log_end_offset=end,
        last_fetch_timestamp_ms=fetch_ms,
        last_caught_up_timestamp_ms=caught_up_ms,
        directory_id=dir_id,
    )


def _answer() -> raft_pb2.DescribeQuorumResponse:
    return raft_pb2.DescribeQuorumResponse(
        leader_id=2,
        leader_epoch=5,
        high_watermark=95,
        cluster_id="cid",
        current_voters=[
            _replica(1, 90, 1_000, 900, "d1"),
            _replica(2, 100, 1_050, 1_050, "d2"),
            _replica(3, 100, 1_040, 1_040, "d3"),
        ],
        observers=[_replica(101, 70, 1_010, 700)],
        nodes=[
            common_pb2.NodeRef(
                node_id=2, endpoint=common_pb2.Endpoint(name="CONTROLLER", host="h2", port=9093)
            )
        ],
    )


def test_status_reports_the_most_lagging_voter_as_kafka_does() -> None:
    status = quorum_status(_answer())
    assert status.as_json() == {
        "cluster_id": "cid",
        "leader_id": 2,
        "leader_epoch": 5,
        "high_watermark": 95,
        "max_follower_lag": 10,
        "max_follower_lag_time_ms": 150,
        "current_voters": [1, 2, 3],
        "current_observers": [101],
        "voters": [
            {"id": 1, "directory_id": "d1", "endpoints": []},
            {"id": 2, "directory_id": "d2", "endpoints": ["CONTROLLER://h2:9093"]},
            {"id": 3, "directory_id": "d3", "endpoints": []},
        ],
        "observers": [{"id": 101, "directory_id": ""}],
    }


def test_status_of_a_fully_caught_up_quorum_has_no_lag() -> None:
    answer = _answer()
    del answer.current_voters[0]
    status = quorum_status(answer)
    assert (status.max_follower_lag, status.max_follower_lag_time_ms) == (0, 0)


def test_replication_rows_list_leader_then_followers_then_observers() -> None:
    rows = [row.as_json() for row in replication_rows(_answer())]
    assert [(r["node_id"], r["status"], r["lag"]) for r in rows] == [
        (2, "Leader", 0),
        (1, "Follower", 10),
        (3, "Follower", 0),
        (101, "Observer", 30),
    ]
    assert rows[0]["directory_id"] == "d2"
    assert set(rows[0]) == {
        "node_id",
        "directory_id",
        "log_end_offset",
        "lag",
        "last_fetch_timestamp",
        "last_caught_up_timestamp",
        "status",
    }


class _FixedHandler:
    """Answers DescribeQuorum as the leader (``node_id == leader``) or as a follower pointing at it."""

    def __init__(self, node_id: int, leader: int) -> None:
        self.node_id = node_id
        self.leader = leader

    async def handle_request(self, request: m.RaftRequest, *, peer_id: int | None = None) -> m.RaftResponse:
        if self.node_id != self.leader:
            code = ErrorCode.NOT_LEADER_OR_FOLLOWER
            return m.error_response_for(request, code, "not leader", self.leader, 4)
        voters = (m.ReplicaState(2, 12, 1, 1),)
        return m.DescribeQuorumResponse(ErrorCode.NONE, "", self.leader, 4, 12, voters)


@pytest.fixture
async def two_nodes() -> AsyncIterator[dict[int, int]]:
    ports = {1: free_port(), 2: free_port()}
    endpoints = {node_id: ("127.0.0.1", port) for node_id, port in ports.items()}
    servers = []
    for node_id, port in ports.items():
        server = grpc.aio.server()
        servicer = RaftServicer(_FixedHandler(node_id, leader=2), cluster_id="cid", endpoints=endpoints)
        raft_pb2_grpc.add_RaftServiceServicer_to_server(servicer, server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        servers.append(server)
    try:
        yield ports
    finally:
        for server in servers:
            await server.stop(grace=None)


async def test_describe_from_a_follower_is_redirected_to_the_leader(two_nodes: dict[int, int]) -> None:
    answer = await asyncio.to_thread(describe_quorum, [f"127.0.0.1:{two_nodes[1]}"], 5.0)
    assert answer.leader_id == 2 and answer.high_watermark == 12
    assert answer.cluster_id == "cid"


def test_describe_gives_up_at_its_deadline_with_a_clear_error() -> None:
    with pytest.raises(KraftError) as info:
        describe_quorum([f"127.0.0.1:{free_port()}"], timeout_s=0.5)
    assert info.value.code is ErrorCode.LEADER_NOT_AVAILABLE
    assert "no quorum leader found" in info.value.message


async def test_describe_at_one_node_answers_as_that_node_without_redirecting(
    two_nodes: dict[int, int],
) -> None:
    answer = await asyncio.to_thread(describe_quorum_at, f"127.0.0.1:{two_nodes[1]}", 5.0)
    assert answer is not None
    assert ErrorCode.from_wire(answer.error_code) is ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert answer.leader_id == 2


def test_describe_at_an_unreachable_node_is_none() -> None:
    assert describe_quorum_at(f"127.0.0.1:{free_port()}", 0.5) is None


def test_node_refs_name_each_controller_endpoint() -> None:
    refs = node_refs({3: ("h3", 9003), 1: ("h1", 9001)})
    assert [(r.node_id, r.endpoint.host, r.endpoint.port, r.endpoint.name) for r in refs] == [
        (1, "h1", 9001, "CONTROLLER"),
        (3, "h3", 9003, "CONTROLLER"),
    ]


def test_node_refs_carry_the_controller_listeners_security_protocol() -> None:
    refs = node_refs({1: ("h1", 9001)}, listener_name="CTRL", security_protocol="SSL")
    assert [(r.endpoint.name, r.endpoint.security_protocol) for r in refs] == [("CTRL", "SSL")]
    assert node_refs({1: ("h1", 9001)})[0].endpoint.security_protocol == "PLAINTEXT"
