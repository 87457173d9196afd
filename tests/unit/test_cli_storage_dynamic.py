"""`kraft storage format --standalone | --initial-controllers | --no-initial-controllers` (KIP-853): the
bootstrap checkpoint each writes, the directory id it assigns, and Kafka's rules for combining them."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.cluster.formatting import BOOTSTRAP_SNAPSHOT_ID, parse_initial_controllers
from kraft.raft.driver import voter_history_of
from kraft.raft.storage_adapters import FileSnapshotStore, SegmentedLogStore
from kraft.raft.voters import Endpoint, Voter, VoterSet
from kraft.storage.ids import random_uuid
from kraft.storage.log import METADATA_LOG_DIR_NAME
from kraft.storage.meta_properties import read_meta_properties

runner = CliRunner()
CLUSTER = random_uuid()


def _config(tmp_path: Path, node_id: int, *, quorum: str | None = None, roles: str = "controller") -> Path:
    """A controller of a dynamic quorum (bootstrap servers) unless ``quorum`` names static voters."""
    key = (
        f"controller.quorum.voters={quorum}"
        if quorum
        else "controller.quorum.bootstrap.servers=127.0.0.1:9093"
    )
    listeners = f"CONTROLLER://127.0.0.1:{9092 + node_id}"
    if "broker" in roles:
        listeners += f",PLAINTEXT://127.0.0.1:{9192 + node_id}"
    path = tmp_path / f"node-{node_id}.properties"
    path.write_text(
        f"process.roles={roles}\nnode.id={node_id}\n{key}\nlisteners={listeners}\n"
        f"log.dirs={tmp_path / f'logs-{node_id}'}\nmetadata.log.dir={tmp_path / f'meta-{node_id}'}\n",
        encoding="utf-8",
    )
    return path


def _format(config: Path, *flags: str) -> tuple[int, str]:
    result = runner.invoke(app, ["storage", "format", "-c", str(config), "-t", CLUSTER, *flags])
    return result.exit_code, result.stdout + result.stderr


def _bootstrap_voters(tmp_path: Path, node_id: int) -> VoterSet | None:
    directory = tmp_path / f"meta-{node_id}" / METADATA_LOG_DIR_NAME
    store = FileSnapshotStore(directory)
    if store.latest() is None:
        return None
    assert store.latest() == BOOTSTRAP_SNAPSHOT_ID
    assert store.read_records(BOOTSTRAP_SNAPSHOT_ID)[1] == []  # control records only
    return store.read_voters(BOOTSTRAP_SNAPSHOT_ID)


def test_standalone_writes_a_one_voter_set_with_this_nodes_directory_id_and_endpoint(tmp_path: Path) -> None:
    config = _config(tmp_path, 1)
    code, output = _format(config, "--standalone")
    assert code == 0, output
    directory_id = read_meta_properties(tmp_path / "meta-1").directory_id
    assert _bootstrap_voters(tmp_path, 1) == VoterSet(
        (Voter(1, directory_id, (Endpoint("CONTROLLER", "127.0.0.1", 9093),)),)
    )
    # The driver's start-up path reads the same set back from the checkpoint (kraft.version 1).
    log_dir = tmp_path / "meta-1" / METADATA_LOG_DIR_NAME
    log = SegmentedLogStore.open(log_dir)
    try:
        history = voter_history_of(log, FileSnapshotStore(log_dir), BOOTSTRAP_SNAPSHOT_ID)
    finally:
        log.close()
    assert history is not None and history.kraft_version == 1 and history.latest.ids == (1,)


def test_initial_controllers_gives_every_listed_node_the_same_set_and_its_listed_directory_id(
    tmp_path: Path,
) -> None:
    ids = {node: random_uuid() for node in (1, 2, 3)}
    flag = ",".join(f"{node}@127.0.0.1:{9092 + node}:{ids[node]}" for node in (1, 2, 3))
    for node in (1, 2, 3):
        code, output = _format(_config(tmp_path, node), "--initial-controllers", flag)
        assert code == 0, output
        assert read_meta_properties(tmp_path / f"meta-{node}").directory_id == ids[node]
    sets = {_bootstrap_voters(tmp_path, node) for node in (1, 2, 3)}
    assert sets == {parse_initial_controllers(flag)}
    assert [(v.node_id, v.directory_id) for v in parse_initial_controllers(flag)] == sorted(ids.items())
    # The other log dirs get their own fresh directory ids.
    assert read_meta_properties(tmp_path / "logs-1").directory_id != ids[1]


def test_no_initial_controllers_writes_no_voter_set(tmp_path: Path) -> None:
    code, output = _format(_config(tmp_path, 2), "--no-initial-controllers")
    assert code == 0, output
    assert _bootstrap_voters(tmp_path, 2) is None
    assert read_meta_properties(tmp_path / "meta-2").node_id == 2


def _refused(tmp_path: Path, config: Path, fragment: str, *flags: str) -> None:
    code, output = _format(config, *flags)
    assert code == 1, output
    assert fragment in output, output
    assert len(output.strip().splitlines()) == 1, output
    assert not (tmp_path / "meta-1" / "meta.properties").exists()  # nothing written
    assert not (tmp_path / "meta-2" / "meta.properties").exists()


def test_kafkas_rules_for_the_dynamic_flags(tmp_path: Path) -> None:
    dynamic = _config(tmp_path, 1)
    _refused(
        tmp_path,
        dynamic,
        "use one of --standalone",
    )
    _refused(tmp_path, dynamic, "cannot be used together", "--standalone", "--no-initial-controllers")
    other = random_uuid()
    _refused(
        tmp_path,
        dynamic,
        "cannot be used together",
        "--standalone",
        "--initial-controllers",
        f"1@127.0.0.1:9093:{other}",
    )
    static = _config(tmp_path, 2, quorum="2@127.0.0.1:9094")
    _refused(tmp_path, static, "controller.quorum.voters", "--standalone")
    _refused(tmp_path, static, "controller.quorum.voters", "--no-initial-controllers")
    _refused(tmp_path, dynamic, "does not list node.id=1", "--initial-controllers", f"2@h:9094:{other}")
    _refused(tmp_path, dynamic, "id@host:port:directory-id", "--initial-controllers", "1@127.0.0.1:9093")
    _refused(tmp_path, dynamic, "UUID", "--initial-controllers", "1@127.0.0.1:9093:not-a-uuid")
    _refused(
        tmp_path,
        dynamic,
        "unique",
        "--initial-controllers",
        f"1@127.0.0.1:9093:{other},2@127.0.0.1:9094:{other}",
    )
    _refused(
        tmp_path,
        dynamic,
        "duplicate",
        "--initial-controllers",
        f"1@127.0.0.1:9093:{other},1@127.0.0.1:9094:{random_uuid()}",
    )
    # A broker-only node of a dynamic cluster formats without the flags and refuses them.
    broker = tmp_path / "broker.properties"
    broker.write_text(
        "process.roles=broker\nnode.id=101\ncontroller.quorum.bootstrap.servers=127.0.0.1:9093\n"
        f"listeners=PLAINTEXT://127.0.0.1:9200\nlog.dirs={tmp_path / 'broker-logs'}\n",
        encoding="utf-8",
    )
    code, output = _format(broker, "--standalone")
    assert code == 1 and "only be used on a controller" in output, output
    code, output = _format(broker)
    assert code == 0, output


def test_ignore_formatted_keeps_the_first_bootstrap_and_checks_the_listed_directory_id(
    tmp_path: Path,
) -> None:
    config = _config(tmp_path, 1)
    assert _format(config, "--standalone")[0] == 0
    first = _bootstrap_voters(tmp_path, 1)
    code, output = _format(config, "--standalone", "--ignore-formatted")
    assert code == 0, output
    assert _bootstrap_voters(tmp_path, 1) == first
    code, output = _format(
        config, "--ignore-formatted", "--initial-controllers", f"1@127.0.0.1:9093:{random_uuid()}"
    )
    assert code == 1 and "directory.id" in output, output
