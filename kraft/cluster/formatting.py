"""Formatting a node's storage directories (``kraft storage format`` and ``kraft cluster up``).

Every directory is checked before any is written, so a refusal never leaves a node half formatted:
an already formatted directory is refused unless ``ignore_formatted``; a directory formatted for another
cluster or another node is refused even then (reusing it would silently lose or mix data).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from kraft.config import NodeConfig
from kraft.storage.errors import InconsistentClusterIdError, StorageStateError
from kraft.storage.ids import parse_uuid
from kraft.storage.meta_properties import (
    META_PROPERTIES_FILE,
    MetaProperties,
    format_log_dir,
    read_meta_properties,
)


@dataclass(frozen=True, slots=True)
class FormattedDir:
    """The outcome for one directory: freshly written, or already formatted for this cluster and skipped."""

    path: Path
    meta: MetaProperties
    skipped: bool


def _existing_meta(directory: Path) -> MetaProperties | None:
    if directory.exists() and not directory.is_dir():
        raise StorageStateError(f"{directory} exists and is not a directory")
    return read_meta_properties(directory) if (directory / META_PROPERTIES_FILE).exists() else None


def format_node_storage(
    cfg: NodeConfig, cluster_id: str, *, ignore_formatted: bool = False
) -> list[FormattedDir]:
    """Write ``meta.properties`` into every log dir and the metadata dir of ``cfg``'s node."""
    try:
        parse_uuid(cluster_id)
    except ValueError as exc:
        raise StorageStateError(f"{exc}; generate a cluster id with `kraft storage random-uuid`") from None
    existing: dict[Path, MetaProperties | None] = {}
    for directory in cfg.all_log_dirs:
        meta = _existing_meta(directory)
        if meta is not None:
            if meta.cluster_id != cluster_id:
                raise InconsistentClusterIdError(
                    f"{directory} is already formatted for cluster {meta.cluster_id}, not {cluster_id}; "
                    "refusing to reformat it (delete the directory to start over)"
                )
            if meta.node_id != cfg.node_id:
                raise StorageStateError(
                    f"{directory} is formatted for node {meta.node_id}, "
                    f"but the config says node.id={cfg.node_id}"
                )
            if not ignore_formatted:
                raise StorageStateError(
                    f"{directory} is already formatted; use --ignore-formatted to skip it"
                )
        existing[directory] = meta
    results: list[FormattedDir] = []
    for directory, meta in existing.items():
        if meta is not None:
            results.append(FormattedDir(directory, meta, skipped=True))
        else:
            written = format_log_dir(directory, cluster_id=cluster_id, node_id=cfg.node_id)
            results.append(FormattedDir(directory, written, skipped=False))
    return results
