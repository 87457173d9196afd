"""Microbenchmark: the image store's save after a snapshot load — the longest event-loop stretch of
``SqliteImageStore.save`` (wall and thread-CPU ms, :func:`bench.work_units._stretches`) for the first save
of a ``--topics`` x ``--partitions`` image into an empty store, then for images of the same shape built
from the empty one (what a snapshot load hands the store: it shares nothing with the saved image, so
every topic is compared and rewritten).  GC frozen and off during each save, as after a load; the
previously saved image is kept alive through each save (on a node the reaper frees a replaced image).

Run: ``python -m bench.store_save --topics 100000 --partitions 10`` (on ``/dev/shm`` when there is one;
~1 GB, a minute or two: the ticker beside the save takes every turn it can).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.snapshot_reap import snapshot_values
from bench.work_units import _stretches
from kraft.clock import SystemClock
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.procutil import reap_children_on_exit


def _image(values: list[bytes]) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay_values(values, 5, 1)
    return delta.apply()


async def run(values: list[bytes], saves: int, root: Path) -> dict[str, Any]:
    result: dict[str, Any] = {}
    try:
        store = await SqliteImageStore.open(root / "image.sqlite", clock=SystemClock())
        held: list[MetadataImage] = []
        for number in range(saves):
            image = _image(values)
            # The image the store saved last stays held by someone else through the save, as on a node
            # (the reaper holds a replaced image's topics and frees them in slices): what is timed is the
            # save, not the old image's deallocation where the store drops it.
            held.append(image)
            gc.collect()
            gc.freeze()
            gc.disable()
            started = time.perf_counter()
            wall, cpu, turns = await _stretches(lambda: store.save(image))  # noqa: B023 (awaited at once)
            result["first_save" if number == 0 else f"replacing_save_{number}"] = {
                "longest_wall_ms": round(wall, 2),
                "longest_cpu_ms": round(cpu, 2),
                "turns": turns,
                "save_wall_s": round(time.perf_counter() - started, 2),
            }
            gc.enable()
            gc.unfreeze()
            del held[:-1]
        await store.close()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return result


def main() -> None:
    reap_children_on_exit()  # whatever it starts ends with it (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--saves", type=int, default=3, help="the first save, then replacing ones")
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        result: dict[str, Any] = {"label": args.label, "loadavg": f.read().split()[:3]}
    root = Path(tempfile.mkdtemp(dir="/dev/shm" if Path("/dev/shm").is_dir() else None))
    result.update(asyncio.run(run(snapshot_values(args.topics, args.partitions), args.saves, root)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
