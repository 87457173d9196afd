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
from collections.abc import Mapping
from typing import Any

import grpc

from chaos.checkers import ClusterSample, FencingInterval
from chaos.history import EventType, HistoryStore
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
            async with grpc.aio.insecure_channel(target) as channel:
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
        async with grpc.aio.insecure_channel(
            self._targets[broker_id], options=[("grpc.enable_retries", 0)]
        ) as ch:
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
        record = broker_pb2.BrokerRecord(value=str(sequence).encode(), has_value=True)
        request = broker_pb2.ProduceRequest(
            cluster_id=self._cluster_id,
            topic=PRODUCE_TOPIC,
            partition=partition,
            leader_epoch=-1,
            records=[record],
            acks=-1,
        )
        try:
            response = await stub.Produce(request, timeout=self._op_timeout_s)
        except grpc.aio.AioRpcError as err:
            return EventType.INFO, None, err.code().name
        code = ErrorCode.from_wire(response.error_code)
        if code is ErrorCode.NONE:
            return EventType.OK, int(response.base_offset), None
        return EventType.FAIL, None, f"{code.name} {response.error_message}"


def fencing_intervals(samples: list[ClusterSample]) -> list[FencingInterval]:
    """Conservative fenced periods per broker from the monitor's samples of the controller's view.

    An interval runs from the first sample showing the broker fenced to the *last* consecutive one that
    still does: the fence committed before the first, and the broker was still fenced at the last, so
    nothing outside those bounds is blamed on a fence the samples did not see.
    """
    ordered = sorted(samples, key=lambda s: s.time_ns)
    intervals: list[FencingInterval] = []
    open_since: dict[int, tuple[int, int]] = {}  # broker -> (first fenced time, last fenced time)
    brokers = {b for s in ordered for b in s.fenced}
    for sample in ordered:
        for broker in brokers:
            fenced = sample.fenced.get(broker)
            if fenced is None:
                continue  # not known in this sample (no active controller): neither opens nor closes
            if fenced:
                first, _ = open_since.get(broker, (sample.time_ns, sample.time_ns))
                open_since[broker] = (first, sample.time_ns)
            elif broker in open_since:
                first, last = open_since.pop(broker)
                intervals.append(FencingInterval(broker, first, last))
    intervals += [FencingInterval(b, first, last) for b, (first, last) in open_since.items()]
    return intervals
