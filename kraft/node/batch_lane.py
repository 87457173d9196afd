"""Steady heartbeats of an intake process's ``CallBatch`` answered where the batch arrives (issue #17).

With intake processes (``controller.intake.processes``) a broker's heartbeat reaches the node inside a
``CallBatch`` (:mod:`kraft.node.intake_batch`), which :class:`~kraft.node.intake.HopInterceptor` would run
on the main loop as a whole: every heartbeat decoded, guarded and run in an urgent controller event there —
exactly the main-loop work the heartbeat fast lane (:mod:`kraft.metadata.heartbeat_lane`) takes away from
heartbeats that reach the node directly.  :class:`BatchLane` serves ``CallBatch`` on the intake loop
instead (``HopInterceptor(replace=...)``, with the intake thread and the fast lane on):

1. the stream's transport is checked first (:func:`~kraft.node.intake_batch.only_from_intake_socket`: the
   identities a batch carries are believed only from the node's own unix socket);
2. each heartbeat of the batch's first message is answered from the lane when the lane and the caller's
   check allow it — the same two conditions as for a heartbeat that arrives alone
   (:meth:`HeartbeatBridge.heartbeat <kraft.node.controller_bridge.HeartbeatBridge.heartbeat>`): the
   caller, seen through its own :class:`~kraft.node.intake_batch.CallContext` exactly as the main loop's
   guard sees it (the batch's unix-socket transport, the call's forwarded identity and address), passes
   :meth:`HeartbeatBridge.may_answer_here <kraft.node.controller_bridge.HeartbeatBridge.may_answer_here>`
   (identity binding; an ACL decision only from a grant the main loop's guard made under the ACLs in force),
   and :meth:`HeartbeatLane.answer` answers it (steady, the lease holding at this thread's now, the touch
   recorded before the second snapshot read).  Those answers are written back at once, in one message;
3. the rest of the batch — heartbeats the lane did not answer (undecodable, not steady, no grant yet,
   lease lapsed) and every other call — goes on to the main loop as ONE
   :meth:`CallBatchServicer.serve <kraft.node.intake_batch.CallBatchServicer.serve>`, unchanged: the
   heartbeats as one controller event, each guarded on its own (and, let through, granted for the next
   time: ``CallBatchServicer.on_admitted``), the other calls each on their own.  A batch answered whole
   never reaches the main loop.

The safety argument is the lane's own (docs/internals/heartbeat-lane.md): nothing here decides anything the
lane and the bridge's check do not already decide for a lone heartbeat; only the call's context differs.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio
from google.protobuf.message import DecodeError

from kraft.grpc_service import RequestDecoder
from kraft.metadata.heartbeat_lane import NOT_ALLOWED
from kraft.node.intake import MainLoopContext, run_writing_on_main
from kraft.node.intake_batch import (
    HEARTBEAT_METHOD,
    CallBatchServicer,
    CallContext,
    ServicerContext,
    only_from_intake_socket,
)
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import intake_pb2 as ipb

if TYPE_CHECKING:
    from kraft.metadata.controller import QuorumController
    from kraft.node.controller_bridge import HeartbeatBridge
    from kraft.security.guard import RequestGuard

CALL_BATCH_METHOD = "/kraft.v1.IntakeService/CallBatch"


class _Transport:
    """The batch call's transport, read once per batch (not once per heartbeat): what a
    :class:`CallContext` takes from it."""

    def __init__(self, batch: ServicerContext) -> None:
        self._peer: str = batch.peer()
        self._auth: Any = batch.auth_context()

    def peer(self) -> str:
        return self._peer

    def auth_context(self) -> Any:
        return self._auth


class BatchLane:
    """``CallBatch`` on the intake loop (see the module docstring).  ``bridge`` and ``controller`` are read
    at each batch: the node's :class:`HeartbeatBridge` (whose ACL grants the lane's decisions use) and the
    controller (None while it starts or after it stopped)."""

    def __init__(
        self,
        batches: CallBatchServicer,
        bridge: Callable[[], HeartbeatBridge | None],
        controller: Callable[[], QuorumController | None],
    ) -> None:
        self._batches = batches
        self._bridge = bridge
        self._controller = controller
        self._main: asyncio.AbstractEventLoop | None = None
        self._decoder = RequestDecoder(logging.getLogger(__name__), "intake_bad_request")  # as the server's
        self.fast = 0  # heartbeats answered here (intake thread; tests and the bench read it)
        self.whole = 0  # batches answered here whole, never handed to the main loop
        self.handed = 0  # batches (the rest of them) handed to the main loop

    def handler(self, main: asyncio.AbstractEventLoop) -> grpc.RpcMethodHandler[Any, Any]:
        """``CallBatch``'s handler on the intake loop (an ``add_intake_handler`` factory)."""
        self._main = main
        return grpc.stream_stream_rpc_method_handler(self.call_batch, response_serializer=_serialize)

    def grant(self, guard: RequestGuard, context: CallContext) -> None:
        """On main (``CallBatchServicer.on_admitted``): the guard let ``context``'s heartbeat through —
        the bridge records the grant the lane's next decision for this caller may use."""
        bridge = self._bridge()
        controller = self._controller()
        if bridge is not None and controller is not None and controller.lane is not None:
            bridge.grant(guard, context)

    async def call_batch(self, raw: AsyncIterator[bytes], context: ServicerContext) -> None:
        """On the intake loop: one ``CallBatch`` stream (its raw messages)."""
        await only_from_intake_socket(context)
        first_raw = await anext(raw, None)
        if first_raw is None:
            return
        first = await self._decoder.decode(first_raw, ipb.CallBatchRequest, "CallBatch", context)
        assert isinstance(first, ipb.CallBatchRequest)
        self._batches.counters.node_batch(len(first.calls))
        fast = self.answer(first, context)
        if fast:
            await context.write(ipb.CallBatchResponse(results=fast))
            if len(fast) == len(first.calls):
                self.whole += 1
                return
        answered = frozenset(result.index for result in fast)
        main = self._main
        assert main is not None, "handler() was not called"
        self.handed += 1

        async def rest(requests: AsyncIterator[bytes], main_context: MainLoopContext) -> None:
            # the later messages (callers that left) decoded on main, as the server's own handler does
            await self._batches.serve(first, self._decoded(requests, main_context), main_context, answered)  # type: ignore[arg-type]

        await run_writing_on_main(rest, raw, context, main)

    def answer(self, request: ipb.CallBatchRequest, batch: ServicerContext) -> list[ipb.CallResult]:
        """On the intake loop: the answers the fast lane gives the heartbeats of ``request`` (the others,
        and every call the lane or the caller's check cannot decide here, are not in it)."""
        controller = self._controller()
        lane = None if controller is None else controller.lane
        bridge = self._bridge()
        if lane is None or bridge is None or lane.snapshot is None:
            return []
        transport = _Transport(batch)
        results: list[ipb.CallResult] = []
        for index, call in enumerate(request.calls):
            if call.method != HEARTBEAT_METHOD:
                continue
            try:
                parsed = cpb.BrokerHeartbeatRequest.FromString(call.request)
            except (DecodeError, ValueError, RuntimeError):
                continue  # refused on main, by the decoder that logs it, as before
            context = CallContext(transport, call.metadata)  # type: ignore[arg-type]
            if not bridge.may_answer_here(context, parsed.broker_id):
                lane.note_slow(NOT_ALLOWED)  # as HeartbeatBridge counts a lone call it cannot decide here
                continue
            answer = lane.answer(parsed)
            if answer is not None:
                results.append(ipb.CallResult(index=index, response=answer.SerializeToString()))
        self.fast += len(results)
        return results

    async def _decoded(
        self, requests: AsyncIterator[bytes], context: MainLoopContext
    ) -> AsyncIterator[ipb.CallBatchRequest]:
        async for raw in requests:
            message = await self._decoder.decode(raw, ipb.CallBatchRequest, "CallBatch", context)  # type: ignore[arg-type]
            assert isinstance(message, ipb.CallBatchRequest)
            yield message


def _serialize(message: ipb.CallBatchResponse) -> bytes:
    return message.SerializeToString()
