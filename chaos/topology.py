"""One proxy per directed link: who dials whom through which port.

A TCP proxy cannot tell its clients apart, so to cut "a cannot reach b" without touching "c reaches b"
every directed pair (a dials b) gets its own proxy ``a_to_b`` listening on its own port and forwarding to
b's real listener.  Node a's configuration names that proxy port as b's address (``address_of``).  On
proxy ``a_to_b`` the ``upstream`` stream carries a's requests and ``downstream`` b's responses.

Node names are the cluster's: ``controller-1``, ``broker-101``; ``client`` stands for the harness's own
workload and admin connections.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kraft.netutil import free_port

CLIENT = "client"


@dataclass(frozen=True, slots=True)
class LinkProxy:
    """The proxy that carries ``source``'s connections to ``target``."""

    source: str
    target: str
    listen_host: str
    listen_port: int
    upstream: str  # target's real "host:port"

    @property
    def name(self) -> str:
        return proxy_name(self.source, self.target)

    @property
    def listen(self) -> str:
        return f"{self.listen_host}:{self.listen_port}"

    def to_populate_json(self) -> dict[str, Any]:
        return {"name": self.name, "listen": self.listen, "upstream": self.upstream, "enabled": True}


def proxy_name(source: str, target: str) -> str:
    return f"{source}_to_{target}"


@dataclass(frozen=True, slots=True)
class Topology:
    """Every proxied directed link of a cluster, and the real listener of every node."""

    listeners: Mapping[str, tuple[str, int]]
    links: Mapping[tuple[str, str], LinkProxy]

    def link(self, source: str, target: str) -> LinkProxy:
        try:
            return self.links[(source, target)]
        except KeyError:
            raise KeyError(f"no proxied link {source} -> {target}") from None

    def address_of(self, source: str, target: str) -> tuple[str, int]:
        """What ``source`` must dial to reach ``target``: its proxy, or the real listener if unproxied."""
        link = self.links.get((source, target))
        if link is not None:
            return link.listen_host, link.listen_port
        return self.listeners[target]

    def links_between(self, sources: Iterable[str], targets: Iterable[str]) -> list[LinkProxy]:
        """Every proxied link from a node in ``sources`` to a different node in ``targets``."""
        wanted_targets = set(targets)
        return [
            link
            for source in sources
            for target in sorted(wanted_targets)
            if (link := self.links.get((source, target))) is not None
        ]

    def nodes(self) -> list[str]:
        return sorted(self.listeners)

    def populate_body(self) -> list[dict[str, Any]]:
        return [link.to_populate_json() for link in self.links.values()]


def kraft_links(
    controllers: Sequence[str], brokers: Sequence[str], clients: Sequence[str] = (CLIENT,)
) -> list[tuple[str, str]]:
    """The directed links of a KRaft cluster: controller→controller (Raft), broker→controller
    (registration, heartbeats, MetadataFetch), broker→broker (ReplicaFetch: a broker dials the endpoint
    its leader advertised, the ``client_to_<leader>`` proxy, and the dialer router sends the connection
    through ``<follower>_to_<leader>``) and client→every node.  Controllers never dial brokers."""
    links = [(a, b) for a in controllers for b in controllers if a != b]
    links += [(b, c) for b in brokers for c in controllers]
    links += [(a, b) for a in brokers for b in brokers if a != b]
    links += [(client, node) for client in clients for node in [*controllers, *brokers]]
    return links


def build_topology(
    listeners: Mapping[str, tuple[str, int]],
    links: Iterable[tuple[str, str]],
    listen_host: str = "127.0.0.1",
    port_for: Callable[[], int] | None = None,
) -> Topology:
    """Assign a distinct listen port to every link's proxy (``free_port`` by default)."""
    allocate = port_for or (lambda: free_port(listen_host))
    taken = {port for _, port in listeners.values()}
    built: dict[tuple[str, str], LinkProxy] = {}
    for source, target in links:
        if target not in listeners:
            raise KeyError(f"link {source} -> {target}: unknown target node {target!r}")
        if (source, target) in built or source == target:
            continue
        port = allocate()
        while port in taken:
            port = allocate()
        taken.add(port)
        host, target_port = listeners[target]
        built[(source, target)] = LinkProxy(source, target, listen_host, port, f"{host}:{target_port}")
    return Topology(dict(listeners), built)
