"""Pipeline benchmark: exact Spark compaction of a large partition log under a small memory cap.

What is measured (results in ``bench/results/pipeline.json``):

- input: one partition log written through ``kraft.storage`` (batches of 1,000 records, 128 MiB segments):
  ``--records`` records (default 10 M) whose keys are drawn uniformly from ``--key-space`` keys (default
  7 M, so about 5.3 M distinct keys survive), 2 % tombstones, timestamps 10 ms apart per batch;
- compaction: ``kraft.pipeline.compaction.compact`` in local mode (``local[2]``) with the driver JVM —
  which hosts the executors in local mode — capped at ``--driver-memory`` (default 512m: Spark's unified
  execution memory is then about (512 - 300) x 0.6 ≈ 127 MiB for both tasks together, while a key → offset
  map of the distinct keys would need several hundred MiB as a Java or Python hash map); records/s =
  input records / wall time of the compaction call;
- peak memory: proportional set size (PSS) of this process and every descendant (the JVM and Spark's
  Python workers), sampled every 200 ms; peak bytes in the Spark local dir (shuffle files and spills);
- verification: the output is opened with ``kraft.storage.SegmentedLog`` (every batch CRC-checked, no
  truncation, same start/end offsets), then compared with an independent Spark computation on the input
  (newest row per key by one SQL ``max_by`` aggregation, minus old tombstones): row count, offset range
  and the sum of 64-bit xxhash64 row hashes over (offset, timestamp, key, value) must be equal, and the
  output must hold as many distinct keys as rows.

Run: ``python -m bench.pipeline [--quick]`` (``--quick``: 1 M records, 700 k keys).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "pipeline.json"
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from kraft.pipeline.compaction import CompactionOptions, compact  # noqa: E402
from kraft.pipeline.reader import read_logs  # noqa: E402
from kraft.pipeline.session import SparkSettings, spark_session  # noqa: E402
from kraft.procutil import reap_children_on_exit  # noqa: E402
from kraft.storage.batch import build_batch  # noqa: E402
from kraft.storage.log import LogConfig, SegmentedLog  # noqa: E402

TOPIC = "bench"
RECORDS_PER_BATCH = 1_000
BATCH_STEP_MS = 10
T0_MS = 1_700_000_000_000
TOMBSTONE_RATE = 0.02
RETENTION_MS = 30_000


def generate(partition_dir: Path, records: int, key_space: int, seed: int) -> dict[str, Any]:
    """Write the input log with kraft's SegmentedLog; returns its size and timing."""
    started = time.monotonic()
    rng = random.Random(seed)
    randrange = rng.randrange
    rand = rng.random
    value = b"v" * 24
    log = SegmentedLog.open(partition_dir, LogConfig(segment_bytes=128 << 20))
    try:
        offset = 0
        batch_index = 0
        while offset < records:
            count = min(RECORDS_PER_BATCH, records - offset)
            batch = [
                (b"key-%010d" % randrange(key_space), None if rand() < TOMBSTONE_RATE else value)
                for _ in range(count)
            ]
            data = build_batch(
                offset,
                batch,
                leader_epoch=1 + batch_index // 2_000,
                timestamp_ms=T0_MS + batch_index * BATCH_STEP_MS,
            )
            log.append_batch(data, validate=False)
            offset += count
            batch_index += 1
        log.flush()
        size = log.size_in_bytes
        segments = len(log.segments())
    finally:
        log.close()
    return {"seconds": round(time.monotonic() - started, 1), "bytes": size, "segments": segments}


class PeakSampler:
    """Samples RSS of this process tree and the size of a directory tree until stopped."""

    def __init__(self, spill_dir: Path, interval_s: float = 0.2) -> None:
        self.spill_dir = spill_dir
        self.interval_s = interval_s
        self.peak_rss_bytes = 0
        self.peak_jvm_rss_bytes = 0
        self.peak_python_workers_rss_bytes = 0
        self.peak_spill_bytes = 0
        self._cpu_ticks: dict[int, int] = {}  # pid → newest utime + stime seen (clock ticks)
        self._baseline: dict[int, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> PeakSampler:
        # CPU is counted from here on: remember what the tree (JVM startup, …) had already used.
        for pid in self._tree_pids():
            self._record_cpu(pid)
        self._baseline = dict(self._cpu_ticks)
        self._thread.start()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    @staticmethod
    def _children() -> dict[int, list[int]]:
        tree: dict[int, list[int]] = {}
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as handle:
                    fields = handle.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            tree.setdefault(int(fields[1]), []).append(int(entry))
        return tree

    @staticmethod
    def _rss(pid: int) -> tuple[int, str]:
        """Proportional set size (PSS): Spark's forked Python workers share pages with their daemon, and
        summing plain RSS would count those pages once per worker."""
        try:
            with open(f"/proc/{pid}/smaps_rollup") as handle:
                rollup = handle.read()
            with open(f"/proc/{pid}/comm") as handle:
                name = handle.read().strip()
        except OSError:
            return 0, ""
        for line in rollup.splitlines():
            if line.startswith("Pss:"):
                return int(line.split()[1]) * 1024, name
        return 0, name

    @property
    def cpu_seconds(self) -> float:
        """CPU time of the process tree while sampling (processes that exited keep their last sample)."""
        used = sum(ticks - self._baseline.get(pid, 0) for pid, ticks in self._cpu_ticks.items())
        return used / os.sysconf("SC_CLK_TCK")

    def _tree_pids(self) -> list[int]:
        tree = self._children()
        found: list[int] = []
        pending = [os.getpid()]
        while pending:
            pid = pending.pop()
            found.append(pid)
            pending.extend(tree.get(pid, []))
        return found

    def _record_cpu(self, pid: int) -> None:
        try:
            with open(f"/proc/{pid}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            return
        # After the ")" field 0 is the state (field 3 of stat); utime and stime are fields 14 and 15.
        self._cpu_ticks[pid] = int(fields[11]) + int(fields[12])

    def _dir_bytes(self) -> int:
        total = 0
        for root, _dirs, files in os.walk(self.spill_dir):
            for name in files:
                with contextlib.suppress(OSError):  # a shuffle file deleted under our feet
                    total += os.path.getsize(os.path.join(root, name))
        return total

    def _run(self) -> None:
        me = os.getpid()
        while not self._stop.wait(self.interval_s):
            total = jvm = workers = 0
            for pid in self._tree_pids():
                rss, name = self._rss(pid)
                self._record_cpu(pid)
                total += rss
                if name == "java":
                    jvm += rss
                elif pid != me and name.startswith("python"):
                    workers += rss
            self.peak_rss_bytes = max(self.peak_rss_bytes, total)
            self.peak_jvm_rss_bytes = max(self.peak_jvm_rss_bytes, jvm)
            self.peak_python_workers_rss_bytes = max(self.peak_python_workers_rss_bytes, workers)
            self.peak_spill_bytes = max(self.peak_spill_bytes, self._dir_bytes())


def _checksum(df: Any) -> tuple[int, int, int, int]:
    """(rows, min offset, max offset, sum of 64-bit row hashes): an order-free fingerprint of rows."""
    from pyspark.sql import functions as F

    row_hash = F.xxhash64("offset", "timestamp_ms", "key", "value").cast("decimal(38,0)")
    row = df.agg(F.count(F.lit(1)), F.min("offset"), F.max("offset"), F.sum(row_hash)).first()
    return int(row[0]), int(row[1] or -1), int(row[2] or -1), int(row[3] or 0)


def verify(spark: Any, in_dir: Path, out_dir: Path, retention_ms: int, records_out: int) -> dict[str, Any]:
    """Exact comparison of the output with an independent Spark computation over the input."""
    from pyspark.sql import functions as F

    started = time.monotonic()
    log = SegmentedLog.open(out_dir / f"{TOPIC}-0", create=False)
    try:
        storage_ok = log.recovered_bytes_truncated == 0
        out_range = (log.start_offset, log.end_offset)
    finally:
        log.close()
    columns = "offset,timestamp_ms,key,value"
    source = read_logs(spark, str(in_dir), columns=columns, include_snapshots=False)
    stats = source.agg(F.min("offset"), F.max("offset"), F.max("timestamp_ms")).first()
    assert stats is not None
    horizon = int(stats[2]) - retention_ms
    # Independent of the pipeline's code path: newest row per key by one SQL aggregation over the input.
    newest = (
        source.where(F.col("key").isNotNull())
        .groupBy("key")
        .agg(F.max_by(F.struct("offset", "timestamp_ms", "value"), "offset").alias("row"))
        .select("key", "row.offset", "row.timestamp_ms", "row.value")
    )
    expected = newest.where(~(F.col("value").isNull() & (F.col("timestamp_ms") < F.lit(horizon))))
    output = read_logs(spark, str(out_dir), columns=columns, include_snapshots=False)
    expected_sum = _checksum(expected)
    output_sum = _checksum(output)
    distinct_keys_out = output.select("key").distinct().count()
    same_range = out_range == (int(stats[0]), int(stats[1]) + 1)
    return {
        "seconds": round(time.monotonic() - started, 1),
        "storage_opens_without_truncation": storage_ok,
        "same_start_and_end_offsets": same_range,
        "expected_fingerprint": list(expected_sum),
        "output_fingerprint": list(output_sum),
        "output_distinct_keys": distinct_keys_out,
        "ok": storage_ok
        and same_range
        and expected_sum == output_sum
        and output_sum[0] == records_out == distinct_keys_out,
    }


def run(
    records: int, key_space: int, driver_memory: str, master: str, work_dir: Path, seed: int
) -> dict[str, Any]:
    in_dir = work_dir / "in"
    out_dir = work_dir / "out"
    spill_dir = work_dir / "spark-local"
    spill_dir.mkdir(parents=True, exist_ok=True)
    print(f"generating {records:,} records over {key_space:,} keys in {in_dir}", flush=True)
    generated = generate(in_dir / f"{TOPIC}-0", records, key_space, seed)
    print(f"generated {generated}", flush=True)
    settings = SparkSettings(
        master=master,
        driver_memory=driver_memory,
        executor_memory=driver_memory,
        shuffle_partitions=16,
        local_dir=str(spill_dir),
        app_name="kraft-bench-pipeline",
    )
    spark = spark_session(settings, jvm_log_path=str(work_dir / "spark.log"))
    try:
        options = CompactionOptions(tombstone_retention_ms=RETENTION_MS, segment_bytes=128 << 20)
        with PeakSampler(spill_dir) as sampler:
            started = time.monotonic()
            report = compact(spark, str(in_dir), str(out_dir), options)
            compact_s = time.monotonic() - started
        totals = report.to_json()["totals"]
        print(f"compacted in {compact_s:.1f} s: {totals}", flush=True)
        verification = verify(spark, in_dir, out_dir, RETENTION_MS, int(totals["records_out"]))
        print(f"verification {verification}", flush=True)
    finally:
        spark.stop()
    mib = 1 << 20
    distinct = int(totals["distinct_keys"])
    return {
        "benchmark": "pipeline.compaction",
        "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version(), "machine": platform.machine()},
        "params": {
            "records": records,
            "key_space": key_space,
            "master": master,
            "driver_memory": driver_memory,
            "records_per_batch": RECORDS_PER_BATCH,
            "tombstone_rate": TOMBSTONE_RATE,
            "tombstone_retention_ms": RETENTION_MS,
            "seed": seed,
        },
        "input": generated,
        "result": {
            "compact_seconds": round(compact_s, 1),
            "records_per_second": round(records / compact_s),
            # Wall time depends on how busy the shared machine is; CPU time of the process tree does not.
            "cpu_seconds_process_tree": round(sampler.cpu_seconds, 1),
            "records_per_cpu_second": round(records / max(sampler.cpu_seconds, 0.001)),
            "load_average_1m_at_end": round(os.getloadavg()[0], 1),
            "totals": totals,
            "peak_pss_mib_process_tree": round(sampler.peak_rss_bytes / mib),
            "peak_pss_mib_jvm": round(sampler.peak_jvm_rss_bytes / mib),
            "peak_pss_mib_python_workers": round(sampler.peak_python_workers_rss_bytes / mib),
            "peak_shuffle_and_spill_mib_on_disk": round(sampler.peak_spill_bytes / mib),
            # What an in-memory key → newest-offset map would need for these keys, for comparison:
            "key_map_estimate_mib": {
                "kafka_style_md5_and_offset_24_bytes_per_key": round(distinct * 24 / mib),
                "python_dict_bytes_key_int_offset": round(distinct * 160 / mib),
            },
        },
        "verification": verification,
    }


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.pipeline", description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--key-space", type=int, default=7_000_000)
    parser.add_argument("--driver-memory", default="512m")
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--work-dir", type=Path, default=None, help="default: a temp dir, deleted after")
    parser.add_argument("--quick", action="store_true", help="1 M records over 700 k keys")
    parser.add_argument("--no-save", action="store_true", help="do not write bench/results/pipeline.json")
    args = parser.parse_args(argv)
    records, key_space = (1_000_000, 700_000) if args.quick else (args.records, args.key_space)
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="kraft-bench-pipeline-"))
    try:
        result = run(records, key_space, args.driver_memory, args.master, work_dir, args.seed)
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    text = json.dumps(result, indent=2)
    print(text)
    if not args.no_save:
        RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
        RESULTS_PATH.write_text(text + "\n")
    return 0 if result["verification"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
