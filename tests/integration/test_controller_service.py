"""ControllerService on real controller processes, with a gRPC client acting as brokers.

One 3-controller quorum per test; brokers are simulated by heartbeat tasks.  Checks: redirects to the
active controller, broker registration/unfencing, topic creation seen through the CLI and MetadataFetch,
no live broker fenced across a SIGKILL failover, a silent broker fenced within its session timeout, and
identical image stores on every controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kraft.client.admin import AdminClient
from kraft.client.channel import open_channel
from kraft.clock import SystemClock
from kraft.cluster.quorum import ControllerQuorum, run_kraft
from kraft.errors import ErrorCode, KraftError
from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.v1 import common_pb2, controller_pb2_grpc
from kraft.v1 import controller_pb2 as cpb

pytestmark = pytest.mark.integration

SESSION_MS = 3000
OVERRIDES = {"broker.session.timeout.ms": str(SESSION_MS), "broker.heartbeat.interval.ms": "500"}


async def until(condition: Callable[[], object], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


class Brokers:
    """Simulated brokers: register, then heartbeat every 300 ms with their applied offset."""

    def __init__(self, client: AdminClient, cluster_id: str) -> None:
        self.client = client
        self.cluster_id = cluster_id
        self.epochs: dict[int, int] = {}
        self.silent: set[int] = set()
        self.fenced_answers: dict[int, int] = {}
        self._task: asyncio.Task[None] | None = None

    async def register(self, broker_id: int) -> int:
        response = await self.client.call(
            lambda s: s.RegisterBroker,
            cpb.RegisterBrokerRequest(
                cluster_id=self.cluster_id,
                broker_id=broker_id,
                incarnation_id=f"incarnation-{broker_id}",
                listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=19000 + broker_id)],
                rack=f"rack-{broker_id % 2}",
            ),
        )
        self.epochs[broker_id] = response.broker_epoch
        return response.broker_epoch

    async def beat(self, broker_id: int) -> cpb.BrokerHeartbeatResponse:
        epoch = self.epochs[broker_id]
        return await self.client.call(
            lambda s: s.BrokerHeartbeat,
            cpb.BrokerHeartbeatRequest(
                cluster_id=self.cluster_id,
                broker_id=broker_id,
                broker_epoch=epoch,
                current_metadata_offset=1 << 40,
            ),
            check=False,
        )

    async def _loop(self) -> None:
        while True:
            for broker_id in list(self.epochs):
                if broker_id in self.silent:
                    continue
                # During the failover no controller may answer within the client's timeout (KraftError
                # NOT_CONTROLLER): keep beating, as a real broker does.  Anything else fails the test.
                with contextlib.suppress(KraftError):
                    response = await self.beat(broker_id)
                    if response.is_fenced and response.error_code == ErrorCode.NONE:
                        self.fenced_answers[broker_id] = self.fenced_answers.get(broker_id, 0) + 1
            await asyncio.sleep(0.3)

    def start(self) -> None:
        self.fenced_answers.clear()
        self._task = asyncio.create_task(self._loop())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task


async def describe(client: AdminClient) -> cpb.DescribeClusterResponse:
    return await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())


def store_tables(path: Path) -> tuple[list[tuple[object, ...]], ...]:
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        return (
            db.execute("SELECT broker_id, epoch, fenced FROM brokers ORDER BY 1").fetchall(),
            db.execute("SELECT topic_id, name, partitions FROM topics ORDER BY 1").fetchall(),
            db.execute("SELECT * FROM partitions ORDER BY 1, 2").fetchall(),
        )


async def test_controller_service_end_to_end(quorum_factory: Callable[..., ControllerQuorum]) -> None:
    quorum = quorum_factory(overrides=OVERRIDES, test_append=False)
    quorum.start()
    leader = quorum.wait_for_leader(timeout_s=30)
    targets = [node.target for node in quorum.nodes.values()]
    async with AdminClient(targets, timeout_s=30, clock=SystemClock()) as client:
        cluster = await describe(client)
        assert cluster.cluster_id == quorum.cluster_id and cluster.controller_id == leader.node_id

        # a controller that is not active redirects to the one that is
        follower = next(n for n in quorum.nodes.values() if n.node_id != cluster.controller_id)
        async with open_channel(follower.target) as channel:
            stub = controller_pb2_grpc.ControllerServiceStub(channel)
            redirected = await stub.DescribeCluster(
                cpb.DescribeClusterRequest(cluster_id=quorum.cluster_id), timeout=10
            )
        assert redirected.error_code == ErrorCode.NOT_CONTROLLER
        assert redirected.controller.node_id == cluster.controller_id
        assert redirected.controller.endpoint.port == quorum.nodes[cluster.controller_id].port

        brokers = Brokers(client, quorum.cluster_id)
        for broker_id in (1, 2, 3):
            await brokers.register(broker_id)
        brokers.start()
        try:
            states: dict[int, str] = {}

            async def refresh() -> None:
                states.clear()
                states.update({b.broker_id: b.state for b in (await describe(client)).brokers})

            deadline = time.monotonic() + 15
            while states != {1: "ACTIVE", 2: "ACTIVE", 3: "ACTIVE"}:
                assert time.monotonic() < deadline, f"brokers not unfenced: {states}"
                await refresh()
                await asyncio.sleep(0.1)

            # topics through the CLI (a subprocess following redirects from any bootstrap entry)
            bootstrap = ",".join(targets)
            created = await asyncio.to_thread(
                run_kraft,
                ["topic", "create", "orders", "-p", "6", "-r", "3", "--config", "retention.ms=1000",
                 "--bootstrap-controller", bootstrap],
            )  # fmt: skip
            assert created.returncode == 0, created.stderr
            described = await asyncio.to_thread(
                run_kraft, ["topic", "describe", "orders", "--json", "--bootstrap-controller", bootstrap]
            )
            topic = json.loads(described.stdout)
            assert topic["configs"] == {"retention.ms": "1000"} and len(topic["partitions"]) == 6
            assert all(len(p["isr"]) == 3 and p["leader"] == p["replicas"][0] for p in topic["partitions"])
            duplicate = await asyncio.to_thread(
                run_kraft, ["topic", "create", "orders", "-p", "1", "--bootstrap-controller", bootstrap]
            )
            assert duplicate.returncode == 1 and duplicate.stderr.startswith("error: TOPIC_ALREADY_EXISTS")

            # MetadataFetch from offset 0 rebuilds the same topic
            fetched = await client.call(
                lambda s: s.MetadataFetch,
                cpb.MetadataFetchRequest(cluster_id=quorum.cluster_id, fetch_offset=0),
            )
            delta = MetadataDelta(MetadataImage.empty())
            if fetched.HasField("snapshot_id"):
                pytest.fail("a fresh cluster should serve records, not a snapshot")
            for record in fetched.records:
                delta.replay(records.decode_value(record.value), record.offset)
            rebuilt = delta.apply().topic("orders")
            assert rebuilt is not None and len(rebuilt.partitions) == 6

            # SIGKILL the active controller: the live brokers are never fenced
            old = cluster.controller_id
            quorum.kill(old)
            await until(lambda: quorum.current_leader() is not None, 30, "a new leader")
            await refresh()
            assert (await describe(client)).controller_id != old
            await asyncio.sleep(SESSION_MS / 1000 * 1.5)
            await refresh()
            assert states == {1: "ACTIVE", 2: "ACTIVE", 3: "ACTIVE"}, states
            assert brokers.fenced_answers == {}, brokers.fenced_answers

            # a silent broker is fenced within session timeout x 1.2 (+ one heartbeat period of slack)
            brokers.silent.add(3)
            silent_since = time.monotonic()
            deadline = silent_since + SESSION_MS / 1000 * 1.2 + 1.0
            while states.get(3) not in ("FENCED", "OFFLINE"):
                assert time.monotonic() < deadline, f"broker 3 still {states.get(3)}"
                await refresh()
                await asyncio.sleep(0.1)
            orders = await client.call(
                lambda s: s.DescribeTopics,
                cpb.DescribeTopicsRequest(
                    cluster_id=quorum.cluster_id, names=["orders"], include_partitions=True
                ),
            )
            assert all(3 not in p.isr and p.leader != 3 for p in orders.topics[0].partitions)

            listed = await asyncio.to_thread(
                run_kraft, ["broker", "list", "--json", "--bootstrap-controller", bootstrap]
            )
            assert {b["id"]: b["state"] for b in json.loads(listed.stdout)}[1] == "ACTIVE"

            # the killed controller comes back and every image store converges
            quorum.restart(old)
            stores = [node.metadata_dir / "metadata-image.sqlite" for node in quorum.nodes.values()]
            deadline = time.monotonic() + 30
            while True:
                tables = [store_tables(p) for p in stores if p.exists()]
                if len(tables) == 3 and all(t == tables[0] for t in tables) and tables[0][1]:
                    break
                assert time.monotonic() < deadline, "image stores did not converge"
                await asyncio.sleep(0.2)
        finally:
            await brokers.stop()
