"""The proxy server: the HTTP API plus its proxies, in the current event loop or a background thread."""

from __future__ import annotations

import asyncio
import json
import random
import threading
from pathlib import Path
from types import TracebackType

from chaos.proxy.api import ToxiproxyApi
from chaos.proxy.collection import ProxyCollection
from chaos.proxy.http import serve_connection

START_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0


class ToxiproxyServer:
    """A Toxiproxy-API-compatible server.  ``port=0`` binds a free port; read it back from ``port``."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = 8474,
        seed: int | None = None,
        *,
        allow_remote_listen: bool = False,
    ) -> None:
        self.host = host
        self.port = port
        self.collection = ProxyCollection(random.Random(seed), allow_remote_listen=allow_remote_listen)
        self._api = ToxiproxyApi(self.collection)
        self._server: asyncio.Server | None = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    async def start(self, config: Path | None = None) -> None:
        """Listen for the API; ``config`` is a JSON array in the ``/populate`` format, loaded first."""
        if config is not None:
            # Read once at startup, before anything else runs on this loop.
            await self.collection.populate(json.loads(config.read_text()))  # noqa: ASYNC240
        self._server = await asyncio.start_server(
            lambda r, w: serve_connection(r, w, self._api.handle), self.host, self.port
        )
        self.port = self._server.sockets[0].getsockname()[1]

    async def serve_forever(self) -> None:
        if self._server is None:
            raise RuntimeError("start() first")
        await self._server.serve_forever()

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None
        await self.collection.close()


async def _cancel_remaining_tasks() -> None:
    """Let connection tasks finish their cancellation before the loop closes."""
    current = asyncio.current_task()
    pending = [task for task in asyncio.all_tasks() if task is not current]
    for task in pending:
        task.cancel()
    await asyncio.gather(*pending, return_exceptions=True)


class BackgroundProxyServer:
    """Runs a :class:`ToxiproxyServer` on its own event loop in a daemon thread.

    Synchronous callers (the ``toxiproxy`` client uses blocking ``requests``) must not share an event
    loop with the server, so tests and the chaos harness drive it from here.
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, seed: int | None = None) -> None:
        self.server = ToxiproxyServer(host, port, seed)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run, name="toxiproxy-server", daemon=True)
        self._ready = threading.Event()
        self._stopped: asyncio.Event | None = None
        self._error: BaseException | None = None

    @property
    def url(self) -> str:
        return self.server.url

    @property
    def host(self) -> str:
        return self.server.host

    @property
    def port(self) -> int:
        return self.server.port

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_until_complete(self._main())
        finally:
            self._loop.close()

    async def _main(self) -> None:
        self._stopped = asyncio.Event()
        try:
            await self.server.start()
        except BaseException as exc:
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        try:
            await self._stopped.wait()
        finally:
            await self.server.stop()
            await _cancel_remaining_tasks()

    def start(self) -> BackgroundProxyServer:
        self._thread.start()
        if not self._ready.wait(START_TIMEOUT_S):
            raise TimeoutError("proxy server did not start within 10 s")
        if self._error is not None:
            raise RuntimeError(f"proxy server failed to start: {self._error}") from self._error
        return self

    def stop(self) -> None:
        if self._thread.is_alive() and self._stopped is not None:
            self._loop.call_soon_threadsafe(self._stopped.set)
            self._thread.join(STOP_TIMEOUT_S)

    def __enter__(self) -> BackgroundProxyServer:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
