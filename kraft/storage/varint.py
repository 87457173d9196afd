"""Kafka's variable-length integers (protobuf style): zig-zag varints/varlongs and unsigned varints.

All decoders take ``(buf, pos)`` and return ``(value, next_pos)``; they raise ``ValueError`` on a
truncated or over-long encoding (callers turn it into a CorruptRecordError with context).
"""

from __future__ import annotations

_MAX_VARLONG_BYTES = 10


def encode_uvarint(value: int) -> bytes:
    """Unsigned varint (used by compact arrays and tagged fields)."""
    if value < 0:
        raise ValueError(f"unsigned varint must be >= 0, got {value}")
    if value < 0x80:
        return bytes((value,))
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def encode_varint(value: int) -> bytes:
    """Zig-zag signed varint/varlong (record fields).  Accepts the full int64 range."""
    zigzag = (value << 1) ^ (value >> 63)
    if 0 <= zigzag < 0x80:
        return bytes((zigzag,))
    return encode_uvarint(zigzag & 0xFFFFFFFFFFFFFFFF)


def decode_uvarint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    end = len(buf)
    result = 0
    shift = 0
    for _ in range(_MAX_VARLONG_BYTES):
        if pos >= end:
            raise ValueError("truncated varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7
    raise ValueError("varint longer than 10 bytes")


def decode_varint(buf: bytes | bytearray | memoryview, pos: int) -> tuple[int, int]:
    # Fast path: one-byte values are by far the most common (deltas, small lengths).
    if pos < len(buf):
        byte = buf[pos]
        if byte < 0x80:
            return (byte >> 1) ^ -(byte & 1), pos + 1
    raw, pos = decode_uvarint(buf, pos)
    return (raw >> 1) ^ -(raw & 1), pos


def size_of_varint(value: int) -> int:
    zigzag = ((value << 1) ^ (value >> 63)) & 0xFFFFFFFFFFFFFFFF
    size = 1
    while zigzag >= 0x80:
        zigzag >>= 7
        size += 1
    return size
