"""One rule for which address a client asks next (:mod:`kraft.client.rotation`), and the clients that now
share it besides the controller client: ``describe_quorum`` (``kraft quorum describe``, the voter changes)
and the broker client's Metadata (``produce``, ``consume``, ``offsets``, ``log-dirs``).  An address whose
attempt failed is not asked again while one that has not failed is left, across the callers' retry rounds;
when all failed, every address is asked again.  Real gRPC servers in threads count what reached them (a
failing address aborts UNAVAILABLE at once, so nothing waits out a timeout); nothing asserts wall time."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import grpc
import pytest

from kraft.client.broker import BrokerClient
from kraft.client.quorum import describe_quorum
from kraft.client.rotation import address_rotation
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc, raft_pb2, raft_pb2_grpc

# --- the rule ---------------------------------------------------------------------------------------------


def test_the_rotation_starts_at_first_and_goes_round() -> None:
    rotation = address_rotation(["a", "b", "c"], first=1)
    assert [rotation.next() for _ in range(4)] == ["b", "c", "a", "b"]
    assert address_rotation(["a", "b", "c"], first=5).round() == ["c", "a", "b"]


def test_a_failed_address_is_skipped_while_another_has_not_failed() -> None:
    rotation = address_rotation(["a", "b", "c"])
    rotation.failed("a")
    assert [rotation.next() for _ in range(4)] == ["b", "c", "b", "c"]
    assert rotation.round() == ["b", "c"]
    rotation.answered("a")
    assert rotation.round() == ["a", "b", "c"]


def test_when_every_address_failed_they_are_all_asked_again() -> None:
    rotation = address_rotation(["a", "b"])
    rotation.failed("a")
    rotation.failed("b")
    assert rotation.round() == ["a", "b"]
    assert not rotation.is_failed("a") and not rotation.is_failed("b")
    rotation.failed("a")
    rotation.failed("b")
    assert rotation.next() == "a"


def test_next_avoids_an_address_and_starts_over_when_only_failed_ones_are_left() -> None:
    rotation = address_rotation(["a", "b", "c"])
    rotation.failed("b")
    assert rotation.next(avoid="a") == "c"
    rotation.failed("c")
    assert rotation.next(avoid="a") == "b", "b and c failed, a avoided: the marks are forgotten"
    assert address_rotation(["a"]).next(avoid="a") is None


def test_a_new_list_keeps_the_marks_of_the_addresses_still_in_it() -> None:
    rotation = address_rotation(["a", "b"], first=1)
    rotation.failed("a")
    rotation.failed("b")
    rotation.replace(["x", "a", "c"])
    assert rotation.round() == ["x", "c"], "a's mark kept, b's dropped with b; the new list's first first"
    with pytest.raises(ValueError):
        rotation.replace([])


def test_a_last_resort_is_asked_only_when_every_other_address_failed() -> None:
    rotation = address_rotation(["a"])
    rotation.replace(["boot", "v1", "v2"], last_resort=["boot"])
    assert [rotation.next() for _ in range(3)] == ["v1", "v2", "v1"]
    assert rotation.round() == ["v2", "v1", "boot"]
    rotation.failed("v1")
    assert rotation.next(avoid="v2") == "boot", "v1 failed and v2 avoided: the last resort"
    rotation.failed("v2")
    assert rotation.next() == "boot"
    rotation.failed("boot")
    assert rotation.next() == "v1", "all failed: start over, the others first"


# --- describe_quorum ----------------------------------------------------------------------------------------


class _Controller(raft_pb2_grpc.RaftServiceServicer):
    """``down``: every DescribeQuorum fails UNAVAILABLE (a transport failure); else NOT_LEADER_OR_FOLLOWER
    without a known leader (an election) for ``electing`` answers, then the leader's answer."""

    def __init__(self, *, down: bool = False, electing: int = 0) -> None:
        self.down = down
        self.electing = electing
        self.calls = 0

    def DescribeQuorum(
        self, request: raft_pb2.DescribeQuorumRequest, context: Any
    ) -> raft_pb2.DescribeQuorumResponse:
        self.calls += 1
        if self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
        if self.calls <= self.electing:
            return raft_pb2.DescribeQuorumResponse(
                error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, leader_id=-1, cluster_id="kc"
            )
        return raft_pb2.DescribeQuorumResponse(leader_id=2, leader_epoch=3, cluster_id="kc")


@pytest.fixture
def serve() -> Iterator[Any]:
    servers: list[grpc.Server] = []

    def start(servicer: Any, add: Any) -> str:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        add(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
        return f"127.0.0.1:{port}"

    try:
        yield start
    finally:
        for server in servers:
            server.stop(None)


def test_describe_quorum_asks_a_failed_address_once_not_every_round(serve: Any) -> None:
    down, electing = _Controller(down=True), _Controller(electing=4)  # type: ignore[abstract]
    targets = [serve(c, raft_pb2_grpc.add_RaftServiceServicer_to_server) for c in (down, electing)]
    answer = describe_quorum(targets, timeout_s=20.0)
    assert answer.leader_id == 2
    assert (down.calls, electing.calls) == (1, 5), "five rounds; the failed address only in the first"


def test_describe_quorum_asks_everyone_again_when_all_failed(serve: Any) -> None:
    downs = [_Controller(down=True), _Controller(down=True)]  # type: ignore[abstract]
    targets = [serve(c, raft_pb2_grpc.add_RaftServiceServicer_to_server) for c in downs]
    with pytest.raises(KraftError, match="no quorum leader found"):
        describe_quorum(targets, timeout_s=0.5)
    assert all(c.calls >= 2 for c in downs), [c.calls for c in downs]


# --- the broker client's Metadata ------------------------------------------------------------------------


class _Broker(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(self, *, down: bool = False) -> None:
        self.down = down
        self.calls = 0

    def Metadata(self, request: pb.BrokerMetadataRequest, context: Any) -> pb.BrokerMetadataResponse:
        self.calls += 1
        if self.down:
            context.abort(grpc.StatusCode.UNAVAILABLE, "failed to connect to all addresses")
        return pb.BrokerMetadataResponse(cluster_id="kc")


async def test_broker_metadata_asks_a_failed_address_once_across_refreshes(serve: Any) -> None:
    down, live = _Broker(down=True), _Broker()  # type: ignore[abstract]
    targets = [serve(b, broker_pb2_grpc.add_BrokerServiceServicer_to_server) for b in (down, live)]
    async with BrokerClient(targets, cluster_id="kc") as client:
        for _ in range(3):
            await client.metadata([])
        assert (down.calls, live.calls) == (1, 3)
        live.down = True
        with pytest.raises(KraftError, match="no broker could answer Metadata"):
            await client.metadata([])
        assert (down.calls, live.calls) == (2, 4), "the live one failed too: the failed one asked again"
        down.down = False
        assert (await client.metadata([])).cluster_id == "kc"
        assert down.calls == 3
