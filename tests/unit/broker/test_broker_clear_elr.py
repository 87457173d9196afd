"""A broker replaying a ClearElrRecord from the controller's log (MetadataFetcher → MetadataPublisher →
image store) ends where the per-partition PartitionChangeRecords kraft wrote before left it: the same
image, stored, and the same leader epochs on the partitions it hosts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from broker_fakes import MemoryImageStore, metadata_fetcher, started_publisher
from loop_fakes import CostClock, LoopTurns

from kraft.broker.types import TopicPartition
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.elr_holders import ElrHolders
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import ConfigResourceType, encode_value, wrap
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb

ME = 4
PARTITIONS = 6


def _log_start() -> list[mpb.MetadataRecord]:
    """A topic whose partitions this broker leads or follows; the odd ones hold an ELR (partition 0
    only a last known ELR)."""
    written = [wrap(mpb.TopicRecord(name="orders", topic_id="T"))]
    for partition_id in range(PARTITIONS):
        leader = ME if partition_id % 3 else 5
        written.append(
            wrap(
                mpb.PartitionRecord(
                    topic_id="T",
                    partition_id=partition_id,
                    replicas=[ME, 5, 6],
                    isr=[leader],
                    leader=leader,
                    leader_epoch=3,
                    partition_epoch=3,
                    eligible_leader_replicas=[6] if partition_id % 2 else [],
                    last_known_elr=[6] if partition_id == 0 else [],
                )
            )
        )
    config = mpb.ConfigRecord(
        resource_type=ConfigResourceType.TOPIC, resource_name="orders", name="min.insync.replicas"
    )
    config.value = "1"
    written.append(wrap(config))
    return written


def _per_partition_clear() -> list[mpb.MetadataRecord]:
    """What kraft's controller wrote before ClearElrRecord."""
    written = []
    for partition_id in range(PARTITIONS):
        change = mpb.PartitionChangeRecord(topic_id="T", partition_id=partition_id)
        if partition_id % 2:
            change.eligible_leader_replicas.SetInParent()
        if partition_id == 0:
            change.last_known_elr.SetInParent()
        if partition_id % 2 or partition_id == 0:
            written.append(wrap(change))
    return written


class LogController:
    """Answers MetadataFetch from a fixed committed log, from the asked offset on."""

    def __init__(self, log: list[mpb.MetadataRecord]) -> None:
        self.active_controller_id = 1
        self.log = [
            cpb.CommittedRecord(offset=i, leader_epoch=1, value=encode_value(r)) for i, r in enumerate(log)
        ]

    async def call(
        self, pick: Any, request: cpb.MetadataFetchRequest, timeout_s: float, *, attempt_timeout_s: float
    ) -> Any:
        return cpb.MetadataFetchResponse(
            error_code=ErrorCode.NONE,
            high_watermark=len(self.log),
            records=self.log[request.fetch_offset :],
        )


async def _replayed(tmp_path: Path, clear: list[mpb.MetadataRecord]) -> tuple[MetadataImage, dict[int, int]]:
    """The image the broker publishes and stores after the log, and its partitions' leader epochs."""
    clock = ManualClock()
    store = MemoryImageStore()
    manager, publisher = await started_publisher(ME, tmp_path, store, clock)
    controller = LogController(_log_start())
    fetcher = metadata_fetcher(ME, controller, publisher, clock)
    try:
        assert await fetcher.fetch_once()  # the topic, as a committed batch
        assert publisher.image.elr_holders == ElrHolders.from_partitions(
            [("T", 0), ("T", 1), ("T", 3), ("T", 5)]
        )
        controller.log += [
            cpb.CommittedRecord(offset=offset, leader_epoch=1, value=encode_value(r))
            for offset, r in enumerate(clear, len(controller.log))
        ]
        assert await fetcher.fetch_once()  # the clear, as the next batch
        await publisher.flush()
        assert store.image is publisher.image  # stored as published
        epochs = {}
        for partition_id in range(PARTITIONS):
            local = manager.get(TopicPartition("orders", partition_id))
            assert local is not None
            epochs[partition_id] = local.leader_epoch
        return publisher.image, epochs
    finally:
        await publisher.flush()
        manager.close()


async def test_a_broker_replays_one_clear_elr_record_as_the_per_partition_changes(tmp_path: Path) -> None:
    image, epochs = await _replayed(tmp_path / "record", [wrap(mpb.ClearElrRecord(topic_name="orders"))])
    before, old_epochs = await _replayed(tmp_path / "changes", _per_partition_clear())
    assert image.topics_by_id == before.topics_by_id
    assert image.offset == len(_log_start()) and before.offset == len(_log_start()) + 3
    assert all(not (p.elr or p.last_known_elr) for _, _, p in image.iter_partitions())
    assert image.elr_holders == ElrHolders.from_partitions([])
    # the partitions it cleared moved to a new leader epoch on this broker, the others stayed
    assert epochs == old_epochs == {0: 4, 1: 4, 2: 3, 3: 4, 4: 3, 5: 4}


async def _turns_replaying_a_big_clear(
    tmp_path: Path, clock: ManualClock, partitions: int, monkeypatch: pytest.MonkeyPatch
) -> int:
    """Loop turns other tasks get while the broker replays one ClearElrRecord of ``partitions`` (up to
    the delta's ``apply()``: its local changes are paced on their own)."""
    manager, publisher = await started_publisher(ME, tmp_path, MemoryImageStore(), clock)
    log = [wrap(mpb.TopicRecord(name="big", topic_id="B"))]
    log += [
        wrap(
            mpb.PartitionRecord(
                topic_id="B",
                partition_id=p,
                replicas=[5, 6, 7],
                isr=[5],
                leader=5,
                eligible_leader_replicas=[6],
            )
        )
        for p in range(partitions)
    ]
    controller = LogController(log)
    fetcher = metadata_fetcher(ME, controller, publisher, clock)
    loop = LoopTurns()
    at_apply: list[int] = []
    apply = MetadataDelta.apply

    def noting_apply(delta: MetadataDelta) -> MetadataImage:
        at_apply.append(loop.turns)
        return apply(delta)

    try:
        assert await fetcher.fetch_once()
        monkeypatch.setattr(MetadataDelta, "apply", noting_apply)
        controller.log.append(
            cpb.CommittedRecord(
                offset=len(controller.log),
                leader_epoch=1,
                value=encode_value(wrap(mpb.ClearElrRecord(topic_name="big"))),
            )
        )
        assert await loop.during(fetcher.fetch_once())
        monkeypatch.undo()
        assert not any(p.elr for _, _, p in publisher.image.iter_partitions())
        return at_apply[0]
    finally:
        await publisher.flush()
        manager.close()


async def test_a_broker_replays_a_big_clear_in_slices_of_the_time_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One ClearElrRecord of 5,000 partitions: on a clock where replay costs time the broker yields the
    loop in the middle of it (its heartbeats and replica fetches run between); where it costs nothing,
    it does not."""
    free = await _turns_replaying_a_big_clear(tmp_path / "free", ManualClock(), 5000, monkeypatch)
    costly = await _turns_replaying_a_big_clear(tmp_path / "costly", CostClock(), 5000, monkeypatch)
    assert costly >= free + 3, (free, costly)
