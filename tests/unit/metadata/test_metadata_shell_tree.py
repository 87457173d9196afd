"""`kraft metadata shell --snapshot F | --log-dir D`: a snapshot / metadata log browsed as a tree
(ls, cat, tree), as kafka-metadata-shell.sh does; the SQL mode stays (tests/unit/metadata/test_cli.py)."""

from __future__ import annotations

import json
from pathlib import Path

from google.protobuf.message import Message
from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.metadata import records as metadata_records
from kraft.storage.log import METADATA_LOG_DIR_NAME, SegmentedLog
from kraft.storage.snapshot import SnapshotDirectory, SnapshotFileId
from kraft.v1 import metadata_pb2 as pb

runner = CliRunner()

SNAPSHOT_RECORDS: list[Message] = [
    pb.FeatureLevelRecord(name="metadata.version", feature_level=7),
    pb.RegisterBrokerRecord(broker_id=101, broker_epoch=1, fenced=False),
    pb.RegisterBrokerRecord(broker_id=102, broker_epoch=2, fenced=True),
    pb.TopicRecord(name="orders", topic_id="t-orders"),
    pb.PartitionRecord(partition_id=0, topic_id="t-orders", replicas=[101, 102], isr=[101], leader=101),
    pb.PartitionRecord(partition_id=1, topic_id="t-orders", replicas=[102, 101], isr=[102], leader=102),
    pb.ConfigRecord(resource_type=2, resource_name="orders", name="retention.ms", value="1000"),
]
LATER_RECORDS: list[Message] = [
    pb.TopicRecord(name="clicks", topic_id="t-clicks"),
    pb.PartitionRecord(partition_id=0, topic_id="t-clicks", replicas=[101], isr=[101], leader=101),
    pb.PartitionChangeRecord(partition_id=1, topic_id="t-orders", leader=-1),
    pb.AccessControlEntryRecord(
        id="acl-1",
        resource_type=2,
        resource_name="orders",
        pattern_type=3,
        principal="User:alice",
        host="*",
        operation=3,
        permission_type=3,
    ),
]


def _value(record: Message) -> bytes:
    return metadata_records.encode_value(metadata_records.wrap(record))


def _metadata_dir(root: Path) -> tuple[Path, Path]:
    """A log whose first 7 records are also in a snapshot (end offset 7), then 4 more records."""
    directory = root / METADATA_LOG_DIR_NAME
    with SegmentedLog.open(directory) as log:
        for record in [*SNAPSHOT_RECORDS, *LATER_RECORDS]:
            log.append_records([(None, _value(record))], leader_epoch=3, timestamp_ms=1)
    writer = SnapshotDirectory(directory).create(
        SnapshotFileId(len(SNAPSHOT_RECORDS), 3), last_contained_log_timestamp=1, timestamp_ms=2
    )
    writer.append_records([(None, _value(r)) for r in SNAPSHOT_RECORDS])
    snapshot = writer.freeze()
    return directory, snapshot


def _run(*args: str, stdin: str | None = None) -> str:
    result = runner.invoke(app, ["metadata", "shell", *args], input=stdin)
    assert result.exit_code == 0, result.output
    assert result.stderr == "", result.stderr
    return result.stdout


def test_ls_cat_and_tree_over_a_snapshot(tmp_path: Path) -> None:
    _, snapshot = _metadata_dir(tmp_path)
    assert _run("--snapshot", str(snapshot), "ls", "/").split() == [
        "acls/",
        "brokers/",
        "cluster/",
        "configs/",
        "features/",
        "topics/",
    ]
    assert _run("--snapshot", str(snapshot), "ls", "/topics").split() == ["orders/"]  # clicks came later
    assert _run("--snapshot", str(snapshot), "ls", "/topics/orders").split() == ["0/", "1/", "configs/", "id"]
    assert json.loads(_run("--snapshot", str(snapshot), "cat", "/topics/orders/1/data")) == {
        "replicas": [102, 101],
        "isr": [102],
        "leader": 102,
        "leaderEpoch": 0,
        "partitionEpoch": 0,
        "eligibleLeaderReplicas": [],
        "lastKnownElr": [],
        "leaderRecoveryState": 0,
        "lastUncleanLeaderEpoch": 0,
    }
    assert _run("--snapshot", str(snapshot), "cat", "/topics/orders/configs/retention.ms") == "1000\n"
    assert _run("--snapshot", str(snapshot), "cat", "/brokers/102/fenced") == "true\n"
    assert _run("--snapshot", str(snapshot), "cat", "/cluster/offset") == "6\n"
    assert _run("--snapshot", str(snapshot), "tree", "/features").splitlines() == [
        "/features",
        "  metadata.version: 7",
    ]


def test_a_log_dir_replays_the_snapshot_then_the_records_after_it(tmp_path: Path) -> None:
    directory, _ = _metadata_dir(tmp_path)
    for given in (directory, tmp_path):  # the partition directory, or metadata.log.dir above it
        assert _run("--log-dir", str(given), "ls", "/topics").split() == ["clicks/", "orders/"]
    assert json.loads(_run("--log-dir", str(directory), "cat", "/topics/orders/1/data"))["leader"] == -1
    acl = json.loads(_run("--log-dir", str(directory), "cat", "/acls/acl-1"))
    assert (acl["principal"], acl["operation"], acl["permission"]) == ("User:alice", "READ", "ALLOW")
    cluster = json.loads(_run("--log-dir", str(directory), "tree", "/cluster", "--json"))
    # Snapshot records repeated in the segment were skipped, not replayed twice (no errors).
    assert cluster["offset"] == 10 and cluster["replayErrors"] == {"count": 0, "first": []}
    assert cluster["topics"] == 2 and cluster["partitions"] == 3
    assert json.loads(_run("--log-dir", str(directory), "ls", "/brokers", "--json")) == ["101/", "102/"]


def test_interactive_tree_mode_reads_commands_from_stdin(tmp_path: Path) -> None:
    directory, _ = _metadata_dir(tmp_path)
    script = "cd /topics/orders\npwd\nls 0\ncat 0/data\ncd ..\nls\nexit\nls /\n"
    result = runner.invoke(app, ["metadata", "shell", "--log-dir", str(directory)], input=script)
    assert result.exit_code == 0, result.output
    out = result.stdout.splitlines()
    assert out[0] == "/topics/orders" and out[1] == "data"
    assert json.loads("\n".join(out[2:-2]))["replicas"] == [101, 102]
    assert out[-2:] == ["clicks/", "orders/"]  # nothing after exit ran
    bad = runner.invoke(
        app, ["metadata", "shell", "--log-dir", str(directory)], input="cat /topics\nrm /x\nls /features\n"
    )
    assert bad.exit_code == 0  # a bad command does not end the session
    assert bad.stderr.splitlines() == [
        "error: /topics: is a directory (try ls or tree)",
        "error: unknown command 'rm' (one of ls, cat, tree)",
    ]
    assert bad.stdout == "metadata.version\n"


def test_tree_mode_errors_are_one_line(tmp_path: Path) -> None:
    directory, snapshot = _metadata_dir(tmp_path)
    for args, message in (
        (["ls", "/"], "need --snapshot F or --log-dir D"),
        (["--snapshot", str(snapshot), "--log-dir", str(directory), "ls"], "not both"),
        (["--snapshot", str(snapshot), "--db", str(snapshot), "ls"], "SQL mode"),
        (["--snapshot", str(snapshot), "cat", "/nope"], "/nope: no such file or directory"),
        (["--snapshot", str(snapshot), "cat"], "usage: cat PATH"),
        (["--snapshot", str(directory / "00000000000000000000.log"), "ls"], "not a snapshot file name"),
        (["--log-dir", str(tmp_path / "missing"), "ls"], "not a directory"),
    ):
        result = runner.invoke(app, ["metadata", "shell", *args])
        assert result.exit_code == 1, args
        assert result.stderr.count("\n") == 1 and message in result.stderr, result.stderr


def test_a_torn_segment_tail_is_reported_not_fatal(tmp_path: Path) -> None:
    directory, _ = _metadata_dir(tmp_path)
    segment = directory / "00000000000000000000.log"
    data = bytearray(segment.read_bytes())
    data[-3] ^= 0xFF  # the last batch (the ACL) is damaged
    segment.write_bytes(bytes(data))
    result = runner.invoke(app, ["metadata", "shell", "--log-dir", str(directory), "ls", "/acls"])
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "warning: 1 records could not be read or replayed" in result.stderr
    errors = json.loads(
        _run("--snapshot", str(next(directory.glob("*.checkpoint"))), "cat", "/cluster/replayErrors")
    )
    assert errors == {"count": 0, "first": []}
