"""Bounded, non-raising gRPC probes of one node (for status displays and wait loops).

Each probe answers ``None`` when the node cannot be asked (not up yet, unreachable, deadline): callers
poll, so a missing answer is information, not an error.
"""

from __future__ import annotations

from dataclasses import dataclass

import grpc

from kraft.client.channel import open_blocking_channel
from kraft.client.quorum import describe_quorum_at, peer_problems_of
from kraft.errors import ErrorCode
from kraft.observability.health import BROKER_SERVICE, HealthStatus, check_health_sync
from kraft.v1 import controller_pb2, controller_pb2_grpc

# One attempt per probe: the caller's poll loop is the retry policy.
_CHANNEL_OPTIONS = [("grpc.enable_retries", 0)]


@dataclass(frozen=True, slots=True)
class QuorumView:
    """What one controller says about the quorum (``leader_id`` -1 = no leader known)."""

    leader_id: int
    leader_epoch: int
    high_watermark: int
    error: ErrorCode
    peer_problems: tuple[str, ...] = ()
    """What this controller reports about its peers right now (unreachable voters, refusals)."""
    voters: tuple[tuple[int, str], ...] = ()
    """The (id, directory id) voters in this controller's answer (the voter set in force when it is the
    leader; a static quorum's directory ids are empty)."""


@dataclass(frozen=True, slots=True)
class BrokerView:
    """A broker as the active controller sees it (``state``: FENCED, ACTIVE, CONTROLLED_SHUTDOWN, OFFLINE)."""

    broker_id: int
    state: str
    metadata_offset: int


@dataclass(frozen=True, slots=True)
class ClusterView:
    """The active controller's DescribeCluster answer: its committed ``metadata_offset`` and every
    registered broker (the brokers' states are those of the image at that offset)."""

    metadata_offset: int
    brokers: dict[int, BrokerView]


def quorum_view(target: str, timeout_s: float) -> QuorumView | None:
    """DescribeQuorum on ``target`` itself (no redirect): any controller names the leader it knows."""
    reply = describe_quorum_at(target, timeout_s)
    if reply is None:
        return None
    return QuorumView(
        reply.leader_id,
        reply.leader_epoch,
        reply.high_watermark,
        ErrorCode.from_wire(reply.error_code),
        tuple(str(problem) for problem in peer_problems_of(reply)),
        tuple(sorted((v.replica_id, v.directory_id) for v in reply.current_voters)),
    )


def cluster_view(target: str, cluster_id: str, timeout_s: float) -> ClusterView | None:
    """DescribeCluster on ``target``; None unless it answered as the active controller.  The one
    DescribeCluster probe: ``kraft cluster status`` and the chaos monitor both poll with it."""
    try:
        with open_blocking_channel(target, _CHANNEL_OPTIONS) as channel:
            stub = controller_pb2_grpc.ControllerServiceStub(channel)
            reply: controller_pb2.DescribeClusterResponse = stub.DescribeCluster(
                controller_pb2.DescribeClusterRequest(cluster_id=cluster_id), timeout=timeout_s
            )
    except grpc.RpcError:
        return None
    if ErrorCode.from_wire(reply.error_code) is not ErrorCode.NONE:
        return None
    brokers = {b.broker_id: BrokerView(b.broker_id, b.state, b.metadata_offset) for b in reply.brokers}
    return ClusterView(int(reply.metadata_offset), brokers)


def broker_serving(target: str, timeout_s: float) -> bool:
    """The broker's own grpc health for ``kraft.v1.BrokerService``: SERVING once this process is unfenced."""
    return check_health_sync(target, BROKER_SERVICE, timeout_s) is HealthStatus.SERVING
