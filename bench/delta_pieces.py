"""Microbenchmark: a snapshot's replay into a MetadataDelta in the pieces a controller's load runs
between budget checks, and the delta's ``apply_steps`` — the longest single piece and step (thread CPU
ms) and the CPU of each whole, garbage collection frozen and off (issue #17, single C operations).

A dict holding one entry per topic rebuilds its table in one C call as it passes 87,381 / 174,762 keys
(docs/internals/raft-performance.md, "Dict resizes and other single C operations"): the longest piece
names the record it started at.  Also times ``MetadataImage.partition_count()`` on the built image.
Compare two trees by running this file against each (``--label``; copy it into the other tree).

Run: ``python -m bench.delta_pieces --topics 100000 --partitions 10`` (~1 GB, ~15 s a round).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from collections.abc import Generator
from typing import Any

from bench.snapshot_reap import snapshot_values
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit

PIECE = 32
"""Records a piece (the controller's snapshot replay checks its budget every 32 records)."""


def _longest_step(steps: Generator[None, None, MetadataImage]) -> tuple[MetadataImage, float]:
    longest = 0.0
    while True:
        started = time.thread_time()
        try:
            next(steps)
        except StopIteration as done:
            return done.value, max(longest, time.thread_time() - started)
        longest = max(longest, time.thread_time() - started)


def one_round(values: list[bytes]) -> dict[str, float]:
    delta = MetadataDelta(MetadataImage.empty())
    longest = 0.0
    at = 0
    replay_started = time.thread_time()
    for start in range(0, len(values), PIECE):
        started = time.thread_time()
        delta.replay_values(values[start : start + PIECE], 1, 1)
        took = time.thread_time() - started
        if took > longest:
            longest, at = took, start
    replay = time.thread_time() - replay_started
    apply_started = time.thread_time()
    image, longest_step = _longest_step(delta.apply_steps())
    applied = time.thread_time() - apply_started
    count_started = time.thread_time()
    partitions = image.partition_count()
    counted = time.thread_time() - count_started
    return {
        "replay_cpu_s": round(replay, 3),
        "longest_piece_ms": round(longest * 1000, 2),
        "longest_piece_at_record": at,
        "apply_cpu_s": round(applied, 3),
        "longest_apply_step_ms": round(longest_step * 1000, 2),
        "partition_count_ms": round(counted * 1000, 3),
        "partitions": partitions,
    }


def main() -> None:
    reap_children_on_exit()  # whatever it starts ends with it (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--topics", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--label", default="")
    args = parser.parse_args()
    values = snapshot_values(args.topics, args.partitions)
    gc.collect()
    gc.freeze()
    gc.disable()
    with open("/proc/loadavg") as f:
        result: dict[str, Any] = {"label": args.label, "loadavg": f.read().split()[:3]}
    result["rounds"] = [one_round(values) for _ in range(args.rounds)]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
