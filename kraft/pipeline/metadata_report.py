"""``kraft pipeline metadata-report``: analytics over a controller's metadata log.

Output directory layout::

    tables/<name>/part-*.parquet   controller_epochs, broker_events, broker_states,
                                   partition_leader_events, offline_intervals, record_type_counts
    plots/*.png                    record_types, broker_timeline, controller_epochs, partition_leaders
    summary.md                     headline numbers and the small tables, linking the plots
    report.json                    the same headline numbers, machine-readable

If the log no longer starts at offset 0 (older segments deleted after a snapshot), the newest snapshot
at or below the log start supplies the starting state: its records are placed just before the first log
offset, stamped with the snapshot's last contained timestamp, and marked ``source = snapshot``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kraft.errors import ErrorCode, KraftError
from kraft.pipeline import metadata_tables as tables
from kraft.pipeline import report_plots as plots
from kraft.pipeline.layout import METADATA_TOPIC, LogFile, PartitionDir, find_partition_dirs
from kraft.pipeline.reader import read_logs

if TYPE_CHECKING:
    import pandas as pd
    from pyspark.sql import DataFrame, SparkSession

SUMMARY_FILE = "summary.md"
REPORT_JSON = "report.json"
_TABLE_ROWS_IN_SUMMARY = 25


@dataclass(slots=True)
class MetadataReport:
    log_dir: str
    metadata_dir: str
    out_dir: str
    records: int = 0
    log_start_offset: int = -1
    log_end_offset: int = -1
    first_timestamp_ms: int = -1
    last_timestamp_ms: int = -1
    bucket_ms: int = 0
    snapshot_records: int = 0
    epochs: int = 0
    brokers: int = 0
    broker_events: int = 0
    leader_changes: int = 0
    offline_intervals: int = 0
    undecodable_records: int = 0
    record_type_totals: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    tables: dict[str, str] = field(default_factory=dict)
    plots: dict[str, str] = field(default_factory=dict)


def _pick_metadata_dir(log_dir: str, report_notes: list[str]) -> PartitionDir:
    candidates = [d for d in find_partition_dirs(log_dir) if d.topic == METADATA_TOPIC]
    if not candidates:
        raise KraftError(ErrorCode.INVALID_REQUEST, f"no {METADATA_TOPIC}-0 metadata log under {log_dir}")
    # Several controllers' replicas of the same log: report on the longest one instead of mixing them.
    chosen = max(candidates, key=lambda d: (sum(s.size_bytes for s in d.segments), d.path))
    if len(candidates) > 1:
        others = ", ".join(d.path for d in candidates if d is not chosen)
        report_notes.append(
            f"{len(candidates)} metadata logs found; used the largest, {chosen.path} (not {others})"
        )
    return chosen


def _baseline_snapshot(directory: PartitionDir) -> LogFile | None:
    """The newest snapshot ending at or before the log start, when older segments are gone."""
    log_start = directory.segments[0].base_offset if directory.segments else None
    if log_start is None or log_start == 0:
        return None
    usable = [s for s in directory.snapshots if s.base_offset <= log_start]
    return usable[-1] if usable else None


def _load_rows(spark: SparkSession, directory: PartitionDir, report: MetadataReport) -> DataFrame:
    from pyspark.sql import functions as F

    columns = "source,file,offset,leader_epoch,timestamp_ms,is_control,record_type,record_json"
    rows = read_logs(spark, directory.path, columns=columns)
    log_rows = rows.where(F.col("source") == "log")
    snapshot = _baseline_snapshot(directory)
    if snapshot is None:
        return log_rows
    snapshot_rows = rows.where(F.col("file") == snapshot.path)
    header = (
        snapshot_rows.where(F.col("record_type") == "SnapshotHeader")
        .select(F.get_json_object("record_json", "$.last_contained_log_timestamp").cast("bigint").alias("ts"))
        .first()
    )
    data = snapshot_rows.where(~F.col("is_control"))
    count = data.count()
    report.snapshot_records = count
    log_start = directory.segments[0].base_offset
    stamp = int(header["ts"]) if header is not None and header["ts"] is not None else -1
    report.notes.append(
        f"log starts at offset {log_start}; state before it comes from snapshot {Path(snapshot.path).name} "
        f"({count} records, placed at offsets {log_start - count}..{log_start - 1})"
    )
    # Place the snapshot's records just before the log, in their snapshot order.
    shifted = data.withColumn("offset", F.col("offset") - F.lit(1) + F.lit(log_start - count)).withColumn(
        "timestamp_ms", F.lit(stamp).cast("bigint")
    )
    return shifted.unionByName(log_rows)


def _pandas(df: DataFrame) -> pd.DataFrame:
    """Collect a small (aggregated or limited) result for plotting."""
    return cast("pd.DataFrame", df.toPandas())


def _write_table(df: DataFrame, out: Path, name: str, report: MetadataReport) -> None:
    path = out / "tables" / name
    df.write.mode("overwrite").parquet(str(path))
    report.tables[name] = str(path)


def _cell(value: object) -> str:
    """A table cell: missing values (None, pandas' NaN for a state never entered) as ``-``, and whole
    floats (pandas turns an int column with gaps into floats) without ``.0``."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _markdown_table(frame: pd.DataFrame, limit: int = _TABLE_ROWS_IN_SUMMARY) -> str:
    if frame.empty:
        return "_none_\n"
    shown = frame.head(limit)
    header = "| " + " | ".join(str(c) for c in shown.columns) + " |"
    rule = "|" + "|".join("---" for _ in shown.columns) + "|"
    body = ["| " + " | ".join(_cell(v) for v in row) + " |" for row in shown.itertuples(index=False)]
    more = f"\n_{len(frame) - limit} more rows in the Parquet table_\n" if len(frame) > limit else "\n"
    return "\n".join([header, rule, *body]) + "\n" + more


def offset_range(report: MetadataReport) -> str:
    """The offsets the report covers, both ends inclusive (``log_end_offset`` is exclusive, as Kafka's)."""
    if report.records == 0:
        return "no offsets"
    return f"offsets {report.log_start_offset}..{report.log_end_offset - 1}"


def _shortened_labels(leader_events: pd.DataFrame) -> list[str]:
    """A table of the partition lanes whose topic name the plot had to shorten, with the full name."""
    if leader_events.empty:
        return []
    keys = dict.fromkeys(zip(leader_events["topic"].fillna("?"), leader_events["partition"], strict=True))
    rows = [
        (plots.partition_label(topic, int(partition)), f"{topic}-{int(partition)}")
        for topic, partition in keys
        if plots.partition_label(topic, int(partition)) != f"{topic}-{int(partition)}"
    ]
    if not rows:
        return []
    return [
        "Partition labels shortened in the plot:",
        "",
        "| label | partition |",
        "|---|---|",
        *[f"| {label} | {full} |" for label, full in sorted(rows)],
        "",
    ]


def _summary_markdown(
    report: MetadataReport,
    epochs: pd.DataFrame,
    broker_summary: pd.DataFrame,
    offline: pd.DataFrame,
    leader_events: pd.DataFrame,
) -> str:
    lines = [
        "# kraft metadata report",
        "",
        f"- metadata log: `{report.metadata_dir}`",
        f"- records: {report.records} ({offset_range(report)}), {report.undecodable_records} undecodable",
        f"- time span: {report.first_timestamp_ms} .. {report.last_timestamp_ms} ms "
        f"({(report.last_timestamp_ms - report.first_timestamp_ms) / 1000:.1f} s)",
        f"- controller epochs: {report.epochs}; brokers: {report.brokers} ({report.broker_events} lifecycle "
        f"events); partition leader changes: {report.leader_changes}; offline intervals: "
        f"{report.offline_intervals}",
        *[f"- note: {note}" for note in report.notes],
        "",
        "## Record types",
        "",
        "| record type | records |",
        "|---|---|",
        *[f"| {name} | {count} |" for name, count in sorted(report.record_type_totals.items())],
        "",
        "![record types](plots/record_types.png)",
        "",
        "## Controller epochs and leader tenures",
        "",
        _markdown_table(epochs),
        "![controller epochs](plots/controller_epochs.png)",
        "",
        "## Broker lifecycle",
        "",
        "Time spent in each state (ms) and the state at the end of the log.  States are named as "
        "`kraft broker list` names them: FENCED = registered, not yet unfenced (catching up); "
        "OFFLINE = fenced after being active (session expired, or controlled shutdown done).",
        "",
        _markdown_table(broker_summary),
        "![broker timeline](plots/broker_timeline.png)",
        "",
        "## Partition leaders and offline intervals",
        "",
        _markdown_table(offline),
        "![partition leaders](plots/partition_leaders.png)",
        "",
        *_shortened_labels(leader_events),
    ]
    return "\n".join(lines)


def metadata_report(spark: SparkSession, log_dir: str, out_dir: str) -> MetadataReport:
    """Build every table, plot and the summary for the metadata log under ``log_dir``."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    out = Path(out_dir)
    notes: list[str] = []
    directory = _pick_metadata_dir(log_dir, notes)
    report = MetadataReport(log_dir=log_dir, metadata_dir=directory.path, out_dir=out_dir, notes=notes)
    out.mkdir(parents=True, exist_ok=True)
    (out / "plots").mkdir(exist_ok=True)

    rows = _load_rows(spark, directory, report).persist(StorageLevel.MEMORY_AND_DISK)
    try:
        stats = (
            rows.where(F.col("source") == "log")
            .agg(
                F.count(F.lit(1)).alias("records"),
                F.min("offset").alias("first_offset"),
                F.max("offset").alias("last_offset"),
                F.min("timestamp_ms").alias("first_ms"),
                F.max("timestamp_ms").alias("last_ms"),
                F.sum(F.when(F.col("record_type") == "Undecodable", 1).otherwise(0)).alias("undecodable"),
            )
            .first()
        )
        assert stats is not None
        report.records = int(stats["records"])
        if report.records:
            report.log_start_offset = int(stats["first_offset"])
            report.log_end_offset = int(stats["last_offset"]) + 1
            report.first_timestamp_ms = int(stats["first_ms"])
            report.last_timestamp_ms = int(stats["last_ms"])
            report.undecodable_records = int(stats["undecodable"] or 0)
        end_ms = report.last_timestamp_ms
        origin_ms = report.first_timestamp_ms
        report.bucket_ms = tables.choose_bucket_ms(max(end_ms - origin_ms, 0))

        epochs_df = tables.controller_epochs(rows.where(F.col("source") == "log"), end_ms)
        events_df = tables.broker_events(rows)
        states_df = tables.broker_states(events_df, end_ms)
        leaders_df = tables.partition_leader_events(rows)
        offline_df = tables.offline_intervals(leaders_df, end_ms)
        counts_df = tables.record_type_counts(rows, report.bucket_ms)
        for name, df in (
            ("controller_epochs", epochs_df),
            ("broker_events", events_df),
            ("broker_states", states_df),
            ("partition_leader_events", leaders_df),
            ("offline_intervals", offline_df),
            ("record_type_counts", counts_df),
        ):
            _write_table(df, out, name, report)

        # Small, aggregated results only reach the driver (for plots and the summary).
        spark_read = spark.read
        epochs = _pandas(spark_read.parquet(report.tables["controller_epochs"]).orderBy("epoch"))
        counts = _pandas(spark_read.parquet(report.tables["record_type_counts"]))
        states_table = spark_read.parquet(report.tables["broker_states"])
        broker_summary = _pandas(
            states_table.groupBy("broker_id")
            .pivot("state", list(plots.STATE_COLORS))
            .agg(F.sum("duration_ms"))
            .join(
                states_table.where(F.col("is_open")).select("broker_id", F.col("state").alias("final_state")),
                "broker_id",
                "left",
            )
            .orderBy("broker_id")
        )
        plotted_brokers = broker_summary["broker_id"].head(plots.MAX_ROWS_PLOTTED).tolist()
        states = _pandas(states_table.where(F.col("broker_id").isin(plotted_brokers)))
        leader_table = spark_read.parquet(report.tables["partition_leader_events"])
        plotted_partitions = (
            leader_table.select("topic_id", "partition")
            .distinct()
            .orderBy("topic_id", "partition")
            .limit(plots.MAX_ROWS_PLOTTED)
        )
        leader_events = _pandas(leader_table.join(plotted_partitions, ["topic_id", "partition"]))
        offline_table = spark_read.parquet(report.tables["offline_intervals"])
        offline = _pandas(offline_table.orderBy("start_offset").limit(200))

        report.epochs = len(epochs)
        report.brokers = len(broker_summary)
        report.broker_events = spark_read.parquet(report.tables["broker_events"]).count()
        report.leader_changes = leader_table.where(F.col("change") != "created").count()
        report.offline_intervals = offline_table.count()
        report.record_type_totals = {
            str(k): int(v) for k, v in counts.groupby("record_type")["records"].sum().items()
        }

        plot_dir = out / "plots"
        report.plots = {
            "record_types": str(
                plots.plot_record_types(counts, origin_ms, report.bucket_ms, plot_dir / "record_types.png")
            ),
            "broker_timeline": str(
                plots.plot_broker_timeline(states, origin_ms, plot_dir / "broker_timeline.png")
            ),
            "controller_epochs": str(
                plots.plot_controller_epochs(epochs, origin_ms, plot_dir / "controller_epochs.png")
            ),
            "partition_leaders": str(
                plots.plot_partition_leaders(
                    leader_events, origin_ms, end_ms, plot_dir / "partition_leaders.png"
                )
            ),
        }
    finally:
        rows.unpersist()

    (out / SUMMARY_FILE).write_text(_summary_markdown(report, epochs, broker_summary, offline, leader_events))
    (out / REPORT_JSON).write_text(json.dumps(report_json(report), indent=2) + "\n")
    return report


def report_json(report: MetadataReport) -> dict[str, Any]:
    return asdict(report)
