"""CLI commands of the metadata area that need no cluster: the read-only SQL shell, argument parsing,
JSON shapes, and the one-line error contract."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kraft.cli.broker import broker_json
from kraft.cli.common import CliError
from kraft.cli.main import app
from kraft.cli.topic import parse_assignment, parse_configs, topic_json
from kraft.clock import ManualClock
from kraft.metadata import records
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

runner = CliRunner()


@pytest.fixture
def store_file(tmp_path: Path) -> Path:
    delta = MetadataDelta(MetadataImage.empty())
    for offset, payload in enumerate(
        [
            pb.RegisterBrokerRecord(broker_id=1, incarnation_id="i", broker_epoch=0),
            pb.TopicRecord(name="orders", topic_id="T"),
            pb.PartitionRecord(partition_id=0, topic_id="T", replicas=[1], isr=[1], leader=1),
        ]
    ):
        delta.replay(records.wrap(payload), offset)
    path = tmp_path / "metadata-image.sqlite"

    async def save() -> None:
        store = await SqliteImageStore.open(path, clock=ManualClock())
        try:
            await store.save(delta.apply())
        finally:
            await store.close()

    asyncio.run(save())
    return path


def test_shell_runs_sql_read_only_and_prints_json(store_file: Path) -> None:
    query = "SELECT t.name, p.leader FROM partitions p JOIN topics t USING (topic_id)"
    result = runner.invoke(app, ["metadata", "shell", "--db", str(store_file), "-c", query, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [{"name": "orders", "leader": 1}]
    write = runner.invoke(app, ["metadata", "shell", "--db", str(store_file), "-c", "DELETE FROM topics"])
    assert write.exit_code == 1 and "readonly" in write.stderr


def test_shell_reads_statements_and_dot_commands_from_stdin(store_file: Path) -> None:
    script = ".tables\nSELECT value FROM meta\n WHERE key = 'offset';\n.quit\n"
    result = runner.invoke(app, ["metadata", "shell", "--db", str(store_file), "--json"], input=script)
    assert result.exit_code == 0, result.output
    assert '"value": "2"' in result.stdout and '"name": "partitions"' in result.stdout


def test_shell_without_a_store_fails_with_one_line(tmp_path: Path) -> None:
    result = runner.invoke(app, ["metadata", "shell", "--db", str(tmp_path / "missing.sqlite")])
    assert result.exit_code == 1
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("error: ")


def test_bad_bootstrap_is_one_line_and_exit_1() -> None:
    result = runner.invoke(app, ["topic", "list", "--bootstrap-controller", "nonsense"])
    assert result.exit_code == 1 and result.stderr.startswith("error: --bootstrap-controller")


def test_assignment_and_config_parsing() -> None:
    assignment = parse_assignment("1:2:3,2:3:1")
    assert [(a.partition, list(a.broker_ids)) for a in assignment] == [(0, [1, 2, 3]), (1, [2, 3, 1])]
    assert [(c.name, c.value) for c in parse_configs(["retention.ms=5", "cleanup.policy = compact"])] == [
        ("retention.ms", "5"),
        ("cleanup.policy", "compact"),
    ]
    with pytest.raises(CliError):
        parse_assignment("1:x")
    with pytest.raises(CliError):
        parse_configs(["novalue"])


def test_json_shapes_match_the_contract() -> None:
    broker = cpb.BrokerDescription(broker_id=3, broker_epoch=7, incarnation_id="i", state="ACTIVE", rack="r")
    broker.endpoints.add(name="PLAINTEXT", host="h", port=9092)
    shaped = broker_json(broker)
    contract = {"id", "epoch", "incarnation_id", "state", "rack", "endpoints", "metadata_offset"}
    assert contract | {"last_heartbeat_ms_ago"} <= set(shaped)
    assert shaped["endpoints"] == ["PLAINTEXT://h:9092"]
    topic = cpb.TopicDescription(name="t", topic_id="T")
    topic.partitions.add(
        partition=0, leader=1, leader_epoch=2, replicas=[1, 2, 3], isr=[1], eligible_leader_replicas=[2]
    )
    assert topic_json(topic) == {
        "name": "t",
        "topic_id": "T",
        "configs": {},
        "partitions": [
            {
                "partition": 0,
                "leader": 1,
                "leader_epoch": 2,
                "replicas": [1, 2, 3],
                "isr": [1],
                "elr": [2],
                "last_known_elr": [],
                "leader_recovery_state": "RECOVERED",
            }
        ],
    }
