"""What a broker's start-up ``PartitionManager.open_to`` does in one go besides opening logs, at
``--partitions`` hosted partitions (issue #17, bounded work units): ordering what the scan found, and the
reconciliation's ``changes_to`` (the manager's assignments against the image's).

Rows (median / max over ``--rounds``, ms of wall time, the heap frozen): ``sort_one_go`` — the
``sorted(found.items())`` open_to did before; ``in_order_longest`` — the longest stretch of the sliced
ordering it does now (:func:`kraft.broker.partitions.in_order`, the work unit's budget);
``changes_to_one_go`` — ``local_changes_between`` of the opened partitions against the image's when
nothing differs (the usual restart), which open_to did before; ``changes_in_steps_longest`` — the longest
stretch of ``local_changes_between_in_steps`` (what it does now); ``assignments_one_go`` — the
publisher's ``local_assignments(image)`` before ``open_to`` / ``load_snapshot`` (every partition of the
image hosted here), which it did in one go until session 9; ``assignments_in_steps_longest`` — the longest
stretch of ``local_assignments_in_steps`` under the work unit's pacer (what it does now).

Run: ``python -m bench.broker_open --partitions 100000``.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import statistics
import time
from dataclasses import replace
from pathlib import Path

from bench.work_units import _stretches
from kraft.broker.image_adapter import local_assignments, local_assignments_in_steps
from kraft.broker.partitions import Pacer, in_order
from kraft.broker.types import (
    LocalChanges,
    PartitionAssignment,
    ReplicaRole,
    TopicPartition,
    local_changes_between,
    local_changes_between_in_steps,
)
from kraft.clock import DEFAULT_WORK_UNIT_MS, SystemClock
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.procutil import reap_children_on_exit


def _image(topics: int, per_topic: int) -> MetadataImage:
    """``topics`` topics of ``per_topic`` partitions, every one on brokers 1-3 (all hosted by broker 1)."""
    registration = PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 1, 1)
    by_id = {
        f"id-{t}": TopicImage(f"topic-{t:04d}", f"id-{t}", (registration,) * per_topic) for t in range(topics)
    }
    return replace(
        MetadataImage.empty(),
        topics_by_id=by_id,
        topic_ids_by_name={t.name: t.topic_id for t in by_id.values()},
    )


def run(partitions: int, rounds: int) -> dict[str, float]:
    topics = max(partitions // 1000, 1)
    tps = [TopicPartition(f"topic-{t:04d}", p) for t in range(topics) for p in range(partitions // topics)]
    random.Random(1).shuffle(tps)  # the scan's order: directories as listed, dir by dir
    assignment = PartitionAssignment("id", 1, 1, 1, (1, 2, 3), (1, 2, 3))
    found = {tp: (Path("/data"), assignment, ReplicaRole.LEADER) for tp in tps}
    desired = dict.fromkeys(tps, assignment)
    image = _image(topics, partitions // topics)
    gc.collect()
    gc.freeze()
    rows: dict[str, list[float]] = {}
    for _ in range(rounds):
        started = time.perf_counter()
        ordered = sorted(found.items())
        rows.setdefault("sort_one_go_ms", []).append((time.perf_counter() - started) * 1000)
        del ordered

        async def sliced() -> None:
            await in_order(found, Pacer(SystemClock(), DEFAULT_WORK_UNIT_MS))

        wall, _cpu, turns = asyncio.run(_stretches(sliced))
        rows.setdefault("in_order_longest_ms", []).append(wall)
        rows.setdefault("in_order_turns", []).append(turns)
        started = time.perf_counter()
        local_changes_between(1, desired, desired)
        rows.setdefault("changes_to_one_go_ms", []).append((time.perf_counter() - started) * 1000)

        async def compared() -> None:
            pacer = Pacer(SystemClock(), DEFAULT_WORK_UNIT_MS)
            for _ in local_changes_between_in_steps(1, desired, desired, LocalChanges({}, {}, {})):
                await pacer.tick()

        wall, _cpu, turns = asyncio.run(_stretches(compared))
        rows.setdefault("changes_in_steps_longest_ms", []).append(wall)
        rows.setdefault("changes_in_steps_turns", []).append(turns)
        started = time.perf_counter()
        local_assignments(image, 1)
        rows.setdefault("assignments_one_go_ms", []).append((time.perf_counter() - started) * 1000)

        async def listed() -> None:
            pacer = Pacer(SystemClock(), DEFAULT_WORK_UNIT_MS)
            for _ in local_assignments_in_steps(image, 1, {}):
                await pacer.tick()

        wall, _cpu, turns = asyncio.run(_stretches(listed))
        rows.setdefault("assignments_in_steps_longest_ms", []).append(wall)
        rows.setdefault("assignments_in_steps_turns", []).append(turns)
    gc.unfreeze()
    out: dict[str, float] = {"partitions": len(tps)}
    for name, values in rows.items():
        out[f"{name}_median"] = round(statistics.median(values), 2)
        out[f"{name}_max"] = round(max(values), 2)
    return out


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    result = run(args.partitions, args.rounds)
    with open("/proc/loadavg") as f:
        result["loadavg_1m"] = float(f.read().split()[0])
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
