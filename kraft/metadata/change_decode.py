"""A leave-shaped PartitionChangeRecord's (and a new PartitionRecord's) value bytes read straight into
their fields, without protobuf.

Every follower controller and every broker replays each PartitionChangeRecord a controlled shutdown
writes (~100,000 in a few seconds, issue #17).  Through upb that is a parse (~1.3 µs), the oneof's
sub-message wrapper, the ``isr`` wrapper and its id list (~2.5 µs more, session 14).  Nearly all of those
records have one shape — partition id, topic id, ISR and/or leader, nothing else, as upb itself writes
them — and :func:`isr_leader_change` reads that shape's bytes directly into an :data:`IsrLeaderChange`.

The rule that keeps it safe: it answers only where its meaning is certainly upb's, and ``None`` for
anything else — another field set, an unknown field, a field twice or out of order, unpacked ids, a
non-ASCII topic id, a varint upb might read differently, a truncated or malformed byte — so the caller
decodes that value through upb exactly as before (same record, or the same ``KraftError``).  Property-
tested against upb in tests/unit/metadata/test_change_decode.py.

The same holds for a new partition's PartitionRecord (session 16): every CreateTopics writes one per
partition (100,000 in a bulk request) and every snapshot one per healthy partition, each replayed by every
follower controller; :func:`plain_partition` reads its seven fields into a :data:`PlainPartition`
(tests/unit/metadata/test_partition_decode.py).

Each tries a straight path first (session 17: :func:`_change_common`, :func:`_plain_common`): the shape
nearly every such record has, its varints inlined and its topic id field matched against the one read
before; anything else goes to the general walk, and from there to upb.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Final

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError

from kraft.errors import KraftError
from kraft.metadata.records import _ONEOF, _SINGLE_BYTE_HEADERS, FRAME_VERSION, ApiKey, decode_value
from kraft.v1 import metadata_pb2 as pb

IsrLeaderChange = tuple[str, int, tuple[int, ...] | None, int | None]
"""``(topic id, partition id, ISR, leader)`` of a PartitionChangeRecord that sets nothing else; ``None``
for a field the record leaves unchanged.  A plain tuple: building it costs far less than any class."""

PlainPartition = tuple[str, int, tuple[int, ...], tuple[int, ...], int, int, int]
"""``(topic id, partition id, replicas, ISR, leader, leader epoch, partition epoch)`` of a PartitionRecord
that sets nothing else (no ELR, recovered, never unclean, no reassignment, no directories): every
partition a CreateTopics or CreatePartitions writes.  Seven fields, where an :data:`IsrLeaderChange` has
four: the replay tells them apart by length."""

# The wire layout read below, checked against the compiled descriptor at import: a renumbered or retyped
# field fails here, not as a record silently read with another meaning.
_CHANGE = pb.PartitionChangeRecord.DESCRIPTOR.fields_by_name
_EXPECTED: Final = {
    "partition_id": (1, FieldDescriptor.TYPE_INT32),
    "topic_id": (2, FieldDescriptor.TYPE_STRING),
    "isr": (3, FieldDescriptor.TYPE_MESSAGE),
    "leader": (4, FieldDescriptor.TYPE_INT32),
}
for _name, (_number, _type) in _EXPECTED.items():
    assert (_CHANGE[_name].number, _CHANGE[_name].type) == (_number, _type), _name
_IDS = pb.BrokerIdList.DESCRIPTOR.fields_by_name["ids"]
assert (_IDS.number, _IDS.type, _IDS.is_packed) == (1, FieldDescriptor.TYPE_INT32, True)
_ONEOF_FIELD = pb.MetadataRecord.DESCRIPTOR.fields_by_name["partition_change"].number
assert _ONEOF_FIELD == ApiKey.PARTITION_CHANGE + 10

# Header (frame version, api key, record version 0: the one layout known here, whatever newer version a
# later build may add) and the MetadataRecord's tag of its ``partition_change`` field (length-delimited).
_PREFIX: Final = bytes((FRAME_VERSION, ApiKey.PARTITION_CHANGE, 0, (_ONEOF_FIELD << 3) | 2))
_TAG_PARTITION_ID: Final = (1 << 3) | 0
_TAG_TOPIC_ID: Final = (2 << 3) | 2
_TAG_ISR: Final = (3 << 3) | 2
_TAG_LEADER: Final = (4 << 3) | 0
_TAG_IDS_PACKED: Final = (1 << 3) | 2

# A PartitionRecord (api key 3) the same way: its MetadataRecord field, and the tags of the seven fields
# a new partition's record sets (ids in packed runs of their own, no BrokerIdList wrapper).
_PARTITION = pb.PartitionRecord.DESCRIPTOR.fields_by_name
_PARTITION_EXPECTED: Final = {
    "partition_id": (1, FieldDescriptor.TYPE_INT32),
    "topic_id": (2, FieldDescriptor.TYPE_STRING),
    "replicas": (3, FieldDescriptor.TYPE_INT32),
    "isr": (4, FieldDescriptor.TYPE_INT32),
    "leader": (7, FieldDescriptor.TYPE_INT32),
    "leader_epoch": (9, FieldDescriptor.TYPE_INT32),
    "partition_epoch": (10, FieldDescriptor.TYPE_INT32),
}
for _name, (_number, _type) in _PARTITION_EXPECTED.items():
    assert (_PARTITION[_name].number, _PARTITION[_name].type) == (_number, _type), _name
assert _PARTITION["replicas"].is_packed and _PARTITION["isr"].is_packed
_PARTITION_FIELD = pb.MetadataRecord.DESCRIPTOR.fields_by_name["partition"].number
assert _PARTITION_FIELD == ApiKey.PARTITION + 10
_PARTITION_PREFIX: Final = bytes((FRAME_VERSION, ApiKey.PARTITION, 0, (_PARTITION_FIELD << 3) | 2))
_TAG_REPLICAS: Final = (3 << 3) | 2
_TAG_PARTITION_ISR: Final = (4 << 3) | 2
_TAG_PARTITION_LEADER: Final = (7 << 3) | 0
_TAG_LEADER_EPOCH: Final = (9 << 3) | 0
_TAG_PARTITION_EPOCH: Final = (10 << 3) | 0

_BAD: Final = -1
# Packed id runs already read (exact bytes -> ids): a run is read the same every time, so this only saves
# the per-id Python loop (ids of 128 and up, two bytes each).  Cleared when full.
_RUNS: dict[bytes, tuple[int, ...]] = {}
_RUNS_MAX: Final = 1 << 14
_MINUS_ONE: Final = b"\xff" * 9 + b"\x01"  # -1 as an int32 varint (10 bytes, as upb writes it)


# The topic id field (tag, length, bytes: field 2, a string, in both a PartitionRecord and a
# PartitionChangeRecord) read last by a walk, and its ``str``: a bulk CreateTopics' records come topic by
# topic, a controlled shutdown's changes mostly so, so nearly every record repeats the one before's topic
# id — matched in place (one C call, no slice, no ASCII check, no new ``str``: the image's partitions of a
# topic then share one topic id object).  Bytes equal to a field read before are read as it was.
# (To begin with: an empty topic id's field, which any walk reads as "" too.)
_last_topic_field: tuple[bytes, str] = (b"\x12\x00", "")


def _long_varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` (first byte ≥ 0x80) and the position after it; ``(0, _BAD)`` for one that
    runs past ``end``, is longer than 10 bytes or above 2**64 — left to upb."""
    result = 0
    shift = 0
    while pos < end and shift < 70:
        byte = data[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return (0, _BAD) if result >> 64 else (result, pos)
        shift += 7
    return 0, _BAD


def _int32(raw: int) -> int:
    """An int32 field's value from its (up to 64-bit) varint: the low 32 bits, two's complement — what
    upb and the protobuf spec do (a negative int32, leader -1, is written as 10 bytes)."""
    raw &= 0xFFFFFFFF
    return raw - (1 << 32) if raw >> 31 else raw


def isr_leader_change(value: bytes) -> IsrLeaderChange | None:
    """The change ``value`` carries if it is a PartitionChangeRecord setting only its partition id, topic
    id, ISR and leader (each at most once, in field order, ids packed); ``None`` for anything else, which
    the caller must decode through upb (:func:`kraft.metadata.records.decode_value`)."""
    if value[:4] != _PREFIX:
        return None
    return _change_common(value) or _change_walk(value)


def _change_common(value: bytes) -> IsrLeaderChange | None:
    """:func:`isr_leader_change` of the shape nearly every change of a controlled shutdown or a rejoin
    has — a record under 128 bytes; a partition id and a leader of one or two varint bytes (or no leader,
    -1); the topic id field read before it, byte for byte; the ISR one packed run of under 128 bytes —
    straight through with the varints inlined (session 17).  ``None`` for anything else, including every
    malformed value: the general walk (:func:`_change_walk`) reads it then."""
    end = len(value)
    try:
        size = value[4]
        if size >= 0x80 or size + 5 != end or value[5] != _TAG_PARTITION_ID:
            return None
        low = value[6]
        if low < 0x80:
            partition_id = low
            pos = 7
        else:
            high = value[7]
            if high >= 0x80:
                return None
            partition_id = (low & 0x7F) | (high << 7)
            pos = 8
        topic_field, topic_id = _last_topic_field
        if not value.startswith(topic_field, pos):
            return None
        pos += len(topic_field)
        isr: tuple[int, ...] | None = None
        if pos < end and value[pos] == _TAG_ISR:
            # BrokerIdList: [0x1a][list size][0x0a][run size][run]; an empty list is [0x1a][0x00]
            size = value[pos + 1]
            if size == 0:
                isr = ()
                pos += 2
            else:
                run_size = value[pos + 3]
                start = pos + 4
                pos = start + run_size
                if size >= 0x80 or value[start - 2] != _TAG_IDS_PACKED or run_size + 2 != size or pos > end:
                    return None
                isr = _run_ids(value, start, pos)
                if isr is None:
                    return None
        leader: int | None = None
        if pos < end and value[pos] == _TAG_LEADER:
            low = value[pos + 1]
            if low < 0x80:
                leader = low
                pos += 2
            elif value.startswith(_MINUS_ONE, pos + 1):  # no leader: a leave's own value
                leader = -1
                pos += 11
            else:
                high = value[pos + 2]
                if high >= 0x80:
                    return None
                leader = (low & 0x7F) | (high << 7)
                pos += 3
        if pos != end:
            return None
        return topic_id, partition_id, isr, leader
    except IndexError:
        return None


def _change_walk(value: bytes) -> IsrLeaderChange | None:
    """:func:`isr_leader_change`'s general walk (any varint width, any field left out); remembers the topic
    id field it read for the straight paths."""
    global _last_topic_field
    end = len(value)
    try:
        size = value[4]
        pos = 5
        if size >= 0x80:
            size, pos = _long_varint(value, 4, end)
            if pos == _BAD:
                return None
        if pos + size != end:  # the record is exactly the rest: no second field, nothing after it
            return None
        # Straight through the four fields in field order, each optional: any other tag, a field twice
        # or out of order (upb would merge, or keep the last) stops the walk short of ``end``: upb's call.
        tag = value[pos] if pos < end else 0
        partition_id = 0
        if tag == _TAG_PARTITION_ID:
            partition_id, pos = _int32_at(value, pos + 1, end)
            if pos == _BAD:
                return None
            tag = value[pos] if pos < end else 0
        topic_id = ""
        if tag == _TAG_TOPIC_ID:
            field_at = pos
            size = value[pos + 1]
            pos += 2
            if size >= 0x80:
                size, pos = _long_varint(value, pos - 1, end)
                if pos == _BAD:
                    return None
            stop = pos + size
            raw = value[pos:stop]
            if stop > end or not raw.isascii():  # (ASCII: valid UTF-8 by any validator's rules)
                return None
            topic_id = raw.decode("ascii")
            _last_topic_field = (value[field_at:stop], topic_id)
            pos = stop
            tag = value[pos] if pos < end else 0
        isr: tuple[int, ...] | None = None
        if tag == _TAG_ISR:
            size = value[pos + 1]
            pos += 2
            if size >= 0x80:
                size, pos = _long_varint(value, pos - 1, end)
                if pos == _BAD:
                    return None
            stop = pos + size
            if stop > end:
                return None
            isr = _packed_ids(value, pos, stop)
            if isr is None:
                return None
            pos = stop
            tag = value[pos] if pos < end else 0
        leader: int | None = None
        if tag == _TAG_LEADER:
            if value[pos + 1 : pos + 11] == _MINUS_ONE:  # no leader: a leave's own value
                leader = -1
                pos += 11
            else:
                leader, pos = _int32_at(value, pos + 1, end)
                if pos == _BAD:
                    return None
        if pos != end:
            return None
        return topic_id, partition_id, isr, leader
    except IndexError:  # a length or varint running past the end: upb says how it is malformed
        return None


def plain_partition(value: bytes) -> PlainPartition | None:
    """The partition ``value`` registers if it is a PartitionRecord setting only its partition id, topic
    id, replicas, ISR, leader, leader epoch and partition epoch (each at most once, in field order, ids
    packed in one run); ``None`` for anything else, which the caller must decode through upb."""
    if value[:4] != _PARTITION_PREFIX:
        return None
    return _plain_common(value) or _plain_walk(value)


def _plain_common(value: bytes) -> PlainPartition | None:
    """:func:`plain_partition` of the shape nearly every new partition's record has — a record under 128
    bytes; partition id and leader of one or two varint bytes; the previous record's topic id field
    byte for byte; three replicas of two bytes each or a run read by :func:`_run_ids`; an ISR of the
    replicas' very bytes or another run; epochs absent or of one byte — straight through with the
    varints inlined (session 17: the general walk took 3.5 µs of a new partition's ~5 µs decode and
    replay on a follower, raft-performance.md).  ``None`` for anything else, including every malformed
    value: the general walk (:func:`_plain_walk`) reads it then, so this path only has to be right where
    it answers."""
    end = len(value)
    try:
        size = value[4]
        if size >= 0x80 or size + 5 != end or value[5] != _TAG_PARTITION_ID:
            return None
        low = value[6]
        if low < 0x80:
            partition_id = low
            pos = 7
        else:
            high = value[7]
            if high >= 0x80:
                return None
            partition_id = (low & 0x7F) | (high << 7)
            pos = 8
        topic_field, topic_id = _last_topic_field
        if not value.startswith(topic_field, pos):
            return None
        pos += len(topic_field)
        if value[pos] != _TAG_REPLICAS:
            return None
        size = value[pos + 1]
        start = pos + 2
        pos = start + size
        if size >= 0x80 or pos > end:
            return None
        run = value[start:pos]
        replicas: tuple[int, ...] | None = None
        if size == 6:
            a, b, c, d, e, f = run
            if a >= 0x80 and b < 0x80 and c >= 0x80 and d < 0x80 and e >= 0x80 and f < 0x80:
                replicas = ((a & 0x7F) | (b << 7), (c & 0x7F) | (d << 7), (e & 0x7F) | (f << 7))
        elif size == 5:
            # Three ids, one below 128 (session 19: in a cluster of brokers 1-1,000 a third of the new
            # partitions, which the loop of _run_ids read a byte at a time): each id's last byte below
            # 0x80, a two-byte id's first byte not.
            a, b, c, d, e = run
            if a < 0x80:
                if b >= 0x80 and c < 0x80 and d >= 0x80 and e < 0x80:
                    replicas = (a, (b & 0x7F) | (c << 7), (d & 0x7F) | (e << 7))
            elif b < 0x80:
                if c < 0x80:
                    if d >= 0x80 and e < 0x80:
                        replicas = ((a & 0x7F) | (b << 7), c, (d & 0x7F) | (e << 7))
                elif d < 0x80 and e < 0x80:
                    replicas = ((a & 0x7F) | (b << 7), (c & 0x7F) | (d << 7), e)
        elif size == 4:  # three ids, two below 128 (four one-byte ids: _run_ids' one C call)
            a, b, c, d = run
            if a < 0x80:
                if b < 0x80:
                    if c >= 0x80 and d < 0x80:
                        replicas = (a, b, (c & 0x7F) | (d << 7))
                elif c < 0x80 and d < 0x80:
                    replicas = (a, (b & 0x7F) | (c << 7), d)
            elif b < 0x80 and c < 0x80 and d < 0x80:
                replicas = ((a & 0x7F) | (b << 7), c, d)
        if replicas is None:
            replicas = _run_ids(value, start, pos, False)
        if replicas is None or value[pos] != _TAG_PARTITION_ISR:
            return None
        isr_size = value[pos + 1]
        start = pos + 2
        pos = start + isr_size
        if isr_size >= 0x80 or pos > end:
            return None
        isr: tuple[int, ...] | None
        if isr_size == size and value.startswith(run, start):
            isr = replicas  # a new partition's ISR is its replicas: the same bytes, read once
        else:
            isr = _run_ids(value, start, pos, False)
            if isr is None:
                return None
        if value[pos] != _TAG_PARTITION_LEADER:
            return None
        low = value[pos + 1]
        if low < 0x80:
            leader = low
            pos += 2
        else:
            high = value[pos + 2]
            if high >= 0x80:
                return None  # (no leader, -1, is ten bytes: the general walk's)
            leader = (low & 0x7F) | (high << 7)
            pos += 3
        leader_epoch = partition_epoch = 0
        if pos < end and value[pos] == _TAG_LEADER_EPOCH:
            leader_epoch = value[pos + 1]
            pos += 2
            if leader_epoch >= 0x80:
                return None
        if pos < end and value[pos] == _TAG_PARTITION_EPOCH:
            partition_epoch = value[pos + 1]
            pos += 2
            if partition_epoch >= 0x80:
                return None
        if pos != end:
            return None
        return topic_id, partition_id, replicas, isr, leader, leader_epoch, partition_epoch
    except IndexError:
        return None


def _plain_walk(value: bytes) -> PlainPartition | None:
    """:func:`plain_partition`'s general walk (any varint width, any field left out); remembers the topic
    id field it read for :func:`_plain_common`."""
    global _last_topic_field
    end = len(value)
    try:
        size = value[4]
        pos = 5
        if size >= 0x80:
            size, pos = _long_varint(value, 4, end)
            if pos == _BAD:
                return None
        if pos + size != end:  # the record is exactly the rest: no second field, nothing after it
            return None
        # The same straight walk as isr_leader_change's: any other field (removing / adding replicas,
        # recovery state, directories, ELR, last known ELR, unclean epoch, an unknown one), a field twice
        # or out of order stops it short of ``end``, and upb reads the value.
        tag = value[pos] if pos < end else 0
        partition_id = 0
        if tag == _TAG_PARTITION_ID:
            partition_id, pos = _int32_at(value, pos + 1, end)
            if pos == _BAD:
                return None
            tag = value[pos] if pos < end else 0
        topic_id = ""
        if tag == _TAG_TOPIC_ID:
            field_at = pos
            size = value[pos + 1]
            pos += 2
            if size >= 0x80:
                size, pos = _long_varint(value, pos - 1, end)
                if pos == _BAD:
                    return None
            stop = pos + size
            raw = value[pos:stop]
            if stop > end or not raw.isascii():  # (ASCII: valid UTF-8 by any validator's rules)
                return None
            topic_id = raw.decode("ascii")
            _last_topic_field = (value[field_at:stop], topic_id)
            pos = stop
            tag = value[pos] if pos < end else 0
        replicas: tuple[int, ...] = ()
        replicas_at = replicas_end = 0
        if tag == _TAG_REPLICAS:
            size = value[pos + 1]
            pos += 2
            if size >= 0x80:
                size, pos = _long_varint(value, pos - 1, end)
                if pos == _BAD:
                    return None
            stop = pos + size
            if stop > end:
                return None
            ids = _run_ids(value, pos, stop, False)
            if ids is None:
                return None
            replicas = ids
            replicas_at, replicas_end = pos, stop
            pos = stop
            tag = value[pos] if pos < end else 0
        isr: tuple[int, ...] = ()
        if tag == _TAG_PARTITION_ISR:
            size = value[pos + 1]
            pos += 2
            if size >= 0x80:
                size, pos = _long_varint(value, pos - 1, end)
                if pos == _BAD:
                    return None
            stop = pos + size
            if stop > end:
                return None
            if stop > pos and value[pos:stop] == value[replicas_at:replicas_end]:
                isr = replicas  # a new partition's ISR is its replicas: the same bytes, read once
            else:
                ids = _run_ids(value, pos, stop, False)
                if ids is None:
                    return None
                isr = ids
            pos = stop
            tag = value[pos] if pos < end else 0
        leader = 0
        if tag == _TAG_PARTITION_LEADER:
            if value[pos + 1 : pos + 11] == _MINUS_ONE:  # no leader (offline)
                leader = -1
                pos += 11
            else:
                leader, pos = _int32_at(value, pos + 1, end)
                if pos == _BAD:
                    return None
            tag = value[pos] if pos < end else 0
        leader_epoch = 0
        if tag == _TAG_LEADER_EPOCH:
            leader_epoch, pos = _int32_at(value, pos + 1, end)
            if pos == _BAD:
                return None
            tag = value[pos] if pos < end else 0
        partition_epoch = 0
        if tag == _TAG_PARTITION_EPOCH:
            partition_epoch, pos = _int32_at(value, pos + 1, end)
            if pos == _BAD:
                return None
        if pos != end:
            return None
        return topic_id, partition_id, replicas, isr, leader, leader_epoch, partition_epoch
    except IndexError:  # a length or varint running past the end: upb says how it is malformed
        return None


def _int32_at(value: bytes, pos: int, end: int) -> tuple[int, int]:
    """The int32 field value whose varint starts at ``pos``, and the position after it (``_BAD``: upb's)."""
    byte = value[pos]
    if byte < 0x80:
        return byte, pos + 1
    if pos + 1 < end and value[pos + 1] < 0x80:  # two bytes: ids and partition ids below 16,384
        return (byte & 0x7F) | (value[pos + 1] << 7), pos + 2
    raw, pos = _long_varint(value, pos, end)
    return _int32(raw), pos


def _packed_ids(value: bytes, pos: int, end: int) -> tuple[int, ...] | None:
    """A BrokerIdList's ids from its bytes ``[pos, end)``: empty, or one packed run filling them."""
    if pos == end:
        return ()
    if value[pos] != _TAG_IDS_PACKED:
        return None
    size = value[pos + 1]
    pos += 2
    if size >= 0x80:
        size, pos = _long_varint(value, pos - 1, end)
        if pos == _BAD:
            return None
    if pos + size != end:
        return None
    return _run_ids(value, pos, end)


def _run_ids(value: bytes, pos: int, end: int, cached: bool = True) -> tuple[int, ...] | None:
    """The int32 ids of the packed run ``value[pos:end]`` (its length already read); None: upb's.
    ``cached``: look the run up in (and add it to) the cache of runs read — a shutdown's ISRs recur; a
    CreateTopics' replica sets mostly do not, and the lookups and insertions cost it more than they save."""
    run = value[pos:end]
    if run.isascii():  # every id below 128, one byte each: one C call
        return tuple(run)
    if cached:
        known = _RUNS.get(run)  # the same few thousand ISRs recur across a shutdown's changes
        if known is not None:
            return known
    highs = run[1::2]
    if not len(run) & 1 and highs.isascii() and min(lows := run[::2]) >= 0x80:
        # Every id in [128, 16384), two bytes each (a cluster of a thousand brokers: most replica sets
        # of a CreateTopics, each new): each first byte has its continuation bit, each second byte not,
        # read pairwise, no loop.  (A first byte without the bit makes a 1-byte id: the loop reads.)
        known = tuple([(low & 0x7F) | (high << 7) for low, high in zip(lows, highs, strict=True)])
    else:
        ids: list[int] = []
        append = ids.append
        while pos < end:
            byte = value[pos]
            if byte < 0x80:
                append(byte)
                pos += 1
            elif pos + 1 < end and value[pos + 1] < 0x80:
                append((byte & 0x7F) | (value[pos + 1] << 7))
                pos += 2
            else:
                number, pos = _long_varint(value, pos, end)
                if pos == _BAD:
                    return None
                append(_int32(number))
        known = tuple(ids)
    if cached:
        if len(_RUNS) >= _RUNS_MAX:
            _RUNS.clear()  # (bounded: costs only the re-reading)
        _RUNS[run] = known
    return known


ReplayRecord = pb.MetadataRecord | IsrLeaderChange | PlainPartition
"""What :func:`decode_replay_values` yields."""
_CHANGE_KEY: Final = bytes((ApiKey.PARTITION_CHANGE,))
_PARTITION_KEY: Final = bytes((ApiKey.PARTITION,))


def decode_replay_values(
    values: Iterable[bytes], on_error: Callable[[KraftError], None] | None = None
) -> Iterator[ReplayRecord]:
    """:func:`kraft.metadata.records.decode_values` for replay (``MetadataDelta.replay_decoded_steps``):
    the same records and the same errors, except that a PartitionChangeRecord of the common shape comes
    as an :data:`IsrLeaderChange` and a PartitionRecord of the common shape as a :data:`PlainPartition`
    instead of a protobuf message."""
    headers = _SINGLE_BYTE_HEADERS
    parse = pb.MetadataRecord.FromString
    fast = isr_leader_change
    plain = plain_partition
    for value in values:
        api = value[1:2]
        if api == _CHANGE_KEY:
            change = fast(value)
            if change is not None:
                yield change
                continue
        elif api == _PARTITION_KEY:
            partition = plain(value)
            if partition is not None:
                yield partition
                continue
        # from here as decode_values: the header by table lookup, upb, and decode_value for the rest
        field = headers.get(value[:3])
        if field is not None:
            try:
                record = parse(value[3:])
            except DecodeError:
                record = None
            if record is not None and record.WhichOneof(_ONEOF) == field:
                yield record
                continue
        if on_error is None:
            yield decode_value(value)
            continue
        try:
            yield decode_value(value)
        except KraftError as exc:
            on_error(exc)
