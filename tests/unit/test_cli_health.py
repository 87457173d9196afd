"""`kraft health`: grpc.health.v1 checks of nodes given on the command line or of a cluster directory."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from typer.testing import CliRunner

from kraft.cli.main import app
from kraft.cluster.manager import LocalCluster
from kraft.netutil import free_port
from kraft.observability.health import BROKER_SERVICE, RAFT_SERVICE

runner = CliRunner()

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def node() -> Iterator[tuple[str, health.HealthServicer]]:
    """A gRPC server with only grpc.health.v1 (a stand-in for a controller or broker listener)."""
    servicer = health.HealthServicer()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        server.stop(grace=None)


def test_a_serving_controller_is_healthy(node: tuple[str, health.HealthServicer]) -> None:
    target, servicer = node
    servicer.set(RAFT_SERVICE, SERVING)
    result = runner.invoke(app, ["health", "--bootstrap-controller", target, "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["healthy"] is True
    assert [(c["role"], c["service"], c["status"]) for c in answer["checks"]] == [
        ("controller", "", "SERVING"),
        ("controller", RAFT_SERVICE, "SERVING"),
    ]


def test_a_controller_without_a_leader_fails_the_check(node: tuple[str, health.HealthServicer]) -> None:
    target, servicer = node
    servicer.set(RAFT_SERVICE, NOT_SERVING)
    result = runner.invoke(app, ["health", "--bootstrap-controller", target])
    assert result.exit_code == 1, result.output
    assert RAFT_SERVICE in result.stdout and "NOT_SERVING" in result.stdout  # the table is still printed
    assert result.stderr.splitlines() == [
        f"error: 1 of 2 health checks not SERVING: {target} {RAFT_SERVICE} NOT_SERVING"
    ]


def test_a_broker_is_checked_for_its_own_service(node: tuple[str, health.HealthServicer]) -> None:
    target, _ = node  # BrokerService never set: the server does not know it
    result = runner.invoke(app, ["health", "--bootstrap-server", target, "--json"])
    assert result.exit_code == 1
    statuses = {c["service"]: c["status"] for c in json.loads(result.stdout)["checks"]}
    assert statuses == {"": "SERVING", BROKER_SERVICE: "SERVICE_UNKNOWN"}


def test_a_bare_target_checks_the_process_or_the_named_service(
    node: tuple[str, health.HealthServicer],
) -> None:
    target, servicer = node
    assert runner.invoke(app, ["health", "--target", target]).exit_code == 0
    servicer.set(BROKER_SERVICE, NOT_SERVING)
    named = runner.invoke(app, ["health", "--target", target, "--service", BROKER_SERVICE, "--json"])
    assert named.exit_code == 1
    [check] = json.loads(named.stdout)["checks"]
    assert (check["service"], check["status"]) == (BROKER_SERVICE, "NOT_SERVING")


def test_a_node_that_is_down_is_unreachable_within_the_timeout() -> None:
    target = f"127.0.0.1:{free_port()}"
    result = runner.invoke(app, ["health", "--target", target, "--timeout", "0.5", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout)["checks"][0]["status"] == "UNREACHABLE"


def test_every_node_of_a_cluster_dir_is_checked(tmp_path: Path) -> None:
    LocalCluster.create(tmp_path / "c", controllers=1, brokers=1, profile="fast")  # nothing started
    result = runner.invoke(app, ["health", "--dir", str(tmp_path / "c"), "--timeout", "0.5", "--json"])
    assert result.exit_code == 1
    checks = [(c["node"], c["service"], c["status"]) for c in json.loads(result.stdout)["checks"]]
    assert checks == [
        ("controller-1", "", "UNREACHABLE"),
        ("controller-1", RAFT_SERVICE, "UNREACHABLE"),
        ("broker-101", "", "UNREACHABLE"),
        ("broker-101", BROKER_SERVICE, "UNREACHABLE"),
    ]


def test_no_node_at_all_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KRAFT_CLUSTER_DIR", raising=False)
    result = runner.invoke(app, ["health"])
    assert result.exit_code == 1
    assert result.stderr.startswith("error: give --target, --bootstrap-controller")
