"""``kraft pipeline``: PySpark jobs over kraft logs — metadata-report and exact compaction.

Spark's own output (JVM warnings, log4j lines, worker tracebacks) goes to ``<out>/spark.log``, never to
the terminal; failures are one ``error:`` line on stderr and exit 1, as for every kraft command.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kraft.cli.common import CliError, JsonOption, fail, handle_errors, print_json, print_key_values
from kraft.errors import KraftError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from kraft.pipeline.session import SparkSettings

app = typer.Typer(no_args_is_help=True, help="PySpark jobs over kraft logs: metadata report, compaction.")

SPARK_LOG_FILE = "spark.log"

LogDirOption = Annotated[
    Path, typer.Option("--log-dir", help="A log directory (or a tree of them) to read.", show_default=False)
]
OutOption = Annotated[Path, typer.Option("--out", help="Output directory.", show_default=False)]
MasterOption = Annotated[str, typer.Option("--master", help="Spark master URL.")]
DriverMemoryOption = Annotated[
    str, typer.Option("--driver-memory", help="Spark driver memory cap (local mode: everything runs there).")
]
ExecutorMemoryOption = Annotated[str, typer.Option("--executor-memory", help="Spark executor memory cap.")]
ShufflePartitionsOption = Annotated[
    int, typer.Option("--shuffle-partitions", min=1, help="Spark SQL shuffle partitions.")
]
LocalDirOption = Annotated[
    Path | None,
    typer.Option(
        "--spill-dir", help="Where Spark spills shuffles (default: the system temp dir).", show_default=False
    ),
]


def _settings(
    master: str, driver_memory: str, executor_memory: str, shuffle_partitions: int, spill_dir: Path | None
) -> SparkSettings:
    from kraft.pipeline.session import SparkSettings

    return SparkSettings(
        master=master,
        driver_memory=driver_memory,
        executor_memory=executor_memory,
        shuffle_partitions=shuffle_partitions,
        local_dir=str(spill_dir) if spill_dir else None,
    )


def _spark_error_line(exc: Exception) -> str:
    """The useful line of a Spark failure: kraft's own error raised in an executor, else Spark's first."""
    text = str(exc)
    for line in reversed(text.splitlines()):
        if "KraftError:" in line or "CorruptRecordError:" in line:
            return line.split("Error: ", 1)[-1].strip()
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return f"Spark job failed: {first}"


@contextmanager
def _spark(settings: SparkSettings, out: Path) -> Iterator[SparkSession]:
    """A quiet SparkSession whose logs go to ``out/spark.log``; stopped on exit; Spark errors → one line."""
    from py4j.protocol import Py4JError  # type: ignore[import-untyped]
    from pyspark.errors import PySparkException

    from kraft.pipeline.session import spark_session

    out.mkdir(parents=True, exist_ok=True)
    session = spark_session(settings, jvm_log_path=str(out / SPARK_LOG_FILE))
    try:
        yield session
    except KraftError:
        raise
    except (PySparkException, Py4JError) as exc:
        raise CliError(f"{_spark_error_line(exc)} (details in {out / SPARK_LOG_FILE})") from None
    finally:
        session.stop()


@app.command("metadata-report")
@handle_errors
def metadata_report_command(
    log_dir: LogDirOption,
    out: OutOption,
    master: MasterOption = "local[*]",
    driver_memory: DriverMemoryOption = "1g",
    executor_memory: ExecutorMemoryOption = "1g",
    shuffle_partitions: ShufflePartitionsOption = 8,
    spill_dir: LocalDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Controller epochs, broker lifecycle, partition leaders and record types of a metadata log.

    Writes Parquet tables (out/tables), PNG plots (out/plots), out/summary.md and out/report.json.

    Examples:

      kraft pipeline metadata-report --log-dir kc/controller-1 --out report

      kraft pipeline metadata-report --log-dir kc --out report --json

      kraft pipeline metadata-report --log-dir kc --out r --master local[2]
    """
    from kraft.pipeline.layout import find_partition_dirs
    from kraft.pipeline.metadata_report import SUMMARY_FILE, metadata_report, offset_range, report_json

    find_partition_dirs(log_dir)  # a missing/empty dir fails here, before a JVM starts
    started = time.monotonic()
    with _spark(
        _settings(master, driver_memory, executor_memory, shuffle_partitions, spill_dir), out
    ) as spark:
        report = metadata_report(spark, str(log_dir), str(out))
    if as_json:
        print_json(report_json(report))
        return
    print_key_values(
        [
            ("MetadataLog", report.metadata_dir),
            ("Records", report.records),
            ("Offsets", offset_range(report).removeprefix("offsets ")),  # inclusive at both ends
            ("ControllerEpochs", report.epochs),
            ("Brokers", report.brokers),
            ("BrokerEvents", report.broker_events),
            ("LeaderChanges", report.leader_changes),
            ("OfflineIntervals", report.offline_intervals),
            ("Summary", str(out / SUMMARY_FILE)),
            ("ElapsedS", f"{time.monotonic() - started:.1f}"),
        ]
    )


@app.command("compact")
@handle_errors
def compact_command(
    log_dir: LogDirOption,
    out: OutOption,
    tombstone_retention_ms: Annotated[
        int,
        typer.Option(
            "--tombstone-retention-ms",
            min=0,
            help="Drop tombstones older than the partition's newest record minus this.",
        ),
    ] = 86_400_000,
    segment_bytes: Annotated[
        int, typer.Option("--segment-bytes", min=1024, help="Roll output segments at.")
    ] = 1 << 30,
    task_bytes: Annotated[
        int, typer.Option("--task-bytes", min=1, help="Input bytes per writer task (output parallelism).")
    ] = 64 << 20,
    master: MasterOption = "local[*]",
    driver_memory: DriverMemoryOption = "1g",
    executor_memory: ExecutorMemoryOption = "1g",
    shuffle_partitions: ShufflePartitionsOption = 8,
    spill_dir: LocalDirOption = None,
    as_json: JsonOption = False,
) -> None:
    """Exact key compaction of partition logs (newest record per key, original offsets).

    Tombstones older than the retention are dropped.
    Records without a key cannot be compacted: they are left out and reported as errors (exit 1).
    Output: segments under out/<topic>-<partition>/ and out/compaction-report.json.

    Examples:

      kraft pipeline compact --log-dir data/orders-0 --out compacted

      kraft pipeline compact --log-dir data --out c --tombstone-retention-ms 0

      kraft pipeline compact --log-dir data --out c --executor-memory 512m --json
    """
    from kraft.pipeline.compaction import REPORT_FILE, CompactionOptions, check_output_dir, compact
    from kraft.pipeline.layout import find_partition_dirs

    # Everything that can be checked without a JVM is checked first (starting Spark takes seconds).
    find_partition_dirs(log_dir)
    if out.resolve() == log_dir.resolve() or log_dir.resolve() in out.resolve().parents:
        raise CliError(f"--out {out} must not be inside --log-dir {log_dir}")
    check_output_dir(out)
    options = CompactionOptions(
        tombstone_retention_ms=tombstone_retention_ms, segment_bytes=segment_bytes, task_bytes=task_bytes
    )
    options.validate()
    with _spark(
        _settings(master, driver_memory, executor_memory, shuffle_partitions, spill_dir), out
    ) as spark:
        report = compact(spark, str(log_dir), str(out), options)
    totals = report.to_json()["totals"]
    if as_json:
        print_json(report.to_json())
    else:
        print_key_values(
            [
                ("Partitions", len(report.partitions)),
                ("RecordsIn", totals["records_in"]),
                ("DistinctKeys", totals["distinct_keys"]),
                ("RecordsOut", totals["records_out"]),
                ("TombstonesDropped", totals["tombstones_dropped"]),
                ("KeylessRecords", totals["keyless_records"]),
                ("BytesIn", totals["bytes_in"]),
                ("BytesOut", totals["bytes_out"]),
                ("BytesSaved", totals["bytes_saved"]),
                ("Report", str(out / REPORT_FILE)),
                ("ElapsedS", f"{report.elapsed_s:.1f}"),
            ]
        )
    if report.errors:
        more = f" (+{len(report.errors) - 1} more in {out / REPORT_FILE})" if len(report.errors) > 1 else ""
        fail(report.errors[0] + more)
