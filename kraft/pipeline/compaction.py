"""Exact key compaction of partition logs on Spark: keep the newest record of every key.

Why Spark: exact compaction needs, for every key, its newest offset.  Kafka keeps a bounded in-memory
``hash(key) -> offset`` map and therefore only *approximately* compacts logs with more keys than fit;
here the key → newest-offset reduction is a Spark aggregation whose sort-based shuffle spills to disk,
so neither the driver nor any executor ever holds a per-key map (seed 004: "an out-of-core shuffle").

Pipeline (one Spark action after a header scan):

1. *scan* (executors): headers + CRCs of every segment → log start/end, newest timestamp, checkpoints;
   the driver cuts each partition into offset ranges of about ``task_bytes`` (one writer task each).
2. *keys* (executors): decode records → ``(task, kind, key, offset)``; kind separates keyed records from
   keyless ones (an error for a compacted topic: counted, left out) and control records (left out).
3. *reduce* (shuffle): ``group by (task, kind, key) → max(offset), count(*), min(offset)``.  Keys stop
   here: only survivor offsets travel on, plus one start marker per range.
4. *write* (executors): rows repartitioned by range, sorted by offset; each task merges its survivor
   offsets with a forward-only read of the input and writes contiguous segments (see compact_writer).

Tombstones: a surviving tombstone (null value) whose timestamp is older than the partition's newest
timestamp minus ``tombstone_retention_ms`` is dropped, so the key disappears.  The horizon is relative to
the log, not the wall clock, so compacting the same input twice gives the same output.
"""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from kraft.errors import ErrorCode, KraftError
from kraft.pipeline.compact_plan import PartitionPlan, SegmentScan, plan_partition, scan_segment
from kraft.pipeline.compact_writer import (
    KIND_CONTROL,
    KIND_KEYED,
    KIND_KEYLESS,
    KIND_RANGE_START,
    OffsetRange,
    RangeCompactor,
    RangeStats,
)
from kraft.pipeline.decode import iter_file_batches, mapped
from kraft.pipeline.layout import LogFile, find_partition_dirs, is_segment_file_name

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

REPORT_FILE = "compaction-report.json"
DEFAULT_TOMBSTONE_RETENTION_MS = 86_400_000  # Kafka's delete.retention.ms default

_KEY_SCHEMA = pa.schema(
    [("pid", pa.int32()), ("kind", pa.int8()), ("key", pa.binary()), ("offset", pa.int64())]
)
_GROUP_COLUMNS = ("kind", "offset", "records", "first_offset")
_STATS_FIELDS: tuple[tuple[str, pa.DataType], ...] = (
    ("task", pa.int32()),
    ("topic", pa.string()),
    ("partition", pa.int32()),
    ("distinct_keys", pa.int64()),
    ("keyed_records_in", pa.int64()),
    ("keyless_records", pa.int64()),
    ("keyless_first_offset", pa.int64()),
    ("control_records", pa.int64()),
    ("records_out", pa.int64()),
    ("tombstones_kept", pa.int64()),
    ("tombstones_dropped", pa.int64()),
    ("batches_out", pa.int64()),
    ("segments_out", pa.int64()),
    ("bytes_out", pa.int64()),
)
_STATS_SCHEMA = pa.schema(list(_STATS_FIELDS))
_STATS_DDL = ", ".join(
    f"`{name}` {'string' if t == pa.string() else 'int' if t == pa.int32() else 'bigint'}"
    for name, t in _STATS_FIELDS
)
_ROWS_PER_KEY_BATCH = 16384


@dataclass(frozen=True, slots=True)
class CompactionOptions:
    tombstone_retention_ms: int = DEFAULT_TOMBSTONE_RETENTION_MS
    segment_bytes: int = 1 << 30  # log.segment.bytes default
    task_bytes: int = 64 << 20  # input bytes per writer task
    checkpoint_bytes: int = 4 << 20  # granularity of range starts and key-pass splits
    split_bytes: int = 32 << 20  # input bytes per key-pass task
    batch_records: int = 1000  # records per output batch (at most)
    batch_bytes: int = 1 << 20  # bytes per output batch (about)

    def validate(self) -> None:
        for name in (
            "segment_bytes",
            "task_bytes",
            "checkpoint_bytes",
            "split_bytes",
            "batch_records",
            "batch_bytes",
        ):
            if getattr(self, name) <= 0:
                raise KraftError(ErrorCode.INVALID_CONFIG, f"{name} must be > 0, got {getattr(self, name)}")
        if self.tombstone_retention_ms < 0:
            raise KraftError(
                ErrorCode.INVALID_CONFIG,
                f"tombstone retention must be >= 0 ms, got {self.tombstone_retention_ms}",
            )


@dataclass(slots=True)
class PartitionReport:
    topic: str
    partition: int
    input_dir: str
    output_dir: str
    log_start_offset: int
    log_end_offset: int
    records_in: int
    distinct_keys: int
    records_out: int
    duplicates_removed: int
    tombstones_kept: int
    tombstones_dropped: int
    keyless_records: int
    keyless_first_offset: int
    control_records: int
    bytes_in: int
    bytes_out: int
    bytes_saved: int
    segments_in: int
    segments_out: int
    batches_out: int
    truncated_tail_bytes: int
    tombstone_horizon_ms: int


@dataclass(slots=True)
class CompactionReport:
    log_dir: str
    out_dir: str
    tombstone_retention_ms: int
    elapsed_s: float
    partitions: list[PartitionReport] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def total(self, name: str) -> int:
        return sum(int(getattr(p, name)) for p in self.partitions)

    def to_json(self) -> dict[str, Any]:
        names = (
            "records_in",
            "distinct_keys",
            "records_out",
            "duplicates_removed",
            "tombstones_kept",
            "tombstones_dropped",
            "keyless_records",
            "control_records",
            "bytes_in",
            "bytes_out",
            "bytes_saved",
            "segments_in",
            "segments_out",
        )
        return {
            "log_dir": self.log_dir,
            "out_dir": self.out_dir,
            "tombstone_retention_ms": self.tombstone_retention_ms,
            "elapsed_s": round(self.elapsed_s, 3),
            "totals": {name: self.total(name) for name in names},
            "errors": self.errors,
            "partitions": [asdict(p) for p in self.partitions],
        }


# --- executor functions (pickled by Spark; keep them free of driver state) ---------------------------


def _scan_task(args: tuple[LogFile, int]) -> SegmentScan:
    return scan_segment(args[0], args[1])


def _key_rows(log_file: LogFile, pid: int, start: int, stop: int) -> Iterator[pa.RecordBatch]:
    """(pid, kind, key, offset) of every record in the batches at ``[start, stop)`` of one segment."""
    kind_col: list[int] = []
    key_col: list[bytes | None] = []
    offset_col: list[int] = []

    def flush() -> pa.RecordBatch:
        out = pa.RecordBatch.from_arrays(
            [
                pa.array([pid] * len(offset_col), pa.int32()),
                pa.array(kind_col, pa.int8()),
                pa.array(key_col, pa.binary()),
                pa.array(offset_col, pa.int64()),
            ],
            schema=_KEY_SCHEMA,
        )
        kind_col.clear()
        key_col.clear()
        offset_col.clear()
        return out

    with mapped(log_file.path) as view:
        for _pos, batch in iter_file_batches(log_file, view, start, stop):
            base = batch.base_offset
            records = batch.records
            offset_col.extend([base + r.offset_delta for r in records])
            if batch.is_control:
                kind_col.extend([KIND_CONTROL] * len(records))
                key_col.extend([None] * len(records))
            else:
                keys = [r.key for r in records]
                key_col.extend(keys)
                kind_col.extend([KIND_KEYED if k is not None else KIND_KEYLESS for k in keys])
            if len(offset_col) >= _ROWS_PER_KEY_BATCH:
                yield flush()
    if offset_col:
        yield flush()


def _stats_batch(stats: list[RangeStats]) -> pa.RecordBatch:
    columns = {name: [getattr(s, name) for s in stats] for name, _ in _STATS_FIELDS}
    return pa.RecordBatch.from_pydict(columns, schema=_STATS_SCHEMA)


# --- driver ------------------------------------------------------------------------------------------


def check_output_dir(out_dir: Path) -> None:
    """Refuse an output directory that already holds segments (compaction never overwrites a log)."""
    if out_dir.exists() and any(is_segment_file_name(p.name) for p in out_dir.rglob("*.log")):
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"output directory {out_dir} already holds segments; choose an empty directory",
        )
    out_dir.mkdir(parents=True, exist_ok=True)


def _routes(spark: SparkSession, partitions: int) -> list[int]:
    """For each Spark partition p, a value v with pmod(hash(v), partitions) == p.

    ``repartition(n, col)`` places a row by Spark's Murmur3 ``hash`` of the column; routing range i
    through ``route[i]`` gives every writer range its own Spark partition (no accidental pile-ups).
    """
    from pyspark.sql import functions as F

    found: dict[int, int] = {}
    limit = 64 * partitions + 64
    rows = (
        spark.range(0, limit)
        .select(
            F.col("id").cast("int").alias("v"),
            F.expr(f"pmod(hash(cast(id as int)), {partitions})").alias("p"),
        )
        .groupBy("p")
        .agg(F.min("v").alias("v"))
        .collect()
    )
    for row in rows:
        found[int(row["p"])] = int(row["v"])
    # Any partition without a hit (practically impossible) just shares: correctness does not depend on it.
    return [found.get(p, p) for p in range(partitions)]


def compact(
    spark: SparkSession, log_dir: str, out_dir: str, options: CompactionOptions | None = None
) -> CompactionReport:
    """Compact every partition log under ``log_dir`` into ``out_dir/<topic>-<partition>/``."""
    opts = options or CompactionOptions()
    opts.validate()
    started = time.monotonic()
    partition_dirs = find_partition_dirs(log_dir)
    seen: dict[tuple[str, int], str] = {}
    for d in partition_dirs:
        if (d.topic, d.partition) in seen:
            raise KraftError(
                ErrorCode.INVALID_REQUEST,
                f"{d.topic}-{d.partition} appears twice ({seen[(d.topic, d.partition)]} and {d.path}); "
                "compact one broker's log directory at a time",
            )
        seen[(d.topic, d.partition)] = d.path
    out_root = Path(out_dir)
    check_output_dir(out_root)
    sc = spark.sparkContext

    # 1. scan headers in executors; the driver only sees one small row per segment
    segments = [s for d in partition_dirs for s in d.segments]
    scans: list[SegmentScan] = []
    if segments:
        checkpoint = opts.checkpoint_bytes
        scans = sc.parallelize([(s, checkpoint) for s in segments], len(segments)).map(_scan_task).collect()
    by_partition: dict[tuple[str, int], list[SegmentScan]] = {}
    for scan in scans:
        by_partition.setdefault((scan.log_file.topic, scan.log_file.partition), []).append(scan)
    plans: list[PartitionPlan] = []
    next_task = 0
    for d in partition_dirs:
        plan = plan_partition(
            d,
            by_partition.get((d.topic, d.partition), []),
            first_task=next_task,
            task_bytes=opts.task_bytes,
            tombstone_retention_ms=opts.tombstone_retention_ms,
        )
        next_task += len(plan.ranges)
        plans.append(plan)
    ranges: list[OffsetRange] = [r for p in plans for r in p.ranges]

    stats_rows: list[Any] = []
    if ranges:
        stats_rows = _run_compaction(spark, scans, plans, ranges, out_root, opts)
    report = _build_report(log_dir, out_dir, opts, plans, stats_rows, time.monotonic() - started)
    (out_root / REPORT_FILE).write_text(json.dumps(report.to_json(), indent=2) + "\n")
    return report


def _key_splits(
    plans: list[PartitionPlan], scans: list[SegmentScan], split_bytes: int
) -> list[tuple[LogFile, int, int]]:
    """Byte ranges of segments, cut at batch boundaries (scan checkpoints), of about ``split_bytes``."""
    wanted = {p.path for p in plans if p.ranges}
    splits: list[tuple[LogFile, int, int]] = []
    for scan in scans:
        if scan.batches == 0 or str(Path(scan.log_file.path).parent) not in wanted:
            continue
        cuts = [0]
        for checkpoint in scan.checkpoints:
            if checkpoint.position - cuts[-1] >= split_bytes:
                cuts.append(checkpoint.position)
        cuts.append(scan.valid_bytes)
        splits.extend((scan.log_file, a, b) for a, b in itertools.pairwise(cuts))
    return splits


def _run_compaction(
    spark: SparkSession,
    scans: list[SegmentScan],
    plans: list[PartitionPlan],
    ranges: list[OffsetRange],
    out_root: Path,
    opts: CompactionOptions,
) -> list[Any]:
    from pyspark.sql import functions as F

    sc = spark.sparkContext
    pids = {(p.topic, p.partition): pid for pid, p in enumerate(plans)}
    splits = _key_splits(plans, scans, opts.split_bytes)

    # 2. decode keys in executors: one Spark partition per split (a byte range of one segment)
    split_df = spark.createDataFrame(
        sc.parallelize([(i,) for i in range(len(splits))], len(splits)), "split_index int"
    )

    def key_rows(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for rb in batches:
            for index in rb.column(0).to_pylist():
                log_file, start, stop = splits[index]
                yield from _key_rows(log_file, pids[(log_file.topic, log_file.partition)], start, stop)

    keys = split_df.mapInArrow(key_rows, "pid int, kind tinyint, key binary, offset bigint")

    # 3. the out-of-core reduction: newest offset (and counts) per key of each partition; then each
    #    survivor goes to the writer range holding its offset (computed in the JVM: ranges per
    #    partition are few, so counting the range starts <= offset is cheap)
    groups = (
        keys.groupBy("pid", "kind", "key")
        .agg(
            F.max("offset").alias("offset"),
            F.count(F.lit(1)).alias("records"),
            F.min("offset").alias("first_offset"),
        )
        .select("pid", *_GROUP_COLUMNS)
    )
    starts_by_pid = F.array(
        *[
            F.array(*[F.lit(r.start) for r in p.ranges]) if p.ranges else F.array().cast("array<bigint>")
            for p in plans
        ]
    )
    first_task_by_pid = F.array(*[F.lit(p.ranges[0].task if p.ranges else -1) for p in plans])
    starts = F.element_at(starts_by_pid, F.col("pid") + 1)
    ranges_started = F.size(F.filter(starts, lambda start: start <= F.col("offset")))
    task = F.element_at(first_task_by_pid, F.col("pid") + 1) + ranges_started - 1
    tasked = groups.select(task.cast("int").alias("task"), *_GROUP_COLUMNS)
    markers = spark.createDataFrame(
        [(r.task, KIND_RANGE_START, r.start, 0, r.start) for r in ranges],
        "task int, kind tinyint, offset bigint, records bigint, first_offset bigint",
    )
    rows = tasked.unionByName(markers)

    # 4. route each range to its own Spark partition, sort by offset, write from the executors
    routes = _routes(spark, len(ranges))
    route_of_task = F.element_at(F.array(*[F.lit(routes[i]) for i in range(len(ranges))]), F.col("task") + 1)
    ordered = (
        rows.withColumn("route", route_of_task)
        .repartition(len(ranges), "route")
        .sortWithinPartitions("task", "offset", "kind")
        .select("task", "kind", "offset", "records", "first_offset")
    )
    ranges_by_task = {r.task: r for r in ranges}
    segment_bytes, batch_records, batch_bytes = opts.segment_bytes, opts.batch_records, opts.batch_bytes
    out_path = str(out_root)

    def write(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        current: RangeCompactor | None = None
        finished: list[RangeStats] = []
        for rb in batches:
            columns = rb.to_pydict()
            for task, kind, offset, records, first_offset in zip(
                columns["task"],
                columns["kind"],
                columns["offset"],
                columns["records"],
                columns["first_offset"],
                strict=True,
            ):
                if current is None or current.range.task != task:
                    if current is not None:
                        finished.append(current.finish())
                    current = RangeCompactor(
                        ranges_by_task[task], Path(out_path), segment_bytes, batch_records, batch_bytes
                    )
                if kind != KIND_RANGE_START:
                    current.add_row(kind, offset, records, first_offset)
        if current is not None:
            finished.append(current.finish())
        yield _stats_batch(finished)

    return ordered.mapInArrow(write, _STATS_DDL).collect()


def _build_report(
    log_dir: str,
    out_dir: str,
    opts: CompactionOptions,
    plans: list[PartitionPlan],
    stats_rows: list[Any],
    elapsed_s: float,
) -> CompactionReport:
    report = CompactionReport(log_dir, out_dir, opts.tombstone_retention_ms, elapsed_s)
    by_partition: dict[tuple[str, int], list[Any]] = {}
    for row in stats_rows:
        by_partition.setdefault((row["topic"], int(row["partition"])), []).append(row)
    for plan in plans:
        rows = by_partition.get((plan.topic, plan.partition), [])

        def total(name: str, rows: list[Any] = rows) -> int:
            return sum(int(r[name]) for r in rows)

        keyless_offsets = [
            int(r["keyless_first_offset"]) for r in rows if int(r["keyless_first_offset"]) >= 0
        ]
        keyed_in = total("keyed_records_in")
        distinct = total("distinct_keys")
        bytes_out = total("bytes_out")
        records_in = keyed_in + total("keyless_records") + total("control_records")
        if records_in != plan.records_in:
            raise KraftError(
                ErrorCode.CORRUPT_MESSAGE,
                f"{plan.path}: header scan counted {plan.records_in} records but decoding found {records_in};"
                " was the log modified during compaction?",
            )
        part = PartitionReport(
            topic=plan.topic,
            partition=plan.partition,
            input_dir=plan.path,
            output_dir=str(Path(out_dir) / f"{plan.topic}-{plan.partition}"),
            log_start_offset=plan.log_start_offset,
            log_end_offset=plan.log_end_offset,
            records_in=records_in,
            distinct_keys=distinct,
            records_out=total("records_out"),
            duplicates_removed=keyed_in - distinct,
            tombstones_kept=total("tombstones_kept"),
            tombstones_dropped=total("tombstones_dropped"),
            keyless_records=total("keyless_records"),
            keyless_first_offset=min(keyless_offsets) if keyless_offsets else -1,
            control_records=total("control_records"),
            bytes_in=plan.bytes_in,
            bytes_out=bytes_out,
            bytes_saved=plan.bytes_in - bytes_out,
            segments_in=plan.segments_in,
            segments_out=total("segments_out"),
            batches_out=total("batches_out"),
            truncated_tail_bytes=plan.truncated_tail_bytes,
            tombstone_horizon_ms=plan.tombstone_horizon_ms,
        )
        report.partitions.append(part)
        if part.keyless_records:
            report.errors.append(
                f"{plan.topic}-{plan.partition}: {part.keyless_records} record(s) without a key were left "
                f"out (compacted topics require keys); first at offset {part.keyless_first_offset}"
            )
    return report
