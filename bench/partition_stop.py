"""Broker stop/start cost with many partitions: closing and reopening N partition logs (issue #19).

A broker with 1-2k partitions took 7-26 s to exit after SIGTERM, and ~5 s to load before it registered
after kill -9.  This measures the storage part of both, the way the broker does it
(:func:`kraft.broker.segmented_partition_log.segmented_log_opener`, one directory per partition):

- **close**: N logs, each with one small flushed batch (an idle partition), closed one after another
  (``PartitionManager.close``); ``fsyncs_per_partition`` counts ``os.fsync``/``os.fdatasync`` calls;
- **open_clean**: reopening them after that clean close (clean-shutdown marker present);
- **open_after_crash**: reopening after a "kill -9" (logs abandoned: no marker, recovery from the
  recovery point), what a broker does before it registers.

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

from kraft.broker.partition_log import PartitionLog
from kraft.broker.segmented_partition_log import segmented_log_opener
from kraft.storage.batch import build_batch

SEGMENT_BYTES = 1024 * 1024 * 1024
TARGET_S = 2.0


@contextmanager
def counting_fsyncs() -> Iterator[dict[str, int]]:
    """Count os.fsync / os.fdatasync calls made inside the block."""
    counts = {"fsync": 0, "fdatasync": 0}
    real_fsync, real_fdatasync = os.fsync, os.fdatasync

    def fsync(fd: Any) -> None:
        counts["fsync"] += 1
        real_fsync(fd)

    def fdatasync(fd: Any) -> None:
        counts["fdatasync"] += 1
        real_fdatasync(fd)

    os.fsync, os.fdatasync = fsync, fdatasync
    try:
        yield counts
    finally:
        os.fsync, os.fdatasync = real_fsync, real_fdatasync


def _timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
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


def _close_all(logs: list[PartitionLog]) -> None:
    for log in logs:
        log.close()


def run(partitions: int, root: Path) -> dict[str, object]:
    opener = segmented_log_opener(SEGMENT_BYTES)
    dirs = [root / f"topic-{i}" for i in range(partitions)]
    batch = build_batch(0, [(b"k", b"v" * 100)], leader_epoch=0, timestamp_ms=1_700_000_000_000)

    logs: list[PartitionLog] = []
    for path in dirs:
        log = opener(path)
        log.append_batches(batch)
        log.flush()
        logs.append(log)

    with counting_fsyncs() as counts:
        close_s = _timed(lambda: _close_all(logs))
    fsyncs = counts["fsync"] + counts["fdatasync"]

    reopened: list[PartitionLog] = []
    open_clean_s = _timed(lambda: reopened.extend(opener(path) for path in dirs))
    for log in reopened:
        log.close()

    # "kill -9": open, then drop without closing (no clean-shutdown marker, nothing written at close).
    crashed = [opener(path) for path in dirs]
    for log in crashed:
        abandon = getattr(getattr(log, "_log", None), "abandon", None)
        if callable(abandon):
            abandon()
    recovered: list[PartitionLog] = []
    open_crash_s = _timed(lambda: recovered.extend(opener(path) for path in dirs))

    # Where a close spends its time (the same close again, profiled).
    close_profile = _top_functions(lambda: _close_all(recovered))
    return {
        "partitions": partitions,
        "close_s": round(close_s, 3),
        "close_ms_per_partition": round(close_s * 1000 / partitions, 3),
        "fsyncs_per_partition": round(fsyncs / partitions, 2),
        "fsync_calls": counts["fsync"],
        "fdatasync_calls": counts["fdatasync"],
        "open_clean_s": round(open_clean_s, 3),
        "open_after_crash_s": round(open_crash_s, 3),
        "close_within_target": close_s <= TARGET_S,
        "open_after_crash_within_target": open_crash_s <= TARGET_S,
        "close_profile_top_tottime": close_profile,
    }


def main() -> dict[str, object]:
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
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "tmp": str(root.parent)},
        "target_s": TARGET_S,
        "result": result,
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
