"""The usable brokers' placement order is computed once per broker set, not per CreateTopics
(``ControllerLogic._placement_order``, issue #17: ordering 1,000 brokers is ~1 ms), and placement is
what ``place_replicas`` gives for the brokers as they are at each request."""

from __future__ import annotations

import pytest

from kraft.errors import ErrorCode
from kraft.metadata import controller_logic, partition_growth, placement
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.metadata.placement import UsableBroker, place_replicas, rack_alternated
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller import CLUSTER
from .test_work_budget import unfenced_brokers


def _create(
    logic: ControllerLogic, log: list[pb.MetadataRecord], name: str, partitions: int, factor: int
) -> cpb.CreatableTopicResult:
    topic = cpb.CreatableTopic(name=name, num_partitions=partitions, replication_factor=factor)
    out = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic]), len(log))
    log.extend(out.records)
    return out.response.topics[0]


def _assignment(logic: ControllerLogic, name: str) -> list[tuple[int, ...]]:
    topic = logic.image.topic(name)
    assert topic is not None
    return [partition.replicas for partition in topic.partitions]


def _expected(logic: ControllerLogic, partitions: int, factor: int, cursor: int) -> list[tuple[int, ...]]:
    usable = [
        UsableBroker(b.broker_id, b.rack)
        for b in logic.image.brokers.values()
        if not b.fenced and not b.in_controlled_shutdown
    ]
    return place_replicas(usable, partitions, factor, cursor)


def test_the_order_is_computed_once_while_the_brokers_stay_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    logic = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    log = unfenced_brokers(logic, ["a", "b", "a", "c", None])
    calls: list[int] = []
    original = rack_alternated

    def counted(brokers: list[UsableBroker]) -> list[UsableBroker]:
        calls.append(len(brokers))
        return original(brokers)

    # (wherever it is called from: the logic's placement or placement.place_replicas)
    monkeypatch.setattr(controller_logic, "rack_alternated", counted)
    monkeypatch.setattr(placement, "rack_alternated", counted)
    orderings = []
    for index in range(20):
        cursor = logic.image.partition_count()
        before = len(calls)
        created = _create(logic, log, f"t{index}", 1 + index % 4, 1 + index % 3)
        orderings.append(len(calls) - before)
        assert created.error_code == ErrorCode.NONE
        assert _assignment(logic, f"t{index}") == _expected(logic, 1 + index % 4, 1 + index % 3, cursor)
    assert orderings == [1] + [0] * 19


def test_placement_follows_a_broker_change(monkeypatch: pytest.MonkeyPatch) -> None:
    logic = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    log = unfenced_brokers(logic, [None, None, None])
    assert _create(logic, log, "before", 6, 2).error_code == ErrorCode.NONE
    assert {b for r in _assignment(logic, "before") for b in r} == {1, 2, 3}
    # broker 3 goes into controlled shutdown: no longer usable for new partitions
    out = logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=3), len(log))
    log.extend(out.records)
    while logic.has_bulk_jobs():
        log.extend(logic.continue_bulk_jobs(len(log)))
    assert logic.image.brokers[3].in_controlled_shutdown
    cursor = logic.image.partition_count()
    assert _create(logic, log, "after", 6, 2).error_code == ErrorCode.NONE
    assert _assignment(logic, "after") == _expected(logic, 6, 2, cursor)
    assert {b for r in _assignment(logic, "after") for b in r} == {1, 2}
    # and a newly registered, unfenced broker is placed on at once
    more = unfenced_brokers_from(logic, log, 4)
    assert more
    cursor = logic.image.partition_count()
    assert _create(logic, log, "later", 6, 2).error_code == ErrorCode.NONE
    assert _assignment(logic, "later") == _expected(logic, 6, 2, cursor)
    assert 4 in {b for r in _assignment(logic, "later") for b in r}
    # too few usable brokers is refused as before
    refused = _create(logic, log, "wide", 1, 4)
    assert refused.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert "larger than the 3 available" in refused.error_message


def unfenced_brokers_from(logic: ControllerLogic, log: list[pb.MetadataRecord], broker_id: int) -> int:
    """Register and unfence one more broker; the records written."""
    before = len(log)
    request = cpb.RegisterBrokerRequest(cluster_id=CLUSTER, broker_id=broker_id, incarnation_id="i")
    log.extend(logic.register_broker(request, 0, len(log)).records)
    beat = cpb.BrokerHeartbeatRequest(
        cluster_id=CLUSTER,
        broker_id=broker_id,
        broker_epoch=logic.image.brokers[broker_id].epoch,
        current_metadata_offset=len(log),
    )
    log.extend(logic.broker_heartbeat(beat, 0, len(log)).records)
    assert not logic.image.brokers[broker_id].fenced
    return len(log) - before


def test_create_partitions_places_from_the_same_kept_order(monkeypatch: pytest.MonkeyPatch) -> None:
    logic = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    log = unfenced_brokers(logic, ["a", "b", "c", "a"])
    assert _create(logic, log, "grown", 2, 2).error_code == ErrorCode.NONE
    calls: list[int] = []
    original = rack_alternated

    def counted(brokers: list[UsableBroker]) -> list[UsableBroker]:
        calls.append(len(brokers))
        return original(brokers)

    monkeypatch.setattr(controller_logic, "rack_alternated", counted)
    monkeypatch.setattr(placement, "rack_alternated", counted)
    cursor = logic.image.partition_count()
    request = cpb.CreatePartitionsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatePartitionsTopic(name="grown", count=7)]
    )
    out = partition_growth.create_partitions(logic, request, len(log))
    assert out.response.topics[0].error_code == ErrorCode.NONE
    log.extend(out.records)
    assert calls == []  # the order kept since the CreateTopics above (the brokers did not change)
    expected = _expected(logic, 5, 2, cursor)
    assert [tuple(a.broker_ids) for a in out.response.topics[0].assignments] == expected
    assert _assignment(logic, "grown")[2:] == expected
