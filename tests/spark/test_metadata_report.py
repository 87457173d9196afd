"""The metadata report finds the controller epochs, broker lifecycle and partition leader transitions
of a metadata log written through kraft.storage with the metadata module's records."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from google.protobuf.message import Message
from pyspark.sql import SparkSession

from kraft.metadata import records as metadata_records
from kraft.pipeline.metadata_report import REPORT_JSON, SUMMARY_FILE, metadata_report
from kraft.storage.batch import LeaderChangeMessage
from kraft.storage.log import LogConfig, SegmentedLog
from kraft.v1 import metadata_pb2 as pb

pytestmark = pytest.mark.spark

T0 = 1_700_000_000_000


def _write_metadata_log(directory: Path) -> None:
    """A scripted history: two controller epochs, two brokers, one partition offline then recovered."""
    log = SegmentedLog.open(directory / "__cluster_metadata-0", LogConfig(segment_bytes=4096))

    def records(epoch: int, at_s: float, *payloads: Message) -> None:
        values = [(None, metadata_records.encode_value(metadata_records.wrap(p))) for p in payloads]
        log.append_records(values, leader_epoch=epoch, timestamp_ms=T0 + int(at_s * 1000))

    def leader(epoch: int, at_s: float, leader_id: int) -> None:
        log.append_control(
            [LeaderChangeMessage(leader_id, (1, 2, 3), (leader_id,))],
            leader_epoch=epoch,
            timestamp_ms=T0 + int(at_s * 1000),
        )

    try:
        leader(1, 0, 1)
        records(1, 1, pb.FeatureLevelRecord(name="metadata.version", feature_level=1))
        records(
            1,
            2,
            pb.RegisterBrokerRecord(broker_id=101, broker_epoch=2, fenced=True),
            pb.RegisterBrokerRecord(broker_id=102, broker_epoch=2, fenced=True),
        )
        records(1, 4, pb.UnfenceBrokerRecord(id=101, epoch=2))
        records(1, 5, pb.BrokerRegistrationChangeRecord(broker_id=102, broker_epoch=2, fenced=-1))
        records(
            1,
            6,
            pb.TopicRecord(name="orders", topic_id="t-orders"),
            pb.PartitionRecord(
                partition_id=0,
                topic_id="t-orders",
                replicas=[101, 102],
                isr=[101, 102],
                leader=101,
                leader_epoch=0,
            ),
            pb.PartitionRecord(
                partition_id=1,
                topic_id="t-orders",
                replicas=[102, 101],
                isr=[102],
                leader=102,
                leader_epoch=0,
            ),
        )
        records(1, 8, pb.NoOpRecord())
        leader(2, 10, 2)
        records(
            2,
            12,
            pb.PartitionChangeRecord(partition_id=1, topic_id="t-orders", leader=-1),
            pb.BrokerRegistrationChangeRecord(broker_id=102, broker_epoch=2, fenced=1),
        )
        records(
            2,
            13,
            pb.PartitionChangeRecord(partition_id=0, topic_id="t-orders", isr=pb.BrokerIdList(ids=[101])),
        )
        records(
            2,
            20,
            pb.BrokerRegistrationChangeRecord(broker_id=102, broker_epoch=2, fenced=-1),
            pb.PartitionChangeRecord(partition_id=1, topic_id="t-orders", leader=102),
        )
        records(
            2,
            25,
            pb.BrokerRegistrationChangeRecord(broker_id=101, broker_epoch=2, in_controlled_shutdown=1),
            pb.PartitionChangeRecord(partition_id=0, topic_id="t-orders", leader=102),
        )
        records(2, 26, pb.FenceBrokerRecord(id=101, epoch=2))
        records(2, 30, pb.UnregisterBrokerRecord(broker_id=101, broker_epoch=2))
        log.flush()
    finally:
        log.close()


def _table(out: Path, name: str) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = pq.read_table(out / "tables" / name).to_pylist()
    return rows


def test_metadata_report_contains_the_expected_transitions(spark: SparkSession, tmp_path: Path) -> None:
    _write_metadata_log(tmp_path / "controller-1")
    out = tmp_path / "report"

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        report = metadata_report(spark, str(tmp_path), str(out))
    # Drawing the plots warns about nothing (a matplotlib warning used to reach the CLI's stderr).
    assert [str(w.message) for w in caught if "matplotlib" in w.filename or "kraft" in w.filename] == []

    assert report.records == 20 and report.log_start_offset == 0 and report.log_end_offset == 20
    epochs = sorted(_table(out, "controller_epochs"), key=lambda r: r["epoch"])
    assert [(e["epoch"], e["leader_id"], e["tenure_ms"]) for e in epochs] == [(1, 1, 10_000), (2, 2, 20_000)]
    assert [e["is_current"] for e in epochs] == [False, True]

    events = sorted(_table(out, "broker_events"), key=lambda r: (r["broker_id"], r["offset"]))
    by_broker: dict[object, list[tuple[object, object]]] = {}
    for e in events:
        by_broker.setdefault(e["broker_id"], []).append((e["event"], e["state"]))
    assert by_broker[101] == [
        ("registered", "FENCED"),
        ("unfenced", "ACTIVE"),
        ("controlled_shutdown", "CONTROLLED_SHUTDOWN"),
        # fenced after being active: what `kraft broker list` shows as OFFLINE (no live session)
        ("fenced", "OFFLINE"),
        ("unregistered", "UNREGISTERED"),
    ]
    assert by_broker[102] == [
        ("registered", "FENCED"),
        ("unfenced", "ACTIVE"),
        ("fenced", "OFFLINE"),
        ("unfenced", "ACTIVE"),
    ]
    states = {(s["broker_id"], s["start_ms"]): s for s in _table(out, "broker_states")}
    fenced_102 = states[(102, T0 + 12_000)]
    assert (fenced_102["state"], fenced_102["duration_ms"], fenced_102["is_open"]) == (
        "OFFLINE",
        8_000,
        False,
    )
    assert states[(102, T0 + 20_000)]["is_open"] is True

    offline = _table(out, "offline_intervals")
    assert [(o["topic"], o["partition"], o["duration_ms"], o["ended_by"]) for o in offline] == [
        ("orders", 1, 8_000, "recovered")
    ]
    changes = sorted(
        (
            (c["partition"], c["offset"], c["leader"], c["change"])
            for c in _table(out, "partition_leader_events")
        ),
        key=lambda c: (c[1], c[0]),
    )
    assert [c[2:] for c in changes] == [
        (101, "created"),
        (102, "created"),
        (-1, "offline"),
        (102, "recovered"),
        (102, "elected"),
    ]

    counts = _table(out, "record_type_counts")
    assert sum(int(c["records"]) for c in counts) == 20
    assert report.record_type_totals["LeaderChange"] == 2
    assert report.record_type_totals["PartitionChangeRecord"] == 4
    for name in ("record_types", "broker_timeline", "controller_epochs", "partition_leaders"):
        assert (out / "plots" / f"{name}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    summary = (out / SUMMARY_FILE).read_text()
    assert "## Broker lifecycle" in summary and "| 101 |" in summary
    assert "- records: 20 (offsets 0..19)," in summary  # both ends inclusive: 20 records
    assert json.loads((out / REPORT_JSON).read_text())["epochs"] == 2
