"""The Toxiproxy HTTP API: routes, status codes, JSON and error bodies as Toxiproxy 2.12.0 sends them."""

from __future__ import annotations

import json
import secrets
from typing import Any
from urllib.parse import unquote

from chaos.proxy.collection import PopulateError, ProxyCollection
from chaos.proxy.http import Request, Response
from chaos.proxy.toxics import BAD_REQUEST_BODY, ApiError, toxic_from_create_body

TOXIPROXY_VERSION = "2.12.0"
JSON_TYPE = "application/json"

# (path pattern, allowed methods); "*" matches one non-empty path segment (gorilla/mux's {name}).
_ROUTES: list[tuple[tuple[str, ...], frozenset[str]]] = [
    (("proxies",), frozenset({"GET", "POST"})),
    (("populate",), frozenset({"POST"})),
    (("reset",), frozenset({"POST"})),
    (("version",), frozenset({"GET"})),
    (("proxies", "*"), frozenset({"GET", "POST", "PATCH", "DELETE"})),
    (("proxies", "*", "toxics"), frozenset({"GET", "POST"})),
    (("proxies", "*", "toxics", "*"), frozenset({"GET", "POST", "PATCH", "DELETE"})),
]


def _json(status: int, value: Any) -> Response:
    return Response(status, json.dumps(value, separators=(",", ":")).encode(), JSON_TYPE)


def error_response(status: int, message: str, extra: dict[str, Any] | None = None) -> Response:
    # Toxiproxy ends with Go's http.Error, which resets the content type to text/plain.
    body = {"error": message, "status": status, **(extra or {})}
    return Response(
        status,
        (json.dumps(body, separators=(",", ":")) + "\n").encode(),
        "text/plain; charset=utf-8",
        {"X-Content-Type-Options": "nosniff"},
    )


def _decode(body: bytes) -> Any:
    if not body.strip():
        raise ApiError(400, f"{BAD_REQUEST_BODY}: EOF")
    try:
        return json.loads(body.decode("utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"{BAD_REQUEST_BODY}: {exc}") from None


def _match(path: str) -> tuple[tuple[str, ...], list[str], frozenset[str]] | None:
    segments = path.split("/")[1:] if path.startswith("/") else []
    for pattern, methods in _ROUTES:
        if len(pattern) != len(segments):
            continue
        params: list[str] = []
        for want, got in zip(pattern, segments, strict=True):
            if want == "*":
                if not got:
                    break
                params.append(unquote(got))
            elif want != got:
                break
        else:
            return pattern, params, methods
    return None


class ToxiproxyApi:
    """Turns requests into collection calls; every response carries ``X-Toxiproxy-Request-Id``."""

    def __init__(self, collection: ProxyCollection) -> None:
        self._collection = collection

    async def handle(self, request: Request) -> Response:
        response = await self._route(request)
        response.headers["X-Toxiproxy-Request-Id"] = secrets.token_hex(10)
        return response

    async def _route(self, request: Request) -> Response:
        if request.headers.get("user-agent", "").startswith("Mozilla/"):
            return Response(403, b"User agent not allowed\n", "text/plain; charset=utf-8")
        matched = _match(request.path)
        if matched is None:
            return Response(404, b"404 page not found\n", "text/plain; charset=utf-8")
        pattern, params, methods = matched
        if request.method not in methods:
            return Response(405)
        try:
            async with self._collection.lock:
                return await self._dispatch(pattern, params, request)
        except PopulateError as exc:
            # As on success, Go marshals an empty (nil) slice as null.
            created = [p.to_json() for p in exc.created] or None
            return error_response(exc.status, exc.message, {"proxies": created})
        except ApiError as exc:
            return error_response(exc.status, exc.message)

    async def _dispatch(self, pattern: tuple[str, ...], params: list[str], request: Request) -> Response:
        method = request.method
        collection = self._collection
        if pattern == ("version",):
            return Response(
                200,
                json.dumps({"version": TOXIPROXY_VERSION}).encode() + b"\n",
                "application/json;charset=utf-8",
            )
        if pattern == ("reset",):
            await collection.reset()
            return Response(204)
        if pattern == ("populate",):
            try:
                body = _decode(request.body)
            except ApiError as exc:
                raise PopulateError(exc.status, exc.message, []) from None
            proxies = await collection.populate(body)
            # Go marshals an empty (nil) slice as null.
            return _json(201, {"proxies": [p.to_json() for p in proxies] or None})
        if pattern == ("proxies",):
            if method == "GET":
                return _json(200, {p.name: p.to_json() for p in collection.all()})
            proxy = await collection.create(_decode(request.body))
            return _json(201, proxy.to_json())
        proxy_name = params[0]
        if pattern == ("proxies", "*"):
            if method == "GET":
                return _json(200, collection.get(proxy_name).to_json())
            if method == "DELETE":
                await collection.delete(proxy_name)
                return Response(204)
            collection.get(proxy_name)  # 404 before 400, as Toxiproxy looks the proxy up first
            return _json(200, (await collection.update(proxy_name, _decode(request.body))).to_json())
        proxy = collection.get(proxy_name)
        if pattern == ("proxies", "*", "toxics"):
            if method == "GET":
                return _json(200, [t.to_json() for t in proxy.toxics()])
            toxic = proxy.add_toxic(toxic_from_create_body(_decode(request.body)))
            return _json(200, toxic.to_json())
        toxic_name = params[1]
        if method == "GET":
            return _json(200, proxy.get_toxic(toxic_name).to_json())
        if method == "DELETE":
            proxy.remove_toxic(toxic_name)
            return Response(204)
        proxy.get_toxic(toxic_name)
        return _json(200, proxy.update_toxic(toxic_name, _decode(request.body)).to_json())
