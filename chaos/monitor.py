"""Watches the cluster during a run through the nodes' real listeners (which no nemesis cuts).

Every ``interval_s`` it asks each controller for its view of the quorum (DescribeQuorum) and the active
controller for the brokers' states, recording :class:`LeaderObservation` and :class:`ClusterSample`
rows for the leadership and liveness checkers.  Probes are blocking gRPC with a short deadline, run in a
worker thread so the event loop keeps serving the workload.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Protocol, TypeVar

import grpc

from chaos.checkers import ClusterSample, LeaderObservation
from kraft.client.channel import open_blocking_channel
from kraft.cluster.probe import cluster_view, quorum_view
from kraft.cluster.spec import NodeSpec
from kraft.storage.errors import StorageError
from kraft.v1 import broker_pb2, broker_pb2_grpc

PROBE_TIMEOUT_S = 0.4


class _Answer(Protocol):
    @property
    def error_code(self) -> int: ...


_A = TypeVar("_A", bound=_Answer)


def _probe(target: str, call: Callable[[grpc.Channel], _A]) -> _A | None:
    """One call on a fresh channel (no retries); None on any RPC failure or a non-NONE error code."""
    try:
        with open_blocking_channel(target, options=[("grpc.enable_retries", 0)]) as channel:
            reply = call(channel)
    except grpc.RpcError:
        return None
    return reply if reply.error_code == 0 else None


def describe_broker(
    target: str, cluster_id: str, timeout_s: float
) -> broker_pb2.DescribeBrokerResponse | None:
    request = broker_pb2.DescribeBrokerRequest(cluster_id=cluster_id)

    def call(channel: grpc.Channel) -> broker_pb2.DescribeBrokerResponse:
        reply: broker_pb2.DescribeBrokerResponse = broker_pb2_grpc.BrokerServiceStub(channel).DescribeBroker(
            request, timeout=timeout_s
        )
        return reply

    return _probe(target, call)


class ClusterMonitor:
    """``broker_images[name][offset] = digest`` keeps only pairs two back-to-back probes agreed on: the
    broker sets its offset and its image in separate steps, so one answer might straddle an update."""

    def __init__(
        self,
        cluster_id: str,
        controllers: Sequence[NodeSpec],
        brokers: Sequence[NodeSpec] = (),
        interval_s: float = 0.25,
        clock_ns: Callable[[], int] = time.monotonic_ns,
        disk_of: Callable[[str], str] | None = None,
    ) -> None:
        """``disk_of(name)``: the controller's metadata disk now (its directory id; raising while there is
        none, mid-wipe): each observation names the disk that answered (see :meth:`_disk`)."""
        self._cluster_id = cluster_id
        self._disk_of = disk_of
        self._controllers = list(controllers)
        self._brokers = list(brokers)
        self._interval_s = interval_s
        self._clock_ns = clock_ns
        self.leaders: list[LeaderObservation] = []
        self.samples: list[ClusterSample] = []
        self.broker_images: dict[str, dict[int, str]] = {b.name: {} for b in self._brokers}

    def _poll_brokers(self) -> None:
        for broker in self._brokers:
            pairs = []
            for _ in range(2):
                reply = describe_broker(broker.target, self._cluster_id, PROBE_TIMEOUT_S)
                if reply is None or reply.metadata_offset < 0 or not reply.image_digest:
                    break
                pairs.append((int(reply.metadata_offset), str(reply.image_digest)))
            if len(pairs) == 2 and pairs[0] == pairs[1]:
                self.broker_images[broker.name][pairs[0][0]] = pairs[0][1]

    def _disk(self, name: str) -> str | None:
        """``name``'s disk now: "" when unknown (no ``disk_of``), None when it has none (mid-wipe)."""
        if self._disk_of is None:
            return ""
        try:
            return self._disk_of(name)
        except (OSError, StorageError):  # between the wipe's delete and its format
            return None

    def poll_once(self) -> ClusterSample:
        """One round of probes (blocking); also appends to ``leaders`` and ``samples``."""
        claims: list[tuple[int, int]] = []
        newest_epoch = -1
        for node in self._controllers:
            disk = self._disk(node.name)
            view = quorum_view(node.target, PROBE_TIMEOUT_S)
            if view is None:
                continue
            now = self._clock_ns()
            leader = view.leader_id if view.leader_id >= 0 else None
            if disk is not None and self._disk(node.name) == disk:
                self.leaders.append(LeaderObservation(node.name, view.leader_epoch, leader, now, disk))
            # else: the disk was replaced around this probe, so which disk answered is unknown: the
            # answer still names the active controller below, but judges no disk's epochs
            newest_epoch = max(newest_epoch, view.leader_epoch)
            if leader == node.node_id:
                claims.append((view.leader_epoch, node.node_id))
        # A claimant behind an epoch another controller already reached is deposed (or an election is
        # under way): its image may be stale, so this poll names no active controller.
        leader_id = max(claims)[1] if claims and max(claims)[0] >= newest_epoch else None
        fenced: dict[int, bool] = {}
        offset = -1
        probe_ns: int | None = None
        if leader_id is not None:
            target = next(n.target for n in self._controllers if n.node_id == leader_id)
            probe_ns = self._clock_ns()
            cluster = cluster_view(target, self._cluster_id, PROBE_TIMEOUT_S)
            if cluster is not None:
                fenced = {broker_id: b.state != "ACTIVE" for broker_id, b in cluster.brokers.items()}
                offset = cluster.metadata_offset
        # The flags describe the committed image at `offset` as it stood between probe_ns and now.
        sample = ClusterSample(self._clock_ns(), leader_id, fenced, offset, probe_ns)
        self.samples.append(sample)
        self._poll_brokers()
        return sample

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.to_thread(self.poll_once)
            # Wake early when asked to stop; a timeout here is the normal poll cadence.
            try:
                await asyncio.wait_for(stop.wait(), self._interval_s)
            except TimeoutError:
                continue

    async def wait_for(
        self, predicate: Callable[[ClusterSample], bool], timeout_s: float
    ) -> ClusterSample | None:
        """Poll until a sample satisfies ``predicate`` or ``timeout_s`` passes (then None)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            sample = await asyncio.to_thread(self.poll_once)
            if predicate(sample):
                return sample
            await asyncio.sleep(self._interval_s)
        return None
