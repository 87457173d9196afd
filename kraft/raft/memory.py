"""In-memory implementations of the driver's ports (tests, the one-voter test double, benchmarks).

They keep real Kafka v2 batch bytes (``kraft.storage.batch``) so the driver's byte handling is the same as
in production; :class:`MemoryLogStore` can :meth:`~MemoryLogStore.crash` to lose what was not flushed.
"""

from __future__ import annotations

import asyncio
from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from typing import Any

from kraft.clock import Clock, SystemClock
from kraft.raft.api import RaftShutdownError
from kraft.raft.control_codec import voter_control_messages, voters_in_snapshot
from kraft.raft.messages import RaftRequest, RaftResponse, SnapshotId
from kraft.raft.state import ElectionState
from kraft.raft.transport import RequestHandler, TransportError
from kraft.raft.voters import VoterSet
from kraft.storage.batch import (
    BatchHeader,
    SnapshotFooterRecord,
    SnapshotHeaderRecord,
    build_batch,
    build_control_batch,
    iter_batch_headers,
    iter_batches,
)
from kraft.storage.snapshot import validate_snapshot_bytes


class MemoryLogStore:
    def __init__(self) -> None:
        self._start = 0
        self._bases: list[int] = []
        self._batches: list[tuple[int, int, int, bytes]] = []  # (base, last, epoch, bytes)
        self._durable = 0  # number of batches made durable by flush()

    @property
    def start_offset(self) -> int:
        return self._start

    @property
    def end_offset(self) -> int:
        return self._batches[-1][1] + 1 if self._batches else self._start

    def epoch_entries(self) -> list[tuple[int, int]]:
        entries: list[tuple[int, int]] = []
        for base, _last, epoch, _data in self._batches:
            if not entries or entries[-1][0] != epoch:
                entries.append((epoch, max(base, self._start)))
        return entries

    def append(
        self, data: bytes, *, built: bool = False, checked: Sequence[BatchHeader] | None = None
    ) -> None:
        # The fake checks every batch whatever ``built`` and ``checked`` say (it is not timed).
        expected = self.end_offset
        parsed: list[tuple[int, int, int, bytes]] = []
        for position, header in iter_batch_headers(data):
            if header.base_offset != expected:
                raise ValueError(f"batch at {header.base_offset} does not continue the log at {expected}")
            chunk = data[position : position + header.size_in_bytes]
            parsed.append((header.base_offset, header.last_offset, header.partition_leader_epoch, chunk))
            expected = header.next_offset
        if not parsed:
            raise ValueError("append of an empty buffer")
        for batch in parsed:
            self._batches.append(batch)
            self._bases.append(batch[0])

    def flush(self) -> int:
        self._durable = len(self._batches)
        return self.end_offset

    def truncate_to(self, end_offset: int) -> None:
        index = bisect_left(self._bases, end_offset)
        # A batch straddling end_offset goes entirely, as in the segmented log.
        while index > 0 and self._batches[index - 1][1] >= end_offset:
            index -= 1
        del self._batches[index:]
        del self._bases[index:]
        self._durable = min(self._durable, len(self._batches))
        self._start = min(self._start, end_offset)

    def read(self, offset: int, max_bytes: int, max_offset: int | None = None) -> bytes:
        if offset < self._start or offset > self.end_offset:
            raise ValueError(f"offset {offset} is outside the log [{self._start}, {self.end_offset}]")
        index = bisect_right(self._bases, offset) - 1
        index = max(index, 0)
        out: list[bytes] = []
        size = 0
        while index < len(self._batches):
            base, last, _epoch, data = self._batches[index]
            if last < offset:
                index += 1
                continue
            if max_offset is not None and base >= max_offset:
                break
            if out and size + len(data) > max_bytes:
                break
            out.append(data)
            size += len(data)
            index += 1
        return b"".join(out)

    def delete_before(self, offset: int) -> int:
        if offset > self.end_offset:
            raise ValueError(f"cannot start the log at {offset}, beyond its end {self.end_offset}")
        drop = 0
        while drop < len(self._batches) and self._batches[drop][1] < offset:
            drop += 1
        del self._batches[:drop]
        del self._bases[:drop]
        self._durable = max(0, self._durable - drop)
        self._start = max(self._start, offset)
        return self._start

    def reset_to(self, start_offset: int) -> None:
        self._batches.clear()
        self._bases.clear()
        self._durable = 0
        self._start = start_offset

    def close(self) -> None:
        self.flush()

    def crash(self) -> None:
        """Lose every batch that was not flushed (tests)."""
        del self._batches[self._durable :]
        del self._bases[self._durable :]


class MemoryElectionStore:
    def __init__(self) -> None:
        self.state: ElectionState | None = None
        self.writes = 0

    def read(self) -> ElectionState | None:
        return self.state

    def write(self, state: ElectionState) -> None:
        self.state = state
        self.writes += 1


class MemorySnapshotStore:
    def __init__(self) -> None:
        self._frozen: dict[SnapshotId, bytes] = {}
        self._download: tuple[SnapshotId, bytearray] | None = None

    def latest(self) -> SnapshotId | None:
        return max(self._frozen, key=lambda s: (s.end_offset, s.epoch), default=None)

    def size(self, snapshot_id: SnapshotId) -> int:
        return len(self._frozen[snapshot_id])

    def read_chunk(self, snapshot_id: SnapshotId, position: int, max_bytes: int) -> bytes:
        data = self._frozen[snapshot_id]
        if position < 0 or position >= len(data):
            raise ValueError(f"position {position} outside snapshot of {len(data)} bytes")
        return data[position : position + max_bytes]

    def read_records(self, snapshot_id: SnapshotId) -> tuple[int, list[bytes]]:
        return decode_snapshot(self._frozen[snapshot_id])

    def read_voters(self, snapshot_id: SnapshotId) -> VoterSet | None:
        return voters_in_snapshot(self._frozen[snapshot_id])

    def write(
        self,
        snapshot_id: SnapshotId,
        last_contained_timestamp_ms: int,
        records: Sequence[bytes],
        now_ms: int,
        voters: VoterSet | None = None,
    ) -> None:
        self._frozen[snapshot_id] = encode_snapshot(
            snapshot_id, last_contained_timestamp_ms, records, now_ms, voters
        )

    def write_chunk(self, snapshot_id: SnapshotId, position: int, data: bytes) -> None:
        if position == 0:
            self._download = (snapshot_id, bytearray())
        if self._download is None or self._download[0] != snapshot_id or len(self._download[1]) != position:
            raise ValueError(f"snapshot chunk at {position} does not continue the download")
        self._download[1].extend(data)

    def finish_download(self, snapshot_id: SnapshotId) -> None:
        if self._download is None or self._download[0] != snapshot_id:
            raise ValueError(f"no download of {snapshot_id} in progress")
        data = bytes(self._download[1])
        self._download = None
        validate_snapshot_bytes(data, f"{snapshot_id}")
        self._frozen[snapshot_id] = data

    def delete_before(self, snapshot_id: SnapshotId) -> None:
        for old in [
            s for s in self._frozen if (s.end_offset, s.epoch) < (snapshot_id.end_offset, snapshot_id.epoch)
        ]:
            del self._frozen[old]


def encode_snapshot(
    snapshot_id: SnapshotId,
    last_contained_timestamp_ms: int,
    records: Sequence[bytes],
    now_ms: int,
    voters: VoterSet | None = None,
) -> bytes:
    """Kafka's snapshot layout: header control batch, with a dynamic quorum a control batch with
    KRaftVersion and Voters (KIP-853), one data batch, footer control batch."""
    parts = [
        build_control_batch(
            0,
            [SnapshotHeaderRecord(last_contained_log_timestamp=last_contained_timestamp_ms)],
            leader_epoch=snapshot_id.epoch,
            timestamp_ms=now_ms,
        )
    ]
    next_offset = 1
    if voters is not None:
        control = voter_control_messages(voters)
        parts.append(
            build_control_batch(next_offset, control, leader_epoch=snapshot_id.epoch, timestamp_ms=now_ms)
        )
        next_offset += len(control)
    if records:
        inputs = [(None, value) for value in records]
        parts.append(build_batch(next_offset, inputs, leader_epoch=snapshot_id.epoch, timestamp_ms=now_ms))
        next_offset += len(records)
    parts.append(
        build_control_batch(
            next_offset, [SnapshotFooterRecord()], leader_epoch=snapshot_id.epoch, timestamp_ms=now_ms
        )
    )
    return b"".join(parts)


def decode_snapshot(data: bytes) -> tuple[int, list[bytes]]:
    """(last contained timestamp, data record values) of snapshot bytes."""
    last_contained = -1
    values: list[bytes] = []
    for batch in iter_batches(data):
        if batch.is_control:
            for message in batch.control_messages():
                if isinstance(message, SnapshotHeaderRecord):
                    last_contained = message.last_contained_log_timestamp
            continue
        values.extend(record.value or b"" for record in batch.records)
    return last_contained, values


class LoopbackNetwork:
    """In-process transport between drivers (tests, single-process clusters): ``network.transport(id)``
    gives node ``id`` a :class:`~kraft.raft.transport.Transport`; :meth:`register` wires a handler;
    :meth:`isolate` / :meth:`heal` cut links.

    Request deadlines and the delay before an unreachable peer fails run on ``clock``, like the drivers'
    timers, so a cluster on a :class:`~kraft.clock.ManualClock` times requests out only when the test
    moves time.  As with :meth:`RaftDriver.recheck_timers <kraft.raft.driver.RaftDriver.recheck_timers>`,
    a clock moved by hand does not shorten the event-loop sleeps: call :meth:`recheck_timers` after
    moving it, then wait for :attr:`idle`.
    """

    def __init__(self, clock: Clock | None = None, *, unreachable_delay_ms: int = 50) -> None:
        self._handlers: dict[int, RequestHandler] = {}
        self.isolated: set[int] = set()
        self._clock: Clock = clock if clock is not None else SystemClock()
        self._unreachable_delay_ms = unreachable_delay_ms
        # Calls waiting on the clock: their wake-up future -> (deadline ms, the handler's answer if any).
        self._waiting: dict[asyncio.Future[None], tuple[int, asyncio.Future[RaftResponse] | None]] = {}

    def register(self, node_id: int, handler: RequestHandler) -> None:
        self._handlers[node_id] = handler

    def unregister(self, node_id: int) -> None:
        self._handlers.pop(node_id, None)

    def isolate(self, node_id: int) -> None:
        self.isolated.add(node_id)

    def heal(self) -> None:
        self.isolated.clear()

    def transport(self, node_id: int) -> LoopbackTransport:
        return LoopbackTransport(self, node_id)

    def recheck_timers(self) -> None:
        """Make every waiting call look at the clock now (after a manual clock moved)."""
        for wake in self._waiting:
            if not wake.done():
                wake.set_result(None)

    @property
    def idle(self) -> bool:
        """No call has reached its deadline or got its answer without having noticed yet.  Once a call
        notices, it hands the outcome to the sender synchronously (the sender's driver is then busy), so
        a test that waits for this and for every driver's ``idle`` knows no outcome is in flight."""
        now_ms = self._clock.monotonic_ms()
        return all(
            deadline_ms > now_ms and (answer is None or not answer.done())
            for deadline_ms, answer in self._waiting.values()
        )

    async def call(self, source: int, dest: int, request: RaftRequest, timeout_ms: int) -> RaftResponse:
        deadline_ms = self._clock.monotonic_ms() + timeout_ms
        handler = self._handlers.get(dest)
        if handler is None or source in self.isolated or dest in self.isolated:
            # Behave like a peer that does not answer: wait out the deadline, bounded.
            await self._wait(min(deadline_ms, self._clock.monotonic_ms() + self._unreachable_delay_ms))
            raise TransportError(dest, "UNAVAILABLE: unreachable")
        # Its own task (as a gRPC server gives each call), so the deadline can be raced against it.
        # The loopback knows who calls: it authenticates like mTLS would.
        answer = asyncio.ensure_future(handler.handle_request(request, peer_id=source))
        try:
            await self._wait(deadline_ms, answer)
        except BaseException:
            answer.cancel()  # the sender was cancelled (its driver stopped)
            raise
        if not answer.done():
            answer.cancel()
            raise TransportError(dest, "DEADLINE_EXCEEDED")
        try:
            response = answer.result()
        except RaftShutdownError as exc:
            raise TransportError(dest, f"UNAVAILABLE: {exc}") from None
        if source in self.isolated or dest in self.isolated:
            raise TransportError(dest, "UNAVAILABLE: unreachable")
        return response

    async def _wait(self, deadline_ms: int, answer: asyncio.Future[RaftResponse] | None = None) -> None:
        """Return once ``answer`` is done or the clock reaches ``deadline_ms``.  The event-loop timeout is
        only when to look at the clock again: on a system clock it is the deadline itself; on a manual
        one it just re-checks, and :meth:`recheck_timers` wakes it when the test moves time."""
        loop = asyncio.get_running_loop()
        while (answer is None or not answer.done()) and (
            remaining_ms := deadline_ms - self._clock.monotonic_ms()
        ) > 0:
            wake: asyncio.Future[None] = loop.create_future()
            self._waiting[wake] = (deadline_ms, answer)
            either: list[asyncio.Future[Any]] = [wake] if answer is None else [wake, answer]
            try:
                await asyncio.wait(either, timeout=remaining_ms / 1000, return_when=asyncio.FIRST_COMPLETED)
            finally:
                del self._waiting[wake]
                wake.cancel()


class LoopbackTransport:
    def __init__(self, network: LoopbackNetwork, node_id: int) -> None:
        self._network = network
        self._node_id = node_id

    async def send(self, dest: int, request: RaftRequest, timeout_ms: int) -> RaftResponse:
        return await self._network.call(self._node_id, dest, request, timeout_ms)

    async def close(self) -> None:
        self._network.unregister(self._node_id)
