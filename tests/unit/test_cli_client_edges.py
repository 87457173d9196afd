"""The CLI's client rough edges, each one ``error:`` line and exit 1: a bootstrap list where nothing answers
(``quorum describe``, ``produce``: after 3 s, naming the list, as the admin commands), a timeout above
Kafka's INT range, an unreadable ``client.properties`` in a cluster directory; and the broker commands'
request timeout taken from the client properties, as the admin commands'.  Every address refuses
connections (a free port); commands run in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_cli_usage import assert_one_error_line, invoke

from kraft.cli import common
from kraft.client.channel import PLAINTEXT_SECURITY, set_default_security
from kraft.cluster.manager import LocalCluster
from kraft.netutil import free_port


@pytest.fixture(autouse=True)
def _clean_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KRAFT_CLUSTER_DIR", raising=False)
    monkeypatch.setattr(common, "bootstrap_start", lambda count: 0)  # the list as given, in the messages
    try:
        yield
    finally:
        set_default_security(PLAINTEXT_SECURITY)
        common.apply_command_config(None)


def _refusing() -> str:
    return f"127.0.0.1:{free_port()},127.0.0.1:{free_port()}"


def test_quorum_describe_names_an_unreachable_bootstrap_list(capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = _refusing()
    outcome = invoke(
        capsys, "quorum", "describe", "--bootstrap-controller", bootstrap, "--status", "--timeout", "30"
    )
    assert_one_error_line(
        outcome, f"no controller reachable at {bootstrap} for 3s", "is --bootstrap-controller right"
    )


def test_produce_names_an_unreachable_bootstrap_list(capsys: pytest.CaptureFixture[str]) -> None:
    bootstrap = _refusing()
    argv = ["produce", "--bootstrap-server", bootstrap, "--topic", "t", "--value", "x", "--timeout", "30"]
    outcome = invoke(capsys, *argv)
    assert_one_error_line(
        outcome, f"no broker reachable at {bootstrap} for 3s", "is --bootstrap-server right"
    )


def test_the_broker_commands_take_request_timeout_ms_cut_to_their_timeout(tmp_path: Path) -> None:
    assert common.broker_client(["a:1"], 30.0).request_timeout_s == common.DEFAULT_REQUEST_TIMEOUT_MS / 1000
    own = tmp_path / "client.properties"
    own.write_text("request.timeout.ms=300\n", encoding="utf-8")
    common.apply_command_config(own)
    assert common.broker_client(["a:1"], 30.0).request_timeout_s == 0.3
    assert common.broker_client(["a:1"], 0.2).request_timeout_s == 0.2


def test_a_timeout_above_kafkas_int_range_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    own = tmp_path / "admin.properties"
    own.write_text("request.timeout.ms=2147483648\n", encoding="utf-8")
    outcome = invoke(
        capsys, "topic", "list", "--bootstrap-controller", _refusing(), "--command-config", str(own)
    )
    assert_one_error_line(
        outcome, "request.timeout.ms='2147483648': must be a positive number of ms up to 2147483647"
    )
    own.write_text("request.timeout.ms=2147483647\ndefault.api.timeout.ms=2147483647\n", encoding="utf-8")
    argv = [
        "topic",
        "list",
        "--bootstrap-controller",
        _refusing(),
        "--command-config",
        str(own),
        "--timeout",
        "0.2",
    ]
    assert_one_error_line(invoke(capsys, *argv), "no active controller answered within 0.2s")


def test_an_unreadable_client_properties_in_a_cluster_dir_is_named_as_such(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    LocalCluster.create(tmp_path / "kc", controllers=1, brokers=1)
    (tmp_path / "kc" / "client.properties").mkdir()
    outcome = invoke(capsys, "topic", "list", "--cluster-dir", str(tmp_path / "kc"))
    assert_one_error_line(outcome, f"cannot read client properties {tmp_path / 'kc' / 'client.properties'}")
