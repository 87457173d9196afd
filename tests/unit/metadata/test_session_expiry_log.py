"""`broker_session_expired` says why: how long the broker was silent, the session timeout, what it had
applied and how many leaderships the fence moves (docs/operations.md).  What it had applied is an offset
the metadata log holds, or ``none``: never a claim past the log's end (the controller fleet benchmark's
brokers report 2**50, "everything"; a session-12 bench line printed it as broker_metadata_offset=
1125899906842624)."""

from __future__ import annotations

import logging

import pytest

from kraft.metadata.controller import ControllerOptions, QuorumController
from kraft.metadata.heartbeats import BrokerContact
from kraft.metadata.session_checker import applied_offset_field
from kraft.observability.logging import KeyValueFormatter
from kraft.v1 import controller_pb2 as cpb

from .test_controller import CLUSTER, activate_broker, manual_clock, registration, started, step, until

EVERYTHING = 1 << 50  # what bench/controller_fleet.py's simulated brokers report


async def _register_and_report(controller: QuorumController, broker_id: int, reported: int | None) -> int:
    """Register and unfence ``broker_id`` with a heartbeat reporting ``reported`` (None: its own epoch,
    an offset it really applied); the epoch."""
    if reported is None:
        return await activate_broker(controller, broker_id)
    epoch = (await controller.register_broker(registration(broker_id))).broker_epoch
    beat = await controller.broker_heartbeat(
        cpb.BrokerHeartbeatRequest(
            cluster_id=CLUSTER, broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=reported
        )
    )
    assert not beat.is_fenced and beat.error_code == 0
    return epoch


@pytest.mark.parametrize("reported", [None, EVERYTHING], ids=["applied-offset", "claim-past-the-log"])
async def test_the_session_expiry_line_carries_heartbeat_age_timeout_and_leaderships(
    caplog: pytest.LogCaptureFixture, reported: int | None
) -> None:
    caplog.set_level(logging.INFO, logger="kraft")
    raft, controller = await started(ControllerOptions(noop_interval_ms=0, session_timeout_ms=400))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epoch = await _register_and_report(controller, 1, reported)
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
        applied = line.split("broker_metadata_offset=")[1].split()[0]
        assert applied == ("none" if reported == EVERYTHING else str(epoch)), line
    finally:
        await controller.stop()


def test_the_applied_offset_field_shows_only_offsets_the_log_holds() -> None:
    assert applied_offset_field(None, 10) == "none"  # no contact at all
    assert applied_offset_field(BrokerContact(0), 10) == "none"  # never reported one (-1)
    assert applied_offset_field(BrokerContact(0, metadata_offset=0), 10) == 0
    assert applied_offset_field(BrokerContact(0, metadata_offset=9), 10) == 9  # the last record
    assert applied_offset_field(BrokerContact(0, metadata_offset=10), 10) == "none"  # not written yet
    assert applied_offset_field(BrokerContact(0, metadata_offset=EVERYTHING), 10) == "none"
