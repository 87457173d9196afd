"""What deadline a broker gives its calls to the controllers (ControllerClient.call's ``timeout_s`` bounds a
whole call, its redirects and resends included; test_controller_client_deadline).

Registration and heartbeats get ``LifecycleTimings.call_deadline_s`` (half the session timeout in a broker:
an answer then still extends the lease past the next heartbeat), not the request timeout that caps one
attempt; a MetadataFetch attempt outlasts its long poll and the call leaves room for one more request."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from broker_fakes import MemoryImageStore, started_publisher

from kraft.broker.fetcher import FetcherTimings, MetadataFetcher
from kraft.broker.lifecycle import BrokerLifecycle, LifecycleTimings, RegistrationInfo
from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState
from kraft.client.controller import ControllerClient
from kraft.clock import ManualClock
from kraft.config import NodeConfig
from kraft.errors import ErrorCode
from kraft.node.broker import BrokerSettings
from kraft.v1 import controller_pb2 as cpb


class RecordingClient:
    """Stands in for ControllerClient: answers at once and records each call's deadline arguments."""

    def __init__(self) -> None:
        self.active_controller_id = 1
        self.deadlines: list[tuple[str, float, float | None]] = []

    async def call(
        self, pick: Any, request: Any, timeout_s: float, *, attempt_timeout_s: float | None = None
    ) -> Any:
        self.deadlines.append((type(request).__name__, timeout_s, attempt_timeout_s))
        if isinstance(request, cpb.RegisterBrokerRequest):
            return cpb.RegisterBrokerResponse(error_code=ErrorCode.NONE, broker_epoch=7)
        if isinstance(request, cpb.BrokerHeartbeatRequest):
            return cpb.BrokerHeartbeatResponse(error_code=ErrorCode.NONE, is_fenced=False)
        return cpb.MetadataFetchResponse(error_code=ErrorCode.NONE, high_watermark=0)


async def test_registration_and_heartbeats_get_the_call_deadline_not_the_request_timeout() -> None:
    clock = ManualClock()
    status = BrokerStatus(1, "c", session_timeout_ms=9000, clock=clock)
    status.transition(BrokerState.STARTING)
    timings = LifecycleTimings(
        heartbeat_interval_s=2.0, request_timeout_s=2.0, registration_timeout_s=60.0, call_deadline_s=4.5
    )
    client = RecordingClient()
    info = RegistrationInfo(listeners=(), rack=None, log_dirs=())
    lifecycle = BrokerLifecycle(status, cast(ControllerClient, client), info, timings, caught_up=lambda: True)
    await lifecycle.register()
    assert await lifecycle._heartbeat_once()
    # The attempt timeout is the client's own (request_timeout_s, set where the broker builds it).
    assert client.deadlines == [
        ("RegisterBrokerRequest", 4.5, None),
        ("BrokerHeartbeatRequest", 4.5, None),
    ]
    assert LifecycleTimings(2.0, 1.5, 60.0).call_timeout_s == 1.5  # unset: one request timeout


async def test_a_metadata_fetch_attempt_outlasts_its_long_poll_and_the_call_one_more_request(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    manager, publisher = await started_publisher(4, tmp_path, MemoryImageStore(), clock)
    client = RecordingClient()
    timings = FetcherTimings(max_wait_ms=500, request_timeout_s=1.0)
    fetcher = MetadataFetcher(
        4, "c", cast(ControllerClient, client), publisher, timings, lambda offset: None, clock=clock
    )
    try:
        assert await fetcher.fetch_once()
        # attempt: the 0.5 s long poll + a request timeout; the call: that + one more request timeout
        assert client.deadlines == [("MetadataFetchRequest", 2.5, 1.5)]
    finally:
        await publisher.flush()
        manager.close()


def test_a_broker_gives_each_call_to_the_controllers_half_its_session_timeout() -> None:
    broker = {
        "process.roles": "broker",
        "node.id": "101",
        "controller.quorum.voters": "1@127.0.0.1:9093",
        "listeners": "PLAINTEXT://127.0.0.1:9092",
        "log.dirs": "/var/kraft/b1",
    }
    assert (
        BrokerSettings.from_config(NodeConfig.from_properties(broker), "c").controller_call_deadline_s == 4.5
    )
    short = NodeConfig.from_properties({**broker, "broker.session.timeout.ms": "3000"})
    assert BrokerSettings.from_config(short, "c").controller_call_deadline_s == 1.5
