"""A FetchStream reads its caller's identity once per stream, not once per Fetch (issue #17, "A lone
write's path": two auth-context reads per message on the leader's intake thread, on every write), and
still refuses a TLS caller without a controller certificate."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from kraft.errors import ErrorCode
from kraft.raft import messages as m
from kraft.raft.grpc_server import RaftServicer
from kraft.v1 import raft_pb2

CLUSTER = "caller-cluster"


class CountingContext:
    """The part of a grpc.aio servicer context RaftServicer's Fetch path reads: the auth context."""

    def __init__(self, auth: dict[str, list[bytes]]) -> None:
        self.auth = auth
        self.reads = 0
        self.aborted: tuple[Any, str] | None = None

    def auth_context(self) -> dict[str, list[bytes]]:
        self.reads += 1
        return self.auth

    async def abort(self, code: Any, details: str) -> None:
        self.aborted = (code, details)
        raise RuntimeError(details)


class EchoHandler:
    """Answers every Fetch with an empty FetchResponse and records the peer id it was given."""

    def __init__(self) -> None:
        self.peer_ids: list[int | None] = []

    async def handle_request(self, request: m.RaftRequest, *, peer_id: int | None = None) -> m.RaftResponse:
        self.peer_ids.append(peer_id)
        return m.FetchResponse(ErrorCode.NONE, "", 1, 1)


async def _requests(count: int) -> AsyncIterator[raft_pb2.FetchRequest]:
    for offset in range(count):
        yield raft_pb2.FetchRequest(
            cluster_id=CLUSTER, replica_id=2, current_leader_epoch=1, fetch_offset=offset, max_wait_ms=0
        )


async def test_a_fetch_stream_reads_the_auth_context_once_for_all_its_messages() -> None:
    handler = EchoHandler()
    servicer = RaftServicer(handler, cluster_id=CLUSTER)
    context = CountingContext({"transport_security_type": [b"insecure"]})
    answers = [answer async for answer in servicer.FetchStream(_requests(5), context)]  # type: ignore[arg-type]
    assert len(answers) == 5
    assert handler.peer_ids == [None] * 5  # PLAINTEXT: nobody is authenticated
    reads_for_five = context.reads
    context.reads = 0
    [answer async for answer in servicer.FetchStream(_requests(1), context)]  # type: ignore[arg-type]
    assert reads_for_five == context.reads  # the same for one message as for five


async def test_a_tls_stream_without_a_controller_certificate_is_still_refused() -> None:
    handler = EchoHandler()
    servicer = RaftServicer(handler, cluster_id=CLUSTER)
    context = CountingContext({"transport_security_type": [b"ssl"], "x509_subject": [b"CN=broker-7"]})
    with pytest.raises(RuntimeError, match="controller certificate"):
        [answer async for answer in servicer.FetchStream(_requests(2), context)]  # type: ignore[arg-type]
    assert handler.peer_ids == []
