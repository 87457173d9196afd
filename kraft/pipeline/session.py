"""The one way kraft builds a SparkSession: quiet, memory-capped, with kraft's data source registered.

Spark's own chatter (INFO logs, progress bars, the startup banner) stays out of the user's terminal: a
log4j2 configuration at WARN (and ERROR for the few loggers that always warn on a laptop) is handed to
the driver JVM before it starts, the console progress bar and the UI are off.
"""

from __future__ import annotations

import os
import sys
import tempfile
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG4J2 = """\
rootLogger.level = warn
rootLogger.appenderRef.stderr.ref = console
appender.console.type = Console
appender.console.name = console
appender.console.target = SYSTEM_ERR
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = spark %p %c{1}: %m%n
logger.hadoop.name = org.apache.hadoop.util.NativeCodeLoader
logger.hadoop.level = error
logger.sparkenv.name = org.apache.spark.SparkEnv
logger.sparkenv.level = error
logger.utils.name = org.apache.spark.util.Utils
logger.utils.level = error
logger.arrow.name = org.apache.spark.sql.execution.python
logger.arrow.level = error
logger.window.name = org.apache.spark.sql.execution.window.WindowExec
logger.window.level = error
logger.sources.name = org.apache.spark.sql.execution.datasources
logger.sources.level = error
logger.conf.name = org.apache.spark.SparkConf
logger.conf.level = error
"""


@dataclass(frozen=True, slots=True)
class SparkSettings:
    """What a user may tune; defaults fit a laptop.  Memory strings use Spark's syntax (``512m``, ``2g``)."""

    master: str = "local[*]"
    driver_memory: str = "1g"
    executor_memory: str = "1g"
    shuffle_partitions: int = 8
    local_dir: str | None = None  # where shuffles spill; Spark's default (/tmp) when None
    app_name: str = "kraft-pipeline"
    extra: dict[str, str] = field(default_factory=dict)


def _log4j2_file() -> str:
    path = Path(tempfile.gettempdir()) / "kraft-pipeline-log4j2.properties"
    if not path.exists() or path.read_text() != _LOG4J2:
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(_LOG4J2)
        tmp.replace(path)
    return str(path)


@contextmanager
def _stderr_to(path: str | None) -> Iterator[None]:
    """Point file descriptor 2 at ``path`` while the block runs (None: leave it alone).

    The JVM inherits the descriptor when it is launched, so everything it and its Python workers print
    (the JVM's startup warnings, log4j output, worker tracebacks) goes to that file for good, while this
    process's own stderr is restored for kraft's one-line errors.
    """
    if path is None:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.dup2(target, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(target)


def spark_session(settings: SparkSettings | None = None, *, jvm_log_path: str | None = None) -> SparkSession:
    """Build (or return the running) SparkSession with kraft's defaults and data source registered.

    Memory settings only take effect when this call starts the JVM; a session that already runs in
    this process is reused as is (Spark allows one per process).  ``jvm_log_path``: send the JVM's
    stderr (Spark's logs) to this file instead of the terminal.
    """
    from pyspark.sql import SparkSession

    from kraft.pipeline.reader import register

    s = settings or SparkSettings()
    # pyspark 4.3 warns on every pandas conversion that pandas 3 is "not fully supported"; kraft only
    # converts small aggregated frames, which works, so keep the warning out of users' terminals.
    warnings.filterwarnings(
        "ignore", message="PySpark does not yet fully support pandas", category=FutureWarning
    )
    # Executors must run this interpreter (the one with kraft, pyarrow installed), not whatever
    # `python3` is first on PATH.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    log_conf = f"-Dlog4j2.configurationFile=file:{_log4j2_file()}"
    builder = (
        SparkSession.builder.master(s.master)
        .appName(s.app_name)
        .config("spark.driver.memory", s.driver_memory)
        .config("spark.executor.memory", s.executor_memory)
        .config("spark.driver.extraJavaOptions", log_conf)
        .config("spark.executor.extraJavaOptions", log_conf)
        .config("spark.sql.shuffle.partitions", str(s.shuffle_partitions))
        .config("spark.default.parallelism", str(s.shuffle_partitions))
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.adaptive.enabled", "true")
        .config("spark.pyspark.python", sys.executable)
        .config("spark.sql.session.timeZone", "UTC")
    )
    if s.local_dir:
        builder = builder.config("spark.local.dir", s.local_dir)
    for key, value in s.extra.items():
        builder = builder.config(key, value)
    with _stderr_to(jvm_log_path):
        spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("WARN")
    register(spark)
    return spark
