"""`kraft storage random-uuid|format|info` and the shared CLI error contract (one line on stderr, exit 1)."""

from __future__ import annotations

import json
from pathlib import Path

import grpc
import pytest
import typer
from typer.testing import CliRunner

from kraft.cli.common import CliError, HostPort, error_message, handle_errors, parse_bootstrap
from kraft.cli.main import app
from kraft.config import ConfigError
from kraft.errors import ErrorCode, KraftError
from kraft.storage.ids import parse_uuid
from kraft.storage.meta_properties import read_meta_properties

runner = CliRunner()


def _write_config(tmp_path: Path, node_id: int = 1, name: str = "node.properties") -> Path:
    path = tmp_path / name
    path.write_text(
        "process.roles=broker,controller\n"
        f"node.id={node_id}\n"
        f"controller.quorum.voters={node_id}@127.0.0.1:9093\n"
        "listeners=PLAINTEXT://127.0.0.1:9092,CONTROLLER://127.0.0.1:9093\n"
        f"log.dirs={tmp_path / 'logs-a'},{tmp_path / 'logs-b'}\n"
        f"metadata.log.dir={tmp_path / 'meta'}\n",
        encoding="utf-8",
    )
    return path


def _fails_with_one_line(args: list[str], fragment: str) -> str:
    result = runner.invoke(app, args)
    assert result.exit_code == 1, result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("error: ")
    assert fragment in lines[0]
    return lines[0]


def _new_id() -> str:
    result = runner.invoke(app, ["storage", "random-uuid"])
    assert result.exit_code == 0
    return result.stdout.strip()


def test_random_uuid_prints_a_fresh_kafka_uuid() -> None:
    first, second = _new_id(), _new_id()
    assert len(parse_uuid(first)) == 16
    assert first != second


def test_format_writes_meta_properties_into_every_dir(tmp_path: Path) -> None:
    config = _write_config(tmp_path, node_id=7)
    cluster_id = _new_id()
    result = runner.invoke(app, ["storage", "format", "--config", str(config), "--cluster-id", cluster_id])
    assert result.exit_code == 0, result.stderr
    directory_ids = set()
    for name in ("logs-a", "logs-b", "meta"):
        meta = read_meta_properties(tmp_path / name)
        assert (meta.cluster_id, meta.node_id, meta.version) == (cluster_id, 7, 1)
        directory_ids.add(meta.directory_id)
        assert f"Formatted {tmp_path / name}" in result.stdout
    assert len(directory_ids) == 3  # every directory gets its own id


def test_format_refuses_an_already_formatted_dir_without_the_flag(tmp_path: Path) -> None:
    config = _write_config(tmp_path)
    cluster_id = _new_id()
    args = ["storage", "format", "--config", str(config), "--cluster-id", cluster_id]
    assert runner.invoke(app, args).exit_code == 0
    before = (tmp_path / "logs-a" / "meta.properties").read_bytes()
    _fails_with_one_line(args, "already formatted; use --ignore-formatted")
    result = runner.invoke(app, [*args, "--ignore-formatted"])
    assert result.exit_code == 0, result.stderr
    assert result.stdout.count("skipped") == 3
    assert (tmp_path / "logs-a" / "meta.properties").read_bytes() == before


def test_format_refuses_another_cluster_id_even_with_the_flag(tmp_path: Path) -> None:
    config = _write_config(tmp_path)
    first = _new_id()
    assert runner.invoke(app, ["storage", "format", "-c", str(config), "--cluster-id", first]).exit_code == 0
    line = _fails_with_one_line(
        ["storage", "format", "-c", str(config), "--cluster-id", _new_id(), "--ignore-formatted"],
        f"already formatted for cluster {first}",
    )
    assert "INCONSISTENT_CLUSTER_ID" in line
    assert read_meta_properties(tmp_path / "meta").cluster_id == first


def test_format_checks_every_dir_before_writing_any(tmp_path: Path) -> None:
    config = _write_config(tmp_path)
    (tmp_path / "other").mkdir()
    other_config = _write_config(tmp_path / "other", name="other.properties")
    # Only the metadata dir (checked last) belongs to another cluster: nothing may be written.
    other_text = other_config.read_text().replace(str(tmp_path / "other" / "meta"), str(tmp_path / "meta"))
    other_config.write_text(other_text)
    assert (
        runner.invoke(
            app, ["storage", "format", "-c", str(other_config), "--cluster-id", _new_id()]
        ).exit_code
        == 0
    )
    _fails_with_one_line(
        ["storage", "format", "-c", str(config), "--cluster-id", _new_id(), "--ignore-formatted"],
        "already formatted for cluster",
    )
    assert not (tmp_path / "logs-a").exists()
    assert not (tmp_path / "logs-b").exists()


def test_format_refuses_a_dir_of_another_node(tmp_path: Path) -> None:
    cluster_id = _new_id()
    assert (
        runner.invoke(
            app, ["storage", "format", "-c", str(_write_config(tmp_path, 1)), "--cluster-id", cluster_id]
        ).exit_code
        == 0
    )
    _fails_with_one_line(
        ["storage", "format", "-c", str(_write_config(tmp_path, 2)), "--cluster-id", cluster_id, "-g"],
        "formatted for node 1, but the config says node.id=2",
    )


@pytest.mark.parametrize("bad_id", ["not-a-uuid", "", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAA!"])
def test_format_refuses_a_cluster_id_that_does_not_parse(tmp_path: Path, bad_id: str) -> None:
    config = _write_config(tmp_path)
    _fails_with_one_line(["storage", "format", "-c", str(config), "--cluster-id", bad_id], "--cluster-id")
    assert not (tmp_path / "meta").exists()


def test_format_with_a_bad_config_names_the_key(tmp_path: Path) -> None:
    config = tmp_path / "bad.properties"
    config.write_text("process.roles=controller\nnode.id=x\n")
    _fails_with_one_line(["storage", "format", "-c", str(config), "--cluster-id", _new_id()], "node.id='x'")
    _fails_with_one_line(
        ["storage", "format", "-c", str(tmp_path / "missing"), "--cluster-id", _new_id()],
        "cannot read config",
    )


def test_info_reports_formatted_dirs_as_table_and_json(tmp_path: Path) -> None:
    config = _write_config(tmp_path, node_id=3)
    cluster_id = _new_id()
    assert (
        runner.invoke(app, ["storage", "format", "-c", str(config), "--cluster-id", cluster_id]).exit_code
        == 0
    )
    table = runner.invoke(app, ["storage", "info", "-c", str(config)])
    assert table.exit_code == 0, table.stderr
    assert table.stdout.count(cluster_id) == 3
    result = runner.invoke(app, ["storage", "info", "-c", str(config), "--json"])
    assert result.exit_code == 0
    info = json.loads(result.stdout)
    assert info["node_id"] == 3
    assert info["problems"] == []
    assert [(d["state"], d["cluster_id"], d["node_id"]) for d in info["dirs"]] == [
        ("formatted", cluster_id, 3)
    ] * 3
    assert [d["metadata_dir"] for d in info["dirs"]] == [False, False, True]


def test_info_on_unformatted_dirs_prints_them_and_fails(tmp_path: Path) -> None:
    config = _write_config(tmp_path)
    (tmp_path / "logs-a").mkdir()
    result = runner.invoke(app, ["storage", "info", "-c", str(config), "--json"])
    assert result.exit_code == 1
    states = [d["state"] for d in json.loads(result.stdout)["dirs"]]
    assert states == ["unformatted", "missing", "missing"]
    assert (
        result.stderr.strip()
        == f"error: {tmp_path / 'logs-a'} is unformatted (run `kraft storage format`) (and 2 more)"
    )


# --- kraft.cli.common --------------------------------------------------------------------------------


class _FakeRpcError(grpc.RpcError, grpc.Call):  # type: ignore[misc]
    """A grpc.Call-shaped error as the sync stubs raise it (only code() and details() are used)."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "failed to connect\nto all addresses"


@pytest.mark.parametrize(
    ("error", "expected"),
    [
        (KraftError(ErrorCode.NOT_CONTROLLER, "ask node 2"), "NOT_CONTROLLER: ask node 2"),
        (ConfigError("invalid config node.id='x': must be an integer >= 0"), "invalid config node.id='x'"),
        (FileNotFoundError(2, "No such file or directory", "/x/y"), "/x/y: No such file or directory"),
        (_FakeRpcError(), "UNAVAILABLE: failed to connect to all addresses"),
        (CliError("multi\nline   message"), "multi line message"),
    ],
)
def test_error_message_is_one_line(error: BaseException, expected: str) -> None:
    message = error_message(error)
    assert "\n" not in message
    assert message.startswith(expected)


def test_handle_errors_turns_expected_errors_into_exit_1(capsys: pytest.CaptureFixture[str]) -> None:
    @handle_errors
    def command(fail: bool) -> str:
        if fail:
            raise KraftError(ErrorCode.BROKER_NOT_AVAILABLE, "broker 101 is down")
        return "ok"

    assert command(False) == "ok"
    with pytest.raises(typer.Exit) as info:
        command(True)
    assert info.value.exit_code == 1
    assert capsys.readouterr().err == "error: BROKER_NOT_AVAILABLE: broker 101 is down\n"


def test_handle_errors_lets_programming_errors_through() -> None:
    @handle_errors
    def command() -> None:
        raise ZeroDivisionError("bug")

    with pytest.raises(ZeroDivisionError):
        command()


def test_parse_bootstrap_accepts_lists_and_ipv6() -> None:
    assert parse_bootstrap("h1:9093, h2:9094") == [HostPort("h1", 9093), HostPort("h2", 9094)]
    [v6] = parse_bootstrap("[::1]:9093")
    assert v6.target == "[::1]:9093"


@pytest.mark.parametrize("text", ["", " , ", "host", "host:", "host:0", "host:70000", "h:1:2", "[::1:9093"])
def test_parse_bootstrap_rejects_bad_entries(text: str) -> None:
    with pytest.raises(CliError, match="--bootstrap-server"):
        parse_bootstrap(text, option="--bootstrap-server")
