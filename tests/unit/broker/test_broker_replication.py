"""Replication between brokers in one process: two BrokerServices on real gRPC servers, in-memory logs,
images built from metadata records; the ReplicaManager's clock is a ManualClock (lag and ISR decisions),
long-polls are bounded by small real waits."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

import grpc
import pytest
from broker_fakes import MemoryLogOpener, MemoryPartitionLog, replayed
from google.protobuf.message import Message
from metric_reads import series_value
from prometheus_client import Counter, Gauge

from kraft.broker import hwm_checkpoint
from kraft.broker.image_adapter import ImageMetadataView, local_assignments
from kraft.broker.partitions import PartitionManager
from kraft.broker.replication import ReplicaManager, ReplicationSettings
from kraft.broker.service import BrokerService
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState, ProducedRecord, ReplicaRole, TopicPartition
from kraft.client.channel import open_channel
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.image import MetadataImage
from kraft.netutil import free_port
from kraft.observability.logging import _FIELDS_ATTR
from kraft.observability.metrics import (
    REPLICA_AT_MIN_ISR_PARTITION_COUNT,
    REPLICA_FETCHER_BYTES,
    REPLICA_FETCHER_MAX_LAG,
    REPLICA_ISR_EXPANDS,
    REPLICA_ISR_SHRINKS,
    REPLICA_LEADER_COUNT,
    REPLICA_PARTITION_COUNT,
    REPLICA_UNDER_MIN_ISR_PARTITION_COUNT,
    REPLICA_UNDER_REPLICATED_PARTITIONS,
)
from kraft.storage.batch import iter_batches
from kraft.storage.errors import FatalStorageError
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc, common_pb2
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb

if TYPE_CHECKING:
    from kraft.v1.broker_pb2_grpc import BrokerServiceAsyncStub

CLUSTER = "c-1"
TOPIC_ID = "tid"
TP = TopicPartition("t", 0)
TIMEOUT_S = 5.0
LAG_MS = 10_000
SESSION_MS = 100_000  # each broker's heartbeat session: its lease is 90_000 ms (BrokerStatus)


@dataclass
class Node:
    broker_id: int
    port: int
    manager: PartitionManager
    opener: MemoryLogOpener
    replicas: ReplicaManager
    service: BrokerService
    server: grpc.aio.Server
    status: BrokerStatus

    def log(self) -> MemoryPartitionLog:
        partition = self.manager.get(TP)
        assert partition is not None
        log = partition.log
        assert isinstance(log, MemoryPartitionLog)
        return log


@dataclass
class Harness:
    clock: ManualClock
    nodes: dict[int, Node]
    image: MetadataImage
    offset: int = 0
    alters: list[cpb.AlterPartitionRequest] = field(default_factory=list)
    fatal: list[tuple[int, str, dict[str, object]]] = field(default_factory=list)  # (broker, reason, fields)
    alter_answer: Callable[[cpb.AlterPartitionRequest], cpb.AlterPartitionResponse] | None = None

    def replay(self, *payloads: Message) -> None:
        self.image = replayed(self.image, self.offset, payloads)
        self.offset += len(payloads)
        for node in self.nodes.values():
            node.manager.reconcile(local_assignments(self.image, node.broker_id))
            node.service.set_view(ImageMetadataView(self.image))
            node.replicas.on_image(self.image)

    async def produce(self, leader: int, *values: bytes, acks: int = 1) -> pb.ProduceResponse:
        async with _Stub(self.nodes[leader].port) as stub:
            request = pb.ProduceRequest(
                cluster_id=CLUSTER, topic=TP.topic, partition=TP.partition, leader_epoch=-1, acks=acks,
                records=[pb.BrokerRecord(value=v, has_value=True) for v in values],
            )  # fmt: skip
            return await stub.Produce(request, timeout=TIMEOUT_S)

    async def consume(self, broker: int, offset: int = 0) -> pb.BrokerFetchResponse:
        async with _Stub(self.nodes[broker].port) as stub:
            request = pb.BrokerFetchRequest(
                cluster_id=CLUSTER,
                topic=TP.topic,
                partition=TP.partition,
                offset=offset,
                max_bytes=1 << 20,
                leader_epoch=-1,
            )
            return await stub.Fetch(request, timeout=TIMEOUT_S)


class _Stub:
    def __init__(self, port: int) -> None:
        self.channel = open_channel(f"127.0.0.1:{port}")

    async def __aenter__(self) -> BrokerServiceAsyncStub:
        stub: BrokerServiceAsyncStub = broker_pb2_grpc.BrokerServiceStub(self.channel)
        return stub

    async def __aexit__(self, *exc: object) -> None:
        await self.channel.close(None)


async def until(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


async def _node(broker_id: int, clock: ManualClock, tmp_path: Path, h: Harness) -> Node:
    status = BrokerStatus(broker_id, CLUSTER, session_timeout_ms=SESSION_MS, clock=clock)
    for state in (BrokerState.STARTING, BrokerState.RECOVERY, BrokerState.RUNNING):
        status.transition(state)
    status.fenced = False
    status.broker_epoch = 100 + broker_id
    status.heartbeat_accepted(clock.monotonic_ms())
    opener = MemoryLogOpener()
    manager = PartitionManager(broker_id, [tmp_path / f"b{broker_id}"], opener)
    manager.load()

    def on_fatal(reason: str, error: BaseException | None = None, **fields: object) -> None:
        h.fatal.append((broker_id, reason, {"error": error, **fields}))

    async def send(request: cpb.AlterPartitionRequest) -> cpb.AlterPartitionResponse:
        h.alters.append(request)
        if h.alter_answer is None:
            return cpb.AlterPartitionResponse(error_code=ErrorCode.REQUEST_TIMED_OUT)
        return h.alter_answer(request)

    replicas = ReplicaManager(
        broker_id,
        CLUSTER,
        manager,
        clock=clock,
        broker_epoch=lambda: status.broker_epoch,
        send_alter_partition=send,
        settings=ReplicationSettings(
            replica_lag_time_max_ms=LAG_MS, fetch_max_wait_ms=50, fetch_backoff_ms=50, produce_timeout_ms=3000
        ),
        on_fatal=on_fatal,
        lease=status,
    )
    service = BrokerService(status, manager, ImageMetadataView(MetadataImage.empty()), replicas=replicas)
    server = grpc.aio.server()
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(service, server)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    return Node(broker_id, port, manager, opener, replicas, service, server, status)


@pytest.fixture
async def h(tmp_path: Path) -> AsyncIterator[Harness]:
    clock = ManualClock(start_ms=1_000_000)
    harness = Harness(clock, {}, MetadataImage.empty())
    for broker_id in (1, 2):
        harness.nodes[broker_id] = await _node(broker_id, clock, tmp_path, harness)
    harness.replay(
        *(
            mpb.RegisterBrokerRecord(
                broker_id=b,
                incarnation_id=f"i{b}",
                broker_epoch=100 + b,
                endpoints=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=n.port)],
                fenced=False,
            )
            for b, n in harness.nodes.items()
        )
    )
    try:
        yield harness
    finally:
        for node in harness.nodes.values():
            await node.replicas.close()
            await node.server.stop(None)
            node.manager.close()


def _create(h: Harness, isr: list[int], leader: int = 1, epoch: int = 3) -> None:
    h.replay(
        mpb.TopicRecord(name=TP.topic, topic_id=TOPIC_ID),
        mpb.PartitionRecord(
            partition_id=0, topic_id=TOPIC_ID, replicas=[1, 2], isr=isr, leader=leader,
            leader_epoch=epoch, partition_epoch=epoch,
        ),
    )  # fmt: skip


def _batches(log: MemoryPartitionLog, below: int) -> list[bytes]:
    return [data for base, data in log.batches if base < below]


async def test_follower_copies_batches_byte_for_byte_and_consumers_read_below_the_high_watermark(
    h: Harness,
) -> None:
    _create(h, isr=[1, 2])
    leader, follower = h.nodes[1], h.nodes[2]
    for values in ([b"a1", b"a2"], [b"a3"], [b"a4", b"a5", b"a6"]):
        response = await h.produce(1, *values)
        assert response.error_code == ErrorCode.NONE
    await until(lambda: follower.log().log_end_offset == 6, "the follower to copy 6 records")
    state = leader.replicas.leader_state(TP)
    assert state is not None
    await until(lambda: state.high_watermark == 6, "the high watermark to reach 6")
    assert _batches(follower.log(), 6) == _batches(leader.log(), 6)
    assert [next(iter(iter_batches(b))).partition_leader_epoch for b in _batches(follower.log(), 6)] == [
        3,
        3,
        3,
    ]
    consumed = await h.consume(1)
    assert [r.value for r in consumed.records] == [b"a1", b"a2", b"a3", b"a4", b"a5", b"a6"]
    assert consumed.high_watermark == 6
    await until(lambda: follower.replicas.follower_high_watermark(TP) == 6, "the follower to learn the HWM")


async def test_consumers_do_not_see_records_an_isr_member_lacks(h: Harness) -> None:
    _create(h, isr=[1, 2])
    await h.nodes[2].replicas.close()  # the follower never fetches
    assert (await h.produce(1, b"x")).error_code == ErrorCode.NONE
    consumed = await h.consume(1)
    assert consumed.error_code == ErrorCode.NONE and list(consumed.records) == []
    assert consumed.high_watermark == 0 and consumed.log_end_offset == 1


async def test_a_leader_alone_in_the_isr_advances_the_high_watermark_on_flush(h: Harness) -> None:
    _create(h, isr=[1])
    await h.nodes[2].replicas.close()
    assert (await h.produce(1, b"x", b"y")).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[1].log().flushed == 2, "the leader to flush")
    assert [r.value for r in (await h.consume(1)).records] == [b"x", b"y"]


async def test_a_diverged_follower_truncates_by_leader_epoch_then_copies(h: Harness) -> None:
    # Broker 2 led epoch 3 and wrote b0..b2 that never reached broker 1; broker 1 leads epoch 5 with
    # its own records from offset 1 on.  Both share offset 0 (epoch 3).
    _create(h, isr=[1, 2], leader=2, epoch=3)
    await h.nodes[1].replicas.close()
    assert (await h.produce(2, b"shared")).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[2].log().flushed == 1, "broker 2 to flush")
    h.nodes[1].log().append_batches(h.nodes[2].log().batches[0][1])  # broker 1 had copied offset 0
    h.nodes[1].log().flush()
    assert (await h.produce(2, b"lost1", b"lost2")).error_code == ErrorCode.NONE
    # Broker 2 stops; broker 1 becomes leader in epoch 5 and appends.
    await h.nodes[2].replicas.close()
    h.nodes[2].replicas = await _restart_replicas(h, 2)
    h.nodes[1].replicas = await _restart_replicas(h, 1)
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, leader=1))
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, leader=1))  # epoch 5
    assert (await h.produce(1, b"new1")).error_code == ErrorCode.NONE
    await until(
        lambda: [r.value for r in h.nodes[2].log().records] == [b"shared", b"new1"],
        "broker 2 to truncate its epoch-3 tail and copy epoch 5",
    )
    assert h.nodes[2].log().batches == h.nodes[1].log().batches


async def _restart_replicas(h: Harness, broker_id: int) -> ReplicaManager:
    """A fresh ReplicaManager on the same logs (the old one was closed), bound to the node's service."""
    node = h.nodes[broker_id]
    old = node.replicas
    replicas = ReplicaManager(
        broker_id,
        CLUSTER,
        node.manager,
        clock=h.clock,
        broker_epoch=lambda: 100 + broker_id,
        send_alter_partition=old._send_alter_partition,
        settings=old.settings,
        lease=node.status,
    )
    node.service._replicas = replicas
    replicas.on_image(h.image)
    return replicas


async def test_a_truncation_below_the_high_watermark_is_refused(h: Harness) -> None:
    _create(h, isr=[1, 2], leader=2, epoch=3)
    await h.nodes[1].replicas.close()
    assert (await h.produce(2, b"a", b"b")).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[2].log().flushed == 2, "broker 2 to flush")
    # Broker 1 holds a different epoch-3 history (impossible with clean elections) and believes 2 is
    # committed: the leader's divergence answer would cut below it.
    h.nodes[1].log().append_records([_produced(b"x"), _produced(b"y")], 2)  # epoch 2, two records
    h.nodes[1].log().flush()
    h.nodes[1].replicas = await _restart_replicas(h, 1)
    followed = h.nodes[1].replicas._followed[TP]
    followed.high_watermark = 2
    h.nodes[1].replicas._ensure_fetcher(2)
    # The leader answers epoch 2 with (2, 0): below the follower's HWM of 2 → refused, nothing deleted.
    await until(lambda: h.nodes[1].replicas.is_stopped(TP), "the follower to stop the partition")
    assert [r.value for r in h.nodes[1].log().records] == [b"x", b"y"]


def _produced(value: bytes) -> ProducedRecord:
    return ProducedRecord(None, value, 0)


async def test_a_lagging_isr_member_is_proposed_out_and_a_caught_up_one_back_in(h: Harness) -> None:
    _create(h, isr=[1, 2])
    await h.nodes[2].replicas.close()
    assert (await h.produce(1, b"x")).error_code == ErrorCode.NONE
    leader = h.nodes[1].replicas
    leader.check_isr_shrinks()
    assert h.alters == [], "ISR members count as caught up when the leadership starts"
    h.clock.advance(LAG_MS + 1)
    leader.check_isr_shrinks()
    await until(lambda: len(h.alters) >= 1, "an AlterPartition")
    shrink = h.alters[0]
    assert shrink.broker_id == 1 and shrink.broker_epoch == 101
    data = shrink.partitions[0]
    assert (data.topic_id, data.leader_epoch, data.partition_epoch) == (TOPIC_ID, 3, 3)
    assert [(m.broker_id, m.broker_epoch) for m in data.new_isr] == [(1, 101)]
    # The controller commits it (kraft bumps both epochs); the HWM no longer waits for 2.
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, isr=mpb.BrokerIdList(ids=[1])))
    state = leader.leader_state(TP)
    assert state is not None and state.isr == (1,) and state.pending is None
    await until(lambda: state.high_watermark == 1, "the HWM to advance without 2")
    # Broker 2 comes back, catches up, and is proposed back in with the epoch it fetched with.
    h.alters.clear()
    h.nodes[2].replicas = await _restart_replicas(h, 2)
    await until(lambda: h.nodes[2].log().log_end_offset == 1, "broker 2 to catch up")
    await until(lambda: len(h.alters) >= 1, "an expansion")
    expand = h.alters[0].partitions[0]
    assert [(m.broker_id, m.broker_epoch) for m in expand.new_isr] == [(1, 101), (2, 102)]
    assert expand.leader_epoch == 4 and expand.partition_epoch == 4


async def test_acks_all_waits_for_the_followers_and_answers_once_they_have_the_records(h: Harness) -> None:
    _create(h, isr=[1, 2])
    answer = await h.produce(1, b"a1", b"a2", acks=-1)
    assert answer.error_code == ErrorCode.NONE and answer.base_offset == 0
    assert h.nodes[2].log().flushed >= 2, "acknowledged only once the follower flushed it"


async def test_acks_all_times_out_when_an_isr_member_does_not_fetch(h: Harness) -> None:
    _create(h, isr=[1, 2])
    await h.nodes[2].replicas.close()
    one = await h.produce(1, b"x", acks=1)
    assert one.error_code == ErrorCode.NONE
    zero = await h.produce(1, b"y", acks=0)
    assert zero.error_code == ErrorCode.NONE
    answer = await h.produce(1, b"z", acks=-1)
    assert answer.error_code == ErrorCode.REQUEST_TIMED_OUT


async def test_acks_all_below_min_insync_replicas_is_refused_before_the_append(h: Harness) -> None:
    _create(h, isr=[1])
    h.replay(mpb.ConfigRecord(resource_type=2, resource_name=TP.topic, name="min.insync.replicas", value="2"))
    answer = await h.produce(1, b"x", acks=-1)
    assert answer.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert h.nodes[1].log().log_end_offset == 0
    assert (await h.produce(1, b"x", acks=1)).error_code == ErrorCode.NONE


async def test_a_stored_per_broker_min_insync_replicas_is_ignored_the_cluster_default_applies(
    h: Harness,
) -> None:
    """The broker resolves min.insync.replicas as the controller's elections do (topic, else cluster-wide
    default): a per-broker value (refused when written now, but an older build stored it) is ignored —
    below the controller's minimum it would let the HWM pass records an eligible leader lacks."""
    _create(h, isr=[1])
    h.replay(mpb.ConfigRecord(resource_type=4, resource_name="", name="min.insync.replicas", value="2"))
    h.replay(mpb.ConfigRecord(resource_type=4, resource_name="1", name="min.insync.replicas", value="1"))
    answer = await h.produce(1, b"x", acks=-1)
    assert answer.error_code == ErrorCode.NOT_ENOUGH_REPLICAS  # 2 (cluster default), not 1 (broker 1's)
    assert h.nodes[1].log().log_end_offset == 0


async def test_acks_all_waiters_get_not_leader_when_the_leadership_moves(h: Harness) -> None:
    _create(h, isr=[1, 2])
    await h.nodes[2].replicas.close()
    waiting = asyncio.create_task(h.produce(1, b"x", acks=-1))
    await until(lambda: h.nodes[1].log().log_end_offset == 1, "the append")
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, leader=2))
    answer = await asyncio.wait_for(waiting, TIMEOUT_S)
    assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


def test_the_hwm_checkpoint_round_trips_and_ignores_another_topic_id(tmp_path: Path) -> None:
    entries = {(TP, TOPIC_ID): 7, (TopicPartition("u", 3), "uid"): 0}
    assert hwm_checkpoint.decode(hwm_checkpoint.encode(entries)) == entries
    hwm_checkpoint.write(tmp_path, entries)
    assert hwm_checkpoint.read(tmp_path) == entries
    (tmp_path / hwm_checkpoint.FILE_NAME).write_bytes(
        b"1\n3\nt 0 7 tid\n"
    )  # torn: fewer lines than announced
    assert hwm_checkpoint.read(tmp_path) == {}


async def test_a_restarted_leader_serves_consumers_up_to_its_checkpointed_hwm(h: Harness) -> None:
    _create(h, isr=[1, 2])
    assert (await h.produce(1, b"a", b"b", acks=-1)).error_code == ErrorCode.NONE
    await h.nodes[1].replicas.close()  # writes the checkpoint: HWM 2
    await h.nodes[2].replicas.close()  # the follower is gone: nothing would advance the HWM again
    h.nodes[1].replicas = await _restart_replicas(h, 1)
    state = h.nodes[1].replicas.leader_state(TP)
    assert state is not None and state.high_watermark == 2
    assert [r.value for r in (await h.consume(1)).records] == [b"a", b"b"]


async def _list_offsets(h: Harness, broker: int, timestamp: int) -> pb.ListOffsetsResponse:
    async with _Stub(h.nodes[broker].port) as stub:
        request = pb.ListOffsetsRequest(
            cluster_id=CLUSTER, topic=TP.topic, partition=TP.partition, timestamp=timestamp, leader_epoch=-1
        )
        return await stub.ListOffsets(request, timeout=TIMEOUT_S)


async def _list_latest(h: Harness, broker: int) -> pb.ListOffsetsResponse:
    return await _list_offsets(h, broker, -1)


async def test_a_leader_without_replication_state_answers_not_leader_until_it_is_set_up(h: Harness) -> None:
    """The restart window: the partition is open as LEADER, but the image has not reached replication
    yet.  Fetch, ListOffsets and Produce answer the retriable NOT_LEADER_OR_FOLLOWER — never HWM 0 (an
    empty partition to a consumer) — and serve normally once the state is set up."""
    _create(h, isr=[1, 2])
    assert (await h.produce(1, b"a", b"b", acks=-1)).error_code == ErrorCode.NONE
    await h.nodes[1].replicas.close()  # writes the checkpoint: HWM 2
    node = h.nodes[1]
    old = node.replicas
    replicas = ReplicaManager(
        1, CLUSTER, node.manager, clock=h.clock, broker_epoch=lambda: 101,
        send_alter_partition=old._send_alter_partition, settings=old.settings,
    )  # fmt: skip
    node.service._replicas = node.replicas = replicas  # restarted; no image reached it yet
    partition = node.manager.get(TP)
    assert partition is not None and partition.role is ReplicaRole.LEADER and not replicas.leads(partition)

    consumed = await h.consume(1)
    assert consumed.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, consumed
    assert "becoming the leader" in consumed.error_message and not consumed.records
    assert consumed.high_watermark == -1 and consumed.leader_epoch == 3
    latest = await _list_latest(h, 1)
    assert latest.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and latest.offset == -1
    produced = await h.produce(1, b"c")
    assert produced.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and produced.base_offset == -1
    assert node.log().log_end_offset == 2  # nothing appended while refused

    replicas.on_image(h.image)
    assert replicas.leads(partition)
    consumed = await h.consume(1)
    assert consumed.error_code == ErrorCode.NONE and consumed.high_watermark == 2
    assert [r.value for r in consumed.records] == [b"a", b"b"]
    assert (await _list_latest(h, 1)).offset == 2


async def test_a_parked_fetch_answers_not_leader_when_the_leader_state_goes_away(h: Harness) -> None:
    """A consumer long-polling at the HWM is re-checked when woken: a leader state dropped under it (the
    partition replaced, e.g. re-created) is NOT_LEADER_OR_FOLLOWER, not an empty answer at HWM 0."""
    _create(h, isr=[1])
    assert (await h.produce(1, b"a")).error_code == ErrorCode.NONE
    node = h.nodes[1]
    await until(lambda: node.replicas.leader_state(TP) is not None, "the leader state")
    await until(lambda: node.replicas.high_watermark(node.manager.get(TP)) == 1, "HWM 1")  # type: ignore[arg-type]
    async with _Stub(node.port) as stub:
        request = pb.BrokerFetchRequest(
            cluster_id=CLUSTER, topic=TP.topic, partition=TP.partition, offset=1, max_bytes=1 << 20,
            leader_epoch=-1, max_wait_ms=3_000,
        )  # fmt: skip
        parked = asyncio.ensure_future(stub.Fetch(request, timeout=TIMEOUT_S))
        await until(lambda: node.service._parked == 1, "the fetch to park")
        node.replicas._drop_led(TP)  # as on_image does when the state no longer matches the partition
        partition = node.manager.get(TP)
        assert partition is not None
        partition.notify_appended()
        answer = await parked
    assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and answer.high_watermark == -1


async def test_latest_offset_is_not_available_while_the_hwm_is_below_the_leader_epoch_start(
    h: Harness,
) -> None:
    """KIP-207: a leader whose high watermark has not reached the start of its own epoch yet (its ISR
    followers have not fetched since it took over) answers ListOffsets LATEST with the retriable
    OFFSET_NOT_AVAILABLE — not a stale end — and the committed end once they have."""
    _create(h, isr=[1, 2])
    follower = h.nodes[2].replicas
    await follower.close()  # the follower stops fetching
    assert (await h.produce(1, b"a", b"b", acks=1)).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[1].log().flushed == 2, "broker 1 to flush")
    assert (await _list_latest(h, 1)).offset == 0  # epoch 3 started at 0: nothing committed yet
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, leader=1))  # epoch 4 starts at 2
    state = h.nodes[1].replicas.leader_state(TP)
    assert state is not None and state.leader_epoch_start_offset == 2 and state.high_watermark == 0
    latest = await _list_latest(h, 1)
    assert latest.error_code == ErrorCode.OFFSET_NOT_AVAILABLE and latest.offset == -1, latest
    assert "below the start offset of leader epoch 4" in latest.error_message
    earliest = await _list_offsets(h, 1, -2)  # EARLIEST is not affected (as in Kafka)
    assert earliest.error_code == ErrorCode.NONE and earliest.offset == 0
    h.nodes[2].replicas = await _restart_replicas(h, 2)  # the follower fetches again: HWM reaches 2
    await until(lambda: state.high_watermark == 2, "the HWM to reach the epoch start")
    latest = await _list_latest(h, 1)
    assert latest.error_code == ErrorCode.NONE and latest.offset == 2


async def test_a_broker_stopped_before_its_partitions_opened_keeps_its_hwm_checkpoint(h: Harness) -> None:
    """Stopped during the start-up catch-up (no partition state yet): the checkpoint was never read, so
    it is not replaced by an empty one — the next start still begins from HWM 2."""
    _create(h, isr=[1, 2])
    assert (await h.produce(1, b"a", b"b", acks=-1)).error_code == ErrorCode.NONE
    await h.nodes[1].replicas.close()  # writes the checkpoint: HWM 2
    log_dir = h.nodes[1].manager.get(TP).log_dir  # type: ignore[union-attr]
    stored = hwm_checkpoint.read_checked(log_dir)
    assert stored.entries == {(TP, TOPIC_ID): 2}
    node = h.nodes[1]
    stopped_early = ReplicaManager(
        1, CLUSTER, node.manager, clock=h.clock, broker_epoch=lambda: 101, send_alter_partition=None
    )
    assert await stopped_early.checkpoints.write_changed(stopped_early._checkpoint_entries()) == 0
    await stopped_early.close()
    assert hwm_checkpoint.read_checked(log_dir) == stored
    h.nodes[1].replicas = await _restart_replicas(h, 1)
    state = h.nodes[1].replicas.leader_state(TP)
    assert state is not None and state.high_watermark == 2


def _failing_flush(log: MemoryPartitionLog) -> list[int]:
    """Make ``log.flush`` raise EIO from now on (fsyncgate: it never succeeds again); returns the list the
    attempts are counted in."""
    attempts: list[int] = []

    def flush() -> None:
        attempts.append(log.log_end_offset)
        raise FatalStorageError("fsync of 00000000000000000000.log failed (Input/output error); stopping")

    log.flush = flush  # type: ignore[method-assign]
    return attempts


async def test_a_failed_leader_flush_is_fatal_and_nothing_after_it_is_acknowledged(h: Harness) -> None:
    _create(h, isr=[1, 2])
    first = await h.produce(1, b"a1", acks=-1)
    assert first.error_code == ErrorCode.NONE and first.base_offset == 0
    attempts = _failing_flush(h.nodes[1].log())
    answer = await h.produce(1, b"a2", acks=-1)
    assert answer.error_code == ErrorCode.KAFKA_STORAGE_ERROR and answer.base_offset == -1
    assert [(b, reason) for b, reason, _ in h.fatal] == [(1, "partition_flush_failed")]
    assert h.fatal[0][2]["partition"] == str(TP)
    assert len(attempts) == 1, "a failed fsync is never retried"
    # From now on nothing is admitted (acks=1 too), served to followers, or counted in the HWM.
    refused = await h.produce(1, b"a3", acks=1)
    assert refused.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert h.nodes[1].log().log_end_offset == 2
    state = h.nodes[1].replicas.leader_state(TP)
    assert state is not None and state.high_watermark == 1
    consumed = await h.consume(1)
    assert [r.value for r in consumed.records] == [b"a1"]
    async with _Stub(h.nodes[1].port) as stub:
        fetched = await stub.ReplicaFetch(
            pb.ReplicaFetchRequest(cluster_id=CLUSTER, replica_id=2, broker_epoch=102, max_wait_ms=0),
            timeout=TIMEOUT_S,
        )
    assert fetched.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert len(h.fatal) == 1 and len(attempts) == 1


async def test_acks_all_waiters_get_a_storage_error_when_the_leader_flush_fails_later(h: Harness) -> None:
    # The follower never fetches, so the first request waits; the second one's flush fails: the first
    # one must not be acknowledged either, even if the follower shows up afterwards.
    _create(h, isr=[1, 2])
    await h.nodes[2].replicas.close()
    waiting = asyncio.create_task(h.produce(1, b"w", acks=-1))
    await until(lambda: h.nodes[1].log().flushed == 1, "the first flush")
    _failing_flush(h.nodes[1].log())
    second = await h.produce(1, b"x", acks=1)
    assert second.error_code == ErrorCode.NONE  # acks=1: answered at the append, before the flush
    first = await asyncio.wait_for(waiting, TIMEOUT_S)
    assert first.error_code == ErrorCode.KAFKA_STORAGE_ERROR
    assert [reason for _, reason, _ in h.fatal] == ["partition_flush_failed"]


async def test_a_failed_follower_flush_is_fatal_and_the_follower_stops_fetching(h: Harness) -> None:
    _create(h, isr=[1, 2])
    attempts = _failing_flush(h.nodes[2].log())
    answer = await h.produce(1, b"a1", acks=-1)
    await until(lambda: bool(h.fatal), "the follower's fatal report")
    assert [(b, reason) for b, reason, _ in h.fatal] == [(2, "replica_append_failed")]
    assert answer.error_code == ErrorCode.REQUEST_TIMED_OUT, "the follower never reported a durable position"
    assert len(attempts) == 1
    state = h.nodes[1].replicas.leader_state(TP)
    assert state is not None and state.high_watermark == 0


async def test_replica_fetches_respect_the_partition_and_response_byte_limits(h: Harness) -> None:
    _create(h, isr=[1, 2])
    await h.nodes[2].replicas.close()  # fetches by hand
    for value in (b"a" * 100, b"b" * 100, b"c" * 100):
        assert (await h.produce(1, value)).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[1].log().flushed == 3, "the leader to flush")
    sizes = [len(data) for _, data in h.nodes[1].log().batches]

    async def fetch(max_bytes: int, partition_max_bytes: int) -> bytes:
        request = pb.ReplicaFetchRequest(
            cluster_id=CLUSTER, replica_id=2, broker_epoch=102, max_bytes=max_bytes
        )
        request.partitions.add(
            topic=TP.topic, partition=0, current_leader_epoch=3, fetch_offset=0, last_fetched_epoch=-1,
            partition_max_bytes=partition_max_bytes,
        )  # fmt: skip
        response = await h.nodes[1].replicas.replica_fetch(request)
        [answer] = response.partitions
        assert answer.error_code == ErrorCode.NONE
        return answer.records

    assert len(await fetch(0, 0)) == sum(sizes)
    assert len(await fetch(0, sizes[0] + sizes[1])) == sizes[0] + sizes[1]
    assert len(await fetch(sizes[0] + sizes[1] + sizes[2] - 1, 0)) == sizes[0] + sizes[1]
    # The first batch always goes, however small the limits: a follower is never stuck behind one.
    assert len(await fetch(1, 1)) == sizes[0]


async def test_the_broker_default_min_insync_replicas_applies_without_a_topic_config(h: Harness) -> None:
    _create(h, isr=[1])
    await h.nodes[2].replicas.close()
    node = h.nodes[1]
    await node.replicas.close()
    replicas = ReplicaManager(
        1,
        CLUSTER,
        node.manager,
        clock=h.clock,
        broker_epoch=lambda: 101,
        send_alter_partition=None,
        settings=ReplicationSettings(min_insync_replicas=2, produce_timeout_ms=3000),
    )
    node.replicas = node.service._replicas = replicas
    replicas.on_image(h.image)
    answer = await h.produce(1, b"x", acks=-1)
    assert answer.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    assert node.log().log_end_offset == 0
    h.replay(mpb.ConfigRecord(resource_type=2, resource_name=TP.topic, name="min.insync.replicas", value="1"))
    assert (await h.produce(1, b"x", acks=-1)).error_code == ErrorCode.NONE, "the topic config overrides"


def _sample(family: Gauge | Counter, node: int) -> float:
    return series_value(family, node=str(node))


async def test_replication_metrics_and_describe_broker_show_isr_health_and_lag(h: Harness) -> None:
    shrinks, expands = (
        _sample(REPLICA_ISR_SHRINKS, 1),
        _sample(REPLICA_ISR_EXPANDS, 1),
    )
    _create(h, isr=[1, 2])
    h.replay(mpb.ConfigRecord(resource_type=2, resource_name=TP.topic, name="min.insync.replicas", value="2"))
    assert (await h.produce(1, b"a", b"b", acks=-1)).error_code == ErrorCode.NONE
    assert _sample(REPLICA_LEADER_COUNT, 1) == 1 and _sample(REPLICA_PARTITION_COUNT, 2) == 1
    assert _sample(REPLICA_UNDER_REPLICATED_PARTITIONS, 1) == 0
    assert _sample(REPLICA_AT_MIN_ISR_PARTITION_COUNT, 1) == 1
    await until(
        lambda: h.nodes[2].replicas.replica_lag(TP) == (2, 0, []), "the follower to know it is caught up"
    )
    assert _sample(REPLICA_FETCHER_MAX_LAG, 2) == 0
    assert _sample(REPLICA_FETCHER_BYTES, 2) > 0
    async with _Stub(h.nodes[1].port) as stub:
        described = await stub.DescribeBroker(pb.DescribeBrokerRequest(cluster_id=CLUSTER), timeout=TIMEOUT_S)
    [led] = described.partitions
    assert (led.role, led.log_end_offset, led.high_watermark, led.lag) == ("LEADER", 2, 2, 0)
    assert [(f.broker_id, f.log_end_offset, f.lag, f.in_isr) for f in led.followers] == [(2, 2, 0, True)]
    # The follower stops fetching and the controller takes it out of the ISR: counted, under min ISR.
    await h.nodes[2].replicas.close()
    assert (await h.produce(1, b"c", acks=1)).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[1].log().flushed == 3, "the leader flush")
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, isr=mpb.BrokerIdList(ids=[1])))
    assert _sample(REPLICA_ISR_SHRINKS, 1) == shrinks + 1
    assert _sample(REPLICA_UNDER_REPLICATED_PARTITIONS, 1) == 1
    assert _sample(REPLICA_UNDER_MIN_ISR_PARTITION_COUNT, 1) == 1
    hwm, lag, followers = h.nodes[1].replicas.replica_lag(TP)
    # KIP-966: the HWM stays at 2 while the ISR is below min ISR (the acks=1 record is not readable yet;
    # the eligible leader 2 holds everything below the HWM)
    assert (hwm, lag) == (2, 0) and followers == [(2, 2, 1, False)]
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, isr=mpb.BrokerIdList(ids=[1, 2])))
    assert _sample(REPLICA_ISR_EXPANDS, 1) == expands + 1
    assert _sample(REPLICA_UNDER_REPLICATED_PARTITIONS, 1) == 0


async def test_the_leader_counts_a_followers_durable_offset_not_its_fetch_offset(h: Harness) -> None:
    _create(h, isr=[1, 2])
    await h.nodes[2].replicas.close()  # fetches by hand
    assert (await h.produce(1, b"a", b"b", b"c")).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[1].log().flushed == 3, "the leader to flush")
    state = h.nodes[1].replicas.leader_state(TP)
    assert state is not None

    async def fetch(fetch_offset: int, durable_offset: int | None) -> pb.ReplicaFetchResponse.Partition:
        request = pb.ReplicaFetchRequest(cluster_id=CLUSTER, replica_id=2, broker_epoch=102)
        request.partitions.add(
            topic=TP.topic, partition=0, current_leader_epoch=3, fetch_offset=fetch_offset,
            last_fetched_epoch=-1, durable_offset=durable_offset,  # -1: no divergence check
        )  # fmt: skip
        [answer] = (await h.nodes[1].replicas.replica_fetch(request)).partitions
        return answer

    # Fetched all three, flushed one: only the flushed one is on two disks.
    assert (await fetch(3, 1)).error_code == ErrorCode.NONE
    assert state.high_watermark == 1
    assert (await fetch(3, 7)).error_code == ErrorCode.NONE  # never past the fetch offset
    assert state.high_watermark == 3
    beyond = await fetch(4, 3)  # the fetch offset itself must be on the leader's log
    assert beyond.error_code == ErrorCode.OFFSET_OUT_OF_RANGE and state.high_watermark == 3


def _hold_flushes(log: MemoryPartitionLog) -> Callable[[], None]:
    """Make ``log.flush`` do nothing (a flush that has not happened yet); returns the release."""
    real = log.flush
    log.flush = lambda: None  # type: ignore[method-assign]

    def release() -> None:
        log.flush = real  # type: ignore[method-assign]

    return release


async def test_a_follower_is_served_batches_the_leader_has_not_flushed_but_the_hwm_counts_only_flushed(
    h: Harness,
) -> None:
    _create(h, isr=[1, 2])
    await h.nodes[2].replicas.close()  # fetches by hand
    leader = h.nodes[1]
    release = _hold_flushes(leader.log())
    assert (await h.produce(1, b"a", b"b", b"c")).error_code == ErrorCode.NONE
    assert leader.log().flushed == 0 and leader.log().log_end_offset == 3
    state = leader.replicas.leader_state(TP)
    assert state is not None
    first = (await _replica_fetch(h, 1, 2, 0)).partitions[0]
    assert first.error_code == ErrorCode.NONE
    assert [r.value for batch in iter_batches(first.records) for r in batch.records] == [b"a", b"b", b"c"]
    assert first.log_end_offset == 3  # the whole log, flushed or not
    # The follower flushed all three and says so: recorded, but the leader has none on its disk, so
    # nothing is committed (a leader counting its appended end would put the HWM at 3 here).
    second = (await _replica_fetch(h, 1, 2, 3)).partitions[0]
    assert second.error_code == ErrorCode.NONE
    follower = state.follower(2)
    assert follower is not None and follower.log_end_offset == 3
    assert state.high_watermark == 0 and second.high_watermark == 0
    assert list((await h.consume(1)).records) == []
    release()
    assert (await h.produce(1, b"d")).error_code == ErrorCode.NONE  # its flush covers a..d
    await until(lambda: leader.log().flushed == 4, "the leader to flush")
    assert state.high_watermark == 3  # the follower's durable end: the minimum over the ISR


async def test_acks_all_is_answered_only_once_the_leader_itself_flushed(h: Harness) -> None:
    _create(h, isr=[1, 2])
    leader, follower = h.nodes[1], h.nodes[2]
    release = _hold_flushes(leader.log())
    produce = asyncio.create_task(h.produce(1, b"a", acks=-1))
    # The follower copies the unflushed batch, flushes it and reports it durable ...
    state = leader.replicas.leader_state(TP)
    assert state is not None
    await until(lambda: follower.log().flushed == 1, "the follower to copy and flush the batch")
    await until(
        lambda: (f := state.follower(2)) is not None and f.log_end_offset == 1,
        "the leader to record the follower's durable end",
    )
    await asyncio.sleep(0.05)
    # ... but the record is not on the leader's disk yet: not acknowledged.
    assert not produce.done() and state.high_watermark == 0
    release()
    assert (await h.produce(1, b"b")).error_code == ErrorCode.NONE  # acks=1; its flush covers both
    assert (await asyncio.wait_for(produce, TIMEOUT_S)).error_code == ErrorCode.NONE
    assert leader.log().flushed >= 1


async def test_a_follower_truncates_the_unflushed_tail_a_restarted_leader_lost(h: Harness) -> None:
    # Broker 1 leads epoch 3; broker 2 copies (and flushes) b and c, which broker 1 never flushed.
    _create(h, isr=[1, 2])
    leader, follower = h.nodes[1], h.nodes[2]
    assert (await h.produce(1, b"a", acks=-1)).error_code == ErrorCode.NONE
    release = _hold_flushes(leader.log())
    assert (await h.produce(1, b"b", b"c")).error_code == ErrorCode.NONE
    await until(lambda: follower.log().flushed == 3, "the follower to copy and flush b and c")
    assert leader.log().flushed == 1
    # Broker 1's machine crashes: its page cache, so b and c, is gone.  It restarts and is elected
    # again (epoch 5); broker 2's b and c were never acknowledged and must go.
    await leader.replicas.close()
    await follower.replicas.close()
    leader.log().truncate_to(1)
    release()
    leader.replicas = await _restart_replicas(h, 1)
    follower.replicas = await _restart_replicas(h, 2)
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, leader=2))
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, leader=1))  # epoch 5
    assert (await h.produce(1, b"d", acks=-1)).error_code == ErrorCode.NONE
    assert [r.value for r in follower.log().records] == [b"a", b"d"]
    assert follower.log().batches == leader.log().batches


async def test_a_follower_catching_up_flushes_every_few_bytes_and_once_caught_up(h: Harness) -> None:
    follower = h.nodes.pop(2)  # it learns about the partition only once the leader is far ahead
    _create(h, isr=[1])
    for i in range(6):
        assert (await h.produce(1, bytes([65 + i]) * 100)).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[1].log().flushed == 6, "the leader to flush")
    size = len(h.nodes[1].log().batches[0][1])
    # One batch per fetch (the first batch always goes); a flush once 2.5 batches are unflushed.
    follower.replicas.settings = replace(
        follower.replicas.settings, fetch_max_bytes=1, catch_up_flush_bytes=size * 5 // 2
    )
    h.nodes[2] = follower
    h.replay()  # the follower applies the image: it follows partition 0 from offset 0
    await until(lambda: follower.log().flushed == 6, "the follower to copy and flush 6 batches")
    assert follower.log().flush_calls == 2  # after the third batch (2.5 reached) and once caught up
    assert _batches(follower.log(), 6) == _batches(h.nodes[1].log(), 6)
    state = h.nodes[1].replicas.leader_state(TP)
    assert state is not None
    await until(lambda: state.high_watermark == 6, "the leader to count the follower's durable end")


async def test_the_dynamic_broker_min_insync_replicas_applies_below_the_topic_config(h: Harness) -> None:
    """``kraft config alter --entity-type brokers --entity-default``: the cluster default replaces the
    .properties value at once; a topic's own min.insync.replicas still wins.  (A per-broker value is
    refused when written and ignored if stored: the test above.)"""
    _create(h, isr=[1])
    assert (await h.produce(1, b"a", acks=-1)).error_code == ErrorCode.NONE
    h.replay(mpb.ConfigRecord(resource_type=4, resource_name="", name="min.insync.replicas", value="2"))
    refused = await h.produce(1, b"x", acks=-1)
    assert refused.error_code == ErrorCode.NOT_ENOUGH_REPLICAS
    h.replay(mpb.ConfigRecord(resource_type=2, resource_name=TP.topic, name="min.insync.replicas", value="1"))
    assert (await h.produce(1, b"y", acks=-1)).error_code == ErrorCode.NONE, "the topic config wins"


async def _replica_fetch(
    h: Harness, leader: int, follower: int, offset: int, epoch: int = 3
) -> pb.ReplicaFetchResponse:
    """One ReplicaFetch as ``follower`` would send it (in ``epoch``, everything below ``offset`` durable)."""
    async with _Stub(h.nodes[leader].port) as stub:
        request = pb.ReplicaFetchRequest(
            cluster_id=CLUSTER, replica_id=follower, broker_epoch=100 + follower, max_wait_ms=0
        )
        request.partitions.add(
            topic=TP.topic, partition=TP.partition, current_leader_epoch=epoch, fetch_offset=offset,
            last_fetched_epoch=3, partition_max_bytes=1 << 20, durable_offset=offset,
        )  # fmt: skip
        return await stub.ReplicaFetch(request, timeout=TIMEOUT_S)


async def test_a_leader_whose_lease_lapsed_refuses_followers_holds_its_hwm_and_fails_acks_all(
    h: Harness,
) -> None:
    """A leader whose heartbeat lease ran out may already be fenced, with a new leader taking writes: it
    serves no replica fetch, commits nothing more and answers no acks=all waiter with success — and
    picks up where it was once a heartbeat is accepted again."""
    _create(h, isr=[1, 2])
    leader, follower = h.nodes[1], h.nodes[2]
    assert (await h.produce(1, b"a", acks=-1)).error_code == ErrorCode.NONE
    await follower.replicas.close()  # the follower stops at offset 1
    state = leader.replicas.leader_state(TP)
    assert state is not None and state.high_watermark == 1
    waiting = asyncio.create_task(h.produce(1, b"b", acks=-1))
    await until(lambda: leader.log().flushed == 2, "the append of b")
    assert not waiting.done()

    # The leader's lease lapses (no heartbeat accepted for 90% of the session); the follower's does not.
    h.clock.advance(leader.status.lease_duration_ms)
    follower.status.heartbeat_accepted(h.clock.monotonic_ms())
    assert not leader.replicas.check_lease()
    answer = await asyncio.wait_for(waiting, TIMEOUT_S)
    assert answer.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER, "retriable, never success"
    assert state.high_watermark_held

    refused = await _replica_fetch(h, 1, 2, 2)
    assert refused.error_code == ErrorCode.NONE
    (part,) = refused.partitions
    assert part.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and part.records == b""
    progress = state.follower(2)
    assert progress is not None and progress.log_end_offset == 1, "a refused fetch is not recorded"
    # 2 has not fetched for longer than replica.lag.time.max.ms, but that is the leader's doing.
    leader.replicas.check_isr_shrinks()
    assert h.alters == []
    # The controller commits ISR [1] meanwhile: the leader alone would be at 2 at once; it stays at 1.
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, isr=mpb.BrokerIdList(ids=[1])))
    assert state.isr == (1,) and state.high_watermark == 1
    partition = leader.manager.get(TP)
    assert partition is not None and leader.replicas.high_watermark(partition) == 1
    assert (await h.produce(1, b"c", acks=-1)).error_code == ErrorCode.BROKER_NOT_AVAILABLE
    assert (await leader.replicas.wait_for_acks(partition, 2)) is ErrorCode.NOT_LEADER_OR_FOLLOWER

    # A heartbeat is accepted again: the HWM goes to what the events allow, followers are served.
    leader.status.heartbeat_accepted(h.clock.monotonic_ms())
    assert leader.replicas.check_lease()
    assert not state.high_watermark_held and state.high_watermark == 2
    assert [r.value for r in (await h.consume(1)).records] == [b"a", b"b"]
    served = await _replica_fetch(h, 1, 2, 1, epoch=4)  # kraft bumps the epoch on every ISR change
    assert served.partitions[0].error_code == ErrorCode.NONE
    assert served.partitions[0].high_watermark == 2 and served.partitions[0].records
    assert (await h.produce(1, b"c", acks=-1)).error_code == ErrorCode.NONE


async def test_a_replica_fetch_parked_when_the_lease_lapses_is_answered_refused_at_once(h: Harness) -> None:
    _create(h, isr=[1, 2])
    leader = h.nodes[1]
    await h.nodes[2].replicas.close()
    async with _Stub(leader.port) as stub:
        request = pb.ReplicaFetchRequest(
            cluster_id=CLUSTER, replica_id=2, broker_epoch=102, max_wait_ms=3_000
        )
        request.partitions.add(
            topic=TP.topic, partition=TP.partition, current_leader_epoch=3, fetch_offset=0,
            last_fetched_epoch=-1, partition_max_bytes=1 << 20, durable_offset=0,
        )  # fmt: skip
        parked = asyncio.ensure_future(stub.ReplicaFetch(request, timeout=TIMEOUT_S))
        await until(lambda: leader.service._parked == 1, "the fetch to park")
        h.clock.advance(leader.status.lease_duration_ms)
        assert not leader.replicas.check_lease()
        started = asyncio.get_running_loop().time()
        answer = await parked
    assert asyncio.get_running_loop().time() - started < 2.0, "answered at the lapse, not at max_wait_ms"
    assert answer.partitions[0].error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER


async def test_the_lease_watch_releases_held_high_watermarks_when_a_heartbeat_is_accepted(h: Harness) -> None:
    """No fetch or flush needed: the watch notices the lease is back (it polls while lapsed)."""
    _create(h, isr=[1])
    leader = h.nodes[1]
    await h.nodes[2].replicas.close()
    assert (await h.produce(1, b"a")).error_code == ErrorCode.NONE
    state = leader.replicas.leader_state(TP)
    assert state is not None
    await until(lambda: state.high_watermark == 1, "HWM 1")
    h.clock.advance(leader.status.lease_duration_ms)
    assert not leader.replicas.check_lease()
    partition = leader.manager.get(TP)
    assert partition is not None
    leader.log().append_records([_produced(b"b")], 3)  # accepted just before the lapse
    leader.replicas.on_appended(partition)
    await until(lambda: leader.log().flushed == 2, "the flush of b")
    assert state.high_watermark == 1  # flushed, but a lapsed leader commits nothing
    watch = asyncio.create_task(leader.replicas._run_lease_watch())
    try:
        leader.status.heartbeat_accepted(h.clock.monotonic_ms())
        await until(lambda: state.high_watermark == 2, "the watch to release the HWM")
    finally:
        watch.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await watch


async def test_a_leader_from_an_unclean_election_reports_recovered_before_it_expands(h: Harness) -> None:
    """KIP-704: the partition comes as RECOVERING (unclean election); its leader proposes its ISR as it
    is with RECOVERED, and asks for no expansion until that is committed."""
    h.replay(
        mpb.TopicRecord(name=TP.topic, topic_id=TOPIC_ID),
        mpb.PartitionRecord(
            partition_id=0, topic_id=TOPIC_ID, replicas=[1, 2], isr=[1], leader=1, leader_epoch=3,
            partition_epoch=3, leader_recovery_state=1,
        ),
    )  # fmt: skip
    await until(lambda: len(h.alters) >= 1, "the RECOVERED report")
    report = h.alters[0].partitions[0]
    assert [m.broker_id for m in report.new_isr] == [1] and report.leader_recovery_state == 0
    assert (report.leader_epoch, report.partition_epoch) == (3, 3)
    # 2 catches up meanwhile: no expansion while RECOVERING (the report is still unanswered)
    assert (await h.produce(1, b"x")).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[2].log().log_end_offset == 1, "broker 2 to catch up")
    assert all(len(a.partitions[0].new_isr) == 1 for a in h.alters)
    # RECOVERED committed: the expansion follows
    h.alters.clear()
    h.replay(mpb.PartitionChangeRecord(topic_id=TOPIC_ID, partition_id=0, leader_recovery_state=0))
    await until(lambda: any(len(a.partitions[0].new_isr) == 2 for a in h.alters), "an expansion")


async def _diverged_follower(
    h: Harness, *, unclean_epoch: int, tail_epoch: int = 2, unclean_config: bool = False
) -> Node:
    """Broker 2 leads at epoch 3 with [a, b]; broker 1 returns holding [x, y], written in ``tail_epoch``,
    below its HWM of 2 — the new leader lacks its committed tail.  The partition's latest unclean election
    is at ``unclean_epoch`` (0 = none)."""
    h.replay(
        mpb.TopicRecord(name=TP.topic, topic_id=TOPIC_ID),
        mpb.PartitionRecord(
            partition_id=0, topic_id=TOPIC_ID, replicas=[1, 2], isr=[1, 2], leader=2, leader_epoch=3,
            partition_epoch=3, last_unclean_leader_epoch=unclean_epoch,
        ),
    )  # fmt: skip
    if unclean_config:
        h.replay(
            mpb.ConfigRecord(
                resource_type=2, resource_name=TP.topic, name="unclean.leader.election.enable", value="true"
            )
        )
    await h.nodes[1].replicas.close()
    assert (await h.produce(2, b"a", b"b")).error_code == ErrorCode.NONE
    await until(lambda: h.nodes[2].log().flushed == 2, "broker 2 to flush")
    h.nodes[1].log().append_records([_produced(b"x"), _produced(b"y")], tail_epoch)  # the new leader lacks it
    h.nodes[1].log().flush()
    h.nodes[1].replicas = await _restart_replicas(h, 1)
    followed = h.nodes[1].replicas._followed[TP]
    followed.high_watermark = 2
    h.nodes[1].replicas._ensure_fetcher(2)
    return h.nodes[1]


async def test_after_an_unclean_election_a_follower_truncates_its_older_committed_tail(
    h: Harness, caplog: pytest.LogCaptureFixture
) -> None:
    """The partition's last unclean election is at epoch 3 (its record says so, whatever the topic's
    unclean.leader.election.enable says: it is unset here, as after ElectLeaders UNCLEAN): the follower's
    committed tail, written in epoch 2, is the loss that election accepted — it truncates to the new
    leader (Kafka's behaviour), with one warning naming the lost offsets, lowers its HWM and replicates."""
    follower = await _diverged_follower(h, unclean_epoch=3)
    await until(lambda: [r.value for r in follower.log().records] == [b"a", b"b"], "the follower to converge")
    assert not follower.replicas.is_stopped(TP)
    assert follower.replicas._followed[TP].high_watermark <= 2
    [warning] = [r for r in caplog.records if "truncation_below_high_watermark" in r.getMessage()]
    fields = getattr(warning, _FIELDS_ATTR)
    assert warning.levelname == "WARNING" and warning.getMessage() == "truncation_below_high_watermark"
    assert (fields["lost_offsets"], fields["unclean_leader_epoch"], fields["offset"]) == ("0..1", 3, 0)


async def test_the_unclean_config_alone_never_truncates_below_the_high_watermark(h: Harness) -> None:
    """unclean.leader.election.enable=true but no unclean election recorded (a clean leader change): a
    divergence below the HWM is a bug, never an accepted loss — refused, nothing deleted."""
    follower = await _diverged_follower(h, unclean_epoch=0, unclean_config=True)
    await until(lambda: follower.replicas.is_stopped(TP), "the follower to stop the partition")
    assert [r.value for r in follower.log().records] == [b"x", b"y"]


async def test_a_committed_tail_written_at_or_after_the_unclean_election_is_never_truncated(
    h: Harness,
) -> None:
    """The unclean election was at epoch 2 and the tail was written in epoch 2, by that election's
    leader: a later (clean) leader lacking it would lose records acknowledged after the election —
    refused, nothing deleted."""
    follower = await _diverged_follower(h, unclean_epoch=2, tail_epoch=2)
    await until(lambda: follower.replicas.is_stopped(TP), "the follower to stop the partition")
    assert [r.value for r in follower.log().records] == [b"x", b"y"]
