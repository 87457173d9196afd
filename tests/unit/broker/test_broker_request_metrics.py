"""Broker Produce/Fetch metrics (Kafka's BrokerTopicMetrics and RequestMetrics) over a real in-process
gRPC server registered as a broker registers it (``add_broker_service``: the decoder that measures the
request's wire size), and no ``*_created`` series anywhere in the exposition."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from broker_fakes import MemoryLogOpener, StaticMetadataView

from kraft.broker.partitions import PartitionManager
from kraft.broker.service import RECORD_WIRE_OVERHEAD, BrokerService, add_broker_service
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState, LocalChanges, PartitionAssignment, TopicPartition
from kraft.client.channel import open_channel
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.observability.metrics import BrokerRequestMetrics, render_metrics
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc

if TYPE_CHECKING:
    from kraft.v1.broker_pb2_grpc import BrokerServiceAsyncStub

# A node label no other test uses: the series are process-wide.
ME = 7301
CLUSTER = "c-1"
LED = TopicPartition("orders", 0)
TIMEOUT_S = 5.0


@dataclass
class Harness:
    stub: BrokerServiceAsyncStub
    service: BrokerService
    view: StaticMetadataView


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    clock = ManualClock(start_ms=1_000_000)
    status = BrokerStatus(ME, CLUSTER, session_timeout_ms=3000, clock=clock)
    for state in (BrokerState.STARTING, BrokerState.RECOVERY, BrokerState.RUNNING):
        status.transition(state)
    status.fenced = False
    status.heartbeat_accepted(clock.monotonic_ms())
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener())
    manager.load()
    assignment = PartitionAssignment("id-orders", ME, 5, 5, (ME,), (ME,))
    manager.apply(LocalChanges(leaders={LED: assignment}))
    view = StaticMetadataView(brokers={ME: 9001}, topics={"orders": 1})
    service = BrokerService(status, manager, view)
    server = grpc.aio.server()
    add_broker_service(server, service)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    channel = open_channel(f"127.0.0.1:{port}")
    try:
        yield Harness(broker_pb2_grpc.BrokerServiceStub(channel), service, view)
    finally:
        await channel.close(None)
        await server.stop(None)
        manager.close()


def sample(text: str, name: str, **labels: str) -> float:
    """The value of one series in the exposition (0 when absent: a counter that never moved)."""
    wanted = {"node": str(ME), **labels}
    for line in text.splitlines():
        match = re.match(r"^([a-z_]+)\{([^}]*)\} (\S+)$", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2)))
        if found == wanted:
            return float(match.group(3))
    return 0.0


def produce_request(topic: str, *values: bytes) -> pb.ProduceRequest:
    return pb.ProduceRequest(
        cluster_id=CLUSTER,
        topic=topic,
        partition=0,
        leader_epoch=-1,
        records=[pb.BrokerRecord(value=v, has_value=True) for v in values],
    )


def fetch_request(topic: str, offset: int) -> pb.BrokerFetchRequest:
    return pb.BrokerFetchRequest(
        cluster_id=CLUSTER, topic=topic, partition=0, offset=offset, max_bytes=1 << 20, leader_epoch=-1
    )


async def test_produce_and_fetch_count_requests_records_bytes_and_latency(harness: Harness) -> None:
    before = render_metrics()
    request = produce_request("orders", b"a" * 10, b"b" * 20, b"c" * 30)
    assert (await harness.stub.Produce(request, timeout=TIMEOUT_S)).error_code == 0
    fetched = await harness.stub.Fetch(fetch_request("orders", 1), timeout=TIMEOUT_S)
    assert [r.value for r in fetched.records] == [b"b" * 20, b"c" * 30], fetched
    after = render_metrics()

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    for scope, labels in (("", {}), ("topic_", {"topic": "orders"})):
        assert delta(f"kraft_broker_{scope}produce_requests_total", **labels) == 1
        assert delta(f"kraft_broker_{scope}messages_in_total", **labels) == 3
        # Bytes in: the request as it came off the wire, which the decoder saw.
        assert delta(f"kraft_broker_{scope}bytes_in_total", **labels) == request.ByteSize()
        assert delta(f"kraft_broker_{scope}fetch_requests_total", **labels) == 1
        assert delta(f"kraft_broker_{scope}bytes_out_total", **labels) == 50 + 2 * RECORD_WIRE_OVERHEAD
        assert delta(f"kraft_broker_{scope}failed_produce_requests_total", **labels) == 0
        assert delta(f"kraft_broker_{scope}failed_fetch_requests_total", **labels) == 0
    for kind in ("Produce", "Fetch"):
        assert delta("kraft_broker_request_latency_seconds_count", request=kind) == 1
        assert delta("kraft_broker_request_latency_seconds_sum", request=kind) > 0


async def test_errors_count_as_failed_and_unknown_topics_only_in_the_totals(harness: Harness) -> None:
    before = render_metrics()
    unknown = await harness.stub.Produce(produce_request("nosuch", b"x"), timeout=TIMEOUT_S)
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    out_of_range = await harness.stub.Fetch(fetch_request("orders", 99), timeout=TIMEOUT_S)
    assert out_of_range.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    after = render_metrics()

    def delta(name: str, **labels: str) -> float:
        return sample(after, name, **labels) - sample(before, name, **labels)

    assert delta("kraft_broker_produce_requests_total") == 1
    assert delta("kraft_broker_failed_produce_requests_total") == 1
    assert delta("kraft_broker_messages_in_total") == 0
    assert 'topic="nosuch"' not in after  # a client naming random topics adds no series
    assert delta("kraft_broker_fetch_requests_total") == 1
    assert delta("kraft_broker_failed_fetch_requests_total") == 1
    assert delta("kraft_broker_topic_failed_fetch_requests_total", topic="orders") == 1
    assert delta("kraft_broker_bytes_out_total") == 0


async def test_a_deleted_topic_loses_its_series_with_the_next_image(harness: Harness) -> None:
    assert (await harness.stub.Produce(produce_request("orders", b"x"), timeout=TIMEOUT_S)).error_code == 0
    assert f'kraft_broker_topic_produce_requests_total{{node="{ME}",topic="orders"}}' in render_metrics()
    harness.service.set_view(StaticMetadataView(brokers={ME: 9001}, topics={}))
    text = render_metrics()
    assert 'topic="orders"' not in "\n".join(line for line in text.splitlines() if f'node="{ME}"' in line)
    assert sample(text, "kraft_broker_produce_requests_total") >= 1  # the totals stay


def test_per_topic_counters_are_bound_once() -> None:
    metrics = BrokerRequestMetrics(ME + 1)
    assert metrics.topic("t") is metrics.topic("t")
    metrics.produced("t", 2, 100, 0.001)
    metrics.retain_topics(lambda topic: False)
    assert metrics.topic("t").messages_in is not None  # re-created from zero after removal
    text = render_metrics()
    assert sample(text, "kraft_broker_topic_messages_in_total", node=str(ME + 1), topic="t") == 0


def test_no_exposed_series_ends_in_created() -> None:
    BrokerRequestMetrics(ME + 2).produced("t", 1, 10, 0.01)  # a counter and a histogram child exist
    names = [line.split("{")[0].split(" ")[0] for line in render_metrics().splitlines() if line[:1] != "#"]
    assert names and "kraft_broker_request_latency_seconds_count" in names
    assert [name for name in names if name.endswith("_created")] == []
