"""The heartbeat fast lane (controller.broker.heartbeats.fast.lane) with a real controller quorum and a real
broker process: the broker is registered, unfenced and kept unfenced by heartbeats the intake thread
answers (no false fencing over several session timeouts), a killed broker is still fenced after its
session timeout (an answered heartbeat never stands in for a missing one), and restarted it is unfenced
again.  Bounded: every wait polls a condition with a deadline; processes are killed in finalizers."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from test_broker_cluster import WAIT_S, Cluster, poll

from kraft.cluster.quorum import ControllerQuorum

pytestmark = pytest.mark.integration

SESSION_MS = 3000
HEARTBEAT_MS = 250


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    # The lane answers only while the leader lease holds, and the lease is renewed only while a caller
    # asked within the last lease: lease = 0.8 x min(fetch timeout, election timeout / 2) = 400 ms here,
    # so heartbeats every 250 ms keep it (with an election timeout of 500 ms the lease is 200 ms and a
    # lone broker's heartbeats, 250 ms apart, found it lapsed most of the time: the full suite timed out
    # waiting for a fast answer).
    overrides = {
        "controller.quorum.election.timeout.ms": "1000",
        "controller.quorum.fetch.timeout.ms": "1500",
        "controller.quorum.election.backoff.max.ms": "500",
        "controller.quorum.fetch.max.wait.ms": "200",
        "controller.quorum.append.linger.ms": "5",
        "broker.session.timeout.ms": str(SESSION_MS),
        "broker.heartbeat.interval.ms": str(HEARTBEAT_MS),
        "controller.broker.heartbeats.fast.lane": "true",
        "log.level": "INFO",
    }
    with ControllerQuorum(tmp_path / "quorum", size=3, overrides=overrides, test_append=False) as quorum:
        quorum.start()
        quorum.wait_for_leader(WAIT_S)
        c = Cluster(quorum, tmp_path)
        try:
            yield c
        finally:
            c.close_brokers()


def _fast_lane_logs(cluster: Cluster) -> int:
    return sum(
        node.log_path.read_text(errors="replace").count("event=heartbeat_fast_lane_serving")
        for node in cluster.quorum.nodes.values()
        if node.log_path.exists()
    )


def test_a_broker_kept_alive_by_fast_heartbeats_is_still_fenced_when_it_dies(cluster: Cluster) -> None:
    broker = cluster.start_broker(201)
    before = cluster.wait_broker_state(201, "RUNNING")
    # the leader answers its steady heartbeats on the intake thread
    poll(lambda: _fast_lane_logs(cluster) > 0 or None, "the leader to serve the heartbeat fast lane")
    # no false fencing: three session timeouts on fast-lane heartbeats alone
    watched_until = time.monotonic() + 3 * SESSION_MS / 1000
    while time.monotonic() < watched_until:
        assert cluster.controller_state(201) == "ACTIVE"
        time.sleep(0.2)
    described = cluster.describe_broker(201)
    assert described is not None and described.broker_epoch == before.broker_epoch

    broker.kill()
    killed_at = time.monotonic()
    poll(lambda: cluster.controller_state(201) in ("FENCED", "OFFLINE") or None, "broker 201 to be fenced")
    assert time.monotonic() - killed_at >= SESSION_MS / 1000 * 0.5, "not before its session could expire"

    cluster.start_broker(201)
    after = cluster.wait_broker_state(201, "RUNNING")
    assert after.broker_epoch > before.broker_epoch
    poll(lambda: cluster.controller_state(201) == "ACTIVE" or None, "broker 201 to be unfenced again")
