"""``AdminClient``'s ``timeout_s`` bounds a whole operation and ``attempt_timeout_s`` one RPC (Kafka's
``default.api.timeout.ms`` and ``request.timeout.ms``).

Before session 16 every round of an AdminClient call got at least 0.5 s (a call could end 0.5 s late),
learning the cluster id and each reconciling resend got a fresh ``timeout_s``.  The controllers here are
fake channels on a manual clock and the backoff sleeps advance that clock, so what each RPC was given and
when the operation ended are exact, with no wall time in any assertion."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, cast

import grpc
import pytest

from kraft.client.admin import ADMIN_RETRY_BACKOFF_S, AdminClient, DeadlinePassed, WriteOutcomeUnknown
from kraft.client.channel import ChannelPool
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2 as cpb

C1, C2 = "c1:9093", "c2:9093"


def _failed(code: grpc.StatusCode, details: str) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details, None)


@dataclass
class _Controller:
    """One fake controller: answers after ``delay_ms`` (clock time) as the active one, or NOT_CONTROLLER
    without a hint (an election); black-holed (never answers) from ``black_hole_from_ms`` on, or for the
    requests numbered in ``black_holed`` (1-based)."""

    active: bool = True
    delay_ms: int = 0
    black_hole_from_ms: int | None = None
    black_holed: frozenset[int] = frozenset()
    received: int = 0


@dataclass
class _Cluster:
    clock: ManualClock
    controllers: dict[str, _Controller]
    sent: list[tuple[str, str, float, int]] = field(default_factory=list)  # target, method, timeout, at ms
    pauses: list[float] = field(default_factory=list)  # the backoff sleeps, in order

    async def answer(self, target: str, method: str, timeout_s: float) -> Any:
        now_ms = self.clock.monotonic_ms()
        self.sent.append((target, method, timeout_s, now_ms))
        controller = self.controllers[target]
        controller.received += 1
        black_holed = controller.received in controller.black_holed or (
            controller.black_hole_from_ms is not None and now_ms >= controller.black_hole_from_ms
        )
        if black_holed or controller.delay_ms > timeout_s * 1000:
            self.clock.advance(round(timeout_s * 1000))
            raise _failed(grpc.StatusCode.DEADLINE_EXCEEDED, "Deadline Exceeded")
        self.clock.advance(controller.delay_ms)
        if not controller.active:
            return cpb.DescribeClusterResponse(error_code=ErrorCode.NOT_CONTROLLER)
        if method.endswith("/CreateTopics"):
            return cpb.CreateTopicsResponse(topics=[cpb.CreatableTopicResult(name="t")])
        return cpb.DescribeClusterResponse(cluster_id="kc")


class _Channel:
    def __init__(self, cluster: _Cluster, target: str) -> None:
        self._cluster = cluster
        self._target = target

    def unary_unary(self, path: str, *args: Any, **kwargs: Any) -> Callable[..., Any]:
        async def send(request: Any, **options: float) -> Any:
            return await self._cluster.answer(self._target, path, options["timeout"])

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


def _admin(
    controllers: dict[str, _Controller],
    timeout_s: float,
    attempt_timeout_s: float | None,
    cluster_id: str = "",
    retry_backoff_s: float | None = None,
) -> tuple[AdminClient, _Cluster]:
    clock = ManualClock()
    cluster = _Cluster(clock, controllers)

    async def sleep(seconds: float) -> None:
        cluster.pauses.append(seconds)
        clock.advance(round(seconds * 1000))

    client = AdminClient(
        list(controllers),
        timeout_s,
        attempt_timeout_s,
        clock=clock,
        cluster_id=cluster_id,
        channels=cast(ChannelPool, _Pool(cluster)),
        sleep=sleep,
        retry_backoff_s=ADMIN_RETRY_BACKOFF_S if retry_backoff_s is None else retry_backoff_s,
    )
    return client, cluster


def _describe_cluster() -> cpb.DescribeClusterRequest:
    return cpb.DescribeClusterRequest(cluster_id="kc")


async def test_the_last_round_gets_only_what_is_left_of_the_deadline() -> None:
    # An election (NOT_CONTROLLER, no hint) is waited out with backoff 0.05, 0.1, 0.2, 0.4 s; the round at
    # 0.75 s finds the controller black-holed and may take only the 0.25 s that are left (it took 0.5 s).
    client, cluster = _admin({C1: _Controller(active=False, black_hole_from_ms=700)}, 1.0, None)
    with pytest.raises(DeadlinePassed, match="no active controller answered within 1s") as failed:
        await client.call(lambda s: s.DescribeCluster, _describe_cluster())
    assert failed.value.code is ErrorCode.NOT_CONTROLLER  # the code scripts already match on
    assert cluster.clock.monotonic_ms() == 1000
    assert cluster.sent[-1] == (C1, "/kraft.v1.ControllerService/DescribeCluster", 0.25, 750)
    assert all(at_ms + timeout_s * 1000 <= 1000 for _, _, timeout_s, at_ms in cluster.sent)


async def test_rounds_pause_from_retry_backoff_doubling_to_the_max() -> None:
    """The CLI's ``retry.backoff.ms`` (here 250 ms) is the first pause; it doubles up to 1 s (Kafka's
    ``retry.backoff.max.ms``); without it the first pause stays 50 ms."""
    client, cluster = _admin({C1: _Controller(active=False)}, 4.0, None, retry_backoff_s=0.25)
    with pytest.raises(DeadlinePassed):
        await client.call(lambda s: s.DescribeCluster, _describe_cluster())
    assert cluster.pauses == [0.25, 0.5, 1.0, 1.0, 1.0]  # then 1 s + a round would pass the 4 s
    client, cluster = _admin({C1: _Controller(active=False)}, 1.0, None)
    with pytest.raises(DeadlinePassed):
        await client.call(lambda s: s.DescribeCluster, _describe_cluster())
    assert cluster.pauses == [0.05, 0.1, 0.2, 0.4]


async def test_a_black_holed_bootstrap_address_costs_one_attempt() -> None:
    client, cluster = _admin({C1: _Controller(black_hole_from_ms=0), C2: _Controller()}, 10.0, 2.0)
    response = await client.call(lambda s: s.DescribeCluster, _describe_cluster())
    assert response.cluster_id == "kc"
    assert [(target, timeout_s) for target, _, timeout_s, _ in cluster.sent] == [(C1, 2.0), (C2, 2.0)]
    assert cluster.clock.monotonic_ms() == 2000  # not the whole 10 s deadline


async def test_learning_the_cluster_id_and_the_call_share_one_deadline() -> None:
    # The cluster id comes after 0.6 s; then the controller black-holes: the call has the 0.4 s left.
    client, cluster = _admin({C1: _Controller(delay_ms=600, black_holed=frozenset({2}))}, 1.0, None)
    with pytest.raises(DeadlinePassed, match="DEADLINE_EXCEEDED"):
        await client.call(lambda s: s.DescribeCluster, cpb.DescribeClusterRequest())
    assert [(timeout_s, at_ms) for _, _, timeout_s, at_ms in cluster.sent] == [(1.0, 0), (0.4, 600)]
    assert cluster.clock.monotonic_ms() == 1000


async def test_resends_after_an_unknown_outcome_share_the_operation_deadline() -> None:
    # Every CreateTopics is black-holed: sent at 0, 2 and 4 s (the last with the 1 s left), then the
    # outcome is still unknown at the 5 s deadline — not 4 attempts of 2 s each.
    client, cluster = _admin({C1: _Controller(black_hole_from_ms=0)}, 5.0, 2.0, cluster_id="kc")
    request = cpb.CreateTopicsRequest(topics=[cpb.CreatableTopic(name="t", num_partitions=1)])
    with pytest.raises(WriteOutcomeUnknown, match="may have been applied"):
        await client.create_topics(request)
    assert [(timeout_s, at_ms) for _, _, timeout_s, at_ms in cluster.sent] == [
        (2.0, 0),
        (2.0, 2000),
        (1.0, 4000),
    ]
    assert cluster.clock.monotonic_ms() == 5000


async def test_a_write_whose_attempt_ran_out_is_resent_to_another_controller_first() -> None:
    # The cluster id was given, so the first request is the write, to c1 — black-holed.  Its outcome is
    # unknown; the resend asks c2 (the active one now) instead of c1 again, and is reconciled there.
    client, cluster = _admin({C1: _Controller(black_hole_from_ms=0), C2: _Controller()}, 10.0, 2.0, "kc")
    request = cpb.CreateTopicsRequest(topics=[cpb.CreatableTopic(name="t", num_partitions=1)])
    response = await client.create_topics(request)
    assert ErrorCode.from_wire(response.topics[0].error_code) is ErrorCode.NONE
    assert [(target, at_ms) for target, _, _, at_ms in cluster.sent] == [(C1, 0), (C2, 2000)]
