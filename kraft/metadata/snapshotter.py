"""Snapshotter: a Raft snapshot of the committed image every ``snapshot_max_bytes`` bytes of committed
records or every ``snapshot_interval_ms`` (checked at each commit); Raft may then delete the log below it.
At most one snapshot is written at a time, in its own task, yielding every ``YIELD_EVERY_RECORDS``.

Fail-stop (issue #14, as Kafka's controller treats a snapshot generation fault): a snapshot that cannot be
written for a storage failure (``ENOSPC``, an I/O error on the ``.checkpoint`` file) is reported to
``on_fatal`` — one ``event=fatal reason=snapshot_write_failed …`` line, exit 70.  Without ``on_fatal``
(unit tests, the simulation), and for any other error (a snapshot id Raft no longer accepts), it is
logged (``snapshot_failed``) and the next due snapshot tries again."""

from __future__ import annotations

import asyncio

from kraft.clock import Clock
from kraft.metadata.controller_state import YIELD_EVERY_RECORDS
from kraft.metadata.image import MetadataImage
from kraft.metadata.image_records import image_values
from kraft.metadata.store import is_storage_failure
from kraft.metadata.store_writer import FatalReporter
from kraft.observability.logging import StructLogger
from kraft.observability.metrics import ControllerMetrics
from kraft.raft.api import RaftClient, RaftError

SNAPSHOT_FATAL = "snapshot_write_failed"
"""The ``reason=`` of the fatal line when a metadata snapshot cannot be written."""


class Snapshotter:
    def __init__(
        self,
        raft: RaftClient,
        clock: Clock,
        *,
        max_bytes: int,
        interval_ms: int,
        metrics: ControllerMetrics,
        log: StructLogger,
        on_fatal: FatalReporter | None = None,
    ) -> None:
        self._raft = raft
        self._on_fatal = on_fatal
        self._clock = clock
        self._max_bytes = max_bytes
        self._interval_ms = interval_ms
        self._metrics = metrics
        self._log = log
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = clock.monotonic_ms()
        self.task: asyncio.Task[None] | None = None

    def count_committed(self, value_bytes: int) -> None:
        self._bytes_since_snapshot += value_bytes

    def forget_counted(self) -> None:
        """A snapshot was loaded: what was counted before it is in there."""
        self._bytes_since_snapshot = 0

    def maybe_snapshot(self, image: MetadataImage) -> None:
        """Start a snapshot of ``image`` (just committed) if one is due and none is being written."""
        if (self.task is not None and not self.task.done()) or image.transaction:
            return  # (never inside a metadata transaction: a reader of the snapshot would miss its Begin)
        now = self._clock.monotonic_ms()
        due_bytes = self._bytes_since_snapshot >= self._max_bytes
        due_time = self._bytes_since_snapshot > 0 and now - self._last_snapshot_ms >= self._interval_ms
        if not (due_bytes or due_time):
            return
        self._bytes_since_snapshot = 0
        self._last_snapshot_ms = now
        self.task = asyncio.get_running_loop().create_task(self._snapshot(image))

    async def _snapshot(self, image: MetadataImage) -> None:
        try:
            writer = self._raft.create_snapshot(image.offset + 1, image.epoch, self._clock.wall_ms())
        except (ValueError, RaftError) as exc:
            self._log.warning("snapshot_skipped", end_offset=image.offset + 1, error=str(exc))
            return
        try:
            chunk: list[bytes] = []
            for value in image_values(image):
                chunk.append(value)
                if len(chunk) >= YIELD_EVERY_RECORDS:
                    writer.append(chunk)
                    chunk = []
                    await asyncio.sleep(0)
            if chunk:
                writer.append(chunk)
            snapshot_id = await writer.freeze()
            self._log.info("snapshot_written", end_offset=snapshot_id.end_offset, epoch=snapshot_id.epoch)
        except Exception as exc:
            self._failed(image, exc)
        finally:
            try:
                await writer.close()
            except Exception as exc:  # deleting the unfinished file failed: the disk is failing too
                self._failed(image, exc)

    def _failed(self, image: MetadataImage, error: Exception) -> None:
        self._metrics.metadata_errors.inc()
        if self._on_fatal is not None and is_storage_failure(error):
            self._on_fatal(SNAPSHOT_FATAL, error, end_offset=image.offset + 1)
        else:
            self._log.error("snapshot_failed", end_offset=image.offset + 1, error=str(error))
