"""A dynamic quorum (KIP-853) run the way an operator runs one, with real processes and one shared cluster:

1. ``kraft cluster up --controllers 3 --dynamic`` grows it 1 → 3 with add-controller (one at a time);
2. a follower's disk is wiped **while a client keeps creating topics**: it rejoins as an observer under a
   new directory id (the old voter stays in the set and cannot be it), the old (id, directory id) is
   removed and the new one added; the leader is killed right after the add and the new set elects a
   leader and serves; no acknowledged topic is lost;
3. a voter restarted on another port updates its own endpoint (UpdateRaftVoter): describe shows the new
   one, and the others reach it there (a failover that needs its vote elects a leader).

Each test leaves three running voters behind for the next.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from kraft.client.admin import AdminClient
from kraft.client.quorum import describe_quorum, quorum_status, remove_controller
from kraft.clock import SystemClock
from kraft.cluster.formatting import format_node_storage
from kraft.cluster.manager import LocalCluster
from kraft.cluster.quorum import REPO_ROOT
from kraft.cluster.spec import NodeSpec
from kraft.config import load_config
from kraft.errors import ErrorCode, KraftError
from kraft.netutil import free_port
from kraft.storage.meta_properties import read_meta_properties
from kraft.v1 import controller_pb2 as cpb

WAIT_S = 30.0


@dataclasses.dataclass(frozen=True)
class UpOutput:
    stdout: str
    stderr: str


@pytest.fixture(scope="module")
def grown(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LocalCluster, UpOutput]]:
    """The cluster ``kraft cluster up --dynamic`` made, and what that command printed."""
    directory = tmp_path_factory.mktemp("dynamic") / "c"
    started = time.monotonic()
    up = subprocess.run(
        [sys.executable, "-m", "kraft.cli.main", "cluster", "up", "--dir", str(directory),
         "--controllers", "3", "--brokers", "1", "--dynamic", "--profile", "fast", "--json",
         "--timeout", "90"],
        capture_output=True, text=True, timeout=120, cwd=REPO_ROOT, stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip
    print(f"cluster up --dynamic: {time.monotonic() - started:.1f} s")
    opened = LocalCluster.open(directory)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        yield opened, UpOutput(up.stdout, up.stderr)
    except BaseException:
        for node in opened.spec.nodes:
            print(f"--- {node.name}\n" + "\n".join(opened.process(node.node_id).log_tail(30)))
        raise
    finally:
        opened.down(timeout_s=2.0)  # SIGKILL after that: nothing to keep


@pytest.fixture
def cluster(grown: tuple[LocalCluster, UpOutput]) -> LocalCluster:
    return grown[0]


def controller_targets(cluster: LocalCluster) -> list[str]:
    return [c.target for c in cluster.spec.controllers]


def directory_id(cluster: LocalCluster, node_id: int) -> str:
    return read_meta_properties(cluster.layout.data_dir(cluster.spec.node(node_id))).directory_id


def assert_no_offset_prediction_mismatch(cluster: LocalCluster) -> None:
    """No controller resigned because its metadata writes landed at offsets it did not predict (a
    VotersRecord the write path did not count): a client's retry of add-controller, which takes
    DUPLICATE_VOTER as done, once hid exactly that in CI."""
    for node in cluster.spec.controllers:
        log = cluster.layout.log_path(node).read_text(encoding="utf-8", errors="replace")
        mismatches = [line for line in log.splitlines() if "offset_prediction_mismatch" in line]
        assert mismatches == [], f"{node.name}: {mismatches}"


def voter_keys(cluster: LocalCluster) -> set[tuple[int, str]]:
    view = quorum_status(describe_quorum(controller_targets(cluster), WAIT_S))
    return {(int(str(v["id"])), str(v["directory_id"])) for v in view.voters}


def test_cluster_up_dynamic_grows_one_to_three(grown: tuple[LocalCluster, UpOutput]) -> None:
    cluster, (stdout, stderr) = grown[0], dataclasses.astuple(grown[1])
    status = json.loads(stdout)
    assert status["healthy"], status
    assert [n["state"] for n in status["nodes"]].count("leader") == 1
    assert "added controller-2 to the voters" in stderr and "added controller-3 to the voters" in stderr
    assert stderr.index("controller-2") < stderr.index("controller-3")  # one at a time, in order
    # Who votes is in the log, not in the configs: every node only knows where to find the quorum.
    for node in cluster.spec.nodes:
        cfg = load_config(cluster.layout.config_path(node))
        assert not cfg.controller_quorum_voters
        assert list(cfg.controller_quorum_bootstrap_servers) == controller_targets(cluster)
    assert voter_keys(cluster) == {(n, directory_id(cluster, n)) for n in (1, 2, 3)}
    assert cluster.spec.dynamic and LocalCluster.open(cluster.layout.root).spec.dynamic
    assert_no_offset_prediction_mismatch(cluster)


class TopicWriter:
    """Creates topics ``w-0``, ``w-1``, … one after another in a thread until stopped; remembers which
    ones were acknowledged (an unknown outcome or an error is not an acknowledgement)."""

    def __init__(self, targets: list[str]) -> None:
        self.targets = targets
        self.acked: list[str] = []
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> TopicWriter:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(WAIT_S)
        assert not self._thread.is_alive()

    def wait_for_acks(self, count: int) -> None:
        deadline = time.monotonic() + WAIT_S
        while len(self.acked) < count:
            assert time.monotonic() < deadline, f"{len(self.acked)}/{count} acked ({self.failures} failed)"
            time.sleep(0.05)

    async def _run(self) -> None:
        async with AdminClient(self.targets, timeout_s=10.0, clock=SystemClock()) as admin:
            for i in range(10_000):
                if self._stop.is_set():
                    return
                name = f"w-{i}"
                request = cpb.CreateTopicsRequest(
                    topics=[cpb.CreatableTopic(name=name, num_partitions=1, replication_factor=1)]
                )
                try:
                    response = await admin.create_topics(request)
                except KraftError:
                    self.failures += 1
                    continue
                if all(t.error_code == ErrorCode.NONE for t in response.topics):
                    self.acked.append(name)
                else:
                    self.failures += 1
                await asyncio.sleep(0.01)  # a steady client, not a flood (2 shared cores in CI)


def missing_topics(cluster: LocalCluster, names: list[str]) -> list[str]:
    async def describe() -> list[str]:
        async with AdminClient(controller_targets(cluster), timeout_s=WAIT_S, clock=SystemClock()) as admin:
            response = await admin.call(
                lambda stub: stub.DescribeTopics, cpb.DescribeTopicsRequest(names=names)
            )
            return [t.name for t in response.topics if t.error_code != ErrorCode.NONE]

    return asyncio.run(describe())


def wait_for_new_leader(cluster: LocalCluster, not_this: int) -> int:
    status = cluster.wait_until(
        lambda s: s.leader_id not in (-1, not_this), WAIT_S, what=f"a leader other than {not_this}"
    )
    return status.leader_id


def test_replace_a_wiped_controller_while_writing_then_fail_over(cluster: LocalCluster) -> None:
    started = time.monotonic()
    leader = cluster.wait_until(lambda s: s.leader_id >= 0, WAIT_S, what="a leader").leader_id
    victim = next(c.node_id for c in cluster.spec.controllers if c.node_id != leader)
    old_directory = directory_id(cluster, victim)
    with TopicWriter(controller_targets(cluster)) as writer:
        writer.wait_for_acks(3)

        # The disk dies: a new, empty one, formatted to join (a new directory id).
        cluster.kill(victim)
        shutil.rmtree(cluster.layout.data_dir(cluster.spec.node(victim)))
        cfg = load_config(cluster.layout.config_path(cluster.spec.node(victim)))
        format_node_storage(cfg, cluster.spec.cluster_id, no_initial_controllers=True)
        new_directory = directory_id(cluster, victim)
        assert new_directory != old_directory
        cluster.start([victim])
        # Same id, new directory: an observer, and the voter (victim, old directory) is not it.
        deadline = time.monotonic() + WAIT_S
        while True:
            view = quorum_status(describe_quorum(controller_targets(cluster), WAIT_S))
            if {"id": victim, "directory_id": new_directory} in view.observers:
                break
            assert time.monotonic() < deadline, view
            time.sleep(0.1)
        assert (victim, old_directory) in voter_keys(cluster)
        assert cluster.status().node(victim).state == "observer"  # `kraft cluster status` says so too
        acked_before = len(writer.acked)
        writer.wait_for_acks(acked_before + 3)  # the two intact voters keep committing

        remove_controller(controller_targets(cluster), victim, old_directory, WAIT_S)
        cluster.add_controller(victim, WAIT_S)
        assert (victim, new_directory) in voter_keys(cluster)
        assert (victim, old_directory) not in voter_keys(cluster)

        # Kill the leader right after the add: the new set (the other old voter and the replaced one)
        # elects a leader, which serves the writer.
        leader = cluster.wait_until(lambda s: s.leader_id >= 0, WAIT_S, what="a leader").leader_id
        cluster.kill(leader)
        new_leader = wait_for_new_leader(cluster, leader)
        acked_before = len(writer.acked)
        writer.wait_for_acks(acked_before + 3)
    assert missing_topics(cluster, writer.acked) == []
    print(f"{len(writer.acked)} topics acknowledged, {writer.failures} failed attempts")
    cluster.start([leader])
    cluster.wait_node_ready(leader, WAIT_S)
    assert voter_keys(cluster) == {(n, directory_id(cluster, n)) for n in (1, 2, 3)}
    assert new_leader != leader
    assert_no_offset_prediction_mismatch(cluster)
    print(f"replace + failover: {time.monotonic() - started:.1f} s")


def test_a_voter_on_a_new_port_updates_its_endpoint(cluster: LocalCluster) -> None:
    started = time.monotonic()
    leader = cluster.wait_until(lambda s: s.leader_id >= 0, WAIT_S, what="a leader").leader_id
    moved_id = next(c.node_id for c in cluster.spec.controllers if c.node_id != leader)
    other = next(c.node_id for c in cluster.spec.controllers if c.node_id not in (leader, moved_id))
    cluster.stop(moved_id, timeout_s=10.0)
    old = cluster.spec.node(moved_id)
    moved = NodeSpec(old.node_id, old.role, old.host, free_port(), old.metrics_port)
    spec = dataclasses.replace(
        cluster.spec, nodes=tuple(moved if n.node_id == moved_id else n for n in cluster.spec.nodes)
    )
    cluster.layout.save(spec)
    reopened = LocalCluster(cluster.layout, spec)
    reopened.write_configs()
    reopened.start([moved_id])

    def endpoints_of(node_id: int) -> object:
        view = quorum_status(describe_quorum([c.target for c in spec.controllers], WAIT_S))
        return next(v["endpoints"] for v in view.voters if v["id"] == node_id)

    deadline = time.monotonic() + WAIT_S
    while endpoints_of(moved_id) != [f"CONTROLLER://{moved.host}:{moved.port}"]:
        assert time.monotonic() < deadline, endpoints_of(moved_id)
        time.sleep(0.1)

    # The node logs the outcome after its update committed, and the describe above can see the commit
    # first (a full-suite run read the log in between): wait for the line within the same deadline.
    def update_logged() -> bool:
        log = cluster.layout.log_path(moved).read_text(encoding="utf-8")
        return "voter_endpoint_update" in log and "outcome=updated" in log

    while not update_logged():
        assert time.monotonic() < deadline, cluster.layout.log_path(moved).read_text(encoding="utf-8")[-2000:]
        time.sleep(0.1)

    # The others reach it at its new address: with the leader gone, no leader can be elected without
    # its vote (or without it answering the other's fetches as the new leader).
    reopened.kill(leader)
    new_leader = wait_for_new_leader(reopened, leader)
    assert new_leader in (moved_id, other)
    reopened.start([leader])
    reopened.wait_node_ready(leader, WAIT_S)
    assert_no_offset_prediction_mismatch(reopened)
    print(f"move a voter: {time.monotonic() - started:.1f} s")
