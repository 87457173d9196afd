"""``isr_leader_change``: a PartitionChangeRecord's value bytes read without protobuf (session 15), against
upb.  Any value — what kraft writes, each rarer field set, hand-built wire encodings upb also accepts
(fields out of order or twice, unpacked ids, long and over-long varints, unknown fields), random bytes,
truncations — is either read to exactly upb's meaning, or left to upb (``None``), never read otherwise;
and what it reads applies to the registration ``apply_partition_change`` gives."""

from __future__ import annotations

from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.errors import KraftError
from kraft.metadata import records
from kraft.metadata.change_decode import (
    IsrLeaderChange,
    _change_common,
    decode_replay_values,
    isr_leader_change,
)
from kraft.metadata.delta import MetadataDelta, apply_isr_leader_change, apply_partition_change
from kraft.metadata.image import LEADER_RECOVERED, LEADER_RECOVERING, MetadataImage, PartitionRegistration
from kraft.v1 import metadata_pb2 as pb

from .value_damage import damaged

_INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_IDS = st.integers(min_value=-1, max_value=5) | _INT32
_ID_LISTS = st.lists(_IDS, max_size=5)
_TOPIC_IDS = st.sampled_from(["T", "", "AAAAAAAAAAAAAAAAAAAAAA"]) | st.text(max_size=24)
_COMMON = frozenset({"partition_id", "topic_id", "isr", "leader"})
_RARE_LISTS = (
    "replicas",
    "removing_replicas",
    "adding_replicas",
    "eligible_leader_replicas",
    "last_known_elr",
)
_RARE_INTS = ("leader_recovery_state", "last_unclean_leader_epoch")
# The strategies the composites below draw from, built once: a strategy built inside a composite is a new
# object at every draw, which Hypothesis validates again each time (~a third of these tests' time).  The
# same strategies, so the same choices give the same values.
_LEADERS = st.integers(min_value=-1, max_value=5) | _INT32


@st.composite
def _change_records(draw: st.DrawFn) -> pb.PartitionChangeRecord:
    """A change as kraft writes them: ISR and/or leader, and in a third of them one rarer field too."""
    change = pb.PartitionChangeRecord(topic_id=draw(_TOPIC_IDS), partition_id=draw(_INT32))
    if draw(st.booleans()):
        change.isr.ids.extend(draw(_ID_LISTS))
    if draw(st.booleans()):
        change.leader = draw(_LEADERS)
    if draw(st.integers(0, 2)) == 0:
        field = draw(st.sampled_from(_RARE_LISTS + _RARE_INTS))
        if field in _RARE_INTS:
            setattr(change, field, draw(_INT32))
        else:
            getattr(change, field).ids.extend(draw(_ID_LISTS))
    return change


def _varint(number: int, padding: int = 0) -> bytes:
    """``number`` (≥ 0, any size) as a varint, with ``padding`` redundant zero groups (upb accepts them
    while the varint stays within 10 bytes)."""
    out = bytearray()
    while number >= 0x80:
        out.append(number & 0x7F | 0x80)
        number >>= 7
    out.append(number)
    if padding:
        out[-1] |= 0x80
        out += b"\x80" * (padding - 1) + b"\x00"
    return bytes(out)


_RAW_NUMBERS = (
    st.integers(0, 300)
    | _INT32.map(lambda n: n & 0xFFFFFFFFFFFFFFFF)  # negatives as upb writes them: 10 bytes
    | st.integers(0, 2**70)  # past 32 bits (truncated), past 64 bits (malformed)
)


_PADDINGS = st.just(0) | st.integers(0, 4)


@st.composite
def _varints(draw: st.DrawFn) -> bytes:
    return _varint(draw(_RAW_NUMBERS), draw(_PADDINGS))


_VARINTS = _varints()
_VARINT_RUNS = st.lists(_VARINTS, max_size=4)
_PACKINGS = st.lists(st.booleans(), max_size=3)


@st.composite
def _isr_bodies(draw: st.DrawFn) -> bytes:
    """A BrokerIdList's bytes: packed runs (one, several, empty) and unpacked ids, in any mix."""
    body = b""
    for packed in draw(_PACKINGS):
        ids = draw(_VARINT_RUNS)
        if packed:
            run = b"".join(ids)
            body += b"\x0a" + _varint(len(run)) + run
        else:
            body += b"".join(b"\x08" + one for one in ids)
    return body


_ISR_BODIES = _isr_bodies()
_FIELD_NUMBERS = st.integers(1, 4) | st.integers(1, 12) | st.just(100)
_WIRE_TYPES = st.sampled_from([0, 2]) | st.integers(0, 7)
_STRING_BODIES = st.binary(max_size=8) | st.text(max_size=8).map(str.encode)
_BINARY_8 = st.binary(max_size=8)
_BINARY_9 = st.binary(max_size=9)


@st.composite
def _wire_fields(draw: st.DrawFn) -> bytes:
    """One field of a PartitionChangeRecord as bytes, any number (known or not), any wire type."""
    number = draw(_FIELD_NUMBERS)
    wire = draw(_WIRE_TYPES)
    tag = _varint(number << 3 | wire)
    if wire == 0:
        return tag + draw(_VARINTS)
    if wire == 2:
        if number == 3 or (number > 4 and draw(st.booleans())):
            body = draw(_ISR_BODIES)
        elif number == 2:
            body = draw(_STRING_BODIES)
        else:
            body = draw(_BINARY_8)
        return tag + _varint(len(body)) + body
    return tag + draw(_BINARY_9)


_CHANGE_RECORDS = _change_records()
_WIRE_FIELD_RUNS = st.lists(_wire_fields(), max_size=6)
_AFTERS = st.sampled_from([b"", b"\x7a\x00", b"\x7a\x02\x20\x01", b"\x20\x01"]) | st.binary(max_size=4)


def _frame(payload: bytes, after: bytes = b"") -> bytes:
    """The value of a MetadataRecord holding ``payload`` as its partition_change (then ``after``)."""
    return b"\x01\x05\x00\x7a" + _varint(len(payload)) + payload + after


@st.composite
def _values(draw: st.DrawFn) -> bytes:
    """What kraft writes, hand-built encodings, and each of them broken in some way."""
    if draw(st.booleans()):
        value = records.encode_value(records.wrap(draw(_CHANGE_RECORDS)))
    else:
        payload = b"".join(draw(_WIRE_FIELD_RUNS))
        # nothing; bytes; a second partition_change (upb merges it); an unknown field
        after = draw(_AFTERS)
        value = _frame(payload, after)
    _, value = damaged(draw, value, random_prefix=b"\x01\x05\x00\x7a")
    return value


def _upb(value: bytes) -> pb.MetadataRecord | tuple[type[KraftError], object, str]:
    try:
        return records.decode_value(value)
    except KraftError as exc:
        return type(exc), exc.code, exc.message


def _meaning(change: pb.PartitionChangeRecord) -> IsrLeaderChange:
    return (
        change.topic_id,
        change.partition_id,
        tuple(change.isr.ids) if change.HasField("isr") else None,
        change.leader if change.HasField("leader") else None,
    )


def _holds_only_the_common_fields(record: pb.MetadataRecord) -> bool:
    """No field but the four (none of them unknown to the schema) on the record or its ISR."""
    change = record.partition_change
    return (
        {f.name for f, _ in change.ListFields()} <= _COMMON
        and not len(UnknownFieldSet(record))
        and not len(UnknownFieldSet(change))
        and not len(UnknownFieldSet(change.isr))
    )


@settings(max_examples=3000)
@given(_values())
def test_a_value_is_read_as_upb_reads_it_or_left_to_upb(value: bytes) -> None:
    change = isr_leader_change(value)
    general = _upb(value)
    if change is not None:
        assert isinstance(general, pb.MetadataRecord), general
        assert general.WhichOneof("record") == "partition_change"
        assert _holds_only_the_common_fields(general)
        assert change == _meaning(general.partition_change)
    # the replay decoder: the same record, or the same error, or the tuple read above
    try:
        got: object = list(decode_replay_values([value]))
    except KraftError as exc:
        got = (type(exc), exc.code, exc.message)
    if change is not None:
        assert got == [change]
    elif isinstance(general, pb.MetadataRecord):
        assert got == [general]
    else:
        assert got == general
    errors: list[KraftError] = []
    skipped = list(decode_replay_values([value], errors.append))
    assert (skipped, len(errors)) == ((got, 0) if isinstance(got, list) else ([], 1))


@settings(max_examples=300)
@given(_change_records())
def test_every_common_shape_kraft_writes_is_read_without_upb(change: pb.PartitionChangeRecord) -> None:
    """(what keeps the fast path from quietly going unused: a leave's, a rejoin's, an ISR change's; kraft's
    topic ids are ASCII, other ones are left to upb's UTF-8 check)"""
    fields = {f.name for f, _ in change.ListFields()}
    got = isr_leader_change(records.encode_value(records.wrap(change)))
    if fields <= _COMMON and change.topic_id.isascii():
        assert got == _meaning(change)
    else:
        assert got is None


_lists = st.lists(st.integers(min_value=-1, max_value=5), max_size=4).map(tuple)
_epochs = st.tuples(st.integers(-1, 5), st.integers(0, 9), st.integers(0, 9))  # leader, both epochs
_maybe_lists = st.just(()) | _lists
_recovery_states = st.just(LEADER_RECOVERED) | st.just(LEADER_RECOVERING)
_unclean_epochs = st.just(0) | st.integers(1, 9)


@st.composite
def _registrations(draw: st.DrawFn) -> PartitionRegistration:
    replicas = draw(_lists)
    isr = replicas if draw(st.booleans()) else draw(_lists)
    if draw(st.booleans()):
        return PartitionRegistration(replicas, isr, *draw(_epochs))
    return PartitionRegistration(
        replicas,
        isr,
        *draw(_epochs),
        draw(_maybe_lists),
        draw(_maybe_lists),
        draw(_recovery_states),
        draw(_unclean_epochs),
    )


@settings(max_examples=500)
@given(_registrations(), st.data())
def test_a_change_read_without_upb_applies_as_the_record_does(
    current: PartitionRegistration, data: st.DataObject
) -> None:
    change = pb.PartitionChangeRecord(topic_id="T", partition_id=data.draw(st.integers(0, 3)))
    if data.draw(st.booleans()):
        change.isr.ids.extend(current.replicas if data.draw(st.booleans()) else data.draw(_lists))
    if data.draw(st.booleans()):
        change.leader = data.draw(st.integers(-1, 5))
    value = records.encode_value(records.wrap(change))
    read = isr_leader_change(value)
    assert read is not None
    _, _, isr, leader = read
    expected = apply_partition_change(current, records.decode_value(value).partition_change)
    got = apply_isr_leader_change(current, isr, leader)
    assert got == expected
    assert type(got) is type(expected)
    assert (got.isr is got.replicas) == (expected.isr is expected.replicas)


def test_leave_and_rejoin_shapes() -> None:
    leave = pb.PartitionChangeRecord(topic_id="AAAAAAAAAAAAAAAAAAAAAA", partition_id=70_000, leader=-1)
    leave.isr.ids.extend([2, 3])
    assert isr_leader_change(records.encode_value(records.wrap(leave))) == (
        "AAAAAAAAAAAAAAAAAAAAAA",
        70_000,
        (2, 3),
        -1,
    )
    rejoin = pb.PartitionChangeRecord(topic_id="T", partition_id=0)
    rejoin.isr.ids.extend([1, 2, 3])
    assert isr_leader_change(records.encode_value(records.wrap(rejoin))) == ("T", 0, (1, 2, 3), None)
    current = PartitionRegistration((1, 2, 3), (2, 3), 2, 5, 8)
    rejoined = apply_isr_leader_change(current, (1, 2, 3), None)
    assert rejoined == PartitionRegistration((1, 2, 3), (1, 2, 3), 2, 6, 9)
    assert rejoined.isr is rejoined.replicas


def _base_image() -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.TopicRecord(name="t", topic_id="T")), 1, 1)
    for partition_id, (replicas, leader) in enumerate([([1, 2, 3], 1), ([2, 3], 2)]):
        delta.replay(
            records.wrap(
                pb.PartitionRecord(
                    topic_id="T", partition_id=partition_id, replicas=replicas, isr=replicas, leader=leader
                )
            ),
            2 + partition_id,
            1,
        )
    return delta.apply()


@settings(max_examples=200)
@given(st.lists(st.tuples(st.sampled_from(["T", "U"]), st.integers(0, 2), st.data()), max_size=6))
def test_a_broker_replaying_record_by_record_gets_the_same_image(
    changes: list[tuple[str, int, st.DataObject]],
) -> None:
    """``replay_isr_leader_change`` (the broker fetcher's per-record path) against ``replay`` of the
    decoded record: the same image, offset, epoch and errors (unknown topic U, partition 2)."""
    base = _base_image()
    direct, general = MetadataDelta(base), MetadataDelta(base)
    for offset, (topic_id, partition_id, data) in enumerate(changes, 10):
        change = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=partition_id)
        if data.draw(st.booleans()):
            change.isr.ids.extend(data.draw(_lists))
        if data.draw(st.booleans()):
            change.leader = data.draw(st.integers(-1, 5))
        value = records.encode_value(records.wrap(change))
        read = isr_leader_change(value)
        assert read is not None
        direct.replay_isr_leader_change(read, offset, 3)
        general.replay(records.decode_value(value), offset, 3)
    assert direct.replay_errors == general.replay_errors
    assert (direct.offset, direct.epoch) == (general.offset, general.epoch)
    assert direct.apply().topics_by_id == general.apply().topics_by_id


# Session 17: the common shape read straight through (``_change_common``), the topic id field matched
# against the one read before it.
_TWO_BYTE_IDS = st.integers(128, 16_383)
_ASCII_TOPIC_IDS = st.sampled_from(["T", "", "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"]) | st.text(
    alphabet=st.characters(max_codepoint=127), max_size=40
)


@st.composite
def _shutdown_changes(draw: st.DrawFn) -> pb.PartitionChangeRecord:
    """A leave's or a rejoin's change in a big cluster (two-byte ids, leader -1 or a broker), or one
    nearby: other id widths, an empty ISR, no ISR or no leader, any int32."""
    change = pb.PartitionChangeRecord(
        topic_id=draw(_ASCII_TOPIC_IDS), partition_id=draw(st.integers(0, 16_383) | _INT32)
    )
    if draw(st.integers(0, 3)):
        change.isr.ids.extend(draw(st.lists(_TWO_BYTE_IDS, max_size=3) | _ID_LISTS))
    if draw(st.integers(0, 3)):
        change.leader = draw(_TWO_BYTE_IDS | st.integers(-1, 127) | _INT32)
    return change


@settings(max_examples=2000)
@given(_shutdown_changes(), st.data())
def test_a_change_after_one_of_its_topic_is_read_as_upb_reads_it_or_left_to_upb(
    change: pb.PartitionChangeRecord, data: st.DataObject
) -> None:
    """The change before it (of the same topic) leaves its topic id field to be matched: the value — as
    kraft writes it, or broken — is read to upb's meaning or left to upb."""
    first = pb.PartitionChangeRecord(topic_id=change.topic_id, partition_id=1, leader=1)
    assert isr_leader_change(records.encode_value(records.wrap(first))) is not None
    value = records.encode_value(records.wrap(change))
    how, value = damaged(data.draw, value)
    got = isr_leader_change(value)
    general = _upb(value)
    if got is not None:
        assert isinstance(general, pb.MetadataRecord), general
        assert general.WhichOneof("record") == "partition_change"
        assert _holds_only_the_common_fields(general)
        assert got == _meaning(general.partition_change)
    if how == "as is":
        assert got == _meaning(change)


def _primed(topic_id: str) -> None:
    """A change of ``topic_id`` read, so the next one of it matches its topic id field."""
    first = pb.PartitionChangeRecord(topic_id=topic_id, partition_id=1, leader=1)
    assert isr_leader_change(records.encode_value(records.wrap(first))) is not None


def _framed(body: bytes) -> bytes:
    return b"\x01\x05\x00\x7a" + bytes([len(body)]) + body


def test_a_shutdown_change_takes_the_straight_path() -> None:
    """(what keeps it from quietly going unused) a leave's changes in a 1,000-broker cluster, after one
    of their topic: read by ``_change_common`` alone."""
    topic_id = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
    _primed(topic_id)
    for change in (
        pb.PartitionChangeRecord(
            topic_id=topic_id, partition_id=500, isr=pb.BrokerIdList(ids=[998, 2]), leader=998
        ),
        pb.PartitionChangeRecord(topic_id=topic_id, partition_id=7, isr=pb.BrokerIdList(ids=[]), leader=-1),
        pb.PartitionChangeRecord(topic_id=topic_id, partition_id=16_000, isr=pb.BrokerIdList(ids=[300, 5])),
        pb.PartitionChangeRecord(topic_id=topic_id, partition_id=3, leader=5),
    ):
        assert _change_common(records.encode_value(records.wrap(change))) == _meaning(change)


def test_shapes_the_straight_path_must_leave_or_read_whole() -> None:
    """Directed examples (each a way the straight path could misread): a record size whose varint runs on;
    an ISR list holding more than its packed run, or a run that is not packed ids; a three-byte partition id
    ending in the topic id's tag; leaders of three bytes, of five starting 0xff (not -1), and cut short."""
    _primed("T")
    tail = b"\x1a\x06\x0a\x04\xfe\x03\xf6\x03" + b"\x20\xfe\x03"
    # (1) record size 0x85 0x08 (1,029): upb rejects it; the value's length fits the first byte alone
    topic_id = "a" * 118
    _primed(topic_id)
    value = b"\x01\x05\x00\x7a\x85" + b"\x08\x01" + b"\x12" + bytes([118]) + topic_id.encode() + tail
    assert len(value) == 0x85 + 5 and isinstance(_upb(value), tuple)
    assert isr_leader_change(value) is None
    _primed("T")
    # (2) the list holds the run and an id more (0x08 0x05, unpacked): upb merges them
    value = _framed(b"\x08\x01\x12\x01T" + b"\x1a\x08\x0a\x04\xfe\x03\xf6\x03\x08\x05" + b"\x20\xfe\x03")
    general = _upb(value)
    assert isinstance(general, pb.MetadataRecord)
    assert tuple(general.partition_change.isr.ids) == (510, 502, 5)
    assert isr_leader_change(value) in (None, _meaning(general.partition_change))
    # (3) a list whose field 1 is not length-delimited (0x0b: group start) of the run's size
    value = _framed(b"\x08\x01\x12\x01T" + b"\x1a\x06\x0b\x04\xfe\x03\xf6\x03" + b"\x20\xfe\x03")
    general = _upb(value)
    got = isr_leader_change(value)
    assert got is None or (
        isinstance(general, pb.MetadataRecord) and got == _meaning(general.partition_change)
    )
    # (4) partition id 0x81 0x80 0x12, then a bad tag 0x01 (upb), or 0x81 0x80 and the topic field
    value = _framed(b"\x08\x81\x80\x12\x01T" + tail)
    assert isinstance(_upb(value), tuple)
    assert isr_leader_change(value) is None
    # (5) leaders of three bytes and of five starting 0xff
    for leader in (20_000, 2**31 - 1):
        change = pb.PartitionChangeRecord(topic_id="T", partition_id=2, leader=leader)
        assert isr_leader_change(records.encode_value(records.wrap(change))) == _meaning(change)
    # (6) the ISR list holding its run and then a field 4 (0x20 0x05): upb keeps it as the list's unknown
    # field and the change has no leader
    value = _framed(b"\x08\x01\x12\x01T" + b"\x1a\x08\x0a\x04\xfe\x03\xf6\x03\x20\x05")
    general = _upb(value)
    assert isinstance(general, pb.MetadataRecord) and not general.partition_change.HasField("leader")
    assert isr_leader_change(value) is None
    # (7) a leader varint cut after its second byte, which still has its continuation bit
    value = _framed(b"\x08\x01\x12\x01T" + b"\x20\xa0\x9c")
    assert isinstance(_upb(value), tuple)
    assert isr_leader_change(value) is None
    # (8) a five-byte leader starting 0xff (2**31 - 1), then five bytes upb cannot read: not a -1
    value = _framed(b"\x08\x01\x12\x01T" + b"\x20\xff\xff\xff\xff\x07" + b"\x01" * 5)
    assert isinstance(_upb(value), tuple)
    assert isr_leader_change(value) is None
