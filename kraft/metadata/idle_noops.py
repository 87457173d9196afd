"""Idle NoOp: the active controller writes a NoOp record after ``metadata.max.idle.interval.ms`` without
other writes (Kafka's idle-interval NoOp), so the metadata log keeps advancing on an idle cluster."""

from __future__ import annotations

import contextlib

from kraft.metadata.controller_logic import Outcome
from kraft.metadata.controller_state import ControllerState, NotControllerError
from kraft.metadata.controller_writes import WritePath
from kraft.metadata.event_queue import EventQueueClosedError
from kraft.metadata.timers import Timers
from kraft.v1 import controller_pb2 as cpb


class IdleNoOps:
    def __init__(
        self, state: ControllerState, writes: WritePath, timers: Timers, *, interval_ms: int
    ) -> None:
        self._state = state
        self._writes = writes
        self._timers = timers
        self._interval_ms = interval_ms

    async def run(self) -> None:
        interval_ms = self._interval_ms
        if interval_ms <= 0:
            return
        writes = self._writes
        while True:
            await self._timers.sleep_ms(interval_ms)
            logic = self._state.logic
            if logic is None or self._timers.now_ms() - writes.last_write_ms < interval_ms:
                continue
            with contextlib.suppress(NotControllerError, TimeoutError, EventQueueClosedError):
                await writes.write(
                    lambda lg: Outcome(
                        lg.noop_records(writes.next_offset), cpb.BrokerHeartbeatResponse(), writes.next_offset
                    ),
                    name="idle-noop",
                    wait_for_jobs=False,
                )
