"""Store writer: keeps the aiosqlite image store (``metadata-image.sqlite``) close to the committed image.

Saves run in their own task, never on the commit path, at most one per ``STORE_MIN_INTERVAL_MS``: during
bulk writes one save covers many batches (the store only shortens a restart's replay; the Raft log stays
the source of truth).

While the committed log moves at a bulk rate (at least ``STORE_BULK_RECORDS_PER_S``, measured over the
interval since the last save or check) a save waits, for at most ``max_defer_ms``
(``controller.image.store.bulk.defer.max.ms``, default ``STORE_MAX_DEFER_MS``) after the last one started
(issue #17, session 15).  Coalescing alone saves nothing there: a controlled shutdown or a
100k-partition creation changes each partition once, so every save writes every partition changed since
the last, and the SQLite thread's ~6-9 µs per row (its Python row building holds the GIL) took 0.6-0.9
CPU-s on each controller during a 106k-leadership shutdown on 2 cores, ~20 % of the host's CPU in that
window.  Deferred, the same rows are written once the bulk work has ended (or every 10 s during a longer
stream: a restart replays at most that much more log).

Staggered (session 16): measured end to end, with every controller saving as soon as its own log went quiet
the active controller saved ~100,000 rows (0.6 CPU-s, ~1.9 s) in the half-second gap between two bulk
CreateTopics requests, inside the bulk work, and the three controllers' after-bulk saves (0.5-1.1 CPU-s
each) overlapped.  Now a save that waited starts only once the log has stayed quiet for its slot times
``stagger_ms`` (``controller.image.store.bulk.save.stagger.ms``): the followers at slots 0 and 1, the active
controller at slot 2 (:func:`save_slot`); the cap is staggered alike.  Each such save logs one
``image_store_saved`` line (why it ran then, rows, wall and SQLite-thread CPU, slot).

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
STORE_BULK_RECORDS_PER_S = 5_000
"""A committed-record rate at or above which a save waits (bulk work: a controlled shutdown commits
~15,000-20,000 records a second on 2 cores, a bulk creation ~10,000-20,000; 16 clients' admin ops ~1,500)."""
STORE_MAX_DEFER_MS = 10_000
"""The longest a save waits for bulk work to end, from the last save's start, by default
(``controller.image.store.bulk.defer.max.ms``; 0 = saves never wait)."""

STORE_BULK_STAGGER_MS = 3_000
"""After bulk work, how much longer each later slot's save waits for the log to stay quiet, by default
(``controller.image.store.bulk.save.stagger.ms``; 0 = every controller saves once its log is quiet).  Longer
than one large save takes (~1.4-2.4 s of wall time for ~220,000 rows on 2 cores): each slot counts from its
own node's quiet, and a follower's quiet comes 0-1 s after the leader's, so with 1,000 ms the three saves
still overlapped in 5 of 5 end-to-end runs (after-bulk heartbeat p99 71-111 ms); with 3,000 they ran one
after another in 2 of 2 (5.7-7.2 ms).  raft-performance.md, "End to end after session 16"."""
STORE_LEADER_SLOT = 2
"""The active controller's slot: after both followers of a 3-voter quorum (slots 0 and 1)."""
SAVE_LOG_ROWS = 10_000
"""A save writing at least this many rows is logged at info (``image_store_saved``), waited or not."""

SAVE_INTERVAL = "interval"
"""``why=`` of a save that did not wait for bulk work (at most one per ``STORE_MIN_INTERVAL_MS``)."""
SAVE_BULK_ENDED = "bulk_ended"
"""``why=`` of a save that waited for bulk work to end (and for its slot's stagger)."""
SAVE_DEFER_MAX = "defer_max"
"""``why=`` of a save that waited ``max_defer_ms`` (plus its stagger) while bulk work went on."""

IMAGE_STORE_FATAL = "image_store_write_failed"
"""The ``reason=`` of the fatal line when the image store cannot be opened or written."""


def save_slot(node_id: int, leader_id: int | None) -> int:
    """A controller's place among the quorum's deferred saves after bulk work: the Raft leader last
    (:data:`STORE_LEADER_SLOT`: its loop answers the brokers' heartbeats), the followers by id after the
    leader's, modulo 3 — 0 and 1 for three consecutive ids, whichever leads (larger or scattered ids may
    share a slot: a spread, not a schedule); 0 while no leader is known."""
    if leader_id is None:
        return 0
    if leader_id == node_id:
        return STORE_LEADER_SLOT
    return (node_id - leader_id - 1) % (STORE_LEADER_SLOT + 1)


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
        max_defer_ms: int = STORE_MAX_DEFER_MS,
        save_pause_percent: int = 0,
        stagger_ms: int = STORE_BULK_STAGGER_MS,
        save_slot: Callable[[], int] = lambda: 0,
    ) -> None:
        self._path = path
        self._timers = timers
        self._committed = committed
        self._metrics = metrics
        self._log = log
        self._on_fatal = on_fatal
        self._max_defer_ms = max_defer_ms
        self._save_pause_percent = save_pause_percent
        self._stagger_ms = stagger_ms
        self._save_slot = save_slot
        """This node's place among the quorum's deferred saves (0 first; the active controller last)."""
        self._store: SqliteImageStore | None = None
        self._dirty = asyncio.Event()
        # (committed offset, clock ms) at the last save's start or the last rate check: the rate of
        # committed records since then decides whether the next save waits
        self._mark = (-1, timers.now_ms())
        self._last_save_ms = timers.now_ms()  # (before the first save: since the writer was made)
        self._saved_offset = -1  # the offset the last save (or the loaded store) holds

    async def open(self) -> MetadataImage | None:
        """Open the store and return the image it holds (None without a store path).  A store that cannot
        be opened or read for a storage failure is fatal (reported, then raised)."""
        if self._path is None:
            return None
        try:
            self._store = await SqliteImageStore.open(self._path, clock=self._timers.clock)
            self._store.pause_ratio = self._save_pause_percent / 100
            loaded = await self._store.load()
            self._saved_offset = loaded.offset
            return loaded
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
            asked_ms = self._timers.now_ms()
            why = await self._wait_for_quiet()
            self._dirty.clear()  # commits while deferred: in the image read next
            image = self._committed()
            if image.transaction:
                # Never inside a metadata transaction: loaded after a restart, the image would lack the
                # open transaction (its Begin is below the stored offset).  The commit closing it marks
                # the store dirty again.
                continue
            started_ms = self._timers.now_ms()
            self._mark, self._last_save_ms = (image.offset, started_ms), started_ms
            cpu_before = store.thread_cpu_s()
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
            self._report(store, image, why, asked_ms, started_ms, cpu_before)
            await self._timers.sleep_until(started_ms + STORE_MIN_INTERVAL_MS)

    def _report(
        self,
        store: SqliteImageStore,
        image: MetadataImage,
        why: str,
        asked_ms: int,
        started_ms: int,
        cpu_before: float | None,
    ) -> None:
        """One ``image_store_saved`` line for a save that waited for bulk work or wrote many rows (debug
        for the others: at most two a second): where the saves' CPU lands against bulk work is what
        decides how they are scheduled (issue #17, session 16)."""
        rows = store.last_save_rows
        level = self._log.info if why != SAVE_INTERVAL or rows >= SAVE_LOG_ROWS else self._log.debug
        cpu_after = store.thread_cpu_s()
        cpu_ms = None if cpu_before is None or cpu_after is None else round((cpu_after - cpu_before) * 1000)
        level(
            "image_store_saved",
            offset=image.offset,
            records=image.offset - self._saved_offset,
            rows=rows,
            why=why,
            waited_ms=started_ms - asked_ms,
            ms=self._timers.now_ms() - started_ms,
            cpu_ms=cpu_ms,
            slot=self._save_slot(),
            start_mono_ms=started_ms,
        )
        self._saved_offset = image.offset

    async def _wait_for_quiet(self) -> str:
        """Return why the save runs now: at once (:data:`SAVE_INTERVAL`) unless the committed log moved at
        ``STORE_BULK_RECORDS_PER_S`` or more since the last mark (checked every ``STORE_MIN_INTERVAL_MS``);
        after bulk work once the log has been below that rate for this node's slot times ``stagger_ms``
        (:data:`SAVE_BULK_ENDED`); or ``max_defer_ms`` plus the same stagger after the last save started
        (:data:`SAVE_DEFER_MAX`).  With ``max_defer_ms`` 0 at once, whatever the rate.

        The stagger (session 16): after bulk work each controller's deferred save writes ~120,000-230,000
        rows (0.5-1.1 CPU-s); all at once on a shared host that is a burst the active controller's
        heartbeat answers feel, and without the stagger the active controller also saved in the half-second
        gap between two bulk requests.  Slots order the saves by role (followers 0 and 1, the active
        controller 2), each counted from the node's *own* quiet: a follower's replay lags the commits by
        seconds after bulk work, so in practice the saves are spread rather than strictly ordered.  The cap
        is staggered the same way, or the saves it forces land together mid-stream."""
        timers = self._timers
        waited = False
        quiet_since_ms: int | None = None
        while True:
            now_ms = timers.now_ms()
            offset = self._committed().offset
            mark_offset, mark_ms = self._mark
            elapsed_ms = now_ms - mark_ms
            if elapsed_ms < STORE_MIN_INTERVAL_MS:
                # too short to tell a rate (a clock that does not move, as in unit tests: after a save
                # the writer sleeps the minimum interval first): saved as before
                return SAVE_INTERVAL
            self._mark = (offset, now_ms)
            bulk = (offset - mark_offset) * 1000 >= STORE_BULK_RECORDS_PER_S * elapsed_ms
            if not waited and (not bulk or self._max_defer_ms <= 0):
                return SAVE_INTERVAL
            waited = True
            stagger_ms = self._stagger_ms * self._save_slot()
            if bulk:
                quiet_since_ms = None
            else:
                if quiet_since_ms is None:
                    quiet_since_ms = mark_ms  # below the rate since the last mark
                if now_ms - quiet_since_ms >= stagger_ms:
                    return SAVE_BULK_ENDED
            if now_ms >= self._last_save_ms + self._max_defer_ms + stagger_ms:
                return SAVE_DEFER_MAX
            await timers.sleep_until(now_ms + STORE_MIN_INTERVAL_MS)

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
