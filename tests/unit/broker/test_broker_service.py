"""BrokerService over a real in-process gRPC server: serving rule, leadership/epoch checks, offsets."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from broker_fakes import MemoryLogOpener, StaticMetadataView

from kraft.broker.partitions import PartitionManager
from kraft.broker.service import BrokerService
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState, LocalChanges, PartitionAssignment, TopicPartition
from kraft.client.channel import open_channel
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.storage.errors import CorruptLogError
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc

if TYPE_CHECKING:
    from kraft.v1.broker_pb2_grpc import BrokerServiceAsyncStub

ME = 1
CLUSTER = "c-1"
LED = TopicPartition("orders", 0)
FOLLOWED = TopicPartition("orders", 1)
TIMEOUT_S = 5.0


@dataclass
class Harness:
    stub: BrokerServiceAsyncStub
    status: BrokerStatus
    manager: PartitionManager
    clock: ManualClock


def _assignment(leader: int, epoch: int) -> PartitionAssignment:
    return PartitionAssignment("id-orders", leader, epoch, epoch, (1, 2), (1, 2))


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
    manager.apply(LocalChanges(leaders={LED: _assignment(ME, 5)}, followers={FOLLOWED: _assignment(2, 3)}))
    view = StaticMetadataView(brokers={1: 9001, 2: 9002}, topics={"orders": 2})
    server = grpc.aio.server()
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(BrokerService(status, manager, view), server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    channel = open_channel(f"127.0.0.1:{port}")
    try:
        yield Harness(broker_pb2_grpc.BrokerServiceStub(channel), status, manager, clock)
    finally:
        await channel.close(None)
        await server.stop(None)
        manager.close()


def records(*values: bytes) -> list[pb.BrokerRecord]:
    return [pb.BrokerRecord(value=v, has_value=True, key=b"k", has_key=True) for v in values]


async def produce(h: Harness, tp: TopicPartition, epoch: int, *values: bytes) -> pb.ProduceResponse:
    request = pb.ProduceRequest(
        cluster_id=CLUSTER,
        topic=tp.topic,
        partition=tp.partition,
        leader_epoch=epoch,
        records=records(*values),
    )
    return await h.stub.Produce(request, timeout=TIMEOUT_S)


async def fetch(h: Harness, offset: int, max_wait_ms: int = 0, epoch: int = -1) -> pb.BrokerFetchResponse:
    request = pb.BrokerFetchRequest(cluster_id=CLUSTER,
        topic=LED.topic, partition=LED.partition, offset=offset, max_bytes=1 << 20,
        max_wait_ms=max_wait_ms, leader_epoch=epoch,
    )  # fmt: skip
    return await h.stub.Fetch(request, timeout=TIMEOUT_S)


async def test_produce_then_fetch_round_trips_records_with_offsets(harness: Harness) -> None:
    first = await produce(harness, LED, 5, b"a", b"b")
    second = await produce(harness, LED, -1, b"c")
    assert (first.error_code, first.base_offset, first.log_end_offset) == (0, 0, 2)
    assert (second.base_offset, second.leader_epoch) == (2, 5)

    response = await fetch(harness, 1)
    assert response.error_code == 0
    assert [(r.offset, r.value, r.leader_epoch) for r in response.records] == [(1, b"b", 5), (2, b"c", 5)]
    assert response.high_watermark == 3 and response.log_start_offset == 0
    # Records sent without a timestamp are stamped with the broker's (injected) wall clock.
    assert {r.timestamp_ms for r in response.records} == {harness.clock.wall_ms()}


async def test_null_and_empty_keys_stay_distinct(harness: Harness) -> None:
    request = pb.ProduceRequest(cluster_id=CLUSTER,
        topic=LED.topic, partition=0, leader_epoch=-1,
        records=[pb.BrokerRecord(value=b"v", has_value=True), pb.BrokerRecord(key=b"", has_key=True)],
    )  # fmt: skip
    assert (await harness.stub.Produce(request, timeout=TIMEOUT_S)).error_code == 0
    out = (await fetch(harness, 0)).records
    assert (out[0].has_key, out[0].has_value, out[1].has_key, out[1].has_value) == (False, True, True, False)


async def test_produce_to_a_followed_partition_names_the_current_leader(harness: Harness) -> None:
    response = await produce(harness, FOLLOWED, 3, b"x")
    assert response.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert response.current_leader.node_id == 2 and response.current_leader.endpoint.port == 9002
    assert response.base_offset == -1


async def test_produce_with_an_old_epoch_is_fenced_and_a_newer_one_is_unknown(harness: Harness) -> None:
    assert (await produce(harness, LED, 4, b"x")).error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert (await produce(harness, LED, 6, b"x")).error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
    partition = harness.manager.get(LED)
    assert partition is not None and partition.log.log_end_offset == 0  # nothing was written


async def test_unknown_topic_and_unhosted_partition_are_told_apart(harness: Harness) -> None:
    unknown = await produce(harness, TopicPartition("nope", 0), -1, b"x")
    unhosted = await produce(harness, TopicPartition("orders", 7), -1, b"x")
    assert unknown.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    assert unhosted.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_produce_rejected_while_fenced_shutting_down_or_without_a_lease(harness: Harness) -> None:
    harness.status.fenced = True
    assert (await produce(harness, LED, 5, b"x")).error_code == ErrorCode.BROKER_NOT_AVAILABLE
    harness.status.fenced = False

    # the lease runs session.timeout.ms less 10% (clock-drift margin) from the accepted heartbeat
    harness.clock.advance(harness.status.lease_duration_ms - 1)
    assert (await produce(harness, LED, 5, b"x")).error_code == ErrorCode.NONE
    harness.clock.advance(1)  # e.g. the process was SIGSTOPped past the session timeout
    response = await produce(harness, LED, 5, b"x")
    assert response.error_code == ErrorCode.BROKER_NOT_AVAILABLE and "session" in response.error_message
    harness.status.heartbeat_accepted(harness.clock.monotonic_ms())

    harness.status.transition(BrokerState.PENDING_CONTROLLED_SHUTDOWN)
    assert (await produce(harness, LED, 5, b"x")).error_code == ErrorCode.BROKER_NOT_AVAILABLE
    meta = await harness.stub.Metadata(pb.BrokerMetadataRequest(cluster_id=CLUSTER), timeout=TIMEOUT_S)
    assert meta.error_code == ErrorCode.BROKER_NOT_AVAILABLE


async def test_bad_produce_requests_are_invalid(harness: Harness) -> None:
    empty = pb.ProduceRequest(cluster_id=CLUSTER, topic=LED.topic, partition=0, leader_epoch=-1)
    assert (await harness.stub.Produce(empty, timeout=TIMEOUT_S)).error_code == ErrorCode.INVALID_REQUEST
    bad_acks = pb.ProduceRequest(
        cluster_id=CLUSTER, topic=LED.topic, partition=0, leader_epoch=-1, acks=3, records=records(b"x")
    )
    assert (await harness.stub.Produce(bad_acks, timeout=TIMEOUT_S)).error_code == ErrorCode.INVALID_REQUEST
    other = pb.ProduceRequest(cluster_id="other", topic=LED.topic, partition=0, records=records(b"x"))
    rejected = await harness.stub.Produce(other, timeout=TIMEOUT_S)
    assert rejected.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID


async def test_fetch_beyond_the_log_is_out_of_range(harness: Harness) -> None:
    await produce(harness, LED, 5, b"a")
    assert (await fetch(harness, 2)).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    assert (await fetch(harness, -1)).error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    at_end = await fetch(harness, 1)
    assert at_end.error_code == 0 and list(at_end.records) == []


async def test_fetch_long_polls_at_the_log_end_until_data_arrives(harness: Harness) -> None:
    parked = asyncio.create_task(fetch(harness, 0, max_wait_ms=10_000))
    partition = harness.manager.get(LED)
    assert partition is not None
    deadline = asyncio.get_running_loop().time() + TIMEOUT_S
    while partition._new_data is None:  # wait until the fetch is parked
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.01)
    await produce(harness, LED, 5, b"late")
    response = await asyncio.wait_for(parked, TIMEOUT_S)
    assert [r.value for r in response.records] == [b"late"]


async def test_fetch_long_poll_times_out_empty(harness: Harness) -> None:
    response = await fetch(harness, 0, max_wait_ms=50)
    assert response.error_code == 0 and list(response.records) == []


async def test_list_offsets_earliest_latest_and_invalid(harness: Harness) -> None:
    await produce(harness, LED, 5, b"a", b"b", b"c")

    async def list_offsets(timestamp: int) -> pb.ListOffsetsResponse:
        request = pb.ListOffsetsRequest(
            cluster_id=CLUSTER, topic=LED.topic, partition=0, timestamp=timestamp, leader_epoch=-1
        )
        return await harness.stub.ListOffsets(request, timeout=TIMEOUT_S)

    assert (await list_offsets(-2)).offset == 0
    assert (await list_offsets(-1)).offset == 3
    assert (await list_offsets(12345)).error_code == ErrorCode.INVALID_REQUEST


async def test_metadata_and_describe_broker(harness: Harness) -> None:
    meta = await harness.stub.Metadata(pb.BrokerMetadataRequest(cluster_id=CLUSTER), timeout=TIMEOUT_S)
    assert meta.error_code == 0 and meta.cluster_id == CLUSTER
    assert [b.broker_id for b in meta.brokers] == [1, 2]

    harness.status.fenced = True  # describe answers even while fenced
    described = await harness.stub.DescribeBroker(
        pb.DescribeBrokerRequest(cluster_id=CLUSTER), timeout=TIMEOUT_S
    )
    assert described.state == "RUNNING" and described.fenced
    assert [(p.topic, p.partition, p.role) for p in described.partitions] == [
        ("orders", 0, "LEADER"),
        ("orders", 1, "FOLLOWER"),
    ]


async def test_a_corrupt_log_on_fetch_takes_its_log_dir_offline_and_is_reported(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Kafka's KafkaStorageException path (issue #14): the client gets KAFKA_STORAGE_ERROR, the log dir and
    its partitions go offline (never served again by this process), the heartbeat report names them, and
    losing the only log dir asks the process to stop."""
    await produce(harness, LED, 5, b"a")
    partition = harness.manager.get(LED)
    assert partition is not None

    def corrupt(offset: int, max_bytes: int) -> list[object]:
        raise CorruptLogError("orders-0/00000000000000000000.log", 0, "CRC-32C mismatch on read", offset=0)

    monkeypatch.setattr(partition.log, "read_records", corrupt)
    stops: list[OSError] = []
    harness.manager.on_all_offline = stops.append
    answer = await fetch(harness, 0)
    assert answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR and "CRC-32C mismatch" in answer.error_message
    assert harness.manager.get(LED) is None and harness.manager.get(FOLLOWED) is None
    dirs, partitions = harness.manager.offline_report()
    assert dirs == [str(partition.log_dir)] and partitions == [("orders", 0), ("orders", 1)]
    assert len(stops) == 1 and "every log dir is offline" in str(stops[0])
    again = await fetch(harness, 0)  # no longer hosted: never read again
    assert again.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    assert (await produce(harness, LED, 5, b"b")).error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER
    described = await harness.stub.DescribeBroker(
        pb.DescribeBrokerRequest(cluster_id=CLUSTER), timeout=TIMEOUT_S
    )  # what `kraft broker describe` shows as OfflineLogDirs, with the reason
    assert len(described.offline_log_dirs) == 1
    assert described.offline_log_dirs[0].startswith(f"{partition.log_dir}: CorruptLogError")
    assert "CRC-32C mismatch" in described.offline_log_dirs[0] and not described.partitions
