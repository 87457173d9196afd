"""Publishes committed metadata to the broker: partition logs, image store, client view.

One publish step: (1) apply the revocations among the delta's local changes (delete partitions, leader →
follower), (2) store the new image and its offset in the image store (one transaction), (3) apply the
grants (new partitions, new leaderships), (4) swap the image the BrokerService answers from.

Why this order: serving ability is only ever *added* after the image that grants it is durable, so a
Produce can never be accepted on a partition state that a crash would roll back; it is *removed* as
early as possible.  A snapshot image that grants this broker nothing (the usual case for a new broker:
a million partitions, none of them here yet) is therefore stored in the background — seconds of SQLite
writes — while the broker goes on fetching; the next step waits for that save before its own.

A crash anywhere in the step is harmless: on restart the stored image comes back, the broker catches up
with the controller's log, the partition directories are reconciled with the caught-up image, and the
records after the stored offset are applied again — application is idempotent (see
:mod:`kraft.broker.partitions`).

Startup (issue #14): :meth:`MetadataPublisher.start` loads the stored image and only *scans* the partition
directories; until :meth:`MetadataPublisher.open_partitions` the publisher is *deferred* — deltas and
snapshots update and store the image but touch no partition.  The broker calls ``open_partitions`` once it
has caught up with the controller's log, so a topic deleted while it was down is never re-created or
opened from a stale stored image (one bad topic used to crash-loop every broker after its deletion).
Partition directory work is paced (:meth:`PartitionManager.apply_paced`) so heartbeats keep flowing.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from itertools import chain
from typing import Protocol

from kraft.broker import heap
from kraft.broker.image_adapter import (
    ImageMetadataView,
    local_assignments_in_steps,
    to_local_changes_in_steps,
)
from kraft.broker.partitions import AppliedChanges, Pacer, PartitionManager
from kraft.broker.types import LocalChanges, PartitionAssignment, TopicPartition
from kraft.clock import DEFAULT_WORK_UNIT_MS, Clock, SystemClock
from kraft.metadata.delta import LocalReplicaChanges, MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.observability.logging import get_logger
from kraft.observability.metrics import BrokerMetrics
from kraft.reaper import (
    MIN_ITEMS,
    release_later,
    release_removed_topics,
    release_replaced_maps,
    release_replaced_topics,
)

RELEASE_STEP = 256
"""Topics of a replaced image looked at between two looks at the budget (~0.2 ms) when a snapshot load
hands them to the reaper."""


class ImageStore(Protocol):
    """Persistence of the applied image (:class:`kraft.metadata.store.SqliteImageStore` implements it)."""

    async def load(self) -> MetadataImage:
        """The last stored image (``MetadataImage.empty()`` when nothing was stored)."""
        ...

    async def save(self, image: MetadataImage) -> None:
        """Store ``image`` and its offset in one transaction (the store diffs against its last save)."""
        ...

    async def close(self) -> None: ...


class MetadataPublisher:
    def __init__(
        self,
        broker_id: int,
        partitions: PartitionManager,
        store: ImageStore,
        listener: str,
        on_view: Callable[[ImageMetadataView], None],
        metrics: BrokerMetrics | None = None,
        *,
        clock: Clock | None = None,
    ) -> None:
        self.broker_id = broker_id
        # Optional only so callers that predate the injection keep working; the broker passes its own.
        self._clock: Clock = clock or SystemClock()
        self._partitions = partitions
        self._store = store
        self._listener = listener
        self._on_view = on_view
        self._metrics = metrics
        self.image = MetadataImage.empty()
        self.last_snapshot_apply_s = 0.0  # until the last snapshot's image was served
        self.last_snapshot_store_s = 0.0  # its image store commit (in the background when it grants nothing)
        self._background_save: asyncio.Task[None] | None = None
        self.deferred = False
        """True between :meth:`start` and :meth:`open_partitions`: partitions are not touched yet."""
        self._log = get_logger("broker.publisher", node=broker_id)

    @property
    def offset(self) -> int:
        return self.image.offset

    async def start(self) -> MetadataImage:
        """Load the stored image and find the partition directories (no log is opened: see
        :meth:`open_partitions`); the publisher is deferred until then."""
        image = await self._store.load()
        self._partitions.scan()
        self.deferred = True
        self._set_image(image)
        partitions = await self._partition_count(image)
        self._log.info("image_loaded", offset=image.offset, partitions=partitions)
        return image

    async def open_partitions(self) -> AppliedChanges:
        """Once caught up with the controller: open/create the partitions the image assigns here, remove
        the directories of the others (paced), and publish normally from then on."""
        await self.flush()
        applied = await self._partitions.open_to(await self._local_assignments(self.image))
        heap.settle()  # the partitions and logs just opened out of later full collections
        self.deferred = False
        # The view callback saw this image while no partition was open: show it again now that they
        # are, so replication sets up their leader/follower state at once, not at the next delta.
        self._on_view(ImageMetadataView(self.image, self._listener))
        return applied

    async def discard_image(self, reason: str) -> None:
        """Forget the stored image (before :meth:`open_partitions` only): it is ahead of the controller's
        log, so it holds records the controller never committed; the broker fetches from the start."""
        assert self.deferred, "only the start-up catch-up may discard the image"
        await self.flush()
        self._log.warning("image_store_discarded", reason=reason, offset=self.image.offset)
        empty = MetadataImage.empty()
        # Every topic of the discarded image goes: freed in slices (big ones alone, small ones in groups).
        await self._release_replaced(self.image, empty)
        await self._save(empty)  # deletes every row: the store diffs against what it holds
        self._set_image(empty)

    async def publish(self, delta: MetadataDelta, last_record_time_ms: int = 0) -> AppliedChanges:
        """Apply one delta built on :attr:`image` (the caller checked it is not mid-transaction)."""
        image = delta.apply()
        # A deleted big topic's partitions are freed in slices once the last image holding it goes.
        release_removed_topics(delta.removed_topics().values())
        if self.deferred:
            await self.flush()
            await self._save(image)
            applied = AppliedChanges()
        else:
            pacer = Pacer(self._clock, DEFAULT_WORK_UNIT_MS)  # one budget through to the deletions
            changes = await self._local_changes(delta, pacer)
            applied = await self._apply(image, changes, pacer)
            if len(changes.deletes) + len(changes.leaders) + len(changes.followers) >= MIN_ITEMS:
                # 100,000 deletes are ~5 ms of objects to free when the last of these goes.
                release_later((changes, applied))
        self._set_image(image, last_record_time_ms)
        return applied

    async def _local_changes(self, delta: MetadataDelta, pacer: Pacer | None = None) -> LocalChanges:
        """This broker's part of ``delta``, yielding the event loop whenever a work unit's time budget
        ran out: one RemoveTopicRecord of a 100,000-partition topic is ~7 ms of scanning for the few
        replicas hosted here, and where this broker hosts most of it (a 3-broker cluster) ~75 ms of
        converting its 100,000 deletes — both in steps (ordering and deleting the partitions
        themselves are paced as well: ``apply_paced``)."""
        pacer = pacer or Pacer(self._clock, DEFAULT_WORK_UNIT_MS)
        changes = LocalReplicaChanges()
        local = LocalChanges({}, {}, {})
        steps = chain(
            delta.local_changes_in_steps(self.broker_id, changes), to_local_changes_in_steps(changes, local)
        )
        for _ in steps:
            await pacer.tick()
        return local

    async def _local_assignments(self, image: MetadataImage) -> dict[TopicPartition, PartitionAssignment]:
        """The partitions ``image`` assigns to this broker, yielding the event loop whenever a work
        unit's time budget ran out (``local_assignments_in_steps``).  Nothing is opened, served or
        removed until the whole list is known: the callers act on it only once this returns."""
        pacer = Pacer(self._clock, DEFAULT_WORK_UNIT_MS)
        hosted: dict[TopicPartition, PartitionAssignment] = {}
        for _ in local_assignments_in_steps(image, self.broker_id, hosted):
            await pacer.tick()
        return hosted

    async def _save(self, image: MetadataImage) -> None:
        try:
            await self._store.save(image)
        except Exception:
            if self._metrics is not None:
                self._metrics.metadata_apply_errors.inc()
            raise

    async def load_snapshot(self, image: MetadataImage) -> AppliedChanges:
        """Replace everything with a snapshot's image (the broker was below the log start)."""
        started_ms = self._clock.monotonic_ms()
        # The snapshot's image shares nothing with the one it replaces: every topic of the old image
        # would be freed in one go where its last holder lets go (~5 ms per 100,000 partitions); the
        # reaper frees them in slices (big topics alone, small ones in groups).
        pacer = Pacer(self._clock, DEFAULT_WORK_UNIT_MS)  # (one budget through its stepped walks)
        await self._release_replaced(self.image, image, pacer)
        if self.deferred:
            await self.flush()
            self._background_save = asyncio.create_task(self._save_in_background(image, started_ms))
            self._set_image(image)
            self.last_snapshot_apply_s = self._seconds_since(started_ms)
            partitions = await self._partition_count(image, pacer)
            self._log.info("snapshot_loaded", offset=image.offset, partitions=partitions)
            return AppliedChanges()
        changes = await self._partitions.changes_to_paced(await self._local_assignments(image))
        revocations, grants = self._partitions.split(changes)
        if grants.is_empty():
            await self.flush()
            applied = await self._apply_revocations(revocations)
            self._background_save = asyncio.create_task(self._save_in_background(image, started_ms))
        else:
            applied = await self._apply(image, changes)
            self.last_snapshot_store_s = self._seconds_since(started_ms)
        if len(changes.deletes) + len(changes.leaders) + len(changes.followers) >= MIN_ITEMS:
            release_later((changes, applied))
        self._set_image(image)
        self.last_snapshot_apply_s = self._seconds_since(started_ms)
        took_s = round(self.last_snapshot_apply_s, 3)
        partitions = await self._partition_count(image, pacer)
        self._log.info("snapshot_loaded", offset=image.offset, partitions=partitions, took_s=took_s)
        return applied

    async def _release_replaced(
        self, old: MetadataImage, new: MetadataImage, pacer: Pacer | None = None
    ) -> None:
        """Hand the topics of ``old`` that ``new`` does not share, and its topic maps, to the reaper
        (:func:`release_replaced_topics`), looking at :data:`RELEASE_STEP` topics between two looks at
        the work unit's budget: at 100,000 topics the walk was a 10-20 ms stretch.  ``old`` is held
        here throughout, so nothing is freed before the reaper has it."""
        pacer = pacer or Pacer(self._clock, DEFAULT_WORK_UNIT_MS)
        kept = new.topics_by_id
        replaced: list[object] = []
        for index, (topic_id, topic) in enumerate(old.topics_by_id.items(), 1):
            if kept.get(topic_id) is not topic:
                replaced.append(topic)
            if index % RELEASE_STEP == 0:
                release_replaced_topics(replaced)
                replaced = []
                await pacer.tick()
        release_replaced_topics(replaced)
        release_replaced_maps((old.topics_by_id, old.topic_ids_by_name))

    async def _partition_count(self, image: MetadataImage, pacer: Pacer | None = None) -> int:
        """``image.partition_count()`` (for a log line) in steps of :data:`RELEASE_STEP` topics: one walk
        of 100,000 topics was ~10 ms, the longest stretch of a snapshot load once the release was stepped).
        ``pacer``: the caller's, so the turn it is in does not get a fresh budget here.  An image built by a
        delta or loaded from the store knows its count (``partition_total``): no walk at all."""
        if image.partition_total is not None:  # kept by the delta that built it: no walk
            return image.partition_total
        pacer = pacer or Pacer(self._clock, DEFAULT_WORK_UNIT_MS)
        total = 0
        for index, topic in enumerate(image.topics_by_id.values(), 1):
            total += len(topic.partitions)
            if index % RELEASE_STEP == 0:
                await pacer.tick()
        return total

    async def flush(self) -> None:
        """Wait for a background image save (before the next save, and before the store closes)."""
        task, self._background_save = self._background_save, None
        if task is not None:
            await task

    def _seconds_since(self, started_ms: int) -> float:
        return (self._clock.monotonic_ms() - started_ms) / 1000

    async def _save_in_background(self, image: MetadataImage, started_ms: int) -> None:
        try:
            await self._store.save(image)
        except Exception as exc:
            # Not fatal: the store keeps its previous image, and the next save writes every difference.
            if self._metrics is not None:
                self._metrics.metadata_apply_errors.inc()
            self._log.error("image_store_save_failed", offset=image.offset, error=str(exc))
            return
        self.last_snapshot_store_s = self._seconds_since(started_ms)
        self._log.info("snapshot_stored", offset=image.offset, took_s=round(self.last_snapshot_store_s, 3))

    async def _apply_revocations(
        self, revocations: LocalChanges, pacer: Pacer | None = None
    ) -> AppliedChanges:
        try:
            # Paced like grants: deleting thousands of partitions must not stall heartbeats either.
            return await self._partitions.apply_paced(revocations, pacer)
        except Exception:
            if self._metrics is not None:
                self._metrics.metadata_apply_errors.inc()
            raise

    async def _apply(
        self, image: MetadataImage, changes: LocalChanges, pacer: Pacer | None = None
    ) -> AppliedChanges:
        await self.flush()
        revocations, grants = self._partitions.split(changes)
        applied = await self._apply_revocations(revocations, pacer)
        try:
            await self._store.save(image)
            # Paced: a bulk create of thousands of partitions must not stall heartbeats into a fence.
            return applied.then(await self._partitions.apply_paced(grants))
        except Exception:
            if self._metrics is not None:
                self._metrics.metadata_apply_errors.inc()
            raise

    def _set_image(self, image: MetadataImage, last_record_time_ms: int = 0) -> None:
        self.image = image
        self._on_view(ImageMetadataView(image, self._listener))
        if self._metrics is not None:
            self._metrics.last_applied_record_offset.set(image.offset)
            if last_record_time_ms > 0:
                lag_s = max(0.0, (self._clock.wall_ms() - last_record_time_ms) / 1000.0)
                self._metrics.last_applied_record_lag_seconds.set(lag_s)
