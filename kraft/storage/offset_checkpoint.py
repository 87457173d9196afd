"""Kafka's per-partition offset checkpoint files (``recovery-point-offset-checkpoint``,
``log-start-offset-checkpoint``), kept inside one log's directory with that log's single entry::

    0                 <- version
    1                 <- number of entries
    orders 3 1200     <- topic partition offset

Kafka keeps one such file per log *directory* listing every partition; kraft's logs are opened one at a
time by independent owners (the Raft driver, each broker partition), so each log directory keeps its own
file with its own entry — the same text format, readable by the same parser.  The entry must name the
directory's own topic and partition: a file copied from another log is refused like a corrupt one.

Reads never raise: a missing or unreadable file returns ``None`` with the reason, and the caller falls back
to the safe choice (scan everything, start at the first segment) and logs why.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from kraft.storage.fileio import atomic_write

RECOVERY_POINT_FILE = "recovery-point-offset-checkpoint"
LOG_START_OFFSET_FILE = "log-start-offset-checkpoint"
_VERSION = "0"


class CheckpointRead(NamedTuple):
    offset: int | None  # None: missing or unreadable
    problem: str  # why it is None ("" when the offset was read)


def topic_partition_of(directory: Path) -> tuple[str, int]:
    """``orders-3`` → ("orders", 3); a name without a numeric suffix is its own topic, partition 0."""
    topic, sep, partition = directory.name.rpartition("-")
    if sep and topic and partition.isdigit():
        return topic, int(partition)
    return directory.name, 0


def offset_checkpoint_bytes(path: Path, offset: int) -> bytes:
    """The content of the checkpoint at ``path`` (its directory names the entry) holding ``offset``."""
    topic, partition = topic_partition_of(path.parent)
    return f"{_VERSION}\n1\n{topic} {partition} {offset}\n".encode("ascii")


def write_offset_checkpoint(path: Path, offset: int) -> None:
    """Atomically (temp, fsync, rename, dir fsync) replace ``path`` with this log's single entry."""
    atomic_write(path, offset_checkpoint_bytes(path, offset))


def read_offset_checkpoint(path: Path) -> CheckpointRead:
    """The offset recorded for this log, or ``None`` and the reason the file cannot be used."""
    try:
        text = path.read_text(encoding="ascii")
    except FileNotFoundError:
        return CheckpointRead(None, "missing")
    except (OSError, UnicodeDecodeError) as exc:
        return CheckpointRead(None, f"unreadable: {exc}")
    lines = text.split("\n")
    # Exactly: version, count, one entry, and the final newline (a torn or extended file is refused).
    if len(lines) != 4 or lines[3] != "":
        return CheckpointRead(None, f"expected 3 lines, found {len(lines) - 1}")
    if lines[0] != _VERSION or lines[1] != "1":
        return CheckpointRead(None, f"unexpected version/count {lines[0]!r}/{lines[1]!r}")
    fields = lines[2].split(" ")
    if len(fields) != 3 or not fields[1].isdigit() or not fields[2].isdigit():
        return CheckpointRead(None, f"malformed entry {lines[2]!r}")
    if (fields[0], int(fields[1])) != topic_partition_of(path.parent):
        return CheckpointRead(None, f"entry names {fields[0]}-{fields[1]}, not this log")
    return CheckpointRead(int(fields[2]), "")
