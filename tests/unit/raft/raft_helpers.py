"""Shared helpers for the Raft unit tests: in-memory drivers on a loopback network, a recording listener.

A :class:`LoopbackCluster` runs its drivers and its network on one :class:`~kraft.clock.ManualClock`: no
timer fires and no request times out until the test moves time with :meth:`LoopbackCluster.advance` /
:meth:`LoopbackCluster.run_until`, which also wait until every driver and the network have looked at the
new time (:func:`settle`), so a test can assert what did *not* happen by a given instant.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pytest

from kraft.clock import ManualClock
from kraft.raft.api import CommittedBatch, LeaderAndEpoch, LoadedSnapshot
from kraft.raft.core_leader import LeaderRole
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import (
    LoopbackNetwork,
    MemoryElectionStore,
    MemoryLogStore,
    MemorySnapshotStore,
)
from kraft.raft.messages import FetchRequest, RaftRequest, RaftResponse

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

T = TypeVar("T")


async def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    """Poll ``condition`` every 10 ms until it holds; fail with ``what`` after ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        await asyncio.sleep(0.01)


_QUIET_TURNS = 10
"""Event-loop turns every driver must stay idle for :func:`settle` to return: an answer travels from one
driver's resolved future to the sender's event queue in two or three turns (no IO on the loopback
network), so ten quiet turns mean nothing is on its way."""


async def settle(
    drivers: Iterable[RaftDriver], timeout_s: float = 5.0, network: LoopbackNetwork | None = None
) -> None:
    """Wait until every driver is parked with nothing queued, and ``network`` (if given) has no request
    whose deadline or answer is yet to be noticed, and all stays so for a few loop turns.

    Counted in loop turns, not wall time, so a slow host only makes this take longer; the bound only
    turns a driver that never goes idle into a failure."""
    drivers = list(drivers)
    deadline = time.monotonic() + timeout_s
    quiet = 0
    while quiet < _QUIET_TURNS:
        if all(driver.idle for driver in drivers) and (network is None or network.idle):
            quiet += 1
            await asyncio.sleep(0)
            continue
        quiet = 0
        if time.monotonic() > deadline:
            raise AssertionError(f"drivers still busy after {timeout_s}s")
        await asyncio.sleep(0.001)  # a driver is in a worker thread (fsync, quorum-state write)


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
    """N drivers over in-memory stores on one loopback network, all on one manual clock; nodes can stop
    and restart on their stores."""

    def __init__(self, size: int, clock: ManualClock | None = None, **overrides: int) -> None:
        self.clock = clock if clock is not None else ManualClock()
        self.voters = tuple(range(1, size + 1))
        self.network = LoopbackNetwork(self.clock)
        self.stores = {node_id: NodeStores() for node_id in self.voters}
        self.drivers: dict[int, RaftDriver] = {}
        self.timings: dict[str, Any] = {**FAST_TIMINGS, **overrides}
        self.directory_ids: dict[int, str] = {}
        """Each node's metadata directory id (KIP-853); "" when unset."""
        self.config_overrides: dict[int, dict[str, Any]] = {}
        """Per node RaftConfig fields (e.g. a dynamic joiner's ``voters=()``, ``bootstrap_ids``)."""
        self.driver_options: dict[str, Any] = {}
        """Keyword arguments of every node's RaftDriver (e.g. ``follower_listener_delay_ms``)."""

    async def start(self, node_id: int) -> RaftDriver:
        stores = self.stores[node_id]
        driver = RaftDriver(
            RaftConfig(
                node_id=node_id,
                cluster_id="test-cluster",
                **{
                    "voters": self.voters,
                    "directory_id": self.directory_ids.get(node_id, ""),
                    **self.timings,
                    **self.config_overrides.get(node_id, {}),
                },
            ),
            transport=self.network.transport(node_id),
            log=stores.log,
            elections=stores.elections,
            snapshots=stores.snapshots,
            clock=self.clock,
            rng=random.Random(node_id),
            **self.driver_options,
        )
        self.network.register(node_id, driver)
        await driver.start()
        self.drivers[node_id] = driver
        await self.settle()  # its timers start now, not whenever the test next moves the clock
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

    async def settle(self) -> None:
        """Wait until every running driver and the network are idle at the current manual time."""
        await settle(self.drivers.values(), network=self.network)

    async def advance(self, delta_ms: int) -> None:
        """Move the manual clock, make every driver and the network poll their timers, and wait until
        they are idle."""
        self.clock.advance(delta_ms)
        for driver in self.drivers.values():
            driver.recheck_timers()
        self.network.recheck_timers()
        await self.settle()

    async def run_until(
        self, condition: Callable[[], bool], what: str, max_ms: int, step_ms: int = 10
    ) -> int:
        """Advance the manual clock ``step_ms`` at a time until ``condition`` holds (checked after each
        settle); fail after ``max_ms`` of manual time.  Returns the manual time it took."""
        await self.settle()
        waited_ms = 0
        while not condition():
            if waited_ms >= max_ms:
                raise AssertionError(f"no {what} after {max_ms} ms of manual time")
            await self.advance(step_ms)
            waited_ms += step_ms
        return waited_ms

    async def complete(self, operation: Awaitable[T], what: str, max_ms: int = 1000) -> T:
        """Run ``operation`` (an append, say) while moving the manual clock until it finishes."""
        future = asyncio.ensure_future(operation)
        try:
            await self.run_until(future.done, what, max_ms)
        finally:
            if not future.done():
                future.cancel()
        return await future

    def leader(self) -> RaftDriver | None:
        for driver in self.drivers.values():
            if driver.leader_and_epoch.leader_id == driver.node_id:
                return driver
        return None

    def elected(self, exclude: int | None = None) -> bool:
        """A leader (other than ``exclude``) that every running node knows."""
        leader = self.leader()
        if leader is None or leader.node_id == exclude:
            return False
        epoch = leader.leader_and_epoch
        return all(d.leader_and_epoch == epoch for d in self.drivers.values())

    async def elect(self, exclude: int | None = None, max_ms: int = 5000, step_ms: int = 10) -> RaftDriver:
        """Move the manual clock until a leader (other than ``exclude``) is known to every running node."""
        await self.run_until(
            lambda: self.elected(exclude), "leader known to every running node", max_ms, step_ms
        )
        leader = self.leader()
        assert leader is not None
        return leader


HOLD_TIMEOUT_S = 5.0


def park_commits_like_an_older_leader(monkeypatch: pytest.MonkeyPatch) -> None:
    """Leaders park a long poll with nothing new to send even when its fetcher would learn a higher
    high watermark from the answer, as before session 15 (``LeaderRole._owes_high_watermark``; the
    state a rolling upgrade still meets: an older leader, or an older follower whose Fetch arrives after
    another one committed).  For the tests of what a follower does while it holds an unlearned commit."""
    monkeypatch.setattr(LeaderRole, "_owes_high_watermark", staticmethod(lambda *_args: False))


class HeldFetches:
    """Installed as the loopback network's transport factory: a node in :attr:`held_nodes` holds its
    outbound Fetches until :meth:`release` (a follower's inline fsync cannot be held without blocking the
    loop, so its next Fetch is held at the wire instead)."""

    def __init__(self, cluster: LoopbackCluster) -> None:
        """Installs itself on ``cluster``'s network (before its nodes start)."""
        self.network = cluster.network
        self.held_nodes: set[int] = set()
        self.held: dict[int, list[FetchRequest]] = {}
        self.delivered = 0
        self.gate = asyncio.Event()
        self.gate.set()
        cluster.network.transport = self.transport  # type: ignore[method-assign,assignment]

    def transport(self, node_id: int) -> HeldTransport:
        return HeldTransport(self, node_id)

    def hold(self, nodes: set[int]) -> None:
        self.held_nodes = set(nodes)
        self.gate.clear()

    def release(self) -> None:
        self.gate.set()


class HeldTransport:
    def __init__(self, fetches: HeldFetches, node_id: int) -> None:
        self._fetches = fetches
        self._node_id = node_id

    async def send(self, dest: int, request: RaftRequest, timeout_ms: int) -> RaftResponse:
        fetches = self._fetches
        held = isinstance(request, FetchRequest) and self._node_id in fetches.held_nodes
        if held and not fetches.gate.is_set():
            assert isinstance(request, FetchRequest)
            fetches.held.setdefault(self._node_id, []).append(request)
            await asyncio.wait_for(fetches.gate.wait(), HOLD_TIMEOUT_S)  # bounded
            fetches.delivered += 1
        return await fetches.network.call(self._node_id, dest, request, timeout_ms)

    async def close(self) -> None:
        self._fetches.network.unregister(self._node_id)
