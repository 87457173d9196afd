"""Kafka-style UUIDs: 16 random bytes shown as 22 characters of unpadded base64url.

Kafka's ``Uuid.randomUuid()`` never returns the all-zero id or the metadata-topic id (…0001), nor a string
starting with ``-`` (it would look like a command-line flag); we follow the same rules.
"""

from __future__ import annotations

import base64
import binascii
import os

ZERO_UUID = "AAAAAAAAAAAAAAAAAAAAAA"
METADATA_TOPIC_UUID = "AAAAAAAAAAAAAAAAAAAAAQ"
_RESERVED = frozenset((ZERO_UUID, METADATA_TOPIC_UUID))


def _encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).decode("ascii").rstrip("=")


def uuid_string(raw: bytes) -> str:
    """The Kafka UUID string of 16 raw bytes."""
    if len(raw) != 16:
        raise ValueError(f"a UUID is 16 bytes, got {len(raw)}")
    return _encode(raw)


def random_uuid() -> str:
    while True:
        text = _encode(os.urandom(16))
        if text not in _RESERVED and not text.startswith("-"):
            return text


def parse_uuid(text: str) -> bytes:
    """The 16 bytes of a Kafka UUID string; ValueError with the reason if it is not one."""
    if len(text) != 22:
        raise ValueError(f"invalid UUID {text!r}: expected 22 base64url characters, got {len(text)}")
    try:
        raw = base64.urlsafe_b64decode(text + "==")
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"invalid UUID {text!r}: not base64url ({exc})") from exc
    if len(raw) != 16 or _encode(raw) != text:
        raise ValueError(f"invalid UUID {text!r}: does not encode 16 bytes canonically")
    return raw


def is_valid_uuid(text: str) -> bool:
    try:
        parse_uuid(text)
    except ValueError:
        return False
    return True
