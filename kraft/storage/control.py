"""KRaft control records: keys and the value schemas Kafka uses.

A control record's key is ``int16 version (0) + int16 type`` (Kafka's ControlRecordType).  The values are
Kafka's "flexible" message schemas (version 0, compact arrays, tagged fields), so Kafka's own tools can
read them:

- LeaderChangeMessage: Version int16, LeaderId int32, Voters [VoterId int32], GrantingVoters [VoterId int32]
- SnapshotHeaderRecord: Version int16, LastContainedLogTimestamp int64
- SnapshotFooterRecord: Version int16
- KRaftVersionRecord: Version int16, KRaftVersion int16
- VotersRecord: Version int16, Voters [VoterId int32, VoterDirectoryId uuid, Endpoints [Name string,
  Host string, Port uint16], KRaftVersionFeature {MinSupportedVersion int16, MaxSupportedVersion int16}]

Unknown tagged fields are skipped on decode (forward compatible); we never write any.
"""

from __future__ import annotations

import enum
import struct
from dataclasses import dataclass

from kraft.storage.errors import CorruptRecordError
from kraft.storage.ids import ZERO_UUID, parse_uuid, uuid_string
from kraft.storage.varint import decode_uvarint, encode_uvarint

_KEY = struct.Struct(">hh")
_I16 = struct.Struct(">h")
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_NO_TAGGED_FIELDS = b"\x00"


class ControlRecordType(enum.IntEnum):
    ABORT = 0
    COMMIT = 1
    LEADER_CHANGE = 2
    SNAPSHOT_HEADER = 3
    SNAPSHOT_FOOTER = 4
    KRAFT_VERSION = 5
    KRAFT_VOTERS = 6


@dataclass(frozen=True, slots=True)
class LeaderChangeMessage:
    leader_id: int
    voters: tuple[int, ...] = ()
    granting_voters: tuple[int, ...] = ()
    version: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotHeaderRecord:
    last_contained_log_timestamp: int
    version: int = 0


@dataclass(frozen=True, slots=True)
class SnapshotFooterRecord:
    version: int = 0


@dataclass(frozen=True, slots=True)
class KRaftVersionRecord:
    kraft_version: int
    version: int = 0


@dataclass(frozen=True, slots=True)
class VoterEndpoint:
    name: str
    host: str
    port: int


@dataclass(frozen=True, slots=True)
class VoterRecordEntry:
    """One voter of a VotersRecord; ``directory_id`` is a Kafka UUID string ("" = the zero UUID)."""

    voter_id: int
    directory_id: str
    endpoints: tuple[VoterEndpoint, ...] = ()
    min_supported_version: int = 0
    max_supported_version: int = 1


@dataclass(frozen=True, slots=True)
class VotersRecord:
    voters: tuple[VoterRecordEntry, ...]
    version: int = 0


ControlMessage = (
    LeaderChangeMessage | SnapshotHeaderRecord | SnapshotFooterRecord | KRaftVersionRecord | VotersRecord
)


def encode_control_key(record_type: ControlRecordType) -> bytes:
    return _KEY.pack(0, int(record_type))


def decode_control_key(key: bytes | None) -> int:
    """The control record type number of a control record key (may be a type this build does not know)."""
    if key is None or len(key) < _KEY.size:
        raise CorruptRecordError(f"control record key must be at least 4 bytes, got {key!r}")
    version, record_type = _KEY.unpack_from(key, 0)
    if version < 0:
        raise CorruptRecordError(f"control record key has negative version {version}")
    return int(record_type)


def _encode_voters(voters: tuple[int, ...]) -> bytes:
    # Compact array: length + 1; each element is a struct with its own (empty) tagged-field section.
    parts = [encode_uvarint(len(voters) + 1)]
    for voter_id in voters:
        parts.append(_I32.pack(voter_id))
        parts.append(_NO_TAGGED_FIELDS)
    return b"".join(parts)


def _skip_tagged_fields(buf: bytes, pos: int) -> int:
    count, pos = decode_uvarint(buf, pos)
    for _ in range(count):
        _tag, pos = decode_uvarint(buf, pos)
        size, pos = decode_uvarint(buf, pos)
        pos += size
    if pos > len(buf):
        raise ValueError("tagged field runs past the end of the value")
    return pos


def _decode_voters(buf: bytes, pos: int) -> tuple[tuple[int, ...], int]:
    length_plus_one, pos = decode_uvarint(buf, pos)
    if length_plus_one == 0:
        return (), pos  # a null compact array; Kafka never writes one here, read it as empty
    voters: list[int] = []
    for _ in range(length_plus_one - 1):
        (voter_id,) = _I32.unpack_from(buf, pos)
        voters.append(voter_id)
        pos = _skip_tagged_fields(buf, pos + 4)
    return tuple(voters), pos


def encode_leader_change(message: LeaderChangeMessage) -> bytes:
    return b"".join(
        (
            _I16.pack(message.version),
            _I32.pack(message.leader_id),
            _encode_voters(message.voters),
            _encode_voters(message.granting_voters),
            _NO_TAGGED_FIELDS,
        )
    )


def decode_leader_change(value: bytes | None) -> LeaderChangeMessage:
    if value is None:
        raise CorruptRecordError("LeaderChange control record has no value")
    try:
        (version,) = _I16.unpack_from(value, 0)
        (leader_id,) = _I32.unpack_from(value, 2)
        voters, pos = _decode_voters(value, 6)
        granting, pos = _decode_voters(value, pos)
        _skip_tagged_fields(value, pos)
    except (struct.error, ValueError) as exc:
        raise CorruptRecordError(f"malformed LeaderChange control record value: {exc}") from exc
    return LeaderChangeMessage(leader_id=leader_id, voters=voters, granting_voters=granting, version=version)


def encode_snapshot_header(record: SnapshotHeaderRecord) -> bytes:
    return _I16.pack(record.version) + _I64.pack(record.last_contained_log_timestamp) + _NO_TAGGED_FIELDS


def decode_snapshot_header(value: bytes | None) -> SnapshotHeaderRecord:
    if value is None:
        raise CorruptRecordError("SnapshotHeader control record has no value")
    try:
        (version,) = _I16.unpack_from(value, 0)
        (timestamp,) = _I64.unpack_from(value, 2)
        _skip_tagged_fields(value, 10)
    except (struct.error, ValueError) as exc:
        raise CorruptRecordError(f"malformed SnapshotHeader control record value: {exc}") from exc
    return SnapshotHeaderRecord(last_contained_log_timestamp=timestamp, version=version)


def encode_snapshot_footer(record: SnapshotFooterRecord) -> bytes:
    return _I16.pack(record.version) + _NO_TAGGED_FIELDS


def decode_snapshot_footer(value: bytes | None) -> SnapshotFooterRecord:
    if value is None:
        raise CorruptRecordError("SnapshotFooter control record has no value")
    try:
        (version,) = _I16.unpack_from(value, 0)
        _skip_tagged_fields(value, 2)
    except (struct.error, ValueError) as exc:
        raise CorruptRecordError(f"malformed SnapshotFooter control record value: {exc}") from exc
    return SnapshotFooterRecord(version=version)


def encode_kraft_version(record: KRaftVersionRecord) -> bytes:
    return _I16.pack(record.version) + _I16.pack(record.kraft_version) + _NO_TAGGED_FIELDS


def decode_kraft_version(value: bytes | None) -> KRaftVersionRecord:
    if value is None:
        raise CorruptRecordError("KRaftVersion control record has no value")
    try:
        version, kraft_version = struct.unpack_from(">hh", value, 0)
        _skip_tagged_fields(value, 4)
    except (struct.error, ValueError) as exc:
        raise CorruptRecordError(f"malformed KRaftVersion control record value: {exc}") from exc
    return KRaftVersionRecord(kraft_version=kraft_version, version=version)


def _encode_compact_string(text: str) -> bytes:
    raw = text.encode("utf-8")
    return encode_uvarint(len(raw) + 1) + raw


def _decode_compact_string(buf: bytes, pos: int) -> tuple[str, int]:
    length_plus_one, pos = decode_uvarint(buf, pos)
    if length_plus_one == 0 or pos + length_plus_one - 1 > len(buf):
        raise ValueError("bad compact string")
    end = pos + length_plus_one - 1
    return buf[pos:end].decode("utf-8"), end


def encode_voters(record: VotersRecord) -> bytes:
    parts = [_I16.pack(record.version), encode_uvarint(len(record.voters) + 1)]
    for voter in record.voters:
        parts.append(_I32.pack(voter.voter_id))
        parts.append(parse_uuid(voter.directory_id or ZERO_UUID))
        parts.append(encode_uvarint(len(voter.endpoints) + 1))
        for endpoint in voter.endpoints:
            parts += [
                _encode_compact_string(endpoint.name),
                _encode_compact_string(endpoint.host),
                struct.pack(">H", endpoint.port),
                _NO_TAGGED_FIELDS,
            ]
        parts += [
            _I16.pack(voter.min_supported_version),
            _I16.pack(voter.max_supported_version),
            _NO_TAGGED_FIELDS,  # KRaftVersionFeature's
            _NO_TAGGED_FIELDS,  # the voter's
        ]
    parts.append(_NO_TAGGED_FIELDS)
    return b"".join(parts)


def decode_voters(value: bytes | None) -> VotersRecord:
    if value is None:
        raise CorruptRecordError("Voters control record has no value")
    try:
        (version,) = _I16.unpack_from(value, 0)
        count_plus_one, pos = decode_uvarint(value, 2)
        voters: list[VoterRecordEntry] = []
        for _ in range(max(0, count_plus_one - 1)):
            (voter_id,) = _I32.unpack_from(value, pos)
            raw_uuid = value[pos + 4 : pos + 20]
            if len(raw_uuid) != 16:
                raise ValueError("truncated directory id")
            directory_id = uuid_string(raw_uuid)
            endpoint_count_plus_one, pos = decode_uvarint(value, pos + 20)
            endpoints: list[VoterEndpoint] = []
            for _ in range(max(0, endpoint_count_plus_one - 1)):
                name, pos = _decode_compact_string(value, pos)
                host, pos = _decode_compact_string(value, pos)
                (port,) = struct.unpack_from(">H", value, pos)
                pos = _skip_tagged_fields(value, pos + 2)
                endpoints.append(VoterEndpoint(name, host, port))
            min_version, max_version = struct.unpack_from(">hh", value, pos)
            pos = _skip_tagged_fields(value, pos + 4)
            pos = _skip_tagged_fields(value, pos)
            voters.append(
                VoterRecordEntry(
                    voter_id,
                    "" if directory_id == ZERO_UUID else directory_id,
                    tuple(endpoints),
                    min_version,
                    max_version,
                )
            )
        _skip_tagged_fields(value, pos)
    except (struct.error, ValueError, UnicodeDecodeError) as exc:
        raise CorruptRecordError(f"malformed Voters control record value: {exc}") from exc
    return VotersRecord(voters=tuple(voters), version=version)


def encode_control_message(message: ControlMessage) -> tuple[bytes, bytes]:
    """The (key, value) pair of a control record carrying ``message``."""
    if isinstance(message, LeaderChangeMessage):
        return encode_control_key(ControlRecordType.LEADER_CHANGE), encode_leader_change(message)
    if isinstance(message, SnapshotHeaderRecord):
        return encode_control_key(ControlRecordType.SNAPSHOT_HEADER), encode_snapshot_header(message)
    if isinstance(message, KRaftVersionRecord):
        return encode_control_key(ControlRecordType.KRAFT_VERSION), encode_kraft_version(message)
    if isinstance(message, VotersRecord):
        return encode_control_key(ControlRecordType.KRAFT_VOTERS), encode_voters(message)
    return encode_control_key(ControlRecordType.SNAPSHOT_FOOTER), encode_snapshot_footer(message)


def decode_control_message(key: bytes | None, value: bytes | None) -> ControlMessage | None:
    """Decode a control record; None for a control type kraft does not interpret (ABORT, COMMIT)."""
    record_type = decode_control_key(key)
    if record_type == ControlRecordType.LEADER_CHANGE:
        return decode_leader_change(value)
    if record_type == ControlRecordType.SNAPSHOT_HEADER:
        return decode_snapshot_header(value)
    if record_type == ControlRecordType.SNAPSHOT_FOOTER:
        return decode_snapshot_footer(value)
    if record_type == ControlRecordType.KRAFT_VERSION:
        return decode_kraft_version(value)
    if record_type == ControlRecordType.KRAFT_VOTERS:
        return decode_voters(value)
    return None
