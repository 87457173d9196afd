"""``kraft cluster restart``: a rolling restart of a local cluster, one node at a time, waiting for health.

Order (Kafka's rolling-restart practice): brokers first, then the controllers that are not active, the
active controller last — so leadership moves once, at the end, instead of at every controller.  The
active controller is read again before each controller, as leadership may have moved meanwhile.

Between nodes the restarted one must be back, bounded by a timeout (:class:`NodeNotBack` otherwise):

- every node: grpc.health ``""`` SERVING (the process is up) and its role's service SERVING
  (``kraft.v1.RaftService``: it knows the leader; ``kraft.v1.BrokerService``: unfenced, serving);
- a broker: registered and unfenced as the active controller sees it (state ``active``);
- a controller: in the quorum again as it was before (voter or observer) with its log caught up: its log
  end offset at least the high watermark the leader reported when it first saw the node back.

A rolling restart of the whole cluster starts only from a healthy cluster: taking a node down while
another is already down can cost the quorum or a partition's last in-sync replica.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kraft.cluster.manager import ClusterError, LocalCluster
from kraft.cluster.spec import NodeRole, NodeSpec
from kraft.errors import KraftError
from kraft.observability.health import (
    BROKER_SERVICE,
    OVERALL,
    RAFT_SERVICE,
    HealthStatus,
    check_health_sync,
)
from kraft.v1 import raft_pb2

STOP_TIMEOUT_S = 15.0
"""SIGTERM → SIGKILL for each node (as ``kraft cluster stop``), at most the per-node timeout."""
HEALTHY_WAIT_S = 10.0
"""How long a rolling restart of the whole cluster waits for it to be healthy before it refuses."""
_POLL_INTERVAL_S = 0.2
_PROBE_TIMEOUT_S = 1.0


def role_services(role: NodeRole) -> tuple[str, str]:
    """The grpc.health services that must be SERVING on a node of ``role``."""
    return (OVERALL, RAFT_SERVICE if role is NodeRole.CONTROLLER else BROKER_SERVICE)


def next_to_restart(remaining: Sequence[NodeSpec], active_controller: int) -> NodeSpec:
    """The node to restart next: a broker (lowest id first), else a controller that is not active, else
    the active controller (``active_controller`` -1: none known, controllers by id)."""
    if not remaining:
        raise ValueError("no node left to restart")
    brokers = sorted((n for n in remaining if n.role is NodeRole.BROKER), key=lambda n: n.node_id)
    if brokers:
        return brokers[0]
    others = sorted((n for n in remaining if n.node_id != active_controller), key=lambda n: n.node_id)
    return others[0] if others else remaining[0]


def restart_order(nodes: Iterable[NodeSpec], active_controller: int) -> list[NodeSpec]:
    """The whole order if leadership stays where it is (what :func:`next_to_restart` yields step by step)."""
    remaining = list(nodes)
    order = []
    while remaining:
        node = next_to_restart(remaining, active_controller)
        remaining.remove(node)
        order.append(node)
    return order


def _service_label(service: str) -> str:
    return service or '""'


def health_problem(services: Mapping[str, HealthStatus]) -> str | None:
    """What is not SERVING among a node's grpc.health checks (None: all are)."""
    bad = [
        f"{_service_label(service)} {status}"
        for service, status in services.items()
        if status is not HealthStatus.SERVING
    ]
    return f"grpc.health {', '.join(bad)}" if bad else None


def broker_problem(state: str) -> str | None:
    """None once the controller sees the broker registered and unfenced (``cluster status`` state)."""
    return None if state == "active" else f"broker state {state} (waiting for active: registered, unfenced)"


class ControllerCatchUp:
    """Whether a restarted controller is back in the quorum, as it was, with its log caught up.

    The target is the leader's high watermark when the node is first seen back in its place: records
    committed before it returned must be in its log; records committed since need not (the log keeps
    moving on a busy cluster)."""

    def __init__(self, node_id: int, was_voter: bool) -> None:
        self.node_id = node_id
        self.was_voter = was_voter
        self.target: int | None = None

    def problem(self, quorum: raft_pb2.DescribeQuorumResponse | None) -> str | None:
        if quorum is None or quorum.leader_id < 0:
            return "no quorum leader answers"
        if quorum.leader_id == self.node_id:
            return None  # elected again: the leader's log is the reference
        place = quorum.current_voters if self.was_voter else quorum.observers
        replica = next((r for r in place if r.replica_id == self.node_id), None)
        if replica is None:
            where = "voters" if self.was_voter else "observers"
            return f"not back among the {where} of leader {quorum.leader_id}"
        if self.target is None:
            self.target = quorum.high_watermark
        if replica.log_end_offset < self.target:
            return f"log end offset {replica.log_end_offset} below the high watermark {self.target}"
        return None


class NodeNotBack(ClusterError):
    """A restarted node did not become healthy in time; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class Restarted:
    """One node of a rolling restart, once it was back."""

    node: NodeSpec
    old_pid: int | None
    new_pid: int
    seconds: float
    was_active: bool
    """It was the active controller when it was stopped."""

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.node.node_id,
            "name": self.node.name,
            "role": str(self.node.role),
            "old_pid": self.old_pid,
            "pid": self.new_pid,
            "seconds": round(self.seconds, 3),
            "was_active_controller": self.was_active,
        }

    def describe(self) -> str:
        active = " (the active controller)" if self.was_active else ""
        pids = f"pid {self.old_pid or '-'} -> {self.new_pid}"
        return f"{self.node.name}{active}: back in {self.seconds:.1f} s ({pids})"


class RollingRestart:
    """Restart nodes of ``cluster`` one at a time (:func:`next_to_restart`), waiting for each
    (:meth:`wait_back`)."""

    def __init__(
        self,
        cluster: LocalCluster,
        timeout_s: float,
        *,
        on_status: Callable[[str], None] | None = None,
        on_restarted: Callable[[Restarted], None] | None = None,
    ) -> None:
        self.cluster = cluster
        self.timeout_s = timeout_s
        self._on_status = on_status or (lambda line: None)
        self._on_restarted = on_restarted or (lambda restarted: None)
        self._controllers = [n.target for n in cluster.spec.controllers]

    def run(self, keys: Sequence[int | str] | None = None) -> list[Restarted]:
        """Restart the nodes named by ``keys`` (ids or names), or every node; returns them in order.

        The whole cluster is rolled only from a healthy one (:class:`ClusterError` otherwise)."""
        if keys:
            named = [self.cluster.process(key).node for key in keys]  # every name resolved before any stop
            remaining = list({node.node_id: node for node in named}.values())
        else:
            try:
                # Polled briefly, not read once: on a loaded machine one slow probe reads as "starting".
                self.cluster.wait_until(
                    lambda s: s.healthy, min(self.timeout_s, HEALTHY_WAIT_S), what="a healthy cluster"
                )
            except ClusterError as exc:
                raise ClusterError(
                    f"{exc}; a rolling restart would take more nodes away: fix it first, or restart the "
                    "nodes named (kraft cluster restart ID…)"
                ) from None
            remaining = list(self.cluster.spec.nodes)
        done: list[Restarted] = []
        total = len(remaining)
        while remaining:
            active = self._active_controller()
            node = next_to_restart(remaining, active)
            remaining.remove(node)
            self._on_status(f"restarting {node.name} ({len(done) + 1} of {total})")
            try:
                restarted = self.restart_one(node, was_active=node.node_id == active)
            except NodeNotBack as exc:
                left = f"; not restarted: {', '.join(n.name for n in remaining)}" if remaining else ""
                raise NodeNotBack(f"{exc} (restarted {len(done)} of {total} nodes before it{left})") from None
            done.append(restarted)
            self._on_restarted(restarted)
        return done

    def restart_one(self, node: NodeSpec, *, was_active: bool) -> Restarted:
        proc = self.cluster.process(node.node_id)
        old_pid = proc.pid()
        catch_up = None
        if node.role is NodeRole.CONTROLLER:
            before = self._describe()
            was_voter = before is None or any(v.replica_id == node.node_id for v in before.current_voters)
            catch_up = ControllerCatchUp(node.node_id, was_voter)
        started = time.monotonic()
        new_pid = self.cluster.restart(node.node_id, timeout_s=min(self.timeout_s, STOP_TIMEOUT_S))
        self.wait_back(node, catch_up, started + self.timeout_s)
        return Restarted(node, old_pid, new_pid, time.monotonic() - started, was_active)

    def wait_back(self, node: NodeSpec, catch_up: ControllerCatchUp | None, deadline: float) -> None:
        """Poll until ``node`` is healthy (module docstring); :class:`NodeNotBack` at ``deadline`` or
        when its process exits."""
        proc = self.cluster.process(node.node_id)
        while True:
            problem = self._problem(node, catch_up)
            if problem is None:
                return
            self._on_status(f"waiting for {node.name}: {problem}")
            if not proc.is_running():
                ended = proc.last_exit()
                why = f": {ended.line}" if ended is not None and ended.line else ""
                raise NodeNotBack(f"{node.name} exited after its restart (log {proc.log_path}){why}")
            if time.monotonic() >= deadline:
                raise NodeNotBack(
                    f"{node.name} did not come back within {self.timeout_s:g} s: {problem} "
                    f"(log {proc.log_path})"
                )
            time.sleep(_POLL_INTERVAL_S)

    def _problem(self, node: NodeSpec, catch_up: ControllerCatchUp | None) -> str | None:
        health = {s: check_health_sync(node.target, s, _PROBE_TIMEOUT_S) for s in role_services(node.role)}
        problem = health_problem(health)
        if problem is not None:
            return problem
        if catch_up is not None:
            return catch_up.problem(self._describe())
        return broker_problem(self._broker_state(node))

    def _broker_state(self, node: NodeSpec) -> str:
        return self.cluster.status(_PROBE_TIMEOUT_S).node(node.node_id).state

    def _describe(self) -> raft_pb2.DescribeQuorumResponse | None:
        # Imported here: the quorum client pulls in the Raft protos' helpers only when needed.
        from kraft.client.quorum import describe_quorum

        try:
            return describe_quorum(self._controllers, timeout_s=2 * _PROBE_TIMEOUT_S)
        except KraftError:
            return None

    def _active_controller(self) -> int:
        described = self._describe()
        return described.leader_id if described is not None else -1
