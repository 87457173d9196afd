"""Store writer: keeps the aiosqlite image store (``metadata-image.sqlite``) close to the committed image.

Saves run in their own task, never on the commit path, at most one per ``STORE_MIN_INTERVAL_MS``: during
bulk writes one save covers many batches (the store only shortens a restart's replay; the Raft log stays
the source of truth).

Fail-stop (issue #14): a store that cannot be opened or written (``database or disk is full``, an I/O
error) is a disk the controller can no longer trust, next to its metadata log: :meth:`StoreWriter.open`
and :meth:`StoreWriter.run` report it to ``on_fatal`` (the node's supervisor: one ``event=fatal
reason=image_store_write_failed op=open|save …`` line, exit 70) instead of retrying while the process looks
alive. Without ``on_fatal`` (unit tests, the simulation) the error ends :meth:`run` with the exception.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from kraft.metadata.image import MetadataImage
from kraft.metadata.store import SqliteImageStore, storage_error_fields
from kraft.metadata.timers import Timers
from kraft.observability.logging import StructLogger
from kraft.observability.metrics import ControllerMetrics

STORE_MIN_INTERVAL_MS = 500

IMAGE_STORE_FATAL = "image_store_write_failed"
"""The ``reason=`` of the fatal line when the image store cannot be opened or written."""


class FatalReporter(Protocol):
    """Reports a fatal condition to the process (``Supervisor.fail``): one ``event=fatal`` line, exit 70."""

    def __call__(self, reason: str, error: BaseException | None = None, **fields: object) -> None: ...


class StoreWriter:
    def __init__(
        self,
        path: Path | None,
        timers: Timers,
        committed: Callable[[], MetadataImage],
        *,
        metrics: ControllerMetrics,
        log: StructLogger,
        on_fatal: FatalReporter | None = None,
    ) -> None:
        self._path = path
        self._timers = timers
        self._committed = committed
        self._metrics = metrics
        self._log = log
        self._on_fatal = on_fatal
        self._store: SqliteImageStore | None = None
        self._dirty = asyncio.Event()

    async def open(self) -> MetadataImage | None:
        """Open the store and return the image it holds (None without a store path).  A store that cannot
        be opened or read for a storage failure is fatal (reported, then raised)."""
        if self._path is None:
            return None
        try:
            self._store = await SqliteImageStore.open(self._path, clock=self._timers.clock)
            return await self._store.load()
        except Exception as exc:
            self._fatal("open", exc, offset=None)
            raise

    @property
    def is_open(self) -> bool:
        """A store is open (a store path was given and :meth:`open` succeeded; until :meth:`close`)."""
        return self._store is not None

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
            if image.transaction:
                # Never inside a metadata transaction: loaded after a restart, the image would lack the
                # open transaction (its Begin is below the stored offset).  The commit closing it marks
                # the store dirty again.
                continue
            started_ms = self._timers.now_ms()
            try:
                await store.save(image)
            except Exception as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    # stop() cancelled the save and SqliteImageStore.save's ROLLBACK raised in place of the
                    # CancelledError: stop, or stop() waits for this task forever (flaky restart test).
                    raise asyncio.CancelledError from exc
                self._fatal("save", exc, offset=image.offset)
                if self._on_fatal is None:
                    raise
                return  # the supervisor stops the process; nothing more is written
            await self._timers.sleep_until(started_ms + STORE_MIN_INTERVAL_MS)

    def _fatal(self, op: str, error: Exception, *, offset: int | None) -> None:
        self._metrics.metadata_errors.inc()
        if self._on_fatal is None:
            return
        fields: dict[str, object] = {"op": op, **storage_error_fields(error)}
        if offset is not None:
            fields["offset"] = offset
        fields["file"] = str(self._path)  # error_fields() overrides it with an OSError's own file name
        self._on_fatal(IMAGE_STORE_FATAL, error, **fields)

    async def close(self) -> None:
        """A last save of the committed image (best effort), then close; call after :meth:`run` ended."""
        if self._store is None:
            return
        image = self._committed()
        if not image.transaction:
            with contextlib.suppress(Exception):
                await self._store.save(image)
        await self._store.close()
        self._store = None
