"""AlterPartition on the controller (kraft.metadata.isr_changes): validation order, record shape, replay."""

from __future__ import annotations

import pytest

from kraft.errors import ErrorCode
from kraft.metadata.isr_changes import alter_partition
from kraft.metadata.rejoin_index import RejoinIndex
from kraft.v1 import controller_pb2 as cpb

from .test_controller_logic import CLUSTER, Harness


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.active_brokers(1, 2, 3)
    assignment = cpb.ReplicaAssignment(partition=0, broker_ids=[1, 2, 3])
    assert harness.create("t", partitions=-1, rf=-1, assignments=[assignment]).error_code == ErrorCode.NONE
    return harness


def _request(
    h: Harness,
    isr: list[int],
    *,
    broker_id: int = 1,
    broker_epoch: int | None = None,
    leader_epoch: int | None = None,
    partition_epoch: int | None = None,
    member_epochs: dict[int, int] | None = None,
) -> cpb.AlterPartitionRequest:
    topic = h.topic("t")
    partition = topic.partitions[0]
    epochs = member_epochs or {}
    return cpb.AlterPartitionRequest(
        cluster_id=CLUSTER,
        broker_id=broker_id,
        broker_epoch=h.image.brokers[broker_id].epoch if broker_epoch is None else broker_epoch,
        partitions=[
            cpb.AlterPartitionRequest.PartitionData(
                topic_id=topic.topic_id,
                partition=0,
                leader_epoch=partition.leader_epoch if leader_epoch is None else leader_epoch,
                partition_epoch=partition.partition_epoch if partition_epoch is None else partition_epoch,
                new_isr=[
                    cpb.AlterPartitionRequest.IsrMember(
                        broker_id=b, broker_epoch=epochs.get(b, h.image.brokers[b].epoch)
                    )
                    for b in isr
                ],
            )
        ],
    )


def _send(h: Harness, req: cpb.AlterPartitionRequest) -> cpb.AlterPartitionResponse:
    return h.run(alter_partition(h.logic, req, h.next_offset))


def test_shrink_writes_an_isr_only_change_and_answers_the_replayed_partition(h: Harness) -> None:
    before = h.topic("t").partitions[0]
    assert before.leader == 1 and tuple(before.isr) == (1, 2, 3)
    first = h.next_offset
    response = _send(h, _request(h, [3, 1]))
    assert response.error_code == ErrorCode.NONE
    [result] = response.partitions
    assert result.error_code == ErrorCode.NONE
    [record] = h.log[first:]
    change = record.partition_change
    assert change.HasField("isr") and list(change.isr.ids) == [1, 3]  # replica order
    assert not change.HasField("leader"), "an ISR change must not run an election"
    assert not change.HasField("replicas")
    after = h.topic("t").partitions[0]
    assert after.leader == 1 and tuple(after.isr) == (1, 3)
    assert after.partition_epoch == before.partition_epoch + 1
    assert after.leader_epoch == before.leader_epoch + 1  # kraft bumps both on every change (documented)
    assert (result.leader, result.leader_epoch, result.partition_epoch) == (
        1,
        after.leader_epoch,
        after.partition_epoch,
    )
    assert list(result.isr) == [1, 3]


def test_a_leader_that_is_not_the_preferred_one_keeps_leading(h: Harness) -> None:
    _send(h, _request(h, [1, 2]))  # 3 leaves
    h.heartbeat(1, want_fence=True)  # 1 (preferred) leaves; 2 leads alone
    assert h.topic("t").partitions[0].leader == 2
    first = h.next_offset
    response = _send(h, _request(h, [2, 3], broker_id=2))
    assert response.partitions[0].error_code == ErrorCode.NONE
    [record] = h.log[first:]
    assert not record.partition_change.HasField("leader")
    partition = h.topic("t").partitions[0]
    assert partition.leader == 2 and tuple(partition.isr) == (2, 3)


def test_unchanged_isr_writes_nothing_and_answers_the_partition(h: Harness) -> None:
    before = h.next_offset
    response = _send(h, _request(h, [1, 2, 3]))
    assert h.next_offset == before
    assert response.partitions[0].error_code == ErrorCode.NONE
    assert list(response.partitions[0].isr) == [1, 2, 3]


def test_stale_partition_epoch_is_invalid_update_version(h: Harness) -> None:
    stale = h.topic("t").partitions[0].partition_epoch
    leader_epoch = h.topic("t").partitions[0].leader_epoch
    _send(h, _request(h, [1, 2]))
    before = h.next_offset
    # Same leader epoch as the partition now has, but the partition epoch the ISR was read at is old.
    now = h.topic("t").partitions[0]
    assert now.leader_epoch == leader_epoch + 1
    response = _send(h, _request(h, [1], leader_epoch=now.leader_epoch, partition_epoch=stale))
    assert response.partitions[0].error_code == ErrorCode.INVALID_UPDATE_VERSION
    assert h.next_offset == before


def test_fenced_leader_epoch(h: Harness) -> None:
    old_epoch = h.topic("t").partitions[0].leader_epoch
    _send(h, _request(h, [1, 2]))
    before = h.next_offset
    response = _send(h, _request(h, [1], leader_epoch=old_epoch))
    assert response.partitions[0].error_code == ErrorCode.FENCED_LEADER_EPOCH
    assert h.next_offset == before


def test_request_newer_than_the_controller_is_not_controller(h: Harness) -> None:
    epoch = h.topic("t").partitions[0].leader_epoch
    response = _send(h, _request(h, [1, 2], leader_epoch=epoch + 1))
    assert response.partitions[0].error_code == ErrorCode.NOT_CONTROLLER


@pytest.mark.parametrize("make_ineligible", ["fence", "stale_member_epoch", "shutting_down"])
def test_ineligible_replica(h: Harness, make_ineligible: str) -> None:
    _send(h, _request(h, [1, 2]))  # 3 out of the ISR
    epochs: dict[int, int] = {}
    if make_ineligible == "fence":
        h.heartbeat(3, want_fence=True)
    elif make_ineligible == "stale_member_epoch":
        epochs[3] = h.image.brokers[3].epoch - 1
    else:
        h.heartbeat(3, want_shut_down=True)  # leads nothing: fenced and shut down
    before = h.next_offset
    response = _send(h, _request(h, [1, 2, 3], member_epochs=epochs))
    assert response.partitions[0].error_code == ErrorCode.INELIGIBLE_REPLICA
    assert h.next_offset == before
    assert tuple(h.topic("t").partitions[0].isr) == (1, 2)


def test_requester_not_the_leader_is_invalid_request(h: Harness) -> None:
    response = _send(h, _request(h, [1, 2], broker_id=2))
    assert response.partitions[0].error_code == ErrorCode.INVALID_REQUEST


def test_isr_without_the_leader_or_with_a_non_replica_is_invalid_request(h: Harness) -> None:
    assert _send(h, _request(h, [2, 3])).partitions[0].error_code == ErrorCode.INVALID_REQUEST
    h.active_brokers(4)
    assert _send(h, _request(h, [1, 4])).partitions[0].error_code == ErrorCode.INVALID_REQUEST


def test_stale_requester_epoch_fails_the_whole_request(h: Harness) -> None:
    response = _send(h, _request(h, [1, 2], broker_epoch=h.image.brokers[1].epoch - 1))
    assert response.error_code == ErrorCode.STALE_BROKER_EPOCH
    assert not response.partitions


def test_unknown_partition(h: Harness) -> None:
    req = _request(h, [1, 2])
    req.partitions[0].partition = 7
    assert _send(h, req).partitions[0].error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION


def test_cluster_id_is_required(h: Harness) -> None:
    req = _request(h, [1, 2])
    req.cluster_id = "other"
    assert _send(h, req).error_code == ErrorCode.INCONSISTENT_CLUSTER_ID


def test_an_accepted_change_keeps_the_rejoin_index_on_the_image(h: Harness) -> None:
    # The rejoin index follows the image delta by delta; an AlterPartition that left it behind made it
    # stale, so the next unfence rebuilt it from scratch (in slices) and a running rejoin job scanned.
    h.logic.rejoin_index.rebuild(h.image.topics_by_id)
    assert h.logic.rejoin_index.current_for is h.logic.image.topics_by_id
    response = _send(h, _request(h, [1, 2]))
    assert response.error_code == ErrorCode.NONE and response.partitions[0].error_code == ErrorCode.NONE
    assert h.logic.rejoin_index.current_for is h.logic.image.topics_by_id
    # ...and what it holds is what an index built from the new image holds.
    fresh = RejoinIndex()
    fresh.rebuild(h.image.topics_by_id)
    assert [h.logic.rejoin_index.flagged_count(b) for b in (1, 2, 3)] == [
        fresh.flagged_count(b) for b in (1, 2, 3)
    ]
