"""DescribeConfigs / IncrementalAlterConfigs on the controller (kraft.metadata.config_control): Kafka's
incremental semantics, validation against the known keys before anything is written, per-resource results,
ConfigRecords that replay (and die with their topic), and where each described value comes from."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kraft.errors import ErrorCode
from kraft.metadata import records
from kraft.metadata.config_catalog import MAX_CONFIG_RESOURCES_PER_REQUEST, AlterOp, apply_ops
from kraft.metadata.config_control import (
    CLUSTER_MIN_ISR_DELETE_REFUSED,
    PER_BROKER_MIN_ISR_REFUSED,
    describe_configs,
    incremental_alter_configs,
)
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import ConfigResourceType
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller_logic import CLUSTER, Harness

TOPIC = ConfigResourceType.TOPIC
BROKER = ConfigResourceType.BROKER
Op = tuple[str, int, str | None]


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.active_brokers(1, 2)
    harness.create("orders", rf=2)
    return harness


def resource(kind: int, name: str, ops: Sequence[Op]) -> cpb.AlterConfigsResource:
    item = cpb.AlterConfigsResource(resource=cpb.ConfigResource(resource_type=kind, resource_name=name))
    for key, op, value in ops:
        config = item.configs.add(name=key, op=op)
        if value is not None:
            config.value = value
    return item


def alter(
    h: Harness, *resources: cpb.AlterConfigsResource, validate_only: bool = False
) -> cpb.IncrementalAlterConfigsResponse:
    request = cpb.IncrementalAlterConfigsRequest(
        cluster_id=CLUSTER, resources=resources, validate_only=validate_only
    )
    return h.run(incremental_alter_configs(h.logic, request, h.next_offset))


def describe(h: Harness, kind: int, name: str, names: Sequence[str] = ()) -> cpb.DescribeConfigsResult:
    request = cpb.DescribeConfigsRequest(
        cluster_id=CLUSTER,
        resources=[
            cpb.DescribeConfigsResource(
                resource=cpb.ConfigResource(resource_type=kind, resource_name=name), config_names=names
            )
        ],
    )
    return describe_configs(h.image, request).results[0]


def entries(result: cpb.DescribeConfigsResult) -> dict[str, tuple[str | None, str]]:
    return {e.name: (e.value if e.HasField("value") else None, e.source) for e in result.configs}


def test_set_and_delete_change_only_the_named_keys_and_replay_anywhere(h: Harness) -> None:
    first = h.next_offset
    ok = alter(h, resource(TOPIC, "orders", [("retention.ms", AlterOp.SET, "1000"), ("segment.ms", 0, "5")]))
    assert [r.error_code for r in ok.results] == [0]
    assert dict(h.image.topic_configs("orders")) == {"retention.ms": "1000", "segment.ms": "5"}
    alter(
        h, resource(TOPIC, "orders", [("segment.ms", AlterOp.DELETE, None), ("min.insync.replicas", 0, "2")])
    )
    assert dict(h.image.topic_configs("orders")) == {"retention.ms": "1000", "min.insync.replicas": "2"}
    records = h.log[first:]
    assert {r.WhichOneof("record") for r in records} == {"config"}
    deleted = [r.config for r in records if not r.config.HasField("value")]
    assert [(d.resource_name, d.name) for d in deleted] == [("orders", "segment.ms")]
    replayed = MetadataDelta(MetadataImage.empty())
    for offset, record in enumerate(h.log):
        replayed.replay(record, offset)
    assert replayed.apply().configs == h.image.configs


def test_setting_the_current_value_or_deleting_an_unset_key_writes_nothing(h: Harness) -> None:
    alter(h, resource(TOPIC, "orders", [("retention.ms", AlterOp.SET, "1000")]))
    before = h.next_offset
    again = alter(
        h,
        resource(
            TOPIC, "orders", [("retention.ms", AlterOp.SET, "1000"), ("segment.ms", AlterOp.DELETE, None)]
        ),
    )
    assert again.results[0].error_code == ErrorCode.NONE
    assert h.next_offset == before


@pytest.mark.parametrize(
    ("ops", "code", "words"),
    [
        (
            [("retention.mss", AlterOp.SET, "1")],
            ErrorCode.INVALID_CONFIG,
            "unknown topic config 'retention.mss'",
        ),
        (
            [("retention.ms", AlterOp.SET, "soon")],
            ErrorCode.INVALID_CONFIG,
            "invalid value 'soon' for retention.ms",
        ),
        ([("retention.ms", AlterOp.SET, None)], ErrorCode.INVALID_CONFIG, "needs a value"),
        ([("min.insync.replicas", AlterOp.SET, "3")], ErrorCode.INVALID_CONFIG, "replication factor 2"),
        ([("retention.ms", AlterOp.APPEND, "1")], ErrorCode.INVALID_CONFIG, "not one"),
        ([("retention.ms", 7, "1")], ErrorCode.INVALID_REQUEST, "unknown config operation 7"),
        ([("retention.ms", 0, "1"), ("retention.ms", 1, None)], ErrorCode.INVALID_REQUEST, "more than once"),
        ([("retention.ms", 0, "9" * 5000)], ErrorCode.INVALID_CONFIG, "limit is 4096"),
    ],
)
def test_one_bad_operation_changes_nothing_on_its_resource(
    h: Harness, ops: list[Op], code: ErrorCode, words: str
) -> None:
    before = h.next_offset
    # the good operation first: it is not applied either
    result = alter(h, resource(TOPIC, "orders", [("segment.ms", AlterOp.SET, "5"), *ops])).results[0]
    assert ErrorCode.from_wire(result.error_code) is code
    assert words in result.error_message
    assert h.next_offset == before and not h.image.topic_configs("orders")


def test_results_are_per_resource_and_other_resources_still_change(h: Harness) -> None:
    response = alter(
        h,
        resource(TOPIC, "nosuch", [("retention.ms", 0, "1")]),
        resource(TOPIC, "orders", [("retention.ms", 0, "1")]),
        resource(BROKER, "abc", [("message.max.bytes", 0, "1")]),
        resource(BROKER, "1", [("log.segment.bytes", 0, "1")]),
        resource(BROKER, "1", [("message.max.bytes", 0, "2")]),
        resource(7, "x", [("a", 0, "1")]),
    )
    codes = [ErrorCode.from_wire(r.error_code) for r in response.results]
    assert codes == [
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.NONE,
        ErrorCode.INVALID_REQUEST,  # not a broker id
        ErrorCode.INVALID_REQUEST,  # broker 1 twice
        ErrorCode.INVALID_REQUEST,
        ErrorCode.INVALID_REQUEST,  # unknown resource type
    ]
    assert dict(h.image.topic_configs("orders")) == {"retention.ms": "1"}


def test_only_dynamic_broker_configs_may_be_set_and_a_static_one_says_so(h: Harness) -> None:
    static = alter(h, resource(BROKER, "1", [("log.segment.bytes", 0, "1048576")])).results[0]
    assert static.error_code == ErrorCode.INVALID_CONFIG
    assert "not dynamic" in static.error_message and ".properties" in static.error_message
    unknown = alter(h, resource(BROKER, "", [("no.such.key", 0, "1")])).results[0]
    assert (
        unknown.error_code == ErrorCode.INVALID_CONFIG
        and "unknown dynamic broker config" in unknown.error_message
    )
    ok = alter(
        h,
        resource(BROKER, "", [("message.max.bytes", 0, "2097152"), ("min.insync.replicas", 0, "2")]),
        resource(BROKER, "1", [("message.max.bytes", 0, "4096")]),
    )
    assert [r.error_code for r in ok.results] == [0, 0]
    # the broker's own value wins over the cluster default, which covers every other broker
    assert h.image.broker_config(1, "message.max.bytes") == "4096"
    assert h.image.broker_config(2, "message.max.bytes") == "2097152"
    assert h.image.broker_config(1, "min.insync.replicas") == "2"
    assert h.image.broker_config(2, "segment.ms") is None


def test_a_per_broker_min_insync_replicas_is_refused_and_one_stored_before_may_be_deleted(
    h: Harness,
) -> None:
    """KIP-966 (ELR, always on in kraft): Kafka's ConfigurationControlManager refuses a broker-level
    min.insync.replicas once ELR is enabled; the cluster-wide default and a topic's value stay allowed."""
    before = h.next_offset
    refused = alter(h, resource(BROKER, "1", [("min.insync.replicas", AlterOp.SET, "1")]))
    assert refused.results[0].error_code == ErrorCode.INVALID_CONFIG
    assert refused.results[0].error_message == PER_BROKER_MIN_ISR_REFUSED
    # with another key in the same resource: the whole resource is refused, nothing written
    mixed = alter(
        h, resource(BROKER, "1", [("message.max.bytes", 0, "4096"), ("min.insync.replicas", 0, "2")])
    )
    assert mixed.results[0].error_code == ErrorCode.INVALID_CONFIG and h.next_offset == before
    assert (
        "set it per topic" in PER_BROKER_MIN_ISR_REFUSED and "--entity-default" in PER_BROKER_MIN_ISR_REFUSED
    )
    ok = alter(h, resource(BROKER, "", [("min.insync.replicas", 0, "2")]))  # the cluster-wide default
    assert ok.results[0].error_code == ErrorCode.NONE
    assert h.image.topic_or_cluster_config("orders", "min.insync.replicas") == "2"
    # a value an older build stored is deleted without complaint
    stored = records.wrap(
        pb.ConfigRecord(resource_type=BROKER, resource_name="1", name="min.insync.replicas", value="1")
    )
    delta = MetadataDelta(h.image)
    delta.replay(stored, h.next_offset)
    h.commit([stored])
    h.logic.reset(delta.apply(), h.now_ms)
    assert h.image.broker_config(1, "min.insync.replicas") == "1"
    assert h.image.topic_or_cluster_config("orders", "min.insync.replicas") == "2"  # not what rules read
    deleted = alter(h, resource(BROKER, "1", [("min.insync.replicas", AlterOp.DELETE, None)]))
    assert deleted.results[0].error_code == ErrorCode.NONE
    assert h.image.broker_config(1, "min.insync.replicas") == "2"


def test_the_controller_writes_the_cluster_wide_min_insync_replicas_and_it_cannot_be_removed() -> None:
    """Kafka's ELR safety records: the active controller writes the cluster-wide min.insync.replicas from
    its own .properties when the log has none, so no node falls back to a .properties value that may
    differ (a broker's static value is never read then); removing it is refused, changing it is not."""
    fresh = Harness()  # bootstrap_records committed at activation
    assert fresh.image.topic_or_cluster_config("any", "min.insync.replicas") == "1"
    assert fresh.logic.bootstrap_records(fresh.next_offset) == []  # once: present now
    before = fresh.next_offset
    removed = alter(fresh, resource(BROKER, "", [("min.insync.replicas", AlterOp.DELETE, None)]))
    assert removed.results[0].error_code == ErrorCode.INVALID_CONFIG
    assert removed.results[0].error_message == CLUSTER_MIN_ISR_DELETE_REFUSED and fresh.next_offset == before
    changed = alter(fresh, resource(BROKER, "", [("min.insync.replicas", AlterOp.SET, "2")]))
    assert changed.results[0].error_code == ErrorCode.NONE
    assert fresh.image.topic_or_cluster_config("any", "min.insync.replicas") == "2"


def test_validate_only_checks_everything_and_writes_nothing(h: Harness) -> None:
    before = h.next_offset
    good = alter(h, resource(TOPIC, "orders", [("retention.ms", 0, "1")]), validate_only=True)
    bad = alter(h, resource(TOPIC, "orders", [("retention.ms", 0, "x")]), validate_only=True)
    assert good.results[0].error_code == ErrorCode.NONE
    assert bad.results[0].error_code == ErrorCode.INVALID_CONFIG
    assert h.next_offset == before


def test_the_request_is_bounded_before_any_work(h: Harness) -> None:
    many = [
        resource(TOPIC, f"t{i}", [("retention.ms", 0, "1")])
        for i in range(MAX_CONFIG_RESOURCES_PER_REQUEST + 1)
    ]
    response = alter(h, *many)
    assert response.error_code == ErrorCode.POLICY_VIOLATION and not response.results
    refused = h.run(
        incremental_alter_configs(h.logic, cpb.IncrementalAlterConfigsRequest(cluster_id=""), h.next_offset)
    )
    assert refused.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID


def test_append_and_subtract_edit_a_list_config() -> None:
    current = {"cleanup.policy": "delete"}
    assert apply_ops(TOPIC, current, [("cleanup.policy", AlterOp.APPEND, "compact,delete")]) == {
        "cleanup.policy": "delete,compact"
    }
    assert apply_ops(TOPIC, current, [("cleanup.policy", AlterOp.SUBTRACT, "delete")]) == {
        "cleanup.policy": None
    }
    assert apply_ops(TOPIC, {}, [("cleanup.policy", AlterOp.APPEND, "compact")]) == {
        "cleanup.policy": "delete,compact"  # appended to the default
    }


def test_describe_shows_own_values_defaults_and_broker_fallbacks_with_their_sources(h: Harness) -> None:
    alter(
        h,
        resource(TOPIC, "orders", [("retention.ms", 0, "1000")]),
        resource(BROKER, "", [("message.max.bytes", 0, "2097152")]),
        resource(BROKER, "2", [("message.max.bytes", 0, "4096")]),
    )
    topic = entries(describe(h, TOPIC, "orders"))
    assert topic["retention.ms"] == ("1000", "DYNAMIC_TOPIC_CONFIG")
    assert topic["cleanup.policy"] == ("delete", "DEFAULT_CONFIG")
    assert topic["max.message.bytes"] == ("2097152", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    # written by the active controller from its .properties (bootstrap_records: one minimum for all)
    assert topic["min.insync.replicas"] == ("1", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    applied = {e.name for e in describe(h, TOPIC, "orders").configs if e.applied}
    assert applied == {"max.message.bytes", "min.insync.replicas", "unclean.leader.election.enable"}
    broker = entries(describe(h, BROKER, "2"))
    assert broker == {
        "message.max.bytes": ("4096", "DYNAMIC_BROKER_CONFIG"),
        "min.insync.replicas": ("1", "DYNAMIC_DEFAULT_BROKER_CONFIG"),
        "unclean.leader.election.enable": (None, "STATIC_BROKER_CONFIG"),  # the controllers' .properties
    }
    default = entries(describe(h, BROKER, ""))
    assert default["message.max.bytes"] == ("2097152", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    assert default["min.insync.replicas"] == ("1", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    assert list(entries(describe(h, TOPIC, "orders", ["retention.ms"]))) == ["retention.ms"]
    unknown = describe(h, TOPIC, "orders", ["nope"])
    assert unknown.error_code == ErrorCode.INVALID_CONFIG
    assert describe(h, TOPIC, "nosuch").error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_a_topics_configs_die_with_it(h: Harness) -> None:
    alter(h, resource(TOPIC, "orders", [("retention.ms", 0, "1000")]))
    h.run(h.logic.delete_topics(cpb.DeleteTopicsRequest(cluster_id=CLUSTER, names=["orders"]), h.next_offset))
    h.create("orders", rf=2)
    assert not h.image.topic_configs("orders")
