"""The longest event-loop stretch of a broker's snapshot load that replaces an image of many topics.

A deferred broker (caught up with nothing opened yet, where the usual snapshot load happens: a new broker
below the log start) holds an image of ``--topics`` one-partition topics hosted elsewhere; each round
loads a snapshot of as many other topics (sharing none), beside a task that takes every turn it can
(:func:`bench.work_units._stretches`): ``MetadataPublisher.load_snapshot`` hands every replaced topic and
the old topic maps to the reaper (:mod:`kraft.reaper`) before the new image is served — in one walk
before session 10, in steps of ``RELEASE_STEP`` topics since.  The reaper's own turns (~1 ms each) run
after it and are not part of the load: the load's turns end when ``load_snapshot`` returns.  The two
images alternate (both stay held by the benchmark, so the reaper frees nothing here).

Runs against the tree on ``PYTHONPATH``: copy this file elsewhere to time another tree.

Run: ``python -m bench.broker_snapshot_walk --topics 100000`` (prints one JSON object).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.work_units import _stretches
from kraft.broker.partitions import PartitionManager
from kraft.broker.publisher import MetadataPublisher
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import wrap
from kraft.procutil import reap_children_on_exit
from kraft.v1 import metadata_pb2 as mpb
from tests.unit.broker.broker_fakes import MemoryImageStore, MemoryLogOpener


def _image(topics: int, prefix: str, offset: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for index in range(topics):
        topic_id = f"{prefix}-{index}"
        delta.replay(wrap(mpb.TopicRecord(name=f"{prefix}{index}", topic_id=topic_id)))
        delta.replay(
            wrap(mpb.PartitionRecord(partition_id=0, topic_id=topic_id, replicas=[2], isr=[2], leader=2))
        )
    delta.replay(wrap(mpb.NoOpRecord()), offset, 1)
    return delta.apply()


async def run(topics: int, rounds: int) -> dict[str, Any]:
    images = [_image(topics, "a", 10), _image(topics, "b", 20)]
    out: dict[str, Any] = {"topics": topics, "rounds": rounds}
    with tempfile.TemporaryDirectory(prefix="broker-snapshot-walk-") as root:
        manager = PartitionManager(1, [Path(root)], MemoryLogOpener())
        publisher = MetadataPublisher(1, manager, MemoryImageStore(), "PLAINTEXT", lambda view: None)
        await publisher.start()  # deferred: nothing opened, the image alone is swapped
        await publisher.load_snapshot(images[0])
        await publisher.flush()
        gc.collect()
        gc.freeze()
        rows: list[tuple[float, float, int]] = []
        cpu: list[float] = []
        for round_ in range(rounds):
            image = images[(round_ + 1) % 2]
            started = time.thread_time()
            rows.append(await _stretches(lambda image=image: publisher.load_snapshot(image)))  # type: ignore[misc]
            cpu.append((time.thread_time() - started) * 1000)
            await publisher.flush()
        out["longest_stretch_ms_median"] = round(statistics.median(r[0] for r in rows), 2)
        out["longest_stretch_ms_max"] = round(max(r[0] for r in rows), 2)
        out["longest_cpu_ms_median"] = round(statistics.median(r[1] for r in rows), 2)
        out["longest_cpu_ms_max"] = round(max(r[1] for r in rows), 2)
        out["turns_median"] = statistics.median(r[2] for r in rows)
        out["loop_cpu_ms_median"] = round(statistics.median(cpu), 1)
        manager.close()
        gc.unfreeze()
    return out


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load_before = float(f.read().split()[0])
    result = asyncio.run(run(args.topics, args.rounds))
    with open("/proc/loadavg") as f:
        result["loadavg_1m"] = [load_before, float(f.read().split()[0])]
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
