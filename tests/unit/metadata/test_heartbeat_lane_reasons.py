"""Why a heartbeat went the main loop's path (session 14, issue #17): the fast lane counts each call it
does not answer under one reason in ``kraft_controller_heartbeats_slow_path_total{reason}``, and the
HeartbeatBridge times the slow path (``kraft_controller_heartbeat_slow_path_seconds``).  A real
QuorumController on a FakeRaft and a manual clock, as in test_heartbeat_lane."""

from __future__ import annotations

import asyncio
import collections
from typing import Any

import pytest

from kraft.metadata.heartbeat_lane import SLOW_REASONS
from kraft.metadata.service import ControllerServicer
from kraft.node.controller_bridge import HeartbeatBridge
from kraft.observability.metrics import CONTROLLER_HEARTBEATS_SLOW_PATH, ControllerMetrics
from kraft.security.authorizer import AuthorizerSettings

from .test_controller import registration, settle
from .test_heartbeat_bridge import CallContext, tls_identities  # noqa: F401 - a fixture
from .test_heartbeat_lane import LEASE_MS, _beat, _controller, _lane, _unfenced


def _counts() -> dict[str, float]:
    return {
        reason: CONTROLLER_HEARTBEATS_SLOW_PATH.labels("1", reason)._value.get() for reason in SLOW_REASONS
    }


def _counted(before: dict[str, float]) -> dict[str, float]:
    """The reasons counted since ``before`` (only those that moved)."""
    return {reason: n - before[reason] for reason, n in _counts().items() if n != before[reason]}


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"want_fence": True}, "asks"),
        ({"want_shut_down": True}, "asks"),
        ({"offline_partitions": True}, "asks"),
        ({"cluster_id": "other"}, "other_cluster"),
        ({"broker_epoch": 12345}, "not_steady"),
        ({"broker_id": 999}, "not_steady"),
    ],
)
async def test_each_request_the_lane_does_not_answer_is_counted_by_reason(
    change: dict[str, Any], reason: str
) -> None:
    _, controller, _, _ = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        req = _beat(101, epoch)
        for key, value in change.items():
            if key == "offline_partitions":
                req.offline_partitions.add(topic="t", partition=0)
            else:
                setattr(req, key, value)
        before = _counts()
        assert _lane(controller).answer(req) is None
        assert _counted(before) == {reason: 1}
        before = _counts()
        assert _lane(controller).answer(_beat(101, epoch)) is not None
        assert _counted(before) == {}, "a fast answer counts no reason"
    finally:
        await controller.stop()


async def test_the_lease_the_snapshot_and_the_commit_are_told_apart() -> None:
    raft, controller, clock, lease = await _controller()
    try:
        epoch = (await controller.register_broker(registration(101))).broker_epoch
        before = _counts()
        assert _lane(controller).answer(_beat(101, epoch)) is None  # registered fenced
        assert _counted(before) == {"not_steady": 1}
        raft.hold_commits = True
        unfence = asyncio.create_task(controller.broker_heartbeat(_beat(101, epoch)))
        await settle()
        before = _counts()
        assert _lane(controller).answer(_beat(101, epoch)) is None  # its unfence record is not committed
        assert _counted(before) == {"uncommitted": 1}
        raft.release()
        await asyncio.wait_for(unfence, 5.0)
        clock.advance(LEASE_MS)
        before = _counts()
        assert _lane(controller).answer(_beat(101, epoch)) is None
        assert _counted(before) == {"lease_lapsed": 1}
        lease.expiry_ms = -1
        controller._event_ran("test", 0)
        before = _counts()
        assert _lane(controller).answer(_beat(101, epoch)) is None
        assert _counted(before) == {"no_lease": 1}
        raft.lose_leadership(2)
        await settle()
        before = _counts()
        assert _lane(controller).answer(_beat(101, epoch)) is None
        assert _counted(before) == {"no_snapshot": 1}
    finally:
        await controller.stop()


async def test_a_snapshot_changed_between_the_two_reads_is_counted() -> None:
    _, controller, _, _ = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        lane = _lane(controller)

        class MainLoopGetsIn(collections.deque[Any]):
            def append(self, touch: Any) -> None:
                lane.unpublish(101)
                super().append(touch)

        lane._touches = MainLoopGetsIn()
        before = _counts()
        assert lane.answer(_beat(101, epoch)) is None
        assert _counted(before) == {"changed": 1}
    finally:
        await controller.stop()


async def test_the_bridge_counts_an_undecidable_caller_and_times_the_slow_path() -> None:
    """A caller whose ACL decision is not known on the intake goes the normal path as ``not_allowed``;
    every call that went the normal path is timed from its arrival to its answer."""
    _, controller, _, _ = await _controller()
    settings = AuthorizerSettings(enabled=True, super_users=frozenset({"User:CN=admin,O=kraft"}))
    servicer = ControllerServicer(controller, authorizer=settings)
    histogram = ControllerMetrics.for_node(1).heartbeat_slow_path_seconds
    try:
        epoch = await _unfenced(controller, 101)
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)

        async def call() -> Any:
            context: Any = CallContext("admin")
            return await asyncio.wait_for(bridge.heartbeat(_beat(101, epoch), context), 5.0)

        timed = histogram._sum.get(), _observations(histogram)
        before = _counts()
        await call()  # no grant yet: the normal path
        assert _counted(before) == {"not_allowed": 1}
        assert _observations(histogram) == timed[1] + 1 and histogram._sum.get() > timed[0]
        before = _counts()
        await call()  # granted now: the lane answers, nothing counted or timed
        assert _counted(before) == {} and _observations(histogram) == timed[1] + 1
    finally:
        await controller.stop()


def _observations(histogram: Any) -> float:
    return float(sum(bucket.get() for bucket in histogram._buckets))


async def test_the_bridge_hands_each_call_s_metadata_to_the_arrival_probe() -> None:
    _, controller, _, _ = await _controller()
    servicer = ControllerServicer(controller)
    try:
        epoch = await _unfenced(controller, 101)
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        seen: list[tuple[object, int]] = []
        bridge.arrival_probe = lambda metadata, broker: seen.append((metadata, broker))
        context: Any = CallContext("broker-101")
        await asyncio.wait_for(bridge.heartbeat(_beat(101, epoch), context), 5.0)
        assert seen == [((), 101)]
    finally:
        await controller.stop()
