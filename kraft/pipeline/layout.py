"""Find the segment and snapshot files of kraft log directories (driver side, no Spark).

A *partition directory* is ``<topic>-<partition>`` (``__cluster_metadata-0`` for the metadata log) holding
segments ``<base offset, 20 digits>.log`` and snapshots ``<end offset 20>-<epoch 10>.checkpoint``.  The
reader accepts one partition directory or any tree containing many; every file becomes one split.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from kraft.errors import ErrorCode, KraftError

METADATA_TOPIC = "__cluster_metadata"

_SEGMENT = re.compile(r"^(\d{20})\.log$")
_SNAPSHOT = re.compile(r"^(\d{20})-(\d{10})\.checkpoint$")
_PARTITION_DIR = re.compile(r"^(.+)-(\d+)$")

SOURCE_LOG = "log"
SOURCE_SNAPSHOT = "snapshot"


@dataclass(frozen=True, slots=True)
class LogFile:
    """One segment or snapshot file: the unit of work (one Spark input split) of every job."""

    path: str
    topic: str
    partition: int
    source: str  # SOURCE_LOG or SOURCE_SNAPSHOT
    base_offset: int  # segment base offset, or the snapshot's end offset
    size_bytes: int
    # The newest segment of its partition: the only one where a torn tail is expected (recovery
    # truncates there), so the reader stops at a bad batch instead of failing.
    is_last_segment: bool


@dataclass(frozen=True, slots=True)
class PartitionDir:
    path: str
    topic: str
    partition: int
    segments: tuple[LogFile, ...]  # sorted by base offset
    snapshots: tuple[LogFile, ...]  # sorted by end offset


def parse_partition_dir_name(name: str) -> tuple[str, int] | None:
    match = _PARTITION_DIR.match(name)
    if match is None:
        return None
    return match.group(1), int(match.group(2))


def _scan_partition_dir(path: Path) -> PartitionDir | None:
    parsed = parse_partition_dir_name(path.name)
    if parsed is None:
        return None
    topic, partition = parsed
    segment_entries: list[tuple[int, Path]] = []
    snapshot_entries: list[tuple[int, Path]] = []
    for entry in path.iterdir():
        if not entry.is_file():
            continue
        if (seg := _SEGMENT.match(entry.name)) is not None:
            segment_entries.append((int(seg.group(1)), entry))
        elif (snap := _SNAPSHOT.match(entry.name)) is not None:
            snapshot_entries.append((int(snap.group(1)), entry))
    if not segment_entries and not snapshot_entries:
        return None
    segment_entries.sort()
    snapshot_entries.sort()
    last = len(segment_entries) - 1
    segments = tuple(
        LogFile(str(p), topic, partition, SOURCE_LOG, base, p.stat().st_size, i == last)
        for i, (base, p) in enumerate(segment_entries)
    )
    snapshots = tuple(
        LogFile(str(p), topic, partition, SOURCE_SNAPSHOT, end, p.stat().st_size, False)
        for end, p in snapshot_entries
    )
    return PartitionDir(str(path), topic, partition, segments, snapshots)


def find_partition_dirs(root: str | Path) -> list[PartitionDir]:
    """Every partition directory at or below ``root``, sorted by (topic, partition, path).

    Raises ``KraftError(INVALID_REQUEST)`` when ``root`` is missing or holds no kraft log files, so the
    CLI can print one clear line instead of running an empty job.
    """
    base = Path(root)
    if not base.is_dir():
        raise KraftError(ErrorCode.INVALID_REQUEST, f"log directory {base} does not exist")
    found: list[PartitionDir] = []
    candidates = [base, *sorted(p for p in base.rglob("*") if p.is_dir())]
    for candidate in candidates:
        scanned = _scan_partition_dir(candidate)
        if scanned is not None:
            found.append(scanned)
    if not found:
        raise KraftError(
            ErrorCode.INVALID_REQUEST,
            f"no kraft log files under {base} (expected <topic>-<partition>/<20-digit offset>.log)",
        )
    found.sort(key=lambda d: (d.topic, d.partition, d.path))
    return found


def is_segment_file_name(name: str) -> bool:
    return _SEGMENT.match(name) is not None


def segment_file_name(base_offset: int) -> str:
    return f"{base_offset:020d}.log"
