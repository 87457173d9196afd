"""How every kraft gRPC server is built and how its services are registered (issue #15 hardening).

Two things every listener shares:

- :func:`register_service` installs a servicer with raw-bytes handlers that decode inside the handler:
  bytes that are no protobuf message of the method's type end the call with ``INVALID_ARGUMENT`` and
  one short message, logged at most once per :data:`BAD_REQUEST_LOG_INTERVAL_S` per peer host without a
  traceback.  The generated ``add_*Servicer_to_server`` functions let gRPC decode, which answers
  ``UNKNOWN`` and logs a traceback at error level for every such request (~10 MB of log in 33 s).
- :func:`server_options` is the one list of transport limits (handshake and idle timeouts, keepalive,
  streams per connection, a connection cap) that controller and broker servers are created with.

It imports grpc, so it stays out of the Raft core (tests/unit/test_layering.py).
"""

from __future__ import annotations

import inspect
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import grpc
import grpc.aio
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import DecodeError, Message
from google.protobuf.message_factory import GetMessageClass

from kraft.config import NodeConfig
from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for

ServicerContext = grpc.aio.ServicerContext[Any, Any]

BAD_REQUEST_LOG_INTERVAL_S = 10.0
"""A peer sending undecodable requests is logged at most this often (the rest are counted)."""
_MAX_LOGGED_PEERS = 1024
"""Peers remembered by the rate limiter; past that it starts over (a bound, not a policy)."""


class RateLimitedLog:
    """One warning per ``key`` per ``interval_s``; how many were suppressed rides on the next one."""

    def __init__(self, interval_s: float = BAD_REQUEST_LOG_INTERVAL_S) -> None:
        self._interval_s = interval_s
        self._last: dict[str, tuple[float, int]] = {}

    def should_log(self, key: str, now_s: float) -> int | None:
        """None to stay quiet, else how many were suppressed since the last logged one."""
        last = self._last.get(key)
        if last is not None and now_s - last[0] < self._interval_s:
            self._last[key] = (last[0], last[1] + 1)
            return None
        if len(self._last) >= _MAX_LOGGED_PEERS:
            self._last.clear()
        self._last[key] = (now_s, 0)
        return 0 if last is None else last[1]


def peer_host(context: ServicerContext) -> str:
    """The caller's address without its port (one client opens many connections)."""
    peer = context.peer() or "unknown"
    return peer.rsplit(":", 1)[0] if peer.count(":") >= 2 else peer


async def abort(context: ServicerContext, code: grpc.StatusCode, message: str) -> NoReturn:
    await context.abort(code, message)
    raise AssertionError("unreachable: context.abort raises")  # pragma: no cover


class RequestDecoder:
    """Parses request bytes for one service; undecodable ones abort with INVALID_ARGUMENT."""

    def __init__(self, logger: logging.Logger, event: str) -> None:
        """``event`` names the rate-limited warning (``raft_bad_request``, ``controller_bad_request``…)."""
        self._log = logger
        self._event = event
        self._limiter = RateLimitedLog()

    async def decode(
        self, raw: bytes, pb_type: type[Message], method: str, context: ServicerContext
    ) -> Message:
        try:
            return pb_type.FromString(raw)
        except (DecodeError, ValueError, RuntimeError) as exc:  # RuntimeError: recursion limit
            host = peer_host(context)
            suppressed = self._limiter.should_log(host, time.monotonic())
            if suppressed is not None:
                self._log.warning(
                    "%s peer=%s method=%s error=%s suppressed=%d",
                    self._event,
                    host,
                    method,
                    type(exc).__name__,
                    suppressed,
                )
            await abort(
                context, grpc_status_for(ErrorCode.INVALID_REQUEST), f"undecodable {pb_type.__name__}"
            )


def _serialize(message: Message) -> bytes:
    return message.SerializeToString()


UnaryMethod = Callable[[Any, ServicerContext], Awaitable[Message]]
StreamMethod = Callable[[AsyncIterator[Any], ServicerContext], AsyncIterator[Message]]


def _unary(decoder: RequestDecoder, name: str, pb_type: type[Message], method: UnaryMethod) -> UnaryMethod:
    async def handle(raw: bytes, context: ServicerContext) -> Message:
        request = await decoder.decode(raw, pb_type, name, context)
        return await method(request, context)

    return handle


def _stream(decoder: RequestDecoder, name: str, pb_type: type[Message], method: StreamMethod) -> StreamMethod:
    async def handle(raw_requests: AsyncIterator[bytes], context: ServicerContext) -> AsyncIterator[Message]:
        async def decoded() -> AsyncIterator[Message]:
            async for raw in raw_requests:
                yield await decoder.decode(raw, pb_type, name, context)

        async for response in method(decoded(), context):
            yield response

    return handle


WritingMethod = Callable[[Any, ServicerContext], Awaitable[None]]


def _stream_writing(
    decoder: RequestDecoder, name: str, pb_type: type[Message], method: WritingMethod
) -> WritingMethod:
    """A stream-stream method that answers with ``context.write`` (a coroutine, not a generator): it can
    write an answer from wherever it is ready, not only from the generator's own frame."""

    async def handle(raw_requests: AsyncIterator[bytes], context: ServicerContext) -> None:
        async def decoded() -> AsyncIterator[Message]:
            async for raw in raw_requests:
                yield await decoder.decode(raw, pb_type, name, context)

        await method(decoded(), context)

    return handle


def _unary_stream(
    decoder: RequestDecoder, name: str, pb_type: type[Message], method: WritingMethod
) -> WritingMethod:
    async def handle(raw: bytes, context: ServicerContext) -> None:
        request = await decoder.decode(raw, pb_type, name, context)
        await method(request, context)

    return handle


def register_service(
    server: grpc.aio.Server,
    servicer: object,
    service: ServiceDescriptor,
    decoder: RequestDecoder,
) -> None:
    """Register every method of ``service`` with handlers that decode inside the call.

    Same methods and wire format as the generated ``add_<Service>Servicer_to_server``; ``servicer`` has one
    coroutine method per RPC named like it (unary-unary, stream-stream taking an async iterator — an async
    generator, or a coroutine answering with ``context.write`` — or unary-stream answering with
    ``context.write`` as grpc.health.v1's Watch does).
    """
    handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}
    for method in service.methods:
        pb_type = GetMessageClass(method.input_type)
        implementation = getattr(servicer, method.name)
        if method.client_streaming and method.server_streaming:
            wrap = _stream if inspect.isasyncgenfunction(implementation) else _stream_writing
            handlers[method.name] = grpc.stream_stream_rpc_method_handler(
                wrap(decoder, method.name, pb_type, implementation), response_serializer=_serialize
            )
        elif not method.client_streaming and not method.server_streaming:
            handlers[method.name] = grpc.unary_unary_rpc_method_handler(
                _unary(decoder, method.name, pb_type, implementation), response_serializer=_serialize
            )
        elif method.server_streaming:
            handlers[method.name] = grpc.unary_stream_rpc_method_handler(
                _unary_stream(decoder, method.name, pb_type, implementation), response_serializer=_serialize
            )
        else:  # pragma: no cover - no such RPC in kraft.v1 or grpc.health.v1
            raise ValueError(f"{service.full_name}/{method.name}: client-streaming methods are not served")
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(service.full_name, handlers),))


# ------------------------------------------------------------------------------ transport limits


@dataclass(frozen=True)
class ServerLimits:
    """Transport limits of one gRPC server (docs/configuration.md, "Connections")."""

    max_message_bytes: int = 16 * 1024 * 1024
    handshake_timeout_ms: int = 10_000
    """A connection that has not completed the HTTP/2 handshake (client preface and SETTINGS) by then is
    closed: half-open or silent TCP connections do not accumulate."""
    max_idle_ms: int = 600_000
    """A connection without an RPC for this long is closed with GOAWAY (Kafka's connections.max.idle.ms)."""
    max_age_ms: int = 0
    """Connections are closed (GOAWAY, then a grace period) after this long; 0 = never."""
    keepalive_time_ms: int = 60_000
    keepalive_timeout_ms: int = 20_000
    max_concurrent_streams: int = 1_000
    max_connections: int = 1_000
    reuseport: bool = False
    """``SO_REUSEPORT`` on the listening socket: only with intake processes (controller.intake.processes),
    which bind the same port.  Off otherwise, so a second process on a configured port fails to bind."""


AGE_GRACE_MS = 30_000
"""After a max-age GOAWAY, RPCs in flight get this long to finish (a long-poll is at most 30 s)."""


def server_options(limits: ServerLimits) -> list[tuple[str, Any]]:
    """The grpc.aio server options every kraft listener is created with."""
    options: list[tuple[str, Any]] = [
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.max_receive_message_length", limits.max_message_bytes),
        ("grpc.server_handshake_timeout_ms", limits.handshake_timeout_ms),
        ("grpc.max_connection_idle_ms", limits.max_idle_ms),
        # The server pings a connection with RPCs open but nothing sent for keepalive_time_ms (a peer that
        # vanished while long-polling) and closes it when no answer comes within keepalive_timeout_ms.
        ("grpc.keepalive_time_ms", limits.keepalive_time_ms),
        ("grpc.keepalive_timeout_ms", limits.keepalive_timeout_ms),
        # Followers keep one long-poll Fetch open all the time; allow their keepalive pings.
        ("grpc.http2.min_ping_interval_without_data_ms", 5_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
        ("grpc.max_allowed_incoming_connections", limits.max_connections),
        ("grpc.so_reuseport", int(limits.reuseport)),
    ]
    if limits.max_age_ms > 0:
        options.append(("grpc.max_connection_age_ms", limits.max_age_ms))
        options.append(("grpc.max_connection_age_grace_ms", AGE_GRACE_MS))
    return options


def server_limits(config: NodeConfig) -> ServerLimits:
    """A node's :class:`ServerLimits` from its configuration."""
    return ServerLimits(
        max_message_bytes=config.grpc_max_message_bytes,
        handshake_timeout_ms=config.grpc_server_handshake_timeout_ms,
        max_idle_ms=config.connections_max_idle_ms,
        max_age_ms=config.grpc_max_connection_age_ms,
        keepalive_time_ms=config.grpc_keepalive_time_ms,
        keepalive_timeout_ms=config.grpc_keepalive_timeout_ms,
        max_concurrent_streams=config.grpc_max_concurrent_streams,
        max_connections=config.max_connections,
    )


def create_server(
    limits: ServerLimits, interceptors: Sequence[grpc.aio.ServerInterceptor[Any, Any]] | None = None
) -> grpc.aio.Server:
    """A grpc.aio server with :func:`server_options` (and ``interceptors``, e.g. the controller's hop from
    its intake loop to the state machine's)."""
    return grpc.aio.server(options=server_options(limits), interceptors=interceptors)
