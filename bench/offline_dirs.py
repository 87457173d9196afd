"""Microbenchmark: what the offline-dir election guard costs the controller's bulk paths.

Builds, through ControllerLogic, ``--topics`` x ``--per-topic`` partitions (RF 3) on three unfenced
brokers, optionally has broker 3 report ``--offline`` partitions of ``topic-0`` on an offline log dir (the
guard is then active for every election), then times fencing broker 1 (its leave job over every
partition, run to the end) and unfencing it (the rejoin elections).  Prints JSON.  For an A/B against an
older commit run it with that commit's ``kraft`` first on PYTHONPATH (``git archive <commit> kraft``);
``--offline`` needs this commit or later.

Run: ``python -m bench.offline_dirs [--offline 1000]`` (100,000 partitions: ~10 s).
"""

from __future__ import annotations

import argparse
import gc
import json
import time
from typing import Any

from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings, Outcome
from kraft.metadata.image import MetadataImage
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb

CLUSTER = "bench"


class Bench:
    def __init__(self, topics: int, per_topic: int) -> None:
        settings = ControllerSettings(
            CLUSTER,
            max_partitions=10**9,
            max_broker_partitions=10**9,
            max_changes_per_write=250,
            max_event_time_ms=0,  # slices by record count only: the same slices on every run
        )
        self.logic = ControllerLogic(settings, MetadataImage.empty(), 0)
        self.offset = 0
        self.epochs: dict[int, int] = {}
        for broker_id in (1, 2, 3):
            request = cpb.RegisterBrokerRequest(
                cluster_id=CLUSTER, broker_id=broker_id, incarnation_id=f"i{broker_id}"
            )
            request.listeners.add(name="PLAINTEXT", host="127.0.0.1", port=10_000 + broker_id)
            registered = self.logic.register_broker(request, 0, self.offset)
            self._count(registered)
            self.epochs[broker_id] = registered.response.broker_epoch
        for broker_id in (1, 2, 3):
            self.beat(broker_id)
        for index in range(topics):
            topic = cpb.CreatableTopic(name=f"topic-{index}", num_partitions=per_topic, replication_factor=3)
            create = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
            self._count(self.logic.create_topics(create, self.offset))
        self.drain()

    def _count(self, outcome: Outcome[Any]) -> None:
        self.offset += len(outcome.records)

    def beat(self, broker_id: int, want_fence: bool = False, offline: int = 0) -> None:
        request = cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER,
            broker_id=broker_id,
            broker_epoch=self.epochs[broker_id],
            current_metadata_offset=self.offset,
            want_fence=want_fence,
        )
        for partition in range(offline):
            request.offline_partitions.add(topic="topic-0", partition=partition)
        self._count(self.logic.broker_heartbeat(request, 0, self.offset))

    def drain(self) -> None:
        while self.logic.has_bulk_jobs():
            self.offset += len(
                getattr(self.logic, "continue_bulk_values", self.logic.continue_bulk_jobs)(self.offset)
            )


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(prog="python -m bench.offline_dirs", description=__doc__.splitlines()[0])
    parser.add_argument("--topics", type=int, default=100)
    parser.add_argument("--per-topic", type=int, default=1000)
    parser.add_argument("--offline", type=int, default=0, help="topic-0 partitions broker 3 reports offline")
    args = parser.parse_args()
    bench = Bench(args.topics, args.per_topic)
    if args.offline:
        bench.beat(3, offline=args.offline)
        bench.drain()
    while not bench.logic.index_some():
        pass
    gc.collect()
    gc.freeze()
    started = time.perf_counter()
    bench.beat(1, want_fence=True)
    bench.drain()
    fenced = time.perf_counter()
    bench.beat(1)
    bench.drain()
    unfenced = time.perf_counter()
    print(
        json.dumps(
            {
                "partitions": args.topics * args.per_topic,
                "offline": args.offline,
                "fence_s": round(fenced - started, 3),
                "unfence_s": round(unfenced - fenced, 3),
            }
        )
    )


if __name__ == "__main__":
    main()
