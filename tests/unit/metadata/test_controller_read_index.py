"""The active controller answers a heartbeat that changes nothing only after Raft confirmed its leadership
(a ReadIndex round started after the heartbeat arrived): a deposed controller that does not know it yet
cannot extend a broker's session that the new controller may already have fenced."""

from __future__ import annotations

import asyncio

from google.protobuf.message import Message

from kraft.errors import ErrorCode
from kraft.metadata.controller import ControllerOptions
from kraft.security.acl import AclOperation, AclPermissionType, PatternType, ResourceType
from kraft.v1 import controller_pb2 as cpb

from .test_controller import CLUSTER, activate_broker, registration, settle, started, step, until


def _beat(broker_id: int, epoch: int) -> cpb.BrokerHeartbeatRequest:
    return cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER, broker_id=broker_id, broker_epoch=epoch, current_metadata_offset=epoch
    )


async def test_an_unchanged_heartbeat_is_answered_only_after_leadership_is_confirmed() -> None:
    raft, controller = await started(ControllerOptions(noop_interval_ms=0))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epoch = await activate_broker(controller, 1)
        raft.hold_confirmations = True
        before = raft.confirmations
        pending = asyncio.create_task(controller.broker_heartbeat(_beat(1, epoch)))
        await settle()
        assert not pending.done() and raft.confirmations == before + 1
        # Asked with the lease allowed (issue #17): Raft answers at once while its lease holds.
        assert raft.lease_asks == raft.confirmations
        raft.confirm()
        answer = await asyncio.wait_for(pending, 5)
        assert answer.error_code == ErrorCode.NONE and not answer.is_fenced
        # A registration that changes something is confirmed by its commit, not by a round.
        before = raft.confirmations
        registered = await controller.register_broker(registration(2))
        assert registered.error_code == ErrorCode.NONE and raft.confirmations == before
    finally:
        await controller.stop()


async def test_a_heartbeat_waiting_for_confirmation_answers_not_controller_when_leadership_is_lost() -> None:
    raft, controller = await started(ControllerOptions(noop_interval_ms=0))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epoch = await activate_broker(controller, 1)
        raft.hold_confirmations = True
        pending = asyncio.create_task(controller.broker_heartbeat(_beat(1, epoch)))
        await settle()
        assert not pending.done()
        raft.lose_leadership(2)
        answer = await asyncio.wait_for(pending, 5)
        assert answer.error_code == ErrorCode.NOT_CONTROLLER
    finally:
        await controller.stop()


async def test_a_heartbeat_not_confirmed_within_the_commit_timeout_is_retriable() -> None:
    raft, controller = await started(ControllerOptions(noop_interval_ms=0, commit_timeout_ms=100))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epoch = await activate_broker(controller, 1)
        raft.hold_confirmations = True  # e.g. partitioned from the majority, check-quorum not yet over
        pending = asyncio.create_task(controller.broker_heartbeat(_beat(1, epoch)))
        await settle()
        await step(controller, 99)
        assert not pending.done()
        await step(controller, 1)
        answer = await asyncio.wait_for(pending, 5)
        assert answer.error_code == ErrorCode.REQUEST_TIMED_OUT
        assert "did not confirm" in answer.error_message
        raft.confirm()  # a majority answers again
        assert (await controller.broker_heartbeat(_beat(1, epoch))).error_code == ErrorCode.NONE
    finally:
        await controller.stop()


async def test_the_round_runs_while_the_heartbeat_still_waits_for_its_brokers_record_to_commit() -> None:
    """Commit wait and leadership round overlap (issue #17): an unchanged heartbeat that depends on its
    broker's uncommitted record (the unfencing just before it) asks for its round at once, and is
    answered only when both the commit and the round are done."""
    raft, controller = await started(ControllerOptions(noop_interval_ms=0))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epoch = (await controller.register_broker(registration(1))).broker_epoch
        raft.hold_commits = True  # a slow quorum: the unfencing below stays uncommitted
        raft.hold_confirmations = True
        unfencing = asyncio.create_task(controller.broker_heartbeat(_beat(1, epoch)))
        await settle()
        assert not unfencing.done()
        before = raft.confirmations
        pending = asyncio.create_task(controller.broker_heartbeat(_beat(1, epoch)))  # changes nothing now
        await settle()
        assert not pending.done() and raft.confirmations == before + 1  # asked before the commit
        raft.confirm()
        await settle()
        assert not pending.done()  # confirmed, but the unfencing it depends on is not committed
        raft.release()
        answer = await asyncio.wait_for(pending, 5)
        assert answer.error_code == ErrorCode.NONE and not answer.is_fenced
        assert not (await asyncio.wait_for(unfencing, 5)).is_fenced
    finally:
        await controller.stop()


async def test_a_heartbeat_whose_commit_wait_fails_ends_its_round_wait() -> None:
    raft, controller = await started(ControllerOptions(noop_interval_ms=0))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epoch = (await controller.register_broker(registration(1))).broker_epoch
        raft.hold_commits = True
        raft.hold_confirmations = True
        unfencing = asyncio.create_task(controller.broker_heartbeat(_beat(1, epoch)))
        await settle()
        pending = asyncio.create_task(controller.broker_heartbeat(_beat(1, epoch)))
        await settle()
        assert raft.confirmations >= 1 and not pending.done()
        raft.lose_leadership(2)  # the uncommitted unfencing is truncated; the round fails too
        answer = await asyncio.wait_for(pending, 5)
        assert answer.error_code == ErrorCode.NOT_CONTROLLER
        await asyncio.wait_for(unfencing, 5)
    finally:
        await controller.stop()


async def test_the_round_is_asked_for_in_the_heartbeats_own_step() -> None:
    """No task between the heartbeat and Raft (issue #17): the round starts in the step that ran the
    heartbeat's event, not loop turns later — under bulk work every turn of the loop is long."""
    raft, controller = await started(ControllerOptions(noop_interval_ms=0))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        epoch = await activate_broker(controller, 1)
        raft.hold_confirmations = True
        before = raft.confirmations
        pending = asyncio.create_task(controller.broker_heartbeat(_beat(1, epoch)))
        await asyncio.sleep(0)  # the heartbeat's task runs its first step, and nothing it scheduled yet
        assert raft.confirmations == before + 1 and not pending.done()
        raft.confirm()
        answer = await asyncio.wait_for(pending, 5)
        assert answer.error_code == ErrorCode.NONE and not answer.is_fenced
    finally:
        await controller.stop()


def _reads() -> list[tuple[str, Message]]:
    """Every read the active controller serves from its image, as (name, request)."""
    return [
        ("describe_topics", cpb.DescribeTopicsRequest(cluster_id=CLUSTER)),
        ("describe_cluster", cpb.DescribeClusterRequest(cluster_id=CLUSTER)),
        ("describe_configs", cpb.DescribeConfigsRequest(cluster_id=CLUSTER)),
        (
            "describe_acls",
            cpb.DescribeAclsRequest(
                cluster_id=CLUSTER,
                filter=cpb.AclFilter(
                    resource_type=ResourceType.ANY,
                    pattern_type=PatternType.ANY,
                    operation=AclOperation.ANY,
                    permission_type=AclPermissionType.ANY,
                ),
            ),
        ),
    ]


async def test_reads_are_answered_only_after_leadership_is_confirmed() -> None:
    """ReadIndex for reads too: a deposed controller must not describe an image the new one moved on from."""
    raft, controller = await started(ControllerOptions(noop_interval_ms=0))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        await activate_broker(controller, 1)
        for name, request in _reads():
            raft.hold_confirmations = True
            before = raft.confirmations
            pending = asyncio.create_task(getattr(controller, name)(request))
            await settle()
            assert not pending.done(), f"{name} answered before leadership was confirmed"
            assert raft.confirmations == before + 1, name
            raft.confirm()
            answer = await asyncio.wait_for(pending, 5)
            assert answer.error_code == ErrorCode.NONE, (name, answer.error_message)
    finally:
        await controller.stop()


async def test_a_read_waiting_for_confirmation_answers_not_controller_when_leadership_is_lost() -> None:
    raft, controller = await started(ControllerOptions(noop_interval_ms=0))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        raft.hold_confirmations = True
        pending = asyncio.create_task(
            controller.describe_cluster(cpb.DescribeClusterRequest(cluster_id=CLUSTER))
        )
        await settle()
        assert not pending.done()
        raft.lose_leadership(2)
        answer = await asyncio.wait_for(pending, 5)
        assert answer.error_code == ErrorCode.NOT_CONTROLLER
        assert answer.controller.node_id == 2
    finally:
        await controller.stop()


async def test_a_read_not_confirmed_within_the_commit_timeout_is_retriable() -> None:
    raft, controller = await started(ControllerOptions(noop_interval_ms=0, commit_timeout_ms=100))
    try:
        raft.elect()
        await until(lambda: controller.is_active)
        raft.hold_confirmations = True
        pending = asyncio.create_task(
            controller.describe_topics(cpb.DescribeTopicsRequest(cluster_id=CLUSTER))
        )
        await settle()
        await step(controller, 100)
        answer = await asyncio.wait_for(pending, 5)
        assert answer.error_code == ErrorCode.REQUEST_TIMED_OUT
        assert "did not confirm" in answer.error_message
        raft.confirm()
        again = await controller.describe_topics(cpb.DescribeTopicsRequest(cluster_id=CLUSTER))
        assert again.error_code == ErrorCode.NONE
    finally:
        await controller.stop()
