"""A local cluster with every directed link behind its own proxy, plus process control for nemeses.

``ChaosCluster.start()``:
1. starts the proxy server (ours in a background thread, or uses a real Toxiproxy at ``TOXIPROXY_URL``);
2. creates the cluster directory with ``kraft.cluster.LocalCluster`` (configs, storage format);
3. builds the topology from the planned listeners and rewrites every node's config so that node A names
   the proxy ``A_to_B`` as B's address (``controller.quorum.voters``);
4. creates the proxies (``/populate``), starts every node and waits until the cluster is healthy.
With our own proxy server, a :class:`~chaos.dialers.DialerRouter` sends a connection that arrives on
another node's link (a broker following a NOT_CONTROLLER hint) through the dialer's own link.  Brokers
advertise their ``client_to_<broker>`` proxy (``advertised.listeners``): a follower's ReplicaFetch to its
leader arrives there and is routed through ``<follower>_to_<leader>``, so replication can be cut too.

The harness itself watches the cluster through the nodes' real listeners (never cut by a nemesis); the
workload dials through the ``client_to_<node>`` proxies.

``dynamic=True`` runs a dynamic quorum (KIP-853) instead: the configs name the proxies in
``controller.quorum.bootstrap.servers``, controllers advertise their ``client_to_<controller>`` proxy
(the endpoint the VotersRecord holds, so a voter dialing another is routed through its own link by the
:class:`~chaos.dialers.DialerRouter`, which a dynamic run always uses), the quorum is grown from
controller 1 with add-controller, and :class:`~chaos.nemesis.MembershipControl` removes and adds voters.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType

from chaos.dialers import DialerRouter
from chaos.proxy import BackgroundProxyServer
from chaos.proxy.client import ToxiproxyClient, ToxiproxyError, external_toxiproxy_url
from chaos.topology import CLIENT, Topology, build_topology, kraft_links
from kraft.client.quorum import describe_quorum, remove_controller
from kraft.cluster.formatting import format_node_storage
from kraft.cluster.manager import ClusterStatus, LocalCluster
from kraft.cluster.spec import NodeRole, NodeSpec
from kraft.config import load_config
from kraft.storage.meta_properties import read_meta_properties

STARTUP_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 10.0
MEMBERSHIP_DESCRIBE_TIMEOUT_S = 5.0


class ChaosCluster:
    """Owns the proxy server, the proxies and the node processes of one chaos run."""

    def __init__(
        self,
        root: Path,
        *,
        controllers: int = 3,
        brokers: int = 0,
        profile: str = "fast",
        proxy_seed: int | None = None,
        proxy_url: str | None = None,
        route_dialers: bool = False,
        dynamic: bool = False,
        overrides: Mapping[str, str] | None = None,
    ) -> None:
        self.root = root
        self.dynamic = dynamic
        self._overrides = dict(overrides or {})
        # The voters' endpoints come from the log, the same for every dialer: only routing by dialer
        # keeps a dynamic quorum's controller links behind their own proxies.
        self._route_dialers = route_dialers or dynamic
        self._controllers = controllers
        self._brokers = brokers
        self._profile = profile
        self._proxy_seed = proxy_seed
        self._proxy_url = proxy_url if proxy_url is not None else external_toxiproxy_url()
        self._server: BackgroundProxyServer | None = None
        self.proxies: ToxiproxyClient | None = None
        self.cluster: LocalCluster | None = None
        self.topology: Topology | None = None
        self.router: DialerRouter | None = None

    # --- lifecycle ---

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> ClusterStatus:
        if self._proxy_url is None:
            self._server = BackgroundProxyServer(port=0, seed=self._proxy_seed).start()
            url = self._server.url
        else:
            url = self._proxy_url
        self.proxies = ToxiproxyClient(url)
        planned = LocalCluster.create(
            self.root / "cluster",
            controllers=self._controllers,
            brokers=self._brokers,
            profile=self._profile,
            dynamic=self.dynamic,
            overrides=self._overrides,
        )
        spec = planned.spec
        listeners = {node.name: (node.host, node.port) for node in spec.nodes}
        self.topology = build_topology(
            listeners,
            kraft_links([c.name for c in spec.controllers], [b.name for b in spec.brokers]),
        )
        self.cluster = LocalCluster(
            planned.layout, spec, address_of=self._address_of_ids, advertised_of=self._advertised_of
        )
        self.cluster.write_configs()
        self.proxies.populate(self.topology.populate_body())
        if self._server is not None and self._route_dialers:
            # Only our own proxy can route by dialer; a real Toxiproxy keeps the known inaccuracy.
            advertised = spec.brokers + (spec.controllers if self.dynamic else ())
            self.router = DialerRouter(
                self.topology, self._pid_of, advertised=frozenset(n.name for n in advertised)
            )
            self._server.server.collection.router = self.router
        if self.dynamic:
            if self.router is None:
                raise RuntimeError(
                    "a dynamic quorum needs the built-in proxy (routing by dialer): unset TOXIPROXY_URL"
                )
            self.cluster.grow_quorum(timeout_s)
        self.cluster.start()
        return self.cluster.wait_healthy(timeout_s)

    def stop(self) -> None:
        """Heal everything, stop every node, stop the proxy server.  Safe to call more than once."""
        try:
            if self.proxies is not None:
                # Best effort: the nodes are stopped next either way (requests' errors are OSErrors).
                with contextlib.suppress(OSError, ToxiproxyError):
                    self.proxies.reset()
            if self.cluster is not None:
                # down() also sends SIGCONT, so a node a nemesis left paused still stops.
                self.cluster.down(STOP_TIMEOUT_S)
        finally:
            if self.proxies is not None:
                self.proxies.close()
            if self._server is not None:
                self._server.stop()
                self._server = None

    def __enter__(self) -> ChaosCluster:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    # --- addressing ---

    def _require(self) -> tuple[LocalCluster, Topology]:
        if self.cluster is None or self.topology is None:
            raise RuntimeError("the chaos cluster is not started")
        return self.cluster, self.topology

    def _address_of_ids(self, viewer_id: int, target_id: int) -> tuple[str, int]:
        cluster, topology = self._require()
        viewer, target = cluster.spec.node(viewer_id), cluster.spec.node(target_id)
        return topology.address_of(viewer.name, target.name)

    def _advertised_of(self, broker_id: int) -> tuple[str, int]:
        """Brokers advertise their client proxy: clients dial it as before, and another broker's
        connection to it is routed through that broker's own link (``chaos.dialers``)."""
        cluster, topology = self._require()
        return topology.address_of(CLIENT, cluster.spec.node(broker_id).name)

    def _pid_of(self, node: str) -> int | None:
        if self.cluster is None or node not in {n.name for n in self.cluster.spec.nodes}:
            return None
        return self.cluster.process(node).pid()

    @property
    def controllers(self) -> tuple[NodeSpec, ...]:
        return self._require()[0].spec.controllers

    @property
    def brokers(self) -> tuple[NodeSpec, ...]:
        return self._require()[0].spec.brokers

    @property
    def cluster_id(self) -> str:
        return self._require()[0].spec.cluster_id

    def client_target(self, node: NodeSpec) -> str:
        """``host:port`` the workload dials to reach ``node`` (through ``client_to_<node>``)."""
        host, port = self._require()[1].address_of(CLIENT, node.name)
        return f"{host}:{port}"

    def metadata_log_dir(self, node: NodeSpec) -> Path:
        return self._require()[0].layout.data_dir(node)

    # --- ProcessControl (chaos.nemesis) ---

    def kill(self, node: str) -> None:
        self._require()[0].kill(node)

    def restart(self, node: str) -> None:
        self._require()[0].start([node])

    def pause(self, node: str) -> None:
        self._require()[0].process(node).pause()

    def resume(self, node: str) -> None:
        self._require()[0].process(node).resume()

    # --- MembershipControl (chaos.nemesis), dynamic quorums only ---

    def voters(self) -> dict[str, str]:
        """Voter name → directory id, as the leader describes the voter set in force (real listeners)."""
        cluster = self._require()[0]
        described = describe_quorum(
            [c.target for c in cluster.spec.controllers], MEMBERSHIP_DESCRIBE_TIMEOUT_S
        )
        return {cluster.spec.node(v.replica_id).name: v.directory_id for v in described.current_voters}

    def remove_voter(self, node: str, directory_id: str, timeout_s: float) -> int | None:
        """RemoveRaftVoter (through the real listeners); the VotersRecord's offset once committed."""
        cluster = self._require()[0]
        targets = [c.target for c in cluster.spec.controllers]
        return remove_controller(targets, cluster.spec.node(node).node_id, directory_id, timeout_s)

    def add_voter(self, node: str, timeout_s: float) -> int | None:
        """AddRaftVoter for a running controller, as ``kraft quorum add-controller`` does."""
        return self._require()[0].add_controller(node, timeout_s)

    def directory_id(self, node: str) -> str:
        cluster = self._require()[0]
        return read_meta_properties(cluster.layout.data_dir(cluster.spec.node(node))).directory_id

    def wipe(self, node: str) -> str:
        """The disk dies: SIGKILL, delete the metadata directory, format a new one the way a joining
        controller is formatted (``--no-initial-controllers``: a new directory id), start again."""
        cluster = self._require()[0]
        spec = cluster.spec.node(node)
        if spec.role is not NodeRole.CONTROLLER:
            raise ValueError(f"{node} is not a controller")
        cluster.kill(node)
        shutil.rmtree(cluster.layout.data_dir(spec))
        config = load_config(cluster.layout.config_path(spec))
        format_node_storage(config, cluster.spec.cluster_id, no_initial_controllers=True)
        cluster.start([node])
        return self.directory_id(node)

    @property
    def controller_names(self) -> list[str]:
        return [c.name for c in self.controllers]

    def leader(self) -> str | None:
        status = self._require()[0].status(probe_timeout_s=0.5)
        if status.leader_id < 0:
            return None
        return next(
            n.name
            for n in self._require()[0].spec.nodes
            if n.node_id == status.leader_id and n.role is NodeRole.CONTROLLER
        )
