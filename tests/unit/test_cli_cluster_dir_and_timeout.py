"""``--cluster-dir`` / ``KRAFT_CLUSTER_DIR`` on produce, consume and quorum add-/remove-controller, and
``--timeout`` (seconds) on quorum describe / add-controller / remove-controller beside ``--timeout-ms``.

Commands run in-process (``kraft.cli.main.run``) against a cluster directory whose nodes never started,
or whose broker port is served by a small blocking gRPC broker in threads."""

from __future__ import annotations

from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import kraft.cli.main as cli_main
from kraft.cli.common import CliError, timeout_seconds
from kraft.cluster.manager import LocalCluster
from kraft.cluster.spec import NodeRole
from kraft.v1 import broker_pb2 as bpb
from kraft.v1 import broker_pb2_grpc
from kraft.v1.common_pb2 import Endpoint

DIRECTORY_ID = "8xCd4lEkRcOvtdUSbkVc2g"


@dataclass(frozen=True)
class Outcome:
    code: int
    out: str
    err: str


def invoke(capsys: pytest.CaptureFixture[str], *args: str) -> Outcome:
    capsys.readouterr()
    code = cli_main.run(list(args))
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


def one_error_line(outcome: Outcome) -> str:
    assert outcome.code == 1 and outcome.out == "", outcome
    lines = outcome.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), outcome.err
    return lines[0]


@pytest.fixture(autouse=True)
def _no_cluster_dir_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KRAFT_CLUSTER_DIR", raising=False)


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """A one-controller, one-broker cluster directory; nothing runs."""
    LocalCluster.create(tmp_path / "kc", controllers=1, brokers=1)
    return tmp_path / "kc"


def _target(cluster: Path, role: NodeRole) -> str:
    return next(node.target for node in LocalCluster.open(cluster).spec.nodes if node.role is role)


class _Broker(broker_pb2_grpc.BrokerServiceServicer):
    """Leads ``orders``-0, which holds one record at offset 5."""

    def __init__(self, port: int) -> None:
        self.port = port

    def Metadata(self, request: bpb.BrokerMetadataRequest, context: Any) -> bpb.BrokerMetadataResponse:
        return bpb.BrokerMetadataResponse(
            brokers=[
                bpb.BrokerMetadataResponse.Broker(
                    broker_id=101, endpoints=[Endpoint(host="127.0.0.1", port=self.port)]
                )
            ],
            topics=[
                bpb.BrokerMetadataResponse.Topic(
                    name="orders", partitions=[bpb.BrokerMetadataResponse.Partition(partition=0, leader=101)]
                )
            ],
        )

    def Fetch(self, request: bpb.BrokerFetchRequest, context: Any) -> bpb.BrokerFetchResponse:
        records = [bpb.BrokerRecord(offset=5, value=b"hello", has_value=True)] if request.offset <= 5 else []
        return bpb.BrokerFetchResponse(high_watermark=6, records=records)


@pytest.fixture
def serving_broker(cluster: Path) -> Iterator[Path]:
    """The cluster directory, its broker's address served by :class:`_Broker`."""
    port = int(_target(cluster, NodeRole.BROKER).rsplit(":", 1)[1])
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    broker_pb2_grpc.add_BrokerServiceServicer_to_server(_Broker(port), server)  # type: ignore[abstract]
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    try:
        yield cluster
    finally:
        server.stop(None)


# --- consume / produce -------------------------------------------------------------------------------


CONSUME_ARGS = ["consume", "-t", "orders", "--offset", "5", "--max-records", "1"]


def test_consume_finds_the_brokers_in_the_cluster_dir(
    capsys: pytest.CaptureFixture[str], serving_broker: Path
) -> None:
    outcome = invoke(capsys, *CONSUME_ARGS, "--cluster-dir", str(serving_broker))
    assert outcome == Outcome(0, "hello\n", "")


def test_consume_takes_the_cluster_dir_from_kraft_cluster_dir(
    capsys: pytest.CaptureFixture[str], serving_broker: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KRAFT_CLUSTER_DIR", str(serving_broker))
    assert invoke(capsys, *CONSUME_ARGS) == Outcome(0, "hello\n", "")


@pytest.mark.parametrize("command", ["consume", "produce"])
def test_without_bootstrap_or_cluster_dir_the_command_names_both(
    capsys: pytest.CaptureFixture[str], command: str
) -> None:
    # produce checks this before it reads stdin (which would wait for input that goes nowhere).
    line = one_error_line(invoke(capsys, command, "-t", "orders"))
    assert line.startswith(f"error: kraft {command}: Missing option '--bootstrap-server'"), line
    assert "--cluster-dir" in line and "KRAFT_CLUSTER_DIR" in line


def test_produce_with_a_cluster_dir_that_is_not_one_is_one_line(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    line = one_error_line(
        invoke(capsys, "produce", "-t", "orders", "-v", "x", "--cluster-dir", str(tmp_path))
    )
    assert "no cluster in" in line


# --- quorum: --cluster-dir and --timeout --------------------------------------------------------------


def test_timeout_seconds_and_timeout_ms_are_one_wait() -> None:
    assert timeout_seconds(None, None, 10.0) == 10.0
    assert timeout_seconds(2.5, None, 10.0) == 2.5
    assert timeout_seconds(None, 300, 10.0) == 0.3
    with pytest.raises(CliError, match="not both"):
        timeout_seconds(1.0, 1000, 10.0)


def _passed_timeouts(monkeypatch: pytest.MonkeyPatch, name: str) -> list[float]:
    """The ``timeout_s`` each call of ``kraft.cli.quorum.<name>`` was given (the real call still runs)."""
    import kraft.cli.quorum as cli_quorum

    real = getattr(cli_quorum, name)
    seen: list[float] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        seen.append(
            kwargs["timeout_s"] if "timeout_s" in kwargs else args[3 if name == "remove_controller" else 1]
        )
        return real(*args, **kwargs)

    monkeypatch.setattr(cli_quorum, name, recording)
    return seen


def test_quorum_describe_waits_for_timeout_seconds(
    capsys: pytest.CaptureFixture[str], cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passed = _passed_timeouts(monkeypatch, "describe_quorum")
    outcome = invoke(
        capsys, "quorum", "describe", "--status", "--cluster-dir", str(cluster), "--timeout", "0.3"
    )
    assert passed == [0.3], "the client waits --timeout, not the 10 s default"
    line = one_error_line(outcome)
    assert "within 0.3 s" in line and _target(cluster, NodeRole.CONTROLLER) in line, line


def test_quorum_describe_refuses_both_timeouts(capsys: pytest.CaptureFixture[str]) -> None:
    argv = [
        "quorum",
        "describe",
        "--status",
        "--bootstrap-controller",
        "h:1",
        "--timeout",
        "1",
        "--timeout-ms",
        "500",
    ]
    assert (
        one_error_line(invoke(capsys, *argv)) == "error: give --timeout (seconds) or --timeout-ms, not both"
    )


def test_remove_controller_asks_the_controllers_of_the_cluster_dir(
    capsys: pytest.CaptureFixture[str], cluster: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    passed = _passed_timeouts(monkeypatch, "remove_controller")
    argv = ["quorum", "remove-controller", "--controller-id", "3", "--controller-directory-id", DIRECTORY_ID]
    line = one_error_line(invoke(capsys, *argv, "--cluster-dir", str(cluster), "--timeout", "0.3"))
    assert passed == [0.3], "the change waits --timeout, not the 30 s default"
    assert _target(cluster, NodeRole.CONTROLLER) in line, line


@pytest.mark.parametrize(
    "argv",
    [
        ["remove-controller", "--controller-id", "3", "--controller-directory-id", DIRECTORY_ID],
        ["add-controller", "--command-config", "controller-2.properties"],
    ],
    ids=["remove", "add"],
)
def test_voter_changes_without_bootstrap_or_cluster_dir_name_both(
    capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    line = one_error_line(invoke(capsys, "quorum", *argv))
    assert line.startswith(f"error: kraft quorum {argv[0]}: Missing option '--bootstrap-controller'"), line
    assert "--cluster-dir" in line


def test_add_controller_resolves_the_cluster_dir_before_reading_the_joiner(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    argv = ["quorum", "add-controller", "--command-config", str(tmp_path / "c2.properties")]
    line = one_error_line(invoke(capsys, *argv, "--cluster-dir", str(tmp_path / "none")))
    assert "no cluster in" in line, line
