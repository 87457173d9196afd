"""Long-lived client channels follow a rotation of their keystore/truststore files (issue #15).

gRPC fixes a channel's credentials when it is made, reconnects included; :class:`ChannelPool` (the Raft
transport's, a broker's controller client's and replica fetcher's channels) replaces its channels when the
files' content changed and the new material loads.  A real in-process mTLS server records the client
certificate of every call; the pool's checks run on a manual clock, so "not yet looked" and "looked" are
exact steps, not sleeps.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kraft.client.channel import (
    ROTATION_CHECK_INTERVAL_S,
    SSL,
    ChannelPool,
    ChannelSecurity,
    KeyStore,
    PemSource,
    TrustStore,
)
from kraft.client.controller import ControllerClient
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.raft import messages as m
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.grpc_server import RaftServicer, add_raft_service
from kraft.raft.grpc_transport import GrpcTransport
from kraft.raft.memory import LoopbackNetwork, MemoryElectionStore, MemoryLogStore, MemorySnapshotStore
from kraft.security.ca import LocalCa, load_ca, write_cluster_tls, write_private
from kraft.security.mapping import SslPrincipalMapper
from kraft.security.principal import TlsPrincipalExtractor, install_principal_extractor
from kraft.security.tls import SslSettings, add_port
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc

CLUSTER = "rotation-cluster"


class PoolClock:
    """What the pool reads to pace its checks."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def next_check(self) -> None:
        self.now += ROTATION_CHECK_INTERVAL_S


@dataclass
class Recorded:
    events: list[tuple[str, dict[str, object]]] = field(default_factory=list)

    def info(self, event: str, **fields: object) -> None:
        self.events.append((event, fields))

    def warning(self, event: str, **fields: object) -> None:
        self.events.append((event, fields))

    def named(self, event: str) -> list[dict[str, object]]:
        return [f for e, f in self.events if e == event]


class _CertificateRecorder(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    """Remembers the client certificate each call came with (its serial number)."""

    def __init__(self) -> None:
        self.serials: list[int] = []
        self.hold: asyncio.Event | None = None
        """Set: the next call waits for it before answering (a call kept in flight)."""
        self.held = asyncio.Event()

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> health_pb2.HealthCheckResponse:
        (pem, *_) = context.auth_context()["x509_pem_cert"]
        self.serials.append(x509.load_pem_x509_certificate(pem).serial_number)
        hold, self.hold = self.hold, None
        if hold is not None:
            self.held.set()
            await hold.wait()
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


class _DescribingController(controller_pb2_grpc.ControllerServiceServicer):
    """Answers DescribeCluster, remembering the client certificate's serial number."""

    def __init__(self) -> None:
        self.serials: list[int] = []

    async def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> cpb.DescribeClusterResponse:
        (pem, *_) = context.auth_context()["x509_pem_cert"]
        self.serials.append(x509.load_pem_x509_certificate(pem).serial_number)
        return cpb.DescribeClusterResponse(cluster_id=CLUSTER)


@dataclass
class Server:
    target: str
    tls_dir: Path
    ca: LocalCa
    recorder: _CertificateRecorder
    controller: _DescribingController

    @property
    def client_keystore(self) -> Path:
        """The file the client under test presents (a copy of a node's keystore, rotated in place)."""
        return self.tls_dir / "client.pem"

    def client_security(self) -> ChannelSecurity:
        return ChannelSecurity(
            SSL, TrustStore(PemSource(path=self.tls_dir / "ca.pem")), KeyStore.from_file(self.client_keystore)
        )

    def rotate_client(self, name: str) -> int:
        """Write a fresh certificate for ``name`` over the client keystore; its serial number."""
        issued = self.ca.issue(name)
        write_private(self.client_keystore, issued.keystore_pem)
        return x509.load_pem_x509_certificate(issued.cert_pem).serial_number


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    """Raft voter 1 of {1, 2, 3} (manual clock: only requests move it) and a recording health service,
    behind mutual TLS."""
    tls_dir = tmp_path / "tls"
    write_cluster_tls(tls_dir, ["controller-1", "controller-2"])
    install_principal_extractor(TlsPrincipalExtractor(SslPrincipalMapper("DEFAULT")))
    config = RaftConfig(node_id=1, voters=(1, 2, 3), cluster_id=CLUSTER)
    clock = ManualClock()
    driver = RaftDriver(
        config,
        transport=LoopbackNetwork().transport(1),
        log=MemoryLogStore(),
        elections=MemoryElectionStore(),
        snapshots=MemorySnapshotStore(),
        clock=clock,
        rng=random.Random(1),
    )
    await driver.start()
    await asyncio.sleep(0)  # the driver's task runs the core's start (its clock reading) on its first turn
    # Past the vote embargo of a just-started voter (docs/internals/raft.md "Leader lease") and still
    # before its first election timeout: the tests' vote requests are judged on who sends them.
    clock.advance(config.vote_protection_ms)
    grpc_server = grpc.aio.server()
    add_raft_service(
        RaftServicer(driver, cluster_id=CLUSTER, endpoints={v: ("127.0.0.1", 1) for v in (1, 2, 3)}),
        grpc_server,
    )
    recorder = _CertificateRecorder()
    health_pb2_grpc.add_HealthServicer_to_server(recorder, grpc_server)
    controller = _DescribingController()  # type: ignore[abstract]
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(controller, grpc_server)
    settings = SslSettings(
        keystore=KeyStore.from_file(tls_dir / "controller-1.pem"),
        truststore=TrustStore(PemSource(path=tls_dir / "ca.pem")),
        client_auth="required",
    )
    port, _ = add_port(grpc_server, f"127.0.0.1:{free_port()}", settings, "CONTROLLER")
    assert port > 0
    await grpc_server.start()
    served = Server(f"127.0.0.1:{port}", tls_dir, load_ca(tls_dir), recorder, controller)
    write_private(served.client_keystore, (tls_dir / "controller-2.pem").read_bytes())
    try:
        yield served
    finally:
        await grpc_server.stop(None)
        await driver.stop()
        install_principal_extractor(TlsPrincipalExtractor())


async def _check(pool: ChannelPool, target: str) -> grpc.aio.Channel:
    channel = pool.get(target)
    await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    return channel


def _serial_of(path: Path) -> int:
    _, chain = KeyStore.from_file(path).read()
    return x509.load_pem_x509_certificate(chain).serial_number


async def test_a_pooled_channel_presents_the_rotated_certificate_after_the_next_check(server: Server) -> None:
    clock, log = PoolClock(), Recorded()
    pool = ChannelPool(security=server.client_security(), clock=clock, log=log, name="test")
    try:
        first = await _check(pool, server.target)
        old_serial = _serial_of(server.client_keystore)
        assert server.recorder.serials == [old_serial]

        new_serial = server.rotate_client("controller-2")
        # Until the pool looks again its channel (and the connection's certificate) stay: cheap calls.
        assert await _check(pool, server.target) is first
        assert server.recorder.serials[-1] == old_serial

        clock.next_check()
        second = await _check(pool, server.target)
        assert second is not first
        assert server.recorder.serials[-1] == new_serial
        assert pool.rotations == 1
        (reopened,) = log.named("tls_client_channels_reopened")
        assert reopened["subject"] == "CN=controller-2,O=kraft" and reopened["channels"] == 1

        # A touch that changes no byte reopens nothing.
        os.utime(server.client_keystore, ns=(1, 1))
        clock.next_check()
        assert await _check(pool, server.target) is second
        assert pool.rotations == 1
    finally:
        await pool.close()


async def test_a_rotation_that_does_not_load_keeps_the_channels(server: Server) -> None:
    clock, log = PoolClock(), Recorded()
    pool = ChannelPool(security=server.client_security(), clock=clock, log=log, name="test")
    try:
        first = await _check(pool, server.target)
        serial = server.recorder.serials[-1]
        # A key that is not the certificate's (a half-done rotation): refused, the old channel serves.
        other = server.ca.issue("controller-2")
        mine = server.ca.issue("controller-2")
        write_private(server.client_keystore, other.key_pem + mine.chain_pem)
        clock.next_check()
        assert await _check(pool, server.target) is first
        assert server.recorder.serials[-1] == serial
        assert (pool.failures, pool.rotations) == (1, 0)
        (failed,) = log.named("tls_client_reload_failed")
        assert "does not belong to the certificate" in str(failed["error"])
        # Fixed: taken at the next check.
        write_private(server.client_keystore, mine.keystore_pem)
        clock.next_check()
        assert await _check(pool, server.target) is not first
        assert server.recorder.serials[-1] == x509.load_pem_x509_certificate(mine.cert_pem).serial_number
    finally:
        await pool.close()


async def test_a_retired_channel_lets_a_call_in_flight_finish(server: Server) -> None:
    """The old channel is closed after the grace period, not under the call it carries."""
    clock = PoolClock()
    pool = ChannelPool(security=server.client_security(), clock=clock, retire_grace_s=30.0)
    try:
        old = await _check(pool, server.target)
        release = server.recorder.hold = asyncio.Event()
        in_flight = asyncio.ensure_future(
            health_pb2_grpc.HealthStub(old).Check(health_pb2.HealthCheckRequest(), timeout=10)
        )
        await asyncio.wait_for(server.recorder.held.wait(), 5)
        server.rotate_client("controller-2")
        clock.next_check()
        assert await _check(pool, server.target) is not old  # retired while the held call is in flight
        assert not in_flight.done()
        release.set()
        answer = await in_flight
        assert answer.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        await pool.close()


def _vote(candidate: int) -> m.VoteRequest:
    return m.VoteRequest(
        cluster_id=CLUSTER,
        candidate_epoch=1,
        candidate_id=candidate,
        voter_id=1,
        last_offset_epoch=0,
        last_offset=0,
    )


async def test_the_raft_transport_dials_again_with_a_rotated_certificate(server: Server) -> None:
    """A Raft transport kept open (as a controller keeps it for its lifetime) speaks with the identity of
    the certificate file as it is now: controller-2's file rotated to controller-3's certificate makes
    the next handshake authenticate node 3 — without a new transport."""
    clock = PoolClock()
    pool = ChannelPool(security=server.client_security(), clock=clock, name="raft")
    transport = GrpcTransport({1: server.target}, channels=pool)
    try:
        as_two = await transport.send(1, _vote(3), 5000)
        assert isinstance(as_two, m.VoteResponse)
        assert as_two.error_code is ErrorCode.INVALID_REQUEST
        assert "authenticated as node 2 claims to be node 3" in as_two.error_message

        server.rotate_client("controller-3")
        clock.next_check()
        as_three = await transport.send(1, _vote(3), 5000)
        assert isinstance(as_three, m.VoteResponse)
        assert as_three.error_code is ErrorCode.NONE and as_three.vote_granted
        assert pool.rotations == 1
    finally:
        await transport.close()


async def test_a_kept_controller_client_presents_the_rotated_certificate(server: Server) -> None:
    """A broker's ControllerClient lives as long as the broker: its cached stub follows the pool's new
    channel after a rotation."""
    clock = PoolClock()
    pool = ChannelPool(security=server.client_security(), clock=clock, name="controller_client")
    client = ControllerClient([(1, server.target)], channels=pool)
    request = cpb.DescribeClusterRequest(cluster_id=CLUSTER)
    try:
        await client.call(lambda stub: stub.DescribeCluster, request, 5.0)
        new_serial = server.rotate_client("controller-2")
        clock.next_check()
        await client.call(lambda stub: stub.DescribeCluster, request, 5.0)
        assert server.controller.serials == [_serial_of(server.tls_dir / "controller-2.pem"), new_serial]
    finally:
        await client.close()
