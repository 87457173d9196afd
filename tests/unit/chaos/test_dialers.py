"""Routing a connection by the process that dialed it (chaos.dialers + the proxy's router hook)."""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from chaos.dialers import DialerRouter, netlink_socket_inode, pid_owns_socket, proc_socket_inode, socket_inode
from chaos.proxy import BackgroundProxyServer
from chaos.proxy.client import ToxiproxyClient
from chaos.topology import CLIENT, build_topology

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux") or not Path("/proc/net/tcp").exists(), reason="needs Linux /proc"
)
IO_TIMEOUT_S = 5.0


@pytest.fixture
def connected_pair() -> Iterator[tuple[socket.socket, int, int]]:
    """A loopback connection made by this process: (dialing socket, its port, the listener's port)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        dialer = socket.create_connection(("127.0.0.1", port), timeout=IO_TIMEOUT_S)
        accepted, _ = listener.accept()
        try:
            yield dialer, dialer.getsockname()[1], port
        finally:
            dialer.close()
            accepted.close()


def test_the_dialing_socket_is_found_and_owned_by_this_process(
    connected_pair: tuple[socket.socket, int, int],
) -> None:
    _, dialer_port, listen_port = connected_pair
    dialer, listener = ("127.0.0.1", dialer_port), ("127.0.0.1", listen_port)
    inode = socket_inode(dialer, listener)
    assert inode is not None
    assert pid_owns_socket(os.getpid(), inode)
    assert not pid_owns_socket(os.getppid(), inode)
    assert socket_inode(listener, dialer) not in (None, inode)  # the accepting end is another socket
    assert proc_socket_inode(dialer_port, listen_port) == inode  # the fallback agrees


def test_netlink_lookup_of_a_missing_socket_is_none(connected_pair: tuple[socket.socket, int, int]) -> None:
    _, dialer_port, listen_port = connected_pair
    # No connection from the listener's port to itself; the kernel would offer the listener instead.
    assert netlink_socket_inode(("127.0.0.1", listen_port), ("127.0.0.1", listen_port)) is None
    assert netlink_socket_inode(("127.0.0.1", dialer_port), ("127.0.0.1", 1)) is None


def _round_trip(address: str) -> bytes:
    host, port = address.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=IO_TIMEOUT_S) as sock:
        sock.sendall(b"ping")
        try:
            return sock.recv(4)
        except ConnectionError:  # reset; a socket timeout is no answer at all and fails the test
            return b""


def test_a_connection_on_another_nodes_link_goes_through_the_dialers_own_link(echo_address: str) -> None:
    """This process plays node ``b`` dialing ``a``'s proxy to ``t``: it must ride ``b_to_t`` instead."""
    host, port = echo_address.rsplit(":", 1)
    topology = build_topology(
        {"a": ("127.0.0.1", 1), "b": ("127.0.0.1", 2), "t": (host, int(port))}, [("a", "t"), ("b", "t")]
    )
    pids = {"b": os.getpid()}  # "a" has no process: nothing else can own the socket
    router = DialerRouter(topology, pids.get)
    with BackgroundProxyServer(port=0, seed=1) as server:
        client = ToxiproxyClient(server.url)
        try:
            client.populate(topology.populate_body())
            server.server.collection.router = router
            theirs, mine = topology.link("a", "t"), topology.link("b", "t")
            assert _round_trip(theirs.listen) == b"ping"
            assert router.rerouted == [(theirs.name, "b", mine.name)]
            # Cutting b's own link now cuts b's traffic that arrives on a's link too.
            client.set_enabled(mine.name, False)
            assert _round_trip(theirs.listen) == b""
            # A connection made by its expected dialer is left alone.
            pids["a"], pids["b"] = pids.pop("b"), -1
            assert _round_trip(theirs.listen) == b"ping"
            assert len(router.rerouted) == 2
        finally:
            client.close()


def test_a_broker_dialing_another_brokers_advertised_client_proxy_rides_its_own_link(
    echo_address: str,
) -> None:
    """Brokers advertise ``client_to_<broker>``: a follower (this process, node ``b``) dialing it for a
    ReplicaFetch must go through ``b_to_t``, so cutting that link cuts replication; the harness (no node)
    keeps the client link."""
    host, port = echo_address.rsplit(":", 1)
    listeners = {"b": ("127.0.0.1", 2), "t": (host, int(port))}
    topology = build_topology(listeners, [("b", "t"), (CLIENT, "t")])
    client_link, own = topology.link(CLIENT, "t"), topology.link("b", "t")
    with BackgroundProxyServer(port=0, seed=1) as server:
        client = ToxiproxyClient(server.url)
        try:
            client.populate(topology.populate_body())
            not_advertised = DialerRouter(topology, {"b": os.getpid()}.get)
            server.server.collection.router = not_advertised
            assert _round_trip(client_link.listen) == b"ping" and not_advertised.rerouted == []
            router = DialerRouter(topology, {"b": os.getpid()}.get, advertised=frozenset({"t"}))
            server.server.collection.router = router
            assert _round_trip(client_link.listen) == b"ping"
            assert router.rerouted == [(client_link.name, "b", own.name)]
            client.set_enabled(own.name, False)
            assert _round_trip(client_link.listen) == b""
            harness = DialerRouter(topology, {"b": -1}.get, advertised=frozenset({"t"}))
            server.server.collection.router = harness
            assert _round_trip(client_link.listen) == b"ping" and harness.rerouted == []
        finally:
            client.close()
