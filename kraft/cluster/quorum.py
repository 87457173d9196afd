"""Real kraft controller processes on loopback, for the integration tests and the benchmarks.

Both import it from here (no pytest imports in this module).

- :class:`ControllerQuorum` writes one ``.properties`` per node (free ports, ``base_dir/node<N>/``),
  formats storage (``kraft storage format``'s code, in-process), starts every node as
  ``python -m kraft.cli.main controller start --config F`` with stdout/stderr in ``node<N>.log``, and can
  stop (SIGTERM), kill (SIGKILL) and restart single nodes.  It is a context manager: leaving it kills
  whatever is still running; an ``atexit`` hook does the same if the interpreter dies first.
- Queries use blocking gRPC with a timeout on every call; every wait polls a condition with a deadline
  and raises :class:`QuorumTimeout` with the node log tails on failure.
"""

from __future__ import annotations

import atexit
import contextlib
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import grpc

from kraft.client.channel import (
    PLAINTEXT_SECURITY,
    SSL,
    ChannelSecurity,
    KeyStore,
    PemSource,
    TrustStore,
    open_blocking_channel,
)
from kraft.cluster.formatting import format_node_storage
from kraft.cluster.spec import FIRST_BROKER_ID, ClusterLayout, tls_properties
from kraft.config import load_config
from kraft.errors import ErrorCode
from kraft.netutil import free_port, wait_for_port
from kraft.procutil import log_tail, reap, spawn_logged
from kraft.security.ca import write_cluster_tls
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import format_log_dir
from kraft.v1 import raft_pb2, raft_pb2_grpc

T = TypeVar("T")

REPO_ROOT = Path(__file__).resolve().parents[2]
KRAFT_COMMAND = [sys.executable, "-m", "kraft.cli.main"]

# Every process this module started and has not reaped; killed at interpreter exit no matter what.
_LIVE: dict[int, subprocess.Popen[bytes]] = {}


def _kill_leftovers() -> None:
    for process in list(_LIVE.values()):
        if process.poll() is None:
            process.kill()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(timeout=5)
    _LIVE.clear()


atexit.register(_kill_leftovers)


class QuorumTimeout(AssertionError):
    """A condition on the quorum did not hold before its deadline (message includes node log tails)."""


def wait_until(condition: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.05) -> T:
    """Poll ``condition`` until it returns something other than None/False; raise QuorumTimeout after."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = condition()
        if value is not None and value is not False:
            return value
        if time.monotonic() >= deadline:
            raise QuorumTimeout(f"timed out after {timeout_s:.1f} s waiting for {what}")
        time.sleep(interval_s)


def run_kraft(args: list[str], timeout_s: float = 60.0) -> subprocess.CompletedProcess[str]:
    """Run one ``kraft`` CLI command to completion (bounded); returns the completed process."""
    return subprocess.run(
        [*KRAFT_COMMAND, *args],
        capture_output=True,
        text=True,
        timeout=timeout_s,
        cwd=REPO_ROOT,
        check=False,
    )


@dataclass
class ControllerProc:
    """One controller node: its config, data dir, log file and (while running) its process."""

    node_id: int
    port: int
    base_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def config_path(self) -> Path:
        return self.base_dir / f"node{self.node_id}.properties"

    @property
    def log_path(self) -> Path:
        return self.base_dir / f"node{self.node_id}.log"

    @property
    def metadata_dir(self) -> Path:
        return self.base_dir / f"node{self.node_id}" / "metadata"

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def start(self, extra_env: Mapping[str, str] | None = None) -> None:
        if self.alive:
            raise RuntimeError(f"node {self.node_id} is already running (pid {self.pid})")
        self.process = spawn_logged(
            [*KRAFT_COMMAND, "controller", "start", "--config", str(self.config_path)],
            self.log_path,
            banner=f"--- start node {self.node_id} at {time.time():.3f} ---",
            extra_env=extra_env,
            cwd=REPO_ROOT,
        )
        _LIVE[self.process.pid] = self.process

    def wait_listening(self, timeout_s: float = 30.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive:
                raise RuntimeError(
                    f"node {self.node_id} exited with {self.exit_code()} during startup:\n{self.log_tail()}"
                )
            if wait_for_port("127.0.0.1", self.port, 0.2):
                return
        raise QuorumTimeout(f"node {self.node_id} did not listen on {self.target} within {timeout_s} s")

    def exit_code(self) -> int | None:
        return self.process.poll() if self.process is not None else None

    def terminate(self, timeout_s: float = 20.0) -> int:
        """SIGTERM (graceful: resign + clean shutdown) and wait; SIGKILL if it overstays. Exit code."""
        process = self.process
        if process is None:
            return 0
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        code = reap(process, timeout_s, kill_wait_s=10)
        if code is None:
            raise QuorumTimeout(f"node {self.node_id} (pid {process.pid}) survived SIGKILL")
        _LIVE.pop(process.pid, None)
        return code

    def wait_exit(self, timeout_s: float = 20.0) -> int:
        """Wait for the process to exit by itself; its exit code (SIGKILL after ``timeout_s``)."""
        process = self.process
        if process is None:
            return 0
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
            raise QuorumTimeout(f"node {self.node_id} did not exit within {timeout_s} s") from None
        _LIVE.pop(process.pid, None)
        return code

    def kill(self) -> None:
        """SIGKILL: no resignation, no clean-shutdown marker, unflushed data lost."""
        process = self.process
        if process is None:
            return
        if process.poll() is None:
            process.kill()
        process.wait(timeout=10)
        _LIVE.pop(process.pid, None)

    def log_tail(self, lines: int = 30) -> str:
        return log_tail(self.log_path, lines)


@dataclass
class QuorumView:
    """What one node's DescribeQuorum said (``leader`` is only True on the answering leader)."""

    node_id: int
    error_code: ErrorCode
    leader_id: int
    leader_epoch: int
    high_watermark: int
    response: raft_pb2.DescribeQuorumResponse

    @property
    def is_leader(self) -> bool:
        return self.error_code is ErrorCode.NONE and self.leader_id == self.node_id


@dataclass
class ControllerQuorum:
    """``size`` controllers under ``base_dir``; ``overrides`` are extra config keys for every node."""

    base_dir: Path
    size: int = 3
    overrides: Mapping[str, str] = field(default_factory=dict)
    cluster_id: str = ""
    test_append: bool = True
    tls: bool = False
    """Mutual TLS on every node (a local CA under ``base_dir/tls``); queries use the ``admin`` cert."""
    dynamic: bool = False
    """A dynamic quorum (KIP-853): every node finds it through node 1 (``controller.quorum.bootstrap.
    servers``); node 1 is formatted ``--standalone``, the others ``--no-initial-controllers`` and join as
    observers until ``kraft quorum add-controller`` adds them."""
    nodes: dict[int, ControllerProc] = field(default_factory=dict)
    _channels: dict[int, grpc.Channel] = field(default_factory=dict)

    @property
    def tls_dir(self) -> Path:
        return self.base_dir / "tls"

    def client_security(self, name: str = "admin") -> ChannelSecurity:
        """How a client with certificate ``name`` (issued by :meth:`prepare`) reaches the nodes."""
        if not self.tls:
            return PLAINTEXT_SECURITY
        return ChannelSecurity(
            SSL,
            TrustStore(PemSource(path=self.tls_dir / "ca.pem")),
            KeyStore.from_file(self.tls_dir / f"{name}.pem"),
        )

    # --- lifecycle ---

    def __enter__(self) -> ControllerQuorum:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def prepare(self) -> None:
        """Pick ports, write configs and format storage (idempotent for the ports already picked)."""
        self.base_dir.mkdir(parents=True, exist_ok=True)
        if not self.cluster_id:
            self.cluster_id = random_uuid()
        if not self.nodes:
            self.nodes = {i: ControllerProc(i, free_port(), self.base_dir) for i in range(1, self.size + 1)}
        if self.tls and not (self.tls_dir / "ca.pem").exists():
            names = [f"controller-{i}" for i in self.nodes] + ["admin", f"broker-{FIRST_BROKER_ID}"]
            write_cluster_tls(self.tls_dir, names)
        for node in self.nodes.values():
            node.config_path.write_text(self.config_text(node.node_id))
            if not (node.metadata_dir / "meta.properties").exists():
                self.format(node.node_id)

    def config_text(self, node_id: int) -> str:
        node = self.nodes[node_id]
        voters = ",".join(f"{n.node_id}@127.0.0.1:{n.port}" for n in self.nodes.values())
        quorum = (
            {"controller.quorum.bootstrap.servers": self.nodes[min(self.nodes)].target}
            if self.dynamic
            else {"controller.quorum.voters": voters}
        )
        keys: dict[str, str] = {
            "process.roles": "controller",
            "node.id": str(node_id),
            **quorum,
            "listeners": f"CONTROLLER://127.0.0.1:{node.port}",
            "metadata.log.dir": str(node.metadata_dir),
            "kraft.test.append.enable": "true" if self.test_append else "false",
            **(tls_properties(ClusterLayout(self.base_dir), f"controller-{node_id}") if self.tls else {}),
            **self.overrides,
        }
        return "".join(f"{key}={value}\n" for key, value in keys.items())

    def format(self, node_id: int) -> None:
        """What ``kraft storage format`` does, in-process (a CLI run per node costs a second)."""
        node = self.nodes[node_id]
        if self.dynamic:
            first = node_id == min(self.nodes)
            format_node_storage(
                load_config(node.config_path),
                self.cluster_id,
                standalone=first,
                no_initial_controllers=not first,
            )
            return
        format_log_dir(node.metadata_dir, cluster_id=self.cluster_id, node_id=node_id)

    def start(self, timeout_s: float = 30.0) -> None:
        """Prepare if needed, start every node that is not running, wait until each listens."""
        if not self.nodes or not all(n.config_path.exists() for n in self.nodes.values()):
            self.prepare()
        started = [node for node in self.nodes.values() if not node.alive]
        for node in started:
            node.start()
        for node in started:
            node.wait_listening(timeout_s)

    def restart(self, node_id: int, timeout_s: float = 30.0) -> None:
        node = self.nodes[node_id]
        if node.alive:
            node.terminate()
        self._drop_channel(node_id)
        node.start()
        node.wait_listening(timeout_s)

    def terminate(self, node_id: int, timeout_s: float = 20.0) -> int:
        self._drop_channel(node_id)
        return self.nodes[node_id].terminate(timeout_s)

    def kill(self, node_id: int) -> None:
        self._drop_channel(node_id)
        self.nodes[node_id].kill()

    def close(self) -> None:
        """Kill every node still running and close channels; safe to call twice."""
        for node_id in list(self._channels):
            self._drop_channel(node_id)
        for node in self.nodes.values():
            node.kill()

    @property
    def live_ids(self) -> list[int]:
        return [node_id for node_id, node in self.nodes.items() if node.alive]

    # --- queries (blocking gRPC, each bounded by a timeout) ---

    def _channel(self, node_id: int) -> grpc.Channel:
        channel = self._channels.get(node_id)
        if channel is None:
            channel = open_blocking_channel(
                self.nodes[node_id].target,
                options=[("grpc.max_receive_message_length", 64 << 20), ("grpc.enable_retries", 0)],
                security=self.client_security(),
            )
            self._channels[node_id] = channel
        return channel

    def _drop_channel(self, node_id: int) -> None:
        channel = self._channels.pop(node_id, None)
        if channel is not None:
            channel.close()

    def describe(self, node_id: int, timeout_s: float = 2.0) -> QuorumView | None:
        """DescribeQuorum on one node; None when it does not answer."""
        stub = raft_pb2_grpc.RaftServiceStub(self._channel(node_id))
        try:
            answer = stub.DescribeQuorum(
                raft_pb2.DescribeQuorumRequest(cluster_id=self.cluster_id), timeout=timeout_s
            )
        except grpc.RpcError:
            return None
        return QuorumView(
            node_id,
            ErrorCode.from_wire(answer.error_code),
            answer.leader_id,
            answer.leader_epoch,
            answer.high_watermark,
            answer,
        )

    def current_leader(self, among: Iterable[int] | None = None) -> QuorumView | None:
        """The live node answering DescribeQuorum as leader, if all live nodes that answer agree on it."""
        ids = list(among) if among is not None else self.live_ids
        views = [view for view in (self.describe(i, 1.0) for i in ids) if view is not None]
        leaders = [view for view in views if view.is_leader]
        if len(leaders) != 1:
            return None
        leader = leaders[0]
        agree = all(v.leader_id == leader.leader_id and v.leader_epoch == leader.leader_epoch for v in views)
        return leader if agree else None

    def wait_for_leader(
        self, timeout_s: float = 30.0, *, exclude: Iterable[int] = (), min_epoch: int = 0
    ) -> QuorumView:
        """Wait until the live nodes agree on one leader (not in ``exclude``, epoch ≥ ``min_epoch``)."""
        excluded = set(exclude)

        def agreed() -> QuorumView | None:
            leader = self.current_leader()
            if leader is None or leader.leader_id in excluded or leader.leader_epoch < min_epoch:
                return None
            return leader

        return self._wait(agreed, timeout_s, "the live controllers to agree on one leader")

    def wait_caught_up(self, node_id: int, offset: int, timeout_s: float = 30.0) -> None:
        """Wait until the leader reports ``node_id``'s log end offset ≥ ``offset``."""

        def caught_up() -> bool:
            leader = self.current_leader()
            if leader is None:
                return False
            replicas = [*leader.response.current_voters, *leader.response.observers]
            return any(r.replica_id == node_id and r.log_end_offset >= offset for r in replicas)

        self._wait(caught_up, timeout_s, f"node {node_id} to reach offset {offset}")

    def append(self, values: list[bytes], timeout_s: float = 20.0) -> tuple[int, int]:
        """TestAppend ``values`` as one batch, retrying across leader changes; (base, last) offsets."""
        deadline = time.monotonic() + timeout_s
        target: int | None = None
        last_error = "no attempt"
        while time.monotonic() < deadline:
            candidates = [target] if target is not None else self.live_ids
            target = None
            for node_id in candidates:
                if not self.nodes[node_id].alive:
                    continue
                stub = raft_pb2_grpc.RaftTestServiceStub(self._channel(node_id))
                request = raft_pb2.TestAppendRequest(cluster_id=self.cluster_id, values=values)
                try:
                    answer = stub.TestAppend(request, timeout=max(0.1, min(5.0, deadline - time.monotonic())))
                except grpc.RpcError as exc:
                    status = exc.code().name if isinstance(exc, grpc.Call) else "RPC_ERROR"
                    last_error = f"node {node_id}: {status}"
                    continue
                code = ErrorCode.from_wire(answer.error_code)
                if code is ErrorCode.NONE:
                    return answer.base_offset, answer.last_offset
                last_error = f"node {node_id}: {code.name} {answer.error_message}"
                if answer.leader_id in self.nodes and answer.leader_id != node_id:
                    target = answer.leader_id
                    break
            if target is None:
                time.sleep(0.05)
        raise QuorumTimeout(f"append not committed within {timeout_s} s ({last_error})\n{self.diagnostics()}")

    def digest(self, node_id: int, timeout_s: float = 2.0) -> raft_pb2.TestDigestResponse | None:
        """TestDigest on one node (its applied offset, record count and digest); None if no answer."""
        stub = raft_pb2_grpc.RaftTestServiceStub(self._channel(node_id))
        request = raft_pb2.TestDigestRequest(cluster_id=self.cluster_id)
        try:
            answer: raft_pb2.TestDigestResponse = stub.TestDigest(request, timeout=timeout_s)
        except grpc.RpcError:
            return None
        return answer

    def wait_converged(self, timeout_s: float = 30.0) -> dict[int, raft_pb2.TestDigestResponse]:
        """Wait until every live node applied the leader's committed log (same offset and digest)."""

        def converged() -> dict[int, raft_pb2.TestDigestResponse] | None:
            leader = self.current_leader()
            if leader is None:
                return None
            digests = {node_id: self.digest(node_id, 1.0) for node_id in self.live_ids}
            answered = {k: v for k, v in digests.items() if v is not None}
            if len(answered) != len(digests):
                return None
            offsets = {d.applied_offset for d in answered.values()}
            if offsets != {leader.high_watermark} or len({d.digest for d in answered.values()}) != 1:
                return None
            return answered

        return self._wait(converged, timeout_s, "every live node to apply the same committed log")

    def _wait(self, condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
        try:
            return wait_until(condition, timeout_s, what)
        except QuorumTimeout as exc:
            raise QuorumTimeout(f"{exc}\n{self.diagnostics()}") from None

    def diagnostics(self, lines: int = 25) -> str:
        """Each node's state and log tail, for failure messages."""
        parts = []
        for node in self.nodes.values():
            state = "running" if node.alive else f"exited({node.exit_code()})"
            parts.append(f"--- node {node.node_id} {node.target} {state} ---\n{node.log_tail(lines)}")
        return "\n".join(parts)


# What the ``quorum_factory`` fixture returns: ``factory(size=3, overrides=..., test_append=...)``.
QuorumFactory = Callable[..., ControllerQuorum]
