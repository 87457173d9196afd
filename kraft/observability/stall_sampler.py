"""Where a node's threads wait: event-loop lag and GIL waits, sampled (issue #17, session 14).

A heartbeat answered on the intake thread in ~50 µs of CPU can still take hundreds of milliseconds when
that thread cannot run: its loop is busy with other calls, another thread holds the GIL in one long C
operation (a big protobuf parse, a dict resize, a GC pass), or the OS has no core for it (2 cores, 3
controllers and a client).  Two samplers tell these apart, off unless ``observability.stall.sampler.ms``
is set (each wakes ``1000 / ms`` times a second and wants the GIL each time):

- :class:`LoopLagSampler`, one per event loop (``loop="main"``, ``loop="intake"``): a ``call_later``
  chain; how late each turn ran is that loop's lag — its own queue, the GIL and the CPU together
  (``kraft_node_loop_lag_seconds``).
- :class:`GilSampler`: a thread that only sleeps.  How late it wakes is the wait for a core plus the
  wait for the GIL; the kernel counts the first (``/proc/thread-self/schedstat``: time runnable but not
  running), so the rest is the GIL (``kraft_node_sampler_wakeup_delay_seconds{wait="total"|"gil"}``).
  A GIL wait the switch interval cannot break (0.1 ms on a node, ``GIL_SWITCH_INTERVAL_S``) is one C
  call that never released it.

Each sample also goes to :class:`StallLog` when it is at least ``log_ms`` (20 ms) long: one INFO line
``event=stall_sampled`` with the monotonic time it ended, so a benchmark can line up a slow request
with what the node's threads were doing then (bench.controller ``--beats-out``).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Final

from google.protobuf.message import Message
from google.protobuf.unknown_fields import UnknownFieldSet
from prometheus_client import Histogram

from kraft.observability.logging import get_logger
from kraft.observability.thread_names import named_target

_STALL_BUCKETS: Final = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0)

LOOP_LAG = Histogram(
    "kraft_node_loop_lag_seconds",
    "How late an event loop ran a sampling timer (observability.stall.sampler.ms): the loop's own queue, "
    "the GIL and the CPU together",
    ("node", "loop"),
    buckets=_STALL_BUCKETS,
)
SAMPLER_WAKEUP_DELAY = Histogram(
    "kraft_node_sampler_wakeup_delay_seconds",
    "How late a sleeping sampler thread got to run again (wait=total), and that less the time the kernel "
    "had it runnable without a core (wait=gil: the wait for the GIL)",
    ("node", "wait"),
    buckets=_STALL_BUCKETS,
)

Observe = Callable[[float], None]


class StallLog:
    """Logs samples of at least ``log_s`` (one line each, with the monotonic time the stall ended)."""

    def __init__(self, node: str, log_s: float) -> None:
        self._node = node
        self._log_s = log_s
        self._log = get_logger("stall_sampler", node=node)

    def note(self, what: str, seconds: float, ended_s: float, **extra: float) -> None:
        if seconds >= self._log_s:
            self._log.info(
                "stall_sampled",
                what=what,
                ms=round(seconds * 1000, 1),
                ended_monotonic_s=round(ended_s, 4),
                **{key: round(value * 1000, 1) for key, value in extra.items()},
            )


class LoopLagSampler:
    """Every ``period_s`` on ``loop``: how late the previous timer ran (``observe`` gets the seconds)."""

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        period_s: float,
        observe: Observe,
        log: StallLog,
        name: str,
        *,
        now: Callable[[], float] = time.monotonic,
    ) -> None:
        self._loop = loop
        self._now = now
        self._period_s = period_s
        self._observe = observe
        self._stall_log = log
        self._name = name
        self._handle: asyncio.TimerHandle | None = None
        self._due_s = 0.0
        self._stopped = False

    def start(self) -> None:
        """Thread-safe: the first timer is set on ``loop``."""
        self._loop.call_soon_threadsafe(self._arm)

    def stop(self) -> None:
        """Thread-safe; the timer in flight, if any, finds itself stopped."""
        self._stopped = True

    def _arm(self) -> None:
        if self._stopped:
            return
        self._due_s = self._now() + self._period_s
        self._handle = self._loop.call_later(self._period_s, self._tick)

    def _tick(self) -> None:
        now = self._now()
        late = max(0.0, now - self._due_s)
        self._observe(late)
        self._stall_log.note(self._name, late, now)
        self._arm()


def _run_delay_s() -> float | None:
    """This thread's time runnable but waiting for a core, in seconds (None where the kernel does not say)."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as stat:
            return int(stat.read().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


class GilSampler:
    """A daemon thread that sleeps ``period_s`` at a time and reports how late it woke
    (``observe_total``) and how much of that was not the kernel's run queue (``observe_gil``).
    ``now``, ``sleep`` and ``run_delay`` are the clock, the sleep and the run-queue reading (tests)."""

    def __init__(
        self,
        period_s: float,
        observe_total: Observe,
        observe_gil: Observe,
        log: StallLog,
        name: str,
        *,
        now: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        run_delay: Callable[[], float | None] = _run_delay_s,
    ) -> None:
        self._period_s = period_s
        self._observe_total = observe_total
        self._observe_gil = observe_gil
        self._stall_log = log
        self._now = now
        self._sleep = sleep
        self._run_delay = run_delay
        self._stop = threading.Event()
        self._thread = threading.Thread(target=named_target(name, self._run), name=name, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()

    def sample(self) -> None:
        """One sleep and what its wake-up waited for."""
        queued_before = self._run_delay()
        start = self._now()
        self._sleep(self._period_s)  # releases the GIL; the wake-up takes it back
        now = self._now()
        queued_after = self._run_delay()
        late = max(0.0, now - start - self._period_s)
        queued = 0.0
        if queued_before is not None and queued_after is not None:
            queued = min(late, max(0.0, queued_after - queued_before))
        gil = late - queued
        self._observe_total(late)
        self._observe_gil(gil)
        self._stall_log.note("gil_sampler", late, now, gil_ms=gil, run_queue_ms=queued)


SENT_METADATA_KEY: Final = "x-kraft-sent-monotonic-ns"
"""A benchmark client's send time (``time.monotonic_ns()``, one clock for every process of a host) in a
heartbeat's metadata: :class:`ArrivalProbe` turns it into the call's arrival delay on the node."""

SENT_FIELD_NUMBER: Final = 100_000
"""The same send time on a ``BrokerHeartbeatStream`` message, whose metadata is the stream's (sent once, at
its opening): a varint field no ``.proto`` declares, so a protobuf parser keeps it among the message's
unknown fields (and an intake process's byte-for-byte proxy passes it on).  Not a declared field because it
is a benchmark's measurement, not part of the protocol: a broker never sends it, a node ignores it unless
its stall sampler is on.  :func:`stamp_sent` writes it, :meth:`ArrivalProbe.message` reads it."""


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        if not value:
            out.append(low)
            return bytes(out)
        out.append(low | 0x80)


_SENT_TAG: Final = _varint(SENT_FIELD_NUMBER << 3)  # wire type 0: varint


def stamp_sent(message: Message, sent_ns: int | None = None) -> None:
    """Add the send time (now, or ``sent_ns``) to ``message`` as :data:`SENT_FIELD_NUMBER` (a fresh
    message: a second stamp would add a second field, and the probe reads the first)."""
    message.MergeFromString(_SENT_TAG + _varint(time.monotonic_ns() if sent_ns is None else sent_ns))


HEARTBEAT_ARRIVAL_DELAY = Histogram(
    "kraft_controller_heartbeat_arrival_delay_seconds",
    "With observability.stall.sampler.ms, for heartbeats that carry their send time (benchmark clients on "
    "the same host): from the client's send to the call's (or stream message's) handler on the intake thread",
    ("node",),
    buckets=_STALL_BUCKETS,
)


class ArrivalProbe:
    """How long a heartbeat that carries its send time took to reach its handler: the client's send, the
    kernel, gRPC's transport on this node and the wait for the intake loop.  A unary call carries it in
    its metadata (:data:`SENT_METADATA_KEY`, :meth:`__call__`), a stream message in the message
    (:data:`SENT_FIELD_NUMBER`, :meth:`message`).  Observed, and logged (``event=heartbeat_arrived_late``)
    when at least ``log_ms``."""

    def __init__(self, node: int | str, log_ms: int = 20) -> None:
        self._observe = HEARTBEAT_ARRIVAL_DELAY.labels(str(node)).observe
        self._log_ns = log_ms * 1_000_000
        self._log = get_logger("stall_sampler", node=node)

    def __call__(self, metadata: object, broker_id: int) -> None:
        if not metadata:
            return
        for key, value in metadata:  # type: ignore[attr-defined]
            if key == SENT_METADATA_KEY:
                try:
                    sent_ns = int(value)
                except ValueError:
                    return
                self._arrived(sent_ns, broker_id)
                return

    def message(self, request: Message, broker_id: int) -> None:
        """A stream message's arrival: its :data:`SENT_FIELD_NUMBER`, if it carries one."""
        fields = UnknownFieldSet(request)
        for index in range(len(fields)):  # indexed: the stubs declare no __iter__
            field = fields[index]
            if field.field_number == SENT_FIELD_NUMBER and field.wire_type == 0:
                self._arrived(int(field.data), broker_id)
                return

    def _arrived(self, sent_ns: int, broker_id: int) -> None:
        delay_ns = time.monotonic_ns() - sent_ns
        self._observe(delay_ns / 1e9)
        if delay_ns >= self._log_ns:
            self._log.info(
                "heartbeat_arrived_late",
                broker=broker_id,
                sent_monotonic_s=round(sent_ns / 1e9, 4),
                ms=round(delay_ns / 1e6, 1),
            )


class StallSamplers:
    """The samplers of one node: its main loop, its intake loop (if any) and a GIL sampler thread."""

    def __init__(self, node: int | str, period_ms: int, log_ms: int = 20) -> None:
        label = str(node)
        self._period_s = period_ms / 1000
        self._log = StallLog(label, log_ms / 1000)
        self._node = label
        self._loops: list[LoopLagSampler] = []
        self._gil = GilSampler(
            self._period_s,
            SAMPLER_WAKEUP_DELAY.labels(label, "total").observe,
            SAMPLER_WAKEUP_DELAY.labels(label, "gil").observe,
            self._log,
            "kraft-stall-sampler",
        )

    def watch_loop(self, loop: asyncio.AbstractEventLoop, name: str) -> None:
        observe = LOOP_LAG.labels(self._node, name).observe
        sampler = LoopLagSampler(loop, self._period_s, observe, self._log, name)
        self._loops.append(sampler)
        sampler.start()

    def start(self) -> None:
        self._gil.start()

    def stop(self) -> None:
        self._gil.stop()
        for sampler in self._loops:
            sampler.stop()
