"""TLS on a real in-process gRPC server: handshakes, principals, Raft bound to certificates, reload.

Each test runs a Raft voter (node 1 of {1, 2, 3}, manual clock: only requests can change its state)
behind ``kraft.security.tls.add_port`` with a local CA's certificates, and dials it through
``kraft.client.channel`` exactly as nodes and the CLI do.
"""

from __future__ import annotations

import asyncio
import random
import socket
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from grpc_health.v1 import health_pb2, health_pb2_grpc

from kraft.client.channel import (
    PLAINTEXT_SECURITY,
    SSL,
    ChannelSecurity,
    KeyStore,
    PemSource,
    TrustStore,
    open_channel,
)
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.grpc_server import RaftServicer, add_raft_service
from kraft.raft.memory import LoopbackNetwork, MemoryElectionStore, MemoryLogStore, MemorySnapshotStore
from kraft.security.ca import LocalCa, create_ca, load_ca, write_cluster_tls, write_private
from kraft.security.mapping import SslPrincipalMapper
from kraft.security.principal import (
    Principal,
    TlsPrincipalExtractor,
    install_principal_extractor,
    principal_of,
)
from kraft.security.tls import CertificateReloader, SslSettings, add_port
from kraft.v1 import raft_pb2, raft_pb2_grpc

CLUSTER = "tls-cluster"
NAMES = ["controller-1", "controller-2", "broker-101", "admin"]


@dataclass
class Node:
    port: int
    tls_dir: Path
    ca: LocalCa
    driver: RaftDriver
    elections: MemoryElectionStore
    reloader: CertificateReloader
    principals: list[Principal]

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    def client(self, name: str | None) -> ChannelSecurity:
        trust = TrustStore(PemSource(path=self.tls_dir / "ca.pem"))
        return ChannelSecurity(SSL, trust, KeyStore.from_file(self.tls_dir / f"{name}.pem") if name else None)


class _RecordingHealth(health_pb2_grpc.HealthServicer):  # type: ignore[misc]
    def __init__(self, principals: list[Principal]) -> None:
        self.principals = principals

    async def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.aio.ServicerContext[object, object]
    ) -> health_pb2.HealthCheckResponse:
        self.principals.append(principal_of(context))
        return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[Node]:
    tls_dir = tmp_path / "tls"
    write_cluster_tls(tls_dir, NAMES)
    install_principal_extractor(TlsPrincipalExtractor(SslPrincipalMapper("DEFAULT")))
    elections = MemoryElectionStore()
    config = RaftConfig(node_id=1, voters=(1, 2, 3), cluster_id=CLUSTER)
    clock = ManualClock()
    driver = RaftDriver(
        config,
        transport=LoopbackNetwork().transport(1),
        log=MemoryLogStore(),
        elections=elections,
        snapshots=MemorySnapshotStore(),
        clock=clock,
        rng=random.Random(1),
    )
    await driver.start()
    await asyncio.sleep(0)  # the driver's task runs the core's start (its clock reading) on its first turn
    # Past the vote embargo of a just-started voter (docs/internals/raft.md "Leader lease") and still
    # before its first election timeout: the tests' vote requests are judged on who sends them.
    clock.advance(config.vote_protection_ms)
    server = grpc.aio.server()
    add_raft_service(
        RaftServicer(driver, cluster_id=CLUSTER, endpoints={v: ("127.0.0.1", 1) for v in (1, 2, 3)}), server
    )
    principals: list[Principal] = []
    health_pb2_grpc.add_HealthServicer_to_server(_RecordingHealth(principals), server)
    settings = SslSettings(
        keystore=KeyStore.from_file(tls_dir / "controller-1.pem"),
        truststore=TrustStore(PemSource(path=tls_dir / "ca.pem")),
        client_auth="required",
    )
    port, reloader = add_port(server, f"127.0.0.1:{free_port()}", settings, "CONTROLLER")
    assert reloader is not None and port > 0
    await server.start()
    try:
        yield Node(port, tls_dir, load_ca(tls_dir), driver, elections, reloader, principals)
    finally:
        await server.stop(None)
        await driver.stop()
        install_principal_extractor(TlsPrincipalExtractor())


async def _health(node: Node, security: ChannelSecurity) -> grpc.StatusCode:
    async with open_channel(node.target, security=security) as channel:
        try:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
        except grpc.aio.AioRpcError as error:
            return error.code()
    return grpc.StatusCode.OK


async def test_the_principal_is_the_client_certificate_subject_in_rfc2253_form(node: Node) -> None:
    assert await _health(node, node.client("broker-101")) is grpc.StatusCode.OK
    _, chain = KeyStore.from_file(node.tls_dir / "broker-101.pem").read()
    cert = x509.load_pem_x509_certificate(chain)
    # What gRPC's auth context gives is what Kafka's DEFAULT rule sees (X500Principal RFC 2253).
    assert node.principals == [Principal("User", cert.subject.rfc4514_string())]
    assert node.principals[0].name == "CN=broker-101,O=kraft"


async def test_mapping_rules_apply_to_the_subject(node: Node) -> None:
    install_principal_extractor(TlsPrincipalExtractor(SslPrincipalMapper("RULE:^CN=([^,]+),O=kraft$/$1/U")))
    assert await _health(node, node.client("admin")) is grpc.StatusCode.OK
    assert node.principals == [Principal("User", "ADMIN")]


async def test_clients_without_a_certificate_of_this_ca_cannot_connect(node: Node, tmp_path: Path) -> None:
    assert await _health(node, node.client(None)) is grpc.StatusCode.UNAVAILABLE
    other = tmp_path / "other"
    write_cluster_tls(other, ["admin"], ca=create_ca("another-ca"))
    # A certificate from another CA, trusting ours (so only the server's check can fail).
    foreign = ChannelSecurity(
        SSL, TrustStore(PemSource(path=node.tls_dir / "ca.pem")), KeyStore.from_file(other / "admin.pem")
    )
    assert await _health(node, foreign) is grpc.StatusCode.UNAVAILABLE
    assert node.principals == []


async def test_a_plaintext_client_on_a_tls_listener_gets_unavailable_socket_closed(node: Node) -> None:
    async with open_channel(node.target, security=PLAINTEXT_SECURITY) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=5)
    assert caught.value.code() is grpc.StatusCode.UNAVAILABLE
    assert "Socket closed" in (caught.value.details() or "")


def _vote(candidate: int, epoch: int = 1) -> raft_pb2.VoteRequest:
    return raft_pb2.VoteRequest(
        cluster_id=CLUSTER,
        candidate_id=candidate,
        candidate_epoch=epoch,
        voter_id=1,
        last_offset_epoch=0,
        last_offset=0,
    )


async def _send_vote(node: Node, name: str, request: raft_pb2.VoteRequest) -> raft_pb2.VoteResponse:
    async with open_channel(node.target, security=node.client(name)) as channel:
        answer: raft_pb2.VoteResponse = await raft_pb2_grpc.RaftServiceStub(channel).Vote(request, timeout=5)
        return answer


async def test_raft_requests_need_a_controller_certificate(node: Node) -> None:
    before = node.elections.read()
    for name in ("broker-101", "admin"):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await _send_vote(node, name, _vote(2))
        assert caught.value.code() is grpc.StatusCode.PERMISSION_DENIED
        assert "needs a controller certificate" in (caught.value.details() or "")
    # Admin tools may still describe the quorum.
    async with open_channel(node.target, security=node.client("admin")) as channel:
        described = await raft_pb2_grpc.RaftServiceStub(channel).DescribeQuorum(
            raft_pb2.DescribeQuorumRequest(), timeout=5
        )
    assert described.cluster_id == CLUSTER  # answered (NOT_LEADER: this lone voter has no leader yet)
    assert node.elections.read() == before


async def test_a_controller_certificate_cannot_speak_for_another_voter(node: Node) -> None:
    before = node.elections.read()
    forged = await _send_vote(node, "controller-2", _vote(3))
    assert ErrorCode.from_wire(forged.error_code) is ErrorCode.INVALID_REQUEST
    assert "authenticated as node 2 claims to be node 3" in forged.error_message
    assert node.elections.read() == before
    # The same certificate speaking for itself is heard: the vote moves node 1 to epoch 1.
    honest = await _send_vote(node, "controller-2", _vote(2))
    assert ErrorCode.from_wire(honest.error_code) is ErrorCode.NONE
    assert honest.vote_granted
    assert node.elections.read() != before


def _served_certificate(node: Node) -> bytes:
    context = ssl.create_default_context(cafile=str(node.tls_dir / "ca.pem"))
    context.load_cert_chain(str(node.tls_dir / "admin.pem"))
    context.set_alpn_protocols(["h2"])
    with (
        socket.create_connection(("127.0.0.1", node.port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return der


async def test_rotated_certificate_files_serve_new_connections_and_a_bad_rotation_is_ignored(
    node: Node,
) -> None:
    old = await asyncio.to_thread(_served_certificate, node)
    keystore = node.tls_dir / "controller-1.pem"
    issued = node.ca.issue("controller-1")
    write_private(keystore, issued.keystore_pem)
    new = await asyncio.to_thread(_served_certificate, node)
    assert new != old
    assert new == x509.load_pem_x509_certificate(issued.cert_pem).public_bytes(serialization.Encoding.DER)
    assert node.reloader.reloads == 1
    # Mutual TLS still works with the new certificate, and the caller's identity is unchanged.
    assert await _health(node, node.client("controller-2")) is grpc.StatusCode.OK
    # A key that does not belong to the certificate: refused, the last good certificate keeps serving.
    other = node.ca.issue("controller-1")
    write_private(keystore, other.key_pem + issued.chain_pem)
    assert await asyncio.to_thread(_served_certificate, node) == new
    assert node.reloader.failures == 1
