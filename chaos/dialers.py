"""Send each connection through the link of the node that actually dialed it.

Proxy ``a_to_b`` assumes its dialer is ``a``.  That breaks when a node dials an address it learned from
another node: a broker following a NOT_CONTROLLER hint dials the endpoint in the hint, which controllers
fill from their own voter config — a ``controller-X_to_controller-Y`` proxy.  The broker's requests then
ride a controller→controller link, so cutting ``broker_to_controller-Y`` would not stop them and cutting
``controller-X_to_controller-Y`` would.

:class:`DialerRouter` fixes that on the harness side.  Our proxy asks it, per accepted connection, for
the upstream to use (``chaos.proxy.collection.ProxyCollection.router``).  It identifies the dialing
process by its socket (Linux: ``/proc/net/tcp`` maps the dialer's port to a socket inode,
``/proc/<pid>/fd`` maps the inode to a node's pid) and, when the dialer is some other node ``d``,
forwards the connection to ``d``'s own proxy to the same target, so ``d_to_b``'s toxics apply.  Unknown
dialers (the harness itself) and non-Linux hosts keep the proxy's usual upstream.

Only connections are routed (gRPC keeps them open), so the /proc scan runs once per connection.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

from chaos.topology import LinkProxy, Topology

PROC_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))


def _port_of(address: str) -> int:
    """``0100007F:1F90`` (the /proc/net/tcp form) → 8080."""
    return int(address.rsplit(":", 1)[1], 16)


def socket_inode(local_port: int, remote_port: int, tables: tuple[Path, ...] = PROC_TCP_TABLES) -> int | None:
    """The inode of the TCP socket bound to ``local_port`` and connected to ``remote_port`` (loopback
    ports are unique enough: the pair names one connection's dialing end)."""
    for table in tables:
        try:
            lines = table.read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) < 10:
                continue
            if _port_of(fields[1]) == local_port and _port_of(fields[2]) == remote_port:
                inode = int(fields[9])
                if inode:
                    return inode
    return None


def pid_owns_socket(pid: int, inode: int) -> bool:
    """True when one of ``pid``'s file descriptors is the socket ``inode``."""
    wanted = f"socket:[{inode}]"
    fd_dir = f"/proc/{pid}/fd"
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return False
    for fd in fds:
        try:
            if os.readlink(f"{fd_dir}/{fd}") == wanted:
                return True
        except OSError:
            continue  # the fd closed while we looked
    return False


class DialerRouter:
    """``router(proxy name, dialer address) -> upstream or None`` for :class:`ProxyCollection`."""

    def __init__(
        self,
        topology: Topology,
        pid_of: Callable[[str], int | None],
        owns: Callable[[int, int], bool] = pid_owns_socket,
        inode_of: Callable[[int, int], int | None] = socket_inode,
    ) -> None:
        self._topology = topology
        self._pid_of = pid_of
        self._owns = owns
        self._inode_of = inode_of
        self._by_name: Mapping[str, LinkProxy] = {link.name: link for link in topology.links.values()}
        self.rerouted: list[tuple[str, str, str]] = []  # (proxy, actual dialer, proxy used instead)

    def dialer_of(self, link: LinkProxy, dialer_port: int) -> str | None:
        """The node whose process holds the dialing socket, or None (the harness, or not found)."""
        inode = self._inode_of(dialer_port, link.listen_port)
        if inode is None:
            return None
        # The expected dialer first: the common case costs one fd scan.
        candidates = [link.source, *(n for n in self._topology.nodes() if n != link.source)]
        for node in candidates:
            pid = self._pid_of(node)
            if pid is not None and self._owns(pid, inode):
                return node
        return None

    def __call__(self, proxy: str, dialer: tuple[str, int]) -> str | None:
        link = self._by_name.get(proxy)
        if link is None:
            return None
        node = self.dialer_of(link, dialer[1])
        if node is None or node == link.source:
            return None
        own = self._topology.links.get((node, link.target))
        if own is None:
            return None  # no proxied link for that pair (e.g. a node dialing itself): leave it alone
        self.rerouted.append((proxy, node, own.name))
        return own.listen
