"""``ControllerClient.call``'s ``timeout_s`` bounds the whole call; each attempt gets ``min(request timeout,
what is left)``.

Before, every attempt (up to voters + 2) got the full ``timeout_s``: a heartbeat sent with "2 s" was
answered after up to 9 s.  The controllers here are fake channels on a manual clock: a black-holed one
moves the clock by the attempt's timeout and fails DEADLINE_EXCEEDED, so what each attempt was given
and when the call ended are exact, with no wall time in any assertion."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pytest

from kraft.client.channel import ChannelPool
from kraft.client.controller import ControllerClient, ControllerUnavailable, OutcomeUnknown
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2 as cpb
from kraft.v1.common_pb2 import NodeRef

TARGETS = {1: "c1:9093", 2: "c2:9093", 3: "c3:9093"}
VOTERS = sorted(TARGETS.items())


def _failed(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


@dataclass
class _Controller:
    """How one fake controller answers: after ``delay_ms`` (clock time), or never (``black_hole``)."""

    black_hole: bool = False
    redirect_to: int | None = None  # NOT_CONTROLLER naming this id; None: the active controller
    delay_ms: int = 0


@dataclass
class _Cluster:
    clock: ManualClock
    controllers: dict[str, _Controller]
    sent: list[tuple[str, float]] = field(default_factory=list)  # (target, the attempt's timeout)

    async def answer(self, target: str, timeout_s: float) -> cpb.DescribeClusterResponse:
        self.sent.append((target, timeout_s))
        controller = self.controllers[target]
        if controller.black_hole or controller.delay_ms > timeout_s * 1000:
            self.clock.advance(round(timeout_s * 1000))
            raise _failed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        self.clock.advance(controller.delay_ms)
        if controller.redirect_to is not None:
            return cpb.DescribeClusterResponse(
                error_code=ErrorCode.NOT_CONTROLLER, controller=NodeRef(node_id=controller.redirect_to)
            )
        return cpb.DescribeClusterResponse(error_code=ErrorCode.NONE, cluster_id=target)


class _Channel:
    """Stands in for a grpc.aio channel: every method of the stub answers through the cluster."""

    def __init__(self, cluster: _Cluster, target: str) -> None:
        self._cluster = cluster
        self._target = target

    def unary_unary(self, path: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        async def send(request: Any, **options: float) -> cpb.DescribeClusterResponse:
            return await self._cluster.answer(self._target, options["timeout"])

        return send

    def stream_stream(self, path: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        def refuse(*_args: Any, **_kwargs: Any) -> Any:
            raise AssertionError(f"{path}: these tests make unary calls only")

        return refuse


class _Pool:
    def __init__(self, cluster: _Cluster) -> None:
        self._channels = {target: _Channel(cluster, target) for target in cluster.controllers}

    def get(self, target: str) -> _Channel:
        return self._channels[target]

    async def close(self) -> None:
        pass


def _client(
    controllers: dict[int, _Controller], request_timeout_s: float | None = 2.0
) -> tuple[ControllerClient, _Cluster]:
    clock = ManualClock()
    cluster = _Cluster(clock, {TARGETS[node]: c for node, c in controllers.items()})
    client = ControllerClient(
        VOTERS, channels=cast(ChannelPool, _Pool(cluster)), request_timeout_s=request_timeout_s, clock=clock
    )
    return client, cluster


async def _describe(client: ControllerClient, timeout_s: float, *, idempotent: bool = True) -> str:
    response = await client.call(
        lambda s: s.DescribeCluster, cpb.DescribeClusterRequest(), timeout_s, idempotent=idempotent
    )
    return response.cluster_id


async def test_a_black_holed_controller_leaves_time_to_find_the_active_one_and_attempts_shrink() -> None:
    # Controller 1 was active and is now black-holed; 2 (slow, busy) knows that 3 took over.
    client, cluster = _client(
        {1: _Controller(), 2: _Controller(redirect_to=3, delay_ms=1500), 3: _Controller(delay_ms=200)}
    )
    assert await _describe(client, 4.5) == TARGETS[1]
    cluster.controllers[TARGETS[1]].black_hole = True
    cluster.sent.clear()
    started_ms = cluster.clock.monotonic_ms()

    assert await _describe(client, 4.5) == TARGETS[3]

    # 1 got the request timeout (2 s), not the whole 4.5 s; 2 answered at 3.5 s; 3 got what was left.
    assert cluster.sent == [(TARGETS[1], 2.0), (TARGETS[2], 2.0), (TARGETS[3], 1.0)]
    assert cluster.clock.monotonic_ms() - started_ms == 3700
    assert client.active_controller_id == 3


async def test_no_sequence_of_resends_outlasts_the_call_deadline_and_the_last_error_is_named() -> None:
    # 1 is black-holed but the others still name it active (no election yet): every resend goes back to it.
    client, cluster = _client(
        {1: _Controller(), 2: _Controller(redirect_to=1), 3: _Controller(redirect_to=1)}
    )
    assert await _describe(client, 3.0) == TARGETS[1]
    cluster.controllers[TARGETS[1]].black_hole = True
    cluster.sent.clear()
    started_ms = cluster.clock.monotonic_ms()

    with pytest.raises(ControllerUnavailable) as failed:
        await _describe(client, 3.0)

    assert cluster.clock.monotonic_ms() - started_ms == 3000  # not 5 attempts of 3 s each
    assert cluster.sent == [(TARGETS[1], 2.0), (TARGETS[2], 1.0), (TARGETS[1], 1.0)]
    message = str(failed.value)
    assert message.startswith(f"controller 1 at {TARGETS[1]}: DEADLINE_EXCEEDED")
    assert message.endswith("the call's 3 s deadline passed")
    assert client.active_controller_id == 1  # slow is not gone (test_controller_client_slow_leader)


async def test_without_a_request_timeout_one_attempt_may_take_the_whole_deadline() -> None:
    client, cluster = _client({1: _Controller(black_hole=True), 2: _Controller(), 3: _Controller()}, None)
    with pytest.raises(ControllerUnavailable, match="DEADLINE_EXCEEDED"):
        await _describe(client, 3.0)
    assert cluster.sent == [(TARGETS[1], 3.0)]  # nothing left for another voter
    assert cluster.clock.monotonic_ms() == 3000


async def test_a_non_idempotent_request_is_not_resent_after_its_attempt_timed_out() -> None:
    client, cluster = _client({1: _Controller(black_hole=True), 2: _Controller(), 3: _Controller()})
    with pytest.raises(OutcomeUnknown, match="may have been applied"):
        await _describe(client, 10.0, idempotent=False)
    assert cluster.sent == [(TARGETS[1], 2.0)]  # the attempt's timeout, then no resend
    assert cluster.clock.monotonic_ms() == 2000

    # The same timeout on an idempotent request moves on to another voter within the deadline.
    client, cluster = _client({1: _Controller(black_hole=True), 2: _Controller(), 3: _Controller()})
    assert await _describe(client, 10.0) == TARGETS[2]
    assert cluster.sent == [(TARGETS[1], 2.0), (TARGETS[2], 2.0)]
