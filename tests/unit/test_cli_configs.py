"""``kraft topic alter``, ``kraft config describe|alter``, ``offsets get``, ``log-dirs describe`` and
``api-versions`` without a cluster: option parsing (Kafka's
kafka-configs.sh syntax), the JSON shapes, and every bad input as one ``error:`` line with exit 1 before any
connection is tried."""

from __future__ import annotations

from pathlib import Path

import pytest

import kraft.cli.main as cli_main
from kraft import __version__ as kraft_version
from kraft.api_versions import api_versions
from kraft.broker.log_dirs import HostedPartition, directory_bytes, measure
from kraft.cli.api_versions import node_json
from kraft.cli.common import CliError, bootstrap_from
from kraft.cli.configs import (
    BROKER_RESOURCE,
    TOPIC_RESOURCE,
    Entity,
    alter_resource,
    describe_json,
    parse_add_configs,
    parse_delete_configs,
    parse_entity,
    split_config_list,
)
from kraft.cli.log_dirs import log_dir_json
from kraft.cli.offsets import parse_partitions, parse_time
from kraft.cli.topic import alter_json
from kraft.errors import ErrorCode
from kraft.v1 import broker_pb2, common_pb2
from kraft.v1 import controller_pb2 as cpb


def test_config_lists_split_on_commas_outside_brackets() -> None:
    assert split_config_list("a=1, b=[x,y] ,c=2", "--add-config") == ["a=1", "b=[x,y]", "c=2"]
    assert parse_add_configs(["retention.ms=1000,cleanup.policy=[compact, delete]", "segment.ms=5"]) == {
        "retention.ms": "1000",
        "cleanup.policy": "compact,delete",
        "segment.ms": "5",
    }
    assert parse_add_configs(["k="]) == {"k": ""}  # an empty value is the controller's to judge
    assert parse_delete_configs(["a,b", "a"]) == ["a", "b"]


@pytest.mark.parametrize(
    ("texts", "words"),
    [
        (["retention.ms"], "is not key=value"),
        (["=1"], "is not key=value"),
        (["a=1,a=2"], "sets a twice"),
        (["a=[1,2"], "'[' without ']'"),
        (["a=1]"], "']' without '['"),
    ],
)
def test_bad_add_configs_are_refused(texts: list[str], words: str) -> None:
    with pytest.raises(CliError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_add_configs(texts)


def test_entities_follow_kafka_configs_options() -> None:
    assert parse_entity("topics", "orders", False) == Entity("topics", TOPIC_RESOURCE, "orders")
    assert parse_entity("brokers", "101", False).resource().resource_name == "101"
    default = parse_entity("brokers", None, True)
    assert default.name == "" and default.own_source == "DYNAMIC_DEFAULT_BROKER_CONFIG"
    assert default.label == "the default of every broker"
    for args, words in [
        (("users", "x", False), "is not one of: topics, brokers"),
        (("topics", None, False), "--entity-name is required"),
        (("topics", None, True), "for --entity-type brokers only"),
        (("brokers", "1", True), "not both"),
        (("brokers", "b1", False), "is not a broker id"),
    ]:
        with pytest.raises(CliError, match=words):
            parse_entity(*args)


def test_an_alter_sets_and_deletes_and_refuses_a_key_in_both() -> None:
    entity = Entity("brokers", BROKER_RESOURCE, "")
    resource = alter_resource(entity, {"message.max.bytes": "9"}, ["min.insync.replicas"])
    assert [(c.name, c.op, c.value if c.HasField("value") else None) for c in resource.configs] == [
        ("message.max.bytes", 0, "9"),
        ("min.insync.replicas", 1, None),
    ]
    with pytest.raises(CliError, match="both in --add-config and --delete-config"):
        alter_resource(entity, {"a": "1"}, ["a"])
    with pytest.raises(CliError, match="nothing to alter"):
        alter_resource(entity, {}, [])


def test_describe_json_lists_own_values_unless_all() -> None:
    entity = Entity("topics", TOPIC_RESOURCE, "orders")
    own = cpb.ConfigEntry(name="retention.ms", value="1", source="DYNAMIC_TOPIC_CONFIG", applied=False)
    fallback = cpb.ConfigEntry(name="min.insync.replicas", source="STATIC_BROKER_CONFIG", applied=True)
    assert describe_json(entity, [own, fallback], False) == {
        "entity_type": "topics",
        "entity_name": "orders",
        "configs": [
            {
                "name": "retention.ms",
                "value": "1",
                "source": "DYNAMIC_TOPIC_CONFIG",
                "applied": False,
                "read_only": False,
            }
        ],
    }
    everything = describe_json(entity, [own, fallback], True)["configs"]
    assert [(c["name"], c["value"]) for c in everything] == [
        ("retention.ms", "1"),
        ("min.insync.replicas", None),
    ]


def test_alter_json_names_the_new_partitions() -> None:
    result = cpb.CreatePartitionsTopicResult(
        name="t", assignments=[cpb.ReplicaAssignment(partition=2, broker_ids=[101, 102])]
    )
    assert alter_json("t", 3, result, False) == {
        "name": "t",
        "result": "altered",
        "partitions": 3,
        "new_partitions": [{"partition": 2, "replicas": [101, 102]}],
    }


def test_a_bootstrap_list_comes_from_the_option_or_the_cluster_dir(tmp_path: Path) -> None:
    assert bootstrap_from("h:1", tmp_path) == "h:1"
    with pytest.raises(CliError, match="give --bootstrap-controller host:port"):
        bootstrap_from(None, None)
    with pytest.raises(CliError, match="no cluster in"):
        bootstrap_from(None, tmp_path)


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (
            ["topic", "alter", "--topic", "t", "--partitions", "0", "--bootstrap-controller", "h:1"],
            "must be positive",
        ),
        (["topic", "alter", "--topic", "t", "--partitions", "3"], "--cluster-dir"),
        (["config", "describe", "--entity-type", "groups", "--entity-name", "g"], "is not one of"),
        (
            ["config", "alter", "--entity-type", "topics", "--entity-name", "t", "--add-config", "x"],
            "key=value",
        ),
        (["config", "alter", "--entity-type", "topics", "--entity-name", "t"], "nothing to alter"),
        (
            [
                "config",
                "describe",
                "--entity-type",
                "topics",
                "--entity-name",
                "t",
                "--bootstrap-controller",
                "h",
            ],
            "host:port",
        ),
        (
            ["config", "describe", "--entity-type", "topics", "--entity-name", "t", "--timeout", "0"],
            "--timeout",
        ),
    ],
)
def test_bad_input_is_one_error_line_and_exit_1(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, args: list[str], words: str
) -> None:
    monkeypatch.delenv("KRAFT_CLUSTER_DIR", raising=False)
    capsys.readouterr()
    assert cli_main.run(args) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and words in err[0], err


def test_the_cluster_dir_comes_from_kraft_cluster_dir(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("KRAFT_CLUSTER_DIR", str(tmp_path / "none"))
    capsys.readouterr()
    assert cli_main.run(["config", "describe", "--entity-type", "topics", "--entity-name", "t"]) == 1
    err = capsys.readouterr().err
    assert "no cluster in" in err and str(tmp_path / "none") in err


def test_offsets_times_and_partitions_parse_like_kafka_get_offsets() -> None:
    assert [parse_time(t) for t in ("earliest", "-2", "LATEST", "-1")] == [-2, -2, -1, -1]
    with pytest.raises(CliError, match="by timestamp is not supported"):
        parse_time("1700000000000")
    with pytest.raises(CliError, match="is not earliest, latest"):
        parse_time("yesterday")
    assert parse_partitions(None) is None
    assert parse_partitions("2, 0,2") == [2, 0]
    with pytest.raises(CliError, match="'x' is not a partition number"):
        parse_partitions("0,x")


def test_log_dirs_measure_partition_bytes_and_report_offline_dirs(tmp_path: Path) -> None:
    online, offline = tmp_path / "a", tmp_path / "b"
    (online / "t-0").mkdir(parents=True)
    (online / "t-0" / "00000000000000000000.log").write_bytes(b"x" * 1000)
    (online / "t-0" / "leader-epoch-checkpoint").write_bytes(b"y" * 24)
    (online / "t-1").mkdir()
    hosted = [
        HostedPartition("t", 1, online, online / "t-1", 5),
        HostedPartition("t", 0, online, online / "t-0", 0),
        HostedPartition("gone", 0, online, online / "gone-0", -1),  # deleted meanwhile: 0 bytes
    ]
    measured = measure([online, offline], {offline: "fsync failed: EIO"}, hosted)
    first, second = (log_dir_json(d) for d in measured)
    assert (
        first["error"] is None and first["usable_bytes"] > 0 and first["total_bytes"] >= first["usable_bytes"]
    )
    assert [(p["topic"], p["partition"], p["size"], p["offset_lag"]) for p in first["partitions"]] == [
        ("gone", 0, 0, -1),
        ("t", 0, 1024, 0),
        ("t", 1, 0, 5),
    ]
    assert (
        second["partitions"] == []
        and second["error"] == f"KAFKA_STORAGE_ERROR: log dir {offline} is offline: fsync failed: EIO"
    )
    assert directory_bytes(tmp_path / "nowhere") == 0


def test_api_versions_lists_the_served_methods_and_refuses_another_cluster() -> None:
    service = broker_pb2.DESCRIPTOR.services_by_name["BrokerService"]
    refused = api_versions(
        "c1", common_pb2.ApiVersionsRequest(cluster_id=""), 101, "broker", [service], {}, -1
    )
    assert refused.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID and refused.cluster_id == "c1"
    assert not refused.services
    answer = api_versions(
        "c1",
        common_pb2.ApiVersionsRequest(cluster_id="c1"),
        101,
        "broker",
        [service],
        {"metadata.version": 1},
        42,
    )
    assert answer.error_code == ErrorCode.NONE and answer.software_version == kraft_version
    described = node_json("broker", "h:1", answer, None)
    assert described["services"]["kraft.v1.BrokerService"][:4] == [
        "Metadata",
        "Produce",
        "Fetch",
        "ListOffsets",
    ]
    assert "DescribeLogDirs" in described["services"]["kraft.v1.BrokerService"]
    assert described["finalized_features"] == {"metadata.version": 1}
    assert described["supported_features"] == {"metadata.version": [1, 1]}
    assert answer.finalized_features_epoch == 42
