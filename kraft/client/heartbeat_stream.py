"""A broker's heartbeats over one long-lived ``BrokerHeartbeatStream`` to the active controller (issue #17).

A unary ``BrokerHeartbeat`` costs both ends a gRPC call each time; a message on an open stream a fraction
of it (docs/internals/raft-performance.md, "Heartbeats over one stream per broker (session 15)").
:meth:`HeartbeatStream.heartbeat` has the contract of ``ControllerClient.call(BrokerHeartbeat)`` — an answer
that is never NOT_CONTROLLER, :class:`~kraft.client.controller.ControllerUnavailable` when no controller
answered, :class:`~kraft.errors.KraftError` on an authorization refusal — and sends over the stream when it
can, over :meth:`ControllerClient.call` when it cannot:

- **which controller**: the one the :class:`~kraft.client.controller.ControllerClient` believes active.  With
  none known yet, the heartbeat goes unary (``call`` finds the leader); the stream opens on the next one;
- **NOT_CONTROLLER** in a stream's answer (nothing was done): the stream is closed and this heartbeat sent
  unary, which follows the hint; the next heartbeat opens a stream to the new active controller.  The
  same for a stream that breaks (the controller went away), with the time left of the heartbeat's deadline;
- **UNIMPLEMENTED** (a controller of an older version): that controller is heartbeated unary from then on.
  grpc.aio hides it when the refusal ends the call while the heartbeat is being written: the write fails
  with grpc.aio's own INTERNAL in place of the controller's status (measured: most opens to a controller
  in another process).  Such a stream tells nothing (``inconclusive``): the heartbeat, never sent, goes
  unary and the next one tries a stream again;
- **the deadline**: every heartbeat has its own (``timeout_s``: the whole call's, as a unary call's); the
  stream waits at most the client's request timeout of it.  One not answered in that time closes the
  stream — a late answer must never be read as the next heartbeat's — and what is left of the deadline
  goes unary, first to another voter (``active_timed_out``), as a unary call's DEADLINE_EXCEEDED on the
  active controller does: a black-holed leader is left for the one the other voters name;
- **one heartbeat at a time** (the broker's lifecycle sends the next only after the previous ended): a
  heartbeat cancelled while it waits closes the stream for the same reason as a missed deadline.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import grpc
import grpc.aio

from kraft.client.controller import MIN_ATTEMPT_S, ControllerClient, ControllerUnavailable, refusal
from kraft.errors import ErrorCode
from kraft.observability.logging import get_logger
from kraft.v1 import controller_pb2 as cpb

METHOD = "/kraft.v1.ControllerService/BrokerHeartbeatStream"
_log = get_logger("client.heartbeat_stream")
_EOF: Any = grpc.aio.EOF  # type: ignore[attr-defined]  # exported, missing from the stubs


class HeartbeatStream:
    """One broker's heartbeat stream (see the module docstring); ``client`` is the broker's controller
    client, which the unary fallback and the active controller's address come from."""

    def __init__(self, client: ControllerClient) -> None:
        self._client = client
        self._target: str | None = None
        self._channel: grpc.aio.Channel | None = None
        self._call: Any = None  # the open grpc.aio stream-stream call (None: none open)
        self._unary_only: set[str] = set()  # controllers that answered UNIMPLEMENTED
        self.opened = 0  # streams opened (tests read it)
        self.streamed = 0  # heartbeats answered over a stream
        self.unary = 0  # heartbeats sent unary (no stream possible, or this one's stream failed)
        self.inconclusive = 0  # streams that ended during a write, their status lost (not sent)

    async def heartbeat(
        self, request: cpb.BrokerHeartbeatRequest, timeout_s: float
    ) -> cpb.BrokerHeartbeatResponse:
        started = time.monotonic()
        call = self._stream()
        target = self._target
        timed_out = False
        if call is not None:
            cap_s = self._client.request_timeout_s
            wait_s = timeout_s if cap_s is None else min(cap_s, timeout_s)
            try:
                async with asyncio.timeout(wait_s):
                    await _write(call, request)
                    response = await call.read()
            except _EndedDuringWrite:
                self.close()
                self.inconclusive += 1
                _log.info("heartbeat_stream_inconclusive", controller=target)
            except TimeoutError:
                # A late answer must never be read as the next heartbeat's: the stream goes.  What is left
                # of the deadline asks another voter (as a unary DEADLINE_EXCEEDED on the active controller
                # does): a black-holed leader would otherwise get every heartbeat's stream until the session
                # ran out, and the broker would never learn of the new one.
                self.close()
                timed_out = True
                _log.info("heartbeat_stream_timed_out", controller=target, waited_s=wait_s)
            except grpc.aio.AioRpcError as err:
                self.close()
                refused = refusal(err)
                if refused is not None:
                    raise refused from None
                if err.code() is grpc.StatusCode.UNIMPLEMENTED:
                    assert target is not None
                    self._unary_only.add(target)
                    _log.info("heartbeat_stream_unsupported", controller=target)
            except asyncio.CancelledError:  # mid-heartbeat: its answer must not be read as the next one's
                self.close()
                raise
            except Exception:  # the stream ended before this write (a write after its end): go unary
                self.close()
            else:
                if response is _EOF:  # the controller ended the stream (it stops): go unary
                    if await call.code() is grpc.StatusCode.UNIMPLEMENTED:
                        assert target is not None
                        self._unary_only.add(target)
                    self.close()
                elif response.error_code == ErrorCode.NOT_CONTROLLER:
                    self.close()  # nothing was done: unary follows the hint
                else:
                    self.streamed += 1
                    assert isinstance(response, cpb.BrokerHeartbeatResponse)
                    return response
        left = timeout_s - (time.monotonic() - started)
        if left < MIN_ATTEMPT_S:
            raise ControllerUnavailable(
                f"controller at {target}: heartbeat not answered within {timeout_s:g} s"
            )
        self.unary += 1
        return await self._client.call(
            lambda stub: stub.BrokerHeartbeat, request, left, active_timed_out=timed_out
        )

    def close(self) -> None:
        """Close the open stream, if any (also when the broker stops)."""
        call, self._call = self._call, None
        self._target = self._channel = None
        if call is not None:
            call.cancel()

    def _stream(self) -> Any:
        """The stream to the active controller (opened now if need be), or None: go unary."""
        client = self._client
        target = client.active_target
        if target is None or target in self._unary_only:
            self.close()
            return None
        channel = client.channel(target)
        if self._call is not None and (self._target != target or self._channel is not channel):
            self.close()  # another active controller, or a new channel (certificates rotated)
        if self._call is None:
            self._call = channel.stream_stream(
                METHOD,
                request_serializer=cpb.BrokerHeartbeatRequest.SerializeToString,
                response_deserializer=cpb.BrokerHeartbeatResponse.FromString,
            )(None)  # None: the heartbeats are written with call.write
            self._target, self._channel = target, channel
            self.opened += 1
            # once per active controller (a leader change, a broken stream): not per heartbeat
            _log.info("heartbeat_stream_opened", controller=target)
        return self._call


class _EndedDuringWrite(Exception):
    """The stream's call ended while a heartbeat was being written: not sent, the call's status lost."""


async def _write(call: Any, request: cpb.BrokerHeartbeatRequest) -> None:
    try:
        await call.write(request)
    except grpc.aio.AioRpcError as err:
        # A send that fails because the call ended makes grpc.aio replace the status it had received
        # (UNIMPLEMENTED, PERMISSION_DENIED…) with INTERNAL "Failed execute_batch" (grpc/aio/_call.py,
        # _write).  Any other code is the status the call had ended with before this write began.
        if err.code() is grpc.StatusCode.INTERNAL:
            raise _EndedDuringWrite from None
        raise
