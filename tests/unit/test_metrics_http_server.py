"""The metrics endpoint bounds its connections (issue #15: 500 half-open connections held 500 threads).

Real sockets on loopback with short limits; every wait is bounded.  What is checked: a connection over the
cap is closed at once and refusals are logged once per interval; a silent connection (plain or TLS: a
handshake that never starts) is closed after the I/O timeout; a client trickling bytes faster than the
timeout is cut at the deadline; a scrape still works once the idle connections are gone.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kraft.client.channel import KeyStore, PemSource, TrustStore
from kraft.netutil import free_port
from kraft.observability.http_server import HttpLimits
from kraft.observability.metrics import MetricsServer, start_metrics_server
from kraft.security.ca import write_cluster_tls
from kraft.security.tls import MetricsTlsContext, SslSettings

WAIT_S = 5.0


def _wait_until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + WAIT_S
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@contextlib.contextmanager
def _server(limits: HttpLimits, tls_dir: Path | None = None) -> Iterator[MetricsServer]:
    context = None
    if tls_dir is not None:
        context = MetricsTlsContext(
            SslSettings(
                keystore=KeyStore.from_file(tls_dir / "node.pem"),
                truststore=TrustStore(PemSource(path=tls_dir / "ca.pem")),
            )
        )
    server = start_metrics_server(free_port(), addr="127.0.0.1", tls_context=context, limits=limits)
    assert server is not None
    try:
        yield server
    finally:
        server.close()


def _connect(server: MetricsServer) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.port), timeout=WAIT_S)


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the server closed ``sock`` (EOF or reset) within :data:`WAIT_S`."""
    try:
        return sock.recv(1024) == b""
    except ConnectionResetError:
        return True


def _scrape(server: MetricsServer) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=WAIT_S) as reply:
        return str(reply.read().decode())


def test_connections_over_the_cap_are_closed_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING)
    limits = HttpLimits(max_connections=3, io_timeout_s=60.0, deadline_s=60.0, refusal_log_interval_s=60.0)
    with _server(limits) as server:
        idle = [_connect(server) for _ in range(3)]  # half-open: they never send a request
        try:
            _wait_until(lambda: server.open_connections == 3, "three connections being served")
            for _ in range(5):
                with _connect(server) as extra:
                    assert _closed_by_server(extra)
            with pytest.raises((urllib.error.URLError, ConnectionError)):
                _scrape(server)
            assert server.refused_connections == 6
            assert server.open_connections == 3
        finally:
            for sock in idle:
                sock.close()
        _wait_until(lambda: server.open_connections == 0, "the idle connections to be gone")
        assert "kraft_" in _scrape(server)
    refusals = [r for r in caplog.records if r.name == "kraft.metrics"]
    assert len(refusals) == 1, "one line per interval, whatever the number refused"
    assert refusals[0].getMessage() == "metrics_connections_refused"
    assert getattr(refusals[0], "kraft_fields", {}).get("max_connections") == 3


@pytest.mark.parametrize("tls", [False, True], ids=["http", "https"])
def test_a_silent_connection_is_closed_after_the_io_timeout(tls: bool, tmp_path: Path) -> None:
    """Over HTTPS the silent client never starts the handshake: the handshake times out the same way."""
    tls_dir = None
    if tls:
        tls_dir = tmp_path / "tls"
        write_cluster_tls(tls_dir, ["node"])
    limits = HttpLimits(io_timeout_s=0.3, deadline_s=60.0)
    with _server(limits, tls_dir) as server, _connect(server) as silent:
        assert _closed_by_server(silent)
        # ended by the I/O timeout (60 s deadline far away), counted before the socket closed
        assert (server.timed_out_connections, server.deadline_cut_connections) == (1, 0)
        _wait_until(lambda: server.open_connections == 0, "the connection's thread to end")


def test_a_client_trickling_bytes_is_cut_at_the_deadline() -> None:
    """One byte every 0.1 s never lets the read timeout fire (30 s: far above any stall of this client on a
    loaded host, and above the loop's 5 s bound); the 0.6 s deadline ends it."""
    limits = HttpLimits(io_timeout_s=30.0, deadline_s=0.6)
    with _server(limits) as server, _connect(server) as slow:
        start = time.monotonic()
        cut = False
        while time.monotonic() - start < WAIT_S:
            try:
                slow.sendall(b"G")
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            slow.settimeout(0.1)
            try:
                if slow.recv(1024) == b"":
                    cut = True
                    break
            except TimeoutError:
                continue
            except ConnectionResetError:
                cut = True
                break
        assert cut, "the trickling connection was never closed"
        # cut by the deadline, not by the read timeout (each read waited 0.1 s at most, of 1 s allowed)
        assert (server.deadline_cut_connections, server.timed_out_connections) == (1, 0)
        _wait_until(lambda: server.open_connections == 0, "the connection's thread to end")
