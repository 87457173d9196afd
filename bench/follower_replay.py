"""Microbenchmark: a follower controller's replay of bulk-create batches, in one process.

Builds ``--topics`` topics of 1,000 partitions (RF 3, over 1,000 brokers) through ``ControllerLogic`` as
``bench.controller``'s bulk phase does, encodes the records into Raft batches of ``--batch`` records, and
replays each batch as a follower's listener does (``LazyRecords`` over the batch bytes, then
``commit_replay.replay_batch`` with the shipped 5 ms budget).  The coroutine is stepped by hand: each
``send()`` is one event-loop turn of the replay, so the longest step is the longest turn the replay
holds the loop for (in CPU: ``time.thread_time``).  Reports CPU per 10,000 records and the longest and
p99 step, per round.

Run: ``python -m bench.follower_replay [--topics 20] [--batch 2000] [--rounds 5]``; for an A/B, run it
with ``PYTHONPATH`` set to each tree, alternated (docs/internals/raft-performance.md, "Follower turns
during bulk work").
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time

from bench.controller import register_active_brokers
from kraft.clock import DEFAULT_WORK_UNIT_MS, SystemClock
from kraft.metadata import records as rec
from kraft.metadata.commit_replay import replay_batch
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.raft.api import CommittedBatch
from kraft.raft.listeners import LazyRecords
from kraft.storage.batch import build_batch, iter_batch_headers
from kraft.v1 import controller_pb2 as cpb


def build(topics: int, batch_records: int) -> tuple[MetadataImage, list[bytes]]:
    """The image with 1,000 active brokers, and the Raft batches that create ``topics`` topics on it."""
    settings = ControllerSettings("bench", max_partitions=10**9, max_broker_partitions=10**9)
    logic = ControllerLogic(settings, MetadataImage.empty(), 0, clock=SystemClock())
    offset = register_active_brokers(logic, 1000)
    base = logic.image
    values: list[bytes] = []
    for t in range(topics):
        topic = cpb.CreatableTopic(name=f"bulk-{t}", num_partitions=1000, replication_factor=3)
        out = logic.create_topics(
            cpb.CreateTopicsRequest(cluster_id="bench", topics=[topic]), offset + len(values)
        )
        values += [rec.encode_value(r) for r in out.records]
    batches = [
        build_batch(
            offset + s, [(None, v) for v in values[s : s + batch_records]], leader_epoch=1, timestamp_ms=0
        )
        for s in range(0, len(values), batch_records)
    ]
    return base, batches


def one_round(base: MetadataImage, batches: list[bytes]) -> dict[str, float]:
    clock = SystemClock()
    image = base
    steps: list[int] = []
    records = 0
    started = time.thread_time_ns()
    for raw in batches:
        ((position, header),) = list(iter_batch_headers(raw))
        batch = CommittedBatch(
            header.base_offset,
            header.last_offset,
            header.partition_leader_epoch,
            LazyRecords(raw, position),
            header.max_timestamp,
        )
        coroutine = replay_batch(image, batch, clock, DEFAULT_WORK_UNIT_MS)
        while True:
            step_started = time.thread_time_ns()
            try:
                coroutine.send(None)
            except StopIteration as stop:
                steps.append(time.thread_time_ns() - step_started)
                image = stop.value.image
                break
            steps.append(time.thread_time_ns() - step_started)
        records += header.last_offset - header.base_offset + 1
    cpu_ns = time.thread_time_ns() - started
    steps.sort()
    return {
        "cpu_ms_per_10k_records": round(cpu_ns / records * 10_000 / 1e6, 1),
        "longest_step_ms": round(steps[-1] / 1e6, 2),
        "p99_step_ms": round(steps[len(steps) * 99 // 100] / 1e6, 2),
        "steps": len(steps),
        "records": records,
    }


def main() -> None:
    reap_children_on_exit()  # every bench main binds its children first (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--batch", type=int, default=2000, help="records per Raft batch")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    base, batches = build(args.topics, args.batch)
    gc.collect()
    gc.freeze()  # as the heap freezer leaves a controller's image: collections walk only what is new
    rounds = [one_round(base, batches) for _ in range(args.rounds)]
    summary = {
        key: statistics.median(r[key] for r in rounds)
        for key in ("cpu_ms_per_10k_records", "longest_step_ms", "p99_step_ms")
    }
    print(json.dumps({"rounds": rounds, "median": summary}))


if __name__ == "__main__":
    main()
