"""Client properties (``--command-config``, a cluster directory's ``client.properties``): one parser, the
same keys and one-line errors wherever they are read; ``default.api.timeout.ms`` as the whole command's
deadline when ``--timeout`` is not given; and an admin command's random first bootstrap address.

Commands run in-process (``kraft.cli.main.run``) against a cluster directory whose nodes never started
(every address refuses connections), so a command ends when its deadline passes, and the one error line
names the deadline and the attempt limit it ran under; or against small gRPC controllers in threads."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import grpc
import pytest
from test_cli_usage import assert_one_error_line, invoke
from typer._click.core import Context, ParameterSource
from typer.core import TyperCommand

from kraft.cli import common
from kraft.client.channel import PLAINTEXT_SECURITY, default_security, set_default_security
from kraft.client.properties import ClientConfig, parse_client_config
from kraft.cluster.manager import LocalCluster
from kraft.config import ConfigError
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc, raft_pb2, raft_pb2_grpc


@pytest.fixture(autouse=True)
def _clean_process(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.delenv("KRAFT_CLUSTER_DIR", raising=False)
    try:
        yield
    finally:
        set_default_security(PLAINTEXT_SECURITY)  # a TLS cluster's security must not leak to other tests
        common.apply_command_config(None)


@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    """A one-controller, one-broker plaintext cluster directory; nothing runs."""
    LocalCluster.create(tmp_path / "kc", controllers=1, brokers=1)
    return tmp_path / "kc"


def _client_properties(cluster: Path, text: str) -> Path:
    path = cluster / "client.properties"
    with path.open("a", encoding="utf-8") as out:
        out.write(text)
    return path


def test_a_plaintext_cluster_dirs_client_properties_sets_the_command_timeouts(
    capsys: pytest.CaptureFixture[str], cluster: Path
) -> None:
    _client_properties(cluster, "request.timeout.ms=300\ndefault.api.timeout.ms=1200\n")
    outcome = invoke(capsys, "topic", "list", "--cluster-dir", str(cluster))
    assert_one_error_line(outcome, "no active controller answered within 1.2s, each attempt at most 0.3s")


def test_a_tls_cluster_dirs_client_properties_takes_request_timeout_ms_too(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    LocalCluster.create(tmp_path / "tc", controllers=1, brokers=1, tls=True)
    _client_properties(tmp_path / "tc", "request.timeout.ms=300\n")
    outcome = invoke(capsys, "topic", "list", "--cluster-dir", str(tmp_path / "tc"), "--timeout", "1")
    assert_one_error_line(outcome, "no active controller answered within 1s, each attempt at most 0.3s")
    assert default_security().is_ssl, "the cluster's TLS settings were taken from the same file"


def test_command_config_alone_is_the_client_config_and_timeout_wins_over_default_api_timeout(
    capsys: pytest.CaptureFixture[str], cluster: Path, tmp_path: Path
) -> None:
    # Kafka's tools have one client file: with --command-config the directory gives only the bootstrap
    # list, and its client.properties is not read — not even when it is broken.
    broken = "request.timeout.ms=300\ndefault.api.timeout.ms=1200\nretry.backoff.max.ms=1\n"  # an unknown key
    _client_properties(cluster, broken)
    own = tmp_path / "admin.properties"
    own.write_text("request.timeout.ms=200\ndefault.api.timeout.ms=700\n", encoding="utf-8")
    argv = ["topic", "list", "--cluster-dir", str(cluster), "--command-config", str(own)]

    outcome = invoke(capsys, *argv)
    assert_one_error_line(outcome, "within 0.7s, each attempt at most 0.2s")  # the command config's own

    outcome = invoke(capsys, *argv, "--timeout", "0.5")
    assert_one_error_line(outcome, "within 0.5s, each attempt at most 0.2s")

    # Without it, the directory's file is the client config: its broken key is the error.
    outcome = invoke(capsys, "topic", "list", "--cluster-dir", str(cluster))
    assert_one_error_line(outcome, "retry.backoff.max.ms", str(cluster / "client.properties"))


def test_a_tls_cluster_dir_with_a_plaintext_command_config_is_one_line_at_once(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    LocalCluster.create(tmp_path / "tc", controllers=1, brokers=1, tls=True)
    own = tmp_path / "timeouts.properties"
    own.write_text("request.timeout.ms=300\n", encoding="utf-8")
    for argv in (["topic", "list"], ["quorum", "describe", "--status"], ["offsets", "get", "--topic", "t"]):
        outcome = invoke(capsys, *argv, "--cluster-dir", str(tmp_path / "tc"), "--command-config", str(own))
        assert_one_error_line(outcome, "uses TLS but --command-config", "security.protocol=SSL")
    # the directory's own client.properties as the command config: TLS, and the command goes on
    copied = tmp_path / "admin.properties"
    copied.write_text((tmp_path / "tc" / "client.properties").read_text() + "request.timeout.ms=300\n")
    argv = ["topic", "list", "--cluster-dir", str(tmp_path / "tc"), "--command-config", str(copied)]
    outcome = invoke(capsys, *argv, "--timeout", "1")
    assert_one_error_line(outcome, "no active controller answered within 1s, each attempt at most 0.3s")
    assert default_security().is_ssl


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "default.api.timeout.ms=3000\n",
            "invalid config default.api.timeout.ms='3000': must be no smaller than request.timeout.ms "
            "(5000, its default)",
        ),
        (
            "request.timeout.ms=8000\ndefault.api.timeout.ms=6000\n",
            "invalid config default.api.timeout.ms='6000': must be no smaller than request.timeout.ms (8000)",
        ),
    ],
)
def test_default_api_timeout_ms_is_checked_against_the_effective_request_timeout(
    capsys: pytest.CaptureFixture[str], cluster: Path, tmp_path: Path, text: str, expected: str
) -> None:
    own = tmp_path / "admin.properties"
    own.write_text(text, encoding="utf-8")
    for command in (["topic", "list"], ["quorum", "describe", "--status"], ["log-dirs", "describe"]):
        # --timeout does not excuse the file: Kafka checks the admin client's config when it is created
        for extra in ([], ["--timeout", "1"]):
            argv = [*command, "--cluster-dir", str(cluster), "--command-config", str(own), *extra]
            assert_one_error_line(invoke(capsys, *argv), expected, str(own))
    path = _client_properties(cluster, text)
    assert_one_error_line(invoke(capsys, "topic", "list", "--cluster-dir", str(cluster)), expected, str(path))


def test_default_api_timeout_ms_equal_to_the_default_request_timeout_is_accepted(
    capsys: pytest.CaptureFixture[str], cluster: Path
) -> None:
    _client_properties(cluster, "default.api.timeout.ms=5000\n")
    outcome = invoke(capsys, "topic", "list", "--cluster-dir", str(cluster), "--timeout", "0.3")
    assert_one_error_line(outcome, "within 0.3s, each attempt at most 5s")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "request.timeout.ms=-1\n",
            "invalid config request.timeout.ms='-1': must be a positive number of ms",
        ),
        ("default.api.timeout.ms=soon\n", "invalid config default.api.timeout.ms='soon': must be a positive"),
        (
            "request.timeout.ms=1000\ndefault.api.timeout.ms=500\n",
            "invalid config default.api.timeout.ms='500': must be no smaller than request.timeout.ms (1000)",
        ),
        # retry.backoff.ms is honoured since session 19; its max is not (a fixed 1 s doubling cap).
        ("retry.backoff.max.ms=100\n", "invalid config retry.backoff.max.ms='100': unknown key in"),
        ("retry.backoff.ms=-1\n", "invalid config retry.backoff.ms='-1': must be a number of ms up to"),
        ("max.block.ms=inf\n", "invalid config max.block.ms='inf': must be a number of ms up to"),
        ("max.block.ms=2147483648\n", "invalid config max.block.ms='2147483648': must be a number of ms"),
    ],
)
def test_bad_client_properties_are_one_line_wherever_they_are_read(
    capsys: pytest.CaptureFixture[str], cluster: Path, tmp_path: Path, text: str, expected: str
) -> None:
    own = tmp_path / "admin.properties"
    own.write_text(text, encoding="utf-8")
    outcome = invoke(
        capsys, "topic", "list", "--bootstrap-controller", "127.0.0.1:1", "--command-config", str(own)
    )
    assert_one_error_line(outcome, expected, str(own))

    path = _client_properties(cluster, text)
    outcome = invoke(capsys, "topic", "list", "--cluster-dir", str(cluster))
    assert_one_error_line(outcome, expected, str(path))


def test_the_client_properties_keys() -> None:
    assert parse_client_config({}) == ClientConfig()
    config = parse_client_config({"request.timeout.ms": " 2500 ", "default.api.timeout.ms": "2500"})
    assert (config.request_timeout_ms, config.default_api_timeout_ms) == (2500, 2500)
    with pytest.raises(ConfigError, match=r"known: default\.api\.timeout\.ms, max\.block\.ms, request\."):
        parse_client_config({"client.id": "x"})
    # Kafka's atLeast(0): 0 is meaningful for both (retry at once; never block on metadata)
    config = parse_client_config({"retry.backoff.ms": "0", "max.block.ms": "0"})
    assert (config.retry_backoff_ms, config.max_block_ms) == (0, 0)
    with pytest.raises(ConfigError, match=r"request\.timeout\.ms='0': must be a positive number"):
        parse_client_config({"request.timeout.ms": "0"})


class _ProduceSeen:
    """What ``kraft produce`` handed its broker client (the produce itself refused: nothing listens)."""

    def __init__(self) -> None:
        self.max_block_s: list[float | None] = []
        self.retry_backoff_s: list[float] = []


@pytest.fixture
def produce_seen(monkeypatch: pytest.MonkeyPatch) -> _ProduceSeen:
    from kraft.client.broker import BrokerClient
    from kraft.errors import ErrorCode, KraftError

    seen = _ProduceSeen()

    async def produce(self: BrokerClient, *args: Any, max_block_s: float | None = None, **kwargs: Any) -> Any:
        seen.max_block_s.append(max_block_s)
        seen.retry_backoff_s.append(self._retry_backoff_s)
        raise KraftError(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, "topic 'orders' does not exist")

    monkeypatch.setattr(BrokerClient, "produce", produce)
    return seen


@pytest.mark.parametrize(
    ("properties", "timeout", "max_block_s", "backoff_s"),
    [
        ("", "30", 30.0, 0.1),  # Kafka's 60 s max.block.ms, capped by --timeout's 30 s default
        ("max.block.ms=7000\nretry.backoff.ms=250\n", "30", 7.0, 0.25),
        ("max.block.ms=7000\n", "2.5", 2.5, 0.1),  # never longer than --timeout
        ("max.block.ms=0\nretry.backoff.ms=0\n", "30", 0.0, 0.0),
    ],
)
def test_produce_waits_for_metadata_up_to_max_block_ms_capped_by_timeout(
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    produce_seen: _ProduceSeen,
    properties: str,
    timeout: str,
    max_block_s: float,
    backoff_s: float,
) -> None:
    own = tmp_path / "producer.properties"
    own.write_text(properties, encoding="utf-8")
    argv = ["produce", "-t", "orders", "-v", "x", "--bootstrap-server", "127.0.0.1:1", "--timeout", timeout]
    outcome = invoke(capsys, *argv, "--command-config", str(own))
    assert outcome.code == 1 and outcome.err == (
        "error: UNKNOWN_TOPIC_OR_PARTITION: topic 'orders' does not exist\n"
    ), outcome
    assert produce_seen.max_block_s == [max_block_s] and produce_seen.retry_backoff_s == [backoff_s]


def _api_timeout_in_a_command(timeout_s: float, source: ParameterSource) -> float:
    with Context(TyperCommand("topic")) as ctx:
        ctx.params["timeout"] = timeout_s
        ctx.set_parameter_source("timeout", source)
        return common.api_timeout_s(timeout_s)


def test_without_timeout_the_whole_call_is_at_least_request_timeout_ms_as_in_kafka(tmp_path: Path) -> None:
    own = tmp_path / "admin.properties"
    own.write_text("request.timeout.ms=20000\n", encoding="utf-8")
    common.apply_command_config(own)
    # Kafka's admin client raises its default API timeout to a larger configured request timeout ...
    assert _api_timeout_in_a_command(15.0, ParameterSource.DEFAULT) == 20.0
    # ... but a timeout the user gave is theirs
    assert _api_timeout_in_a_command(15.0, ParameterSource.COMMANDLINE) == 15.0
    assert common.api_timeout_s(15.0) == 15.0  # outside a command (a helper called by a test or a script)
    common.apply_command_config(None)
    assert _api_timeout_in_a_command(15.0, ParameterSource.DEFAULT) == 15.0


# --- the first bootstrap address ------------------------------------------------------------------------


class _Live(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self) -> None:
        self.received = 0

    def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: Any
    ) -> cpb.DescribeClusterResponse:
        self.received += 1
        return cpb.DescribeClusterResponse(cluster_id="kc")

    def DescribeTopics(self, request: cpb.DescribeTopicsRequest, context: Any) -> cpb.DescribeTopicsResponse:
        self.received += 1
        return cpb.DescribeTopicsResponse()


@pytest.fixture
def live_pair() -> Iterator[tuple[_Live, _Live, str]]:
    """Two answering controllers (each answers as the active one): which one a command asks first shows."""
    controllers, servers, targets = [_Live(), _Live()], [], []  # type: ignore[abstract]
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


def test_an_admin_command_starts_at_the_bootstrap_address_bootstrap_start_picks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, live_pair: tuple[_Live, _Live, str]
) -> None:
    first, second, bootstrap = live_pair
    monkeypatch.setattr(common, "bootstrap_start", lambda count: 1)
    outcome = invoke(capsys, "topic", "list", "--bootstrap-controller", bootstrap, "--json")
    assert outcome.code == 0, outcome
    assert (first.received, second.received) == (0, 2), "DescribeCluster and DescribeTopics at the second"


def test_the_first_bootstrap_address_is_drawn_from_the_random_source(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, live_pair: tuple[_Live, _Live, str]
) -> None:
    first, second, bootstrap = live_pair
    draws = random.Random(17)
    expected = [draws.randrange(2) for _ in range(8)]
    assert 0 in expected and 1 in expected, "seed 17 draws both"
    monkeypatch.setattr(common, "BOOTSTRAP_RANDOM", random.Random(17))
    asked = []
    for _ in expected:
        before = (first.received, second.received)
        assert invoke(capsys, "topic", "list", "--bootstrap-controller", bootstrap, "--json").code == 0
        asked.append(0 if first.received > before[0] else 1)
    assert asked == expected


def test_bootstrap_targets_start_where_bootstrap_start_says_and_keep_the_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(common, "bootstrap_start", lambda count: 2)
    assert common.bootstrap_targets("a:1,b:2,c:3") == ["c:3", "a:1", "b:2"]
    monkeypatch.setattr(common, "bootstrap_start", lambda count: 0)
    assert common.bootstrap_targets("a:1,b:2,c:3") == ["a:1", "b:2", "c:3"]


class _Leader(raft_pb2_grpc.RaftServiceServicer):
    def __init__(self, node_id: int) -> None:
        self.node_id = node_id
        self.received = 0

    def DescribeQuorum(
        self, request: raft_pb2.DescribeQuorumRequest, context: Any
    ) -> raft_pb2.DescribeQuorumResponse:
        self.received += 1
        return raft_pb2.DescribeQuorumResponse(leader_id=self.node_id, leader_epoch=1, cluster_id="kc")


def test_quorum_describe_starts_at_the_address_bootstrap_start_picks(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    leaders, servers, targets = [_Leader(1), _Leader(2)], [], []  # type: ignore[abstract]
    for servicer in leaders:
        server = grpc.server(ThreadPoolExecutor(max_workers=2))
        raft_pb2_grpc.add_RaftServiceServicer_to_server(servicer, server)
        targets.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        server.start()
        servers.append(server)
    monkeypatch.setattr(common, "bootstrap_start", lambda count: 1)
    try:
        argv = ["quorum", "describe", "--bootstrap-controller", ",".join(targets), "--replication", "--json"]
        outcome = invoke(capsys, *argv)
    finally:
        for server in servers:
            server.stop(None)
    assert outcome.code == 0, outcome
    assert [leader.received for leader in leaders] == [0, 1]


@pytest.mark.parametrize(
    ("properties", "timeout", "attempt_s"),
    [
        ("", "20", 5.0),  # the CLI's request.timeout.ms default, as every other command's
        ("request.timeout.ms=7000\n", "20", 7.0),  # once a fixed 2 s, whatever the file said
        ("request.timeout.ms=7000\n", "3", 3.0),  # never more than is left of --timeout
    ],
)
def test_quorum_describe_attempts_get_request_timeout_ms(
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    properties: str,
    timeout: str,
    attempt_s: float,
) -> None:
    from kraft.client import quorum

    limits: list[float] = []

    def describe_once(target: str, timeout_s: float, *args: Any, **kwargs: Any) -> Any:
        limits.append(timeout_s)
        return raft_pb2.DescribeQuorumResponse(leader_id=1, leader_epoch=1, cluster_id="kc")

    monkeypatch.setattr(quorum, "_describe_once", describe_once)
    own = tmp_path / "admin.properties"
    own.write_text(properties, encoding="utf-8")
    argv = ["quorum", "describe", "--replication", "--bootstrap-controller", "127.0.0.1:1", "--json"]
    outcome = invoke(capsys, *argv, "--timeout", timeout, "--command-config", str(own))
    assert outcome.code == 0, outcome
    assert len(limits) == 1 and limits[0] == pytest.approx(attempt_s, abs=0.1)


def test_quorum_describe_pauses_retry_backoff_ms_between_rounds(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from kraft.client import quorum
    from kraft.errors import ErrorCode

    answers = [
        raft_pb2.DescribeQuorumResponse(error_code=ErrorCode.NOT_LEADER_OR_FOLLOWER, leader_id=-1),
        raft_pb2.DescribeQuorumResponse(leader_id=1, leader_epoch=1, cluster_id="kc"),
    ]
    pauses: list[float] = []
    monkeypatch.setattr(quorum, "_describe_once", lambda *args, **kwargs: answers.pop(0))
    # The module's own clock, with its sleep recorded (time.sleep itself stays as it is for everyone else).
    monkeypatch.setattr(quorum, "time", SimpleNamespace(monotonic=time.monotonic, sleep=pauses.append))
    own = tmp_path / "admin.properties"
    own.write_text("retry.backoff.ms=250\n", encoding="utf-8")
    argv = ["quorum", "describe", "--replication", "--bootstrap-controller", "127.0.0.1:1", "--json"]
    outcome = invoke(capsys, *argv, "--command-config", str(own))
    assert outcome.code == 0, outcome
    assert pauses == [0.25] and not answers  # an election in progress: one round, one pause, then the leader
