"""The event loop and the gRPC I/O layer long-running kraft processes (controllers, brokers) run on.

uvloop by default: grpc.aio's per-message cost is dominated by event-loop scheduling (callbacks, futures,
task switches), and uvloop halves much of it — measured here, a bare grpc.aio unary server went from
6,300 to 9,200 calls/s with 64 callers, and the 3-controller quorum committed ~20 % more single-record
writes/s at 64 clients (docs/internals/raft-performance.md).  ``KRAFT_EVENT_LOOP=asyncio`` selects the
standard loop (e.g. to rule uvloop out when chasing a bug); an unknown value is an error, not a guess.

gRPC's I/O layer: grpcio ≥ 1.80 runs Python gRPC on EventEngine, whose reads and writes hop through its
own poller and worker threads before grpc.aio's completion-queue thread wakes the event loop.  gRPC's
epoll-based iomgr (still built in, selected by turning the EventEngine experiments off) does that I/O on
the completion-queue thread itself.  Measured here (docs/internals/raft-performance.md): iomgr halves a
grpc.aio stream round trip on loopback (0.20 → 0.10 ms) and cuts the quorum's 1-client commit p50 by
~15 %, but a busy active controller serves about half as many broker heartbeats during bulk metadata work
(measured with 1,000 brokers; EventEngine's own threads presumably keep the sockets moving while
the loop is busy).  Heartbeats are the
controller's job, so EventEngine stays the default and ``KRAFT_GRPC_IO=iomgr`` is the opt-in latency
profile; an operator's own ``GRPC_EXPERIMENTS`` always wins.  gRPC reads the choice once, at import, so
:func:`configure_grpc_io` runs first thing in the ``kraft`` command (``kraft/cli/__init__.py``), and the
children it spawns inherit the environment.
"""

from __future__ import annotations

import asyncio
import faulthandler
import itertools
import os
import signal
import sys
from collections.abc import Callable, Coroutine, MutableMapping, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

EVENT_LOOP_ENV = "KRAFT_EVENT_LOOP"
LOOPS = ("uvloop", "asyncio")

GRPC_IO_ENV = "KRAFT_GRPC_IO"
GRPC_IOS = ("iomgr", "event-engine")
GRPC_EXPERIMENTS_ENV = "GRPC_EXPERIMENTS"
IOMGR_EXPERIMENTS = "-event_engine_client,-event_engine_listener,-event_engine_for_all_other_endpoints"
"""The EventEngine experiments whose absence puts gRPC's TCP clients, listeners and endpoints on iomgr."""

_grpc_io_effective: str | None = None
"""What :func:`configure_grpc_io` found or chose for this process (None = it has not run)."""


class RuntimeChoiceError(ValueError):
    """An environment variable selecting part of the process runtime names no choice kraft knows."""


class EventLoopChoiceError(RuntimeChoiceError):
    """``$KRAFT_EVENT_LOOP`` names no loop kraft knows."""


class GrpcIoChoiceError(RuntimeChoiceError):
    """``$KRAFT_GRPC_IO`` names no gRPC I/O layer kraft knows."""


def _grpc_io_choice(environ: MutableMapping[str, str]) -> str:
    name = environ.get(GRPC_IO_ENV, "").strip() or "event-engine"
    if name not in GRPC_IOS:
        raise GrpcIoChoiceError(f"{GRPC_IO_ENV}={name!r}: must be one of {', '.join(GRPC_IOS)}")
    return name


def configure_grpc_io(environ: MutableMapping[str, str] | None = None) -> str:
    """Select gRPC's I/O layer for this process (and the children it spawns) from ``$KRAFT_GRPC_IO``;
    with ``environ``, edit that mapping instead (the environment of a child process to be started).

    Call before anything imports ``grpc``.  Never raises (it runs at import time of the ``kraft`` command):
    a bad ``$KRAFT_GRPC_IO`` changes nothing here and is reported by :func:`run_server`.  Returns what this
    process runs on: ``iomgr``, ``event-engine``, or ``GRPC_EXPERIMENTS=…`` when the operator set that.
    """
    global _grpc_io_effective
    env = os.environ if environ is None else environ
    own = env.get(GRPC_EXPERIMENTS_ENV)
    if (own is not None and own != IOMGR_EXPERIMENTS) or (environ is None and "grpc" in sys.modules):
        effective = _running_on(own)  # the operator's own experiments, or too late to choose
    else:
        try:
            choice = _grpc_io_choice(env)
        except GrpcIoChoiceError:
            choice = "unknown"  # changes nothing; run_server refuses to start anyway
        if choice == "iomgr":
            env[GRPC_EXPERIMENTS_ENV] = IOMGR_EXPERIMENTS
        elif own == IOMGR_EXPERIMENTS and env.get(GRPC_IO_ENV, "").strip() == "event-engine":
            del env[GRPC_EXPERIMENTS_ENV]  # inherited from a parent that chose iomgr; this one did not
        effective = _running_on(env.get(GRPC_EXPERIMENTS_ENV))
    if environ is None:
        _grpc_io_effective = effective
    return effective


GRPC_VERBOSITY_ENV = "GRPC_VERBOSITY"
KRAFT_GRPC_VERBOSITY_ENV = "KRAFT_GRPC_VERBOSITY_DEFAULT"
"""The ``GRPC_VERBOSITY`` kraft itself chose for this process; a child that finds the two equal knows the
value is its parent's default, not the operator's, and chooses its own."""
NODE_GRPC_VERBOSITY = "ERROR"
CLI_GRPC_VERBOSITY = "NONE"
_NODE_ROLES = frozenset({"controller", "broker"})


def is_node_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` runs a node (``kraft controller start …``, ``kraft broker start …``)."""
    return any(role in _NODE_ROLES and after == "start" for role, after in itertools.pairwise(argv[1:]))


def configure_grpc_logging(argv: Sequence[str], environ: MutableMapping[str, str] | None = None) -> str:
    """Choose gRPC's C-core log level (``GRPC_VERBOSITY``, read once when grpc is imported) for the
    ``kraft`` command about to run; returns it.

    gRPC's default writes INFO lines on stderr — among them one ``Handshake failed …`` line per refused
    TLS handshake, which anyone who can reach an mTLS port can repeat without limit (a log growth attack).
    A node (``controller start``/``broker start``) runs at ``ERROR``: the handshake lines (INFO) go, the
    core's real errors still reach the node's log.  Every other command runs at ``NONE``: kraft reports its
    failures itself in one line (the core would add e.g. ``add_port.cc:83] Failed to add port …`` before
    it).  An operator's own ``GRPC_VERBOSITY`` (e.g. ``debug``) always wins; a value this function set in
    a parent process (``kraft cluster up`` spawning nodes) does not count as the operator's.
    """
    env = os.environ if environ is None else environ
    own = env.get(GRPC_VERBOSITY_ENV)
    if own is not None and env.get(KRAFT_GRPC_VERBOSITY_ENV) != own:
        return own
    chosen = NODE_GRPC_VERBOSITY if is_node_command(argv) else CLI_GRPC_VERBOSITY
    env[GRPC_VERBOSITY_ENV] = env[KRAFT_GRPC_VERBOSITY_ENV] = chosen
    return chosen


def grpc_io_name() -> str:
    """The gRPC I/O layer this process runs on — for the startup log line."""
    if _grpc_io_effective is not None:
        return _grpc_io_effective
    return _running_on(os.environ.get(GRPC_EXPERIMENTS_ENV))


def _running_on(grpc_experiments: str | None) -> str:
    if grpc_experiments == IOMGR_EXPERIMENTS:
        return "iomgr"
    return f"{GRPC_EXPERIMENTS_ENV}={grpc_experiments}" if grpc_experiments else "event-engine"


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


def check_choices() -> Callable[[], asyncio.AbstractEventLoop] | None:
    """Raise :class:`RuntimeChoiceError` for an unknown ``$KRAFT_EVENT_LOOP``/``$KRAFT_GRPC_IO`` or a bad
    ``$KRAFT_GC_THRESHOLD``; return the loop factory (commands call this before any other work, so a
    typo fails fast)."""
    from kraft.observability.gc_watch import node_gc_threshold  # (observability imports this module)

    factory = loop_factory()
    _grpc_io_choice(os.environ)
    node_gc_threshold(os.environ)
    return factory


def run_server(main: Coroutine[Any, Any, T]) -> T:
    """Run a process's main coroutine to completion on the selected loop (after checking the runtime
    choices in the environment: an unknown ``$KRAFT_EVENT_LOOP`` or ``$KRAFT_GRPC_IO`` is an error)."""
    try:
        factory = check_choices()
    except RuntimeChoiceError:
        main.close()  # never started: do not leave a "coroutine was never awaited" warning behind
        raise
    enable_stack_dumps()
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(_watched(main))


async def _watched(main: Coroutine[Any, Any, T]) -> T:
    """``main`` with a :class:`LoopStallMonitor` on its loop: a loop that stops turning is reported with
    every thread's stack instead of going silent."""
    from kraft.observability.logging import get_logger
    from kraft.observability.loop_stall import LoopStallMonitor

    monitor = LoopStallMonitor(asyncio.get_running_loop(), get_logger("runtime"))
    monitor.start()
    try:
        return await main
    finally:
        monitor.stop()


def enable_stack_dumps() -> None:
    """``kill -USR2 <pid>`` writes every thread's Python stack to the node's stderr (its log), like a
    JVM's thread dump: the way to see where a node that stopped answering is stuck.  faulthandler does
    it from C, so it works while the event loop or the GIL holder is stuck; the node goes on running.
    The cluster manager sends it to a node that ignores SIGTERM before it sends SIGKILL; a crash (SIGSEGV,
    SIGABRT) writes the same dump before the process dies."""
    try:
        faulthandler.enable()  # a fatal signal (a crash in a C extension) also leaves the stacks in the log
        if hasattr(signal, "SIGUSR2"):
            faulthandler.register(signal.SIGUSR2, all_threads=True, chain=False)
    except (OSError, ValueError, AttributeError):
        pass  # stderr is no file (an in-process test capturing it): nothing to dump into


def running_loop_name() -> str:
    """``uvloop`` or ``asyncio`` — for the startup log line."""
    return "uvloop" if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else "asyncio"
