"""Session checker: fences brokers whose heartbeat session expired, one broker per write.

Runs every ``session_timeout/8`` on the controller's clock.  The controller's own slowness must not be
blamed on brokers.  Two guards:

* A check that wakes far too late (the event loop was blocked) pushes every deadline back by the stall:
  heartbeats may be sitting unread.
* The *intake guard* (:class:`IntakeRate`): the loop turns, but gRPC's intake is starved (a busy process
  on a saturated host accepts about one call per loop turn; session 14 measured a leader taking 140 to 490
  of 500 heartbeats/s during bulk work, then draining at 850 to 1,000/s, and clients whose attempts time out
  retry elsewhere, so some heartbeats never arrive at all).  Sessions then age slower than the clock,
  by how late the intake is.

How late the intake is, ``r`` (1.0: one heartbeat per live broker per ``broker.heartbeat.interval.ms``),
is measured on the brokers that *are* heard (:class:`IntakeRate`): the gaps between each broker's
consecutive arrivals over half a session, and the arrivals of the last interval against the brokers heard
in that half session — the lower of the two.  This tells the two cases a fixed fraction of the expected
arrivals (the guard before session 15: hold while under 25 %) cannot:

* *the controller receives late* — every broker's arrivals thin out (a queue: gaps of ``interval / r``;
  dropped attempts: gaps geometric with mean ``interval / r``), so both measures read low;
* *some brokers are dead* — the dead send nothing, so they add no gap, and half a session after their last
  heartbeat they are no longer counted as heard: the live ones still arrive ``interval`` apart and ``r``
  stays ~1.  Half the fleet dead reads as 50 % of expected arrivals (which the fraction could not tell
  from a collapse to 50 %) but is fenced on time, late by at most that half session's hold.

While ``r`` < :data:`INTAKE_HEALTHY_RATE` a check moves the session clock by ``elapsed * q`` instead of
``elapsed``, with ``q = max(INTAKE_MIN_SESSION_RATE, r**2)`` (every deadline is held by ``elapsed *
(1 - q)``, never past now).  ``r`` alone would keep the *mean* number of heartbeats a session spans;
losses are what fence a live broker (k dropped attempts in a row have probability ``(1 - r)**k``), and
``r**2`` keeps that chance at ~1e-5 per session for ``r`` between 0.5 and 0.8 at the default 9 s / 2 s
(docs/internals/metadata.md has the table).  Bounded: the session clock never runs slower than
``INTAKE_MIN_SESSION_RATE`` (1/4), so no broker keeps a session more than ``4 x session_timeout`` past
its last heartbeat's arrival (plus a check).  When *nothing* arrives (a whole fleet stopped, or a network
partition between brokers and the controller, which no intake measure can tell from a total intake
stall) every broker is fenced 3.3 to 4 session timeouts after its last arrival (the old guard: 3).
Holding is safe: a broker whose heartbeats go unanswered stops serving on its own 0.9 session
timeouts after its last accepted heartbeat was sent (kraft.broker), so a hold delays only the moving of a
dead broker's leaderships, never lets it serve unfenced.

Kafka (``BrokerHeartbeatTracker``) fences on the session timeout alone: contact times are written from the
request-handler thread pool as heartbeats arrive, so a busy controller thread does not delay them; an
intake that does not keep up (network threads, request queue) is not guarded.  Here one process's intake
can starve under bulk work on a small host, hence the guard.  The send time brokers put in the call
metadata (``x-kraft-sent-monotonic-ns``) is not used: monotonic clocks are not comparable across hosts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

from kraft.metadata.controller_logic import ControllerLogic, Outcome
from kraft.metadata.controller_state import ControllerState, NotControllerError
from kraft.metadata.controller_writes import WritePath
from kraft.metadata.event_queue import EventQueueClosedError
from kraft.metadata.heartbeats import BrokerContact, applied_offset
from kraft.metadata.timers import Timers
from kraft.observability.logging import StructLogger
from kraft.observability.metrics import ControllerMetrics
from kraft.v1 import controller_pb2 as cpb

# The intake guard (module docstring) acts with at least this many unfenced brokers: fewer give too few
# arrivals to measure the intake by.
INTAKE_MIN_BROKERS = 8
# Arrival gaps are measured over this many checks (half a session timeout).
INTAKE_WINDOW_CHECKS = 4
# At or above this arrival rate (measured gaps against the heartbeat interval) sessions run at full speed:
# a broker sends its next heartbeat an interval after the answer, so gaps run a little over the interval.
INTAKE_HEALTHY_RATE = 0.95
# The slowest the session clock runs: no session outlives its last arrival by more than
# session_timeout / INTAKE_MIN_SESSION_RATE.
INTAKE_MIN_SESSION_RATE = 0.25
# Held checks are logged on the first of a run and then once per session timeout.
_LOG_EVERY_CHECKS = 8

NO_OFFSET = "none"


def applied_offset_field(contact: BrokerContact | None, next_offset: int) -> int | str:
    """The ``broker_metadata_offset`` of the expiry line: the offset the broker last reported applied, or
    ``none`` when it never reported one or reported one the metadata log does not hold yet (at or past
    ``next_offset``, the offset the next record gets).  Such a claim is not an offset anyone applied: the
    controller fleet benchmark's brokers report 2**50 ("everything"), and a broken broker could too; the
    line shows only what the broker can really have applied."""
    offset = applied_offset(contact, next_offset)
    return NO_OFFSET if offset < 0 else offset


def session_rate(arrival_rate: float) -> float:
    """How fast sessions age (1.0: as the clock) while heartbeats arrive at ``arrival_rate`` of what live
    brokers send (module docstring)."""
    if arrival_rate >= INTAKE_HEALTHY_RATE:
        return 1.0
    return max(INTAKE_MIN_SESSION_RATE, arrival_rate * arrival_rate)


class IntakeRate:
    """The rate heartbeats arrive at, against the rate live brokers send them: the lower of two measures
    (module docstring).

    * *Gaps*, over the last :data:`INTAKE_WINDOW_CHECKS` checks: each arrival's gap since the same broker's
      previous one.  A dead broker adds no gap, so dead brokers never read as a slow intake; but a live
      broker's run of lost heartbeats shows only when it ends, so after a collapse begins this measure
      trails it by up to a window.
    * *Count*, over the last checks that span a heartbeat interval (so that brokers whose heartbeats fall in
      step do not make one check look empty and the next full): their arrivals against one per interval
      from each broker heard in the window.  It sees a collapse within an interval; a broker that just
      died still counts as expected until a window after its last arrival (then it is no longer
      "heard"), so a fraction ``d`` of the fleet dying at once reads as ``1 - d`` for at most a window."""

    def __init__(self, heartbeat_interval_ms: int, session_timeout_ms: int, check_interval_ms: int) -> None:
        self._interval_ms = max(1, heartbeat_interval_ms)
        self._count_checks = min(INTAKE_WINDOW_CHECKS, -(-self._interval_ms // max(1, check_interval_ms)))
        # A longer gap outlived any held session: a broker coming back says nothing about the intake.
        self._max_gap_ms = int(session_timeout_ms / INTAKE_MIN_SESSION_RATE)
        self._last_arrival: dict[int, int] = {}
        self._gaps = 0  # this check's gap samples, their sum, and its arrivals
        self._gaps_ms = 0
        self._arrivals = 0
        # per check: (gaps, their sum, arrivals, when the check's span began)
        self._window: deque[tuple[int, int, int, int]] = deque(maxlen=INTAKE_WINDOW_CHECKS)
        self._check_start_ms: int | None = None
        self._checks = 0

    def restart(self) -> None:
        """A new leadership: the window starts empty and no gap spans the standby time before it (what a
        standby heard says nothing about this intake).  The tracker renewed every session
        (``HeartbeatTracker.reset``), so none expires before the window is full again (half a session
        plus a check)."""
        self._window.clear()
        self._last_arrival.clear()
        self._gaps = self._gaps_ms = self._arrivals = 0
        self._check_start_ms = None

    def arrived(self, broker_id: int, now_ms: int) -> None:
        previous = self._last_arrival.get(broker_id)
        if previous is not None and now_ms <= previous:
            return  # recorded out of order (a fast-lane touch taken after a later arrival): no gap
        self._last_arrival[broker_id] = now_ms
        self._arrivals += 1
        if previous is not None and now_ms - previous <= self._max_gap_ms:
            self._gaps += 1
            self._gaps_ms += now_ms - previous

    def end_check(self, now_ms: int) -> tuple[float, int]:
        """Close this check's samples: the arrival rate over the window (1.0 = one heartbeat per live
        broker per interval; 0.0 when no gap was measured: nothing arrived, or only first heartbeats) and
        the arrivals of the window.  Until the window is full after :meth:`restart`, 1.0: no judgement."""
        began = now_ms if self._check_start_ms is None else self._check_start_ms
        self._check_start_ms = now_ms
        self._window.append((self._gaps, self._gaps_ms, self._arrivals, began))
        self._gaps = self._gaps_ms = self._arrivals = 0
        self._checks += 1
        if self._checks % _LOG_EVERY_CHECKS == 0:
            # Brokers gone for good (removed, re-numbered) would leave their entries forever.
            stale = now_ms - self._max_gap_ms
            self._last_arrival = {b: t for b, t in self._last_arrival.items() if t >= stale}
        gaps = sum(w[0] for w in self._window)
        gaps_ms = sum(w[1] for w in self._window)
        arrivals = sum(w[2] for w in self._window)
        if len(self._window) < INTAKE_WINDOW_CHECKS:
            return 1.0, arrivals
        if gaps == 0 or arrivals == 0:
            return 0.0, arrivals
        by_gaps = gaps * self._interval_ms / max(1, gaps_ms)
        since = self._window[0][3]
        heard = sum(1 for t in self._last_arrival.values() if t >= since)
        recent = list(self._window)[-self._count_checks :]
        recent_arrivals = sum(w[2] for w in recent)
        by_count = recent_arrivals * self._interval_ms / max(1, heard * (now_ms - recent[0][3]))
        return min(1.0, by_gaps, by_count), arrivals


class SessionChecker:
    def __init__(
        self,
        state: ControllerState,
        writes: WritePath,
        timers: Timers,
        *,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        metrics: ControllerMetrics,
        log: StructLogger,
    ) -> None:
        self._state = state
        self._writes = writes
        self._timers = timers
        self.interval_ms = max(10, session_timeout_ms // 8)
        self._metrics = metrics
        self._log = log
        self._intake = IntakeRate(heartbeat_interval_ms, session_timeout_ms, self.interval_ms)
        self._held_checks = 0  # checks in a row that held sessions for the intake
        self._leadership: ControllerLogic | None = None  # the logic the intake window was measured for
        # With the heartbeat fast lane (kraft.metadata.heartbeat_lane, set by the controller): take the
        # touches of heartbeats answered on the intake thread into the logic's sessions, and take a broker
        # out of the lane's snapshot before it is fenced.
        self.take_touches: Callable[[ControllerLogic], None] | None = None
        self.leave_steady: Callable[[int], None] | None = None

    def heartbeat_arrived(self, broker_id: int, now_ms: int) -> None:
        """A heartbeat of ``broker_id`` reached the controller at ``now_ms`` (any epoch, any outcome)."""
        self._intake.arrived(broker_id, now_ms)

    async def run(self) -> None:
        interval_ms = self.interval_ms
        last_ms = self._timers.now_ms()
        while True:
            await self._timers.sleep_ms(interval_ms)
            now = self._timers.now_ms()
            stall = now - last_ms - interval_ms
            last_ms = now
            logic = self._state.logic
            if logic is None:
                continue
            if logic is not self._leadership:
                self._leadership = logic
                self._intake.restart()
            if self.take_touches is not None:
                self.take_touches(logic)  # they count as arrivals, and as contact
            arrival_rate, arrivals = self._intake.end_check(now)
            if stall > interval_ms:
                # The loop itself was blocked: heartbeats may be queued unread, so nobody expires now.
                logic.heartbeats.extend_all(stall)
                self._log.warning("controller_stalled", stall_ms=stall)
                continue
            self._hold_for_intake(logic, arrival_rate, arrivals, interval_ms + max(0, stall), now)
            await self._fence_expired(logic, now)

    def _hold_for_intake(
        self, logic: ControllerLogic, arrival_rate: float, arrivals: int, elapsed_ms: int, now: int
    ) -> None:
        """Age the sessions of this check by ``elapsed_ms * session_rate`` instead of ``elapsed_ms`` when
        heartbeats arrive late (module docstring): hold every deadline by the rest, never past now."""
        rate = session_rate(arrival_rate)
        if logic.heartbeats.unfenced_count() < INTAKE_MIN_BROKERS or rate >= 1.0:
            if self._held_checks:
                self._log.info("heartbeat_intake_recovered", held_checks=self._held_checks)
            self._held_checks = 0
            return
        held_ms = round(elapsed_ms * (1.0 - rate))
        logic.heartbeats.hold(held_ms, now)
        if self._held_checks % _LOG_EVERY_CHECKS == 0:
            self._log.warning(
                "heartbeat_intake_stalled",
                arrival_rate=round(arrival_rate, 2),
                arrivals=arrivals,
                session_rate=round(rate, 2),
                held_ms=held_ms,
                checks=self._held_checks + 1,
            )
        self._held_checks += 1

    def _settled_expiry(self, logic: ControllerLogic, now: int) -> int | None:
        """The expired broker :meth:`ControllerLogic.fence_expired` will fence now, after every heartbeat
        answered on the intake thread was seen: the touches are taken, then the candidate is taken out of
        the fast lane's snapshot and the touches taken again — a heartbeat the intake answered from the
        snapshot before that recorded its touch before it, so it is seen now, and any later one goes the
        normal path.  Repeated while a fresh touch makes another broker the candidate (each at most once).
        Without the fast lane: ``next_expired``."""
        take, leave = self.take_touches, self.leave_steady
        if take is None or leave is None:
            return logic.heartbeats.next_expired(now)
        take(logic)
        left: set[int] = set()
        while True:
            expiring = logic.heartbeats.next_expired(now)
            if expiring is None or expiring in left:
                return expiring
            leave(expiring)
            left.add(expiring)
            take(logic)

    async def _fence_expired(self, logic: ControllerLogic, now: int) -> None:
        fenced: list[int] = []

        def fence_one(lg: ControllerLogic) -> Outcome[cpb.BrokerHeartbeatResponse]:
            """One event: fence the next expired broker (its leave job continues in slices)."""
            if lg is not logic:
                raise NotControllerError(self._state.leader.leader_id)
            # Read before fencing: what the broker last said and what it leads (the fence moves it).
            expiring = self._settled_expiry(lg, now)
            contact = lg.heartbeats.contact(expiring) if expiring is not None else None
            leaderships = lg.leader_count(expiring) if expiring is not None else 0
            broker_id, records = lg.fence_expired(now, self._writes.next_offset)
            fenced.append(broker_id)
            if broker_id < 0:
                return Outcome([], cpb.BrokerHeartbeatResponse(), wait_offset=-1)
            self._metrics.timed_out_broker_heartbeats.inc()
            self._log.warning(
                "broker_session_expired",
                broker=broker_id,
                last_heartbeat_ms_ago=now - contact.last_contact_ms if contact is not None else -1,
                session_timeout_ms=lg.heartbeats.session_timeout_ms,
                broker_metadata_offset=applied_offset_field(contact, self._writes.next_offset),
                leaderships_to_move=leaderships if expiring == broker_id else -1,
                action="fenced",
            )
            return Outcome(records, cpb.BrokerHeartbeatResponse(), self._writes.next_offset)

        while self._state.logic is logic:
            fenced.clear()
            try:
                await self._writes.write(fence_one, name="fence-expired")
            except (NotControllerError, TimeoutError, EventQueueClosedError):
                return
            if not fenced or fenced[0] < 0:
                return
