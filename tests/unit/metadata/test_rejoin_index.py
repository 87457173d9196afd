"""RejoinIndex against the full scan it replaces: the same build_change records, in the same order, for
any image (arbitrary replica lists, ISRs, leaders; topics created, changed, removed, re-created) and any
broker states, with the index following the images delta by delta or rebuilt from scratch."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import rejoin_index
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage, PartitionRegistration, TopicImage
from kraft.metadata.partition_change import build_change
from kraft.metadata.partition_counts import PartitionCounts
from kraft.metadata.rejoin_index import RejoinIndex, flagged_replicas
from kraft.v1 import metadata_pb2 as pb

BROKERS = list(range(6))
TOPIC_IDS = ["t0", "t1", "t2"]
IDS = st.integers(-1, 6)  # -1: no leader; 6: a broker that is not registered
ID_LISTS = st.lists(st.integers(0, 6), max_size=4)  # repeats and non-replica ISR members on purpose
BIG_TOPIC = 3  # topics of 3+ partitions keep their own counts here (both paths are exercised)


@pytest.fixture(autouse=True, scope="module")
def _small_big_topics() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(rejoin_index, "TOPIC_COUNTS_MIN_PARTITIONS", BIG_TOPIC)
        patch.setattr(rejoin_index, "SETTLE_CHECK_EVERY", 2)  # settle slices split topics here too
        yield


@st.composite
def registration(draw: st.DrawFn) -> tuple[list[int], list[int], int]:
    replicas = draw(ID_LISTS)
    # Mostly the states the controller writes (ISR a subset in replica order, a replica leading), with
    # arbitrary ones mixed in.
    isr_kind = draw(_ISR_KINDS)
    if isr_kind == "same":
        isr = replicas
    elif isr_kind == "subset":
        isr = [r for r in replicas if draw(st.booleans())]
    else:
        isr = draw(ID_LISTS)
    leader = draw(st.sampled_from(replicas) if replicas and draw(st.integers(0, 3)) != 0 else IDS)
    return replicas, isr, leader


# The strategies the composites draw from, built once: one built inside a composite is a new object at
# every draw, which Hypothesis validates again each time.  The same strategies: the same examples.
_ISR_KINDS = st.sampled_from(["same", "same", "subset", "subset", "other"])
_REGISTRATIONS = registration()
_TOPIC_ID_DRAWS = st.sampled_from(TOPIC_IDS)
_RECORD_KINDS = st.sampled_from(["topic", "topic", "partition", "change", "change", "change", "remove"])


@st.composite
def records(draw: st.DrawFn) -> list[pb.MetadataRecord]:
    topic_id = draw(_TOPIC_ID_DRAWS)
    kind = draw(_RECORD_KINDS)
    if kind == "topic":
        # A topic with its partitions.  The name varies so a TopicRecord may also re-create a removed
        # id or replace a live one.
        name = f"{topic_id}-{draw(st.integers(0, 1))}"
        created = [pb.MetadataRecord(topic=pb.TopicRecord(name=name, topic_id=topic_id))]
        for partition_id in range(draw(st.integers(0, 4))):
            replicas, isr, leader = draw(_REGISTRATIONS)
            created.append(
                pb.MetadataRecord(
                    partition=pb.PartitionRecord(
                        topic_id=topic_id,
                        partition_id=partition_id,
                        replicas=replicas,
                        isr=isr,
                        leader=leader,
                    )
                )
            )
        return created
    if kind == "remove":
        return [pb.MetadataRecord(remove_topic=pb.RemoveTopicRecord(topic_id=topic_id))]
    partition_id = draw(st.integers(0, 4))  # past the end: skipped (or a new partition when dense)
    replicas, isr, leader = draw(_REGISTRATIONS)
    if kind == "partition":
        return [
            pb.MetadataRecord(
                partition=pb.PartitionRecord(
                    topic_id=topic_id, partition_id=partition_id, replicas=replicas, isr=isr, leader=leader
                )
            )
        ]
    change = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=partition_id)
    if draw(st.booleans()):
        change.isr.ids.extend(isr)
    if draw(st.booleans()):
        change.leader = leader
    if draw(st.integers(0, 4)) == 0:
        change.replicas.ids.extend(replicas)
    if draw(st.integers(0, 3)) == 0:  # KIP-966 fields: set, or cleared (present and empty)
        change.eligible_leader_replicas.SetInParent()
        change.eligible_leader_replicas.ids.extend(draw(ID_LISTS))
    if draw(st.integers(0, 3)) == 0:
        change.last_known_elr.SetInParent()
        change.last_known_elr.ids.extend(draw(ID_LISTS))
    return [pb.MetadataRecord(partition_change=change)]


def scan_changes(
    topics: dict[str, TopicImage] | MetadataImage, broker_id: int, acceptable: Callable[[int], bool]
) -> list[pb.PartitionChangeRecord]:
    """The oracle: ControllerLogic._partitions_of + build_change, as before the index."""
    assert isinstance(topics, MetadataImage)
    found = []
    for topic, partition_id, partition in topics.iter_partitions():
        if broker_id in partition.replicas:
            change = build_change(
                topic.topic_id, partition_id, partition, acceptable, add_to_isr=(broker_id,)
            )
            if change is not None:
                found.append(change)
    return found


def index_changes(
    index: RejoinIndex, image: MetadataImage, broker_id: int, acceptable: Callable[[int], bool]
) -> list[pb.PartitionChangeRecord]:
    found = []
    for topic, partition_id, partition in index.candidates(image.topics_by_id, broker_id, acceptable):
        assert broker_id in partition.replicas
        change = build_change(topic.topic_id, partition_id, partition, acceptable, add_to_isr=(broker_id,))
        if change is not None:
            found.append(change)
    return found


def nonzero(counts: Counter[int]) -> dict[int, int]:
    """The counts without zero entries (a negative one stays: it would be a bug)."""
    return {k: v for k, v in counts.items() if v != 0}


def assert_same_structure(index: RejoinIndex, image: MetadataImage) -> None:
    """What the deltas built equals a rebuild: flags, leader counts, topic order."""
    fresh = RejoinIndex()
    fresh.rebuild(image.topics_by_id)
    assert index._by_broker == fresh._by_broker
    assert index._flags == fresh._flags
    assert nonzero(index.leader_counts) == nonzero(fresh.leader_counts)
    assert nonzero(index.replica_counts) == nonzero(fresh.replica_counts)
    assert index.partitions == fresh.partitions == image.partition_count()
    counts = PartitionCounts()
    counts.update(image.topics_by_id)
    assert nonzero(fresh.leader_counts) == nonzero(counts.leaders)
    assert nonzero(fresh.replica_counts) == nonzero(counts.replicas)
    assert sorted(image.topics_by_id, key=index._ordinal.__getitem__) == list(image.topics_by_id)
    assert set(index._ordinal) == set(image.topics_by_id)
    # big topics' own counts (what a removal subtracts) equal a recount of the topic
    big = {t for t, topic in image.topics_by_id.items() if len(topic.partitions) >= BIG_TOPIC}
    assert set(index._topic_counts) == big
    for topic_id, (leaders, replicas) in index._topic_counts.items():
        recount = PartitionCounts()
        recount.update({topic_id: image.topics_by_id[topic_id]})
        assert nonzero(leaders) == nonzero(recount.leaders)
        assert nonzero(replicas) == nonzero(recount.replicas)


def _holds_elr(partition: PartitionRegistration) -> bool:
    return bool(partition.elr or partition.last_known_elr)


def _leaderless(partition: PartitionRegistration) -> bool:
    return partition.leader == -1


def assert_unsettled_queries_match_a_scan(index: RejoinIndex, image: MetadataImage) -> None:
    """``unsettled`` finds, in scan order, every partition with replicas that holds an ELR / LKE or has
    no leader (what the ELR clear and an implicit unclean ElectLeaders look for), for all topics or some."""
    for wanted in (_holds_elr, _leaderless):
        expected = [
            (topic.topic_id, partition_id)
            for topic, partition_id, partition in image.iter_partitions()
            if partition.replicas and wanted(partition)
        ]
        got = index.unsettled(image.topics_by_id, wanted)
        assert [(t.topic_id, p) for t, p, _ in got] == expected
        assert all(partition is image.partition(t.topic_id, p) for t, p, partition in got)
        some = TOPIC_IDS[1:]
        got = index.unsettled(image.topics_by_id, wanted, some)
        assert [(t.topic_id, p) for t, p, _ in got] == [e for e in expected if e[0] in some]
        # taken lazily (an implicit unclean ElectLeaders in parts), big topics in windows or not, the
        # topics sorted or (window 2: more picked than that) in the ordinals' insertion order, kept sorted
        assert list(index._ordinal.values()) == sorted(index._ordinal.values())
        for window in (rejoin_index.UNSETTLED_WINDOW, 2):
            with pytest.MonkeyPatch.context() as patch:
                patch.setattr(rejoin_index, "UNSETTLED_WINDOW", window)
                topics = image.topics_by_id
                lazy = [(t, p) for t, p in index.unsettled_ids() if wanted(topics[t].partitions[p])]
                assert lazy == [(t.topic_id, p) for t, p, _ in index.unsettled(topics, wanted)]
                lazy = [(t, p) for t, p in index.unsettled_ids(some) if wanted(topics[t].partitions[p])]
                assert lazy == [e for e in expected if e[0] in some]


@pytest.mark.parametrize("lazy_min_changes", [rejoin_index.LAZY_MIN_CHANGES, 0])
@settings(max_examples=300, deadline=None)
@given(
    groups=st.lists(st.lists(records(), min_size=1, max_size=5), min_size=1, max_size=8),
    acceptable_sets=st.lists(st.frozensets(st.integers(-1, 6)), min_size=1, max_size=3),
    rebuild_at=st.sets(st.integers(0, 7)),
)
def test_index_candidates_give_the_scans_records(
    groups: list[list[list[pb.MetadataRecord]]],
    acceptable_sets: list[frozenset[int]],
    rebuild_at: set[int],
    lazy_min_changes: int,
) -> None:
    """(``lazy_min_changes`` 0: every delta leaves its changed partitions dirty, and each query settles
    them first.)"""
    image = MetadataImage.empty()
    index = RejoinIndex()
    index.lazy_min_changes = lazy_min_changes
    index.rebuild(image.topics_by_id)
    for step, group in enumerate(groups):
        delta = MetadataDelta(image)
        for bundle in group:
            for record in bundle:
                delta.replay(record)
        image = delta.apply()
        if step in rebuild_at:
            index.invalidate()  # a reset: the next query rebuilds
        index.advance(delta, image.topics_by_id)
        for accepted in acceptable_sets:
            for broker_id in [*BROKERS, 6]:
                # the unfenced broker is acceptable: the precondition of the index
                ok = accepted | {broker_id}
                acceptable = ok.__contains__
                assert index_changes(index, image, broker_id, acceptable) == scan_changes(
                    image, broker_id, acceptable
                )
        assert_same_structure(index, image)
        assert_unsettled_queries_match_a_scan(index, image)


@settings(max_examples=300, deadline=None)
@given(
    replicas=ID_LISTS,
    isr=ID_LISTS,
    leader=IDS,
    same=st.booleans(),
    broker_id=st.integers(0, 6),
    accepted=st.frozensets(st.integers(-1, 6)),
)
def test_an_unflagged_replica_is_left_alone_unless_its_leader_is_unacceptable(
    replicas: list[int], isr: list[int], leader: int, same: bool, broker_id: int, accepted: frozenset[int]
) -> None:
    """The claim the index rests on, for one partition: if build_change changes it on this replica's
    unfence, the replica is flagged or the leader is not acceptable (and leads)."""
    replica_ids = tuple(replicas)
    partition = PartitionRegistration(replica_ids, replica_ids if same else tuple(isr), leader, 0, 0)
    ok = accepted | {broker_id}
    if broker_id not in partition.replicas:
        return
    change = build_change("t", 0, partition, ok.__contains__, add_to_isr=(broker_id,))
    if change is not None:
        assert broker_id in flagged_replicas(partition) or (leader != -1 and leader not in ok)


def test_a_settled_partition_led_by_an_unacceptable_broker_is_a_candidate() -> None:
    """Not flagged (preferred leader leads, everyone in sync) yet changed: its leader is being moved
    out; found by the one pass made while such a leader exists."""
    replicas = (1, 2)
    topic = TopicImage("a", "a", (PartitionRegistration(replicas, replicas, 1, 0, 0),))
    image = MetadataImage(0, 0, {}, {"a": topic}, {"a": "a"}, {}, {})
    index = RejoinIndex()
    index.rebuild(image.topics_by_id)
    assert index._by_broker == {}
    acceptable = {2}.__contains__
    changes = index_changes(index, image, 2, acceptable)
    assert changes == scan_changes(image, 2, acceptable)
    assert [c.leader for c in changes] == [2]


def test_a_healthy_image_flags_nothing() -> None:
    replicas = (1, 2, 3)
    topic = TopicImage("a", "a", tuple(PartitionRegistration(replicas, replicas, 1, 0, 0) for _ in range(5)))
    index = RejoinIndex()
    index.rebuild({"a": topic})
    assert index._by_broker == {}
    assert index.leader_counts == Counter({1: 5})


def test_partition_counts_total_follows_the_image() -> None:
    counts = PartitionCounts()
    image = MetadataImage.empty()
    delta = MetadataDelta(image)
    for topic_id, n in (("a", 3), ("b", 2)):
        delta.replay(pb.MetadataRecord(topic=pb.TopicRecord(name=topic_id, topic_id=topic_id)))
        for p in range(n):
            delta.replay(
                pb.MetadataRecord(
                    partition=pb.PartitionRecord(
                        topic_id=topic_id, partition_id=p, replicas=[1], isr=[1], leader=1
                    )
                )
            )
    image = delta.apply()
    counts.update(image.topics_by_id)
    assert counts.partitions == image.partition_count() == 5
    delta = MetadataDelta(image)
    delta.replay(pb.MetadataRecord(remove_topic=pb.RemoveTopicRecord(topic_id="a")))
    image = delta.apply()
    counts.update(image.topics_by_id)
    assert counts.partitions == image.partition_count() == 2


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    start=st.lists(records(), min_size=1, max_size=8),
    groups=st.lists(st.lists(records(), min_size=1, max_size=4), min_size=1, max_size=8),
    slices=st.lists(st.integers(0, 6), min_size=8, max_size=8),
    acceptable=st.frozensets(st.integers(-1, 6)),
)
def test_a_sliced_rebuild_with_deltas_in_between_equals_a_full_rebuild(
    start: list[list[pb.MetadataRecord]],
    groups: list[list[list[pb.MetadataRecord]]],
    slices: list[int],
    acceptable: frozenset[int],
) -> None:
    """After activation the index is rebuilt a few partitions per event while deltas (topics created,
    changed, removed, re-created) keep arriving; once done it equals a rebuild of the final image and
    gives the scan's records."""
    delta = MetadataDelta(MetadataImage.empty())
    for bundle in start:
        for record in bundle:
            delta.replay(record)
    image = delta.apply()
    index = RejoinIndex()
    index.start_rebuild(image.topics_by_id)
    for step, group in enumerate(groups):
        index.rebuild_some(image.topics_by_id, slices[step])  # a slice, maybe of nothing (limit 0)
        delta = MetadataDelta(image)
        for bundle in group:
            for record in bundle:
                delta.replay(record)
        image = delta.apply()
        index.advance(delta, image.topics_by_id)
        assert index.current_for is None or not index.building
    while not index.rebuild_some(image.topics_by_id, 2):
        assert index.current_for is None
    assert index.current_for is image.topics_by_id and not index.building
    assert_same_structure(index, image)
    for broker_id in [*BROKERS, 6]:
        ok = (acceptable | {broker_id}).__contains__
        assert index_changes(index, image, broker_id, ok) == scan_changes(image, broker_id, ok)


def test_an_unfence_during_a_sliced_rebuild_finishes_it() -> None:
    delta = MetadataDelta(MetadataImage.empty())
    for topic_id in TOPIC_IDS:
        delta.replay(pb.MetadataRecord(topic=pb.TopicRecord(name=topic_id, topic_id=topic_id)))
        delta.replay(
            pb.MetadataRecord(
                partition=pb.PartitionRecord(
                    topic_id=topic_id, partition_id=0, replicas=[1, 2], isr=[2], leader=2
                )
            )
        )
    image = delta.apply()
    index = RejoinIndex()
    index.start_rebuild(image.topics_by_id)
    assert not index.rebuild_some(image.topics_by_id, 1) and index.building
    ok = {1, 2}.__contains__
    assert index_changes(index, image, 1, ok) == scan_changes(image, 1, ok) != []
    assert not index.building and index.current_for is image.topics_by_id


@settings(max_examples=200)
@given(
    st.dictionaries(st.integers(-1, 6), st.integers(-3, 3), max_size=5),
    st.lists(st.integers(-1, 6), max_size=30),
    st.lists(st.integers(-1, 6), max_size=30),
)
def test_shift_counts_as_a_step_per_item(start: dict[int, int], old: list[int], new: list[int]) -> None:
    """``_shift`` (a topic's changed partitions move the leader counts at once, in C from
    ``SHIFT_IN_C`` items) leaves exactly the counts — zero entries included — of one step per item."""
    stepped = Counter(start)
    for key in old:
        stepped[key] -= 1
    for key in new:
        stepped[key] += 1
    shifted = Counter(start)
    rejoin_index._shift(shifted, old, new)
    assert dict(shifted) == dict(stepped)


def assert_settled_partitions_are_exact(index: RejoinIndex, image: MetadataImage) -> None:
    """Mid-way, with partitions dirty: every partition not dirty has a rebuild's flags, the per-broker
    sets mirror the stored flags exactly, and the counts are exact (they never wait for a settle)."""
    fresh = RejoinIndex()
    fresh.rebuild(image.topics_by_id)
    dirty = index._dirty
    for topic_id, topic in image.topics_by_id.items():
        for partition_id in range(len(topic.partitions)):
            if partition_id in dirty.get(topic_id, ()):
                continue
            got = index._flags.get(topic_id, {}).get(partition_id, ())
            assert got == fresh._flags.get(topic_id, {}).get(partition_id, ()), (topic_id, partition_id)
    mirrored: dict[int, dict[str, set[int]]] = {}
    for topic_id, flags in index._flags.items():
        assert flags, "an empty flag map is kept"
        for partition_id, brokers in flags.items():
            for broker_id in brokers:
                mirrored.setdefault(broker_id, {}).setdefault(topic_id, set()).add(partition_id)
    assert index._by_broker == mirrored
    assert set(dirty) <= set(image.topics_by_id)
    assert all(dirty.values())
    assert nonzero(index.leader_counts) == nonzero(fresh.leader_counts)
    assert nonzero(index.replica_counts) == nonzero(fresh.replica_counts)
    assert index.partitions == fresh.partitions


@settings(max_examples=300, deadline=None, derandomize=True)
@given(
    groups=st.lists(st.lists(records(), min_size=1, max_size=5), min_size=1, max_size=10),
    settle_slices=st.lists(st.integers(0, 5), min_size=10, max_size=10),
    budget_ends=st.lists(st.booleans(), min_size=10, max_size=10),
    lazy_min_changes=st.integers(0, 3),
    queried_at=st.sets(st.integers(0, 9)),
    acceptable=st.frozensets(st.integers(-1, 6)),
)
def test_dirty_flags_settled_in_any_slices_equal_a_rebuild(
    groups: list[list[list[pb.MetadataRecord]]],
    settle_slices: list[int],
    budget_ends: list[bool],
    lazy_min_changes: int,
    queried_at: set[int],
    acceptable: frozenset[int],
) -> None:
    """Bulk deltas (here: any delta changing at least ``lazy_min_changes`` existing partitions) leave
    their partitions dirty; slices of ``settle_some`` of any size (0 too; maybe ended by their time
    budget at the first check) come between deltas, and a query
    now and then settles everything first.  At every step what is not dirty is exact; once settled the
    index equals a rebuild and gives the scan's records.  Not marking a changed partition dirty, not
    settling before a query, or settling from a stale partition each fail this."""
    image = MetadataImage.empty()
    index = RejoinIndex()
    index.lazy_min_changes = lazy_min_changes
    index.rebuild(image.topics_by_id)
    for step, group in enumerate(groups):
        delta = MetadataDelta(image)
        for bundle in group:
            for record in bundle:
                delta.replay(record)
        image = delta.apply()
        index.advance(delta, image.topics_by_id)
        assert index.current_for is image.topics_by_id
        assert_settled_partitions_are_exact(index, image)
        done = index.settle_some(settle_slices[step], (lambda: True) if budget_ends[step] else None)
        assert done == (not index.settling)
        assert_settled_partitions_are_exact(index, image)
        if step in queried_at:
            left = {t: set(ids) for t, ids in index._dirty.items()}
            assert_unsettled_queries_match_a_scan(index, image)  # exact with dirty flags left ...
            assert index._dirty == left  # ... which it does not settle (it asks the dirty partitions)
            for broker_id in [*BROKERS, 6]:
                ok = (acceptable | {broker_id}).__contains__
                assert index_changes(index, image, broker_id, ok) == scan_changes(image, broker_id, ok)
            assert not index.settling
            assert_same_structure(index, image)
    while not index.settle_some(1):
        pass
    assert_same_structure(index, image)


def test_a_bulk_delta_leaves_its_changes_dirty_and_a_small_one_does_not() -> None:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(pb.MetadataRecord(topic=pb.TopicRecord(name="t", topic_id="t")))
    for partition_id in range(rejoin_index.LAZY_MIN_CHANGES):
        delta.replay(
            pb.MetadataRecord(
                partition=pb.PartitionRecord(
                    topic_id="t", partition_id=partition_id, replicas=[1, 2], isr=[1, 2], leader=1
                )
            )
        )
    image = delta.apply()
    index = RejoinIndex()
    index.rebuild(image.topics_by_id)

    def moved(partition_ids: range) -> MetadataImage:
        """Broker 1 leaves the ISR of ``partition_ids`` (2 leads: not the preferred leader, unsettled)."""
        change = MetadataDelta(image)
        for partition_id in partition_ids:
            change.replay(
                pb.MetadataRecord(
                    partition_change=pb.PartitionChangeRecord(
                        topic_id="t", partition_id=partition_id, isr=pb.BrokerIdList(ids=[2]), leader=2
                    )
                )
            )
        after = change.apply()
        index.advance(change, after.topics_by_id)
        return after

    image = moved(range(1))  # one change: flagged at once
    assert not index.settling and index._flags == {"t": {0: (1, 2)}}
    image = moved(range(rejoin_index.LAZY_MIN_CHANGES))  # a bulk delta: counts now, flags later
    assert index.settling and index._flags == {"t": {0: (1, 2)}}
    assert index.leader_counts[2] == rejoin_index.LAZY_MIN_CHANGES and index.leader_counts[1] == 0
    assert not index.settle_some(10) and index.settling
    assert index.flagged_count(1) == rejoin_index.LAZY_MIN_CHANGES  # a query settles the rest first
    assert not index.settling
    assert_same_structure(index, image)


def test_an_unsettled_query_finds_dirty_partitions_without_settling_them() -> None:
    # A bulk delta takes every partition's leader away (an offline topic): its flags are dirty (stale:
    # settled, nothing flagged).  The query for leaderless partitions (an unclean ElectLeaders) asks each
    # dirty partition itself: all of them, in scan order, and the settling is left to its slices.
    size = rejoin_index.LAZY_MIN_CHANGES + 6
    delta = MetadataDelta(MetadataImage.empty())
    for name in ("a", "b"):
        delta.replay(pb.MetadataRecord(topic=pb.TopicRecord(name=name, topic_id=name)))
        for partition_id in range(size):
            delta.replay(
                pb.MetadataRecord(
                    partition=pb.PartitionRecord(
                        topic_id=name, partition_id=partition_id, replicas=[1, 2], isr=[1, 2], leader=1
                    )
                )
            )
    image = delta.apply()
    index = RejoinIndex()
    index.rebuild(image.topics_by_id)
    assert not index._flags  # all settled
    change = MetadataDelta(image)
    for partition_id in range(size):
        offline = pb.PartitionChangeRecord(topic_id="b", partition_id=partition_id, leader=-1)
        change.replay(pb.MetadataRecord(partition_change=offline))
    image = change.apply()
    index.advance(change, image.topics_by_id)
    assert index.settling and not index._flags
    got = index.unsettled(image.topics_by_id, _leaderless)
    assert [(t.topic_id, p) for t, p, _ in got] == [("b", p) for p in range(size)]
    assert index.unsettled(image.topics_by_id, _leaderless, ["a"]) == []
    assert sum(len(ids) for ids in index._dirty.values()) == size  # nothing settled by the queries
    assert_unsettled_queries_match_a_scan(index, image)
    while not index.settle_some(7):
        pass
    assert_same_structure(index, image)
    assert [(t.topic_id, p) for t, p, _ in index.unsettled(image.topics_by_id, _leaderless)] == [
        ("b", p) for p in range(size)
    ]
