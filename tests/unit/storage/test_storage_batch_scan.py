"""The record walk of a batch (``kraft.storage.batch._scan_records``, session 17) against the walk it
replaced, kept here verbatim as the reference: the same records or ``(offset, value)`` pairs for valid
bodies of every shape (keys, headers, null values, negative and large deltas, varints of any width, longer
than needed included), and the same exception — class and message — for damaged, truncated and
miscounted ones."""

from __future__ import annotations

import struct
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kraft.storage.batch import (
    CRC_OFFSET,
    HEADER_SIZE,
    CorruptRecordError,
    Record,
    _decode_general,
    _scan_records,
    build_batch,
    decode_batch,
    decode_offset_values,
)

# --- the reference: _scan_records as it was before session 17 (a Record built by its constructor) ------


def _reference_scan(view: memoryview, pos: int, end: int, count: int, pairs_base: int | None) -> list[Any]:
    data = view[pos:end].tobytes()
    size = len(data)
    records: list[Any] = []
    append = records.append
    i = 0
    for _ in range(count):
        start = i
        if i + 7 <= size:
            byte = data[i]
            if byte < 0x80:
                length = (byte >> 1) ^ -(byte & 1)
                i += 1
            elif data[i + 1] < 0x80:
                raw = (byte & 0x7F) | (data[i + 1] << 7)
                length = (raw >> 1) ^ -(raw & 1)
                i += 2
            else:
                length = -1
            record_end = i + length
            timestamp = data[i + 1]
            if length > 0 and record_end <= size and timestamp < 0x80:
                i += 2
                byte = data[i]
                if byte < 0x80:
                    offset_delta = (byte >> 1) ^ -(byte & 1)
                    i += 1
                elif data[i + 1] < 0x80:
                    raw = (byte & 0x7F) | (data[i + 1] << 7)
                    offset_delta = (raw >> 1) ^ -(raw & 1)
                    i += 2
                else:
                    offset_delta = -1
                if offset_delta >= 0 and i + 2 <= record_end and data[i] == 0x01:
                    byte = data[i + 1]
                    if byte < 0x80:
                        value_length = (byte >> 1) ^ -(byte & 1)
                        i += 2
                    elif i + 3 <= record_end and data[i + 2] < 0x80:
                        raw = (byte & 0x7F) | (data[i + 2] << 7)
                        value_length = (raw >> 1) ^ -(raw & 1)
                        i += 3
                    else:
                        value_length = -1
                    if value_length >= 0 and i + value_length + 1 == record_end and data[record_end - 1] == 0:
                        value = data[i : i + value_length]
                        if pairs_base is None:
                            append(Record(offset_delta, (timestamp >> 1) ^ -(timestamp & 1), None, value))
                        else:
                            append((pairs_base + offset_delta, value))
                        i = record_end
                        continue
        record, i = _decode_general(data, start, size)
        append(record if pairs_base is None else (pairs_base + record.offset_delta, record.value or b""))
    if i != size:
        raise ValueError(f"{size - i} stray bytes after the last record")
    return records


# --- record bodies of any shape, varints of any width --------------------------------------------------


def _varint(value: int, extra: int) -> bytes:
    """Zig-zag ``value`` with ``extra`` redundant zero groups (a longer encoding decoders must accept)."""
    raw = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    groups = []
    while True:
        groups.append(raw & 0x7F)
        raw >>= 7
        if not raw:
            break
    groups += [0] * extra
    return bytes([g | 0x80 for g in groups[:-1]] + [groups[-1]])


small_or_wide = st.one_of(
    st.integers(-70, 70),
    st.integers(-9000, 9000),
    st.integers(-(2**40), 2**40),
    st.sampled_from([63, 64, 8191, 8192]),
)
widths = st.sampled_from([0, 0, 0, 0, 1, 2])
# Values whose length takes three varint bytes (>= 8192), made from a drawn length: drawing ~8 KB of bytes
# per value overran Hypothesis' example buffer and failed its data_too_large health check now and then.
wide_value = st.builds(
    lambda n, fill: fill * n, st.integers(8185, 8200), st.sampled_from([b"v", b"\x00", b"\x80"])
)
blob = st.one_of(st.none(), st.binary(max_size=70), wide_value)


@st.composite
def records_bodies(draw: st.DrawFn) -> tuple[bytes, list[Record]]:
    """A records body and the records the general decoder reads from it."""
    parts: list[bytes] = []
    expected: list[Record] = []
    for index in range(draw(st.integers(0, 12))):
        value_only = draw(st.sampled_from([True, True, False]))
        offset_delta = index if value_only and draw(st.booleans()) else draw(small_or_wide)
        timestamp_delta = 0 if value_only and draw(st.booleans()) else draw(small_or_wide)
        key = None if value_only else draw(blob)
        value = draw(st.one_of(st.binary(max_size=70), wide_value) if value_only else blob)
        headers: tuple[tuple[str, bytes | None], ...] = (
            ()
            if value_only
            else tuple(
                draw(
                    st.lists(
                        st.tuples(st.text(max_size=4), st.one_of(st.none(), st.binary(max_size=5))),
                        max_size=2,
                    )
                )
            )
        )
        fields = [
            bytes([draw(st.sampled_from([0, 0, 0x21, 0xFF]))]),  # attributes: ignored by every decoder
            _varint(timestamp_delta, draw(widths)),
            _varint(offset_delta, draw(widths)),
        ]
        for item in (key, value):
            fields.append(
                _varint(-1, draw(widths)) if item is None else _varint(len(item), draw(widths)) + item
            )
        fields.append(_varint(len(headers), draw(widths)))
        for name, header_value in headers:
            raw_name = name.encode()
            fields.append(_varint(len(raw_name), 0) + raw_name)
            fields.append(
                _varint(-1, 0) if header_value is None else _varint(len(header_value), 0) + header_value
            )
        body = b"".join(fields)
        parts.append(_varint(len(body), draw(widths)) + body)
        expected.append(Record(offset_delta, timestamp_delta, key, value, headers))
    return b"".join(parts), expected


def _outcome(scan: Any, data: bytes, count: int, pairs_base: int | None) -> object:
    try:
        return scan(memoryview(data), 0, len(data), count, pairs_base)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        return type(exc), str(exc)


@settings(max_examples=400, deadline=None)
@given(
    records_bodies(),
    st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3),
    st.integers(-1, 1),
    st.integers(0, 12),
    st.sampled_from([None, 0, 2**40]),
)
def test_the_walk_decides_as_the_walk_it_replaced(
    shaped: tuple[bytes, list[Record]],
    edits: list[tuple[int, int]],
    count_error: int,
    cut: int,
    pairs_base: int | None,
) -> None:
    body, expected = shaped
    got = _scan_records(memoryview(body), 0, len(body), len(expected), pairs_base)
    if pairs_base is None:
        assert got == expected
    else:
        assert got == [(pairs_base + r.offset_delta, r.value or b"") for r in expected]
    assert got == _reference_scan(memoryview(body), 0, len(body), len(expected), pairs_base)
    damaged = bytearray(body)
    for position, byte in edits:
        if damaged:
            damaged[position % len(damaged)] = byte
    if cut and edits:
        del damaged[-cut:]
    raw = bytes(damaged)
    count = max(0, len(expected) + count_error)
    assert _outcome(_scan_records, raw, count, pairs_base) == _outcome(
        _reference_scan, raw, count, pairs_base
    )


def test_a_walk_inside_a_larger_buffer_reads_only_its_own_bytes() -> None:
    # the records end where the batch's length says, whatever follows in the buffer (a well-formed record
    # here): a count one too many is refused, not read from past the end
    data = build_batch(5, [(None, b"a"), (None, b"")], leader_epoch=1, timestamp_ms=0)
    view = memoryview(data + b"\x10\x00\x00\x04\x01\x04xy\x00")
    assert _scan_records(view, HEADER_SIZE, len(data), 2, 5) == [(5, b"a"), (6, b"")]
    assert _scan_records(view, HEADER_SIZE, len(view), 3, 5) == [(5, b"a"), (6, b""), (7, b"xy")]
    for pairs_base in (None, 5):
        refused = _outcome_in(view, len(data), 3, pairs_base)
        assert refused == _reference_outcome_in(view, len(data), 3, pairs_base)
        assert refused[0] is ValueError


def _outcome_in(view: memoryview, end: int, count: int, pairs_base: int | None) -> tuple[type, str]:
    try:
        _scan_records(view, HEADER_SIZE, end, count, pairs_base)
    except ValueError as exc:
        return type(exc), str(exc)
    raise AssertionError("accepted")


def _reference_outcome_in(view: memoryview, end: int, count: int, pairs_base: int | None) -> tuple[type, str]:
    try:
        _reference_scan(view, HEADER_SIZE, end, count, pairs_base)
    except ValueError as exc:
        return type(exc), str(exc)
    raise AssertionError("accepted")


def _with_valid_crc(raw: bytes) -> bytes:
    from crc32c import crc32c

    data = bytearray(raw)
    struct.pack_into(">I", data, CRC_OFFSET, crc32c(bytes(data[21:])))
    return bytes(data)


@settings(max_examples=100, deadline=None)
@given(records_bodies(), st.integers(0, 2**40))
def test_a_batch_of_any_shape_decodes_to_its_records_or_is_refused_whole(
    shaped: tuple[bytes, list[Record]], base_offset: int
) -> None:
    body, expected = shaped
    if not expected:
        return
    template = bytearray(
        build_batch(base_offset, [(None, b"")], leader_epoch=1, timestamp_ms=0)[:HEADER_SIZE]
    )
    struct.pack_into(">i", template, 8, HEADER_SIZE - 12 + len(body))  # batch_length
    struct.pack_into(">i", template, 57, len(expected))  # record_count
    raw = _with_valid_crc(bytes(template) + body)
    assert list(decode_batch(raw)[0].records) == expected
    assert decode_offset_values(raw) == [(base_offset + r.offset_delta, r.value or b"") for r in expected]
    short = bytearray(raw[:-1])  # the last record's header count cut off, the batch length fitted
    struct.pack_into(">i", short, 8, len(short) - 12)
    damaged = _with_valid_crc(bytes(short))
    for decode in (decode_batch, decode_offset_values):
        try:
            decode(damaged)
        except CorruptRecordError:
            continue
        raise AssertionError(f"{decode.__name__} accepted a body one byte short")


def _record(*fields: bytes) -> bytes:
    body = b"".join(fields)
    return _varint(len(body), 0) + body


NEXT = _record(b"\x00\x00\x02\x01\x06abc\x00")  # a plain value-only record (offset delta 1)


def _plain_outcome(scan: Any, data: bytes, count: int, pairs_base: int | None) -> object:
    try:
        return scan(memoryview(data), 0, len(data), count, pairs_base)
    except (ValueError, IndexError, UnicodeDecodeError) as exc:
        return type(exc), str(exc)


@pytest.mark.parametrize(
    ("body", "count", "decoded"),
    [
        # a negative offset delta (raw zig-zag odd) is the general decoder's, not an inline (raw >> 1)
        (_record(b"\x00\x00\x01\x01\x06xyz\x00") + NEXT, 2, [(-1, b"xyz"), (1, b"abc")]),
        (_record(b"\x00\x00\xff\x01\x01\x06xyz\x00") + NEXT, 2, [(-128, b"xyz"), (1, b"abc")]),
        # a null value (0x01) and a negative timestamp delta, inline-shaped otherwise
        (_record(b"\x00\x00\x00\x01\x01\x00") + NEXT, 2, [(0, b""), (1, b"abc")]),
        (_record(b"\x00\x03\x00\x01\x06xyz\x00") + NEXT, 2, [(0, b"xyz"), (1, b"abc")]),
        # a negative record length (raw 0x11: -9) before a body that would fit length 8
        (b"\x11\x00\x00\x00\x01\x04xy\x00" + NEXT, 2, None),
        # a header count of 1 in the record's last byte: no header follows (refused)
        (_record(b"\x00\x00\x00\x01\x06xyz\x02") + NEXT, 2, None),
        # three two-byte varints in the last 8 bytes: the inline path's reads would pass the end (refused)
        (b"\x81\x00\x00\x00\x81\x00\x01\x81", 1, None),
        (NEXT + b"\x81\x00\x00\x00\x81\x00\x01\x81", 2, None),
        # a length of three varint bytes, and a record claiming more bytes than the batch has (refused)
        (b"\x80\x80\x01" + NEXT[1:] + NEXT, 2, None),
        (_record(b"\x00\x00\x00\x01\x06xyz\x00")[:-1] + NEXT, 2, None),
    ],
)
def test_hand_made_records_decide_as_before(
    body: bytes, count: int, decoded: list[tuple[int, bytes]] | None
) -> None:
    for pairs_base in (None, 0):
        got = _plain_outcome(_scan_records, body, count, pairs_base)
        assert got == _plain_outcome(_reference_scan, body, count, pairs_base)
        if decoded is None:
            assert isinstance(got, tuple) and got[0] is ValueError
        elif pairs_base == 0:
            assert got == decoded
