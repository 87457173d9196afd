"""A prepared topic's PartitionRecords are encoded as they are built (session 17, issue #17).

- :func:`new_partition_value` gives exactly the bytes ``encode_value`` gives the record
  ``ControllerLogic._new_partitions`` builds from the same fields — any topic id, partition id, replica
  list, ISR (the replicas' tuple itself, or any other) and leader, int32 extremes and negatives included —
  and the follower's direct read (``plain_partition``) takes the bulk creation's shape;
- a prepared topic's write appends, byte for byte, what one unsliced CreateTopics event writes for it,
  with brokers fenced before its plan (ISRs short of the replicas) or between its preparation and its
  write (its records rebuilt at the write);
- preparing keeps no protobuf message per partition;
- :func:`change_value` gives exactly the bytes ``encode_value`` gives a PartitionChangeRecord of a
  partition id, topic id, maybe an ISR and maybe a leader (session 18: a leave's common change).
"""

from __future__ import annotations

import gc
from typing import Any

from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.clock import Deadline
from kraft.metadata import records as rec
from kraft.metadata.change_decode import plain_partition
from kraft.metadata.delta import apply_partition_change
from kraft.metadata.image import PartitionRegistration
from kraft.metadata.partition_change import build_change, build_change_encoded
from kraft.metadata.partition_encode import change_value, full_change_value, new_partition_value, topic_field
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

from .test_bulk_create_paths import BROKERS, CLUSTER, _fence, _logic
from .test_shutdown_slices import _partitions

INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
IDS = st.one_of(
    st.integers(min_value=0, max_value=127),  # one byte
    st.integers(min_value=128, max_value=5_000),  # two bytes, in and past the table
    INT32,  # anything: negatives are 10 bytes
)
TOPIC_IDS = st.one_of(
    st.from_regex(r"[A-Za-z0-9_-]{22}", fullmatch=True),  # what TopicIds gives
    st.just(""),
    st.text(max_size=200),  # non-ASCII, and longer than one length byte
)


def _record(
    topic_id: str, partition_id: int, replicas: tuple[int, ...], isr: list[int], leader: int
) -> bytes:
    """What the unprepared path writes: ``_new_partitions``' record, through ``encode_value``."""
    record = pb.MetadataRecord()
    partition = record.partition
    partition.partition_id = partition_id
    partition.topic_id = topic_id
    partition.replicas.extend(replicas)
    partition.isr.extend(isr)
    partition.leader = leader
    return rec.encode_value(record)


@settings(max_examples=3_000, deadline=None)
@given(
    topic_id=TOPIC_IDS,
    partition_id=st.one_of(st.integers(min_value=0, max_value=5_000), INT32),
    replicas=st.lists(IDS, max_size=12),
    isr=st.one_of(st.none(), st.lists(IDS, max_size=12)),
    leader=st.one_of(st.sampled_from([-1, 0]), IDS),
)
def test_a_new_partitions_value_is_the_bytes_encode_value_gives(
    topic_id: str, partition_id: int, replicas: list[int], isr: list[int] | None, leader: int
) -> None:
    ids = tuple(replicas)
    in_sync: tuple[int, ...] | list[int] = ids if isr is None else isr  # None: the very tuple (common)
    value = new_partition_value(topic_field(topic_id), partition_id, ids, in_sync, leader)
    assert value == _record(topic_id, partition_id, ids, list(in_sync), leader)


@settings(max_examples=500, deadline=None)
@given(
    partition_id=st.integers(min_value=0, max_value=200_000),
    replicas=st.lists(st.integers(min_value=0, max_value=20_000), min_size=1, max_size=5, unique=True),
    all_in=st.booleans(),
)
def test_the_bulk_creations_shape_is_read_back_directly_by_a_follower(
    partition_id: int, replicas: list[int], all_in: bool
) -> None:
    ids = tuple(replicas)
    isr = ids if all_in else ids[:1]
    value = new_partition_value(topic_field("AAAAAAAAAAAAAAAAAAAAAA"), partition_id, ids, isr, ids[0])
    assert value == _record("AAAAAAAAAAAAAAAAAAAAAA", partition_id, ids, list(isr), ids[0])
    assert plain_partition(value) == ("AAAAAAAAAAAAAAAAAAAAAA", partition_id, ids, isr, ids[0], 0, 0)


@settings(max_examples=3_000, deadline=None)
@given(
    topic_id=TOPIC_IDS,
    partition_id=st.one_of(st.integers(min_value=0, max_value=5_000), INT32),
    isr=st.one_of(st.none(), st.lists(IDS, max_size=12)),
    leader=st.one_of(st.none(), st.sampled_from([-1, 0]), IDS),
)
def test_a_changes_value_is_the_bytes_encode_value_gives(
    topic_id: str, partition_id: int, isr: list[int] | None, leader: int | None
) -> None:
    """``leave_change``'s record (session 18): the ISR set when given (an empty one too: present,
    emptied), the leader when given (0 and -1 included)."""
    record = pb.MetadataRecord()
    change = record.partition_change
    change.partition_id = partition_id
    change.topic_id = topic_id
    if isr is not None:
        change.isr.ids.extend(isr)
    if leader is not None:
        change.leader = leader
    assert change_value(topic_field(topic_id), partition_id, isr, leader) == rec.encode_value(record)


ASSIGNMENTS = st.lists(st.permutations(range(1, BROKERS + 1)).map(lambda p: p[:3]), min_size=1, max_size=40)
FENCED = st.sets(st.integers(min_value=1, max_value=BROKERS), max_size=3)


@settings(max_examples=60, deadline=None)
@given(assignment=ASSIGNMENTS, fenced=FENCED, after_preparing=st.booleans())
def test_a_prepared_topics_append_is_the_unsliced_createtopics_one(
    assignment: list[tuple[int, ...]], fenced: set[int], after_preparing: bool
) -> None:
    """``fenced`` fenced before the plan (its partitions' ISRs leave them out: the general encoding) or,
    ``after_preparing``, between the preparation and the write (the write rebuilds its records, encoded
    as they are added); the unsliced CreateTopics runs with the same brokers fenced."""
    # every partition keeps an acceptable replica (else both refuse it)
    assignment = [r for r in assignment if set(r) - fenced] or [tuple(sorted(set(range(1, 7)) - fenced)[:1])]
    topic = cpb.CreatableTopic(name="assigned", configs=[cpb.TopicConfig(name="retention.ms", value="9")])
    for partition, replicas in enumerate(assignment):
        topic.assignments.add(partition=partition, broker_ids=replicas)
    request = cpb.CreateTopicsRequest(cluster_id=CLUSTER, topics=[topic])

    whole, whole_log = _logic()
    for broker_id in sorted(fenced):
        _fence(whole, whole_log, broker_id)
    expected = whole.create_topics(request, len(whole_log))

    logic, log = _logic()
    if not after_preparing:
        for broker_id in sorted(fenced):
            _fence(logic, log, broker_id)
    outcome, plan = logic.plan_topic(request, len(log), prepared=True)
    assert plan is not None, outcome.response
    while not logic.prepare_some(plan, Deadline(None, 0), 7):
        pass
    if after_preparing:
        for broker_id in sorted(fenced):
            _fence(logic, log, broker_id)
    written = logic.create_prepared_topic(plan, False, len(log))

    assert written.response == expected.response
    assert written.response.topics[0].error_code == 0, written.response.topics[0].error_message
    assert written.values is not None  # appended as values (``records`` decodes them)
    assert written.encoded() == expected.encoded()
    assert logic.image.topic("assigned") == whole.image.topic("assigned")


def _messages() -> int:
    return sum(1 for o in gc.get_objects() if isinstance(o, Message))


def test_preparing_keeps_no_protobuf_message_per_partition() -> None:
    logic, log = _logic()
    request = cpb.CreateTopicsRequest(
        cluster_id=CLUSTER, topics=[cpb.CreatableTopic(name="many", num_partitions=600, replication_factor=3)]
    )
    outcome, plan = logic.plan_topic(request, len(log), prepared=True)
    assert plan is not None, outcome.response
    gc.collect()
    before = _messages()
    while not logic.prepare_some(plan, Deadline(None, 0), 100):
        pass
    gc.collect()
    assert _messages() - before < 10  # was one MetadataRecord per partition (600) before session 17
    assert len(plan.prepared_values) == 600 and all(type(v) is bytes for v in plan.prepared_values)
    written = logic.create_prepared_topic(plan, False, len(log))
    assert written.values is not None and len(written.values) == 1 + 600


ID_LISTS = st.one_of(st.none(), st.lists(IDS, max_size=6))
OPTIONAL_INT32 = st.one_of(st.none(), st.sampled_from([0, 1, -1]), INT32)


@settings(max_examples=400, deadline=None)
@given(
    topic_id=TOPIC_IDS,
    partition_id=st.one_of(st.integers(min_value=0, max_value=5_000), INT32),
    isr=ID_LISTS,
    leader=st.one_of(st.none(), st.sampled_from([-1, 0]), IDS),
    elr=ID_LISTS,
    lke=ID_LISTS,
    recovery=OPTIONAL_INT32,
    unclean_epoch=OPTIONAL_INT32,
)
def test_any_changes_value_is_the_bytes_encode_value_gives(
    topic_id: str,
    partition_id: int,
    isr: list[int] | None,
    leader: int | None,
    elr: list[int] | None,
    lke: list[int] | None,
    recovery: int | None,
    unclean_epoch: int | None,
) -> None:
    """``change_record``'s fields (session 19: elections, a sole replica's leave): every list present
    when given (an empty one too: present, emptied), every optional int when given (0 included)."""
    record = pb.MetadataRecord()
    change = record.partition_change
    change.partition_id = partition_id
    change.topic_id = topic_id
    for field, ids in (("isr", isr), ("eligible_leader_replicas", elr), ("last_known_elr", lke)):
        if ids is not None:
            getattr(change, field).SetInParent()
            getattr(change, field).ids.extend(ids)
    if leader is not None:
        change.leader = leader
    if recovery is not None:
        change.leader_recovery_state = recovery
    if unclean_epoch is not None:
        change.last_unclean_leader_epoch = unclean_epoch
    value = full_change_value(
        topic_field(topic_id), partition_id, isr, leader, elr, lke, recovery, unclean_epoch
    )
    assert value == rec.encode_value(record)


@settings(max_examples=400, deadline=None)
@given(
    current=_partitions(),
    acceptable=st.sets(st.integers(min_value=1, max_value=5)),
    remove=st.one_of(st.none(), st.integers(min_value=1, max_value=5)),
    add=st.lists(st.integers(min_value=1, max_value=5), max_size=2),
    min_isr=st.integers(1, 4),
    unclean_shutdown=st.sets(st.integers(min_value=1, max_value=5), max_size=1),
    unclean_election=st.booleans(),
    topic_id=st.sampled_from(["T", "AAAAAAAAAAAAAAAAAAAAAA"]),
    partition_id=st.integers(min_value=0, max_value=5_000),
)
def test_an_encoded_change_is_the_records_bytes_and_replay(
    current: PartitionRegistration,
    acceptable: set[int],
    remove: int | None,
    add: list[int],
    min_isr: int,
    unclean_shutdown: set[int],
    unclean_election: bool,
    topic_id: str,
    partition_id: int,
) -> None:
    """``build_change_encoded`` (session 19: an unfence's elections and the rare leave shapes in a batch
    of values) decides as ``build_change`` and gives ``encode_value``'s bytes of its record and the
    registration replaying that record gives."""
    rules: dict[str, Any] = {
        "min_isr": min_isr,
        "unclean_shutdown": tuple(unclean_shutdown),
        "unclean_election": unclean_election,
    }
    accept = acceptable.__contains__
    adding = tuple(add)  # () is build_change's default: its fast path looks at it by equality
    expected = build_change(topic_id, partition_id, current, accept, remove, adding, **rules)
    got = build_change_encoded(topic_field(topic_id), partition_id, current, accept, remove, adding, **rules)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert got[0] == rec.encode_value(rec.wrap(expected))
    assert got[1] == apply_partition_change(current, expected)
    assert rec.decode_value(got[0]).partition_change == expected  # a follower reads it as the record
