"""Microbenchmark: three controllers' large image-store saves at once against one after another (issue #17,
session 16).  After bulk work each controller of a quorum saves ~100,000-300,000 changed rows; on a shared
host (the benchmarks' 3 controllers on 2 cores) three such saves at the same moment are a CPU burst the
active controller's heartbeat answers feel.  Here this process plays the active controller: its event loop
runs a 1-ms ticker doing ~0.2 ms of Python work per tick (a heartbeat handler) and saves its own store at
slot 2; two child processes play the followers and save theirs at slots 0 and 1.  A slot's save starts
``slot x --stagger-ms`` after a common start (0: all three at once, session 15's schedule); the ticker's
lateness is reported over the same window for either setting (``--window-s`` from the start).

Run: ``python -m bench.store_save_stagger --stagger-ms 1000`` (alternate ``--stagger-ms 0`` and ``1000``
across runs; ``--switch-us 100`` as a controller sets the GIL switch interval).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.store_save_pacing import _image, _moved
from kraft.clock import SystemClock
from kraft.metadata.store import SqliteImageStore
from kraft.procutil import reap_children_on_exit, spawn_child

LEADER_SLOT = 2
START_LEAD_S = 4.0
"""How far ahead of the common start the children are told it (they build their images meanwhile)."""


async def _prepared_store(root: Path, topics: int, partitions: int) -> tuple[SqliteImageStore, Any]:
    """A store holding one image, and the next image (every row changed) to save at the start."""
    image = _image(topics, partitions)
    store = await SqliteImageStore.open(root / "image.sqlite", clock=SystemClock())
    await store.load()
    await store.save(image)
    moved = _moved(image)
    gc.collect()
    return store, moved


async def _save_at(store: SqliteImageStore, image: Any, start: float, at: float) -> dict[str, float]:
    """Save ``image`` at ``at`` (wall clock): when it started (s after the common ``start``), wall, CPU."""
    await asyncio.sleep(max(0.0, at - time.time()))
    started = time.time()
    cpu_before = store.thread_cpu_s() or 0.0
    await store.save(image)
    return {
        "start_s": round(started - start, 3),
        "wall_ms": round((time.time() - started) * 1000),
        "cpu_ms": round(((store.thread_cpu_s() or 0.0) - cpu_before) * 1000),
    }


async def _child(topics: int, partitions: int, start: float, at: float) -> None:
    with tempfile.TemporaryDirectory(prefix="kraft-stagger-") as root:
        store, moved = await _prepared_store(Path(root), topics, partitions)
        try:
            print(json.dumps(await _save_at(store, moved, start, at)), flush=True)
        finally:
            await store.close()


async def _ticks(until: float, late: list[float]) -> None:
    """1-ms sleeps with ~0.2 ms of Python work each until ``until`` (wall clock): lateness into ``late``."""
    while time.time() < until:
        started = time.perf_counter()
        await asyncio.sleep(0.001)
        late.append(time.perf_counter() - started - 0.001)
        total = 0
        for i in range(3000):
            total += i


def _followers(topics: int, partitions: int, stagger_ms: int, start: float) -> list[subprocess.Popen[str]]:
    """The two follower processes, saving at slots 0 and 1."""
    return [
        spawn_child(
            [
                sys.executable,
                "-m",
                "bench.store_save_stagger",
                "--child",
                str(topics),
                str(partitions),
                str(start),
                str(start + slot * stagger_ms / 1000),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for slot in (0, 1)
    ]


async def run(
    topics: int,
    partitions: int,
    stagger_ms: int,
    window_s: float,
    start: float,
    children: list[subprocess.Popen[str]],
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="kraft-stagger-") as root:
        store, moved = await _prepared_store(Path(root), topics, partitions)
        try:
            if time.time() > start - 0.5:
                raise RuntimeError("the leader's image was not ready before the start: raise START_LEAD_S")
            await asyncio.sleep(start - 0.2 - time.time())
            late: list[float] = []
            ticker = asyncio.create_task(_ticks(start + window_s, late))
            own = await _save_at(store, moved, start, start + LEADER_SLOT * stagger_ms / 1000)
            await ticker
        finally:
            await store.close()
    outputs = await asyncio.to_thread(lambda: [child.communicate()[0] for child in children])
    followers = [json.loads(output.strip().splitlines()[-1]) for output in outputs]
    ordered = sorted(late)
    over_5ms = sum(x for x in ordered if x > 0.005)
    return {
        "stagger_ms": stagger_ms,
        "rows_per_save": topics * partitions,
        "followers": followers,
        "leader": own,
        "ticks": len(ordered),
        "late_p50_ms": round(ordered[len(ordered) // 2] * 1000, 2),
        "late_p99_ms": round(ordered[int(0.99 * len(ordered))] * 1000, 1),
        "late_max_ms": round(ordered[-1] * 1000, 1),
        "late_over_5ms_sum_ms": round(over_5ms * 1000),
    }


def main() -> None:
    reap_children_on_exit()
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--topics", type=int, default=200)
    parser.add_argument("--partitions", type=int, default=1000)
    parser.add_argument("--stagger-ms", type=int, default=1000)
    parser.add_argument("--window-s", type=float, default=6.0)
    parser.add_argument("--switch-us", type=int, default=100, help="sys.setswitchinterval, µs (0: Python's)")
    parser.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.switch_us:
        sys.setswitchinterval(args.switch_us / 1e6)
    if args.child:
        topics, partitions, start, at = args.child
        asyncio.run(_child(int(topics), int(partitions), float(start), float(at)))
        return
    start = time.time() + START_LEAD_S + args.topics * args.partitions / 25_000  # the images' build time
    children = _followers(args.topics, args.partitions, args.stagger_ms, start)
    result = asyncio.run(run(args.topics, args.partitions, args.stagger_ms, args.window_s, start, children))
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
