"""What a local cluster is: its nodes, their ports, where their files live, and their generated configs.

``plan_cluster`` picks ids and ports; ``ClusterLayout`` maps a node to its config, data, log and pid
paths under one directory; ``node_properties`` renders a node's Kafka-style config.  ``address_of`` lets
a caller (the chaos harness) make node A dial node B through a proxy: it returns the (host, port) that
``viewer`` must use to reach ``target``'s listener.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from kraft.cluster.profiles import profile_overrides
from kraft.config import NodeConfig
from kraft.netutil import free_port
from kraft.security.authorizer import STANDARD_AUTHORIZER
from kraft.security.ca import ORGANIZATION

AddressOf = Callable[[int, int], tuple[str, int]]
AdvertisedOf = Callable[[int], tuple[str, int]]
"""A broker's advertised address by node id (what it registers; clients and other brokers dial it); on a
dynamic quorum also a controller's (its endpoint in the VotersRecord, which the other voters dial)."""

FIRST_BROKER_ID: Final = 101
STATE_FILE: Final = "cluster.json"


class NodeRole(enum.StrEnum):
    CONTROLLER = "controller"
    BROKER = "broker"


@dataclass(frozen=True, slots=True)
class NodeSpec:
    """One node of a generated cluster: a controller (ids 1…) or a broker (ids 101…)."""

    node_id: int
    role: NodeRole
    host: str
    port: int
    metrics_port: int = 0

    @property
    def name(self) -> str:
        return f"{self.role}-{self.node_id}"

    @property
    def target(self) -> str:
        """``host:port`` of the node's own listener (what a local client dials without a proxy)."""
        return f"{self.host}:{self.port}"

    @property
    def listener_name(self) -> str:
        return "CONTROLLER" if self.role is NodeRole.CONTROLLER else "PLAINTEXT"


@dataclass(frozen=True, slots=True)
class ClusterSpec:
    """The nodes and shared settings of a cluster; persisted as ``cluster.json`` in its directory."""

    cluster_id: str
    nodes: tuple[NodeSpec, ...]
    profile: str = "default"
    overrides: Mapping[str, str] = field(default_factory=dict)
    tls: bool = False
    """Every listener SSL with mutual TLS; certificates from a local CA in ``<dir>/tls``."""
    authorizer: bool = False
    """With ``tls``: the StandardAuthorizer on every node, ``super.users`` = the cluster's own node and
    admin certificates (:func:`super_users`), so everyone else is denied unless an ACL allows."""
    dynamic: bool = False
    """A dynamic quorum (KIP-853): every node finds the quorum through ``controller.quorum.bootstrap.
    servers`` (the controllers' addresses); the first controller is formatted ``--standalone``, the others
    ``--no-initial-controllers`` and join with AddRaftVoter (:mod:`kraft.cluster.membership`)."""

    @property
    def controllers(self) -> tuple[NodeSpec, ...]:
        return tuple(n for n in self.nodes if n.role is NodeRole.CONTROLLER)

    @property
    def brokers(self) -> tuple[NodeSpec, ...]:
        return tuple(n for n in self.nodes if n.role is NodeRole.BROKER)

    def node(self, key: int | str) -> NodeSpec:
        """Look a node up by id (``1``, ``"101"``) or name (``"controller-1"``); ``KeyError`` if absent."""
        for node in self.nodes:
            if str(key) in (str(node.node_id), node.name):
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise KeyError(f"no node {key!r} in this cluster (nodes: {known})")

    def to_json(self) -> dict[str, Any]:
        return {
            "cluster_id": self.cluster_id,
            "profile": self.profile,
            "overrides": dict(self.overrides),
            "tls": self.tls,
            "authorizer": self.authorizer,
            "dynamic": self.dynamic,
            "nodes": [
                {
                    "id": n.node_id,
                    "role": str(n.role),
                    "host": n.host,
                    "port": n.port,
                    "metrics_port": n.metrics_port,
                }
                for n in self.nodes
            ],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> ClusterSpec:
        nodes = tuple(
            NodeSpec(
                int(n["id"]), NodeRole(n["role"]), str(n["host"]), int(n["port"]), int(n["metrics_port"])
            )
            for n in data["nodes"]
        )
        return cls(
            str(data["cluster_id"]),
            nodes,
            str(data["profile"]),
            dict(data.get("overrides", {})),
            bool(data.get("tls", False)),
            bool(data.get("authorizer", False)),  # clusters created before it existed had none
            bool(data.get("dynamic", False)),
        )


@dataclass(frozen=True, slots=True)
class ClusterLayout:
    """Where each node's files live under the cluster directory ``root``."""

    root: Path

    @property
    def state_path(self) -> Path:
        return self.root / STATE_FILE

    def config_path(self, node: NodeSpec) -> Path:
        return self.root / "config" / f"{node.name}.properties"

    def data_dir(self, node: NodeSpec) -> Path:
        return self.root / "data" / node.name

    def log_path(self, node: NodeSpec) -> Path:
        return self.root / "logs" / f"{node.name}.log"

    def pid_path(self, node: NodeSpec) -> Path:
        return self.root / "run" / f"{node.name}.pid"

    @property
    def tls_dir(self) -> Path:
        """The local CA (``ca.pem``, ``ca-key.pem``) and one keystore ``<name>.pem`` per node and client."""
        return self.root / "tls"

    @property
    def client_properties(self) -> Path:
        """The CLI's ``--command-config`` for a TLS cluster (admin certificate)."""
        return self.root / "client.properties"

    def save(self, spec: ClusterSpec) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        tmp = self.state_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(spec.to_json(), indent=2) + "\n", encoding="utf-8")
        tmp.replace(self.state_path)

    def load(self) -> ClusterSpec | None:
        """The saved spec, or None when ``root`` holds no cluster."""
        if not self.state_path.exists():
            return None
        try:
            return ClusterSpec.from_json(json.loads(self.state_path.read_text(encoding="utf-8")))
        except (ValueError, KeyError, TypeError) as exc:
            raise ValueError(f"{self.state_path} is not a kraft cluster file: {exc}") from None


def plan_cluster(
    cluster_id: str,
    controllers: int = 3,
    brokers: int = 3,
    *,
    base_port: int | None = None,
    host: str = "127.0.0.1",
    profile: str = "default",
    metrics: bool = False,
    overrides: Mapping[str, str] | None = None,
    tls: bool = False,
    authorizer: bool | None = None,
    dynamic: bool = False,
) -> ClusterSpec:
    """Ids and ports for a new cluster (``dynamic``: see :attr:`ClusterSpec.dynamic`).

    ``authorizer`` (default: ``tls``) turns the StandardAuthorizer on; it needs ``tls`` (on PLAINTEXT
    every caller is ``User:ANONYMOUS``, so there is nobody to grant anything to).

    With ``base_port`` P: controllers listen on P, P+1, …, brokers on the next ports, metrics (when
    enabled) on the ports after those.  Without it every port comes from :func:`free_port`.
    """
    if controllers < 1:
        raise ValueError("a cluster needs at least one controller")
    if brokers < 0:
        raise ValueError("the number of brokers cannot be negative")
    authorizer = tls if authorizer is None else authorizer
    if authorizer and not tls:
        raise ValueError("an authorizer needs TLS: on PLAINTEXT nobody is authenticated")
    profile_overrides(profile)  # validate the name early
    count = controllers + brokers
    ports = _ports(count * (2 if metrics else 1), base_port, host)
    roles = [NodeRole.CONTROLLER] * controllers + [NodeRole.BROKER] * brokers
    ids = list(range(1, controllers + 1)) + list(range(FIRST_BROKER_ID, FIRST_BROKER_ID + brokers))
    nodes = tuple(
        NodeSpec(node_id, role, host, ports[i], ports[count + i] if metrics else 0)
        for i, (node_id, role) in enumerate(zip(ids, roles, strict=True))
    )
    return ClusterSpec(cluster_id, nodes, profile, dict(overrides or {}), tls, authorizer, dynamic)


def _ports(count: int, base_port: int | None, host: str) -> list[int]:
    if base_port is not None:
        if not 1 <= base_port <= 65535 - count:
            raise ValueError(f"--base-port {base_port} leaves no room for {count} ports below 65536")
        return list(range(base_port, base_port + count))
    ports: list[int] = []
    while len(ports) < count:
        port = free_port(host)
        if port not in ports:
            ports.append(port)
    return ports


ADMIN_CLIENT: Final = "admin"
"""The common name of the CLI's certificate in a TLS cluster."""


def tls_properties(layout: ClusterLayout, name: str) -> dict[str, str]:
    """A TLS cluster node's security keys: CONTROLLER and SSL listeners over mutual TLS."""
    return {
        "listener.security.protocol.map": "CONTROLLER:SSL,SSL:SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(layout.tls_dir / f"{name}.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(layout.tls_dir / "ca.pem"),
        "ssl.client.auth": "required",
    }


def certificate_principal(name: str) -> str:
    """The principal a certificate of the local CA (:mod:`kraft.security.ca`) authenticates as under the
    DEFAULT ``ssl.principal.mapping.rules``: its subject in RFC 2253 form, ``User:CN=broker-101,O=kraft``."""
    return f"User:CN={name},O={ORGANIZATION}"


def super_users(spec: ClusterSpec) -> str:
    """``super.users`` of a local TLS cluster: every controller and broker, and the CLI's admin client."""
    names = [node.name for node in spec.nodes] + [ADMIN_CLIENT]
    return ";".join(certificate_principal(name) for name in names)


def client_properties(layout: ClusterLayout) -> dict[str, str]:
    """``client.properties`` of a TLS cluster: the admin client's certificate and the CA."""
    return {
        "security.protocol": "SSL",
        "ssl.keystore.type": "PEM",
        "ssl.keystore.location": str(layout.tls_dir / f"{ADMIN_CLIENT}.pem"),
        "ssl.truststore.type": "PEM",
        "ssl.truststore.location": str(layout.tls_dir / "ca.pem"),
    }


def node_properties(
    spec: ClusterSpec,
    node: NodeSpec,
    layout: ClusterLayout,
    address_of: AddressOf | None = None,
    advertised_of: AdvertisedOf | None = None,
) -> dict[str, str]:
    """The Kafka-style config of ``node`` (validated by :class:`NodeConfig` before it is returned)."""

    def controller_address(controller: NodeSpec) -> str:
        host, port = (
            address_of(node.node_id, controller.node_id) if address_of else (controller.host, controller.port)
        )
        return f"{host}:{port}"

    # With TLS the broker listener is named SSL (Kafka's default map makes SSL an SSL listener).
    listener = "SSL" if spec.tls and node.role is NodeRole.BROKER else node.listener_name
    # Dynamic: where to find the quorum (who votes is in the log, VotersRecord); static: the voters.
    quorum = (
        ("controller.quorum.bootstrap.servers", ",".join(controller_address(c) for c in spec.controllers))
        if spec.dynamic
        else (
            "controller.quorum.voters",
            ",".join(f"{c.node_id}@{controller_address(c)}" for c in spec.controllers),
        )
    )
    props: dict[str, str] = {
        "process.roles": str(node.role),
        "node.id": str(node.node_id),
        quorum[0]: quorum[1],
        "listeners": f"{listener}://{node.host}:{node.port}",
    }
    # A broker advertises what it registers; a controller of a dynamic quorum what goes into the
    # VotersRecord (the address the other voters dial).
    if advertised_of is not None and (node.role is NodeRole.BROKER or spec.dynamic):
        host, port = advertised_of(node.node_id)
        props["advertised.listeners"] = f"{listener}://{host}:{port}"
    if spec.tls:
        props.update(tls_properties(layout, node.name))
    if spec.authorizer:
        props["authorizer.class.name"] = STANDARD_AUTHORIZER
        props["super.users"] = super_users(spec)
    data_dir = str(layout.data_dir(node))
    if node.role is NodeRole.CONTROLLER:
        props["metadata.log.dir"] = data_dir
    else:
        props["log.dirs"] = data_dir
    if node.metrics_port:
        props["metrics.port"] = str(node.metrics_port)
    props.update(profile_overrides(spec.profile))
    props.update(spec.overrides)
    NodeConfig.from_properties(props)  # fail here, not in a background process, on a bad override
    return props
