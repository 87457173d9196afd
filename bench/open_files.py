"""Open-file benchmark (issue #14): a broker hosting 100,000 idle partitions within 1,000 descriptors.

What is measured (results in ``bench/results/open_files.json``): the broker's partition layer as the
broker process builds it — a :class:`~kraft.broker.partitions.PartitionManager` over real segmented
partition logs opened by :func:`~kraft.broker.segmented_partition_log.segmented_log_opener` with one
shared :class:`~kraft.storage.open_files.OpenFileCache` — in a process whose soft ``RLIMIT_NOFILE`` is
lowered to :data:`FD_LIMIT` first, so any leak past the cache ends the run with "Too many open files".

1. **create**: ``N`` partitions are created as the broker does on a CreateTopics delta
   (``apply_paced``: staging directory, state file, log, rename), descriptors counted every 10,000;
2. **reopen**: every log is closed and the directories re-opened as after a restart (``scan`` +
   ``open_to``, recovery of each log);
3. **touch**: one read of every partition's log (an empty log answers without opening its file), then a
   produce to a random 1 % of them (each reopens its segment file through the LRU) and a read back.

Reported: peak and final open descriptors of the process (``/proc/self/fd``), the cache's capacity,
opens and evictions, seconds and partitions/s per phase.  The target is ``peak_fds < 1000`` for
100,000 partitions.  The directories live on ``/dev/shm`` when it exists (tmpfs: the run measures
descriptors and CPU, not the disk's fsync latency), else in the temp dir.

Run: ``python -m bench.open_files [--quick]`` (``--quick``: 10,000 partitions).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import random
import resource
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from kraft.broker.partitions import PartitionManager
from kraft.broker.segmented_partition_log import segmented_log_opener
from kraft.broker.types import LocalChanges, PartitionAssignment, ProducedRecord, TopicPartition
from kraft.procutil import reap_children_on_exit
from kraft.storage.open_files import OpenFileCache

FD_LIMIT = 1000
"""The soft RLIMIT_NOFILE the benchmark runs under (the issue's bound)."""
CACHE_CAPACITY = 512
TOPIC_PARTITIONS = 1000
"""Partitions per topic (100 topics for the full run)."""
BROKER = 1


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _assignments(count: int) -> dict[TopicPartition, PartitionAssignment]:
    out: dict[TopicPartition, PartitionAssignment] = {}
    for i in range(count):
        topic = f"idle-{i // TOPIC_PARTITIONS:03d}"
        out[TopicPartition(topic, i % TOPIC_PARTITIONS)] = PartitionAssignment(
            f"id-{topic}", BROKER, 0, 0, (BROKER,), (BROKER,)
        )
    return out


async def _run(count: int, root: Path) -> dict[str, Any]:
    cache = OpenFileCache(CACHE_CAPACITY)
    opener = segmented_log_opener(1 << 30, open_files=cache)
    desired = _assignments(count)
    peak = open_fds()
    result: dict[str, Any] = {}

    manager = PartitionManager(BROKER, [root], opener)
    manager.scan()
    started = time.perf_counter()
    items = sorted(desired.items())
    for start in range(0, len(items), 10_000):
        await manager.apply_paced(LocalChanges(leaders=dict(items[start : start + 10_000])))
        peak = max(peak, open_fds())
    took = time.perf_counter() - started
    assert len(manager) == count, (len(manager), manager.offline)
    result["create"] = {"seconds": round(took, 2), "partitions_per_s": round(count / took)}
    manager.close()

    manager = PartitionManager(BROKER, [root], opener)
    started = time.perf_counter()
    manager.scan()
    await manager.open_to(desired)
    took = time.perf_counter() - started
    peak = max(peak, open_fds())
    assert len(manager) == count
    result["reopen"] = {"seconds": round(took, 2), "partitions_per_s": round(count / took)}

    started = time.perf_counter()
    for partition in manager.partitions():
        partition.log.read_records(0, 1024)
    rng = random.Random(7)
    produced = rng.sample(manager.partitions(), max(1, count // 100))
    for partition in produced:
        partition.log.append_records([ProducedRecord(b"k", b"v" * 100, 0)], 0)
    for partition in produced:
        assert partition.log.read_records(0, 1024)[0].value == b"v" * 100
    took = time.perf_counter() - started
    peak = max(peak, open_fds())
    result["touch"] = {"seconds": round(took, 2), "produced_partitions": len(produced)}
    result["final_fds"] = open_fds()
    manager.close()
    result["peak_fds"] = peak
    result["cache"] = {
        "capacity": cache.capacity,
        "opens": cache.stats.opens,
        "evictions": cache.stats.evictions,
    }
    return result


def main() -> dict[str, Any]:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.open_files", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10,000 partitions instead of 100,000")
    parser.add_argument("--partitions", type=int, default=0, help="override the partition count")
    args = parser.parse_args()
    count = args.partitions or (10_000 if args.quick else 100_000)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(FD_LIMIT, hard), hard))
    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    root = Path(tempfile.mkdtemp(prefix="kraft-bench-open-files-", dir=base))
    try:
        measured = asyncio.run(_run(count, root / "logs"))
    finally:
        shutil.rmtree(root, ignore_errors=True)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    outcome = {
        "benchmark": "open_files",
        "partitions": count,
        "fd_limit": min(FD_LIMIT, hard),
        "target": "peak_fds < 1000",
        "met": measured["peak_fds"] < 1000,
        "storage": "tmpfs (/dev/shm)" if base == Path("/dev/shm") else str(base),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        **measured,
    }
    print(outcome)
    return outcome


if __name__ == "__main__":
    main()
