"""A one-voter Raft driver on in-memory stores and the system clock, elected: the bridges' tests
(test_fetch_bridge, test_append_bridge) drive real appends and fetches through it."""

from __future__ import annotations

import asyncio
import random

from kraft.clock import SystemClock
from kraft.raft.core_types import RaftConfig
from kraft.raft.driver import RaftDriver
from kraft.raft.memory import LoopbackNetwork, MemoryElectionStore, MemoryLogStore, MemorySnapshotStore

ELECTION_TIMEOUT_S = 5.0


def single_voter(log: MemoryLogStore | None = None) -> RaftDriver:
    return RaftDriver(
        RaftConfig(node_id=1, voters=(1,), cluster_id="c1", append_linger_ms=1),
        transport=LoopbackNetwork().transport(1),
        log=log or MemoryLogStore(),
        elections=MemoryElectionStore(),
        snapshots=MemorySnapshotStore(),
        clock=SystemClock(),
        rng=random.Random(7),
    )


async def leading(driver: RaftDriver) -> None:
    """Start ``driver`` and wait (bounded) until it leads."""
    await driver.start()
    for _ in range(int(ELECTION_TIMEOUT_S / 0.005)):  # bounded poll: the election runs on the system clock
        if driver.leader_and_epoch.leader_id == 1:
            return
        await asyncio.sleep(0.005)
    raise AssertionError("the single voter did not elect itself")
