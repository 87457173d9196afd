"""RejoinIndex against the full scan it replaces: the same build_change records, in the same order, for
any image (arbitrary replica lists, ISRs, leaders; topics created, changed, removed, re-created) and any
broker states, with the index following the images delta by delta or rebuilt from scratch."""

from __future__ import annotations

import gc
import weakref
from collections import Counter
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import rejoin_index
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import (
    LEADER_RECOVERED,
    LEADER_RECOVERING,
    MetadataImage,
    PartitionRegistration,
    TopicImage,
)
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
    """The oracle: ControllerLogic._partitions_of + build_change, as before the index — the unfence's
    election, which adds nothing to the ISR (leaders add caught-up replicas by AlterPartition)."""
    assert isinstance(topics, MetadataImage)
    found = []
    for topic, partition_id, partition in topics.iter_partitions():
        if broker_id in partition.replicas:
            change = build_change(topic.topic_id, partition_id, partition, acceptable)
            if change is not None:
                found.append(change)
    return found


def index_changes(
    index: RejoinIndex, image: MetadataImage, broker_id: int, acceptable: Callable[[int], bool]
) -> list[pb.PartitionChangeRecord]:
    found = []
    for topic, partition_id, partition in index.candidates(image.topics_by_id, broker_id, acceptable):
        assert broker_id in partition.replicas
        change = build_change(topic.topic_id, partition_id, partition, acceptable)
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


@settings(max_examples=600, deadline=None)
@given(
    replicas=ID_LISTS,
    isr=ID_LISTS,
    leader=IDS,
    same=st.booleans(),
    elr=ID_LISTS,
    lke=ID_LISTS,
    recovering=st.booleans(),
    broker_id=st.integers(0, 6),
    accepted=st.frozensets(st.integers(-1, 6)),
    min_isr=st.integers(1, 4),
    unclean=st.booleans(),
)
def test_an_unflagged_replica_is_left_alone_unless_its_leader_is_unacceptable(
    replicas: list[int],
    isr: list[int],
    leader: int,
    same: bool,
    elr: list[int],
    lke: list[int],
    recovering: bool,
    broker_id: int,
    accepted: frozenset[int],
    min_isr: int,
    unclean: bool,
) -> None:
    """The claim the index rests on, for one partition: if the unfence's election (build_change, nothing
    added to the ISR; any min ISR, unclean elections on or off) changes it, the replica is flagged or
    the leader is not acceptable (and leads).  ELR and last known ELR drawn apart from the ISR (often
    empty), so stable partitions come up as often as unsettled ones."""
    replica_ids = tuple(replicas)
    partition = PartitionRegistration(
        replica_ids,
        replica_ids if same else tuple(isr),
        leader,
        0,
        0,
        tuple(elr[: len(elr) // 2]),  # (half the draws: empty)
        tuple(lke[: len(lke) // 2]),
        LEADER_RECOVERING if recovering else LEADER_RECOVERED,
    )
    ok = accepted | {broker_id}
    if broker_id not in partition.replicas:
        return
    change = build_change("t", 0, partition, ok.__contains__, min_isr=min_isr, unclean_election=unclean)
    if change is not None:
        assert broker_id in flagged_replicas(partition) or (leader != -1 and leader not in ok)


def test_a_fenced_leaders_partitions_are_not_candidates_of_its_unfence() -> None:
    """What a fence leaves (broker 1 out of the ISR of each partition it led, the next replica leading)
    is stable: nobody is flagged, and broker 1's unfence has no candidate — the scan's election changes
    none of them (session 20: 100,000 such candidates cost ~0.42 s of the unfence).  The preferred
    replica back in the ISR (AlterPartition) flags the partition again: the election restores it."""
    fenced = tuple(PartitionRegistration((1, 2, 3), (2, 3), 2, 1, 1) for _ in range(4))
    topic = TopicImage("a", "a", fenced)
    image = MetadataImage(0, 0, {}, {"a": topic}, {"a": "a"}, {}, {})
    index = RejoinIndex()
    index.rebuild(image.topics_by_id)
    acceptable = {1, 2, 3}.__contains__
    assert index._by_broker == {} and index._flags == {}
    assert list(index.candidates(image.topics_by_id, 1, acceptable)) == []
    assert scan_changes(image, 1, acceptable) == []
    back = PartitionRegistration((1, 2, 3), (1, 2, 3), 2, 1, 2)  # in sync again, 2 still leading
    topic = TopicImage("a", "a", (back, *fenced[1:]))
    image = MetadataImage(0, 0, {}, {"a": topic}, {"a": "a"}, {}, {})
    index.rebuild(image.topics_by_id)
    assert index._flags == {"a": {0: (1, 2, 3)}}
    assert index_changes(index, image, 3, acceptable) == scan_changes(image, 3, acceptable) != []


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
                    # the preferred replica in sync, not leading: the unfence's election restores it
                    topic_id=topic_id,
                    partition_id=0,
                    replicas=[1, 2],
                    isr=[1, 2],
                    leader=2,
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
        """Broker 2 leads ``partition_ids``, broker 1 still in sync (the preferred leader in the ISR, not
        leading: unsettled)."""
        change = MetadataDelta(image)
        for partition_id in partition_ids:
            change.replay(
                pb.MetadataRecord(
                    partition_change=pb.PartitionChangeRecord(
                        topic_id="t", partition_id=partition_id, leader=2
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


# ---- the rejoin job's walk (session 21) ----


def a_slice(
    source: Iterator[tuple[TopicImage, int, PartitionRegistration]],
    image: MetadataImage,
    acceptable: Callable[[int], bool],
    budget: int,
    min_isr: int,
    unclean: bool,
) -> tuple[list[pb.PartitionChangeRecord], bool]:
    """One slice of a rejoin job (ControllerLogic._run_rejoin_jobs without its time bounds): elections on
    ``image`` for what ``source`` hands out until ``budget`` changes; True when it found its end."""
    changes: list[pb.PartitionChangeRecord] = []
    while len(changes) < budget:
        taken = next(source, None)
        if taken is None:
            return changes, True
        topic = image.topics_by_id.get(taken[0].topic_id)
        if topic is None or taken[1] >= len(topic.partitions):
            continue  # deleted meanwhile
        change = build_change(
            topic.topic_id,
            taken[1],
            topic.partitions[taken[1]],
            acceptable,
            min_isr=min_isr,
            unclean_election=unclean,
        )
        if change is not None:
            changes.append(change)
    return changes, False


def scan_of(image: MetadataImage, broker_id: int) -> Iterator[tuple[TopicImage, int, PartitionRegistration]]:
    """The scan oracle's source (ControllerLogic._partitions_of): every partition of the broker in the
    image of the query, in scan order, elected on the image of the slice that reaches it."""
    return ((t, p, r) for t, p, r in list(image.iter_partitions()) if broker_id in r.replicas)


_CHANGES = st.lists(records(), max_size=4).map(
    lambda bundles: [b for b in bundles if b[0].HasField("partition_change")]
)


_ANY_RECORDS = st.lists(records(), max_size=3)


@pytest.mark.parametrize("lazy_min_changes", [rejoin_index.LAZY_MIN_CHANGES, 0])
@settings(max_examples=300, deadline=None)
@given(
    start=st.lists(st.lists(records(), min_size=1, max_size=5), min_size=1, max_size=4),
    broker_id=st.integers(0, 5),
    accepted=st.frozensets(st.integers(-1, 6)),
    slices=st.lists(
        st.tuples(
            _CHANGES,  # another writer's partition changes before the slice
            _ANY_RECORDS,  # ... and other records (topics too), with ``topic_records``
            st.frozensets(st.integers(-1, 6)),  # the brokers acceptable at the slice, with ``moving``
            st.sampled_from([1, 1, 2, 3]),  # its room for changes (filled: the job comes back)
            st.integers(1, 3),  # min ISR
            st.booleans(),  # unclean elections
        ),
        min_size=1,
        max_size=8,
    ),
    topic_records=st.booleans(),
    moving=st.booleans(),
    blind=st.sampled_from(["never", "never", "rebuild", "stale"]),
    blind_at=st.integers(0, 7),
)
def test_a_walk_elects_what_a_scan_of_each_slice_elects(
    start: list[list[list[pb.MetadataRecord]]],
    broker_id: int,
    accepted: frozenset[int],
    slices: list[
        tuple[list[list[pb.MetadataRecord]], list[list[pb.MetadataRecord]], frozenset[int], int, int, bool]
    ],
    topic_records: bool,
    moving: bool,
    blind: str,
    blind_at: int,
    lazy_min_changes: int,
) -> None:
    """A rejoin job's slices, each after another writer's records (changing partitions; with
    ``topic_records`` also adding, removing or re-creating partitions and topics), with the brokers
    acceptable at the query (or, ``moving``, any: leaders becoming unacceptable with their partitions
    unchanged, the walk's fall-back to the scan), the index following, or at slice ``blind_at`` rebuilt
    behind the walk or left stale: the walk's elections are the scan's, slice by slice, and it ends in
    the same slice.  Each slice's elections are applied too (the job's own changes reach its watch).
    (Partition changes without the rest, mostly: a TopicRecord for an id of the query's image or a blind
    index make the walk fall back to the scan, so what its watch does would seldom be tested.)"""
    image = MetadataImage.empty()
    index = RejoinIndex()
    index.lazy_min_changes = lazy_min_changes
    index.rebuild(image.topics_by_id)

    def apply(records: list[pb.MetadataRecord], how: str = "never") -> None:
        nonlocal image
        delta = MetadataDelta(image)
        for record in records:
            delta.replay(record)
        image = delta.apply()
        if how != "never":
            index.invalidate()  # a reset or a write behind the index's back
        index.advance(delta, image.topics_by_id)
        if how == "rebuild":
            index.rebuild(image.topics_by_id)  # following again, having missed the changes

    for group in start:
        apply([record for bundle in group for record in bundle])
    ok = (accepted | {broker_id}).__contains__
    walk = index.walk(image.topics_by_id, broker_id, ok)
    scan = scan_of(image, broker_id)
    for step, (changes, others, accepted_now, budget, min_isr, unclean) in enumerate(slices):
        written = changes + others if topic_records else changes
        apply([record for bundle in written for record in bundle], blind if step == blind_at else "never")
        acceptable = accepted_now.__contains__ if moving else ok
        walk.at_slice(image.topics_by_id, acceptable)
        got, walk_ended = a_slice(walk, image, acceptable, budget, min_isr, unclean)
        want, scan_ended = a_slice(scan, image, acceptable, budget, min_isr, unclean)
        assert got == want
        assert walk_ended == scan_ended
        apply([pb.MetadataRecord(partition_change=change) for change in got])
        if walk_ended:
            break


def test_a_walk_hands_out_partitions_changed_since_its_query_past_its_last() -> None:
    """Broker 1 was fenced (out of each ISR, 2 leading): nothing flagged but partition 3, leaderless with
    1 in its ISR.  After 3 is handed out, partitions 0, 1 and 5 get every replica back in the ISR (an
    election would restore 1, the preferred leader): the walk hands out 5 only (0 and 1 are behind it,
    as for the scan), then ends; a change after its end is handed out by the next ``next()`` (the scan's
    next slice would visit that partition)."""
    fenced = PartitionRegistration((1, 2, 3), (2, 3), 2, 1, 1)
    leaderless = PartitionRegistration((1, 2, 3), (1,), -1, 1, 1)
    topic = TopicImage("a", "a", (fenced, fenced, fenced, leaderless, fenced, fenced, fenced))
    image = MetadataImage(0, 0, {}, {"a": topic}, {"a": "a"}, {}, {})
    index = RejoinIndex()
    index.rebuild(image.topics_by_id)
    acceptable = {1, 2, 3}.__contains__
    walk = index.walk(image.topics_by_id, 1, acceptable)
    walk.at_slice(image.topics_by_id, acceptable)
    assert next(walk)[1] == 3

    def in_sync(partition_ids: list[int]) -> None:
        nonlocal image
        delta = MetadataDelta(image)
        for partition_id in partition_ids:
            delta.replay(
                pb.MetadataRecord(
                    partition_change=pb.PartitionChangeRecord(
                        topic_id="a", partition_id=partition_id, isr=pb.BrokerIdList(ids=[1, 2, 3])
                    )
                )
            )
        image = delta.apply()
        index.advance(delta, image.topics_by_id)

    in_sync([5, 0, 1])
    walk.at_slice(image.topics_by_id, acceptable)
    assert [p for _, p, _ in walk] == [5]
    in_sync([6])
    assert [p for _, p, _ in walk] == [6]


def test_a_walk_scans_the_rest_when_a_leader_becomes_unacceptable() -> None:
    """Stable partitions of broker 1 led by 2 (no candidate), then 2 is not acceptable (fenced, its
    leave job not there yet) with its partitions unchanged: each would move, so the walk hands out every
    partition of 1 past its last — here all, in scan order."""
    fenced = PartitionRegistration((1, 2, 3), (2, 3), 2, 1, 1)
    other = PartitionRegistration((3, 4), (3, 4), 3, 0, 0)
    topic = TopicImage("a", "a", (fenced, other, fenced))
    image = MetadataImage(0, 0, {}, {"a": topic}, {"a": "a"}, {}, {})
    index = RejoinIndex()
    index.rebuild(image.topics_by_id)
    walk = index.walk(image.topics_by_id, 1, {1, 2, 3, 4}.__contains__)
    walk.at_slice(image.topics_by_id, {1, 2, 3, 4}.__contains__)
    assert next(walk, None) is None
    walk.at_slice(image.topics_by_id, {1, 3, 4}.__contains__)
    assert [p for _, p, _ in walk] == [0, 2]


def test_a_walk_scans_the_rest_when_the_index_missed_changes() -> None:
    """An image replaced behind the index (alter_partition's writes, a reset) leaves the watch blind:
    the walk scans the rest — also once the index follows again after a rebuild."""
    fenced = PartitionRegistration((1, 2, 3), (2, 3), 2, 1, 1)
    topic = TopicImage("a", "a", (fenced, fenced))
    image = MetadataImage(0, 0, {}, {"a": topic}, {"a": "a"}, {}, {})
    acceptable = {1, 2, 3}.__contains__
    for rebuilt in (False, True):
        index = RejoinIndex()
        index.rebuild(image.topics_by_id)
        walk = index.walk(image.topics_by_id, 1, acceptable)
        delta = MetadataDelta(image)
        delta.replay(
            pb.MetadataRecord(
                partition_change=pb.PartitionChangeRecord(
                    topic_id="a", partition_id=1, isr=pb.BrokerIdList(ids=[1, 2, 3])
                )
            )
        )
        later = delta.apply()  # not advanced: the index still follows ``image``
        if rebuilt:
            index.rebuild(later.topics_by_id)
        walk.at_slice(later.topics_by_id, acceptable)
        assert [p for _, p, _ in walk] == [0, 1]


def test_a_dropped_walk_is_freed_at_once_and_no_longer_watched() -> None:
    """A job dropped (done, its broker fenced again, a reset) takes its walk with it by reference
    counting (no cycle through its generators), so later deltas do not feed a dead watch until a
    collection — the controller's collector may be frozen or off for long stretches."""
    topic = TopicImage("a", "a", (PartitionRegistration((1, 2), (2,), -1, 1, 1),) * 3)
    image = MetadataImage(0, 0, {}, {"a": topic}, {"a": "a"}, {}, {})
    index = RejoinIndex()
    index.rebuild(image.topics_by_id)
    gc.disable()
    try:
        walk = index.walk(image.topics_by_id, 1, {1, 2}.__contains__)
        next(walk)
        walk.at_slice(image.topics_by_id, {1, 2}.__contains__)
        gone = weakref.ref(walk)
        assert len(index._walks) == 1
        del walk
        assert gone() is None
        assert len(index._walks) == 0
    finally:
        gc.enable()
