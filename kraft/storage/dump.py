"""Offline decoding of segment and snapshot files (``kraft metadata dump``, like kafka-dump-log.sh).

Storage knows batch headers and control records; it does not know what the value of a data record
means.  That is plugged in through a decoder registry:

    from kraft.storage.dump import register_record_decoder

    def describe(key: bytes | None, value: bytes | None) -> dict[str, Any] | None:
        ...  # a JSON-ready description, or None if this decoder does not recognise the record

    register_record_decoder(describe)

Decoders are tried newest first (a later registration overrides an earlier one for the records it
claims); the first non-None answer is shown as the record's ``payload``.  Records no decoder claims
are shown by size only.  ``kraft metadata dump`` registers ``kraft.metadata.records.describe_value``
for metadata records.

Damaged files are reported, not raised: the dump stops at the first invalid batch of a file and records
the position and the reason in ``error``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from kraft.storage.batch import STORED_BATCH_MAX_BYTES, RecordBatch, decode_batch
from kraft.storage.control import (
    ControlMessage,
    KRaftVersionRecord,
    LeaderChangeMessage,
    SnapshotFooterRecord,
    SnapshotHeaderRecord,
    VotersRecord,
    decode_control_key,
    decode_control_message,
)
from kraft.storage.errors import StorageError
from kraft.storage.segment import LOG_SUFFIX
from kraft.storage.snapshot import SNAPSHOT_SUFFIX

RecordDecoder = Callable[[bytes | None, bytes | None], dict[str, Any] | None]

_DECODERS: list[RecordDecoder] = []


def register_record_decoder(decoder: RecordDecoder) -> None:
    """Add a decoder for data-record payloads (idempotent: registering the same function twice is a no-op)."""
    if decoder not in _DECODERS:
        _DECODERS.append(decoder)


def unregister_record_decoder(decoder: RecordDecoder) -> None:
    if decoder in _DECODERS:
        _DECODERS.remove(decoder)


def decode_payload(key: bytes | None, value: bytes | None) -> dict[str, Any] | None:
    for decoder in reversed(_DECODERS):
        described = decoder(key, value)
        if described is not None:
            return described
    return None


def _describe_control(message: ControlMessage | None, record_type: int) -> dict[str, Any]:
    if isinstance(message, LeaderChangeMessage):
        return {
            "type": "LeaderChange",
            "version": message.version,
            "leaderId": message.leader_id,
            "voters": list(message.voters),
            "grantingVoters": list(message.granting_voters),
        }
    if isinstance(message, SnapshotHeaderRecord):
        return {
            "type": "SnapshotHeader",
            "version": message.version,
            "lastContainedLogTimestamp": message.last_contained_log_timestamp,
        }
    if isinstance(message, SnapshotFooterRecord):
        return {"type": "SnapshotFooter", "version": message.version}
    if isinstance(message, KRaftVersionRecord):
        return {"type": "KRaftVersion", "version": message.version, "kRaftVersion": message.kraft_version}
    if isinstance(message, VotersRecord):
        return {
            "type": "Voters",
            "version": message.version,
            "voters": [
                {
                    "voterId": voter.voter_id,
                    "voterDirectoryId": voter.directory_id,
                    "endpoints": [f"{e.name}://{e.host}:{e.port}" for e in voter.endpoints],
                }
                for voter in message.voters
            ],
        }
    return {"type": f"ControlType{record_type}"}


def describe_batch(batch: RecordBatch, position: int, *, with_records: bool = True) -> dict[str, Any]:
    out: dict[str, Any] = {
        "baseOffset": batch.base_offset,
        "lastOffset": batch.last_offset,
        "count": len(batch.records),
        "partitionLeaderEpoch": batch.partition_leader_epoch,
        "isControl": batch.is_control,
        "position": position,
        "size": batch.size_in_bytes,
        "crc": batch.crc,
        "baseTimestamp": batch.base_timestamp,
        "maxTimestamp": batch.max_timestamp,
    }
    if not with_records:
        return out
    records: list[dict[str, Any]] = []
    for record in batch.records:
        entry: dict[str, Any] = {
            "offset": batch.base_offset + record.offset_delta,
            "keySize": -1 if record.key is None else len(record.key),
            "valueSize": -1 if record.value is None else len(record.value),
        }
        if record.headers:
            entry["headerKeys"] = [name for name, _ in record.headers]
        if batch.is_control:
            try:
                record_type = decode_control_key(record.key)
                entry["control"] = _describe_control(
                    decode_control_message(record.key, record.value), record_type
                )
            except StorageError as exc:
                entry["control"] = {"type": "Undecodable", "error": exc.message}
        else:
            payload = decode_payload(record.key, record.value)
            if payload is not None:
                entry["payload"] = payload
        records.append(entry)
    out["records"] = records
    return out


def dump_file(path: Path, *, with_records: bool = True) -> dict[str, Any]:
    """Describe every batch of one segment or snapshot file; stops (and reports) at the first bad one."""
    data = path.read_bytes()
    batches: list[dict[str, Any]] = []
    position = 0
    error: str | None = None
    preallocated = 0
    while position < len(data):
        try:
            batch, end = decode_batch(data, position, max_batch_bytes=STORED_BATCH_MAX_BYTES)
        except StorageError as exc:
            if data.count(0, position) == len(data) - position:
                preallocated = len(data) - position  # a live segment's zero-filled space, not damage
            else:
                error = exc.message
            break
        batches.append(describe_batch(batch, position, with_records=with_records))
        position = end
    kind = "snapshot" if path.name.endswith(SNAPSHOT_SUFFIX) else "segment"
    return {
        "file": str(path),
        "kind": kind,
        "size": len(data),
        "validBytes": position,
        "preallocatedBytes": preallocated,
        "error": error,
        "batches": batches,
    }


def log_dir_files(log_dir: str | os.PathLike[str]) -> list[Path]:
    """Segments (by base offset) then snapshots (by id) of a log directory."""
    directory = Path(log_dir)
    segments = sorted(directory.glob(f"*{LOG_SUFFIX}"))
    snapshots = sorted(directory.glob(f"*{SNAPSHOT_SUFFIX}"))
    return [*segments, *snapshots]


def dump_log_dir(log_dir: str | os.PathLike[str], *, with_records: bool = True) -> Iterator[dict[str, Any]]:
    for path in log_dir_files(log_dir):
        yield dump_file(path, with_records=with_records)


def format_file_dump(dump: dict[str, Any]) -> Iterator[str]:
    """kafka-dump-log.sh style text lines for one :func:`dump_file` result."""
    yield f"Dumping {dump['file']} ({dump['kind']}, {dump['size']} bytes)"
    for batch in dump["batches"]:
        yield (
            f"baseOffset: {batch['baseOffset']} lastOffset: {batch['lastOffset']} count: {batch['count']} "
            f"partitionLeaderEpoch: {batch['partitionLeaderEpoch']} "
            f"isControl: {str(batch['isControl']).lower()} "
            f"position: {batch['position']} CreateTime: {batch['maxTimestamp']} size: {batch['size']} "
            f"magic: 2 crc: {batch['crc']} isvalid: true"
        )
        for record in batch.get("records", ()):
            line = (
                f"| offset: {record['offset']} keySize: {record['keySize']} valueSize: {record['valueSize']}"
            )
            if "control" in record:
                line += f" control: {json.dumps(record['control'], default=str)}"
            elif "payload" in record:
                line += f" payload: {json.dumps(record['payload'], default=str)}"
            yield line
    if dump["error"]:
        yield f"Found invalid data at position {dump['validBytes']}: {dump['error']}"
    elif dump.get("preallocatedBytes"):
        yield (
            f"Preallocated (zero-filled) space from position {dump['validBytes']}: "
            f"{dump['preallocatedBytes']} bytes"
        )
