"""Which event loop reads grpc.aio's completion-queue wake-ups (issue #17, session 14).

grpc.aio (grpcio 1.85 here) has one completion-queue poller thread per process.  Every event it takes — a
call arrived, a message read, a message or status sent: ~5 per unary call — is put on one queue and
announced by one byte written to ONE socket that every event loop that ever made a grpc.aio object (a
channel or a server) watches with ``add_reader``.  So each event wakes every such loop; the one whose
``recv`` gets the byte drains the queue, runs its own loop's events and posts the others' to their loops
with ``call_soon_threadsafe``.

A controller node has two such loops: the intake loop (its server: heartbeats, Raft fetches served there)
and the main loop (the Raft transport's channels: votes, a follower's fetches).  On the active controller
nearly all gRPC traffic is the intake loop's, yet every event woke the main loop too (standalone: ~4.6
main-thread wake-ups and ~75 µs of main-thread CPU per unary call served on the other loop; ~0.05 and
~5 µs with the main loop's reader off), part of the active controller's main-thread cost at 1,000 brokers
(docs/internals/raft-performance.md "The leader's main loop and grpc.aio's wake-ups (session 14)").

:class:`PollerReader` takes the main loop's reader off that socket while the node leads (the main loop
then gets only its own events, posted by the intake loop's reader) and puts it back when it does not, and
before the intake loop stops (else the main loop's own events would have nobody to read them).

A follower is the other way round: its main loop is the fetch client (and the sender of a candidate's
votes), its intake loop serves little (redirected client calls, votes), yet every event of every fetch woke
the intake thread too.  :class:`LoopReaders` (the node's two readers together) takes the intake loop's
reader off while the node does not lead, so the main loop reads every event and posts the intake's; while
it leads, the main loop's.  Never both: a reader is only taken off once the other loop's is on (and that
loop bound), and both are put back before the intake loop stops.

grpc offers no API for this: the poller queue is found through its thread's target and the loop's binding
through the queue's references (:func:`gc.get_referents`), both checked by type.  Where that finds nothing
(another grpc version, e.g. one with a wake-up socket per loop, where the problem does not exist) it does
nothing and says so once.
"""

from __future__ import annotations

import asyncio
import functools
import gc
import importlib
import threading
from asyncio import AbstractEventLoop
from collections.abc import Awaitable, Callable
from typing import Any

from kraft.observability.logging import StructLogger


def _cygrpc() -> Any:
    try:
        return importlib.import_module("grpc._cython.cygrpc")
    except ImportError:
        return None


def poller_queue() -> Any:
    """grpc.aio's process-wide poller completion queue, or None (not started, or not this grpc)."""
    cygrpc = _cygrpc()
    queue_type = getattr(cygrpc, "PollerCompletionQueue", None)
    if queue_type is None:
        return None
    for thread in threading.enumerate():
        owner = getattr(getattr(thread, "_target", None), "__self__", None)
        if isinstance(owner, queue_type):
            return owner
    return None


def loop_binding(queue: Any, loop: AbstractEventLoop) -> Any:
    """``loop``'s binding to ``queue`` (it holds the wake-up socket ``loop`` watches), or None."""
    bound_type = getattr(_cygrpc(), "_BoundEventLoop", None)
    if queue is None or bound_type is None:
        return None
    for referent in gc.get_referents(queue):
        if isinstance(referent, dict):
            bound = referent.get(loop)
            if isinstance(bound, bound_type) and getattr(bound, "loop", None) is loop:
                return bound
    return None


class PollerReader:
    """Takes ``loop`` (the node's main loop) off grpc.aio's wake-up socket and puts it back; call on
    ``loop`` only, with another bound loop (the intake loop) running for as long as it is off."""

    def __init__(self, loop: AbstractEventLoop, log: StructLogger, name: str = "main") -> None:
        self._loop = loop
        self._log = log
        self._name = name  # which loop, in the log lines
        self._off: tuple[Any, Callable[[], object]] | None = None  # (socket, the reader to put back)
        self._said_unavailable = False  # the "no poller queue" line is said once

    @property
    def detached(self) -> bool:
        return self._off is not None

    def detach(self) -> bool:
        """Take the loop's reader off (idempotent); False when there is none to take (the loop is not
        bound yet, or this grpc differs)."""
        if self._off is not None:
            return True
        queue = poller_queue()
        bound = loop_binding(queue, self._loop)
        handler = getattr(queue, "_handle_events", None)
        sock = getattr(bound, "read_socket", None)
        if sock is None or handler is None:
            if not self._said_unavailable and queue is None:
                self._said_unavailable = True
                self._log.info("grpc_poller_reader_unavailable", reason="no grpc.aio poller queue found")
            return False
        # uvloop's remove_reader answers None, not whether it watched: the loop is bound, so grpc.aio made it
        # watch the socket, and attach() puts the reader back.
        self._loop.remove_reader(sock)
        self._off = (sock, functools.partial(handler, self._loop))
        self._log.info("grpc_poller_reader", loop=self._name, reader="off")
        return True

    def attach(self) -> None:
        """Put the loop's reader back (idempotent); before the other loop stops, and on losing leadership."""
        off, self._off = self._off, None
        if off is None:
            return
        sock, reader = off
        try:
            self._loop.add_reader(sock, reader)
        except (OSError, ValueError) as exc:  # the queue was shut down meanwhile (its socket closed)
            self._log.warning("grpc_poller_reader_not_restored", loop=self._name, error=repr(exc))
            return
        self._log.info("grpc_poller_reader", loop=self._name, reader="on")

    def follow(self, leading: bool) -> None:
        """Off while ``leading``, on otherwise (called on every leadership check)."""
        if leading:
            self.detach()
        else:
            self.attach()


class LoopReaders:
    """A controller's two bound loops' readers: the main loop's off while the node leads (``leader_off``:
    ``controller.leader.grpc.events.on.intake``), the intake loop's off while it does not (``follower_off``:
    ``controller.follower.grpc.events.on.main``).  Call on the main loop; ``on_intake`` runs a function on
    the intake loop and awaits its result."""

    def __init__(
        self,
        main_loop: AbstractEventLoop,
        intake_loop: AbstractEventLoop,
        on_intake: Callable[[Callable[[], object]], Awaitable[object]],
        log: StructLogger,
        *,
        leader_off: bool,
        follower_off: bool,
    ) -> None:
        self._main_loop = main_loop
        self.main = PollerReader(main_loop, log, "main") if leader_off else None
        self.intake = PollerReader(intake_loop, log, "intake") if follower_off else None
        self._on_intake = on_intake
        # follow() and restore() one at a time (a hop to the intake loop is an await): a restore() must not
        # run between a follow()'s check and its hop, and nothing is taken off after restore()
        self._lock = asyncio.Lock()
        self._restored = False

    async def follow(self, leading: bool) -> None:
        """Called on every leadership check; hops to the intake loop only to change its reader."""
        async with self._lock:
            if not self._restored:
                await self._follow(leading)

    async def _follow(self, leading: bool) -> None:
        if leading:
            if self.intake is not None and self.intake.detached:
                await self._on_intake(self.intake.attach)  # the intake loop reads again before main stops
            if self.main is not None:
                self.main.detach()
            return
        if self.main is not None:
            self.main.attach()
        if self.intake is not None and not self.intake.detached and self._main_reads():
            await self._on_intake(self.intake.detach)

    def _main_reads(self) -> bool:
        """Whether the main loop watches the wake-up socket: bound (it made a channel), reader not off."""
        if self.main is not None and self.main.detached:
            return False
        return loop_binding(poller_queue(), self._main_loop) is not None

    async def restore(self) -> None:
        """Both readers back for good, as grpc.aio left them: before the intake loop (its server) stops."""
        async with self._lock:
            self._restored = True
            await self._restore()

    async def _restore(self) -> None:
        if self.main is not None:
            self.main.attach()
        if self.intake is not None and self.intake.detached:
            await self._on_intake(self.intake.attach)
