"""The heartbeat fast lane (kraft.metadata.heartbeat_lane): steady BrokerHeartbeats answered from the
snapshot the main loop publishes, everything else the normal path.  A real QuorumController on a FakeRaft
and a manual clock; the lease is the test's (``Lease``).  One test per safety condition of
docs/internals/heartbeat-lane.md: steadiness, the leader lease (and its renewal callers), session
liveness (a touch is seen before an expiry check, also one recorded while the check takes the broker out),
publication (a fence, a shutdown, a re-registration takes the broker out at once), and ACLs."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
from typing import Any

import grpc
import pytest

from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.service import ControllerServicer
from kraft.node.controller_bridge import HeartbeatBridge
from kraft.observability.metrics import ControllerMetrics
from kraft.security.authorizer import AuthorizerSettings
from kraft.v1 import controller_pb2 as cpb

from .fake_raft import FakeRaft
from .test_controller import CLUSTER, ENDPOINTS, registration, settle, until
from .test_heartbeat_bridge import Aborted, CallContext, tls_identities  # noqa: F401 - a fixture

SESSION_MS = 9_000
LEASE_MS = 2_000


class Lease:
    """The Raft leader lease's end the controller publishes (the driver's, in a real node)."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.expiry_ms = -1

    def hold(self) -> None:
        self.expiry_ms = self.clock.now_ms + LEASE_MS

    def __call__(self) -> int:
        return self.expiry_ms


async def _controller(*, lane: bool = True) -> tuple[FakeRaft, QuorumController, ManualClock, Lease]:
    raft = FakeRaft(1)
    clock = ManualClock()
    lease = Lease(clock)
    options = ControllerOptions(noop_interval_ms=0, session_timeout_ms=SESSION_MS, leader_lease_ms=LEASE_MS)
    controller = QuorumController(
        raft, CLUSTER, ENDPOINTS, options, clock=clock, lease_expiry_ms=lease if lane else None
    )
    await controller.start()
    raft.elect()
    await until(lambda: controller.is_active)
    lease.hold()
    return raft, controller, clock, lease


async def _unfenced(controller: QuorumController, broker_id: int) -> int:
    """Registered and unfenced through the normal path (its records committed)."""
    epoch = (await controller.register_broker(registration(broker_id))).broker_epoch
    beat = await controller.broker_heartbeat(_beat(broker_id, epoch))
    assert beat.error_code == ErrorCode.NONE and not beat.is_fenced
    return epoch


def _beat(broker_id: int, epoch: int, **fields: Any) -> cpb.BrokerHeartbeatRequest:
    fields.setdefault("current_metadata_offset", epoch)
    return cpb.BrokerHeartbeatRequest(cluster_id=CLUSTER, broker_id=broker_id, broker_epoch=epoch, **fields)


def _lane(controller: QuorumController) -> Any:
    assert controller.lane is not None
    return controller.lane


async def test_a_steady_heartbeat_is_answered_without_the_main_loop() -> None:
    _, controller, _, _ = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        events = len(controller.writes.queue.processed)
        counter = ControllerMetrics.for_node(1).heartbeats_fast_lane
        counted = counter._value.get()
        answer = _lane(controller).answer(_beat(101, epoch))
        assert answer is not None and answer.error_code == ErrorCode.NONE
        assert answer.is_caught_up and not answer.is_fenced and not answer.should_shut_down
        behind = _lane(controller).answer(_beat(101, epoch, current_metadata_offset=epoch - 1))
        assert behind is not None and not behind.is_caught_up  # as broker_heartbeat computes it
        # the same answer the normal path gives
        slow = await controller.broker_heartbeat(_beat(101, epoch))
        assert slow == answer
        assert len(controller.writes.queue.processed) == events + 1, "only the slow one ran an event"
        assert counter._value.get() == counted + 2
    finally:
        await controller.stop()


@pytest.mark.parametrize(
    "change",
    [
        {"want_fence": True},
        {"want_shut_down": True},
        {"offline_partitions": True},
        {"cluster_id": "other"},
        {"cluster_id": ""},
        {"broker_epoch": 12345},
        {"broker_id": 999},
    ],
)
async def test_a_heartbeat_that_is_not_steady_goes_to_the_main_loop(change: dict[str, Any]) -> None:
    _, controller, _, _ = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        req = _beat(101, epoch)
        for key, value in change.items():
            if key == "offline_partitions":
                req.offline_partitions.add(topic="t", partition=0)
            else:
                setattr(req, key, value)
        assert _lane(controller).answer(req) is None
        assert _lane(controller).answer(_beat(101, epoch)) is not None  # the steady one still is
    finally:
        await controller.stop()


async def test_a_fenced_broker_and_one_whose_record_is_not_committed_go_to_the_main_loop() -> None:
    raft, controller, _, _ = await _controller()
    try:
        epoch = (await controller.register_broker(registration(101))).broker_epoch
        assert _lane(controller).answer(_beat(101, epoch)) is None, "registered fenced"
        raft.hold_commits = True
        unfence = asyncio.create_task(controller.broker_heartbeat(_beat(101, epoch)))
        await settle()
        assert not unfence.done()
        # unfenced in the speculative image, but its answer depends on the uncommitted unfence record
        assert _lane(controller).answer(_beat(101, epoch)) is None
        raft.release()
        assert not (await asyncio.wait_for(unfence, 5.0)).is_fenced
        assert _lane(controller).answer(_beat(101, epoch)) is not None
    finally:
        await controller.stop()


async def test_a_lapsed_lease_goes_the_normal_path() -> None:
    raft, controller, clock, lease = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        assert _lane(controller).answer(_beat(101, epoch)) is not None
        clock.advance(LEASE_MS)  # the published lease ends now: its end is not inside it
        assert _lane(controller).answer(_beat(101, epoch)) is None
        lease.expiry_ms = -1  # no lease at all
        controller._event_ran("test", 0)  # (what every event's end republishes)
        assert _lane(controller).answer(_beat(101, epoch)) is None
        lease.hold()
        controller._event_ran("test", 0)
        assert _lane(controller).answer(_beat(101, epoch)) is not None
        raft.lose_leadership(2)  # a leader change takes the snapshot away at once, lease or not
        await settle()
        assert _lane(controller).answer(_beat(101, epoch)) is None
    finally:
        await controller.stop()


async def test_fast_answers_keep_asking_raft_for_the_lease() -> None:
    """Without slow-path heartbeats the lease in use is renewed only if Raft sees lease callers."""
    raft, controller, clock, _ = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        asked = raft.lease_asks
        assert _lane(controller).answer(_beat(101, epoch)) is not None
        await settle()
        assert raft.lease_asks == asked + 1, "the first fast answer posts a lease note"
        for _ in range(5):  # within one note interval: no more notes
            assert _lane(controller).answer(_beat(101, epoch)) is not None
        await settle()
        assert raft.lease_asks == asked + 1
        clock.advance(LEASE_MS // 8)
        assert _lane(controller).answer(_beat(101, epoch)) is not None
        await settle()
        assert raft.lease_asks == asked + 2
    finally:
        await controller.stop()


async def test_a_touch_is_seen_before_the_session_expiry_check() -> None:
    _, controller, clock, lease = await _controller()
    try:
        epoch = await _unfenced(controller, 101)  # last main-loop contact: now
        _lane(controller).bind(None)  # no lease notes: they would take the touches first
        clock.advance(SESSION_MS // 2)
        lease.hold()
        controller._event_ran("test", 0)
        assert _lane(controller).answer(_beat(101, epoch)) is not None  # a touch at SESSION_MS / 2
        clock.advance(SESSION_MS // 2 + 100)  # past the main loop's contact + session, not the touch's
        logic = controller.logic
        assert logic is not None
        rebuilds = _lane(controller).rebuilds
        timed_out = controller.metrics.timed_out_broker_heartbeats._value.get()  # (a per-process series)
        await controller.sessions._fence_expired(logic, clock.now_ms)
        assert not controller.committed.brokers[101].fenced
        assert controller.metrics.timed_out_broker_heartbeats._value.get() == timed_out
        # the touch was taken first: 101 was never a candidate, never taken out of the snapshot
        assert _lane(controller).rebuilds == rebuilds
        # and without any heartbeat for a whole session it is fenced as ever
        clock.advance(SESSION_MS + 1)
        await controller.sessions._fence_expired(logic, clock.now_ms)
        assert controller.committed.brokers[101].fenced
    finally:
        await controller.stop()


async def test_a_heartbeat_answered_while_the_check_takes_the_broker_out_is_seen() -> None:
    """The race of the expiry check with the intake: an answer from the snapshot before the broker left it
    recorded its touch before, so the check's second drain sees it; an answer after it left fails."""
    _, controller, clock, lease = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        clock.advance(SESSION_MS + 100)
        lease.hold()
        controller._event_ran("test", 0)
        lane = _lane(controller)
        unpublish = lane.unpublish
        raced: list[cpb.BrokerHeartbeatResponse | None] = []

        def intake_gets_in_first(broker_id: int) -> None:
            raced.append(lane.answer(_beat(broker_id, epoch)))  # the intake thread, just before
            unpublish(broker_id)
            raced.append(lane.answer(_beat(broker_id, epoch)))  # and just after

        lane.unpublish = intake_gets_in_first
        controller.sessions.leave_steady = intake_gets_in_first
        logic = controller.logic
        assert logic is not None
        await controller.sessions._fence_expired(logic, clock.now_ms)
        assert raced[0] is not None and raced[1] is None
        assert not controller.committed.brokers[101].fenced, "fenced although its heartbeat was answered"
        # taken out only for the check: republished after it, steady again
        assert lane.answer(_beat(101, epoch)) is not None
    finally:
        await controller.stop()


async def test_a_broker_taken_out_between_the_touch_and_the_answer_is_not_answered() -> None:
    """The intake's other half of that race: the main loop takes the broker out and drains right after
    the intake read the snapshot, before its touch landed — the intake's second read fails, no answer."""
    _, controller, _, _ = await _controller()
    try:
        epoch = await _unfenced(controller, 101)
        lane = _lane(controller)
        drained: list[Any] = []

        class MainLoopGetsIn(collections.deque[Any]):
            def append(self, touch: Any) -> None:
                lane.unpublish(101)  # the expiry check, between the intake's first read and its touch
                drained.extend(lane.drain())
                super().append(touch)

        lane._touches = MainLoopGetsIn()
        assert lane.answer(_beat(101, epoch)) is None
        assert drained == [] and lane.answered == 0
    finally:
        await controller.stop()


async def test_a_fence_a_shutdown_or_a_new_registration_makes_the_next_heartbeat_slow() -> None:
    raft, controller, clock, lease = await _controller()
    try:
        lane = _lane(controller)
        epochs = {b: await _unfenced(controller, b) for b in (101, 102, 103, 104)}
        assert all(lane.answer(_beat(b, e)) is not None for b, e in epochs.items())
        # 101 asks to be fenced (normal path): out of the snapshot when that event ends, not at the commit
        raft.hold_commits = True
        fencing = asyncio.create_task(controller.broker_heartbeat(_beat(101, epochs[101], want_fence=True)))
        await until(lambda: controller.writes.next_offset > controller.committed.offset + 1)
        assert not fencing.done()
        assert lane.answer(_beat(101, epochs[101])) is None
        assert lane.answer(_beat(102, epochs[102])) is not None
        raft.release()
        assert (await asyncio.wait_for(fencing, 5.0)).is_fenced
        assert lane.answer(_beat(101, epochs[101])) is None
        # 102 shuts down (controlled shutdown: no leaderships, so it is fenced at once)
        await controller.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=102))
        assert lane.answer(_beat(102, epochs[102])) is None
        # 103 registers again: a new epoch, fenced; the old epoch is stale
        replacing = registration(103, "inc-103-b")
        replacing.previous_incarnation_id = "inc-103"  # (a restart: the live session does not refuse it)
        again = await controller.register_broker(replacing)
        assert again.error_code == ErrorCode.NONE
        assert lane.answer(_beat(103, epochs[103])) is None
        assert lane.answer(_beat(103, again.broker_epoch)) is None
        # 104's session expires (main loop only): fenced, and slow from then on
        clock.advance(SESSION_MS + 1)
        lease.hold()
        logic = controller.logic
        assert logic is not None
        await controller.sessions._fence_expired(logic, clock.now_ms)
        assert controller.committed.brokers[104].fenced
        assert lane.answer(_beat(104, epochs[104])) is None
        # the normal path answers them as before
        slow = await controller.broker_heartbeat(_beat(103, epochs[103]))
        assert slow.error_code == ErrorCode.STALE_BROKER_EPOCH
    finally:
        await controller.stop()


async def test_switched_off_there_is_no_lane() -> None:
    _, controller, _, _ = await _controller(lane=False)
    try:
        assert controller.lane is None
        await _unfenced(controller, 101)
    finally:
        await controller.stop()


@pytest.mark.usefixtures("tls_identities")
async def test_acl_decisions_are_unchanged() -> None:
    """Through the bridge: a caller is answered by the lane only when the guard would let it through —
    identity binding checked on the spot, an ACL decision only from a grant the main loop's guard made
    under the ACLs in force; refusals come from the normal path as before."""
    _, controller, _, _ = await _controller()
    settings = AuthorizerSettings(enabled=True, super_users=frozenset({"User:CN=admin,O=kraft"}))
    servicer = ControllerServicer(controller, authorizer=settings)
    try:
        epoch = await _unfenced(controller, 101)
        bridge = HeartbeatBridge(asyncio.get_running_loop(), lambda: servicer.guard, lambda: controller)
        lane = _lane(controller)

        async def call(caller: str, broker_id: int = 101) -> Any:
            try:
                context: Any = CallContext(caller)
                return await asyncio.wait_for(bridge.heartbeat(_beat(broker_id, epoch), context), 5.0)
            except Aborted as refused:
                return refused

        for caller in ("stranger", "broker-101"):  # not a node principal; no CLUSTER_ACTION ACL
            refused = await call(caller)
            assert isinstance(refused, Aborted) and refused.code == grpc.StatusCode.PERMISSION_DENIED
        assert lane.answered == 0
        first = await call("admin")  # no grant yet: the guard decides on main, and grants it
        assert isinstance(first, cpb.BrokerHeartbeatResponse) and first.error_code == ErrorCode.NONE
        assert (lane.answered, bridge.calls) == (0, 3)
        second = await call("admin")
        assert second == first and (lane.answered, bridge.calls) == (1, 3)
        # the ACLs change: no grant holds until the guard decided again
        controller.state.committed = dataclasses.replace(controller.state.committed, acls={})
        third = await call("admin")
        assert third == first and (lane.answered, bridge.calls) == (1, 4)
        # identity binding: broker-101 speaking for 102 is refused by the normal path, never answered here
        refused = await call("broker-101", broker_id=102)
        assert isinstance(refused, Aborted) and refused.code == grpc.StatusCode.PERMISSION_DENIED
        assert refused.details.startswith("CLUSTER_AUTHORIZATION_FAILED")
        # without an authorizer: the identity binding alone, on the intake
        open_servicer = ControllerServicer(controller)
        open_bridge = HeartbeatBridge(
            asyncio.get_running_loop(), lambda: open_servicer.guard, lambda: controller
        )
        answered = lane.answered
        plain = await open_bridge.heartbeat(_beat(101, epoch), CallContext("broker-101"))  # type: ignore[arg-type]
        assert plain.error_code == ErrorCode.NONE and lane.answered == answered + 1
        with pytest.raises(Aborted):
            await open_bridge.heartbeat(_beat(101, epoch), CallContext("broker-102"))  # type: ignore[arg-type]
        assert lane.answered == answered + 1
    finally:
        await controller.stop()
