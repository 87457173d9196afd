"""The set of proxies behind the API, with Toxiproxy's create/update/populate/reset semantics."""

from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass
from typing import Any

from chaos.proxy.proxy import Proxy, Router, loopback_listen
from chaos.proxy.toxics import BAD_REQUEST_BODY, MISSING_FIELD, PROXY_EXISTS, PROXY_NOT_FOUND, ApiError


@dataclass(frozen=True, slots=True)
class ProxySpec:
    """A validated create-proxy body."""

    name: str
    upstream: str
    listen: str
    enabled: bool


class PopulateError(ApiError):
    """A populate failure; Toxiproxy still reports the proxies created before it."""

    def __init__(self, status: int, message: str, created: list[Proxy]) -> None:
        super().__init__(status, message)
        self.created = created


def _optional(body: dict[str, Any], key: str, kind: type, default: Any) -> Any:
    value = body.get(key, default)
    if value is None:
        return default
    if not isinstance(value, kind):
        raise ApiError(400, f"{BAD_REQUEST_BODY}: {key!r} must be a {kind.__name__}, got {value!r}")
    return value


def parse_proxy_spec(body: Any, where: str = "") -> ProxySpec:
    if not isinstance(body, dict):
        raise ApiError(400, f"{BAD_REQUEST_BODY}: expected a JSON object{where}")
    name = _optional(body, "name", str, "")
    upstream = _optional(body, "upstream", str, "")
    listen = _optional(body, "listen", str, "")
    enabled = _optional(body, "enabled", bool, True)
    if not name:
        raise ApiError(400, f"{MISSING_FIELD}: name{where}")
    if not upstream:
        raise ApiError(400, f"{MISSING_FIELD}: upstream{where}")
    return ProxySpec(name=name, upstream=upstream, listen=listen, enabled=enabled)


class ProxyCollection:
    """All proxies by name.  Every mutation holds one lock so API calls apply in arrival order."""

    def __init__(self, rng: random.Random, *, allow_remote_listen: bool = False) -> None:
        """Unless ``allow_remote_listen``, proxies listen on loopback only (:func:`loopback_listen`)."""
        self._rng = rng
        self._allow_remote_listen = allow_remote_listen
        self._proxies: dict[str, Proxy] = {}
        # Optional per-connection upstream override (chaos.dialers); read at each accept, so it may be
        # installed after the proxies exist.
        self.router: Router | None = None
        self.lock = asyncio.Lock()

    def _route(self, proxy: str, dialer: tuple[str, int]) -> str | None:
        return None if self.router is None else self.router(proxy, dialer)

    def all(self) -> list[Proxy]:
        return [self._proxies[name] for name in sorted(self._proxies)]

    def get(self, name: str) -> Proxy:
        proxy = self._proxies.get(name)
        if proxy is None:
            raise ApiError(404, PROXY_NOT_FOUND)
        return proxy

    def _listen(self, listen: str) -> str:
        return listen if self._allow_remote_listen else loopback_listen(listen)

    async def _start_new(self, spec: ProxySpec) -> Proxy:
        proxy = Proxy(spec.name, self._listen(spec.listen), spec.upstream, self._rng, self._route)
        if spec.enabled:
            await proxy.start()
        self._proxies[spec.name] = proxy
        return proxy

    async def create(self, body: Any) -> Proxy:
        spec = parse_proxy_spec(body)
        if spec.name in self._proxies:
            raise ApiError(409, PROXY_EXISTS)
        return await self._start_new(spec)

    async def populate(self, body: Any) -> list[Proxy]:
        """Create or replace each listed proxy; all entries are validated before any is created."""
        if not isinstance(body, list):
            raise PopulateError(400, f"{BAD_REQUEST_BODY}: expected a JSON array", [])
        try:
            specs = [parse_proxy_spec_for_populate(entry, index) for index, entry in enumerate(body)]
        except ApiError as exc:
            raise PopulateError(exc.status, exc.message, []) from None
        done: list[Proxy] = []
        for spec in specs:
            try:
                done.append(await self._add_or_replace(spec))
            except ApiError as exc:
                raise PopulateError(exc.status, exc.message, done) from None
        return done

    async def _add_or_replace(self, spec: ProxySpec) -> Proxy:
        existing = self._proxies.get(spec.name)
        if existing is not None:
            if existing.listen == self._listen(spec.listen) and existing.upstream == spec.upstream:
                return existing  # unchanged: keeps its enabled flag and toxics
            await existing.stop()
            del self._proxies[spec.name]
        return await self._start_new(spec)

    async def update(self, name: str, body: Any) -> Proxy:
        proxy = self.get(name)
        if not isinstance(body, dict):
            raise ApiError(400, f"{BAD_REQUEST_BODY}: expected a JSON object")
        listen = self._listen(_optional(body, "listen", str, proxy.listen))
        upstream = _optional(body, "upstream", str, proxy.upstream)
        enabled = _optional(body, "enabled", bool, proxy.enabled)
        if listen != proxy.listen or upstream != proxy.upstream:
            # A changed address drops every connection: stop, then restart with the new one.
            was_running = proxy.enabled
            await proxy.stop()
            proxy.listen, proxy.upstream = listen, upstream
            if was_running and enabled:
                await proxy.start()
        if enabled and not proxy.enabled:
            await proxy.start()
        elif not enabled and proxy.enabled:
            await proxy.stop()
        return proxy

    async def delete(self, name: str) -> None:
        proxy = self.get(name)
        await proxy.stop()
        del self._proxies[name]

    async def reset(self) -> None:
        """Restart every disabled proxy and remove all toxics (500 if a port cannot be bound again)."""
        for proxy in self.all():
            await proxy.start()
            proxy.remove_all_toxics()

    async def close(self) -> None:
        for proxy in self.all():
            await proxy.stop()
        self._proxies.clear()


def parse_proxy_spec_for_populate(entry: Any, index: int) -> ProxySpec:
    return parse_proxy_spec(entry, where=f" at proxy {index + 1}")
