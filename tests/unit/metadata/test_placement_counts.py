"""Replicas per broker of a range of a plan's placement counted without placing every partition
(``placement.placed_replica_counts``, issue #17): exact, within its placement budget, and used by a new
active controller that resumes a big topic, so its reservation of the unwritten rest is exact at once
when the brokers are few — before, with racks, it reserved the whole rest on every broker until the rest
was counted in slices, refusing other CreateTopics meanwhile."""

from __future__ import annotations

import itertools
from collections import Counter
from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.clock import Deadline
from kraft.errors import ErrorCode
from kraft.metadata import placement
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.image import MetadataImage
from kraft.metadata.placement import (
    UsableBroker,
    place_ordered_range,
    placed_replica_counts,
    rack_alternated,
    rack_count,
)
from kraft.v1 import controller_pb2 as cpb

from .test_controller import CLUSTER
from .test_sliced_topics import _assigned
from .test_work_budget import _replay, unfenced_brokers


def _placed(
    ordered: Sequence[UsableBroker], racks: int, first: int, count: int, factor: int, start: int
) -> Counter[int]:
    return Counter(
        b for replicas in place_ordered_range(ordered, racks, first, count, factor, start) for b in replicas
    )


@settings(max_examples=300, deadline=None)
@given(
    rack_of=st.lists(st.sampled_from(["a", "b", "c", ""]), min_size=1, max_size=9),
    data=st.data(),
)
def test_the_counts_equal_the_placement_and_stay_within_the_budget(
    rack_of: list[str], data: st.DataObject
) -> None:
    brokers = [UsableBroker(10 + i, rack or None) for i, rack in enumerate(rack_of)]
    ordered = rack_alternated(brokers)
    racks = rack_count(ordered)
    factor = data.draw(st.integers(1, len(brokers)))
    first = data.draw(st.integers(0, 300))
    count = data.draw(st.integers(0, 400))
    start = data.draw(st.integers(0, 1000))
    budget = data.draw(st.integers(0, 200))
    placed = 0
    real = placement.place_ordered_range

    def counted(*args: object) -> list[tuple[int, ...]]:
        nonlocal placed
        result = real(*args)  # type: ignore[arg-type]
        placed += len(result)
        return result

    placement.place_ordered_range = counted  # type: ignore[assignment]
    try:
        got = placed_replica_counts(ordered, racks, first, count, factor, start, budget)
    finally:
        placement.place_ordered_range = real
    assert placed <= budget
    if got is not None:
        assert got == (_placed(ordered, racks, first, count, factor, start) if count else Counter())
    n = len(brokers)
    if count <= budget and n * max(n - 1, 1) + 2 * n <= budget:
        assert got is not None  # within the budget whatever the range


def test_counting_stops_when_the_time_budget_ran_out() -> None:
    """Checked after each block: a range of more than one follower shift gives up (the caller falls back
    to the bound and counts in slices); a range within one block needs no check."""
    ordered = rack_alternated([UsableBroker(b, "a" if b < 4 else "b") for b in range(1, 6)])
    racks = rack_count(ordered)
    assert placed_replica_counts(ordered, racks, 0, 50, 2, 7, 1_000, lambda: True) is None
    assert placed_replica_counts(ordered, racks, 0, 5, 2, 7, 1_000, lambda: True) == _placed(
        ordered, racks, 0, 5, 2, 7
    )


BIG = 200  # partitions of the big topic, rf 2, written WORK_UNIT per slice
WORK_UNIT = 40  # 4-5 brokers: one block per follower shift (n x (n - 1)) plus the ends fits in a unit


def _settings(max_broker_partitions: int) -> ControllerSettings:
    return ControllerSettings(
        CLUSTER,
        max_changes_per_write=WORK_UNIT,
        max_event_time_ms=0,
        max_partitions=1_000_000,
        max_broker_partitions=max_broker_partitions,
    )


@pytest.mark.parametrize("racks", [["a", "a", "a", "b"], ["a", "b", "a", "b", "c"]])
def test_a_new_active_controller_reserves_the_resumed_rest_exactly_per_broker_at_once(
    racks: list[str],
) -> None:
    """Racks: the O(brokers) bound is the whole rest on every broker; with few brokers the exact count
    costs less than a work unit of placements, so the reservation is exact from the reset on and a
    topic that fits next to the rest on the least loaded broker is admitted before any slice is written."""
    ids = (f"topic-{i}" for i in itertools.count())
    first = ControllerLogic(_settings(10_000), MetadataImage.empty(), 0, new_topic_id=lambda: next(ids))
    log = unfenced_brokers(first, racks)
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatableTopic(name="huge", num_partitions=BIG, replication_factor=2)]
    )
    _, plan = first.plan_topic(request, len(log))
    assert plan is not None
    while not plan.place_some(Deadline(None, 0), WORK_UNIT):
        pass
    full = Counter(plan.by_broker)
    log.extend(first.create_planned_topic(plan, False, len(log)).records)
    for _ in range(2):
        log.extend(first.continue_bulk_jobs(len(log)))
    committed = _replay(log)
    huge = committed.topic("huge")
    assert huge is not None and 0 < len(huge.partitions) < BIG and committed.transaction
    unwritten = BIG - len(huge.partitions)
    rest = full - Counter(b for p in huge.partitions for b in p.replicas)
    brokers = range(1, len(racks) + 1)
    least = min(brokers, key=lambda b: rest[b])
    assert rest[least] < unwritten  # the exact count is below the bound (the whole rest on each)
    # max.broker.partitions with room for exactly one more replica on it once the rest is written
    second = ControllerLogic(_settings(full[least] + 1), committed, 0, new_topic_id=lambda: "again")
    assert {b: second.reservations.replicas_on(b) for b in brokers} == {b: rest[b] for b in brokers}
    one = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[_assigned("one", [[least]])])
    created = second.create_topics(one, len(log))
    assert created.response.topics[0].error_code == ErrorCode.NONE, created.response
    log.extend(created.records)
    two = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[_assigned("two", [[least]])])
    assert second.create_topics(two, len(log)).response.topics[0].error_code == ErrorCode.POLICY_VIOLATION
    while second.has_bulk_jobs():
        log.extend(second.continue_bulk_jobs(len(log)))
    assert second.reservations.partitions == 0
    topic = _replay(log).topic("huge")
    assert topic is not None and len(topic.partitions) == BIG
    assert Counter(b for p in topic.partitions for b in p.replicas) == full  # the unsliced placement
