"""The event loop long-running kraft processes (controllers, brokers) run on.

uvloop by default: grpc.aio's per-message cost is dominated by event-loop scheduling (callbacks, futures,
task switches), and uvloop halves much of it — measured here, a bare grpc.aio unary server went from
6,300 to 9,200 calls/s with 64 callers, and the 3-controller quorum committed ~20 % more single-record
writes/s at 64 clients (docs/internals/raft-performance.md).  ``KRAFT_EVENT_LOOP=asyncio`` selects the
standard loop (e.g. to rule uvloop out when chasing a bug); an unknown value is an error, not a guess.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOP_ENV = "KRAFT_EVENT_LOOP"
LOOPS = ("uvloop", "asyncio")


class EventLoopChoiceError(ValueError):
    """``$KRAFT_EVENT_LOOP`` names no loop kraft knows."""


def loop_factory(choice: str | None = None) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The factory for ``choice`` (default: ``$KRAFT_EVENT_LOOP``, else uvloop); None = asyncio's own."""
    name = (choice if choice is not None else os.environ.get(EVENT_LOOP_ENV, "")).strip() or "uvloop"
    if name not in LOOPS:
        raise EventLoopChoiceError(f"{EVENT_LOOP_ENV}={name!r}: must be one of {', '.join(LOOPS)}")
    if name == "asyncio":
        return None
    try:
        import uvloop
    except ImportError:  # a platform without uvloop wheels: the standard loop still works
        return None
    factory: Callable[[], asyncio.AbstractEventLoop] = uvloop.new_event_loop
    return factory


def run_server(main: Coroutine[Any, Any, T]) -> T:
    """Run a process's main coroutine to completion on the selected loop."""
    try:
        factory = loop_factory()
    except EventLoopChoiceError:
        main.close()  # never started: do not leave a "coroutine was never awaited" warning behind
        raise
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio`` — for the startup log line."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
