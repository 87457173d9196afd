"""Kafka's longest topic names (249 characters) on a real file system: the partition directory, its
staging (``-create``) and deletion (``-delete``) names all fit 255 bytes, and the broker creates, writes,
deletes and re-creates such partitions; a name that cannot fit is skipped, never a crash."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kraft.broker.partitions import (
    PartitionManager,
    deletion_dir_name,
    staging_dir_name,
)
from kraft.broker.segmented_partition_log import segmented_log_opener
from kraft.broker.types import LocalChanges, PartitionAssignment, ProducedRecord, TopicPartition
from kraft.metadata.topic_rules import MAX_TOPIC_NAME_LENGTH, validate_topic_name
from kraft.pipeline.layout import parse_partition_dir_name
from kraft.storage.fileio import MAX_FILE_NAME_BYTES

LONGEST = "t" * MAX_TOPIC_NAME_LENGTH
LAST_FITTING_PARTITION = 99_999  # 249 + "-" + 5 digits = 255


def _assignment(topic_id: str) -> PartitionAssignment:
    return PartitionAssignment(topic_id, leader=1, leader_epoch=0, partition_epoch=0, replicas=(1,), isr=(1,))


def _manager(tmp_path: Path) -> PartitionManager:
    manager = PartitionManager(1, [tmp_path / "logs"], segmented_log_opener(1024 * 1024))
    manager.load()
    return manager


@pytest.mark.parametrize("partition", [0, 7, LAST_FITTING_PARTITION])
def test_every_name_kind_of_a_249_character_topic_fits_255_bytes(partition: int) -> None:
    validate_topic_name(LONGEST)
    tp = TopicPartition(LONGEST, partition)
    names = [tp.dir_name, staging_dir_name(tp), deletion_dir_name(tp)]
    assert all(len(name.encode()) <= MAX_FILE_NAME_BYTES for name in names), [len(n) for n in names]
    assert staging_dir_name(tp).endswith("-create") and deletion_dir_name(tp).endswith("-delete")
    assert staging_dir_name(tp) != staging_dir_name(tp)  # unique by the uuid, not by the cut topic
    assert parse_partition_dir_name(tp.dir_name) == (LONGEST, partition)


def test_short_names_keep_kafkas_layout() -> None:
    name = deletion_dir_name(TopicPartition("orders", 3))
    topic, dot, rest = name.partition(".")
    assert topic == "orders-3" and dot and len(rest) == 32 + len("-delete")


def test_a_249_character_topic_is_created_written_deleted_and_recreated(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    tps = [TopicPartition(LONGEST, p) for p in (0, LAST_FITTING_PARTITION)]
    manager.apply(LocalChanges(leaders={tp: _assignment("id-1") for tp in tps}))
    for tp in tps:
        partition = manager.get(tp)
        assert partition is not None and partition.path.name == tp.dir_name
        partition.log.append_records([ProducedRecord(None, b"v", 1)], 0)
        assert partition.log.read_records(0, 1024)[0].value == b"v"

    manager.apply(LocalChanges(deletes={tps[0]: "id-1"}))
    assert manager.get(tps[0]) is None and not (tmp_path / "logs" / tps[0].dir_name).exists()
    # Re-created under the same name with a new topic id: the old directory goes through -delete first.
    manager.apply(LocalChanges(leaders={tps[1]: _assignment("id-2")}))
    recreated = manager.get(tps[1])
    assert recreated is not None and recreated.log.log_end_offset == 0
    manager.close()
    assert sorted(os.listdir(tmp_path / "logs")) == [tps[1].dir_name]


def test_crash_leftovers_with_cut_names_are_removed_at_load(tmp_path: Path) -> None:
    logs = tmp_path / "logs"
    tp = TopicPartition(LONGEST, 12)
    for leftover in (staging_dir_name(tp), deletion_dir_name(tp)):
        (logs / leftover).mkdir(parents=True)
        (logs / leftover / "00000000000000000000.log").write_bytes(b"")
    manager = _manager(tmp_path)
    assert os.listdir(logs) == [] and len(manager) == 0


def test_a_partition_whose_directory_name_cannot_fit_is_skipped_not_fatal(tmp_path: Path) -> None:
    manager = _manager(tmp_path)
    too_long = TopicPartition(LONGEST, LAST_FITTING_PARTITION + 1)
    fits = TopicPartition(LONGEST, 1)
    applied = manager.apply(LocalChanges(leaders={too_long: _assignment("id"), fits: _assignment("id")}))
    assert applied.became_leader == (fits,)
    assert manager.get(too_long) is None and manager.get(fits) is not None
    manager.close()
