"""The broker's own lifecycle state and the rule for when it may serve clients.

One :class:`BrokerStatus` per process, written only by the lifecycle task (:mod:`kraft.broker.lifecycle`)
and read by the BrokerService handlers.  Serving needs three things at once: the RUNNING state, an
unfenced registration, and a *lease*: the last heartbeat the controller accepted was sent less than
:func:`lease_duration_ms` ago — the session timeout less a safety margin (below).  The lease is what
stops a broker that was paused (SIGSTOP, a long GC-like stall) from answering a Produce in the instant
after it resumes and before its next heartbeat tells it that it was fenced: the monotonic clock kept
running while it was stopped, so the lease has already expired.

A lapsed lease (or a fence) also sets ``resync_required``: the broker serves again only after a metadata
fetch sent *after* that moment came back with nothing left to apply, so leaderships it lost while it was
away are applied before it can accept a Produce for them.

The lease also gates replication (:class:`kraft.broker.replication.ReplicaManager`): while it has lapsed a
leader serves no follower fetch, holds its high watermarks and fails waiting acks=all requests.

Why a margin: the controller fences a broker once ``broker.session.timeout.ms`` passed *on its own clock*
since the heartbeat arrived (no earlier than it was sent), and only then may a new leader take over.  The
broker must stop strictly before that on *its* clock, whose rate may differ from the controller's (NTP
slews a clock by at most 500 ppm; a crystal drifts ~100 ppm).  A tenth of the session (900 ms of Kafka's
9 s) is far above any rate difference, costs nothing while heartbeats flow (one every
``broker.heartbeat.interval.ms``, 2 s by default); the Raft thesis's leader lease (§6.4.1) shortens its
lease by a clock-drift bound the same way.  See docs/internals/replication.md.
"""

from __future__ import annotations

from collections.abc import Callable

from kraft.broker.types import BrokerState
from kraft.clock import Clock
from kraft.errors import ErrorCode

_ALLOWED: dict[BrokerState, frozenset[BrokerState]] = {
    BrokerState.NOT_RUNNING: frozenset({BrokerState.STARTING, BrokerState.SHUTTING_DOWN}),
    BrokerState.STARTING: frozenset({BrokerState.RECOVERY, BrokerState.SHUTTING_DOWN}),
    BrokerState.RECOVERY: frozenset(
        {BrokerState.RUNNING, BrokerState.PENDING_CONTROLLED_SHUTDOWN, BrokerState.SHUTTING_DOWN}
    ),
    # RUNNING → RECOVERY: fenced by the controller (session expiry, stale epoch) and catching up again.
    BrokerState.RUNNING: frozenset(
        {BrokerState.RECOVERY, BrokerState.PENDING_CONTROLLED_SHUTDOWN, BrokerState.SHUTTING_DOWN}
    ),
    BrokerState.PENDING_CONTROLLED_SHUTDOWN: frozenset({BrokerState.SHUTTING_DOWN}),
    BrokerState.SHUTTING_DOWN: frozenset({BrokerState.NOT_RUNNING}),
}


# The lease ends this fraction of the session timeout before the controller can fence the broker.
LEASE_SAFETY_FRACTION = 0.1


def lease_duration_ms(session_timeout_ms: int) -> int:
    """How long after an accepted heartbeat was sent the broker may act on it: the session timeout less
    :data:`LEASE_SAFETY_FRACTION` of it (at least 1 ms less)."""
    return session_timeout_ms - max(int(session_timeout_ms * LEASE_SAFETY_FRACTION), 1)


class IllegalStateTransition(RuntimeError):
    pass


class BrokerStatus:
    """Mutable state of one broker process (single writer: the lifecycle task)."""

    def __init__(
        self,
        broker_id: int,
        cluster_id: str,
        session_timeout_ms: int,
        *,
        clock: Clock,
    ) -> None:
        self.broker_id = broker_id
        self.cluster_id = cluster_id
        self.session_timeout_ms = session_timeout_ms
        self.lease_duration_ms = lease_duration_ms(session_timeout_ms)
        self.state = BrokerState.NOT_RUNNING
        self.incarnation_id = ""
        # the process this one replaced on the same log dirs (kraft.broker.incarnation); "" when unknown
        self.previous_incarnation_id = ""
        # the processes before that one on the same log dirs, newest first, since the last one the
        # controller accepted (each died before its registration was answered)
        self.earlier_incarnation_ids: tuple[str, ...] = ()
        self.broker_epoch = -1
        self.fenced = True
        self.metadata_offset = -1  # last applied metadata offset
        self.controller_id = -1
        # Set when the broker may have missed metadata (lease lapsed, fenced, re-registered); cleared by
        # the fetcher once a fetch *sent after* it was set found nothing more to apply.
        self.resync_required = False
        self.resync_generation = 0
        self._clock = clock
        self._lease_expires_at_ms: int | None = None  # None: no lease granted (or revoked)
        self.last_heartbeat_accepted_ms = -1
        """:meth:`monotonic_ms` when the latest accepted heartbeat was sent (-1: none yet)."""
        self._listeners: list[Callable[[BrokerState, BrokerState], None]] = []

    # --- transitions ---------------------------------------------------------------------------

    def on_transition(self, listener: Callable[[BrokerState, BrokerState], None]) -> None:
        """Call ``listener(old, new)`` after every state change (logs, metrics)."""
        self._listeners.append(listener)

    def transition(self, new: BrokerState) -> None:
        old = self.state
        if new is old:
            return
        if new not in _ALLOWED[old]:
            raise IllegalStateTransition(f"broker state {old.name} -> {new.name} is not allowed")
        self.state = new
        for listener in self._listeners:
            listener(old, new)

    # --- lease -----------------------------------------------------------------------------------

    def heartbeat_accepted(self, sent_at_ms: int) -> None:
        """Extend the lease from when the accepted heartbeat was *sent* (the controller's clock started
        no earlier than that), never from when its answer arrived, by :attr:`lease_duration_ms` (the
        session timeout less the safety margin).  ``sent_at_ms`` is :meth:`monotonic_ms` read before the
        heartbeat went out."""
        self.last_heartbeat_accepted_ms = max(self.last_heartbeat_accepted_ms, sent_at_ms)
        expires_ms = sent_at_ms + self.lease_duration_ms
        if self._lease_expires_at_ms is None or expires_ms > self._lease_expires_at_ms:
            self._lease_expires_at_ms = expires_ms

    def lease_lapsed(self) -> bool:
        """A lease was granted and has run out (paused, partitioned, or the controller is gone)."""
        return self._lease_expires_at_ms is not None and not self.lease_valid()

    def begin_resync(self) -> None:
        if not self.resync_required:
            self.resync_required = True
            self.resync_generation += 1

    def end_resync(self, generation: int) -> bool:
        """Clear the resync flag if ``generation`` (read when the fetch was sent) is the current one."""
        if self.resync_required and generation == self.resync_generation:
            self.resync_required = False
            return True
        return False

    def lease_expires_at_ms(self) -> int | None:
        """:meth:`monotonic_ms` at which the lease ends (None: none granted, or revoked)."""
        return self._lease_expires_at_ms

    def revoke_lease(self) -> None:
        self._lease_expires_at_ms = None

    def monotonic_ms(self) -> int:
        """The broker's timer clock (lease, registration deadline), never the wall clock."""
        return self._clock.monotonic_ms()

    def now_ms(self) -> int:
        """Wall-clock milliseconds (record timestamps), not for timeouts."""
        return self._clock.wall_ms()

    def lease_valid(self) -> bool:
        expires_ms = self._lease_expires_at_ms
        return expires_ms is not None and self._clock.monotonic_ms() < expires_ms

    # --- serving rule ----------------------------------------------------------------------------

    def serving_error(self) -> tuple[ErrorCode, str] | None:
        """None when client requests may be served, else the error to answer with."""
        if self.state is not BrokerState.RUNNING:
            return ErrorCode.BROKER_NOT_AVAILABLE, f"broker {self.broker_id} is {self.state.name}"
        if self.fenced:
            return ErrorCode.BROKER_NOT_AVAILABLE, f"broker {self.broker_id} is fenced"
        if not self.lease_valid():
            return ErrorCode.BROKER_NOT_AVAILABLE, f"broker {self.broker_id} has no live session"
        if self.resync_required:
            return ErrorCode.BROKER_NOT_AVAILABLE, f"broker {self.broker_id} is catching up on metadata"
        return None
