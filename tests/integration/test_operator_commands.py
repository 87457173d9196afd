"""The operator commands modelled on Kafka's tools, end to end on one small local cluster (1 controller, 2
brokers, PLAINTEXT) shared by every test of this file: ``kraft topic alter --partitions``
(kafka-topics.sh --alter), ``kraft config describe|alter`` (kafka-configs.sh), ``kraft offsets get``
(kafka-get-offsets.sh), ``kraft log-dirs describe`` (kafka-log-dirs.sh), ``kraft api-versions``
(kafka-broker-api-versions.sh), ``kraft features`` (kafka-features.sh; the controller is formatted with a
bootstrap checkpoint, as ``kraft storage format --release-version`` writes it).  Commands run in-process
(``kraft.cli.main.run``), one cluster start for the file; each check waits on the cluster with a bound,
never a fixed sleep."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import kraft.cli.main as cli_main
from kraft import __version__ as kraft_version
from kraft.cluster.manager import LocalCluster
from kraft.cluster.spec import NodeRole
from kraft.config import load_config
from kraft.metadata.bootstrap import write_bootstrap_features

pytestmark = pytest.mark.integration

UP_TIMEOUT_S = 90.0


@dataclass(frozen=True)
class Cluster:
    directory: Path
    controllers: str
    brokers: str


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    directory = tmp_path_factory.mktemp("ops") / "cluster"
    local = LocalCluster.create(directory, controllers=1, brokers=2, profile="fast")
    controller = load_config(local.process(1).config_path)
    assert controller.metadata_log_dir is not None
    write_bootstrap_features(Path(controller.metadata_log_dir), {"metadata.version": 1})
    try:
        local.start()
        local.wait_healthy(UP_TIMEOUT_S)
        status = local.status()
        yield Cluster(directory, status.bootstrap(NodeRole.CONTROLLER), status.bootstrap(NodeRole.BROKER))
    finally:
        local.down(timeout_s=5)


def kraft(capsys: pytest.CaptureFixture[str], *args: str) -> Ran:
    capsys.readouterr()
    started = time.monotonic()
    code = cli_main.run(list(args))
    captured = capsys.readouterr()
    print(f"[{time.monotonic() - started:5.2f} s] exit {code}: kraft {' '.join(args)}")
    return Ran(code, captured.out, captured.err)


def ok_json(capsys: pytest.CaptureFixture[str], *args: str) -> Any:
    ran = kraft(capsys, *args, "--json")
    assert ran.code == 0, ran.err
    return json.loads(ran.out)


def one_error(ran: Ran, *fragments: str) -> None:
    assert ran.code == 1, ran
    lines = ran.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), ran.err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


def produce(
    capsys: pytest.CaptureFixture[str], c: Cluster, topic: str, partition: int, value: str, *extra: str
) -> Ran:
    return kraft(
        capsys, "produce", "--bootstrap-server", c.brokers, "--topic", topic, "--partition", str(partition),
        "--value", value, *extra,
    )  # fmt: skip


def unknown_to_brokers(ran: Ran) -> bool:
    """The produce gave up because no broker's metadata knows the topic or that partition yet."""
    return ran.code != 0 and "UNKNOWN_TOPIC_OR_PARTITION" in ran.err


def produce_once_known(
    capsys: pytest.CaptureFixture[str], c: Cluster, topic: str, partition: int, value: str, *extra: str
) -> Ran:
    """One produce to a partition created a moment ago: resent only while the brokers do not know it."""
    return produce_until(capsys, c, lambda _ran: True, topic, partition, value, *extra)


def produce_until(
    capsys: pytest.CaptureFixture[str],
    c: Cluster,
    done: Callable[[Ran], bool],
    topic: str,
    partition: int,
    value: str,
    *extra: str,
) -> Ran:
    """Produce until ``done`` holds for the outcome and the brokers know the partition (at most 30 s): a
    config change or a new topic or partition reaches the brokers with their next metadata fetch, after
    the controller acknowledged it (as in Kafka); a refusal such as MESSAGE_TOO_LARGE is final for one
    produce.  ``kraft produce`` waits for a partition no broker knows up to ``max.block.ms`` capped by its
    ``--timeout`` (session 19; a fixed 1 s grace before), and some calls here pass a short ``--timeout`` —
    so the test still waits for the brokers to apply the change."""
    deadline = time.monotonic() + 30.0
    ran = produce(capsys, c, topic, partition, value, *extra)
    while (unknown_to_brokers(ran) or not done(ran)) and time.monotonic() < deadline:
        time.sleep(0.05)  # poll interval inside the bounded wait
        ran = produce(capsys, c, topic, partition, value, *extra)
    return ran


def test_topic_alter_adds_partitions_that_brokers_create_and_refuses_shrinking(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    created = ok_json(
        capsys, "topic", "create", "grow", "-p", "1", "-r", "2", "--bootstrap-controller", c.controllers
    )
    assert created["partitions"] == 1
    dry = ok_json(
        capsys, "topic", "alter", "--topic", "grow", "--partitions", "3", "--validate-only",
        "--cluster-dir", str(c.directory),
    )  # fmt: skip
    assert dry["result"] == "validated" and [p["partition"] for p in dry["new_partitions"]] == [1, 2]
    altered = ok_json(
        capsys,
        "topic",
        "alter",
        "--topic",
        "grow",
        "--partitions",
        "3",
        "--bootstrap-controller",
        c.controllers,
    )
    assert altered["result"] == "altered" and altered["partitions"] == 3
    assert all(len(p["replicas"]) == 2 for p in altered["new_partitions"])
    described = ok_json(capsys, "topic", "describe", "grow", "--bootstrap-controller", c.controllers)
    assert [p["partition"] for p in described["partitions"]] == [0, 1, 2]
    assert all(p["leader"] in p["replicas"] for p in described["partitions"])
    # the leader of the new partition created it: a produce to it succeeds (retried until it is served)
    ran = produce_once_known(capsys, c, "grow", 2, "hello")
    assert ran.code == 0, ran.err
    bootstrap = ("--bootstrap-controller", c.controllers)
    same = kraft(capsys, "topic", "alter", "--topic", "grow", "--partitions", "3", *bootstrap)
    one_error(same, "INVALID_PARTITIONS", "has 3 partitions")
    missing = kraft(capsys, "topic", "alter", "--topic", "nosuch", "--partitions", "3", *bootstrap)
    one_error(missing, "UNKNOWN_TOPIC_OR_PARTITION")


def test_config_alter_and_describe_round_trip_and_brokers_apply_them(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    bootstrap = ("--bootstrap-controller", c.controllers)
    ok_json(capsys, "topic", "create", "cfg", "-p", "1", "-r", "2", *bootstrap)
    topic = ("--entity-type", "topics", "--entity-name", "cfg")
    assert ok_json(capsys, "config", "describe", *topic, *bootstrap)["configs"] == []
    add = "max.message.bytes=100,cleanup.policy=[compact,delete]"
    altered = ok_json(capsys, "config", "alter", *topic, "--add-config", add, *bootstrap)
    assert altered["set"] == {"max.message.bytes": "100", "cleanup.policy": "compact,delete"}
    own = ok_json(capsys, "config", "describe", *topic, *bootstrap)["configs"]
    assert {(e["name"], e["value"], e["source"]) for e in own} == {
        ("max.message.bytes", "100", "DYNAMIC_TOPIC_CONFIG"),
        ("cleanup.policy", "compact,delete", "DYNAMIC_TOPIC_CONFIG"),
    }
    every = {
        e["name"]: e for e in ok_json(capsys, "config", "describe", *topic, "--all", *bootstrap)["configs"]
    }
    assert every["retention.ms"]["source"] == "DEFAULT_CONFIG" and not every["retention.ms"]["applied"]
    assert every["max.message.bytes"]["applied"]
    # the broker applies the topic's max.message.bytes at once (from its metadata image)
    too_big = produce_until(capsys, c, lambda r: r.code != 0, "cfg", 0, "x" * 300, "--timeout", "5")
    one_error(too_big, "MESSAGE_TOO_LARGE", "max.message.bytes=100 of topic cfg")
    ok_json(capsys, "config", "alter", *topic, "--delete-config", "max.message.bytes", *bootstrap)
    fits = produce_until(capsys, c, lambda r: r.code == 0, "cfg", 0, "x" * 300, "--timeout", "10")
    assert fits.code == 0, fits.err
    # a dynamic broker default: every broker re-reads min.insync.replicas (3 > the 2 replicas: refused)
    default = ("--entity-type", "brokers", "--entity-default")
    ok_json(
        capsys,
        "config",
        "alter",
        *default,
        "--add-config",
        "min.insync.replicas=3",
        "--cluster-dir",
        str(c.directory),
    )
    broker_view = ok_json(
        capsys, "config", "describe", "--entity-type", "brokers", "--entity-name", "101", "--all", *bootstrap
    )
    assert {(e["name"], e["value"], e["source"]) for e in broker_view["configs"]} >= {
        ("min.insync.replicas", "3", "DYNAMIC_DEFAULT_BROKER_CONFIG")
    }
    refused = produce_until(capsys, c, lambda r: r.code != 0, "cfg", 0, "y", "--timeout", "1")
    assert refused.code == 1 and "NOT_ENOUGH_REPLICAS" in refused.err, refused
    # the cluster-wide default cannot be removed (every node reads it, not its .properties): set back
    one_error(
        kraft(capsys, "config", "alter", *default, "--delete-config", "min.insync.replicas", *bootstrap),
        "INVALID_CONFIG", "the cluster-wide min.insync.replicas cannot be removed",
    )  # fmt: skip
    ok_json(capsys, "config", "alter", *default, "--add-config", "min.insync.replicas=1", *bootstrap)
    assert produce_until(capsys, c, lambda r: r.code == 0, "cfg", 0, "y", "--timeout", "10").code == 0
    # nor set for one broker (eligible leader replicas need one minimum)
    one_error(
        kraft(capsys, "config", "alter", "--entity-type", "brokers", "--entity-name", "101",
              "--add-config", "min.insync.replicas=1", *bootstrap),
        "INVALID_CONFIG", "min.insync.replicas cannot be set for one broker",
    )  # fmt: skip
    # bad input: one line, nothing changed
    one_error(
        kraft(capsys, "config", "alter", *topic, "--add-config", "retention.mss=1", *bootstrap),
        "INVALID_CONFIG", "unknown topic config 'retention.mss'",
    )  # fmt: skip
    one_error(
        kraft(capsys, "config", "alter", *topic, "--add-config", "min.insync.replicas=5", *bootstrap),
        "INVALID_CONFIG", "replication factor 2",
    )  # fmt: skip
    one_error(
        kraft(capsys, "config", "alter", "--entity-type", "brokers", "--entity-name", "101", "--add-config",
              "log.segment.bytes=1048576", *bootstrap),
        "INVALID_CONFIG", "not dynamic",
    )  # fmt: skip
    one_error(
        kraft(capsys, "config", "describe", "--entity-type", "topics", "--entity-name", "nosuch", *bootstrap),
        "UNKNOWN_TOPIC_OR_PARTITION",
    )  # fmt: skip
    left = {"name": "cleanup.policy", "value": "compact,delete", "source": "DYNAMIC_TOPIC_CONFIG"}
    assert ok_json(capsys, "config", "describe", *topic, *bootstrap)["configs"] == [
        {**left, "applied": False, "read_only": False}
    ]


def test_offsets_log_dirs_and_api_versions_read_every_node(
    cluster: Cluster, capsys: pytest.CaptureFixture[str]
) -> None:
    c = cluster
    at = ("--cluster-dir", str(c.directory))
    ok_json(capsys, "topic", "create", "offs", "-p", "2", "-r", "2", "--bootstrap-controller", c.controllers)
    produced = produce_once_known(capsys, c, "offs", 0, "a", "--value", "b", "--value", "c")
    assert produced.code == 0, produced.err
    latest = ok_json(capsys, "offsets", "get", "--topic", "offs", *at)
    assert [(r["partition"], r["offset"]) for r in latest] == [(0, 3), (1, 0)]
    earliest = ok_json(
        capsys, "offsets", "get", "--topic", "offs", "--time", "earliest", "--partitions", "0", *at
    )
    assert earliest == [{"topic": "offs", "partition": 0, "offset": 0}]
    text = kraft(
        capsys, "offsets", "get", "--topic", "offs", "--bootstrap-server", c.brokers, "--timeout", "10"
    )
    assert text.code == 0 and text.out.splitlines() == ["offs:0:3", "offs:1:0"], text
    one_error(
        kraft(capsys, "offsets", "get", "--topic", "offs", "--time", "1700000000000", *at), "not supported"
    )
    one_error(kraft(capsys, "offsets", "get", "--topic", "offs", "--partitions", "5", *at), "no partition 5")
    one_error(kraft(capsys, "offsets", "get", "--topic", "nosuch", *at), "UNKNOWN_TOPIC_OR_PARTITION")

    described = ok_json(capsys, "log-dirs", "describe", "--topic", "offs", *at)
    assert [b["broker"] for b in described] == [101, 102] and not any(b["error"] for b in described)
    for broker in described:
        (log_dir,) = broker["log_dirs"]
        assert log_dir["error"] is None and log_dir["usable_bytes"] > 0
        sizes = {p["partition"]: p["size"] for p in log_dir["partitions"]}
        assert set(sizes) == {0, 1} and sizes[0] > sizes[1], sizes  # acks=all: 3 records on both replicas
    one_error(kraft(capsys, "log-dirs", "describe", "--broker", "999", *at), "broker 999 is not registered")

    nodes = ok_json(capsys, "api-versions", *at)
    assert [(n["role"], n["node_id"]) for n in nodes] == [("controller", 1), ("broker", 101), ("broker", 102)]
    for node in nodes:
        assert node["error"] is None and node["software_version"] == kraft_version
        assert node["finalized_features"] == {"metadata.version": 1}
        assert node["supported_features"] == {"metadata.version": [1, 1]}
    assert "CreatePartitions" in nodes[0]["services"]["kraft.v1.ControllerService"]
    assert "DescribeLogDirs" in nodes[1]["services"]["kraft.v1.BrokerService"]
    wrong = kraft(capsys, "api-versions", "--bootstrap-server", c.controllers.split(",")[0], "--timeout", "5")
    one_error(wrong, "1 of 1 nodes did not answer", "serves no broker ApiVersions")


def test_features_describe_upgrade_and_refused_changes(
    capsys: pytest.CaptureFixture[str], cluster: Cluster
) -> None:
    at = ("--bootstrap-controller", cluster.controllers, "--timeout", "10")
    described = ok_json(capsys, "features", "describe", *at)
    assert described == {
        "controller_id": 1,
        "features": [
            {
                "feature": "metadata.version",
                "supported_min": 1,
                "supported_max": 1,
                "finalized_level": 1,  # from the bootstrap checkpoint, written by the first activation
                "release": "0.1-IV0",
            }
        ],
    }
    table = kraft(capsys, "features", "describe", *at)
    assert table.code == 0 and "metadata.version" in table.out and "0.1-IV0" in table.out, table
    # The level it is at: accepted, nothing changes (a resent upgrade is harmless).
    assert ok_json(capsys, "features", "upgrade", "--release-version", "0.1", *at) == {
        "result": "finalized",
        "features": {"metadata.version": 1},
    }
    one_error(
        kraft(capsys, "features", "upgrade", "--feature", "metadata.version=2", *at),
        "INVALID_UPDATE_VERSION",
        "metadata.version level 2 is not supported by this controller (1..1)",
    )
    one_error(
        kraft(capsys, "features", "downgrade", "--feature", "metadata.version=0", *at),
        "INVALID_UPDATE_VERSION",
        "level 0 is not supported",
    )
    one_error(
        kraft(capsys, "features", "upgrade", "--release-version", "9.9", *at), "unknown release version"
    )
    one_error(kraft(capsys, "features", "upgrade", *at), "nothing to change")
    after = ok_json(capsys, "features", "describe", *at)
    assert after["features"][0]["finalized_level"] == 1


def test_a_broker_restarted_after_kill_9_registers_without_waiting_out_its_old_session(
    cluster: Cluster,
) -> None:
    """kraft.broker.incarnation: the new process names its predecessor on the same log dirs, so the
    controller replaces the registration at once; before, the first attempt was refused
    (DUPLICATE_BROKER_REGISTRATION) until the dead process's session expired.  Runs last in this file:
    the broker is back and unfenced before it returns."""
    local = LocalCluster.open(cluster.directory)
    broker = local.process(102)
    assert local.kill(102)
    offset = broker.log_path.stat().st_size
    local.start([102])
    local.wait_node_ready(102, timeout_s=30)
    with broker.log_path.open("rb") as f:
        f.seek(offset)
        restarted = f.read().decode("utf-8", "replace")
    assert "event=registered" in restarted and "event=unfenced" in restarted, restarted
    # No attempt was refused by the controller (a refusal's reason starts with its error code); a retry
    # after a transport error or a deadline (a slow controller on a loaded host) is not a refusal.
    refused = [
        line
        for line in restarted.splitlines()
        if "event=registration_retry" in line and re.search(r'reason="?[A-Z_]+: ', line)
    ]
    assert "DUPLICATE_BROKER_REGISTRATION" not in restarted and not refused, restarted
