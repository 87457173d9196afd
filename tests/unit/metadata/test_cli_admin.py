"""`kraft broker describe` (broker-side state) and `kraft topic elect-leaders` against in-process fakes:
a ControllerService that answers DescribeCluster / DescribeTopics / ElectLeaders and a BrokerService
that answers DescribeBroker, both on real gRPC servers on free ports."""

from __future__ import annotations

import json
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from typer.testing import CliRunner

from kraft.cli.broker import UNKNOWN_STATE, client_endpoint
from kraft.cli.common import CliError
from kraft.cli.main import app
from kraft.cli.topic import (
    ElectionType,
    elect_request,
    election_failures,
    only_under_replicated,
    topic_json,
)
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import broker_pb2, broker_pb2_grpc
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc as cpb_grpc
from kraft.v1.common_pb2 import Endpoint

runner = CliRunner()
CLUSTER = "cli-cluster"


@dataclass
class FakeControllerService(cpb_grpc.ControllerServiceServicer):
    broker_port: int
    elect_results: list[cpb.TopicElectionResults] = field(default_factory=list)
    elect_requests: list[cpb.ElectLeadersRequest] = field(default_factory=list)
    elect_error: tuple[ErrorCode, str] | None = None  # a request-level error to answer with
    predates_election_type: bool = False  # an older controller: ignores election_type, runs PREFERRED
    topics: list[cpb.TopicDescription] | None = None  # None: one fully in-sync topic "orders"
    broker_port2: int = 0  # a second broker (2) registered but fenced

    def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: Any
    ) -> cpb.DescribeClusterResponse:
        endpoint = Endpoint(name="PLAINTEXT", host="127.0.0.1", port=self.broker_port)
        broker = cpb.BrokerDescription(broker_id=1, broker_epoch=5, state="ACTIVE", endpoints=[endpoint])
        fenced = cpb.BrokerDescription(broker_id=2, broker_epoch=6, state="FENCED")
        return cpb.DescribeClusterResponse(cluster_id=CLUSTER, controller_id=0, brokers=[broker, fenced])

    def DescribeTopics(self, request: cpb.DescribeTopicsRequest, context: Any) -> cpb.DescribeTopicsResponse:
        if self.topics is not None:
            wanted = set(request.names)
            return cpb.DescribeTopicsResponse(
                topics=[t for t in self.topics if not wanted or t.name in wanted]
            )
        partition = cpb.PartitionDescription(partition=0, leader=1, leader_epoch=2, replicas=[1], isr=[1])
        topic = cpb.TopicDescription(name="orders", topic_id="T", partitions=[partition])
        return cpb.DescribeTopicsResponse(topics=[topic])

    def ElectLeaders(self, request: cpb.ElectLeadersRequest, context: Any) -> cpb.ElectLeadersResponse:
        self.elect_requests.append(request)
        if self.elect_error is not None:
            code, message = self.elect_error
            return cpb.ElectLeadersResponse(error_code=code.value, error_message=message)
        ran = 0 if self.predates_election_type else request.election_type
        return cpb.ElectLeadersResponse(topics=self.elect_results, election_type=ran)


@dataclass
class FakeBrokerService(broker_pb2_grpc.BrokerServiceServicer):
    state: str = "PENDING_CONTROLLED_SHUTDOWN"
    cluster_ids: list[str] = field(default_factory=list)
    partitions: list[broker_pb2.DescribeBrokerResponse.LocalPartition] = field(default_factory=list)
    offline_log_dirs: list[str] = field(default_factory=list)

    def DescribeBroker(
        self, request: broker_pb2.DescribeBrokerRequest, context: Any
    ) -> broker_pb2.DescribeBrokerResponse:
        self.cluster_ids.append(request.cluster_id)
        return broker_pb2.DescribeBrokerResponse(
            broker_id=1,
            state=self.state,
            cluster_id=CLUSTER,
            partitions=self.partitions,
            offline_log_dirs=self.offline_log_dirs,
        )


@dataclass
class Fakes:
    controller: FakeControllerService
    broker: FakeBrokerService | None
    bootstrap: str


def _serve(servicer: Any, add: Any, port: int) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    add(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    return server


@pytest.fixture
def fakes(request: pytest.FixtureRequest) -> Iterator[Fakes]:
    """A fake controller and, unless parametrized indirectly with False, the fake broker it points at."""
    broker_port = free_port()
    controller_port = free_port()
    # The generated servicer bases declare every RPC abstract; the fakes implement only what the CLI calls.
    controller = FakeControllerService(broker_port)  # type: ignore[abstract]
    broker = FakeBrokerService() if getattr(request, "param", True) else None  # type: ignore[abstract]
    servers = [_serve(controller, cpb_grpc.add_ControllerServiceServicer_to_server, controller_port)]
    if broker is not None:
        servers.append(_serve(broker, broker_pb2_grpc.add_BrokerServiceServicer_to_server, broker_port))
    try:
        yield Fakes(controller, broker, f"127.0.0.1:{controller_port}")
    finally:
        for server in servers:
            server.stop(grace=None).wait(5)


def test_broker_describe_shows_the_broker_side_state(fakes: Fakes) -> None:
    args = ["broker", "describe", "1", "--bootstrap-controller", fakes.bootstrap]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    described = json.loads(result.stdout)
    assert described["state"] == "ACTIVE"
    assert described["broker_state"] == "PENDING_CONTROLLED_SHUTDOWN"
    assert fakes.broker is not None and fakes.broker.cluster_ids == [CLUSTER]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "BrokerState" in table.stdout and "PENDING_CONTROLLED_SHUTDOWN" in table.stdout
    assert described["offline_log_dirs"] == []
    assert "OfflineLogDirs" in table.stdout and "none" in table.stdout


def test_broker_describe_shows_offline_log_dirs_with_their_errors(fakes: Fakes) -> None:
    assert fakes.broker is not None
    fakes.broker.offline_log_dirs = ["/data/d1: FatalStorageError: fsync of d1/orders-0 failed (EIO)"]
    args = ["broker", "describe", "1", "--bootstrap-controller", fakes.bootstrap]
    described = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    assert described["offline_log_dirs"] == fakes.broker.offline_log_dirs
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    line = next(ln for ln in table.stdout.splitlines() if ln.startswith("OfflineLogDirs"))
    assert "/data/d1: FatalStorageError: fsync of d1/orders-0 failed (EIO)" in line


@pytest.mark.parametrize("fakes", [False], indirect=True, ids=["broker-down"])
def test_broker_describe_shows_unknown_when_the_broker_does_not_answer(fakes: Fakes) -> None:
    result = runner.invoke(
        app, ["broker", "describe", "1", "--bootstrap-controller", fakes.bootstrap, "--json"]
    )
    assert result.exit_code == 0, result.output
    described = json.loads(result.stdout)
    assert described["broker_state"] == UNKNOWN_STATE
    assert described["offline_log_dirs"] is None  # not known: the broker did not answer
    assert described["partitions"][0]["role"] == "leader"


def test_client_endpoint_prefers_plaintext_and_maps_wildcards_to_loopback() -> None:
    broker = cpb.BrokerDescription(
        endpoints=[
            Endpoint(name="INTERNAL", host="10.0.0.1", port=1),
            Endpoint(name="PLAINTEXT", host="0.0.0.0", port=2),
        ]
    )
    assert client_endpoint(broker) == "127.0.0.1:2"
    assert client_endpoint(cpb.BrokerDescription()) is None
    assert (
        client_endpoint(cpb.BrokerDescription(endpoints=[Endpoint(name="X", host="::1", port=3)]))
        == "[::1]:3"
    )


def test_elect_leaders_prints_each_result_as_json(fakes: Fakes) -> None:
    fakes.controller.elect_results = [
        cpb.TopicElectionResults(
            topic="orders",
            partitions=[
                cpb.PartitionElectionResult(partition=0),
                cpb.PartitionElectionResult(
                    partition=1, error_code=ErrorCode.ELECTION_NOT_NEEDED.value, error_message="leads"
                ),
            ],
        )
    ]
    result = runner.invoke(
        app,
        ["topic", "elect-leaders", "--bootstrap-controller", fakes.bootstrap, "--topic", "orders", "--json"],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == [
        {"topic": "orders", "partition": 0, "result": "ELECTED", "message": None},
        {"topic": "orders", "partition": 1, "result": "ELECTION_NOT_NEEDED", "message": "leads"},
    ]
    sent = fakes.controller.elect_requests[0]
    assert [(tp.topic, list(tp.partitions)) for tp in sent.topic_partitions] == [("orders", [])]


def test_elect_leaders_failure_is_one_line_and_exit_1(fakes: Fakes) -> None:
    fakes.controller.elect_results = [
        cpb.TopicElectionResults(
            topic="orders",
            partitions=[
                cpb.PartitionElectionResult(
                    partition=3,
                    error_code=ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE.value,
                    error_message="preferred leader 2 is not live and in sync",
                )
            ],
        )
    ]
    args = ["topic", "elect-leaders", "--bootstrap-controller", fakes.bootstrap, "--topic", "orders"]
    result = runner.invoke(app, [*args, "--partition", "3"])
    assert result.exit_code == 1
    assert "PREFERRED_LEADER_NOT_AVAILABLE" in result.stdout  # the table still shows every result
    error_lines = result.stderr.strip().splitlines()
    assert len(error_lines) == 1
    assert error_lines[0].startswith("error: 1 of 1 elections failed; first: orders-3 PREFERRED_LEADER")
    assert list(fakes.controller.elect_requests[0].topic_partitions[0].partitions) == [3]


def test_elect_leaders_with_nothing_to_do_says_so(fakes: Fakes) -> None:
    result = runner.invoke(app, ["topic", "elect-leaders", "--bootstrap-controller", fakes.bootstrap])
    assert result.exit_code == 0, result.output
    assert "no partition needed" in result.stdout
    assert list(fakes.controller.elect_requests[0].topic_partitions) == []


def test_elect_request_validates_its_options() -> None:
    with pytest.raises(CliError, match="--partition needs --topic"):
        elect_request(None, 1)
    with pytest.raises(CliError, match="negative"):
        elect_request("t", -1)
    assert elect_request(None, None) == cpb.ElectLeadersRequest()
    usage = runner.invoke(
        app, ["topic", "elect-leaders", "--bootstrap-controller", "h:1", "--partition", "2"]
    )
    assert usage.exit_code == 1 and usage.stderr.strip() == "error: --partition needs --topic"


def test_election_failures_exclude_election_not_needed() -> None:
    results = [
        {"result": "ELECTED"},
        {"result": "ELECTION_NOT_NEEDED"},
        {"result": "UNKNOWN_TOPIC_OR_PARTITION"},
    ]
    assert election_failures(results) == [{"result": "UNKNOWN_TOPIC_OR_PARTITION"}]


def test_under_replicated_partitions_are_those_with_an_isr_smaller_than_their_replicas(fakes: Fakes) -> None:
    topic = cpb.TopicDescription(
        name="orders",
        topic_id="T",
        partitions=[
            cpb.PartitionDescription(partition=0, leader=1, replicas=[1, 2, 3], isr=[1, 2, 3]),
            cpb.PartitionDescription(partition=1, leader=2, replicas=[2, 3, 1], isr=[2, 3]),
            cpb.PartitionDescription(partition=2, leader=-1, replicas=[3], isr=[3]),
        ],
    )
    assert [p["partition"] for p in only_under_replicated(topic_json(topic))["partitions"]] == [1]
    args = ["topic", "describe", "orders", "--bootstrap-controller", fakes.bootstrap]
    result = runner.invoke(app, [*args, "--under-replicated-partitions", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["partitions"] == []  # the fake's only partition is fully in sync


def _topics() -> list[cpb.TopicDescription]:
    def p(index: int, leader: int, replicas: list[int], isr: list[int]) -> cpb.PartitionDescription:
        return cpb.PartitionDescription(partition=index, leader=leader, replicas=replicas, isr=isr)

    return [
        cpb.TopicDescription(name="healthy", topic_id="H", partitions=[p(0, 1, [1, 2], [1, 2])]),
        cpb.TopicDescription(
            name="orders",
            topic_id="O",
            partitions=[
                p(0, 1, [1, 2], [1]),  # under-replicated, available
                p(1, -1, [2], [2]),  # offline: no leader
                p(2, 2, [2, 1], [2, 1]),  # led by fenced broker 2: unavailable
            ],
        ),
    ]


def test_topic_describe_filters_unavailable_and_under_replicated_partitions_cluster_wide(
    fakes: Fakes,
) -> None:
    fakes.controller.topics = _topics()
    base = ["topic", "describe", "--bootstrap-controller", fakes.bootstrap, "--json"]
    everything = runner.invoke(app, base)
    assert everything.exit_code == 0, everything.output
    assert [t["name"] for t in json.loads(everything.stdout)] == ["healthy", "orders"]
    unavailable = runner.invoke(app, [*base, "--unavailable-partitions"])
    assert unavailable.exit_code == 0, unavailable.output
    [orders] = json.loads(unavailable.stdout)
    assert orders["name"] == "orders" and [p["partition"] for p in orders["partitions"]] == [1, 2]
    under = runner.invoke(app, [*base, "--under-replicated-partitions"])
    [orders] = json.loads(under.stdout)
    assert [p["partition"] for p in orders["partitions"]] == [0]
    both = runner.invoke(app, [*base, "--under-replicated-partitions", "--unavailable-partitions"])
    assert json.loads(both.stdout) == []
    one = runner.invoke(app, [*base, "healthy", "--unavailable-partitions"])
    assert json.loads(one.stdout)["name"] == "healthy" and json.loads(one.stdout)["partitions"] == []
    text = runner.invoke(app, [*base[:-1], "--unavailable-partitions"])
    assert text.exit_code == 0 and "orders" in text.stdout and "healthy" not in text.stdout


def test_broker_describe_shows_per_partition_log_end_high_watermark_and_lag(fakes: Fakes) -> None:
    assert fakes.broker is not None
    local = broker_pb2.DescribeBrokerResponse.LocalPartition
    lag = broker_pb2.DescribeBrokerResponse.ReplicaLag
    fakes.broker.partitions = [
        local(
            topic="orders", partition=0, role="LEADER", log_end_offset=10, high_watermark=7, lag=0,
            followers=[
                lag(broker_id=2, log_end_offset=7, lag=3, in_isr=True),
                lag(broker_id=3, log_end_offset=-1, lag=-1),
            ],
        ),
    ]  # fmt: skip
    fakes.controller.topics = [
        cpb.TopicDescription(
            name="orders",
            topic_id="O",
            partitions=[cpb.PartitionDescription(partition=0, leader=1, replicas=[1, 2, 3], isr=[1, 2])],
        )
    ]
    args = ["broker", "describe", "1", "--bootstrap-controller", fakes.bootstrap]
    described = json.loads(runner.invoke(app, [*args, "--json"]).stdout)
    [partition] = described["partitions"]
    assert (partition["log_end_offset"], partition["high_watermark"], partition["lag"]) == (10, 7, 0)
    assert partition["followers"] == [
        {"broker_id": 2, "log_end_offset": 7, "lag": 3, "in_isr": True},
        {"broker_id": 3, "log_end_offset": None, "lag": None, "in_isr": False},
    ]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "Lag" in table.stdout and "2:3,3:?" in table.stdout


def test_elect_leaders_unclean_sends_the_election_type_and_prints_a_line_per_result(fakes: Fakes) -> None:
    fakes.controller.elect_results = [
        cpb.TopicElectionResults(
            topic="orders",
            partitions=[
                cpb.PartitionElectionResult(partition=0),
                cpb.PartitionElectionResult(
                    partition=1,
                    error_code=ErrorCode.ELECTION_NOT_NEEDED.value,
                    error_message="the partition has a leader (2)",
                ),
            ],
        )
    ]
    args = ["topic", "elect-leaders", "--bootstrap-controller", fakes.bootstrap, "--topic", "orders"]
    result = runner.invoke(app, [*args, "--election-type", "UNCLEAN"])  # case-insensitive, as Kafka's
    assert result.exit_code == 0, result.output
    assert fakes.controller.elect_requests[0].election_type == 1
    rows = [line for line in result.stdout.splitlines() if "orders" in line]
    assert len(rows) == 2 and "ELECTED" in rows[0] and "ELECTION_NOT_NEEDED" in rows[1]
    # the default stays preferred (0)
    assert runner.invoke(app, args).exit_code == 0
    assert fakes.controller.elect_requests[1].election_type == 0


def test_elect_leaders_unclean_without_a_live_replica_fails_in_one_line(fakes: Fakes) -> None:
    fakes.controller.elect_results = [
        cpb.TopicElectionResults(
            topic="orders",
            partitions=[
                cpb.PartitionElectionResult(
                    partition=0,
                    error_code=ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE.value,
                    error_message="no replica of [1, 2, 3] is live",
                )
            ],
        )
    ]
    args = ["topic", "elect-leaders", "--bootstrap-controller", fakes.bootstrap, "--election-type"]
    result = runner.invoke(app, [*args, "unclean", "--json"])
    assert result.exit_code == 1
    assert json.loads(result.stdout) == [
        {
            "topic": "orders",
            "partition": 0,
            "result": "ELIGIBLE_LEADERS_NOT_AVAILABLE",
            "message": "no replica of [1, 2, 3] is live",
        }
    ]
    [line] = result.stderr.strip().splitlines()
    assert line.startswith("error: 1 of 1 elections failed; first: orders-0 ELIGIBLE_LEADERS_NOT_AVAILABLE")


def test_elect_leaders_request_error_exits_non_zero(fakes: Fakes) -> None:
    fakes.controller.elect_error = (ErrorCode.POLICY_VIOLATION, "ElectLeaders names 2 topics; the limit is 1")
    args = ["topic", "elect-leaders", "--bootstrap-controller", fakes.bootstrap, "--election-type", "unclean"]
    result = runner.invoke(app, args)
    assert result.exit_code != 0
    [line] = result.stderr.strip().splitlines()
    assert "POLICY_VIOLATION" in line and "the limit is 1" in line


def test_elect_leaders_rejects_an_unknown_election_type(fakes: Fakes) -> None:
    args = ["topic", "elect-leaders", "--bootstrap-controller", fakes.bootstrap, "--election-type", "dirty"]
    result = runner.invoke(app, args)
    assert result.exit_code == 2 and fakes.controller.elect_requests == []


def test_elect_request_carries_the_election_type() -> None:
    assert elect_request("t", 0, ElectionType.UNCLEAN).election_type == 1
    assert elect_request(None, None, ElectionType.PREFERRED) == cpb.ElectLeadersRequest()


def test_elect_leaders_unclean_refuses_an_answer_from_a_controller_that_ran_a_preferred_election(
    fakes: Fakes,
) -> None:
    fakes.controller.predates_election_type = True
    fakes.controller.elect_results = [
        cpb.TopicElectionResults(topic="orders", partitions=[cpb.PartitionElectionResult(partition=0)])
    ]
    args = ["topic", "elect-leaders", "--bootstrap-controller", fakes.bootstrap, "--election-type", "unclean"]
    result = runner.invoke(app, args)
    assert result.exit_code == 1 and "ELECTED" not in result.stdout
    [line] = result.stderr.strip().splitlines()
    assert "ran a preferred election, not unclean" in line and "predates --election-type" in line
    # a preferred request is what such a controller serves
    result = runner.invoke(app, args[:-2])
    assert result.exit_code == 0, result.output
