"""``meta.properties``: the identity of a formatted log directory (Kafka's format, version 1)::

    #
    #Written by kraft
    cluster.id=<22-char uuid>
    directory.id=<22-char uuid>
    node.id=1
    version=1

    #crc32c=1a2b3c4d

Written once by ``kraft storage format`` (atomically: temp, fsync, rename, dir fsync) and never
overwritten by a running node.  A node refuses to start on a directory without it (unformatted), with a
corrupt one, or with one naming another cluster or node.

Integrity: the last line is a checksum, CRC-32C of every other byte of the file.  It is a *comment*, so
Kafka's reader (``java.util.Properties``) ignores it and the file stays Kafka's format; kraft verifies it
on every read, so a flipped byte in ``cluster.id`` cannot make a node silently join another cluster with
the old data.  Chosen over a second durable copy: one file, one atomic write, no way for two copies to
disagree after a crash.  A file without the line (written before it existed, or by Kafka) is still
accepted.  So that a flip *inside* the checksum line cannot pass for "no checksum", any line that still
looks like one (a comment holding ``=``, or any line mentioning ``crc32c``) must be exactly it.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from crc32c import crc32c

from kraft.storage.errors import InconsistentClusterIdError, StorageStateError
from kraft.storage.fileio import atomic_write, fsync_dir
from kraft.storage.ids import parse_uuid, random_uuid

META_PROPERTIES_FILE = "meta.properties"
META_PROPERTIES_VERSION = 1
_CHECKSUM_LINE = re.compile(r"#crc32c=([0-9a-f]{8})")


@dataclass(frozen=True, slots=True)
class MetaProperties:
    cluster_id: str
    node_id: int
    directory_id: str
    version: int = META_PROPERTIES_VERSION

    def __post_init__(self) -> None:
        if self.node_id < 0:
            raise ValueError(f"node.id must be >= 0, got {self.node_id}")
        if self.version != META_PROPERTIES_VERSION:
            raise ValueError(f"unsupported meta.properties version {self.version}")
        parse_uuid(self.cluster_id)
        parse_uuid(self.directory_id)

    def to_text(self) -> str:
        body = (
            "#\n#Written by kraft\n"
            f"cluster.id={self.cluster_id}\n"
            f"directory.id={self.directory_id}\n"
            f"node.id={self.node_id}\n"
            f"version={self.version}\n"
        )
        return f"{body}#crc32c={crc32c(body.encode('utf-8')):08x}\n"


def _looks_like_checksum(line: str) -> bool:
    stripped = line.strip()
    return "crc32c" in stripped.lower() or (stripped[:1] in ("#", "!") and "=" in stripped)


def verify_checksum(raw: bytes, path: Path) -> None:
    """StorageStateError if ``raw`` carries a checksum line that is damaged or does not match the rest
    of the file; a file without any checksum-like line (older format, Kafka's) passes."""
    lines = raw.split(b"\n")
    candidates = [i for i, line in enumerate(lines) if _looks_like_checksum(line.decode("utf-8", "replace"))]
    if not candidates:
        return
    if len(candidates) > 1:
        raise StorageStateError(f"corrupt {path}: {len(candidates)} checksum lines")
    i = candidates[0]
    match = _CHECKSUM_LINE.fullmatch(lines[i].decode("utf-8", "replace"))
    if match is None:
        raise StorageStateError(f"corrupt {path}: damaged checksum line {lines[i]!r}")
    rest = b"\n".join(lines[:i] + lines[i + 1 :])
    computed = crc32c(rest)
    if computed != int(match.group(1), 16):
        raise StorageStateError(
            f"corrupt {path}: CRC-32C mismatch (stored {match.group(1)}, computed {computed:08x}); "
            "the file was damaged: restore it rather than reformat"
        )


def parse_properties(text: str) -> dict[str, str]:
    """Java-properties subset: ``key=value`` lines, ``#``/``!`` comments, blank lines."""
    out: dict[str, str] = {}
    for raw_line in text.splitlines():
        line = raw_line.strip()
        if not line or line[0] in "#!":
            continue
        key, sep, value = line.partition("=")
        if not sep:
            raise ValueError(f"line without '=': {line!r}")
        out[key.strip()] = value.strip()
    return out


def read_meta_properties(log_dir: str | os.PathLike[str]) -> MetaProperties:
    """Read and validate ``<log_dir>/meta.properties``; StorageStateError if unformatted or corrupt."""
    path = Path(log_dir) / META_PROPERTIES_FILE
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise StorageStateError(
            f"log directory {log_dir} is not formatted (no {META_PROPERTIES_FILE}); "
            "run `kraft storage format`"
        ) from None
    except OSError as exc:
        raise StorageStateError(f"cannot read {path}: {exc}") from exc
    verify_checksum(raw, path)
    try:
        props = parse_properties(raw.decode("utf-8"))
        return MetaProperties(
            cluster_id=props["cluster.id"],
            node_id=int(props["node.id"]),
            directory_id=props["directory.id"],
            version=int(props["version"]),
        )
    except KeyError as exc:
        raise StorageStateError(f"corrupt {path}: missing {exc.args[0]}") from exc
    except ValueError as exc:  # UnicodeDecodeError included
        raise StorageStateError(f"corrupt {path}: {exc}") from exc


def write_meta_properties(log_dir: str | os.PathLike[str], props: MetaProperties) -> None:
    directory = Path(log_dir)
    directory.mkdir(parents=True, exist_ok=True)
    fsync_dir(directory)
    atomic_write(directory / META_PROPERTIES_FILE, props.to_text().encode("utf-8"))


def format_log_dir(
    log_dir: str | os.PathLike[str],
    *,
    cluster_id: str,
    node_id: int,
    directory_id: str | None = None,
    ignore_formatted: bool = False,
) -> MetaProperties:
    """Write ``meta.properties`` into ``log_dir`` (created if missing) and return it.

    An already formatted directory is never overwritten: StorageStateError, or with ``ignore_formatted``
    the existing properties are returned if they name the same cluster and node (a mismatch still raises).
    """
    try:
        parse_uuid(cluster_id)
    except ValueError as exc:
        raise StorageStateError(f"cluster id {cluster_id!r} is not a valid Kafka UUID: {exc}") from exc
    if (Path(log_dir) / META_PROPERTIES_FILE).exists():
        if not ignore_formatted:
            raise StorageStateError(
                f"log directory {log_dir} is already formatted; use --ignore-formatted to skip it"
            )
        return check_meta_properties(log_dir, cluster_id=cluster_id, node_id=node_id)
    props = MetaProperties(cluster_id=cluster_id, node_id=node_id, directory_id=directory_id or random_uuid())
    write_meta_properties(log_dir, props)
    return props


def check_meta_properties(
    log_dir: str | os.PathLike[str], *, cluster_id: str | None = None, node_id: int | None = None
) -> MetaProperties:
    """What a node runs at startup: the directory must be formatted for this cluster and this node."""
    props = read_meta_properties(log_dir)
    if cluster_id is not None and props.cluster_id != cluster_id:
        raise InconsistentClusterIdError(
            f"log directory {log_dir} belongs to cluster {props.cluster_id}, not {cluster_id}"
        )
    if node_id is not None and props.node_id != node_id:
        raise StorageStateError(
            f"log directory {log_dir} belongs to node {props.node_id}, not node {node_id}"
        )
    return props
