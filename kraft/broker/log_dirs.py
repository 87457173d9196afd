"""DescribeLogDirs (Kafka's; ``kraft log-dirs describe``): each log dir of the broker, the bytes every hosted
partition takes in it, the file system's total and usable bytes, and the dirs taken offline after an I/O
error (with why).

Sizes are measured by listing each partition's directory (one ``stat`` per file) on a worker thread, so a
broker with thousands of partitions keeps answering heartbeats and produces meanwhile; a file deleted
during the walk (a partition being removed, a segment being replaced) simply no longer counts.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from kraft.errors import ErrorCode
from kraft.v1 import broker_pb2 as pb


@dataclass(frozen=True, slots=True)
class HostedPartition:
    topic: str
    partition: int
    log_dir: Path
    path: Path
    offset_lag: int  # -1 unknown


def directory_bytes(path: Path) -> int:
    """Bytes of the regular files directly in ``path`` (a partition directory has no subdirectories)."""
    total = 0
    try:
        with os.scandir(path) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_size
                except FileNotFoundError:
                    continue
    except FileNotFoundError:
        return 0
    return total


def _usage(path: Path) -> tuple[int, int]:
    try:
        usage = shutil.disk_usage(path)
    except OSError:
        return -1, -1
    return usage.total, usage.free


def measure(
    log_dirs: Sequence[Path], offline: Mapping[Path, str], partitions: Sequence[HostedPartition]
) -> list[pb.DescribeLogDirsResponse.LogDir]:
    """Blocking (file system calls): run it on a worker thread."""
    by_dir: dict[Path, list[HostedPartition]] = {}
    for hosted in partitions:
        by_dir.setdefault(hosted.log_dir, []).append(hosted)
    result = []
    for log_dir in log_dirs:
        out = pb.DescribeLogDirsResponse.LogDir(path=str(log_dir), total_bytes=-1, usable_bytes=-1)
        reason = offline.get(log_dir)
        if reason is not None:
            out.error_code = int(ErrorCode.KAFKA_STORAGE_ERROR)
            out.error_message = f"log dir {log_dir} is offline: {reason}"
            result.append(out)
            continue
        out.total_bytes, out.usable_bytes = _usage(log_dir)
        for hosted in sorted(by_dir.get(log_dir, ()), key=lambda h: (h.topic, h.partition)):
            out.partitions.add(
                topic=hosted.topic,
                partition=hosted.partition,
                size_bytes=directory_bytes(hosted.path),
                offset_lag=hosted.offset_lag,
            )
        result.append(out)
    return result
