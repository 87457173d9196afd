"""CreatePartitions on the controller (kraft.metadata.partition_growth): grow only, limits before
placement, placement like a new topic's, records that replay into the grown topic and tell each broker
its new replicas."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kraft.errors import ErrorCode
from kraft.metadata.controller_logic import ControllerSettings
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.partition_growth import create_partitions
from kraft.metadata.placement import UsableBroker, place_replicas
from kraft.metadata.request_limits import MAX_PARTITIONS_PER_TOPIC, RequestLimits
from kraft.v1 import controller_pb2 as cpb

from .test_controller_logic import CLUSTER, Harness


@pytest.fixture
def h() -> Harness:
    harness = Harness()
    harness.active_brokers(1, 2, 3)
    return harness


def grow(
    h: Harness, counts: Sequence[tuple[str, int]], validate_only: bool = False, cluster_id: str = CLUSTER
) -> cpb.CreatePartitionsResponse:
    request = cpb.CreatePartitionsRequest(
        cluster_id=cluster_id,
        topics=[cpb.CreatePartitionsTopic(name=n, count=c) for n, c in counts],
        validate_only=validate_only,
    )
    return h.run(create_partitions(h.logic, request, h.next_offset))


def test_growing_a_topic_adds_partitions_with_its_replication_factor_placed_like_creation(h: Harness) -> None:
    assert h.create("orders", partitions=2, rf=2).error_code == ErrorCode.NONE
    before = h.topic("orders").partitions
    usable = [UsableBroker(b, f"r{b % 3}") for b in (1, 2, 3)]
    expected = place_replicas(usable, 3, 2, h.image.partition_count())
    first = h.next_offset
    response = grow(h, [("orders", 5)])
    result = response.topics[0]
    assert result.error_code == ErrorCode.NONE, result
    assert [(a.partition, tuple(a.broker_ids)) for a in result.assignments] == [
        (2 + i, replicas) for i, replicas in enumerate(expected)
    ]
    topic = h.topic("orders")
    assert topic.partitions[:2] == before  # the old partitions are untouched
    assert len(topic.partitions) == 5
    for i, replicas in enumerate(expected):
        partition = topic.partitions[2 + i]
        assert partition.replicas == replicas and partition.isr == replicas
        assert partition.leader == replicas[0]
    # the records replay into the same image on any other node, and tell each broker what to create
    records = h.log[first:]
    assert [r.WhichOneof("record") for r in records] == ["partition"] * 3
    delta = MetadataDelta(MetadataImage.empty())
    for offset, record in enumerate(h.log):
        delta.replay(record, offset)
    assert delta.apply().topic("orders") == topic
    grown = MetadataDelta(_image_before(h, first))
    for offset, record in enumerate(records, start=first):
        grown.replay(record, offset)
    for broker_id in (1, 2, 3):
        local = grown.local_changes(broker_id)
        created = {p.partition_id for p in local.leaders + local.followers}
        assert created == {2 + i for i, r in enumerate(expected) if broker_id in r}
        assert not local.deletes


def _image_before(h: Harness, offset: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for position, record in enumerate(h.log[:offset]):
        delta.replay(record, position)
    return delta.apply()


@pytest.mark.parametrize("count", [0, 1, 2, -1])
def test_a_count_that_does_not_grow_the_topic_is_invalid_partitions_and_writes_nothing(
    h: Harness, count: int
) -> None:
    h.create("orders", partitions=2)
    before = h.next_offset
    result = grow(h, [("orders", count)]).topics[0]
    assert result.error_code == ErrorCode.INVALID_PARTITIONS
    assert "has 2 partitions" in result.error_message and "larger" in result.error_message
    assert h.next_offset == before


def test_per_topic_errors_leave_the_other_topics_growing(h: Harness) -> None:
    h.create("a")
    h.create("b", rf=3)
    response = grow(h, [("a", 3), ("nosuch", 2), ("b", MAX_PARTITIONS_PER_TOPIC + 1), ("a", 4)])
    codes = [(t.name, ErrorCode.from_wire(t.error_code)) for t in response.topics]
    assert codes == [
        ("a", ErrorCode.INVALID_REQUEST),  # named twice
        ("nosuch", ErrorCode.UNKNOWN_TOPIC_OR_PARTITION),
        ("b", ErrorCode.INVALID_PARTITIONS),
        ("a", ErrorCode.INVALID_REQUEST),
    ]
    assert len(h.topic("a").partitions) == 1
    ok = grow(h, [("a", 3), ("b", 2)])
    assert [t.error_code for t in ok.topics] == [0, 0]
    assert len(h.topic("a").partitions) == 3 and len(h.topic("b").partitions) == 2
    assert all(len(p.replicas) == 3 for p in h.topic("b").partitions)


def test_validate_only_places_but_writes_nothing(h: Harness) -> None:
    h.create("orders")
    before = h.next_offset
    result = grow(h, [("orders", 4)], validate_only=True).topics[0]
    assert result.error_code == ErrorCode.NONE and len(result.assignments) == 3
    assert h.next_offset == before and len(h.topic("orders").partitions) == 1


def test_request_limits_refuse_the_whole_request_before_any_placement() -> None:
    h = Harness()
    h.logic.settings = ControllerSettings(
        CLUSTER, request_limits=RequestLimits(max_topics=2, max_partitions=10)
    )
    h.active_brokers(1)
    h.create("a")
    h.create("b")
    too_many_topics = grow(h, [("a", 2), ("b", 2), ("c", 2)])
    assert too_many_topics.error_code == ErrorCode.POLICY_VIOLATION and not too_many_topics.topics
    assert "max.request.topics" in too_many_topics.error_message
    too_many_partitions = grow(h, [("a", 6), ("b", 7)])  # 5 + 6 new partitions > 10
    assert too_many_partitions.error_code == ErrorCode.POLICY_VIOLATION
    assert "max.request.partitions" in too_many_partitions.error_message
    assert grow(h, [("a", 6), ("b", 6)]).topics[1].error_code == ErrorCode.NONE


def test_cluster_and_broker_partition_limits_apply_to_growth() -> None:
    h = Harness()
    h.logic.settings = ControllerSettings(CLUSTER, max_partitions=5, max_broker_partitions=4)
    h.active_brokers(1, 2)
    h.create("a", partitions=2, rf=2)  # 2 replicas on each broker
    over_cluster = grow(h, [("a", 6)]).topics[0]
    assert (
        over_cluster.error_code == ErrorCode.POLICY_VIOLATION
        and "max.partitions" in over_cluster.error_message
    )
    over_broker = grow(h, [("a", 5)]).topics[0]  # 3 more replicas per broker: 5 > 4
    assert over_broker.error_code == ErrorCode.POLICY_VIOLATION
    assert "max.broker.partitions" in over_broker.error_message
    assert grow(h, [("a", 4)]).topics[0].error_code == ErrorCode.NONE


def test_too_few_live_brokers_for_the_replication_factor_names_the_fenced_ones(h: Harness) -> None:
    h.create("orders", rf=3)
    h.heartbeat(3, want_fence=True)
    result = grow(h, [("orders", 2)]).topics[0]
    assert result.error_code == ErrorCode.INVALID_REPLICATION_FACTOR
    assert "fenced: [3]" in result.error_message


def test_a_wrong_cluster_id_is_refused(h: Harness) -> None:
    h.create("orders")
    response = grow(h, [("orders", 2)], cluster_id="other")
    assert response.error_code == ErrorCode.INCONSISTENT_CLUSTER_ID


def test_a_partition_count_whose_directory_names_would_not_fit_is_refused(h: Harness) -> None:
    name = "t" * 249
    h.create(name)
    result = grow(h, [(name, 100_001)]).topics[0]  # "-100000": 256 bytes
    assert result.error_code == ErrorCode.INVALID_PARTITIONS and "directory name" in result.error_message
