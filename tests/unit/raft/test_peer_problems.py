"""Misconfiguration and dead peers are logged within seconds, rate-limited, naming peer and address.

:class:`kraft.raft.driver.PeerProblems` on a manual clock: a peer refusing our requests with
INCONSISTENT_CLUSTER_ID / INCONSISTENT_VOTER_SET is a warning at once; a peer that fails transport calls
is a warning after a few consecutive failures; both repeat at most once per interval; recovery is logged."""

from __future__ import annotations

import asyncio
import logging

import grpc
import grpc.aio
import pytest

from kraft.client.quorum import PeerProblemView, describe_quorum_at, peer_problems_of
from kraft.errors import ErrorCode
from kraft.observability.logging import KeyValueFormatter, get_logger
from kraft.raft.driver import PEER_FAILURES_BEFORE_WARNING, PeerProblem, PeerProblems
from kraft.raft.grpc_server import RaftServicer, add_raft_service
from kraft.raft.messages import DescribeQuorumResponse

ADDRESSES = {2: "127.0.0.1:9102", 3: "127.0.0.1:9103"}


def _lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The records as the nodes write them (``key=value`` lines)."""
    formatter = KeyValueFormatter()
    return [formatter.format(r) for r in caplog.records if r.name == "kraft.raft.peer-test"]


@pytest.fixture
def problems(caplog: pytest.LogCaptureFixture) -> PeerProblems:
    caplog.set_level(logging.INFO, logger="kraft.raft.peer-test")
    return PeerProblems(get_logger("raft.peer-test"), ADDRESSES.get, interval_ms=30_000)


def test_a_refusal_is_a_warning_at_once_with_the_peer_and_address(
    problems: PeerProblems, caplog: pytest.LogCaptureFixture
) -> None:
    problems.answered(2, ErrorCode.INCONSISTENT_CLUSTER_ID, "cluster id B, expected A", now_ms=0)
    lines = _lines(caplog)
    assert len(lines) == 1
    assert "event=raft_peer_refused" in lines[0] and "peer=2" in lines[0]
    assert "address=127.0.0.1:9102" in lines[0] and "code=INCONSISTENT_CLUSTER_ID" in lines[0]
    assert problems.problems() == {2: "INCONSISTENT_CLUSTER_ID from 127.0.0.1:9102: cluster id B, expected A"}


def test_refusals_repeat_at_most_once_per_interval_per_peer_and_code(
    problems: PeerProblems, caplog: pytest.LogCaptureFixture
) -> None:
    for now_ms in range(0, 30_000, 500):
        problems.answered(2, ErrorCode.INCONSISTENT_VOTER_SET, "not a voter", now_ms)
    problems.answered(3, ErrorCode.INCONSISTENT_VOTER_SET, "not a voter", 1_000)
    assert len(_lines(caplog)) == 2, "one per peer within the interval"
    problems.answered(2, ErrorCode.INCONSISTENT_VOTER_SET, "not a voter", 30_000)
    assert len(_lines(caplog)) == 3, "again after the interval"


def test_an_unreachable_peer_is_a_warning_after_a_few_failures_and_its_recovery_is_logged(
    problems: PeerProblems, caplog: pytest.LogCaptureFixture
) -> None:
    for attempt in range(PEER_FAILURES_BEFORE_WARNING - 1):
        problems.send_failed(3, "UNAVAILABLE: connection refused", attempt * 100)
    assert _lines(caplog) == [], "a single failed call (a restart, an election) is not worth a warning"
    for attempt in range(20):
        problems.send_failed(3, "UNAVAILABLE: connection refused", 1_000 + attempt * 100)
    lines = _lines(caplog)
    assert len(lines) == 1, lines
    assert "event=raft_peer_unreachable" in lines[0] and "address=127.0.0.1:9103" in lines[0]
    assert f"failures={PEER_FAILURES_BEFORE_WARNING}" in lines[0] and "connection refused" in lines[0]
    assert 3 in problems.problems()
    problems.answered(3, ErrorCode.NONE, "", 5_000)
    lines = _lines(caplog)
    assert "event=raft_peer_reachable" in lines[-1] and "peer=3" in lines[-1]
    assert problems.problems() == {}


def test_ordinary_errors_are_not_refusals(problems: PeerProblems, caplog: pytest.LogCaptureFixture) -> None:
    problems.answered(2, ErrorCode.FENCED_LEADER_EPOCH, "", 0)
    problems.answered(2, ErrorCode.NOT_LEADER_OR_FOLLOWER, "", 0)
    assert _lines(caplog) == [] and problems.problems() == {}


def test_reports_are_structured_for_describe_quorum(problems: PeerProblems) -> None:
    for attempt in range(PEER_FAILURES_BEFORE_WARNING):
        problems.send_failed(3, "UNAVAILABLE: connection refused", attempt)
    problems.answered(2, ErrorCode.INCONSISTENT_VOTER_SET, "voter 2 is not in my voter set", 10)
    assert problems.reports() == (
        PeerProblem(2, "127.0.0.1:9102", "INCONSISTENT_VOTER_SET", "voter 2 is not in my voter set"),
        PeerProblem(3, "127.0.0.1:9103", "unreachable", "UNAVAILABLE: connection refused"),
    )


async def test_describe_quorum_carries_the_responders_peer_problems() -> None:
    """Every DescribeQuorum answer — here a non-leader's — names its responder and its problems."""
    reported = (PeerProblem(1, "127.0.0.1:1", "unreachable", "UNAVAILABLE: connection refused"),)

    class NotLeader:
        async def handle_request(self, request: object, peer_id: int | None = None) -> DescribeQuorumResponse:
            return DescribeQuorumResponse(ErrorCode.NOT_LEADER_OR_FOLLOWER, "", leader_id=-1, leader_epoch=3)

    servicer = RaftServicer(NotLeader(), cluster_id="cid", node_id=3, peer_problems=lambda: reported)
    server = grpc.aio.server()
    add_raft_service(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        answer = await asyncio.to_thread(describe_quorum_at, f"127.0.0.1:{port}", 2.0)
    finally:
        await server.stop(None)
    assert answer is not None
    assert peer_problems_of(answer) == [
        PeerProblemView(3, 1, "127.0.0.1:1", "unreachable", "UNAVAILABLE: connection refused")
    ]
    assert str(peer_problems_of(answer)[0]) == (
        "controller 3 -> 1: unreachable at 127.0.0.1:1 (UNAVAILABLE: connection refused)"
    )
