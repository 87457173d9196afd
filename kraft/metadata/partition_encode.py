"""A new partition's PartitionRecord value — and a common PartitionChangeRecord's — written straight
from their fields, without protobuf.

A bulk CreateTopics (100 topics x 1,000 partitions, issue #17) built one upb ``MetadataRecord`` per
partition when it prepared a topic, kept it (GC-tracked, with its own arena) until the topic's write, and
serialized it then (:func:`kraft.metadata.records.encode_value`): ~3.7-4 µs a partition (build and
encode), 100,000 tracked objects a request.  :func:`new_partition_value` gives the same bytes from the
fields in ~1.5 µs, and the prepared topic carries them (bytes are not tracked by the collector) to the append
(:class:`kraft.metadata.controller_logic.Outcome` ``values``).

The bytes must be exactly :func:`~kraft.metadata.records.encode_value`'s of the record
``_new_partitions`` builds — the same log whichever path wrote it, and the follower's direct read
(:func:`kraft.metadata.change_decode.plain_partition`) takes them as it takes upb's.  That is upb's proto3
wire format for the fields a new partition sets: fields in number order, a field at its zero value
omitted, ids packed, a negative int32 as a 10-byte varint.  Property-tested against upb over many shapes
in tests/unit/metadata/test_partition_encode.py; the field numbers and types are checked against the
compiled descriptor at import.

:func:`change_value` does the same for the PartitionChangeRecord a broker's leave writes for most of its
partitions (a controlled shutdown of 100,000 leaderships, a fence): partition id, topic id, maybe the ISR,
maybe the leader (session 18: ~2.4 µs a change to build the upb record, ~1 to encode it).
:func:`full_change_value` adds the ELR, last known ELR, recovery state and unclean epoch (session 19: an
unfence's elections, a sole replica's leave, the rarer leave shapes).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from google.protobuf.descriptor import FieldDescriptor

from kraft.metadata import records as rec
from kraft.storage.varint import encode_uvarint
from kraft.v1 import metadata_pb2 as pb

# The wire layout written below, checked against the compiled descriptor: a renumbered or retyped field
# fails at import, not as records written with another meaning.
_FIELDS = pb.PartitionRecord.DESCRIPTOR.fields_by_name
for _name, (_number, _type) in {
    "partition_id": (1, FieldDescriptor.TYPE_INT32),
    "topic_id": (2, FieldDescriptor.TYPE_STRING),
    "replicas": (3, FieldDescriptor.TYPE_INT32),
    "isr": (4, FieldDescriptor.TYPE_INT32),
    "leader": (7, FieldDescriptor.TYPE_INT32),
}.items():
    assert (_FIELDS[_name].number, _FIELDS[_name].type) == (_number, _type), _name
assert _FIELDS["replicas"].is_packed and _FIELDS["isr"].is_packed
# Field 1 is the lowest: nothing upb writes goes before the partition id.
assert min(f.number for f in pb.PartitionRecord.DESCRIPTOR.fields) == 1
_CHANGE_FIELDS = pb.PartitionChangeRecord.DESCRIPTOR.fields_by_name
for _name, (_number, _type) in {
    "partition_id": (1, FieldDescriptor.TYPE_INT32),
    "topic_id": (2, FieldDescriptor.TYPE_STRING),
    "isr": (3, FieldDescriptor.TYPE_MESSAGE),
    "leader": (4, FieldDescriptor.TYPE_INT32),
    "leader_recovery_state": (8, FieldDescriptor.TYPE_INT32),
    "eligible_leader_replicas": (9, FieldDescriptor.TYPE_MESSAGE),
    "last_known_elr": (10, FieldDescriptor.TYPE_MESSAGE),
    "last_unclean_leader_epoch": (11, FieldDescriptor.TYPE_INT32),
}.items():
    assert (_CHANGE_FIELDS[_name].number, _CHANGE_FIELDS[_name].type) == (_number, _type), _name
for _name in ("leader", "leader_recovery_state", "last_unclean_leader_epoch"):
    assert _CHANGE_FIELDS[_name].has_presence, _name  # written when set, 0 included
assert min(f.number for f in pb.PartitionChangeRecord.DESCRIPTOR.fields) == 1
_IDS = pb.BrokerIdList.DESCRIPTOR.fields_by_name["ids"]
assert (_IDS.number, _IDS.type, _IDS.is_packed) == (1, FieldDescriptor.TYPE_INT32, True)
assert len(pb.BrokerIdList.DESCRIPTOR.fields) == 1

_TAG_PARTITION_ID: Final = bytes(((1 << 3) | 0,))
_TAG_TOPIC_ID: Final = bytes(((2 << 3) | 2,))
_TAG_REPLICAS: Final = bytes(((3 << 3) | 2,))
_TAG_ISR: Final = bytes(((4 << 3) | 2,))
_TAG_LEADER: Final = bytes(((7 << 3) | 0,))
_TAG_CHANGE_ISR: Final = bytes(((3 << 3) | 2,))
_TAG_CHANGE_LEADER: Final = bytes(((4 << 3) | 0,))
_TAG_CHANGE_RECOVERY: Final = bytes(((8 << 3) | 0,))
_TAG_CHANGE_ELR: Final = bytes(((9 << 3) | 2,))
_TAG_CHANGE_LKE: Final = bytes(((10 << 3) | 2,))
_TAG_CHANGE_UNCLEAN_EPOCH: Final = bytes(((11 << 3) | 0,))


def _value_head(kind: str) -> bytes:
    """The value's header (frame version, api key, record version) and the MetadataRecord's tag of its
    ``kind`` field — taken from encode_value itself, so a new record version moves both alike."""
    probe = pb.MetadataRecord()
    getattr(probe, kind).partition_id = 1
    value = rec.encode_value(probe)
    body = getattr(probe, kind).SerializeToString()  # b"\x08\x01"
    assert value.endswith(bytes((len(body),)) + body), value
    return value[: -1 - len(body)]


_HEAD: Final = _value_head("partition")
_CHANGE_HEAD: Final = _value_head("partition_change")

_SMALL_COUNT: Final = 1 << 12
_SMALL: Final = tuple(encode_uvarint(n) for n in range(_SMALL_COUNT))
"""Varints of 0…4,095 (broker ids, partition ids, lengths): a tuple index instead of a Python loop."""
_SMALL_BY_VALUE: Final = dict(enumerate(_SMALL))
_small = _SMALL_BY_VALUE.get  # None for anything else (negative, large): then _varint
_UINT64: Final = (1 << 64) - 1


def _varint(value: int) -> bytes:
    """An int32's varint as upb writes it: a negative value as its 64-bit two's complement (10 bytes)."""
    if 0 <= value < _SMALL_COUNT:
        return _SMALL[value]
    return encode_uvarint(value & _UINT64)


def _packed(ids: Sequence[int]) -> bytes:
    """The packed run of ``ids`` (their varints back to back)."""
    parts = [*map(_small, ids)]
    if None in parts:  # an id outside the table: each id alone
        return b"".join([_varint(i) for i in ids])
    return b"".join(parts)  # type: ignore[arg-type]  # (no None: checked above)


def topic_field(topic_id: str) -> bytes:
    """The ``topic_id`` field's bytes (tag, length, UTF-8), computed once per topic and passed to
    :func:`new_partition_value` for each of its partitions; empty for ``""`` (proto3 omits it)."""
    if not topic_id:
        return b""
    data = topic_id.encode()
    return _TAG_TOPIC_ID + _varint(len(data)) + data


def new_partition_value(
    topic: bytes, partition_id: int, replicas: Sequence[int], isr: Sequence[int], leader: int
) -> bytes:
    """:func:`~kraft.metadata.records.encode_value`'s bytes of the MetadataRecord whose ``partition`` sets
    these fields and no others (leader and partition epoch 0: a new partition); ``topic`` is
    :func:`topic_field`'s.  An ISR that is the replicas' tuple itself (the common case) reuses its run."""
    if isr is replicas and partition_id and leader:
        # The bulk creation's case (every replica in the ISR, the ids in the table, the partition id any
        # positive one; anything else, a negative one included, is a KeyError): one concatenation,
        # ~1.5 µs against ~1.8 for the general path below.
        small = _SMALL_BY_VALUE
        try:
            packed = b"".join([small[i] for i in replicas])
            # (a big topic's partition ids run past the table: a varint of their own)
            pid = small[partition_id] if partition_id < _SMALL_COUNT else _varint(partition_id)
            lead = small[leader]
        except KeyError:
            return _general(topic, partition_id, replicas, isr, leader)
        if packed:
            size = _varint(len(packed))
            body = b"\x08" + pid + topic + b"\x1a" + size + packed + b'"' + size + packed + b"8" + lead
            return _HEAD + _varint(len(body)) + body
    return _general(topic, partition_id, replicas, isr, leader)


def _general(
    topic: bytes, partition_id: int, replicas: Sequence[int], isr: Sequence[int], leader: int
) -> bytes:
    packed = _packed(replicas) if replicas else b""
    parts = [_TAG_PARTITION_ID, _varint(partition_id)] if partition_id else []
    parts.append(topic)
    if packed:
        parts += (_TAG_REPLICAS, _varint(len(packed)), packed)
    if isr:
        run = packed if isr is replicas else _packed(isr)
        parts += (_TAG_ISR, _varint(len(run)), run)
    if leader:
        parts += (_TAG_LEADER, _varint(leader))
    body = b"".join(parts)
    return b"".join((_HEAD, _varint(len(body)), body))


def change_value(topic: bytes, partition_id: int, isr: Sequence[int] | None, leader: int | None) -> bytes:
    """:func:`~kraft.metadata.records.encode_value`'s bytes of the MetadataRecord whose
    ``partition_change`` sets these fields and no others: ``isr`` None leaves the ISR absent (an empty
    one is present, emptied), ``leader`` None leaves the leader absent (unchanged; -1 is "none");
    ``topic`` is :func:`topic_field`'s."""
    # The common case (every id, count and length in the table; -1 or anything else is a KeyError):
    # concatenations only, ~1 µs against ~1.6 for the general path below.
    small = _SMALL_BY_VALUE
    try:
        if not partition_id:
            body = topic
        elif partition_id < _SMALL_COUNT:
            body = b"\x08" + small[partition_id] + topic  # (a negative one: KeyError)
        else:
            body = b"\x08" + _varint(partition_id) + topic
        if isr is not None:
            if isr:
                run = b"".join([small[i] for i in isr])
                ids = b"\n" + small[len(run)] + run  # BrokerIdList.ids (field 1, packed)
                body += b"\x1a" + small[len(ids)] + ids
            else:
                body += b"\x1a\x00"  # present, emptied
        if leader is not None:
            body += b" " + small[leader]
        return _CHANGE_HEAD + small[len(body)] + body
    except KeyError:
        return _general_change(topic, partition_id, isr, leader)


def _id_list(ids: Sequence[int]) -> bytes:
    """A present BrokerIdList's bytes after its tag: length, then its ``ids`` field (packed) unless empty."""
    run = _packed(ids) if ids else b""
    inner = b"\n" + _varint(len(run)) + run if run else b""  # BrokerIdList.ids (field 1, packed)
    return _varint(len(inner)) + inner


def _general_change(
    topic: bytes,
    partition_id: int,
    isr: Sequence[int] | None,
    leader: int | None,
    elr: Sequence[int] | None = None,
    lke: Sequence[int] | None = None,
    recovery: int | None = None,
    unclean_epoch: int | None = None,
) -> bytes:
    parts = [_TAG_PARTITION_ID, _varint(partition_id)] if partition_id else []
    parts.append(topic)
    if isr is not None:
        parts += (_TAG_CHANGE_ISR, _id_list(isr))
    if leader is not None:
        parts += (_TAG_CHANGE_LEADER, _varint(leader))
    # (fields 5-7, the reassignment's lists, are never written by a change built here)
    if recovery is not None:
        parts += (_TAG_CHANGE_RECOVERY, _varint(recovery))
    if elr is not None:
        parts += (_TAG_CHANGE_ELR, _id_list(elr))
    if lke is not None:
        parts += (_TAG_CHANGE_LKE, _id_list(lke))
    if unclean_epoch is not None:
        parts += (_TAG_CHANGE_UNCLEAN_EPOCH, _varint(unclean_epoch))
    body = b"".join(parts)
    return b"".join((_CHANGE_HEAD, _varint(len(body)), body))


def full_change_value(
    topic: bytes,
    partition_id: int,
    isr: Sequence[int] | None,
    leader: int | None,
    elr: Sequence[int] | None,
    lke: Sequence[int] | None,
    recovery: int | None,
    unclean_epoch: int | None,
) -> bytes:
    """:func:`change_value` of any change the controller's elections and leaves build
    (:func:`kraft.metadata.partition_change.change_record`'s fields): besides the ISR and the leader, the
    ELR and last known ELR (None: absent; an empty one is present, emptied, as the ISR), the leader
    recovery state and the last unclean leader epoch (None: absent; 0 is written when given).  Session
    19: the unfence's elections, a sole replica's leave and the other rare leave shapes."""
    if elr is None and lke is None and recovery is None and unclean_epoch is None:
        return change_value(topic, partition_id, isr, leader)
    # The shapes these writes take (ids, counts, lengths and states in the table, the leader maybe -1;
    # anything else is a KeyError): concatenations only, ~1 µs against ~2.9 for the general path.
    small = _SMALL_BY_VALUE
    try:
        if not partition_id:
            body = topic
        elif partition_id < _SMALL_COUNT:
            body = b"\x08" + small[partition_id] + topic  # (a negative one: KeyError)
        else:
            body = b"\x08" + _varint(partition_id) + topic
        if isr is not None:
            body += _small_list(_TAG_CHANGE_ISR, isr)
        if leader is not None:
            body += _LEADER_FIELDS[leader]
        if recovery is not None:
            body += _TAG_CHANGE_RECOVERY + small[recovery]
        if elr is not None:
            body += _small_list(_TAG_CHANGE_ELR, elr)
        if lke is not None:
            body += _small_list(_TAG_CHANGE_LKE, lke)
        if unclean_epoch is not None:
            body += _TAG_CHANGE_UNCLEAN_EPOCH + small[unclean_epoch]
        return _CHANGE_HEAD + small[len(body)] + body
    except KeyError:
        return _general_change(topic, partition_id, isr, leader, elr, lke, recovery, unclean_epoch)


def _small_list(tag: bytes, ids: Sequence[int]) -> bytes:
    """A present BrokerIdList field (``tag`` and its bytes) whose ids are all in the table (else
    KeyError)."""
    if not ids:
        return tag + b"\x00"  # present, emptied
    small = _SMALL_BY_VALUE
    run = b"".join([small[i] for i in ids])
    inner = b"\n" + small[len(run)] + run  # BrokerIdList.ids (field 1, packed)
    return tag + small[len(inner)] + inner


_LEADER_FIELDS: Final = {
    **{value: _TAG_CHANGE_LEADER + data for value, data in _SMALL_BY_VALUE.items()},
    -1: _TAG_CHANGE_LEADER + _varint(-1),  # none: a leaderless partition (10 bytes)
}
"""The leader field (tag and varint) of a leader in the table or -1."""
