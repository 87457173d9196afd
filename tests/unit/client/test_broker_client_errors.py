"""Produce/fetch errors arrive at once and say the right thing: an unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION after a short grace (not REQUEST_TIMED_OUT at the deadline), a batch over the
limit is MESSAGE_TOO_LARGE and is not retried."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import grpc
import pytest

from kraft.client.broker import BrokerClient
from kraft.errors import ErrorCode, KraftError
from kraft.netutil import free_port
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc
from kraft.v1.common_pb2 import Endpoint

GRACE_S = 0.3


class _Broker(broker_pb2_grpc.BrokerServiceServicer):
    """Broker 101 leads ``orders`` (2 partitions); ``late`` appears after ``appear_after`` Metadata calls."""

    def __init__(self, port: int, appear_after: int = 10**9) -> None:
        self.port = port
        self.appear_after = appear_after
        self.metadata_calls = 0
        self.produce_calls = 0

    def _topic(self, name: str) -> pb.BrokerMetadataResponse.Topic:
        known = name == "orders" or (name == "late" and self.metadata_calls > self.appear_after)
        if not known:
            return pb.BrokerMetadataResponse.Topic(
                name=name,
                error_code=ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                error_message=f"unknown topic {name!r}",
            )
        return pb.BrokerMetadataResponse.Topic(
            name=name,
            partitions=[
                pb.BrokerMetadataResponse.Partition(partition=p, leader=101, leader_epoch=1) for p in (0, 1)
            ],
        )

    async def Metadata(self, request: pb.BrokerMetadataRequest, context: Any) -> pb.BrokerMetadataResponse:
        self.metadata_calls += 1
        return pb.BrokerMetadataResponse(
            brokers=[
                pb.BrokerMetadataResponse.Broker(
                    broker_id=101, endpoints=[Endpoint(host="127.0.0.1", port=self.port)]
                )
            ],
            topics=[self._topic(name) for name in request.topics],
        )

    async def Produce(self, request: pb.ProduceRequest, context: Any) -> pb.ProduceResponse:
        self.produce_calls += 1
        if len(request.records[0].value) > 1000:
            return pb.ProduceResponse(
                error_code=ErrorCode.MESSAGE_TOO_LARGE,
                error_message="above message.max.bytes",
                base_offset=-1,
            )
        return pb.ProduceResponse(base_offset=7, log_end_offset=8, leader_epoch=1)


@pytest.fixture
async def broker() -> AsyncIterator[tuple[_Broker, str]]:
    port = free_port()
    servicer = _Broker(port, appear_after=2)  # type: ignore[abstract]
    server = grpc.aio.server(options=[("grpc.max_receive_message_length", 64 * 1024)])
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    try:
        yield servicer, f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def _produce(
    target: str, topic: str, partition: int, value: bytes, grace_s: float = GRACE_S
) -> pb.ProduceResponse:
    async with BrokerClient([target], unknown_topic_grace_s=grace_s) as client:
        return await client.produce(topic, partition, [(None, value)], deadline_s=20.0)


@pytest.mark.parametrize(
    ("topic", "partition", "says"),
    [
        ("nosuch", 0, "topic 'nosuch' does not exist"),
        ("orders", 5, "topic 'orders' has 2 partition(s), 0..1; there is no partition 5"),
    ],
)
async def test_an_unknown_topic_or_partition_fails_fast(
    broker: tuple[_Broker, str], topic: str, partition: int, says: str
) -> None:
    _, target = broker
    started = time.monotonic()
    with pytest.raises(KraftError) as raised:
        await _produce(target, topic, partition, b"v")
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert says in raised.value.message
    assert GRACE_S <= time.monotonic() - started < 5.0, "after the grace, long before the 20 s deadline"


async def test_fetch_on_an_unknown_topic_fails_fast_too(broker: tuple[_Broker, str]) -> None:
    _, target = broker
    async with BrokerClient([target], unknown_topic_grace_s=GRACE_S) as client:
        with pytest.raises(KraftError) as raised:
            await client.fetch("nosuch", 0, 0, deadline_s=20.0)
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


async def test_a_topic_that_appears_within_the_grace_is_produced_to(broker: tuple[_Broker, str]) -> None:
    servicer, target = broker
    # The topic appears at the third Metadata answer; a grace far above the time that takes (however
    # loaded the machine) makes this about the rule — produced to once it appears — not about timing.
    started = time.monotonic()
    response = await _produce(target, "late", 0, b"v", grace_s=15.0)
    assert response.error_code == ErrorCode.NONE and response.base_offset == 7
    assert time.monotonic() - started < 15.0
    assert servicer.metadata_calls > 2


async def test_a_batch_over_the_broker_limit_is_message_too_large_and_not_retried(
    broker: tuple[_Broker, str],
) -> None:
    servicer, target = broker
    response = await _produce(target, "orders", 0, b"x" * 2000)
    assert ErrorCode.from_wire(response.error_code) is ErrorCode.MESSAGE_TOO_LARGE
    assert servicer.produce_calls == 1


async def test_a_request_over_the_grpc_limit_is_message_too_large_not_resource_exhausted(
    broker: tuple[_Broker, str],
) -> None:
    servicer, target = broker
    started = time.monotonic()
    with pytest.raises(KraftError) as raised:
        await _produce(target, "orders", 0, b"x" * 100_000)  # above the server's 64 KiB gRPC limit
    assert raised.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert "RESOURCE_EXHAUSTED" not in raised.value.code.name
    assert servicer.produce_calls == 0 and time.monotonic() - started < 5.0
