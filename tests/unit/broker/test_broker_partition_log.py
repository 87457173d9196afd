"""SegmentedPartitionLog: the partition manager on real Kafka-format segment files."""

from __future__ import annotations

from pathlib import Path

import pytest

from kraft.broker.partitions import PartitionManager
from kraft.broker.segmented_partition_log import segmented_log_opener
from kraft.broker.types import LocalChanges, PartitionAssignment, ProducedRecord, TopicPartition
from kraft.storage.errors import OffsetOutOfRangeError

TP = TopicPartition("orders", 0)
ASSIGNMENT = PartitionAssignment("id-1", 1, 7, 7, (1,), (1,))


def test_append_read_and_reopen_keep_offsets_timestamps_and_epochs(tmp_path: Path) -> None:
    opener = segmented_log_opener(segment_bytes=4096)
    log = opener(tmp_path / "orders-0")
    assert log.append_records([ProducedRecord(b"k", b"v0", 100), ProducedRecord(None, b"v1", 100)], 3) == 0
    assert log.append_records([ProducedRecord(b"a", None, 200), ProducedRecord(b"b", b"", 250)], 4) == 2
    log.close()

    reopened = opener(tmp_path / "orders-0")
    records = reopened.read_records(1, 1 << 20)
    assert [(r.offset, r.key, r.value, r.timestamp_ms, r.leader_epoch) for r in records] == [
        (1, None, b"v1", 100, 3),
        (2, b"a", None, 200, 4),
        (3, b"b", b"", 250, 4),
    ]
    assert (reopened.log_start_offset, reopened.log_end_offset) == (0, 4)
    assert reopened.read_records(4, 100) == []
    with pytest.raises(OffsetOutOfRangeError):
        reopened.read_records(5, 100)
    reopened.close()


def test_segments_roll_and_reads_cross_them(tmp_path: Path) -> None:
    log = segmented_log_opener(segment_bytes=1024)(tmp_path / "t-0")
    for i in range(40):
        log.append_records([ProducedRecord(None, bytes(64) + str(i).encode(), 1)], 0)
    offsets: list[int] = []
    position = 0
    while position < log.log_end_offset:
        chunk = log.read_records(position, 256)
        assert chunk, "a read below the log end always makes progress"
        offsets.extend(r.offset for r in chunk)
        position = chunk[-1].offset + 1
    assert offsets == list(range(40))
    assert len(list((tmp_path / "t-0").glob("*.log"))) > 1
    log.close()


def test_partition_manager_restart_keeps_data_on_real_logs(tmp_path: Path) -> None:
    opener = segmented_log_opener(segment_bytes=1 << 20)
    manager = PartitionManager(1, [tmp_path], opener)
    manager.load()
    manager.apply(LocalChanges(leaders={TP: ASSIGNMENT}))
    partition = manager.get(TP)
    assert partition is not None
    partition.log.append_records([ProducedRecord(None, b"x", 5)], ASSIGNMENT.leader_epoch)
    manager.close()

    again = PartitionManager(1, [tmp_path], opener)
    again.load()
    assert again.reconcile({TP: ASSIGNMENT}).is_empty()
    reloaded = again.get(TP)
    assert reloaded is not None and reloaded.log.log_end_offset == 1
    again.close()
