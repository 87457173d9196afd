"""`broker_session_expired` says why: how long the broker was silent, the session timeout, what it had
applied and how many leaderships the fence moves (docs/operations.md)."""

from __future__ import annotations

import logging

import pytest

from kraft.metadata.controller import ControllerOptions
from kraft.observability.logging import KeyValueFormatter
from kraft.v1 import controller_pb2 as cpb

from .test_controller import CLUSTER, activate_broker, manual_clock, started, step, until


async def test_the_session_expiry_line_carries_heartbeat_age_timeout_and_leaderships(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="kraft")
    raft, controller = await started(ControllerOptions(noop_interval_ms=0, session_timeout_ms=400))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        await activate_broker(controller, 1)
        topic = cpb.CreatableTopic(name="orders", num_partitions=3, replication_factor=1)
        created = await controller.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]))
        assert created.topics[0].error_code == 0
        silent_since = manual_clock(controller).now_ms
        while not controller.committed.brokers[1].fenced:
            await step(controller, 50)
            assert manual_clock(controller).now_ms - silent_since < 2_000
        formatter = KeyValueFormatter()
        lines = [formatter.format(r) for r in caplog.records if "broker_session_expired" in r.getMessage()]
        assert len(lines) == 1, lines
        line = lines[0]
        assert "level=warning" in line and "broker=1" in line
        assert "session_timeout_ms=400" in line and "leaderships_to_move=3" in line
        age = int(line.split("last_heartbeat_ms_ago=")[1].split()[0])
        assert 400 < age <= 500, line
    finally:
        await controller.stop()
