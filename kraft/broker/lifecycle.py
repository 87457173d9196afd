"""Registration, heartbeats and controlled shutdown (Kafka's BrokerLifecycleManager).

Theory of operation
-------------------
:meth:`BrokerLifecycle.register` sends RegisterBroker with this process's incarnation id until the
active controller accepts it (backoff between tries; fatal answers — wrong cluster id, invalid
registration — stop the broker; DUPLICATE_BROKER_REGISTRATION is retried because the previous process's
session may still be expiring, unless the request names that process among this one's predecessors on
the same log dirs: :mod:`kraft.broker.incarnation`).  Success moves STARTING → RECOVERY: registered, fenced,
catching up.

:meth:`BrokerLifecycle.run_heartbeats` is the one task that writes :class:`BrokerStatus`.  Every
``broker.heartbeat.interval.ms`` (or at once when woken: catch-up reached, shutdown requested) it sends
BrokerHeartbeat{epoch, current metadata offset, want_fence = not caught up, want_shut_down} and reacts:

- accepted → the lease is extended from the moment the heartbeat was *sent*;
  ``is_fenced = False`` → RUNNING; ``is_fenced = True`` while RUNNING → RECOVERY (fenced by the controller);
- STALE_BROKER_EPOCH / BROKER_ID_NOT_REGISTERED → the registration is gone or replaced: stop serving at
  once (fenced, lease revoked, RECOVERY) and register again (a new broker epoch);
- ``should_shut_down`` while shutting down → :attr:`shutdown_granted` is set.  Until then the heartbeats
  come every :data:`PENDING_SHUTDOWN_INTERVAL_S`, not every interval: the controller grants on a later
  heartbeat than the one asking (once the shutdown record is committed and seen), and waiting a whole
  interval for it made every SIGTERM take ≥ 2 s (issue #19; Kafka shortens the first wait to 50 ms).

Transport trouble is retried at the next tick; the lease simply runs out if it lasts, which stops
serving without any message from the controller.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kraft.broker.status import BrokerStatus
from kraft.broker.types import BrokerState
from kraft.client.controller import ControllerClient, ControllerUnavailable
from kraft.errors import ErrorCode
from kraft.features import SUPPORTED_FEATURES
from kraft.observability.logging import get_logger
from kraft.v1 import controller_pb2 as cpb
from kraft.v1.common_pb2 import Endpoint
from kraft.v1.metadata_pb2 import BrokerFeature

_FATAL_REGISTRATION_ERRORS = frozenset(
    {
        ErrorCode.INCONSISTENT_CLUSTER_ID,
        ErrorCode.INVALID_REGISTRATION,
        ErrorCode.UNSUPPORTED_VERSION,
        ErrorCode.INVALID_REQUEST,
    }
)
_REREGISTER_ERRORS = frozenset({ErrorCode.STALE_BROKER_EPOCH, ErrorCode.BROKER_ID_NOT_REGISTERED})
PENDING_SHUTDOWN_INTERVAL_S = 0.05
"""Heartbeat interval while a controlled shutdown waits for the controller's grant."""


HeartbeatSender = Callable[[cpb.BrokerHeartbeatRequest, float], Awaitable[cpb.BrokerHeartbeatResponse]]
"""Sends one heartbeat with a timeout; the contract of ``ControllerClient.call`` (never NOT_CONTROLLER)."""


class RegistrationFailed(Exception):
    """The broker cannot register (fatal answer, or no success within the registration timeout)."""


@dataclass(frozen=True, slots=True)
class RegistrationInfo:
    listeners: tuple[Endpoint, ...]
    rack: str | None
    log_dirs: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class LifecycleTimings:
    heartbeat_interval_s: float
    request_timeout_s: float
    registration_timeout_s: float
    retry_backoff_s: float = 0.1
    call_deadline_s: float | None = None
    """Bounds one registration or heartbeat call, every redirect and resend included (None:
    ``request_timeout_s``; the controller client caps each attempt at its request timeout).  A broker
    takes half its session timeout, as Kafka's heartbeat channel did (KAFKA-14392): a heartbeat answered
    then still extends the lease (which runs from when it was sent, 0.9 of the session) past the next
    one, and one answered later would not be worth waiting for — the next heartbeat is due by then."""

    @property
    def call_timeout_s(self) -> float:
        return self.request_timeout_s if self.call_deadline_s is None else self.call_deadline_s


class BrokerLifecycle:
    def __init__(
        self,
        status: BrokerStatus,
        client: ControllerClient,
        info: RegistrationInfo,
        timings: LifecycleTimings,
        caught_up: Callable[[], bool],
        on_fenced: Callable[[], None] = lambda: None,
        rng: random.Random | None = None,
        offline: Callable[[], tuple[list[str], list[tuple[str, int]]]] = lambda: ([], []),
        heartbeats: HeartbeatSender | None = None,
    ) -> None:
        """``heartbeats``: how a heartbeat is sent — ``HeartbeatStream.heartbeat``
        (kraft.client.heartbeat_stream: one stream to the active controller); None: a unary call each."""
        self._status = status
        self._client = client
        self._info = info
        self._timings = timings
        self._caught_up = caught_up
        self._on_fenced = on_fenced
        self._offline = offline
        self._heartbeats = heartbeats or self._unary_heartbeat
        """(offline log dirs, (topic, partition) that were on them): reported in every heartbeat."""
        self._rng = rng or random.Random()
        self._wake = asyncio.Event()
        self._want_shut_down = False
        self.shutdown_granted = asyncio.Event()
        self._log = get_logger("broker.lifecycle", node=status.broker_id).with_context(
            lambda: {"state": status.state.name, "epoch": status.broker_epoch}
        )

    # --- requests from other tasks ------------------------------------------------------------------

    def wake(self) -> None:
        """Send the next heartbeat now (e.g. catch-up just completed)."""
        self._wake.set()

    def request_shutdown(self) -> None:
        """Begin a controlled shutdown (SIGTERM)."""
        status = self._status
        if self._want_shut_down:
            return
        self._want_shut_down = True
        if status.state in (BrokerState.RECOVERY, BrokerState.RUNNING):
            status.transition(BrokerState.PENDING_CONTROLLED_SHUTDOWN)
        else:
            # Not registered yet: there is nothing to hand over.
            self.shutdown_granted.set()
        self._wake.set()

    # --- registration --------------------------------------------------------------------------------

    async def register(self) -> None:
        """Register (or re-register) until accepted; raises :class:`RegistrationFailed`."""
        status = self._status
        # On the status's clock (injected), so a test on a manual clock decides when the deadline passes.
        deadline_ms = status.monotonic_ms() + round(self._timings.registration_timeout_s * 1000)
        attempt = 0
        previous_epoch = status.broker_epoch
        while True:
            request = cpb.RegisterBrokerRequest(
                cluster_id=status.cluster_id,
                broker_id=status.broker_id,
                incarnation_id=status.incarnation_id,
                listeners=list(self._info.listeners),
                log_dirs=list(self._info.log_dirs),
                previous_broker_epoch=previous_epoch,
                previous_incarnation_id=status.previous_incarnation_id,
                earlier_incarnation_ids=list(status.earlier_incarnation_ids),
                # what this software reads: the controller refuses a cluster level outside it, and an
                # upgrade past any registered broker's range (kraft.metadata.feature_control)
                features=[
                    BrokerFeature(name=name, min_supported_version=low, max_supported_version=high)
                    for name, (low, high) in sorted(SUPPORTED_FEATURES.items())
                ],
            )
            if self._info.rack is not None:
                request.rack = self._info.rack
            problem: str
            try:
                response = await self._client.call(
                    lambda stub: stub.RegisterBroker, request, self._timings.call_timeout_s
                )
            except ControllerUnavailable as err:
                problem = str(err)
            else:
                code = ErrorCode.from_wire(response.error_code)
                if code is ErrorCode.NONE:
                    status.broker_epoch = response.broker_epoch
                    status.controller_id = self._client.active_controller_id
                    status.fenced = True
                    if status.state is BrokerState.STARTING:
                        status.transition(BrokerState.RECOVERY)
                    self._log.info("registered", broker_epoch=response.broker_epoch)
                    return
                problem = f"{code.name}: {response.error_message}"
                if code in _FATAL_REGISTRATION_ERRORS:
                    raise RegistrationFailed(f"registration rejected: {problem}")
            if self._want_shut_down:
                raise RegistrationFailed(f"shutdown requested before registration succeeded ({problem})")
            if status.monotonic_ms() >= deadline_ms:
                raise RegistrationFailed(
                    f"not registered within {self._timings.registration_timeout_s:g} s: {problem}"
                )
            self._log.warning("registration_retry", attempt=attempt, reason=problem)
            await self._sleep(self._backoff_s(attempt))
            attempt += 1

    # --- heartbeats ---------------------------------------------------------------------------------

    async def run_heartbeats(self) -> None:
        """Heartbeat until cancelled (or until the controller grants a requested shutdown)."""
        attempt = 0
        while not self.shutdown_granted.is_set():
            ok = await self._heartbeat_once()
            if self.shutdown_granted.is_set():
                return
            if ok:
                attempt = 0
                interval = self._timings.heartbeat_interval_s
                if self._want_shut_down:
                    interval = min(interval, PENDING_SHUTDOWN_INTERVAL_S)
                await self._sleep(interval)
            else:
                await self._sleep(min(self._backoff_s(attempt), self._timings.heartbeat_interval_s))
                attempt += 1

    async def _heartbeat_once(self) -> bool:
        status = self._status
        if status.broker_epoch >= 0 and status.lease_lapsed() and not status.resync_required:
            status.begin_resync()
            self._log.warning("session_lease_lapsed")
        request = cpb.BrokerHeartbeatRequest(
            cluster_id=status.cluster_id,
            broker_id=status.broker_id,
            broker_epoch=status.broker_epoch,
            current_metadata_offset=status.metadata_offset,
            want_fence=not self._caught_up() and not self._want_shut_down,
            want_shut_down=self._want_shut_down,
        )
        offline_dirs, offline_partitions = self._offline()
        if offline_dirs:
            request.offline_log_dirs.extend(offline_dirs)
            for topic, partition in offline_partitions:
                request.offline_partitions.add(topic=topic, partition=partition)
        sent_at_ms = status.monotonic_ms()
        try:
            response = await self._heartbeats(request, self._timings.call_timeout_s)
        except ControllerUnavailable as err:
            self._log.warning("heartbeat_failed", reason=str(err))
            return False
        code = ErrorCode.from_wire(response.error_code)
        status.controller_id = self._client.active_controller_id
        if code in _REREGISTER_ERRORS:
            self._stop_serving(f"{code.name}: {response.error_message}")
            if self._want_shut_down:
                self.shutdown_granted.set()  # nothing left to hand over
                return True
            await self.register()
            return True
        if code is not ErrorCode.NONE:
            self._log.warning("heartbeat_rejected", code=code.name, message=response.error_message)
            return False
        if status.broker_epoch >= 0 and status.lease_lapsed() and not status.resync_required:
            # The lease ran out while this heartbeat was on its way (sent before the lapse, answered
            # after): the controller may have fenced this broker and moved its leaderships meanwhile, and
            # then unfenced it on this very heartbeat (caught up to its epoch, not asking to be fenced).
            # Extending the lease from the send would let it serve those leaderships again unresynced.
            status.begin_resync()
            self._log.warning("session_lease_lapsed", in_flight_ms=status.monotonic_ms() - sent_at_ms)
        previous_ms = status.last_heartbeat_accepted_ms
        status.heartbeat_accepted(sent_at_ms)
        self._apply_heartbeat(response, sent_at_ms - previous_ms if previous_ms >= 0 else -1)
        return True

    async def _unary_heartbeat(
        self, request: cpb.BrokerHeartbeatRequest, timeout_s: float
    ) -> cpb.BrokerHeartbeatResponse:
        return await self._client.call(lambda stub: stub.BrokerHeartbeat, request, timeout_s)

    def _apply_heartbeat(self, response: cpb.BrokerHeartbeatResponse, gap_ms: int = -1) -> None:
        """``gap_ms``: since the previous accepted heartbeat was sent (-1: none), for the fenced line."""
        status = self._status
        if response.should_shut_down and not self._want_shut_down:
            # An operator asked the controller to shut this broker down (`kraft broker shutdown`).
            self._log.info("shutdown_requested_by_controller")
            self.request_shutdown()
        if self._want_shut_down:
            if response.should_shut_down:
                self._log.info("controlled_shutdown_granted")
                status.fenced = True
                self.shutdown_granted.set()
            return
        if response.is_fenced:
            if not status.fenced:
                # The controller fenced us although we did not ask: our session expired on its side
                # (heartbeats late or lost: see its broker_session_expired line) or it fenced us on purpose.
                self.fence_locally(
                    "fenced_by_controller",
                    reason="the heartbeat answer says fenced: the controller expired this broker's session "
                    "(heartbeats did not arrive within broker.session.timeout.ms)",
                    ms_since_previous_accepted_heartbeat=gap_ms,
                    session_timeout_ms=status.session_timeout_ms,
                    controller=status.controller_id,
                )
        else:
            if status.fenced:
                self._log.info("unfenced")
            status.fenced = False
            if status.state is BrokerState.RECOVERY:
                status.transition(BrokerState.RUNNING)

    def fence_locally(self, event: str, **why: object) -> None:
        """Stop serving at once because the controller fenced this broker (heartbeat answer or image);
        ``on_fenced`` lets the owner hold back the next unfence request until the image shows it.
        ``why``: fields of the log line that say why (reason, …)."""
        status = self._status
        status.fenced = True
        status.begin_resync()
        if status.state is BrokerState.RUNNING:
            status.transition(BrokerState.RECOVERY)
        self._log.warning(event, **why)
        self._on_fenced()

    def _stop_serving(self, reason: str) -> None:
        status = self._status
        status.fenced = True
        status.revoke_lease()
        status.begin_resync()
        if status.state is BrokerState.RUNNING:
            status.transition(BrokerState.RECOVERY)
        self._log.warning("registration_lost", reason=reason)

    # --- helpers --------------------------------------------------------------------------------------

    def _backoff_s(self, attempt: int) -> float:
        base = self._timings.retry_backoff_s * (2.0 ** min(attempt, 10))
        capped = min(base, max(self._timings.heartbeat_interval_s, self._timings.retry_backoff_s))
        return capped * (0.5 + self._rng.random() / 2)

    async def _sleep(self, seconds: float) -> None:
        """Sleep, but return early when woken."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), seconds)
        self._wake.clear()
