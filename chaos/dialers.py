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
import socket
import struct
from collections.abc import Callable, Mapping
from pathlib import Path

from chaos.topology import LinkProxy, Topology

PROC_TCP_TABLES = (Path("/proc/net/tcp"), Path("/proc/net/tcp6"))
NETLINK_SOCK_DIAG = 4
SOCK_DIAG_BY_FAMILY = 20
NLMSG_HEADER = struct.Struct("=IHHII")  # length, type, flags, seq, pid
INET_DIAG_REQ = struct.Struct("=BBBBI")  # family, protocol, ext, pad, states
INET_DIAG_SOCKID = struct.Struct("!HH16s16s")  # sport, dport, src, dst (network order)
INET_DIAG_SOCKID_TAIL = struct.Struct("=III")  # interface, cookie (2 words; ~0 = "no cookie")
INET_DIAG_MSG_INODE_OFFSET = NLMSG_HEADER.size + 4 + INET_DIAG_SOCKID.size + INET_DIAG_SOCKID_TAIL.size + 16
ALL_TCP_STATES = 0xFFFFFFFF
NO_COOKIE = 0xFFFFFFFF
NETLINK_TIMEOUT_S = 1.0


def _packed_ip(host: str) -> tuple[int, bytes]:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return family, socket.inet_pton(family, host).ljust(16, b"\0")


def netlink_socket_inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """Exact lookup of one TCP socket through sock_diag (what ``ss`` uses): a hash lookup in the
    kernel, unlike reading ``/proc/net/tcp``, which lists every socket on the host (slow when busy)."""
    family, local_ip = _packed_ip(local[0])
    _, remote_ip = _packed_ip(remote[0])
    request = (
        INET_DIAG_REQ.pack(family, socket.IPPROTO_TCP, 0, 0, ALL_TCP_STATES)
        + INET_DIAG_SOCKID.pack(local[1], remote[1], local_ip, remote_ip)
        + INET_DIAG_SOCKID_TAIL.pack(0, NO_COOKIE, NO_COOKIE)
    )
    header = NLMSG_HEADER.pack(NLMSG_HEADER.size + len(request), SOCK_DIAG_BY_FAMILY, 1, 1, 0)
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_SOCK_DIAG) as nl:
        nl.settimeout(NETLINK_TIMEOUT_S)
        nl.sendto(header + request, (0, 0))
        reply = nl.recv(65536)
    if len(reply) < INET_DIAG_MSG_INODE_OFFSET + 4:
        return None  # an NLMSG_ERROR (ENOENT: no such socket)
    _, kind, _, _, _ = NLMSG_HEADER.unpack_from(reply)
    if kind != SOCK_DIAG_BY_FAMILY:
        return None
    # The kernel falls back to a *listening* socket on the port when no connection matches: keep only
    # the exact connection asked for.
    sport, dport = struct.unpack_from("!HH", reply, NLMSG_HEADER.size + 4)
    if (sport, dport) != (local[1], remote[1]):
        return None
    (inode,) = struct.unpack_from("=I", reply, INET_DIAG_MSG_INODE_OFFSET)
    return inode or None


def _port_of(address: str) -> int:
    """``0100007F:1F90`` (the /proc/net/tcp form) → 8080."""
    return int(address.rsplit(":", 1)[1], 16)


def proc_socket_inode(
    local_port: int, remote_port: int, tables: tuple[Path, ...] = PROC_TCP_TABLES
) -> int | None:
    """The fallback: scan ``/proc/net/tcp{,6}`` for the socket on ``local_port`` connected to
    ``remote_port`` (loopback ports are unique enough: the pair names one connection's dialing end)."""
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


def socket_inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The inode of the TCP socket at ``local`` connected to ``remote`` (None when not found)."""
    try:
        return netlink_socket_inode(local, remote)
    except (OSError, ValueError):
        return proc_socket_inode(local[1], remote[1])


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
        inode_of: Callable[[tuple[str, int], tuple[str, int]], int | None] = socket_inode,
        advertised: frozenset[str] = frozenset(),
    ) -> None:
        """``advertised``: nodes that advertise their client proxy (brokers, see ``ChaosCluster``): other
        nodes dial ``client_to_<node>`` too, so connections on those client links are routed as well."""
        self._topology = topology
        self._advertised = advertised
        self._pid_of = pid_of
        self._owns = owns
        self._inode_of = inode_of
        self._by_name: Mapping[str, LinkProxy] = {link.name: link for link in topology.links.values()}
        self.rerouted: list[tuple[str, str, str]] = []  # (proxy, actual dialer, proxy used instead)

    def dialer_of(self, link: LinkProxy, dialer: tuple[str, int]) -> str | None:
        """The node whose process holds the dialing socket, or None (the harness, or not found)."""
        inode = self._inode_of(dialer, (link.listen_host, link.listen_port))
        if inode is None:
            return None
        nodes = set(self._topology.nodes())
        # The expected dialer first: the common case costs one fd scan.
        candidates = [link.source] if link.source in nodes else []
        candidates += [n for n in sorted(nodes) if n != link.source]
        for node in candidates:
            pid = self._pid_of(node)
            if pid is not None and self._owns(pid, inode):
                return node
        return None

    def __call__(self, proxy: str, dialer: tuple[str, int]) -> str | None:
        link = self._by_name.get(proxy)
        if link is None:
            return None
        if link.source not in self._topology.listeners and link.target not in self._advertised:
            return None  # client links: only the harness dials them
        try:
            node = self.dialer_of(link, dialer)
        except Exception:  # a lookup failure must never break forwarding
            return None
        if node is None or node == link.source:
            return None
        own = self._topology.links.get((node, link.target))
        if own is None:
            return None  # no proxied link for that pair (e.g. a node dialing itself): leave it alone
        self.rerouted.append((proxy, node, own.name))
        return own.listen
