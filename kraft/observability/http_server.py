"""The ``/metrics`` HTTP(S) server with bounded connections (issue #15: 500 half-open connections held
500 threads of a node, for ever).

A thread per connection, as ``prometheus_client``'s server, but:

* at most :attr:`HttpLimits.max_connections` at once — one more is closed as soon as it is accepted
  (``event=metrics_connections_refused``, logged at most once per :attr:`HttpLimits.refusal_log_interval_s`
  with the count refused since the last line);
* every read and write (the TLS handshake's included) times out after :attr:`HttpLimits.io_timeout_s`;
* a connection still open :attr:`HttpLimits.deadline_s` after it was accepted (a client trickling one byte
  at a time beats a per-read timeout) is shut down by the accept loop, which looks every half second.

HTTPS: each accepted connection is wrapped with the context ``tls_context()`` returns *now* (a rotated
certificate serves the next scrape); the handshake runs in the connection's own thread, so a client that
never finishes one cannot stall ``accept`` — and holds its thread no longer than the I/O timeout.
"""

from __future__ import annotations

import contextlib
import math
import socket
import ssl
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler
from wsgiref.types import WSGIApplication

from prometheus_client.exposition import ThreadingWSGIServer

from kraft.observability.logging import get_logger
from kraft.observability.thread_names import named_target

_log = get_logger("metrics")


@dataclass(frozen=True, slots=True)
class HttpLimits:
    max_connections: int = 32
    """Connections served at once (Prometheus scrapes each target over one; 32 leaves room for people)."""
    io_timeout_s: float = 10.0
    """A read or write (TLS handshake included) that waits longer ends the connection."""
    deadline_s: float = 30.0
    """No connection lives longer (a scrape takes milliseconds)."""
    refusal_log_interval_s: float = 10.0


class _SilentHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Scrapes are not logged (prometheus_client's handler does the same)."""


class BoundedWsgiServer(ThreadingWSGIServer):
    """See the module docstring.  Build with :func:`serve`."""

    # server_close shuts the open connections down instead of waiting for their threads.
    block_on_close = False

    def __init__(
        self,
        server_address: tuple[str, int],
        *,
        limits: HttpLimits,
        tls_context: Callable[[], ssl.SSLContext] | None,
    ) -> None:
        self.address_family = socket.AF_INET6 if ":" in server_address[0] else socket.AF_INET
        self.limits = limits
        self.tls_context = tls_context
        self._lock = threading.Lock()
        self._open: dict[socket.socket, float] = {}
        """Connections being served → when they must be gone (``time.monotonic``)."""
        self.refused = 0
        # Why connections ended early (the tests assert the cause, not the time it took; under _lock):
        self.timed_out = 0  # a read or write (or TLS handshake) waited io_timeout_s
        self.cut_at_deadline = 0  # still open deadline_s after it was accepted
        self._refused_unlogged = 0
        self._refusal_logged_at = -math.inf
        super().__init__(server_address, _SilentHandler)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._open)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = self.socket.accept()
        sock.settimeout(self.limits.io_timeout_s)
        if self.tls_context is None:
            return sock, address
        try:
            wrapped = self.tls_context().wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        except (OSError, ValueError):
            sock.close()
            raise
        return wrapped, address

    def verify_request(self, request: Any, client_address: Any) -> bool:
        with self._lock:
            if len(self._open) < self.limits.max_connections:
                self._open[request] = time.monotonic() + self.limits.deadline_s
                return True
        self._refuse()
        return False  # socketserver closes it

    def _refuse(self) -> None:
        self.refused += 1
        self._refused_unlogged += 1
        now = time.monotonic()
        if now - self._refusal_logged_at >= self.limits.refusal_log_interval_s:
            _log.warning(
                "metrics_connections_refused",
                refused=self._refused_unlogged,
                max_connections=self.limits.max_connections,
                port=self.server_port,
            )
            self._refused_unlogged = 0
            self._refusal_logged_at = now

    def process_request(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request(request, client_address)
        except BaseException:  # no thread to serve it: it is not open
            self._forget(request)
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._forget(request)

    def _forget(self, request: Any) -> None:
        with self._lock:
            self._open.pop(request, None)

    def finish_request(self, request: Any, client_address: Any) -> None:
        if isinstance(request, ssl.SSLSocket):
            request.do_handshake()  # here, under the I/O timeout, not implicitly inside the first read
        super().finish_request(request, client_address)

    def service_actions(self) -> None:
        """Shut down connections past their deadline (called by ``serve_forever`` every poll)."""
        self._shut_down(time.monotonic())

    def server_close(self) -> None:
        super().server_close()
        self._shut_down(math.inf)

    def _shut_down(self, now: float) -> None:
        """Shut down the connections whose deadline is ``now`` or earlier."""
        with self._lock:
            late = [sock for sock, deadline in self._open.items() if deadline <= now]
            for sock in late:
                self._open[sock] = math.inf  # once; the serving thread forgets it when it ends
            if now != math.inf:  # not server_close's
                self.cut_at_deadline += len(late)
        for sock in late:
            # The plain socket's shutdown (not SSLSocket's, which drops its TLS object under the reader):
            # the blocked read in the serving thread returns, and the thread ends.
            with contextlib.suppress(OSError):
                socket.socket.shutdown(sock, socket.SHUT_RDWR)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A failed handshake, a timeout, a client gone: the client's problem, not worth a traceback.
        (Called inside the serving thread's ``except``: a timeout is counted.)"""
        if isinstance(sys.exc_info()[1], TimeoutError):
            with self._lock:
                self.timed_out += 1


def serve(
    addr: str,
    port: int,
    app: WSGIApplication,
    *,
    tls_context: Callable[[], ssl.SSLContext] | None = None,
    limits: HttpLimits | None = None,
    name: str = "metrics-http",
) -> tuple[BoundedWsgiServer, threading.Thread]:
    """Serve ``app`` on ``addr:port`` (0: any free port) from a daemon thread; raises ``OSError`` when the
    port cannot be bound.  Stop with ``server.shutdown(); server.server_close()``."""

    server = BoundedWsgiServer((addr, port), limits=limits or HttpLimits(), tls_context=tls_context)
    server.set_app(app)
    thread = threading.Thread(target=named_target(name, server.serve_forever), name=name, daemon=True)
    thread.start()
    return server, thread
