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
    """Start ``driver`` and wait (bounded) until it leads, its leader-change record is committed and it
    is parked.  Not just "leads": the new leader's first batch (the leader change) is written and fsynced
    after the core already names it leader, so a test that went on at that point could meet that flush —
    catch it at a gated fsync instead of its own write's, or have its first append held by it and pulled
    (test_pull_during_flush failed so under load: the fsync thread ran late)."""
    await driver.start()
    for _ in range(int(ELECTION_TIMEOUT_S / 0.005)):  # bounded poll: the election runs on the system clock
        if (
            driver.leader_and_epoch.leader_id == 1
            and driver.high_watermark == driver.next_append_offset
            and driver.idle
        ):
            return
        await asyncio.sleep(0.005)
    raise AssertionError(
        "the single voter did not elect itself and commit its leader change: "
        f"{driver.leader_and_epoch} high watermark {driver.high_watermark} "
        f"next offset {driver.next_append_offset} idle {driver.idle}"
    )
