"""The node's side of batched ControllerService calls from its intake processes (``IntakeService``).

An intake process (:mod:`kraft.node.intake_process`) sends the ControllerService calls it took in one
loop turn — 1,000 brokers' heartbeats every few hundred ms, CreateTopics — as ONE ``CallBatch`` message
over the node's unix socket, instead of one proxied call each.  Here each call is run exactly as if it
had come alone, and its answer streamed back as soon as it is ready:

- **identity, ACLs and errors per caller**: every call carries its caller's metadata (the forwarded
  ``x-kraft-intake-*`` identity included) and gets a context of its own (:class:`CallContext`) on which
  the ControllerService servicer's own handler runs — its guard (identity binding, ACLs), its decoding,
  its error mapping — so a caller's answer or status is what the proxied call would have had; one bad call
  (undecodable, refused, failing) never touches the others';
- **heartbeats of one batch as one controller event** (:meth:`QuorumController.broker_heartbeats`): each
  heartbeat is still checked by the guard alone, the admitted ones go in as one urgent event (at most
  :data:`HEARTBEATS_PER_EVENT` per event, so a batch never makes a long one) and the ones that change
  nothing share one commit wait and one leadership confirmation;
- **quick answers first**: a heartbeat never waits for a slow call of the same batch (a big
  CreateTopics): results go back as they complete, those ready together in one message.

Served ONLY to the node's own intake processes: the service is registered only on a node that runs them,
and every call whose transport is not the unix socket (0600 in a 0700 directory) is refused with
PERMISSION_DENIED — a network caller could otherwise vouch for any identity in a batch.

:class:`IntakeCounterSink` turns the intake processes' periodic counter reports (``ReportCounters``) into
Prometheus counters (``kraft_intake_*``, docs/operations.md).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from google.protobuf.message import Message
from google.protobuf.message_factory import GetMessageClass

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.grpc_service import RequestDecoder, register_service
from kraft.observability.logging import get_logger
from kraft.observability.metrics import IntakeMetrics
from kraft.security.guard import AccessDenied
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import intake_pb2 as ipb

if TYPE_CHECKING:
    from kraft.metadata.controller import QuorumController
    from kraft.metadata.service import ControllerServicer
    from kraft.security.guard import RequestGuard

ServicerContext = grpc.aio.ServicerContext[Any, Any]
Emit = Callable[[list[ipb.CallResult]], Awaitable[None]]
"""Hands results of a batch to its caller (written at once, or queued for the next message)."""

CONTROLLER_SERVICE = "kraft.v1.ControllerService"
HEARTBEAT_METHOD = f"/{CONTROLLER_SERVICE}/BrokerHeartbeat"
HEARTBEATS_PER_EVENT = 128
"""Heartbeats of one batch per controller event: ~10-30 µs each, so an event stays within the default
``controller.max.event.time.ms`` (5 ms) on this 2-core host."""
_LOCAL_PEER_PREFIX = "unix:"
_log = get_logger("intake_batch")


class CallAborted(Exception):
    """A batched call's handler aborted: its caller gets this status."""

    def __init__(self, code: grpc.StatusCode, details: str) -> None:
        super().__init__(details)
        self.code = code
        self.details = details


class CallContext:
    """The servicer context of one call of a batch: the batch's own transport (its ``unix:`` peer and
    auth context — so :func:`kraft.security.principal.auth_context_of` believes the forwarded identity
    exactly as on a proxied call, and only there) with the call's own metadata; ``abort`` ends this call
    only (:class:`CallAborted`)."""

    def __init__(self, batch: ServicerContext, metadata: Sequence[ipb.ForwardedHeader]) -> None:
        self._peer: str = batch.peer()
        self._auth: Any = batch.auth_context()
        self._metadata = tuple(
            (header.key, header.binary_value if header.key.endswith("-bin") else header.value)
            for header in metadata
        )
        self.code: grpc.StatusCode | None = None
        self.details: str | None = None

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> Any:
        return self._auth

    def invocation_metadata(self) -> tuple[tuple[str, Any], ...]:
        return self._metadata

    def set_code(self, code: grpc.StatusCode) -> None:
        self.code = code

    def set_details(self, details: str) -> None:
        self.details = details

    async def abort(self, code: grpc.StatusCode, details: str = "", trailing_metadata: Any = ()) -> None:
        raise CallAborted(code, details)


def headers_of(metadata: Sequence[tuple[str, Any]]) -> list[ipb.ForwardedHeader]:
    """A call's metadata as ``ForwardedHeader`` messages (binary values for ``-bin`` keys)."""
    headers: list[ipb.ForwardedHeader] = []
    for key, value in metadata:
        if isinstance(value, bytes):
            headers.append(ipb.ForwardedHeader(key=key, binary_value=value))
        else:
            headers.append(ipb.ForwardedHeader(key=key, value=str(value)))
    return headers


@dataclass(frozen=True, slots=True)
class _Method:
    request_type: type[Message]
    handler: Callable[[Any, Any], Any]


def _failed(index: int, code: grpc.StatusCode, details: str) -> ipb.CallResult:
    return ipb.CallResult(index=index, status_code=code.value[0], details=details)


class CallBatchServicer:
    """``IntakeService`` on a node with intake processes (see the module docstring)."""

    def __init__(
        self,
        servicer: ControllerServicer,
        controller: Callable[[], QuorumController | None],
        node: int | str,
    ) -> None:
        self._servicer = servicer
        self._controller = controller
        self._decoder = RequestDecoder(logging.getLogger(__name__), "intake_batch_bad_request")
        self._methods: dict[str, _Method] = {}
        for method in cpb.DESCRIPTOR.services_by_name["ControllerService"].methods:
            if not method.client_streaming and not method.server_streaming:
                self._methods[f"/{CONTROLLER_SERVICE}/{method.name}"] = _Method(
                    GetMessageClass(method.input_type), getattr(servicer, method.name)
                )
        self.counters = IntakeCounterSink(node)
        self.on_admitted: Callable[[RequestGuard, CallContext], None] | None = None
        """Called with each heartbeat the guard let through (the heartbeat fast lane's ACL grants,
        :class:`kraft.node.batch_lane.BatchLane`)."""

    async def CallBatch(
        self, requests: AsyncIterator[ipb.CallBatchRequest], context: ServicerContext
    ) -> None:
        await only_from_intake_socket(context)
        request = await anext(requests, None)
        if request is None:
            return
        self.counters.node_batch(len(request.calls))
        await self.serve(request, requests, context)

    async def serve(
        self,
        request: ipb.CallBatchRequest,
        requests: AsyncIterator[ipb.CallBatchRequest],
        context: ServicerContext,
        answered: frozenset[int] = frozenset(),
    ) -> None:
        """The batch ``request`` (its first message; ``requests``: the rest of the stream), but for the
        calls ``answered`` already (steady heartbeats the fast lane answered on the intake loop)."""
        heartbeats: list[tuple[int, ipb.BatchedCall]] = []
        others: list[tuple[int, ipb.BatchedCall]] = []
        for index, call in enumerate(request.calls):
            if index not in answered:
                (heartbeats if call.method == HEARTBEAT_METHOD else others).append((index, call))
        chunks = [
            heartbeats[start : start + HEARTBEATS_PER_EVENT]
            for start in range(0, len(heartbeats), HEARTBEATS_PER_EVENT)
        ]
        if not chunks and not others:
            return
        if len(chunks) + len(others) == 1:
            # The usual batch (only heartbeats, or one call): run here, without a task — each task is a
            # turn of the main loop, long while bulk work runs — and write each answer as it is ready.
            # Its callers leaving end the whole CallBatch (the intake process cancels it once none is left
            # waiting), which cancels this handler as it would a proxied call's; a heartbeat whose caller
            # left while others of the same event still wait is answered anyway (one event, ~ms).
            async def write(results: list[ipb.CallResult]) -> None:
                await context.write(ipb.CallBatchResponse(results=results))

            if chunks:
                await self._heartbeats(chunks[0], context, write)
            else:
                await self._one(*others[0], context, write)
            return
        queue: asyncio.Queue[ipb.CallResult] = asyncio.Queue()

        async def enqueue(results: list[ipb.CallResult]) -> None:
            for result in results:
                queue.put_nowait(result)

        tasks = [asyncio.create_task(self._heartbeats(chunk, context, enqueue)) for chunk in chunks]
        # Each call other than heartbeats runs as its own task, so a caller that leaves cancels its own
        # call (not yet started: it never runs) and no other (_cancel_left).
        own = {index: asyncio.create_task(self._one(index, call, context, enqueue)) for index, call in others}
        tasks += own.values()
        tasks.append(asyncio.create_task(self._cancel_left(requests, own, queue)))
        unanswered = {index for index, _ in heartbeats} | own.keys()
        try:
            while unanswered:
                ready = [await queue.get()]
                while not queue.empty():  # everything ready by now goes in the same message
                    ready.append(queue.get_nowait())
                # one answer per call: a call cancelled as it finished may have answered as well
                ready = [r for r in ready if r.index in unanswered]
                unanswered.difference_update(r.index for r in ready)
                if ready:
                    await context.write(ipb.CallBatchResponse(results=ready))
        finally:
            for task in tasks:
                task.cancel()  # the intake process went away: nobody reads the rest

    async def _cancel_left(
        self,
        requests: AsyncIterator[ipb.CallBatchRequest],
        own: dict[int, asyncio.Task[None]],
        queue: asyncio.Queue[ipb.CallResult],
    ) -> None:
        """Cancels the calls whose callers left (``CallBatchRequest.left``): each is answered CANCELLED
        here (its caller is gone; the answer only completes the batch).  Heartbeats are not cancelled:
        those of one event run together and take ~ms."""
        try:
            async for message in requests:
                for index in message.left:
                    task = own.get(index)
                    if task is not None and task.cancel():
                        self.counters.cancelled_call()
                        queue.put_nowait(_failed(index, grpc.StatusCode.CANCELLED, "the caller left"))
        except Exception:  # an undecodable message (the batch is aborted) or a bug: said, not swallowed
            _log.exception("intake_batch_left_unreadable")

    async def _one(self, index: int, call: ipb.BatchedCall, batch: ServicerContext, emit: Emit) -> None:
        method = self._methods.get(call.method)
        if method is None:
            await emit([_failed(index, grpc.StatusCode.UNIMPLEMENTED, f"{call.method} is not batched")])
            return
        context = CallContext(batch, call.metadata)
        try:
            parsed = await self._decoder.decode(call.request, method.request_type, call.method, context)  # type: ignore[arg-type]
            response: Message = await method.handler(parsed, context)
        except CallAborted as abort:
            await emit([_failed(index, abort.code, abort.details)])
            return
        except Exception as exc:  # a bug answers its own caller, as grpc.aio would (UNKNOWN), no other
            _log.exception("intake_batch_call_failed", method=call.method)
            await emit([_failed(index, grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")])
            return
        if context.code is not None and context.code != grpc.StatusCode.OK:
            await emit([_failed(index, context.code, context.details or "")])
            return
        await emit([ipb.CallResult(index=index, response=response.SerializeToString())])

    async def _heartbeats(
        self, calls: Sequence[tuple[int, ipb.BatchedCall]], batch: ServicerContext, emit: Emit
    ) -> None:
        """Each heartbeat decoded and checked on its own (refusals answered at once), the admitted ones
        answered by one :meth:`QuorumController.broker_heartbeats`, as they are ready."""
        admitted: list[tuple[int, cpb.BrokerHeartbeatRequest]] = []
        refused: list[ipb.CallResult] = []
        guard = self._servicer.guard
        for index, call in calls:
            context = CallContext(batch, call.metadata)
            try:
                parsed = await self._decoder.decode(
                    call.request,
                    cpb.BrokerHeartbeatRequest,
                    call.method,
                    context,  # type: ignore[arg-type]
                )
                assert isinstance(parsed, cpb.BrokerHeartbeatRequest)
                guard.check_node(context, parsed.broker_id, "heartbeat as broker")
            except CallAborted as abort:
                refused.append(_failed(index, abort.code, abort.details))
                continue
            except AccessDenied as exc:  # as ControllerServicer._call aborts it
                refused.append(_failed(index, grpc_status_for(exc.code), str(exc)))
                continue
            if self.on_admitted is not None:
                self.on_admitted(guard, context)
            admitted.append((index, parsed))
        if refused:
            await emit(refused)
        if not admitted:
            return
        controller = self._controller()
        if controller is None:
            starting = []
            for index, _ in admitted:
                response = cpb.BrokerHeartbeatResponse(
                    error_code=int(ErrorCode.NOT_CONTROLLER), error_message="the controller is starting"
                )
                response.controller.node_id = -1
                starting.append(ipb.CallResult(index=index, response=response.SerializeToString()))
            await emit(starting)
            return
        pending = {index for index, _ in admitted}
        try:
            async for answers in controller.broker_heartbeats([request for _, request in admitted]):
                results = []
                for position, answer in answers:
                    index = admitted[position][0]
                    pending.discard(index)
                    results.append(ipb.CallResult(index=index, response=answer.SerializeToString()))
                await emit(results)
        except Exception as exc:  # a bug: every caller not yet answered gets it, as each would have alone
            _log.exception("controller_request_failed", request="BrokerHeartbeatRequest")
            code = grpc_status_for(ErrorCode.UNKNOWN_SERVER_ERROR)
            await emit([_failed(index, code, f"{type(exc).__name__}: {exc}") for index in sorted(pending)])

    async def ReportCounters(
        self, request: ipb.IntakeCounters, context: ServicerContext
    ) -> ipb.IntakeCountersAck:
        await only_from_intake_socket(context)
        self.counters.report(request)
        return ipb.IntakeCountersAck()


async def only_from_intake_socket(context: ServicerContext) -> None:
    peer = context.peer() or ""
    if not peer.startswith(_LOCAL_PEER_PREFIX):
        await context.abort(
            grpc.StatusCode.PERMISSION_DENIED, "IntakeService is served only to this node's intake processes"
        )
        raise AssertionError("unreachable: context.abort raises")


class IntakeCounterSink:
    """The intake processes' cumulative counters as Prometheus counters (each report adds what grew since
    the previous one of the same intake process; an intake process is never restarted, fail-stop), plus
    the node's own count of the batches it received."""

    _FIELDS = (
        "append_batches",
        "append_calls",
        "controller_batches",
        "controller_calls",
        "proxied_calls",
        "stream_messages",
        "proxied_answers",
    )

    def __init__(self, node: int | str) -> None:
        self._metrics = IntakeMetrics.for_node(node)
        self._last: dict[int, dict[str, int]] = {}

    def node_batch(self, calls: int) -> None:
        self._metrics.received_batches.inc()
        self._metrics.received_calls.inc(calls)

    def cancelled_call(self) -> None:
        self._metrics.cancelled_calls.inc()

    def report(self, counters: ipb.IntakeCounters) -> None:
        last = self._last.setdefault(counters.index, dict.fromkeys(self._FIELDS, 0))
        for name in self._FIELDS:
            value = int(getattr(counters, name))
            grown = value - last[name]
            if grown > 0:
                self._metrics.counter(name, counters.index).inc(grown)
                last[name] = value


def add_intake_service(server: grpc.aio.Server, servicer: CallBatchServicer) -> None:
    """Register ``IntakeService`` (a node with intake processes only; every call off the unix socket is
    refused by the servicer itself)."""
    register_service(
        server,
        servicer,
        ipb.DESCRIPTOR.services_by_name["IntakeService"],
        RequestDecoder(logging.getLogger(__name__), "intake_bad_request"),
    )
