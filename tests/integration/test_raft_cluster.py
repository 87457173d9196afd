"""A real 3-controller quorum on loopback: election, leader failure, full restart, snapshot catch-up,
graceful handover, and the startup refusals.  Every wait is a polled condition with a deadline."""

from __future__ import annotations

import itertools
import json
import signal
import time
from pathlib import Path

import grpc
import pytest

from kraft.client.channel import open_blocking_channel
from kraft.cluster import quorum as cluster_quorum
from kraft.cluster.quorum import ControllerQuorum, QuorumFactory, run_kraft, wait_until
from kraft.errors import ErrorCode
from kraft.storage import shutdown_marker
from kraft.storage.meta_properties import MetaProperties, write_meta_properties
from kraft.v1 import raft_pb2, raft_pb2_grpc

pytestmark = pytest.mark.integration

VALUE = b"r" * 100


def _append_batches(quorum: ControllerQuorum, batches: int, per_batch: int = 5) -> int:
    """Append ``batches`` batches; returns the last committed offset."""
    last = -1
    for index in range(batches):
        values = [b"%d-%d-" % (index, i) + VALUE for i in range(per_batch)]
        _, last = quorum.append(values)
    return last


def test_three_controllers_elect_exactly_one_leader_and_describe_shows_it(quorum: ControllerQuorum) -> None:
    leader = quorum.wait_for_leader(30)
    views = [quorum.describe(node_id) for node_id in quorum.nodes]
    assert [v.node_id for v in views if v is not None and v.is_leader] == [leader.node_id]
    assert {v.leader_id for v in views if v is not None} == {leader.node_id}

    follower = next(node for node_id, node in quorum.nodes.items() if node_id != leader.node_id)
    status = run_kraft(
        ["quorum", "describe", "--bootstrap-controller", follower.target, "--status", "--json"]
    )
    assert status.returncode == 0, status.stderr
    shown = json.loads(status.stdout)
    assert shown["cluster_id"] == quorum.cluster_id
    assert shown["leader_id"] == leader.node_id
    assert shown["leader_epoch"] >= 1
    assert sorted(shown["current_voters"]) == [1, 2, 3]
    assert shown["current_observers"] == []

    replication = run_kraft(
        ["quorum", "describe", "--bootstrap-controller", follower.target, "--replication", "--json"]
    )
    assert replication.returncode == 0, replication.stderr
    rows = json.loads(replication.stdout)
    assert sorted(row["node_id"] for row in rows) == [1, 2, 3]
    assert [row["status"] for row in rows].count("Leader") == 1
    assert all(row["directory_id"] for row in rows if row["status"] == "Leader")

    text = run_kraft(["quorum", "describe", "--bootstrap-controller", follower.target, "--status"])
    assert text.returncode == 0, text.stderr
    fields = dict(line.split(":", 1) for line in text.stdout.splitlines())
    assert {key: value.strip() for key, value in fields.items()} == {
        "ClusterId": quorum.cluster_id,
        "LeaderId": str(leader.node_id),
        "LeaderEpoch": str(shown["leader_epoch"]),
        "HighWatermark": fields["HighWatermark"].strip(),
        "MaxFollowerLag": fields["MaxFollowerLag"].strip(),
        "MaxFollowerLagTimeMs": fields["MaxFollowerLagTimeMs"].strip(),
        "CurrentVoters": "[1,2,3]",
        "CurrentObservers": "[]",
        "Voters": fields["Voters"].strip(),
        "Observers": "-",
        # A healthy quorum: every controller answered and none reports a peer problem.
        "PeerProblems": "-",
        "UnansweredControllers": "-",
    }
    # KIP-853's Voters line: id@directory-id and the endpoint of each voter.
    voters = [entry.strip() for entry in fields["Voters"].split(",")]
    assert [entry.split("@", 1)[0] for entry in voters] == ["1", "2", "3"]
    for entry in voters:
        node_id, rest = entry.split("@", 1)
        directory_id, endpoint = rest.split(" ", 1)
        assert len(directory_id) == 22
        assert endpoint == f"CONTROLLER://{quorum.nodes[int(node_id)].target}"


def test_a_request_from_another_cluster_is_refused_with_inconsistent_cluster_id(
    quorum: ControllerQuorum,
) -> None:
    leader = quorum.wait_for_leader(30)
    with open_blocking_channel(quorum.nodes[leader.node_id].target) as channel:
        stub = raft_pb2_grpc.RaftServiceStub(channel)
        vote = raft_pb2.VoteRequest(
            cluster_id="AAAAAAAAAAAAAAAAAAAAAg",
            candidate_epoch=leader.leader_epoch + 5,
            candidate_id=2,
            voter_id=leader.node_id,
            last_offset_epoch=leader.leader_epoch,
            last_offset=10**6,
        )
        answer = stub.Vote(vote, timeout=5)
    assert answer.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID
    assert not answer.vote_granted
    still = quorum.wait_for_leader(10)
    assert (still.node_id, still.leader_epoch) == (leader.node_id, leader.leader_epoch)


def test_killing_the_leader_elects_another_and_loses_nothing_committed(quorum: ControllerQuorum) -> None:
    first = quorum.wait_for_leader(30)
    _append_batches(quorum, 20)
    before = quorum.wait_converged(30)
    committed_records = before[first.node_id].record_count
    assert committed_records == 100

    quorum.kill(first.node_id)
    second = quorum.wait_for_leader(30, exclude=[first.node_id], min_epoch=first.leader_epoch + 1)
    survivors = quorum.digest(second.node_id)
    assert survivors is not None and survivors.record_count >= committed_records
    _append_batches(quorum, 5)

    quorum.restart(first.node_id)
    after = quorum.wait_converged(60)
    assert set(after) == {1, 2, 3}
    assert {d.record_count for d in after.values()} == {committed_records + 25}
    rejoined = quorum.describe(first.node_id)
    assert rejoined is not None and not rejoined.is_leader
    assert rejoined.leader_id == second.node_id


def test_restarting_every_node_keeps_committed_data(quorum: ControllerQuorum) -> None:
    quorum.wait_for_leader(30)
    _append_batches(quorum, 10)
    before = quorum.wait_converged(30)
    digest = next(iter(before.values())).digest

    for node_id in quorum.nodes:
        quorum.kill(node_id)  # no clean shutdown: only what was fsynced survives
    quorum.start()
    quorum.wait_for_leader(30)
    after = quorum.wait_converged(60)
    assert {d.record_count for d in after.values()} == {50}
    assert {d.digest for d in after.values()} == {digest}
    _append_batches(quorum, 1)
    assert {d.record_count for d in quorum.wait_converged(30).values()} == {55}


def test_a_follower_behind_the_snapshot_catches_up_with_fetch_snapshot(quorum_factory: QuorumFactory) -> None:
    quorum = quorum_factory(
        overrides={
            "metadata.log.segment.bytes": "16384",
            "metadata.log.max.record.bytes.between.snapshots": "20000",
        }
    )
    quorum.start()
    leader = quorum.wait_for_leader(30)
    lagging = next(node_id for node_id in quorum.nodes if node_id != leader.node_id)
    _append_batches(quorum, 2)
    quorum.wait_converged(30)
    assert quorum.terminate(lagging) == 0

    # ~100 KB of values: several snapshots on the leader, and its log start moves past `lagging`'s end.
    _append_batches(quorum, 100, per_batch=8)
    leader_digest = quorum.digest(quorum.wait_for_leader(30).node_id)
    assert leader_digest is not None and leader_digest.snapshots_created >= 2

    quorum.restart(lagging)
    converged = quorum.wait_converged(60)
    assert converged[lagging].snapshots_loaded >= 1
    assert converged[lagging].record_count == 2 * 5 + 100 * 8


def test_graceful_shutdown_of_the_leader_hands_over_fast(quorum_factory: QuorumFactory) -> None:
    # A fetch timeout far above the bound: only EndQuorumEpoch can make the handover this fast.
    quorum = quorum_factory(overrides={"controller.quorum.fetch.timeout.ms": "8000"})
    quorum.start()
    first = quorum.wait_for_leader(30)
    _append_batches(quorum, 3)
    quorum.wait_converged(30)

    node = quorum.nodes[first.node_id]
    assert node.process is not None
    started = time.monotonic()
    node.process.send_signal(signal.SIGTERM)
    second = quorum.wait_for_leader(10, exclude=[first.node_id], min_epoch=first.leader_epoch + 1)
    handover_s = time.monotonic() - started
    assert node.wait_exit(20) == 0
    assert handover_s < 4.0, f"handover took {handover_s:.2f} s"
    assert shutdown_marker.read(node.metadata_dir / "__cluster_metadata-0").clean

    quorum.restart(first.node_id)
    _append_batches(quorum, 1)
    converged = quorum.wait_converged(30)
    assert {d.record_count for d in converged.values()} == {20}
    rejoined = quorum.describe(first.node_id)
    assert rejoined is not None and rejoined.leader_id == second.node_id


def test_a_quorum_on_grpcs_iomgr_replicates_and_fails_over(quorum_factory: QuorumFactory) -> None:
    # KRAFT_GRPC_IO=iomgr (kraft.runtime) swaps gRPC's whole I/O layer: the same safety, on the other stack.
    quorum = quorum_factory()
    quorum.prepare()
    for node in quorum.nodes.values():
        node.start(extra_env={"KRAFT_GRPC_IO": "iomgr"})
    for node in quorum.nodes.values():
        node.wait_listening(30)
    first = quorum.wait_for_leader(30)
    _append_batches(quorum, 4)
    assert {d.record_count for d in quorum.wait_converged(30).values()} == {20}
    for node in quorum.nodes.values():
        assert "grpc_io=iomgr" in node.log_path.read_text(), node.log_tail()

    quorum.kill(first.node_id)
    second = quorum.wait_for_leader(30, exclude=[first.node_id], min_epoch=first.leader_epoch + 1)
    _append_batches(quorum, 2)
    survivors = quorum.wait_converged(30)
    assert set(survivors) == set(quorum.nodes) - {first.node_id}
    assert {d.record_count for d in survivors.values()} == {30}
    assert second.node_id != first.node_id


def test_controller_refuses_an_unformatted_dir_with_one_line(quorum_factory: QuorumFactory) -> None:
    quorum = quorum_factory(size=1)
    quorum.prepare()  # writes configs and formats
    node = quorum.nodes[1]
    (node.metadata_dir / "meta.properties").unlink()
    result = run_kraft(["controller", "start", "--config", str(node.config_path)], timeout_s=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "not formatted" in lines[0]


def test_controller_refuses_log_dirs_of_two_clusters(tmp_path: Path, quorum_factory: QuorumFactory) -> None:
    quorum = quorum_factory(size=1)
    quorum.prepare()
    node = quorum.nodes[1]
    other_dir = tmp_path / "other-log-dir"
    write_meta_properties(
        other_dir,
        MetaProperties(cluster_id="AAAAAAAAAAAAAAAAAAAAAg", node_id=1, directory_id="AAAAAAAAAAAAAAAAAAAAAw"),
    )
    node.config_path.write_text(quorum.config_text(1) + f"log.dirs={other_dir}\n")
    result = run_kraft(["controller", "start", "--config", str(node.config_path)], timeout_s=60)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "disagree on cluster.id" in lines[0]


def test_the_test_append_service_is_off_by_default(quorum_factory: QuorumFactory) -> None:
    quorum = quorum_factory(size=1, test_append=False)
    quorum.start()
    quorum.wait_for_leader(30)
    with open_blocking_channel(quorum.nodes[1].target) as channel:
        stub = raft_pb2_grpc.RaftTestServiceStub(channel)
        request = raft_pb2.TestAppendRequest(cluster_id=quorum.cluster_id, values=[b"x"])
        with pytest.raises(grpc.RpcError) as info:
            stub.TestAppend(request, timeout=5)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


class _SteppedClock:
    """``time`` for kraft.cluster.quorum: ``sleep`` moves ``monotonic`` on, nothing else does."""

    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def test_wait_until_gives_up_at_its_deadline(monkeypatch: pytest.MonkeyPatch) -> None:
    # On a stepped clock, not the wall's (the bound was `< 2 s` of real time): it polls every 50 ms and
    # gives up at the first look past 200 ms — not later, not forever.
    clock = _SteppedClock()
    monkeypatch.setattr(cluster_quorum, "time", clock)
    polls: list[float] = []

    def never() -> None:
        polls.append(clock.now)
        if len(polls) > 1000:  # bounded: a wait_until that never gives up fails here instead of hanging
            raise RuntimeError("still polling after 1,000 looks")

    with pytest.raises(AssertionError, match="never"):
        wait_until(never, 0.2, "never")
    steps = [round(later - earlier, 6) for earlier, later in itertools.pairwise(polls)]
    assert polls[0] == 100.0 and steps == [0.05] * (len(polls) - 1)
    assert polls[-2] < 100.2 <= polls[-1] < 100.25  # the first look past the deadline is the last
    assert clock.now == polls[-1]  # gave up without sleeping again
