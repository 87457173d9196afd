"""Produce/fetch errors arrive when they should and say the right thing: an unknown topic or partition is
UNKNOWN_TOPIC_OR_PARTITION once it stayed unknown for the call's limit — a produce's ``max_block_s``
(Kafka's ``max.block.ms``), else the client's grace — or at the deadline (never REQUEST_TIMED_OUT for
it), metadata asked again every ``retry_backoff_s``; a batch over the limit is MESSAGE_TOO_LARGE and is
not retried.

The client runs on a manual clock (its pauses advance it), so what is asserted is how many metadata
answers it waited through and which limit ended the wait, not how long a loaded host took."""

from __future__ import annotations

import asyncio
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

# Exact in binary, so the manual clock lands on each limit exactly (0.1 * 10 falls short of 1.0).
GRACE_S = 0.375
BACKOFF_S = 0.125


class _ManualTime:
    """The client's clock and sleep: a pause advances the clock by its length at once."""

    def __init__(self) -> None:
        self.now = 0.0
        self.pauses: list[float] = []

    def clock(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds
        await asyncio.sleep(0)


def _client(
    target: str, time: _ManualTime, grace_s: float = GRACE_S, backoff_s: float = BACKOFF_S
) -> BrokerClient:
    return BrokerClient(
        [target], unknown_topic_grace_s=grace_s, retry_backoff_s=backoff_s, clock=time.clock, sleep=time.sleep
    )


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
    target: str,
    topic: str,
    partition: int,
    value: bytes,
    *,
    time: _ManualTime | None = None,
    max_block_s: float | None = None,
    deadline_s: float = 20.0,
    backoff_s: float = BACKOFF_S,
) -> pb.ProduceResponse:
    async with _client(target, time or _ManualTime(), backoff_s=backoff_s) as client:
        return await client.produce(
            topic, partition, [(None, value)], deadline_s=deadline_s, max_block_s=max_block_s
        )


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
    servicer, target = broker
    time = _ManualTime()
    with pytest.raises(KraftError) as raised:
        await _produce(target, topic, partition, b"v", time=time)
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert says in raised.value.message
    # The grace (0.375 s) of answers 0.125 s apart — 4 answers — not the 20 s deadline's 161.
    assert servicer.metadata_calls == 4 and time.pauses == [BACKOFF_S] * 3
    assert "not present in metadata after 375 ms" in raised.value.message


async def test_fetch_on_an_unknown_topic_fails_after_the_grace_too(broker: tuple[_Broker, str]) -> None:
    servicer, target = broker
    async with _client(target, _ManualTime()) as client:
        with pytest.raises(KraftError) as raised:
            await client.fetch("nosuch", 0, 0, deadline_s=20.0)
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert servicer.metadata_calls == 4


async def test_a_topic_that_appears_within_max_block_is_produced_to(broker: tuple[_Broker, str]) -> None:
    """``kraft produce`` right after ``kraft topic create``: the brokers learn the topic a few metadata
    fetches later (here the third answer knows it); the producer waits for it, as Kafka's does."""
    servicer, target = broker
    time = _ManualTime()
    response = await _produce(target, "late", 0, b"v", time=time, max_block_s=60.0)
    assert response.error_code == ErrorCode.NONE and response.base_offset == 7
    assert servicer.metadata_calls == 3 and time.pauses == [BACKOFF_S] * 2


async def test_a_topic_slower_than_the_grace_is_waited_for_up_to_max_block(
    broker: tuple[_Broker, str],
) -> None:
    """The 1 s grace once ended this produce on a loaded host; with max.block.ms the wait is the caller's."""
    servicer, target = broker
    servicer.appear_after = 20  # known at the 21st answer: 2.5 s of pauses, far beyond the grace
    time = _ManualTime()
    response = await _produce(target, "late", 0, b"v", time=time, max_block_s=5.0)
    assert response.error_code == ErrorCode.NONE
    assert servicer.metadata_calls == 21 and time.now > GRACE_S


async def test_a_topic_that_never_appears_fails_at_max_block(broker: tuple[_Broker, str]) -> None:
    servicer, target = broker
    time = _ManualTime()
    with pytest.raises(KraftError) as raised:
        await _produce(target, "nosuch", 0, b"v", time=time, max_block_s=2.0, deadline_s=20.0)
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert "topic 'nosuch' does not exist" in raised.value.message
    assert "not present in metadata after 2000 ms" in raised.value.message
    assert servicer.metadata_calls == 17 and time.now == 2.0


async def test_a_topic_that_never_appears_fails_at_the_deadline_before_max_block(
    broker: tuple[_Broker, str],
) -> None:
    """max.block.ms (60 s by default) above the command's --timeout: the deadline ends the wait, and the
    error still names the unknown topic (Kafka's "not present in metadata"), not REQUEST_TIMED_OUT."""
    servicer, target = broker
    time = _ManualTime()
    with pytest.raises(KraftError) as raised:
        await _produce(target, "nosuch", 0, b"v", time=time, max_block_s=60.0, deadline_s=1.0)
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert servicer.metadata_calls == 9 and time.now == 1.0


async def test_max_block_zero_fails_at_the_first_answer_that_does_not_know_the_topic(
    broker: tuple[_Broker, str],
) -> None:
    servicer, target = broker
    with pytest.raises(KraftError) as raised:
        await _produce(target, "nosuch", 0, b"v", max_block_s=0.0)
    assert raised.value.code is ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert servicer.metadata_calls == 1


async def test_metadata_is_asked_again_after_retry_backoff(broker: tuple[_Broker, str]) -> None:
    servicer, target = broker
    time = _ManualTime()
    with pytest.raises(KraftError):
        await _produce(target, "nosuch", 0, b"v", time=time, max_block_s=1.0, backoff_s=0.25)
    assert time.pauses == [0.25] * 4 and servicer.metadata_calls == 5


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
    time = _ManualTime()
    with pytest.raises(KraftError) as raised:
        # above the server's 64 KiB gRPC limit
        await _produce(target, "orders", 0, b"x" * 100_000, time=time)
    assert raised.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert "RESOURCE_EXHAUSTED" not in raised.value.code.name
    assert servicer.produce_calls == 0 and time.pauses == [], "refused at once, never retried"
