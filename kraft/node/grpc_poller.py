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
before the intake loop stops (else the main loop's own events would have nobody to read them).  A follower
keeps both readers: its main loop is the fetch client, and a second hop on each fetch answer would slow
replication.

grpc offers no API for this: the poller queue is found through its thread's target and the loop's binding
through the queue's references (:func:`gc.get_referents`), both checked by type.  Where that finds nothing
(another grpc version, e.g. one with a wake-up socket per loop, where the problem does not exist) it does
nothing and says so once.
"""

from __future__ import annotations

import functools
import gc
import importlib
import threading
from asyncio import AbstractEventLoop
from collections.abc import Callable
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

    def __init__(self, loop: AbstractEventLoop, log: StructLogger) -> None:
        self._loop = loop
        self._log = log
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
        self._log.info("grpc_events_on_intake", main_loop_reader="off")
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
            self._log.warning("grpc_poller_reader_not_restored", error=repr(exc))
            return
        self._log.info("grpc_events_on_intake", main_loop_reader="on")

    def follow(self, leading: bool) -> None:
        """Off while ``leading``, on otherwise (called on every leadership check)."""
        if leading:
            self.detach()
        else:
            self.attach()
