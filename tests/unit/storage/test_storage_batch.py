"""Record-batch codec: round trips, agreement with kafka-python's independent parser, bad input."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

from kraft.storage.batch import (
    CRC_OFFSET,
    HEADER_SIZE,
    ControlMessage,
    ControlRecordType,
    LeaderChangeMessage,
    Record,
    RecordBatch,
    SnapshotFooterRecord,
    SnapshotHeaderRecord,
    build_batch,
    build_control_batch,
    check_batch,
    decode_batch,
    decode_offset_values,
    encode_batch,
    iter_batch_headers,
    iter_batches,
    peek_batch_header,
    with_base_offset,
    with_leader_epoch,
)
from kraft.storage.errors import CorruptRecordError, RecordTooLargeError
from kraft.storage.varint import decode_uvarint, decode_varint, encode_uvarint, encode_varint, size_of_varint

Triple = tuple[bytes | None, bytes | None, tuple[tuple[str, bytes | None], ...]]

maybe_bytes = st.one_of(st.none(), st.binary(max_size=300))
headers = st.lists(st.tuples(st.text(max_size=10), maybe_bytes), max_size=3).map(tuple)
record_inputs = st.lists(st.tuples(maybe_bytes, maybe_bytes, headers), min_size=1, max_size=20)
offsets = st.integers(min_value=0, max_value=2**62)
epochs = st.integers(min_value=0, max_value=2**31 - 1)
timestamps = st.integers(min_value=0, max_value=2**50)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_varint_round_trips_over_the_int64_range(value: int) -> None:
    encoded = encode_varint(value)
    assert len(encoded) == size_of_varint(value)
    assert decode_varint(encoded, 0) == (value, len(encoded))


@given(st.integers(min_value=0, max_value=2**64 - 1))
def test_uvarint_round_trips(value: int) -> None:
    encoded = encode_uvarint(value)
    assert decode_uvarint(encoded, 0) == (value, len(encoded))


@settings(max_examples=150)
@given(offsets, record_inputs, epochs, timestamps)
def test_build_then_decode_round_trips(base: int, records: list[Triple], epoch: int, ts: int) -> None:
    data = build_batch(base, records, leader_epoch=epoch, timestamp_ms=ts)
    batch, end = decode_batch(data)
    assert end == len(data) == batch.size_in_bytes
    assert batch.base_offset == base
    assert batch.partition_leader_epoch == epoch
    assert batch.last_offset == base + len(records) - 1
    assert batch.next_offset == base + len(records)
    assert not batch.is_control
    assert [(r.key, r.value, r.headers) for r in batch.records] == [tuple(r) for r in records]
    assert [batch.record_offset(r) for r in batch.records] == list(range(base, base + len(records)))
    assert encode_batch(batch) == data


@settings(max_examples=150)
@given(offsets, record_inputs, epochs, timestamps)
def test_kafka_python_parser_agrees_with_our_encoder(
    base: int, records: list[Triple], epoch: int, ts: int
) -> None:
    data = build_batch(base, records, leader_epoch=epoch, timestamp_ms=ts)
    theirs = DefaultRecordBatch(data)
    assert theirs.validate_crc()
    assert theirs.base_offset == base
    assert theirs.leader_epoch == epoch
    assert theirs.next_offset == base + len(records)
    parsed = list(theirs)
    assert [r.offset for r in parsed] == list(range(base, base + len(records)))
    assert [r.timestamp for r in parsed] == [ts] * len(records)
    assert [(r.key, r.value, tuple(r.headers)) for r in parsed] == [(k, v, tuple(h)) for k, v, h in records]


@settings(max_examples=100)
@given(record_inputs, timestamps)
def test_our_decoder_agrees_with_kafka_python_encoder(records: list[Triple], ts: int) -> None:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=False,
        producer_id=-1,
        producer_epoch=-1,
        base_sequence=-1,
        batch_size=2**30,
    )
    for offset, (key, value, hdrs) in enumerate(records):
        builder.append(offset, timestamp=ts + offset, key=key, value=value, headers=list(hdrs))
    data = bytes(builder.build())
    batch, _ = decode_batch(data)
    assert batch.base_timestamp == ts
    assert [(r.offset_delta, r.timestamp_delta, r.key, r.value, r.headers) for r in batch.records] == [
        (i, i, k, v, tuple(h)) for i, (k, v, h) in enumerate(records)
    ]


def test_encode_batch_keeps_every_field() -> None:
    batch = RecordBatch(
        base_offset=7,
        partition_leader_epoch=3,
        magic=2,
        crc=0,
        attributes=0,
        last_offset_delta=4,
        base_timestamp=100,
        max_timestamp=150,
        producer_id=12,
        producer_epoch=2,
        base_sequence=9,
        records=(Record(0, 0, b"a", b"1"), Record(4, 50, None, None, (("h", None),))),
    )
    decoded, _ = decode_batch(encode_batch(batch))
    assert decoded.records == batch.records
    assert (decoded.producer_id, decoded.producer_epoch, decoded.base_sequence) == (12, 2, 9)
    assert (decoded.last_offset, decoded.max_timestamp) == (11, 150)
    assert batch.size_in_bytes == decoded.size_in_bytes


def test_peek_reads_the_header_without_the_records() -> None:
    data = build_batch(42, [(b"k", b"v")] * 5, leader_epoch=9, timestamp_ms=1234)
    header = peek_batch_header(data + b"trailing garbage")
    assert (header.base_offset, header.size_in_bytes, header.partition_leader_epoch) == (42, len(data), 9)
    assert (header.last_offset_delta, header.record_count, header.attributes) == (4, 5, 0)
    assert (header.last_offset, header.next_offset, header.max_timestamp) == (46, 47, 1234)


def test_control_batches_round_trip_and_kafka_sees_control_records() -> None:
    messages: list[ControlMessage] = [
        LeaderChangeMessage(leader_id=2, voters=(1, 2, 3), granting_voters=(2, 3)),
        SnapshotHeaderRecord(last_contained_log_timestamp=99),
        SnapshotFooterRecord(),
    ]
    data = build_control_batch(10, messages, leader_epoch=4, timestamp_ms=5)
    batch, _ = decode_batch(data)
    assert batch.is_control
    assert batch.control_messages() == messages
    theirs = DefaultRecordBatch(data)
    assert theirs.is_control_batch
    assert [r.type for r in theirs] == [
        ControlRecordType.LEADER_CHANGE,
        ControlRecordType.SNAPSHOT_HEADER,
        ControlRecordType.SNAPSHOT_FOOTER,
    ]


def test_leader_change_value_has_kafkas_flexible_v0_layout() -> None:
    data = build_control_batch(0, [LeaderChangeMessage(1, (1, 2), (1,))], leader_epoch=1, timestamp_ms=0)
    value = decode_batch(data)[0].records[0].value
    # version 0, leader 1, voters: compact len 3 → [1 + tags, 2 + tags], granting: len 2 → [1 + tags], tags
    assert value == bytes.fromhex("000000000001030000000100000000020002000000010000")


def test_rebasing_and_restamping_keep_the_crc_valid() -> None:
    data = build_batch(0, [(None, b"x")], leader_epoch=1, timestamp_ms=0)
    moved = with_leader_epoch(with_base_offset(data, 500), 8)
    header = check_batch(moved)
    assert (header.base_offset, header.partition_leader_epoch) == (500, 8)


def test_iterators_walk_concatenated_batches() -> None:
    parts = [
        build_batch(i * 2, [(None, b"a"), (None, b"b")], leader_epoch=1, timestamp_ms=0) for i in range(3)
    ]
    data = b"".join(parts)
    assert [b.base_offset for b in iter_batches(data)] == [0, 2, 4]
    assert [pos for pos, _ in iter_batch_headers(data)] == [0, len(parts[0]), 2 * len(parts[0])]


def test_wrong_magic_is_rejected_with_a_clear_error() -> None:
    data = bytearray(build_batch(0, [(None, b"v")], leader_epoch=1, timestamp_ms=0))
    data[16] = 1
    with pytest.raises(CorruptRecordError, match="magic 1, expected 2"):
        decode_batch(data)


def test_crc_mismatch_is_rejected() -> None:
    data = bytearray(build_batch(0, [(None, b"value")], leader_epoch=1, timestamp_ms=0))
    data[-1] ^= 0xFF
    with pytest.raises(CorruptRecordError, match="CRC mismatch"):
        decode_batch(data)


def test_truncated_batch_and_header_are_rejected() -> None:
    data = build_batch(0, [(None, b"value")], leader_epoch=1, timestamp_ms=0)
    with pytest.raises(CorruptRecordError, match="truncated batch at position 0"):
        decode_batch(data[:-1])
    with pytest.raises(CorruptRecordError, match="truncated batch header"):
        decode_batch(data[: HEADER_SIZE - 1])


def test_oversize_batch_is_rejected_before_reading_it() -> None:
    data = build_batch(0, [(None, b"v" * 2000)], leader_epoch=1, timestamp_ms=0)
    with pytest.raises(RecordTooLargeError, match="above the maximum of 1000"):
        check_batch(data, max_batch_bytes=1000)


def test_impossible_length_field_is_rejected() -> None:
    data = bytearray(build_batch(0, [(None, b"v")], leader_epoch=1, timestamp_ms=0))
    struct.pack_into(">i", data, 8, 3)
    with pytest.raises(CorruptRecordError, match="below the minimum"):
        peek_batch_header(data)


def test_record_framing_errors_are_corrupt_records_even_with_a_valid_crc() -> None:
    data = bytearray(build_batch(0, [(b"k", b"v")], leader_epoch=1, timestamp_ms=0))
    data[HEADER_SIZE] = 0x7E  # record length varint now claims 63 bytes
    from crc32c import crc32c

    struct.pack_into(">I", data, CRC_OFFSET, crc32c(bytes(data[21:])))
    with pytest.raises(CorruptRecordError, match="malformed records"):
        decode_batch(data)


def test_empty_record_list_is_a_caller_error() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        build_batch(0, [], leader_epoch=0, timestamp_ms=0)


# The inline path of _decode_records (a value-only record: no key, no headers, small deltas) against
# the general per-field decoder it falls back to: same records, or both refuse.

value_only = st.lists(st.one_of(st.binary(max_size=70), st.binary(min_size=8100, max_size=8300)), max_size=12)


def _general_only(data: bytes, count: int) -> tuple[Record, ...]:
    from kraft.storage.batch import _decode_general

    records, pos = [], 0
    for _ in range(count):
        record, pos = _decode_general(data, pos, len(data))
        records.append(record)
    if pos != len(data):
        raise ValueError("stray bytes")
    return tuple(records)


def _outcome(decode: object, *args: object) -> object:
    try:
        return decode(*args)  # type: ignore[operator]
    except (ValueError, IndexError, UnicodeDecodeError):
        return "refused"


@settings(max_examples=200)
@given(value_only, st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=4), st.data())
def test_the_inline_record_path_decides_as_the_general_decoder(
    values: list[bytes], edits: list[tuple[int, int]], data: st.DataObject
) -> None:
    from kraft.storage.batch import _decode_records

    # value-only records (the inline path), some with a key or a header (the general path) between them
    inputs: list[Triple] = [
        (
            data.draw(st.sampled_from([None, None, b"k"])),
            v,
            data.draw(st.sampled_from([(), (), (("h", b"1"),)])),
        )
        for v in values
    ] or [(None, b"", ())]
    body = bytearray(build_batch(7, inputs, leader_epoch=1, timestamp_ms=5)[HEADER_SIZE:])
    assert _decode_records(memoryview(bytes(body)), 0, len(body), len(inputs)) == tuple(
        Record(i, 0, k, v, h) for i, (k, v, h) in enumerate(inputs)
    )
    for position, byte in edits:  # damaged bodies (a valid CRC over wrong bytes): the same decision
        if body:
            body[position % len(body)] = byte
    count = data.draw(st.integers(0, len(inputs) + 1))
    raw = bytes(body)
    assert _outcome(_decode_records, memoryview(raw), 0, len(raw), count) == _outcome(
        _general_only, raw, count
    )


def test_a_value_only_record_of_any_length_form_round_trips() -> None:
    # record and value lengths of one, two and three varint bytes; offset deltas past one byte
    values = [b"", b"x" * 63, b"y" * 64, b"z" * 8000, b"w" * 9000] + [b"v"] * 70
    data = build_batch(0, [(None, v) for v in values], leader_epoch=1, timestamp_ms=0)
    batch, _ = decode_batch(data)
    assert [(r.offset_delta, r.key, r.value, r.headers) for r in batch.records] == [
        (i, None, v, ()) for i, v in enumerate(values)
    ]


@settings(max_examples=150)
@given(
    st.lists(
        st.tuples(st.sampled_from([None, b"k"]), st.one_of(st.none(), st.binary(max_size=9000))),
        min_size=1,
        max_size=80,
    )
)
def test_value_only_records_are_encoded_byte_for_byte_as_the_general_encoder(
    records: list[tuple[bytes | None, bytes | None]],
) -> None:
    from kraft.storage.batch import _encode_record

    data = build_batch(3, records, leader_epoch=2, timestamp_ms=9)
    general = b"".join(_encode_record(i, 0, k, v, ()) for i, (k, v) in enumerate(records))
    assert data[HEADER_SIZE:] == general


def test_a_record_built_by_the_inline_path_is_a_record_like_any_other() -> None:
    # (built from its slots' descriptors, not by __init__: every field set, still frozen, hashed alike)
    data = build_batch(0, [(None, b"value")], leader_epoch=1, timestamp_ms=0)
    (got,) = decode_batch(data)[0].records
    made = Record(0, 0, None, b"value")
    assert type(got) is Record and got == made and hash(got) == hash(made) and repr(got) == repr(made)
    assert got.headers == () and got.key is None
    with pytest.raises(AttributeError):
        got.value = b"other"  # type: ignore[misc]


# decode_offset_values: what decode_batch gives as (offset, value) — values null as b"" — or the same
# refusal, for the inline path, the general path between, and damaged bodies under a valid CRC.


def _with_valid_crc(raw: bytes) -> bytes:
    from crc32c import crc32c

    data = bytearray(raw)
    struct.pack_into(">I", data, CRC_OFFSET, crc32c(bytes(data[21:])))
    return bytes(data)


def _pairs_via_batch(raw: bytes) -> object:
    try:
        batch, _ = decode_batch(raw)
    except CorruptRecordError:
        return "refused"
    return [(batch.record_offset(r), r.value or b"") for r in batch.records]


def _pairs(raw: bytes) -> object:
    try:
        return decode_offset_values(raw)
    except CorruptRecordError:
        return "refused"


@settings(max_examples=200)
@given(
    value_only,
    st.integers(0, 2**40),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    st.data(),
)
def test_offset_values_are_the_decoded_batchs(
    values: list[bytes], base_offset: int, edits: list[tuple[int, int]], data: st.DataObject
) -> None:
    inputs: list[Triple] = [
        (
            data.draw(st.sampled_from([None, None, b"k"])),
            data.draw(st.sampled_from([v, v, None])),
            data.draw(st.sampled_from([(), (), (("h", b"1"),)])),
        )
        for v in values
    ] or [(None, b"", ())]
    raw = build_batch(base_offset, inputs, leader_epoch=1, timestamp_ms=5)
    assert decode_offset_values(raw) == [(base_offset + i, v or b"") for i, (_, v, _) in enumerate(inputs)]
    body = bytearray(raw[HEADER_SIZE:])
    for position, byte in edits:
        if body:
            body[position % len(body)] = byte
    damaged = _with_valid_crc(raw[:HEADER_SIZE] + bytes(body))
    assert _pairs(damaged) == _pairs_via_batch(damaged)
