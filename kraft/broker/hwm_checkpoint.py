"""``replication-offset-checkpoint``: the high watermarks of one log dir's partitions (Kafka's file).

Kafka's text format (``OffsetCheckpointFile``: a version line, a count line, ``topic partition offset``
lines) with kraft's version 1, which adds the topic id to each line, so a checkpoint written before a topic
was deleted and re-created under the same name is never applied to the new topic's log.

Why it exists: a restarted broker would otherwise start every partition at HWM 0 — as a leader, consumers
see nothing until every ISR follower fetched again; as a follower, its truncation floor
(docs/internals/replication.md, "The high-watermark rule of truncation") is lower than it could be.  A
stored value is a high watermark the partition really had, so it is safe to start from it (it is still
capped by the log's flushed end).  Written every ``replica.high.watermark.checkpoint.interval.ms`` (5 s,
Kafka's default) and at shutdown, atomically (temp file, fsync, rename).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from kraft.broker.types import TopicPartition
from kraft.storage.fileio import atomic_write

FILE_NAME = "replication-offset-checkpoint"
VERSION = 1


def encode(entries: Mapping[tuple[TopicPartition, str], int]) -> bytes:
    """``{(partition, topic id): high watermark}`` as the file's bytes (sorted: deterministic)."""
    lines = [str(VERSION), str(len(entries))]
    for (tp, topic_id), offset in sorted(entries.items()):
        lines.append(f"{tp.topic} {tp.partition} {offset} {topic_id}")
    return ("\n".join(lines) + "\n").encode()


def decode(data: bytes) -> dict[tuple[TopicPartition, str], int]:
    """The entries of a file; ValueError when it is not a complete version-1 checkpoint."""
    lines = data.decode().splitlines()
    if len(lines) < 2 or lines[0] != str(VERSION):
        raise ValueError(f"not a version {VERSION} {FILE_NAME}")
    count = int(lines[1])
    if len(lines) != count + 2:
        raise ValueError(f"{FILE_NAME} announces {count} entries, holds {len(lines) - 2}")
    entries: dict[tuple[TopicPartition, str], int] = {}
    for line in lines[2:]:
        topic, partition, offset, topic_id = line.split(" ")
        entries[(TopicPartition(topic, int(partition)), topic_id)] = int(offset)
    return entries


def read(log_dir: Path) -> dict[tuple[TopicPartition, str], int]:
    """A log dir's checkpoint; empty when there is none or it cannot be read (starting from 0 is safe)."""
    try:
        return decode((log_dir / FILE_NAME).read_bytes())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}


def write(log_dir: Path, entries: Mapping[tuple[TopicPartition, str], int]) -> None:
    atomic_write(log_dir / FILE_NAME, encode(entries))
