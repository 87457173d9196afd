"""Storage benchmark: durable append throughput, recovery scan rate, index lookup cost.

What is measured (results in ``bench/results/storage.json``):

- **append**: ``SegmentedLog.append_batch`` (CRC-validating, the follower path) of pre-encoded 1 KiB,
  64 KiB and 1 MiB batches with one ``flush()`` (fsync) per batch, next to the floor of the same
  hardware measured in the same run: ``os.write`` + ``os.fsync`` of buffers of the same size to a plain
  file.  The two alternate operation by operation so noise from other processes hits both alike.
  Target: log ≥ 80 % of the floor at 64 KiB.  A third contender, ``log_preallocated``, is the same log
  with the metadata log's preallocation (zero-filled space ahead of the data, fdatasync that does not
  grow the file); ``preallocated_vs_floor`` is its ratio to the same floor.
- **recovery**: a log of ``KRAFT_BENCH_STORAGE_RECOVERY_MB`` MiB (default 1024) of 16 KiB batches is
  written and flushed, the process "crashes" (no clean-shutdown marker) and the recovery-point
  checkpoint is removed so the whole log is scanned (size, magic, CRC, continuity, index rebuild).
  Reported with the segment files in the page cache ("hot") and evicted from it with
  ``posix_fadvise(DONTNEED)`` ("cold"; only our files are evicted).  Target ≥ 500 MB/s.  Wall-clock and
  CPU-time rates are both reported: on a shared machine the wall clock mostly measures the run queue.
- **recovery after an unclean stop, full scan vs recovery-point scan**: a log of the same size,
  flushed (the recovery point follows the flushes), then an unflushed tail of ``UNFLUSHED_TAIL_MB`` is
  appended and the process "crashes".  Opened once with the ``recovery-point-offset-checkpoint`` removed
  (every segment scanned: what happened before the recovery point existed) and once with it (the
  segment holding the recovery point is CRC-scanned from the recovery point's batch on — below it only a
  header walk that rebuilds the indexes — and later segments wholly; older segments are trusted, their
  batches verified when read).  Both hot (page cache).  Run twice: with the default
  ``log.segment.bytes`` (1 GiB, so a 1 GiB log is one or two segments and the recovery point's segment
  is most of the log) and with ``RECOVERY_POINT_SEGMENT_MB`` segments.  Reported per open: ``seconds``,
  ``scanned_mb`` (the bytes the recovery CRC-checked, ``SegmentedLog.recovered_bytes_scanned``) and
  ``scanned_mb_per_s`` (scanned / seconds — the scan rate, never the whole log's size over a tail
  scan's time).
- **index lookup**: mean cost of ``OffsetIndex.lookup`` and of a whole ``SegmentedLog.read(offset, 1)``
  (lookup + header walk + pread) at random offsets of a 64 MiB log of 1 KiB batches.

Run: ``python -m bench.storage [--quick] [--only SECTION ...]`` (``--quick``: shorter rounds, 128 MiB
recovery log; ``--only``: run just those sections and merge them into the existing results file).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import random
import shutil
import struct
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

from kraft.procutil import reap_children_on_exit
from kraft.storage.batch import build_batch, with_base_offset
from kraft.storage.log import (
    METADATA_LOG_PREALLOCATE_BYTES,
    RECOVERY_POINT_FILE,
    LogConfig,
    SegmentedLog,
)

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "storage.json"
MIB = 1024 * 1024
BATCH_SIZES = {"1KiB": 1024, "64KiB": 64 * 1024, "1MiB": MIB}
_BASE_OFFSET = struct.Struct(">q")
RECORD_OVERHEAD = 80  # batch header + one record's framing, so the encoded batch is ~the nominal size


def _batch_of_size(size: int) -> bytes:
    payload = os.urandom(max(size - RECORD_OVERHEAD, 1))
    return build_batch(0, [(None, payload)], leader_epoch=1, timestamp_ms=int(time.time() * 1000))


def bench_append(root: Path, seconds_per_size: float) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, size in BATCH_SIZES.items():
        batch = _batch_of_size(size)
        directory = root / f"append-{label}"
        # Segments large enough that rolling is not part of this measurement.
        config = LogConfig(segment_bytes=1 << 30, max_batch_bytes=2 * MIB)
        log = SegmentedLog.open(directory / "log-0", config)
        preallocated = SegmentedLog.open(
            directory / "prealloc-0", replace(config, preallocate_bytes=METADATA_LOG_PREALLOCATE_BYTES)
        )
        raw_fd = os.open(directory / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

        def raw_op(fd: int = raw_fd, buf: bytes = batch) -> None:
            os.write(fd, buf)
            os.fsync(fd)

        rebased = bytearray(batch)

        def log_op(target: SegmentedLog, buf: bytearray = rebased) -> None:
            # Re-basing in place (the base offset is outside the CRC) keeps the benchmark's own copying
            # out of the measurement: what is timed is append_batch (CRC validation + write) + flush.
            _BASE_OFFSET.pack_into(buf, 0, target.end_offset)
            target.append_batch(buf)
            target.flush()

        # Alternate the two operation by operation (and swap which goes first) so that disk noise from
        # other processes and journal-commit timing hit both alike.
        ops: list[tuple[str, Callable[[], None]]] = [
            ("raw", raw_op),
            ("log", functools.partial(log_op, log)),
            ("log_preallocated", functools.partial(log_op, preallocated)),
        ]
        elapsed = dict.fromkeys((name for name, _op in ops), 0.0)
        count = 0
        deadline = time.perf_counter() + seconds_per_size
        try:
            while time.perf_counter() < deadline:
                shift = count % len(ops)
                for name, op in ops[shift:] + ops[:shift]:
                    started = time.perf_counter()
                    op()
                    elapsed[name] += time.perf_counter() - started
                count += 1
        finally:
            os.close(raw_fd)
            log.close()
            preallocated.close()
        entry: dict[str, Any] = {"batch_bytes": len(batch), "batches_each": count}
        for name, seconds in elapsed.items():
            entry[name] = {
                "batches_per_s": round(count / seconds, 1),
                "mb_per_s": round(count * len(batch) / seconds / 1e6, 2),
                "mean_latency_ms": round(seconds / count * 1000, 3),
            }
        floor = max(entry["raw"]["mb_per_s"], 1e-9)
        entry["log_vs_floor"] = round(entry["log"]["mb_per_s"] / floor, 3)
        entry["preallocated_vs_floor"] = round(entry["log_preallocated"]["mb_per_s"] / floor, 3)
        results[label] = entry
    return results


def _evict(directory: Path) -> None:
    for path in directory.glob("*.log"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _timed_recovery(directory: Path, config: LogConfig, size: int) -> tuple[dict[str, float], int]:
    (directory / RECOVERY_POINT_FILE).unlink()
    started = time.perf_counter()
    cpu_started = time.process_time()
    log = SegmentedLog.open(directory, config)
    elapsed = time.perf_counter() - started
    cpu = time.process_time() - cpu_started
    end = log.end_offset
    log.abandon()  # stay "crashed" so the next run scans again
    # CPU time is reported too: on a shared machine the wall clock mostly measures the run queue.
    return {
        "seconds": round(elapsed, 3),
        "mb_per_s": round(size / elapsed / 1e6, 1),
        "cpu_seconds": round(cpu, 3),
        "mb_per_cpu_s": round(size / max(cpu, 1e-9) / 1e6, 1),
    }, end


def bench_recovery(root: Path, total_mb: int) -> dict[str, Any]:
    config = LogConfig(segment_bytes=256 * MIB)
    directory = root / "recovery-0"
    batch = _batch_of_size(16 * 1024)
    log = SegmentedLog.open(directory, config)
    count = total_mb * MIB // len(batch)
    started = time.perf_counter()
    for _ in range(count):
        log.append_batch(with_base_offset(batch, log.end_offset), validate=False)
    log.flush()
    write_s = time.perf_counter() - started
    size = log.size_in_bytes
    expected_end = log.end_offset
    log.abandon()
    results: dict[str, Any] = {
        "log_bytes": size,
        "batches": count,
        "batch_bytes": len(batch),
        "segments": len(list(directory.glob("*.log"))),
        "write_and_flush_mb_per_s": round(size / write_s / 1e6, 1),
    }
    for label in ("hot", "hot_again", "cold"):
        if label == "cold":
            _evict(directory)
        results[label], end = _timed_recovery(directory, config, size)
        if end != expected_end:
            raise RuntimeError(f"recovery lost data: end {end}, expected {expected_end}")
    return results


RECOVERY_POINT_SEGMENT_MB = 64
UNFLUSHED_TAIL_MB = 4
DEFAULT_SEGMENT_BYTES = 1 << 30  # log.segment.bytes' default (Kafka's)


def _timed_open(directory: Path, config: LogConfig) -> tuple[float, int, int, int]:
    """(seconds, end offset, size, bytes the recovery CRC-checked) of one open."""
    started = time.perf_counter()
    log = SegmentedLog.open(directory, config)
    elapsed = time.perf_counter() - started
    end, size, scanned = log.end_offset, log.size_in_bytes, log.recovered_bytes_scanned
    log.abandon()
    return elapsed, end, size, scanned


def _recovery_point_case(root: Path, total_mb: int, segment_bytes: int) -> dict[str, Any]:
    config = LogConfig(segment_bytes=segment_bytes)
    directory = root / f"recovery-point-{segment_bytes}-0"
    batch = _batch_of_size(16 * 1024)
    log = SegmentedLog.open(directory, config)
    for _ in range(total_mb * MIB // len(batch)):
        log.append_batch(with_base_offset(batch, log.end_offset), validate=False)
        if log.end_offset % 64 == 0:
            log.flush()  # the recovery point advances with the flushes (after rolls / every 1 MiB)
    log.flush()
    recovery_point = log.recovery_point
    for _ in range(UNFLUSHED_TAIL_MB * MIB // len(batch)):
        log.append_batch(with_base_offset(batch, log.end_offset), validate=False)
    expected_end, size = log.end_offset, log.size_in_bytes
    log.abandon()  # crash: the tail was written but never flushed (it is in the page cache)
    checkpoint = (directory / RECOVERY_POINT_FILE).read_bytes()
    results: dict[str, Any] = {
        "log_mb": round(size / 1e6, 1),
        "segment_bytes": segment_bytes,
        "segments": len(list(directory.glob("*.log"))),
        "recovery_point": recovery_point,
        "unflushed_tail_mb": round(UNFLUSHED_TAIL_MB * MIB / 1e6, 1),
    }
    for label in ("full_scan", "recovery_point_scan"):
        if label == "full_scan":
            (directory / RECOVERY_POINT_FILE).unlink()
        else:
            (directory / RECOVERY_POINT_FILE).write_bytes(checkpoint)
        seconds, end, _, scanned = _timed_open(directory, config)
        if end != expected_end:
            raise RuntimeError(f"recovery lost data: end {end}, expected {expected_end}")
        results[label] = {
            "seconds": round(seconds, 3),
            "scanned_mb": round(scanned / 1e6, 1),
            "scanned_mb_per_s": round(scanned / seconds / 1e6, 1),
        }
        # Every open ends with the recovery point at the end: put the crash state back for the next.
        (directory / RECOVERY_POINT_FILE).write_bytes(checkpoint)
    results["speedup"] = round(results["full_scan"]["seconds"] / results["recovery_point_scan"]["seconds"], 1)
    shutil.rmtree(directory)  # the next case needs the disk space (and the page cache)
    return results


def bench_recovery_point(root: Path, total_mb: int) -> dict[str, Any]:
    """Unclean stop with an unflushed tail: full scan vs a scan from the recovery point's segment, with
    the default segment size and with small segments."""
    return {
        "default_segments": _recovery_point_case(root, total_mb, DEFAULT_SEGMENT_BYTES),
        f"segments_{RECOVERY_POINT_SEGMENT_MB}MiB": _recovery_point_case(
            root, total_mb, RECOVERY_POINT_SEGMENT_MB * MIB
        ),
    }


def bench_index_lookup(root: Path, total_mb: int, lookups: int) -> dict[str, Any]:
    config = LogConfig(segment_bytes=1 << 30)
    log = SegmentedLog.open(root / "index-0", config)
    batch = _batch_of_size(1024)
    for _ in range(total_mb * MIB // len(batch)):
        log.append_batch(with_base_offset(batch, log.end_offset), validate=False)
    log.flush()
    rng = random.Random(7)
    offsets = [rng.randrange(log.end_offset) for _ in range(lookups)]
    segment = log._segments[-1]  # the index of the one segment: measured on its own
    started = time.perf_counter()
    for offset in offsets:
        segment.index.lookup(offset)
    lookup_s = time.perf_counter() - started
    started = time.perf_counter()
    for offset in offsets:
        log.read(offset, 1)
    read_s = time.perf_counter() - started
    results = {
        "batches": log.end_offset,
        "index_entries": len(segment.index),
        "index_lookup_us": round(lookup_s / lookups * 1e6, 3),
        "read_one_batch_us": round(read_s / lookups * 1e6, 2),
    }
    log.close()
    return results


SECTIONS = ("append_fsync_per_batch", "recovery_scan", "recovery_point_scan", "index_lookup")


def run(quick: bool, only: tuple[str, ...] = SECTIONS) -> dict[str, Any]:
    recovery_mb = int(os.environ.get("KRAFT_BENCH_STORAGE_RECOVERY_MB", "128" if quick else "1024"))
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
        },
        "quick": quick,
    }
    sections: dict[str, Callable[[Path], dict[str, Any]]] = {
        "append_fsync_per_batch": lambda root: bench_append(root, 3.0 if quick else 12.0),
        "recovery_scan": lambda root: bench_recovery(root, recovery_mb),
        "recovery_point_scan": lambda root: bench_recovery_point(root, recovery_mb),
        "index_lookup": lambda root: bench_index_lookup(root, 16 if quick else 64, 20_000),
    }
    with tempfile.TemporaryDirectory(
        prefix="kraft-bench-storage-", dir=os.environ.get("KRAFT_BENCH_DIR")
    ) as tmp:
        for name in SECTIONS:
            if name in only:
                results[name] = sections[name](Path(tmp))
    return results


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.storage", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="shorter rounds and a 128 MiB recovery log")
    parser.add_argument(
        "--only",
        nargs="+",
        choices=SECTIONS,
        help="run only these sections; the other sections of the results file are kept",
    )
    parser.add_argument("--out", type=Path, default=RESULTS_PATH)
    args = parser.parse_args(argv)
    results = run(args.quick, tuple(args.only) if args.only else SECTIONS)
    if args.only and args.out.exists():
        # A partial run updates its sections of the last full run; the machine line is this run's.
        merged = json.loads(args.out.read_text())
        merged.update(results)
        results = merged
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
