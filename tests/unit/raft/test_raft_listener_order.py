"""Listener delivery order around leader changes (regression for chaos `pause` seed 28).

A node that is *not* the new leader must hear of the leader change before it is handed any batch of the
newer epoch; a node that *is* the new leader hears of it only after every batch before its epoch start."""

from __future__ import annotations

import asyncio

from kraft.observability.logging import get_logger
from kraft.raft.api import CommittedBatch, LeaderAndEpoch, LoadedSnapshot
from kraft.raft.listeners import CommitView, ListenerSet
from kraft.raft.memory import MemoryLogStore, MemorySnapshotStore
from kraft.storage.batch import build_batch


class _Recorder:
    def __init__(self, expected: int) -> None:
        self.events: list[tuple[str, int]] = []
        self.done = asyncio.Event()
        self._expected = expected

    def _record(self, event: tuple[str, int]) -> None:
        self.events.append(event)
        if len(self.events) >= self._expected:
            self.done.set()

    async def handle_commit(self, batch: CommittedBatch) -> None:
        self._record(("commit", batch.epoch))

    async def handle_load_snapshot(self, reader: LoadedSnapshot) -> None:
        self._record(("snapshot", reader.snapshot_id.epoch))

    async def handle_leader_change(self, leader: LeaderAndEpoch) -> None:
        self._record(("leader", leader.epoch))


def _log_with_epochs(*epochs: int) -> MemoryLogStore:
    log = MemoryLogStore()
    for offset, epoch in enumerate(epochs):
        log.append(build_batch(offset, [(None, b"v")], leader_epoch=epoch, timestamp_ms=0))
    log.flush()
    return log


async def _deliver(view: CommitView, log: MemoryLogStore) -> list[tuple[str, int]]:
    recorder = _Recorder(expected=3)
    listeners = ListenerSet(log, MemorySnapshotStore(), lambda: view, get_logger("test"))
    listeners.register(recorder)
    try:
        async with asyncio.timeout(5):
            await recorder.done.wait()
    finally:
        await listeners.close()
    return recorder.events


async def test_a_change_to_another_leader_is_reported_before_its_epochs_batches() -> None:
    view = CommitView(high_watermark=2, leader=LeaderAndEpoch(2, 2), leader_epoch_start_offset=-1)
    events = await _deliver(view, _log_with_epochs(1, 2))
    assert events == [("leader", 2), ("commit", 1), ("commit", 2)]


async def test_becoming_leader_is_reported_only_after_the_earlier_epochs() -> None:
    view = CommitView(high_watermark=2, leader=LeaderAndEpoch(1, 2), leader_epoch_start_offset=1)
    events = await _deliver(view, _log_with_epochs(1, 2))
    assert events[:2] == [("commit", 1), ("commit", 2)] and events[2] == ("leader", 2)
