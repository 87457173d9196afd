"""The metadata report over the log of a real, short cluster run (3 controllers, 2 brokers)."""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest
from pyspark.sql import SparkSession

from kraft.cluster.manager import LocalCluster
from kraft.pipeline.metadata_report import metadata_report

pytestmark = [pytest.mark.spark, pytest.mark.integration, pytest.mark.timeout(600)]

READY_TIMEOUT_S = 120  # generous: 2 shared cores, 5 Python processes starting at once


def _log_tails(root: Path, lines: int = 10) -> str:
    tails = []
    for log in sorted((root / "logs").glob("*.log")):
        tails.append(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-lines:]))
    return "\n".join(tails)


def test_report_of_a_real_run_shows_elections_and_broker_lifecycle(
    spark: SparkSession, tmp_path: Path
) -> None:
    root = tmp_path / "cluster"
    cluster = LocalCluster.create(root, controllers=3, brokers=2, profile="fast")
    try:
        cluster.start()
        first = cluster.wait_healthy(READY_TIMEOUT_S)
        first_leader = first.leader_id
        # A graceful broker stop is a controlled shutdown; a graceful leader stop forces an election.
        assert cluster.stop("broker-102", timeout_s=30) == "stopped", _log_tails(root)
        cluster.stop(first_leader, timeout_s=30)
        cluster.wait_until(
            lambda s: s.leader_id not in (-1, first_leader),
            READY_TIMEOUT_S,
            what="a new controller leader",
        )
    finally:
        cluster.down(timeout_s=10)

    out = tmp_path / "report"
    report = metadata_report(spark, str(root), str(out))

    epochs = pq.read_table(out / "tables" / "controller_epochs").to_pylist()
    leaders = {e["epoch"]: e["leader_id"] for e in epochs}
    first_epoch = max((epoch for epoch, leader in leaders.items() if leader == first_leader), default=-1)
    assert first_epoch >= 0, epochs
    later = [leader for epoch, leader in leaders.items() if epoch > first_epoch]
    assert any(leader not in (None, first_leader) for leader in later), epochs

    events = sorted(
        pq.read_table(out / "tables" / "broker_events").to_pylist(),
        key=lambda e: (e["broker_id"], e["offset"]),
    )
    by_broker: dict[int, list[str]] = {}
    for event in events:
        by_broker.setdefault(event["broker_id"], []).append(event["event"])
    assert set(by_broker) == {101, 102}, events
    for broker_events in by_broker.values():
        assert broker_events[0] == "registered" and "unfenced" in broker_events, by_broker
    after_unfence = by_broker[102][by_broker[102].index("unfenced") + 1 :]
    assert {"controlled_shutdown", "fenced"} & set(after_unfence), by_broker
    assert report.record_type_totals.get("LeaderChange", 0) >= 2
    assert (out / "summary.md").exists()
