"""One proxied TCP connection: two links (upstream, downstream), each pumping bytes through its toxics.

Theory of operation (mirrors Toxiproxy's ``link.go`` with one asyncio task pair per link instead of one
goroutine per toxic):

* A *reader* task reads chunks from the link's source socket, stamps each with the time it was read and
  queues it (at most ``QUEUE_CHUNKS`` chunks, which is the back-pressure a slow toxic exerts).
* A *pump* task takes chunks one by one and passes each through the link's active toxics in chain order
  (``_through``); the end of the chain writes to the destination socket.  Latency is counted from the
  read time, so sequential processing still adds a delay once, not once per queued chunk.
* Toxicity is drawn per link, not per chunk: on link start and again whenever the chain of this
  direction changes (Toxiproxy re-runs every stub then).
* A ``timeout`` toxic puts the pump in *blackhole* mode: chunks are read and dropped; after ``timeout``
  ms without data (0 = never) the connection closes; removing the toxic also closes it (Toxiproxy's
  Cleanup hook).
* Sleeps inside a toxic end early when that toxic is removed or drawn inactive, and the pending chunk is
  forwarded: Toxiproxy flushes an interrupted toxic's buffer downstream.
* When a link ends (EOF, error, ``limit_data`` reached, blackhole timeout) it closes its destination
  socket; the other link then reads EOF from that same socket, runs its own end-of-stream toxics
  (``slow_close``) and closes the other socket, so a connection always closes as a whole.
* ``reset_peer`` aborts both sockets with an RST (SO_LINGER 0), but only on connections that started
  while a ``reset_peer`` toxic was already in that direction's chain, as Toxiproxy does; other
  connections get an ordinary FIN.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import socket
import struct
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from chaos.proxy.toxics import Direction, Toxic

QUEUE_CHUNKS = 1024
READ_BYTES = 32 * 1024


class ToxicChains(Protocol):
    """What a link needs from its proxy: the current toxic chain of a direction, and where to count the
    pieces of data each toxic got (by toxic name)."""

    toxic_chunks: Counter[str]

    def chain(self, direction: Direction) -> list[Toxic]: ...


@dataclass(slots=True)
class _Chunk:
    data: bytes
    read_at: float  # loop.time() when the chunk was read


class _Signal:
    """Queue markers that are not data."""


_EOF = _Signal()
_CHANGED = _Signal()


class Link:
    """Bytes of one direction of one connection flowing through that direction's toxic chain."""

    def __init__(
        self,
        connection: Connection,
        direction: Direction,
        source: asyncio.StreamReader,
        dest: asyncio.StreamWriter,
        chains: ToxicChains,
        rng: random.Random,
    ) -> None:
        self._connection = connection
        self.direction = direction
        self._source = source
        self._dest = dest
        self._chains = chains
        self._rng = rng
        self._queue: asyncio.Queue[_Chunk | _Signal] = asyncio.Queue(maxsize=QUEUE_CHUNKS)
        self._changed = asyncio.Event()
        self._draws: dict[str, bool] = {}
        self._limit_sent: dict[str, int] = {}
        self.started_with_reset_peer = any(t.type == "reset_peer" for t in chains.chain(direction))
        self._redraw()

    # --- chain bookkeeping ---

    def _redraw(self) -> None:
        self._draws = {t.name: self._rng.random() < t.toxicity for t in self._chains.chain(self.direction)}

    def chain_changed(self) -> None:
        """Called by the proxy after a toxic of this direction was added, updated or removed."""
        self._redraw()
        fired, self._changed = self._changed, asyncio.Event()
        fired.set()
        # Wake a pump blocked on an empty queue; a full queue means the pump is busy and re-reads the chain.
        with contextlib.suppress(asyncio.QueueFull):
            self._queue.put_nowait(_CHANGED)

    def active_chain(self) -> list[Toxic]:
        return [t for t in self._chains.chain(self.direction) if self._draws.get(t.name, False)]

    def _current(self, name: str) -> Toxic | None:
        """The toxic of that name if it is still in the chain and drawn active for this link."""
        for toxic in self._chains.chain(self.direction):
            if toxic.name == name:
                return toxic if self._draws.get(name, False) else None
        return None

    def _present(self, name: str) -> bool:
        return any(t.name == name for t in self._chains.chain(self.direction))

    # --- tasks ---

    async def read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            while True:
                data = await self._source.read(READ_BYTES)
                if not data:
                    break
                await self._queue.put(_Chunk(data, loop.time()))
        except (ConnectionError, OSError):
            pass
        await self._queue.put(_EOF)

    async def pump_loop(self) -> None:
        reset = False
        try:
            reset = await self._pump()
        except (ConnectionError, OSError):
            pass
        finally:
            if reset:
                self._connection.close(reset=True)
            else:
                self._dest.close()
                self._connection.link_finished(self.direction)

    async def _pump(self) -> bool:
        """Run until the link ends; True when it must end with an RST."""
        while True:
            chain = self.active_chain()
            hole = next((t for t in chain if t.type == "timeout"), None)
            if hole is not None:
                if await self._blackhole(hole):
                    continue
                return False
            item = await self._queue.get()
            if item is _CHANGED:
                continue
            if isinstance(item, _Chunk):
                outcome = await self._through(chain, 0, item.data, item.read_at)
                if outcome is not None:
                    return outcome
                continue
            return await self._on_eof(chain)

    async def _blackhole(self, toxic: Toxic) -> bool:
        """Drop everything; True if the toxic stays but was drawn inactive (data flows again)."""
        loop = asyncio.get_running_loop()
        deadline = self._hole_deadline(toxic, loop.time())
        while True:
            remaining = None if deadline is None else deadline - loop.time()
            if remaining is not None and remaining <= 0:
                return False
            try:
                item = await asyncio.wait_for(self._queue.get(), remaining)
            except TimeoutError:
                return False
            if item is _EOF:
                return False
            if isinstance(item, _Chunk):
                self._chains.toxic_chunks[toxic.name] += 1  # dropped by the hole
            # Re-check on every item, not only on _CHANGED: that marker is dropped when the queue is full.
            if not self._present(toxic.name):
                return False  # Cleanup: removing a timeout toxic closes its connections.
            current = self._current(toxic.name)
            if current is None:
                return True
            toxic = current
            # Every pass of Toxiproxy's select loop starts a fresh timer.
            deadline = self._hole_deadline(toxic, loop.time())

    @staticmethod
    def _hole_deadline(toxic: Toxic, now: float) -> float | None:
        timeout_ms = toxic.attr("timeout")
        return None if timeout_ms <= 0 else now + timeout_ms / 1000.0

    async def _sleep(self, seconds: float, toxic: Toxic) -> None:
        """Sleep, ending early when ``toxic`` is removed or drawn inactive (its chunk is then flushed)."""
        if seconds <= 0:
            return
        loop = asyncio.get_running_loop()
        deadline = loop.time() + seconds
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return
            changed = self._changed
            try:
                await asyncio.wait_for(changed.wait(), remaining)
            except TimeoutError:
                return
            if self._current(toxic.name) is None:
                return

    async def _write(self, data: bytes) -> None:
        self._dest.write(data)
        await self._dest.drain()

    async def _through(self, chain: list[Toxic], index: int, data: bytes, read_at: float) -> bool | None:
        """Pass ``data`` through ``chain[index:]``; None to continue, else end the link (True = RST)."""
        if index == len(chain):
            await self._write(data)
            return None
        toxic = chain[index]
        # Counted before the toxic acts (its sleep starts in this same loop step): once a test sees the
        # count move, the piece is held by this toxic, so the test needs no sleep to be sure of it.
        self._chains.toxic_chunks[toxic.name] += 1
        kind = toxic.type
        if kind == "latency":
            jitter_ms = toxic.attr("jitter")
            # Go draws the jitter from [-jitter, +jitter).
            jitter_draw = self._rng.randint(-jitter_ms, jitter_ms - 1) if jitter_ms > 0 else 0
            delay_ms = toxic.attr("latency") + jitter_draw
            loop = asyncio.get_running_loop()
            await self._sleep(read_at + delay_ms / 1000.0 - loop.time(), toxic)
            return await self._through(chain, index + 1, data, read_at)
        if kind == "bandwidth":
            return await self._bandwidth(chain, index, toxic, data, read_at)
        if kind == "slicer":
            return await self._slicer(chain, index, toxic, data, read_at)
        if kind == "limit_data":
            return await self._limit_data(chain, index, toxic, data, read_at)
        if kind == "reset_peer":
            # The chunk is swallowed; after `timeout` ms the link closes.
            await self._sleep(toxic.attr("timeout") / 1000.0, toxic)
            return self.started_with_reset_peer
        # noop and slow_close pass data through untouched.
        return await self._through(chain, index + 1, data, read_at)

    async def _bandwidth(
        self, chain: list[Toxic], index: int, toxic: Toxic, data: bytes, read_at: float
    ) -> bool | None:
        rate_kb_s = toxic.attr("rate")
        if rate_kb_s <= 0:
            # Toxiproxy stalls forever on rate <= 0 (an endless split loop); kraft passes data instead.
            return await self._through(chain, index + 1, data, read_at)
        slice_bytes = rate_kb_s * 100  # what `rate` KB/s moves in 100 ms
        while len(data) > slice_bytes:
            await self._sleep(0.1, toxic)
            outcome = await self._through(chain, index + 1, data[:slice_bytes], read_at)
            if outcome is not None:
                return outcome
            data = data[slice_bytes:]
        await self._sleep(len(data) / rate_kb_s / 1000.0, toxic)
        return await self._through(chain, index + 1, data, read_at)

    async def _slicer(
        self, chain: list[Toxic], index: int, toxic: Toxic, data: bytes, read_at: float
    ) -> bool | None:
        pieces = slice_chunk(data, toxic.attr("average_size"), toxic.attr("size_variation"), self._rng)
        for position, piece in enumerate(pieces):
            if position:
                await self._sleep(toxic.attr("delay") / 1_000_000.0, toxic)
            outcome = await self._through(chain, index + 1, piece, read_at)
            if outcome is not None:
                return outcome
        return None

    async def _limit_data(
        self, chain: list[Toxic], index: int, toxic: Toxic, data: bytes, read_at: float
    ) -> bool | None:
        limit = toxic.attr("bytes")
        sent = self._limit_sent.get(toxic.name, 0)
        allowed = data[: max(limit - sent, 0)]
        if allowed:
            self._limit_sent[toxic.name] = sent + len(allowed)
            outcome = await self._through(chain, index + 1, allowed, read_at)
            if outcome is not None:
                return outcome
        if self._limit_sent.get(toxic.name, 0) >= limit:
            return False
        return None

    async def _on_eof(self, chain: list[Toxic]) -> bool:
        for toxic in chain:
            if toxic.type == "slow_close":
                await self._sleep(toxic.attr("delay") / 1000.0, toxic)
            elif toxic.type == "reset_peer":
                await self._sleep(toxic.attr("timeout") / 1000.0, toxic)
                return self.started_with_reset_peer
        return False


def slice_chunk(data: bytes, average_size: int, size_variation: int, rng: random.Random) -> list[bytes]:
    """Toxiproxy's slicer: halve (± variation) until each piece is ≤ average_size + size_variation."""
    if average_size <= 0 or len(data) <= average_size + size_variation:
        return [data]
    pieces: list[bytes] = []
    stack = [data]
    while stack:
        piece = stack.pop()
        if len(piece) <= average_size + size_variation:
            pieces.append(piece)
            continue
        shift = rng.randint(-size_variation, size_variation) if size_variation > 0 else 0
        middle = min(max(len(piece) // 2 + shift, 1), len(piece) - 1)
        # Push the right half first so the left half is emitted first (order is preserved).
        stack.append(piece[middle:])
        stack.append(piece[:middle])
    return pieces


class Connection:
    """A client connection accepted by a proxy plus its upstream connection and the two links."""

    def __init__(
        self,
        client: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        upstream: tuple[asyncio.StreamReader, asyncio.StreamWriter],
        chains: ToxicChains,
        rng: random.Random,
        on_closed: Callable[[Connection], None],
    ) -> None:
        self._client_writer = client[1]
        self._upstream_writer = upstream[1]
        self._on_closed = on_closed
        self._closed = False
        self._finished: set[Direction] = set()
        self._tasks: list[asyncio.Task[None]] = []
        self.links = {
            Direction.UPSTREAM: Link(self, Direction.UPSTREAM, client[0], upstream[1], chains, rng),
            Direction.DOWNSTREAM: Link(self, Direction.DOWNSTREAM, upstream[0], client[1], chains, rng),
        }

    def start(self) -> None:
        for link in self.links.values():
            self._tasks.append(asyncio.create_task(link.read_loop()))
            self._tasks.append(asyncio.create_task(link.pump_loop()))

    def chain_changed(self, direction: Direction) -> None:
        if not self._closed:
            self.links[direction].chain_changed()

    def link_finished(self, direction: Direction) -> None:
        self._finished.add(direction)
        if len(self._finished) == len(self.links):
            self.close()

    def close(self, reset: bool = False) -> None:
        """Close both sockets (FIN, or RST with ``reset``) and stop the tasks; idempotent."""
        if self._closed:
            return
        self._closed = True
        for writer in (self._client_writer, self._upstream_writer):
            if reset:
                sock = writer.get_extra_info("socket")
                if sock is not None:
                    with contextlib.suppress(OSError):
                        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                writer.transport.abort()
            else:
                writer.close()
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()
        self._on_closed(self)
