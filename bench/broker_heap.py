"""The cyclic GC's full collections on a broker that loads a big snapshot, and what comes after it.

A deferred broker (a new one: below the log start, nothing hosted yet) downloads a snapshot of
``--partitions`` partitions (100-partition topics on brokers 1-6) through ``MetadataFetcher.fetch_once``
from a fake controller that answers every chunk at once (``--chunk`` records each), replays it and loads
it (``MetadataPublisher.load_snapshot``).  Then ``--churn`` rounds of steady work each leave
``--survivors`` new long-lived tracked objects (as applied metadata, replication states and logs do) and
drop as many short-lived ones.  Every full (generation 2) collection is timed through
``gc.callbacks``: how many ran and how long the longest took, during the load and during the churn.
RSS (``VmRSS``) after the load and at the end.

Since session 10 the broker freezes what is alive after each snapshot chunk, after the load and after the
start-up open (``kraft.broker.heap.settle``: the young generations collected, then ``gc.freeze``); the
same file measures a tree without (copy it elsewhere and put the other tree on ``PYTHONPATH``).

Run: ``python -m bench.broker_heap --partitions 100000`` (prints one JSON object).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import tempfile
import time
from pathlib import Path
from typing import Any

from kraft.broker.fetcher import FetcherTimings, MetadataFetcher
from kraft.broker.partitions import PartitionManager
from kraft.broker.publisher import MetadataPublisher
from kraft.clock import SystemClock
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.image_records import image_values
from kraft.metadata.records import wrap
from kraft.procutil import reap_children_on_exit
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb
from tests.unit.broker.broker_fakes import MemoryImageStore, MemoryLogOpener

PER_TOPIC = 100


class _Collections:
    """Every generation-2 collection's duration (ms), from ``gc.callbacks``."""

    def __init__(self) -> None:
        self.full: list[float] = []
        self._started = 0.0
        gc.callbacks.append(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        if info.get("generation") != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.full.append((time.perf_counter() - self._started) * 1000)

    def take(self) -> dict[str, float]:
        full, self.full = self.full, []
        return {"full_collections": len(full), "longest_ms": round(max(full, default=0.0), 1)}


class _SnapshotController:
    """Answers MetadataFetch as a controller whose log starts after ``values``' snapshot."""

    def __init__(self, values: list[bytes], chunk: int) -> None:
        self.values = values
        self.chunk = chunk
        self.snapshot = cpb.SnapshotRef(end_offset=1_000, epoch=1)

    async def call(
        self, method: Any, request: cpb.MetadataFetchRequest, timeout_s: float, *, attempt_timeout_s: float
    ) -> Any:
        if not request.HasField("snapshot_id"):
            return cpb.MetadataFetchResponse(snapshot_id=self.snapshot, high_watermark=1_000)
        start = request.snapshot_position
        end = min(start + self.chunk, len(self.values))
        return cpb.MetadataFetchResponse(
            snapshot_id=self.snapshot,
            snapshot_records=self.values[start:end],
            next_snapshot_position=end,
            snapshot_done=end >= len(self.values),
        )


def _values(partitions: int) -> list[bytes]:
    delta = MetadataDelta(MetadataImage.empty())
    for topic in range(partitions // PER_TOPIC):
        topic_id = f"topic-id-{topic}"
        delta.replay(wrap(mpb.TopicRecord(name=f"topic-{topic}", topic_id=topic_id)))
        for partition in range(PER_TOPIC):
            replicas = [1 + (partition + i) % 6 for i in range(3)]
            record = mpb.PartitionRecord(
                partition_id=partition, topic_id=topic_id, replicas=replicas, isr=replicas, leader=replicas[0]
            )
            delta.replay(wrap(record))
    delta.replay(wrap(mpb.NoOpRecord()), 999, 1)
    return list(image_values(delta.apply()))


def _rss_mib() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return round(int(line.split()[1]) / 1024, 1)
    return -1.0


async def run(partitions: int, chunk: int, churn: int, survivors: int) -> dict[str, Any]:
    values = _values(partitions)
    gc.collect()
    out: dict[str, Any] = {"partitions": partitions, "chunk": chunk, "records": len(values)}
    with tempfile.TemporaryDirectory(prefix="broker-heap-") as root:
        manager = PartitionManager(7, [Path(root)], MemoryLogOpener())  # (broker 7 hosts none of it)
        publisher = MetadataPublisher(7, manager, MemoryImageStore(), "PLAINTEXT", lambda view: None)
        await publisher.start()
        fetcher = MetadataFetcher(
            7,
            "c-1",
            _SnapshotController(values, chunk),  # type: ignore[arg-type]
            publisher,
            FetcherTimings(max_wait_ms=0, request_timeout_s=5.0),
            lambda offset: None,
            clock=SystemClock(),
        )
        del values
        collections = _Collections()
        started = time.thread_time()
        assert await fetcher.fetch_once() and fetcher.snapshots_loaded == 1
        await publisher.flush()
        out["load_cpu_ms"] = round((time.thread_time() - started) * 1000, 1)
        out["load"] = collections.take()
        out["rss_after_load_mib"] = _rss_mib()
        kept: list[list[object]] = []
        for _ in range(churn):
            kept.append([[index] for index in range(survivors)])  # long-lived
            _ = [[index] for index in range(survivors)]  # short-lived
            await asyncio.sleep(0)
        out["churn"] = collections.take()
        out["rss_end_mib"] = _rss_mib()
        out["frozen_objects"] = gc.get_freeze_count()
        manager.close()
    return out


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--partitions", type=int, default=100_000)
    parser.add_argument("--chunk", type=int, default=5_000)
    parser.add_argument("--churn", type=int, default=200)
    parser.add_argument("--survivors", type=int, default=2_000)
    args = parser.parse_args()
    with open("/proc/loadavg") as f:
        load_before = float(f.read().split()[0])
    result = asyncio.run(run(args.partitions, args.chunk, args.churn, args.survivors))
    with open("/proc/loadavg") as f:
        result["loadavg_1m"] = [load_before, float(f.read().split()[0])]
    print(json.dumps(result))


if __name__ == "__main__":
    main()
