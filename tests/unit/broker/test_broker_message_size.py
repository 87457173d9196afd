"""Record size limits: Produce checks the batch it would append against the topic's max.message.bytes
or the broker's message.max.bytes before writing anything (exactly at the limit accepted, one byte above
refused); Fetch returns any accepted batch whole, even above max_bytes; the partition log's reader and
recovery keep batches far above the old 8 MiB cap."""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from broker_fakes import StaticMetadataView

from kraft.broker.partitions import PartitionManager
from kraft.broker.segmented_partition_log import SegmentedPartitionLog, segmented_log_opener
from kraft.broker.service import BrokerService
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState, LocalChanges, PartitionAssignment, ProducedRecord, TopicPartition
from kraft.client.channel import open_channel
from kraft.clock import ManualClock
from kraft.config import GRPC_ENVELOPE_BYTES, ConfigError, NodeConfig
from kraft.errors import ErrorCode, KraftError
from kraft.netutil import free_port
from kraft.storage.batch import DEFAULT_MAX_BATCH_BYTES, build_batch
from kraft.storage.log import SegmentedLog
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc

if TYPE_CHECKING:
    from kraft.v1.broker_pb2_grpc import BrokerServiceAsyncStub

ME = 1
CLUSTER = "c-1"
SMALL = TopicPartition("small", 0)  # broker default message.max.bytes
BIG = TopicPartition("big", 0)  # topic max.message.bytes above the broker's
GRPC_MAX = 16 * 1024 * 1024
MESSAGE_MAX = 1000
TIMEOUT_S = 10.0


def batch_size(*values: bytes, timestamp_ms: int = 1) -> int:
    return len(build_batch(0, [(None, v) for v in values], leader_epoch=0, timestamp_ms=timestamp_ms))


def value_for(size: int) -> bytes:
    """A value whose one-record batch is exactly ``size`` bytes (varint lengths grow with the value)."""
    n = size - batch_size(b"")
    while batch_size(b"v" * n) > size:
        n -= 1
    assert batch_size(b"v" * n) == size
    return b"v" * n


def produced(*values: bytes) -> list[ProducedRecord]:
    return [ProducedRecord(None, v, 1) for v in values]


# --- the partition log ---------------------------------------------------------------------------------


def _open(path: Path) -> SegmentedPartitionLog:
    log = segmented_log_opener(1 << 30)(path)
    assert isinstance(log, SegmentedPartitionLog)
    return log


def test_the_limit_is_checked_before_append_and_a_refusal_writes_nothing(tmp_path: Path) -> None:
    log = _open(tmp_path / "t-0")
    value = b"x" * 500
    exact = batch_size(value)
    assert log.append_records(produced(value), 0, exact) == 0  # exactly at the limit: accepted
    segment = tmp_path / "t-0" / "00000000000000000000.log"
    before = segment.stat().st_size
    with pytest.raises(KraftError) as refused:
        log.append_records(produced(value + b"y"), 0, exact)  # one byte above
    assert refused.value.code is ErrorCode.MESSAGE_TOO_LARGE
    assert f"{exact + 1} bytes is above the limit of {exact}" in refused.value.message
    assert log.log_end_offset == 1 and segment.stat().st_size == before
    assert [r.value for r in log.read_records(0, 1 << 20)] == [value]
    log.close()


def test_mixed_timestamp_batches_are_checked_at_their_real_size(tmp_path: Path) -> None:
    log = _open(tmp_path / "t-0")
    records = [ProducedRecord(None, b"a", 1), ProducedRecord(None, b"b", 5)]
    with pytest.raises(KraftError):
        log.append_records(records, 0, batch_size(b"a", b"b") - 1)
    assert log.log_end_offset == 0
    assert log.append_records(records, 0, 10_000) == 0
    log.close()


def test_recovery_after_a_crash_keeps_a_batch_above_the_old_8_mib_cap(tmp_path: Path) -> None:
    path = tmp_path / "t-0"
    log = _open(path)
    big = os.urandom(DEFAULT_MAX_BATCH_BYTES + 1024)  # the user's 10 MB case, above batch.py's cap
    log.append_records(produced(b"before"), 0)
    log.append_records(produced(big), 0, GRPC_MAX)
    log.append_records(produced(b"after"), 0)
    segmented = log._log  # simulate kill -9: no clean-shutdown marker
    segmented.flush()  # the page cache survives a process kill; only the marker is missing
    segmented.abandon()
    shutil.copytree(path, tmp_path / "copy")

    reopened = _open(path)
    assert reopened.log_end_offset == 3
    values = [r.value for r in reopened.read_records(0, 1)] + [r.value for r in reopened.read_records(1, 1)]
    assert values[0] == b"before" and values[1] == big
    assert [r.value for r in reopened.read_records(2, 1)] == [b"after"]
    reopened.close()
    plain = SegmentedLog.open(tmp_path / "copy")  # the old 8 MiB cap: recovery cut at the big batch
    assert plain.end_offset == 1 and plain.recovered_bytes_truncated > 0
    plain.abandon()


# --- the service ---------------------------------------------------------------------------------------


@dataclass
class Harness:
    stub: BrokerServiceAsyncStub
    manager: PartitionManager
    view: StaticMetadataView


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    clock = ManualClock(start_ms=1000)
    status = BrokerStatus(ME, CLUSTER, session_timeout_ms=60_000, clock=clock)
    for state in (BrokerState.STARTING, BrokerState.RECOVERY, BrokerState.RUNNING):
        status.transition(state)
    status.fenced = False
    status.heartbeat_accepted(clock.monotonic_ms())
    manager = PartitionManager(ME, [tmp_path / "logs"], segmented_log_opener(1 << 30))
    manager.load()
    lead = PartitionAssignment("id", ME, 0, 0, (ME,), (ME,))
    manager.apply(LocalChanges(leaders={SMALL: lead, BIG: lead}))
    view = StaticMetadataView(
        brokers={ME: 9001},
        topics={"small": 1, "big": 1},
        configs={"big": {"max.message.bytes": str(GRPC_MAX)}},
    )
    service = BrokerService(
        status, manager, view, message_max_bytes=MESSAGE_MAX, grpc_max_message_bytes=GRPC_MAX
    )
    limits = [("grpc.max_send_message_length", GRPC_MAX), ("grpc.max_receive_message_length", GRPC_MAX)]
    server = grpc.aio.server(options=limits)
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(service, server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    channel = open_channel(f"127.0.0.1:{port}", options=limits)
    try:
        yield Harness(broker_pb2_grpc.BrokerServiceStub(channel), manager, view)
    finally:
        await channel.close(None)
        await server.stop(None)
        manager.close()


async def produce(h: Harness, tp: TopicPartition, *values: bytes) -> pb.ProduceResponse:
    request = pb.ProduceRequest(
        cluster_id=CLUSTER,
        topic=tp.topic,
        partition=tp.partition,
        leader_epoch=-1,
        records=[pb.BrokerRecord(value=v, has_value=True, timestamp_ms=1) for v in values],
    )
    return await h.stub.Produce(request, timeout=TIMEOUT_S)


async def fetch(h: Harness, tp: TopicPartition, offset: int, max_bytes: int) -> pb.BrokerFetchResponse:
    request = pb.BrokerFetchRequest(
        cluster_id=CLUSTER, topic=tp.topic, partition=tp.partition, offset=offset, max_bytes=max_bytes
    )
    return await h.stub.Fetch(request, timeout=TIMEOUT_S)


async def test_message_max_bytes_is_checked_at_produce(harness: Harness) -> None:
    at_limit = value_for(MESSAGE_MAX)
    accepted = await produce(harness, SMALL, at_limit)
    assert accepted.error_code == 0 and accepted.base_offset == 0
    refused = await produce(harness, SMALL, at_limit + b"v")
    assert refused.error_code == ErrorCode.MESSAGE_TOO_LARGE and refused.base_offset == -1
    assert "message.max.bytes=1000 of broker 1" in refused.error_message
    assert "1001 bytes" in refused.error_message and "\n" not in refused.error_message
    partition = harness.manager.get(SMALL)
    assert partition is not None and partition.log.log_end_offset == 1


async def test_a_dynamic_broker_message_max_bytes_replaces_the_properties_value(harness: Harness) -> None:
    """``kraft config alter --entity-type brokers --add-config message.max.bytes=…`` reaches the broker as a
    metadata config: the Produce limit of topics without max.message.bytes follows it at once."""
    view = harness.view
    view.broker_configs["message.max.bytes"] = str(MESSAGE_MAX + 500)
    accepted = await produce(harness, SMALL, value_for(MESSAGE_MAX + 500))
    assert accepted.error_code == 0
    refused = await produce(harness, SMALL, value_for(MESSAGE_MAX + 501))
    assert refused.error_code == ErrorCode.MESSAGE_TOO_LARGE
    assert (
        f"message.max.bytes={MESSAGE_MAX + 500} (dynamic broker config) of broker 1" in refused.error_message
    )
    view.broker_configs.clear()
    assert (
        await produce(harness, SMALL, value_for(MESSAGE_MAX + 1))
    ).error_code == ErrorCode.MESSAGE_TOO_LARGE


async def test_the_topic_override_allows_the_largest_servable_batch_and_fetch_returns_it_whole(
    harness: Harness,
) -> None:
    wire_max = GRPC_MAX - GRPC_ENVELOPE_BYTES
    largest = value_for(wire_max)
    assert (await produce(harness, BIG, b"first")).error_code == 0
    assert (await produce(harness, BIG, largest)).error_code == 0
    over = await produce(harness, BIG, largest[:-100] + b"x" * 101)
    assert over.error_code == ErrorCode.MESSAGE_TOO_LARGE and "grpc.max.message.bytes" in over.error_message
    # Kafka's rule: the first batch comes back even when it is larger than max_bytes.
    first = await fetch(harness, BIG, 1, max_bytes=1)
    assert first.error_code == 0 and [r.value for r in first.records] == [largest]
    both = await fetch(harness, BIG, 0, max_bytes=1)
    assert [r.value for r in both.records] == [b"first"]


async def test_a_fetch_never_outgrows_a_grpc_message(harness: Harness) -> None:
    chunk = b"z" * (1024 * 1024)
    for _ in range(20):  # 20 MiB in 1 MiB batches, above the 16 MiB gRPC message limit
        assert (await produce(harness, BIG, chunk)).error_code == 0
    response = await fetch(harness, BIG, 0, max_bytes=1 << 30)
    assert response.error_code == 0 and 0 < len(response.records) < 16
    assert response.ByteSize() <= GRPC_MAX


def test_message_max_bytes_must_fit_a_grpc_message() -> None:
    base = {
        "process.roles": "broker",
        "node.id": "101",
        "controller.quorum.voters": "1@127.0.0.1:9093",
        "listeners": "PLAINTEXT://127.0.0.1:9092",
        "log.dirs": "/tmp/kraft-x",
    }
    assert NodeConfig.from_properties(base).message_max_bytes == 1048588
    fits = str(GRPC_MAX - GRPC_ENVELOPE_BYTES)
    assert NodeConfig.from_properties({**base, "message.max.bytes": fits}).message_max_bytes == int(fits)
    with pytest.raises(ConfigError) as refused:
        NodeConfig.from_properties({**base, "message.max.bytes": str(int(fits) + 1)})
    assert "message.max.bytes" in str(refused.value) and "\n" not in str(refused.value)
    with pytest.raises(ConfigError):
        NodeConfig.from_properties({**base, "grpc.max.message.bytes": "1048576"})  # default no longer fits
