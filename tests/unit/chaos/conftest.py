"""Fixtures for the proxy tests: a background proxy server, a threaded echo upstream, a patched client."""

from __future__ import annotations

import socket
import socketserver
import threading
from collections.abc import Iterator
from typing import Any

import pytest
import requests
import toxiproxy.api
from toxiproxy import Toxiproxy

from chaos.proxy import BackgroundProxyServer
from kraft.netutil import free_port

CLIENT_TIMEOUT_S = 10.0


class _EchoHandler(socketserver.BaseRequestHandler):
    def handle(self) -> None:
        sock: socket.socket = self.request
        sock.settimeout(30)
        try:
            while data := sock.recv(65536):
                sock.sendall(data)
        except OSError:
            return


class _EchoServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


class _TimeoutRequests:
    """Stands in for ``requests`` inside toxiproxy.api: the client sends no timeout of its own."""

    @staticmethod
    def get(url: str, **kwargs: Any) -> requests.Response:
        return requests.get(url, timeout=CLIENT_TIMEOUT_S, **kwargs)

    @staticmethod
    def post(url: str, **kwargs: Any) -> requests.Response:
        return requests.post(url, timeout=CLIENT_TIMEOUT_S, **kwargs)

    @staticmethod
    def delete(url: str, **kwargs: Any) -> requests.Response:
        return requests.delete(url, timeout=CLIENT_TIMEOUT_S, **kwargs)


@pytest.fixture
def proxy_server() -> Iterator[BackgroundProxyServer]:
    server = BackgroundProxyServer(port=free_port(), seed=7).start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def toxiproxy_client(proxy_server: BackgroundProxyServer, monkeypatch: pytest.MonkeyPatch) -> Toxiproxy:
    monkeypatch.setattr(toxiproxy.api, "requests", _TimeoutRequests)
    monkeypatch.setattr(toxiproxy.api.APIConsumer, "host", proxy_server.host)
    monkeypatch.setattr(toxiproxy.api.APIConsumer, "port", proxy_server.port)
    return Toxiproxy()


@pytest.fixture
def echo_address() -> Iterator[str]:
    port = free_port()
    server = _EchoServer(("127.0.0.1", port), _EchoHandler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), name="echo-upstream", daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
