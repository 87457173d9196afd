"""ACLs in the metadata log: AccessControlEntryRecord / RemoveAccessControlEntryRecord replay, snapshot
(image_records) and image store round trips, and CreateAcls / DeleteAcls / DescribeAcls on the logic."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from google.protobuf.message import Message

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata import acl_control, records
from kraft.metadata.acl_records import acl_record
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.image_records import image_records, image_values
from kraft.metadata.store import SqliteImageStore
from kraft.security.acl import (
    AclFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    StandardAcl,
)
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

READ_ORDERS = StandardAcl(
    ResourceType.TOPIC,
    "orders",
    PatternType.LITERAL,
    "User:alice",
    "*",
    AclOperation.READ,
    AclPermissionType.ALLOW,
)
DENY_ETL = StandardAcl(
    ResourceType.TOPIC,
    "etl-",
    PatternType.PREFIXED,
    "User:*",
    "10.0.0.9",
    AclOperation.ALL,
    AclPermissionType.DENY,
)


def _replay(image: MetadataImage, *payloads: Message) -> tuple[MetadataImage, list[str]]:
    delta = MetadataDelta(image)
    for i, payload in enumerate(payloads):
        delta.replay(records.wrap(payload), image.offset + 1 + i, 2)
    return delta.apply(), delta.replay_errors


def _with_acls() -> MetadataImage:
    image, errors = _replay(
        MetadataImage.empty(),
        pb.TopicRecord(name="orders", topic_id="T"),
        acl_record("a1", READ_ORDERS),
        acl_record("a2", DENY_ETL),
    )
    assert errors == []
    return image


def test_acl_records_frame_with_kafkas_api_keys_and_decode_back() -> None:
    record = records.wrap(acl_record("a1", READ_ORDERS))
    value = records.encode_value(record)
    assert int(records.ApiKey.ACCESS_CONTROL_ENTRY) == 18  # Kafka's api key
    assert records.peek_api_key(value) == records.ApiKey.ACCESS_CONTROL_ENTRY
    assert records.decode_value(value) == record
    remove = records.encode_value(records.wrap(pb.RemoveAccessControlEntryRecord(id="a1")))
    assert records.peek_api_key(remove) == 19
    assert records.to_dict(record)["data"]["principal"] == "User:alice"


def test_replay_adds_and_removes_acls_and_reports_what_does_not_fit() -> None:
    image = _with_acls()
    assert image.acls == {"a1": READ_ORDERS, "a2": DENY_ETL}
    after, errors = _replay(image, pb.RemoveAccessControlEntryRecord(id="a1"))
    assert after.acls == {"a2": DENY_ETL} and errors == []
    assert image.acls == {"a1": READ_ORDERS, "a2": DENY_ETL}  # the old image is untouched
    _, errors = _replay(after, pb.RemoveAccessControlEntryRecord(id="a1"))
    assert errors == ["remove of unknown ACL a1"]
    _, errors = _replay(after, acl_record("a2", READ_ORDERS))
    assert errors == ["ACL a2 already exists"]
    bad = acl_record("a3", READ_ORDERS)
    bad.operation = 99
    unchanged, errors = _replay(after, bad)
    assert unchanged.acls == after.acls and "not a valid AclOperation" in errors[0] and "a3" in errors[0]


def test_an_image_that_does_not_touch_acls_shares_the_acl_mapping() -> None:
    image = _with_acls()
    after, _ = _replay(image, pb.TopicRecord(name="other", topic_id="U"))
    assert after.acls is image.acls


def test_a_snapshot_of_the_image_rebuilds_its_acls() -> None:
    image = _with_acls()
    rebuilt = MetadataDelta(MetadataImage.empty())
    rebuilt.replay_values(list(image_values(image)))
    assert rebuilt.apply().acls == image.acls
    kinds = [r.WhichOneof("record") for r in image_records(image)]
    assert kinds.count("access_control_entry") == 2


async def test_the_image_store_saves_and_loads_acls_incrementally(tmp_path: Path) -> None:
    path = tmp_path / "image.sqlite"
    image = _with_acls()
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        await store.save(image)
        removed, _ = _replay(image, pb.RemoveAccessControlEntryRecord(id="a1"), acl_record("a3", READ_ORDERS))
        await store.save(removed)
    finally:
        await store.close()
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        loaded = await store.load()
        assert store.discarded is None
        assert loaded.acls == {"a2": DENY_ETL, "a3": READ_ORDERS}
    finally:
        await store.close()
    with sqlite3.connect(path) as db:  # an edited ACL row fails the checksum: the store is discarded
        db.execute("UPDATE acls SET permission_type = 3 WHERE id = 'a2'")
    store = await SqliteImageStore.open(path, clock=ManualClock())
    try:
        assert (await store.load()).acls == {}
        assert store.discarded is not None and "checksum" in store.discarded
    finally:
        await store.close()


# ---- the controller side ----


def _logic() -> ControllerLogic:
    return ControllerLogic(ControllerSettings("c1"), MetadataImage.empty(), 0)


def _commit(logic: ControllerLogic, outcome_records: list[pb.MetadataRecord]) -> None:
    """The records the logic produced are already in its speculative image; they replay the same way."""
    delta = MetadataDelta(MetadataImage.empty())
    for record in outcome_records:
        delta.replay(record)
    assert delta.replay_errors == []


def binding(acl: StandardAcl) -> cpb.AclBinding:
    return acl_control.binding_of(acl)


def test_create_acls_validates_each_binding_and_writes_only_the_valid_new_ones() -> None:
    logic = _logic()
    ids = iter(["id-1", "id-2", "id-3"])
    bad = binding(READ_ORDERS)
    bad.principal = "alice"
    cluster = binding(READ_ORDERS)
    cluster.resource_type = int(ResourceType.CLUSTER)
    outcome = acl_control.create_acls(
        logic,
        cpb.CreateAclsRequest(
            cluster_id="c1", creations=[binding(READ_ORDERS), bad, cluster, binding(READ_ORDERS)]
        ),
        10,
        new_id=lambda: next(ids),
    )
    results = outcome.response.results
    assert [r.error_code for r in results] == [0, ErrorCode.INVALID_REQUEST, ErrorCode.INVALID_REQUEST, 0]
    assert "TYPE:NAME" in results[1].error_message and "kafka-cluster" in results[2].error_message
    assert results[0].id == results[3].id == "id-1"  # the same binding twice is one ACL
    assert [r.WhichOneof("record") for r in outcome.records] == ["access_control_entry"]
    assert logic.image.acls == {"id-1": READ_ORDERS}
    _commit(logic, outcome.records)
    again = acl_control.create_acls(
        logic, cpb.CreateAclsRequest(cluster_id="c1", creations=[binding(READ_ORDERS)]), 11
    )
    assert again.records == [] and again.response.results[0].id == "id-1"


def test_create_acls_refuses_an_oversized_request_before_writing_anything() -> None:
    logic = _logic()
    request = cpb.CreateAclsRequest(
        cluster_id="c1", creations=[binding(READ_ORDERS)] * (acl_control.MAX_ACLS_PER_REQUEST + 1)
    )
    outcome = acl_control.create_acls(logic, request, 0)
    assert outcome.records == [] and outcome.response.error_code == ErrorCode.POLICY_VIOLATION
    wrong_cluster = acl_control.create_acls(
        logic, cpb.CreateAclsRequest(cluster_id="other", creations=[binding(READ_ORDERS)]), 0
    )
    assert wrong_cluster.response.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID


def test_describe_and_delete_by_filter() -> None:
    logic = _logic()
    ids = iter(["id-1", "id-2"])
    acl_control.create_acls(
        logic,
        cpb.CreateAclsRequest(cluster_id="c1", creations=[binding(READ_ORDERS), binding(DENY_ETL)]),
        0,
        new_id=lambda: next(ids),
    )
    everything = acl_control.filter_of(AclFilter())
    described = acl_control.describe_acls(logic.image.acls, cpb.DescribeAclsRequest(filter=everything))
    assert sorted(d.id for d in described.acls) == ["id-1", "id-2"]
    match = acl_control.filter_of(AclFilter(ResourceType.TOPIC, "etl-daily", PatternType.MATCH))
    matched = acl_control.describe_acls(logic.image.acls, cpb.DescribeAclsRequest(filter=match))
    assert [d.id for d in matched.acls] == ["id-2"]
    unknown = acl_control.describe_acls(logic.image.acls, cpb.DescribeAclsRequest())
    assert unknown.error_code == ErrorCode.INVALID_REQUEST  # an unset filter is UNKNOWN, not ANY
    alice = acl_control.filter_of(AclFilter(principal="User:alice"))
    outcome = acl_control.delete_acls(
        logic, cpb.DeleteAclsRequest(cluster_id="c1", filters=[alice, everything]), 2
    )
    first, second = outcome.response.filter_results
    assert [d.id for d in first.matching_acls] == ["id-1"]
    assert [d.id for d in second.matching_acls] == ["id-2"]  # id-1 is reported once
    assert [r.remove_access_control_entry.id for r in outcome.records] == ["id-1", "id-2"]
    assert logic.image.acls == {}
