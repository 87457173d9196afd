"""How a follower's :class:`~kraft.broker.replication.ReplicaManager` reaches its leaders.

The replica fetch is the only broker-to-broker call of replication: divergence (Kafka's
OffsetsForLeaderEpoch) travels in its answer (``diverging_epoch``, KIP-320), and AlterPartition goes to the
controller through the ``send_alter_partition`` callable the manager is given.  Keeping the call behind
:class:`ReplicaFetchTransport` lets the deterministic simulation (tests/sim/replication_harness.py) run the
real ReplicaManager over a seeded in-memory network on a virtual-time loop; a broker process uses
:class:`GrpcReplicaFetchTransport`, the manager's default.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

import grpc

from kraft.client.channel import ChannelPool, ChannelSecurity
from kraft.observability.logging import get_logger
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc


class ReplicaFetchFailed(Exception):
    """No answer from the leader (unreachable, unknown endpoint, timed out); ``code`` names why (logs)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class ReplicaFetchTransport(Protocol):
    async def replica_fetch(
        self, leader_id: int, request: pb.ReplicaFetchRequest, timeout_s: float
    ) -> pb.ReplicaFetchResponse:
        """Send one replica fetch to broker ``leader_id`` and return its answer; raises
        :class:`ReplicaFetchFailed` when none came (the fetcher backs off and retries)."""
        ...

    async def close(self) -> None: ...


class GrpcReplicaFetchTransport:
    """``BrokerService.ReplicaFetch`` over gRPC: one channel per leader endpoint (``endpoint_of``: the
    ``host:port`` of a broker's listener in the current image, None when unknown), following a rotation of
    the broker's TLS files (:class:`~kraft.client.channel.ChannelPool`)."""

    def __init__(
        self,
        broker_id: int,
        endpoint_of: Callable[[int], str | None],
        *,
        channel_options: Iterable[tuple[str, int]] = (),
        security: ChannelSecurity | None = None,
    ) -> None:
        self._endpoint_of = endpoint_of
        self._channels = ChannelPool(
            list(channel_options),
            security,
            log=get_logger("broker.replication", node=broker_id),
            name="replica_fetcher",
        )

    async def replica_fetch(
        self, leader_id: int, request: pb.ReplicaFetchRequest, timeout_s: float
    ) -> pb.ReplicaFetchResponse:
        target = self._endpoint_of(leader_id)
        if target is None:
            raise ReplicaFetchFailed("NO_ENDPOINT")
        stub = broker_pb2_grpc.BrokerServiceStub(self._channels.get(target))
        try:
            response: pb.ReplicaFetchResponse = await stub.ReplicaFetch(request, timeout=timeout_s)
        except grpc.aio.AioRpcError as err:
            raise ReplicaFetchFailed(err.code().name) from err
        return response

    async def close(self) -> None:
        await self._channels.close()
