"""Store writer: keeps the aiosqlite image store (``metadata-image.sqlite``) close to the committed image.

Saves run in their own task, never on the commit path, at most one per ``STORE_MIN_INTERVAL_MS``: during
bulk writes one save covers many batches (the store only shortens a restart's replay; the Raft log stays
the source of truth).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path

from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore
from kraft.metadata.timers import Timers
from kraft.observability.logging import StructLogger
from kraft.observability.metrics import ControllerMetrics

STORE_MIN_INTERVAL_MS = 500
STORE_RETRY_MS = 1_000


class StoreWriter:
    def __init__(
        self,
        path: Path | None,
        timers: Timers,
        committed: Callable[[], MetadataImage],
        *,
        metrics: ControllerMetrics,
        log: StructLogger,
    ) -> None:
        self._path = path
        self._timers = timers
        self._committed = committed
        self._metrics = metrics
        self._log = log
        self._store: SqliteImageStore | None = None
        self._dirty = asyncio.Event()

    async def open(self) -> MetadataImage | None:
        """Open the store and return the image it holds (None without a store path)."""
        if self._path is None:
            return None
        self._store = await SqliteImageStore.open(self._path, clock=self._timers.clock)
        return await self._store.load()

    def mark_dirty(self) -> None:
        """The committed image changed."""
        self._dirty.set()

    async def run(self) -> None:
        store = self._store
        if store is None:
            return
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            image = self._committed()
            started_ms = self._timers.now_ms()
            try:
                await store.save(image)
            except Exception as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # stop() cancelled the save and SqliteImageStore.save's ROLLBACK raised in place of the
                    # CancelledError: stop, or stop() waits for this task forever (flaky restart test).
                    raise asyncio.CancelledError from exc
                self._metrics.metadata_errors.inc()
                self._log.error("image_store_save_failed", offset=image.offset, error=str(exc))
                await self._timers.sleep_ms(STORE_RETRY_MS)
                self._dirty.set()
            await self._timers.sleep_until(started_ms + STORE_MIN_INTERVAL_MS)

    async def close(self) -> None:
        """A last save of the committed image (best effort), then close; call after :meth:`run` ended."""
        if self._store is None:
            return
        with contextlib.suppress(Exception):
            await self._store.save(self._committed())
        await self._store.close()
        self._store = None
