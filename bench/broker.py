"""Broker benchmark: image bootstrap, delta apply rate, Produce/Fetch throughput on one leader.

What is measured (results in ``bench/results/broker.json``):

- **bootstrap**: a new broker (hosting none of the partitions yet, as a freshly added broker) starts
  with an empty image store and is told by MetadataFetch that it is below the log start; it downloads
  a snapshot of 1,000,000 partitions (1,000 topics x 1,000 partitions, RF 3 over 3 brokers) in chunks of
  20,000 records over gRPC, replays it into an image, reconciles its partition directories and commits
  the image to the SQLite image store.  ``seconds``: from the first fetch to the image being served
  (target ≤ 10 s); the image grants this broker nothing, so its SQLite commit runs in the background
  and ``seconds_until_stored`` is when that finished.  The snapshot is served by the in-process fake
  controller of the unit tests with pre-encoded record values, so the controller's own cost of
  producing them is not included.
- **delta apply rate**: the broker is a replica of 1,000 partitions; the controller commits leader
  changes (PartitionChangeRecords flipping each partition's leader between this broker and another)
  and the broker applies them — partition roles/epochs on disk, image store, served view.  Records/s from
  the first record appended to the last one applied.
- **produce / fetch**: one leader partition on a real segmented log; a grpc.aio client sends Produce
  batches of 100 records x 100 bytes back to back, then fetches everything with 1 MiB fetches.

- **replication** (issue #16): a local cluster of real processes (1 controller, 3 brokers, ``fast``
  profile, :class:`~kraft.cluster.manager.LocalCluster`), a topic with 3 partitions at replication
  factor 3 (one led by each broker). Produce throughput (records/s, MiB/s) and per-request latency
  p50/p99 for ``acks=1`` vs ``acks=all``, 100-byte and 1 KiB records (batches of ~16 KiB: 160 x 100 B,
  16 x 1 KiB), 1 and 16 concurrent producers (async, in this process; producer *i* writes partition
  *i* mod 3), each configuration for a fixed time; ``acks_all_vs_acks_1`` is the ratio of records/s.
  **Follower catch-up**: one follower of a fresh RF-3 topic is killed, the leader takes ``lag_mib`` of
  acks=1 writes, the follower restarts; MB/s from its first copied byte to its log end reaching the
  leader's (``DescribeBroker``), and the time from its restart (process start and registration included).

Run: ``python -m bench.broker [--quick] [--replication-only] [--catch-up-lag-mib N]`` (``--quick``:
100,000 partitions, fewer records, a 64 MiB lag instead of 256 MiB; ``--replication-only``: only the
replication section, merged into the existing ``broker.json``; ``--catch-up-lag-mib``: the follower's
lag, e.g. 1024 for the issue's "after a 1 GiB lag").  ``--catch-up-merge``: only the catch-up, once, on a
fresh cluster, merged into ``broker.json`` as ``replication.follower_catch_up`` (the one it replaces is
kept as ``follower_catch_up_previous``) with the load average before and after (the host is shared).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS_PATH = REPO_ROOT / "bench" / "results" / "broker.json"
CATCH_UP_PATH = REPO_ROOT / "bench" / "results" / "catch_up.json"  # --catch-up-only: before/after runs
if str(REPO_ROOT) not in sys.path:  # the fake controller lives with the unit tests
    sys.path.insert(0, str(REPO_ROOT))

from kraft.broker.types import BrokerState, TopicPartition  # noqa: E402
from kraft.client.admin import AdminClient  # noqa: E402
from kraft.client.broker import BrokerClient  # noqa: E402
from kraft.client.channel import open_blocking_channel  # noqa: E402
from kraft.clock import SystemClock  # noqa: E402
from kraft.cluster.manager import LocalCluster  # noqa: E402
from kraft.metadata.records import encode_value, wrap  # noqa: E402
from kraft.metadata.store import SqliteImageStore  # noqa: E402
from kraft.netutil import free_port  # noqa: E402
from kraft.node.broker import BrokerServer, BrokerSettings  # noqa: E402
from kraft.observability.logging import configure_logging  # noqa: E402
from kraft.procutil import reap_children_on_exit  # noqa: E402
from kraft.v1 import broker_pb2 as bpb  # noqa: E402
from kraft.v1 import broker_pb2_grpc  # noqa: E402
from kraft.v1 import controller_pb2 as cpb  # noqa: E402
from kraft.v1 import metadata_pb2 as mpb  # noqa: E402
from kraft.v1.common_pb2 import Endpoint  # noqa: E402
from tests.unit.broker.fake_controller import FakeController, FakeSnapshot  # noqa: E402

CLUSTER = "bench-cluster"
NEW_BROKER = 4
CHUNK_RECORDS = 20_000
TIMEOUT_S = 600.0


def settings(base: Path, controller_port: int, broker_id: int) -> BrokerSettings:
    port = free_port()
    return BrokerSettings(
        broker_id=broker_id,
        cluster_id=CLUSTER,
        voters=((1, f"127.0.0.1:{controller_port}"),),
        bind_address=f"127.0.0.1:{port}",
        listeners=(Endpoint(name="PLAINTEXT", host="127.0.0.1", port=port),),
        client_listener="PLAINTEXT",
        rack=None,
        log_dirs=(base / "logs",),
        heartbeat_interval_ms=500,
        session_timeout_ms=600_000,
        registration_timeout_ms=60_000,
        request_timeout_ms=30_000,
        retry_backoff_ms=20,
        fetch_max_wait_ms=200,
        log_segment_bytes=64 << 20,
        max_message_bytes=64 << 20,
        metrics_port=0,
    )


async def wait_for(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not condition():
        if loop.time() > deadline:
            raise TimeoutError(f"benchmark timed out waiting for {what}")
        await asyncio.sleep(0.005)


def snapshot_values(topics: int, partitions_per_topic: int) -> list[bytes]:
    values = [
        encode_value(wrap(mpb.RegisterBrokerRecord(broker_id=b, incarnation_id=f"inc-{b}", broker_epoch=b)))
        for b in (1, 2, 3)
    ]
    for t in range(topics):
        topic_id = f"topic-id-{t:08d}"
        values.append(encode_value(wrap(mpb.TopicRecord(name=f"topic-{t}", topic_id=topic_id))))
        for p in range(partitions_per_topic):
            replicas = [1 + p % 3, 1 + (p + 1) % 3, 1 + (p + 2) % 3]
            record = mpb.PartitionRecord(
                partition_id=p, topic_id=topic_id, replicas=replicas, isr=replicas, leader=replicas[0]
            )
            values.append(encode_value(wrap(record)))
    return values


async def bench_bootstrap(base: Path, topics: int, per_topic: int) -> dict[str, Any]:
    fake = FakeController(CLUSTER)
    fake.snapshot_chunk = CHUNK_RECORDS
    values = snapshot_values(topics, per_topic)
    end_offset = len(values) + 10
    fake.snapshot = FakeSnapshot(end_offset, 1, values)
    fake.log_start = end_offset
    await fake.start()
    store = await SqliteImageStore.open(base / "logs" / "metadata-image.sqlite", clock=SystemClock())
    server = BrokerServer(settings(base, fake.port, NEW_BROKER), store)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        await wait_for(lambda: len(fake.fetch_requests) > 0, "the first fetch")
        started = time.perf_counter()
        await wait_for(lambda: server.fetcher.snapshots_loaded > 0, "the snapshot to load")
        elapsed = time.perf_counter() - started
        await wait_for(lambda: server.publisher.last_snapshot_store_s > 0, "the image to be stored")
        stored = time.perf_counter() - started
        partitions = server.publisher.image.partition_count()
        await wait_for(lambda: server.status.state is BrokerState.RUNNING, "RUNNING")
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await fake.stop()
    return {
        "partitions": partitions,
        "snapshot_records": len(values),
        "chunk_records": CHUNK_RECORDS,
        "seconds": round(elapsed, 3),
        "download_and_replay_seconds": round(server.fetcher.last_snapshot_replay_s, 3),
        "partition_changes_seconds": round(server.publisher.last_snapshot_apply_s, 3),
        # The image grants the new broker nothing, so it is stored in the background (see publisher.py).
        "image_store_seconds": round(server.publisher.last_snapshot_store_s, 3),
        "seconds_until_stored": round(stored, 3),
        "target_seconds": 10.0,
        "meets_target": elapsed <= 10.0,
    }


async def bench_delta_apply(base: Path, partitions: int, changes: int) -> dict[str, Any]:
    fake = FakeController(CLUSTER)
    fake.append(mpb.TopicRecord(name="hot", topic_id="topic-hot"))
    for p in range(partitions):
        fake.append(
            mpb.PartitionRecord(partition_id=p, topic_id="topic-hot", replicas=[1, 2], isr=[1, 2], leader=1)
        )
    await fake.start()
    store = await SqliteImageStore.open(base / "logs" / "metadata-image.sqlite", clock=SystemClock())
    server = BrokerServer(settings(base, fake.port, 1), store)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    try:
        await wait_for(lambda: server.status.state is BrokerState.RUNNING, "RUNNING")
        started = time.perf_counter()
        last = -1
        for i in range(changes):
            leader = 2 if (i // partitions) % 2 == 0 else 1
            last = fake.append(
                mpb.PartitionChangeRecord(partition_id=i % partitions, topic_id="topic-hot", leader=leader)
            )
            if i % 1000 == 999:
                await asyncio.sleep(0)  # let the broker's fetch see records while they are being committed
        await wait_for(lambda: server.publisher.offset >= last, "the last change to apply")
        elapsed = time.perf_counter() - started
        roles_ok = all(
            p.leader_id == server.publisher.image.topic("hot").partitions[p.tp.partition].leader  # type: ignore[union-attr]
            for p in server.partitions.partitions()
        )
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await fake.stop()
    return {
        "local_partitions": partitions,
        "records": changes,
        "seconds": round(elapsed, 3),
        "records_per_second": round(changes / elapsed),
        "roles_match_image": roles_ok,
    }


async def bench_produce_fetch(base: Path, batches: int) -> dict[str, Any]:
    fake = FakeController(CLUSTER)
    fake.append(mpb.TopicRecord(name="data", topic_id="topic-data"))
    fake.append(mpb.PartitionRecord(partition_id=0, topic_id="topic-data", replicas=[1], isr=[1], leader=1))
    await fake.start()
    store = await SqliteImageStore.open(base / "logs" / "metadata-image.sqlite", clock=SystemClock())
    broker_settings = settings(base, fake.port, 1)
    server = BrokerServer(broker_settings, store)
    stop = asyncio.Event()
    task = asyncio.create_task(server.run(stop))
    batch = [(None, os.urandom(100)) for _ in range(100)]
    try:
        await wait_for(lambda: server.status.state is BrokerState.RUNNING, "RUNNING")
        async with BrokerClient([broker_settings.listeners[0].host + f":{server.port}"]) as client:
            started = time.perf_counter()
            for _ in range(batches):
                response = await client.produce("data", 0, batch)
                if response.error_code:
                    raise RuntimeError(f"produce failed: {response.error_message}")
            produce_s = time.perf_counter() - started
            total = batches * len(batch)
            started = time.perf_counter()
            offset = 0
            while offset < total:
                fetched = await client.fetch("data", 0, offset, max_bytes=1 << 20)
                offset = fetched.records[-1].offset + 1
            fetch_s = time.perf_counter() - started
        partition = server.partitions.get(TopicPartition("data", 0))
        assert partition is not None and partition.log.log_end_offset == total
    finally:
        stop.set()
        await asyncio.wait_for(task, 60)
        await fake.stop()
    mib = total * 100 / (1 << 20)
    return {
        "records": total,
        "record_bytes": 100,
        "records_per_request": len(batch),
        "produce_records_per_second": round(total / produce_s),
        "produce_mib_per_second": round(mib / produce_s, 2),
        "fetch_records_per_second": round(total / fetch_s),
        "fetch_mib_per_second": round(mib / fetch_s, 2),
    }


async def run(quick: bool, lag_mib: int | None = None) -> dict[str, Any]:
    configure_logging("WARNING")
    results: dict[str, Any] = {
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        },
        "quick": quick,
    }
    with tempfile.TemporaryDirectory() as tmp:
        topics = 100 if quick else 1000
        results["bootstrap"] = await bench_bootstrap(Path(tmp) / "bootstrap", topics, 1000)
    with tempfile.TemporaryDirectory() as tmp:
        results["delta_apply"] = await bench_delta_apply(
            Path(tmp) / "delta", 1000, 5_000 if quick else 20_000
        )
    with tempfile.TemporaryDirectory() as tmp:
        results["produce_fetch"] = await bench_produce_fetch(Path(tmp) / "data", 200 if quick else 1000)
    results["replication"] = await bench_replication(quick, lag_mib)
    results["machine"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


# --- replication (issue #16) -------------------------------------------------------------------------


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def _produce_load(
    bootstrap: str, topic: str, acks: int, record_bytes: int, producers: int, seconds: float
) -> dict[str, Any]:
    per_request = max(1, 16_000 // record_bytes)
    batch = [(None, os.urandom(record_bytes)) for _ in range(per_request)]
    latencies: list[float] = []
    async with BrokerClient(bootstrap.split(","), request_timeout_s=30.0) as client:
        for p in range(3):  # learn the leaders before the clock starts
            await client.produce(topic, p, batch[:1], acks=acks)
        deadline = time.perf_counter() + seconds

        async def producer(index: int) -> None:
            partition = index % 3
            while time.perf_counter() < deadline:
                started = time.perf_counter()
                response = await client.produce(topic, partition, batch, acks=acks)
                if response.error_code:
                    raise RuntimeError(f"produce failed: {response.error_code} {response.error_message}")
                latencies.append(time.perf_counter() - started)

        started = time.perf_counter()
        await asyncio.gather(*(producer(i) for i in range(producers)))
        elapsed = time.perf_counter() - started
    latencies.sort()
    records = len(latencies) * per_request
    return {
        "acks": "all" if acks == -1 else str(acks),
        "record_bytes": record_bytes,
        "producers": producers,
        "records_per_request": per_request,
        "records_per_second": round(records / elapsed),
        "mib_per_second": round(records * record_bytes / elapsed / (1 << 20), 2),
        "latency_p50_ms": round(_percentile(latencies, 0.50) * 1000, 2),
        "latency_p99_ms": round(_percentile(latencies, 0.99) * 1000, 2),
        "requests": len(latencies),
    }


def _describe_log_end(target: str, topic: str, cluster_id: str) -> int | None:
    channel = open_blocking_channel(target)
    try:
        # The broker refuses a DescribeBroker without the cluster id (INCONSISTENT_CLUSTER_ID, no
        # partitions), which read here as "no such partition" and left the catch-up waiting forever.
        answer = broker_pb2_grpc.BrokerServiceStub(channel).DescribeBroker(
            bpb.DescribeBrokerRequest(cluster_id=cluster_id), timeout=2
        )
    except Exception:
        return None
    finally:
        channel.close()
    return next((p.log_end_offset for p in answer.partitions if p.topic == topic and p.partition == 0), None)


async def _catch_up(cluster: Any, bootstrap: str, admin_target: str, lag_mib: int) -> dict[str, Any]:
    brokers = [n for n in cluster.spec.brokers]
    leader, follower = brokers[0], brokers[2]
    async with AdminClient([admin_target], clock=SystemClock()) as admin:
        await admin.call(
            lambda stub: stub.CreateTopics,
            cpb.CreateTopicsRequest(
                topics=[
                    cpb.CreatableTopic(
                        name="catchup",
                        num_partitions=-1,
                        replication_factor=-1,
                        assignments=[
                            cpb.ReplicaAssignment(partition=0, broker_ids=[b.node_id for b in brokers])
                        ],
                    )
                ]
            ),
        )
    await asyncio.sleep(1.0)
    cluster.kill(follower.node_id)
    record_bytes, per_request = 1024, 64
    batch = [(None, os.urandom(record_bytes)) for _ in range(per_request)]
    requests = lag_mib * (1 << 20) // (record_bytes * per_request)
    producing = time.perf_counter()
    async with BrokerClient([leader.target], request_timeout_s=30.0) as client:
        pending: set[asyncio.Task[Any]] = set()
        answers = []
        for _ in range(requests):
            pending.add(asyncio.create_task(client.produce("catchup", 0, batch, acks=1)))
            if len(pending) >= 8:
                done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                answers += [task.result() for task in done]
        answers += await asyncio.gather(*pending)
    failed = [a for a in answers if a.error_code]
    if failed:
        raise RuntimeError(f"catch-up produce failed: {failed[0].error_code} {failed[0].error_message}")
    produced_s = time.perf_counter() - producing
    target_end = None
    deadline = time.perf_counter() + TIMEOUT_S
    while target_end is None and time.perf_counter() < deadline:  # a busy leader may miss the 2 s bound
        target_end = await asyncio.to_thread(
            _describe_log_end, leader.target, "catchup", cluster.spec.cluster_id
        )
    if target_end is None:
        raise RuntimeError("the leader did not describe its log")
    lag_bytes = requests * per_request * (record_bytes + 8)  # approximate stored bytes (value + overhead)
    start_before = await asyncio.to_thread(
        _describe_log_end, follower.target, "catchup", cluster.spec.cluster_id
    )
    restarted = time.perf_counter()
    cluster.start([follower.node_id])
    first_progress: float | None = None
    begin_offset: int | None = None
    while True:
        end = await asyncio.to_thread(_describe_log_end, follower.target, "catchup", cluster.spec.cluster_id)
        now = time.perf_counter()
        if end is not None:
            if begin_offset is None:
                begin_offset = end
            if first_progress is None and end > begin_offset:
                first_progress = now
            if end >= target_end:
                break
        if now - restarted > TIMEOUT_S:
            raise RuntimeError("the follower did not catch up")
        await asyncio.sleep(0.05)
    done_at = time.perf_counter()
    copied_fraction = (target_end - (begin_offset or 0)) / max(target_end, 1)
    copying_s = max(done_at - (first_progress or restarted), 1e-3)
    return {
        "lag_mib": lag_mib,
        "lag_records": target_end,
        "follower_offset_before_restart": start_before,
        "seconds_from_restart": round(done_at - restarted, 2),
        "seconds_copying": round(copying_s, 2),
        "mb_per_second": round(lag_bytes * copied_fraction / copying_s / 1e6, 1),
        "seconds_producing_the_lag": round(produced_s, 2),
    }


def _lag_mib(quick: bool, lag_mib: int | None) -> int:
    return lag_mib if lag_mib is not None else 64 if quick else 256


async def bench_catch_up(quick: bool, lag_mib: int | None = None) -> dict[str, Any]:
    """Only the follower catch-up of :func:`bench_replication`, on a fresh cluster."""
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", controllers=1, brokers=3, profile="fast")
        cluster.start()
        try:
            await asyncio.to_thread(cluster.wait_healthy, 90)
            bootstrap = ",".join(b.target for b in cluster.spec.brokers)
            return await _catch_up(
                cluster, bootstrap, cluster.spec.controllers[0].target, _lag_mib(quick, lag_mib)
            )
        finally:
            cluster.down()


async def bench_replication(quick: bool, lag_mib: int | None = None) -> dict[str, Any]:
    seconds = 3.0 if quick else 8.0
    with tempfile.TemporaryDirectory() as tmp:
        cluster = LocalCluster.create(Path(tmp) / "cluster", controllers=1, brokers=3, profile="fast")
        cluster.start()
        try:
            await asyncio.to_thread(cluster.wait_healthy, 90)
            bootstrap = ",".join(b.target for b in cluster.spec.brokers)
            controller = cluster.spec.controllers[0].target
            ids = [b.node_id for b in cluster.spec.brokers]
            async with AdminClient([controller], clock=SystemClock()) as admin:
                for size in (100, 1024):
                    await admin.call(
                        lambda stub: stub.CreateTopics,
                        cpb.CreateTopicsRequest(
                            topics=[
                                cpb.CreatableTopic(
                                    name=f"load-{size}",
                                    num_partitions=-1,
                                    replication_factor=-1,
                                    assignments=[
                                        cpb.ReplicaAssignment(partition=p, broker_ids=ids[p:] + ids[:p])
                                        for p in range(3)
                                    ],
                                )
                            ]
                        ),
                    )
            await asyncio.sleep(1.0)
            runs = []
            for size in (100, 1024):
                for producers in (1, 16):
                    for acks in (1, -1):
                        runs.append(
                            await _produce_load(bootstrap, f"load-{size}", acks, size, producers, seconds)
                        )
            ratios = {}
            for size in (100, 1024):
                for producers in (1, 16):
                    pair = {
                        r["acks"]: r
                        for r in runs
                        if r["record_bytes"] == size and r["producers"] == producers
                    }
                    ratios[f"{size}B_{producers}p"] = round(
                        pair["all"]["records_per_second"] / pair["1"]["records_per_second"], 2
                    )
            catch_up = await _catch_up(cluster, bootstrap, controller, _lag_mib(quick, lag_mib))
        finally:
            cluster.down()
    return {
        "cluster": "1 controller + 3 broker processes (fast profile); 3 partitions, RF 3, one led per broker",
        "seconds_per_run": seconds,
        "produce": runs,
        "acks_all_vs_acks_1": ratios,
        "follower_catch_up": catch_up,
    }


def _catch_up_merge(quick: bool, lag_mib: int | None) -> None:
    """One catch-up on a fresh cluster, merged into broker.json's replication section."""
    load_before = [round(x, 2) for x in os.getloadavg()]
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    result = asyncio.run(bench_catch_up(quick, lag_mib))
    result["measured"] = {
        "run": "python -m bench.broker --catch-up-merge (only the catch-up, fresh cluster, not niced)",
        "started_utc": started,
        "load_average_before": load_before,
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
        "cpus": os.cpu_count(),
    }
    results = json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.exists() else {}
    replication = results.setdefault("replication", {})
    if "follower_catch_up" in replication:
        replication["follower_catch_up_previous"] = replication["follower_catch_up"]
    replication["follower_catch_up"] = result
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(result, indent=2))


def main() -> None:
    reap_children_on_exit()  # no node, server or child outlives the benchmark (kraft.procutil)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="smaller sizes (a smoke run)")
    parser.add_argument(
        "--replication-only", action="store_true", help="only the replication section (merged into the file)"
    )
    parser.add_argument(
        "--catch-up-only",
        metavar="LABEL",
        help=f"only the follower catch-up, --repeat times; recorded under LABEL in {CATCH_UP_PATH.name}",
    )
    parser.add_argument("--repeat", type=int, default=2, help="catch-up runs per --catch-up-only label")
    parser.add_argument(
        "--catch-up-lag-mib",
        type=int,
        metavar="N",
        help="the follower's lag in MiB for the catch-up (default 256, 64 with --quick)",
    )
    parser.add_argument(
        "--catch-up-merge",
        action="store_true",
        help="only the follower catch-up, once; merged into broker.json as replication.follower_catch_up",
    )
    args = parser.parse_args()
    lag_mib: int | None = args.catch_up_lag_mib
    if lag_mib is not None and not 1 <= lag_mib <= 64 << 10:
        parser.error(f"--catch-up-lag-mib must be between 1 and {64 << 10}, not {lag_mib}")
    if args.catch_up_merge:
        _catch_up_merge(args.quick, lag_mib)
        return
    if args.catch_up_only:
        runs = [asyncio.run(bench_catch_up(args.quick, lag_mib)) for _ in range(args.repeat)]
        recorded = json.loads(CATCH_UP_PATH.read_text()) if CATCH_UP_PATH.exists() else {}
        recorded[args.catch_up_only] = {
            "runs": runs,
            "best_mb_per_second": max(r["mb_per_second"] for r in runs),
        }
        CATCH_UP_PATH.write_text(json.dumps(recorded, indent=2) + "\n")
        print(json.dumps(recorded[args.catch_up_only], indent=2))
        return
    if args.replication_only:
        results = json.loads(RESULTS_PATH.read_text()) if RESULTS_PATH.exists() else {}
        results["replication"] = asyncio.run(bench_replication(args.quick, lag_mib))
    else:
        results = asyncio.run(run(args.quick, lag_mib))
    RESULTS_PATH.parent.mkdir(parents=True, exist_ok=True)
    RESULTS_PATH.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
