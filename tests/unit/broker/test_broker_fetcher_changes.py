"""MetadataFetcher: PartitionChangeRecords of the common shape, replayed without upb (session 15,
``kraft.metadata.change_decode``), give the image that replaying every record through upb gives."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from broker_fakes import MemoryImageStore, metadata_fetcher, started_publisher

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.change_decode import isr_leader_change
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import decode_value, encode_value, wrap
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb

ME = 4


def _change(partition_id: int, isr: list[int] | None, leader: int | None, **rare: Any) -> mpb.MetadataRecord:
    change = mpb.PartitionChangeRecord(topic_id="T", partition_id=partition_id, **rare)
    if isr is not None:
        change.isr.ids.extend(isr)
    if leader is not None:
        change.leader = leader
    return wrap(change)


RECORDS = [
    wrap(mpb.TopicRecord(name="t", topic_id="T")),
    *(
        wrap(mpb.PartitionRecord(topic_id="T", partition_id=p, replicas=[1, 2, 3], isr=[1, 2, 3], leader=1))
        for p in range(3)
    ),
    _change(0, [2, 3], 2),  # a leave
    _change(1, None, -1),  # no leader
    _change(2, [2, 3], 200),
    _change(1, [3], 3, leader_recovery_state=1),  # a rarer field: through upb
    _change(0, [1, 2, 3], None),  # a rejoin
]
VALUES = [encode_value(record) for record in RECORDS]


class ChangesController:
    """Answers one MetadataFetch with :data:`VALUES` at offsets 0..."""

    active_controller_id = 1

    async def call(
        self, pick: Any, request: cpb.MetadataFetchRequest, timeout_s: float, *, attempt_timeout_s: float
    ) -> Any:
        records = [cpb.CommittedRecord(offset=i, leader_epoch=1, value=v) for i, v in enumerate(VALUES)]
        return cpb.MetadataFetchResponse(
            error_code=ErrorCode.NONE, high_watermark=len(records), records=records
        )


async def test_changes_read_without_upb_give_the_image_of_upb_replay(tmp_path: Path) -> None:
    assert sum(isr_leader_change(v) is not None for v in VALUES) == 4  # (the path under test is taken)
    expected = MetadataDelta(MetadataImage.empty())
    for offset, value in enumerate(VALUES):
        expected.replay(decode_value(value), offset, 1)
    clock = ManualClock()
    manager, publisher = await started_publisher(ME, tmp_path, MemoryImageStore(), clock)
    fetcher = metadata_fetcher(ME, ChangesController(), publisher, clock)
    try:
        assert await fetcher.fetch_once()
        assert publisher.image.topics_by_id == expected.apply().topics_by_id
        assert publisher.offset == len(VALUES) - 1
    finally:
        await publisher.flush()
        manager.close()
