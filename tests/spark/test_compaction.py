"""Spark compaction equals an in-memory reference, and its output is a valid kraft / Kafka log."""

from __future__ import annotations

import itertools
import json
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pyspark.sql import SparkSession
from spark_log_builders import BatchSpec, Written, parse_with_kafka_python, write_partition

from kraft.errors import KraftError
from kraft.pipeline.compaction import REPORT_FILE, CompactionOptions, compact
from kraft.pipeline.reader import read_logs
from kraft.storage.log import SegmentedLog

pytestmark = pytest.mark.spark

Expected = list[tuple[int, int, bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]]


def reference_compaction(written: list[Written], retention_ms: int) -> Expected:
    """The obvious in-memory algorithm: newest record per key; old tombstones and keyless records go."""
    data = [w for w in written if not w.is_control]
    if not data and not written:
        return []
    newest: dict[bytes, Written] = {}
    for w in data:
        if w.key is not None:
            newest[w.key] = w
    horizon = max(w.timestamp_ms for w in written) - retention_ms
    kept = [w for w in newest.values() if not (w.value is None and w.timestamp_ms < horizon)]
    return sorted((w.offset, w.timestamp_ms, w.key, w.value, w.headers) for w in kept)


def check_output(out_dir: Path, written: list[Written], retention_ms: int) -> None:
    expected = reference_compaction(written, retention_ms)
    batches = parse_with_kafka_python(out_dir)
    got = [r for b in batches for r in b.records]
    assert got == expected
    # batches chain exactly and span the input's offsets: no offset is lost or reused
    assert batches[0].base_offset == written[0].offset
    assert batches[-1].last_offset == written[-1].offset
    for before, after in itertools.pairwise(batches):
        assert after.base_offset == before.last_offset + 1
    # and kraft's own storage opens it without truncating anything
    copy = out_dir.parent / (out_dir.name + "-opened")
    shutil.copytree(out_dir, copy)
    log = SegmentedLog.open(copy, create=False)
    try:
        assert log.recovered_bytes_truncated == 0
        assert (log.start_offset, log.end_offset) == (written[0].offset, written[-1].offset + 1)
    finally:
        log.close()


record = st.tuples(
    st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d", b"e", b"f"])).filter(lambda k: True),
    st.one_of(st.none(), st.binary(min_size=0, max_size=6)),
    st.one_of(st.just(()), st.just((("h", b"1"),))),
)
batch = st.tuples(
    st.lists(record, min_size=1, max_size=4),
    st.integers(min_value=0, max_value=400),  # timestamp step
    st.booleans(),  # roll before
    st.integers(min_value=0, max_value=9),  # 0 = control batch instead
)


def _specs(
    raw: list[tuple[list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]], int, bool, int]],
) -> list[BatchSpec]:
    specs: list[BatchSpec] = []
    ts = 1_000
    epoch = 0
    for records, step, roll, control in raw:
        ts += step
        if control == 0:
            epoch += 1
            specs.append(BatchSpec((), ts, epoch, roll_before=roll, control_leader=1))
        else:
            specs.append(BatchSpec(tuple(records), ts, epoch, roll_before=roll))
    return specs


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    partitions=st.lists(st.lists(batch, min_size=1, max_size=12), min_size=1, max_size=2),
    retention_ms=st.sampled_from([0, 300, 10_000_000]),
    task_bytes=st.sampled_from([150, 400, 1 << 20]),
)
def test_compaction_equals_in_memory_reference(
    spark: SparkSession,
    tmp_path_factory: pytest.TempPathFactory,
    partitions: list[
        list[tuple[list[tuple[bytes | None, bytes | None, tuple[tuple[str, bytes], ...]]], int, bool, int]]
    ],
    retention_ms: int,
    task_bytes: int,
) -> None:
    root = tmp_path_factory.mktemp("in")
    out = tmp_path_factory.mktemp("out")
    written = {p: write_partition(root, "compacted", p, _specs(raw)) for p, raw in enumerate(partitions)}
    options = CompactionOptions(
        tombstone_retention_ms=retention_ms,
        task_bytes=task_bytes,
        checkpoint_bytes=64,
        segment_bytes=300,
        batch_records=3,
    )
    report = compact(spark, str(root), str(out), options)
    for p, records in written.items():
        check_output(out / f"compacted-{p}", records, retention_ms)
    keyed = [w for ws in written.values() for w in ws if not w.is_control and w.key is not None]
    totals = report.to_json()["totals"]
    assert totals["records_in"] == sum(len(ws) for ws in written.values())
    assert totals["distinct_keys"] == len({(w.partition, w.key) for w in keyed})
    assert totals["keyless_records"] == sum(
        1 for ws in written.values() for w in ws if not w.is_control and w.key is None
    )
    assert totals["records_out"] == sum(
        len(reference_compaction(ws, retention_ms)) for ws in written.values()
    )
    assert bool(report.errors) == (totals["keyless_records"] > 0)


def test_compaction_report_and_reader_agree_on_a_fixed_log(spark: SparkSession, tmp_path: Path) -> None:
    written = write_partition(
        tmp_path / "in",
        "users",
        0,
        [
            BatchSpec(((b"u1", b"v1", ()), (b"u2", b"v1", ()), (None, b"orphan", ())), 1_000),
            BatchSpec(((b"u1", b"v2", ()), (b"u3", None, ())), 2_000, roll_before=True),
            BatchSpec(((b"u2", None, ()),), 9_000),
        ],
    )
    out = tmp_path / "out"
    report = compact(spark, str(tmp_path / "in"), str(out), CompactionOptions(tombstone_retention_ms=5_000))
    rows = read_logs(spark, str(out)).orderBy("offset").collect()
    assert [(r["offset"], r["key"], r["value"]) for r in rows] == [(3, b"u1", b"v2"), (5, b"u2", None)]
    part = report.partitions[0]
    assert (part.records_in, part.distinct_keys, part.records_out) == (6, 3, 2)
    assert (part.tombstones_dropped, part.tombstones_kept, part.keyless_records) == (1, 1, 1)
    assert part.keyless_first_offset == 2
    assert part.bytes_saved == part.bytes_in - part.bytes_out > 0
    saved = json.loads((out / REPORT_FILE).read_text())
    assert saved["totals"]["records_out"] == 2
    assert "without a key" in saved["errors"][0]
    check_output(out / "users-0", written, 5_000)


def test_compaction_refuses_a_non_empty_output_and_duplicate_partitions(
    spark: SparkSession, tmp_path: Path
) -> None:
    write_partition(tmp_path / "in" / "b1", "t", 0, [BatchSpec(((b"k", b"v", ()),), 1)])
    out = tmp_path / "out"
    compact(spark, str(tmp_path / "in"), str(out))
    with pytest.raises(KraftError, match="already holds segments"):
        compact(spark, str(tmp_path / "in"), str(out))
    write_partition(tmp_path / "in" / "b2", "t", 0, [BatchSpec(((b"k", b"v", ()),), 1)])
    with pytest.raises(KraftError, match="appears twice"):
        compact(spark, str(tmp_path / "in"), str(tmp_path / "out2"))
