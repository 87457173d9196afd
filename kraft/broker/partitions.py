"""The partition manager: the broker's local partition logs and their roles.

Theory of operation
-------------------
Each hosted partition is a directory ``<topic>-<partition>`` under one of ``log.dirs`` holding a segmented
log (through :class:`~kraft.broker.partition_log.PartitionLog`) and a ``partition.state`` file that records
the topic id, the role (LEADER / FOLLOWER), the leader id and the leader epoch.

Metadata deltas arrive as :class:`~kraft.broker.types.LocalChanges` and are applied in Kafka's order:
first stop and delete the partitions the broker no longer hosts, then become leader for new
leaderships, then follower for the rest (the publisher applies the deletions and demotions just before
committing the image and the rest just after, see :meth:`PartitionManager.split`).  Every step is
idempotent — creating a partition that exists opens it, deleting one that is gone does nothing, and a
role/epoch that is already recorded is not rewritten — and startup reconciles the directories with the
stored image, so a crash anywhere in a step is repaired on restart.

Crash safety of directory changes:

- creation: the directory is built under a staging name (``…-create``) with its state file, then renamed
  into place, so a directory with the final name always has a state file;
- deletion: the directory is renamed to ``<name>.<uuid>-delete`` (one atomic step that takes it out of
  the image's view), then removed; leftovers of either kind are removed by :meth:`load`.

Both temporary names are built as Kafka builds its deletion name (``LocalLog.logDeleteDirName``): the
topic part is cut so the whole name stays within the file system's 255-byte limit, since a 249-character
topic (Kafka's maximum) plus ``-<p>.<32 hex>-delete`` would not fit.  Partition directories themselves
(``<topic>-<p>``) fit because the controller refuses partition ids whose directory name would not.

``partition.state`` is written atomically (temp + rename) but not fsynced: the image store is the source
of truth for roles and epochs and a full :meth:`reconcile` rewrites any state file that is behind.  A paced
apply rewrites the state files of a turn's re-roled partitions in one batch on a worker thread before the
turn ends (a new file renamed over the old is ~0.4 ms of system time: a controlled shutdown re-roles every
partition the broker leads); the roles in memory change at once, as before.

Follower replication (a later step) plugs in through :class:`AppliedChanges`: the broker hands the
``became_follower`` list to a fetcher manager, which appends through :meth:`Partition.log`.

Startup and pacing (issue #14)
------------------------------
At start the broker only :meth:`PartitionManager.scan` s its log dirs (state files, no log is opened) and
catches up with the controller's log first; :meth:`PartitionManager.open_to` then opens the partitions the
caught-up image still assigns here and removes the directories of everything else — a topic deleted
while the broker was down is never re-created or even opened.  Directory work is paced
(:meth:`PartitionManager.apply_paced`): at most :data:`PARTITIONS_PER_TURN` partitions per event-loop
turn, so a bulk create of thousands of partitions does not starve heartbeats into a fence.

Log dir failure (Kafka's ``LogDirFailure``): an ``OSError`` or a storage error (a failed write or
fsync, a segment that cannot be opened, corrupt flushed data) while creating, opening or deleting one
partition — or a storage error (``CorruptLogError``, a failed write or fsync) while serving or
replicating it (:meth:`PartitionManager.storage_failed`) — marks that partition and its log dir offline
(one ``log_dir_offline`` line); the partitions of that dir are closed and no longer served, new
partitions go to the dirs still online, every heartbeat reports the offline dirs and their partitions
(:meth:`PartitionManager.offline_report`) so the controller moves their leadership away, and when no log
dir is left :class:`AllLogDirsOfflineError` stops the broker (fail-stop).
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import json
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import islice, pairwise
from operator import attrgetter
from pathlib import Path
from typing import Any

from kraft.broker.partition_log import PartitionLog, PartitionLogOpener
from kraft.broker.segmented_partition_log import (
    SegmentedPartitionLog,
    close_partition_logs,
    sync_recovered_partition_logs,
)
from kraft.broker.types import (
    LocalChanges,
    PartitionAssignment,
    ReplicaRole,
    TopicPartition,
    local_changes_between,
    local_changes_between_in_steps,
)
from kraft.clock import DEFAULT_WORK_UNIT_MS, Clock, Deadline, SystemClock
from kraft.observability.logging import get_logger
from kraft.storage.errors import CorruptLogError, FatalStorageError, StorageError
from kraft.storage.fileio import MAX_FILE_NAME_BYTES

STATE_FILE = "partition.state"
_STATE_VERSION = 1
_DELETE_SUFFIX = "-delete"
_CREATE_SUFFIX = "-create"


def temporary_dir_name(tp: TopicPartition, suffix: str) -> str:
    """``<topic>-<p>.<uuid>`` + ``suffix``, with the topic cut so the name fits :data:`MAX_FILE_NAME_BYTES`
    (Kafka's ``logDirNameWithSuffixCappedLength``); unique through the random uuid, not the topic."""
    tail = f"-{tp.partition}.{uuid.uuid4().hex}{suffix}"
    return tp.topic[: max(MAX_FILE_NAME_BYTES - len(tail), 0)] + tail


def staging_dir_name(tp: TopicPartition) -> str:
    """Where a new partition directory is built before it is renamed into place."""
    return temporary_dir_name(tp, _CREATE_SUFFIX)


def deletion_dir_name(tp: TopicPartition) -> str:
    """What a partition directory is renamed to before it is removed."""
    return temporary_dir_name(tp, _DELETE_SUFFIX)


PARTITIONS_PER_TURN = 64
"""Partition directories created/opened/deleted per event-loop turn by the paced methods (at most)."""

PACE_STEP = 1
"""Partitions :meth:`PartitionManager.apply_paced` handles between two looks at the turn's budget: one —
a partition's directory work is 0.1 ms to tens of ms (closing a segmented log before deleting it syncs
it), while a look at the clock is ~0.2 µs."""

SORT_RUN = 2048
"""Partitions :func:`in_order` sorts in one step (~0.3 ms); its runs are then joined or merged."""

MERGE_STEP = 512
"""Partitions :func:`in_order` takes from the merge of its runs in one step (~0.5 ms)."""

_AsChanges = Callable[[dict[TopicPartition, Any]], LocalChanges]
_ORDER = attrgetter("topic", "partition")  # TopicPartition's order, compared in C


class Pacer:
    """Yields the event loop from a sliced loop when its turn's time budget ran out."""

    def __init__(self, clock: Clock, budget_ms: int) -> None:
        self._clock = clock
        self._budget_ms = budget_ms
        self.pauses = 0
        self.restart()

    def restart(self) -> None:
        """A new turn starts (the caller yielded on its own)."""
        self._deadline = Deadline(self._clock, self._budget_ms)

    def expired(self) -> bool:
        """The turn's budget ran out (the caller yields, then :meth:`restart` s)."""
        return self._deadline.expired()

    async def tick(self) -> None:
        if self._deadline.expired():
            self.pauses += 1
            await asyncio.sleep(0)
            self.restart()


async def in_order(partitions: Iterable[TopicPartition], pacer: Pacer) -> list[TopicPartition]:
    """``sorted(partitions)`` in steps (``pacer`` yields between them): runs of :data:`SORT_RUN` sorted
    by a key compared in C, then joined — the usual case: a broker's deletes of a topic come in
    partition order — or merged (:func:`heapq.merge`) :data:`MERGE_STEP` at a time. ``partitions`` (a
    dict's keys) must not change until this returns."""
    runs: list[list[TopicPartition]] = []
    items = iter(partitions)
    while run := sorted(islice(items, SORT_RUN), key=_ORDER):
        if runs:  # (pauses only between steps: a small change is ordered without one)
            await pacer.tick()
        runs.append(run)
    if len(runs) <= 1:
        return runs[0] if runs else []
    ordered: list[TopicPartition] = []
    if all(_ORDER(before[-1]) <= _ORDER(after[0]) for before, after in pairwise(runs)):
        for run in runs:
            ordered.extend(run)
        return ordered
    merged = heapq.merge(*runs, key=_ORDER)
    while piece := list(islice(merged, MERGE_STEP)):
        await pacer.tick()
        ordered.extend(piece)
    return ordered


class AllLogDirsOfflineError(OSError):
    """Every log dir of the broker failed: it cannot host any partition (the process must stop)."""


def is_storage_failure(error: BaseException) -> bool:
    """A failure of the local disk or of the data on it (Kafka's KafkaStorageException): durable data
    that no longer verifies, a failed write or fsync, any other I/O error — not a caller's mistake such as
    an offset out of range or a bad batch received from a leader."""
    if isinstance(error, AllLogDirsOfflineError):
        return False
    return isinstance(error, CorruptLogError | FatalStorageError | OSError)


class Partition:
    """One hosted partition: its log, where it lives, and what the image says about it."""

    __slots__ = ("_checkpoint_key", "_new_data", "assignment", "log", "log_dir", "path", "role", "tp")

    def __init__(
        self,
        tp: TopicPartition,
        log_dir: Path,
        log: PartitionLog,
        assignment: PartitionAssignment,
        role: ReplicaRole,
    ) -> None:
        self.tp = tp
        self.log_dir = log_dir
        self.path = log_dir / tp.dir_name
        self.log = log
        self.assignment = assignment
        self.role = role
        # Created lazily: a broker may host many partitions and most never have a long-polling reader.
        self._new_data: asyncio.Event | None = None
        self._checkpoint_key: tuple[TopicPartition, str] | None = None

    @property
    def topic_id(self) -> str:
        return self.assignment.topic_id

    @property
    def checkpoint_key(self) -> tuple[TopicPartition, str]:
        """``(tp, topic id)``, its ``replication-offset-checkpoint`` key: made once and kept, so a
        checkpoint pass over 100,000 partitions allocates no new GC-tracked tuple per partition (those
        pushed the collector into full collections of the whole heap every few passes)."""
        key = self._checkpoint_key
        if key is None or key[1] != self.assignment.topic_id:
            key = self._checkpoint_key = (self.tp, self.assignment.topic_id)
        return key

    @property
    def leader_epoch(self) -> int:
        return self.assignment.leader_epoch

    @property
    def leader_id(self) -> int:
        return self.assignment.leader

    def notify_appended(self) -> None:
        """Wake every reader long-polling at the old log end."""
        event, self._new_data = self._new_data, None
        if event is not None:
            event.set()

    def data_event(self) -> asyncio.Event:
        """An event set by the next append (for long-poll Fetch)."""
        if self._new_data is None:
            self._new_data = asyncio.Event()
        return self._new_data


@dataclass(frozen=True, slots=True)
class AppliedChanges:
    """What one application of local changes did (for logs, metrics and follower fetchers)."""

    deleted: tuple[TopicPartition, ...] = ()
    became_leader: tuple[TopicPartition, ...] = ()
    became_follower: tuple[TopicPartition, ...] = ()
    created: tuple[TopicPartition, ...] = field(default=())

    def is_empty(self) -> bool:
        return not (self.deleted or self.became_leader or self.became_follower)

    def then(self, later: AppliedChanges) -> AppliedChanges:
        return AppliedChanges(
            self.deleted + later.deleted,
            self.became_leader + later.became_leader,
            self.became_follower + later.became_follower,
            self.created + later.created,
        )


class PartitionManager:
    """Owns every local partition; the only code that creates, deletes or re-roles partition logs."""

    def __init__(
        self,
        broker_id: int,
        log_dirs: Sequence[Path],
        open_log: PartitionLogOpener,
        *,
        clock: Clock | None = None,
        work_unit_ms: int = DEFAULT_WORK_UNIT_MS,
    ) -> None:
        """``clock`` and ``work_unit_ms`` time the paced methods' turns (:meth:`apply_paced`)."""
        if not log_dirs:
            raise ValueError("a broker needs at least one log dir")
        self.broker_id = broker_id
        self._clock: Clock = clock or SystemClock()
        self.work_unit_ms = work_unit_ms
        self.log_dirs = tuple(Path(d) for d in log_dirs)
        self._open_log = open_log
        self._partitions: dict[TopicPartition, Partition] = {}
        self._load_by_dir: dict[Path, int] = dict.fromkeys(self.log_dirs, 0)
        self._found: dict[TopicPartition, tuple[Path, PartitionAssignment, ReplicaRole]] = {}
        self.offline_dirs: dict[Path, str] = {}
        """Log dirs taken offline after an I/O error → the error (never used again by this process)."""
        self.offline: dict[TopicPartition, str] = {}
        """Partitions that could not be created or opened (or whose log dir went offline) → why."""
        self._offline_dir_of: dict[TopicPartition, Path] = {}
        # Directories renamed to their deletion name by a paced apply and not removed yet: apply_paced
        # removes them on a thread between its turns (Kafka deletes on a background thread), not on the loop.
        self._doomed: list[Path] | None = None
        # Partitions re-roled by a paced apply's turn whose state file is not rewritten yet: the turn
        # writes them on a thread in one batch (:meth:`_write_restated`), not one by one on the loop.
        self._restated: list[Partition] | None = None
        # Each watcher's set of partitions whose hosting changed since it last looked (watch_changes).
        self._watchers: list[set[TopicPartition]] = []
        self.on_all_offline: Callable[[AllLogDirsOfflineError], None] | None = None
        """Called by :meth:`storage_failed` when the last log dir went offline (the process must stop);
        without it the error is raised."""
        self._log = get_logger("broker.partitions", node=broker_id)

    # --- queries -------------------------------------------------------------------------------

    def get(self, tp: TopicPartition) -> Partition | None:
        return self._partitions.get(tp)

    def partitions(self) -> list[Partition]:
        return [self._partitions[tp] for tp in sorted(self._partitions)]

    def assignments(self) -> dict[TopicPartition, PartitionAssignment]:
        return {tp: p.assignment for tp, p in self._partitions.items()}

    def __len__(self) -> int:
        return len(self._partitions)

    # --- change tracking -----------------------------------------------------------------------

    def watch_changes(self) -> set[TopicPartition]:
        """A set that collects every partition whose hosting changes from now on — added, removed, or its
        role or assignment changed, by a metadata apply, a start-up open, a storage failure or close —
        filled with the partitions hosted now (all are new to the watcher).  The watcher takes what it
        needs and clears it; :meth:`unwatch` ends it.  So :class:`~kraft.broker.replication.ReplicaManager`
        visits per image the partitions that changed, not every hosted one."""
        touched = set(self._partitions)
        self._watchers.append(touched)
        return touched

    def take_changes(self, touched: set[TopicPartition]) -> set[TopicPartition]:
        """Hand the watcher its collected set ``touched`` to keep (no copy: 100,000 partitions are a
        few ms of one) and collect from now on in the new empty set returned."""
        renewed: set[TopicPartition] = set()
        self._watchers = [renewed if w is touched else w for w in self._watchers]
        return renewed

    def unwatch(self, touched: set[TopicPartition]) -> None:
        self._watchers = [w for w in self._watchers if w is not touched]

    def _touch(self, tp: TopicPartition) -> None:
        for touched in self._watchers:
            touched.add(tp)

    # --- startup -------------------------------------------------------------------------------

    def load(self) -> None:
        """Open the partitions found in the log dirs; finish interrupted creations/deletions."""
        self.scan()
        found, self._found = self._found, {}
        for tp, (log_dir, assignment, role) in sorted(found.items()):
            self._add(Partition(tp, log_dir, self._open_log(log_dir / tp.dir_name), assignment, role))
        self._log.info("partitions_loaded", count=len(self._partitions))

    def scan(self) -> int:
        """Find the partition directories in the log dirs without opening any log (see :meth:`open_to`);
        finish interrupted creations/deletions.  A log dir that cannot be read is taken offline."""
        self._found.clear()
        for log_dir in self.log_dirs:
            try:
                log_dir.mkdir(parents=True, exist_ok=True)
                entries = sorted(log_dir.iterdir())
            except OSError as exc:
                self._dir_failed(log_dir, exc)
                continue
            for entry in entries:
                if not entry.is_dir():
                    continue
                if entry.name.endswith((_DELETE_SUFFIX, _CREATE_SUFFIX)):
                    shutil.rmtree(entry, ignore_errors=True)
                    continue
                state = _read_state(entry)
                if state is None:
                    continue  # not a partition directory of ours (e.g. the metadata log)
                tp, assignment, role = state
                if tp.dir_name != entry.name or tp in self._found or tp in self._partitions:
                    self._log.warning("partition_dir_ignored", path=str(entry))
                    continue
                self._found[tp] = (log_dir, assignment, role)
        self._log.info("partition_dirs_found", count=len(self._found))
        return len(self._found)

    async def open_to(self, desired: Mapping[TopicPartition, PartitionAssignment]) -> AppliedChanges:
        """After :meth:`scan`: open the found partitions ``desired`` still assigns here (same topic id),
        remove the directories of all others, then create what is missing — paced.

        Except when a log dir could not be read by the scan: the partitions ``desired`` assigns that were
        found nowhere may be on it, and a replica created empty elsewhere would stand for one that holds
        the partition's data — the controller could elect it from the ELR (its registration still proves
        it kept its dirs) and lose acknowledged records.  They are held back as offline partitions of that
        dir instead (reported by every heartbeat, never elected, not hosted until a restart finds the dir
        readable); a partition that really is new to this broker waits for that restart too."""
        unreadable = sorted(self.offline_dirs)  # taken offline by the scan: their contents are unknown
        found, self._found = self._found, {}
        removed = 0
        opened: list[Partition] = []
        started = time.monotonic()
        # Ordered in steps (a 100,000-partition broker's sorted() of what the scan found was one stretch of
        # ~550 ms: bench/broker_open.py), then opened PARTITIONS_PER_TURN a turn.
        ordered = await in_order(found, Pacer(self._clock, self.work_unit_ms))
        for index, tp in enumerate(ordered):
            if index % PARTITIONS_PER_TURN == PARTITIONS_PER_TURN - 1:
                await asyncio.sleep(0)
            log_dir, assignment, role = found[tp]
            wanted = desired.get(tp)
            if log_dir in self.offline_dirs:
                if wanted is not None and wanted.topic_id == assignment.topic_id and tp not in self.offline:
                    # Its dir failed while others opened: offline with it, not re-created elsewhere empty.
                    self.offline[tp] = f"log dir {log_dir} offline"
                    self._offline_dir_of[tp] = log_dir
                continue
            try:
                if wanted is None or wanted.topic_id != assignment.topic_id:
                    # Deleted (or moved away) while this broker was down: never opened, never served.
                    self._remove_dir(log_dir, tp)
                    removed += 1
                    continue
                partition = Partition(tp, log_dir, self._open_log(log_dir / tp.dir_name), assignment, role)
                self._add(partition)
                opened.append(partition)
            except (OSError, StorageError) as exc:  # KafkaStorageException
                self._partition_failed(tp, log_dir, exc)
        # After a crash each log's recovery scan left its newest segment to be fdatasync'ed: all at once,
        # in parallel, before any partition is led, followed or served.
        failed = sync_recovered_partition_logs([p.log for p in opened])
        for partition in opened:
            error = failed.get(partition.log)
            if error is not None:
                self.storage_failed(partition, error)
        self._log.info(
            "partition_logs_opened",
            count=len(opened),
            duration_ms=round((time.monotonic() - started) * 1000),
            sync_failures=len(failed),
        )
        if removed:
            self._log.info("stale_partition_dirs_removed", count=removed)
        if unreadable:
            self._hold_back(desired, found, unreadable[0])
        pacer = Pacer(self._clock, self.work_unit_ms)
        applied = await self.apply_paced(await self.changes_to_paced(desired, pacer), pacer)
        self._log.info("partitions_opened", count=len(self._partitions), offline=len(self.offline))
        return applied

    async def apply_paced(self, changes: LocalChanges, pacer: Pacer | None = None) -> AppliedChanges:
        """:meth:`apply` in event-loop turns of at most :data:`PARTITIONS_PER_TURN` partitions — and,
        for deletions, the work unit's time budget (checked every :data:`PACE_STEP` partitions) — in
        the same order: all deletes, then leaders, then followers, each kind by partition. The
        ordering is sliced too (:func:`in_order`): a broker hosting a deleted 100,000-partition topic
        sorted its deletes for ~50 ms in one go. ``pacer``: the caller's turn, if it did work in it
        without yielding (the publisher's conversion of the same deletes), so the two together stay
        within one budget."""
        pacer = pacer or Pacer(self._clock, self.work_unit_ms)
        deleted: list[TopicPartition] = []
        leaders: list[TopicPartition] = []
        followers: list[TopicPartition] = []
        created: list[TopicPartition] = []
        kinds: tuple[tuple[Mapping[TopicPartition, Any], _AsChanges, bool], ...]
        kinds = (
            (changes.deletes, lambda part: LocalChanges(deletes=part), True),
            (changes.leaders, lambda part: LocalChanges(leaders=part), False),
            (changes.followers, lambda part: LocalChanges(followers=part), False),
        )
        self._doomed = []
        self._restated = []
        try:
            for mapping, as_changes, budgeted in kinds:
                await self._apply_kind(
                    mapping, as_changes, budgeted, pacer, (deleted, leaders, followers, created)
                )
        finally:
            restated, self._restated = self._restated, None
            if restated:  # (an error mid-way: the roles changed in memory are recorded still)
                await asyncio.to_thread(_write_states, restated)
            doomed, self._doomed = self._doomed, None
            if doomed:  # (an error mid-way: what was renamed goes anyway; start-up would remove it too)
                await asyncio.to_thread(_remove_trees, doomed)
        return AppliedChanges(tuple(deleted), tuple(leaders), tuple(followers), tuple(created))

    async def _apply_kind(
        self,
        mapping: Mapping[TopicPartition, Any],
        as_changes: _AsChanges,
        budgeted: bool,
        pacer: Pacer,
        out: tuple[list[TopicPartition], list[TopicPartition], list[TopicPartition], list[TopicPartition]],
    ) -> None:
        deleted, leaders, followers, created = out
        order = await in_order(mapping, pacer)
        start = 0
        while start < len(order):
            end = start
            turn = AppliedChanges()
            while end < len(order) and end - start < PARTITIONS_PER_TURN:
                piece = order[end : min(end + PACE_STEP, start + PARTITIONS_PER_TURN)]
                turn = turn.then(self._apply_quietly(as_changes({tp: mapping[tp] for tp in piece})))
                end += len(piece)
                # Deletions end a turn on the budget too (a turn began where the ordering's last
                # step left it): discarding a log and renaming its directory is 0.1 to ms. Leaderships and
                # followings keep whole turns of 64, as before: a demotion must not wait turns
                # behind a budget that the host's load, not this work, used up.
                if budgeted and pacer.expired():
                    break
            if self._restated and await self._write_restated():
                # A state file that could not be written took its log dir offline: what went with it is
                # not led or followed here (as when the write failed in place).
                turn = AppliedChanges(
                    turn.deleted,
                    tuple(tp for tp in turn.became_leader if tp in self._partitions),
                    tuple(tp for tp in turn.became_follower if tp in self._partitions),
                    tuple(tp for tp in turn.created if tp in self._partitions),
                )
            self._log_applied(turn)
            deleted.extend(turn.deleted)
            leaders.extend(turn.became_leader)
            followers.extend(turn.became_follower)
            created.extend(turn.created)
            start = end
            doomed = self._doomed
            if doomed:
                # The turn's deleted directories (renamed already) are removed on a thread while
                # the loop runs: an rmtree waits on the file system (a busy disk: tens of ms).
                self._doomed = []
                await asyncio.to_thread(_remove_trees, doomed)
            else:
                await asyncio.sleep(0)
            pacer.restart()

    async def _write_restated(self) -> bool:
        """Write the state files of the partitions this turn re-roled, on a worker thread, in one batch:
        each is a new file renamed over the old (~0.4 ms of mostly system time: a controlled shutdown
        turns every leadership of the broker into a following).  The roles in memory changed already,
        as before; the files are not fsynced (the image store is the source of truth) and the turn
        ends only after they are written, so a later turn or apply never races its own write.  A
        failed write takes the partition's log dir offline, as in place.  True if any failed."""
        restated, self._restated = self._restated or [], []
        errors = await asyncio.to_thread(_write_states, restated)
        for partition, error in zip(restated, errors, strict=True):
            if error is not None:
                self._partition_failed(partition.tp, partition.log_dir, error)
        return any(error is not None for error in errors)

    # --- log dir failure -------------------------------------------------------------------------

    @property
    def online_dirs(self) -> tuple[Path, ...]:
        return tuple(d for d in self.log_dirs if d not in self.offline_dirs)

    def storage_failed(self, partition: Partition, exc: BaseException) -> None:
        """A read, append or flush of ``partition``'s log failed with a storage error (corrupt data, a
        failed write or fsync): take its log dir offline, as Kafka does for a KafkaStorageException.
        Nothing more happens for a partition that is no longer hosted (already offline)."""
        if self._partitions.get(partition.tp) is not partition:
            return
        try:
            self._partition_failed(partition.tp, partition.log_dir, exc)
        except AllLogDirsOfflineError as error:
            if self.on_all_offline is None:
                raise
            self.on_all_offline(error)

    def offline_report(self) -> tuple[list[str], list[tuple[str, int]]]:
        """(offline log dirs, (topic, partition) that were on them) for the heartbeat."""
        if not self.offline_dirs:
            return [], []
        partitions = [
            (tp.topic, tp.partition)
            for tp in sorted(self._offline_dir_of)
            if self._offline_dir_of[tp] in self.offline_dirs
        ]
        return [str(d) for d in sorted(self.offline_dirs)], partitions

    def _hold_back(
        self,
        desired: Mapping[TopicPartition, PartitionAssignment],
        found: Mapping[TopicPartition, object],
        log_dir: Path,
    ) -> None:
        """Mark the ``desired`` partitions found on no readable dir offline on ``log_dir`` (unreadable)."""
        held = [
            tp
            for tp in sorted(desired)
            if tp not in found and tp not in self._partitions and tp not in self.offline
        ]
        for tp in held:
            self.offline[tp] = f"log dir {log_dir} was unreadable at start-up and may hold it"
            self._offline_dir_of[tp] = log_dir
        if held:
            self._log.warning("partitions_held_back", log_dir=str(log_dir), count=len(held))

    def _partition_failed(self, tp: TopicPartition, log_dir: Path, exc: BaseException) -> None:
        self.offline[tp] = f"{type(exc).__name__}: {exc}"
        self._offline_dir_of[tp] = log_dir
        self._dir_failed(log_dir, exc, tp)

    def _dir_failed(self, log_dir: Path, exc: BaseException, tp: TopicPartition | None = None) -> None:
        """Take ``log_dir`` offline (Kafka's LogDirFailure): close and stop serving its partitions."""
        if log_dir in self.offline_dirs:
            return
        self.offline_dirs[log_dir] = f"{type(exc).__name__}: {exc}"
        closed = 0
        # A partition that failed while being created or opened is not hosted yet: counted on its own.
        extra = 1 if tp is not None and tp not in self._partitions else 0
        for other, partition in list(self._partitions.items()):
            if partition.log_dir == log_dir:
                del self._partitions[other]
                self._touch(other)
                self._load_by_dir[log_dir] -= 1
                self.offline[other] = f"log dir {log_dir} offline"
                self._offline_dir_of[other] = log_dir
                partition.notify_appended()
                with contextlib.suppress(Exception):
                    partition.log.close()
                closed += 1
        self._log.error(
            "log_dir_offline",
            log_dir=str(log_dir),
            partition=str(tp) if tp is not None else None,
            error=f"{type(exc).__name__}: {exc}",
            partitions_offline=closed + extra,
            online_dirs=len(self.online_dirs),
        )
        if not self.online_dirs:
            message = f"every log dir is offline (last: {log_dir}: "
            if isinstance(exc, OSError) and exc.errno is not None:
                raise AllLogDirsOfflineError(
                    exc.errno, f"{message}{exc.strerror or exc})", str(log_dir)
                ) from exc
            raise AllLogDirsOfflineError(f"{message}{exc})") from exc

    # --- applying metadata -----------------------------------------------------------------------

    def apply(self, changes: LocalChanges) -> AppliedChanges:
        """Apply one delta's local changes in Kafka's order: delete, then lead, then follow."""
        applied = self._apply_quietly(changes)
        self._log_applied(applied)
        return applied

    def _apply_quietly(self, changes: LocalChanges) -> AppliedChanges:
        deleted = [tp for tp in sorted(changes.deletes) if self._delete(tp, changes.deletes[tp])]
        created: list[TopicPartition] = []
        leaders = self._set_roles(changes.leaders, ReplicaRole.LEADER, created)
        followers = self._set_roles(changes.followers, ReplicaRole.FOLLOWER, created)
        return AppliedChanges(tuple(deleted), tuple(leaders), tuple(followers), tuple(created))

    def _log_applied(self, applied: AppliedChanges) -> None:
        if not applied.is_empty():
            self._log.info(
                "local_changes_applied",
                deleted=len(applied.deleted),
                leaders=len(applied.became_leader),
                followers=len(applied.became_follower),
                created=len(applied.created),
            )

    def reconcile(self, desired: Mapping[TopicPartition, PartitionAssignment]) -> AppliedChanges:
        """Make the local partitions exactly ``desired`` (the image's partitions hosted here)."""
        return self.apply(self.changes_to(desired))

    def changes_to(self, desired: Mapping[TopicPartition, PartitionAssignment]) -> LocalChanges:
        """The local changes that :meth:`reconcile` would apply."""
        return local_changes_between(self.broker_id, self.assignments(), desired)

    async def changes_to_paced(
        self, desired: Mapping[TopicPartition, PartitionAssignment], pacer: Pacer | None = None
    ) -> LocalChanges:
        """:meth:`changes_to` in steps that yield the loop when the work unit ran out (``pacer``): at
        start-up it compares every hosted partition with the image (~160 ms for 100,000 in one go).
        Compares a copy of the hosted partitions taken at the start (``desired`` must not change)."""
        pacer = pacer or Pacer(self._clock, self.work_unit_ms)
        out = LocalChanges({}, {}, {})
        hosted = _Assignments(dict(self._partitions))
        for _ in local_changes_between_in_steps(self.broker_id, hosted, desired, out):
            await pacer.tick()
        return out

    def split(self, changes: LocalChanges) -> tuple[LocalChanges, LocalChanges]:
        """``(revocations, grants)``: what takes serving ability away (deletions, a leader becoming a
        follower) and what adds it (new partitions, new or re-epoched leaderships).

        The publisher applies revocations before it commits the image and grants after, so this broker
        never serves from a partition state that a crash could roll back (restart reconciles the
        partition logs with the stored image) and stops serving a lost leadership as early as it can.
        """
        demoted: dict[TopicPartition, PartitionAssignment] = {}
        created: dict[TopicPartition, PartitionAssignment] = {}
        for tp, assignment in changes.followers.items():
            partition = self._partitions.get(tp)
            if partition is not None and partition.topic_id == assignment.topic_id:
                demoted[tp] = assignment
            else:
                created[tp] = assignment
        revocations = LocalChanges(deletes=changes.deletes, followers=demoted)
        grants = LocalChanges(leaders=changes.leaders, followers=created)
        return revocations, grants

    def close(self) -> None:
        """Close every partition log together (:func:`close_partition_logs`: flush, one sync barrier,
        then the clean-shutdown markers), not one by one with several fsyncs each."""
        partitions = list(self._partitions.values())
        for tp in self._partitions:
            self._touch(tp)
        self._partitions.clear()
        for partition in partitions:
            partition.notify_appended()
        started = time.monotonic()
        close_partition_logs([partition.log for partition in partitions])
        self._log.info(
            "partition_logs_closed",
            count=len(partitions),
            duration_ms=round((time.monotonic() - started) * 1000),
        )

    # --- internals -------------------------------------------------------------------------------

    def _set_roles(
        self,
        assignments: Mapping[TopicPartition, PartitionAssignment],
        role: ReplicaRole,
        created: list[TopicPartition],
    ) -> list[TopicPartition]:
        changed: list[TopicPartition] = []
        for tp in sorted(assignments):
            assignment = assignments[tp]
            partition = self._partitions.get(tp)
            if partition is not None and partition.topic_id != assignment.topic_id:
                # The topic was deleted and re-created under the same name: the old data must go.
                self._delete(tp)
                partition = None
            if partition is None:
                if len(tp.dir_name.encode()) > MAX_FILE_NAME_BYTES:
                    # The controller refuses such partitions; one that got into the image anyway (an
                    # older controller) must not crash-loop the broker: it is left unhosted, loudly.
                    self._log.error("partition_dir_name_too_long", topic=tp.topic, partition=tp.partition)
                    continue
                if tp in self.offline:
                    continue  # failed once in this process: its log dir is offline
                log_dir = self._placement()
                try:
                    self._create(tp, assignment, role, log_dir)
                except (OSError, StorageError) as exc:  # KafkaStorageException
                    self._partition_failed(tp, log_dir, exc)
                    continue
                created.append(tp)
                changed.append(tp)
            elif partition.assignment != assignment or partition.role is not role:
                partition.assignment = assignment
                partition.role = role
                self._touch(tp)
                if self._restated is not None:
                    self._restated.append(partition)  # written at the end of the paced apply's turn
                else:
                    try:
                        _write_state(partition.path, tp, assignment, role)
                    except (OSError, StorageError) as exc:  # KafkaStorageException
                        self._partition_failed(tp, partition.log_dir, exc)
                        continue
                # A reader parked on this partition must re-check its epoch and role.
                partition.notify_appended()
                changed.append(tp)
        return changed

    def _placement(self) -> Path:
        online = self.online_dirs
        if not online:
            raise AllLogDirsOfflineError(0, "every log dir is offline")
        return min(online, key=lambda d: self._load_by_dir[d])

    def _create(
        self, tp: TopicPartition, assignment: PartitionAssignment, role: ReplicaRole, log_dir: Path
    ) -> Partition:
        final = log_dir / tp.dir_name
        if final.exists():
            # A directory without a readable state file (load() skipped it): never ours to keep.
            self._remove_dir(log_dir, tp)
        staging = log_dir / staging_dir_name(tp)
        staging.mkdir(parents=True)
        _write_state(staging, tp, assignment, role)
        os.replace(staging, final)
        partition = Partition(tp, log_dir, self._open_log(final), assignment, role)
        self._add(partition)
        return partition

    def _delete(self, tp: TopicPartition, topic_id: str | None = None) -> bool:
        """Delete the local log of ``tp`` (only if it belongs to ``topic_id`` when one is given)."""
        partition = self._partitions.get(tp)
        if partition is None or (topic_id is not None and partition.topic_id != topic_id):
            return False
        del self._partitions[tp]
        self._touch(tp)
        self._load_by_dir[partition.log_dir] -= 1
        partition.notify_appended()
        try:
            log = partition.log
            if isinstance(log, SegmentedPartitionLog):
                log.discard()  # its data is going: no syncs (a crash before the rename leaves it unclean,
                # and a directory the image no longer assigns is removed unopened at start-up)
            else:
                log.close()
            self._remove_dir(partition.log_dir, tp)
        except (OSError, StorageError) as exc:  # KafkaStorageException
            self._partition_failed(tp, partition.log_dir, exc)
        return True

    def _remove_dir(self, log_dir: Path, tp: TopicPartition) -> None:
        """Rename the partition directory to its deletion name (atomic: it is gone from then on), then
        remove it — later on a thread within a paced apply (:meth:`apply_paced`), here otherwise."""
        doomed = log_dir / deletion_dir_name(tp)
        os.replace(log_dir / tp.dir_name, doomed)
        if self._doomed is not None:
            self._doomed.append(doomed)
        else:
            shutil.rmtree(doomed, ignore_errors=True)

    def _add(self, partition: Partition) -> None:
        self._partitions[partition.tp] = partition
        self._touch(partition.tp)
        self._load_by_dir[partition.log_dir] += 1


class _Assignments(Mapping[TopicPartition, PartitionAssignment]):
    """Partitions → their assignments, read through (no copy of 100,000 assignments in one go)."""

    __slots__ = ("_partitions",)

    def __init__(self, partitions: dict[TopicPartition, Partition]) -> None:
        self._partitions = partitions

    def __getitem__(self, tp: TopicPartition) -> PartitionAssignment:
        return self._partitions[tp].assignment

    def __iter__(self) -> Iterator[TopicPartition]:
        return iter(self._partitions)

    def __len__(self) -> int:
        return len(self._partitions)


def _remove_trees(paths: Iterable[Path]) -> None:
    """Remove renamed-away partition directories (on a worker thread; leftovers of a crash are removed
    by the next :meth:`PartitionManager.scan`)."""
    for path in paths:
        shutil.rmtree(path, ignore_errors=True)


def _write_states(partitions: Sequence[Partition]) -> list[BaseException | None]:
    """Write each partition's state file as it is now (on a worker thread): per partition, the error
    that stopped its write, or None."""
    errors: list[BaseException | None] = []
    for partition in partitions:
        try:
            _write_state(partition.path, partition.tp, partition.assignment, partition.role)
        except (OSError, StorageError) as exc:  # KafkaStorageException
            errors.append(exc)
        else:
            errors.append(None)
    return errors


def _write_state(
    directory: Path, tp: TopicPartition, assignment: PartitionAssignment, role: ReplicaRole
) -> None:
    state = {
        "version": _STATE_VERSION,
        "topic": tp.topic,
        "partition": tp.partition,
        "topic_id": assignment.topic_id,
        "role": role.value,
        "leader_id": assignment.leader,
        "leader_epoch": assignment.leader_epoch,
        "partition_epoch": assignment.partition_epoch,
        "replicas": list(assignment.replicas),
        "isr": list(assignment.isr),
    }
    tmp = directory / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, separators=(",", ":")))
    os.replace(tmp, directory / STATE_FILE)


def read_partition_state(directory: Path) -> tuple[TopicPartition, PartitionAssignment, ReplicaRole] | None:
    """The recorded state of a partition directory, or None when it has no valid state file."""
    return _read_state(directory)


def _read_state(directory: Path) -> tuple[TopicPartition, PartitionAssignment, ReplicaRole] | None:
    try:
        raw = json.loads((directory / STATE_FILE).read_text())
        tp = TopicPartition(str(raw["topic"]), int(raw["partition"]))
        assignment = PartitionAssignment(
            topic_id=str(raw["topic_id"]),
            leader=int(raw["leader_id"]),
            leader_epoch=int(raw["leader_epoch"]),
            partition_epoch=int(raw["partition_epoch"]),
            replicas=_ints(raw["replicas"]),
            isr=_ints(raw["isr"]),
        )
        return tp, assignment, ReplicaRole(raw["role"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _ints(values: Iterable[object]) -> tuple[int, ...]:
    return tuple(int(str(v)) for v in values)
