"""The bootstrap checkpoint: the feature levels a brand-new cluster starts at (Kafka's
``bootstrap.checkpoint``, written by ``kafka-storage.sh format --release-version``).

``kraft storage format --release-version 0.1`` (or ``--feature metadata.version=1``) writes
``<metadata dir>/bootstrap.checkpoint``: a snapshot-format file (SnapshotHeader, one batch of
FeatureLevelRecords, SnapshotFooter; every batch CRC-checked when read) next to ``meta.properties``,
outside the Raft log directory.  The first controller to become active on an empty metadata log writes
those FeatureLevelRecords (:meth:`kraft.metadata.controller_logic.ControllerLogic.bootstrap_records`);
without the file it writes the latest ``metadata.version`` (:data:`kraft.features.LATEST_METADATA_VERSION`).
The file is read only at start and only matters before the cluster's first activation: every controller
of a new quorum should be formatted with the same levels, as in Kafka.

A damaged file, or one naming a level this software does not support, stops the controller at start
with one line (it would otherwise bootstrap the cluster at a level nobody asked for).
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from pathlib import Path

from kraft.errors import KraftError
from kraft.features import check_supported
from kraft.metadata.records import decode_value, encode_value, wrap
from kraft.storage.batch import decode_batch
from kraft.storage.errors import CorruptRecordError, StorageStateError
from kraft.storage.fileio import fsync_dir
from kraft.storage.snapshot import (
    RecordsSnapshotWriter,
    SnapshotFileId,
    snapshot_file_name,
    validate_snapshot_bytes,
)
from kraft.v1 import metadata_pb2 as pb

BOOTSTRAP_FILE = "bootstrap.checkpoint"
_MAX_BOOTSTRAP_BYTES = 1 << 20  # a handful of records: anything larger is not a bootstrap checkpoint


def write_bootstrap_features(metadata_dir: Path, levels: Mapping[str, int]) -> Path:
    """Write ``levels`` as the bootstrap checkpoint of ``metadata_dir`` (durably: the snapshot writer's
    fsync, then rename and directory fsync); refuses to replace an existing one."""
    final = metadata_dir / BOOTSTRAP_FILE
    if final.exists():
        raise StorageStateError(f"{final} already exists; refusing to replace it")
    snapshot_id = SnapshotFileId(0, 0)
    with RecordsSnapshotWriter(
        metadata_dir, snapshot_id, last_contained_log_timestamp=-1, timestamp_ms=int(time.time() * 1000)
    ) as writer:
        writer.append_records(
            [
                (None, encode_value(wrap(pb.FeatureLevelRecord(name=name, feature_level=level))))
                for name, level in sorted(levels.items())
            ]
        )
        writer.freeze()
    os.replace(metadata_dir / snapshot_file_name(snapshot_id), final)
    fsync_dir(metadata_dir)
    return final


def read_bootstrap_features(metadata_dir: Path) -> dict[str, int] | None:
    """The levels of ``metadata_dir``'s bootstrap checkpoint, None when there is none; StorageStateError
    (one line naming the file) when it is damaged or names an unsupported level."""
    path = metadata_dir / BOOTSTRAP_FILE
    try:
        with path.open("rb") as f:
            data = f.read(_MAX_BOOTSTRAP_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise StorageStateError(f"cannot read {path}: {exc.strerror}") from exc
    if len(data) > _MAX_BOOTSTRAP_BYTES:
        raise StorageStateError(
            f"{path} is larger than {_MAX_BOOTSTRAP_BYTES} bytes: not a bootstrap checkpoint"
        )
    levels: dict[str, int] = {}
    try:
        validate_snapshot_bytes(data, str(path), epoch=0)
        position = 0
        while position < len(data):
            batch, position = decode_batch(data, position)
            if batch.is_control:
                continue
            for record in batch.records:
                decoded = decode_value(record.value or b"")
                kind = decoded.WhichOneof("record")
                if kind != "feature_level":
                    raise CorruptRecordError(f"a {kind} record (only FeatureLevelRecords belong here)")
                levels[decoded.feature_level.name] = decoded.feature_level.feature_level
    except KraftError as exc:
        raise StorageStateError(f"damaged {path}: {exc.message}") from None
    try:
        for name, level in levels.items():
            check_supported(name, level)
    except ValueError as exc:
        raise StorageStateError(f"{path}: {exc}") from None
    return levels
