"""Small loopback networking helpers shared by the harnesses, tests and `kraft cluster up`."""

from __future__ import annotations

import socket
import time


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago (bind to 0, read it back, release it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on (host, port) or the port cannot be bound."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
        return False


def wait_for_port(host: str, port: int, timeout_s: float) -> bool:
    """Poll until a TCP connect to (host, port) succeeds or ``timeout_s`` passes; True on success."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with socket.create_connection((host, port), timeout=0.2):
                return True
        except OSError:
            time.sleep(0.05)
    return False


WILDCARD_HOSTS = frozenset({"", "0.0.0.0", "::"})


def advertised_host(host: str) -> str:
    """The host a listener bound to ``host`` is reached at: the machine's FQDN for a wildcard bind."""
    return socket.getfqdn() if host in WILDCARD_HOSTS else host
