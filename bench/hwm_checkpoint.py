"""High-watermark checkpoint benchmark (issue #14): what one ``replica.high.watermark.checkpoint.interval.ms``
tick costs the broker's event loop with many partitions.

The ``replication-offset-checkpoint`` is one file per log dir listing all of its partitions (Kafka's
design), written every 5 s and at shutdown.  For ``N`` partitions in one log dir this measures:

- **before** (the code as of 8d080bb): version-1 encoding (entries sorted by their ``TopicPartition``
  keys) and the atomic write (temp file, fsync, rename, dir fsync) both on the event loop, on every tick,
  whether anything changed or not;
- **after** (:class:`~kraft.broker.hwm_checkpoint.CheckpointWriter`): version 2 (a crc32c line), lines
  in the entries' order (sorted as strings until session 9), the write on a worker thread, nothing
  written on a tick where no high watermark moved.  Measured for a tick where every partition changed
  and an idle tick (the one-go ``write_changed``; the broker's paced tick is ``bench.broker_timers``);
- **read**: reading and verifying the file at start (strict parse and checksum).

For each: wall seconds of the tick and the longest event-loop stall seen by a 1 ms ticker running beside
it (what heartbeats and Produce requests wait).  The file lives on ``/dev/shm`` when it exists (tmpfs:
no disk fsync latency, so the write share is a lower bound), else in the temp dir.

Run: ``python -m bench.hwm_checkpoint [--quick]`` (``--quick``: 1,000 and 20,000 partitions only).
Results: ``bench/results/hwm_checkpoint.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shutil
import tempfile
import time
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

from kraft.broker import hwm_checkpoint
from kraft.broker.types import TopicPartition
from kraft.procutil import reap_children_on_exit
from kraft.storage.fileio import atomic_write

SIZES = (1_000, 20_000, 100_000)
QUICK_SIZES = (1_000, 20_000)
TOPIC_PARTITIONS = 1_000
RESULTS = Path(__file__).resolve().parent / "results" / "hwm_checkpoint.json"


def _entries(count: int, shift: int = 0) -> dict[tuple[TopicPartition, str], int]:
    return {
        (
            TopicPartition(f"topic-{i // TOPIC_PARTITIONS:03d}", i % TOPIC_PARTITIONS),
            f"id-{i // TOPIC_PARTITIONS:022d}",
        ): (i * 7 + shift)
        for i in range(count)
    }


def _legacy_encode(entries: Mapping[tuple[TopicPartition, str], int]) -> bytes:
    """The version-1 encoder as it was before this change (sorted by the tuple keys)."""
    lines = ["1", str(len(entries))]
    for (tp, topic_id), offset in sorted(entries.items()):
        lines.append(f"{tp.topic} {tp.partition} {offset} {topic_id}")
    return ("\n".join(lines) + "\n").encode()


async def _measure(tick: Callable[[], Awaitable[object]]) -> dict[str, float]:
    """Wall seconds of ``tick`` and the longest gap between 1 ms ticks of a coroutine beside it."""
    loop = asyncio.get_running_loop()
    stop = False
    longest = 0.0

    async def ticker() -> None:
        nonlocal longest
        last = loop.time()
        while not stop:
            await asyncio.sleep(0.001)
            now = loop.time()
            longest = max(longest, now - last)
            last = now

    ticking = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    started = time.perf_counter()
    await tick()
    took = time.perf_counter() - started
    await asyncio.sleep(0.005)
    stop = True
    await ticking
    return {"seconds": round(took, 4), "max_loop_stall_ms": round(longest * 1000, 1)}


async def _run(count: int, root: Path) -> dict[str, Any]:
    log_dir = root / f"n{count}"
    log_dir.mkdir()
    first, second = _entries(count), _entries(count, shift=1)

    async def before() -> None:
        atomic_write(log_dir / hwm_checkpoint.FILE_NAME, _legacy_encode(second))

    writer = hwm_checkpoint.CheckpointWriter()
    await writer.write_changed({log_dir: first})

    async def after_changed() -> None:
        await writer.write_changed({log_dir: dict(second)})

    async def after_idle() -> None:
        await writer.write_changed({log_dir: dict(second)})

    async def read() -> None:
        assert hwm_checkpoint.read_checked(log_dir) == (second, "")

    result: dict[str, Any] = {"partitions": count}
    result["before_every_tick"] = await _measure(before)
    result["after_changed_tick"] = await _measure(after_changed)
    result["after_idle_tick"] = await _measure(after_idle)
    result["read_and_verify"] = await _measure(read)
    result["file_bytes"] = (log_dir / hwm_checkpoint.FILE_NAME).stat().st_size
    writer.write_now({})
    return result


def main() -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1,000 and 20,000 partitions only")
    args = parser.parse_args()
    base = "/dev/shm" if os.path.isdir("/dev/shm") else None
    root = Path(tempfile.mkdtemp(prefix="kraft-hwm-bench-", dir=base))
    try:
        runs = [asyncio.run(_run(n, root)) for n in (QUICK_SIZES if args.quick else SIZES)]
    finally:
        shutil.rmtree(root, ignore_errors=True)
    report = {
        "benchmark": "hwm_checkpoint",
        "storage": "tmpfs" if base else "temp dir",
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "runs": runs,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps(report, indent=2) + "\n")
    print(json.dumps(report, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
