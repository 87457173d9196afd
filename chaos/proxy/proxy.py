"""One proxy: a listen socket forwarding every accepted connection to one upstream, with toxics.

``listen`` is rewritten to the bound address on start (``127.0.0.1:0`` → ``127.0.0.1:<port>``,
``:0``/empty → ``[::]:<port>``), so re-enabling a disabled proxy binds the same port again.  Disabling
closes the listener (new connects are refused) and every open connection with a FIN.
"""

from __future__ import annotations

import asyncio
import errno
import os
import random
import socket
from collections import Counter
from collections.abc import Callable
from typing import Any

from chaos.proxy.link import Connection
from chaos.proxy.toxics import TOXIC_EXISTS, TOXIC_NOT_FOUND, ApiError, Direction, Toxic, updated_toxic

UPSTREAM_DIAL_TIMEOUT_S = 10.0


def split_host_port(address: str) -> tuple[str, int]:
    """``host:port`` / ``[v6]:port`` / ``:port`` → (host, port); ValueError with Go's wording otherwise."""
    if address == "":
        return "", 0  # Go's net.Listen("tcp", "") binds a random port on all interfaces
    host, sep, port_text = address.rpartition(":")
    if not sep:
        raise ValueError(f"address {address}: missing port in address")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        port = int(port_text) if port_text else 0
    except ValueError:
        raise ValueError(f"address {address}: invalid port") from None
    if not 0 <= port <= 65535:
        raise ValueError(f"address {address}: invalid port")
    return host, port


_LOOPBACK_HOSTS = ("localhost", "::1")


def loopback_listen(listen: str) -> str:
    """Where a proxy asked to listen on ``listen`` listens when remote listeners are not allowed (the
    default, issue #15: any local client of the API could otherwise open a relay reachable from other
    machines): an all-interfaces address (``""``, ``:port``, ``0.0.0.0:port``, ``[::]:port``) becomes
    ``127.0.0.1:port``; another non-loopback host is refused with ApiError(403)."""
    try:
        host, port = split_host_port(listen)
    except ValueError as exc:
        raise ApiError(500, f"listen tcp {listen}: {exc}") from None
    if host in ("", "0.0.0.0", "::"):
        return f"127.0.0.1:{port}"
    if host in _LOOPBACK_HOSTS or host.startswith("127."):
        return listen
    raise ApiError(
        403,
        f"listen {listen}: proxies listen on loopback addresses only "
        "(start the server with --allow-remote-listen to bind other addresses)",
    )


def _bind(listen: str) -> socket.socket:
    try:
        host, port = split_host_port(listen)
    except ValueError as exc:
        raise ApiError(500, f"listen tcp {listen}: {exc}") from None
    try:
        if host in ("", "::"):
            # Go's ":port" listens dual-stack on all interfaces.
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            address: tuple[Any, ...] = ("::", port)
        else:
            family, _, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
            sock = socket.socket(family, socket.SOCK_STREAM)
        # Go sets SO_REUSEADDR on listeners, so a just-closed proxy can rebind its port at once.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(address)
            sock.listen(128)
        except OSError:
            sock.close()
            raise
    except OSError as exc:
        code = exc.errno if exc.errno is not None else errno.EINVAL
        raise ApiError(500, f"listen tcp {listen}: bind: {os.strerror(code).lower()}") from None
    sock.setblocking(False)
    return sock


# (proxy name, dialer's (host, port)) -> another upstream for this connection, or None for the usual one.
Router = Callable[[str, tuple[str, int]], str | None]


def _render_address(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"


class Proxy:
    """A named listen→upstream forwarder with an upstream and a downstream toxic chain."""

    def __init__(
        self, name: str, listen: str, upstream: str, rng: random.Random, router: Router | None = None
    ) -> None:
        self.name = name
        self._router = router
        self.listen = listen
        self.upstream = upstream
        self.enabled = False
        self._rng = rng
        self._chains: dict[Direction, list[Toxic]] = {Direction.UPSTREAM: [], Direction.DOWNSTREAM: []}
        self._server: asyncio.Server | None = None
        self._connections: set[Connection] = set()
        # Pieces of data that reached each toxic (by name), over all connections; never reset.  Tests
        # (in another thread: an int read is atomic) wait on it instead of sleeping.  Not in the API.
        self.toxic_chunks: Counter[str] = Counter()

    # --- lifecycle ---

    async def start(self) -> None:
        """Bind ``listen`` and accept; ApiError(500) with Go's listen error text if it cannot bind."""
        if self._server is not None:
            return
        sock = _bind(self.listen)
        self.listen = _render_address(sock)
        self._server = await asyncio.start_server(self._accept, sock=sock)
        self.enabled = True

    async def stop(self) -> None:
        self.enabled = False
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for connection in list(self._connections):
            connection.close()
        if server is not None:
            await server.wait_closed()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            host, port = split_host_port(await self._upstream_for(writer))
            upstream = await asyncio.wait_for(asyncio.open_connection(host, port), UPSTREAM_DIAL_TIMEOUT_S)
        except (OSError, ValueError, TimeoutError):
            writer.close()
            return
        if not self.enabled:
            upstream[1].close()
            writer.close()
            return
        connection = Connection((reader, writer), upstream, self, self._rng, self._connections.discard)
        self._connections.add(connection)
        connection.start()

    async def _upstream_for(self, writer: asyncio.StreamWriter) -> str:
        """``upstream``, unless the router sends this dialer elsewhere (an extension, not in Toxiproxy).
        The router reads kernel socket tables: it runs in a worker thread, off the forwarding loop."""
        if self._router is None:
            return self.upstream
        peer = writer.get_extra_info("peername")
        if not isinstance(peer, tuple) or len(peer) < 2:
            return self.upstream
        routed = await asyncio.to_thread(self._router, self.name, (str(peer[0]), int(peer[1])))
        return routed or self.upstream

    # --- toxics ---

    def chain(self, direction: Direction) -> list[Toxic]:
        return self._chains[direction]

    def toxics(self) -> list[Toxic]:
        """Upstream toxics first, then downstream, each in insertion order (Toxiproxy's listing order)."""
        return [*self._chains[Direction.UPSTREAM], *self._chains[Direction.DOWNSTREAM]]

    def get_toxic(self, name: str) -> Toxic:
        for toxic in self.toxics():
            if toxic.name == name:
                return toxic
        raise ApiError(404, TOXIC_NOT_FOUND)

    def _notify(self, direction: Direction) -> None:
        for connection in list(self._connections):
            connection.chain_changed(direction)

    def add_toxic(self, toxic: Toxic) -> Toxic:
        # Names are unique across both directions of a proxy.
        if any(t.name == toxic.name for t in self.toxics()):
            raise ApiError(409, TOXIC_EXISTS)
        self._chains[toxic.direction].append(toxic)
        self._notify(toxic.direction)
        return toxic

    def update_toxic(self, name: str, body: Any) -> Toxic:
        current = self.get_toxic(name)
        replacement = updated_toxic(current, body)
        chain = self._chains[current.direction]
        chain[chain.index(current)] = replacement
        self._notify(current.direction)
        return replacement

    def remove_toxic(self, name: str) -> None:
        toxic = self.get_toxic(name)
        self._chains[toxic.direction].remove(toxic)
        self._notify(toxic.direction)

    def remove_all_toxics(self) -> None:
        for toxic in self.toxics():
            self.remove_toxic(toxic.name)

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "listen": self.listen,
            "upstream": self.upstream,
            "enabled": self.enabled,
            # Toxiproxy serialises its exported, untagged zerolog field as an empty object.
            "Logger": {},
            "toxics": [t.to_json() for t in self.toxics()],
        }
