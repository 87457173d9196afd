"""Calls to the active controller: find it among ``controller.quorum.voters``, follow NOT_CONTROLLER.

:meth:`ControllerClient.call` sends one request to the controller believed active; on a transport error
or a NOT_CONTROLLER answer without a usable hint it moves on to the next voter, and on NOT_CONTROLLER
with a hint it goes straight to the named controller (its address taken from our own voter list when the id
is a voter we know, else from the hint).  It gives up after one round over the voters (plus
the redirects) with :class:`ControllerUnavailable`; retry pacing (backoff) belongs to the caller, which
knows whether it is registering, heartbeating or fetching.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import grpc

from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2_grpc
from kraft.v1.common_pb2 import NodeRef

if TYPE_CHECKING:
    from kraft.v1.controller_pb2_grpc import ControllerServiceAsyncStub


class _ControllerResponse(Protocol):
    @property
    def error_code(self) -> int: ...

    @property
    def controller(self) -> NodeRef: ...


ResponseT = TypeVar("ResponseT", bound=_ControllerResponse)
# Selects the RPC on a stub: ``lambda stub: stub.BrokerHeartbeat``.
MethodPicker = Callable[["ControllerServiceAsyncStub"], Callable[..., Awaitable[ResponseT]]]


class ControllerUnavailable(Exception):
    """No controller answered as the active one in this round."""


class ControllerClient:
    def __init__(
        self,
        voters: Sequence[tuple[int, str]],
        *,
        max_message_bytes: int = 16 * 1024 * 1024,
    ) -> None:
        """``voters``: ``(node id, "host:port")`` of every controller (the bootstrap list)."""
        if not voters:
            raise ValueError("the controller client needs at least one voter")
        self._voters = list(voters)
        self._voter_targets = dict(self._voters)
        self._options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._active: tuple[int, str] | None = None
        self._next_voter = 0

    @property
    def active_controller_id(self) -> int:
        return -1 if self._active is None else self._active[0]

    async def call(self, pick: MethodPicker[ResponseT], request: Any, timeout_s: float) -> ResponseT:
        """Send ``request`` to the active controller; the answer is never NOT_CONTROLLER."""
        attempts = len(self._voters) + 2
        last_error = "no controller tried"
        for _ in range(attempts):
            node_id, target = self._current()
            channel = self._channel(target)
            stub: ControllerServiceAsyncStub = controller_pb2_grpc.ControllerServiceStub(channel)
            try:
                response = await pick(stub)(request, timeout=timeout_s)
            except grpc.aio.AioRpcError as err:
                last_error = f"controller {node_id} at {target}: {err.code().name} {err.details()}"
                self._forget(target)
                continue
            if response.error_code != ErrorCode.NOT_CONTROLLER:
                self._active = (node_id, target)
                return response
            hint = response.controller
            known = self._voter_targets.get(hint.node_id)
            if known is not None:
                # Resolve the id through our own voter list (as Kafka does): the endpoint in the hint is
                # how the *controllers* reach each other, which need not be how this broker reaches them.
                self._active = (hint.node_id, known)
            elif hint.node_id >= 0 and hint.endpoint.port > 0:
                self._active = (hint.node_id, f"{hint.endpoint.host or '127.0.0.1'}:{hint.endpoint.port}")
            else:
                self._forget(target)
            last_error = f"controller {node_id} at {target} is not the active controller"
        raise ControllerUnavailable(last_error)

    async def close(self) -> None:
        channels, self._channels = self._channels, {}
        for channel in channels.values():
            await channel.close(None)

    def _current(self) -> tuple[int, str]:
        if self._active is None:
            self._active = self._voters[self._next_voter % len(self._voters)]
            self._next_voter += 1
        return self._active

    def _forget(self, target: str) -> None:
        if self._active is not None and self._active[1] == target:
            self._active = None

    def _channel(self, target: str) -> grpc.aio.Channel:
        channel = self._channels.get(target)
        if channel is None:
            channel = grpc.aio.insecure_channel(target, options=self._options)
            self._channels[target] = channel
        return channel
