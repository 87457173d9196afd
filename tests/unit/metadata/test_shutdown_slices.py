"""A controlled shutdown's leave job in bounded slices (issue #17, session 10): the fast path of a sole
replica leaving, election rules looked up only where they matter, and the closing of each slice's changes
(the speculative image and its indexes) counted against the event's time budget.

Time is a :class:`CostClock`: each read of the clock (one per ``CHECK_EVERY`` partitions scanned) costs
1 ms, and the closing costs what the test charges per touched topic, so slice lengths are exact and
independent of the host.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from loop_fakes import CostClock

from kraft.clock import CHECK_EVERY
from kraft.metadata import records
from kraft.metadata.controller_logic import ControllerLogic, ControllerSettings
from kraft.metadata.delta import MetadataDelta, apply_partition_change
from kraft.metadata.election_config import MIN_INSYNC_REPLICAS, UNCLEAN_LEADER_ELECTION_ENABLE
from kraft.metadata.image import NO_PARTITION_LEADER, MetadataImage, PartitionRegistration
from kraft.metadata.image_records import partition_record
from kraft.metadata.partition_change import build_change, leave_change, leave_change_encoded, rules_matter
from kraft.metadata.partition_encode import topic_field
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_controller import CLUSTER
from .test_work_budget import unfenced_brokers

_ids = st.integers(min_value=1, max_value=5)


def _replay(log: Iterable[pb.MetadataRecord]) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    for offset, record in enumerate(log):
        delta.replay(records.decode_value(records.encode_value(record)), offset)
    assert not delta.replay_errors
    return delta.apply()


# ---- the fast path and the rules it does not need, against the general rules ----


@st.composite
def _partitions(draw: st.DrawFn) -> PartitionRegistration:
    """Shapes the rules produce (ISR, ELR, last known ELR disjoint), a third of them with the ISR down
    to one member (the shape of the fast path)."""
    replicas = tuple(draw(st.lists(_ids, min_size=1, max_size=4, unique=True)))
    if draw(st.integers(0, 2)) == 0:
        isr: tuple[int, ...] = (draw(st.sampled_from(replicas)),)
    else:
        isr = tuple(r for r in replicas if draw(st.booleans()))
    elr = tuple(r for r in replicas if r not in isr and draw(st.integers(0, 3)) == 0)
    lke = tuple(r for r in replicas if r not in isr and r not in elr and draw(st.integers(0, 3)) == 0)
    leader = draw(st.sampled_from((NO_PARTITION_LEADER, *isr)))
    recovery = draw(st.sampled_from((0, 0, 0, 1)))
    epochs = draw(st.tuples(st.integers(0, 50), st.integers(0, 50)))
    unclean_epoch = draw(st.sampled_from((0, 0, 7)))
    return PartitionRegistration(replicas, isr, leader, *epochs, elr, lke, recovery, unclean_epoch)


@settings(max_examples=800, deadline=None)
@given(
    current=_partitions(),
    acceptable=st.sets(_ids),
    min_isr=st.integers(1, 4),
    unclean_shutdown=st.booleans(),
    unclean_election=st.booleans(),
)
def test_a_leave_decides_as_build_change_and_without_rules_where_they_do_not_matter(
    current: PartitionRegistration,
    acceptable: set[int],
    min_isr: int,
    unclean_shutdown: bool,
    unclean_election: bool,
) -> None:
    broker = current.isr[0] if current.isr else current.replicas[0]
    accept = acceptable.__contains__
    expected = build_change(
        "T",
        0,
        current,
        accept,
        remove_from_isr=broker,
        min_isr=min_isr,
        unclean_shutdown=(broker,) if unclean_shutdown else (),
        unclean_election=unclean_election,
    )
    got = leave_change(
        "T",
        0,
        current,
        accept,
        broker,
        min_isr=min_isr,
        unclean_shutdown=unclean_shutdown,
        unclean_election=unclean_election,
    )
    if expected is None:
        assert got is None
    else:
        assert got is not None
        record, registration = got
        assert record.partition_change == expected
        assert registration == apply_partition_change(current, expected)
    # encoded (the bulk slices' batches of values, session 18): the same bytes and registration
    encoded = leave_change_encoded(
        "T",
        topic_field("T"),
        0,
        current,
        accept,
        broker,
        min_isr=min_isr,
        unclean_shutdown=unclean_shutdown,
        unclean_election=unclean_election,
    )
    if got is None:
        assert encoded is None
    else:
        assert encoded is not None and encoded[1] == got[1]
        # every shape a value since session 19 (the ELR's, a sole replica's, an unclean election's)
        assert isinstance(encoded[0], bytes)
        assert encoded[0] == records.encode_value(got[0])
    if not rules_matter(current, accept, broker):
        # what the leave job does then: any rules, the same result as the topic's own
        assert leave_change("T", 0, current, accept, broker, unclean_shutdown=unclean_shutdown) == got


# ---- the leave job: sliced and timed equals the general rules applied to every partition ----


class _Topic:
    def __init__(
        self, name: str, parts: Sequence[PartitionRegistration], min_isr: int | None, unclean: bool | None
    ) -> None:
        self.name, self.parts, self.min_isr, self.unclean = name, parts, min_isr, unclean


@st.composite
def _topics(draw: st.DrawFn) -> list[_Topic]:
    """Topics of 1-3 partitions over brokers 1-4 (many of them broker 1's alone), some with their own
    election rules."""
    topics = []
    for t in range(draw(st.integers(1, 40))):
        parts = []
        for _ in range(draw(st.sampled_from((1, 1, 1, 2, 3)))):
            if draw(st.booleans()):
                parts.append(PartitionRegistration((1,), (1,), 1, 1, 1))  # a sole replica of broker 1
                continue
            replicas = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=3, unique=True)))
            isr = tuple(r for r in replicas if draw(st.booleans())) or replicas[:1]
            elr = tuple(r for r in replicas if r not in isr and draw(st.integers(0, 3)) == 0)
            leader = draw(st.sampled_from((NO_PARTITION_LEADER, *isr)))
            parts.append(PartitionRegistration(replicas, isr, leader, 2, 3, elr))
        min_isr = draw(st.sampled_from((None, None, 1, 2, 3)))
        unclean = draw(st.sampled_from((None, None, True, False)))
        topics.append(_Topic(f"t{t}", parts, min_isr, unclean))
    return topics


def _settled(
    topic_id: str, partition_id: int, p: PartitionRegistration, min_isr: int, unclean: bool
) -> PartitionRegistration:
    """``p`` after the elections a newly active controller would resume on it with every broker up (its
    rejoin job), so the shutdown is all the logic does to it."""
    for _ in range(4):
        change = build_change(
            topic_id, partition_id, p, lambda _: True, min_isr=min_isr, unclean_election=unclean
        )
        if change is None:
            return p
        p = apply_partition_change(p, change)
    raise AssertionError(f"no stable state from {p}")


def _cluster(topics: Sequence[_Topic], cluster_min_isr: int) -> list[pb.MetadataRecord]:
    """Brokers 1-4 registered and unfenced, a cluster-wide min.insync.replicas, then ``topics``."""
    builder = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    log = unfenced_brokers(builder, [None] * 4)
    log.append(
        records.wrap(
            pb.ConfigRecord(
                resource_type=records.ConfigResourceType.BROKER,
                resource_name="",
                name=MIN_INSYNC_REPLICAS,
                value=str(cluster_min_isr),
            )
        )
    )
    for topic in topics:
        log.append(records.wrap(pb.TopicRecord(name=topic.name, topic_id=topic.name)))
        for config, value in (
            (MIN_INSYNC_REPLICAS, topic.min_isr),
            (UNCLEAN_LEADER_ELECTION_ENABLE, topic.unclean),
        ):
            if value is not None:
                log.append(
                    records.wrap(
                        pb.ConfigRecord(
                            resource_type=records.ConfigResourceType.TOPIC,
                            resource_name=topic.name,
                            name=config,
                            value=str(value).lower(),
                        )
                    )
                )
        min_isr = topic.min_isr if topic.min_isr is not None else cluster_min_isr
        for pid, drawn in enumerate(topic.parts):
            p = _settled(topic.name, pid, drawn, min_isr, bool(topic.unclean))
            log.append(records.wrap(partition_record(topic.name, pid, p)))
    return log


def _closing_costs(logic: ControllerLogic, clock: CostClock, ms_per_topic: int) -> list[int]:
    """Charge ``ms_per_topic`` on ``clock`` for each topic the speculative image's rejoin index follows
    (the closing of a slice's changes; a test probe on this instance only); the counts it saw."""
    index = logic.rejoin_index
    advance = index.advance
    seen: list[int] = []

    def costly_advance(delta: MetadataDelta, topics_by_id: Any) -> None:
        changed = sum(1 for _ in delta.changed_topics())
        seen.append(changed)
        clock.advance(ms_per_topic * changed)
        advance(delta, topics_by_id)

    vars(index)["advance"] = costly_advance
    return seen


def _shutdown_in_slices(
    logic: ControllerLogic, log: list[pb.MetadataRecord], clock: CostClock | None = None
) -> list[tuple[int, int]]:
    """Broker 1's controlled shutdown, then every bulk slice: (records, clock ms) of each event."""
    started = clock.now_ms if clock is not None else 0
    first = logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1), len(log))
    log.extend(first.records)
    sizes = [(len(first.records), (clock.now_ms if clock is not None else 0) - started)]
    while logic.has_bulk_jobs():
        started = clock.now_ms if clock is not None else 0
        more = logic.continue_bulk_jobs(len(log))
        log.extend(more)
        sizes.append((len(more), (clock.now_ms if clock is not None else 0) - started))
    return sizes


def _expected(image: MetadataImage) -> dict[str, tuple[PartitionRegistration, ...]]:
    """Every partition after broker 1 left it, by the general rules, each on its own (the leave job's
    partitions are independent: the brokers' states do not change during it)."""
    accept = {2, 3, 4}.__contains__
    result = {}
    for topic in image.topics_by_id.values():
        parts = []
        min_isr = int(image.topic_or_cluster_config(topic.name, MIN_INSYNC_REPLICAS) or 1)
        unclean = image.topic_or_cluster_config(topic.name, UNCLEAN_LEADER_ELECTION_ENABLE) == "true"
        for pid, p in enumerate(topic.partitions):
            change = None
            if 1 in p.isr or p.leader == 1:
                change = build_change(
                    topic.topic_id,
                    pid,
                    p,
                    accept,
                    remove_from_isr=1,
                    min_isr=min_isr,
                    unclean_election=unclean,
                )
            parts.append(p if change is None else apply_partition_change(p, change))
        result[topic.topic_id] = tuple(parts)
    return result


@settings(max_examples=60, deadline=None)
@given(
    topics=_topics(), cluster_min_isr=st.integers(1, 3), budget_ms=st.integers(2, 12), unit=st.integers(1, 40)
)
def test_a_sliced_timed_shutdown_equals_the_general_rules_on_every_partition(
    topics: list[_Topic], cluster_min_isr: int, budget_ms: int, unit: int
) -> None:
    log = _cluster(topics, cluster_min_isr)
    image = _replay(log)
    clock = CostClock(0)
    settings_ = ControllerSettings(CLUSTER, max_changes_per_write=unit, max_event_time_ms=budget_ms)
    logic = ControllerLogic(settings_, image, 0, clock=clock)
    while not logic.index_some():
        pass
    _closing_costs(logic, clock, 1)
    clock.cost_ms = 1
    _shutdown_in_slices(logic, log, clock)
    want = _expected(image)
    got = {t.topic_id: t.partitions for t in logic.image.topics_by_id.values()}
    assert got == want
    # the records replay to the image the logic built without replaying them
    replayed = _replay(log)
    assert {t.topic_id: t.partitions for t in replayed.topics_by_id.values()} == want
    assert logic.leader_count(1) == 0


# ---- slices of one-partition topics end within the budget, closing included ----


def _sole_replica_topics(count: int) -> list[_Topic]:
    return [
        _Topic(f"admin-{i}", [PartitionRegistration((1,), (1,), 1, 1, 1)], None, None) for i in range(count)
    ]


def test_slices_of_one_partition_topics_end_within_the_budget_with_their_closing() -> None:
    # 1 ms per clock read (per CHECK_EVERY topics scanned) and 1 ms per 4 topics closed: closing is 8x
    # the scan, as for the ~9,000 one-partition topics bench.controller's shutdown leaves leaderless.
    topics = _sole_replica_topics(3_000)
    log = _cluster(topics, 1)
    clock = CostClock(0)
    budget_ms = 40
    logic = ControllerLogic(
        ControllerSettings(CLUSTER, max_changes_per_write=1_000, max_event_time_ms=budget_ms),
        _replay(log),
        0,
        clock=clock,
    )
    while not logic.index_some():
        pass
    index = logic.rejoin_index
    advance = index.advance

    def costly_advance(delta: MetadataDelta, topics_by_id: Any) -> None:
        clock.advance(sum(1 for _ in delta.changed_topics()) // 4)
        advance(delta, topics_by_id)

    vars(index)["advance"] = costly_advance
    clock.cost_ms = 1
    sizes = _shutdown_in_slices(logic, log, clock)
    # One check of the deadline covers CHECK_EVERY topics: scanning them (1 ms) and closing them (8 ms)
    # is the most a slice may run past its budget; the clock reads that measure the closing, 2 ms more.
    step_ms = 1 + CHECK_EVERY // 4
    assert all(ms <= budget_ms + step_ms + 2 for _, ms in sizes[1:]), sizes
    assert len(sizes) < 3_000 / CHECK_EVERY  # still many topics per slice, not a few
    assert sum(n for n, _ in sizes) == 3_000 + 1  # a change per topic, and the shutdown's own record
    assert all(
        p.leader == NO_PARTITION_LEADER and p.elr == (1,)
        for t in logic.image.topics_by_id.values()
        for p in t.partitions
    )
    # The closing is what used to overrun: without it counted, a slice scans ~budget_ms reads of
    # CHECK_EVERY topics (capped by the 1,000-record unit) and then closes them all.
    untimed_closing = (budget_ms - 1) * CHECK_EVERY // 4
    assert untimed_closing > 2 * budget_ms


def test_slices_of_unfence_elections_end_within_the_budget_with_their_closing() -> None:
    # The same for a rejoin job (unfence elections): 3,000 one-partition topics left leaderless with
    # broker 1 in each ELR (as its fence leaves them), broker 1 acceptable again, so each partition is an
    # election — the job a new active controller resumes from such an image.  Closing (each change
    # replayed, the image, its indexes) costs 1 ms per 4 topics: 8x the scan.
    log = _cluster(_sole_replica_topics(3_000), 1)
    for i in range(3_000):
        change = pb.PartitionChangeRecord(topic_id=f"admin-{i}", partition_id=0, leader=NO_PARTITION_LEADER)
        change.isr.SetInParent()  # emptied
        change.eligible_leader_replicas.ids.append(1)
        log.append(records.wrap(change))
    clock = CostClock(0)
    budget_ms = 40
    logic = ControllerLogic(
        ControllerSettings(CLUSTER, max_changes_per_write=1_000, max_event_time_ms=budget_ms),
        _replay(log),
        0,
        clock=clock,
    )
    assert logic.has_bulk_jobs()  # the elections, found by the reset
    while not logic.index_some():
        pass
    index = logic.rejoin_index
    advance = index.advance

    def costly_advance(delta: MetadataDelta, topics_by_id: Any) -> None:
        clock.advance(sum(1 for _ in delta.changed_topics()) // 4)
        advance(delta, topics_by_id)

    vars(index)["advance"] = costly_advance
    clock.cost_ms = 1
    sizes = []
    while logic.has_bulk_jobs():
        started = clock.now_ms
        more = logic.continue_bulk_jobs(len(log))
        log.extend(more)
        sizes.append((len(more), clock.now_ms - started))
    step_ms = 1 + CHECK_EVERY // 4  # as for the leave job above
    assert all(ms <= budget_ms + step_ms + 2 for _, ms in sizes[1:]), sizes
    assert sum(n for n, _ in sizes) == 3_000 and len(sizes) < 3_000 / CHECK_EVERY
    assert logic.rejoin_closing_cost.measured
    topics = logic.image.topics_by_id.values()
    assert all(p.leader == 1 and p.isr == (1,) for t in topics for p in t.partitions)
    assert {t.topic_id: t.partitions for t in _replay(log).topics_by_id.values()} == {
        t.topic_id: t.partitions for t in topics
    }


def test_the_closing_estimate_follows_what_slices_measure() -> None:
    topics = _sole_replica_topics(600)
    log = _cluster(topics, 1)
    clock = CostClock(0)
    logic = ControllerLogic(
        ControllerSettings(CLUSTER, max_changes_per_write=1_000, max_event_time_ms=20),
        _replay(log),
        0,
        clock=clock,
    )
    while not logic.index_some():
        pass
    seen = _closing_costs(logic, clock, 1)
    clock.cost_ms = 1
    _shutdown_in_slices(logic, log, clock)
    assert logic.closing_cost.measured and seen
    # ~1 ms per topic closed, a topic is 1 + TOPIC_CLOSING_UNITS units: ~0.11 ms per unit (and the two
    # reads measuring it)
    assert 0.08 < logic.closing_cost.ms_per_unit < 0.2


def test_one_slow_closing_raises_the_estimate_by_half_at_most_and_a_lasting_rise_is_followed() -> None:
    logic = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    cost = logic.closing_cost
    cost.note(10, 1_000)  # the first measurement replaces the initial guess
    assert cost.measured and cost.ms_per_unit == 0.01
    cost.note(100, 1_000)  # one chunk preempted while closing: 10x
    assert cost.ms_per_unit == 0.015
    cost.note(10, 1_000)
    assert cost.ms_per_unit == 0.0125
    for _ in range(12):  # the closing really became 4x dearer: followed
        cost.note(40, 1_000)
    assert 0.035 < cost.ms_per_unit <= 0.04
    cost.note(0, 1_000)  # a closing under 1 ms reads 0 on the ms clock ...
    cost.note(0, 1_000)
    cost.note(0, 1_000)
    cost.note(0, 1_000)
    assert cost.ms_per_unit < 0.003
    for _ in range(20):  # ... and the estimate still grows back from there
        cost.note(20, 1_000)
    assert 0.019 < cost.ms_per_unit <= 0.02


# ---- the leave job's memo of decisions follows the brokers' states ----


def test_a_broker_leaving_during_another_s_shutdown_is_not_elected_by_later_slices() -> None:
    """Broker 1 leaves partitions whose ISR is brokers 1-3: its first slice elects broker 2.  Broker 2
    then starts its own controlled shutdown; no later slice of broker 1's job may elect it — the job's
    memo of decisions (issue #17, session 15) is dropped when the brokers' states change."""
    builder = ControllerLogic(ControllerSettings(CLUSTER), MetadataImage.empty(), 0)
    log = unfenced_brokers(builder, [None] * 3)
    log.append(records.wrap(pb.TopicRecord(name="t", topic_id="t")))
    count = 60
    for pid in range(count):
        registration = PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 1, 1)
        log.append(records.wrap(partition_record("t", pid, registration)))
    logic = ControllerLogic(ControllerSettings(CLUSTER, max_changes_per_write=10), _replay(log), 0)
    log.extend(
        logic.shutdown_broker(cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=1), len(log)).records
    )
    if all(p.leader == 1 for p in logic.image.topics_by_id["t"].partitions):
        log.extend(logic.continue_bulk_jobs(len(log)))  # the job's first slice
    moved = [p.leader for p in logic.image.topics_by_id["t"].partitions if p.leader != 1]
    assert moved and set(moved) == {2} and len(moved) < count
    second = logic.shutdown_broker(
        cpb.ShutdownBrokerRequest(cluster_id=CLUSTER, broker_id=2), len(log)
    ).records
    log.extend(second)
    after = len(second)
    while logic.has_bulk_jobs():
        more = logic.continue_bulk_jobs(len(log))
        log.extend(more)
        after += len(more)
    elected = [
        r.partition_change.leader
        for r in log[-after:]
        if r.WhichOneof("record") == "partition_change" and r.partition_change.HasField("leader")
    ]
    assert elected and 2 not in elected
    assert {p.leader for p in logic.image.topics_by_id["t"].partitions} == {3}
