"""Small loopback networking helpers shared by the harnesses, tests and `kraft cluster up`."""

from __future__ import annotations

import random
import socket
import time
from collections import deque
from pathlib import Path

_EPHEMERAL_RANGE_FILE = "/proc/sys/net/ipv4/ip_local_port_range"
_LOWEST_PICKED_PORT = 10_000
_recently_picked: deque[int] = deque(maxlen=4096)
_picker = random.Random()  # seeded from the OS: two processes pick different sequences


def _ephemeral_range() -> tuple[int, int] | None:
    try:
        low, high = (int(part) for part in Path(_EPHEMERAL_RANGE_FILE).read_text().split())
    except (OSError, ValueError):
        return None
    return low, high


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port that was free a moment ago, for a listener that a test or ``kraft cluster`` starts.

    Picked below the kernel's ephemeral range where there is room (Linux: 32768-60999 by default): a
    listener port from that range can be taken, while its node is down for a restart, as the source port
    of any outgoing connection on the machine, and the restart then fails with "address in use" (a risk on
    a busy host).  Ports handed out recently by this process are not handed out again.  Elsewhere: bind to
    port 0 and read it back."""
    ephemeral = _ephemeral_range()
    if ephemeral is not None and ephemeral[0] - 1 > _LOWEST_PICKED_PORT + 1000:
        for _ in range(200):
            port = _picker.randrange(_LOWEST_PICKED_PORT, ephemeral[0])
            if port in _recently_picked or not _bindable(host, port):
                continue
            _recently_picked.append(port)
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        picked: int = sock.getsockname()[1]
        _recently_picked.append(picked)
        return picked


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


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
