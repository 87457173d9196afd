"""Reading what the nodes left on disk after a run: each controller's metadata log, record by record,
and the metadata image the log implies at chosen offsets (to compare with the brokers' images)."""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from chaos.checkers import NodeLog
from kraft.broker.image_adapter import image_digest
from kraft.errors import KraftError
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.metadata.records import decode_value, kind
from kraft.storage.batch import decode_batch
from kraft.storage.errors import CorruptRecordError, RecordTooLargeError
from kraft.storage.log import METADATA_LOG_DIR_NAME


@dataclass(frozen=True, slots=True)
class LogEntry:
    offset: int
    epoch: int
    is_control: bool
    key: bytes
    value: bytes

    def comparable(self) -> bytes:
        """The bytes replicas must agree on: leader epoch, key, value."""
        return struct.pack(">ii", self.epoch, len(self.key)) + self.key + self.value


def iter_metadata_log(metadata_log_dir: Path) -> Iterator[LogEntry]:
    """Every record of the metadata log's segments, in offset order.

    Reading a segment stops at its first torn or corrupt batch, as log recovery would truncate there.
    """
    directory = metadata_log_dir / METADATA_LOG_DIR_NAME
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while position < len(data):
            try:
                batch, position = decode_batch(data, position)
            except (CorruptRecordError, RecordTooLargeError, ValueError, IndexError, struct.error):
                break
            for record in batch.records:
                yield LogEntry(
                    batch.base_offset + record.offset_delta,
                    batch.partition_leader_epoch,
                    batch.is_control,
                    record.key or b"",
                    record.value or b"",
                )


def read_metadata_records(metadata_log_dir: Path) -> dict[int, bytes]:
    """offset → comparable bytes of every record in the segments."""
    return {entry.offset: entry.comparable() for entry in iter_metadata_log(metadata_log_dir)}


def node_log(node_id: int, metadata_log_dir: Path, high_watermark: int) -> NodeLog:
    records = read_metadata_records(metadata_log_dir)
    start = min(records) if records else 0
    return NodeLog(node_id, high_watermark, records, log_start_offset=start)


def image_digests_at(metadata_log_dir: Path, offsets: Iterable[int], high_watermark: int) -> dict[int, str]:
    """The digest of the image the committed log implies after each wanted offset (below the HWM).

    Empty when the log does not start at offset 0 (its prefix is in a snapshot this reader does not load)
    or a record cannot be decoded.
    """
    wanted = sorted({o for o in offsets if 0 <= o < high_watermark})
    if not wanted:
        return {}
    digests: dict[int, str] = {}
    image = MetadataImage.empty()
    delta = MetadataDelta(image)
    for expected, entry in enumerate(iter_metadata_log(metadata_log_dir)):
        if entry.offset != expected:
            return {}  # a gap or a snapshotted prefix: no exact image to compare
        if entry.offset > wanted[-1]:
            break
        if not entry.is_control and entry.value:
            try:
                delta.replay(decode_value(entry.value), entry.offset, entry.epoch)
            except KraftError:
                return {}
        if entry.offset in wanted:
            image = delta.apply()
            digests[entry.offset] = image_digest(image)
            delta = MetadataDelta(image)
    return digests


# Records that can change a broker's registration state (fenced, shutting down, registered at all).
_REGISTRATION_KINDS = (
    "register_broker",
    "unregister_broker",
    "fence_broker",
    "unfence_broker",
    "broker_registration_change",
)


def broker_registration_offsets(metadata_log_dir: Path, high_watermark: int) -> dict[int, list[int]]:
    """broker id → offsets (ascending, below the HWM) of the committed records about its registration.

    What :func:`chaos.produce.fencing_intervals` needs to tell one fence from the next.  A record that
    cannot be decoded is skipped (test-only raw appends).
    """
    offsets: dict[int, list[int]] = {}
    for entry in iter_metadata_log(metadata_log_dir):
        if entry.offset >= high_watermark:
            break
        if entry.is_control or not entry.value:
            continue
        try:
            record = decode_value(entry.value)
            field = kind(record)
        except KraftError:
            continue
        if field not in _REGISTRATION_KINDS:
            continue
        payload = getattr(record, field)
        broker_id = payload.id if field in ("fence_broker", "unfence_broker") else payload.broker_id
        offsets.setdefault(int(broker_id), []).append(entry.offset)
    return offsets
