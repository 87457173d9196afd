"""A small synchronous client for the Toxiproxy HTTP API (ours or a real Toxiproxy at ``TOXIPROXY_URL``).

Unlike toxiproxy-python it sets a timeout on every call, raises on every error status (including 500),
and is not process-global, so one harness can drive several servers.
"""

from __future__ import annotations

import os
from typing import Any

import requests

TOXIPROXY_URL_ENV = "TOXIPROXY_URL"
DEFAULT_TIMEOUT_S = 10.0


class ToxiproxyError(Exception):
    """The API answered with an error status (the message is Toxiproxy's ``error`` text)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"toxiproxy {status}: {message}")
        self.status = status
        self.message = message


def external_toxiproxy_url() -> str | None:
    """The URL of a real Toxiproxy server the harness should use instead of starting its own."""
    url = os.environ.get(TOXIPROXY_URL_ENV, "").strip()
    return url.rstrip("/") or None


class ToxiproxyClient:
    def __init__(self, url: str, timeout_s: float = DEFAULT_TIMEOUT_S) -> None:
        self.url = url.rstrip("/")
        self._timeout_s = timeout_s
        self._session = requests.Session()

    def close(self) -> None:
        self._session.close()

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        response = self._session.request(method, self.url + path, json=body, timeout=self._timeout_s)
        if response.status_code >= 400:
            try:
                message = str(response.json().get("error", response.text))
            except ValueError:
                message = response.text.strip()
            raise ToxiproxyError(response.status_code, message)
        return response.json() if response.content else None

    def version(self) -> str:
        return str(self._call("GET", "/version")["version"])

    def proxies(self) -> dict[str, Any]:
        result: dict[str, Any] = self._call("GET", "/proxies")
        return result

    def populate(self, proxies: list[dict[str, Any]]) -> list[dict[str, Any]]:
        result = self._call("POST", "/populate", proxies)
        return list(result.get("proxies") or [])

    def create(self, name: str, upstream: str, listen: str, enabled: bool = True) -> dict[str, Any]:
        result: dict[str, Any] = self._call(
            "POST", "/proxies", {"name": name, "upstream": upstream, "listen": listen, "enabled": enabled}
        )
        return result

    def delete(self, name: str) -> None:
        self._call("DELETE", f"/proxies/{name}")

    def set_enabled(self, name: str, enabled: bool) -> None:
        self._call("POST", f"/proxies/{name}", {"enabled": enabled})

    def add_toxic(
        self,
        proxy: str,
        name: str,
        kind: str,
        stream: str = "downstream",
        toxicity: float = 1.0,
        attributes: dict[str, int] | None = None,
    ) -> dict[str, Any]:
        body = {
            "name": name,
            "type": kind,
            "stream": stream,
            "toxicity": toxicity,
            "attributes": attributes or {},
        }
        result: dict[str, Any] = self._call("POST", f"/proxies/{proxy}/toxics", body)
        return result

    def remove_toxic(self, proxy: str, name: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{name}")

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self._call("GET", f"/proxies/{proxy}/toxics"))

    def reset(self) -> None:
        self._call("POST", "/reset")
