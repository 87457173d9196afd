"""Per-request work limits (issue #15): refused by shape, before any placement or election work."""

from __future__ import annotations

import pytest

from kraft.errors import ErrorCode, KraftError
from kraft.metadata import controller_logic
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.metadata.request_limits import (
    RequestLimits,
    check_create_topics,
    check_delete_topics,
    check_elect_leaders,
)
from kraft.v1 import controller_pb2 as cpb

CLUSTER = "cluster-L"
LIMITS = RequestLimits(max_topics=5, max_partitions=100)


def _logic(limits: RequestLimits = LIMITS) -> ControllerLogic:
    logic = ControllerLogic(
        ControllerSettings(CLUSTER, request_limits=limits), MetadataImage.empty(), 0, new_topic_id=lambda: "T"
    )
    return logic


def _topics(count: int, partitions: int = 1) -> list[cpb.CreatableTopic]:
    return [
        cpb.CreatableTopic(name=f"t{i}", num_partitions=partitions, replication_factor=1)
        for i in range(count)
    ]


def test_create_topics_counts_topics_partitions_defaults_and_assignments() -> None:
    check_create_topics(cpb.CreateTopicsRequest(topics=_topics(5, 20)), LIMITS, default_partitions=1)
    with pytest.raises(KraftError, match=r"6 topics; the limit is 5 \(max.request.topics\)") as error:
        check_create_topics(cpb.CreateTopicsRequest(topics=_topics(6)), LIMITS, default_partitions=1)
    assert error.value.code is ErrorCode.POLICY_VIOLATION
    with pytest.raises(KraftError, match=r"max\.request\.partitions"):
        check_create_topics(cpb.CreateTopicsRequest(topics=_topics(2, 51)), LIMITS, default_partitions=1)
    defaults = [cpb.CreatableTopic(name=f"d{i}", num_partitions=-1) for i in range(2)]
    with pytest.raises(KraftError, match=r"max\.request\.partitions"):
        check_create_topics(cpb.CreateTopicsRequest(topics=defaults), LIMITS, default_partitions=60)
    assigned = cpb.CreatableTopic(name="a")
    for p in range(101):
        assigned.assignments.add(partition=p, broker_ids=[1])
    with pytest.raises(KraftError, match=r"max\.request\.partitions"):
        check_create_topics(cpb.CreateTopicsRequest(topics=[assigned]), LIMITS, default_partitions=1)
    # Negative or zero counts are the logic's INVALID_PARTITIONS, not a way around the sum.
    check_create_topics(
        cpb.CreateTopicsRequest(topics=[*_topics(1, -5), *_topics(1, 100)[0:1]]), LIMITS, default_partitions=1
    )


def test_delete_and_elect_limits() -> None:
    check_delete_topics(cpb.DeleteTopicsRequest(names=["a"] * 5), LIMITS)
    with pytest.raises(KraftError, match="DeleteTopics names 6 topics"):
        check_delete_topics(cpb.DeleteTopicsRequest(names=["a"] * 6), LIMITS)
    listed = cpb.ElectLeadersRequest(topic_partitions=[cpb.TopicPartitions(topic="x", partitions=range(101))])
    with pytest.raises(KraftError, match="ElectLeaders names more than 100 partitions"):
        check_elect_leaders(listed, LIMITS, lambda _: 0)
    whole = cpb.ElectLeadersRequest(topic_partitions=[cpb.TopicPartitions(topic="x")] * 2)
    check_elect_leaders(whole, LIMITS, lambda _: 50)
    with pytest.raises(KraftError, match=r"max\.request\.partitions"):
        check_elect_leaders(whole, LIMITS, lambda _: 51)


def test_validate_only_million_partitions_is_refused_before_placement(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The issue's bomb: a validate_only CreateTopics of 1,000,000 partitions placed them all first."""

    def no_placement(*args: object, **kwargs: object) -> object:
        raise AssertionError("placement ran for a request over the limit")

    monkeypatch.setattr(controller_logic, "place_ordered_range", no_placement)
    logic = _logic(RequestLimits())
    bomb = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER,
        validate_only=True,
        topics=[cpb.CreatableTopic(name="bomb", num_partitions=1_000_000, replication_factor=1)],
    )
    out = logic.create_topics(bomb, 0)
    assert out.records == [] and list(out.response.topics) == []
    assert out.response.error_code == ErrorCode.POLICY_VIOLATION
    assert "max.request.partitions" in out.response.error_message


def test_over_limit_requests_write_nothing() -> None:
    logic = _logic()
    create = logic.create_topics(cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=_topics(6)), 0)
    delete = logic.delete_topics(cpb.DeleteTopicsRequest(cluster_id=CLUSTER, names=["x"] * 6), 0)
    elect = logic.elect_leaders(
        cpb.ElectLeadersRequest(
            cluster_id=CLUSTER, topic_partitions=[cpb.TopicPartitions(topic="x", partitions=range(101))]
        ),
        0,
    )
    for out in (create, delete, elect):
        assert out.records == [] and out.response.error_code == ErrorCode.POLICY_VIOLATION


def test_elect_leaders_results_name_each_topic_once() -> None:
    """The 2.9 GB response: every result repeated a (long) topic name.  Now the name is in the answer
    once per topic entry, and each partition's result is a few bytes."""
    logic = _logic(RequestLimits(max_topics=10, max_partitions=10_000))
    name = "n" * 10_000  # no such topic; a name this long is never valid, but the request may carry one
    request = cpb.ElectLeadersRequest(
        cluster_id=CLUSTER, topic_partitions=[cpb.TopicPartitions(topic=name, partitions=range(10_000))]
    )
    response = logic.elect_leaders(request, 0).response
    assert [group.topic for group in response.topics] == [name]
    results = response.topics[0].partitions
    assert len(results) == 10_000
    assert {r.error_code for r in results} == {ErrorCode.UNKNOWN_TOPIC_OR_PARTITION}
    # Bounded by the request: name once plus ~35 bytes per partition (it was 10,000 copies of the name).
    assert response.ByteSize() < len(name) + 40 * 10_000
    assert response.ByteSize() < request.ByteSize() + 40 * 10_000
