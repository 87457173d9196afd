"""A real cluster to attack (issue #15 security suite): 3 controllers and 1 broker as processes.

:func:`started_target` yields an :class:`AttackTarget`: the node endpoints, the cluster id, a channel
factory, and what the attacks check (leader and epoch, each controller's quorum-state bytes, the high
watermark, RSS).  Tests get it through a module fixture parametrized over :data:`TARGET_KINDS`:

* ``PLAINTEXT`` — no authentication: the attacker is anyone who can reach a port;
* ``SSL`` — ``kraft cluster up --tls``: mutual TLS on every listener and the StandardAuthorizer with the
  cluster's own certificates as ``super.users``.  ``open_channel`` presents the CLI's admin certificate
  (a super user: the strongest credential that is no node's); :meth:`AttackTarget.channel_as` presents
  any certificate of the cluster's CA (a node's, or one :meth:`AttackTarget.issue` makes).
"""

from __future__ import annotations

import contextlib
import functools
import os
import signal
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from kraft.client.channel import (
    PLAINTEXT_SECURITY,
    SSL,
    ChannelSecurity,
    KeyStore,
    PemSource,
    TrustStore,
    set_default_security,
)
from kraft.cluster.manager import LocalCluster
from kraft.cluster.spec import ADMIN_CLIENT
from kraft.errors import ErrorCode
from kraft.security.ca import load_ca, write_private
from kraft.storage.log import METADATA_LOG_DIR_NAME
from kraft.storage.quorum_state import QUORUM_STATE_FILE
from kraft.v1 import raft_pb2, raft_pb2_grpc

TARGET_KINDS = ("PLAINTEXT", "SSL")

OVERRIDES: Mapping[str, str] = {
    # Small enough that the capped long-poll is seen quickly.
    "metadata.fetch.max.wait.ms": "2000",
    # Followers may be paused (SIGSTOP) for a few seconds without anyone timing out: the leader keeps its
    # quorum (check-quorum: 1.5 times this) and the resumed followers do not start an election.
    "controller.quorum.fetch.timeout.ms": "6000",
}

ChannelFactory = Callable[[str], grpc.Channel]
AioChannelFactory = Callable[[str], grpc.aio.Channel]

_CHANNEL_OPTIONS = [
    ("grpc.enable_retries", 0),
    ("grpc.max_send_message_length", 64 << 20),
    ("grpc.max_receive_message_length", 64 << 20),
]


def plaintext_channel(target: str) -> grpc.Channel:
    return grpc.insecure_channel(target, options=_CHANNEL_OPTIONS)


def plaintext_aio_channel(target: str) -> grpc.aio.Channel:
    return grpc.aio.insecure_channel(target, options=_CHANNEL_OPTIONS)


def tls_security(tls_dir: Path, name: str | None) -> ChannelSecurity:
    """TLS that trusts the cluster's CA and presents ``<tls_dir>/<name>.pem`` (None: no certificate)."""
    keystore = KeyStore.from_file(tls_dir / f"{name}.pem") if name else None
    return ChannelSecurity(SSL, TrustStore(PemSource(path=tls_dir / "ca.pem")), keystore)


def tls_channel(tls_dir: Path, name: str | None, target: str) -> grpc.Channel:
    return grpc.secure_channel(target, tls_security(tls_dir, name).credentials(), options=_CHANNEL_OPTIONS)


def tls_aio_channel(tls_dir: Path, name: str | None, target: str) -> grpc.aio.Channel:
    credentials = tls_security(tls_dir, name).credentials()
    return grpc.aio.secure_channel(target, credentials, options=_CHANNEL_OPTIONS)


@dataclass
class AttackTarget:
    kind: str
    cluster: LocalCluster
    cluster_id: str
    controllers: dict[int, str]
    """node id → ``host:port`` of each controller (RaftService, ControllerService)."""
    brokers: dict[int, str]
    """node id → ``host:port`` of each broker (BrokerService)."""
    open_channel: ChannelFactory
    open_aio_channel: AioChannelFactory

    @property
    def tls(self) -> bool:
        return self.kind == "SSL"

    @contextlib.contextmanager
    def channel(self, target: str) -> Iterator[grpc.Channel]:
        channel = self.open_channel(target)
        try:
            yield channel
        finally:
            channel.close()

    @contextlib.contextmanager
    def channel_as(self, name: str | None, target: str) -> Iterator[grpc.Channel]:
        """SSL only: a channel presenting the certificate ``name`` (``controller-2``, ``broker-101``, one
        :meth:`issue` made; None: TLS without a client certificate)."""
        assert self.tls, "certificates exist only on an SSL target"
        channel = tls_channel(self.cluster.layout.tls_dir, name, target)
        try:
            yield channel
        finally:
            channel.close()

    def issue(self, name: str) -> None:
        """SSL only: a certificate ``CN=<name>,O=kraft`` from the cluster's CA, for :meth:`channel_as`."""
        tls_dir = self.cluster.layout.tls_dir
        path = tls_dir / f"{name}.pem"
        if not path.exists():
            write_private(path, load_ca(tls_dir).issue(name).keystore_pem)

    def raft_identities(self, node_id: int) -> list[str | None]:
        """Who forges Raft requests at controller ``node_id``: on PLAINTEXT the anonymous caller (None);
        on SSL the admin certificate (a super user, but no controller), a broker's, and the certificate
        of another voter (a stolen controller key: it may speak Raft, but only as itself)."""
        if not self.tls:
            return [None]
        other_voter = min(v for v in self.controllers if v != node_id)
        return [ADMIN_CLIENT, f"broker-{min(self.brokers)}", f"controller-{other_voter}"]

    def service_identity(self, service: str) -> str | None:
        """The certificate requests to ``service`` present on SSL beyond the admin's (None: the admin's):
        RaftService answers only controllers, so Raft-level attacks (bad bytes, cluster ids, fuzzing) come
        with a controller's certificate and reach the real checks."""
        return f"controller-{max(self.controllers)}" if self.tls and service == "RaftService" else None

    @contextlib.contextmanager
    def service_channel(self, service: str, target: str) -> Iterator[grpc.Channel]:
        with self.raft_channel(self.service_identity(service), target) as channel:
            yield channel

    def open_service_aio_channel(self, service: str, target: str) -> grpc.aio.Channel:
        identity = self.service_identity(service)
        if identity is None:
            return self.open_aio_channel(target)
        return tls_aio_channel(self.cluster.layout.tls_dir, identity, target)

    @contextlib.contextmanager
    def raft_channel(self, identity: str | None, target: str) -> Iterator[grpc.Channel]:
        """A channel for :meth:`raft_identities`'s ``identity``."""
        if identity is None:
            with self.channel(target) as channel:
                yield channel
        else:
            with self.channel_as(identity, target) as channel:
                yield channel

    def describe_quorum(self, node_id: int) -> raft_pb2.DescribeQuorumResponse:
        with self.channel(self.controllers[node_id]) as channel:
            response: raft_pb2.DescribeQuorumResponse = raft_pb2_grpc.RaftServiceStub(channel).DescribeQuorum(
                raft_pb2.DescribeQuorumRequest(cluster_id=self.cluster_id), timeout=5
            )
        return response

    def leader(self, timeout_s: float = 30.0) -> tuple[int, int]:
        """(leader id, epoch) that every controller agrees on."""
        deadline = time.monotonic() + timeout_s
        seen: set[tuple[int, int]] = set()
        while time.monotonic() < deadline:
            seen = set()
            for node_id in self.controllers:
                try:
                    answer = self.describe_quorum(node_id)
                except grpc.RpcError:
                    seen.add((-1, -1))
                    continue
                # A follower answers NOT_LEADER_OR_FOLLOWER naming the leader it follows.
                seen.add((answer.leader_id, answer.leader_epoch))
            if len(seen) == 1 and next(iter(seen))[0] >= 0:
                return next(iter(seen))
            time.sleep(0.1)
        raise AssertionError(f"no agreed leader within {timeout_s} s: {seen}")

    def leader_answer(self) -> raft_pb2.DescribeQuorumResponse:
        leader_id, _ = self.leader()
        answer = self.describe_quorum(leader_id)
        assert answer.error_code == ErrorCode.NONE, answer
        return answer

    def quorum_state(self, node_id: int) -> bytes:
        node = self.cluster.spec.node(node_id)
        return (self.cluster.layout.data_dir(node) / METADATA_LOG_DIR_NAME / QUORUM_STATE_FILE).read_bytes()

    def quorum_states(self) -> dict[int, bytes]:
        return {node_id: self.quorum_state(node_id) for node_id in self.controllers}

    @contextlib.contextmanager
    def paused(self, node_ids: list[int]) -> Iterator[None]:
        """SIGSTOP the nodes for the block (SIGCONT on the way out, whatever happens)."""
        pids = [self.pids()[node_id] for node_id in node_ids]
        try:
            for pid in pids:
                os.kill(pid, signal.SIGSTOP)
            yield
        finally:
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    def pids(self) -> dict[int, int]:
        found: dict[int, int] = {}
        for node_id in (*self.controllers, *self.brokers):
            pid = self.cluster.process(node_id).pid()
            assert pid is not None, f"node {node_id} is not running"
            found[node_id] = pid
        return found

    def rss_bytes(self) -> dict[int, int]:
        """Resident memory of every node process."""
        out: dict[int, int] = {}
        for node_id, pid in self.pids().items():
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out[node_id] = int(line.split()[1]) * 1024
        return out

    def cpu_seconds(self) -> dict[int, float]:
        """CPU time (user + system) every node process has used so far: the work a request cost, which a
        loaded host does not inflate as it does the wall time of the call."""
        ticks = os.sysconf("SC_CLK_TCK")
        out: dict[int, float] = {}
        for node_id, pid in self.pids().items():
            # /proc/<pid>/stat: "pid (comm) state …"; utime and stime are fields 14 and 15, counted here
            # after the comm's closing parenthesis (a comm may hold spaces)
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[node_id] = (int(fields[11]) + int(fields[12])) / ticks
        return out

    def all_running(self) -> bool:
        return all(self.cluster.process(n).is_running() for n in (*self.controllers, *self.brokers))


@contextlib.contextmanager
def started_target(root: Path, kind: str) -> Iterator[AttackTarget]:
    if kind not in TARGET_KINDS:
        raise ValueError(f"no {kind} attack target (known: {', '.join(TARGET_KINDS)})")
    tls = kind == "SSL"
    cluster = LocalCluster.create(
        root, controllers=3, brokers=1, profile="fast", overrides=OVERRIDES, tls=tls
    )
    tls_dir = cluster.layout.tls_dir
    assert cluster.spec.authorizer is tls  # `cluster up --tls` configures the authorizer
    open_channel: ChannelFactory = (
        functools.partial(tls_channel, tls_dir, ADMIN_CLIENT) if tls else plaintext_channel
    )
    open_aio: AioChannelFactory = (
        functools.partial(tls_aio_channel, tls_dir, ADMIN_CLIENT) if tls else plaintext_aio_channel
    )
    set_default_security(cluster.client_security())  # the cluster's own probes, as `kraft cluster` does
    try:
        # Controllers first, brokers once a leader is elected (what `kraft cluster up` does).
        cluster.start([n.node_id for n in cluster.spec.controllers])
        cluster.wait_until(lambda s: s.leader_id >= 0, 90.0, what="a quorum leader")
        cluster.start()
        cluster.wait_healthy(timeout_s=90)
        yield AttackTarget(
            kind,
            cluster,
            cluster.spec.cluster_id,
            {n.node_id: n.target for n in cluster.spec.controllers},
            {n.node_id: n.target for n in cluster.spec.brokers},
            open_channel,
            open_aio,
        )
    finally:
        try:
            cluster.down(timeout_s=15)
        finally:
            set_default_security(PLAINTEXT_SECURITY)
