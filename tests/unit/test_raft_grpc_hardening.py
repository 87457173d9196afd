"""Issue #15 at the gRPC edge: a bounded fuzzer against an in-process RaftService over a real driver.

Random bytes and extreme field values for every RaftService method get only documented answers —
INVALID_ARGUMENT for undecodable bytes, otherwise OK with the protocol error inside the response — never
crash the node, never change its election state, and are logged at most once per peer per interval.
"""

from __future__ import annotations

import logging
import random
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.message import Message

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.grpc_server import RaftServicer, add_raft_service, valid_directory_id
from kraft.raft.memory import LoopbackNetwork, MemoryElectionStore, MemoryLogStore, MemorySnapshotStore
from kraft.raft.messages import INT32_MAX, MAX_EPOCH
from kraft.v1 import raft_pb2

CLUSTER = "fuzz-cluster"
DIRECTORY = "3JYSPKIBRe-ipK1M2Xq7Lg"
INT32 = (-(1 << 31), -1, INT32_MAX, MAX_EPOCH + 1)
INT64 = (-(1 << 63), -1, (1 << 63) - 1)
IDS = (-(1 << 31), -1, 1, 2, 3, 9, INT32_MAX)
STRINGS = ("", CLUSTER, "x" * 300, "\u00e9\u0000")

UNARY_METHODS: dict[str, type[Message]] = {
    "Vote": raft_pb2.VoteRequest,
    "BeginQuorumEpoch": raft_pb2.BeginQuorumEpochRequest,
    "EndQuorumEpoch": raft_pb2.EndQuorumEpochRequest,
    "Fetch": raft_pb2.FetchRequest,
    "FetchSnapshot": raft_pb2.FetchSnapshotRequest,
    "DescribeQuorum": raft_pb2.DescribeQuorumRequest,
}
RESPONSES: dict[str, type[Message]] = {
    "Vote": raft_pb2.VoteResponse,
    "BeginQuorumEpoch": raft_pb2.BeginQuorumEpochResponse,
    "EndQuorumEpoch": raft_pb2.EndQuorumEpochResponse,
    "Fetch": raft_pb2.FetchResponse,
    "FetchSnapshot": raft_pb2.FetchSnapshotResponse,
    "DescribeQuorum": raft_pb2.DescribeQuorumResponse,
}


@dataclass
class Node:
    port: int
    driver: RaftDriver
    elections: MemoryElectionStore
    servicer: RaftServicer


@pytest.fixture
async def node() -> AsyncIterator[Node]:
    """Voter 1 of {1, 2, 3} on a manual clock that never moves: only requests can change its state."""
    elections = MemoryElectionStore()
    driver = RaftDriver(
        RaftConfig(node_id=1, voters=(1, 2, 3), cluster_id=CLUSTER),
        transport=LoopbackNetwork().transport(1),
        log=MemoryLogStore(),
        elections=elections,
        snapshots=MemorySnapshotStore(),
        clock=ManualClock(),
        rng=random.Random(1),
    )
    await driver.start()
    port = free_port()
    server = grpc.aio.server()
    servicer = RaftServicer(driver, cluster_id=CLUSTER, endpoints={v: ("127.0.0.1", 1) for v in (1, 2, 3)})
    add_raft_service(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield Node(port, driver, elections, servicer)
    finally:
        await server.stop(None)
        await driver.stop()


def _raw_call(channel: grpc.aio.Channel, method: str) -> Callable[..., Any]:
    # No serializers: the bytes go on the wire exactly as given.
    return channel.unary_unary(
        f"/kraft.v1.RaftService/{method}", request_serializer=None, response_deserializer=None
    )


async def _status_of(call: Any, payload: bytes) -> tuple[grpc.StatusCode, bytes]:
    try:
        answer = await call(payload, timeout=5)
    except grpc.aio.AioRpcError as error:
        return error.code(), b""
    return grpc.StatusCode.OK, answer


def _random_payloads(rng: random.Random, count: int) -> list[bytes]:
    return [bytes(rng.getrandbits(8) for _ in range(rng.randint(1, 200))) for _ in range(count)]


def _extreme(rng: random.Random, pb_type: type[Message]) -> Message:
    """One message whose every field holds an edge value (epochs are all unusable)."""
    message = pb_type()
    for field in pb_type.DESCRIPTOR.fields:
        name = field.name
        if field.type == field.TYPE_MESSAGE:
            sub = getattr(message, name)
            for inner in sub.DESCRIPTOR.fields:
                values = INT64 if inner.type == inner.TYPE_INT64 else INT32
                setattr(sub, inner.name, rng.choice(values))
        elif field.is_repeated:
            getattr(message, name).extend(rng.choice(IDS) for _ in range(rng.randint(0, 40)))
        elif field.type == field.TYPE_STRING:
            setattr(message, name, rng.choice(STRINGS))
        elif field.type == field.TYPE_BOOL:
            setattr(message, name, rng.random() < 0.5)
        elif field.type == field.TYPE_INT64:
            setattr(message, name, rng.choice(INT64))
        elif "epoch" in name and "last" not in name:
            setattr(message, name, rng.choice(INT32))  # never an epoch a node may adopt
        else:
            setattr(message, name, rng.choice(IDS + INT32))
    return message


async def test_random_bytes_get_invalid_argument_or_a_protocol_error_and_change_nothing(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    rng = random.Random(15)
    caplog.set_level(logging.WARNING, logger="kraft.raft.grpc_server")
    seen: set[grpc.StatusCode] = set()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{node.port}") as channel:
        for method, response_type in RESPONSES.items():
            call = _raw_call(channel, method)
            for payload in _random_payloads(rng, 40):
                code, answer = await _status_of(call, payload)
                seen.add(code)
                assert code in (grpc.StatusCode.OK, grpc.StatusCode.INVALID_ARGUMENT), (method, code)
                if code is grpc.StatusCode.OK and method != "DescribeQuorum":
                    # Bytes that happen to parse carry no valid cluster id: refused inside the response.
                    parsed: Any = response_type.FromString(answer)
                    assert parsed.error_code != ErrorCode.NONE
    assert grpc.StatusCode.INVALID_ARGUMENT in seen
    assert node.elections.state is None and node.elections.writes == 0
    assert node.driver.leader_and_epoch.leader_id == -1
    warnings = [r for r in caplog.records if r.name == "kraft.raft.grpc_server"]
    assert len(warnings) == 1, "one peer: logged once per interval"
    assert warnings[0].exc_info is None and "raft_bad_request" in warnings[0].getMessage()


async def test_extreme_field_values_for_every_method_are_refused_and_change_nothing(node: Node) -> None:
    rng = random.Random(16)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{node.port}") as channel:
        for method, request_type in UNARY_METHODS.items():
            call = _raw_call(channel, method)
            for _ in range(60):
                code, answer = await _status_of(call, _extreme(rng, request_type).SerializeToString())
                assert code is grpc.StatusCode.OK, (method, code)
                response: Any = RESPONSES[method].FromString(answer)
                if method == "Vote":
                    assert not response.vote_granted
                if method != "DescribeQuorum":
                    assert response.error_code != ErrorCode.NONE or method == "Vote"
    assert node.elections.state is None and node.elections.writes == 0
    assert node.driver.leader_and_epoch.epoch == 0


async def test_fetch_stream_with_garbage_ends_with_invalid_argument(node: Node) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{node.port}") as channel:
        stream = channel.stream_stream(
            "/kraft.v1.RaftService/FetchStream", request_serializer=None, response_deserializer=None
        )

        async def requests() -> AsyncIterator[bytes]:
            yield b"\xff\xff\xff\xff\xff"

        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in stream(requests(), timeout=5):
                pass
    assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT


async def test_a_bad_directory_id_is_refused_in_fetch_vote_and_begin_quorum_epoch(node: Node) -> None:
    huge = "d" * 65536
    async with grpc.aio.insecure_channel(f"127.0.0.1:{node.port}") as channel:
        fetch = raft_pb2.FetchRequest(
            cluster_id=CLUSTER, replica_id=9, fetch_offset=0, max_bytes=1, replica_directory_id=huge
        )
        code, answer = await _status_of(_raw_call(channel, "Fetch"), fetch.SerializeToString())
        assert code is grpc.StatusCode.OK
        assert raft_pb2.FetchResponse.FromString(answer).error_code == ErrorCode.INVALID_REQUEST
        vote = raft_pb2.VoteRequest(
            cluster_id=CLUSTER, candidate_id=2, voter_id=1, candidate_directory_id=huge
        )
        code, answer = await _status_of(_raw_call(channel, "Vote"), vote.SerializeToString())
        assert code is grpc.StatusCode.OK
        assert raft_pb2.VoteResponse.FromString(answer).error_code == ErrorCode.INVALID_REQUEST
        begin = raft_pb2.BeginQuorumEpochRequest(
            cluster_id=CLUSTER, leader_id=2, leader_epoch=1, voter_id=1, voter_directory_id="dir-1"
        )
        code, answer = await _status_of(_raw_call(channel, "BeginQuorumEpoch"), begin.SerializeToString())
        assert code is grpc.StatusCode.OK
        assert raft_pb2.BeginQuorumEpochResponse.FromString(answer).error_code == ErrorCode.INVALID_REQUEST
    assert valid_directory_id("") and valid_directory_id(DIRECTORY)
    assert not valid_directory_id("dir-1") and not valid_directory_id(DIRECTORY + "A")
