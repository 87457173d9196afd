"""A real cluster to attack (issue #15 security suite): 3 controllers and 1 broker as processes.

:func:`started_target` yields an :class:`AttackTarget`: the node endpoints, the cluster id, a channel
factory, and what the attacks check (leader and epoch, each controller's quorum-state bytes, the high
watermark, RSS).  Tests get it through a module fixture parametrized over :data:`TARGET_KINDS`; only
``PLAINTEXT`` exists today.  A TLS variant adds its kind here and, in :func:`started_target`, the cluster
overrides and an ``open_channel`` that presents the client certificate — the attacks stay as they are.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio

from kraft.cluster.manager import LocalCluster
from kraft.errors import ErrorCode
from kraft.storage.log import METADATA_LOG_DIR_NAME
from kraft.storage.quorum_state import QUORUM_STATE_FILE
from kraft.v1 import raft_pb2, raft_pb2_grpc

TARGET_KINDS = ("PLAINTEXT",)

OVERRIDES: Mapping[str, str] = {
    # Small enough that the capped long-poll is seen quickly.
    "metadata.fetch.max.wait.ms": "2000",
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

    @contextlib.contextmanager
    def channel(self, target: str) -> Iterator[grpc.Channel]:
        channel = self.open_channel(target)
        try:
            yield channel
        finally:
            channel.close()

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

    def all_running(self) -> bool:
        return all(self.cluster.process(n).is_running() for n in (*self.controllers, *self.brokers))


@contextlib.contextmanager
def started_target(root: Path, kind: str) -> Iterator[AttackTarget]:
    if kind != "PLAINTEXT":
        raise ValueError(f"no {kind} attack target yet")
    cluster = LocalCluster.create(root, controllers=3, brokers=1, profile="fast", overrides=OVERRIDES)
    try:
        cluster.start()
        cluster.wait_healthy(timeout_s=90)
        yield AttackTarget(
            kind,
            cluster,
            cluster.spec.cluster_id,
            {n.node_id: n.target for n in cluster.spec.controllers},
            {n.node_id: n.target for n in cluster.spec.brokers},
            plaintext_channel,
            plaintext_aio_channel,
        )
    finally:
        cluster.down(timeout_s=15)
