"""A follower's registrations built in one C call (session 19, ``kraft/metadata/delta.py``): a new
partition read without upb and an ISR / leader change give the very registration — type, every field,
the shared tuples — that ``PartitionRegistration(...)`` and the general replay give; a topic's base
registration is looked up without ``len()`` and only for ids it holds."""

from __future__ import annotations

from kraft.metadata import delta as delta_module
from kraft.metadata import records
from kraft.metadata.change_decode import decode_replay_values
from kraft.metadata.chunked import CHUNK, ChunkedSequence
from kraft.metadata.delta import MetadataDelta, apply_isr_leader_change, apply_partition_change
from kraft.metadata.image import LEADER_RECOVERED, MetadataImage, PartitionRegistration
from kraft.v1 import metadata_pb2 as pb


def _healthy_fields(registration: PartitionRegistration) -> None:
    assert type(registration) is PartitionRegistration
    assert len(registration) == len(PartitionRegistration._fields)
    assert registration.elr == () and registration.last_known_elr == ()
    assert registration.leader_recovery_state == LEADER_RECOVERED
    assert registration.last_unclean_leader_epoch == 0


def _image(partitions: int) -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.TopicRecord(name="t", topic_id="T")), 1, 1)
    for p in range(partitions):
        replicas = [300 + p % 7, 5, 999]
        delta.replay(
            records.wrap(
                pb.PartitionRecord(
                    topic_id="T", partition_id=p, replicas=replicas, isr=replicas, leader=replicas[0]
                )
            )
        )
    return delta.apply()


def test_a_new_partition_read_without_upb_is_the_registration_upb_gives() -> None:
    """Every field and the type equal what the protobuf record's replay builds, the ISR the replicas'
    very tuple (or a tuple of its own when it differs)."""
    base = _image(0)
    values = [
        records.encode_value(
            records.wrap(
                pb.PartitionRecord(
                    topic_id="T",
                    partition_id=p,
                    replicas=[300, 5, 999],
                    isr=[300, 5, 999] if p else [300, 5],
                    leader=300,
                    leader_epoch=p,
                    partition_epoch=2 * p,
                )
            )
        )
        for p in range(3)
    ]
    decoded = list(decode_replay_values(values))
    assert all(type(one) is tuple for one in decoded)  # (the straight path, not upb)
    direct, general = MetadataDelta(base), MetadataDelta(base)
    direct.replay_decoded(decoded)
    for value in values:
        general.replay(records.decode_value(value))
    got = direct.apply().topics_by_id["T"].partitions
    expected = general.apply().topics_by_id["T"].partitions
    assert [tuple(r) for r in got] == [tuple(r) for r in expected]
    for registration, other in zip(got, expected, strict=True):
        _healthy_fields(registration)
        assert registration._asdict() == other._asdict()
    assert got[0].isr == (300, 5) and got[0].isr is not got[0].replicas
    assert got[1].isr is got[1].replicas and got[2].isr is got[2].replicas


def test_an_isr_leader_change_is_the_registration_the_general_change_gives() -> None:
    """``apply_isr_leader_change`` on a healthy registration: the type, every field, epochs bumped, the
    ISR the replicas' tuple when equal — as ``apply_partition_change`` of the same record."""
    current = PartitionRegistration((300, 5, 999), (300, 5, 999), 300, 4, 9)
    for isr, leader in (((5, 999), 5), (None, 999), ((300, 5, 999), None), ((), -1)):
        got = apply_isr_leader_change(current, isr, leader)
        change = pb.PartitionChangeRecord(topic_id="T", partition_id=0)
        if isr is not None:
            change.isr.ids.extend(isr)
        if leader is not None:
            change.leader = leader
        expected = apply_partition_change(current, change)
        _healthy_fields(got)
        assert got._asdict() == expected._asdict()
        assert (got.isr is got.replicas) == (got.isr == got.replicas)


def test_a_change_finds_its_base_registration_and_only_ids_the_topic_holds() -> None:
    """A topic of more than one chunk (its partitions a ChunkedSequence) and a small one (a tuple): a
    change of its last partition applies; one past its end and a negative id are unknown partitions, as
    the general replay says (never the registration counted from the end)."""
    for count in (CHUNK + 3, 3):
        base = _image(count)
        partitions = base.topics_by_id["T"].partitions
        assert isinstance(partitions, ChunkedSequence) == (count > CHUNK)
        values = [
            records.encode_value(
                records.wrap(
                    pb.PartitionChangeRecord(topic_id="T", partition_id=p, isr=pb.BrokerIdList(ids=[5]))
                )
            )
            for p in (count - 1, count, -1)
        ]
        direct, general = MetadataDelta(base), MetadataDelta(base)
        decoded = list(decode_replay_values(values))
        assert sum(type(one) is tuple for one in decoded) >= 2  # (read without upb: the path under test)
        direct.replay_decoded(decoded)
        for value in values:
            general.replay(records.decode_value(value))
        assert direct.replay_errors == general.replay_errors
        assert direct.replay_errors == [
            f"change of unknown partition T/{count}",
            "change of unknown partition T/-1",
        ]
        got = direct.apply().topics_by_id["T"].partitions
        assert got[count - 1].isr == (5,) and got[count - 1].leader_epoch == 1
        assert direct.apply().topics_by_id == general.apply().topics_by_id


def test_a_new_list_of_three_is_interned_in_order_and_cached() -> None:
    """``shared_ids`` of a new three-id list (its own path since session 19): the ids in their order, each
    the one shared int object of its value, and the same tuple for the next equal list."""
    first = delta_module.intern_ids((int("70001"), int("70002"), int("70003")))  # (ints > 256: own objects)
    ids = (int("70003"), int("70001"), int("70002"))
    assert ids[0] is not first[2]
    shared = delta_module.shared_ids(ids)
    assert shared == (70003, 70001, 70002)
    assert shared[0] is first[2] and shared[1] is first[0] and shared[2] is first[1]
    assert delta_module.shared_ids([70003, 70001, 70002]) is shared
    assert delta_module.shared_ids((int("70004"), int("70005"))) == (
        70004,
        70005,
    )  # (other lengths as before)
