"""The data-plane workload (issue #16): acks=all producers on a replicated topic while brokers fail.

``chaos-data`` has :data:`DATA_PARTITIONS` partitions with replication factor 3 (the controller places
them).  One producer per partition sends one record at a time with ``acks=-1`` to the broker it believes
leads the partition, and on any error asks a broker's Metadata who leads now.  Each produce is one
operation of the history (``f = "produce-all"``, key ``chaos-data-<p>``, value = the record's text):

- NONE → ``ok`` with the acknowledged base offset as result;
- NOT_ENOUGH_REPLICAS (refused before the append) → ``fail``;
- anything else (a gRPC error, NOT_LEADER_OR_FOLLOWER — which a waiting acks=all request also gets when
  leadership moves after the append —, NOT_ENOUGH_REPLICAS_AFTER_APPEND, REQUEST_TIMED_OUT…) → ``info``:
  the record may or may not be in the log; the producer continues as a new process.

After the run (everything healed) :func:`read_final` waits until every partition has a leader and a whole
ISR, then reads it from the leader below its high watermark with consumer Fetches; after the cluster
stopped, :func:`read_replica_logs` reads every replica's partition files.  The checkers are in
:mod:`chaos.checkers.data_plane`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

from chaos.checkers.data_plane import DATA_CONSUME, DATA_PRODUCE, IsrSample, PartitionRead, ReplicaLog
from chaos.history import EventType, HistoryStore
from chaos.produce import produce_acks_all
from kraft.broker.types import TopicPartition
from kraft.client.channel import open_channel
from kraft.errors import ErrorCode
from kraft.storage.batch import iter_batches
from kraft.storage.log import SegmentedLog
from kraft.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc

DATA_TOPIC = "chaos-data"
DATA_PARTITIONS = 2
DATA_REPLICATION = 3
# acks=all needs two replicas: with two of three brokers down (or a leader cut off from its followers)
# writes are refused with NOT_ENOUGH_REPLICAS, never acknowledged by the leader alone.
DATA_MIN_INSYNC_REPLICAS = 2
DATA_PROCESS_BASE = 2_000_000  # process ids of data-plane producers
CONSUMER_PROCESS_BASE = 3_000_000  # process ids of data-plane consumers
CONSUME_WAIT_MS = 200
CONSUME_MAX_BYTES = 64 * 1024
ISR_PROBE_INTERVAL_S = 0.1
# No gRPC-level retries (each request is one operation), and reconnect attempts at most 500 ms apart:
# with gRPC's default backoff (1 s growing to 120 s) a channel to a broker that was killed and restarted,
# or cut off for a while, answers UNAVAILABLE at once for many seconds after it is back.
CHANNEL_OPTIONS = (
    ("grpc.enable_retries", 0),
    ("grpc.initial_reconnect_backoff_ms", 100),
    # gRPC core's minimum time for one connection attempt, not a backoff (kraft.raft.grpc_transport's
    # channel_options say why it is not 100 ms: a loaded host's handshake failed calls at once)
    ("grpc.min_reconnect_backoff_ms", 500),
    ("grpc.max_reconnect_backoff_ms", 500),
)
# Broker settings of a data-plane run: followers that stop fetching leave the ISR within the short
# pace's faults (Kafka's default, 30 s, would outlast them all).
DATA_PLANE_OVERRIDES = {"replica.lag.time.max.ms": "1500", "replica.fetch.wait.max.ms": "200"}
SETUP_TIMEOUT_S = 20.0
READ_BATCH_BYTES = 1 << 20


def data_key(partition: int) -> str:
    return f"{DATA_TOPIC}-{partition}"


async def create_data_topic(cluster_id: str, controller_targets: Sequence[str]) -> None:
    """Create ``chaos-data`` (RF 3); retries every controller until one accepts it."""
    topic = controller_pb2.CreatableTopic(
        name=DATA_TOPIC,
        num_partitions=DATA_PARTITIONS,
        replication_factor=DATA_REPLICATION,
        configs=[controller_pb2.TopicConfig(name="min.insync.replicas", value=str(DATA_MIN_INSYNC_REPLICAS))],
    )
    request = controller_pb2.CreateTopicsRequest(cluster_id=cluster_id, topics=[topic])
    deadline = time.monotonic() + SETUP_TIMEOUT_S
    last = "no controller answered"
    while time.monotonic() < deadline:
        for target in controller_targets:
            async with open_channel(target) as channel:
                stub: Any = controller_pb2_grpc.ControllerServiceStub(channel)
                try:
                    response = await stub.CreateTopics(request, timeout=2.0)
                except grpc.aio.AioRpcError as err:
                    last = f"{target}: {err.code().name}"
                    continue
            code = ErrorCode.from_wire(response.error_code or response.topics[0].error_code)
            if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                return
            last = f"{target}: {code.name}"
        await asyncio.sleep(0.3)
    raise TimeoutError(f"could not create {DATA_TOPIC}: {last}")


async def _partitions(
    stub: Any, cluster_id: str, timeout_s: float = 2.0
) -> dict[int, tuple[int, int, tuple[int, ...]]] | None:
    """partition → (leader, leader epoch, ISR) from one broker's Metadata; None on an error."""
    request = broker_pb2.BrokerMetadataRequest(cluster_id=cluster_id, topics=[DATA_TOPIC])
    try:
        response = await stub.Metadata(request, timeout=timeout_s)
    except grpc.aio.AioRpcError:
        return None
    if response.error_code != 0:
        return None
    found: dict[int, tuple[int, int, tuple[int, ...]]] = {}
    for topic in response.topics:
        if topic.name == DATA_TOPIC:
            for p in topic.partitions:
                found[p.partition] = (p.leader, p.leader_epoch, tuple(p.isr))
    return found


async def _leaders(stub: Any, cluster_id: str) -> dict[int, tuple[int, int, int]] | None:
    """partition → (leader, leader epoch, ISR size) from one broker's Metadata; None on an error."""
    found = await _partitions(stub, cluster_id)
    if found is None:
        return None
    return {p: (leader, epoch, len(isr)) for p, (leader, epoch, isr) in found.items()}


async def find_leader(stubs: Mapping[int, Any], cluster_id: str, partition: int, attempt: int) -> int:
    """Who leads ``partition`` according to the brokers' Metadata (asked in turn from ``attempt``);
    a broker in turn when none names a known one."""
    brokers = sorted(stubs)
    for i in range(len(brokers)):
        leaders = await _leaders(stubs[brokers[(attempt + i) % len(brokers)]], cluster_id)
        if leaders is not None and leaders.get(partition, (-1, -1, 0))[0] in stubs:
            return leaders[partition][0]
    return brokers[attempt % len(brokers)]


class DataPlaneWorkload:
    def __init__(
        self,
        store: HistoryStore,
        cluster_id: str,
        broker_targets: Mapping[int, str],
        op_timeout_s: float = 3.0,
        pause_s: float = 0.02,
    ) -> None:
        self._store = store
        self._cluster_id = cluster_id
        self._targets = dict(broker_targets)
        self._op_timeout_s = op_timeout_s
        self._pause_s = pause_s
        self._next_process = DATA_PROCESS_BASE
        self.broker_of: dict[int, int] = {}  # producer process -> the broker it sends to

    def _new_process(self, broker: int) -> int:
        process, self._next_process = self._next_process, self._next_process + 1
        self.broker_of[process] = broker
        return process

    async def run(self, duration_s: float) -> None:
        deadline = time.monotonic() + duration_s
        async with contextlib.AsyncExitStack() as stack:
            stubs = await _broker_stubs(stack, self._targets)
            await asyncio.gather(*(self._producer(p, stubs, deadline) for p in range(DATA_PARTITIONS)))

    async def _producer(self, partition: int, stubs: Mapping[int, Any], deadline: float) -> None:
        sequence = 0
        attempt = 0
        leader = await find_leader(stubs, self._cluster_id, partition, 0)
        process = self._new_process(leader)
        while time.monotonic() < deadline:
            value = f"p{partition}-{sequence}"
            invoked = await self._store.invoke(process, DATA_PRODUCE, data_key(partition), value)
            outcome, result, error = await self._produce(stubs[leader], partition, value)
            await self._store.complete(invoked.op_id, outcome, result, error)
            sequence += 1
            if outcome is not EventType.OK:
                attempt += 1
                found = await find_leader(stubs, self._cluster_id, partition, attempt)
                # A new process per target broker (the checkers tell whom a produce went to), and
                # after an info, whose request may still take effect.
                if outcome is EventType.INFO or found != leader:
                    process = self._new_process(found)
                leader = found
            await asyncio.sleep(self._pause_s)

    async def _produce(self, stub: Any, partition: int, value: str) -> tuple[EventType, Any, str | None]:
        code, offset, message = await produce_acks_all(
            stub, self._cluster_id, DATA_TOPIC, partition, value.encode(), self._op_timeout_s
        )
        if code is None:
            return EventType.INFO, None, message
        if code is ErrorCode.NONE:
            return EventType.OK, offset, None
        if code is ErrorCode.NOT_ENOUGH_REPLICAS:
            return EventType.FAIL, None, message
        return EventType.INFO, None, message


class DataConsumers:
    """One consumer per partition reading from the broker it believes leads, through the client proxies
    (never cut): a leader cut off from the quorum keeps answering it until it learns otherwise.  Each
    consumer Fetch (long-poll) is one operation, ``f = "consume"``, value = the fetch offset; ``ok`` with
    result ``{"broker", "hwm", "records": [[offset, value], ...]}``, ``fail`` with the error otherwise
    (a read has no effect).  The consumer moves on from the last record read; on an error it asks a
    broker's Metadata who leads and goes there (a new process per broker)."""

    def __init__(
        self,
        store: HistoryStore,
        cluster_id: str,
        broker_targets: Mapping[int, str],
        op_timeout_s: float = 3.0,
    ) -> None:
        self._store = store
        self._cluster_id = cluster_id
        self._targets = dict(broker_targets)
        self._op_timeout_s = op_timeout_s
        self._next_process = CONSUMER_PROCESS_BASE

    async def run(self, duration_s: float) -> None:
        deadline = time.monotonic() + duration_s
        async with contextlib.AsyncExitStack() as stack:
            stubs = await _broker_stubs(stack, self._targets)
            await asyncio.gather(*(self._consumer(p, stubs, deadline) for p in range(DATA_PARTITIONS)))

    async def _consumer(self, partition: int, stubs: Mapping[int, Any], deadline: float) -> None:
        offset = 0
        attempt = 0
        broker = await find_leader(stubs, self._cluster_id, partition, 0)
        process = self._new_process()
        while time.monotonic() < deadline:
            invoked = await self._store.invoke(process, DATA_CONSUME, data_key(partition), offset)
            request = broker_pb2.BrokerFetchRequest(
                cluster_id=self._cluster_id,
                topic=DATA_TOPIC,
                partition=partition,
                offset=offset,
                max_bytes=CONSUME_MAX_BYTES,
                leader_epoch=-1,
                max_wait_ms=CONSUME_WAIT_MS,
            )
            error: str | None
            try:
                response = await stubs[broker].Fetch(request, timeout=self._op_timeout_s)
            except grpc.aio.AioRpcError as err:
                response, error = None, err.code().name
            else:
                code = ErrorCode.from_wire(response.error_code)
                error = None if code is ErrorCode.NONE else f"{code.name} {response.error_message}"
            if response is not None and error is None:
                read = [
                    (int(r.offset), bytes(r.value).decode()) for r in response.records if r.offset >= offset
                ]
                records = [[o, v] for o, v in read]
                result = {"broker": broker, "hwm": int(response.high_watermark), "records": records}
                await self._store.complete(invoked.op_id, EventType.OK, result)
                if read:
                    offset = read[-1][0] + 1
                continue
            await self._store.complete(invoked.op_id, EventType.FAIL, {"broker": broker}, error)
            if response is not None and response.error_code == ErrorCode.OFFSET_OUT_OF_RANGE.value:
                offset = max(offset, int(response.log_start_offset))
            attempt += 1
            found = await find_leader(stubs, self._cluster_id, partition, attempt)
            if found != broker:
                process = self._new_process()
            broker = found
            await asyncio.sleep(0.05)

    def _new_process(self) -> int:
        process, self._next_process = self._next_process, self._next_process + 1
        return process


class IsrProbe:
    """Samples every broker's own view of the data topic (Metadata on its real listener, never cut)
    every :data:`ISR_PROBE_INTERVAL_S`: the leader, leader epoch and ISR its image holds, with the
    send and answer times, for :func:`chaos.checkers.data_plane.under_min_isr_intervals`."""

    def __init__(self, cluster_id: str, broker_targets: Mapping[int, str]) -> None:
        self._cluster_id = cluster_id
        self._targets = dict(broker_targets)
        self.samples: list[IsrSample] = []

    async def run(self, stop: asyncio.Event) -> None:
        async with contextlib.AsyncExitStack() as stack:
            stubs = await _broker_stubs(stack, self._targets)
            await asyncio.gather(*(self._probe(b, stub, stop) for b, stub in stubs.items()))

    async def _probe(self, broker: int, stub: Any, stop: asyncio.Event) -> None:
        while not stop.is_set():
            sent = time.monotonic_ns()
            found = await _partitions(stub, self._cluster_id, timeout_s=1.0)
            answered = time.monotonic_ns()
            for partition, (leader, epoch, isr) in sorted((found or {}).items()):
                self.samples.append(IsrSample(broker, partition, sent, answered, leader, epoch, isr))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ISR_PROBE_INTERVAL_S)


async def read_final(
    cluster_id: str, broker_targets: Mapping[int, str], timeout_s: float
) -> dict[int, PartitionRead] | None:
    """Once every partition has a leader and all replicas in its ISR: each leader's records below its
    high watermark (consumer Fetches from offset 0).  None if that state is not reached in time."""
    deadline = time.monotonic() + timeout_s
    async with contextlib.AsyncExitStack() as stack:
        stubs = await _broker_stubs(stack, broker_targets)
        while time.monotonic() < deadline:
            reads = await _read_once(cluster_id, stubs)
            if reads is not None:
                return reads
            await asyncio.sleep(0.3)
    return None


async def _read_once(cluster_id: str, stubs: Mapping[int, Any]) -> dict[int, PartitionRead] | None:
    for broker in sorted(stubs):
        leaders = await _leaders(stubs[broker], cluster_id)
        if leaders is None or len(leaders) < DATA_PARTITIONS:
            continue
        if any(leader not in stubs or isr < DATA_REPLICATION for leader, _, isr in leaders.values()):
            return None
        reads: dict[int, PartitionRead] = {}
        for partition, (leader, epoch, _) in sorted(leaders.items()):
            read = await _read_partition(stubs[leader], cluster_id, partition, leader, epoch)
            if read is None:
                return None
            reads[partition] = read
        return reads
    return None


async def _read_partition(
    stub: Any, cluster_id: str, partition: int, leader: int, epoch: int
) -> PartitionRead | None:
    records: dict[int, bytes] = {}
    offset = 0
    start = 0
    while True:
        request = broker_pb2.BrokerFetchRequest(
            cluster_id=cluster_id,
            topic=DATA_TOPIC,
            partition=partition,
            offset=offset,
            max_bytes=READ_BATCH_BYTES,
            leader_epoch=epoch,
            max_wait_ms=0,
        )
        try:
            response = await stub.Fetch(request, timeout=5.0)
        except grpc.aio.AioRpcError:
            return None
        code = ErrorCode.from_wire(response.error_code)
        if code is ErrorCode.OFFSET_OUT_OF_RANGE and offset == 0:
            offset = start = int(response.log_start_offset)
            continue
        if code is not ErrorCode.NONE:
            return None
        hwm = int(response.high_watermark)
        for record in response.records:
            records[int(record.offset)] = bytes(record.value)
        if not response.records or offset >= hwm:
            return PartitionRead(partition, leader, hwm, records, start)
        offset = int(response.records[-1].offset) + 1
        if offset >= hwm:
            return PartitionRead(partition, leader, hwm, records, start)


async def _broker_stubs(stack: contextlib.AsyncExitStack, targets: Mapping[int, str]) -> dict[int, Any]:
    """broker → BrokerService stub over a channel that ``stack`` closes (no gRPC-level retries, and
    reconnects at most :data:`CHANNEL_OPTIONS`' 500 ms apart)."""
    stubs: dict[int, Any] = {}
    for broker, target in targets.items():
        channel = await stack.enter_async_context(open_channel(target, options=CHANNEL_OPTIONS))
        stubs[broker] = broker_pb2_grpc.BrokerServiceStub(channel)
    return stubs


def read_replica_logs(data_dirs: Mapping[int, Path]) -> list[ReplicaLog]:
    """Every replica's ``chaos-data`` partition logs as their files hold them (the brokers are stopped)."""
    logs: list[ReplicaLog] = []
    for broker, data_dir in sorted(data_dirs.items()):
        for partition in range(DATA_PARTITIONS):
            path = data_dir / TopicPartition(DATA_TOPIC, partition).dir_name
            if not path.is_dir():
                continue
            log = SegmentedLog.open(path, create=False)
            try:
                records: dict[int, bytes] = {}
                for batch in iter_batches(log.read_all_batches()):
                    for record in batch.records:
                        records[batch.base_offset + record.offset_delta] = record.value or b""
                logs.append(ReplicaLog(broker, partition, records, log.start_offset, log.end_offset))
            finally:
                log.close()
    return logs
