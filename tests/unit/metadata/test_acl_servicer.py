"""ControllerService enforcement with a fake principal extractor: identity binding of node principals,
default deny once an authorizer is configured, ACLs added through CreateAcls taking effect, and a refusal
reaching a real client as PERMISSION_DENIED → KraftError without retries."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from typing import Any

import grpc
import pytest

import kraft.security.principal as principal_module
from kraft.client.admin import AdminClient
from kraft.clock import ManualClock, SystemClock
from kraft.errors import ErrorCode, KraftError
from kraft.metadata.acl_control import binding_of
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.service import ControllerServicer, add_controller_service
from kraft.netutil import free_port
from kraft.security.acl import (
    CLUSTER_RESOURCE_NAME,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    StandardAcl,
)
from kraft.security.authorizer import AuthorizerSettings
from kraft.security.principal import ANONYMOUS, Principal, install_principal_extractor
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb

from .fake_raft import FakeRaft
from .test_controller import CLUSTER, ENDPOINTS, activate_broker, until

ADMIN = Principal("User", "admin")
ALICE = Principal("User", "alice")
SETTINGS_ON = AuthorizerSettings(enabled=True, super_users=frozenset({"User:admin"}))


class Aborted(Exception):
    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(f"{code.name}: {details}")
        self.code = code
        self.details = details


class FakeContext:
    """What the servicer reads of a grpc.aio context: the peer, abort — and, for the fake extractor, who."""

    def __init__(self, principal: Principal) -> None:
        self.principal = principal

    def peer(self) -> str:
        return "ipv4:10.0.0.1:40000"

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


async def _servicer(settings: AuthorizerSettings | None) -> tuple[ControllerServicer, QuorumController]:
    raft = FakeRaft(1)
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000)
    controller = QuorumController(raft, CLUSTER, ENDPOINTS, options, clock=ManualClock())
    await controller.start()
    raft.elect()
    await until(lambda: controller.is_active)
    await activate_broker(controller, 1)  # topics need a broker to live on
    return ControllerServicer(controller, authorizer=settings), controller


@pytest.fixture
async def plain() -> AsyncIterator[ControllerServicer]:
    servicer, controller = await _servicer(None)
    try:
        yield servicer
    finally:
        await controller.stop()


@pytest.fixture
async def secured() -> AsyncIterator[ControllerServicer]:
    servicer, controller = await _servicer(SETTINGS_ON)
    try:
        yield servicer
    finally:
        await controller.stop()


def registration(broker_id: int) -> cpb.RegisterBrokerRequest:
    return cpb.RegisterBrokerRequest(
        cluster_id=CLUSTER,
        broker_id=broker_id,
        incarnation_id=f"inc-{broker_id}",
        listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=9000 + broker_id)],
    )


def acl(
    principal: str,
    operation: AclOperation,
    resource_type: ResourceType = ResourceType.TOPIC,
    name: str = "orders",
    pattern: PatternType = PatternType.LITERAL,
) -> StandardAcl:
    return StandardAcl(resource_type, name, pattern, principal, "*", operation, AclPermissionType.ALLOW)


async def add_acls(servicer: ControllerServicer, *acls: StandardAcl) -> None:
    response = await servicer.CreateAcls(
        cpb.CreateAclsRequest(cluster_id=CLUSTER, creations=[binding_of(a) for a in acls]),
        FakeContext(ADMIN),  # type: ignore[arg-type]
    )
    assert response.error_code == ErrorCode.NONE
    assert [r.error_code for r in response.results] == [0] * len(acls)


async def call(method: Any, request: Any, who: Principal) -> Any:
    return await method(request, FakeContext(who))


async def test_a_broker_principal_cannot_heartbeat_or_register_as_another_broker(
    plain: ControllerServicer,
) -> None:
    broker_101 = Principal("User", "broker-101")
    registered = await call(plain.RegisterBroker, registration(101), broker_101)
    assert registered.error_code == ErrorCode.NONE  # itself: allowed, no authorizer needed
    beat = cpb.BrokerHeartbeatRequest(cluster_id=CLUSTER, broker_id=102, broker_epoch=registered.broker_epoch)
    with pytest.raises(Aborted) as refused:
        await call(plain.BrokerHeartbeat, beat, broker_101)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details.startswith("CLUSTER_AUTHORIZATION_FAILED: User:broker-101 is broker 101")
    with pytest.raises(Aborted):
        await call(plain.RegisterBroker, registration(102), broker_101)
    with pytest.raises(Aborted):
        await call(
            plain.AlterPartition, cpb.AlterPartitionRequest(cluster_id=CLUSTER, broker_id=102), broker_101
        )
    with pytest.raises(Aborted):  # a controller certificate speaks only as its own node id
        await call(plain.RegisterBroker, registration(102), Principal("User", "controller-1"))
    # Without an authorizer anyone else is unchecked (PLAINTEXT development mode).
    assert (await call(plain.RegisterBroker, registration(102), ANONYMOUS)).error_code == ErrorCode.NONE


async def test_with_an_authorizer_anonymous_is_denied_until_an_acl_allows_it(
    secured: ControllerServicer,
) -> None:
    create = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatableTopic(name="orders", num_partitions=1, replication_factor=1)]
    )
    with pytest.raises(Aborted) as refused:
        await call(secured.CreateTopics, create, ANONYMOUS)
    assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert refused.value.details.startswith("TOPIC_AUTHORIZATION_FAILED: User:ANONYMOUS may not CREATE")
    for method, request in (
        (secured.DescribeCluster, cpb.DescribeClusterRequest()),
        (secured.ElectLeaders, cpb.ElectLeadersRequest()),
        (secured.ShutdownBroker, cpb.ShutdownBrokerRequest(broker_id=1)),
        (secured.UnregisterBroker, cpb.UnregisterBrokerRequest(broker_id=1)),
        (secured.MetadataFetch, cpb.MetadataFetchRequest(broker_id=1)),
        (secured.CreateAcls, cpb.CreateAclsRequest(cluster_id=CLUSTER)),
        (secured.DescribeAcls, cpb.DescribeAclsRequest(cluster_id=CLUSTER)),
        (secured.DeleteAcls, cpb.DeleteAclsRequest(cluster_id=CLUSTER)),
    ):
        with pytest.raises(Aborted) as cluster_refused:
            await call(method, request, ANONYMOUS)
        assert cluster_refused.value.details.startswith("CLUSTER_AUTHORIZATION_FAILED")
    await add_acls(secured, acl("User:ANONYMOUS", AclOperation.CREATE))
    created = await call(secured.CreateTopics, create, ANONYMOUS)
    assert created.error_code == ErrorCode.NONE and created.topics[0].error_code == ErrorCode.NONE
    with pytest.raises(Aborted):  # CREATE does not grant DELETE
        await call(
            secured.DeleteTopics, cpb.DeleteTopicsRequest(cluster_id=CLUSTER, names=["orders"]), ANONYMOUS
        )
    other = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        topics=[cpb.CreatableTopic(name="payments", num_partitions=1, replication_factor=1)],
    )
    with pytest.raises(Aborted):
        await call(secured.CreateTopics, other, ANONYMOUS)


async def test_cluster_create_grants_every_topic_and_describe_lists_only_describable_topics(
    secured: ControllerServicer,
) -> None:
    cluster = ResourceType.CLUSTER
    await add_acls(
        secured,
        acl("User:alice", AclOperation.CREATE, cluster, CLUSTER_RESOURCE_NAME),
        acl("User:alice", AclOperation.READ, name="ord", pattern=PatternType.PREFIXED),
    )
    topics = [
        cpb.CreatableTopic(name=n, num_partitions=1, replication_factor=1) for n in ("orders", "payments")
    ]
    created = await call(
        secured.CreateTopics, cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=topics), ALICE
    )
    assert [t.error_code for t in created.topics] == [0, 0]
    listing = await call(secured.DescribeTopics, cpb.DescribeTopicsRequest(cluster_id=CLUSTER), ALICE)
    assert [t.name for t in listing.topics] == ["orders"]  # READ implies DESCRIBE; payments left out
    named = await call(
        secured.DescribeTopics,
        cpb.DescribeTopicsRequest(cluster_id=CLUSTER, names=["payments", "orders"]),
        ALICE,
    )
    assert [(t.name, t.error_code) for t in named.topics] == [
        ("payments", ErrorCode.TOPIC_AUTHORIZATION_FAILED),
        ("orders", ErrorCode.NONE),
    ]
    everything = await call(secured.DescribeTopics, cpb.DescribeTopicsRequest(cluster_id=CLUSTER), ADMIN)
    assert [t.name for t in everything.topics] == ["orders", "payments"]


async def test_with_an_authorizer_node_requests_need_the_node_itself_and_cluster_action(
    secured: ControllerServicer,
) -> None:
    broker_7 = Principal("User", "broker-7")
    with pytest.raises(Aborted) as refused:  # its own id, but no CLUSTER_ACTION yet
        await call(secured.RegisterBroker, registration(7), broker_7)
    assert "CLUSTER_ACTION" in refused.value.details
    await add_acls(
        secured,
        acl("User:broker-7", AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME),
        acl("User:alice", AclOperation.CLUSTER_ACTION, ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME),
    )
    assert (await call(secured.RegisterBroker, registration(7), broker_7)).error_code == ErrorCode.NONE
    with pytest.raises(Aborted) as not_a_node:  # an ACL does not let a user speak for a broker
        await call(secured.RegisterBroker, registration(8), ALICE)
    assert "not a node principal" in not_a_node.value.details
    fetch = cpb.MetadataFetchRequest(cluster_id=CLUSTER, broker_id=8)
    with pytest.raises(Aborted):
        await call(secured.MetadataFetch, fetch, broker_7)
    assert (await call(secured.RegisterBroker, registration(9), ADMIN)).error_code == ErrorCode.NONE


async def test_a_refusal_reaches_the_admin_client_as_its_error_at_once() -> None:
    servicer = ControllerServicer(None, authorizer=SETTINGS_ON)  # no controller bound: nothing allowed
    server = grpc.aio.server()
    add_controller_service(server, servicer)
    port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
    await server.start()
    clock = SystemClock()
    try:
        async with AdminClient([f"127.0.0.1:{port}"], timeout_s=30.0, clock=clock) as client:
            started = clock.monotonic_ms()
            with pytest.raises(KraftError) as refused:
                await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
            assert clock.monotonic_ms() - started < 5_000  # not retried until the 30 s deadline
    finally:
        await server.stop(None)
    assert refused.value.code == ErrorCode.CLUSTER_AUTHORIZATION_FAILED
    assert "User:ANONYMOUS may not DESCRIBE cluster" in refused.value.message


async def test_partition_growth_and_configs_need_kafkas_acl_operations(secured: ControllerServicer) -> None:
    """CreatePartitions: TOPIC Alter; IncrementalAlterConfigs: AlterConfigs and DescribeConfigs:
    DescribeConfigs on each TOPIC resource, on CLUSTER for BROKER resources (Kafka's mapping)."""
    create = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatableTopic(name="orders", num_partitions=1, replication_factor=1)]
    )
    assert (await call(secured.CreateTopics, create, ADMIN)).topics[0].error_code == ErrorCode.NONE
    grow = cpb.CreatePartitionsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatePartitionsTopic(name="orders", count=2)]
    )
    topic = cpb.ConfigResource(resource_type=2, resource_name="orders")
    broker = cpb.ConfigResource(resource_type=4, resource_name="1")
    alter_topic = cpb.IncrementalAlterConfigsRequest(
        cluster_id=CLUSTER,
        resources=[
            cpb.AlterConfigsResource(
                resource=topic, configs=[cpb.AlterableConfig(name="retention.ms", value="1")]
            )
        ],
    )
    alter_broker = cpb.IncrementalAlterConfigsRequest(
        cluster_id=CLUSTER,
        resources=[
            cpb.AlterConfigsResource(
                resource=broker, configs=[cpb.AlterableConfig(name="message.max.bytes", value="9")]
            )
        ],
    )
    describe_topic = cpb.DescribeConfigsRequest(
        cluster_id=CLUSTER, resources=[cpb.DescribeConfigsResource(resource=topic)]
    )
    describe_both = cpb.DescribeConfigsRequest(
        cluster_id=CLUSTER,
        resources=[cpb.DescribeConfigsResource(resource=topic), cpb.DescribeConfigsResource(resource=broker)],
    )
    for method, request, refusal in (
        (
            secured.CreatePartitions,
            grow,
            "TOPIC_AUTHORIZATION_FAILED: User:alice may not ALTER topic 'orders'",
        ),
        (
            secured.IncrementalAlterConfigs,
            alter_topic,
            "TOPIC_AUTHORIZATION_FAILED: User:alice may not ALTER_CONFIGS",
        ),
        (
            secured.IncrementalAlterConfigs,
            alter_broker,
            "CLUSTER_AUTHORIZATION_FAILED: User:alice may not ALTER_CONFIGS",
        ),
        (
            secured.DescribeConfigs,
            describe_topic,
            "TOPIC_AUTHORIZATION_FAILED: User:alice may not DESCRIBE_CONFIGS",
        ),
    ):
        with pytest.raises(Aborted) as refused:
            await call(method, request, ALICE)
        assert refused.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.value.details.startswith(refusal), refused.value.details
    # ALTER_CONFIGS on the topic implies DESCRIBE_CONFIGS of it, not of the brokers (CLUSTER)
    await add_acls(
        secured, acl("User:alice", AclOperation.ALTER_CONFIGS), acl("User:alice", AclOperation.ALTER)
    )
    assert (await call(secured.IncrementalAlterConfigs, alter_topic, ALICE)).results[
        0
    ].error_code == ErrorCode.NONE
    assert (await call(secured.DescribeConfigs, describe_topic, ALICE)).results[
        0
    ].error_code == ErrorCode.NONE
    with pytest.raises(Aborted) as refused:
        await call(secured.DescribeConfigs, describe_both, ALICE)
    assert refused.value.details.startswith(
        "CLUSTER_AUTHORIZATION_FAILED: User:alice may not DESCRIBE_CONFIGS"
    )
    grown = await call(secured.CreatePartitions, grow, ALICE)
    assert grown.error_code == ErrorCode.NONE and grown.topics[0].error_code == ErrorCode.NONE
    await add_acls(
        secured, acl("User:alice", AclOperation.ALTER_CONFIGS, ResourceType.CLUSTER, "kafka-cluster")
    )
    assert (await call(secured.IncrementalAlterConfigs, alter_broker, ALICE)).results[
        0
    ].error_code == ErrorCode.NONE
