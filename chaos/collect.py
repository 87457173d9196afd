"""Reading what the nodes left on disk after a run: each controller's metadata log, record by record."""

from __future__ import annotations

import struct
from pathlib import Path

from chaos.checkers import NodeLog
from kraft.storage.batch import decode_batch
from kraft.storage.errors import CorruptRecordError, RecordTooLargeError
from kraft.storage.log import METADATA_LOG_DIR_NAME


def read_metadata_records(metadata_log_dir: Path) -> dict[int, bytes]:
    """offset → (batch leader epoch, key, value) bytes of every record in the segments.

    Reading a segment stops at its first torn or corrupt batch, as log recovery would truncate there.
    The leader epoch is part of the compared bytes: the same payload written in another epoch is a
    different entry.
    """
    directory = metadata_log_dir / METADATA_LOG_DIR_NAME
    records: dict[int, bytes] = {}
    for segment in sorted(directory.glob("*.log")):
        data = segment.read_bytes()
        position = 0
        while position < len(data):
            try:
                batch, position = decode_batch(data, position)
            except (CorruptRecordError, RecordTooLargeError, ValueError, IndexError, struct.error):
                break
            epoch = struct.pack(">i", batch.partition_leader_epoch)
            for record in batch.records:
                key, value = record.key or b"", record.value or b""
                entry = epoch + struct.pack(">i", len(key)) + key + value
                records[batch.base_offset + record.offset_delta] = entry
    return records


def node_log(node_id: int, metadata_log_dir: Path, high_watermark: int) -> NodeLog:
    records = read_metadata_records(metadata_log_dir)
    start = min(records) if records else 0
    return NodeLog(node_id, high_watermark, records, log_start_offset=start)
