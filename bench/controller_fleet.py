"""``bench.controller``'s simulated brokers: a heartbeating fleet, its own lateness, and worker processes.

Session 10 found that up to half of the slowest 1 % of "heartbeat latency during bulk work" was the
benchmark's own client: one Python process played 1,000 brokers (and sent the bulk requests) on the
same 2 cores as the quorum, and a heartbeat whose answer arrived while that process's loop was busy
counted the wait as the quorum's latency (docs/internals/raft-performance.md, "Heartbeats during bulk,
the client and the lease (session 11)").  So the fleet now measures itself:

- **send lateness**: each heartbeat's actual send time against its schedule (one every ``interval_s``,
  spread evenly over the fleet);
- **loop lags** (:class:`LoopLagTicker`): a ticker task on each client loop records every turn that came
  more than :data:`LAG_SAMPLE_S` late.  A response that arrives while the loop is stalled is noticed only
  when the stall ends, so a heartbeat whose answer was noticed as a stall of its own process's loop ended
  (within :data:`NOTICE_SLACK_S`) is tagged with that stall's length, at most its whole latency
  (``client_lag``): the most of that heartbeat's latency that was the client noticing the answer late
  rather than the quorum answering late.  (The answer may have come at any moment of the stall, so this
  is an upper bound of the client's share; ``latency - client_lag`` a lower bound of the quorum's.)

And it can run elsewhere: :class:`FleetWorkers` splits brokers 2..N over K worker processes
(``--broker-processes K``), each on its own event loop (uvloop by default, what every kraft process runs),
and merges every heartbeat's ``(sent at, latency, …)`` into the one list the windows are computed from,
exactly as when the whole fleet ran in the benchmark's process (``time.monotonic`` is CLOCK_MONOTONIC,
one clock for every process of the host).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import gc
import json
import math
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from kraft.client.admin import AdminClient
from kraft.client.channel import ChannelPool
from kraft.client.controller import MAX_RECONNECT_BACKOFF_MS, RECONNECT_BACKOFF_MS, ControllerClient
from kraft.client.heartbeat_stream import HeartbeatStream
from kraft.clock import SystemClock
from kraft.errors import ErrorCode, KraftError
from kraft.observability.stall_sampler import SENT_METADATA_KEY, stamp_sent
from kraft.procutil import reap_children_on_exit, spawn_child
from kraft.runtime import loop_factory
from kraft.v1 import common_pb2
from kraft.v1 import controller_pb2 as cpb

REPO_ROOT = Path(__file__).resolve().parents[1]

TICK_S = 0.005
"""The loop-lag ticker's period: 200 wake-ups a second per client process (~1 % of a core)."""
LAG_SAMPLE_S = 0.005
"""A ticker turn later than this is recorded as a stall of that loop."""
CLIENT_LAG_S = 0.020
"""A heartbeat whose answer was noticed at the end of a stall of its own client's loop of at least this
long is counted as "during a client lag" (session 10's probe used the same 20 ms)."""
NOTICE_SLACK_S = 0.020
"""How far apart the end of a stall (the ticker's wake-up) and the noticing of an answer that waited in
it may be: when the loop resumes, the answers that came meanwhile and the ticker are all ready at once and
run in some order, each answer taking its share of a loop turn."""
REGISTER_CONCURRENCY = 32
"""Registrations in flight at once, over the whole fleet (as before the worker processes)."""


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


class Beat(NamedTuple):
    """One answered heartbeat (all times ``time.monotonic()`` seconds)."""

    sent: float
    latency: float
    send_late: float
    """How long after its schedule the heartbeat was sent."""
    client_lag: float = 0.0
    """The stall of the sending process's loop that ended as the answer was noticed (at most the
    latency): the most of this heartbeat's latency the client itself can have added."""


@dataclass
class LoopLagTicker:
    """Records the stalls of the loop it runs on: (stall end, stall length) for each turn of a
    :data:`TICK_S` ticker that came more than :data:`LAG_SAMPLE_S` late."""

    stalls: list[tuple[float, float]] = field(default_factory=list)
    _task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None

    async def _run(self) -> None:
        while True:
            due = time.monotonic() + TICK_S
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            if now - due > LAG_SAMPLE_S:
                self.stalls.append((now, now - due))

    def lag_at_notice(self, sent: float, noticed: float) -> float:
        """How much of [sent, noticed] the loop can have spent stalled with the answer already there: the
        longest recorded stall that ended within :data:`NOTICE_SLACK_S` of ``noticed``, clipped to the
        round trip (0: no stall ended then)."""
        lags = [
            min(lag, noticed - sent)
            for stall_end, lag in self.stalls
            if abs(stall_end - noticed) <= NOTICE_SLACK_S and stall_end - lag < noticed
        ]
        return max(lags, default=0.0)


GC_SAMPLE_S = 0.005
"""A collection of the client's own cyclic GC at least this long is recorded (:class:`GcPauses`)."""


@dataclass
class GcPauses:
    """The client process's own GC pauses (session 14): (end, seconds, generation) of every collection of
    at least :data:`GC_SAMPLE_S` — a full collection over the client's heap (tens of thousands of recorded
    heartbeats, the bulk requests) stops its loop as a CPU shortage would."""

    pauses: list[tuple[float, float, int]] = field(default_factory=list)
    _started: float | None = None

    def install(self) -> None:
        gc.callbacks.append(self._callback)

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        now = time.monotonic()
        if phase == "start":
            self._started = now
            return
        started, self._started = self._started, None
        if started is not None and now - started >= GC_SAMPLE_S:
            self.pauses.append((now, now - started, int(info.get("generation", 2))))


def next_send_at(previous_at: float, now: float, interval_s: float) -> float:
    """A simulated broker's next send time: the next slot of its fixed schedule (``previous_at`` + k
    intervals) that is not already past — the slots missed while its last heartbeat was slow (a stall of
    the quorum or of this client) are skipped, not sent late back to back.  A real broker waits an
    interval after each answer (kraft.broker.lifecycle) and never catches up either; sending the missed
    slots at once made a starved 2-core host's fleet a burst of up to (stall / interval) heartbeats per
    broker — load that kept the quorum saturated after the stall had ended (raft-performance.md,
    "Heartbeat errors under intake processes (session 14)")."""
    next_at = previous_at + interval_s
    if next_at < now:
        next_at += math.ceil((now - next_at) / interval_s) * interval_s
    return next_at


def error_kind(exc: Exception) -> str:
    """A heartbeat's failure as a short kind: the exception's type, with its error code for a KraftError
    and, for the client's "no active controller answered" (every attempt failed), the gRPC status it
    quotes (DEADLINE_EXCEEDED: nothing came back in the attempt's time)."""
    if isinstance(exc, KraftError):
        for status in ("DEADLINE_EXCEEDED", "UNAVAILABLE", "CANCELLED", "RESOURCE_EXHAUSTED"):
            if status in exc.message:
                return f"{type(exc).__name__}:{exc.code.name}:{status}"
        return f"{type(exc).__name__}:{exc.code.name}"
    return type(exc).__name__


STREAMS_PER_CONNECTION = 250
"""Simulated brokers whose heartbeat streams share one connection.  A server takes at most
``grpc.max.concurrent.streams`` (1,000) streams per connection, and gRPC puts channels of equal arguments
on one connection: 1,000 brokers' long-lived streams there would leave the admin client's calls no room
(a real broker holds one stream on its own connection)."""


@dataclass
class Fleet:
    """Simulated brokers heartbeating every ``interval_s`` through one admin client."""

    client: AdminClient
    beats: AdminClient
    cluster_id: str
    interval_s: float
    epochs: dict[int, int] = field(default_factory=dict)
    latencies: list[Beat] = field(default_factory=list)
    fenced_after_unfence: set[int] = field(default_factory=set)
    errors: int = 0
    error_kinds: collections.Counter[str] = field(default_factory=collections.Counter)
    """``errors`` by kind (:func:`error_kind`): a timeout on the client is told from an answer's error."""
    stopped: set[int] = field(default_factory=set)
    stalls: list[tuple[float, float]] = field(default_factory=list)
    """Loop stalls of every process that sent heartbeats (merged; see :class:`LoopLagTicker`)."""
    gc_pauses: list[tuple[float, float, int]] = field(default_factory=list)
    """GC pauses of every process that sent heartbeats (merged; see :class:`GcPauses`)."""
    heartbeat_stream: bool = True
    """As a broker does by default (``broker.heartbeat.stream``): each broker's steady heartbeats over one
    BrokerHeartbeatStream (kraft.client.heartbeat_stream); False: a unary call each, as before session 15."""
    _streams: dict[int, HeartbeatStream] = field(default_factory=dict)
    _stream_clients: dict[int, ControllerClient] = field(default_factory=dict)

    async def register(self, broker_id: int) -> None:
        request = cpb.RegisterBrokerRequest(
            cluster_id=self.cluster_id,
            broker_id=broker_id,
            incarnation_id=f"bench-{broker_id}",
            listeners=[common_pb2.Endpoint(name="PLAINTEXT", host="127.0.0.1", port=20_000 + broker_id)],
            rack=f"rack-{broker_id % 10}",
        )
        response = await self.client.call(lambda s: s.RegisterBroker, request)
        self.epochs[broker_id] = response.broker_epoch
        beat = await self.beat(broker_id, patient=True)
        if beat.is_fenced:
            raise RuntimeError(f"broker {broker_id} not unfenced: {beat}")

    async def beat(self, broker_id: int, patient: bool = False) -> cpb.BrokerHeartbeatResponse:
        request = cpb.BrokerHeartbeatRequest(
            cluster_id=self.cluster_id,
            broker_id=broker_id,
            broker_epoch=self.epochs[broker_id],
            current_metadata_offset=1 << 50,  # a broker that applies everything at once
        )
        if self.heartbeat_stream and not patient:
            stream = self._streams.get(broker_id)
            if stream is None:
                stream = self._streams[broker_id] = HeartbeatStream(self._stream_client(broker_id))
            # the send time rides in the message (the stream's metadata is sent once): a node with
            # observability.stall.sampler.ms measures each message's arrival delay from it
            stamp_sent(request)
            # the whole budget of the unary path's admin client (beats: timeout_s=2.0)
            return await stream.heartbeat(request, self.beats.timeout_s)
        client = self.client if patient else self.beats
        # the send time rides along: a node with observability.stall.sampler.ms measures the call's
        # arrival delay from it (kraft_controller_heartbeat_arrival_delay_seconds); others ignore it
        return await client.call(
            lambda s: functools.partial(
                s.BrokerHeartbeat, metadata=((SENT_METADATA_KEY, str(time.monotonic_ns())),)
            ),
            request,
            check=False,
        )

    def _stream_client(self, broker_id: int) -> ControllerClient:
        """The controller client broker ``broker_id``'s stream rides on: one per
        :data:`STREAMS_PER_CONNECTION` brokers, each on a connection of its own."""
        shard = broker_id // STREAMS_PER_CONNECTION
        client = self._stream_clients.get(shard)
        if client is None:
            options = [
                ("grpc.initial_reconnect_backoff_ms", RECONNECT_BACKOFF_MS),
                # the minimum time of one connection attempt, not a backoff (grpc_transport.channel_options)
                ("grpc.min_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
                ("grpc.max_reconnect_backoff_ms", MAX_RECONNECT_BACKOFF_MS),
                # a connection of its own (gRPC shares one between channels of equal arguments)
                ("kraft.bench.heartbeat.connection", shard),
            ]
            voters = [(-1, target) for target in self.beats.targets]
            client = ControllerClient(voters, channels=ChannelPool(options, None, name="fleet_heartbeats"))
            self._stream_clients[shard] = client
        return client

    async def close_streams(self) -> None:
        """Close the heartbeat streams and their connections (the fleet's brokers stopped)."""
        for stream in self._streams.values():
            stream.close()
        self._streams.clear()
        clients, self._stream_clients = self._stream_clients, {}
        for client in clients.values():
            await client.close()

    async def run_one(self, broker_id: int, offset_s: float) -> None:
        scheduled = time.monotonic() + offset_s
        await asyncio.sleep(offset_s)
        next_at = time.monotonic()
        send_late = next_at - scheduled
        while broker_id not in self.stopped:
            sent = time.monotonic()
            try:
                response = await self.beat(broker_id)
            except Exception as exc:
                self.errors += 1
                self.error_kinds[error_kind(exc)] += 1
            else:
                self.latencies.append(Beat(sent, time.monotonic() - sent, send_late))
                if response.error_code != ErrorCode.NONE:
                    self.errors += 1
                    self.error_kinds[f"answer:{ErrorCode.from_wire(response.error_code).name}"] += 1
                elif response.is_fenced and broker_id not in self.stopped:
                    self.fenced_after_unfence.add(broker_id)
            next_at = next_send_at(next_at, time.monotonic(), self.interval_s)
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            send_late = max(0.0, time.monotonic() - next_at)

    def tag_client_lags(self, ticker: LoopLagTicker, first: int = 0) -> None:
        """Tag ``latencies[first:]`` (sent from the ticker's loop) with the stall of that loop each answer
        waited in (:meth:`LoopLagTicker.lag_at_notice`), and keep the ticker's stalls."""
        self.latencies[first:] = [
            beat._replace(client_lag=ticker.lag_at_notice(beat.sent, beat.sent + beat.latency))
            for beat in self.latencies[first:]
        ]
        self.stalls.extend(ticker.stalls)

    def window(self, start: float, end: float) -> dict[str, Any]:
        """Heartbeat latency of the heartbeats sent in [start, end), and the client's own lateness in it."""
        beats = [beat for beat in self.latencies if start <= beat.sent < end]
        values = [beat.latency * 1000 for beat in beats]
        out: dict[str, Any] = {
            "heartbeats": len(values),
            "p50_ms": round(percentile(values, 0.50), 2),
            "p99_ms": round(percentile(values, 0.99), 2),
            "max_ms": round(max(values, default=0.0), 2),
        }
        if beats:
            out["client"] = self.client_lateness(beats, start, end)
        return out

    def timeline(self, start: float, end: float, bin_s: float) -> list[list[float]]:
        """The heartbeats sent in [start, end) in bins of ``bin_s`` from ``start``: per bin [its start
        (s after ``start``), heartbeats, p50 ms, p99 ms, max ms] — where in a window its slowest were."""
        bins: list[list[float]] = [[] for _ in range(max(1, int((end - start) / bin_s + 0.999)))]
        for beat in self.latencies:
            if start <= beat.sent < end:
                bins[min(len(bins) - 1, int((beat.sent - start) / bin_s))].append(beat.latency * 1000)
        return [
            [
                round(i * bin_s, 2),
                len(values),
                round(percentile(values, 0.50), 1),
                round(percentile(values, 0.99), 1),
                round(max(values, default=0.0), 1),
            ]
            for i, values in enumerate(bins)
        ]

    def client_lateness(self, beats: list[Beat], start: float, end: float) -> dict[str, Any]:
        late = [beat.send_late * 1000 for beat in beats]
        stalls = [lag * 1000 for stall_end, lag in self.stalls if start <= stall_end < end]
        slowest = sorted(beats, key=lambda beat: beat.latency)[int(0.99 * len(beats)) :]
        clean = [beat.latency * 1000 for beat in beats if beat.client_lag < CLIENT_LAG_S]
        less_lag = [(beat.latency - beat.client_lag) * 1000 for beat in beats]
        pauses = [seconds * 1000 for pause_end, seconds, _ in self.gc_pauses if start <= pause_end < end]
        return {
            "gc_pauses_over_5ms": len(pauses),
            "gc_pause_ms": round(sum(pauses), 1),
            "gc_pause_max_ms": round(max(pauses, default=0.0), 1),
            "send_late_p50_ms": round(percentile(late, 0.50), 2),
            "send_late_p99_ms": round(percentile(late, 0.99), 2),
            "send_late_max_ms": round(max(late, default=0.0), 2),
            "loop_stalls_over_20ms": sum(1 for lag in stalls if lag >= CLIENT_LAG_S * 1000),
            "loop_stall_ms_over_20ms": round(sum(lag for lag in stalls if lag >= CLIENT_LAG_S * 1000), 1),
            "loop_stall_max_ms": round(max(stalls, default=0.0), 2),
            "slowest_1pct": len(slowest),
            "slowest_1pct_during_client_lag": sum(1 for beat in slowest if beat.client_lag >= CLIENT_LAG_S),
            # The quorum's share, as far as the client can tell: the heartbeats whose answer did not
            # wait in a stall of 20 ms or more of the client's loop, and every heartbeat's latency less
            # the stall its answer can have waited in (a lower bound of what the quorum took).
            "p99_ms_without_client_lag": round(percentile(clean, 0.99), 2),
            "heartbeats_without_client_lag": len(clean),
            "p99_ms_less_client_lag": round(percentile(less_lag, 0.99), 2),
        }


async def gather_limited(limit: int, coros: list[Any]) -> list[Any]:
    semaphore = asyncio.Semaphore(limit)

    async def one(coro: Any) -> Any:
        async with semaphore:
            return await coro

    return list(await asyncio.gather(*(one(c) for c in coros)))


def beat_offset_s(broker_id: int, brokers: int, interval_s: float) -> float:
    """Where in the interval broker ``broker_id`` heartbeats: spread evenly over the fleet."""
    return (broker_id % 1000) * interval_s / min(brokers, 1000)


# ---------------------------------------------------------------------------------------------- workers


@dataclass
class FleetWorkers:
    """Brokers ``broker_ids`` registered and heartbeating from ``processes`` worker processes
    (``python -m bench.controller_fleet``), each with its own admin clients on a ``loop`` event loop.

    Protocol (one JSON object a line): the benchmark writes the worker's settings, the worker answers
    ``{"registered": n}`` once its brokers are registered and unfenced; ``beat`` starts the heartbeats,
    ``stop`` ends them and the worker answers with every heartbeat and loop stall it recorded."""

    targets: Sequence[str]
    cluster_id: str
    broker_ids: Sequence[int]
    brokers: int
    interval_s: float
    processes: int
    loop: str
    heartbeat_stream: bool = True
    _children: list[subprocess.Popen[str]] = field(default_factory=list)

    async def register(self) -> None:
        shares = [list(self.broker_ids[i :: self.processes]) for i in range(self.processes)]
        for share in shares:
            child: subprocess.Popen[str] = spawn_child(
                [sys.executable, "-m", "bench.controller_fleet", "--loop", self.loop],
                cwd=REPO_ROOT,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            self._children.append(child)
            settings = {
                "targets": list(self.targets),
                "cluster_id": self.cluster_id,
                "broker_ids": share,
                "brokers": self.brokers,
                "interval_s": self.interval_s,
                "register_concurrency": max(1, REGISTER_CONCURRENCY // self.processes),
                "heartbeat_stream": self.heartbeat_stream,
            }
            self._send(child, settings)
        for answer in await self._answers():
            if "registered" not in answer:
                raise RuntimeError(f"fleet worker failed to register its brokers: {answer}")

    async def start_beating(self) -> None:
        for child in self._children:
            self._send(child, "beat")

    async def stop(self, fleet: Fleet) -> None:
        """End the heartbeats and merge every worker's into ``fleet``."""
        for child in self._children:
            self._send(child, "stop")
        for answer in await self._answers():
            fleet.latencies.extend(Beat(*beat) for beat in answer["beats"])
            fleet.stalls.extend((end, lag) for end, lag in answer["stalls"])
            fleet.gc_pauses.extend((end, s, g) for end, s, g in answer.get("gc_pauses", []))
            fleet.errors += answer["errors"]
            fleet.fenced_after_unfence.update(answer["fenced_after_unfence"])
        fleet.latencies.sort(key=lambda beat: beat.sent)
        self.close()

    def close(self) -> None:
        for child in self._children:
            if child.poll() is None:
                child.kill()
            child.wait()
            for stream in (child.stdin, child.stdout):
                if stream is not None:
                    stream.close()
        self._children.clear()

    @staticmethod
    def _send(child: subprocess.Popen[str], message: object) -> None:
        assert child.stdin is not None
        child.stdin.write(json.dumps(message) + "\n")
        child.stdin.flush()

    async def _answers(self) -> list[dict[str, Any]]:
        """One answer line from every worker (read in threads: the benchmark's loop keeps running)."""

        def read(child: subprocess.Popen[str]) -> dict[str, Any]:
            assert child.stdout is not None
            line = child.stdout.readline()
            if not line:
                raise RuntimeError(f"fleet worker {child.pid} ended (exit {child.wait()})")
            answer: dict[str, Any] = json.loads(line)
            return answer

        return list(await asyncio.gather(*(asyncio.to_thread(read, child) for child in self._children)))


async def worker_main(read_line: Callable[[], str], write_line: Callable[[str], None]) -> None:
    """One fleet worker: register its brokers, heartbeat between ``beat`` and ``stop``, report."""
    settings = json.loads(await asyncio.to_thread(read_line))
    targets = settings["targets"]
    interval_s = float(settings["interval_s"])
    async with AdminClient(targets, timeout_s=300, clock=SystemClock()) as client:
        # heartbeats like a real broker's: one short attempt, no long retries (the next one comes soon)
        beats = AdminClient(targets, timeout_s=2.0, attempt_timeout_s=1.0, clock=SystemClock())
        fleet = Fleet(
            client, beats, settings["cluster_id"], interval_s, heartbeat_stream=settings["heartbeat_stream"]
        )
        ticker = LoopLagTicker()
        pauses = GcPauses()
        pauses.install()
        tasks: list[asyncio.Task[None]] = []
        try:
            await gather_limited(
                int(settings["register_concurrency"]), [fleet.register(b) for b in settings["broker_ids"]]
            )
            write_line(json.dumps({"registered": len(fleet.epochs)}))
            if json.loads(await asyncio.to_thread(read_line)) != "beat":
                raise RuntimeError("fleet worker: expected beat")
            ticker.start()
            brokers = int(settings["brokers"])
            tasks = [
                asyncio.create_task(fleet.run_one(b, beat_offset_s(b, brokers, interval_s)))
                for b in fleet.epochs
            ]
            if json.loads(await asyncio.to_thread(read_line)) != "stop":
                raise RuntimeError("fleet worker: expected stop")
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            await ticker.stop()
            await fleet.close_streams()
            await beats.close()
            pauses.uninstall()
    fleet.tag_client_lags(ticker)
    write_line(
        json.dumps(
            {
                "beats": [list(beat) for beat in fleet.latencies],
                "stalls": fleet.stalls,
                "gc_pauses": pauses.pauses,
                "errors": fleet.errors,
                "fenced_after_unfence": sorted(fleet.fenced_after_unfence),
            }
        )
    )


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # whatever it starts ends with it (kraft.procutil)
    import argparse

    parser = argparse.ArgumentParser(
        prog="python -m bench.controller_fleet", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--loop", default="uvloop", choices=("uvloop", "asyncio"))
    args = parser.parse_args(argv)
    # Like the controllers (kraft.node.metadata_layer): let gRPC's completion-queue thread get the GIL often.
    sys.setswitchinterval(0.0001)

    def write_line(line: str) -> None:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()

    run_loop(worker_main(sys.stdin.readline, write_line), args.loop)
    return 0


def run_loop(main: Any, loop: str) -> Any:
    """``asyncio.run(main)`` on the ``loop`` event loop (``asyncio``: the standard one)."""
    factory = loop_factory(loop)
    if factory is None:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=factory) as runner:
        return runner.run(main)


if __name__ == "__main__":
    sys.exit(main())
