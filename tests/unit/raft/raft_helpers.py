"""Shared helpers for the Raft unit tests: in-memory drivers on a loopback network, a recording listener."""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kraft.clock import SystemClock
from kraft.raft.api import CommittedBatch, LeaderAndEpoch, LoadedSnapshot
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import (
    LoopbackNetwork,
    MemoryElectionStore,
    MemoryLogStore,
    MemorySnapshotStore,
)

FAST_TIMINGS: dict[str, int] = {
    "election_timeout_ms": 150,
    "fetch_timeout_ms": 300,
    "election_backoff_max_ms": 150,
    "election_backoff_base_ms": 10,
    "append_linger_ms": 1,
    "request_timeout_ms": 200,
    "retry_backoff_ms": 10,
    "fetch_max_wait_ms": 50,
}


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


@dataclass
class RecordingListener:
    values: dict[int, bytes] = field(default_factory=dict)
    control_offsets: list[int] = field(default_factory=list)
    snapshots: list[LoadedSnapshot] = field(default_factory=list)
    snapshot_values: list[bytes] = field(default_factory=list)
    leaders: list[LeaderAndEpoch] = field(default_factory=list)
    next_offset: int = 0

    async def handle_commit(self, batch: CommittedBatch) -> None:
        assert batch.base_offset == self.next_offset, (batch.base_offset, self.next_offset)
        if batch.control:
            self.control_offsets.append(batch.base_offset)
        for record in batch.records:
            self.values[record.offset] = record.value
        self.next_offset = batch.last_offset + 1

    async def handle_load_snapshot(self, reader: LoadedSnapshot) -> None:
        self.snapshots.append(reader)
        self.values = {}
        self.snapshot_values = list(reader.records)
        self.next_offset = reader.snapshot_id.end_offset

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self.leaders.append(leader)


@dataclass
class NodeStores:
    log: MemoryLogStore = field(default_factory=MemoryLogStore)
    elections: MemoryElectionStore = field(default_factory=MemoryElectionStore)
    snapshots: MemorySnapshotStore = field(default_factory=MemorySnapshotStore)


class LoopbackCluster:
    """N drivers over in-memory stores on one loopback network; nodes can stop and restart on their stores."""

    def __init__(self, size: int, **overrides: int) -> None:
        self.voters = tuple(range(1, size + 1))
        self.network = LoopbackNetwork()
        self.stores = {node_id: NodeStores() for node_id in self.voters}
        self.drivers: dict[int, RaftDriver] = {}
        self.timings = {**FAST_TIMINGS, **overrides}

    async def start(self, node_id: int) -> RaftDriver:
        stores = self.stores[node_id]
        driver = RaftDriver(
            RaftConfig(node_id=node_id, voters=self.voters, cluster_id="test-cluster", **self.timings),
            transport=self.network.transport(node_id),
            log=stores.log,
            elections=stores.elections,
            snapshots=stores.snapshots,
            clock=SystemClock(),
            rng=random.Random(node_id),
        )
        self.network.register(node_id, driver)
        await driver.start()
        self.drivers[node_id] = driver
        return driver

    async def start_all(self) -> None:
        for node_id in self.voters:
            await self.start(node_id)

    async def stop(self, node_id: int) -> None:
        driver = self.drivers.pop(node_id)
        self.network.unregister(node_id)
        await driver.stop()

    async def close(self) -> None:
        for node_id in list(self.drivers):
            await self.stop(node_id)

    def leader(self) -> RaftDriver | None:
        for driver in self.drivers.values():
            if driver.leader_and_epoch.leader_id == driver.node_id:
                return driver
        return None

    async def wait_for_leader(self, timeout_s: float = 10.0, exclude: int | None = None) -> RaftDriver:
        def elected() -> bool:
            leader = self.leader()
            if leader is None or leader.node_id == exclude:
                return False
            epoch = leader.leader_and_epoch
            return all(d.leader_and_epoch == epoch for d in self.drivers.values())

        await wait_until(elected, timeout_s, "a leader known to every running node")
        leader = self.leader()
        assert leader is not None
        return leader
