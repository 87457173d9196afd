"""Microbenchmark: how late a 1-ms timer runs while the image store saves ``--topics`` x ``--partitions``
changed rows (a controlled shutdown's leader moves, all written by one save), unpaced against paced
(issue #17, session 15).  Beside each save a thread sleeps 1 ms in a loop and an asyncio task awaits 1-ms
sleeps on the saving event loop; each reports how much later than 1 ms it woke (max, p99), as a heartbeat
handler on the intake thread or the main loop would be delayed.  ``--mode unpaced`` writes each table in
one statement (as before session 15), ``chunks`` 2,000 rows per statement with no pause (the default),
``paced`` with a pause as long as each chunk took (``controller.image.store.save.pause.percent=100``).

Run: ``python -m bench.store_save_pacing --mode paced`` (alternate the modes across runs; ``--switch-us
100`` as a controller sets the GIL switch interval, ``controller.gil.switch.interval.us``).

Session 18 (issue #17): ``--store-nice N`` gives the store's SQLite thread nice N (Linux, per thread), and
each round also reports how long the ticker thread sat runnable without a core during the save
(``thread_runqueue_ms``, its ``/proc/thread-self/schedstat``): on a host whose cores are busy a save
competes with the process's other threads for the CPU its process gets, which a niced SQLite thread yields.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from kraft.clock import SystemClock
from kraft.metadata.delta import MetadataDelta, make_partition, shared_ids
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SAVE_CHUNK_ROWS, STORE_THREAD_NAME, SqliteImageStore
from kraft.observability.thread_names import native_name
from kraft.procutil import reap_children_on_exit
from kraft.v1 import metadata_pb2 as pb

MODES = {"unpaced": (10**9, 0.0), "chunks": (SAVE_CHUNK_ROWS, 0.0), "paced": (SAVE_CHUNK_ROWS, 1.0)}


def _image(topics: int, partitions: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for t in range(topics):
        topic_id = f"topic-id-{t:06d}-xxxxxxxxxxxx"
        delta.replay(pb.MetadataRecord(topic=pb.TopicRecord(name=f"t{t}", topic_id=topic_id)))
        for p in range(partitions):
            other = 2 + (t * partitions + p) % 997
            replicas = [1, other, other + 1]
            record = pb.PartitionRecord(
                topic_id=topic_id, partition_id=p, replicas=replicas, isr=replicas, leader=1
            )
            delta.replay(pb.MetadataRecord(partition=record))
    return delta.apply()


def _moved(image: MetadataImage) -> MetadataImage:
    """Broker 1 leaves every partition's ISR (or comes back): every row changes."""
    delta = MetadataDelta(image)
    for topic in image.topics_by_id.values():
        for p, part in enumerate(topic.partitions):
            isr = shared_ids(part.isr[1:] if part.isr[0] == 1 else (1, *part.isr))
            change = make_partition(
                part.replicas, isr, isr[0], part.leader_epoch + 1, part.partition_epoch + 1
            )
            delta.set_partition(topic.topic_id, p, change)
    return delta.apply()


def _store_thread_ids() -> list[int]:
    """The native ids of this process's image-store SQLite threads (their ``comm``)."""
    ids = []
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().strip() == native_name(STORE_THREAD_NAME).decode():
                ids.append(int(task.name))
    return ids


def _store_thread_cpu_ms() -> float:
    """CPU the image store's SQLite thread has used (Linux: its ``comm`` is the store's thread name)."""
    total = 0
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError):
            if (task / "comm").read_text().strip() == native_name(STORE_THREAD_NAME).decode():
                total += int((task / "schedstat").read_text().split()[0])
    return total / 1e6


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))] if ordered else 0.0


def _runqueue_ns() -> int:
    """The calling thread's time runnable without a core so far (``/proc/thread-self/schedstat``; 0 if
    unreadable)."""
    try:
        return int(Path("/proc/thread-self/schedstat").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return 0


def _ticker(stop: threading.Event, late: list[float], queued: list[int]) -> None:
    """A thread's 1-ms sleeps until ``stop``: each one's lateness into ``late``; its run-queue ns from
    ``queued`` being cleared (by the saver, at the save's start) to ``stop`` appended to ``queued``."""
    base = _runqueue_ns()
    while not stop.is_set():
        if not queued:
            queued.append(0)  # the saver cleared it: count from now
            base = _runqueue_ns()
        started = time.perf_counter()
        time.sleep(0.001)
        late.append(time.perf_counter() - started - 0.001)
    queued.append(_runqueue_ns() - base)


async def _loop_ticker(late: list[float]) -> None:
    """The event loop's 1-ms sleeps until cancelled: each one's lateness into ``late``."""
    while True:
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        late.append(time.perf_counter() - started - 0.001)


async def run(
    topics: int, partitions: int, mode: str, rounds: int, root: Path, store_nice: int = 0
) -> list[dict[str, Any]]:
    image = _image(topics, partitions)
    store = await SqliteImageStore.open(root / "image.sqlite", clock=SystemClock())
    results: list[dict[str, Any]] = []
    if store_nice:
        for tid in _store_thread_ids():
            os.setpriority(os.PRIO_PROCESS, tid, store_nice)
    try:
        await store.load()
        await store.save(image)
        store.chunk_rows, store.pause_ratio = MODES[mode]
        for _ in range(rounds):
            image = _moved(image)
            gc.collect()
            stop = threading.Event()
            thread_late: list[float] = []
            loop_late: list[float] = []
            queued: list[int] = [0]

            thread = threading.Thread(target=_ticker, args=(stop, thread_late, queued), name="ticker")
            thread.start()
            task = asyncio.create_task(_loop_ticker(loop_late))
            await asyncio.sleep(0.05)
            thread_late.clear()
            loop_late.clear()
            queued.clear()
            cpu_before = _store_thread_cpu_ms()
            started = time.perf_counter()
            await store.save(image)
            wall = time.perf_counter() - started
            store_cpu_ms = _store_thread_cpu_ms() - cpu_before
            stop.set()
            thread.join()
            task.cancel()
            results.append(
                {
                    "mode": mode,
                    "store_nice": store_nice,
                    "rows": topics * partitions,
                    "save_ms": round(wall * 1000),
                    "store_thread_cpu_ms": round(store_cpu_ms),
                    "thread_late_max_ms": round(max(thread_late) * 1000, 1),
                    "thread_late_p99_ms": round(_p99(thread_late) * 1000, 1),
                    "loop_late_max_ms": round(max(loop_late) * 1000, 1),
                    "loop_late_p99_ms": round(_p99(loop_late) * 1000, 1),
                    "thread_runqueue_ms": round(queued[-1] / 1e6, 1),
                }
            )
    finally:
        await store.close()
    return results


def main() -> None:
    reap_children_on_exit()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--mode", choices=sorted(MODES), default="chunks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--switch-us", type=int, default=0, help="sys.setswitchinterval, µs (0: Python's)")
    parser.add_argument("--store-nice", type=int, default=0, help="the SQLite thread nice (Linux; 0: as is)")
    args = parser.parse_args()
    if args.switch_us:
        sys.setswitchinterval(args.switch_us / 1e6)
    with tempfile.TemporaryDirectory(prefix="kraft-store-pacing-") as root:
        saves = run(args.topics, args.partitions, args.mode, args.rounds, Path(root), args.store_nice)
        for result in asyncio.run(saves):
            print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
