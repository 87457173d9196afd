"""The rolling restart's ordering and the health conditions it waits for between nodes (no processes).

The whole roll against real processes is in tests/integration/test_e2e_cli.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from kraft.cluster.manager import ClusterError, LocalCluster
from kraft.cluster.rolling import (
    ControllerCatchUp,
    RollingRestart,
    broker_problem,
    health_problem,
    next_to_restart,
    restart_order,
    role_services,
)
from kraft.cluster.spec import NodeRole, NodeSpec
from kraft.observability.health import BROKER_SERVICE, RAFT_SERVICE, HealthStatus
from kraft.v1 import raft_pb2


def controller(node_id: int) -> NodeSpec:
    return NodeSpec(node_id, NodeRole.CONTROLLER, "127.0.0.1", 9000 + node_id)


def broker(node_id: int) -> NodeSpec:
    return NodeSpec(node_id, NodeRole.BROKER, "127.0.0.1", 9000 + node_id)


CLUSTER = [controller(1), controller(2), controller(3), broker(101), broker(102), broker(103)]


def names(nodes: list[NodeSpec]) -> list[str]:
    return [n.name for n in nodes]


@pytest.mark.parametrize("active", [1, 2, 3])
def test_brokers_first_then_followers_then_the_active_controller(active: int) -> None:
    order = restart_order(reversed(CLUSTER), active)
    followers = [f"controller-{i}" for i in (1, 2, 3) if i != active]
    assert names(order) == ["broker-101", "broker-102", "broker-103", *followers, f"controller-{active}"]


def test_without_a_known_leader_controllers_go_by_id() -> None:
    assert names(restart_order(CLUSTER, -1)) == names(
        sorted(CLUSTER, key=lambda n: (n.role != "broker", n.node_id))
    )


def test_the_next_node_follows_leadership_that_moved_during_the_roll() -> None:
    remaining = [controller(1), controller(2), controller(3)]
    first = next_to_restart(remaining, active_controller=1)
    assert first.node_id == 2
    remaining.remove(first)
    # Leadership moved to 3 meanwhile: 1 is now a follower and goes before 3.
    assert next_to_restart(remaining, active_controller=3).node_id == 1
    assert next_to_restart([controller(3)], active_controller=3).node_id == 3
    with pytest.raises(ValueError, match="no node left"):
        next_to_restart([], 1)


def test_named_nodes_only_and_in_the_safe_order() -> None:
    assert names(restart_order([controller(1), broker(102)], active_controller=1)) == [
        "broker-102",
        "controller-1",
    ]


def test_each_role_must_serve_its_own_health_service() -> None:
    assert role_services(NodeRole.CONTROLLER) == ("", RAFT_SERVICE)
    assert role_services(NodeRole.BROKER) == ("", BROKER_SERVICE)
    serving = {"": HealthStatus.SERVING, BROKER_SERVICE: HealthStatus.SERVING}
    assert health_problem(serving) is None
    problem = health_problem({"": HealthStatus.UNREACHABLE, BROKER_SERVICE: HealthStatus.NOT_SERVING})
    assert problem == f'grpc.health "" UNREACHABLE, {BROKER_SERVICE} NOT_SERVING'


def test_a_broker_is_back_once_active() -> None:
    assert broker_problem("active") is None
    for state in ("starting", "registering", "fenced", "controlled_shutdown"):
        problem = broker_problem(state)
        assert problem is not None and state in problem


def quorum(
    leader: int, hwm: int, voters: dict[int, int], observers: dict[int, int] | None = None
) -> raft_pb2.DescribeQuorumResponse:
    return raft_pb2.DescribeQuorumResponse(
        leader_id=leader,
        high_watermark=hwm,
        current_voters=[raft_pb2.ReplicaState(replica_id=i, log_end_offset=e) for i, e in voters.items()],
        observers=[
            raft_pb2.ReplicaState(replica_id=i, log_end_offset=e) for i, e in (observers or {}).items()
        ],
    )


def test_a_controller_is_back_when_in_its_place_with_the_high_watermark_it_returned_to() -> None:
    check = ControllerCatchUp(2, was_voter=True)
    assert check.problem(None) == "no quorum leader answers"
    assert check.problem(quorum(-1, 0, {})) == "no quorum leader answers"
    assert check.problem(quorum(1, 100, {1: 100, 3: 100})) == "not back among the voters of leader 1"
    # First seen back at HWM 100: that is the target, even as the high watermark moves on.
    assert check.problem(quorum(1, 100, {1: 100, 2: 40, 3: 100})) == (
        "log end offset 40 below the high watermark 100"
    )
    assert check.problem(quorum(1, 130, {1: 130, 2: 100, 3: 130})) is None
    assert check.target == 100


def test_a_controller_elected_again_is_back_and_an_observer_must_return_as_one() -> None:
    assert ControllerCatchUp(2, was_voter=True).problem(quorum(2, 50, {2: 50})) is None
    observer = ControllerCatchUp(4, was_voter=False)
    assert observer.problem(quorum(1, 50, {1: 50, 4: 50})) == "not back among the observers of leader 1"
    assert observer.problem(quorum(1, 50, {1: 50}, observers={4: 50})) is None


def test_the_whole_cluster_is_rolled_only_from_a_healthy_one(tmp_path: Path) -> None:
    cluster = LocalCluster.create(tmp_path / "kc", controllers=1, brokers=1)
    with pytest.raises(
        ClusterError, match=r"waiting for a healthy cluster: no leader.*restart the nodes named"
    ):
        RollingRestart(cluster, timeout_s=1.0).run()
    assert cluster.running() == {}  # nothing was touched
