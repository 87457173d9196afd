"""Formatting a node's storage directories (``kraft storage format`` and ``kraft cluster up``).

Every directory is checked before any is written, so a refusal never leaves a node half formatted:
an already formatted directory is refused unless ``ignore_formatted``; a directory formatted for another
cluster or another node is refused even then (reusing it would silently lose or mix data).

A controller of a dynamic quorum (KIP-853: no ``controller.quorum.voters``) is formatted in one of three
ways, as Kafka's ``kafka-storage.sh format``:

- ``--standalone``: a one-voter quorum of this node (to grow from with ``kraft quorum add-controller``);
- ``--initial-controllers 1@host:port:DIRID,…``: every listed controller gets the same first voter set,
  and this node's metadata directory gets the directory id it is listed with;
- ``--no-initial-controllers``: a node that will join a running quorum (it starts as an observer).

The first two write the bootstrap checkpoint ``00000000000000000000-0000000000.checkpoint`` into the
metadata log directory: a snapshot at offset 0 holding ``KRaftVersionRecord(1)`` and the ``VotersRecord``.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from kraft.config import NodeConfig, split_host_port
from kraft.metadata.bootstrap import write_bootstrap_features
from kraft.raft.control_codec import voter_problem
from kraft.raft.messages import SnapshotId
from kraft.raft.storage_adapters import FileSnapshotStore
from kraft.raft.voters import Endpoint, Voter, VoterSet, VoterSetError
from kraft.storage.errors import InconsistentClusterIdError, StorageStateError
from kraft.storage.ids import parse_uuid, random_uuid
from kraft.storage.log import METADATA_LOG_DIR_NAME
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


BOOTSTRAP_SNAPSHOT_ID = SnapshotId(0, 0)
"""The bootstrap checkpoint ``00000000000000000000-0000000000.checkpoint`` (KIP-853)."""


class FormatError(ValueError):
    """The format flags do not fit the config (one line, the CLI prints it)."""


@dataclass(frozen=True, slots=True)
class DynamicBootstrap:
    """How a dynamic-quorum controller is formatted: ``voters`` is the first voter set (None:
    ``--no-initial-controllers``, a node that joins later)."""

    voters: VoterSet | None


def parse_initial_controllers(text: str, listener_name: str = "CONTROLLER") -> VoterSet:
    """``1@host:port:DIRID,2@…`` (``--initial-controllers``) → the first voter set; ValueError names the
    bad entry."""
    voters: list[Voter] = []
    for entry in (item.strip() for item in text.split(",")):
        if not entry:
            continue
        node, sep, rest = entry.partition("@")
        address, colon, directory_id = rest.rpartition(":")
        if not sep or not colon or ":" not in address or not re.fullmatch(r"\d{1,9}", node):
            raise ValueError(f"entry {entry!r} is not id@host:port:directory-id")
        try:
            host, port = split_host_port(address)
        except ValueError as exc:
            raise ValueError(f"entry {entry!r}: {exc}") from None
        endpoints = (Endpoint(listener_name, host, port),)
        problem = voter_problem(int(node), directory_id, endpoints)
        if problem is not None or not host or port == 0:
            raise ValueError(f"entry {entry!r}: {problem or 'needs a host and a port in 1..65535'}")
        voters.append(Voter(int(node), directory_id, endpoints))
    if not voters:
        raise ValueError("must list at least one controller as id@host:port:directory-id")
    if len({voter.directory_id for voter in voters}) != len(voters):
        raise ValueError("directory ids must be unique")
    try:
        return VoterSet(tuple(voters))
    except VoterSetError as exc:
        raise ValueError(str(exc)) from None


def controller_endpoint(cfg: NodeConfig) -> Endpoint:
    """The endpoint other controllers dial for ``cfg``'s node (a wildcard host becomes 127.0.0.1)."""
    listener = cfg.controller_listener
    if listener is None:
        raise FormatError("a controller needs a CONTROLLER listener")
    host, port = split_host_port(listener.target)
    return Endpoint(listener.name, host, port)


def dynamic_bootstrap(
    cfg: NodeConfig,
    *,
    standalone: bool = False,
    initial_controllers: str | None = None,
    no_initial_controllers: bool = False,
    directory_id: str,
) -> DynamicBootstrap | None:
    """Check the KIP-853 format flags against ``cfg`` (Kafka's rules) and return what to write.

    ``directory_id`` is the one the metadata directory will have when ``--standalone`` (a fresh random
    one, or the existing one under --ignore-formatted).  None: a static quorum or a broker-only node."""
    chosen = [
        name
        for name, given in (
            ("--standalone", standalone),
            ("--initial-controllers", initial_controllers is not None),
            ("--no-initial-controllers", no_initial_controllers),
        )
        if given
    ]
    if len(chosen) > 1:
        raise FormatError(f"{' and '.join(chosen)} cannot be used together")
    if cfg.controller_quorum_voters:
        if chosen:
            raise FormatError(
                f"{chosen[0]} is for a dynamic quorum; this config sets controller.quorum.voters (a static "
                "quorum): remove it and set controller.quorum.bootstrap.servers instead"
            )
        return None
    if not cfg.is_controller:
        if chosen:
            raise FormatError(f"{chosen[0]} can only be used on a controller (process.roles)")
        return None
    if not chosen:
        raise FormatError(
            "controller.quorum.voters is not set on this controller (a dynamic quorum): use one of "
            "--standalone, --initial-controllers or --no-initial-controllers"
        )
    if no_initial_controllers:
        return DynamicBootstrap(None)
    listener = cfg.controller_listener
    if listener is None:
        raise FormatError("a controller needs a CONTROLLER listener")
    if standalone:
        return DynamicBootstrap(VoterSet((Voter(cfg.node_id, directory_id, (controller_endpoint(cfg),)),)))
    assert initial_controllers is not None
    try:
        voters = parse_initial_controllers(initial_controllers, listener.name)
    except ValueError as exc:
        raise FormatError(f"--initial-controllers: {exc}") from None
    if voters.get(cfg.node_id) is None:
        raise FormatError(
            f"--initial-controllers does not list node.id={cfg.node_id}; a controller that joins later "
            "is formatted with --no-initial-controllers"
        )
    return DynamicBootstrap(voters)


def write_bootstrap_checkpoint(metadata_dir: Path, voters: VoterSet) -> Path:
    """Write the bootstrap checkpoint (KRaftVersion(1) + Voters) into ``metadata_dir``'s metadata log."""
    directory = metadata_dir / METADATA_LOG_DIR_NAME
    directory.mkdir(parents=True, exist_ok=True)
    store = FileSnapshotStore(directory)
    if store.latest() is not None or any(directory.glob("*.log")):
        raise StorageStateError(f"{directory} already holds a metadata log; refusing to bootstrap over it")
    store.write(BOOTSTRAP_SNAPSHOT_ID, 0, [], int(time.time() * 1000), voters=voters)
    return directory / "00000000000000000000-0000000000.checkpoint"


def _existing_meta(directory: Path) -> MetaProperties | None:
    if directory.exists() and not directory.is_dir():
        raise StorageStateError(f"{directory} exists and is not a directory")
    return read_meta_properties(directory) if (directory / META_PROPERTIES_FILE).exists() else None


def format_node_storage(
    cfg: NodeConfig,
    cluster_id: str,
    *,
    ignore_formatted: bool = False,
    standalone: bool = False,
    initial_controllers: str | None = None,
    no_initial_controllers: bool = False,
    bootstrap_features: Mapping[str, int] | None = None,
) -> list[FormattedDir]:
    """Write ``meta.properties`` into every log dir and the metadata dir of ``cfg``'s node, and for a
    dynamic-quorum controller the bootstrap checkpoint (see the module docstring).

    ``bootstrap_features`` (``--release-version`` / ``--feature``, checked by the caller): the levels a new
    cluster starts at, written into a controller's metadata dir as ``bootstrap.checkpoint``
    (kraft.metadata.bootstrap); a broker-only node has no use for them and gets none."""
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
    metadata_dir = cfg.metadata_log_dir
    existing_metadata = existing.get(metadata_dir) if metadata_dir is not None else None
    metadata_directory_id = existing_metadata.directory_id if existing_metadata else random_uuid()
    bootstrap = dynamic_bootstrap(
        cfg,
        standalone=standalone,
        initial_controllers=initial_controllers,
        no_initial_controllers=no_initial_controllers,
        directory_id=metadata_directory_id,
    )
    voters = bootstrap.voters if bootstrap is not None else None
    if voters is not None and metadata_dir is not None:
        listed = voters.get(cfg.node_id)
        assert listed is not None
        if existing_metadata is not None and existing_metadata.directory_id != listed.directory_id:
            raise FormatError(
                f"{metadata_dir} has directory.id {existing_metadata.directory_id}, but the voter set "
                f"lists node {cfg.node_id} with {listed.directory_id}"
            )
        metadata_directory_id = listed.directory_id
    results: list[FormattedDir] = []
    for directory, meta in existing.items():
        if meta is not None:
            results.append(FormattedDir(directory, meta, skipped=True))
        else:
            written = format_log_dir(
                directory,
                cluster_id=cluster_id,
                node_id=cfg.node_id,
                directory_id=metadata_directory_id if directory == metadata_dir else None,
            )
            results.append(FormattedDir(directory, written, skipped=False))
    if voters is not None and metadata_dir is not None and existing_metadata is None:
        # A metadata directory skipped under --ignore-formatted keeps whatever it was formatted with.
        write_bootstrap_checkpoint(metadata_dir, voters)
    if bootstrap_features and cfg.is_controller and metadata_dir is not None and existing_metadata is None:
        write_bootstrap_features(metadata_dir, bootstrap_features)
    return results
