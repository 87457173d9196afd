"""Session checker: fences brokers whose heartbeat session expired, one broker per write.

Runs every ``session_timeout/8`` on the controller's clock.  Two ways the controller's own slowness is
kept from being blamed on brokers: a check that wakes far too late (the event loop was blocked) pushes
every deadline back by the stall, and a check that saw far fewer heartbeats arrive than the unfenced
brokers send (gRPC intake starved, see :meth:`SessionChecker._intake_stalled`) extends them too.
"""

from __future__ import annotations

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

# With at least this many unfenced brokers, a session check that saw fewer than this fraction of the
# heartbeats they send extends deadlines instead of fencing, at most this many checks in a row.
INTAKE_MIN_BROKERS = 8
INTAKE_STALL_FRACTION = 0.25
INTAKE_STALL_MAX_CHECKS = 16

NO_OFFSET = "none"


def applied_offset_field(contact: BrokerContact | None, next_offset: int) -> int | str:
    """The ``broker_metadata_offset`` of the expiry line: the offset the broker last reported applied, or
    ``none`` when it never reported one or reported one the metadata log does not hold yet (at or past
    ``next_offset``, the offset the next record gets).  Such a claim is not an offset anyone applied: the
    controller fleet benchmark's brokers report 2**50 ("everything"), and a broken broker could too; the
    line shows only what the broker can really have applied."""
    offset = applied_offset(contact, next_offset)
    return NO_OFFSET if offset < 0 else offset


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
        self._heartbeat_interval_ms = heartbeat_interval_ms
        self._metrics = metrics
        self._log = log
        self._heartbeats_received = 0  # since the last check (see _intake_stalled)
        self._intake_stalls = 0
        # With the heartbeat fast lane (kraft.metadata.heartbeat_lane, set by the controller): take the
        # touches of heartbeats answered on the intake thread into the logic's sessions, and take a broker
        # out of the lane's snapshot before it is fenced.
        self.take_touches: Callable[[ControllerLogic], None] | None = None
        self.leave_steady: Callable[[int], None] | None = None

    def heartbeat_arrived(self) -> None:
        self._heartbeats_received += 1

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
            if self.take_touches is not None:
                self.take_touches(logic)  # they count as received, and as contact
            received, self._heartbeats_received = self._heartbeats_received, 0
            if stall > interval_ms:
                # The loop itself was blocked: heartbeats may be queued unread, so nobody expires now.
                logic.heartbeats.extend_all(stall)
                self._log.warning("controller_stalled", stall_ms=stall)
                continue
            if self._intake_stalled(logic, received, interval_ms + max(0, stall)):
                logic.heartbeats.extend_all(interval_ms + max(0, stall))
                continue
            await self._fence_expired(logic, now)

    def _intake_stalled(self, logic: ControllerLogic, received: int, elapsed_ms: int) -> bool:
        """True when far fewer heartbeats arrived than the unfenced brokers send: the controller is not
        getting them (gRPC starved by a busy process), so their silence proves nothing about the brokers.

        A loop that keeps turning can still starve gRPC's intake (seen under bulk writes on a saturated
        machine); fencing then would fence live brokers.  Bounded: after INTAKE_STALL_MAX_CHECKS checks
        in a row (about two session timeouts) expiry resumes, so a real mass failure is still fenced.
        """
        unfenced = logic.heartbeats.unfenced_count()
        if unfenced < INTAKE_MIN_BROKERS:
            self._intake_stalls = 0
            return False
        expected = unfenced * elapsed_ms / max(1, self._heartbeat_interval_ms)
        if received >= expected * INTAKE_STALL_FRACTION:
            self._intake_stalls = 0
            return False
        if self._intake_stalls >= INTAKE_STALL_MAX_CHECKS:
            return False
        self._intake_stalls += 1
        self._log.warning(
            "heartbeat_intake_stalled",
            received=received,
            expected=round(expected),
            checks=self._intake_stalls,
        )
        return True

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
