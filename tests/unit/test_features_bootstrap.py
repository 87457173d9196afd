"""kraft.features (release names, name=level, the supported range), the bootstrap checkpoint written by
``kraft storage format --release-version/--feature`` and read by a controller at start, and the broker's
incarnation file."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kraft.broker.incarnation import INCARNATION_FILE, take_over_incarnation
from kraft.cli.main import app
from kraft.config import load_config
from kraft.features import (
    LATEST_METADATA_VERSION,
    SUPPORTED_FEATURES,
    metadata_version_of_release,
    parse_feature_level,
    requested_levels,
)
from kraft.metadata.bootstrap import BOOTSTRAP_FILE, read_bootstrap_features, write_bootstrap_features
from kraft.node.metadata_layer import options_from_config
from kraft.storage.errors import StorageStateError

runner = CliRunner()
CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"


def test_release_names_and_feature_levels_parse_or_fail_with_one_line() -> None:
    assert metadata_version_of_release("0.1") == metadata_version_of_release("0.1-IV0") == 1
    with pytest.raises(ValueError, match=r"unknown release version '9\.9'; this software supports 0\.1-IV0"):
        metadata_version_of_release("9.9")
    assert parse_feature_level(" metadata.version = 1 ") == ("metadata.version", 1)
    for bad in ("metadata.version", "=1", "metadata.version=x", "metadata.version=-1"):
        with pytest.raises(ValueError, match="is not name=level"):
            parse_feature_level(bad)
    assert requested_levels("0.1", []) == {"metadata.version": 1}
    with pytest.raises(ValueError, match="given more than once"):
        requested_levels("0.1", ["metadata.version=1"])
    with pytest.raises(
        ValueError, match=r"metadata.version level 7 is not supported; this software supports 1\.\.1"
    ):
        requested_levels(None, ["metadata.version=7"])
    with pytest.raises(ValueError, match="unknown feature 'nosuch'"):
        requested_levels(None, ["nosuch=1"])
    assert requested_levels(None, ["metadata.version=7"], check=False) == {"metadata.version": 7}
    assert SUPPORTED_FEATURES["metadata.version"] == (1, LATEST_METADATA_VERSION)


def test_bootstrap_checkpoint_round_trip_and_refusals(tmp_path: Path) -> None:
    assert read_bootstrap_features(tmp_path) is None
    path = write_bootstrap_features(tmp_path, {"metadata.version": 1})
    assert path == tmp_path / BOOTSTRAP_FILE and not list(tmp_path.glob("*.part"))
    assert read_bootstrap_features(tmp_path) == {"metadata.version": 1}
    with pytest.raises(StorageStateError, match="already exists"):
        write_bootstrap_features(tmp_path, {"metadata.version": 1})
    data = bytearray(path.read_bytes())
    data[-30] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(StorageStateError, match=f"damaged {path}"):
        read_bootstrap_features(tmp_path)
    other = tmp_path / "other"
    other.mkdir()
    write_bootstrap_features(other, {"metadata.version": 9})  # written by a newer kraft
    with pytest.raises(StorageStateError, match=r"metadata\.version level 9 is not supported"):
        read_bootstrap_features(other)


def _config(tmp_path: Path, roles: str = "controller", node_id: int = 1) -> Path:
    path = tmp_path / f"node-{node_id}.properties"
    listeners = "CONTROLLER://127.0.0.1:9093" if roles == "controller" else "PLAINTEXT://127.0.0.1:9092"
    path.write_text(
        f"process.roles={roles}\nnode.id={node_id}\ncontroller.quorum.voters=1@127.0.0.1:9093\n"
        f"listeners={listeners}\ncontroller.listener.names=CONTROLLER\n"
        f"log.dirs={tmp_path / f'data-{node_id}'}\n",
        encoding="utf-8",
    )
    return path


def test_format_release_version_writes_the_bootstrap_checkpoint_a_controller_reads(tmp_path: Path) -> None:
    config = _config(tmp_path)
    result = runner.invoke(
        app, ["storage", "format", "-c", str(config), "-t", CLUSTER_ID, "--release-version", "0.1", "--json"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["bootstrap_features"] == {"metadata.version": 1}
    cfg = load_config(config)
    assert cfg.metadata_log_dir is not None
    assert read_bootstrap_features(Path(cfg.metadata_log_dir)) == {"metadata.version": 1}
    assert options_from_config(cfg).bootstrap_features == {"metadata.version": 1}


def test_format_refuses_an_unknown_release_with_one_line_and_writes_nothing(tmp_path: Path) -> None:
    config = _config(tmp_path)
    for flags, fragment in (
        (["--release-version", "9.9"], "unknown release version '9.9'"),
        (["--feature", "metadata.version=5"], "metadata.version level 5 is not supported"),
        (["--feature", "kraft.version"], "is not name=level"),
    ):
        result = runner.invoke(app, ["storage", "format", "-c", str(config), "-t", CLUSTER_ID, *flags])
        assert result.exit_code == 1, result.output
        assert len(result.stderr.splitlines()) == 1 and fragment in result.stderr, result.stderr
    assert not (tmp_path / "data-1").exists()


def test_a_broker_only_node_gets_no_bootstrap_checkpoint(tmp_path: Path) -> None:
    config = _config(tmp_path, roles="broker", node_id=101)
    result = runner.invoke(app, ["storage", "format", "-c", str(config), "-t", CLUSTER_ID, "-r", "0.1"])
    assert result.exit_code == 0, result.output
    assert not (tmp_path / "data-101" / BOOTSTRAP_FILE).exists()


def test_the_incarnation_file_hands_the_previous_id_to_the_next_process(tmp_path: Path) -> None:
    first = "0b6f8b4e-3a43-4f7e-9b55-2f9f3f2a3e10"
    second = "5d1c1c8e-7e53-4a0b-8d4e-0c1f4b7a9d22"
    assert take_over_incarnation(tmp_path, first) == ()
    assert take_over_incarnation(tmp_path, second) == (first,)
    (tmp_path / INCARNATION_FILE).write_text("not a uuid\n", encoding="ascii")
    assert take_over_incarnation(tmp_path, first) == ()  # damaged: no proof, the session rule applies
    assert (tmp_path / INCARNATION_FILE).read_text(encoding="ascii") == f"{first}\n"
