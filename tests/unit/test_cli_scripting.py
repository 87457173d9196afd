"""Scripting contracts of the `kraft` CLI that need no cluster: ``--json`` on the write commands,
``--verbose`` retries, errors that name what is wrong at once, the consume hint, and help texts.

Commands run in-process (``kraft.cli.main.run``) against small blocking gRPC servers in threads (the CLI
runs its own event loop), or a cluster directory whose nodes were never started."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

import kraft.cli.main as cli_main
from kraft.client.rotation import UNREACHABLE_TIMEOUT_S
from kraft.cluster.manager import LocalCluster
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import broker_pb2 as bpb
from kraft.v1 import broker_pb2_grpc, controller_pb2_grpc
from kraft.v1 import controller_pb2 as cpb
from kraft.v1.common_pb2 import Endpoint, NodeRef


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


CLUSTER_ID = "scripting-cluster"


class _Controller(controller_pb2_grpc.ControllerServiceServicer):
    """The first write of each kind is applied and answered "outcome unknown" (deposed after append)."""

    def __init__(self) -> None:
        self.topics: dict[str, int] = {}
        self.deposed_once: set[str] = set()
        self.calls: list[str] = []

    def _deposed(self, what: str) -> bool:
        self.calls.append(what)
        if what in self.deposed_once:
            return False
        self.deposed_once.add(what)
        return True

    def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: Any
    ) -> cpb.DescribeClusterResponse:
        # Where the CLI learns the cluster id it must send (controllers refuse an empty one).
        return cpb.DescribeClusterResponse(cluster_id=CLUSTER_ID)

    def CreateTopics(self, request: cpb.CreateTopicsRequest, context: Any) -> cpb.CreateTopicsResponse:
        assert request.cluster_id == CLUSTER_ID
        topic = request.topics[0]
        exists = topic.name in self.topics
        self.topics.setdefault(topic.name, topic.num_partitions)
        if self._deposed("create"):
            return cpb.CreateTopicsResponse(
                error_code=ErrorCode.REQUEST_TIMED_OUT,
                error_message="lost leadership",
                controller=NodeRef(node_id=-1),
            )
        code = ErrorCode.TOPIC_ALREADY_EXISTS if exists else ErrorCode.NONE
        return cpb.CreateTopicsResponse(topics=[cpb.CreatableTopicResult(name=topic.name, error_code=code)])

    def DescribeTopics(self, request: cpb.DescribeTopicsRequest, context: Any) -> cpb.DescribeTopicsResponse:
        return cpb.DescribeTopicsResponse(
            topics=[
                cpb.TopicDescription(
                    name=name,
                    topic_id=f"id-{name}",
                    partitions=[
                        cpb.PartitionDescription(partition=p, leader=1, replicas=[1])
                        for p in range(self.topics[name])
                    ],
                )
                for name in request.names
                if name in self.topics
            ]
        )

    def DeleteTopics(self, request: cpb.DeleteTopicsRequest, context: Any) -> cpb.DeleteTopicsResponse:
        name = request.names[0]
        gone = self.topics.pop(name, None) is None
        code = ErrorCode.UNKNOWN_TOPIC_OR_PARTITION if gone else ErrorCode.NONE
        return cpb.DeleteTopicsResponse(topics=[cpb.DeletableTopicResult(name=name, error_code=code)])

    def UnregisterBroker(self, request: Any, context: Any) -> cpb.UnregisterBrokerResponse:
        return cpb.UnregisterBrokerResponse()

    def ShutdownBroker(self, request: Any, context: Any) -> cpb.ShutdownBrokerResponse:
        return cpb.ShutdownBrokerResponse(leaderships_remaining=4)


class _Broker(broker_pb2_grpc.BrokerServiceServicer):
    """Broker 1 leads ``orders``-0, which is empty at offset 5."""

    def __init__(self, port: int) -> None:
        self.port = port

    def Metadata(self, request: bpb.BrokerMetadataRequest, context: Any) -> bpb.BrokerMetadataResponse:
        return bpb.BrokerMetadataResponse(
            brokers=[
                bpb.BrokerMetadataResponse.Broker(
                    broker_id=1, endpoints=[Endpoint(host="127.0.0.1", port=self.port)]
                )
            ],
            topics=[
                bpb.BrokerMetadataResponse.Topic(
                    name="orders", partitions=[bpb.BrokerMetadataResponse.Partition(partition=0, leader=1)]
                )
            ],
        )

    def ListOffsets(self, request: Any, context: Any) -> bpb.ListOffsetsResponse:
        return bpb.ListOffsetsResponse(offset=5)

    def Fetch(self, request: bpb.BrokerFetchRequest, context: Any) -> bpb.BrokerFetchResponse:
        return bpb.BrokerFetchResponse(high_watermark=5)

    def DescribeBroker(self, request: Any, context: Any) -> bpb.DescribeBrokerResponse:
        return bpb.DescribeBrokerResponse(broker_id=1)


def _serve(register: Callable[[grpc.Server, int], None]) -> tuple[grpc.Server, str]:
    port = free_port()
    server = grpc.server(ThreadPoolExecutor(max_workers=4))
    register(server, port)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.fixture
def controller() -> Iterator[tuple[_Controller, str]]:
    servicer = _Controller()  # type: ignore[abstract]
    server, target = _serve(
        lambda s, _: controller_pb2_grpc.add_ControllerServiceServicer_to_server(servicer, s)
    )
    try:
        yield servicer, target
    finally:
        server.stop(None)


@pytest.fixture
def broker() -> Iterator[str]:
    server, target = _serve(
        lambda s, port: broker_pb2_grpc.add_BrokerServiceServicer_to_server(_Broker(port), s)  # type: ignore[abstract]
    )
    try:
        yield target
    finally:
        server.stop(None)


# --- --json and --verbose on the write commands ---------------------------------------------------------


def test_topic_create_json_after_an_unknown_outcome_is_created_with_the_retry_shown(
    capsys: pytest.CaptureFixture[str], controller: tuple[_Controller, str]
) -> None:
    servicer, target = controller
    outcome = invoke(
        capsys,
        "topic",
        "create",
        "orders",
        "-p",
        "2",
        "-r",
        "1",
        "--bootstrap-controller",
        target,
        "--json",
        "--verbose",
    )
    assert outcome.code == 0, outcome
    assert json.loads(outcome.out) == {
        "name": "orders",
        "result": "created",
        "topic_id": "id-orders",
        "partitions": 2,
        "replication_factor": 1,
    }
    assert servicer.calls == ["create", "create"]
    retries = [line for line in outcome.err.splitlines() if line.startswith("retry: ")]
    assert any("outcome unknown" in line for line in retries), outcome.err
    assert any("created by the first attempt" in line for line in retries), outcome.err


def test_without_verbose_retries_are_silent(
    capsys: pytest.CaptureFixture[str], controller: tuple[_Controller, str]
) -> None:
    _, target = controller
    outcome = invoke(
        capsys, "topic", "create", "orders", "-p", "1", "-r", "1", "--bootstrap-controller", target
    )
    assert outcome.code == 0 and outcome.err == "", outcome
    assert outcome.out.startswith("topic orders created: id id-orders")


def test_topic_delete_broker_unregister_and_shutdown_print_json(
    capsys: pytest.CaptureFixture[str], controller: tuple[_Controller, str]
) -> None:
    servicer, target = controller
    servicer.topics["old"] = 1
    deleted = invoke(capsys, "topic", "delete", "old", "--bootstrap-controller", target, "--json")
    assert json.loads(deleted.out) == {"name": "old", "result": "deleted"}
    missing = invoke(
        capsys, "topic", "delete", "old", "--if-exists", "--bootstrap-controller", target, "--json"
    )
    assert json.loads(missing.out) == {"name": "old", "result": "not_found"}
    unregistered = invoke(capsys, "broker", "unregister", "103", "--bootstrap-controller", target, "--json")
    assert json.loads(unregistered.out) == {"id": 103, "result": "unregistered"}
    shutdown = invoke(capsys, "broker", "shutdown", "102", "--bootstrap-controller", target, "--json")
    assert json.loads(shutdown.out) == {
        "id": 102,
        "result": "controlled_shutdown",
        "leaderships_remaining": 4,
    }


# --- errors that say what is wrong, at once --------------------------------------------------------------


def test_a_dead_bootstrap_controller_fails_within_seconds_naming_the_address(
    capsys: pytest.CaptureFixture[str],
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    outcome = invoke(capsys, "topic", "list", "--bootstrap-controller", dead)
    assert outcome.code == 1 and len(outcome.err.splitlines()) == 1, outcome
    # The unreachable path (nothing answered for UNREACHABLE_TIMEOUT_S), not the 15 s call budget's
    # "no active controller answered within 15s".
    assert outcome.err.startswith(f"error: no controller reachable at {dead} for {UNREACHABLE_TIMEOUT_S:g}s")
    assert "controller -1" not in outcome.err


def test_a_broker_given_as_bootstrap_controller_is_named_a_broker(
    capsys: pytest.CaptureFixture[str], broker: str
) -> None:
    outcome = invoke(capsys, "broker", "list", "--bootstrap-controller", broker)
    assert outcome.code == 1, outcome
    assert outcome.err == (
        f"error: {broker} is a broker, not a controller: --bootstrap-controller takes the controllers' "
        "addresses (controller.quorum.voters)\n"
    )


def test_consume_from_the_latest_offset_says_why_nothing_was_printed(
    capsys: pytest.CaptureFixture[str], broker: str
) -> None:
    outcome = invoke(capsys, "consume", "--bootstrap-server", broker, "-t", "orders", "--idle-timeout", "0.2")
    assert outcome.code == 0 and outcome.out == "", outcome
    assert outcome.err.splitlines() == [
        "no new records in orders-0 after its latest offset 5 within --idle-timeout 0.2s; use "
        "--from-beginning or --offset N to read older ones"
    ]
    explicit = invoke(
        capsys,
        "consume",
        "--bootstrap-server",
        broker,
        "-t",
        "orders",
        "--offset",
        "5",
        "--idle-timeout",
        "0.2",
    )
    assert explicit.code == 0 and explicit.err == "", "an explicit start needs no hint"


# --- cluster stop/down --json on a cluster whose nodes are not running -----------------------------------


def test_cluster_stop_and_down_print_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    root = tmp_path / "kc"
    LocalCluster.create(root, controllers=1, brokers=1)
    stopped = invoke(capsys, "cluster", "stop", "101", "--dir", str(root), "--json")
    assert stopped.code == 0, stopped
    assert json.loads(stopped.out) == {"nodes": [{"name": "broker-101", "outcome": "not running"}]}
    down = invoke(capsys, "cluster", "down", "--dir", str(root), "--json", "--purge")
    assert down.code == 0, down
    assert json.loads(down.out) == {
        "nodes": [
            {"name": "broker-101", "outcome": "not running"},
            {"name": "controller-1", "outcome": "not running"},
        ],
        "removed": str(root),
    }
    assert not root.exists()


# --- help texts ----------------------------------------------------------------------------------------


def test_topic_help_lists_elect_leaders(capsys: pytest.CaptureFixture[str]) -> None:
    top = invoke(capsys, "--help")
    topic_line = next(line for line in top.out.splitlines() if line.lstrip("│ ").startswith("topic "))
    assert "elect-leaders" in topic_line, topic_line


def test_cluster_up_help_shows_the_defaults(capsys: pytest.CaptureFixture[str]) -> None:
    outcome = invoke(capsys, "cluster", "up", "--help")
    text = " ".join(outcome.out.split())
    assert outcome.code == 0
    assert "Controllers ." not in text and "Brokers ." not in text
    assert "Controllers (default 3" in text and "Brokers (default 3" in text
