"""One local SparkSession for the whole test session (starting a JVM costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pyspark = pytest.importorskip("pyspark")

from pyspark.sql import SparkSession  # noqa: E402

from kraft.pipeline.session import SparkSettings, spark_session  # noqa: E402


@pytest.fixture(scope="session")
def spark(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SparkSession]:
    settings = SparkSettings(
        master="local[2]",
        driver_memory="768m",
        shuffle_partitions=2,
        local_dir=str(tmp_path_factory.mktemp("spark-local")),
        app_name="kraft-tests",
    )
    session = spark_session(settings)
    try:
        yield session
    finally:
        session.stop()
