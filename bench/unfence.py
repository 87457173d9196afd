"""Microbenchmark: the active controller's logic unfencing one broker in a big image.

Builds, through ControllerLogic, an image of ``--topics`` x ``--per-topic`` partitions (RF 3) over
``--brokers`` unfenced brokers, then for ``--rounds`` rounds fences a broker (its leave job run to the
end), and times the heartbeat that unfences it — alternating the full scan (the code before the rejoin
index, ``ControllerLogic._partitions_of``) and the index on different brokers of the same image, so both
see the same load.  Also times a one-partition CreateTopics (the placement cursor) and the index's first
build after a reset.  Prints JSON.

Run: ``python -m bench.unfence`` (1,000 x 1,000 partitions over 1,000 brokers: ~1.5 GiB, minutes).
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable, Iterator
from typing import Any

from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb

CLUSTER = "bench"


class Bench:
    def __init__(self, brokers: int, topics: int, per_topic: int) -> None:
        settings = ControllerSettings(
            CLUSTER, max_partitions=10**9, max_broker_partitions=10**9, max_changes_per_write=250
        )
        self.logic = ControllerLogic(settings, MetadataImage.empty(), 0)
        self.offset = 0
        self.epochs: dict[int, int] = {}
        for broker_id in range(1, brokers + 1):
            request = cpb.RegisterBrokerRequest(
                cluster_id=CLUSTER,
                broker_id=broker_id,
                incarnation_id=f"i{broker_id}",
                rack=f"r{broker_id % 10}",
            )
            request.listeners.add(name="PLAINTEXT", host="127.0.0.1", port=10_000 + broker_id)
            out = self.logic.register_broker(request, 0, self.offset)
            self.offset += len(out.records)
            self.epochs[broker_id] = out.response.broker_epoch
            self.beat(broker_id)
        for index in range(topics):
            topic = cpb.CreatableTopic(name=f"topic-{index}", num_partitions=per_topic, replication_factor=3)
            self.create(topic)

    def create(self, topic: cpb.CreatableTopic) -> int:
        out = self.logic.create_topics(
            cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), self.offset
        )
        self.offset += len(out.records)
        return len(out.records)

    def beat(self, broker_id: int, want_fence: bool = False) -> int:
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=self.epochs[broker_id],
            current_metadata_offset=self.offset,
            want_fence=want_fence,
        )
        records = self.logic.broker_heartbeat(beat, 0, self.offset).records
        self.offset += len(records)
        return len(records)

    def fence(self, broker_id: int) -> None:
        self.beat(broker_id, want_fence=True)
        while self.logic.has_bulk_jobs():
            self.offset += len(
                getattr(self.logic, "continue_bulk_values", self.logic.continue_bulk_jobs)(self.offset)
            )


def scan_candidates(
    logic: ControllerLogic,
) -> Callable[
    [MetadataImage, int, Callable[[int], bool]], Iterator[tuple[TopicImage, int, PartitionRegistration]]
]:
    def candidates(
        image: MetadataImage, broker_id: int, acceptable: Callable[[int], bool]
    ) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
        return logic._partitions_of(broker_id)

    return candidates


def summary(values: list[float]) -> dict[str, float]:
    return {
        "min_ms": round(min(values) * 1000, 2),
        "median_ms": round(statistics.median(values) * 1000, 2),
        "max_ms": round(max(values) * 1000, 2),
    }


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.unfence", description=__doc__.splitlines()[0])
    parser.add_argument("--brokers", type=int, default=1000)
    parser.add_argument("--topics", type=int, default=1000)
    parser.add_argument("--per-topic", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    start = time.perf_counter()
    bench = Bench(args.brokers, args.topics, args.per_topic)
    gc.collect()
    gc.freeze()  # as the controller does after loading: collections do not walk the image
    results: dict[str, Any] = {
        "partitions": bench.logic.image.partition_count(),
        "brokers": args.brokers,
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    logic = bench.logic
    if not hasattr(logic, "rejoin_index"):  # the code before the index: only the scan and the old cursor
        return _before_the_index(bench, args.rounds, results)
    indexed = logic._rejoin_candidates
    # The index's first build (after a reset: a newly active controller) happens at the first unfence.
    bench.fence(1)
    logic.rejoin_index.invalidate()
    start = time.perf_counter()
    records = bench.beat(1)
    results["first_unfence_after_reset_ms"] = round((time.perf_counter() - start) * 1000, 1)
    results["first_unfence_records"] = records
    times: dict[str, list[float]] = {"scan": [], "index": []}
    counts: dict[str, list[int]] = {"scan": [], "index": []}
    broker_id = 2
    for _ in range(args.rounds):
        for mode in ("scan", "index"):
            # an instance attribute shadows the method: the same logic object either way
            setattr(logic, "_rejoin_candidates", scan_candidates(logic) if mode == "scan" else indexed)  # noqa: B010
            bench.fence(broker_id)
            start = time.perf_counter()
            counts[mode].append(bench.beat(broker_id))
            times[mode].append(time.perf_counter() - start)
            broker_id += 1
    setattr(logic, "_rejoin_candidates", indexed)  # noqa: B010
    results["unfence"] = {mode: {**summary(times[mode]), "records": counts[mode]} for mode in times}
    # Finding the partitions alone (no records): what the index replaces, on a fenced broker.
    bench.fence(broker_id)
    image = logic.image
    acceptable = logic.acceptable_in(image)
    found: dict[str, list[float]] = {"scan": [], "index": []}
    for _ in range(args.rounds):
        start = time.perf_counter()
        scanned = sum(1 for _ in logic._partitions_of(broker_id))
        found["scan"].append(time.perf_counter() - start)
        start = time.perf_counter()
        candidates = sum(1 for _ in logic._rejoin_candidates(image, broker_id, acceptable))
        found["index"].append(time.perf_counter() - start)
    results["find_partitions"] = {
        "scan": {**summary(found["scan"]), "partitions": scanned},
        "index": {**summary(found["index"]), "partitions": candidates},
    }
    _create_small(bench, args.rounds, results)
    print(json.dumps(results, indent=2))
    return 0


def _before_the_index(bench: Bench, rounds: int, results: dict[str, Any]) -> int:
    times: list[float] = []
    for broker_id in range(2, 2 + rounds):
        bench.fence(broker_id)
        start = time.perf_counter()
        bench.beat(broker_id)
        times.append(time.perf_counter() - start)
    results["unfence"] = {"scan": summary(times)}
    _create_small(bench, rounds, results)
    print(json.dumps(results, indent=2))
    return 0


def _create_small(bench: Bench, rounds: int, results: dict[str, Any]) -> None:
    """CreateTopics of one partition: the placement cursor was image.partition_count(), a sum over
    topics."""
    logic = bench.logic
    cursor: list[float] = []
    old_cursor: list[float] = []
    for index in range(rounds * 4):
        start = time.perf_counter()
        logic.image.partition_count()
        old_cursor.append(time.perf_counter() - start)
        start = time.perf_counter()
        bench.create(cpb.CreatableTopic(name=f"small-{index}", num_partitions=1, replication_factor=3))
        cursor.append(time.perf_counter() - start)
    results["create_one_partition"] = summary(cursor)
    results["image_partition_count_call"] = summary(old_cursor)


if __name__ == "__main__":
    raise SystemExit(main())
