"""Broker stop/start cost with many partitions: closing and reopening N partition logs (issue #19).

A broker with 1-2k partitions took 7-26 s to exit after SIGTERM, and ~5 s to load before it registered
after kill -9.  This measures the storage part of both, the way the broker does it
(:func:`kraft.broker.segmented_partition_log.segmented_log_opener`, one directory per partition):

- **close**, as ``PartitionManager.close`` does it (all logs together:
  :func:`kraft.storage.log.close_logs`), in three states: ``close_after_writes`` (new logs, one flushed
  batch each: every index and checkpoint changed), ``close_idle`` (reopened, nothing written) and
  ``close_with_unflushed_appends`` (one unflushed batch each: produce traffic at SIGTERM);
  ``syncs_per_partition`` counts ``os.fsync``/``os.fdatasync``/``syncfs`` calls; ``close_s`` is the
  slowest of the three;
- **open_clean**: reopening them after a clean close (clean-shutdown marker present);
- **open_after_crash**: reopening after a "kill -9" with an unflushed batch per log (no marker, a
  recovery scan of each active segment), what a broker does before it registers;
- ``close_one_by_one_after_recovery``: each log's ``close()`` on its own (the protocol for a single log,
  e.g. the metadata log), for comparison.

Targets (issue #19): close ≤ 2 s and open after a crash ≤ 2 s for 2,000 partitions.  The tmp dir is the
one of ``tempfile`` (``TMPDIR``): put it on the disk a broker would use.

Run: ``python -m bench.partition_stop [--quick]`` (``--quick``: 500 partitions instead of 2,000); the
JSON goes to ``bench/results/partition_stop.json``.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import platform
import pstats
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from kraft.broker.partition_log import PartitionLog, PartitionLogOpener
from kraft.broker.segmented_partition_log import (
    close_partition_logs,
    segmented_log_opener,
    sync_recovered_partition_logs,
)
from kraft.procutil import reap_children_on_exit
from kraft.storage import fileio
from kraft.storage.batch import build_batch

SEGMENT_BYTES = 1024 * 1024 * 1024
TARGET_S = 2.0


@contextmanager
def counting_fsyncs() -> Iterator[dict[str, int]]:
    """Count os.fsync / os.fdatasync and syncfs calls made inside the block."""
    counts = {"fsync": 0, "fdatasync": 0, "syncfs": 0}
    real_fsync, real_fdatasync = os.fsync, os.fdatasync
    real_syncfs = fileio._SYNCFS

    def syncfs(fd: int) -> int:
        counts["syncfs"] += 1
        assert real_syncfs is not None
        return real_syncfs(fd)

    def fsync(fd: Any) -> None:
        counts["fsync"] += 1
        real_fsync(fd)

    def fdatasync(fd: Any) -> None:
        counts["fdatasync"] += 1
        real_fdatasync(fd)

    os.fsync, os.fdatasync = fsync, fdatasync
    if real_syncfs is not None:
        fileio._SYNCFS = syncfs
    try:
        yield counts
    finally:
        os.fsync, os.fdatasync = real_fsync, real_fdatasync
        fileio._SYNCFS = real_syncfs


_cpu: list[float] = [0.0]


def _timed(action: Callable[[], object]) -> float:
    """Wall seconds of ``action``; its CPU seconds (this process, every thread) go to ``_cpu[0]``: on a
    shared machine the wall time includes waiting for a core, the CPU time does not."""
    started, cpu = time.perf_counter(), time.process_time()
    action()
    _cpu[0] = time.process_time() - cpu
    return time.perf_counter() - started


def _top_functions(action: Callable[[], object], limit: int = 8) -> list[str]:
    profile = cProfile.Profile()
    profile.enable()
    action()
    profile.disable()
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(limit)
    lines = [line.strip() for line in out.getvalue().splitlines()]
    header = next(i for i, line in enumerate(lines) if line.startswith("ncalls"))
    return [line for line in lines[header + 1 :] if line][:limit]


def _close_one_by_one(logs: list[PartitionLog]) -> None:
    for log in logs:
        log.close()


def _close(logs: list[PartitionLog]) -> dict[str, float]:
    """Close as the broker does (``PartitionManager.close``: all together); time and sync calls."""
    with counting_fsyncs() as counts:
        seconds = _timed(lambda: close_partition_logs(logs))
    partitions = len(logs)
    syncs = counts["fsync"] + counts["fdatasync"] + counts["syncfs"]
    return {
        "s": round(seconds, 3),
        "ms_per_partition": round(seconds * 1000 / partitions, 3),
        "cpu_s": round(_cpu[0], 3),
        "syncs_per_partition": round(syncs / partitions, 3),
        "fsync_calls": counts["fsync"],
        "fdatasync_calls": counts["fdatasync"],
        "syncfs_calls": counts["syncfs"],
    }


def _open(opener: PartitionLogOpener, dirs: list[Path]) -> tuple[list[PartitionLog], dict[str, float]]:
    logs: list[PartitionLog] = []
    with counting_fsyncs() as counts:
        # As PartitionManager.open_to: open every log, then the deferred syncs of recovery, in parallel.
        def open_all() -> None:
            logs.extend(opener(path) for path in dirs)
            sync_recovered_partition_logs(logs)

        seconds = _timed(open_all)
    syncs = counts["fsync"] + counts["fdatasync"] + counts["syncfs"]
    return logs, {
        "s": round(seconds, 3),
        "cpu_s": round(_cpu[0], 3),
        "syncs_per_partition": round(syncs / len(dirs), 3),
    }


def _append_unflushed(logs: list[PartitionLog], batch: bytes) -> None:
    for log in logs:
        log.append_batches(batch_at(batch, log.log_end_offset))


def batch_at(batch: bytes, offset: int) -> bytes:
    """``batch`` moved to base offset ``offset`` (the base offset is outside the CRC)."""
    return offset.to_bytes(8, "big", signed=True) + batch[8:]


def run(partitions: int, root: Path) -> dict[str, object]:
    opener = segmented_log_opener(SEGMENT_BYTES)
    dirs = [root / f"topic-{i}" for i in range(partitions)]
    batch = build_batch(0, [(b"k", b"v" * 100)], leader_epoch=0, timestamp_ms=1_700_000_000_000)

    # 1. New logs, one flushed batch each: the close rewrites every index and checkpoint.
    logs = [opener(path) for path in dirs]
    for log in logs:
        log.append_batches(batch)
        log.flush()
    close_written = _close(logs)

    # 2. Clean reopen; then a close with nothing changed (idle partitions).
    logs, open_clean = _open(opener, dirs)
    close_idle = _close(logs)

    # 3. Clean reopen, one unflushed batch each (produce traffic at SIGTERM), close.
    logs, _ = _open(opener, dirs)
    _append_unflushed(logs, batch)
    close_dirty = _close(logs)

    # 4. "kill -9" under the same traffic: reopen, append unflushed, drop without closing (no marker),
    #    then the open a restarted broker does before it registers (a recovery scan per partition).
    logs, _ = _open(opener, dirs)
    _append_unflushed(logs, batch)
    for log in logs:
        abandon = getattr(getattr(log, "_log", None), "abandon", None)
        if callable(abandon):
            abandon()
    recovered, open_crash = _open(opener, dirs)

    # The old protocol for comparison: the same logs closed one by one (each its own barriers).
    with counting_fsyncs() as counts:
        one_by_one_s = _timed(lambda: _close_one_by_one(recovered))
    one_by_one_syncs = counts["fsync"] + counts["fdatasync"] + counts["syncfs"]
    logs, _ = _open(opener, dirs)
    close_profile = _top_functions(lambda: close_partition_logs(logs))
    close_s = max(close_written["s"], close_idle["s"], close_dirty["s"])
    return {
        "partitions": partitions,
        "close_after_writes": close_written,
        "close_idle": close_idle,
        "close_with_unflushed_appends": close_dirty,
        "close_one_by_one_after_recovery": {
            "s": round(one_by_one_s, 3),
            "syncs_per_partition": round(one_by_one_syncs / partitions, 3),
        },
        "open_clean": open_clean,
        "open_after_crash": open_crash,
        "close_s": close_s,
        "open_clean_s": open_clean["s"],
        "open_after_crash_s": open_crash["s"],
        "close_within_target": close_s <= TARGET_S,
        "open_clean_within_target": open_clean["s"] <= TARGET_S,
        "open_after_crash_within_target": open_crash["s"] <= TARGET_S,
        "close_profile_top_tottime": close_profile,
    }


def main() -> dict[str, object]:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="500 partitions instead of 2,000")
    parser.add_argument("--partitions", type=int, default=0, help="override the partition count")
    args = parser.parse_args()
    partitions = args.partitions or (500 if args.quick else 2000)
    root = Path(tempfile.mkdtemp(prefix="kraft-bench-partition-stop-"))
    try:
        result = run(partitions, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return {
        "benchmark": "partition_stop",
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "tmp": str(root.parent),
            "load_average_1m": round(os.getloadavg()[0], 1),
        },
        "target_s": TARGET_S,
        "result": result,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
