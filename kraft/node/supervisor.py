"""Fail-stop supervision of a long-running process (controller or broker), issue #14.

A process that cannot do its job must not linger looking alive: a controller whose Raft driver failed
(fsync/write error, ENOSPC, impossible persisted state) or whose state machine cannot replay committed
data, or a broker whose fetcher or heartbeat task died, exits so that systemd (``Restart=on-failure``)
or an operator acts on it.  One :class:`Supervisor` per process:

- :meth:`Supervisor.watch` — every long-running task of the process (Raft driver, listeners, controller
  tasks, broker lifecycle, fetcher, gRPC server) is watched; an exception, or a return of a task meant to
  run forever, fails the process;
- :meth:`Supervisor.fail` — code that detects a fatal condition itself (the Raft driver's ``on_fatal``)
  reports it; the first report wins;
- :meth:`Supervisor.wait` — the process's main coroutine waits for a stop request or a failure;
- :meth:`Supervisor.fail_stop` — logs exactly one line ``event=fatal reason=<reason> …`` (structured
  key=value, with ``error=``, ``errno=``, ``file=`` when known and ``exit_code=``), runs a bounded
  crash-like cleanup (release the ports; never write a clean-shutdown marker over storage that failed), and
  ends the process with :data:`EXIT_FATAL` through ``os._exit`` — a watchdog thread does that anyway after
  :data:`HARD_DEADLINE_S` even if the event loop is stuck, so the process is gone within a second.

Exit codes of ``kraft controller start`` / ``kraft broker start``: 0 after a clean stop (SIGTERM), 1 when
the process cannot start (one ``error:`` line: config, storage check, registration), :data:`EXIT_FATAL`
(70, ``EX_SOFTWARE`` of sysexits.h) after a fatal error at run time.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno as errno_module
import logging
import os
import sys
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol

from kraft.errors import KraftError
from kraft.observability.logging import StructLogger, get_logger

EXIT_FATAL = 70
"""Exit status after a fatal run-time error (sysexits.h ``EX_SOFTWARE``); see the module docstring."""

CLEANUP_TIMEOUT_S = 0.5
"""How long the crash-like cleanup after a fatal error may take before it is abandoned."""

HARD_DEADLINE_S = 0.9
"""The watchdog's deadline: the process ends by then even if the event loop never runs again."""

FATAL_EVENT = "fatal"


@dataclass(frozen=True, slots=True)
class Failure:
    """Why the process must stop: ``reason`` is a short snake_case token; ``fields`` add detail."""

    reason: str
    fields: dict[str, object] = field(default_factory=dict)


class Watchdog(Protocol):
    def cancel(self) -> None: ...


WatchdogFactory = Callable[[float, Callable[[], None]], Watchdog]
"""``start(deadline_s, fire)``: call ``fire`` after ``deadline_s`` unless cancelled (tests fire by hand)."""


def thread_watchdog(deadline_s: float, fire: Callable[[], None]) -> Watchdog:
    """A daemon timer thread: it runs even while the event loop is blocked in a hung cleanup."""
    timer = threading.Timer(deadline_s, fire)
    timer.daemon = True
    timer.start()
    return timer


def error_fields(error: BaseException) -> dict[str, object]:
    """``error=``, plus ``errno=``/``file=`` from the first OSError in the cause chain (what an operator
    needs: ENOSPC on which file) and ``code=`` for a KraftError."""
    fields: dict[str, object] = {"error": f"{type(error).__name__}: {error}"}
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, KraftError) and "code" not in fields:
            fields["code"] = current.code.name
        if isinstance(current, OSError):
            if current.errno is not None:
                fields["errno"] = errno_module.errorcode.get(current.errno, str(current.errno))
            if current.filename is not None:
                fields["file"] = os.fsdecode(current.filename)
            break
        current = current.__cause__ or current.__context__
    return fields


class Supervisor:
    """Watches a process's tasks and turns the first fatal error into one log line and an exit."""

    def __init__(
        self,
        logger: StructLogger | None = None,
        *,
        exit_process: Callable[[int], NoReturn] = os._exit,
        start_watchdog: WatchdogFactory = thread_watchdog,
        cleanup_timeout_s: float = CLEANUP_TIMEOUT_S,
        hard_deadline_s: float = HARD_DEADLINE_S,
    ) -> None:
        self._log = logger or get_logger("node")
        self._exit = exit_process
        self._start_watchdog = start_watchdog
        self._cleanup_timeout_s = cleanup_timeout_s
        self._hard_deadline_s = hard_deadline_s
        self._failure: Failure | None = None
        self._failed = asyncio.Event()
        self._stopping = False

    @property
    def failure(self) -> Failure | None:
        return self._failure

    @property
    def stopping(self) -> bool:
        return self._stopping

    def begin_stop(self) -> None:
        """A graceful stop began: tasks cancelled or ending from now on are expected."""
        self._stopping = True

    def fail(self, reason: str, error: BaseException | None = None, **fields: object) -> None:
        """Report a fatal condition (the first report wins; later ones are logged at debug)."""
        details: dict[str, object] = dict(fields)
        if error is not None:
            details.update(error_fields(error))
        if self._failure is not None:
            self._log.debug("fatal_already_reported", reason=reason, **details)
            return
        self._failure = Failure(reason, details)
        self._failed.set()

    def watch(self, task: asyncio.Future[Any], name: str, *, forever: bool = True) -> None:
        """Fail when ``task`` raises, or — ``forever`` — when it ends at all outside a graceful stop."""
        task.add_done_callback(lambda t: self._task_done(t, name, forever))

    def _task_done(self, task: asyncio.Future[Any], name: str, forever: bool) -> None:
        if task.cancelled():
            if not self._stopping:
                # Only the owner cancels its tasks, and only while stopping; anything else is a bug.
                self.fail("task_cancelled", task=name)
            return
        error = task.exception()
        if error is not None:
            self.fail("task_failed", error, task=name)
        elif forever and not self._stopping:
            self.fail("task_exited", task=name)

    async def wait(self, stop_requested: Awaitable[object]) -> Failure | None:
        """Wait until ``stop_requested`` completes (→ None) or a failure is reported (→ the failure)."""
        if self._failure is not None:
            if asyncio.iscoroutine(stop_requested):
                stop_requested.close()
            return self._failure
        stop_task = asyncio.ensure_future(stop_requested)
        failed_task = asyncio.ensure_future(self._failed.wait())
        try:
            await asyncio.wait({stop_task, failed_task}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stop_task, failed_task):
                task.cancel()
        return self._failure

    async def fail_stop(self, cleanup: Callable[[], Awaitable[None]] | None = None) -> NoReturn:
        """Log the one ``fatal`` line, run ``cleanup`` (bounded), exit with :data:`EXIT_FATAL`."""
        failure = self._failure or Failure("unknown")
        self._stopping = True
        self._emit(failure)
        watchdog = self._start_watchdog(self._hard_deadline_s, self._hard_exit)
        if cleanup is not None:
            try:
                await asyncio.wait_for(cleanup(), self._cleanup_timeout_s)
            except BaseException as exc:  # the exit below must happen whatever the cleanup does
                self._log.debug("fatal_cleanup_incomplete", error=f"{type(exc).__name__}: {exc}")
        watchdog.cancel()
        self._flush_logs()
        self._exit(EXIT_FATAL)

    def _emit(self, failure: Failure) -> None:
        fields = {"reason": failure.reason, **failure.fields, "exit_code": EXIT_FATAL}
        self._log.error(FATAL_EVENT, **fields)

    def _hard_exit(self) -> None:
        # From the watchdog thread: the loop did not finish the cleanup in time.
        self._flush_logs()
        self._exit(EXIT_FATAL)

    @staticmethod
    def _flush_logs() -> None:
        # Exiting anyway: a broken handler or stream must not block the exit.
        for handler in logging.getLogger().handlers:
            with contextlib.suppress(Exception):
                handler.flush()
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()


def attach_driver(
    supervisor: Supervisor, on_fatal: Callable[[Callable[[str, BaseException], None]], None]
) -> None:
    """Fail the process when the Raft driver reports a fatal error (``RaftDriver.on_fatal``): the driver
    task failed (``raft_driver_failed``) or committed data could not be applied (``raft_listener_failed``)."""
    on_fatal(supervisor.fail)
