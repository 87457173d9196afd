"""MetadataFetcher on a manual clock: the snapshot download + replay time it reports (bench, logs) is
measured on the broker's injected clock, so a test can assert it exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from broker_fakes import MemoryImageStore, metadata_fetcher, started_publisher
from loop_fakes import CostClock, LoopTurns

from kraft.broker import heap
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.records import encode_value, wrap
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb

ME = 4
CALL_MS = 120
SNAPSHOT = cpb.SnapshotRef(end_offset=10, epoch=1)
VALUES = [encode_value(wrap(mpb.TopicRecord(name=f"t{i}", topic_id=f"T{i}"))) for i in range(3)]


class SnapshotController:
    """Answers MetadataFetch as a controller whose log starts after :data:`SNAPSHOT`: the first fetch
    points at the snapshot, then one record per chunk; each call takes :data:`CALL_MS` of manual time."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.active_controller_id = 1
        self.calls = 0

    async def call(
        self, pick: Any, request: cpb.MetadataFetchRequest, timeout_s: float, *, attempt_timeout_s: float
    ) -> Any:
        self.calls += 1
        self.clock.advance(CALL_MS)
        if not request.HasField("snapshot_id"):
            return cpb.MetadataFetchResponse(
                error_code=ErrorCode.NONE, high_watermark=10, snapshot_id=SNAPSHOT
            )
        position = request.snapshot_position
        return cpb.MetadataFetchResponse(
            error_code=ErrorCode.NONE,
            high_watermark=10,
            snapshot_id=SNAPSHOT,
            snapshot_records=VALUES[position : position + 1],
            next_snapshot_position=position + 1,
            snapshot_done=position + 1 >= len(VALUES),
        )


async def test_the_snapshot_replay_time_is_measured_on_the_injected_clock(tmp_path: Path) -> None:
    clock = ManualClock()
    manager, publisher = await started_publisher(ME, tmp_path, MemoryImageStore(), clock)
    controller = SnapshotController(clock)
    applied: list[int] = []
    fetcher = metadata_fetcher(ME, controller, publisher, clock, applied.append)
    try:
        assert await fetcher.fetch_once()
        assert fetcher.snapshots_loaded == 1 and applied == [publisher.offset]
        assert all(publisher.image.topic(f"t{i}") is not None for i in range(3))
        # One call pointed at the snapshot, then three chunk calls; the download started after the first.
        assert controller.calls == 4
        assert fetcher.last_snapshot_replay_s == 3 * CALL_MS / 1000
    finally:
        await publisher.flush()
        manager.close()


class RecordsController:
    """Answers one MetadataFetch with ``count`` TopicRecords at offsets 0..count-1."""

    def __init__(self, count: int) -> None:
        self.active_controller_id = 1
        self.records = [
            cpb.CommittedRecord(
                offset=i,
                leader_epoch=1,
                value=encode_value(wrap(mpb.TopicRecord(name=f"r{i}", topic_id=f"R{i}"))),
            )
            for i in range(count)
        ]

    async def call(
        self, pick: Any, request: cpb.MetadataFetchRequest, timeout_s: float, *, attempt_timeout_s: float
    ) -> Any:
        return cpb.MetadataFetchResponse(
            error_code=ErrorCode.NONE, high_watermark=len(self.records), records=self.records
        )


async def _loop_turns_while_replaying(tmp_path: Path, clock: ManualClock, count: int) -> int:
    manager, publisher = await started_publisher(ME, tmp_path, MemoryImageStore(), clock)
    fetcher = metadata_fetcher(ME, RecordsController(count), publisher, clock)
    loop = LoopTurns()
    try:
        assert await loop.during(fetcher.fetch_once())
        assert all(publisher.image.topic(f"r{i}") is not None for i in range(count))
        return loop.turns
    finally:
        await publisher.flush()
        manager.close()


async def test_a_big_metadata_response_is_replayed_in_slices_of_the_time_budget(tmp_path: Path) -> None:
    """1,000 records in one response: on a clock where replay costs time (1 ms per read, a read per 32
    records) the replay yields the loop every ~5 ms of it (the broker's heartbeats and replica fetches run
    between); on a clock where it costs nothing it is one turn, as before."""
    free = await _loop_turns_while_replaying(tmp_path / "free", ManualClock(), 1000)
    costly = await _loop_turns_while_replaying(tmp_path / "costly", CostClock(1), 1000)
    assert costly >= free + 5, (free, costly)


async def test_a_snapshot_download_freezes_the_heap_after_each_chunk_and_after_the_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What each chunk built, and the loaded image, are frozen (``heap.settle``: the young generations
    collected, no full collection), so later full collections do not walk them; a start-up open does
    the same."""
    settled: list[int] = []
    monkeypatch.setattr(heap, "settle", lambda: settled.append(len(settled)))
    clock = ManualClock()
    manager, publisher = await started_publisher(ME, tmp_path, MemoryImageStore(), clock)
    assert len(settled) == 1  # (started: its partitions opened)
    fetcher = metadata_fetcher(ME, SnapshotController(clock), publisher, clock, lambda offset: None)
    try:
        assert await fetcher.fetch_once()
        assert len(settled) == 1 + len(VALUES) + 1  # one per chunk, one after the load
    finally:
        await publisher.flush()
        manager.close()
