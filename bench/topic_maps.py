"""Microbenchmark: the image's topic maps — what one CreateTopics' ``apply()`` and the previous image's
free cost on an image of N topics, and what reading the maps costs (issue #17).

For each ``--topics`` N: an image of N one-partition topics (UUID ids, built by one delta like a replay),
then

- ``apply_us_p50``: ``MetadataDelta.apply()`` of a delta creating one more topic (TopicRecord +
  PartitionRecord), median over the rounds; ``free_us_p50``: dropping that new image right after
  (what installing the next image frees — the dict copies before ``kraft.metadata.pmap``);
- ``lookup_by_id_ns``: ``topics_by_id[id]``; ``topic_by_name_ns``: ``image.topic(name)`` (up to 5,000
  spread ids/names, best of 5 passes);
- ``iter_items_ms`` / ``iter_values_ms``: one pass over ``topics_by_id.items()`` / ``.values()``
  (best of 5).

A/B: run it with ``PYTHONPATH`` on each tree (``git archive <commit> | tar -x -C DIR``), alternated,
under ``flock /tmp/kraft-bench.lock``.  Prints one JSON object per N (with the load average).

Run: ``python -m bench.topic_maps [--topics 6000 100000]`` (~10 s).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable

from kraft.metadata import records as rec
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import metadata_pb2 as mpb


def _replay_topic(delta: MetadataDelta, name: str) -> None:
    topic_id = str(uuid.uuid4())
    delta.replay(rec.wrap(mpb.TopicRecord(name=name, topic_id=topic_id)))
    replicas = [1, 2, 3]
    partition = mpb.PartitionRecord(partition_id=0, topic_id=topic_id, replicas=replicas, isr=replicas)
    partition.leader = 1
    delta.replay(rec.wrap(partition))


def build(topics: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for k in range(topics):
        _replay_topic(delta, f"t-{k}")
    return delta.apply()


def _best_of(passes: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(passes))


def measure(topics: int) -> dict[str, float]:
    image = build(topics)
    applies: list[float] = []
    frees: list[float] = []
    gc.collect()
    gc.disable()  # a collection inside a timed step would be charged to it
    try:
        for i in range(300 if topics <= 10_000 else 60):
            delta = MetadataDelta(image)
            _replay_topic(delta, f"new-{i}")
            started = time.perf_counter()
            new = delta.apply()
            applies.append(time.perf_counter() - started)
            del delta
            started = time.perf_counter()
            del new
            frees.append(time.perf_counter() - started)
    finally:
        gc.enable()
    ids = list(image.topics_by_id)
    step = max(1, len(ids) // 5000)
    sample_ids = ids[::step]
    sample_names = [image.topics_by_id[i].name for i in sample_ids]

    def lookup_by_id() -> float:
        by_id = image.topics_by_id
        started = time.perf_counter()
        for topic_id in sample_ids:
            by_id[topic_id]
        return (time.perf_counter() - started) / len(sample_ids)

    def topic_by_name() -> float:
        started = time.perf_counter()
        for name in sample_names:
            image.topic(name)
        return (time.perf_counter() - started) / len(sample_names)

    def iter_items() -> float:
        started = time.perf_counter()
        for _topic_id, _topic in image.topics_by_id.items():
            pass
        return time.perf_counter() - started

    def iter_values() -> float:
        started = time.perf_counter()
        for _topic in image.topics_by_id.values():
            pass
        return time.perf_counter() - started

    return {
        "topics": topics,
        "apply_us_p50": round(statistics.median(applies) * 1e6, 2),
        "free_us_p50": round(statistics.median(frees) * 1e6, 2),
        "lookup_by_id_ns": round(_best_of(5, lookup_by_id) * 1e9, 1),
        "topic_by_name_ns": round(_best_of(5, topic_by_name) * 1e9, 1),
        "iter_items_ms": round(_best_of(5, iter_items) * 1e3, 3),
        "iter_values_ms": round(_best_of(5, iter_values) * 1e3, 3),
    }


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, nargs="+", default=[6000, 100_000])
    args = parser.parse_args()
    for topics in args.topics:
        result = measure(topics)
        print(json.dumps({**result, "load_average": os.getloadavg()[0]}), flush=True)


if __name__ == "__main__":
    main()
