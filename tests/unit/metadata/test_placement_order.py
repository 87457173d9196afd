"""The usable brokers' placement order is computed once per broker set, not per CreateTopics
(``ControllerLogic._placement_order``, issue #17: ordering 1,000 brokers is ~1 ms), a broker change moves
only the changed brokers (:class:`UsableBrokerOrder`, equal to ``rack_alternated`` of the usable brokers
for any sequence of broker maps: property test), and placement is what ``place_replicas`` gives for the
brokers as they are at each request."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.errors import ErrorCode
from kraft.metadata import controller_logic, partition_growth, placement
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import BrokerRegistration, MetadataImage
from kraft.metadata.placement import (
    UsableBroker,
    UsableBrokerOrder,
    place_replicas,
    rack_alternated,
    rack_count,
)
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


def _counting_work(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Brokers looked at to order the usable brokers: ``rack_alternated`` calls (their lengths), wherever
    they come from, and each broker :class:`UsableBrokerOrder` moves (1 each)."""
    calls: list[int] = []
    original = rack_alternated

    def counted(brokers: list[UsableBroker]) -> list[UsableBroker]:
        calls.append(len(brokers))
        return original(brokers)

    # (wherever it is called from: the logic's placement or placement.place_replicas)
    monkeypatch.setattr(controller_logic, "rack_alternated", counted)
    monkeypatch.setattr(placement, "rack_alternated", counted)
    update = UsableBrokerOrder._update

    def moved(self: UsableBrokerOrder, broker_id: int, registration: BrokerRegistration | None) -> None:
        calls.append(1)
        update(self, broker_id, registration)

    monkeypatch.setattr(UsableBrokerOrder, "_update", moved)
    return calls


def test_the_order_is_computed_once_while_the_brokers_stay_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    logic = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    log = unfenced_brokers(logic, ["a", "b", "a", "c", None])
    calls = _counting_work(monkeypatch)
    orderings = []
    for index in range(20):
        cursor = logic.image.partition_count()
        before = len(calls)
        created = _create(logic, log, f"t{index}", 1 + index % 4, 1 + index % 3)
        orderings.append(sum(calls[before:]))
        assert created.error_code == ErrorCode.NONE
        assert _assignment(logic, f"t{index}") == _expected(logic, 1 + index % 4, 1 + index % 3, cursor)
    assert orderings == [5] + [0] * 19  # the five brokers once, then nothing while they stay the same
    # a change of one broker moves that broker only
    unfenced_brokers_from(logic, log, 6)
    cursor = logic.image.partition_count()
    before = len(calls)
    assert _create(logic, log, "after-6", 3, 2).error_code == ErrorCode.NONE
    assert sum(calls[before:]) == 1
    assert _assignment(logic, "after-6") == _expected(logic, 3, 2, cursor)


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
    calls = _counting_work(monkeypatch)
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


# --- UsableBrokerOrder against rack_alternated, for any sequence of broker maps ---

RACKS = [None, "a", "b", "c", ""]


def _registration(broker_id: int, rack: str | None, fenced: bool, stopping: bool) -> BrokerRegistration:
    return BrokerRegistration(broker_id, broker_id, f"i{broker_id}", (), rack, fenced, stopping)


def _usable(brokers: Mapping[int, BrokerRegistration]) -> list[UsableBroker]:
    return [
        UsableBroker(b.broker_id, b.rack)
        for b in brokers.values()
        if not b.fenced and not b.in_controlled_shutdown
    ]


_step = st.tuples(
    st.sampled_from(["set", "remove", "fresh", "same"]),
    st.integers(min_value=0, max_value=24),  # broker id
    st.sampled_from(RACKS),
    st.booleans(),  # fenced
    st.booleans(),  # in controlled shutdown
    st.booleans(),  # looked at after this step (the logic does not see every image)
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_step, min_size=1, max_size=60))
def test_the_kept_order_equals_rack_alternated_of_the_usable_brokers(
    steps: list[tuple[str, int, str | None, bool, bool, bool]],
) -> None:
    order = UsableBrokerOrder()
    brokers: dict[int, BrokerRegistration] = {}
    for action, broker_id, rack, fenced, stopping, look in steps:
        # as a delta does: a new map, new registrations for the changed brokers, the others shared
        brokers = dict(brokers)
        if action == "set":
            brokers[broker_id] = _registration(broker_id, rack, fenced, stopping)
        elif action == "remove":
            brokers.pop(broker_id, None)
        elif action == "fresh":  # a snapshot load: every registration a new (equal) object
            brokers = {
                b: _registration(r.broker_id, r.rack, r.fenced, r.in_controlled_shutdown)
                for b, r in brokers.items()
            }
        if not look:
            continue
        expected = rack_alternated(_usable(brokers))
        ordered, racks = order.of(brokers)
        assert ordered == expected
        assert racks == rack_count(expected)
        assert order.of(brokers)[0] is ordered  # kept while the map stays the same
