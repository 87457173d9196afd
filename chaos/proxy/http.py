"""A small HTTP/1.1 server over asyncio streams: enough for a JSON control API.

Supports keep-alive, ``Content-Length`` and chunked request bodies.  Timeouts follow Toxiproxy's
server: a request must arrive within 15 s of the previous response (60 s idle between requests) and a
handler has 25 s before the client gets a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import http
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

MAX_HEADER_LINES = 100
MAX_BODY_BYTES = 16 * 1024 * 1024
IDLE_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 15.0
HANDLER_TIMEOUT_S = 25.0


@dataclass(frozen=True, slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-cased names
    body: bytes


@dataclass(slots=True)
class Response:
    status: int
    body: bytes = b""
    content_type: str | None = None
    headers: dict[str, str] = field(default_factory=dict)


Handler = Callable[[Request], Awaitable[Response]]


class BadRequest(Exception):
    """The bytes on the wire are not an HTTP/1.x request we can serve."""


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        parts: list[bytes] = []
        total = 0
        while True:
            size_line = await reader.readline()
            try:
                size = int(size_line.split(b";", 1)[0].strip(), 16)
            except ValueError:
                raise BadRequest("bad chunk size") from None
            if size == 0:
                # Skip trailers up to the blank line.
                while (await reader.readline()).strip():
                    pass
                return b"".join(parts)
            total += size
            if total > MAX_BODY_BYTES:
                raise BadRequest("body too large")
            parts.append(await reader.readexactly(size))
            await reader.readexactly(2)
    length_text = headers.get("content-length", "0")
    try:
        length = int(length_text)
    except ValueError:
        raise BadRequest("bad content-length") from None
    if length < 0 or length > MAX_BODY_BYTES:
        raise BadRequest("bad content-length")
    return await reader.readexactly(length) if length else b""


async def _read_request(reader: asyncio.StreamReader) -> tuple[Request, bool] | None:
    """The next request and whether the connection may be kept alive; None on a clean EOF."""
    line = await asyncio.wait_for(reader.readline(), IDLE_TIMEOUT_S)
    if not line:
        return None
    parts = line.decode("latin-1").strip().split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        raise BadRequest("malformed request line")
    method, target, version = parts
    headers: dict[str, str] = {}
    for _ in range(MAX_HEADER_LINES):
        header = await asyncio.wait_for(reader.readline(), READ_TIMEOUT_S)
        if header in (b"\r\n", b"\n", b""):
            break
        name, sep, value = header.decode("latin-1").partition(":")
        if not sep:
            raise BadRequest("malformed header")
        headers[name.strip().lower()] = value.strip()
    else:
        raise BadRequest("too many headers")
    body = await asyncio.wait_for(_read_body(reader, headers), READ_TIMEOUT_S)
    connection = headers.get("connection", "").lower()
    keep_alive = connection != "close" if version == "HTTP/1.1" else connection == "keep-alive"
    path = target.split("?", 1)[0]
    return Request(method=method.upper(), path=path, headers=headers, body=body), keep_alive


def _encode(response: Response, keep_alive: bool) -> bytes:
    try:
        reason = http.HTTPStatus(response.status).phrase
    except ValueError:
        reason = "Unknown"
    lines = [f"HTTP/1.1 {response.status} {reason}", f"Date: {email.utils.formatdate(usegmt=True)}"]
    if response.content_type is not None:
        lines.append(f"Content-Type: {response.content_type}")
    lines.extend(f"{name}: {value}" for name, value in response.headers.items())
    if response.status != 204:
        lines.append(f"Content-Length: {len(response.body)}")
    if not keep_alive:
        lines.append("Connection: close")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (b"" if response.status == 204 else response.body)


async def serve_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler
) -> None:
    """Serve requests on one client connection until it closes or asks to."""
    try:
        while True:
            try:
                parsed = await _read_request(reader)
            except BadRequest as exc:
                bad = Response(400, f"400 Bad Request: {exc}".encode(), "text/plain; charset=utf-8")
                writer.write(_encode(bad, keep_alive=False))
                await writer.drain()
                return
            if parsed is None:
                return
            request, keep_alive = parsed
            try:
                response = await asyncio.wait_for(handler(request), HANDLER_TIMEOUT_S)
            except TimeoutError:
                response = Response(
                    503,
                    b"<html><head><title>Timeout</title></head><body></body></html>",
                    "text/html; charset=utf-8",
                )
            writer.write(_encode(response, keep_alive))
            await writer.drain()
            if not keep_alive:
                return
    except (ConnectionError, OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return
    except asyncio.CancelledError:
        # Server shutdown cancels idle keep-alive connections; this task is the connection's top level.
        return
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError, OSError):
            await writer.wait_closed()
