"""MetadataFetcher on a manual clock: the snapshot download + replay time it reports (bench, logs) is
measured on the broker's injected clock, so a test can assert it exactly."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from broker_fakes import MemoryImageStore, MemoryLogOpener

from kraft.broker.fetcher import FetcherTimings, MetadataFetcher
from kraft.broker.partitions import PartitionManager
from kraft.broker.publisher import MetadataPublisher
from kraft.client.controller import ControllerClient
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

    async def call(self, pick: Any, request: cpb.MetadataFetchRequest, timeout_s: float) -> Any:
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
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener())
    publisher = MetadataPublisher(
        ME, manager, MemoryImageStore(), "PLAINTEXT", lambda view: None, clock=clock
    )
    await publisher.start()
    await publisher.open_partitions()  # caught up (nothing to fetch here): publish normally
    controller = SnapshotController(clock)
    applied: list[int] = []
    fetcher = MetadataFetcher(
        ME,
        "c",
        cast(ControllerClient, controller),
        publisher,
        FetcherTimings(max_wait_ms=0, request_timeout_s=1.0),
        applied.append,
        clock=clock,
    )
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
