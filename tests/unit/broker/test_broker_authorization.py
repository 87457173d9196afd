"""BrokerService enforcement with a fake principal extractor: Produce needs TOPIC WRITE, Fetch TOPIC READ,
Metadata lists only describable topics, ReplicaFetch is bound to the caller's own broker id."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from broker_fakes import MemoryLogOpener, StaticMetadataView

import kraft.security.principal as principal_module
from kraft.broker.partitions import PartitionManager
from kraft.broker.service import BrokerService
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState, LocalChanges, PartitionAssignment, TopicPartition
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.security.acl import AclOperation, AclPermissionType, PatternType, ResourceType, StandardAcl
from kraft.security.authorizer import Authorizer, AuthorizerSettings
from kraft.security.guard import RequestGuard
from kraft.security.principal import ANONYMOUS, Principal, install_principal_extractor
from kraft.v1 import broker_pb2 as pb

ME = 1
CLUSTER = "c-1"
ORDERS = TopicPartition("orders", 0)
ALICE = Principal("User", "alice")


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class FakeContext:
    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    def peer(self) -> str:
        return "ipv6:[::1]:40000"

    async def abort(self, code: grpc.StatusCode, details: str) -> None:
        raise Aborted(code, details)


@pytest.fixture(autouse=True)
def fake_extractor() -> Iterator[None]:
    # restores what was installed before (the default TLS extractor): a test later in this worker that
    # reads certificates (test_intake_process) found every caller anonymous
    before = principal_module._extractor
    install_principal_extractor(lambda context: getattr(context, "principal", ANONYMOUS))
    try:
        yield
    finally:
        install_principal_extractor(before)


def _service(tmp_path: Path, acls: dict[str, StandardAcl] | None) -> tuple[BrokerService, PartitionManager]:
    clock = ManualClock(start_ms=1_000_000)
    status = BrokerStatus(ME, CLUSTER, session_timeout_ms=3000, clock=clock)
    for state in (BrokerState.STARTING, BrokerState.RECOVERY, BrokerState.RUNNING):
        status.transition(state)
    status.fenced = False
    status.heartbeat_accepted(clock.monotonic_ms())
    manager = PartitionManager(ME, [tmp_path / "logs"], MemoryLogOpener())
    manager.load()
    manager.apply(LocalChanges(leaders={ORDERS: PartitionAssignment("id-orders", ME, 1, 1, (1,), (1,))}))
    view = StaticMetadataView(brokers={1: 9001}, topics={"orders": 1, "payments": 1})
    table = acls or {}
    guard = RequestGuard(
        Authorizer(AuthorizerSettings(enabled=True), lambda: table) if acls is not None else None
    )
    return BrokerService(status, manager, view, guard=guard), manager


def allow(principal: str, operation: AclOperation, topic: str = "orders") -> StandardAcl:
    return StandardAcl(
        ResourceType.TOPIC, topic, PatternType.LITERAL, principal, "*", operation, AclPermissionType.ALLOW
    )


def produce() -> pb.ProduceRequest:
    record = pb.BrokerRecord(value=b"v", has_value=True)
    return pb.ProduceRequest(
        cluster_id=CLUSTER, topic="orders", partition=0, leader_epoch=-1, records=[record], acks=1
    )


async def call(method: Any, request: Any, who: Principal) -> Any:
    return await method(request, FakeContext(who))


async def test_produce_needs_write_and_fetch_needs_read(tmp_path: Path) -> None:
    service, manager = _service(tmp_path, {"a": allow("User:alice", AclOperation.WRITE)})
    try:
        produced = await call(service.Produce, produce(), ALICE)
        assert produced.error_code == ErrorCode.NONE and produced.base_offset == 0
        with pytest.raises(Aborted) as refused:
            await call(service.Produce, produce(), ANONYMOUS)
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details.startswith("TOPIC_AUTHORIZATION_FAILED: User:ANONYMOUS may not WRITE")
        fetch = pb.BrokerFetchRequest(
            cluster_id=CLUSTER, topic="orders", partition=0, offset=0, leader_epoch=-1
        )
        with pytest.raises(Aborted):  # WRITE does not grant READ
            await call(service.Fetch, fetch, ALICE)
        offsets = pb.ListOffsetsRequest(
            cluster_id=CLUSTER, topic="orders", partition=0, timestamp=-1, leader_epoch=-1
        )
        assert (await call(service.ListOffsets, offsets, ALICE)).offset == 1  # WRITE implies DESCRIBE
        with pytest.raises(Aborted):
            await call(service.DescribeBroker, pb.DescribeBrokerRequest(cluster_id=CLUSTER), ALICE)
    finally:
        manager.close()


async def test_metadata_lists_only_the_topics_the_caller_may_describe(tmp_path: Path) -> None:
    service, manager = _service(tmp_path, {"a": allow("User:alice", AclOperation.READ)})
    try:
        listing = await call(service.Metadata, pb.BrokerMetadataRequest(cluster_id=CLUSTER), ALICE)
        assert [t.name for t in listing.topics] == ["orders"]
        named = await call(
            service.Metadata, pb.BrokerMetadataRequest(cluster_id=CLUSTER, topics=["payments"]), ALICE
        )
        assert [(t.name, t.error_code, len(t.partitions)) for t in named.topics] == [
            ("payments", ErrorCode.TOPIC_AUTHORIZATION_FAILED, 0)
        ]
    finally:
        manager.close()


async def test_without_an_authorizer_only_node_identity_is_checked(tmp_path: Path) -> None:
    service, manager = _service(tmp_path, None)
    try:
        assert (await call(service.Produce, produce(), ANONYMOUS)).error_code == ErrorCode.NONE
        fetch = pb.ReplicaFetchRequest(cluster_id=CLUSTER, replica_id=3, broker_epoch=5)
        with pytest.raises(Aborted) as refused:
            await call(service.ReplicaFetch, fetch, Principal("User", "broker-2"))
        assert refused.value.details.startswith("CLUSTER_AUTHORIZATION_FAILED: User:broker-2 is broker 2")
        own = await call(service.ReplicaFetch, fetch, Principal("User", "broker-3"))
        assert own.error_code == ErrorCode.UNSUPPORTED_VERSION  # passed the guard (no replicas here)
    finally:
        manager.close()
