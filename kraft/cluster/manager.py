"""``LocalCluster``: a whole cluster under one directory — create, start, observe, wait, stop.

Typical use (the CLI and the chaos harness)::

    cluster = LocalCluster.create(Path("/tmp/c"), controllers=3, brokers=3, profile="fast")
    cluster.start()
    cluster.wait_healthy(timeout_s=60)
    cluster.kill("controller-1"); cluster.start(["controller-1"]); cluster.wait_node_ready(1, 30)
    cluster.down()

The directory is the only state: ``cluster.json`` (the spec), ``config/``, ``data/``, ``logs/``, ``run/``
(pid files), so a later ``LocalCluster.open(dir)`` — another CLI invocation — finds the same processes.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kraft.client.channel import PLAINTEXT_SECURITY, ChannelSecurity
from kraft.client.properties import ClientConfig, load_client_config
from kraft.client.quorum import describe_quorum
from kraft.cluster.formatting import format_node_storage
from kraft.cluster.membership import add_joining_controller, joining_controller
from kraft.cluster.probe import broker_serving, cluster_view, quorum_view
from kraft.cluster.process import NodeProcess, ProcessError
from kraft.cluster.spec import (
    ADMIN_CLIENT,
    AddressOf,
    AdvertisedOf,
    ClusterLayout,
    ClusterSpec,
    NodeRole,
    NodeSpec,
    client_properties,
    node_properties,
    plan_cluster,
)
from kraft.config import ConfigError, format_properties, load_config
from kraft.errors import KraftError
from kraft.netutil import port_in_use
from kraft.security.ca import write_cluster_tls
from kraft.storage.ids import random_uuid
from kraft.storage.meta_properties import read_meta_properties

_FATAL = " event=fatal "
CONTROLLER_READY = frozenset({"leader", "follower", "observer"})
"""``observer``: a controller of a dynamic quorum that follows the leader but is not a voter (not added
yet, or removed)."""
BROKER_READY = frozenset({"active"})


class ClusterError(Exception):
    """A cluster operation that cannot proceed; the message is one line for the user."""


@dataclass(frozen=True, slots=True)
class NodeStatus:
    node_id: int
    role: NodeRole
    name: str
    pid: int | None
    endpoint: str
    state: str
    log: str
    exit_code: int | None = None
    """For a ``failed``/``exited`` node: its exit status (70 = fatal error, 1 = could not start)."""
    last_error: str = ""
    """For a ``failed`` node: its last ``event=fatal`` line (or ``error:`` line) from its log."""
    metrics_port: int = 0
    """Its Prometheus port (0: none; ``cluster up --metrics`` gives every node one)."""
    peer_problems: tuple[str, ...] = ()
    """For a running controller: what it reports about its peers (an unreachable voter with the address
    it dials, INCONSISTENT_CLUSTER_ID / INCONSISTENT_VOTER_SET refusals), from DescribeQuorum."""

    @property
    def ready(self) -> bool:
        return self.state in (CONTROLLER_READY if self.role is NodeRole.CONTROLLER else BROKER_READY)

    def as_json(self) -> dict[str, Any]:
        return {
            "id": self.node_id,
            "role": str(self.role),
            "name": self.name,
            "pid": self.pid,
            "endpoint": self.endpoint,
            "state": self.state,
            "log": self.log,
            "exit_code": self.exit_code,
            "last_error": self.last_error,
            "metrics_port": self.metrics_port or None,
            "peer_problems": list(self.peer_problems),
        }


@dataclass(frozen=True, slots=True)
class ClusterStatus:
    """A point-in-time view of every node.

    Controller states: ``stopped``, ``starting`` (process up, not answering), ``electing`` (no leader
    known), ``leader``, ``follower``, ``observer`` (follows the leader but is not a voter: a dynamic
    quorum's controller not added yet, or removed).  Any node: ``failed`` (it exited by itself with a
    ``fatal`` or ``error:`` line or a non-zero status: see ``exit_code`` / ``last_error``), ``exited``
    (it is gone without saying why, e.g. SIGKILL).  Broker states: ``stopped``, ``starting`` (no active
    controller to ask), ``registering`` (not registered yet), or the controller's view lower-cased:
    ``fenced``, ``active``, ``controlled_shutdown``, ``offline``.
    """

    cluster_id: str
    dir: str
    leader_id: int
    nodes: tuple[NodeStatus, ...]

    @property
    def healthy(self) -> bool:
        """One leader, every controller following it, every broker unfenced."""
        return self.leader_id >= 0 and all(node.ready for node in self.nodes)

    def node(self, node_id: int) -> NodeStatus:
        return next(n for n in self.nodes if n.node_id == node_id)

    def summary(self) -> str:
        """One line for progress displays and timeout messages."""
        controllers = [n for n in self.nodes if n.role is NodeRole.CONTROLLER]
        brokers = [n for n in self.nodes if n.role is NodeRole.BROKER]
        leader = f"leader {self.leader_id}" if self.leader_id >= 0 else "no leader"
        waiting = ", ".join(f"{n.name} {n.state}" for n in self.nodes if not n.ready)
        ready_brokers = sum(n.ready for n in brokers)
        text = f"{leader}; controllers {sum(n.ready for n in controllers)}/{len(controllers)} ready"
        text += f"; brokers {ready_brokers}/{len(brokers)} active"
        return text + (f" (waiting: {waiting})" if waiting else "")

    def as_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "dir": self.dir,
            "leader_id": self.leader_id,
            "healthy": self.healthy,
            "bootstrap_controller": self.bootstrap(NodeRole.CONTROLLER),
            "bootstrap_server": self.bootstrap(NodeRole.BROKER),
            "nodes": [n.as_json() for n in self.nodes],
        }

    def bootstrap(self, role: NodeRole) -> str:
        """Every ``role`` node's endpoint, comma-separated: the value of ``--bootstrap-controller``
        (controllers) or ``--bootstrap-server`` (brokers)."""
        return ",".join(n.endpoint for n in self.nodes if n.role is role)


class LocalCluster:
    """The processes of one cluster directory."""

    def __init__(
        self,
        layout: ClusterLayout,
        spec: ClusterSpec,
        *,
        address_of: AddressOf | None = None,
        extra_env: Mapping[str, str] | None = None,
        advertised_of: AdvertisedOf | None = None,
    ) -> None:
        """``advertised_of``: a broker's ``advertised.listeners`` address by node id (e.g. a proxy in
        front of it); None = brokers advertise their ``listeners``."""
        self.layout = layout
        self.spec = spec
        self.address_of = address_of
        self.advertised_of = advertised_of
        self._processes = {n.node_id: NodeProcess(n, layout, dict(extra_env or {})) for n in spec.nodes}

    # --- creation -------------------------------------------------------------------------------------

    @classmethod
    def create(
        cls,
        root: Path,
        *,
        controllers: int = 3,
        brokers: int = 3,
        base_port: int | None = None,
        host: str = "127.0.0.1",
        profile: str = "default",
        metrics: bool = False,
        overrides: Mapping[str, str] | None = None,
        cluster_id: str | None = None,
        address_of: AddressOf | None = None,
        extra_env: Mapping[str, str] | None = None,
        spec: ClusterSpec | None = None,
        tls: bool = False,
        authorizer: bool | None = None,
        dynamic: bool = False,
    ) -> LocalCluster:
        """Plan ids and ports, write every config, format every node's storage, save ``cluster.json``.

        ``dynamic``: a KIP-853 quorum — only the first controller is a voter until :meth:`grow_quorum`
        adds the others (``kraft cluster up --dynamic`` does).

        Pass ``spec`` (from :func:`plan_cluster`) to use ports planned earlier — e.g. to set up proxies
        first; the sizing arguments are then ignored.  ``authorizer`` (default: ``tls``) configures the
        StandardAuthorizer with the cluster's own certificates as ``super.users``.  Refuses a directory
        that already holds a cluster, and ports that are already taken.
        """
        layout = ClusterLayout(root.resolve())
        if layout.state_path.exists():
            raise ClusterError(
                f"{layout.root} already holds a cluster; start it with `kraft cluster up --dir {root}` "
                "or remove it with `kraft cluster down --purge`"
            )
        try:
            spec = spec or plan_cluster(
                cluster_id or random_uuid(),
                controllers,
                brokers,
                base_port=base_port,
                host=host,
                profile=profile,
                metrics=metrics,
                overrides=overrides,
                tls=tls,
                authorizer=authorizer,
                dynamic=dynamic,
            )
        except ValueError as exc:
            raise ClusterError(str(exc)) from None
        cluster = cls(layout, spec, address_of=address_of, extra_env=extra_env)
        cluster.check_ports_free(spec.nodes)
        if spec.tls:
            cluster.write_tls()
        cluster.write_configs()
        cluster.format_storage()
        layout.save(spec)
        return cluster

    @classmethod
    def open(
        cls,
        root: Path,
        *,
        address_of: AddressOf | None = None,
        extra_env: Mapping[str, str] | None = None,
    ) -> LocalCluster:
        """The cluster saved in ``root``; :class:`ClusterError` if there is none."""
        layout = ClusterLayout(root.resolve())
        try:
            spec = layout.load()
        except ValueError as exc:
            raise ClusterError(str(exc)) from None
        if spec is None:
            raise ClusterError(
                f"no cluster in {layout.root} (create one with `kraft cluster up --dir {root}`)"
            )
        return cls(layout, spec, address_of=address_of, extra_env=extra_env)

    def write_tls(self) -> None:
        """A local CA, one certificate per node (``CN=controller-1``, ``CN=broker-101``) and one for the
        CLI (``CN=admin``), and ``client.properties`` naming the admin certificate."""
        names = [node.name for node in self.spec.nodes] + [ADMIN_CLIENT]
        write_cluster_tls(self.layout.tls_dir, names)
        header = f"kraft CLI --command-config for cluster {self.spec.cluster_id} (admin certificate)"
        self.layout.client_properties.write_text(
            format_properties(client_properties(self.layout), header=header), encoding="utf-8"
        )

    def client_config(self) -> ClientConfig:
        """This cluster's ``client.properties`` (:mod:`kraft.client.properties`: TLS, written by ``kraft
        cluster up --tls``; the timeouts a user adds): read when the cluster is TLS or the file exists, so a
        plaintext cluster's directory may carry the CLI's ``request.timeout.ms`` too."""
        path = self.layout.client_properties
        if not self.spec.tls and not path.exists():
            return ClientConfig()
        try:
            return load_client_config(path, what="client properties")
        except ConfigError as exc:
            raise ClusterError(str(exc)) from None

    def client_security(self) -> ChannelSecurity:
        """How a local client reaches this cluster's nodes (its ``client.properties`` when TLS)."""
        return self.client_config().security if self.spec.tls else PLAINTEXT_SECURITY

    def write_configs(self) -> None:
        """(Re)write every node's ``.properties`` from the spec (and ``address_of``, if given)."""
        # Render (and validate) all of them before writing any: a bad override leaves nothing behind.
        rendered = {
            node: node_properties(self.spec, node, self.layout, self.address_of, self.advertised_of)
            for node in self.spec.nodes
        }
        for node, props in rendered.items():
            path = self.layout.config_path(node)
            path.parent.mkdir(parents=True, exist_ok=True)
            header = f"{node.name} of cluster {self.spec.cluster_id} (generated by kraft cluster)"
            path.write_text(format_properties(props, header=header), encoding="utf-8")

    def format_storage(self) -> None:
        """``kraft storage format`` for every node; on a dynamic quorum the first controller
        ``--standalone`` (a one-voter quorum), the other controllers ``--no-initial-controllers``."""
        first = min((c.node_id for c in self.spec.controllers), default=None)
        for node in self.spec.nodes:
            cfg = load_config(self.layout.config_path(node))
            dynamic_controller = self.spec.dynamic and node.role is NodeRole.CONTROLLER
            format_node_storage(
                cfg,
                self.spec.cluster_id,
                ignore_formatted=True,
                standalone=dynamic_controller and node.node_id == first,
                no_initial_controllers=dynamic_controller and node.node_id != first,
            )

    # --- a dynamic quorum (KIP-853) -------------------------------------------------------------------

    def voters(self, timeout_s: float = 10.0) -> tuple[int, ...]:
        """The ids of the voter set in force, as the leader describes it."""
        described = describe_quorum(
            [c.target for c in self.spec.controllers], timeout_s, self.client_security()
        )
        return tuple(sorted(v.replica_id for v in described.current_voters))

    def add_controller(self, key: int | str, timeout_s: float = 30.0) -> int | None:
        """Make a running controller of a dynamic quorum a voter, as ``kraft quorum add-controller
        --command-config <its config>`` does; returns the committed VotersRecord's offset."""
        proc = self.process(key)
        if proc.node.role is not NodeRole.CONTROLLER:
            raise ClusterError(f"{proc.node.name} is not a controller")
        try:
            joiner = joining_controller(self.layout.config_path(proc.node))
            return add_joining_controller([c.target for c in self.spec.controllers], joiner, timeout_s)
        except (KraftError, OSError) as exc:
            raise ClusterError(f"cannot add {proc.node.name} to the voters: {exc}") from None

    def grow_quorum(
        self, timeout_s: float, on_status: Callable[[ClusterStatus], None] | None = None
    ) -> list[tuple[str, int | None]]:
        """Build a new dynamic quorum: start the first controller (a one-voter quorum), wait for it to
        lead, start the others (observers) and add them one at a time (each once it has caught up: one
        voter change at a time, KIP-853).  Bounded by ``timeout_s`` in all; returns (name, offset) per
        added controller."""
        if not self.spec.dynamic:
            raise ClusterError("grow_quorum is for a dynamic quorum (cluster up --dynamic)")
        deadline = time.monotonic() + timeout_s
        first, *joiners = sorted(c.node_id for c in self.spec.controllers)
        self.start([first])
        self.wait_until(
            lambda s: s.leader_id == first,
            timeout_s,
            what=f"controller-{first} to lead its one-voter quorum",
            expect_running=[first],
            on_status=on_status,
        )
        self.start(joiners)
        added: list[tuple[str, int | None]] = []
        for node_id in joiners:
            if node_id in self.voters(max(deadline - time.monotonic(), 1.0)):
                continue  # already a voter
            self._check_alive([self.process(node_id)])
            offset = self.add_controller(node_id, max(deadline - time.monotonic(), 1.0))
            added.append((self.process(node_id).node.name, offset))
        return added

    def check_ports_free(self, nodes: Iterable[NodeSpec]) -> None:
        for node in nodes:
            for port, what in ((node.port, "listener"), (node.metrics_port, "metrics port")):
                if port and port_in_use(node.host, port):
                    raise ClusterError(
                        f"port {port} ({node.name} {what}) on {node.host} is already in use; "
                        "stop whatever holds it or choose another --base-port"
                    )

    # --- processes ------------------------------------------------------------------------------------

    def process(self, key: int | str) -> NodeProcess:
        """A node's process handle by id (``1``, ``101``) or name (``controller-1``)."""
        try:
            node = self.spec.node(key)
        except KeyError as exc:
            raise ClusterError(str(exc.args[0])) from None
        return self._processes[node.node_id]

    def _select(self, keys: Iterable[int | str] | None) -> list[NodeProcess]:
        chosen = list(self._processes.values()) if keys is None else [self.process(k) for k in keys]
        # Controllers first on start (brokers need a quorum to register with).
        return sorted(chosen, key=lambda p: (p.node.role is not NodeRole.CONTROLLER, p.node.node_id))

    def running(self) -> dict[str, int]:
        """Name → pid of every node process that is running now."""
        return {p.node.name: pid for p in self._select(None) if (pid := p.pid()) is not None}

    def start(self, keys: Iterable[int | str] | None = None) -> dict[str, int]:
        """Start the given nodes (default: all that are not running); returns name → pid."""
        to_start = [p for p in self._select(keys) if not p.is_running()]
        self.check_ports_free(p.node for p in to_start)
        started: dict[str, int] = {}
        for proc in to_start:
            try:
                started[proc.node.name] = proc.start()
            except (OSError, ProcessError) as exc:
                raise ClusterError(f"cannot start {proc.node.name}: {exc}") from None
        return started

    def stop(self, key: int | str, timeout_s: float = 15.0) -> str:
        """Graceful stop of one node (SIGTERM, SIGKILL after ``timeout_s``)."""
        return self.process(key).stop(timeout_s)

    def kill(self, key: int | str) -> bool:
        """SIGKILL one node (a crash)."""
        return self.process(key).kill()

    def restart(self, key: int | str, timeout_s: float = 15.0) -> int:
        proc = self.process(key)
        proc.stop(timeout_s)
        return self.start([proc.node.node_id])[proc.node.name]

    def down(self, timeout_s: float = 15.0) -> dict[str, str]:
        """Stop everything: brokers first (controlled shutdown needs the controllers), then controllers.

        Each group gets SIGTERM at once and ``timeout_s`` to exit before SIGKILL.  Returns name → outcome.
        """
        outcomes: dict[str, str] = {}
        for role in (NodeRole.BROKER, NodeRole.CONTROLLER):
            group = [p for p in self._select(None) if p.node.role is role]
            pids = {p.node.name: p.request_stop() for p in group}
            for proc in group:
                outcomes[proc.node.name] = proc.finish_stop(pids[proc.node.name], timeout_s)
        return outcomes

    # --- observation ----------------------------------------------------------------------------------

    def status(self, probe_timeout_s: float = 1.0) -> ClusterStatus:
        pids = {node_id: proc.pid() for node_id, proc in self._processes.items()}
        views = {
            c.node_id: quorum_view(c.target, probe_timeout_s) if pids[c.node_id] is not None else None
            for c in self.spec.controllers
        }
        # The leader is the controller that says it leads (highest epoch wins a stale claim).
        claims = [
            (v.leader_epoch, node_id)
            for node_id, v in views.items()
            if v is not None and v.leader_id == node_id
        ]
        leader_id = max(claims)[1] if claims else -1
        leader_view = views.get(leader_id)
        voters = dict(leader_view.voters) if leader_view is not None else {}
        brokers = None
        if leader_id >= 0 and self.spec.brokers:
            leader = self.spec.node(leader_id)
            cluster = cluster_view(leader.target, self.spec.cluster_id, probe_timeout_s)
            brokers = None if cluster is None else cluster.brokers
        nodes: list[NodeStatus] = []
        for node in self.spec.nodes:
            pid = pids[node.node_id]
            log = str(self.layout.log_path(node))
            if pid is None:
                ended = self._processes[node.node_id].last_exit()
                if ended is not None:
                    state = "failed" if ended.failed else "exited"
                    nodes.append(
                        NodeStatus(
                            node.node_id, node.role, node.name, None, node.target, state, log,
                            exit_code=ended.code, last_error=ended.line, metrics_port=node.metrics_port,
                        )
                    )  # fmt: skip
                    continue
                state = "stopped"
            elif node.role is NodeRole.CONTROLLER:
                view = views[node.node_id]
                if view is None:
                    state = "starting"
                elif view.leader_id < 0:
                    state = "electing"
                elif view.leader_id == node.node_id:
                    state = "leader"
                else:
                    voter = node.node_id in voters and voters[node.node_id] in ("", self._directory_id(node))
                    state = "observer" if voters and not voter else "follower"
            elif brokers is None:
                state = "starting"
            else:
                broker = brokers.get(node.node_id)
                state = broker.state.lower() if broker is not None else "registering"
                # Right after a restart the controller may still show the old incarnation as active;
                # only the broker itself knows whether this process is serving yet.
                if state == "active" and not broker_serving(node.target, probe_timeout_s):
                    state = "starting"
            view = views.get(node.node_id)
            nodes.append(
                NodeStatus(
                    node.node_id, node.role, node.name, pid, node.target, state, log,
                    metrics_port=node.metrics_port,
                    peer_problems=view.peer_problems if view is not None else (),
                )
            )  # fmt: skip
        return ClusterStatus(self.spec.cluster_id, str(self.layout.root), leader_id, tuple(nodes))

    def _directory_id(self, node: NodeSpec) -> str | None:
        """The directory id in a node's ``meta.properties`` (None if it cannot be read)."""
        try:
            return read_meta_properties(self.layout.data_dir(node)).directory_id
        except KraftError:
            return None

    def _check_alive(self, expected: Iterable[NodeProcess]) -> None:
        for proc in expected:
            if not proc.is_running():
                code = proc.exit_code()
                how = f"exited with code {code}" if code is not None else "is not running"
                ended = proc.last_exit()
                # Skip box-drawing and blank lines (typer/rich error boxes): show the last line with words.
                wordy = [line.strip(" │╭╮╰╯─") for line in proc.log_tail(20) if re.search(r"\w{3}", line)]
                last = f"; last log line: {wordy[-1]}" if wordy else ""
                if ended is not None and ended.line and _FATAL in ended.line:
                    last = f"; {ended.line}"  # the one fatal line says why (fail-stop)
                raise ClusterError(f"{proc.node.name} {how} (log {proc.log_path}){last}")

    def wait_until(
        self,
        predicate: Callable[[ClusterStatus], bool],
        timeout_s: float,
        *,
        what: str = "the condition",
        expect_running: Iterable[int | str] | None = None,
        on_status: Callable[[ClusterStatus], None] | None = None,
        interval_s: float = 0.2,
    ) -> ClusterStatus:
        """Poll :meth:`status` until ``predicate`` holds; :class:`ClusterError` on timeout or on a node in
        ``expect_running`` (default: none) dying meanwhile."""
        expected = [self.process(k) for k in expect_running] if expect_running is not None else []
        deadline = time.monotonic() + timeout_s
        while True:
            status = self.status()
            if on_status is not None:
                on_status(status)
            if predicate(status):
                return status
            self._check_alive(expected)
            if time.monotonic() >= deadline:
                raise ClusterError(f"timed out after {timeout_s:g} s waiting for {what}: {status.summary()}")
            time.sleep(interval_s)

    def wait_healthy(
        self, timeout_s: float = 60.0, on_status: Callable[[ClusterStatus], None] | None = None
    ) -> ClusterStatus:
        """Wait until the quorum has a leader every controller follows and every broker is unfenced."""
        return self.wait_until(
            lambda s: s.healthy,
            timeout_s,
            what="a healthy cluster",
            expect_running=[n.node_id for n in self.spec.nodes],
            on_status=on_status,
        )

    def wait_node_ready(
        self,
        key: int | str,
        timeout_s: float = 30.0,
        on_status: Callable[[ClusterStatus], None] | None = None,
    ) -> ClusterStatus:
        """Wait until one node is ready: a controller follows or leads, a broker is unfenced."""
        node = self.process(key).node
        return self.wait_until(
            lambda s: s.leader_id >= 0 and s.node(node.node_id).ready,
            timeout_s,
            what=f"{node.name} to be ready",
            expect_running=[node.node_id],
            on_status=on_status,
        )
