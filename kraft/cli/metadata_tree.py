"""The metadata image as a tree of paths, for ``kraft metadata shell --snapshot F ls /topics`` (the
browse of kafka-metadata-shell.sh).

The image is rebuilt offline from files — a snapshot, or a metadata log directory (its newest snapshot
plus the segment records after it) — by the same :class:`~kraft.metadata.delta.MetadataDelta` replay
the nodes use.  A log directory's segments are read as written: on a live node that includes records
not yet committed.  Reading stops at a file's first invalid batch (a torn tail); records that cannot
be replayed are counted under ``/cluster``.

Layout (directories end in ``/`` in ``ls``)::

    /brokers/<id>/registration       the BrokerRegistration (JSON)
    /brokers/<id>/fenced             true | false
    /brokers/<id>/inControlledShutdown
    /topics/<name>/id                the topic id
    /topics/<name>/<partition>/data  replicas, isr, leader, leaderEpoch, partitionEpoch,
                                     eligibleLeaderReplicas, lastKnownElr, leaderRecoveryState (JSON)
    /topics/<name>/configs/<key>     topic configs set in the metadata
    /configs/<type>/<name>/<key>     every config resource (BROKER "" = cluster-wide default)
    /features/<name>                 finalized feature level
    /acls/<id>                       one ACL binding (JSON)
    /cluster/{source,offset,epoch,brokers,topics,partitions,voters,replayErrors}
"""

from __future__ import annotations

import dataclasses
import enum
import json
import posixpath
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kraft.cli.common import CliError

if TYPE_CHECKING:
    from kraft.storage.batch import RecordBatch


class Tree(dict[str, Any]):
    """A directory: name -> Tree | file.  A file holds a JSON-ready value, which may itself be a plain
    dict (a registration, a partition's data): only ``Tree`` instances are directories."""


MAX_REPLAY_ERRORS_KEPT = 100  # /cluster/replayErrors lists this many; the count covers all of them


def _jsonable(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, tuple | list):
        return [_jsonable(v) for v in value]
    return value


def _read_batches(path: Path) -> tuple[list[RecordBatch], str | None]:
    """Every valid batch of one file, and why reading stopped early (None: read to the end)."""
    from kraft.storage.batch import STORED_BATCH_MAX_BYTES, decode_batch
    from kraft.storage.errors import StorageError

    data = path.read_bytes()
    batches: list[RecordBatch] = []
    position = 0
    while position < len(data):
        try:
            batch, position = decode_batch(data, position, max_batch_bytes=STORED_BATCH_MAX_BYTES)
        except StorageError as exc:
            if data.count(0, position) == len(data) - position:
                return batches, None  # a live segment's zero-filled preallocated space
            return batches, f"{path.name}: stopped at position {position}: {exc.message}"
        batches.append(batch)
    return batches, None


class ImageLoader:
    """Replays metadata files into an image; collects what the /cluster directory shows."""

    def __init__(self) -> None:
        from kraft.metadata.delta import MetadataDelta
        from kraft.metadata.image import MetadataImage

        self.delta = MetadataDelta(MetadataImage.empty())
        self.sources: list[str] = []
        self.problems: list[str] = []
        self.problem_count = 0
        self.voters: list[dict[str, Any]] | None = None

    def _problem(self, message: str) -> None:
        self.problem_count += 1
        if len(self.problems) < MAX_REPLAY_ERRORS_KEPT:
            self.problems.append(message)

    def _replay_file(self, path: Path, after_offset: int) -> None:
        from kraft.errors import KraftError
        from kraft.storage.control import VotersRecord

        batches, stopped = _read_batches(path)
        if stopped is not None:
            self._problem(stopped)
        for batch in batches:
            if batch.is_control:
                for message in batch.control_messages():
                    if isinstance(message, VotersRecord):
                        self.voters = [
                            {
                                "voterId": v.voter_id,
                                "endpoints": [f"{e.name}://{e.host}:{e.port}" for e in v.endpoints],
                            }
                            for v in message.voters
                        ]
                continue
            for record in batch.records:
                offset = batch.base_offset + record.offset_delta
                if offset <= after_offset or record.value is None:
                    continue

                def report(exc: KraftError, at: int = offset) -> None:
                    self._problem(f"{path.name} offset {at}: {exc.message}")

                self.delta.replay_values([record.value], offset, batch.partition_leader_epoch, report)

    def load_snapshot(self, path: Path) -> None:
        from kraft.storage.snapshot import parse_snapshot_file_name

        snapshot_id = parse_snapshot_file_name(path.name)
        if snapshot_id is None:
            raise CliError(f"--snapshot {path}: not a snapshot file name (<end offset>-<epoch>.checkpoint)")
        if not path.is_file():
            raise CliError(f"--snapshot {path}: not a file")
        self._replay_file(path, -1)
        self.delta.offset = snapshot_id.end_offset - 1
        self.delta.epoch = snapshot_id.epoch
        self.sources.append(str(path))

    def load_log_dir(self, directory: Path) -> None:
        from kraft.storage.dump import log_dir_files
        from kraft.storage.log import METADATA_LOG_DIR_NAME
        from kraft.storage.segment import LOG_SUFFIX
        from kraft.storage.snapshot import SNAPSHOT_SUFFIX

        if not directory.is_dir():
            raise CliError(f"--log-dir {directory}: not a directory")
        if not log_dir_files(directory) and (directory / METADATA_LOG_DIR_NAME).is_dir():
            directory = directory / METADATA_LOG_DIR_NAME  # metadata.log.dir itself
        files = log_dir_files(directory)
        snapshots = [p for p in files if p.name.endswith(SNAPSHOT_SUFFIX)]
        segments = [p for p in files if p.name.endswith(LOG_SUFFIX)]
        if not files:
            raise CliError(f"--log-dir {directory}: no segment (*.log) or snapshot (*.checkpoint) files")
        after = -1
        if snapshots:
            self.load_snapshot(snapshots[-1])  # names sort by end offset (zero-padded)
            after = self.delta.offset
        for segment in segments:
            self._replay_file(segment, after)
        self.sources.extend(str(s) for s in segments)

    def tree(self) -> Tree:
        image = self.delta.apply()
        for error in self.delta.replay_errors:
            self._problem(error)
        return build_tree(image, self.sources, self.voters, self.problems, self.problem_count)


def build_tree(
    image: Any,
    sources: list[str],
    voters: list[dict[str, Any]] | None = None,
    problems: list[str] | None = None,
    problem_count: int = 0,
) -> Tree:
    """The browsable tree of a :class:`~kraft.metadata.image.MetadataImage`."""
    from kraft.metadata.records import ConfigResourceType

    brokers = Tree()
    for broker_id, broker in sorted(image.brokers.items()):
        brokers[str(broker_id)] = Tree(
            registration=_jsonable(broker),
            fenced=broker.fenced,
            inControlledShutdown=broker.in_controlled_shutdown,
        )
    topics = Tree()
    for name, topic_id in sorted(image.topic_ids_by_name.items()):
        topic = image.topics_by_id[topic_id]
        node = Tree(id=topic_id)
        for partition_id, partition in enumerate(topic.partitions):
            node[str(partition_id)] = Tree(
                data={
                    "replicas": list(partition.replicas),
                    "isr": list(partition.isr),
                    "leader": partition.leader,
                    "leaderEpoch": partition.leader_epoch,
                    "partitionEpoch": partition.partition_epoch,
                    "eligibleLeaderReplicas": list(partition.elr),
                    "lastKnownElr": list(partition.last_known_elr),
                    "leaderRecoveryState": partition.leader_recovery_state,
                    "lastUncleanLeaderEpoch": partition.last_unclean_leader_epoch,
                }
            )
        configs = dict(image.topic_configs(name))
        if configs:
            node["configs"] = Tree(sorted(configs.items()))
        topics[name] = node
    configs_tree = Tree()
    for key, values in sorted(image.configs.items()):
        try:
            kind = ConfigResourceType(key.resource_type).name
        except ValueError:
            kind = str(key.resource_type)
        configs_tree.setdefault(kind, Tree())[key.resource_name or '""'] = Tree(sorted(values.items()))
    cluster = Tree(
        source=sources,
        offset=image.offset,
        epoch=image.epoch,
        brokers=len(image.brokers),
        topics=len(image.topics_by_id),
        partitions=image.partition_count(),
        replayErrors={"count": problem_count, "first": list(problems or [])},
    )
    if voters is not None:
        cluster["voters"] = voters
    return Tree(
        brokers=brokers,
        topics=topics,
        configs=configs_tree,
        features=Tree(sorted(image.features.items())),
        acls=Tree((acl_id, _jsonable(acl)) for acl_id, acl in sorted(image.acls.items())),
        cluster=cluster,
    )


def _sort_key(name: str) -> tuple[int, int, str]:
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def resolve(cwd: str, path: str | None) -> str:
    """An absolute, normalised path (``..`` above the root stays at the root)."""
    joined = posixpath.normpath(posixpath.join(cwd, path or "."))
    return "/" + joined.lstrip("/")


def lookup(tree: Tree, path: str) -> Any:
    node: Any = tree
    for part in [p for p in path.split("/") if p]:
        if not isinstance(node, Tree) or part not in node:
            raise CliError(f"{path}: no such file or directory")
        node = node[part]
    return node


def ls(tree: Tree, path: str) -> list[str]:
    """Child names of a directory (directories with a trailing ``/``); a file lists as its name."""
    node = lookup(tree, path)
    if not isinstance(node, Tree):
        return [posixpath.basename(path)]
    return [f"{name}/" if isinstance(node[name], Tree) else name for name in sorted(node, key=_sort_key)]


def cat(tree: Tree, path: str) -> Any:
    node = lookup(tree, path)
    if isinstance(node, Tree):
        raise CliError(f"{path}: is a directory (try ls or tree)")
    return node


def render(value: Any) -> str:
    """A leaf as cat prints it: strings bare, everything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, indent=2, default=str)


def tree_lines(tree: Tree, path: str) -> list[str]:
    """An indented listing of everything under ``path``, leaves with their values on one line."""
    node = lookup(tree, path)
    lines = [path]

    def walk(current: Any, depth: int) -> None:
        for name in sorted(current, key=_sort_key):
            child = current[name]
            if isinstance(child, Tree):
                lines.append(f"{'  ' * depth}{name}/")
                walk(child, depth + 1)
            else:
                lines.append(f"{'  ' * depth}{name}: {json.dumps(child, default=str)}")

    if isinstance(node, Tree):
        walk(node, 1)
    else:
        lines[0] = f"{path}: {json.dumps(node, default=str)}"
    return lines
