"""Every toxic's observable effect on real TCP traffic through the proxy.

The proxy's job is real TCP timing, so wall time stays, but only where it proves something on any host:
lower bounds that prove a delay was applied, and upper bounds only against the configured delay itself
or a generous multiple of it.  That a toxic did *not* act, or that a chunk is being held right now, is
read from the proxy's ``toxic_chunks`` counter (pieces of data that reached each toxic), not guessed
from a round trip being fast or from a sleep.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import requests

from chaos.proxy import BackgroundProxyServer
from kraft.netutil import free_port

TIMEOUT_S = 10.0


class _Proxy:
    """One proxy in front of the echo upstream, driven over raw HTTP."""

    def __init__(self, server: BackgroundProxyServer, upstream: str) -> None:
        self._server = server
        self._base = server.url
        created = requests.post(
            f"{self._base}/proxies",
            timeout=TIMEOUT_S,
            json={"name": "echo", "upstream": upstream, "listen": "127.0.0.1:0"},
        )
        created.raise_for_status()
        host, port = created.json()["listen"].rsplit(":", 1)
        self.address = (host, int(port))

    def add(self, kind: str, stream: str = "downstream", toxicity: float = 1.0, **attributes: int) -> str:
        name = f"{kind}_{stream}"
        response = requests.post(
            f"{self._base}/proxies/echo/toxics",
            timeout=TIMEOUT_S,
            json={
                "name": name,
                "type": kind,
                "stream": stream,
                "toxicity": toxicity,
                "attributes": attributes,
            },
        )
        response.raise_for_status()
        return name

    def update(self, name: str, body: dict[str, Any]) -> None:
        requests.patch(
            f"{self._base}/proxies/echo/toxics/{name}", json=body, timeout=TIMEOUT_S
        ).raise_for_status()

    def remove(self, name: str) -> None:
        requests.delete(f"{self._base}/proxies/echo/toxics/{name}", timeout=TIMEOUT_S).raise_for_status()

    def set_enabled(self, enabled: bool) -> None:
        requests.patch(
            f"{self._base}/proxies/echo", json={"enabled": enabled}, timeout=TIMEOUT_S
        ).raise_for_status()

    def connect(self) -> socket.socket:
        return socket.create_connection(self.address, timeout=TIMEOUT_S)

    def chunks_through(self, toxic: str) -> int:
        """Pieces of data that reached ``toxic`` so far (read from the server thread's proxy)."""
        return self._server.server.collection.get("echo").toxic_chunks[toxic]

    def wait_for_chunks(self, toxic: str, count: int) -> None:
        """Wait until ``count`` pieces reached ``toxic``; fail after TIMEOUT_S."""
        deadline = time.monotonic() + TIMEOUT_S
        while self.chunks_through(toxic) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{self.chunks_through(toxic)} of {count} pieces reached {toxic}")
            time.sleep(0.005)


@pytest.fixture
def proxy(proxy_server: BackgroundProxyServer, echo_address: str) -> Iterator[_Proxy]:
    yield _Proxy(proxy_server, echo_address)


@pytest.fixture
def connection(proxy: _Proxy) -> Iterator[socket.socket]:
    sock = proxy.connect()
    try:
        yield sock
    finally:
        sock.close()


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        piece = sock.recv(size - len(data))
        if not piece:
            break
        data += piece
    return data


def _timed(action: Callable[[], object]) -> float:
    started = time.monotonic()
    action()
    return time.monotonic() - started


def _round_trip(sock: socket.socket, payload: bytes = b"ping") -> float:
    def exchange() -> None:
        sock.sendall(payload)
        assert _recv_exactly(sock, len(payload)) == payload

    return _timed(exchange)


def _closed_by_peer(sock: socket.socket) -> bool:
    """True on EOF or reset; False (socket.timeout propagates) if the connection stays open."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def test_latency_delays_each_direction(proxy: _Proxy, connection: socket.socket) -> None:
    _round_trip(connection)  # the connection works before any toxic
    down = proxy.add("latency", latency=300)
    # Upper bounds: 10x / 8x the configured latency, so only a delay applied many times over (per queued
    # chunk, say) fails them, not a loaded host.
    assert 0.28 <= _round_trip(connection) < 3.0
    assert proxy.chunks_through(down) == 1  # the echoed chunk, and only it, went through the toxic
    up = proxy.add("latency", stream="upstream", latency=200)
    assert 0.48 <= _round_trip(connection) < 4.0
    assert (proxy.chunks_through(up), proxy.chunks_through(down)) == (1, 2)


def test_latency_jitter_stays_within_its_range(proxy: _Proxy, connection: socket.socket) -> None:
    proxy.add("latency", latency=150, jitter=100)
    for _ in range(4):
        assert 0.045 <= _round_trip(connection) < 3.0


def test_updating_latency_applies_to_open_connections(proxy: _Proxy, connection: socket.socket) -> None:
    name = proxy.add("latency", latency=50)
    proxy.update(name, {"attributes": {"latency": 400}})
    assert _round_trip(connection) >= 0.38


def test_removing_latency_flushes_the_delayed_chunk_at_once(proxy: _Proxy, connection: socket.socket) -> None:
    # An hour of latency: within the socket's TIMEOUT_S, only the flush on removal can deliver the chunk.
    name = proxy.add("latency", latency=3_600_000)
    connection.sendall(b"held")
    proxy.wait_for_chunks(name, 1)  # the echoed chunk is now held by the latency toxic
    proxy.remove(name)
    assert _recv_exactly(connection, 4) == b"held"  # raises TimeoutError if it is still held


def test_bandwidth_caps_the_rate(proxy: _Proxy, connection: socket.socket) -> None:
    proxy.add("bandwidth", rate=100)  # 100 KB/s
    payload = b"x" * 60_000
    elapsed = _round_trip(connection, payload)
    assert elapsed >= 0.45, f"60 KB at 100 KB/s took only {elapsed:.3f}s"
    assert elapsed < 8.0


def test_slicer_splits_data_into_small_delayed_pieces(proxy: _Proxy, connection: socket.socket) -> None:
    proxy.add("slicer", average_size=10, size_variation=0, delay=20_000)
    counter = proxy.add("noop")  # after the slicer in the chain: counts the pieces it emits
    payload = bytes(range(100))
    started = time.monotonic()
    connection.sendall(payload)
    pieces: list[bytes] = []
    while sum(map(len, pieces)) < len(payload):
        pieces.append(connection.recv(4096))
        assert pieces[-1], "connection closed early"
    elapsed = time.monotonic() - started
    assert b"".join(pieces) == payload
    # Halving 100 bytes until each piece is <= 10: 4 quarters of 25 -> 12 + 13 -> 6 + 6, 6 + 7: 16 pieces.
    # (How many recv() calls they take is up to TCP and the host's load, so it is not asserted.)
    assert proxy.chunks_through(counter) == 16
    assert elapsed >= 0.12  # at least 6 of the 15 inter-piece delays of 20 ms


def test_limit_data_closes_after_n_bytes(proxy: _Proxy, connection: socket.socket) -> None:
    proxy.add("limit_data", bytes=10)
    connection.sendall(b"a" * 100)
    received = b""
    while piece := connection.recv(1024):
        received += piece
    assert received == b"a" * 10


def test_limit_data_upstream_truncates_what_the_server_sees(proxy_server: BackgroundProxyServer) -> None:
    listener = socket.create_server(("127.0.0.1", free_port()))
    listener.settimeout(TIMEOUT_S)
    seen: list[bytes] = []

    def record_one_connection() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.settimeout(TIMEOUT_S)
            while piece := conn.recv(1024):
                seen.append(piece)

    recorder = threading.Thread(target=record_one_connection, daemon=True)
    recorder.start()
    try:
        recording = _Proxy(proxy_server, f"127.0.0.1:{listener.getsockname()[1]}")
        recording.add("limit_data", stream="upstream", bytes=6)
        with recording.connect() as sock:
            sock.sendall(b"abcdefghij")
            assert _closed_by_peer(sock)
        recorder.join(TIMEOUT_S)
        assert b"".join(seen) == b"abcdef"
    finally:
        listener.close()


def test_timeout_zero_blackholes_until_removed_then_closes(proxy: _Proxy, connection: socket.socket) -> None:
    name = proxy.add("timeout", timeout=0)
    connection.sendall(b"lost")
    proxy.wait_for_chunks(name, 1)  # the hole dropped it: it can never arrive
    connection.setblocking(False)
    with pytest.raises(BlockingIOError):
        connection.recv(1024)  # no data, and no EOF: the connection is still open
    connection.settimeout(TIMEOUT_S)
    proxy.remove(name)
    assert _closed_by_peer(connection)


def test_timeout_closes_the_connection_after_the_timeout(proxy: _Proxy, connection: socket.socket) -> None:
    proxy.add("timeout", stream="upstream", timeout=300)

    def send_then_wait_for_the_close() -> None:
        # Timed from before the send: the toxic's 300 ms start when the proxy reads it, which is later.
        # (Timing from after the send made a stalled test thread eat into the lower bound.)
        connection.sendall(b"lost")
        assert _closed_by_peer(connection)

    assert 0.29 <= _timed(send_then_wait_for_the_close) < 5.0


def test_reset_peer_resets_new_connections(proxy: _Proxy) -> None:
    proxy.add("reset_peer", stream="upstream", timeout=100)
    with proxy.connect() as sock:
        started = time.monotonic()  # before the send: the toxic's 100 ms start when the proxy reads it
        sock.sendall(b"boom")
        with pytest.raises(ConnectionResetError):
            while sock.recv(1024):
                pass
        assert time.monotonic() - started >= 0.05


def test_reset_peer_closes_older_connections_with_a_fin(proxy: _Proxy, connection: socket.socket) -> None:
    proxy.add("reset_peer", stream="upstream", timeout=0)
    connection.sendall(b"boom")
    assert connection.recv(1024) == b""


def test_slow_close_delays_the_close(proxy: _Proxy, connection: socket.socket) -> None:
    proxy.add("slow_close", delay=1000)
    # Data is not delayed: a 1 s slow_close delay would make this take at least 1 s (margin: a whole
    # second for one loopback round trip).
    assert _round_trip(connection) < 1.0

    def end_then_wait_for_the_close() -> None:
        connection.shutdown(socket.SHUT_WR)  # timed from here: the delay starts when the proxy reads EOF
        assert _closed_by_peer(connection)

    assert 0.99 <= _timed(end_then_wait_for_the_close) < TIMEOUT_S


def test_disabled_proxy_refuses_and_drops_connections(proxy: _Proxy, connection: socket.socket) -> None:
    _round_trip(connection)  # echoes (asserted inside), so the connection works
    proxy.set_enabled(False)
    assert _closed_by_peer(connection)
    with pytest.raises(ConnectionRefusedError):
        proxy.connect()
    proxy.set_enabled(True)
    with proxy.connect() as again:
        _round_trip(again)


def test_toxicity_zero_never_applies_and_one_always_does(proxy: _Proxy) -> None:
    never = proxy.add("latency", latency=1000, toxicity=0.0)
    with proxy.connect() as sock:
        _round_trip(sock)
    assert proxy.chunks_through(never) == 0
    always = proxy.add("latency", stream="upstream", latency=300, toxicity=1.0)
    with proxy.connect() as sock:
        assert _round_trip(sock) >= 0.28
    assert (proxy.chunks_through(always), proxy.chunks_through(never)) == (1, 0)


def test_toxicity_is_drawn_per_connection(proxy: _Proxy) -> None:
    name = proxy.add("latency", latency=400, toxicity=0.5)
    outcomes = set()
    for _ in range(12):
        with proxy.connect() as sock:
            before = proxy.chunks_through(name)
            first = _round_trip(sock)
            first_delayed = proxy.chunks_through(name) > before
            second = _round_trip(sock)
            second_delayed = proxy.chunks_through(name) > before + first_delayed
        # One draw per connection: the toxic takes both exchanges on it or neither.
        assert first_delayed == second_delayed
        if first_delayed:
            assert min(first, second) >= 0.38  # and when it takes them, it delays them
        outcomes.add(first_delayed)
    assert outcomes == {True, False}  # seed 7 gives both within 12 connections
