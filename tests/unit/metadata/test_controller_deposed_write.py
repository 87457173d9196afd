"""Regression (chaos `pause` seed 28): a deposed controller must never acknowledge a write that a newer
leader overwrote, even when the newer epoch's batch reaches it before the leader change does."""

from __future__ import annotations

import asyncio

from kraft.errors import ErrorCode
from kraft.metadata import records
from kraft.metadata.controller import ControllerOptions
from kraft.raft.api import LeaderAndEpoch
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller import CLUSTER, activate_broker, started, until


async def test_a_write_overwritten_by_a_newer_leader_is_not_acknowledged() -> None:
    raft, controller = await started(ControllerOptions(noop_interval_ms=0, session_timeout_ms=60_000))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        await activate_broker(controller, 1)

        raft.hold_commits = True  # our CreateTopics records stay uncommitted, as on a paused leader
        topic = cpb.CreatableTopic(name="orders", num_partitions=3, replication_factor=1)
        request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])
        pending = asyncio.create_task(controller.create_topics(request))
        await until(lambda: bool(raft._pending))
        overwritten = len(raft._pending)

        # A newer leader truncated our tail and committed its own records at those offsets; its batch is
        # delivered before the leader change (the order a rejoining follower can see).
        raft._pending.clear()
        raft.end_offset = raft.high_watermark
        old = raft.leader_and_epoch
        raft._leader = LeaderAndEpoch(2, old.epoch + 1)
        noop = records.encode_value(pb.MetadataRecord(no_op=pb.NoOpRecord()))
        raft.end_offset += overwritten
        raft._commit_batch([noop] * overwritten)
        raft._broadcast(raft.leader_and_epoch)

        response = await asyncio.wait_for(pending, 5)
        codes = {response.error_code, *(t.error_code for t in response.topics)}
        assert all(topic.error_code != ErrorCode.NONE for topic in response.topics)
        # Appended, then deposed: REQUEST_TIMED_OUT ("outcome unknown"), never NOT_CONTROLLER, which
        # promises that nothing was done and invites a blind resend.
        assert ErrorCode.REQUEST_TIMED_OUT in codes and ErrorCode.NOT_CONTROLLER not in codes
        assert "outcome unknown" in response.error_message
        # The newer leader is not known yet here (its batch came before the leader change): the hint
        # says "unknown" (-1), never this deposed controller itself.
        assert response.HasField("controller") and response.controller.node_id == -1
        assert controller.committed.topic("orders") is None
    finally:
        await controller.stop()
