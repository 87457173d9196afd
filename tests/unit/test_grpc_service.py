"""kraft.grpc_service: decode-in-handler registration for every service and the transport limits of
every listener (issue #15)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from google.protobuf.message import Message

from kraft.broker.service import add_broker_service
from kraft.config import NodeConfig
from kraft.grpc_service import (
    RateLimitedLog,
    ServerLimits,
    create_server,
    server_limits,
    server_options,
)
from kraft.metadata.service import ControllerServicer, add_controller_service
from kraft.netutil import free_port
from kraft.v1 import broker_pb2, controller_pb2

# Bytes that are no protobuf message of any kind: a field with wire type 7 (invalid), and a truncated
# length-delimited field.
UNDECODABLE = (b"\x0f", b"\x0a\xff\xff\xff\xff\x0f", b"\x12\x05ab")


def _methods(module: Any, service: str) -> list[str]:
    return [m.name for m in module.DESCRIPTOR.services_by_name[service].methods]


class _Echo:
    """Any servicer: the test only reaches it with bytes that decode."""

    def __getattr__(self, name: str) -> Any:
        async def answer(request: Message, context: Any) -> Message:
            raise AssertionError(f"{name} reached with undecodable bytes")

        return answer


@pytest.fixture
async def servers() -> AsyncIterator[int]:
    """ControllerService (an unbound servicer) and BrokerService (a servicer nobody may reach) on one
    server built like a node's."""
    server = create_server(ServerLimits())
    add_controller_service(server, ControllerServicer())
    add_broker_service(server, _Echo())  # type: ignore[arg-type]
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    try:
        yield port
    finally:
        await server.stop(None)


@pytest.mark.parametrize(
    ("module", "service", "logger"),
    [
        (controller_pb2, "ControllerService", "kraft.metadata.service"),
        (broker_pb2, "BrokerService", "kraft.broker.service"),
    ],
)
async def test_undecodable_bytes_get_invalid_argument_and_one_warning(
    servers: int, caplog: pytest.LogCaptureFixture, module: Any, service: str, logger: str
) -> None:
    caplog.set_level(logging.WARNING)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{servers}") as channel:
        for method in _methods(module, service):
            call = channel.unary_unary(f"/kraft.v1.{service}/{method}", None, None)
            for payload in UNDECODABLE:
                with pytest.raises(grpc.aio.AioRpcError) as error:
                    await call(payload, timeout=5)
                assert error.value.code() is grpc.StatusCode.INVALID_ARGUMENT, (method, error.value)
                assert (error.value.details() or "").startswith("undecodable ")
    warnings = [r for r in caplog.records if r.name == logger]
    assert len(warnings) == 1, "one peer: one line per interval, whatever the number of requests"
    assert warnings[0].exc_info is None and "bad_request" in warnings[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


async def test_unbound_controller_still_answers_decodable_requests(servers: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{servers}") as channel:
        call = channel.unary_unary(
            "/kraft.v1.ControllerService/DescribeCluster",
            request_serializer=None,
            response_deserializer=controller_pb2.DescribeClusterResponse.FromString,
        )
        answer = await call(
            controller_pb2.DescribeClusterRequest(cluster_id="x").SerializeToString(), timeout=5
        )
    assert answer.error_code != 0  # NOT_CONTROLLER: "the controller is starting"


def test_rate_limited_log_counts_what_it_suppressed() -> None:
    log = RateLimitedLog(interval_s=10)
    assert log.should_log("a", 0.0) == 0
    assert log.should_log("a", 1.0) is None
    assert log.should_log("a", 2.0) is None
    assert log.should_log("b", 2.0) == 0
    assert log.should_log("a", 10.5) == 2


def test_server_options_from_config() -> None:
    config = NodeConfig.from_properties(
        {
            "process.roles": "broker",
            "node.id": "1",
            "controller.quorum.voters": "0@127.0.0.1:9093",
            "listeners": "PLAINTEXT://127.0.0.1:9092",
            "log.dirs": "/tmp/x",
            "max.connections": "7",
            "connections.max.idle.ms": "1234",
            "grpc.server.handshake.timeout.ms": "999",
            "grpc.max.connection.age.ms": "60000",
            "grpc.max.concurrent.streams": "11",
        }
    )
    options = dict(server_options(server_limits(config)))
    assert options["grpc.max_allowed_incoming_connections"] == 7
    assert options["grpc.max_connection_idle_ms"] == 1234
    assert options["grpc.server_handshake_timeout_ms"] == 999
    assert options["grpc.max_connection_age_ms"] == 60000
    assert options["grpc.max_concurrent_streams"] == 11
    assert "grpc.max_connection_age_ms" not in dict(server_options(ServerLimits()))
    assert config.metrics_bind_host == "127.0.0.1"  # the listener's host, not 0.0.0.0


async def _closed_by_server(port: int, timeout_s: float) -> bool:
    """Connect, send nothing (a half-open client), and wait for the server to close the connection."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        while True:
            chunk = await asyncio.wait_for(reader.read(4096), timeout_s)
            if not chunk:  # EOF: the server closed it (it may first send its SETTINGS frame)
                return True
    except (TimeoutError, ConnectionResetError):
        return False
    finally:
        writer.close()


async def test_500_half_open_connections_are_closed_within_the_handshake_timeout() -> None:
    """Issue #15: 500 half-open connections were never timed out.  With a 1 s handshake timeout every one
    is closed by the server within a few seconds."""
    server = create_server(ServerLimits(handshake_timeout_ms=1000))
    add_controller_service(server, ControllerServicer())
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    try:
        start = time.monotonic()
        closed = await asyncio.gather(*(_closed_by_server(port, 10.0) for _ in range(500)))
        elapsed = time.monotonic() - start
    finally:
        await server.stop(None)
    assert all(closed), f"{closed.count(False)} of 500 connections were still open after 10 s"
    assert elapsed < 8.0, f"closing 500 half-open connections took {elapsed:.1f} s"


async def _accepted(reader: asyncio.StreamReader) -> bool:
    """True when the server took the connection: it sends its HTTP/2 SETTINGS frame at once (a
    connection over max.connections is closed without a byte)."""
    return bool(await asyncio.wait_for(reader.read(4096), 10.0))


async def _until_closed(reader: asyncio.StreamReader) -> None:
    """Read until the server closes the connection (EOF), bounded."""
    async with asyncio.timeout(20.0):
        while await reader.read(4096):
            pass


async def test_connections_over_the_cap_are_refused_while_the_cap_is_full() -> None:
    """max.connections: with 20 half-open connections held, the 21st client cannot make a call; once the
    handshake timeout closes them, it can."""
    server = create_server(ServerLimits(handshake_timeout_ms=3000, max_connections=20))
    add_controller_service(server, ControllerServicer())
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    holders = [await asyncio.open_connection("127.0.0.1", port) for _ in range(20)]
    request = controller_pb2.DescribeClusterRequest(cluster_id="x").SerializeToString()
    try:
        # Every holder counts against the cap (the server answered each), not "probably, after a while".
        assert all([await _accepted(reader) for reader, _ in holders])
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            with pytest.raises(grpc.aio.AioRpcError) as refused:
                await channel.unary_unary("/kraft.v1.ControllerService/DescribeCluster", None, None)(
                    request, timeout=1.0
                )
            assert refused.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
        # ... refused while the cap was full: no holder had been closed yet.
        assert not any(reader.at_eof() for reader, _ in holders)
        # The handshake timeout frees the slots: the server closes every holder.
        await asyncio.gather(*(_until_closed(reader) for reader, _ in holders))
        # (A fresh subchannel: the shared pool would still be backing off from the refused attempt; it
        # waits for ready, as the server may count a closed connection out just after its EOF.)
        options = [("grpc.use_local_subchannel_pool", 1)]
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}", options=options) as channel:
            answer = await channel.unary_unary("/kraft.v1.ControllerService/DescribeCluster", None, None)(
                request, timeout=10, wait_for_ready=True
            )
        assert controller_pb2.DescribeClusterResponse.FromString(answer).error_code != 0
    finally:
        for _, writer in holders:
            writer.close()
        await server.stop(None)
