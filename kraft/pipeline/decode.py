"""Executor-side decoding: one log file → its record batches → Arrow record batches of rows.

Runs inside Spark's Python workers, so it imports only the codec (``kraft.storage.batch``), the metadata
record decoder and pyarrow.  Files are memory-mapped so a 1 GiB segment is never copied into the heap.
"""

from __future__ import annotations

import json
import mmap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import pyarrow as pa

from kraft.errors import ErrorCode, KraftError
from kraft.pipeline.layout import METADATA_TOPIC, LogFile
from kraft.storage.batch import STORED_BATCH_MAX_BYTES, RecordBatch, decode_batch, decode_control_key
from kraft.storage.control import (
    ControlRecordType,
    LeaderChangeMessage,
    SnapshotFooterRecord,
    SnapshotHeaderRecord,
    decode_control_message,
)
from kraft.storage.errors import CorruptRecordError

_HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))

# (name, arrow type, Spark DDL type) — the reader's full row, in column order.
COLUMNS: tuple[tuple[str, pa.DataType, str], ...] = (
    ("topic", pa.string(), "string"),
    ("partition", pa.int32(), "int"),
    ("source", pa.string(), "string"),
    ("file", pa.string(), "string"),
    ("offset", pa.int64(), "bigint"),
    ("leader_epoch", pa.int32(), "int"),
    ("timestamp_ms", pa.int64(), "bigint"),
    ("key", pa.binary(), "binary"),
    ("value", pa.binary(), "binary"),
    ("headers", _HEADER_TYPE, "array<struct<key:string,value:binary>>"),
    ("is_control", pa.bool_(), "boolean"),
    ("record_type", pa.string(), "string"),
    ("record_json", pa.string(), "string"),
)
COLUMN_NAMES: tuple[str, ...] = tuple(c[0] for c in COLUMNS)
_ARROW_TYPES = {name: arrow for name, arrow, _ in COLUMNS}
_DDL_TYPES = {name: ddl for name, _, ddl in COLUMNS}

ROWS_PER_ARROW_BATCH = 8192


def select_columns(spec: str | None) -> tuple[str, ...]:
    """Parse a comma list of column names (None/empty = all), keeping the canonical order."""
    if not spec:
        return COLUMN_NAMES
    wanted = {name.strip() for name in spec.split(",") if name.strip()}
    unknown = wanted - set(COLUMN_NAMES)
    if unknown:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"unknown reader column(s) {sorted(unknown)}; known: {', '.join(COLUMN_NAMES)}",
        )
    return tuple(name for name in COLUMN_NAMES if name in wanted)


def spark_ddl(columns: Sequence[str]) -> str:
    return ", ".join(f"`{name}` {_DDL_TYPES[name]}" for name in columns)


def arrow_schema(columns: Sequence[str]) -> pa.Schema:
    return pa.schema([(name, _ARROW_TYPES[name]) for name in columns])


class MappedFile:
    """A file's bytes as a read-only memoryview over an mmap (an empty view for an empty file)."""

    def __init__(self, path: str) -> None:
        self._handle = open(path, "rb")  # noqa: SIM115 - closed in close()
        self._mmap: mmap.mmap | None = None
        try:
            if self._handle.seek(0, 2) == 0:
                self.view = memoryview(b"")
            else:
                self._mmap = mmap.mmap(self._handle.fileno(), 0, access=mmap.ACCESS_READ)
                self.view = memoryview(self._mmap)
        except BaseException:
            self._handle.close()
            raise

    def close(self) -> None:
        self.view.release()
        if self._mmap is not None:
            self._mmap.close()
        self._handle.close()


@contextmanager
def mapped(path: str) -> Iterator[memoryview]:
    mapped_file = MappedFile(path)
    try:
        yield mapped_file.view
    finally:
        mapped_file.close()


def iter_file_batches(
    log_file: LogFile, buf: memoryview, start: int = 0, stop: int | None = None
) -> Iterator[tuple[int, RecordBatch]]:
    """(file position, batch) of every valid batch in ``buf`` starting in ``[start, stop)``.

    ``start`` must be a batch boundary (0 or a position found by a header scan).  A bad batch in the
    newest segment of a partition is a torn tail — kraft's recovery truncates there, so the reader
    stops.  Anywhere else it is corruption and raises, naming the file and position.
    """
    pos = start
    end = len(buf) if stop is None else min(stop, len(buf))
    while pos < end:
        try:
            batch, next_pos = decode_batch(buf, pos, max_batch_bytes=STORED_BATCH_MAX_BYTES)
        except CorruptRecordError as exc:
            if log_file.is_last_segment:
                return
            raise KraftError(ErrorCode.CORRUPT_MESSAGE, f"{log_file.path}: {exc.message}") from exc
        yield pos, batch
        pos = next_pos


def _describe_control(key: bytes | None, value: bytes | None) -> tuple[str, str]:
    message = decode_control_message(key, value)
    if isinstance(message, LeaderChangeMessage):
        data: dict[str, Any] = {
            "leader_id": message.leader_id,
            "voters": list(message.voters),
            "granting_voters": list(message.granting_voters),
        }
        return "LeaderChange", json.dumps(data)
    if isinstance(message, SnapshotHeaderRecord):
        return "SnapshotHeader", json.dumps(
            {"last_contained_log_timestamp": message.last_contained_log_timestamp}
        )
    if isinstance(message, SnapshotFooterRecord):
        return "SnapshotFooter", "{}"
    try:
        name = ControlRecordType(decode_control_key(key)).name
    except (ValueError, KraftError):
        name = "UNKNOWN"
    return f"Control:{name}", "{}"


def _describe_metadata(value: bytes | None) -> tuple[str, str]:
    # Imported here: the metadata package pulls in protobuf, which only metadata-log readers need.
    from kraft.metadata.records import describe_value

    if value is None:
        return "Undecodable", json.dumps({"error": "null value"})
    described = describe_value(value)
    if described.get("type") == "Undecodable":
        return "Undecodable", json.dumps({"error": described.get("error"), "size": described.get("size")})
    return str(described["type"]), json.dumps(described["data"], sort_keys=True)


class _ColumnBuffer:
    """Column lists for the requested columns only; flushed as one Arrow record batch."""

    def __init__(self, columns: Sequence[str]) -> None:
        self.columns = tuple(columns)
        self.schema = arrow_schema(columns)
        self.data: dict[str, list[Any]] = {name: [] for name in columns}
        self.rows = 0

    def flush(self) -> pa.RecordBatch:
        arrays = [pa.array(self.data[name], type=_ARROW_TYPES[name]) for name in self.columns]
        out = pa.RecordBatch.from_arrays(arrays, schema=self.schema)
        # Cleared in place (pa.array copied the values) so callers may keep references to the lists.
        for values in self.data.values():
            values.clear()
        self.rows = 0
        return out


def read_file_as_arrow(
    log_file: LogFile, columns: Sequence[str], rows_per_batch: int = ROWS_PER_ARROW_BATCH
) -> Iterator[pa.RecordBatch]:
    """Decode one segment/snapshot file into Arrow batches holding ``columns`` (one row per record)."""
    out = _ColumnBuffer(columns)
    data = out.data
    wanted = set(columns)
    want_meta = bool(wanted & {"record_type", "record_json"})
    is_metadata_log = log_file.topic == METADATA_TOPIC
    # Per-file constants and per-batch values are appended with one list extend per batch; only
    # per-record columns are touched in the inner loop (the hot path of every job).
    file_constants = {
        "topic": log_file.topic,
        "partition": log_file.partition,
        "source": log_file.source,
        "file": log_file.path,
    }
    constant_columns = [(data[n], v) for n, v in file_constants.items() if n in wanted]
    offsets = data.get("offset")
    epochs = data.get("leader_epoch")
    timestamps = data.get("timestamp_ms")
    keys = data.get("key")
    values = data.get("value")
    headers = data.get("headers")
    controls = data.get("is_control")
    record_types = data.get("record_type")
    record_jsons = data.get("record_json")
    with mapped(log_file.path) as buf:
        for _pos, batch in iter_file_batches(log_file, buf):
            records = batch.records
            base_offset = batch.base_offset
            base_ts = batch.base_timestamp
            count = len(records)
            for column, constant in constant_columns:
                column.extend([constant] * count)
            if epochs is not None:
                epochs.extend([batch.partition_leader_epoch] * count)
            if controls is not None:
                controls.extend([batch.is_control] * count)
            if offsets is not None:
                offsets.extend([base_offset + r.offset_delta for r in records])
            if timestamps is not None:
                timestamps.extend([base_ts + r.timestamp_delta for r in records])
            if keys is not None:
                keys.extend([r.key for r in records])
            if values is not None:
                values.extend([r.value for r in records])
            if headers is not None:
                headers.extend([[{"key": k, "value": v} for k, v in r.headers] for r in records])
            if want_meta:
                for record in records:
                    record_type: str | None = None
                    record_json: str | None = None
                    if batch.is_control:
                        record_type, record_json = _describe_control(record.key, record.value)
                    elif is_metadata_log:
                        record_type, record_json = _describe_metadata(record.value)
                    if record_types is not None:
                        record_types.append(record_type)
                    if record_jsons is not None:
                        record_jsons.append(record_json)
            out.rows += count
            if out.rows >= rows_per_batch:
                yield out.flush()
    if out.rows:
        yield out.flush()
