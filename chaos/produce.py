"""The produce workload: one client per broker appending to the partition that broker leads.

Feeds the fencing checker: a broker the controller has fenced must not acknowledge a Produce.  The topic
``chaos-produce`` is created before the run with partition *i* assigned to broker *i* alone (replication
factor 1), so each broker leads exactly one partition and its client always knows where to send.
Clients dial their broker through ``client_to_<broker>``, a link no nemesis cuts: a broker cut off from
the controllers still receives produce requests and must refuse them once its lease is gone.

Outcomes: NONE → ``ok`` (result = base offset); a gRPC error → ``info``; any error code → ``fail`` (the
broker validated and refused before appending).
"""

from __future__ import annotations

import asyncio
import time
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from chaos.checkers import ClusterSample, FencingInterval
from chaos.history import EventType, HistoryStore
from kraft.client.channel import open_channel
from kraft.errors import ErrorCode
from kraft.v1 import broker_pb2, broker_pb2_grpc, controller_pb2, controller_pb2_grpc

PRODUCE_TOPIC = "chaos-produce"
PRODUCER_PROCESS_BASE = 1_000_000  # process ids of producers, apart from the topic clients'
SETUP_TIMEOUT_S = 20.0


async def create_produce_topic(cluster_id: str, controller_targets: list[str], brokers: list[int]) -> None:
    """Create ``chaos-produce`` with partition i on broker i; retries until some controller accepts it."""
    assignments = [
        controller_pb2.ReplicaAssignment(partition=i, broker_ids=[b]) for i, b in enumerate(brokers)
    ]
    topic = controller_pb2.CreatableTopic(
        name=PRODUCE_TOPIC, num_partitions=-1, replication_factor=-1, assignments=assignments
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
            if response.error_code != 0:
                last = f"{target}: {ErrorCode.from_wire(response.error_code).name}"
                continue
            code = ErrorCode.from_wire(response.topics[0].error_code)
            if code in (ErrorCode.NONE, ErrorCode.TOPIC_ALREADY_EXISTS):
                return
            last = f"{target}: {code.name} {response.topics[0].error_message}"
        await asyncio.sleep(0.3)
    raise TimeoutError(f"could not create {PRODUCE_TOPIC}: {last}")


class ProduceWorkload:
    def __init__(
        self,
        store: HistoryStore,
        cluster_id: str,
        broker_targets: Mapping[int, str],
        op_timeout_s: float = 2.0,
        pause_s: float = 0.05,
    ) -> None:
        self._store = store
        self._cluster_id = cluster_id
        self._brokers = sorted(broker_targets)
        self._targets = dict(broker_targets)
        self._op_timeout_s = op_timeout_s
        self._pause_s = pause_s
        self.broker_of: dict[int, int] = {}
        self._next_process = PRODUCER_PROCESS_BASE

    def _new_process(self, broker_id: int) -> int:
        process, self._next_process = self._next_process, self._next_process + 1
        self.broker_of[process] = broker_id
        return process

    async def run(self, duration_s: float) -> None:
        deadline = time.monotonic() + duration_s
        await asyncio.gather(*(self._producer(i, b, deadline) for i, b in enumerate(self._brokers)))

    async def _producer(self, partition: int, broker_id: int, deadline: float) -> None:
        process = self._new_process(broker_id)
        sequence = 0
        async with open_channel(self._targets[broker_id], options=[("grpc.enable_retries", 0)]) as ch:
            stub: Any = broker_pb2_grpc.BrokerServiceStub(ch)
            while time.monotonic() < deadline:
                key = f"{PRODUCE_TOPIC}-{partition}"
                invoked = await self._store.invoke(process, "produce", key, sequence)
                outcome, result, error = await self._produce(stub, partition, sequence)
                await self._store.complete(invoked.op_id, outcome, result, error)
                if outcome is EventType.INFO:
                    process = self._new_process(broker_id)
                sequence += 1
                await asyncio.sleep(self._pause_s)

    async def _produce(self, stub: Any, partition: int, sequence: int) -> tuple[EventType, Any, str | None]:
        code, offset, message = await produce_acks_all(
            stub, self._cluster_id, PRODUCE_TOPIC, partition, str(sequence).encode(), self._op_timeout_s
        )
        if code is None:
            return EventType.INFO, None, message
        if code is ErrorCode.NONE:
            return EventType.OK, offset, None
        return EventType.FAIL, None, message


async def produce_acks_all(
    stub: Any, cluster_id: str, topic: str, partition: int, value: bytes, timeout_s: float
) -> tuple[ErrorCode | None, int, str]:
    """One acks=all Produce of one record: (error code, base offset, message).  The code is None when
    the RPC itself failed — the outcome is unknown — and the message is then the gRPC status name."""
    record = broker_pb2.BrokerRecord(value=value, has_value=True)
    request = broker_pb2.ProduceRequest(
        cluster_id=cluster_id, topic=topic, partition=partition, leader_epoch=-1, records=[record], acks=-1
    )
    try:
        response = await stub.Produce(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as err:
        return None, -1, err.code().name
    code = ErrorCode.from_wire(response.error_code)
    return code, int(response.base_offset), f"{code.name} {response.error_message}"


def fencing_intervals(
    samples: Sequence[ClusterSample], changes: Mapping[int, Sequence[int]] | None = None
) -> list[FencingInterval]:
    """Conservative fenced periods per broker from the monitor's samples of the controller's view.

    An interval runs from the first sample showing the broker fenced (the fence committed before that
    answer came back: its ``time_ns``) to the last sample still showing *the same fence* (the broker was
    still fenced when that request was sent: its ``observed_from_ns``), so nothing outside those bounds
    is blamed on a fence the samples did not see.

    *The same fence*: ``changes`` maps each broker to the offsets of the committed records about its
    registration (register, fence, unfence, shutdown, unregister — see
    :func:`chaos.collect.broker_registration_offsets`).  Two fenced samples belong to one fence only when
    no such record lies between their metadata offsets.  Samples are seconds apart at worst (slow probes,
    no active controller after a leader kill), and a broker can be unfenced, acknowledge produces and be
    fenced again between two of them; without the log those periods would be merged into one and every
    legitimate acknowledgement in the gap blamed (the kill/12 false alarm).  With ``changes`` given, a
    sample whose metadata offset is unknown, or lower than one seen before (a stale controller's
    view), says nothing.  Without ``changes`` (samples with no offsets), consecutive fenced samples are
    merged as before: an approximation that can bridge an unseen unfence.
    """
    ordered = sorted(samples, key=lambda s: s.time_ns)
    intervals: list[FencingInterval] = []
    # broker -> (fence id, first fenced time, last "still fenced" time)
    open_since: dict[int, tuple[int, int, int]] = {}
    brokers = {b for s in ordered for b in s.fenced}
    newest_offset = -1
    for sample in ordered:
        if changes is not None:
            if sample.metadata_offset < max(0, newest_offset):
                continue  # unknown offset, or a controller behind one already seen: a stale view
            newest_offset = sample.metadata_offset
        for broker in brokers:
            fenced = sample.fenced.get(broker)
            if fenced is None:
                continue  # not known in this sample (no active controller): neither opens nor closes
            # Which fence: the number of registration records of this broker committed so far.
            fence_id = 0 if changes is None else bisect_right(changes.get(broker, ()), sample.metadata_offset)
            current = open_since.get(broker)
            if current is not None and (not fenced or current[0] != fence_id):
                intervals.append(FencingInterval(broker, current[1], current[2]))
                del open_since[broker]
                current = None
            if fenced:
                first = sample.time_ns if current is None else current[1]
                open_since[broker] = (fence_id, first, sample.observed_from_ns)
    intervals += [FencingInterval(b, first, last) for b, (_, first, last) in open_since.items()]
    # One sample alone proves nothing in between (its answer came back after its request was sent).
    return [i for i in intervals if i.unfenced_ns is None or i.unfenced_ns >= i.fenced_ns]
