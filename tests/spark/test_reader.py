"""The kraft-log reader returns exactly what kraft.storage wrote, one row per record."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest
from pyspark.sql import Row, SparkSession
from spark_log_builders import BatchSpec, Written, write_partition

from kraft.errors import KraftError
from kraft.metadata import records as metadata_records
from kraft.pipeline.reader import read_logs
from kraft.storage.snapshot import SnapshotDirectory, SnapshotFileId
from kraft.v1 import metadata_pb2

pytestmark = pytest.mark.spark


def _rows_as_written(df_rows: Sequence[Row]) -> list[Written]:
    out = []
    for row in df_rows:
        r = row.asDict()
        out.append(
            Written(
                r["topic"],
                r["partition"],
                r["offset"],
                r["leader_epoch"],
                r["timestamp_ms"],
                r["key"],
                r["value"],
                tuple((h["key"], h["value"]) for h in r["headers"]),
                r["is_control"],
            )
        )
    return out


def test_reader_round_trips_a_tree_of_partitions_written_by_storage(
    spark: SparkSession, tmp_path: Path
) -> None:
    written: list[Written] = []
    written += write_partition(
        tmp_path / "broker-1",
        "orders",
        0,
        [
            BatchSpec(((b"k1", b"v1", ()), (None, b"no-key", (("trace", b"t1"), ("empty", None)))), 1_000, 1),
            BatchSpec(((b"k1", None, ()),), 2_000, 1, roll_before=True),
            BatchSpec((), 2_500, 2, control_leader=3),
            BatchSpec(((b"k2", b"v2", ()),), 3_000, 2, roll_before=True),
        ],
    )
    written += write_partition(tmp_path / "broker-1", "orders", 1, [BatchSpec(((b"a", b"b", ()),), 5, 0)])
    written += write_partition(
        tmp_path / "broker-2" / "nested", "users", 7, [BatchSpec(((b"x", b"y", ()),), 9, 4)]
    )

    rows = read_logs(spark, str(tmp_path)).orderBy("topic", "partition", "offset").collect()

    got = _rows_as_written(rows)
    control = [w for w in got if w.is_control]
    assert [w for w in got if not w.is_control] == sorted(
        (w for w in written if not w.is_control), key=lambda w: (w.topic, w.partition, w.offset)
    )
    assert [(c.offset, c.leader_epoch) for c in control] == [(3, 2)]
    leader_change = next(r for r in rows if r["is_control"])
    assert leader_change["record_type"] == "LeaderChange"
    assert '"leader_id": 3' in leader_change["record_json"]
    assert {r["source"] for r in rows} == {"log"}
    # one split per segment file: orders-0 has three segments, the others one each
    assert read_logs(spark, str(tmp_path)).rdd.getNumPartitions() == 5


def test_reader_projects_requested_columns_only(spark: SparkSession, tmp_path: Path) -> None:
    write_partition(tmp_path, "t", 0, [BatchSpec(((b"k", b"v", ()), (b"k2", None, ())), 7, 0)])
    df = read_logs(spark, str(tmp_path), columns="offset,key")
    assert df.columns == ["offset", "key"]
    assert [tuple(r) for r in df.orderBy("offset").collect()] == [(0, b"k"), (1, b"k2")]


def test_metadata_log_rows_carry_decoded_records_and_snapshots(spark: SparkSession, tmp_path: Path) -> None:
    topic = metadata_records.wrap(metadata_pb2.TopicRecord(name="orders", topic_id="tid-1"))
    fence = metadata_records.wrap(metadata_pb2.FenceBrokerRecord(id=101, epoch=5))
    values = [metadata_records.encode_value(topic), metadata_records.encode_value(fence)]
    write_partition(
        tmp_path,
        "__cluster_metadata",
        0,
        [
            BatchSpec(tuple((None, v, ()) for v in values), 10, 1),
            BatchSpec(((None, b"\x07junk", ()),), 11, 1),
        ],
    )
    store = SnapshotDirectory(tmp_path / "__cluster_metadata-0")
    with store.create(SnapshotFileId(3, 1), last_contained_log_timestamp=11, timestamp_ms=12) as snapshot:
        snapshot.append_records([(None, values[0])])
        snapshot.freeze()

    rows = read_logs(spark, str(tmp_path)).orderBy("source", "offset").collect()
    log_rows = [r for r in rows if r["source"] == "log"]
    assert [r["record_type"] for r in log_rows] == ["TopicRecord", "FenceBrokerRecord", "Undecodable"]
    assert '"name": "orders"' in log_rows[0]["record_json"]
    snapshot_types = [r["record_type"] for r in rows if r["source"] == "snapshot"]
    assert snapshot_types == ["SnapshotHeader", "TopicRecord", "SnapshotFooter"]
    assert read_logs(spark, str(tmp_path), include_snapshots=False).count() == 3


def test_torn_tail_of_newest_segment_is_ignored_but_older_corruption_fails(
    spark: SparkSession, tmp_path: Path
) -> None:
    write_partition(
        tmp_path,
        "t",
        0,
        [BatchSpec(((b"a", b"1", ()),), 1, 0), BatchSpec(((b"b", b"2", ()),), 2, 0, roll_before=True)],
    )
    segments = sorted((tmp_path / "t-0").glob("*.log"))
    with segments[-1].open("ab") as tail:
        tail.write(b"\x00\x00\x00\x00\x00\x00\x00\x02torn")
    assert read_logs(spark, str(tmp_path), columns="offset").count() == 2

    with segments[0].open("r+b") as first:
        first.seek(70)
        first.write(b"\xff\xff")
    with pytest.raises(Exception, match=r"CRC mismatch|CORRUPT_MESSAGE"):
        read_logs(spark, str(tmp_path), columns="offset").count()


def test_missing_directory_and_unknown_column_are_clear_errors(spark: SparkSession, tmp_path: Path) -> None:
    with pytest.raises(KraftError, match="does not exist"):
        read_logs(spark, str(tmp_path / "nope"))
    with pytest.raises(KraftError, match="no kraft log files"):
        read_logs(spark, str(tmp_path))
    write_partition(tmp_path, "t", 0, [BatchSpec(((b"a", b"1", ()),), 1, 0)])
    with pytest.raises(KraftError, match="unknown reader column"):
        read_logs(spark, str(tmp_path), columns="offset,bogus")
