"""The active controller's event queue: every state change of the controller logic runs here, one event at
a time, heartbeats first.

Kafka's QuorumController runs each operation as an event on one ``KafkaEventQueue`` thread (the single
writer of the speculative image); ``ControllerEventManager``-era controllers and KafkaEventQueue both
let a caller *prepend* an urgent event, and bulk work continues as further events appended at the tail.
Here one asyncio task plays the thread and two lanes give the order:

- ``URGENT`` — BrokerHeartbeat and RegisterBroker: a broker's session must never wait behind bulk work,
  or it is fenced for the controller's own slowness;
- ``NORMAL`` — everything else: admin requests, session-expiry fencing, idle NoOps, and each *slice* of a
  bulk operation (a CreateTopics part, a chunk of a broker leaving its ISRs, a chunk of unfence
  elections), which enqueues its next slice only after running, so every urgent event that arrived in
  the meantime runs first.

An event is a synchronous function (compute records against the speculative image and append them):
it must be bounded — the bulk paths slice themselves by ``controller.max.work.unit.records`` and
``controller.max.event.time.ms`` (whichever comes first).  Waiting
for commits happens outside the queue, in the caller's task.  After each normal event, and after every
``URGENT_BURST`` urgent ones, the runner yields a loop turn so gRPC intake and Raft run in between.
An urgent event with no urgent one queued skips the runner and runs in the caller's task (:meth:`run`).

Each event is timed on the injected clock (:meth:`ControllerEventQueue.observe`): the shell turns the
durations into the per-kind histogram (Kafka's ``EventQueueProcessingTimeMs``) and the
``controller_event_slow`` log line.

IO-free apart from asyncio; deterministic: the order depends only on the order of :meth:`submit` calls.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from enum import IntEnum
from typing import Any, TypeVar

from kraft.clock import Clock

T = TypeVar("T")

URGENT_BURST = 64
"""Urgent events run back to back at most this many before the runner yields a loop turn."""


class EventPriority(IntEnum):
    URGENT = 0
    NORMAL = 1


@dataclass(slots=True)
class _Event:
    priority: EventPriority
    name: str
    run: Callable[[], Any]
    future: asyncio.Future[Any]


class EventQueueClosedError(Exception):
    """The queue stopped before the event ran."""


class ControllerEventQueue:
    def __init__(self) -> None:
        self._lanes: tuple[deque[_Event], deque[_Event]] = (deque(), deque())
        self._wakeup: asyncio.Future[None] | None = None
        self._task: asyncio.Task[None] | None = None
        self._closed = False
        self.processed: list[str] = []
        """Names of the last events run, oldest first (bounded; tests and debugging read it)."""
        self.history_limit = 1_000
        self._clock: Clock | None = None
        self._on_event: Callable[[str, int], None] | None = None
        self._on_start: Callable[[], None] | None = None

    def observe(
        self,
        clock: Clock,
        on_event: Callable[[str, int], None],
        on_start: Callable[[], None] | None = None,
    ) -> None:
        """Time every event on ``clock``; ``on_start()`` right before each one runs (what else it needs
        to read at the start, e.g. thread CPU), ``on_event(name, duration_ms)`` after it ran."""
        self._clock = clock
        self._on_event = on_event
        self._on_start = on_start

    def __len__(self) -> int:
        return len(self._lanes[0]) + len(self._lanes[1])

    def submit(self, priority: EventPriority, name: str, run: Callable[[], T]) -> asyncio.Future[T]:
        """Queue ``run``; the future gets its result (or exception) once it ran.  Starts the runner task
        on first use (on the running loop)."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._closed:
            future.set_exception(EventQueueClosedError(f"event queue closed ({name})"))
            return future
        self._lanes[priority].append(_Event(priority, name, run, future))
        if self._task is None or self._task.done():
            self._task = loop.create_task(self._run(), name="controller-event-queue")
        wakeup, self._wakeup = self._wakeup, None
        if wakeup is not None and not wakeup.done():
            wakeup.set_result(None)
        return future

    async def run(self, priority: EventPriority, name: str, run: Callable[[], T]) -> T:
        """Submit and wait for the result.

        An urgent event with no other urgent event queued runs at once, in the caller's task: every event
        is a synchronous function on this one loop, so none is half-run while the caller runs, and the
        order is what the queue would give (it would run next, before every normal event).  That saves
        the loop turns of handing it to the runner task and the result back — each as long as whatever
        else runs in that turn (a bulk slice, a commit's replay) — which a heartbeat pays during bulk work
        (re-landed from 481808f after A/B, docs/internals/raft-performance.md; it runs in the caller's
        task, never outside one).
        """
        if priority == EventPriority.URGENT and not self._lanes[EventPriority.URGENT] and not self._closed:
            clock = self._clock
            started_ms = 0 if clock is None else clock.monotonic_ms()
            if self._on_start is not None:
                self._on_start()
            try:
                return run()
            finally:
                self._record(name, clock, started_ms)
        future = self.submit(priority, name, run)
        try:
            return await future
        except asyncio.CancelledError:
            future.cancel()  # the runner skips it
            raise

    def _record(self, name: str, clock: Clock | None, started_ms: int) -> None:
        if clock is not None and self._on_event is not None:
            self._on_event(name, clock.monotonic_ms() - started_ms)
        processed = self.processed
        processed.append(name)
        if len(processed) > self.history_limit:
            del processed[: len(processed) - self.history_limit]

    def _pop(self) -> _Event | None:
        for lane in self._lanes:
            while lane:
                event = lane.popleft()
                if not event.future.done():
                    return event
        return None

    async def _run(self) -> None:
        urgent_run = 0
        while True:
            event = self._pop()
            if event is None:
                self._wakeup = asyncio.get_running_loop().create_future()
                await self._wakeup
                continue
            clock = self._clock
            started_ms = 0 if clock is None else clock.monotonic_ms()
            if self._on_start is not None:
                self._on_start()
            try:
                result = event.run()
            except Exception as exc:  # the caller's error (KraftError, NotControllerError, ...)
                event.future.set_exception(exc)
            else:
                event.future.set_result(result)
            self._record(event.name, clock, started_ms)
            urgent_run = urgent_run + 1 if event.priority == EventPriority.URGENT else URGENT_BURST
            if urgent_run >= URGENT_BURST:
                urgent_run = 0
                await asyncio.sleep(0)

    async def close(self) -> None:
        """Fail every queued event and stop the runner."""
        self._closed = True
        for lane in self._lanes:
            while lane:
                event = lane.popleft()
                if not event.future.done():
                    event.future.set_exception(EventQueueClosedError(f"event queue closed ({event.name})"))
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
