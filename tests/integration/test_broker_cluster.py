"""Real controller quorum + real broker processes: registration, fencing, restarts, pauses, failover,
convergence, the data path and its error cases.

One 3-controller quorum is shared by the module (session 3 s, heartbeat 500 ms) to keep the run short;
every test uses its own broker ids and topic names.  Every wait polls a condition with a deadline; every
process is killed in a fixture finalizer (controllers also by kraft.cluster.quorum's atexit hook if the
interpreter dies).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeVar

import grpc
import pytest
from tmpfs import fill, small_tmpfs

from kraft.client.channel import open_blocking_channel
from kraft.cluster.formatting import format_node_storage
from kraft.cluster.quorum import KRAFT_COMMAND, REPO_ROOT, ControllerQuorum, run_kraft, wait_until
from kraft.config import load_config
from kraft.errors import ErrorCode
from kraft.metadata.store import IMAGE_STORE_FILE, SqliteImageStore
from kraft.netutil import free_port, wait_for_port
from kraft.procutil import log_tail, spawn_logged
from kraft.storage.batch import build_batch, iter_batches
from kraft.v1 import broker_pb2 as bpb
from kraft.v1 import broker_pb2_grpc, controller_pb2_grpc
from kraft.v1 import controller_pb2 as cpb

pytestmark = pytest.mark.integration

T = TypeVar("T")
SESSION_MS = 3000
HEARTBEAT_MS = 500
RPC_TIMEOUT_S = 5.0
WAIT_S = 40.0


@dataclass
class BrokerProc:
    """One broker process: config, log dirs, log file, and its gRPC endpoint."""

    broker_id: int
    port: int
    base_dir: Path
    voters: str
    process: subprocess.Popen[bytes] | None = None
    extra_config: dict[str, str] = field(default_factory=dict)
    open_file_limit: int | None = None
    """Soft and hard RLIMIT_NOFILE of the process (``ulimit -n``); None: inherited."""

    @property
    def config_path(self) -> Path:
        return self.base_dir / f"broker{self.broker_id}.properties"

    @property
    def log_dir(self) -> Path:
        return self.base_dir / f"broker{self.broker_id}" / "logs"

    @property
    def log_path(self) -> Path:
        return self.base_dir / f"broker{self.broker_id}.log"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def write_config(self) -> None:
        self.config_path.write_text(
            "\n".join(
                [
                    "process.roles=broker",
                    f"node.id={self.broker_id}",
                    f"controller.quorum.voters={self.voters}",
                    f"listeners=PLAINTEXT://127.0.0.1:{self.port}",
                    f"log.dirs={self.log_dir}",
                    f"broker.heartbeat.interval.ms={HEARTBEAT_MS}",
                    f"broker.session.timeout.ms={SESSION_MS}",
                    "initial.broker.registration.timeout.ms=30000",
                    "controller.quorum.request.timeout.ms=1000",
                    *(f"{key}={value}" for key, value in self.extra_config.items()),
                    "",
                ]
            )
        )

    def start(self) -> None:
        command = [*KRAFT_COMMAND, "broker", "start", "--config", str(self.config_path)]
        if self.open_file_limit is not None:
            limit = str(self.open_file_limit)
            command = ["sh", "-c", f'ulimit -n {limit} && exec "$@"', "sh", *command]
        self.process = spawn_logged(
            command,
            self.log_path,
            banner=f"--- start broker {self.broker_id} at {time.time():.3f} ---",
            cwd=REPO_ROOT,
        )
        if not wait_for_port("127.0.0.1", self.port, 30.0):
            raise AssertionError(f"broker {self.broker_id} did not listen:\n{self.log_tail()}")

    def signal(self, sig: signal.Signals) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def terminate(self, timeout_s: float = 30.0) -> int:
        if self.process is None:
            return 0
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"broker {self.broker_id} ignored SIGTERM:\n{self.log_tail()}") from None

    def kill(self) -> None:
        if self.process is not None and self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                self.process.send_signal(signal.SIGCONT)  # a stopped process must be able to die
            self.process.kill()
            self.process.wait(timeout=10)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def log_tail(self, lines: int = 40) -> str:
        return log_tail(self.log_path, lines)


class Cluster:
    """The shared quorum plus the brokers a test started; blocking gRPC helpers with timeouts."""

    def __init__(self, quorum: ControllerQuorum, base_dir: Path) -> None:
        self.quorum = quorum
        self.base_dir = base_dir
        self.brokers: dict[int, BrokerProc] = {}
        self._channels: dict[str, grpc.Channel] = {}

    @property
    def voters(self) -> str:
        return ",".join(f"{n.node_id}@127.0.0.1:{n.port}" for n in self.quorum.nodes.values())

    def start_broker(
        self, broker_id: int, extra_config: dict[str, str] | None = None, open_file_limit: int | None = None
    ) -> BrokerProc:
        broker = self.brokers.get(broker_id)
        if broker is None:
            broker = BrokerProc(
                broker_id,
                free_port(),
                self.base_dir,
                self.voters,
                extra_config=extra_config or {},
                open_file_limit=open_file_limit,
            )
            broker.write_config()
            # What `kraft storage format` does, in-process: an interpreter start per broker costs seconds
            # on a loaded 2-core host (the CLI itself is tested in tests/unit/test_cli_storage.py).
            format_node_storage(load_config(broker.config_path), self.quorum.cluster_id)
            self.brokers[broker_id] = broker
        broker.start()
        return broker

    def close_brokers(self) -> None:
        for broker in self.brokers.values():
            broker.kill()
        for channel in self._channels.values():
            channel.close()
        self._channels.clear()

    def _channel(self, target: str) -> grpc.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = open_blocking_channel(target)
            self._channels[target] = channel
        return channel

    # --- controller side -------------------------------------------------------------------------

    def controller_call(self, method: str, request: object) -> object:
        """Call the active controller (tries every live controller; follows NOT_CONTROLLER by retrying)."""

        def attempt() -> object | None:
            for node_id in self.quorum.live_ids:
                stub = controller_pb2_grpc.ControllerServiceStub(
                    self._channel(self.quorum.nodes[node_id].target)
                )
                try:
                    response: object = getattr(stub, method)(request, timeout=RPC_TIMEOUT_S)
                except grpc.RpcError:
                    continue
                if getattr(response, "error_code", None) != ErrorCode.NOT_CONTROLLER:
                    return response
            return None

        return wait_until(attempt, WAIT_S, f"the active controller to answer {method}", interval_s=0.1)

    def create_topic(self, name: str, assignments: dict[int, list[int]]) -> None:
        request = cpb.CreateTopicsRequest(
            cluster_id=self.quorum.cluster_id,
            topics=[
                cpb.CreatableTopic(
                    name=name,
                    num_partitions=-1,
                    replication_factor=-1,
                    assignments=[
                        cpb.ReplicaAssignment(partition=p, broker_ids=b) for p, b in assignments.items()
                    ],
                )
            ],
        )
        response = self.controller_call("CreateTopics", request)
        assert isinstance(response, cpb.CreateTopicsResponse)
        assert response.error_code == 0, response.error_message
        assert response.topics[0].error_code == 0, response.topics[0].error_message

    def describe_topic(self, name: str) -> cpb.TopicDescription:
        request = cpb.DescribeTopicsRequest(
            cluster_id=self.quorum.cluster_id, names=[name], include_partitions=True
        )
        response = self.controller_call("DescribeTopics", request)
        assert isinstance(response, cpb.DescribeTopicsResponse)
        return response.topics[0]

    def describe_cluster(self) -> cpb.DescribeClusterResponse:
        response = self.controller_call(
            "DescribeCluster", cpb.DescribeClusterRequest(cluster_id=self.quorum.cluster_id)
        )
        assert isinstance(response, cpb.DescribeClusterResponse)
        return response

    def controller_state(self, broker_id: int) -> str:
        return next((b.state for b in self.describe_cluster().brokers if b.broker_id == broker_id), "UNKNOWN")

    def leader_of(self, topic: str, partition: int) -> tuple[int, int]:
        p = self.describe_topic(topic).partitions[partition]
        return p.leader, p.leader_epoch

    # --- broker side -------------------------------------------------------------------------------

    def broker_stub(self, broker_id: int) -> broker_pb2_grpc.BrokerServiceStub:
        return broker_pb2_grpc.BrokerServiceStub(self._channel(self.brokers[broker_id].target))

    def describe_broker(self, broker_id: int) -> bpb.DescribeBrokerResponse | None:
        try:
            return self.broker_stub(broker_id).DescribeBroker(
                bpb.DescribeBrokerRequest(cluster_id=self.quorum.cluster_id), timeout=RPC_TIMEOUT_S
            )
        except grpc.RpcError:
            return None

    def wait_broker_state(
        self, broker_id: int, state: str, timeout_s: float = WAIT_S
    ) -> bpb.DescribeBrokerResponse:
        def reached() -> bpb.DescribeBrokerResponse | None:
            described = self.describe_broker(broker_id)
            return described if described is not None and described.state == state else None

        try:
            return wait_until(reached, timeout_s, f"broker {broker_id} to be {state}", interval_s=0.1)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{self.brokers[broker_id].log_tail()}") from None

    def produce(
        self, broker_id: int, topic: str, partition: int, epoch: int, *values: bytes
    ) -> bpb.ProduceResponse:
        request = bpb.ProduceRequest(
            cluster_id=self.quorum.cluster_id,
            topic=topic,
            partition=partition,
            leader_epoch=epoch,
            records=[bpb.BrokerRecord(value=v, has_value=True) for v in values],
            acks=-1,
        )
        return self.broker_stub(broker_id).Produce(request, timeout=RPC_TIMEOUT_S)

    def assert_dirs_match_image(self, broker_id: int, topics: list[str]) -> None:
        """The broker's partition directories are exactly the partitions the controller assigns it."""

        def matches() -> bool:
            expected = set()
            for name in topics:
                topic = self.describe_topic(name)
                expected |= {f"{name}-{p.partition}" for p in topic.partitions if broker_id in p.replicas}
            broker_dirs = self.brokers[broker_id].log_dir
            present = {p.name for p in broker_dirs.iterdir() if p.is_dir()}
            return expected == {d for d in present if d.rsplit("-", 1)[0] in topics}

        wait_until(matches, WAIT_S, f"broker {broker_id}'s partition dirs to match the image", interval_s=0.1)


@pytest.fixture(scope="module")
def shared_quorum(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControllerQuorum]:
    base = tmp_path_factory.mktemp("broker-quorum")
    overrides = {
        "controller.quorum.election.timeout.ms": "500",
        "controller.quorum.fetch.timeout.ms": "1500",
        "controller.quorum.election.backoff.max.ms": "500",
        "controller.quorum.fetch.max.wait.ms": "200",
        "controller.quorum.append.linger.ms": "5",
        "broker.session.timeout.ms": str(SESSION_MS),
        "broker.heartbeat.interval.ms": str(HEARTBEAT_MS),
        "log.level": "INFO",
    }
    with ControllerQuorum(base, size=3, overrides=overrides, test_append=False) as q:
        q.start()
        q.wait_for_leader(WAIT_S)
        yield q


@pytest.fixture
def cluster(shared_quorum: ControllerQuorum, tmp_path: Path) -> Iterator[Cluster]:
    quorum = shared_quorum
    for node_id, node in quorum.nodes.items():  # a test that stopped a controller must not break the next
        if not node.alive:
            quorum.restart(node_id)
    quorum.wait_for_leader(WAIT_S)
    c = Cluster(quorum, tmp_path)
    try:
        yield c
    finally:
        c.close_brokers()


def poll(condition: Callable[[], T | None], what: str, timeout_s: float = WAIT_S) -> T:
    return wait_until(condition, timeout_s, what, interval_s=0.1)


# --- tests -------------------------------------------------------------------------------------------


def test_broker_registers_fenced_catches_up_then_is_unfenced(cluster: Cluster) -> None:
    broker = cluster.start_broker(101)
    described = cluster.wait_broker_state(101, "RUNNING")
    assert not described.fenced and described.broker_epoch >= 0
    assert described.metadata_offset >= described.broker_epoch
    poll(lambda: cluster.controller_state(101) == "ACTIVE", "the controller to show broker 101 ACTIVE")
    log = broker.log_text()
    order = [log.find(f"new={state}") for state in ("STARTING", "RECOVERY", "RUNNING")]
    assert -1 not in order and order == sorted(order), "states logged in lifecycle order"


def test_data_path_and_error_cases(cluster: Cluster) -> None:
    cluster.start_broker(111)
    cluster.start_broker(112)
    cluster.wait_broker_state(111, "RUNNING")
    cluster.wait_broker_state(112, "RUNNING")
    cluster.create_topic("path", {0: [111, 112], 1: [112, 111]})
    cluster.assert_dirs_match_image(111, ["path"])
    cluster.assert_dirs_match_image(112, ["path"])
    leader, epoch = cluster.leader_of("path", 0)
    assert leader == 111
    poll(lambda: cluster.produce(111, "path", 0, epoch, b"x").error_code == 0 or None, "produce to succeed")

    bootstrap = cluster.brokers[112].target  # not the leader of partition 0: the CLI must follow it
    produced = run_kraft(
        ["produce", "--bootstrap-server", bootstrap, "--topic", "path", "--partition", "0", "--json",
         "--value", "a", "--value", "b"]
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout)["base_offset"] == 1
    consumed = run_kraft(
        ["consume", "--bootstrap-server", bootstrap, "--topic", "path", "--partition", "0",
         "--from-beginning", "--max-records", "3", "--json"]
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    assert [json.loads(line)["value"] for line in consumed.stdout.splitlines()] == ["x", "a", "b"]

    follower = cluster.produce(112, "path", 0, epoch, b"y")
    assert follower.error_code == ErrorCode.NOT_LEADER_OR_FOLLOWER and follower.current_leader.node_id == 111
    assert cluster.produce(111, "path", 0, epoch + 1, b"y").error_code == ErrorCode.UNKNOWN_LEADER_EPOCH
    assert cluster.produce(111, "nope", 0, -1, b"y").error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION
    fetch = cluster.broker_stub(111).Fetch(
        bpb.BrokerFetchRequest(
            cluster_id=cluster.quorum.cluster_id,
            topic="path",
            partition=0,
            offset=99,
            max_bytes=1024,
            leader_epoch=-1,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert fetch.error_code == ErrorCode.OFFSET_OUT_OF_RANGE
    metadata = cluster.broker_stub(112).Metadata(
        bpb.BrokerMetadataRequest(cluster_id=cluster.quorum.cluster_id, topics=["path"]),
        timeout=RPC_TIMEOUT_S,
    )
    assert metadata.error_code == 0 and [p.leader for p in metadata.topics[0].partitions] == [111, 112]
    bad = run_kraft(
        ["produce", "--bootstrap-server", bootstrap, "--topic", "nope", "--value", "z", "--timeout", "1"]
    )
    assert (
        bad.returncode == 1 and bad.stderr.startswith("error:") and len(bad.stderr.strip().splitlines()) == 1
    )


def test_killed_broker_is_fenced_after_the_session_timeout_and_restarts_with_a_new_epoch(
    cluster: Cluster,
) -> None:
    first = cluster.start_broker(121)
    cluster.start_broker(122)
    before = cluster.wait_broker_state(121, "RUNNING")
    cluster.wait_broker_state(122, "RUNNING")
    cluster.create_topic("kill9", {0: [121, 122], 1: [121, 122]})
    cluster.assert_dirs_match_image(121, ["kill9"])
    poll(lambda: cluster.leader_of("kill9", 0)[0] == 121 or None, "121 to lead kill9-0")

    first.kill()
    killed_at = time.monotonic()
    poll(lambda: cluster.controller_state(121) in ("FENCED", "OFFLINE") or None, "broker 121 to be fenced")
    fenced_after = time.monotonic() - killed_at
    assert fenced_after >= SESSION_MS / 1000 * 0.5, "not fenced before its session could expire"
    assert cluster.leader_of("kill9", 0)[0] == 122 and cluster.leader_of("kill9", 1)[0] == 122

    cluster.start_broker(121)
    after = cluster.wait_broker_state(121, "RUNNING")
    assert after.incarnation_id != before.incarnation_id
    assert after.broker_epoch > before.broker_epoch
    log = first.log_text().split("--- start broker 121")[-1]
    assert (
        "event=image_loaded" in log and "offset=-1 " not in log.split("event=image_loaded")[1].split("\n")[0]
    )
    cluster.assert_dirs_match_image(121, ["kill9"])


def test_paused_broker_never_accepts_produce_for_a_partition_it_lost(cluster: Cluster) -> None:
    paused = cluster.start_broker(131)
    cluster.start_broker(132)
    cluster.wait_broker_state(131, "RUNNING")
    cluster.wait_broker_state(132, "RUNNING")
    cluster.create_topic("pause", {0: [131, 132]})
    cluster.assert_dirs_match_image(131, ["pause"])
    poll(lambda: cluster.leader_of("pause", 0)[0] == 131 or None, "131 leads pause-0")
    old_epoch = cluster.leader_of("pause", 0)[1]
    poll(
        lambda: cluster.produce(131, "pause", 0, old_epoch, b"before").error_code == 0 or None,
        "produce on 131",
    )

    paused.signal(signal.SIGSTOP)
    try:
        poll(lambda: cluster.leader_of("pause", 0)[0] == 132 or None, "leadership to move to 132")
    finally:
        paused.signal(signal.SIGCONT)
    # From the first instant after it resumes, the old leader must refuse the old epoch.
    answers = []
    deadline = time.monotonic() + 3 * SESSION_MS / 1000
    while time.monotonic() < deadline:
        try:
            answers.append(cluster.produce(131, "pause", 0, old_epoch, b"zombie").error_code)
        except grpc.RpcError:
            continue
    assert answers and ErrorCode.NONE not in answers
    cluster.wait_broker_state(131, "RUNNING")
    # Back in the ISR it may lead again (preferred leader), but only under a newer epoch.
    response = cluster.produce(131, "pause", 0, old_epoch, b"zombie")
    assert response.error_code in (ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.FENCED_LEADER_EPOCH)
    assert cluster.leader_of("pause", 0)[1] > old_epoch


def test_controller_failover_fences_no_live_broker(cluster: Cluster) -> None:
    for broker_id in (141, 142):
        cluster.start_broker(broker_id)
    for broker_id in (141, 142):
        cluster.wait_broker_state(broker_id, "RUNNING")
    leader = cluster.quorum.wait_for_leader(WAIT_S)
    cluster.quorum.kill(leader.node_id)
    cluster.quorum.wait_for_leader(WAIT_S, exclude=[leader.node_id])
    # Two full session timeouts under the new active controller: both brokers stay unfenced throughout.
    deadline = time.monotonic() + 2 * SESSION_MS / 1000
    while time.monotonic() < deadline:
        for broker_id in (141, 142):
            described = cluster.describe_broker(broker_id)
            assert described is not None and not described.fenced, cluster.brokers[broker_id].log_tail()
        time.sleep(0.1)
    for broker_id in (141, 142):
        assert cluster.controller_state(broker_id) == "ACTIVE"
        assert "fenced_by_controller" not in cluster.brokers[broker_id].log_text()


def test_three_brokers_converge_to_the_same_image(cluster: Cluster) -> None:
    ids = (151, 152, 153)
    for broker_id in ids:
        cluster.start_broker(broker_id)
    for broker_id in ids:
        cluster.wait_broker_state(broker_id, "RUNNING")
    cluster.create_topic("converge", {p: [ids[p % 3], ids[(p + 1) % 3]] for p in range(6)})

    def converged() -> str | None:
        views = [cluster.describe_broker(b) for b in ids]
        if any(v is None for v in views):
            return None
        offsets = {v.metadata_offset for v in views if v is not None}
        digests = {v.image_digest for v in views if v is not None}
        return digests.pop() if len(offsets) == 1 and len(digests) == 1 else None

    poll(converged, "three brokers at the same offset with the same image digest")
    for broker_id in ids:
        cluster.assert_dirs_match_image(broker_id, ["converge"])


def test_sigterm_runs_a_controlled_shutdown(cluster: Cluster) -> None:
    broker = cluster.start_broker(161)
    cluster.start_broker(162)
    cluster.wait_broker_state(161, "RUNNING")
    cluster.wait_broker_state(162, "RUNNING")
    cluster.create_topic("graceful", {0: [161, 162]})
    poll(lambda: cluster.leader_of("graceful", 0)[0] == 161 or None, "161 leads graceful-0")
    assert broker.terminate() == 0
    log = broker.log_text()
    assert "event=controlled_shutdown_granted" in log
    assert "new=PENDING_CONTROLLED_SHUTDOWN" in log and "new=NOT_RUNNING" in log
    assert cluster.leader_of("graceful", 0)[0] == 162

    # An operator's `kraft broker shutdown` reaches the broker through its heartbeat answer.
    idle = cluster.start_broker(163)
    cluster.wait_broker_state(163, "RUNNING")
    bootstrap = cluster.quorum.nodes[cluster.quorum.live_ids[0]].target
    result = run_kraft(["broker", "shutdown", "163", "--bootstrap-controller", bootstrap])
    assert result.returncode == 0, result.stderr
    process = idle.process
    assert process is not None
    assert process.wait(timeout=WAIT_S) == 0
    assert "event=shutdown_requested_by_controller" in idle.log_text()


def test_topic_deletion_removes_partition_dirs(cluster: Cluster) -> None:
    cluster.start_broker(171)
    cluster.wait_broker_state(171, "RUNNING")
    cluster.create_topic("doomed", {0: [171], 1: [171]})
    cluster.assert_dirs_match_image(171, ["doomed"])
    response = cluster.controller_call(
        "DeleteTopics", cpb.DeleteTopicsRequest(cluster_id=cluster.quorum.cluster_id, names=["doomed"])
    )
    assert isinstance(response, cpb.DeleteTopicsResponse) and response.error_code == 0
    log_dir = cluster.brokers[171].log_dir
    poll(lambda: not any(p.name.startswith("doomed-") for p in log_dir.iterdir()) or None, "dirs deleted")


def test_a_broker_far_behind_bootstraps_from_a_snapshot(cluster: Cluster) -> None:
    behind = cluster.start_broker(181)
    cluster.start_broker(182)
    cluster.wait_broker_state(181, "RUNNING")
    cluster.wait_broker_state(182, "RUNNING")
    cluster.create_topic("snap-a", {0: [181, 182]})
    cluster.assert_dirs_match_image(181, ["snap-a"])
    assert behind.terminate() == 0

    # While 181 is down: its topic goes away and a new one is assigned to it.
    response = cluster.controller_call(
        "DeleteTopics", cpb.DeleteTopicsRequest(cluster_id=cluster.quorum.cluster_id, names=["snap-a"])
    )
    assert isinstance(response, cpb.DeleteTopicsResponse) and response.error_code == 0
    cluster.create_topic("snap-b", {0: [182, 181], 1: [182, 181]})
    # Restarted controllers serve MetadataFetch only from what they applied since their image store
    # offset, so once every controller's store holds the two writes above, 181's offset is below every
    # controller's log window: it must take a snapshot.  A follower applies a commit late (after its next
    # fetch, then controller.quorum.follower.listener.delay.ms) and saves its store later still; stopped
    # right after CreateTopics it restarts from an image at or below 181's offset and, if elected, serves
    # 181 from its log (the flake of session 12: metadata_catch_up from_offset=166, no snapshot_loaded).
    leader = wait_until(cluster.quorum.current_leader, WAIT_S, "one agreed controller leader")
    committed = leader.high_watermark - 1  # the DeleteTopics and CreateTopics records are at or below it
    stores = {n: node.metadata_dir / IMAGE_STORE_FILE for n, node in cluster.quorum.nodes.items()}

    def stored_offsets() -> dict[int, int | None]:
        return {n: SqliteImageStore.stored_offset(path) for n, path in stores.items()}

    def all_saved() -> bool:
        return all(o is not None and o >= committed for o in stored_offsets().values())

    wait_until(all_saved, WAIT_S, f"every controller's image store to reach offset {committed}")
    for node_id in list(cluster.quorum.nodes):
        cluster.quorum.terminate(node_id)
    # A stopping controller saves its committed image last, so no store went back below the wait's offset.
    assert all_saved(), stored_offsets()
    cluster.quorum.start()  # all three at once
    cluster.quorum.wait_for_leader(WAIT_S)

    cluster.start_broker(181)
    cluster.wait_broker_state(181, "RUNNING")
    log = behind.log_text().split("--- start broker 181")[-1]
    assert "event=snapshot_loaded" in log, behind.log_tail()
    cluster.assert_dirs_match_image(181, ["snap-a", "snap-b"])
    assert not any(p.name.startswith("snap-a-") for p in behind.log_dir.iterdir())


# --- hostile but legal input ----------------------------------------------------------------------------

LONGEST_TOPIC = "L" * 249  # Kafka's maximum topic name length
GRPC_MAX = 16 * 1024 * 1024  # grpc.max.message.bytes default
LARGEST_BATCH = GRPC_MAX - 64 * 1024  # the largest message.max.bytes that default allows


def _value_filling(batch_bytes: int) -> bytes:
    """A random value whose one-record batch (as the broker builds it) is exactly ``batch_bytes``."""
    n = batch_bytes - len(build_batch(0, [(None, b"")], leader_epoch=0, timestamp_ms=1))
    while len(build_batch(0, [(None, b"v" * n)], leader_epoch=0, timestamp_ms=1)) > batch_bytes:
        n -= 1
    assert len(build_batch(0, [(None, b"v" * n)], leader_epoch=0, timestamp_ms=1)) == batch_bytes
    return os.urandom(n)


def _no_crash_logged(broker: BrokerProc) -> None:
    text = broker.log_text()
    assert "File name too long" not in text and "Traceback" not in text, broker.log_tail()


def test_a_249_character_topic_is_produced_consumed_and_deleted_with_every_broker_healthy(
    cluster: Cluster,
) -> None:
    ids = (191, 192, 193)
    for broker_id in ids:
        cluster.start_broker(broker_id)
    for broker_id in ids:
        cluster.wait_broker_state(broker_id, "RUNNING")
    cluster.create_topic(LONGEST_TOPIC, {0: [191, 192, 193], 1: [192, 193, 191]})
    for broker_id in ids:
        cluster.assert_dirs_match_image(broker_id, [LONGEST_TOPIC])
    bootstrap = cluster.brokers[193].target
    produced = run_kraft(
        ["produce", "--bootstrap-server", bootstrap, "--topic", LONGEST_TOPIC, "--partition", "1",
         "--value", "a", "--value", "b", "--json"]
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    consumed = run_kraft(
        ["consume", "--bootstrap-server", bootstrap, "--topic", LONGEST_TOPIC, "--partition", "1",
         "--from-beginning", "--max-records", "2", "--json"]
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    assert [json.loads(line)["value"] for line in consumed.stdout.splitlines()] == ["a", "b"]

    response = cluster.controller_call(
        "DeleteTopics", cpb.DeleteTopicsRequest(cluster_id=cluster.quorum.cluster_id, names=[LONGEST_TOPIC])
    )
    assert isinstance(response, cpb.DeleteTopicsResponse) and response.topics[0].error_code == 0
    for broker_id in ids:
        log_dir = cluster.brokers[broker_id].log_dir

        def deleted(d: Path = log_dir) -> bool | None:
            return not any(p.name.startswith("LLL") for p in d.iterdir()) or None

        poll(deleted, "dirs deleted")

    assert cluster.brokers[192].terminate() == 0
    cluster.start_broker(192)
    for broker_id in ids:
        cluster.wait_broker_state(broker_id, "RUNNING")
        assert cluster.brokers[broker_id].alive
        _no_crash_logged(cluster.brokers[broker_id])


def test_the_largest_accepted_record_survives_kill_9_with_every_later_record(cluster: Cluster) -> None:
    broker = cluster.start_broker(195, {"message.max.bytes": str(LARGEST_BATCH)})
    cluster.wait_broker_state(195, "RUNNING")
    cluster.create_topic("huge", {0: [195]})
    _, epoch = cluster.leader_of("huge", 0)
    options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
    with open_blocking_channel(broker.target, options=options) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)

        def produce(value: bytes) -> bpb.ProduceResponse:
            request = bpb.ProduceRequest(
                cluster_id=cluster.quorum.cluster_id, topic="huge", partition=0, leader_epoch=epoch,
                records=[bpb.BrokerRecord(value=value, has_value=True, timestamp_ms=1)], acks=-1,
            )  # fmt: skip
            return stub.Produce(request, timeout=30)

        poll(lambda: produce(b"first").error_code == 0 or None, "the first produce to succeed")
        largest = _value_filling(LARGEST_BATCH)
        accepted = produce(largest)
        assert accepted.error_code == 0, accepted.error_message
        refused = produce(largest + b"!")
        assert refused.error_code == ErrorCode.MESSAGE_TOO_LARGE, refused.error_message
        assert "message.max.bytes" in refused.error_message
        for value in (b"after-1", b"after-2"):
            assert produce(value).error_code == 0
        expected = [b"first", largest, b"after-1", b"after-2"]

        broker.kill()  # kill -9: no clean shutdown marker, recovery scans the whole segment
        cluster.start_broker(195)
        cluster.wait_broker_state(195, "RUNNING")

        def fetch_all() -> list[bytes] | None:
            values: list[bytes] = []
            while len(values) < len(expected):
                request = bpb.BrokerFetchRequest(
                    cluster_id=cluster.quorum.cluster_id,
                    topic="huge",
                    partition=0,
                    offset=len(values),
                    max_bytes=1,
                    leader_epoch=-1,
                )
                response = stub.Fetch(request, timeout=30)
                if response.error_code != 0 or not response.records:
                    return None
                values.extend(r.value for r in response.records)
            return values

        assert poll(fetch_all, "every record to be fetchable after the restart") == expected
    assert "partition_log_truncated_by_recovery" not in broker.log_text()


def test_a_topic_max_message_bytes_is_enforced_and_the_cli_prints_one_line(cluster: Cluster) -> None:
    cluster.start_broker(197)
    cluster.wait_broker_state(197, "RUNNING")
    controllers = ",".join(n.target for n in cluster.quorum.nodes.values())
    created = run_kraft(
        ["topic", "create", "sized", "--replica-assignment", "197", "--config", "max.message.bytes=2000",
         "--bootstrap-controller", controllers]
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    bootstrap = cluster.brokers[197].target
    small = run_kraft(["produce", "--bootstrap-server", bootstrap, "--topic", "sized", "--value", "x" * 1000])
    assert small.returncode == 0, small.stderr
    big = run_kraft(["produce", "--bootstrap-server", bootstrap, "--topic", "sized", "--value", "x" * 3000])
    assert big.returncode == 1 and len(big.stderr.strip().splitlines()) == 1, big.stderr
    assert big.stderr.startswith("error: MESSAGE_TOO_LARGE") and "max.message.bytes=2000" in big.stderr
    overload = run_kraft(
        ["topic", "create", "overload", "-p", "100000", "-r", "1", "--bootstrap-controller", controllers]
    )  # fmt: skip
    assert overload.returncode == 1 and overload.stderr.startswith("error: POLICY_VIOLATION"), overload.stderr
    assert "max.broker.partitions" in overload.stderr


def test_a_topic_deleted_while_a_broker_was_down_is_not_recreated_at_its_restart(cluster: Cluster) -> None:
    """Issue #14: a restarting broker catches up with the controller's log before it opens or creates
    partitions from its stored image (which still has the topic)."""
    broker = cluster.start_broker(201)
    cluster.wait_broker_state(201, "RUNNING")
    cluster.create_topic("resurrect", {0: [201], 1: [201]})
    cluster.assert_dirs_match_image(201, ["resurrect"])
    assert broker.terminate() == 0
    response = cluster.controller_call(
        "DeleteTopics", cpb.DeleteTopicsRequest(cluster_id=cluster.quorum.cluster_id, names=["resurrect"])
    )
    assert isinstance(response, cpb.DeleteTopicsResponse) and response.error_code == 0
    # Stands for a partition the stored image has but the disk lost: it must not be re-created either.
    shutil.rmtree(broker.log_dir / "resurrect-1")
    broker.start()
    cluster.wait_broker_state(201, "RUNNING")
    assert broker.alive
    assert not any(p.name.startswith("resurrect-") for p in broker.log_dir.iterdir())
    log = broker.log_text().split("--- start broker 201")[-1]
    # The controller's log was fetched first; only then was the stale directory removed (never opened).
    catch_up = log.find("event=metadata_catch_up ")
    assert (
        -1 < catch_up < log.find("event=stale_partition_dirs_removed") < log.find("event=partitions_opened")
    )


def test_a_broker_whose_only_log_dir_is_full_exits_with_one_fatal_line(cluster: Cluster) -> None:
    """Issue #14: fail-stop — no log dir left to host partitions (ENOSPC) ends the process with exit 70."""
    broker_dir = cluster.base_dir / "broker211"
    with small_tmpfs(broker_dir, "8m"):
        broker = cluster.start_broker(211)
        cluster.wait_broker_state(211, "RUNNING")
        fill(broker.log_dir)
        cluster.create_topic("no-room", {p: [211] for p in range(4)})
        assert broker.process is not None
        code = broker.process.wait(timeout=WAIT_S)
        broker.kill()
    assert code == 70, broker.log_tail()
    fatal = [line for line in broker.log_text().splitlines() if " event=fatal " in line]
    assert len(fatal) == 1, fatal
    assert "exit_code=70" in fatal[0] and "reason=" in fatal[0]


def _three_replica_topic(
    cluster: Cluster, ids: tuple[int, int, int], tuned: dict[str, str], topic: str
) -> tuple[str, str]:
    """Brokers ``ids`` started with ``tuned`` and RUNNING, then ``topic`` created with one partition on
    them (in that order, the first the preferred leader) and min.insync.replicas=2, its dirs on every
    broker: the bootstrap controller and the brokers' bootstrap list."""
    for broker_id in ids:
        cluster.start_broker(broker_id, tuned)
    for broker_id in ids:
        cluster.wait_broker_state(broker_id, "RUNNING")
    bootstrap_controller = cluster.quorum.nodes[min(cluster.quorum.live_ids)].target
    assignment = ":".join(str(b) for b in ids)
    created = run_kraft(
        ["topic", "create", topic, "--bootstrap-controller", bootstrap_controller,
         "--replica-assignment", assignment, "--config", "min.insync.replicas=2"]
    )  # fmt: skip
    assert created.returncode == 0, created.stderr
    for broker_id in ids:
        cluster.assert_dirs_match_image(broker_id, [topic])
    return bootstrap_controller, ",".join(cluster.brokers[b].target for b in ids)


def _segment_bytes(broker: BrokerProc, partition_dir: str) -> bytes:
    path = broker.log_dir / partition_dir / "00000000000000000000.log"
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_followers_copy_the_leaders_batches_and_a_restarted_follower_rejoins_the_isr(
    cluster: Cluster,
) -> None:
    ids = (151, 152, 153)
    for broker_id in ids:
        cluster.start_broker(broker_id)
    for broker_id in ids:
        cluster.wait_broker_state(broker_id, "RUNNING")
    cluster.create_topic("repl", {0: list(ids)})
    for broker_id in ids:
        cluster.assert_dirs_match_image(broker_id, ["repl"])
    assert cluster.leader_of("repl", 0)[0] == 151
    for i in range(5):

        def produced(i: int = i) -> bool | None:
            return cluster.produce(151, "repl", 0, -1, f"r{i}".encode()).error_code == 0 or None

        poll(produced, "produce")

    def replicated() -> bool:
        leader = _segment_bytes(cluster.brokers[151], "repl-0")
        return bool(leader) and all(_segment_bytes(cluster.brokers[b], "repl-0") == leader for b in ids)

    poll(replicated, "every replica's segment file to hold the leader's batches byte for byte")
    fetch = cluster.broker_stub(151).Fetch(
        bpb.BrokerFetchRequest(
            cluster_id=cluster.quorum.cluster_id,
            topic="repl",
            partition=0,
            offset=0,
            max_bytes=1 << 20,
            leader_epoch=-1,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert fetch.error_code == 0 and fetch.high_watermark == 5
    assert [r.value for r in fetch.records] == [f"r{i}".encode() for i in range(5)]

    cluster.brokers[153].kill()
    poll(
        lambda: list(cluster.describe_topic("repl").partitions[0].isr) == [151, 152] or None,
        "153 out of the ISR",
    )
    for i in range(5, 8):

        def produced(i: int = i) -> bool | None:
            return cluster.produce(151, "repl", 0, -1, f"r{i}".encode()).error_code == 0 or None

        poll(produced, "produce")
    cluster.start_broker(153)
    cluster.wait_broker_state(153, "RUNNING")
    poll(
        lambda: list(cluster.describe_topic("repl").partitions[0].isr) == list(ids) or None,
        "153 back in the ISR",
    )
    poll(replicated, "the restarted follower to catch up byte for byte")
    fetch = cluster.broker_stub(151).Fetch(
        bpb.BrokerFetchRequest(
            cluster_id=cluster.quorum.cluster_id,
            topic="repl",
            partition=0,
            offset=0,
            max_bytes=1 << 20,
            leader_epoch=-1,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert [r.value for r in fetch.records] == [f"r{i}".encode() for i in range(8)]


def test_acks_all_records_survive_kill_9_of_the_leader_and_no_offset_is_reused(cluster: Cluster) -> None:
    """Issue #16's scenario: produce a1..a3 with --acks all to p0 on its leader, kill -9 the leader,
    consume from the new leader: a1..a3 are there, and the next produce gets offset 3."""
    ids = (161, 162, 163)
    for broker_id in ids:
        cluster.start_broker(broker_id)
    for broker_id in ids:
        cluster.wait_broker_state(broker_id, "RUNNING")
    cluster.create_topic("acks", {0: list(ids)})
    for broker_id in ids:
        cluster.assert_dirs_match_image(broker_id, ["acks"])
    assert cluster.leader_of("acks", 0)[0] == 161
    bootstrap = f"{cluster.brokers[162].target},{cluster.brokers[163].target}"
    produced = run_kraft(
        ["produce", "--bootstrap-server", cluster.brokers[161].target, "--topic", "acks", "--partition", "0",
         "--acks", "all", "--json", "--value", "a1", "--value", "a2", "--value", "a3"]
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout)["base_offset"] == 0

    cluster.brokers[161].kill()
    poll(lambda: cluster.leader_of("acks", 0)[0] in (162, 163) or None, "a new leader for acks-0")
    consumed = run_kraft(
        ["consume", "--bootstrap-server", bootstrap, "--topic", "acks", "--partition", "0",
         "--from-beginning", "--max-records", "3", "--idle-timeout", "10", "--json"]
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    lines = [json.loads(line) for line in consumed.stdout.splitlines()]
    assert [(r["offset"], r["value"]) for r in lines] == [(0, "a1"), (1, "a2"), (2, "a3")]
    produced = run_kraft(
        ["produce", "--bootstrap-server", bootstrap, "--topic", "acks", "--partition", "0", "--acks", "all",
         "--json", "--value", "a4"]
    )  # fmt: skip
    assert produced.returncode == 0, produced.stderr
    assert json.loads(produced.stdout)["base_offset"] == 3

    # The killed leader returns as a follower: it keeps a1..a3 at 0..2 (committed, nothing to truncate),
    # copies a4, rejoins the ISR, and its segment file then holds the new leader's batches byte for byte.
    new_leader = cluster.leader_of("acks", 0)[0]
    cluster.start_broker(161)
    cluster.wait_broker_state(161, "RUNNING")
    poll(lambda: 161 in cluster.describe_topic("acks").partitions[0].isr or None, "161 back in the ISR")

    def identical() -> bytes | None:
        mine = _segment_bytes(cluster.brokers[161], "acks-0")
        return mine if mine and mine == _segment_bytes(cluster.brokers[new_leader], "acks-0") else None

    segment = poll(identical, "161's segment file to match the new leader's")
    fetch = cluster.broker_stub(new_leader).Fetch(
        bpb.BrokerFetchRequest(
            cluster_id=cluster.quorum.cluster_id, topic="acks", partition=0, offset=0, max_bytes=1 << 20,
            leader_epoch=-1,
        ),
        timeout=RPC_TIMEOUT_S,
    )  # fmt: skip
    assert fetch.error_code == 0 and fetch.high_watermark == 4  # every batch of the file is below it
    assert [(b.base_offset + r.offset_delta, r.value) for b in iter_batches(segment) for r in b.records] == [
        (0, b"a1"),
        (1, b"a2"),
        (2, b"a3"),
        (3, b"a4"),
    ]


def test_min_insync_replicas_refuses_acks_all_with_two_brokers_down_and_loses_nothing_when_they_return(
    cluster: Cluster,
) -> None:
    """Issue #16: RF=3, min.insync.replicas=2 (topic config). With two brokers down, `kraft produce --acks
    all` fails with NOT_ENOUGH_REPLICAS on one line and writes nothing; acks=1 is still taken; once one
    returns and rejoins the ISR acks=all works again; with all back the three segment files are identical,
    and after a kill -9 of the leader the new leader serves every acknowledged record at its offset."""
    ids = (171, 172, 173)
    tuned = {"replica.lag.time.max.ms": "3000", "replica.fetch.wait.max.ms": "200"}
    _, all_brokers = _three_replica_topic(cluster, ids, tuned, "mir")

    def produce(acks: str, *values: str) -> subprocess.CompletedProcess[str]:
        args = ["produce", "--bootstrap-server", all_brokers, "--topic", "mir", "--partition", "0",
                "--acks", acks, "--json"]  # fmt: skip
        for value in values:
            args += ["--value", value]
        return run_kraft(args)

    def produced_at(acks: str, *values: str) -> int | None:
        result = produce(acks, *values)
        return int(json.loads(result.stdout)["base_offset"]) if result.returncode == 0 else None

    def isr_is(expected: list[int]) -> bool | None:
        return sorted(cluster.describe_topic("mir").partitions[0].isr) == expected or None

    assert poll(lambda: produced_at("all", "a0", "a1", "a2"), "acks=all with the whole ISR") == 0
    cluster.brokers[172].kill()
    cluster.brokers[173].kill()
    poll(lambda: isr_is([171]), "the ISR to shrink to [171]")
    refused = produce("all", "never")
    assert refused.returncode == 1, refused.stdout
    [line] = refused.stderr.strip().splitlines()
    assert line.startswith("error: NOT_ENOUGH_REPLICAS:"), line
    assert produced_at("1", "b3") == 3  # acks=1 is not bound by min.insync.replicas; nothing was written

    cluster.start_broker(172, tuned)
    cluster.wait_broker_state(172, "RUNNING")
    poll(lambda: isr_is([171, 172]), "172 back in the ISR")
    assert poll(lambda: produced_at("all", "c4"), "acks=all once 172 is back") == 4
    cluster.start_broker(173, tuned)
    cluster.wait_broker_state(173, "RUNNING")
    poll(lambda: isr_is(list(ids)), "173 back in the ISR")

    def replicated() -> bool:
        leader = _segment_bytes(cluster.brokers[171], "mir-0")
        return bool(leader) and all(_segment_bytes(cluster.brokers[b], "mir-0") == leader for b in ids)

    poll(replicated, "the three segment files to be identical byte for byte")
    cluster.brokers[171].kill()
    poll(lambda: cluster.leader_of("mir", 0)[0] in (172, 173) or None, "a new leader for mir-0")
    consumed = run_kraft(
        ["consume", "--bootstrap-server", all_brokers, "--topic", "mir", "--partition", "0",
         "--from-beginning", "--max-records", "5", "--idle-timeout", "10", "--json"]
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    records = [(r["offset"], r["value"]) for r in map(json.loads, consumed.stdout.splitlines())]
    assert records == [(0, "a0"), (1, "a1"), (2, "a2"), (3, "b3"), (4, "c4")]


def test_an_eligible_leader_that_left_the_isr_first_brings_the_partition_back_with_every_record(
    cluster: Cluster,
) -> None:
    """KIP-966 with real processes: RF=3, min.insync.replicas=2. 183 dies (ISR at min ISR, not eligible),
    then the leader 181 (the ISR drops below min ISR: 181 stays eligible), then 182 (the whole ISR is
    gone: offline, ELR 181,182). Restarting 181 — not the last ISR member — brings the partition back
    with every acks=all record at its offset (before, the ISR kept only 182 and 181's return did nothing)."""
    ids = (181, 182, 183)
    tuned = {"replica.lag.time.max.ms": "3000", "replica.fetch.wait.max.ms": "200"}
    bootstrap_controller, all_brokers = _three_replica_topic(cluster, ids, tuned, "elr")

    def produced_at(*values: str) -> int | None:
        args = ["produce", "--bootstrap-server", all_brokers, "--topic", "elr", "--partition", "0",
                "--acks", "all", "--json"]  # fmt: skip
        for value in values:
            args += ["--value", value]
        result = run_kraft(args)
        return int(json.loads(result.stdout)["base_offset"]) if result.returncode == 0 else None

    def state() -> tuple[int, list[int], list[int]]:
        p = cluster.describe_topic("elr").partitions[0]
        return p.leader, sorted(p.isr), sorted(p.eligible_leader_replicas)

    assert poll(lambda: produced_at("a0", "a1", "a2"), "acks=all with the whole ISR") == 0
    cluster.brokers[183].kill()
    poll(lambda: state() == (181, [181, 182], []) or None, "183 out of the ISR, nobody eligible yet")
    assert poll(lambda: produced_at("b3"), "acks=all at min ISR") == 3
    cluster.brokers[181].kill()
    poll(lambda: state() == (182, [182], [181]) or None, "182 leads, 181 eligible")
    cluster.brokers[182].kill()
    poll(lambda: state() == (-1, [], [181, 182]) or None, "offline with 181 and 182 eligible")
    described = run_kraft(
        ["topic", "describe", "elr", "--bootstrap-controller", bootstrap_controller, "--json"]
    )
    assert described.returncode == 0, described.stderr
    [partition] = json.loads(described.stdout)["partitions"]
    assert (partition["isr"], partition["elr"], partition["leader"]) == ([], [181, 182], -1)

    cluster.start_broker(181, tuned)
    cluster.wait_broker_state(181, "RUNNING")
    poll(lambda: state()[0] == 181 or None, "181 elected from the ELR")
    # Below min ISR the high watermark is frozen (KIP-966): 183 catching up puts the ISR back at 2.
    cluster.start_broker(183, tuned)
    cluster.wait_broker_state(183, "RUNNING")
    poll(lambda: state() == (181, [181, 183], []) or None, "183 back in the ISR, the ELR cleared")
    assert poll(lambda: produced_at("c4"), "acks=all once the ISR is back at min ISR") == 4
    consumed = run_kraft(
        ["consume", "--bootstrap-server", cluster.brokers[181].target, "--topic", "elr", "--partition", "0",
         "--from-beginning", "--max-records", "5", "--idle-timeout", "10", "--json"]
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    records = [(r["offset"], r["value"]) for r in map(json.loads, consumed.stdout.splitlines())]
    assert records == [(0, "a0"), (1, "a1"), (2, "a2"), (3, "b3"), (4, "c4")]


def test_turning_unclean_election_on_elects_a_replica_outside_the_isr_which_reports_recovered(
    cluster: Cluster,
) -> None:
    """unclean.leader.election.enable with real processes: the only live replica (193) left the ISR while
    it was at min ISR, so it is not eligible and the partition stays offline; `kraft config alter` turning
    the config on elects it at once (RECOVERING, ISR = it), its broker reports RECOVERED, and it takes
    writes at the offset after what it held — b3, acknowledged while 193 was down, is lost (the
    documented price)."""
    ids = (191, 192, 193)
    tuned = {"replica.lag.time.max.ms": "3000", "replica.fetch.wait.max.ms": "200"}
    bootstrap_controller, all_brokers = _three_replica_topic(cluster, ids, tuned, "unc")

    def produced_at(acks: str, *values: str) -> int | None:
        args = ["produce", "--bootstrap-server", all_brokers, "--topic", "unc", "--partition", "0",
                "--acks", acks, "--json"]  # fmt: skip
        for value in values:
            args += ["--value", value]
        result = run_kraft(args)
        return int(json.loads(result.stdout)["base_offset"]) if result.returncode == 0 else None

    def described() -> dict[str, object]:
        result = run_kraft(
            ["topic", "describe", "unc", "--bootstrap-controller", bootstrap_controller, "--json"]
        )
        assert result.returncode == 0, result.stderr
        partition: dict[str, object] = json.loads(result.stdout)["partitions"][0]
        return partition

    assert poll(lambda: produced_at("all", "a0", "a1", "a2"), "acks=all with the whole ISR") == 0
    cluster.brokers[193].kill()
    poll(lambda: described()["isr"] == [191, 192] or None, "193 out of the ISR")
    assert poll(lambda: produced_at("all", "b3"), "acks=all at min ISR") == 3
    cluster.brokers[191].kill()
    poll(lambda: described()["elr"] == [191] or None, "191 eligible")
    cluster.brokers[192].kill()
    poll(lambda: described()["leader"] == -1 or None, "the partition offline")
    cluster.start_broker(193, tuned)
    cluster.wait_broker_state(193, "RUNNING")  # unfenced: its election ran, and found it not eligible
    assert (described()["leader"], described()["elr"]) == (-1, [191, 192])

    altered = run_kraft(
        ["config", "alter", "--bootstrap-controller", bootstrap_controller, "--entity-type", "topics",
         "--entity-name", "unc", "--add-config", "unclean.leader.election.enable=true"]
    )  # fmt: skip
    assert altered.returncode == 0, altered.stderr

    def led_by_193() -> dict[str, object] | None:
        partition = described()
        return partition if partition["leader"] == 193 else None

    partition = poll(led_by_193, "193 elected uncleanly")
    assert (partition["isr"], partition["elr"]) == ([193], [])
    poll(lambda: described()["leader_recovery_state"] == "RECOVERED" or None, "193's RECOVERED report")
    assert poll(lambda: produced_at("1", "z"), "acks=1 to the new leader") == 3  # b3's offset, reused
    # 191 returns holding b3 below its high watermark: it truncates (the config is on) and rejoins.
    cluster.start_broker(191, tuned)
    cluster.wait_broker_state(191, "RUNNING")
    poll(lambda: described()["isr"] == [191, 193] or None, "191 back in the ISR")
    consumed = run_kraft(
        ["consume", "--bootstrap-server", cluster.brokers[193].target, "--topic", "unc", "--partition", "0",
         "--from-beginning", "--max-records", "4", "--idle-timeout", "10", "--json"]
    )  # fmt: skip
    assert consumed.returncode == 0, consumed.stderr
    records = [(r["offset"], r["value"]) for r in map(json.loads, consumed.stdout.splitlines())]
    assert records == [(0, "a0"), (1, "a1"), (2, "a2"), (3, "z")]

    def converged() -> bool:
        leader = _segment_bytes(cluster.brokers[193], "unc-0")
        return bool(leader) and _segment_bytes(cluster.brokers[191], "unc-0") == leader

    poll(converged, "191's segment identical to the new leader's")


def test_a_min_isr_change_clears_the_elr_and_an_unclean_election_request_brings_an_offline_partition_back(
    cluster: Cluster,
) -> None:
    """With real processes and the CLI: `kraft config alter` raising min.insync.replicas clears the ELR in
    the same write (KIP-966), and `kraft topic elect-leaders --election-type unclean` elects the only live
    replica of an offline partition although unclean.leader.election.enable is false (Kafka's
    kafka-leader-election.sh --election-type unclean): RECOVERING, then RECOVERED, then it takes writes.
    The old leader (186) then returns holding b1 below its high watermark, a record the new leader lacks:
    the election's marker (last_unclean_leader_epoch) lets it truncate b1 although the config is still
    false, and it ends byte-identical with the new leader (before the marker it stopped replicating)."""
    ids = (185, 186, 187)
    tuned = {
        "replica.lag.time.max.ms": "3000",
        "replica.fetch.wait.max.ms": "200",
        "replica.high.watermark.checkpoint.interval.ms": "200",  # 186's HWM 2 is on disk at its kill
    }
    bootstrap_controller, all_brokers = _three_replica_topic(cluster, ids, tuned, "unc-cli")

    def described() -> dict[str, object]:
        result = run_kraft(
            ["topic", "describe", "unc-cli", "--bootstrap-controller", bootstrap_controller, "--json"]
        )
        assert result.returncode == 0, result.stderr
        partition: dict[str, object] = json.loads(result.stdout)["partitions"][0]
        return partition

    def elect(election_type: str) -> subprocess.CompletedProcess[str]:
        return run_kraft(
            ["topic", "elect-leaders", "--bootstrap-controller", bootstrap_controller, "--topic", "unc-cli",
             "--partition", "0", "--election-type", election_type, "--json"]
        )  # fmt: skip

    def produced(acks: str, value: str) -> int | None:
        result = run_kraft(
            ["produce", "--bootstrap-server", all_brokers, "--topic", "unc-cli", "--partition", "0",
             "--acks", acks, "--value", value, "--json"]
        )  # fmt: skip
        return int(json.loads(result.stdout)["base_offset"]) if result.returncode == 0 else None

    poll(lambda: described()["isr"] == [185, 186, 187] or None, "the whole ISR")
    assert poll(lambda: produced("all", "a0"), "acks=all with the whole ISR") == 0
    cluster.brokers[187].kill()
    poll(lambda: described()["isr"] == [185, 186] or None, "187 out of the ISR")
    assert poll(lambda: produced("all", "b1"), "acks=all at min ISR") == 1  # on 185 and 186, not 187

    def checkpointed_hwm(broker_id: int) -> int:
        """The HWM of unc-cli-0 in the broker's replication-offset-checkpoint (-1: not there yet)."""
        path = cluster.brokers[broker_id].log_dir / "replication-offset-checkpoint"
        with contextlib.suppress(OSError):
            for line in path.read_text().splitlines():
                fields = line.split()
                if fields[:2] == ["unc-cli", "0"]:
                    return int(fields[2])
        return -1

    # 186, a follower, learns the HWM past b1 from its next fetch answer (185 must still be alive)
    poll(lambda: checkpointed_hwm(186) >= 2 or None, "186's checkpointed HWM past b1")
    cluster.brokers[185].kill()
    poll(lambda: described()["elr"] == [185] or None, "185 eligible")
    raised = run_kraft(
        ["config", "alter", "--bootstrap-controller", bootstrap_controller, "--entity-type", "topics",
         "--entity-name", "unc-cli", "--add-config", "min.insync.replicas=3"]
    )  # fmt: skip
    assert raised.returncode == 0, raised.stderr
    # The config write carries the clear; nothing else would change the partition now (185 and 187 are
    # down, the leader has nobody to add), so before the fix its ELR stayed [185] until the next change.
    poll(lambda: described()["elr"] == [] or None, "the ELR cleared")
    partition = described()
    assert (partition["leader"], partition["isr"], partition["elr"]) == (186, [186], [])
    cluster.brokers[186].kill()
    poll(lambda: described()["leader"] == -1 or None, "the partition offline")
    cluster.start_broker(187, tuned)
    cluster.wait_broker_state(187, "RUNNING")  # unfenced: its election ran, and found it not eligible
    assert described()["leader"] == -1

    preferred = elect("preferred")
    assert preferred.returncode == 1
    assert json.loads(preferred.stdout)[0]["result"] == "PREFERRED_LEADER_NOT_AVAILABLE"
    unclean = elect("unclean")
    assert unclean.returncode == 0, unclean.stderr
    assert json.loads(unclean.stdout) == [
        {"topic": "unc-cli", "partition": 0, "result": "ELECTED", "message": None}
    ]
    partition = described()
    assert (partition["leader"], partition["isr"], partition["elr"]) == (187, [187], [])
    poll(lambda: described()["leader_recovery_state"] == "RECOVERED" or None, "187's RECOVERED report")
    again = elect("unclean")
    assert again.returncode == 0 and json.loads(again.stdout)[0]["result"] == "ELECTION_NOT_NEEDED"
    # b1's offset, reused: the loss the unclean election accepted
    assert poll(lambda: produced("1", "after"), "acks=1 to the uncleanly elected leader") == 1

    # 186, the old leader, returns with b1 committed (below its HWM): it truncates it and converges
    cluster.start_broker(186, tuned)
    cluster.wait_broker_state(186, "RUNNING")

    def converged() -> bool:
        leader = _segment_bytes(cluster.brokers[187], "unc-cli-0")
        return bool(leader) and _segment_bytes(cluster.brokers[186], "unc-cli-0") == leader

    poll(converged, "186's segment identical to the new leader's")
    poll(lambda: described()["isr"] == [186, 187] or None, "186 back in the ISR")
    broker_log = cluster.brokers[186].log_path.read_text()
    assert "truncation_below_high_watermark_refused" not in broker_log
    assert "truncation_below_high_watermark" in broker_log  # the one warning naming the lost offsets
    # (no consumer check: min ISR 3 with an ISR of two keeps the HWM frozen, KIP-966 — the segments
    # above are the proof: a0, then "after" at b1's offset, on both)


LOW_FD_LIMIT = 512
MANY_PARTITIONS = 2000


def _open_fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


R = TypeVar("R", bpb.ProduceResponse, bpb.BrokerFetchResponse)


def _until_ok(call: Callable[[], R], what: str, broker: BrokerProc) -> R:
    """Repeat ``call`` until it answers without an error (leadership settles after fences/restarts)."""
    answers: list[R] = []

    def attempt() -> R | None:
        answers.append(call())
        return answers[-1] if answers[-1].error_code == 0 else None

    try:
        return poll(attempt, what)
    except AssertionError:
        raise AssertionError(f"{what}: last answer {answers[-1:]}\n{broker.log_tail()}") from None


def _produce_to(cluster: Cluster, partition: int, prefix: bytes = b"v") -> bpb.ProduceResponse:
    _leader, epoch = cluster.leader_of("wide", partition)
    return cluster.produce(141, "wide", partition, epoch, prefix + b"%d" % partition)


def _fetch_record(cluster: Cluster, partition: int) -> bpb.BrokerFetchResponse:
    """The fetch answer (:func:`_until_ok` asks again after an error).  An answer without an error must
    hold exactly the record produced before the restart: a leader whose replication state is not set up
    yet answers NOT_LEADER_OR_FOLLOWER, never an empty partition at high watermark 0."""
    fetched = _fetch_from(cluster, partition)
    if fetched.error_code == 0:
        values = [r.value for r in fetched.records]
        assert values == [b"v%d" % partition], (
            f"wide-{partition} answered without an error: records {values}, hwm {fetched.high_watermark}"
        )
    return fetched


def _fetch_from(cluster: Cluster, partition: int) -> bpb.BrokerFetchResponse:
    request = bpb.BrokerFetchRequest(
        cluster_id=cluster.quorum.cluster_id,
        topic="wide",
        partition=partition,
        max_bytes=1024,
        leader_epoch=-1,
    )
    return cluster.broker_stub(141).Fetch(request, timeout=RPC_TIMEOUT_S)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="counts descriptors in /proc")
def test_a_broker_limited_to_512_files_hosts_2000_partitions_and_restarts(cluster: Cluster) -> None:
    """Issue #14: partitions cost no descriptor while idle (an LRU of open segment files, half the
    limit), so a broker under ``ulimit -n 512`` hosts 2,000 partitions, serves them and reopens them all
    after a restart — before, every partition held its segment file open and the broker died with
    "Too many open files"."""
    broker = cluster.start_broker(141, open_file_limit=LOW_FD_LIMIT)
    cluster.wait_broker_state(141, "RUNNING")
    cluster.create_topic("wide", {p: [141] for p in range(MANY_PARTITIONS)})

    def hosted() -> int | None:
        described = cluster.describe_broker(141)
        return 1 if described is not None and len(described.partitions) == MANY_PARTITIONS else None

    poll(hosted, f"broker 141 hosting {MANY_PARTITIONS} partitions", timeout_s=180)
    assert broker.process is not None and broker.alive, broker.log_tail()
    touched = range(0, MANY_PARTITIONS, 97)
    for partition in touched:
        _until_ok(partial(_produce_to, cluster, partition), f"a produce to wide-{partition}", broker)
    assert _open_fds(broker.process.pid) < LOW_FD_LIMIT
    assert "open_segment_files_max=256" in broker.log_text()

    assert broker.terminate() == 0, broker.log_tail()
    broker.start()
    cluster.wait_broker_state(141, "RUNNING", timeout_s=180)
    poll(hosted, "the partitions reopened after the restart", timeout_s=180)
    for partition in touched:
        # Retriable errors while the restarted broker settles; never an error-free empty answer.
        _until_ok(
            partial(_fetch_record, cluster, partition), f"the record of wide-{partition} read back", broker
        )
    assert broker.process is not None and _open_fds(broker.process.pid) < LOW_FD_LIMIT
    assert "Too many open files" not in broker.log_text()


def test_corrupt_data_read_by_a_consumer_takes_the_log_dir_offline_and_leadership_moves(
    cluster: Cluster,
) -> None:
    """Issue #14, Kafka's LogDirFailure end to end: a flipped byte in a leader's flushed segment is caught
    by the read's CRC check; the broker answers KAFKA_STORAGE_ERROR, takes that log dir offline (its
    other dir keeps serving), reports it in its heartbeats, and the controller moves the leadership to
    the other ISR member."""
    base = cluster.base_dir / "broker161"
    dirs = f"{base}/d1,{base}/d2"
    cluster.start_broker(161, {"log.dirs": dirs})
    cluster.start_broker(162)
    cluster.wait_broker_state(161, "RUNNING")
    cluster.wait_broker_state(162, "RUNNING")
    cluster.create_topic("frail", {0: [161, 162], 1: [161, 162], 2: [161, 162]})
    poll(lambda: list(cluster.describe_topic("frail").partitions[0].isr) == [161, 162] or None, "ISR")
    _leader, epoch = cluster.leader_of("frail", 0)
    answer = poll(
        lambda: (
            ((a := cluster.produce(161, "frail", 0, epoch, b"precious" * 50)).error_code == 0 and a) or None
        ),
        "the produce to frail-0",
    )
    assert answer.base_offset == 0
    described = cluster.describe_broker(161)
    assert described is not None
    homes = {(p.topic, p.partition): p.log_dir for p in described.partitions}
    frail_dir = Path(homes[("frail", 0)])
    others = {Path(d) for key, d in homes.items() if Path(d) != frail_dir}
    segment = frail_dir / "frail-0" / "00000000000000000000.log"
    with segment.open("r+b") as out:  # a payload byte: only the batch CRC notices
        out.seek(100)
        byte = out.read(1)
        out.seek(100)
        out.write(bytes([byte[0] ^ 0x55]))
    fetched = cluster.broker_stub(161).Fetch(
        bpb.BrokerFetchRequest(
            cluster_id=cluster.quorum.cluster_id,
            topic="frail",
            partition=0,
            max_bytes=1 << 20,
            leader_epoch=-1,
        ),
        timeout=RPC_TIMEOUT_S,
    )
    assert fetched.error_code == ErrorCode.KAFKA_STORAGE_ERROR, fetched
    assert "CRC-32C mismatch" in fetched.error_message
    moved = poll(
        lambda: ((p := cluster.describe_topic("frail").partitions[0]).leader == 162 and p) or None,
        "the controller to move frail-0's leadership to 162",
    )
    assert list(moved.isr) == [162]
    text = cluster.brokers[161].log_text()
    assert "event=log_dir_offline" in text and str(frail_dir) in text
    assert cluster.brokers[161].alive, cluster.brokers[161].log_tail()
    # Partitions on the other dir are still led by 161 and served.
    still = cluster.describe_broker(161)
    assert still is not None and {Path(p.log_dir) for p in still.partitions} <= others
