"""``BrokerHeartbeatStream`` on the intake loop: a broker's heartbeats over one long-lived stream (issue #17).

A unary call costs the leader's intake ~0.3-0.45 ms of grpc.aio per heartbeat, and the broker's side its
own; a message on an open stream a fraction of that (docs/internals/raft-performance.md, "Heartbeats over
one stream per broker (session 15)").  A broker keeps ONE ``BrokerHeartbeatStream`` open to the active
controller (as a Kafka broker keeps one connection) and sends each heartbeat as a message on it.

Each message is answered exactly as a unary ``BrokerHeartbeat`` carrying it would be —
:meth:`HeartbeatBridge.answer <kraft.node.controller_bridge.HeartbeatBridge.answer>` is the unary call's own
path: the fast lane when its conditions hold (the caller's check, a steady broker, the lease), else the
hand-off to the main loop where the servicer's guard checks the caller and the controller answers (a
follower, or a controller still starting, answers NOT_CONTROLLER in the message: the broker re-opens to the
new leader).  What differs, and why it is safe:

- **the caller is read once per stream** (auth context, peer, forwarded identity: a
  :class:`~kraft.node.intake.MainLoopContext`), not once per call: they belong to the connection, which a
  stream never changes.  Every message is still checked against its own broker id (identity binding, ACLs);
- **answers in request order**: the messages of a stream are handled one at a time, the next read only
  after the previous one is answered (a broker sends its next heartbeat only after the previous answer
  anyway);
- **a refusal ends the stream** with the status a unary call would have been refused with (undecodable:
  INVALID_ARGUMENT; the guard's refusal: its status), so the broker sees the same error;
- **a cancelled stream leaves nothing behind**: the handler's only state is its own frame; a message
  waiting on the main loop is answered into a future nobody reads
  (:func:`~kraft.node.controller_bridge._settle_all` skips it).

Without the intake thread (or with the heartbeat bridge off) the servicer's own ``BrokerHeartbeatStream``
runs each message through its unary ``BrokerHeartbeat`` on the main loop.  Intake processes proxy the stream
byte for byte like every other streaming method (:class:`kraft.node.intake_process.Proxy`), the caller's
identity forwarded with it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import grpc
import grpc.aio

from kraft.grpc_service import RequestDecoder
from kraft.node.controller_bridge import Refused
from kraft.node.intake import MainLoopContext
from kraft.v1 import controller_pb2 as cpb

if TYPE_CHECKING:
    from kraft.node.controller_bridge import HeartbeatBridge

HEARTBEAT_STREAM_METHOD = "/kraft.v1.ControllerService/BrokerHeartbeatStream"


def heartbeat_stream_handler(bridge: HeartbeatBridge) -> grpc.RpcMethodHandler[Any, Any]:
    """``BrokerHeartbeatStream``'s gRPC handler on the intake loop (``HopInterceptor(replace=...)``)."""
    decoder = RequestDecoder(logging.getLogger(__name__), "controller_bad_request")

    async def handle(
        requests: AsyncIterator[bytes], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[cpb.BrokerHeartbeatResponse]:
        caller = MainLoopContext(context, asyncio.get_running_loop())
        async for raw in requests:
            request = await decoder.decode(raw, cpb.BrokerHeartbeatRequest, "BrokerHeartbeatStream", context)
            assert isinstance(request, cpb.BrokerHeartbeatRequest)
            probe = bridge.message_probe  # observability.stall.sampler.ms: the message's arrival delay
            if probe is not None:
                probe(request, request.broker_id)
            answer = await bridge.answer(request, caller)
            if isinstance(answer, Refused):
                await context.abort(answer.code, answer.details)
                raise AssertionError("unreachable: context.abort raises")
            yield answer

    return grpc.stream_stream_rpc_method_handler(handle, response_serializer=_serialize)


def _serialize(message: cpb.BrokerHeartbeatResponse) -> bytes:
    return message.SerializeToString()
