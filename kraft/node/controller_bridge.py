"""BrokerHeartbeat calls of the request plane's loop, handed to the main loop together.

A fleet of 1,000 brokers heartbeating every 2 s sends 500 calls a second to the active controller.  Through
:class:`~kraft.node.intake.HopInterceptor` each one hops to the main loop on its own: a cross-thread wake-up,
a task, a servicer context and an urgent controller event per heartbeat, all on the loop that also runs
Raft and every CreateTopics (docs/internals/raft-performance.md, "CreateTopics with 1,000 brokers
(session 12)").  :class:`HeartbeatBridge` serves ``BrokerHeartbeat`` on the intake loop itself instead, as
:class:`~kraft.node.intake.AppendBridge` serves TestAppend: every heartbeat that arrives while the previous
hand-off still waits for the main loop joins it, and a main-loop turn takes them all as ONE
:meth:`QuorumController.broker_heartbeats` — one urgent event for up to
:data:`~kraft.node.intake_batch.HEARTBEATS_PER_EVENT` of them, the unchanged ones sharing one commit wait
and one leadership confirmation — exactly what an intake process's batch gets
(:mod:`kraft.node.intake_batch`).  Each call is still answered on its own and as it would be alone:

- **identity and ACLs per call**: the caller's auth context, peer and (unix-socket calls only) forwarded
  identity are read on the intake loop when the call arrives (:class:`~kraft.node.intake.MainLoopContext`),
  and the servicer's own guard checks each call on the main loop, where the ACLs live; a refused call is
  answered with its status at once, the others go on;
- **errors per call**: an undecodable request is refused alone (INVALID_ARGUMENT, on the intake loop); a
  controller failure answers only the calls still waiting in that event (INTERNAL, as the servicer's);
- **answers as they are ready**: a heartbeat waiting for nothing is answered without waiting for one of
  the same hand-off that appended records — the controller yields them in commit order.

**The fast lane** (``controller.broker.heartbeats.fast.lane``): a *steady* heartbeat is answered right
here, on the intake loop, from the snapshot the controller publishes (:mod:`kraft.metadata.heartbeat_lane`)
and never reaches the main loop.  Its caller is checked here as the servicer's guard would check it
(:meth:`HeartbeatBridge.may_answer_here`): the identity binding is a pure function of the caller's
principal; an ACL decision is taken only from the grants the main loop published — the callers (principal,
host) its guard allowed CLUSTER_ACTION for, under the ACLs in force now — else the call goes the normal way.

Switched by ``controller.broker.heartbeats.on.intake`` (docs/configuration.md), off by default: it took
~13 % of the leader's main-loop wake-ups off at 500 heartbeats/s, but no CreateTopics latency gain was
measurable on the shared 2-core host (docs/internals/raft-performance.md, "CreateTopics with 1,000 brokers
(session 12)").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.grpc_service import RequestDecoder
from kraft.metadata.heartbeat_lane import NOT_ALLOWED
from kraft.node.intake import MainLoopContext
from kraft.node.intake_batch import HEARTBEATS_PER_EVENT, CallContext
from kraft.observability.logging import get_logger
from kraft.security.guard import AccessDenied, peer_host
from kraft.security.principal import node_identity, principal_of
from kraft.v1 import controller_pb2 as cpb

if TYPE_CHECKING:
    from kraft.metadata.controller import QuorumController
    from kraft.security.guard import RequestGuard

MAX_GRANTS = 10_000  # (principal, host) pairs kept for the fast lane's ACL decisions (then started anew)

_log = get_logger("controller_bridge")


@dataclass(frozen=True, slots=True)
class Refused:
    """A call answered with a gRPC status instead of a response (its caller's ``context.abort``)."""

    code: grpc.StatusCode
    details: str


Answer = cpb.BrokerHeartbeatResponse | Refused


@dataclass(slots=True)
class _Call:
    request: cpb.BrokerHeartbeatRequest
    context: MainLoopContext
    future: asyncio.Future[Answer]


class HeartbeatBridge:
    """``BrokerHeartbeat`` served on the intake loop, handed to the main loop ``main`` in batches (see the
    module docstring).  ``guard`` and ``controller`` are read on the main loop at each hand-off: the
    servicer's guard, and the controller (None while it starts or after it stopped)."""

    def __init__(
        self,
        main: asyncio.AbstractEventLoop,
        guard: Callable[[], RequestGuard],
        controller: Callable[[], QuorumController | None],
    ) -> None:
        self._main = main
        self._guard = guard
        self._controller = controller
        # Shared by the intake thread (calls) and the main thread (hand-off), as in AppendBridge: a call
        # either lands in the batch the next hand-off takes or schedules a hand-off of its own.
        self._lock = threading.Lock()
        self._queued: list[_Call] = []
        self._handoff_scheduled = False
        self._running: set[asyncio.Task[None]] = set()
        self.handoffs = 0  # main-loop hand-offs that carried calls (tests and the bench read them)
        self.calls = 0  # calls handed off
        self.fast = 0  # calls answered by the fast lane (intake thread)
        # observability.stall.sampler.ms: (call metadata, broker id) -> the arrival delay of a call that
        # carries its send time (kraft.observability.stall_sampler.ArrivalProbe)
        self.arrival_probe: Callable[[object, int], None] | None = None
        # the same for a BrokerHeartbeatStream message, whose send time rides in the message itself
        # (ArrivalProbe.message; kraft.node.heartbeat_stream): (message, broker id)
        self.message_probe: Callable[[cpb.BrokerHeartbeatRequest, int], None] | None = None
        # The fast lane's ACL grants: (the ACLs they were decided under, the (principal, host) pairs the
        # guard allowed CLUSTER_ACTION).  Replaced whole by the main loop, read by the intake thread.
        self._grants: tuple[object, frozenset[tuple[str, str]]] = (None, frozenset())

    async def heartbeat(
        self, request: cpb.BrokerHeartbeatRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> cpb.BrokerHeartbeatResponse:
        """On the intake loop: the call's answer, or its refusal as ``context.abort``."""
        if self.arrival_probe is not None:
            self.arrival_probe(context.invocation_metadata(), request.broker_id)
        answer = await self.answer(request, MainLoopContext(context, asyncio.get_running_loop()))
        if isinstance(answer, Refused):
            await context.abort(answer.code, answer.details)
            raise AssertionError("unreachable: context.abort raises")
        return answer

    async def answer(self, request: cpb.BrokerHeartbeatRequest, call_context: MainLoopContext) -> Answer:
        """On the intake loop: ``request``'s answer, or its refusal — for a unary call (:meth:`heartbeat`)
        or one message of a ``BrokerHeartbeatStream`` (:mod:`kraft.node.heartbeat_stream`), whose caller is
        ``call_context`` (read once per call or stream)."""
        loop = asyncio.get_running_loop()
        controller = self._controller()
        lane = None if controller is None else controller.lane
        if lane is not None:
            if self.may_answer_here(call_context, request.broker_id):
                fast = lane.answer(request)
                if fast is not None:
                    self.fast += 1
                    return fast
            else:
                lane.note_slow(NOT_ALLOWED)
        arrived = time.perf_counter()  # the slow path's time (kraft_controller_heartbeat_slow_path_seconds)
        future: asyncio.Future[Answer] = loop.create_future()
        call = _Call(request, call_context, future)
        with self._lock:
            self._queued.append(call)
            schedule, self._handoff_scheduled = not self._handoff_scheduled, True
        if schedule:
            # Posted at the end of this intake loop turn: the calls taken in during the same turn join
            # this hand-off, and the main loop is woken once for all of them.
            loop.call_soon(self._post_handoff)
        answer = await future
        if lane is not None:
            lane.slow_answered(time.perf_counter() - arrived)
        return answer

    def may_answer_here(self, context: MainLoopContext | CallContext, broker_id: int) -> bool:
        """On the intake loop: would :meth:`RequestGuard.check_node` let this call through?  True only when
        that is certain without the main loop: the identity binding (pure), and with an authorizer a
        CLUSTER_ACTION grant the main loop's guard decided for this principal and host under the ACLs in
        force now.  False sends the call the normal way, where the guard decides (and a refusal is
        answered and logged as always).  Also for the heartbeats of an intake process's batch
        (:class:`~kraft.node.batch_lane.BatchLane`: ``context`` is then the call's own CallContext)."""
        authorizer = self._guard().authorizer
        principal = principal_of(context)
        identity = node_identity(principal)
        if identity is not None and identity.node_id != broker_id:
            return False
        if authorizer is None:
            return True
        if identity is None and not authorizer.is_super_user(principal):
            return False
        acls, grants = self._grants
        return acls is authorizer.acls_in_force() and (str(principal), peer_host(context)) in grants

    def grant(self, guard: RequestGuard, context: MainLoopContext | CallContext) -> None:
        """On main, after ``guard`` let a heartbeat through: publish its (principal, host) grant."""
        authorizer = guard.authorizer
        if authorizer is None:
            return
        acls = authorizer.acls_in_force()
        key = (str(principal_of(context)), peer_host(context))
        known, grants = self._grants
        if known is acls and key in grants:
            return
        if known is not acls or len(grants) >= MAX_GRANTS:
            grants = frozenset()
        self._grants = (acls, grants | {key})

    def _post_handoff(self) -> None:
        try:
            self._main.call_soon_threadsafe(self._handoff)
        except RuntimeError:  # the main loop is closed: nothing will take the queue, answer it here
            with self._lock:
                queued, self._queued = self._queued, []
                self._handoff_scheduled = False
            closed = Refused(grpc.StatusCode.UNAVAILABLE, "the node's main loop is closed")
            _settle_all([(call.future, closed) for call in queued])

    def _handoff(self) -> None:
        """On main: check every queued call, answer the refused ones, run the rest as controller events."""
        with self._lock:
            queued, self._queued = self._queued, []
            self._handoff_scheduled = False
        if not queued:
            return
        self.handoffs += 1
        self.calls += len(queued)
        guard = self._guard()
        current = self._controller()
        lane_on = current is not None and current.lane is not None
        admitted: list[_Call] = []
        refused: list[tuple[asyncio.Future[Answer], Answer]] = []
        for call in queued:
            try:
                guard.check_node(call.context, call.request.broker_id, "heartbeat as broker")
            except AccessDenied as exc:  # as ControllerServicer._call aborts it
                refused.append((call.future, Refused(grpc_status_for(exc.code), str(exc))))
                continue
            except Exception as exc:  # a guard bug fails its own call (grpc.aio's UNKNOWN), no other
                _log.exception("heartbeat_check_failed", broker=call.request.broker_id)
                failed = Refused(grpc.StatusCode.UNKNOWN, f"{type(exc).__name__}: {exc}")
                refused.append((call.future, failed))
                continue
            if lane_on:
                self.grant(guard, call.context)
            admitted.append(call)
        if refused:
            _post(refused)
        if not admitted:
            return
        controller = self._controller()
        if controller is None:  # as ControllerServicer._call answers it
            _post([(call.future, _starting()) for call in admitted])
            return
        for start in range(0, len(admitted), HEARTBEATS_PER_EVENT):
            task = self._main.create_task(
                self._run(controller, admitted[start : start + HEARTBEATS_PER_EVENT]), name="heartbeats"
            )
            self._running.add(task)
            task.add_done_callback(self._running.discard)

    async def _run(self, controller: QuorumController, calls: list[_Call]) -> None:
        """On main: one controller event for ``calls``; each answer posted as soon as it is ready."""
        pending = set(range(len(calls)))
        try:
            async for answers in controller.broker_heartbeats([call.request for call in calls]):
                ready: list[tuple[asyncio.Future[Answer], Answer]] = []
                for position, answer in answers:
                    pending.discard(position)
                    ready.append((calls[position].future, answer))
                _post(ready)
        except Exception as exc:  # a bug: each caller not yet answered gets it, as it would alone
            _log.exception("controller_request_failed", request="BrokerHeartbeatRequest")
            failed = Refused(grpc_status_for(ErrorCode.UNKNOWN_SERVER_ERROR), f"{type(exc).__name__}: {exc}")
            _post([(calls[position].future, failed) for position in sorted(pending)])
        except asyncio.CancelledError:  # the node stops: its callers must not wait for their deadline
            stopped = Refused(grpc.StatusCode.UNAVAILABLE, "the controller stopped")
            _post([(calls[position].future, stopped) for position in sorted(pending)])
            raise


def _starting() -> cpb.BrokerHeartbeatResponse:
    response = cpb.BrokerHeartbeatResponse(
        error_code=int(ErrorCode.NOT_CONTROLLER), error_message="the controller is starting"
    )
    response.controller.node_id = -1
    return response


def _post(answers: list[tuple[asyncio.Future[Answer], Answer]]) -> None:
    """From main: settle ``answers`` on their callers' loop (the intake loop), one wake-up for all."""
    if not answers:
        return
    with contextlib.suppress(RuntimeError):  # the intake loop is closed: the server is gone
        answers[0][0].get_loop().call_soon_threadsafe(_settle_all, answers)


def _settle_all(answers: list[tuple[asyncio.Future[Answer], Answer]]) -> None:
    for future, answer in answers:
        if not future.done():  # else the call ended meanwhile (deadline, client gone)
            future.set_result(answer)


def heartbeat_handler(bridge: HeartbeatBridge) -> grpc.RpcMethodHandler[Any, Any]:
    """``BrokerHeartbeat``'s gRPC handler on the intake loop (``HopInterceptor(replace=...)``): decoded
    there (undecodable bytes: INVALID_ARGUMENT, as ControllerService answers them) and served by
    ``bridge``.  Its own decoder: the server's is used on the main loop."""
    decoder = RequestDecoder(logging.getLogger(__name__), "controller_bad_request")
    method = "BrokerHeartbeat"

    async def handle(raw: bytes, context: grpc.aio.ServicerContext[Any, Any]) -> cpb.BrokerHeartbeatResponse:
        request = await decoder.decode(raw, cpb.BrokerHeartbeatRequest, method, context)
        assert isinstance(request, cpb.BrokerHeartbeatRequest)
        return await bridge.heartbeat(request, context)

    return grpc.unary_unary_rpc_method_handler(handle, response_serializer=_serialize)


def _serialize(message: cpb.BrokerHeartbeatResponse) -> bytes:
    return message.SerializeToString()
