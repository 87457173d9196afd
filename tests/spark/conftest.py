"""One local SparkSession for the whole test session (starting a JVM costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

from kraft.pipeline.session import SparkSettings, spark_session  # noqa: E402

# The tests' JVM lives a few minutes and runs tiny jobs on a shared 2-core host: the C2 compiler's work
# never pays back there, nor do parallel GC threads.  C1 only and the serial collector change how fast
# the JVM runs, not what a job computes (session 21: a JVM start and six small compactions took 38-42 s
# instead of 57-73 s, 2 alternated pairs).
# ``defaultJavaOptions`` is prepended to the ``extraJavaOptions`` kraft sets (its log4j2 file).
TEST_JVM_OPTIONS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    settings = SparkSettings(
        master="local[2]",
        driver_memory="768m",
        shuffle_partitions=2,
        local_dir=str(tmp_path_factory.mktemp("spark-local")),
        app_name="kraft-tests",
        extra={"spark.driver.defaultJavaOptions": TEST_JVM_OPTIONS},
    )
    session = spark_session(settings)
    try:
        yield session
    finally:
        session.stop()
