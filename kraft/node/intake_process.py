"""An intake process: a grpc.aio server on the controller's own port (``SO_REUSEPORT``) in a child process.

With ``controller.intake.processes`` = N > 0 a controller node starts N of these
(:mod:`kraft.node.intake_pool`).  The kernel spreads the TCP connections arriving at the controller's port
over every socket bound there with ``SO_REUSEPORT`` — the node's main process and its intake processes — so
the cost of the calls that land here (HTTP/2 framing, grpc.aio's per-call event-loop work, ~230 µs of CPU
per unary call on the 2-core host) is paid on another core than the state machine's.

What an intake process does with a call (docs/internals/request-plane.md):

- ``RaftTestService.TestAppend`` (only with ``kraft.test.append.enable``): the calls that arrive while the
  previous batch is in flight are forwarded as ONE ``TestAppendRequest`` (values concatenated) over one
  long-lived ``TestAppendStream`` to the main process; each caller gets its own base/last offsets cut from
  the one answer.  One batch in flight at a time is group commit: a lone call goes at once, and under load
  the batch grows with the time one round takes.  A call that would not be valid as part of a batch (another
  cluster id, no values, too many) is proxied alone, so the main process answers it exactly as it would.
- ``RaftTestService.TestAppendStream``: answered here, message by message in order, each message through
  the same batcher (passed through, every message cost a proxied message each way).
- ``ControllerService.BrokerHeartbeat`` and ``CreateTopics`` (unless
  ``controller.intake.batch.controller.calls=false``): the calls of one loop turn go to the node as ONE
  internal ``IntakeService/CallBatch`` message with each caller's metadata; the node runs each as if it had
  come alone and streams the answers back (:class:`ControllerCallBatcher`, :mod:`kraft.node.intake_batch`).
- every other method (Raft, other admin calls, MetadataFetch streams, health): proxied
  byte for byte — a generic handler with identity serializers, unary and streaming alike — over the node's
  unix domain socket (in a 0700 directory of the metadata log dir), with the caller's metadata and deadline.

Its counters go to the node every few seconds (``IntakeService/ReportCounters``; exported there as
``kraft_intake_*``).  It runs on gRPC's iomgr unless ``KRAFT_INTAKE_GRPC_IO`` says otherwise
(:func:`kraft.node.intake_pool.child_environment`).

The caller's identity: on an SSL listener this process terminates TLS with the node's own settings, so it
forwards each caller's auth context (certificate subject, SANs) and address as ``x-kraft-intake-*``
metadata, dropping any such header the caller sent; the node believes them only on calls from its unix
socket (:func:`kraft.security.principal.auth_context_of`), so Raft's identity binding and the ACLs see the
caller, never this process.

Run as ``python -m kraft.node.intake_process --index I --listen HOST:PORT --upstream PATH ...`` by the
node, never by hand; it dies with the node (``PR_SET_PDEATHSIG`` via :func:`kraft.procutil.spawn_child`)
and ends gracefully on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib
import json
import os
import signal
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import grpc
import grpc.aio
from google.protobuf.descriptor import ServiceDescriptor

from kraft.config import load_config
from kraft.grpc_service import ServerLimits, create_server
from kraft.node.intake_batch import headers_of
from kraft.observability.logging import configure_logging, get_logger
from kraft.runtime import grpc_io_name, loop_factory
from kraft.security.principal import (
    INTAKE_AUTH_KEY,
    INTAKE_METADATA_PREFIX,
    INTAKE_PEER_KEY,
    encode_auth,
)
from kraft.security.tls import add_port, listener_settings
from kraft.v1 import intake_pb2, raft_pb2

APPEND_METHOD = "/kraft.v1.RaftTestService/TestAppend"
APPEND_STREAM_METHOD = "/kraft.v1.RaftTestService/TestAppendStream"
CALL_BATCH_METHOD = "/kraft.v1.IntakeService/CallBatch"
REPORT_COUNTERS_METHOD = "/kraft.v1.IntakeService/ReportCounters"
BATCHED_CONTROLLER_METHODS = frozenset(
    {"/kraft.v1.ControllerService/BrokerHeartbeat", "/kraft.v1.ControllerService/CreateTopics"}
)
"""ControllerService calls sent to the node in ``CallBatch`` messages (kraft.node.intake_batch): the ones
many callers send at once (1,000 brokers' heartbeats, bulk topic creation); the rest are proxied."""
MAX_BATCH_CALLS = 1_000
COUNTER_REPORT_INTERVAL_S = 5.0
"""How often an intake process reports its counters to the node (and once more at its stop)."""
MAX_BATCH_VALUES = 100_000
"""RaftTestServicer's own bound on one request's values: a batch never holds more."""
UPSTREAM_CHANNELS = 4
"""Proxied calls are spread over this many connections to the main process: one connection would hold
every caller's streams and hit the main server's ``grpc.max_concurrent_streams`` (per connection)."""
_PROTO_MODULES = (
    "kraft.v1.raft_pb2",
    "kraft.v1.controller_pb2",
    "kraft.v1.broker_pb2",
    "kraft.v1.metadata_pb2",
    "kraft.v1.common_pb2",
    "grpc_health.v1.health_pb2",
)
# Headers the transport owns: never copied from the incoming call onto the forwarded one.
_TRANSPORT_HEADERS = frozenset({"user-agent", "content-type", "te", "host"})

_log = get_logger("intake_process")
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # exported, missing from the stubs

if TYPE_CHECKING:
    _GenericRpcHandler = grpc.GenericRpcHandler[Any, Any]  # generic in the stubs only
else:
    _GenericRpcHandler = grpc.GenericRpcHandler


@dataclasses.dataclass(frozen=True)
class MethodShape:
    client_streaming: bool
    server_streaming: bool


def method_shapes(modules: Sequence[str] = _PROTO_MODULES) -> dict[str, MethodShape]:
    """Every gRPC method a controller may serve, ``/package.Service/Method`` → its streaming shape (from
    the generated descriptors, so a new method is proxied without a change here)."""
    shapes: dict[str, MethodShape] = {}
    for name in modules:
        module = importlib.import_module(name)
        services: dict[str, ServiceDescriptor] = dict(module.DESCRIPTOR.services_by_name)
        for service in services.values():
            for method in service.methods:
                shapes[f"/{service.full_name}/{method.name}"] = MethodShape(
                    bool(method.client_streaming), bool(method.server_streaming)
                )
    return shapes


def forwarded_metadata(
    context: grpc.aio.ServicerContext[Any, Any], *, forward_auth: bool
) -> tuple[tuple[str, Any], ...]:
    """The caller's own metadata for the forwarded call — transport, ``grpc-`` and ``x-kraft-intake-``
    headers stay behind (a caller must not pass for somebody else) — plus the caller's address and, on a
    TLS listener (``forward_auth``), its auth context, which the node believes only from its unix socket
    (:func:`kraft.security.principal.auth_context_of`)."""
    own = [
        (key, value)
        for key, value in (context.invocation_metadata() or ())
        if key not in _TRANSPORT_HEADERS and not key.startswith((":", "grpc-", INTAKE_METADATA_PREFIX))
    ]
    own.append((INTAKE_PEER_KEY, context.peer() or ""))
    if forward_auth:
        own.append((INTAKE_AUTH_KEY, encode_auth(context.auth_context())))
    return tuple(own)


class Upstream:
    """Channels to the main process's unix socket: :attr:`append` for the batched appends' stream, a few
    more taken in turn for proxied calls."""

    def __init__(self, socket_path: str, max_message_bytes: int, channels: int = UPSTREAM_CHANNELS) -> None:
        target = f"unix:{socket_path}"

        def open_one(index: int) -> grpc.aio.Channel:
            return grpc.aio.insecure_channel(
                target,
                options=[
                    ("grpc.max_send_message_length", max_message_bytes),
                    ("grpc.max_receive_message_length", max_message_bytes),
                    ("grpc.enable_retries", 0),
                    # a connection of its own per channel (gRPC shares subchannels between equal channels)
                    ("grpc.use_local_subchannel_pool", 1),
                    ("kraft.intake.channel", index),
                ],
            )

        self.append = open_one(0)
        self._proxied = [open_one(index + 1) for index in range(channels)]
        self._next = 0

    def pick(self) -> grpc.aio.Channel:
        self._next = (self._next + 1) % len(self._proxied)
        return self._proxied[self._next]

    async def close(self) -> None:
        for channel in (self.append, *self._proxied):
            await channel.close(None)


async def _abort_from(context: grpc.aio.ServicerContext[Any, Any], error: grpc.aio.AioRpcError) -> None:
    trailing: Any = tuple(error.trailing_metadata() or ())  # grpc wants a tuple, not Metadata
    await context.abort(error.code(), error.details() or "", trailing)


class Proxy:
    """Byte-for-byte forwarding of one method to the main process (see the module docstring)."""

    def __init__(self, upstream: Upstream, *, forward_auth: bool = False) -> None:
        """``forward_auth``: send each caller's TLS auth context along (a TLS listener)."""
        self._upstream = upstream
        self._forward_auth = forward_auth
        self.calls = 0
        """Calls proxied (counted as they start)."""
        self.answers = 0
        """Messages the proxied streams answered: a ``BrokerHeartbeatStream`` is one call and one answer
        per heartbeat, so the heartbeats a stream carries are counted here, not in ``calls``."""

    def metadata(self, context: grpc.aio.ServicerContext[Any, Any]) -> tuple[tuple[str, Any], ...]:
        """What a call forwards of its caller (:func:`forwarded_metadata`)."""
        return forwarded_metadata(context, forward_auth=self._forward_auth)

    def handler(self, method: str, shape: MethodShape) -> grpc.RpcMethodHandler[Any, Any]:
        # No (de)serializers: request and response stay the bytes on the wire.
        if not shape.client_streaming and not shape.server_streaming:
            return grpc.unary_unary_rpc_method_handler(self._unary_unary(method))
        if not shape.client_streaming:
            return grpc.unary_stream_rpc_method_handler(self._streaming(method, stream_in=False))
        if not shape.server_streaming:
            return grpc.stream_unary_rpc_method_handler(self._stream_unary(method))
        return grpc.stream_stream_rpc_method_handler(self._streaming(method, stream_in=True))

    def _unary_unary(self, method: str) -> Callable[..., Awaitable[bytes]]:
        async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            return await self.unary(method, request, context)

        return handle

    async def unary(self, method: str, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        self.calls += 1
        call = self._upstream.pick().unary_unary(method, None, None)(
            request,
            metadata=forwarded_metadata(context, forward_auth=self._forward_auth),
            timeout=context.time_remaining(),
        )
        return await self._finish(call, context)

    def _stream_unary(self, method: str) -> Callable[..., Awaitable[bytes]]:
        async def handle(
            requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
        ) -> bytes:
            self.calls += 1
            call = self._upstream.pick().stream_unary(method, None, None)(
                requests,
                metadata=forwarded_metadata(context, forward_auth=self._forward_auth),
                timeout=context.time_remaining(),
            )
            return await self._finish(call, context)

        return handle

    async def _finish(self, call: Any, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        try:
            response: bytes = await call
        except grpc.aio.AioRpcError as error:
            await _abort_from(context, error)
            raise AssertionError("unreachable: context.abort raises") from None
        trailing = await call.trailing_metadata()
        if trailing:
            context.set_trailing_metadata(tuple(trailing))
        return response

    def _streaming(self, method: str, *, stream_in: bool) -> Callable[..., AsyncIterator[bytes]]:
        async def handle(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> AsyncIterator[bytes]:
            self.calls += 1
            channel = self._upstream.pick()
            opener: Any = (
                channel.stream_stream(method, None, None)
                if stream_in
                else channel.unary_stream(method, None, None)
            )
            call = opener(
                request,
                metadata=forwarded_metadata(context, forward_auth=self._forward_auth),
                timeout=context.time_remaining(),
            )
            try:
                async for item in call:
                    self.answers += 1
                    yield item
            except grpc.aio.AioRpcError as error:
                await _abort_from(context, error)
            finally:
                call.cancel()  # the caller left (or the stream ended: then this does nothing)
            trailing = await call.trailing_metadata()
            if trailing:
                context.set_trailing_metadata(tuple(trailing))

        return handle


class _Pending:
    __slots__ = ("future", "request")

    def __init__(self, request: raft_pb2.TestAppendRequest, future: asyncio.Future[Any]) -> None:
        self.request = request
        self.future = future


class AppendStreamFailed(Exception):
    """The upstream stream ended without answering a batch: its callers get this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


SendBatch = Callable[[raft_pb2.TestAppendRequest], Awaitable[raft_pb2.TestAppendResponse]]


class AppendBatcher:
    """Group commit of ``TestAppend`` calls: one batch in flight; what arrives meanwhile is the next batch.

    ``send`` forwards one request and returns its answer (raising :class:`AppendStreamFailed`); it is
    called by one task at a time.  A batch holds at most ``max_values`` values and ``max_bytes`` bytes of
    values (a single request larger than that goes alone, as it would have)."""

    def __init__(self, send: SendBatch, *, cluster_id: str, max_values: int, max_bytes: int) -> None:
        self._send = send
        self._cluster_id = cluster_id
        self._max_values = max_values
        self._max_bytes = max_bytes
        self._pending: list[_Pending] = []
        self._flusher: asyncio.Task[None] | None = None
        self.batches = 0
        self.calls = 0

    def batchable(self, request: raft_pb2.TestAppendRequest) -> bool:
        """Whether the main process would accept ``request`` (so it may share a batch): the others are
        proxied alone and answered by the main process itself."""
        return request.cluster_id == self._cluster_id and 0 < len(request.values) <= self._max_values

    async def append(self, request: raft_pb2.TestAppendRequest) -> raft_pb2.TestAppendResponse:
        future: asyncio.Future[raft_pb2.TestAppendResponse] = asyncio.get_running_loop().create_future()
        self._pending.append(_Pending(request, future))
        if self._flusher is None:
            # Started as a task, so the calls whose handlers run in this loop turn join the first batch.
            self._flusher = asyncio.create_task(self._flush(), name="intake-append-flusher")
        return await future

    def _take(self) -> list[_Pending]:
        batch: list[_Pending] = []
        values = size = 0
        for pending in self._pending:
            count = len(pending.request.values)
            nbytes = sum(len(value) for value in pending.request.values)
            if batch and (values + count > self._max_values or size + nbytes > self._max_bytes):
                break
            batch.append(pending)
            values += count
            size += nbytes
        del self._pending[: len(batch)]
        return batch

    async def _flush(self) -> None:
        try:
            while self._pending:
                batch = [p for p in self._take() if not p.future.done()]  # a cancelled caller left
                if batch:
                    await self._round(batch)
        finally:
            self._flusher = None

    async def _round(self, batch: list[_Pending]) -> None:
        request = raft_pb2.TestAppendRequest(cluster_id=self._cluster_id)
        for pending in batch:
            request.values.extend(pending.request.values)
        try:
            response = await self._send(request)
        except AppendStreamFailed as failure:
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(failure)
            return
        except Exception as error:  # a bug must come back to the callers, not leave them hanging
            for pending in batch:
                if not pending.future.done():
                    pending.future.set_exception(error)
            raise
        self.batches += 1
        self.calls += len(batch)
        for pending, answer in zip(batch, split_answer(response, batch), strict=True):
            if not pending.future.done():
                pending.future.set_result(answer)


def split_answer(
    response: raft_pb2.TestAppendResponse, batch: Sequence[_Pending]
) -> list[raft_pb2.TestAppendResponse]:
    """Each caller's answer from the batch's: its own offsets on success, the batch's error otherwise."""
    if response.error_code != 0:
        return [response for _ in batch]  # the same error (NOT_LEADER with the leader's address…) to all
    total = sum(len(p.request.values) for p in batch)
    if response.last_offset - response.base_offset + 1 != total:
        raise RuntimeError(
            f"batch of {total} values answered with offsets {response.base_offset}..{response.last_offset}"
        )
    answers: list[raft_pb2.TestAppendResponse] = []
    base = response.base_offset
    for pending in batch:
        count = len(pending.request.values)
        answers.append(
            raft_pb2.TestAppendResponse(
                error_code=0,
                leader_id=response.leader_id,
                leader_epoch=response.leader_epoch,
                base_offset=base,
                last_offset=base + count - 1,
            )
        )
        base += count
    return answers


class AppendStream:
    """The long-lived ``TestAppendStream`` to the main process, one request in flight (the batcher's
    :data:`SendBatch`); reopened for the next batch after it fails."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self._open = channel.stream_stream(
            APPEND_STREAM_METHOD,
            request_serializer=raft_pb2.TestAppendRequest.SerializeToString,
            response_deserializer=raft_pb2.TestAppendResponse.FromString,
        )
        self._call: Any = None

    async def send(self, request: raft_pb2.TestAppendRequest) -> raft_pb2.TestAppendResponse:
        if self._call is None:
            self._call = self._open(None)  # None: the requests are written with call.write
        call = self._call
        try:
            await call.write(request)
            response = await call.read()
        except grpc.aio.AioRpcError as error:
            self._call = None
            raise AppendStreamFailed(error.code(), error.details() or "") from None
        except asyncio.CancelledError:
            self._call = None
            call.cancel()
            raise
        if response is _EOF:
            self._call = None
            code = await call.code()
            details = await call.details()
            if code == grpc.StatusCode.OK:  # ended without an answer: nobody knows if it was appended
                code, details = grpc.StatusCode.UNAVAILABLE, "the append stream to the controller ended"
            raise AppendStreamFailed(code, details or "")
        assert isinstance(response, raft_pb2.TestAppendResponse)
        return response

    def close(self) -> None:
        if self._call is not None:
            self._call.cancel()
            self._call = None


class BatchedCallFailed(Exception):
    """A batched ControllerService call got no answer (the batch failed) or a non-OK status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


_STATUS_BY_VALUE = {code.value[0]: code for code in grpc.StatusCode}


class BatchCall(Protocol):
    """One ``CallBatch`` in flight: its answers, and the way to tell the node that callers left."""

    def responses(self) -> AsyncIterator[intake_pb2.CallBatchResponse]:
        """The node's answers; raises :class:`BatchedCallFailed` when the call fails."""
        ...

    async def leave(self, indices: Sequence[int]) -> None:
        """Tell the node these calls' callers left (it cancels them, or never starts them)."""
        ...

    def cancel(self) -> None:
        """End the whole call (no caller of it is waiting any more)."""
        ...


OpenBatch = Callable[[intake_pb2.CallBatchRequest, float | None], BatchCall]
"""Send one ``CallBatch`` (with a timeout, or None)."""


class _Round:
    """A batch in flight: which of its callers left, told to the node as they leave."""

    __slots__ = ("batch", "call", "leaving")

    def __init__(self, call: BatchCall, batch: list[_Call]) -> None:
        self.call = call
        self.batch = batch
        self.leaving: set[asyncio.Task[None]] = set()

    def left(self, index: int) -> None:
        if all(c.future.done() for c in self.batch):
            # nobody of this batch waits any more: end it (the node's handler is cancelled, as a proxied
            # call's is when its caller leaves)
            self.call.cancel()
            return
        task = asyncio.get_running_loop().create_task(self.call.leave([index]), name="intake-call-left")
        self.leaving.add(task)
        task.add_done_callback(self.leaving.discard)


class _Call:
    __slots__ = ("future", "index", "metadata", "method", "request", "round", "timeout")

    def __init__(
        self,
        method: str,
        request: bytes,
        metadata: Sequence[tuple[str, Any]],
        timeout: float | None,
        future: asyncio.Future[bytes],
    ) -> None:
        self.method = method
        self.request = request
        self.metadata = metadata
        self.timeout = timeout
        self.future = future
        self.round: _Round | None = None  # set once its batch is sent
        self.index = 0  # its position in that batch


class ControllerCallBatcher:
    """The ControllerService calls of one loop turn as ONE ``CallBatch`` message to the node
    (:mod:`kraft.node.intake_batch` runs each as if it came alone and streams the answers back).

    Batches are cut by loop turn, not by round trip: the first call of a turn schedules the send for the
    end of that turn (``call_soon``), so a lone call waits for no earlier batch, and several batches may be
    in flight — a heartbeat batch never waits behind a batch that holds a slow CreateTopics.

    A caller that leaves (cancelled, or past its deadline: gRPC cancels its handler) is dropped from a
    batch not yet sent; from a batch in flight it is named to the node (``CallBatchRequest.left``), which
    cancels that call or never starts it; once no caller of a batch waits, the whole CallBatch is
    cancelled."""

    def __init__(self, open_batch: OpenBatch, *, max_calls: int, max_bytes: int) -> None:
        self._open = open_batch
        self._max_calls = max_calls
        self._max_bytes = max_bytes
        self._pending: list[_Call] = []
        self._scheduled = False
        self._rounds: set[asyncio.Task[None]] = set()
        self.batches = 0
        self.calls = 0

    async def call(
        self, method: str, request: bytes, metadata: Sequence[tuple[str, Any]], deadline_s: float | None
    ) -> bytes:
        """The node's answer to one call (raises :class:`BatchedCallFailed` with its status otherwise)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[bytes] = loop.create_future()
        call = _Call(method, request, metadata, deadline_s, future)
        self._pending.append(call)
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        try:
            return await future
        except asyncio.CancelledError:
            if call.round is not None and future.cancelled():  # left while its batch is in flight
                call.round.left(call.index)
            raise

    def _flush(self) -> None:
        self._scheduled = False
        pending = [call for call in self._pending if not call.future.done()]  # a cancelled caller left
        self._pending = []
        batch: list[_Call] = []
        size = 0
        for call in pending:
            if batch and (len(batch) >= self._max_calls or size + len(call.request) > self._max_bytes):
                self._start(batch)
                batch, size = [], 0
            batch.append(call)
            size += len(call.request)
        if batch:
            self._start(batch)

    def _start(self, batch: list[_Call]) -> None:
        task = asyncio.get_running_loop().create_task(self._round(batch), name="intake-call-batch")
        self._rounds.add(task)
        task.add_done_callback(self._rounds.discard)

    async def _round(self, batch: list[_Call]) -> None:
        batch = [c for c in batch if not c.future.done()]  # left before the batch went
        if not batch:
            return
        request = intake_pb2.CallBatchRequest(
            calls=[
                intake_pb2.BatchedCall(method=c.method, request=c.request, metadata=headers_of(c.metadata))
                for c in batch
            ]
        )
        timeouts = [c.timeout for c in batch]
        timeout = None if any(t is None for t in timeouts) else max(t for t in timeouts if t is not None)
        self.batches += 1
        self.calls += len(batch)
        failure = BatchedCallFailed(
            grpc.StatusCode.UNAVAILABLE, "the batch to the controller ended without this call's answer"
        )
        call = self._open(request, timeout)
        in_flight = _Round(call, batch)
        for index, each in enumerate(batch):
            each.round, each.index = in_flight, index
        try:
            async for response in call.responses():
                for result in response.results:
                    if result.index >= len(batch) or batch[result.index].future.done():
                        continue
                    future = batch[result.index].future
                    if result.status_code == grpc.StatusCode.OK.value[0]:
                        future.set_result(result.response)
                    else:
                        code = _STATUS_BY_VALUE.get(result.status_code, grpc.StatusCode.UNKNOWN)
                        future.set_exception(BatchedCallFailed(code, result.details))
        except BatchedCallFailed as error:
            failure = error
        except Exception as error:  # a bug must come back to the callers, not leave them hanging
            failure = BatchedCallFailed(grpc.StatusCode.INTERNAL, f"{type(error).__name__}: {error}")
            raise
        finally:
            for each in batch:
                each.round = None
                if not each.future.done():
                    each.future.set_exception(failure)

    async def close(self) -> None:
        for task in list(self._rounds):
            task.cancel()


class _GrpcBatchCall:
    """:class:`BatchCall` over a stream-stream ``CallBatch`` on the node's unix socket."""

    def __init__(self, call: Any, request: intake_pb2.CallBatchRequest) -> None:
        self._call = call
        self._request = request
        # one write at a time, the calls first: a caller may leave while they are still being written
        # (grpc.aio's docs ask for no concurrent writes on a call; two leaves in one turn worked without
        # the lock in a test, so this is for the order and the rule, not a loss seen)
        self._writing = asyncio.Lock()

    async def responses(self) -> AsyncIterator[intake_pb2.CallBatchResponse]:
        try:
            async with self._writing:
                await self._call.write(self._request)
            async for response in self._call:
                yield response
        except grpc.aio.AioRpcError as error:
            raise BatchedCallFailed(error.code(), error.details() or "") from None
        finally:
            self._call.cancel()

    async def leave(self, indices: Sequence[int]) -> None:
        # the batch may have ended meanwhile: then nothing of it is left to cancel
        async with self._writing:
            with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError, grpc.aio.UsageError):
                await self._call.write(intake_pb2.CallBatchRequest(left=indices))

    def cancel(self) -> None:
        self._call.cancel()


def call_batch_opener(upstream: Upstream) -> OpenBatch:
    """:data:`OpenBatch` over the node's unix socket (the proxied calls' channels, taken in turn)."""

    def open_batch(request: intake_pb2.CallBatchRequest, deadline_s: float | None) -> BatchCall:
        call: Any = upstream.pick().stream_stream(
            CALL_BATCH_METHOD,
            request_serializer=intake_pb2.CallBatchRequest.SerializeToString,
            response_deserializer=intake_pb2.CallBatchResponse.FromString,
        )(None, timeout=deadline_s)  # None: the messages are written on the call (request, then left)
        return _GrpcBatchCall(call, request)

    return open_batch


HOLD_CREATES_ENV = "KRAFT_TEST_INTAKE_HOLD_CREATE_TOPICS"
"""Tests only: ``N`` > 0 makes this process's call batcher a :class:`HeldTurnCallBatcher` holding its first
turn with a CreateTopics open until N CreateTopics wait in it.  Read once at start; unset in production."""
CREATE_TOPICS_METHOD = "/kraft.v1.ControllerService/CreateTopics"
HOLD_BOUND_S = 10.0
"""A held turn is sent after this long even when fewer calls came (the test then fails, it does not hang)."""


class HeldTurnCallBatcher(ControllerCallBatcher):
    """Tests only (:data:`HOLD_CREATES_ENV`): the first turn in which a ``hold_method`` call arrives is
    held open — its batch not sent — until ``hold_calls`` such calls wait in it (or ``bound_s`` passes);
    every call that arrives meanwhile joins it, and afterwards it is the plain batcher.

    Why: a batch is one loop turn's calls, and grpc.aio hands a loop few new calls per turn, so whether N
    concurrent calls share a ``CallBatch`` is timing (on a quiet host each can have a turn of its own).
    Holding one turn makes "N calls that wait at once go as ONE batch" a deterministic check of the
    batching through real processes (tests/integration/test_intake_processes.py).  A subclass selected at
    start, so the production batcher has no hook to check on its hot path."""

    def __init__(
        self,
        open_batch: OpenBatch,
        *,
        max_calls: int,
        max_bytes: int,
        hold_method: str,
        hold_calls: int,
        bound_s: float = HOLD_BOUND_S,
    ) -> None:
        super().__init__(open_batch, max_calls=max_calls, max_bytes=max_bytes)
        self._hold_method = hold_method
        self._hold_calls = hold_calls
        self._bound_s = bound_s
        self._held = 0
        self._timer: asyncio.TimerHandle | None = None
        self._released = False

    async def call(
        self, method: str, request: bytes, metadata: Sequence[tuple[str, Any]], deadline_s: float | None
    ) -> bytes:
        if not self._released and method == self._hold_method:
            loop = asyncio.get_running_loop()
            if self._timer is None:
                self._timer = loop.call_later(self._bound_s, self._release)
            self._held += 1
            if self._held >= self._hold_calls:
                loop.call_soon(self._release)  # runs after this call joined the pending ones
        return await super().call(method, request, metadata, deadline_s)

    def _flush(self) -> None:
        if self._timer is not None and not self._released:
            return  # the held turn: _release sends it with every call that joined it
        super()._flush()

    def _release(self) -> None:
        if self._released:
            return
        self._released = True
        if self._timer is not None:
            self._timer.cancel()
        super()._flush()


def call_batcher(open_batch: OpenBatch, *, max_calls: int, max_bytes: int) -> ControllerCallBatcher:
    """The intake process's call batcher: the plain one, or the test hold of :data:`HOLD_CREATES_ENV`."""
    hold = os.environ.get(HOLD_CREATES_ENV, "").strip()
    if not hold:
        return ControllerCallBatcher(open_batch, max_calls=max_calls, max_bytes=max_bytes)
    _log.warning("intake_test_hold", env=HOLD_CREATES_ENV, calls=int(hold))
    return HeldTurnCallBatcher(
        open_batch,
        max_calls=max_calls,
        max_bytes=max_bytes,
        hold_method=CREATE_TOPICS_METHOD,
        hold_calls=int(hold),
    )


class IntakeHandler(_GenericRpcHandler):
    """Routes every method: batched ``TestAppend`` and ``TestAppendStream`` messages (when enabled),
    batched ControllerService calls (:data:`BATCHED_CONTROLLER_METHODS`, when a call batcher is given),
    everything else proxied."""

    def __init__(
        self,
        proxy: Proxy,
        batcher: AppendBatcher | None,
        calls: ControllerCallBatcher | None = None,
    ) -> None:
        self._proxy = proxy
        self._batcher = batcher
        self._calls = calls
        self.stream_messages = 0
        self._handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {
            method: proxy.handler(method, shape) for method, shape in method_shapes().items()
        }
        if batcher is not None:
            self._handlers[APPEND_METHOD] = grpc.unary_unary_rpc_method_handler(self._append)
            self._handlers[APPEND_STREAM_METHOD] = grpc.stream_stream_rpc_method_handler(self._append_stream)
        if calls is not None:
            for method in BATCHED_CONTROLLER_METHODS:
                self._handlers[method] = grpc.unary_unary_rpc_method_handler(self._batched(method))

    def service(
        self, handler_call_details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler[Any, Any] | None:
        return self._handlers.get(handler_call_details.method)  # unknown: UNIMPLEMENTED, as upstream

    def counters(self, index: int) -> intake_pb2.IntakeCounters:
        """This process's counts so far (reported to the node: kraft.node.intake_batch)."""
        return intake_pb2.IntakeCounters(
            index=index,
            append_batches=self._batcher.batches if self._batcher else 0,
            append_calls=self._batcher.calls if self._batcher else 0,
            controller_batches=self._calls.batches if self._calls else 0,
            controller_calls=self._calls.calls if self._calls else 0,
            proxied_calls=self._proxy.calls,
            stream_messages=self.stream_messages,
            proxied_answers=self._proxy.answers,
        )

    def _batched(self, method: str) -> Callable[..., Awaitable[bytes]]:
        async def handle(request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
            assert self._calls is not None
            try:
                return await self._calls.call(
                    method, request, self._proxy.metadata(context), context.time_remaining()
                )
            except BatchedCallFailed as failure:
                await context.abort(failure.code, failure.details)
                raise AssertionError("unreachable: context.abort raises") from None

        return handle

    async def _append(self, request: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> bytes:
        assert self._batcher is not None
        try:
            parsed = raft_pb2.TestAppendRequest.FromString(request)
        except Exception:  # let the main process say what is wrong with it, as without intake
            return await self._proxy.unary(APPEND_METHOD, request, context)
        if not self._batcher.batchable(parsed):
            return await self._proxy.unary(APPEND_METHOD, request, context)
        try:
            answer = await self._batcher.append(parsed)
        except AppendStreamFailed as failure:
            await context.abort(failure.code, failure.details)
            raise AssertionError("unreachable: context.abort raises") from None
        return answer.SerializeToString()

    async def _append_stream(
        self, requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[bytes]:
        """A client's ``TestAppendStream`` answered here, message by message in order as the main
        process's does (``TestAppend`` for each), each message joining the batches of the unary calls:
        passed through byte for byte, every message cost a proxied stream message each way and the node
        one Raft append per message."""
        async for request in requests:
            self.stream_messages += 1
            yield await self._append(request, context)


async def serve(args: argparse.Namespace) -> None:
    limits = ServerLimits(**json.loads(args.limits))
    if not limits.reuseport:
        raise SystemExit("intake process: the server limits must allow SO_REUSEPORT")
    upstream = Upstream(args.upstream, limits.max_message_bytes)
    stream: AppendStream | None = None
    batcher: AppendBatcher | None = None
    if args.batch_appends:
        stream = AppendStream(upstream.append)
        batcher = AppendBatcher(
            stream.send,
            cluster_id=args.cluster_id,
            max_values=MAX_BATCH_VALUES,
            # room for the framing of every value and the cluster id under the message limit
            max_bytes=limits.max_message_bytes // 2,
        )
    server = create_server(limits)
    # The node's TLS settings, from its own configuration (a copy in the node's 0700 intake directory):
    # the same certificates, client authentication and reloading as the node's listener.
    tls = listener_settings(load_config(Path(args.tls_config)), args.listener) if args.tls_config else None
    calls = (
        None
        if args.no_batch_controller_calls
        else call_batcher(
            call_batch_opener(upstream), max_calls=MAX_BATCH_CALLS, max_bytes=limits.max_message_bytes // 2
        )
    )
    handler = IntakeHandler(Proxy(upstream, forward_auth=tls is not None), batcher, calls)
    server.add_generic_rpc_handlers([handler])
    port, _reloader = add_port(server, args.listen, tls, args.listener)
    if port == 0:
        raise SystemExit(f"intake process: cannot listen on {args.listen}")
    await server.start()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    # The node waits for this file (written after the server listens) before it reports itself started.
    ready = Path(args.ready)
    await asyncio.to_thread(ready.write_text, f"{os.getpid()}\n")
    _log.info(
        "intake_process_started",
        index=args.index,
        pid=os.getpid(),
        listen=args.listen,
        grpc_io=grpc_io_name(),
    )
    orphan_watch = asyncio.create_task(_exit_when_orphaned(args.parent_pid, stop))
    reporter = CounterReporter(upstream.append, lambda: handler.counters(args.index))
    reporting = asyncio.create_task(reporter.run(COUNTER_REPORT_INTERVAL_S), name="intake-counters")
    try:
        await stop.wait()
    finally:
        orphan_watch.cancel()
        reporting.cancel()
        await server.stop(grace=args.grace_s)
        if calls is not None:
            await calls.close()
        await reporter.report()  # the last counts, before the node stops listening
        if stream is not None:
            stream.close()
        await upstream.close()
        with contextlib.suppress(OSError):
            os.unlink(ready)
        counters = handler.counters(args.index)
        _log.info(
            "intake_process_stopped",
            index=args.index,
            batches=counters.append_batches,
            batched_calls=counters.append_calls,
            controller_batches=counters.controller_batches,
            controller_calls=counters.controller_calls,
            proxied_calls=counters.proxied_calls,
            stream_messages=counters.stream_messages,
            proxied_answers=counters.proxied_answers,
        )


class CounterReporter:
    """Sends this process's counters to the node (``IntakeService/ReportCounters``) every interval: the
    node exports them (kraft.node.intake_batch).  A failed report is logged once and retried next time
    (a node without the metadata layer does not serve it: then they are only logged at stop)."""

    def __init__(self, channel: grpc.aio.Channel, counters: Callable[[], intake_pb2.IntakeCounters]) -> None:
        self._send = channel.unary_unary(
            REPORT_COUNTERS_METHOD,
            request_serializer=intake_pb2.IntakeCounters.SerializeToString,
            response_deserializer=intake_pb2.IntakeCountersAck.FromString,
        )
        self._counters = counters
        self._warned = False

    async def report(self, timeout_s: float = 2.0) -> bool:
        try:
            await self._send(self._counters(), timeout=timeout_s)
        except grpc.aio.AioRpcError as error:
            if not self._warned:
                self._warned = True
                _log.warning("intake_counters_not_reported", code=error.code().name, details=error.details())
            return False
        return True

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            await self.report()


async def _exit_when_orphaned(parent_pid: int, stop: asyncio.Event) -> None:
    """A second guard beside the death signal (which the kernel sends only when the *thread* that
    started this process ends): once the node is gone, stop."""
    while parent_pid and os.getppid() == parent_pid:  # noqa: ASYNC110 (no event says a parent died)
        await asyncio.sleep(1.0)
    if parent_pid:
        _log.warning("intake_process_orphaned", parent_pid=parent_pid)
        stop.set()


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m kraft.node.intake_process")
    parser.add_argument("--index", type=int, required=True)
    parser.add_argument("--listen", required=True, help="HOST:PORT, the controller's own bound address")
    parser.add_argument("--upstream", required=True, help="the main process's unix socket path")
    parser.add_argument("--cluster-id", required=True)
    parser.add_argument("--limits", required=True, help="ServerLimits as JSON")
    parser.add_argument("--ready", required=True, help="file written once listening")
    parser.add_argument("--batch-appends", action="store_true")
    parser.add_argument(
        "--no-batch-controller-calls", action="store_true", help="proxy BrokerHeartbeat and CreateTopics too"
    )
    parser.add_argument("--listener", default="CONTROLLER", help="the listener's name")
    parser.add_argument("--tls-config", help="the node's configuration, when its listener is SSL")
    parser.add_argument("--parent-pid", type=int, default=0, help="exit when this process is gone")
    parser.add_argument("--grace-s", type=float, default=1.0)
    parser.add_argument("--log-level", default="INFO")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    configure_logging(args.log_level)
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(serve(args))
    return 0


if __name__ == "__main__":
    sys.exit(main())
