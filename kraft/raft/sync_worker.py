"""One worker thread for the driver's log fsyncs, without the default executor's hand-offs.

``asyncio.to_thread`` costs, per call, a copied context, a ``functools.partial``, a
``concurrent.futures.Future`` and its wrapping asyncio future with their callbacks — measured on uvloop
~25 µs of the event-loop thread's CPU and ~46 µs of wall time per round trip for a call that does
nothing, against ~13 µs and ~29 µs for a plain queue into one dedicated thread whose result comes back
with one ``call_soon_threadsafe`` (docs/internals/raft-performance.md, "Session 11").  A leader pays it
once per batch, and a follower once per Fetch answer with records — on a lone write's critical path
(append, fsync, next Fetch).

Only the driver task uses it, and it awaits each call before the next (the log's one-flush-at-a-time
rule), so one thread suffices and calls run in submission order.  The thread is a daemon: a process that
exits with a flush in flight acknowledged nothing for it (acknowledgement waits for the result).
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from kraft.observability.thread_names import named_target

T = TypeVar("T")

_Job = tuple[Callable[[], Any], "asyncio.Future[Any]", asyncio.AbstractEventLoop]


def _settle(future: asyncio.Future[Any], result: object, error: BaseException | None) -> None:
    if future.done():  # the awaiting task was cancelled (the driver stopped): nobody wants it
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)


class SyncWorker:
    """Runs blocking calls (the log's fsync) on one thread, in order, and resolves an asyncio future on
    the caller's loop with each result or exception."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False

    def run(self, call: Callable[[], T]) -> asyncio.Future[T]:
        """``call()`` on the worker thread; the future (on the running loop) gets its outcome."""
        if self._stopped:
            raise RuntimeError(f"{self._name} is stopped")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._thread is None:
            work = named_target(self._name, self._work)
            self._thread = threading.Thread(target=work, name=self._name, daemon=True)
            self._thread.start()
        self._jobs.put((call, future, loop))
        return future

    def stop(self) -> None:
        """Let the thread end once the calls already queued ran (never blocks)."""
        if not self._stopped:
            self._stopped = True
            self._jobs.put(None)

    def join(self, timeout_s: float) -> bool:
        """Wait (blocking) for the thread to end after :meth:`stop`; True if it did (or never started)."""
        thread = self._thread
        if thread is None:
            return True
        thread.join(timeout_s)
        return not thread.is_alive()

    def _work(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            call, future, loop = job
            result: object = None
            error: BaseException | None = None
            try:
                result = call()
            except BaseException as exc:  # handed to the awaiting driver task, which decides (fail-stop)
                error = exc
            # RuntimeError: the loop is closed; its driver is gone and awaits nothing.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(_settle, future, result, error)
