"""Steady broker heartbeats answered on the request plane's thread, without the main loop (issue #17).

A BrokerHeartbeat that changes nothing costs the active controller's main thread ~285 µs of CPU and ~5
wake-ups, almost none of it controller logic, and during bulk work it waits behind bulk slices
(docs/internals/raft-performance.md "What a heartbeat costs the leader (session 12)").  Most heartbeats
are *steady*: :meth:`ControllerLogic.broker_heartbeat` would append no record and answer only
``is_caught_up`` — the broker is registered with that epoch, unfenced, not in controlled shutdown, not
leaving; it asks for nothing (no want_fence, want_shut_down, offline partitions); and the record its
answer depends on is committed.  :class:`HeartbeatLane` answers those on the intake thread from a
:class:`LaneSnapshot` the main loop publishes; everything else goes the normal path.

Threads: :meth:`HeartbeatLane.answer` runs on the intake thread; everything else on the main loop.  They
share only (a) ``snapshot``, an immutable object the main loop replaces whole (one reference store), and
(b) ``_touches``, a deque (append / popleft are atomic).  The safety argument, one condition at a time,
is docs/internals/heartbeat-lane.md:

- **leadership**: answered only while the Raft leader lease published with the snapshot (an expiry on
  the same monotonic clock) holds at the intake's now — the proof the normal path's answer takes from
  ``confirm_leadership(lease=True)``.  At most every ``note_interval_ms`` of fast answers the main loop
  is told (:meth:`QuorumController._lane_note`): it asks Raft for the lease as a caller, so the lease in
  use is renewed as with slow-path heartbeats, and republishes the expiry;
- **session liveness**: the intake records the touch ``(broker, epoch, now, metadata offset)`` BEFORE
  it reads the snapshot a second time and answers; the main loop drains the touches before every
  session-expiry decision and heartbeat handling, and before fencing an expired broker it takes it out
  of the snapshot and drains again (:meth:`SessionChecker`), so no broker is fenced whose heartbeat was
  answered here;
- **publication**: the main loop republishes after every controller event (rebuilt when the speculative
  image's brokers or the logic changed), every commit, a leader change and each lease note — in the
  same synchronous stretch as the decision, so a broker leaves "steady" before the main loop yields.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from kraft.clock import Clock
from kraft.metadata.controller_logic import ControllerLogic
from kraft.v1 import controller_pb2 as cpb

# Why a heartbeat went the normal path (kraft_controller_heartbeats_slow_path_total{reason}): no snapshot
# (not the active controller, or not yet published), no lease published (-1), the published lease had
# ended, the request asks for something, another cluster, the broker is not steady (unknown, other epoch,
# fenced, in controlled shutdown, leaving), its record is not committed yet, the snapshot changed between
# the two reads, the identity/ACL check cannot be decided on the intake thread.
NO_SNAPSHOT = "no_snapshot"
NO_LEASE = "no_lease"
LEASE_LAPSED = "lease_lapsed"
ASKS = "asks"
OTHER_CLUSTER = "other_cluster"
NOT_STEADY = "not_steady"
UNCOMMITTED = "uncommitted"
CHANGED = "changed"
NOT_ALLOWED = "not_allowed"
SLOW_REASONS = (
    NO_SNAPSHOT, NO_LEASE, LEASE_LAPSED, ASKS, OTHER_CLUSTER, NOT_STEADY, UNCOMMITTED, CHANGED, NOT_ALLOWED
)  # fmt: skip

Touch = tuple[int, int, int, int]
"""``(broker id, broker epoch, now_ms, metadata offset)`` of a heartbeat answered on the intake thread."""


@dataclass(frozen=True, slots=True)
class LaneSnapshot:
    """What the intake thread may answer from; replaced whole, never changed."""

    logic: object
    """The ControllerLogic it was built from (identity only: a new logic is a new leadership)."""
    brokers: object
    """The speculative image's ``brokers`` map it was built from (identity: a new map is a broker change)."""
    cluster_id: str
    committed_offset: int
    lease_expiry_ms: int
    """The Raft leader lease's end on the controller's monotonic clock (-1: none)."""
    steady: Mapping[int, tuple[int, int]]
    """broker id -> (epoch, the offset its answer depends on): :meth:`ControllerLogic.steady_heartbeats`."""


class HeartbeatLane:
    """See the module docstring.  ``lease_expiry_ms`` reads the Raft leader lease's end (main loop)."""

    def __init__(
        self,
        clock: Clock,
        cluster_id: str,
        lease_expiry_ms: Callable[[], int],
        *,
        note_interval_ms: int,
        on_answer: Callable[[], None] | None = None,
        on_slow: Callable[[str], None] | None = None,
        on_slow_answered: Callable[[float], None] | None = None,
    ) -> None:
        self._clock = clock
        self._cluster_id = cluster_id
        self._lease_expiry_ms = lease_expiry_ms
        self._note_interval_ms = max(1, note_interval_ms)
        self._on_answer = on_answer
        self._on_slow = on_slow  # intake thread: why a call goes the normal path (one of SLOW_REASONS)
        self._on_slow_answered = on_slow_answered  # intake thread: seconds from arrival to a slow answer
        self.snapshot: LaneSnapshot | None = None
        self._touches: collections.deque[Touch] = collections.deque()
        self._dirty = False  # a broker was taken out by hand (unpublish): the next publish rebuilds
        self._notify: Callable[[], object] | None = None
        self._last_note_ms: int | None = None  # intake thread only
        self.answered = 0  # intake thread only (tests, the bench)
        self.rebuilds = 0  # main loop only

    # ---- intake thread ----

    def answer(self, req: cpb.BrokerHeartbeatRequest) -> cpb.BrokerHeartbeatResponse | None:
        """The answer the controller would give ``req``, or None: the normal path must handle it."""
        snapshot = self.snapshot
        if snapshot is None:
            self._slow(NO_SNAPSHOT)
            return None
        now_ms = self._clock.monotonic_ms()
        steady = _steady(snapshot, req, now_ms)
        if isinstance(steady, str):
            self._slow(steady)
            return None
        # The touch first, then the snapshot again: a main loop that takes this broker out of the snapshot
        # and then drains the touches (before fencing it) either sees this touch or made this read fail.
        self._touches.append((req.broker_id, req.broker_epoch, now_ms, req.current_metadata_offset))
        again = self.snapshot
        if again is not snapshot:
            if again is None:
                self._slow(CHANGED)
                return None
            steady = _steady(again, req, now_ms)
            if isinstance(steady, str):
                # (the touch stays: the broker did heartbeat, and so does the normal path)
                self._slow(CHANGED)
                return None
        self.answered += 1
        if self._on_answer is not None:
            self._on_answer()
        last = self._last_note_ms
        if last is None or now_ms - last >= self._note_interval_ms:
            self._last_note_ms = now_ms
            notify = self._notify
            if notify is not None:
                notify()
        return cpb.BrokerHeartbeatResponse(is_caught_up=req.current_metadata_offset >= steady[0])

    def _slow(self, reason: str) -> None:
        on_slow = self._on_slow
        if on_slow is not None:
            on_slow(reason)

    def note_slow(self, reason: str) -> None:
        """On the intake thread: a call the bridge sends the normal path before asking the lane
        (``NOT_ALLOWED``)."""
        self._slow(reason)

    def slow_answered(self, seconds: float) -> None:
        """On the intake thread: a call that went the normal path was answered ``seconds`` after arriving."""
        observe = self._on_slow_answered
        if observe is not None:
            observe(seconds)

    # ---- main loop ----

    def bind(self, notify: Callable[[], object] | None) -> None:
        """``notify``: called on the intake thread at most every ``note_interval_ms`` of fast answers; it
        must post the controller's lease note to the main loop (thread-safe, never blocking)."""
        self._notify = notify

    def publish(self, logic: ControllerLogic | None, committed_offset: int) -> None:
        """Republish from ``logic`` (the active ControllerLogic, None while not active): rebuilt when its
        brokers changed, else only the committed offset and the lease expiry."""
        if logic is None:
            self.snapshot = None
            return
        brokers = logic.image.brokers
        lease = self._lease_expiry_ms()
        snapshot = self.snapshot
        if (
            snapshot is not None
            and snapshot.logic is logic
            and snapshot.brokers is brokers
            and not self._dirty
        ):
            if snapshot.committed_offset != committed_offset or snapshot.lease_expiry_ms != lease:
                self.snapshot = dataclasses.replace(
                    snapshot, committed_offset=committed_offset, lease_expiry_ms=lease
                )
            return
        self._dirty = False
        self.rebuilds += 1
        self.snapshot = LaneSnapshot(
            logic, brokers, self._cluster_id, committed_offset, lease, logic.steady_heartbeats()
        )

    def unpublish(self, broker_id: int) -> None:
        """Take ``broker_id`` out of the snapshot now (the main loop is about to fence it); the next
        :meth:`publish` rebuilds from the logic."""
        snapshot = self.snapshot
        if snapshot is None or broker_id not in snapshot.steady:
            return
        steady = dict(snapshot.steady)
        del steady[broker_id]
        self._dirty = True
        self.snapshot = dataclasses.replace(snapshot, steady=steady)

    def clear(self) -> None:
        """Nothing is answered here until the next :meth:`publish` (leadership changed)."""
        self.snapshot = None

    def drain(self) -> list[Touch]:
        """The touches recorded since the last drain, oldest first."""
        touches = self._touches
        taken: list[Touch] = []
        while True:
            try:
                taken.append(touches.popleft())
            except IndexError:
                return taken


def _steady(snapshot: LaneSnapshot, req: cpb.BrokerHeartbeatRequest, now_ms: int) -> tuple[int, int] | str:
    """The broker's ``(epoch, depends-on offset)`` when ``req`` may be answered from ``snapshot``, else
    the reason it may not (one of :data:`SLOW_REASONS`)."""
    if now_ms >= snapshot.lease_expiry_ms:
        # the normal path confirms by a round
        return NO_LEASE if snapshot.lease_expiry_ms < 0 else LEASE_LAPSED
    if req.want_fence or req.want_shut_down or len(req.offline_partitions):
        return ASKS
    if req.cluster_id != snapshot.cluster_id:
        return OTHER_CLUSTER
    steady = snapshot.steady.get(req.broker_id)
    if steady is None or steady[0] != req.broker_epoch:
        return NOT_STEADY
    if steady[1] > snapshot.committed_offset:
        return UNCOMMITTED
    return steady
