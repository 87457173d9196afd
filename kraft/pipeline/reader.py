"""A Spark DataFrame over kraft log directories: one split per segment/snapshot file, decoded in executors.

Usage::

    from kraft.pipeline.reader import read_logs
    df = read_logs(spark, "/data/broker-101")                  # every partition below the directory
    df = read_logs(spark, d, columns="topic,partition,offset,key", include_snapshots=False)

or, once :func:`register` ran (``kraft.pipeline.session.spark_session`` does it)::

    spark.read.format("kraft-log").option("path", d).load()

Options: ``path`` (required), ``columns`` (comma list, default all — decoding only what is asked for is
the one projection a Python data source can do), ``snapshots`` (``true``/``false``, default true).
Rows: see :data:`kraft.pipeline.decode.COLUMNS`; ``record_type``/``record_json`` are filled for the metadata
log (decoded ``MetadataRecord``s) and for control records (LeaderChange, snapshot header/footer).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pyarrow as pa
from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from kraft.pipeline.decode import read_file_as_arrow, select_columns, spark_ddl
from kraft.pipeline.layout import LogFile, find_partition_dirs

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession
    from pyspark.sql.types import StructType

FORMAT_NAME = "kraft-log"


class LogFilePartition(InputPartition):
    """One input split: a single segment or snapshot file."""

    def __init__(self, log_file: LogFile) -> None:
        super().__init__(log_file.path)
        self.log_file = log_file


def list_log_files(path: str, *, include_snapshots: bool = True) -> list[LogFile]:
    """Every file the reader splits on, in (topic, partition, source, offset) order."""
    files: list[LogFile] = []
    for partition_dir in find_partition_dirs(path):
        files.extend(partition_dir.segments)
        if include_snapshots:
            files.extend(partition_dir.snapshots)
    return files


def _parse_bool(value: str | None, default: bool) -> bool:
    if value is None:
        return default
    return value.strip().lower() in {"1", "true", "yes"}


class KraftLogReader(DataSourceReader):
    def __init__(self, path: str, columns: Sequence[str], include_snapshots: bool) -> None:
        self.path = path
        self.columns = tuple(columns)
        self.include_snapshots = include_snapshots

    def partitions(self) -> Sequence[InputPartition]:
        return [
            LogFilePartition(f) for f in list_log_files(self.path, include_snapshots=self.include_snapshots)
        ]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        assert isinstance(partition, LogFilePartition)
        yield from read_file_as_arrow(partition.log_file, self.columns)


class KraftLogDataSource(DataSource):
    """``spark.read.format("kraft-log")``: records of kraft segment and snapshot files."""

    def __init__(self, options: dict[str, Any]) -> None:
        super().__init__(options)
        path = options.get("path")
        if not path:
            raise ValueError("the kraft-log data source needs option path=<log directory>")
        self.path = str(path)
        self.columns = select_columns(options.get("columns"))
        self.include_snapshots = _parse_bool(options.get("snapshots"), True)

    @classmethod
    def name(cls) -> str:
        return FORMAT_NAME

    def schema(self) -> str:
        return spark_ddl(self.columns)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KraftLogReader(self.path, self.columns, self.include_snapshots)


_REGISTERED: set[int] = set()  # ids of the SparkContexts (JVMs) that know the data source


def register(spark: SparkSession) -> None:
    """Make ``spark.read.format("kraft-log")`` available (once per running SparkContext)."""
    context_id = id(spark.sparkContext._jsc)
    if context_id not in _REGISTERED:
        spark.dataSource.register(KraftLogDataSource)
        _REGISTERED.add(context_id)


def read_logs(
    spark: SparkSession, path: str, *, columns: str | None = None, include_snapshots: bool = True
) -> DataFrame:
    """The records below ``path`` as a DataFrame (fails fast on a directory without kraft logs)."""
    # Validate on the driver first: a missing dir should be one clear error, not a Spark stack trace.
    select_columns(columns)
    list_log_files(path, include_snapshots=include_snapshots)
    register(spark)
    reader = spark.read.format(FORMAT_NAME).option("path", path)
    reader = reader.option("snapshots", "true" if include_snapshots else "false")
    if columns:
        reader = reader.option("columns", columns)
    return reader.load()
