"""DescribeBroker at scale: a broker hosting more partitions than one gRPC message of the default 4 MiB
receive limit can carry answers them in pages, and ``describe_broker`` (``kraft broker describe``) reads
them all — before, one answer held every partition and the CLI's channel refused it (RESOURCE_EXHAUSTED)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest
from broker_fakes import MemoryPartitionLog, StaticMetadataView

from kraft.broker.partitions import Partition, PartitionManager
from kraft.broker.service import DESCRIBE_PAGE_BYTES, BrokerService
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState, PartitionAssignment, ReplicaRole, TopicPartition
from kraft.client.broker import broker_state, describe_broker
from kraft.client.channel import open_channel
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc

ME = 1
CLUSTER = "c-1"
GRPC_DEFAULT_RECEIVE_BYTES = 4 * 1024 * 1024
# Long topic names (Kafka allows 249 characters) make each entry ~300 B, so ~20,000 partitions — cheap
# in-memory logs — already outgrow the default receive limit.
TOPICS = 20
PER_TOPIC = 1000
TIMEOUT_S = 30.0


class ManyPartitions(PartitionManager):
    """A partition manager that hosts ``hosted`` without creating a directory for each."""

    def __init__(self, log_dir: Path, hosted: list[Partition]) -> None:
        super().__init__(ME, [log_dir], MemoryPartitionLog)
        self._hosted = hosted

    def partitions(self) -> list[Partition]:
        return list(self._hosted)


class CountingService(BrokerService):
    """The broker's service, keeping the cursor of each DescribeBroker request it answered (a page)."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.cursors: list[tuple[str, int]] = []

    async def DescribeBroker(
        self, request: pb.DescribeBrokerRequest, context: Any
    ) -> pb.DescribeBrokerResponse:
        self.cursors.append((request.partitions_after_topic, request.partitions_after_partition))
        return await super().DescribeBroker(request, context)


@dataclass
class Served:
    target: str
    expected: list[tuple[str, int]]
    service: CountingService


def _hosted(log_dir: Path) -> list[Partition]:
    hosted: list[Partition] = []
    # Built in reverse order: the pages must come sorted whatever order the manager keeps.
    for t in reversed(range(TOPICS)):
        topic = f"t{t:02d}-" + "x" * 200
        assignment = PartitionAssignment(f"id-{t}", ME, 3, 3, (ME,), (ME,))
        for p in reversed(range(PER_TOPIC)):
            tp = TopicPartition(topic, p)
            hosted.append(
                Partition(
                    tp, log_dir, MemoryPartitionLog(log_dir / tp.dir_name), assignment, ReplicaRole.LEADER
                )
            )
    return hosted


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    clock = ManualClock(start_ms=1_000_000)
    status = BrokerStatus(ME, CLUSTER, session_timeout_ms=3000, clock=clock)
    for state in (BrokerState.STARTING, BrokerState.RECOVERY, BrokerState.RUNNING):
        status.transition(state)
    hosted = _hosted(tmp_path / "logs")
    manager = ManyPartitions(tmp_path / "logs", hosted)
    view = StaticMetadataView(brokers={ME: 9001}, topics={})
    server = grpc.aio.server()
    service = CountingService(status, manager, view)
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(service, server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    try:
        yield Served(f"127.0.0.1:{port}", sorted((p.tp.topic, p.tp.partition) for p in hosted), service)
    finally:
        await server.stop(None)


async def test_every_partition_is_described_although_they_outgrow_one_default_message(served: Served) -> None:
    described = await describe_broker(served.target, CLUSTER, TIMEOUT_S)
    assert described is not None and described.error_code == ErrorCode.NONE
    assert described.state == "RUNNING" and described.broker_id == ME
    got = [(p.topic, p.partition) for p in described.partitions]
    assert got == served.expected  # all of them, once each, in (topic, partition) order
    assert described.partition_count == len(served.expected) and not described.more_partitions
    # The point of paging: all of them in one message would not fit gRPC's default receive limit.
    assert described.ByteSize() > GRPC_DEFAULT_RECEIVE_BYTES
    # Its cost is the round trips: each page asked for once, in order, and every page but the last nearly
    # full (≥ 90 % of DESCRIBE_PAGE_BYTES: the broker's size estimate is an upper bound) — not a request
    # per partition, nor a page asked for twice.
    cursors = served.service.cursors
    assert cursors == sorted(set(cursors)), "a page was asked for twice or out of order"
    assert 5 <= len(cursors) <= described.ByteSize() // (DESCRIBE_PAGE_BYTES * 9 // 10) + 1, cursors


async def test_each_page_fits_a_client_with_grpc_s_default_limits(served: Served) -> None:
    async with open_channel(served.target) as channel:  # no options: gRPC's 4 MiB receive limit
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        request = pb.DescribeBrokerRequest(cluster_id=CLUSTER)
        pages: list[pb.DescribeBrokerResponse] = []
        while True:
            page = await stub.DescribeBroker(request, timeout=TIMEOUT_S)
            assert page.error_code == 0 and page.partitions
            assert page.ByteSize() <= DESCRIBE_PAGE_BYTES + 1024
            pages.append(page)
            if not page.more_partitions:
                break
            request.partitions_after_topic = page.partitions[-1].topic
            request.partitions_after_partition = page.partitions[-1].partition
    assert len(pages) >= 5
    assert [(p.topic, p.partition) for page in pages for p in page.partitions] == served.expected


async def test_a_bounded_describe_and_the_state_alone(served: Served) -> None:
    first = await describe_broker(served.target, CLUSTER, TIMEOUT_S, max_partitions=7)
    assert first is not None
    assert [(p.topic, p.partition) for p in first.partitions] == served.expected[:7]
    assert first.more_partitions and first.partition_count == len(served.expected)
    # Across a page boundary the limit still holds exactly.
    many = await describe_broker(served.target, CLUSTER, TIMEOUT_S, max_partitions=12_345)
    assert many is not None and [(p.topic, p.partition) for p in many.partitions] == served.expected[:12_345]
    state = await broker_state(served.target, CLUSTER, TIMEOUT_S)
    assert state is not None and state.state == "RUNNING" and not state.partitions
    assert state.partition_count == len(served.expected) and state.ByteSize() < 1024


async def test_a_cursor_past_the_end_and_a_wrong_cluster(served: Served) -> None:
    async with open_channel(served.target) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        past = pb.DescribeBrokerRequest(cluster_id=CLUSTER, partitions_after_topic="~")  # sorts last
        page = await stub.DescribeBroker(past, timeout=TIMEOUT_S)
        assert page.error_code == 0 and not page.partitions and not page.more_partitions
    refused = await describe_broker(served.target, "another", TIMEOUT_S)
    assert refused is not None and refused.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert not refused.partitions
