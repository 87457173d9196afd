"""Publishes committed metadata to the broker: partition logs, image store, client view — in that order.

One publish step = apply the delta's local changes to the partition logs, then store the new image and
its offset in the image store (one transaction), then swap the image the BrokerService answers from.
Changing the partition logs *before* committing the image is what makes a crash in between harmless: on
restart the old image and offset come back, the same records are fetched again and re-applying them to
the partition logs is idempotent (see :mod:`kraft.broker.partitions`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from kraft.broker.image_adapter import ImageMetadataView, local_assignments, to_local_changes
from kraft.broker.partitions import AppliedChanges, PartitionManager
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.observability.logging import get_logger
from kraft.observability.metrics import BrokerMetrics


class ImageStore(Protocol):
    """Persistence of the applied image (:class:`kraft.metadata.store.ImageStore` implements it)."""

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
    ) -> None:
        self.broker_id = broker_id
        self._partitions = partitions
        self._store = store
        self._listener = listener
        self._on_view = on_view
        self._metrics = metrics
        self.image = MetadataImage.empty()
        self._log = get_logger("broker.publisher", node=broker_id)

    @property
    def offset(self) -> int:
        return self.image.offset

    async def start(self) -> MetadataImage:
        """Load the stored image and make the partition logs match it (finishing an interrupted step)."""
        image = await self._store.load()
        self._partitions.load()
        self._partitions.reconcile(local_assignments(image, self.broker_id))
        self._set_image(image)
        self._log.info("image_loaded", offset=image.offset, partitions=image.partition_count())
        return image

    async def publish(self, delta: MetadataDelta, last_record_time_ms: int = 0) -> AppliedChanges:
        """Apply one delta built on :attr:`image` (the caller checked it is not mid-transaction)."""
        image = delta.apply()
        try:
            applied = self._partitions.apply(to_local_changes(delta.local_changes(self.broker_id)))
            await self._store.save(image)
        except Exception:
            if self._metrics is not None:
                self._metrics.metadata_apply_errors.inc()
            raise
        self._set_image(image, last_record_time_ms)
        return applied

    async def load_snapshot(self, image: MetadataImage) -> AppliedChanges:
        """Replace everything with a snapshot's image (the broker was below the log start)."""
        applied = self._partitions.reconcile(local_assignments(image, self.broker_id))
        await self._store.save(image)
        self._set_image(image)
        self._log.info("snapshot_loaded", offset=image.offset, partitions=image.partition_count())
        return applied

    def _set_image(self, image: MetadataImage, last_record_time_ms: int = 0) -> None:
        self.image = image
        self._on_view(ImageMetadataView(image, self._listener))
        if self._metrics is not None:
            self._metrics.last_applied_record_offset.set(image.offset)
            if last_record_time_ms > 0:
                lag_s = max(0.0, time.time() - last_record_time_ms / 1000.0)
                self._metrics.last_applied_record_lag_seconds.set(lag_s)
