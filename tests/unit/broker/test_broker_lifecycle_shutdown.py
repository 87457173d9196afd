"""A controlled shutdown does not wait a heartbeat interval for the controller's grant (issue #19: every
SIGTERM took at least broker.heartbeat.interval.ms)."""

from __future__ import annotations

import asyncio
from typing import Any, cast

from kraft.broker.lifecycle import (
    PENDING_SHUTDOWN_INTERVAL_S,
    BrokerLifecycle,
    LifecycleTimings,
    RegistrationInfo,
)
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState
from kraft.client.controller import ControllerClient
from kraft.clock import ManualClock
from kraft.errors import ErrorCode
from kraft.v1 import controller_pb2 as cpb


class GrantOnSecondAsk:
    """Grants the shutdown on the second heartbeat that asks for it (the first only starts it, as the
    controller does: the grant waits for the shutdown record to be committed)."""

    def __init__(self) -> None:
        self.asked = 0
        self.requests: list[Any] = []
        self.active_controller_id = 1
        self.heartbeat_seen = asyncio.Event()

    async def call(self, pick: Any, request: Any, timeout_s: float) -> Any:
        self.requests.append(request)
        if isinstance(request, cpb.RegisterBrokerRequest):
            return cpb.RegisterBrokerResponse(error_code=ErrorCode.NONE, broker_epoch=7)
        self.heartbeat_seen.set()
        if request.want_shut_down:
            self.asked += 1
        return cpb.BrokerHeartbeatResponse(
            error_code=ErrorCode.NONE, is_fenced=False, should_shut_down=self.asked >= 2
        )


async def test_after_asking_the_next_heartbeats_come_quickly_until_granted() -> None:
    status = BrokerStatus(1, "c", session_timeout_ms=9000, clock=ManualClock())
    status.transition(BrokerState.STARTING)
    client = GrantOnSecondAsk()
    timings = LifecycleTimings(heartbeat_interval_s=60.0, request_timeout_s=1.0, registration_timeout_s=5.0)
    info = RegistrationInfo(listeners=(), rack=None, log_dirs=())
    lifecycle = BrokerLifecycle(status, cast(ControllerClient, client), info, timings, caught_up=lambda: True)
    await lifecycle.register()
    assert [(f.name, f.min_supported_version) for f in client.requests[0].features] == [
        ("metadata.version", 1)
    ]
    beats = asyncio.create_task(lifecycle.run_heartbeats())
    # the first (unfencing) heartbeat is out; the next one is a whole interval (60 s) away
    await asyncio.wait_for(client.heartbeat_seen.wait(), 5)
    lifecycle.request_shutdown()
    # Without the short interval the grant would come a heartbeat interval (60 s) later.
    await asyncio.wait_for(lifecycle.shutdown_granted.wait(), 20 * PENDING_SHUTDOWN_INTERVAL_S + 5)
    await asyncio.wait_for(beats, 5)
    assert client.asked == 2
