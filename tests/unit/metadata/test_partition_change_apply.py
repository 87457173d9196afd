"""``apply_partition_change``: what every follower and broker does with each PartitionChangeRecord it
replays.  Its common shape (ISR and/or leader onto a registration without ELR, recovery state or unclean
epoch) has a path of its own (session 14); both paths must give what the record says, field by field."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.metadata import records
from kraft.metadata.delta import apply_partition_change
from kraft.metadata.image import LEADER_RECOVERED, LEADER_RECOVERING, PartitionRegistration
from kraft.v1 import metadata_pb2 as pb

_lists = st.lists(st.integers(min_value=-1, max_value=5), max_size=4).map(tuple)
_leader_epochs = st.tuples(
    st.integers(min_value=-1, max_value=5),
    st.integers(min_value=0, max_value=9),
    st.integers(min_value=0, max_value=9),
)  # leader, leader epoch, partition epoch


@st.composite
def _registrations(draw: st.DrawFn) -> PartitionRegistration:
    replicas = draw(_lists)
    isr = replicas if draw(st.booleans()) else draw(_lists)
    if draw(st.booleans()):  # the common shape in half of them
        return PartitionRegistration(replicas, isr, *draw(_leader_epochs))
    # else each rarer field off its default in half of them, independently (each alone in 1/16)
    return PartitionRegistration(
        replicas,
        isr,
        *draw(_leader_epochs),
        draw(st.just(()) | _lists),
        draw(st.just(()) | _lists),
        draw(st.just(LEADER_RECOVERED) | st.just(LEADER_RECOVERING)),
        draw(st.just(0) | st.integers(min_value=1, max_value=9)),
    )


@st.composite
def _changes(draw: st.DrawFn, current: PartitionRegistration) -> pb.PartitionChangeRecord:
    """A change setting any subset of the fields (ISR and leader most often), sometimes to the values
    ``current`` already holds; decoded from its bytes, as a follower gets it."""
    change = pb.PartitionChangeRecord(topic_id="T", partition_id=0)
    if draw(st.booleans()):
        change.isr.ids.extend(current.replicas if draw(st.booleans()) else draw(_lists))
    if draw(st.booleans()):
        change.leader = draw(st.integers(min_value=-1, max_value=5))
    field = draw(  # at most one of the rarer fields (each in ~1/6 of the changes)
        st.sampled_from(
            [
                None,
                "replicas",
                "eligible_leader_replicas",
                "last_known_elr",
                "leader_recovery_state",
                "last_unclean_leader_epoch",
            ]
        )
    )
    if field in ("leader_recovery_state", "last_unclean_leader_epoch"):
        setattr(change, field, draw(st.integers(min_value=0, max_value=9)))
    elif field is not None:
        getattr(change, field).ids.extend(draw(_lists))
    decoded = records.decode_value(records.encode_value(records.wrap(change)))
    return decoded.partition_change


def _expected(current: PartitionRegistration, r: pb.PartitionChangeRecord) -> PartitionRegistration:
    """The record's meaning spelled out: a field present replaces, an absent one keeps, both epochs bump."""
    return PartitionRegistration(
        tuple(r.replicas.ids) if r.HasField("replicas") else current.replicas,
        tuple(r.isr.ids) if r.HasField("isr") else current.isr,
        r.leader if r.HasField("leader") else current.leader,
        current.leader_epoch + 1,
        current.partition_epoch + 1,
        tuple(r.eligible_leader_replicas.ids) if r.HasField("eligible_leader_replicas") else current.elr,
        tuple(r.last_known_elr.ids) if r.HasField("last_known_elr") else current.last_known_elr,
        r.leader_recovery_state if r.HasField("leader_recovery_state") else current.leader_recovery_state,
        r.last_unclean_leader_epoch
        if r.HasField("last_unclean_leader_epoch")
        else current.last_unclean_leader_epoch,
    )


@settings(max_examples=500)  # a break of the common shape's guard shows in 1/32 of the examples or more
@given(st.data())
def test_a_change_gives_what_its_fields_say_on_either_path(data: st.DataObject) -> None:
    current = data.draw(_registrations())
    change = data.draw(_changes(current))
    got = apply_partition_change(current, change)
    assert got == _expected(current, change)
    assert type(got) is PartitionRegistration
    if got.isr == got.replicas:
        assert got.isr is got.replicas  # one shared tuple (what the image's memory counts on)


def test_the_common_shape_keeps_the_replicas_and_bumps_both_epochs() -> None:
    current = PartitionRegistration((1, 2, 3), (1, 2, 3), 1, 4, 7)
    change = pb.PartitionChangeRecord(topic_id="T", partition_id=0, leader=2)
    change.isr.ids.extend([2, 3])
    assert apply_partition_change(current, change) == PartitionRegistration((1, 2, 3), (2, 3), 2, 5, 8)
    back = pb.PartitionChangeRecord(topic_id="T", partition_id=0)
    back.isr.ids.extend([1, 2, 3])
    rejoined = apply_partition_change(PartitionRegistration((1, 2, 3), (2, 3), 2, 5, 8), back)
    assert rejoined == PartitionRegistration((1, 2, 3), (1, 2, 3), 2, 6, 9)
    assert rejoined.isr is rejoined.replicas
