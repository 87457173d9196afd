"""The CLI's client rough edges, each one ``error:`` line and exit 1: a bootstrap list where nothing answers
(``quorum describe``, ``produce``: after 3 s, naming the list, as the admin commands), a timeout above
Kafka's INT range, an unreadable ``client.properties`` in a cluster directory; the broker commands' request
timeout taken from the client properties, as the admin commands'; ``features describe`` giving a hung
controller one ``request.timeout.ms`` (not the whole ``--timeout``) and starting at the random address;
``api-versions`` asking every node at once with that limit.  Unreachable addresses refuse connections (a
free port); commands run in-process."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
from test_cli_usage import assert_one_error_line, invoke

from kraft.cli import common
from kraft.client.channel import PLAINTEXT_SECURITY, set_default_security
from kraft.cluster.manager import LocalCluster
from kraft.netutil import free_port
from kraft.v1 import common_pb2, controller_pb2_grpc


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


class _ApiVersions(controller_pb2_grpc.ControllerServiceServicer):
    """A controller's ApiVersions; ``hole``: takes the request and answers only after its deadline (a hung
    process; at most 10 s).  Records the deadline each request came with."""

    def __init__(self, node_id: int, *, hole: bool = False) -> None:
        self.node_id = node_id
        self.hole = hole
        self.deadlines: list[float] = []

    def ApiVersions(
        self, request: common_pb2.ApiVersionsRequest, context: Any
    ) -> common_pb2.ApiVersionsResponse:
        remaining = context.time_remaining()
        self.deadlines.append(remaining if remaining is not None else float("inf"))
        if self.hole:
            time.sleep(min(self.deadlines[-1] + 0.5, 10.0))  # past the deadline: the client gives up
        return common_pb2.ApiVersionsResponse(node_id=self.node_id)


@pytest.fixture
def hole_then_live() -> Iterator[tuple[_ApiVersions, _ApiVersions, str]]:
    controllers = [_ApiVersions(1, hole=True), _ApiVersions(2)]  # type: ignore[abstract]
    servers, targets = [], []
    for servicer in controllers:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)
        targets.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        server.start()
        servers.append(server)
    try:
        yield controllers[0], controllers[1], ",".join(targets)
    finally:
        for server in servers:
            server.stop(None)


def test_features_describe_gives_a_hung_controller_one_request_timeout_not_the_whole_timeout(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, hole_then_live: tuple[_ApiVersions, _ApiVersions, str]
) -> None:
    hole, live, bootstrap = hole_then_live
    own = tmp_path / "admin.properties"
    own.write_text("request.timeout.ms=300\n", encoding="utf-8")
    argv = ["features", "describe", "--bootstrap-controller", bootstrap, "--json", "--timeout", "20"]
    outcome = invoke(capsys, *argv, "--command-config", str(own))
    assert outcome.code == 0, outcome
    assert json.loads(outcome.out)["controller_id"] == 2
    assert len(hole.deadlines) == 1 and hole.deadlines[0] <= 0.3, hole.deadlines  # not the 20 s --timeout
    assert len(live.deadlines) == 1


def test_features_describe_starts_at_the_random_bootstrap_address(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    hole_then_live: tuple[_ApiVersions, _ApiVersions, str],
) -> None:
    hole, live, bootstrap = hole_then_live
    monkeypatch.setattr(common, "bootstrap_start", lambda count: 1)
    outcome = invoke(capsys, "features", "describe", "--bootstrap-controller", bootstrap, "--json")
    assert outcome.code == 0, outcome
    assert (len(hole.deadlines), len(live.deadlines)) == (0, 1)


def test_api_versions_gives_a_hung_node_one_request_timeout_and_reports_the_others(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, hole_then_live: tuple[_ApiVersions, _ApiVersions, str]
) -> None:
    hole, live, bootstrap = hole_then_live
    own = tmp_path / "admin.properties"
    own.write_text("request.timeout.ms=300\n", encoding="utf-8")
    argv = ["api-versions", "--bootstrap-controller", bootstrap, "--json", "--timeout", "20"]
    outcome = invoke(capsys, *argv, "--command-config", str(own))
    assert_one_error_line(outcome, "1 of 2 nodes did not answer", "DEADLINE_EXCEEDED")
    assert [node["node_id"] for node in json.loads(outcome.out)] == [None, 2]
    assert len(hole.deadlines) == 1 and hole.deadlines[0] <= 0.3, hole.deadlines  # not the 20 s --timeout
    assert len(live.deadlines) == 1
