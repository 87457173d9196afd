"""The heartbeat fast lane (controller.broker.heartbeats.fast.lane) with a real controller quorum and a real
broker process: the broker is registered, unfenced and kept unfenced by heartbeats the intake thread
answers (no false fencing over several session timeouts), a killed broker is still fenced after its
session timeout (an answered heartbeat never stands in for a missing one), and restarted it is unfenced
again.  The same with every connection through an intake process (``controller.intake.exclusive``): the
heartbeats then reach the leader inside CallBatch messages, and the lane answers them there
(kraft/node/batch_lane.py), counted in ``kraft_controller_heartbeats_fast_lane_total``.  Bounded: every wait
polls a condition with a deadline; processes are killed in finalizers."""

from __future__ import annotations

import re
import shutil
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from test_broker_cluster import WAIT_S, Cluster, poll

from kraft.client.channel import open_blocking_channel
from kraft.cluster.quorum import ControllerQuorum
from kraft.errors import ErrorCode
from kraft.netutil import free_port
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc as cpb_grpc

pytestmark = pytest.mark.integration

SESSION_MS = 3000
HEARTBEAT_MS = 250


@dataclass
class _ScrapedQuorum(ControllerQuorum):
    """A quorum whose nodes serve their metrics (each on a port of its own)."""

    metrics_ports: dict[int, int] = field(default_factory=dict)

    def config_text(self, node_id: int) -> str:
        port = self.metrics_ports.setdefault(node_id, free_port())
        return super().config_text(node_id) + f"metrics.port={port}\nmetrics.host=127.0.0.1\n"

    def fast_lane_answers(self) -> int:
        """``kraft_controller_heartbeats_fast_lane_total`` summed over the nodes that answer a scrape."""
        return self.scraped_total("kraft_controller_heartbeats_fast_lane_total")

    def scraped_total(self, name: str) -> int:
        """Counter ``name`` summed over every label set of the nodes that answer a scrape."""
        total = 0
        for port in self.metrics_ports.values():
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2.0) as page:
                    text = page.read().decode()
            except OSError:  # a node not up (yet): it answered nothing
                continue
            for value in re.findall(rf"^{re.escape(name)}\{{[^}}]*\}} (\S+)$", text, re.M):
                total += int(float(value))
        return total


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    yield from _cluster(tmp_path, {})


@pytest.fixture
def intake_cluster() -> Iterator[Cluster]:
    # a short base directory: the intake socket path must fit a unix socket's 107 bytes (pytest's don't)
    base = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))
    try:
        intake = {"controller.intake.processes": "1", "controller.intake.exclusive": "true"}
        yield from _cluster(base, intake)
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _cluster(tmp_path: Path, extra: dict[str, str]) -> Iterator[Cluster]:
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
        **extra,
    }
    with _ScrapedQuorum(tmp_path / "quorum", size=3, overrides=overrides, test_append=False) as quorum:
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
    _kept_alive_then_fenced(cluster)


def test_through_intake_processes_batched_heartbeats_use_the_lane_and_a_dead_broker_is_fenced(
    intake_cluster: Cluster,
) -> None:
    # exclusive: the broker's heartbeats reach the leader only inside its intake process's CallBatch messages
    _kept_alive_then_fenced(intake_cluster)


def _kept_alive_then_fenced(cluster: Cluster) -> None:
    quorum = cluster.quorum
    assert isinstance(quorum, _ScrapedQuorum)
    broker = cluster.start_broker(201)
    before = cluster.wait_broker_state(201, "RUNNING")
    # the leader answers its steady heartbeats on the intake thread
    poll(lambda: _fast_lane_logs(cluster) > 0 or None, "the leader to serve the heartbeat fast lane")
    poll(lambda: quorum.fast_lane_answers() > 0 or None, "fast-lane answers to be counted")
    counted = quorum.fast_lane_answers()
    # no false fencing: three session timeouts on fast-lane heartbeats alone
    watched_until = time.monotonic() + 3 * SESSION_MS / 1000
    while time.monotonic() < watched_until:
        assert cluster.controller_state(201) == "ACTIVE"
        time.sleep(0.2)
    # ~12 heartbeats in three session timeouts: most of them answered by the lane
    assert quorum.fast_lane_answers() >= counted + 3
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


def test_a_broker_heartbeats_over_one_stream_and_reopens_it_to_a_new_leader(cluster: Cluster) -> None:
    """broker.heartbeat.stream (the default): the broker's heartbeats go over one BrokerHeartbeatStream,
    answered by the lane; the leader killed, the broker opens a stream to the new one, stays unfenced under
    it, and its heartbeats there are answered over the stream too (kraft/client/heartbeat_stream.py)."""
    _streams_across_a_leader_change(cluster)


def test_through_intake_processes_the_heartbeat_stream_is_proxied_and_answered_by_the_lane(
    intake_cluster: Cluster,
) -> None:
    # exclusive: the stream reaches the leader only through its intake process (Proxy, byte for byte)
    _streams_across_a_leader_change(intake_cluster)
    # the intake processes count the heartbeats, not only the streams: one proxied call per stream, one
    # answer per heartbeat (their counters reach the node's endpoint every 5 s)
    quorum = intake_cluster.quorum
    assert isinstance(quorum, _ScrapedQuorum)
    poll(
        lambda: quorum.scraped_total("kraft_intake_proxied_answers_total") >= 3 or None,
        "the intake processes' proxied answers to count each streamed heartbeat",
    )


def _streams_across_a_leader_change(cluster: Cluster) -> None:
    quorum = cluster.quorum
    assert isinstance(quorum, _ScrapedQuorum)
    broker = cluster.start_broker(211)
    before = cluster.wait_broker_state(211, "RUNNING")
    leader = quorum.wait_for_leader(WAIT_S)
    opened = poll(
        lambda: broker.log_text().count("event=heartbeat_stream_opened") or None, "a heartbeat stream"
    )
    poll(lambda: quorum.fast_lane_answers() > 0 or None, "fast-lane answers to be counted")
    # one stream carries the heartbeats: no other opened over two session timeouts
    time.sleep(2 * SESSION_MS / 1000)
    assert broker.log_text().count("event=heartbeat_stream_opened") == opened
    assert "heartbeat_stream_unsupported" not in broker.log_text()
    # a follower answers a stream's message NOT_CONTROLLER, naming the leader (the broker re-opens there)
    follower = next(node for node_id, node in quorum.nodes.items() if node_id != leader.node_id)
    with open_blocking_channel(follower.target) as channel:
        beat = cpb.BrokerHeartbeatRequest(
            cluster_id=quorum.cluster_id, broker_id=211, broker_epoch=before.broker_epoch
        )
        answers = list(
            cpb_grpc.ControllerServiceStub(channel).BrokerHeartbeatStream(iter([beat]), timeout=10)
        )
    assert [a.error_code for a in answers] == [ErrorCode.NOT_CONTROLLER]
    assert answers[0].controller.node_id == leader.node_id

    quorum.kill(leader.node_id)
    new = quorum.wait_for_leader(WAIT_S, exclude=[leader.node_id])
    poll(
        lambda: f"controller={quorum.nodes[new.node_id].target}" in _opened_lines(broker.log_text()) or None,
        "a heartbeat stream to the new leader",
    )
    counted = quorum.fast_lane_answers()  # the survivors' counters only (the killed one is not scraped)
    watched_until = time.monotonic() + 2 * SESSION_MS / 1000
    while time.monotonic() < watched_until:
        described = cluster.describe_broker(211)
        assert described is not None and not described.fenced, broker.log_tail()
        time.sleep(0.2)
    assert cluster.controller_state(211) == "ACTIVE"
    assert "fenced_by_controller" not in broker.log_text()
    assert quorum.fast_lane_answers() >= counted + 3, "the new leader answers the streamed heartbeats"
    after = cluster.describe_broker(211)
    assert after is not None and after.broker_epoch == before.broker_epoch


def _opened_lines(log: str) -> str:
    return "\n".join(line for line in log.splitlines() if "event=heartbeat_stream_opened" in line)
