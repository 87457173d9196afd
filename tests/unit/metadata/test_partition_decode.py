"""``plain_partition``: a PartitionRecord's value bytes read without protobuf (session 16), against upb.
Any value — what kraft writes (a new partition's seven fields, and each rarer field set), hand-built wire
encodings upb also accepts (fields out of order or twice, unpacked or split ids, long and over-long
varints, unknown fields, every wire type), random bytes, truncations — is either read to exactly upb's
meaning, or left to upb (``None``), never read otherwise; and what it reads replays into the registration
(and the errors) ``replay`` of the record gives."""

from __future__ import annotations

import pytest
from google.protobuf.unknown_fields import UnknownFieldSet
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.errors import KraftError
from kraft.metadata import change_decode, records
from kraft.metadata.change_decode import (
    PlainPartition,
    _plain_common,
    decode_replay_values,
    plain_partition,
)
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.v1 import metadata_pb2 as pb

from .value_damage import damaged

_INT32 = st.integers(min_value=-(2**31), max_value=2**31 - 1)
_IDS = st.integers(min_value=-1, max_value=5) | st.integers(100, 20_000) | _INT32
_ID_LISTS = st.lists(_IDS, max_size=5)
_TOPIC_IDS = st.sampled_from(["T", "", "AAAAAAAAAAAAAAAAAAAAAA"]) | st.text(max_size=24)
_COMMON = frozenset(
    {"partition_id", "topic_id", "replicas", "isr", "leader", "leader_epoch", "partition_epoch"}
)
_RARE_LISTS = ("removing_replicas", "adding_replicas", "eligible_leader_replicas", "last_known_elr")
_RARE_INTS = ("leader_recovery_state", "last_unclean_leader_epoch")
_REPEATED_INTS = frozenset({3, 4, 5, 6, 12, 13})
# The strategies the composites below draw from, built once: a strategy built inside a composite is a new
# object at every draw, which Hypothesis validates again each time (~a third of these tests' time).  The
# same strategies, so the same choices give the same values.
_LEADERS = st.integers(min_value=-1, max_value=5) | _INT32
_EPOCHS = st.integers(0, 3) | _INT32
_DIRECTORY_LISTS = st.lists(st.text(max_size=4), max_size=2)


@st.composite
def _partition_records(draw: st.DrawFn) -> pb.PartitionRecord:
    """A partition as kraft writes them (its ISR often its replicas), in a third one rarer field too."""
    replicas = draw(_ID_LISTS)
    record = pb.PartitionRecord(
        topic_id=draw(_TOPIC_IDS),
        partition_id=draw(_INT32),
        replicas=replicas,
        isr=replicas if draw(st.booleans()) else draw(_ID_LISTS),
        leader=draw(_LEADERS),
        leader_epoch=draw(_EPOCHS),
        partition_epoch=draw(_EPOCHS),
    )
    if draw(st.integers(0, 2)) == 0:
        field = draw(st.sampled_from((*_RARE_LISTS, *_RARE_INTS, "directories")))
        if field in _RARE_INTS:
            setattr(record, field, draw(_INT32))
        elif field == "directories":
            record.directories.extend(draw(_DIRECTORY_LISTS))
        else:
            getattr(record, field).extend(draw(_ID_LISTS))
    return record


def _varint(number: int, padding: int = 0) -> bytes:
    """``number`` (≥ 0, any size) as a varint, with ``padding`` redundant zero groups."""
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
    | st.integers(128, 20_000)
    | _INT32.map(lambda n: n & 0xFFFFFFFFFFFFFFFF)  # negatives as upb writes them: 10 bytes
    | st.integers(0, 2**70)  # past 32 bits (truncated), past 64 bits (malformed)
)


_PADDINGS = st.just(0) | st.integers(0, 4)


@st.composite
def _varints(draw: st.DrawFn) -> bytes:
    return _varint(draw(_RAW_NUMBERS), draw(_PADDINGS))


_VARINTS = _varints()
_VARINT_RUNS = st.lists(_VARINTS, max_size=4)
_FIELD_NUMBERS = st.sampled_from([1, 2, 3, 4, 7, 9, 10]) | st.integers(1, 14) | st.just(100)
_WIRE_TYPES = st.sampled_from([0, 2]) | st.integers(0, 7)
_STRING_BODIES = st.binary(max_size=8) | st.text(max_size=8).map(str.encode)
_TEXT_BODIES = st.text(max_size=8).map(str.encode)
_BINARY_8 = st.binary(max_size=8)
_BINARY_9 = st.binary(max_size=9)


@st.composite
def _wire_fields(draw: st.DrawFn) -> bytes:
    """One field of a PartitionRecord as bytes: any number (known or not), any wire type; a repeated int
    field packed (a run of varints) or unpacked (one varint)."""
    number = draw(_FIELD_NUMBERS)
    wire = draw(_WIRE_TYPES)
    tag = _varint(number << 3 | wire)
    if wire == 0:
        return tag + draw(_VARINTS)
    if wire == 2:
        if number in _REPEATED_INTS:
            body = b"".join(draw(_VARINT_RUNS))
        elif number in (2, 11):
            body = draw(_STRING_BODIES)
        else:
            body = draw(_BINARY_8)
        return tag + _varint(len(body)) + body
    return tag + draw(_BINARY_9)


_PARTITION_RECORDS = _partition_records()
_WIRE_FIELD_RUNS = st.lists(_wire_fields(), max_size=7)
_AFTERS = st.sampled_from([b"", b"\x6a\x00", b"\x6a\x02\x08\x01", b"\x20\x01"]) | st.binary(max_size=4)


def _frame(payload: bytes, after: bytes = b"") -> bytes:
    """The value of a MetadataRecord holding ``payload`` as its partition (then ``after``)."""
    return b"\x01\x03\x00\x6a" + _varint(len(payload)) + payload + after


@st.composite
def _values(draw: st.DrawFn) -> bytes:
    """What kraft writes, hand-built encodings, and each of them broken in some way."""
    if draw(st.booleans()):
        value = records.encode_value(records.wrap(draw(_PARTITION_RECORDS)))
    else:
        # the seven fields in order (each maybe), or any fields in any order
        if draw(st.booleans()):
            payload = b""
            for number in (1, 2, 3, 4, 7, 9, 10):
                if draw(st.booleans()):
                    wire = 2 if number in (2, 3, 4) else 0
                    if wire == 2 and number != 2:
                        body = b"".join(draw(_VARINT_RUNS))
                        payload += bytes((number << 3 | 2,)) + _varint(len(body)) + body
                    elif wire == 2:
                        body = draw(_TEXT_BODIES)
                        payload += b"\x12" + _varint(len(body)) + body
                    else:
                        payload += bytes((number << 3,)) + draw(_VARINTS)
        else:
            payload = b"".join(draw(_WIRE_FIELD_RUNS))
        # nothing; bytes; a second partition field (upb merges it); an unknown field
        after = draw(_AFTERS)
        value = _frame(payload, after)
    _, value = damaged(draw, value, random_prefix=b"\x01\x03\x00\x6a")
    return value


def _upb(value: bytes) -> pb.MetadataRecord | tuple[type[KraftError], object, str]:
    try:
        return records.decode_value(value)
    except KraftError as exc:
        return type(exc), exc.code, exc.message


def _meaning(r: pb.PartitionRecord) -> PlainPartition:
    return (
        r.topic_id,
        r.partition_id,
        tuple(r.replicas),
        tuple(r.isr),
        r.leader,
        r.leader_epoch,
        r.partition_epoch,
    )


def _holds_only_the_common_fields(record: pb.MetadataRecord) -> bool:
    """No field but the seven (none of them unknown to the schema) on the record."""
    partition = record.partition
    return (
        {f.name for f, _ in partition.ListFields()} <= _COMMON
        and not len(UnknownFieldSet(record))
        and not len(UnknownFieldSet(partition))
    )


@settings(max_examples=3000)
@given(_values())
def test_a_value_is_read_as_upb_reads_it_or_left_to_upb(value: bytes) -> None:
    partition = plain_partition(value)
    general = _upb(value)
    if partition is not None:
        assert isinstance(general, pb.MetadataRecord), general
        assert general.WhichOneof("record") == "partition"
        assert _holds_only_the_common_fields(general)
        assert partition == _meaning(general.partition)
    # the replay decoder: the same record, or the same error, or the tuple read above
    try:
        got: object = list(decode_replay_values([value]))
    except KraftError as exc:
        got = (type(exc), exc.code, exc.message)
    if partition is not None:
        assert got == [partition]
    elif isinstance(general, pb.MetadataRecord):
        assert got == [general]
    else:
        assert got == general
    errors: list[KraftError] = []
    skipped = list(decode_replay_values([value], errors.append))
    assert (skipped, len(errors)) == ((got, 0) if isinstance(got, list) else ([], 1))


@settings(max_examples=300)
@given(_partition_records())
def test_every_new_partition_kraft_writes_is_read_without_upb(record: pb.PartitionRecord) -> None:
    """(what keeps the fast path from quietly going unused: every CreateTopics / CreatePartitions record;
    kraft's topic ids are ASCII, other ones are left to upb's UTF-8 check)"""
    fields = {f.name for f, _ in record.ListFields()}
    got = plain_partition(records.encode_value(records.wrap(record)))
    if fields <= _COMMON and record.topic_id.isascii():
        assert got == _meaning(record)
    else:
        assert got is None


def test_a_created_partition_of_a_big_cluster() -> None:
    """Ids past 127 (two bytes each), partition ids past 16,383 (three), leader -1 (ten)."""
    record = pb.PartitionRecord(
        topic_id="AAAAAAAAAAAAAAAAAAAAAA",
        partition_id=70_000,
        replicas=[999, 5, 1000],
        isr=[999, 5, 1000],
        leader=999,
    )
    value = records.encode_value(records.wrap(record))
    assert plain_partition(value) == (
        "AAAAAAAAAAAAAAAAAAAAAA",
        70_000,
        (999, 5, 1000),
        (999, 5, 1000),
        999,
        0,
        0,
    )
    offline = pb.PartitionRecord(topic_id="T", replicas=[2], leader=-1, leader_epoch=4, partition_epoch=9)
    assert plain_partition(records.encode_value(records.wrap(offline))) == ("T", 0, (2,), (), -1, 4, 9)


def _base_image() -> MetadataImage:
    delta = MetadataDelta(MetadataImage.empty())
    delta.replay(records.wrap(pb.TopicRecord(name="t", topic_id="T")), 1, 1)
    return delta.apply()


@settings(max_examples=300)
@given(st.lists(st.tuples(st.sampled_from(["T", "U"]), st.integers(0, 3), st.data()), max_size=8))
def test_a_partition_read_without_upb_replays_as_the_record_does(
    partitions: list[tuple[str, int, st.DataObject]],
) -> None:
    """``replay_decoded`` of the tuples against ``replay`` of the decoded records: the same image (the ISR
    the replicas' very tuple when equal) and the same errors (unknown topic U, a partition id skipping
    ids); the tuples interleaved with protobuf records, as a batch replays them."""
    base = _base_image()
    direct, general = MetadataDelta(base), MetadataDelta(base)
    values: list[bytes] = []
    for topic_id, partition_id, data in partitions:
        replicas = data.draw(st.lists(st.integers(0, 300), max_size=3))
        record = pb.PartitionRecord(
            topic_id=topic_id,
            partition_id=partition_id,
            replicas=replicas,
            isr=replicas
            if data.draw(st.booleans())
            else data.draw(st.lists(st.integers(0, 300), max_size=3)),
            leader=data.draw(st.integers(-1, 300)),
            leader_epoch=data.draw(st.integers(0, 3)),
            partition_epoch=data.draw(st.integers(0, 3)),
        )
        values.append(records.encode_value(records.wrap(record)))
        if data.draw(st.booleans()):  # a record upb reads, between them
            values.append(
                records.encode_value(records.wrap(pb.FeatureLevelRecord(name="f", feature_level=1)))
            )
    decoded = list(decode_replay_values(values))
    assert sum(type(one) is tuple for one in decoded) == len(partitions)
    direct.replay_decoded(decoded)
    for value in values:
        general.replay(records.decode_value(value))
    assert direct.replay_errors == general.replay_errors
    got, expected = direct.apply(), general.apply()
    assert got.topics_by_id == expected.topics_by_id
    assert got.features == expected.features
    for topic in got.topics_by_id.values():
        for registration in topic.partitions:
            assert (registration.isr is registration.replicas) == (registration.isr == registration.replicas)


# Session 17: the common shape read straight through (``_plain_common``), the topic id field matched
# against the one read before it.
_TWO_BYTE_IDS = st.integers(128, 16_383)
_ASCII_TOPIC_IDS = st.sampled_from(["T", "", "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"]) | st.text(
    alphabet=st.characters(max_codepoint=127), max_size=40
)


@st.composite
def _bulk_records(draw: st.DrawFn) -> pb.PartitionRecord:
    """A CreateTopics partition of a big cluster as kraft writes it (three two-byte ids, the ISR its
    replicas), or one nearby: other id widths and counts, another ISR, leader -1, long epochs."""
    replicas = draw(st.lists(_TWO_BYTE_IDS, min_size=3, max_size=3) | _ID_LISTS)
    return pb.PartitionRecord(
        topic_id=draw(_ASCII_TOPIC_IDS),
        partition_id=draw(st.integers(0, 16_383) | _INT32),
        replicas=replicas,
        isr=replicas if draw(st.booleans()) else draw(_ID_LISTS),
        leader=draw(_TWO_BYTE_IDS | st.integers(-1, 127) | _INT32),
        leader_epoch=draw(st.integers(0, 3) | st.integers(0, 300) | _INT32),
        partition_epoch=draw(st.integers(0, 3) | st.integers(0, 300) | _INT32),
    )


@settings(max_examples=2000)
@given(_bulk_records(), st.data())
def test_a_value_after_one_of_its_topic_is_read_as_upb_reads_it_or_left_to_upb(
    record: pb.PartitionRecord, data: st.DataObject
) -> None:
    """The record before it (partition 0 of the same topic) leaves its topic id field to be matched: the
    value — as kraft writes it, or broken — is read to upb's meaning or left to upb."""
    first = pb.PartitionRecord(topic_id=record.topic_id, replicas=[1], isr=[1], leader=1)
    assert plain_partition(records.encode_value(records.wrap(first))) is not None
    value = records.encode_value(records.wrap(record))
    how, value = damaged(data.draw, value)
    partition = plain_partition(value)
    general = _upb(value)
    if partition is not None:
        assert isinstance(general, pb.MetadataRecord), general
        assert general.WhichOneof("record") == "partition"
        assert _holds_only_the_common_fields(general)
        assert partition == _meaning(general.partition)
    if how == "as is":
        assert partition == _meaning(record)


def test_a_bulk_creation_record_takes_the_straight_path() -> None:
    """(what keeps it from quietly going unused) a new partition of a 1,000-broker cluster, after one of
    its topic: read by ``_plain_common`` alone, its ISR the replicas' very tuple."""
    topic_id = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
    first = pb.PartitionRecord(topic_id=topic_id, replicas=[998, 999, 1], isr=[998, 999, 1], leader=998)
    assert _plain_common(records.encode_value(records.wrap(first))) is None  # a new topic: the walk's
    assert plain_partition(records.encode_value(records.wrap(first))) is not None
    record = pb.PartitionRecord(
        topic_id=topic_id, partition_id=500, replicas=[254, 246, 247], isr=[254, 246, 247], leader=254
    )
    got = _plain_common(records.encode_value(records.wrap(record)))
    assert got == (topic_id, 500, (254, 246, 247), (254, 246, 247), 254, 0, 0)
    assert got is not None and got[3] is got[2]


def test_a_long_record_size_is_not_read_as_one_byte() -> None:
    """A record size whose varint runs on (0x85 0x08: 1,029 bytes, past the value) is upb's to reject,
    even where the byte after it would start the common shape and the value's length fits the first
    byte alone (0x85 + 5)."""
    topic_id = "a" * 110
    first = pb.PartitionRecord(topic_id=topic_id, replicas=[1], isr=[1], leader=1)
    assert plain_partition(records.encode_value(records.wrap(first))) is not None
    body = b"\x08\x01" + b"\x12" + bytes([110]) + topic_id.encode()
    body += b"\x1a\x06\xfe\x03\xf6\x03\xf7\x03" + b"\x22\x06\xfe\x03\xf6\x03\xf7\x03" + b"\x38\xfe\x03"
    value = b"\x01\x03\x00\x6a\x85" + body
    assert len(value) == 0x85 + 5
    assert isinstance(_upb(value), tuple)  # an error
    assert plain_partition(value) is None


def test_wider_varints_in_the_common_shape_are_read_whole() -> None:
    """Six bytes of replicas that are not three two-byte ids (a four-byte id, then a two-byte one), an
    ISR of the replicas' length but not their ids, a two-byte leader epoch, and a three-byte partition
    id ending in the topic id's tag byte: read as upb reads them, or left to it."""
    first = pb.PartitionRecord(topic_id="T", replicas=[1], isr=[1], leader=1)
    assert plain_partition(records.encode_value(records.wrap(first))) is not None
    wide = pb.PartitionRecord(topic_id="T", partition_id=3, replicas=[3_000_000, 500], isr=[500], leader=500)
    value = records.encode_value(records.wrap(wide))
    assert plain_partition(value) == _meaning(wide)
    # an ISR as long as the replicas, not theirs
    other = pb.PartitionRecord(
        topic_id="T", partition_id=5, replicas=[300, 301, 302], isr=[300, 301, 303], leader=300
    )
    assert plain_partition(records.encode_value(records.wrap(other))) == _meaning(other)
    # a two-byte leader epoch whose second byte is the partition epoch's tag (10,245: 0x85 0x50), then a
    # byte that upb reads as a bad tag
    epochs = pb.PartitionRecord(
        topic_id="T", partition_id=4, replicas=[1], isr=[1], leader=1, leader_epoch=10_245
    )
    value = records.encode_value(records.wrap(epochs))
    assert plain_partition(value) == _meaning(epochs)
    assert value.endswith(b"\x48\x85\x50") and value[4] + 5 == len(value)
    value = value[:4] + bytes([value[4] + 1]) + value[5:] + b"\x07"
    assert isinstance(_upb(value), tuple)  # an error
    assert plain_partition(value) is None
    body = b"\x08\x81\x80" + b"\x12\x01T"  # (upb: partition id 0x81 0x80 0x12, then a bad tag 0x01)
    body += b"\x1a\x06\xfe\x03\xf6\x03\xf7\x03" + b"\x22\x06\xfe\x03\xf6\x03\xf7\x03" + b"\x38\xfe\x03"
    value = b"\x01\x03\x00\x6a" + bytes([len(body)]) + body
    general = _upb(value)
    got = plain_partition(value)
    assert got is None or (isinstance(general, pb.MetadataRecord) and got == _meaning(general.partition))


# Session 19: three replicas of one and two bytes in any order (brokers below 128 and above in one set)
# read by ``_plain_common`` itself, not by the loop of ``_run_ids``.
_MIXED_IDS = st.lists(st.integers(1, 127) | _TWO_BYTE_IDS, min_size=3, max_size=3)  # (leader 0: no field)


@settings(max_examples=600)
@given(_MIXED_IDS, st.booleans(), st.data())
def test_three_replicas_of_mixed_widths_are_read_as_upb_reads_them(
    replicas: list[int], isr_is_replicas: bool, data: st.DataObject
) -> None:
    """After a record of its topic, a new partition whose three replicas are one- and two-byte ids in any
    order — as kraft writes it (read by ``_plain_common`` itself, to exactly the record) or broken (read
    to upb's meaning, or left to upb)."""
    topic_id = "f81d4fae-7dec-11d0-a765-00a0c91e6bf6"
    first = pb.PartitionRecord(topic_id=topic_id, replicas=[1], isr=[1], leader=1)
    assert plain_partition(records.encode_value(records.wrap(first))) is not None
    record = pb.PartitionRecord(
        topic_id=topic_id,
        partition_id=7,
        replicas=replicas,
        isr=replicas if isr_is_replicas else replicas[:2],
        leader=replicas[0],
        leader_epoch=1,
    )
    written = records.encode_value(records.wrap(record))
    assert _plain_common(written) == _meaning(record)
    how, value = damaged(data.draw, written)
    partition = plain_partition(value)
    general = _upb(value)
    if partition is not None:
        assert isinstance(general, pb.MetadataRecord), general
        assert general.WhichOneof("record") == "partition"
        assert _holds_only_the_common_fields(general)
        assert partition == _meaning(general.partition)
    if how == "as is":
        assert partition == _meaning(record)


def test_each_order_of_mixed_width_replicas_takes_the_straight_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every order of one one-byte id and two two-byte ones (five bytes), and of two one-byte ids and one
    two-byte one (four bytes): read by ``_plain_common``, to the ids in their order, the ISR the replicas'
    very tuple, without the loop of ``_run_ids`` (what keeps the path from quietly going unused); a
    two-byte id cut short (its first byte without the continuation bit, or its second byte with one) is
    not read as three ids."""
    topic_id = "T"
    first = pb.PartitionRecord(topic_id=topic_id, replicas=[1], isr=[1], leader=1)
    assert plain_partition(records.encode_value(records.wrap(first))) is not None

    def no_loop(*args: object) -> None:
        raise AssertionError(f"_run_ids{args[1:]}")

    saved = change_decode._run_ids
    monkeypatch.setattr(change_decode, "_run_ids", no_loop)
    for replicas in (
        [5, 300, 999],
        [300, 5, 999],
        [300, 999, 5],
        [5, 6, 999],
        [5, 999, 6],
        [999, 5, 6],
    ):
        record = pb.PartitionRecord(
            topic_id=topic_id, partition_id=2, replicas=replicas, isr=replicas, leader=replicas[0]
        )
        value = records.encode_value(records.wrap(record))
        got = _plain_common(value)
        assert got == (topic_id, 2, tuple(replicas), tuple(replicas), replicas[0], 0, 0), replicas
        assert got is not None and got[3] is got[2]
    monkeypatch.setattr(change_decode, "_run_ids", saved)
    # An id's bytes made to run on or stop early, in each order (an ISR of its own, so the straight path
    # reads on past the replicas): never the three ids, and what is read is upb's meaning.
    for replicas, broken_runs in (
        ([5, 300, 999], (b"\x05\x2c\x02\xe7\x07", b"\x05\xac\x82\xe7\x07", b"\x05\xac\x02\x67\x07")),
        ([300, 5, 999], (b"\xac\x82\x05\xe7\x07", b"\xac\x02\x85\xe7\x07", b"\xac\x02\x05\xe7\x87")),
        ([300, 999, 5], (b"\xac\x02\xe7\x87\x05", b"\xac\x02\x67\x07\x05", b"\xac\x82\xe7\x07\x05")),
        ([5, 6, 999], (b"\x05\x06\x67\x07", b"\x05\x86\xe7\x07", b"\x05\x06\xe7\x87")),
        ([5, 999, 6], (b"\x05\xe7\x87\x06", b"\x05\x67\x07\x06", b"\x85\xe7\x07\x06")),
        ([999, 5, 6], (b"\xe7\x87\x05\x06", b"\xe7\x07\x85\x06", b"\x67\x07\x05\x06")),
    ):
        record = pb.PartitionRecord(
            topic_id=topic_id, partition_id=2, replicas=replicas, isr=[replicas[0]], leader=replicas[0]
        )
        value = records.encode_value(records.wrap(record))
        run = bytes(pb.PartitionRecord(replicas=replicas).SerializeToString())
        assert run in value and len(broken_runs[0]) + 2 == len(run)
        for broken in broken_runs:
            other = value.replace(run, run[:2] + broken)
            general = _upb(other)
            got = plain_partition(other)
            assert got is None or (
                isinstance(general, pb.MetadataRecord) and got == _meaning(general.partition)
            )
            assert got is None or got[2] != tuple(replicas), (replicas, broken)
