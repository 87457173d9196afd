"""Real processes over mutual TLS: a 3-controller quorum with a broker, what an outsider can do to it
(nothing), HTTPS metrics, and certificate rotation under load (issue #15)."""

from __future__ import annotations

import contextlib
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest

from kraft.client.channel import (
    PLAINTEXT_SECURITY,
    SSL,
    ChannelSecurity,
    KeyStore,
    PemSource,
    TrustStore,
    open_blocking_channel,
    set_default_security,
)
from kraft.cluster.manager import LocalCluster
from kraft.cluster.quorum import ControllerQuorum, QuorumFactory
from kraft.errors import ErrorCode
from kraft.security.ca import create_ca, load_ca, write_private
from kraft.v1 import raft_pb2, raft_pb2_grpc

pytestmark = pytest.mark.timeout(120)


@pytest.fixture
def tls_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    cluster = LocalCluster.create(
        tmp_path / "c", controllers=3, brokers=1, profile="fast", metrics=True, tls=True
    )
    set_default_security(cluster.client_security())  # the probes, as `kraft cluster` commands do
    try:
        yield cluster
    finally:
        set_default_security(PLAINTEXT_SECURITY)
        cluster.down(timeout_s=5.0)


def _security(tls_dir: Path, name: str | None) -> ChannelSecurity:
    keystore = KeyStore.from_file(tls_dir / f"{name}.pem") if name else None
    return ChannelSecurity(SSL, TrustStore(PemSource(path=tls_dir / "ca.pem")), keystore)


def _describe(target: str, security: ChannelSecurity) -> raft_pb2.DescribeQuorumResponse:
    with open_blocking_channel(target, security=security) as channel:
        answer: raft_pb2.DescribeQuorumResponse = raft_pb2_grpc.RaftServiceStub(channel).DescribeQuorum(
            raft_pb2.DescribeQuorumRequest(), timeout=5
        )
        return answer


def _scrape(port: int, context: ssl.SSLContext) -> str:
    with urllib.request.urlopen(f"https://127.0.0.1:{port}/metrics", context=context, timeout=5) as reply:
        return str(reply.read().decode())


def test_a_tls_cluster_forms_registers_its_broker_and_refuses_outsiders(tls_cluster: LocalCluster) -> None:
    cluster = tls_cluster
    cluster.start([c.node_id for c in cluster.spec.controllers])
    leader = cluster.wait_until(lambda s: s.leader_id >= 0, 30.0, what="a quorum leader")
    cluster.start()
    status = cluster.wait_healthy(30.0)
    assert status.node(101).state == "active"
    tls_dir = cluster.layout.tls_dir
    target = cluster.spec.node(status.leader_id).target
    before = _describe(target, _security(tls_dir, "admin"))
    assert before.leader_id == status.leader_id and leader.leader_id >= 0

    # No certificate, a PLAINTEXT client: the handshake fails, nothing reaches a service.
    for security in (_security(tls_dir, None), PLAINTEXT_SECURITY):
        with pytest.raises(grpc.RpcError) as caught:
            _describe(target, security)
        assert caught.value.code() is grpc.StatusCode.UNAVAILABLE

    # The broker's certificate cannot move Raft; a controller's cannot speak for another voter.
    follower = next(c for c in cluster.spec.controllers if c.node_id != status.leader_id)
    forged = raft_pb2.VoteRequest(
        cluster_id=cluster.spec.cluster_id,
        candidate_id=follower.node_id,
        candidate_epoch=before.leader_epoch + 1,
        voter_id=status.leader_id,
        last_offset_epoch=before.leader_epoch,
        last_offset=before.high_watermark + 1000,
    )
    with (
        open_blocking_channel(target, security=_security(tls_dir, "broker-101")) as channel,
        pytest.raises(grpc.RpcError) as denied,
    ):
        raft_pb2_grpc.RaftServiceStub(channel).Vote(forged, timeout=5)
    assert denied.value.code() is grpc.StatusCode.PERMISSION_DENIED
    impostor = next(
        c for c in cluster.spec.controllers if c.node_id not in (status.leader_id, follower.node_id)
    )
    with open_blocking_channel(target, security=_security(tls_dir, impostor.name)) as channel:
        answer = raft_pb2_grpc.RaftServiceStub(channel).Vote(forged, timeout=5)
    assert ErrorCode.from_wire(answer.error_code) is ErrorCode.INVALID_REQUEST
    after = _describe(target, _security(tls_dir, "admin"))
    assert (after.leader_id, after.leader_epoch) == (before.leader_id, before.leader_epoch)

    # Metrics are HTTPS with the same certificates: the admin certificate scrapes, no certificate fails.
    metrics_port = cluster.spec.node(status.leader_id).metrics_port
    context = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    context.load_cert_chain(str(tls_dir / "admin.pem"))
    assert "kraft_" in _scrape(metrics_port, context)
    anonymous = ssl.create_default_context(cafile=str(tls_dir / "ca.pem"))
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        _scrape(metrics_port, anonymous)


def test_rotating_to_a_new_ca_under_load_moves_the_raft_links_without_a_restart(
    quorum_factory: QuorumFactory,
) -> None:
    """An operator's CA rotation while a writer commits: (1) trust both CAs and give every node (and the
    admin) a certificate of the new CA, (2) trust only the new CA.  After (2) an old-CA certificate is
    refused by every node, yet every voter keeps replicating: each controller re-dialled its peers with
    its new certificate and the new trust (``tls_client_channels_reopened``) — no process restarted."""
    quorum: ControllerQuorum = quorum_factory(size=3)
    quorum.tls = True
    quorum.start()
    leader = quorum.wait_for_leader(30.0)
    pids = {node_id: node.pid for node_id, node in quorum.nodes.items()}
    stop = threading.Event()
    appended: list[int] = []
    errors: list[str] = []

    def writer() -> None:
        while not stop.is_set():
            try:
                _, last = quorum.append([b"x" * 64], timeout_s=10.0)
                appended.append(last)
            except AssertionError as exc:
                errors.append(str(exc).splitlines()[0])
                return

    tls_dir = quorum.tls_dir
    old_ca = load_ca(tls_dir)
    old_admin = tls_dir / "admin-old-ca.pem"
    write_private(old_admin, (tls_dir / "admin.pem").read_bytes())
    new_ca = create_ca("kraft-rotated-ca")
    thread = threading.Thread(target=writer, name="writer")
    thread.start()
    try:
        _wait_until(lambda: len(appended) >= 5 or bool(errors), 30.0, "the writer to be appending")
        # (1) Overlap: both CAs trusted, every certificate re-issued by the new one.
        write_private(tls_dir / "ca.pem", old_ca.cert_pem + new_ca.cert_pem)
        for node_id in quorum.nodes:
            write_private(
                tls_dir / f"controller-{node_id}.pem", new_ca.issue(f"controller-{node_id}").keystore_pem
            )
        write_private(tls_dir / "admin.pem", new_ca.issue("admin").keystore_pem)
        _wait_reopened(quorum, leader.leader_id, trusted_cas=2)
        rotated_at = len(appended)
        _wait_until(lambda: len(appended) > rotated_at + 5 or bool(errors), 30.0, "appends after (1)")
        # (2) The old CA leaves the truststores.  Each follower's TCP connections to the leader now:
        # a pool that really re-dials opens a new one (gRPC never re-verifies an open connection, so a
        # follower keeping its old channel would go on replicating over a link nobody could open now).
        followers = [n for n in quorum.nodes if n != leader.leader_id]
        leader_port = quorum.nodes[leader.leader_id].port
        links_before = {f: _links(quorum.nodes[f].pid, leader_port) for f in followers}
        assert all(links_before.values()), links_before
        write_private(tls_dir / "ca.pem", new_ca.cert_pem)
        _wait_reopened(quorum, leader.leader_id, trusted_cas=1)
        _wait_until(
            lambda: all(_links(quorum.nodes[f].pid, leader_port) - links_before[f] for f in followers),
            15.0,
            "every follower to open a new connection to the leader",
        )
        dropped_at = len(appended)
        _wait_until(lambda: len(appended) > dropped_at + 5 or bool(errors), 30.0, "appends after (2)")
    finally:
        stop.set()
        thread.join(timeout=30)
    assert not errors
    # Every node now refuses the old CA's certificates (its server reloaded the truststore)...
    old_security = ChannelSecurity(
        SSL, TrustStore(PemSource(path=tls_dir / "ca.pem")), KeyStore.from_file(old_admin)
    )
    for node_id in quorum.nodes:
        with pytest.raises(grpc.RpcError) as refused:
            _describe(quorum.nodes[node_id].target, old_security)
        assert refused.value.code() is grpc.StatusCode.UNAVAILABLE
    # ...and every follower replicates what is committed now, over Raft links it dialled after (2).
    _, last = quorum.append([b"after the old CA left"], timeout_s=10.0)
    for node_id in quorum.nodes:
        quorum.wait_caught_up(node_id, last + 1, timeout_s=15.0)
    after = quorum.wait_for_leader(10.0)
    assert (after.leader_id, after.leader_epoch) == (leader.leader_id, leader.leader_epoch)
    assert {node_id: node.pid for node_id, node in quorum.nodes.items()} == pids
    for node_id in quorum.nodes:
        assert "tls_certificates_reloaded" in quorum.nodes[node_id].log_path.read_text()


def _wait_reopened(quorum: ControllerQuorum, leader_id: int, *, trusted_cas: int) -> None:
    """Until every follower logged re-dialling its Raft peers with a new-CA certificate and a truststore
    of ``trusted_cas`` CAs.  (A leader sends nothing in steady state — followers fetch from it — so its
    channels are checked, and replaced, when it next sends.)"""

    def reopened(node_id: int) -> bool:
        text = quorum.nodes[node_id].log_path.read_text(encoding="utf-8", errors="replace")
        return any(
            "event=tls_client_channels_reopened" in line
            and "pool=raft" in line
            and "kraft-rotated-ca" in line
            and f"trusted_cas={trusted_cas}" in line
            for line in text.splitlines()
        )

    followers = [n for n in quorum.nodes if n != leader_id]
    _wait_until(lambda: all(reopened(n) for n in followers), 30.0, f"Raft links with {trusted_cas} CAs")


def _links(pid: int | None, port: int) -> set[int]:
    """The local ports of process ``pid``'s established TCP connections to ``port`` on loopback (Linux
    ``/proc``: the process's socket inodes matched against the kernel's TCP tables)."""
    assert pid is not None
    inodes: set[str] = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    ports: set[int] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            local, remote, state, inode = fields[1], fields[2], fields[3], fields[9]
            if inode in inodes and state == "01" and int(remote.rsplit(":", 1)[1], 16) == port:
                ports.add(int(local.rsplit(":", 1)[1], 16))
    return ports


def _wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` until it holds; fail naming ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)
