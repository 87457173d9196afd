"""Microbenchmark: a broker's cost of applying the records of a bulk creation and of a controlled
shutdown, as its metadata fetcher receives them, in one process.

Builds the committed records as the controller writes them — ``--topics`` topics of 1,000 partitions (RF
3, over 1,000 brokers) through ``ControllerLogic.create_topics`` (``bench.follower_replay``'s build), and
broker 1's controlled shutdown of ``--topics`` topics it leads (``bench.shutdown_profile``'s build: one
PartitionChangeRecord per partition) — then feeds them to a real ``MetadataFetcher`` and
``MetadataPublisher`` (broker ``--broker``: hosts its RF-3 share, partition logs in memory, the image
store in memory) through a fake controller answering MetadataFetch with 10,000 records a response (the
controller's default).  CPU (``time.thread_time``) per 10,000 records, in pieces:

- ``parse``: the response's protobuf parse (what the gRPC client does on this thread);
- ``fetch_loop``: ``fetch_once`` less the parse and the publish: reading each record (decoding, replay into
  the delta);
- ``apply``: ``MetadataDelta.apply`` (the new image);
- ``publish_rest``: the rest of ``MetadataPublisher.publish`` (this broker's local changes, its partition
  logs' reaction — opening, leader/follower switches — and the image store's save: in memory, or with
  ``--store sqlite`` the broker's SQLite store, which saves on a thread of its own: ``publish_process``
  and ``total_process`` count every thread's CPU; ``store_thread`` is that thread's alone: the saves).

Run: ``python -m bench.broker_apply [--topics 20] [--rounds 5]``; for an A/B, run it with ``PYTHONPATH``
set to each tree, alternated (docs/internals/raft-performance.md, "A broker's apply of bulk creation and
controlled shutdown").
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.elr_shutdown import PER_TOPIC
from bench.follower_replay import build as build_creation
from bench.shutdown_profile import build as build_shutdown
from kraft.broker.fetcher import FetcherTimings, MetadataFetcher
from kraft.broker.partitions import PartitionManager
from kraft.broker.publisher import ImageStore, MetadataPublisher
from kraft.clock import SystemClock
from kraft.errors import ErrorCode
from kraft.metadata import records as rec
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.procutil import reap_children_on_exit
from kraft.storage.batch import decode_batch
from kraft.v1 import controller_pb2 as cpb
from tests.unit.broker.broker_fakes import MemoryImageStore, MemoryLogOpener

FETCH_RECORDS = 10_000  # kraft.metadata.fetch_server.DEFAULT_FETCH_RECORDS


class _Controller:
    """Answers MetadataFetch from prebuilt responses (built once: not the broker's cost)."""

    def __init__(self, first: int, values: list[bytes]) -> None:
        self.end = first + len(values)
        self.parse_ns = 0
        self.responses: dict[int, bytes] = {}
        for start in range(0, len(values), FETCH_RECORDS):
            records = [
                cpb.CommittedRecord(offset=first + start + i, leader_epoch=1, append_time_ms=1, value=v)
                for i, v in enumerate(values[start : start + FETCH_RECORDS])
            ]
            response = cpb.MetadataFetchResponse(
                error_code=ErrorCode.NONE, high_watermark=self.end, records=records
            )
            self.responses[first + start] = response.SerializeToString()

    async def call(self, pick: Any, request: cpb.MetadataFetchRequest, timeout_s: float, **_: Any) -> Any:
        raw = self.responses.get(request.fetch_offset)
        if raw is None:
            return cpb.MetadataFetchResponse(error_code=ErrorCode.NONE, high_watermark=self.end)
        started = time.thread_time_ns()
        try:
            return cpb.MetadataFetchResponse.FromString(raw)  # as the gRPC client hands it over
        finally:
            self.parse_ns += time.thread_time_ns() - started


def creation_records(topics: int) -> tuple[MetadataImage, int, list[bytes]]:
    base, batches = build_creation(topics, 10**9)
    values = [r.value or b"" for raw in batches for r in decode_batch(raw)[0].records]
    return base, base.offset + 1, values


def shutdown_records(topics: int) -> tuple[MetadataImage, int, list[bytes]]:
    logic, offset, image = build_shutdown(1000, topics, 0, 1000, 5)
    logic.reset(image, 0)
    values: list[bytes] = []
    out = logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id="bench", broker_id=1), offset)
    values += [rec.encode_value(r) for r in out.records]
    while logic.has_bulk_jobs():
        more = getattr(logic, "continue_bulk_values", logic.continue_bulk_jobs)(offset + len(values))
        values += [r if type(r) is bytes else rec.encode_value(r) for r in more]  # (values since session 18)
    return image, offset, values


async def _store(kind: str, root: Path, base: MetadataImage) -> ImageStore:
    if kind == "memory":
        memory = MemoryImageStore()
        memory.image = base
        return memory
    sqlite = await SqliteImageStore.open(root / "image.sqlite", clock=SystemClock())
    await sqlite.save(base)  # (the broker's image before the records: its last save)
    return sqlite


async def one_round(
    broker: int, base: MetadataImage, first: int, values: list[bytes], store_kind: str
) -> dict[str, float]:
    ns = dict.fromkeys(
        ("fetch_once", "publish", "apply", "fetch_once_process", "publish_process", "wall", "publish_wall"), 0
    )
    store_thread_s = 0.0
    with tempfile.TemporaryDirectory(prefix="broker-apply-") as root:
        store = await _store(store_kind, Path(root), base)
        # The SQLite store's own thread (its saves: rows built and written there), None for the memory store.
        thread_cpu_s = store.thread_cpu_s if isinstance(store, SqliteImageStore) else None
        manager = PartitionManager(broker, [Path(root)], MemoryLogOpener())
        publisher = MetadataPublisher(broker, manager, store, "PLAINTEXT", lambda view: None)
        await publisher.start()
        await publisher.open_partitions()
        controller = _Controller(first, values)
        fetcher = MetadataFetcher(
            broker,
            "bench",
            controller,  # type: ignore[arg-type]
            publisher,
            FetcherTimings(max_wait_ms=0, request_timeout_s=5.0),
            lambda offset: None,
            clock=SystemClock(),
        )
        publish = publisher.publish
        apply = MetadataDelta.apply

        async def timed_publish(delta: MetadataDelta, last_record_time_ms: int = 0) -> Any:
            nonlocal store_thread_s
            started, started_process, started_wall = (
                time.thread_time_ns(),
                time.process_time_ns(),
                time.perf_counter_ns(),
            )
            started_store = thread_cpu_s() if thread_cpu_s is not None else None
            try:
                return await publish(delta, last_record_time_ms)
            finally:
                ns["publish"] += time.thread_time_ns() - started
                ns["publish_process"] += time.process_time_ns() - started_process
                ns["publish_wall"] += time.perf_counter_ns() - started_wall
                ended_store = thread_cpu_s() if thread_cpu_s is not None else None
                if started_store is not None and ended_store is not None:
                    store_thread_s += ended_store - started_store

        def timed_apply(delta: MetadataDelta) -> MetadataImage:
            started = time.thread_time_ns()
            try:
                return apply(delta)
            finally:
                ns["apply"] += time.thread_time_ns() - started

        publisher.publish = timed_publish  # type: ignore[method-assign]
        MetadataDelta.apply = timed_apply  # type: ignore[method-assign, assignment]
        gc.collect()
        gc.freeze()  # as the heap freezer leaves a broker's image: collections walk only what is new
        try:
            fetcher.resume_from_publisher()
            while publisher.offset < first + len(values) - 1:
                started, started_process, started_wall = (
                    time.thread_time_ns(),
                    time.process_time_ns(),
                    time.perf_counter_ns(),
                )
                assert await fetcher.fetch_once()
                ns["fetch_once"] += time.thread_time_ns() - started
                ns["fetch_once_process"] += time.process_time_ns() - started_process
                ns["wall"] += time.perf_counter_ns() - started_wall
        finally:
            MetadataDelta.apply = apply  # type: ignore[method-assign]
            gc.unfreeze()
        await publisher.flush()
        manager.close()
        await store.close()
    ns["parse"] = controller.parse_ns
    per_10k = 10_000 / len(values) / 1e6
    return {
        "parse": round(ns["parse"] * per_10k, 1),
        "fetch_loop": round((ns["fetch_once"] - ns["publish"] - ns["parse"]) * per_10k, 1),
        "apply": round(ns["apply"] * per_10k, 1),
        "publish_rest": round((ns["publish"] - ns["apply"]) * per_10k, 1),
        "total": round(ns["fetch_once"] * per_10k, 1),
        # the publish's CPU on every thread (the SQLite store saves on a thread of its own)
        "publish_process": round(ns["publish_process"] * per_10k, 1),
        "total_process": round(ns["fetch_once_process"] * per_10k, 1),
        # wall time (the broker's metadata lag, on an otherwise idle loop): the publish waits for the save
        "publish_wall": round(ns["publish_wall"] * per_10k, 1),
        # the SQLite store's thread during the publishes: the save's CPU (0 for the memory store)
        "store_thread": round(store_thread_s * 1e9 * per_10k, 1),
        "wall": round(ns["wall"] * per_10k, 1),
    }


def main() -> None:
    reap_children_on_exit()  # every bench main binds its children first (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--topics", type=int, default=20, help="topics of 1,000 partitions, each phase")
    parser.add_argument("--broker", type=int, default=5, help="the broker applying (hosts its RF-3 share)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--phases", default="create,shutdown")
    parser.add_argument("--store", choices=("memory", "sqlite"), default="memory", help="the image store")
    args = parser.parse_args()
    assert PER_TOPIC == 1000
    load_before = os.getloadavg()
    builders = {"create": creation_records, "shutdown": shutdown_records}
    out: dict[str, Any] = {
        "benchmark": "broker_apply",
        "topics": args.topics,
        "broker": args.broker,
        "store": args.store,
    }
    for phase in args.phases.split(","):
        base, first, values = builders[phase](args.topics)
        rounds = [
            asyncio.run(one_round(args.broker, base, first, values, args.store)) for _ in range(args.rounds)
        ]
        out[phase] = {
            "records": len(values),
            "median_cpu_ms_per_10k": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]},
            "rounds": rounds,
        }
    out["load_average_before"] = [round(x, 2) for x in load_before]
    out["load_average_after"] = [round(x, 2) for x in os.getloadavg()]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
