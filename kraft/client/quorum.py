"""Admin-side helpers for RaftService: find the leader from any controller, describe the quorum, and
add or remove controllers (KIP-853 AddRaftVoter / RemoveRaftVoter).

Blocking gRPC (the CLI and test harnesses have no event loop); every call has a deadline and the whole
operation is bounded by ``timeout_s``.  Used by ``kraft quorum describe`` and reusable by tooling that
needs the leader (``kraft cluster status``, chaos checkers).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from kraft.client.channel import ChannelSecurity, open_blocking_channel
from kraft.client.rotation import NodeRotation, address_rotation
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import raft_pb2, raft_pb2_grpc

_REDIRECTABLE = frozenset({ErrorCode.NOT_LEADER_OR_FOLLOWER, ErrorCode.BROKER_NOT_AVAILABLE})


@dataclass(frozen=True, slots=True)
class Pacing:
    """How one call paces its DescribeQuorum attempts: each RPC is cut at ``request_timeout_s`` (and what
    is left of the call's ``timeout_s``), and a round that found no leader is followed by a pause of
    ``retry_backoff_s``.  The CLI passes the client properties' ``request.timeout.ms`` and
    ``retry.backoff.ms`` (:func:`kraft.cli.common.request_timeout_s`), as its other commands do; the
    defaults are for tooling that polls a quorum it started (``kraft cluster``, tests)."""

    request_timeout_s: float = 2.0
    retry_backoff_s: float = 0.1


DEFAULT_PACING = Pacing()


@dataclass(frozen=True, slots=True)
class QuorumStatus:
    """Kafka's ``kafka-metadata-quorum.sh describe --status`` fields."""

    cluster_id: str
    leader_id: int
    leader_epoch: int
    high_watermark: int
    max_follower_lag: int
    max_follower_lag_time_ms: int
    current_voters: list[int]
    current_observers: list[int]
    voters: list[dict[str, object]]
    """Each voter's ``id``, ``directory_id`` and ``endpoints`` (``NAME://host:port``), KIP-853 style."""
    observers: list[dict[str, object]]
    """Each observer's ``id`` and ``directory_id`` (a wiped voter shows up here until re-added)."""

    def as_json(self) -> dict[str, object]:
        return {
            "cluster_id": self.cluster_id,
            "leader_id": self.leader_id,
            "leader_epoch": self.leader_epoch,
            "high_watermark": self.high_watermark,
            "max_follower_lag": self.max_follower_lag,
            "max_follower_lag_time_ms": self.max_follower_lag_time_ms,
            "current_voters": self.current_voters,
            "current_observers": self.current_observers,
            "voters": self.voters,
            "observers": self.observers,
        }


@dataclass(frozen=True, slots=True)
class ReplicationRow:
    """One row of ``describe --replication``."""

    node_id: int
    directory_id: str
    log_end_offset: int
    lag: int
    last_fetch_timestamp: int
    last_caught_up_timestamp: int
    status: str
    """``Leader``, ``Follower`` or ``Observer``."""

    def as_json(self) -> dict[str, object]:
        return {
            "node_id": self.node_id,
            "directory_id": self.directory_id,
            "log_end_offset": self.log_end_offset,
            "lag": self.lag,
            "last_fetch_timestamp": self.last_fetch_timestamp,
            "last_caught_up_timestamp": self.last_caught_up_timestamp,
            "status": self.status,
        }


def _describe_once(
    target: str, timeout_s: float, cluster_id: str = "", security: ChannelSecurity | None = None
) -> raft_pb2.DescribeQuorumResponse:
    """One DescribeQuorum.  Without ``cluster_id`` the first answer is a refusal that states the node's
    cluster id (every request must name it, issue #15); the call is then made again with that id.
    ``security``: None = the process default (:func:`kraft.client.channel.set_default_security`)."""
    with open_blocking_channel(target, [("grpc.enable_retries", 0)], security) as channel:
        stub = raft_pb2_grpc.RaftServiceStub(channel)
        response: raft_pb2.DescribeQuorumResponse = stub.DescribeQuorum(
            raft_pb2.DescribeQuorumRequest(cluster_id=cluster_id), timeout=timeout_s
        )
        refused = ErrorCode.from_wire(response.error_code) is ErrorCode.INCONSISTENT_CLUSTER_ID
        if refused and not cluster_id and response.cluster_id:
            response = stub.DescribeQuorum(
                raft_pb2.DescribeQuorumRequest(cluster_id=response.cluster_id), timeout=timeout_s
            )
        return response


def describe_quorum_at(target: str, timeout_s: float) -> raft_pb2.DescribeQuorumResponse | None:
    """DescribeQuorum on ``target`` itself, no redirect (any controller names the leader it knows);
    None when it cannot be asked (not up, unreachable, deadline) — for callers that poll."""
    try:
        return _describe_once(target, timeout_s)
    except grpc.RpcError:
        return None


def _leader_target(response: raft_pb2.DescribeQuorumResponse) -> str | None:
    for node in response.nodes:
        if node.node_id == response.leader_id and node.endpoint.port > 0:
            host = node.endpoint.host or "127.0.0.1"
            return f"[{host}]:{node.endpoint.port}" if ":" in host else f"{host}:{node.endpoint.port}"
    return None


def describe_quorum(
    bootstrap: Sequence[str] | NodeRotation[str],
    timeout_s: float = 10.0,
    security: ChannelSecurity | None = None,
    *,
    unreachable_timeout_s: float | None = None,
    pacing: Pacing = DEFAULT_PACING,
) -> raft_pb2.DescribeQuorumResponse:
    """DescribeQuorum answered by the leader, found from any of ``bootstrap`` (``host:port`` targets, asked
    in order from the first; or a rotation a caller keeps across calls).

    Follows NOT_LEADER_OR_FOLLOWER redirects and retries while an election is in progress, until
    ``timeout_s``; then raises :class:`KraftError` naming what was last seen.  Each round asks the
    addresses as :class:`kraft.client.rotation.NodeRotation` says: one whose last attempt failed (refused,
    black-holed, not a controller) is not asked again while one that has not failed is left, so a dead
    address costs the call one attempt, not one per round.

    ``unreachable_timeout_s`` (the CLI's :data:`kraft.client.rotation.UNREACHABLE_TIMEOUT_S`): when rounds
    in which no address answered at all go on that long, give up at once naming the addresses (a wrong
    ``--bootstrap-controller``); None (callers waiting for a quorum to start): wait to the deadline.
    ``pacing``: each attempt's limit and the pause between rounds (:class:`Pacing`).
    """
    deadline = time.monotonic() + timeout_s
    rotation = bootstrap if isinstance(bootstrap, NodeRotation) else address_rotation(bootstrap)
    last_problem = "no controller answered"
    unreachable_since: float | None = None
    while True:
        answered = False
        for target in rotation.round():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            try:
                response = _describe_once(target, min(pacing.request_timeout_s, remaining), security=security)
            except grpc.RpcError as exc:
                status = exc.code().name if isinstance(exc, grpc.Call) else "RPC_ERROR"
                last_problem = f"{target}: {status}"
                rotation.failed(target)
                continue
            rotation.answered(target)
            answered = True
            code = ErrorCode.from_wire(response.error_code)
            if code is ErrorCode.NONE:
                return response
            if code not in _REDIRECTABLE:
                raise KraftError(code, f"{target}: {response.error_message or code.name}")
            leader = _leader_target(response)
            last_problem = f"{target} is not the leader (leader {response.leader_id})"
            if leader is not None and leader != target:
                try:
                    redirected = _describe_once(
                        leader,
                        min(pacing.request_timeout_s, max(deadline - time.monotonic(), 0.05)),
                        security=security,
                    )
                except grpc.RpcError as exc:
                    code_name = exc.code().name if isinstance(exc, grpc.Call) else "RPC_ERROR"
                    last_problem = f"leader {leader}: {code_name}"
                    continue
                if ErrorCode.from_wire(redirected.error_code) is ErrorCode.NONE:
                    return redirected
        now = time.monotonic()
        if answered or unreachable_timeout_s is None:
            unreachable_since = None
        else:
            unreachable_since = now if unreachable_since is None else unreachable_since
            if now - unreachable_since >= unreachable_timeout_s and now < deadline:
                raise KraftError(
                    ErrorCode.LEADER_NOT_AVAILABLE,
                    f"no controller reachable at {','.join(rotation.nodes)} for {unreachable_timeout_s:g}s "
                    f"({last_problem}); is --bootstrap-controller right and is a controller running there?",
                )
        if now >= deadline:
            raise KraftError(
                ErrorCode.LEADER_NOT_AVAILABLE,
                f"no quorum leader found within {timeout_s:g} s ({last_problem})",
            )
        time.sleep(pacing.retry_backoff_s)


@dataclass(frozen=True, slots=True)
class PeerProblemView:
    """A problem one controller (``reporter_id``) has with a peer: DescribeQuorum's ``peer_problems``."""

    reporter_id: int
    peer_id: int
    address: str
    kind: str
    """``unreachable``, or the refusal's error code (INCONSISTENT_CLUSTER_ID, INCONSISTENT_VOTER_SET, …)."""
    detail: str

    def __str__(self) -> str:
        how = (
            f"unreachable at {self.address}"
            if self.kind == "unreachable"
            else f"{self.kind} from {self.address}"
        )
        return f"controller {self.reporter_id} -> {self.peer_id}: {how} ({self.detail})"

    def as_json(self) -> dict[str, object]:
        return {
            "reporter_id": self.reporter_id,
            "peer_id": self.peer_id,
            "address": self.address,
            "kind": self.kind,
            "detail": self.detail,
        }


def peer_problems_of(response: raft_pb2.DescribeQuorumResponse) -> list[PeerProblemView]:
    """The answering controller's own peer problems."""
    return [
        PeerProblemView(response.responder_id, p.peer_id, p.address, p.kind, p.detail)
        for p in response.peer_problems
    ]


def controller_targets(response: raft_pb2.DescribeQuorumResponse) -> list[str]:
    """``host:port`` of every controller the response advertises."""
    targets: list[str] = []
    for node in response.nodes:
        if node.endpoint.port > 0:
            host = node.endpoint.host or "127.0.0.1"
            target = f"[{host}]:{node.endpoint.port}" if ":" in host else f"{host}:{node.endpoint.port}"
            if target not in targets:
                targets.append(target)
    return targets


@dataclass(frozen=True, slots=True)
class QuorumProblems:
    """What every asked controller reports about its peers, and the controllers that did not answer."""

    problems: list[PeerProblemView]
    unanswered: list[str]

    def as_json(self) -> dict[str, object]:
        return {
            "peer_problems": [p.as_json() for p in self.problems],
            "unanswered_controllers": self.unanswered,
        }


def gather_peer_problems(targets: Iterable[str], timeout_s: float = 2.0) -> QuorumProblems:
    """DescribeQuorum on each target itself (no redirect), all at once, each bounded by ``timeout_s``."""
    unique = list(dict.fromkeys(targets))
    if not unique:
        return QuorumProblems([], [])
    with ThreadPoolExecutor(max_workers=min(len(unique), 8)) as pool:
        answers = list(pool.map(lambda target: describe_quorum_at(target, timeout_s), unique))
    problems: dict[tuple[int, int], PeerProblemView] = {}
    unanswered: list[str] = []
    for target, answer in zip(unique, answers, strict=True):
        if answer is None:
            unanswered.append(target)
            continue
        for problem in peer_problems_of(answer):
            problems[(problem.reporter_id, problem.peer_id)] = problem
    return QuorumProblems([problems[key] for key in sorted(problems)], unanswered)


def _leader_state(response: raft_pb2.DescribeQuorumResponse) -> raft_pb2.ReplicaState | None:
    return next((v for v in response.current_voters if v.replica_id == response.leader_id), None)


def quorum_status(response: raft_pb2.DescribeQuorumResponse) -> QuorumStatus:
    """The ``--status`` view, computed as Kafka's MetadataQuorumCommand does."""
    leader = _leader_state(response)
    leader_end = leader.log_end_offset if leader is not None else response.high_watermark
    max_lag = 0
    max_lag_time_ms = 0
    lagging: raft_pb2.ReplicaState | None = None
    for voter in response.current_voters:
        lag = leader_end - voter.log_end_offset
        if lagging is None or lag > max_lag:
            max_lag, lagging = lag, voter
    if lagging is not None and leader is not None and lagging.replica_id != leader.replica_id:
        if leader.last_caught_up_timestamp_ms >= 0 and lagging.last_caught_up_timestamp_ms >= 0:
            max_lag_time_ms = leader.last_caught_up_timestamp_ms - lagging.last_caught_up_timestamp_ms
        else:
            max_lag_time_ms = -1
    return QuorumStatus(
        cluster_id=response.cluster_id,
        leader_id=response.leader_id,
        leader_epoch=response.leader_epoch,
        high_watermark=response.high_watermark,
        max_follower_lag=max(max_lag, 0),
        max_follower_lag_time_ms=max_lag_time_ms,
        current_voters=[v.replica_id for v in response.current_voters],
        current_observers=[o.replica_id for o in response.observers],
        voters=[
            {
                "id": v.replica_id,
                "directory_id": v.directory_id,
                "endpoints": _endpoints_of(response, v.replica_id),
            }
            for v in response.current_voters
        ],
        observers=[{"id": o.replica_id, "directory_id": o.directory_id} for o in response.observers],
    )


def _endpoints_of(response: raft_pb2.DescribeQuorumResponse, node_id: int) -> list[str]:
    return [
        f"{node.endpoint.name or 'CONTROLLER'}://{node.endpoint.host}:{node.endpoint.port}"
        for node in response.nodes
        if node.node_id == node_id and node.endpoint.port > 0
    ]


def replication_rows(response: raft_pb2.DescribeQuorumResponse) -> list[ReplicationRow]:
    """The ``--replication`` rows: the leader first, then followers, then observers (Kafka's order)."""
    leader = _leader_state(response)
    leader_end = leader.log_end_offset if leader is not None else response.high_watermark

    def row(replica: raft_pb2.ReplicaState, status: str) -> ReplicationRow:
        return ReplicationRow(
            node_id=replica.replica_id,
            directory_id=replica.directory_id,
            log_end_offset=replica.log_end_offset,
            lag=max(leader_end - replica.log_end_offset, 0),
            last_fetch_timestamp=replica.last_fetch_timestamp_ms,
            last_caught_up_timestamp=replica.last_caught_up_timestamp_ms,
            status=status,
        )

    rows = [row(leader, "Leader")] if leader is not None else []
    rows += [row(v, "Follower") for v in response.current_voters if v.replica_id != response.leader_id]
    rows += [row(o, "Observer") for o in response.observers]
    return rows


@dataclass(frozen=True, slots=True)
class ControllerEndpoint:
    """A listener of a controller as a VotersRecord stores it."""

    name: str
    host: str
    port: int


def _voter_change_once(
    target: str, method: str, request: Message, timeout_s: float, security: ChannelSecurity | None
) -> raft_pb2.RaftVoterChangeResponse:
    with open_blocking_channel(target, [("grpc.enable_retries", 0)], security) as channel:
        stub = raft_pb2_grpc.RaftServiceStub(channel)
        response: raft_pb2.RaftVoterChangeResponse = getattr(stub, method)(request, timeout=timeout_s)
        return response


def _change_voters(
    bootstrap: Sequence[str],
    method: str,
    request: Message,
    timeout_s: float,
    already_done: tuple[ErrorCode, Callable[[raft_pb2.DescribeQuorumResponse], bool]],
    security: ChannelSecurity | None = None,
    on_retry: Callable[[str], None] | None = None,
    unreachable_timeout_s: float | None = None,
    pacing: Pacing = DEFAULT_PACING,
) -> int | None:
    """Send one voter change to the leader (found from ``bootstrap``, following redirects); returns the
    offset of the committed VotersRecord or raises :class:`KraftError` with the leader's error.

    A leader can append the VotersRecord and then lose leadership before answering: the change may
    commit under the next leader, which then refuses the retry (DUPLICATE_VOTER for an add,
    VOTER_NOT_FOUND for a remove).  ``already_done`` is that error and a check of the voter set: after an
    attempt whose outcome is unknown, that refusal with the change in force is success (None: the
    offset of the earlier attempt's VotersRecord is not known).  ``on_retry`` is told each retry and
    why, one line each (the CLI's ``--verbose``); ``unreachable_timeout_s``: as :func:`describe_quorum`'s."""
    retry = on_retry or (lambda line: None)
    deadline = time.monotonic() + timeout_s
    # One rotation for every DescribeQuorum of the change: an address that failed once is not asked again
    # while another has not failed.
    rotation = address_rotation(bootstrap)
    last_problem = "no leader answered"
    outcome_unknown = False
    refusal, in_force = already_done
    while time.monotonic() < deadline:
        described = describe_quorum(
            rotation,
            timeout_s=max(deadline - time.monotonic(), 0.1),
            security=security,
            unreachable_timeout_s=unreachable_timeout_s,
            pacing=pacing,
        )
        leader = _leader_target(described)
        # The leader refuses an empty cluster id (issue #15); DescribeQuorum told us ours.
        request.cluster_id = described.cluster_id  # type: ignore[attr-defined]
        if leader is None:
            raise KraftError(
                ErrorCode.LEADER_NOT_AVAILABLE, f"leader {described.leader_id} has no known endpoint"
            )
        try:
            # The leader waits (up to the request's timeout_ms) for the change to commit.
            response = _voter_change_once(
                leader, method, request, max(deadline - time.monotonic(), 0.1) + 1.0, security
            )
        except grpc.RpcError as exc:
            status = exc.code().name if isinstance(exc, grpc.Call) else "RPC_ERROR"
            last_problem = f"{leader}: {status}"
            outcome_unknown = True
            retry(f"{method} to leader {leader}: {status}; the outcome is unknown, asking the leader again")
            time.sleep(pacing.retry_backoff_s)
            continue
        code = ErrorCode.from_wire(response.error_code)
        if code is ErrorCode.NONE:
            return response.offset
        if code in _REDIRECTABLE:
            last_problem = f"{leader} is no longer the leader"
            outcome_unknown = True
            retry(f"{method} to {leader}: {code.name} (no longer the leader); finding the new leader")
            time.sleep(pacing.retry_backoff_s)
            continue
        if code is refusal and outcome_unknown:
            now = describe_quorum(
                rotation, timeout_s=max(deadline - time.monotonic(), 0.1), security=security, pacing=pacing
            )
            if in_force(now):
                retry(f"{method}: {code.name} after an unknown outcome, and the change is in force: done")
                return None
        raise KraftError(code, response.error_message or code.name)
    raise KraftError(
        ErrorCode.REQUEST_TIMED_OUT,
        f"the voter change did not complete within {timeout_s:g} s ({last_problem})",
    )


def add_controller(
    bootstrap: Sequence[str],
    node_id: int,
    directory_id: str,
    endpoints: Sequence[ControllerEndpoint],
    timeout_s: float = 30.0,
    security: ChannelSecurity | None = None,
    on_retry: Callable[[str], None] | None = None,
    unreachable_timeout_s: float | None = None,
    pacing: Pacing = DEFAULT_PACING,
) -> int | None:
    """AddRaftVoter (KIP-853): make the controller (``node_id``, ``directory_id``), which must already be
    running as an observer, a voter once it has caught up.  Returns the VotersRecord's offset (None when
    an earlier attempt's change turned out to be in force, see :func:`_change_voters`).
    ``security``: how to dial (on TLS the leader takes voter changes only from a controller
    certificate); None = the process default."""
    request = raft_pb2.AddRaftVoterRequest(
        timeout_ms=int(timeout_s * 1000),
        voter_id=node_id,
        voter_directory_id=directory_id,
        listeners=[raft_pb2.RaftVoterEndpoint(name=e.name, host=e.host, port=e.port) for e in endpoints],
    )

    def added(described: raft_pb2.DescribeQuorumResponse) -> bool:
        return any(
            v.replica_id == node_id and v.directory_id == directory_id for v in described.current_voters
        )

    return _change_voters(
        bootstrap,
        "AddRaftVoter",
        request,
        timeout_s,
        (ErrorCode.DUPLICATE_VOTER, added),
        security,
        on_retry,
        unreachable_timeout_s,
        pacing,
    )


def remove_controller(
    bootstrap: Sequence[str],
    node_id: int,
    directory_id: str,
    timeout_s: float = 30.0,
    on_retry: Callable[[str], None] | None = None,
    unreachable_timeout_s: float | None = None,
    pacing: Pacing = DEFAULT_PACING,
) -> int | None:
    """RemoveRaftVoter (KIP-853); a leader that removes itself hands over once the change commits."""
    request = raft_pb2.RemoveRaftVoterRequest(
        timeout_ms=int(timeout_s * 1000), voter_id=node_id, voter_directory_id=directory_id
    )

    def removed(described: raft_pb2.DescribeQuorumResponse) -> bool:
        return not any(
            v.replica_id == node_id and v.directory_id == directory_id for v in described.current_voters
        )

    return _change_voters(
        bootstrap,
        "RemoveRaftVoter",
        request,
        timeout_s,
        (ErrorCode.VOTER_NOT_FOUND, removed),
        on_retry=on_retry,
        unreachable_timeout_s=unreachable_timeout_s,
        pacing=pacing,
    )
