"""An admin command's ``request.timeout.ms`` (``--command-config``) limits one RPC, ``--timeout`` the whole
command (Kafka's admin client: ``request.timeout.ms`` and ``default.api.timeout.ms``).

A bootstrap controller that accepts the connection and never answers costs one attempt, and the command
goes on to the next address; before session 16 the CLI gave an attempt all of ``--timeout``, so one such
address failed the command.  The commands run in-process (``kraft.cli.main.run``) against small blocking
gRPC controllers in threads: one that answers, and black holes whose handlers wait (bounded) until the
test ends.  Nothing here asserts wall time: the black holes count what reached them."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import grpc
import pytest
from test_cli_usage import invoke

from kraft.cli import common
from kraft.cli.common import DEFAULT_REQUEST_TIMEOUT_MS, apply_command_config, request_timeout_s
from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc

HELD_AT_MOST_S = 30.0  # a black hole's handler lets go by then even if the test forgot to release it


class _Live(controller_pb2_grpc.ControllerServiceServicer):
    """The active controller of cluster ``kc``, holding topic ``orders``."""

    def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: Any
    ) -> cpb.DescribeClusterResponse:
        return cpb.DescribeClusterResponse(cluster_id="kc")

    def DescribeTopics(self, request: cpb.DescribeTopicsRequest, context: Any) -> cpb.DescribeTopicsResponse:
        partition = cpb.PartitionDescription(partition=0, leader=101, replicas=[101])
        return cpb.DescribeTopicsResponse(
            topics=[cpb.TopicDescription(name="orders", partitions=[partition])]
        )


class _BlackHole(controller_pb2_grpc.ControllerServiceServicer):
    """Accepts the connection and the request, never answers (a hung controller)."""

    def __init__(self, release: threading.Event) -> None:
        self.received = 0
        self._release = release

    def _hold(self, context: Any) -> NoReturn:
        self.received += 1
        self._release.wait(HELD_AT_MOST_S)
        context.abort(grpc.StatusCode.UNAVAILABLE, "released by the test")
        raise AssertionError("context.abort raises")

    def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: Any
    ) -> cpb.DescribeClusterResponse:
        return self._hold(context)

    def DescribeTopics(self, request: cpb.DescribeTopicsRequest, context: Any) -> cpb.DescribeTopicsResponse:
        return self._hold(context)


@dataclass
class _Servers:
    release: threading.Event
    servers: list[grpc.Server]

    def serve(self, servicer: controller_pb2_grpc.ControllerServiceServicer) -> str:
        server = grpc.server(ThreadPoolExecutor(max_workers=4))
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, server)
        port = server.add_insecure_port("127.0.0.1:0")
        server.start()
        self.servers.append(server)
        return f"127.0.0.1:{port}"

    def black_hole(self) -> tuple[str, _BlackHole]:
        hole = _BlackHole(self.release)  # type: ignore[abstract]
        return self.serve(hole), hole


@pytest.fixture(autouse=True)
def _first_address_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tests put the black hole first and count what reached it: the command starts there (the CLI's
    own start is random, tests/unit/test_cli_client_properties.py)."""
    monkeypatch.setattr(common, "bootstrap_start", lambda count: 0)


@pytest.fixture
def servers() -> Iterator[_Servers]:
    running = _Servers(threading.Event(), [])
    try:
        yield running
    finally:
        running.release.set()
        for server in running.servers:
            server.stop(None)


@pytest.fixture
def one_second_requests(tmp_path: Path) -> Path:
    path = tmp_path / "admin.properties"
    path.write_text("request.timeout.ms=1000\n", encoding="utf-8")
    return path


def test_a_black_holed_bootstrap_controller_costs_one_attempt(
    capsys: pytest.CaptureFixture[str], servers: _Servers, one_second_requests: Path
) -> None:
    hole_target, hole = servers.black_hole()
    live = servers.serve(_Live())  # type: ignore[abstract]
    bootstrap = f"{hole_target},{live}"
    argv = ["topic", "list", "--bootstrap-controller", bootstrap, "--json", "--timeout", "8"]

    outcome = invoke(capsys, *argv, "--command-config", str(one_second_requests))

    assert outcome.code == 0, outcome
    assert '"name": "orders"' in outcome.out
    assert hole.received == 1, "one attempt of 1 s, then the second controller (which is now the active one)"


def test_when_every_bootstrap_controller_is_black_holed_the_command_fails_in_one_line(
    capsys: pytest.CaptureFixture[str], servers: _Servers, one_second_requests: Path
) -> None:
    (first, first_hole), (second, second_hole) = servers.black_hole(), servers.black_hole()
    argv = ["topic", "list", "--bootstrap-controller", f"{first},{second}", "--timeout", "2.5"]

    outcome = invoke(capsys, *argv, "--command-config", str(one_second_requests))

    assert outcome.code == 1 and outcome.out == "", outcome
    lines = outcome.err.splitlines()
    assert len(lines) == 1, outcome.err
    assert lines[0].startswith(
        f"error: {ErrorCode.NOT_CONTROLLER.name}: no active controller answered within 2.5s, each attempt at "
        "most 1s: "
    ), lines[0]
    assert "DEADLINE_EXCEEDED" in lines[0]
    assert first_hole.received >= 1 and second_hole.received >= 1, "both addresses were asked"


def test_request_timeout_ms_is_checked_and_each_command_starts_from_the_default(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, one_second_requests: Path
) -> None:
    bad = tmp_path / "bad.properties"
    bad.write_text("request.timeout.ms=soon\n", encoding="utf-8")
    outcome = invoke(
        capsys, "topic", "list", "--bootstrap-controller", "127.0.0.1:1", "--command-config", str(bad)
    )
    assert outcome.code == 1
    assert outcome.err == (
        "error: invalid config request.timeout.ms='soon': must be a positive number of ms up to 2147483647 "
        f"(in {bad})\n"
    )

    apply_command_config(one_second_requests)
    assert request_timeout_s() == 1.0
    apply_command_config(None)  # the next command, without --command-config
    assert request_timeout_s() == DEFAULT_REQUEST_TIMEOUT_MS / 1000
