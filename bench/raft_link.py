"""The Raft Fetch link alone: what one round trip costs over grpc.aio and over a plain framed TCP link.

Issue #17's lone create waits on two Raft messages (the leader's FetchResponse to a follower, the
follower's next FetchRequest), ~510 and ~580 µs on a quiet 2-core host (docs/internals/raft-performance.md,
"End to end after session 20").  This measures the claim "a transport below grpc.aio would make those two
messages much cheaper": two processes on loopback, one request in flight, the real ``kraft.v1`` messages
(a FetchRequest as a follower sends it; a FetchResponse carrying one record batch of ``--sizes`` bytes,
300 B like a lone create's and 4 KB), for

- ``grpc_stream``: a ``FetchStream`` bidi stream exactly as
  :class:`~kraft.raft.grpc_transport.GrpcTransport` drives it (its
  :func:`~kraft.raft.grpc_transport.channel_options`, a :class:`~kraft.client.channel.ChannelPool` looked
  up per round trip, a lock and an ``asyncio.timeout`` per round trip), served by a server built
  like a node's (:func:`kraft.grpc_service.create_server`, :func:`kraft.grpc_service.register_service`:
  the request bytes decoded inside the handler), PLAINTEXT; ``grpc_stream_tls`` the same with mutual TLS
  (:func:`kraft.security.tls.server_credentials`, client certificate required);
- ``grpc_unary``: unary ``Fetch`` on the same channel (what a peer without FetchStream gets);
- ``native``: an asyncio :class:`asyncio.Protocol` on each side, 4-byte big-endian length-prefixed frames
  carrying the same serialized protobufs, the length checked against the bound before any buffer grows,
  the same lock and timeout per round trip, PLAINTEXT;
- ``native_tls``: the same over TLS 1.3 with a client certificate required (the server reads the peer's
  identity from its certificate once per connection, as an mTLS Raft link must);
- ``native_hop``: ``native`` with the server's protocol on a second thread's loop and every request handed
  to the main loop and its answer back with ``call_soon_threadsafe`` — the node's intake thread → main
  loop hop, so ``native_hop`` minus ``native`` measures that hop.

Every process runs on the loop kraft's nodes run on (:func:`kraft.runtime.loop_factory`: uvloop) and the
gRPC I/O layer they run on (:func:`kraft.runtime.configure_grpc_io`).  Per arm: round-trip p50/p99 (µs)
and the CPU per round trip of the client and of the server process (``/proc/<pid>/stat`` user+sys, all
threads, over the timed window).  Arms alternate within a round and the order reverses every round.
``--burner`` adds one round with one CPU burner process (``while True: pass``) running: the 2-core host
the target is set for is a loaded one.

Run it under ``flock /tmp/kraft-bench.lock``::

    PYTHONPATH=$PWD python -m bench.raft_link --rounds 4 --burner --out bench/results/raft-link-session21.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from bench.proc_cpu import TICK_S, snapshot
from kraft.netutil import free_port, wait_for_port
from kraft.procutil import reap, reap_children_on_exit, spawn_child
from kraft.runtime import configure_grpc_io, loop_factory

REPO_ROOT = Path(__file__).resolve().parents[1]
ARMS = ("grpc_stream", "grpc_stream_tls", "grpc_unary", "native", "native_tls", "native_hop")
GRPC_ARMS = frozenset({"grpc_stream", "grpc_stream_tls", "grpc_unary"})
TLS_ARMS = frozenset({"grpc_stream_tls", "native_tls"})
DEFAULT_SIZES = (300, 4096)
MAX_FRAME_BYTES = 16 * 1024 * 1024
"""The native link's frame bound: ``grpc.max.message.bytes``'s default, checked before allocation."""
HEADER_BYTES = 4
INITIAL_BUFFER_BYTES = 64 * 1024
MIN_READ_BYTES = 16 * 1024
ROUND_TRIP_TIMEOUT_S = 5.0
SERVER_START_TIMEOUT_S = 30.0
CLIENT_TIMEOUT_S = 120.0
CLUSTER_ID = "MkU3OEVBNTcwNTJENDM2Qg"
DIRECTORY_ID = "b3d4fS1rZXktZGlyZWN0bw"


# ------------------------------------------------------------------------------------------- messages


def fetch_request(max_bytes: int) -> Any:
    """A FetchRequest as a follower sends it (``max_bytes`` picks the answer's size in this benchmark)."""
    from kraft.v1 import raft_pb2

    return raft_pb2.FetchRequest(
        cluster_id=CLUSTER_ID,
        replica_id=2,
        current_leader_epoch=7,
        fetch_offset=123_456,
        last_fetched_epoch=7,
        max_wait_ms=500,
        max_bytes=max_bytes,
        replica_directory_id=DIRECTORY_ID,
        read_round=42,
        high_watermark=123_456,
    )


def fetch_response(records_bytes: int) -> Any:
    """A FetchResponse carrying one record batch of ``records_bytes`` (opaque bytes to the transport)."""
    from kraft.v1 import raft_pb2

    return raft_pb2.FetchResponse(
        leader_id=1,
        leader_epoch=7,
        high_watermark=123_456,
        log_start_offset=0,
        records=bytes(i % 251 for i in range(records_bytes)),
        read_round=42,
    )


def frame(payload: bytes) -> bytes:
    return len(payload).to_bytes(HEADER_BYTES, "big") + payload


class FrameTooLarge(Exception):
    """A frame header announced more than the bound: the connection is closed before any buffer grows."""


class FrameReader:
    """Splits a byte stream into length-prefixed frames, read straight into its own buffer (the
    :class:`asyncio.BufferedProtocol` side: :meth:`get_buffer`, then :meth:`updated`).  A length over
    ``max_bytes`` raises :class:`FrameTooLarge` as soon as its header is in, before the buffer grows for it.

    Why buffered: with a plain :class:`asyncio.Protocol` over TLS, the loop's SSL layer reads each record
    with ``SSLObject.read(256 KiB)``, a fresh 256 KiB allocation per read — above glibc's mmap threshold,
    so an mmap and munmap per message (one exploratory pair at load ~4.5, session 21: a uvloop TLS round
    trip 229 → 139 µs p50 with glibc's threshold raised).  A buffered protocol has it decrypt into this
    buffer instead (168 to 206 µs then, and ~30 % less client CPU, without touching the threshold)."""

    def __init__(self, max_bytes: int = MAX_FRAME_BYTES, initial_bytes: int = INITIAL_BUFFER_BYTES) -> None:
        self._max = max_bytes
        self._buffer = bytearray(initial_bytes)
        self._start = 0
        self._end = 0

    def get_buffer(self) -> memoryview:
        """Where the next read goes: the free tail of the buffer, compacted first when it is short."""
        start, end, buffer = self._start, self._end, self._buffer
        if start == end:
            self._start = self._end = 0
        elif len(buffer) - end < MIN_READ_BYTES:
            pending = end - start
            buffer[:pending] = buffer[start:end]  # same length: no resize, allowed while views exist
            self._start, self._end = 0, pending
        return memoryview(self._buffer)[self._end :]

    def updated(self, nbytes: int) -> list[bytes]:
        """``nbytes`` more were written at :meth:`get_buffer`'s view: the frames now complete."""
        self._end += nbytes
        buffer = self._buffer
        frames: list[bytes] = []
        while self._end - self._start >= HEADER_BYTES:
            start = self._start
            size = int.from_bytes(buffer[start : start + HEADER_BYTES], "big")
            if size > self._max:
                raise FrameTooLarge(f"frame of {size} bytes over the bound of {self._max}")
            stop = start + HEADER_BYTES + size
            if self._end < stop:
                if HEADER_BYTES + size + MIN_READ_BYTES > len(buffer):
                    # A frame larger than the buffer (within the bound): a new buffer, never a resize of
                    # one a read may still hold a view of.
                    grown = bytearray(HEADER_BYTES + size + MIN_READ_BYTES)
                    grown[: self._end - start] = buffer[start : self._end]
                    self._buffer, self._start, self._end = grown, 0, self._end - start
                break
            frames.append(bytes(buffer[start + HEADER_BYTES : stop]))
            self._start = stop
        return frames

    def feed(self, data: bytes) -> list[bytes]:
        """:meth:`get_buffer` and :meth:`updated` for bytes already read (tests)."""
        frames: list[bytes] = []
        view = memoryview(data)
        while view:
            target = self.get_buffer()
            n = min(len(target), len(view))
            target[:n] = view[:n]
            frames += self.updated(n)
            view = view[n:]
        return frames


# --------------------------------------------------------------------------------------------- TLS


@dataclass(frozen=True, slots=True)
class TlsPaths:
    truststore: Path
    server_keystore: Path
    client_keystore: Path


def write_tls(directory: Path) -> TlsPaths:
    from kraft.security.ca import write_cluster_tls

    files = write_cluster_tls(directory, ["controller-1", "controller-2"])
    return TlsPaths(files.truststore, files.keystore("controller-1"), files.keystore("controller-2"))


def tls_paths(directory: Path) -> TlsPaths:
    return TlsPaths(directory / "ca.pem", directory / "controller-1.pem", directory / "controller-2.pem")


def server_ssl_context(paths: TlsPaths) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(paths.server_keystore)
    context.load_verify_locations(cafile=paths.truststore)
    context.verify_mode = ssl.CERT_REQUIRED  # a peer proves who it is before it can send a Fetch
    return context


def client_ssl_context(paths: TlsPaths) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # verifies the server's chain and host name
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.load_cert_chain(paths.client_keystore)
    context.load_verify_locations(cafile=paths.truststore)
    return context


def peer_common_name(peercert: Any) -> str | None:
    """The CN of ``SSLObject.getpeercert()``'s subject (what ``principal_of`` maps to a node id)."""
    if not peercert:
        return None
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                return str(value)
    return None


# ------------------------------------------------------------------------------------------- servers


class _FrameServer(asyncio.BufferedProtocol):
    """One connection of the native server: a Fetch frame in, a FetchResponse frame out."""

    def __init__(self, answer: Callable[[bytes, asyncio.Transport], None]) -> None:
        self._answer = answer
        self._reader = FrameReader()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is no asyncio.Transport subclass
        ssl_object = transport.get_extra_info("ssl_object")
        if ssl_object is not None and peer_common_name(ssl_object.getpeercert()) is None:
            transport.close()  # no identity, no Raft

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        transport = self._transport
        assert transport is not None
        try:
            frames = self._reader.updated(nbytes)
        except FrameTooLarge:
            transport.close()
            return
        for payload in frames:
            self._answer(payload, transport)


def _direct_answerer(responses: dict[int, Any]) -> Callable[[bytes, asyncio.Transport], None]:
    from kraft.v1 import raft_pb2

    default = responses[min(responses)]

    def answer(payload: bytes, transport: asyncio.Transport) -> None:
        # Parsed and serialized per round trip, as the gRPC arms' (de)serializers do.
        request = raft_pb2.FetchRequest.FromString(payload)
        transport.write(frame(responses.get(request.max_bytes, default).SerializeToString()))

    return answer


def _hopping_answerer(
    responses: dict[int, Any], main_loop: asyncio.AbstractEventLoop
) -> Callable[[bytes, asyncio.Transport], None]:
    """Decode on the intake thread, answer on ``main_loop``, write back on the intake thread."""
    from kraft.v1 import raft_pb2

    default = responses[min(responses)]

    def answer(payload: bytes, transport: asyncio.Transport) -> None:
        request = raft_pb2.FetchRequest.FromString(payload)
        intake_loop = asyncio.get_running_loop()

        def on_main() -> None:
            data = frame(responses.get(request.max_bytes, default).SerializeToString())
            intake_loop.call_soon_threadsafe(transport.write, data)

        main_loop.call_soon_threadsafe(on_main)

    return answer


def _responses(sizes: tuple[int, ...]) -> dict[int, Any]:
    return {size: fetch_response(size) for size in sizes}


async def _serve_grpc(port: int, sizes: tuple[int, ...], tls: TlsPaths | None, stop: asyncio.Event) -> None:
    import grpc.aio

    from kraft.grpc_service import RequestDecoder, ServerLimits, create_server, register_service
    from kraft.v1 import raft_pb2

    responses = _responses(sizes)
    default = responses[min(responses)]

    class Servicer:
        """Fetch and FetchStream answer; every other RaftService method is registered but never called."""

        async def Fetch(self, request: Any, context: Any) -> Any:
            return responses.get(request.max_bytes, default)

        async def FetchStream(self, requests: AsyncIterator[Any], context: Any) -> AsyncIterator[Any]:
            async for request in requests:
                yield responses.get(request.max_bytes, default)

        def __getattr__(self, name: str) -> Callable[..., Any]:
            async def unimplemented(*_args: Any) -> None:
                raise NotImplementedError(name)

            return unimplemented

    server: grpc.aio.Server = create_server(ServerLimits())
    service = raft_pb2.DESCRIPTOR.services_by_name["RaftService"]
    register_service(server, Servicer(), service, RequestDecoder(logging.getLogger(__name__), "bad_request"))
    if tls is None:
        server.add_insecure_port(f"127.0.0.1:{port}")
    else:
        from kraft.client.channel import KeyStore, PemSource, TrustStore
        from kraft.security.tls import CLIENT_AUTH_REQUIRED, SslSettings, server_credentials

        settings = SslSettings(
            KeyStore.from_file(tls.server_keystore),
            TrustStore(PemSource(path=tls.truststore)),
            client_auth=CLIENT_AUTH_REQUIRED,
        )
        credentials, _reloader = server_credentials(settings, "CONTROLLER")
        server.add_secure_port(f"127.0.0.1:{port}", credentials)
    await server.start()
    await stop.wait()
    await server.stop(grace=None)


async def _serve_native(
    port: int, sizes: tuple[int, ...], tls: TlsPaths | None, hop: bool, stop: asyncio.Event
) -> None:
    responses = _responses(sizes)
    context = server_ssl_context(tls) if tls is not None else None
    if not hop:
        answer = _direct_answerer(responses)
        server = await asyncio.get_running_loop().create_server(
            lambda: _FrameServer(answer), "127.0.0.1", port, ssl=context
        )
        await stop.wait()
        server.close()
        return
    # The intake thread's loop accepts and reads; the main loop (this one) answers.
    main_loop = asyncio.get_running_loop()
    hopping = _hopping_answerer(responses, main_loop)
    intake_loop = (loop_factory() or asyncio.new_event_loop)()
    ready = threading.Event()

    def run_intake() -> None:
        asyncio.set_event_loop(intake_loop)

        async def listen() -> None:
            await intake_loop.create_server(lambda: _FrameServer(hopping), "127.0.0.1", port, ssl=context)
            ready.set()

        intake_loop.run_until_complete(listen())
        intake_loop.run_forever()

    thread = threading.Thread(target=run_intake, name="intake", daemon=True)
    thread.start()
    ready.wait(SERVER_START_TIMEOUT_S)
    await stop.wait()
    intake_loop.call_soon_threadsafe(intake_loop.stop)
    thread.join(5.0)


def serve(arm: str, port: int, sizes: tuple[int, ...], tls: TlsPaths | None) -> None:
    """The server process of ``arm`` (until SIGTERM)."""
    import signal

    async def run() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        if arm in GRPC_ARMS:
            await _serve_grpc(port, sizes, tls, stop)
        else:
            await _serve_native(port, sizes, tls, arm == "native_hop", stop)

    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        runner.run(run())


# ------------------------------------------------------------------------------------------- clients


class _FrameClient(asyncio.BufferedProtocol):
    """The native client's connection: one request in flight, its answer resolves :attr:`waiter`."""

    def __init__(self) -> None:
        self._reader = FrameReader()
        self.transport: asyncio.Transport | None = None
        self.waiter: asyncio.Future[bytes] | None = None
        self.closed = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        try:
            frames = self._reader.updated(nbytes)
        except FrameTooLarge as exc:
            assert self.transport is not None
            self.transport.close()
            self._fail(exc)
            return
        for payload in frames:
            waiter, self.waiter = self.waiter, None
            if waiter is not None and not waiter.done():
                waiter.set_result(payload)

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(exc or EOFError("the peer closed the link"))
        if not self.closed.done():
            self.closed.set_result(None)

    def _fail(self, exc: BaseException) -> None:
        waiter, self.waiter = self.waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_exception(exc)


async def _grpc_round_trips(
    arm: str, port: int, tls: TlsPaths | None
) -> tuple[Callable[[Any], Any], Callable[[], Any]]:
    """(one round trip, close) for a gRPC arm, driven as GrpcTransport drives a peer."""
    from kraft.client.channel import SSL, ChannelPool, ChannelSecurity, KeyStore, PemSource, TrustStore
    from kraft.raft.grpc_transport import DEFAULT_MAX_MESSAGE_BYTES, channel_options
    from kraft.v1 import raft_pb2, raft_pb2_grpc

    security = (
        ChannelSecurity(
            SSL, TrustStore(PemSource(path=tls.truststore)), KeyStore.from_file(tls.client_keystore)
        )
        if tls is not None
        else None
    )
    pool = ChannelPool(channel_options(DEFAULT_MAX_MESSAGE_BYTES, 1000), security, name="raft")
    address = f"127.0.0.1:{port}"
    lock = asyncio.Lock()
    channel = pool.get(address)
    stub = raft_pb2_grpc.RaftServiceStub(channel)
    stream: Any = None

    async def unary(request: Any) -> Any:
        nonlocal channel, stub
        if pool.get(address) is not channel:
            channel = pool.get(address)
            stub = raft_pb2_grpc.RaftServiceStub(channel)
        return await stub.Fetch(request, timeout=ROUND_TRIP_TIMEOUT_S)

    async def streamed(request: Any) -> Any:
        nonlocal channel, stub, stream
        if pool.get(address) is not channel:
            channel = pool.get(address)
            stub = raft_pb2_grpc.RaftServiceStub(channel)
        await lock.acquire()
        try:
            if stream is None:
                stream = stub.FetchStream(None)
            async with asyncio.timeout(ROUND_TRIP_TIMEOUT_S):
                await stream.write(request)
                response = await stream.read()
        finally:
            lock.release()
        if not isinstance(response, raft_pb2.FetchResponse):
            raise EOFError("the server ended the stream")
        return response

    async def close() -> None:
        if stream is not None:
            stream.cancel()
        await pool.close()

    return (unary if arm == "grpc_unary" else streamed), close


async def _native_round_trips(
    port: int, tls: TlsPaths | None
) -> tuple[Callable[[Any], Any], Callable[[], Any]]:
    """(one round trip, close) for a native arm: serialize, frame, write; await the answer frame, parse."""
    from kraft.v1 import raft_pb2

    loop = asyncio.get_running_loop()
    context = client_ssl_context(tls) if tls is not None else None
    _transport, protocol = await loop.create_connection(
        _FrameClient, "127.0.0.1", port, ssl=context, server_hostname="127.0.0.1" if context else None
    )
    lock = asyncio.Lock()

    async def round_trip(request: Any) -> Any:
        await lock.acquire()
        try:
            transport = protocol.transport
            assert transport is not None
            waiter: asyncio.Future[bytes] = loop.create_future()
            protocol.waiter = waiter
            transport.write(frame(request.SerializeToString()))
            async with asyncio.timeout(ROUND_TRIP_TIMEOUT_S):
                payload = await waiter
        finally:
            lock.release()
        return raft_pb2.FetchResponse.FromString(payload)

    async def close() -> None:
        if protocol.transport is not None:
            protocol.transport.close()
        await asyncio.wait_for(protocol.closed, 5.0)

    return round_trip, close


def _cpu_ticks(pid: int) -> int:
    taken = snapshot(pid)
    return taken.ticks if taken is not None else 0


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


async def _measure(
    arm: str,
    port: int,
    server_pid: int,
    sizes: tuple[int, ...],
    seconds: float,
    warmup: int,
    tls: TlsPaths | None,
) -> dict[str, Any]:
    """Per size: ``warmup`` round trips, then as many as fit in ``seconds``, timed one by one."""
    if arm in GRPC_ARMS:
        round_trip, close = await _grpc_round_trips(arm, port, tls)
    else:
        round_trip, close = await _native_round_trips(port, tls)
    me = os.getpid()
    result: dict[str, Any] = {}
    try:
        for size in sizes:
            request = fetch_request(size)
            for _ in range(warmup):
                answer = await round_trip(request)
            assert len(answer.records) == size, (len(answer.records), size)
            samples: list[float] = []
            client0, server0 = _cpu_ticks(me), _cpu_ticks(server_pid)
            started = time.perf_counter()
            end = started + seconds
            now = started
            while now < end:
                await round_trip(request)
                after = time.perf_counter()
                samples.append((after - now) * 1e6)
                now = after
            wall_s = now - started
            client1, server1 = _cpu_ticks(me), _cpu_ticks(server_pid)
            count = len(samples)
            result[str(size)] = {
                "round_trips": count,
                "p50_us": round(statistics.median(samples), 1),
                "p99_us": round(percentile(samples, 0.99), 1),
                "mean_us": round(wall_s / count * 1e6, 1),
                "client_cpu_us_per_rt": round((client1 - client0) * TICK_S / count * 1e6, 1),
                "server_cpu_us_per_rt": round((server1 - server0) * TICK_S / count * 1e6, 1),
            }
    finally:
        await close()
    return result


def client(
    arm: str,
    port: int,
    server_pid: int,
    sizes: tuple[int, ...],
    seconds: float,
    warmup: int,
    tls: TlsPaths | None,
) -> None:
    with asyncio.Runner(loop_factory=loop_factory()) as runner:
        result = runner.run(_measure(arm, port, server_pid, sizes, seconds, warmup, tls))
    print(json.dumps(result))


# ------------------------------------------------------------------------------------------- driver


def _child_env() -> dict[str, str]:
    env = dict(os.environ)
    configure_grpc_io(env)  # the gRPC I/O layer kraft's node processes run on
    return env


def run_arm(arm: str, sizes: tuple[int, ...], seconds: float, warmup: int, tls_dir: Path) -> dict[str, Any]:
    """One server process and one client process for ``arm``; the client's per-size numbers."""
    port = free_port()
    sizes_arg = ",".join(str(size) for size in sizes)
    common = ["--sizes", sizes_arg, "--tls-dir", str(tls_dir)]
    env = _child_env()
    server = spawn_child(
        [sys.executable, "-m", "bench.raft_link", "--serve", arm, "--port", str(port), *common],
        cwd=REPO_ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
    )
    try:
        if not wait_for_port("127.0.0.1", port, timeout_s=SERVER_START_TIMEOUT_S):
            raise RuntimeError(f"the {arm} server did not listen within {SERVER_START_TIMEOUT_S:.0f} s")
        command = [
            sys.executable, "-m", "bench.raft_link", "--client", arm, "--port", str(port),
            "--server-pid", str(server.pid), "--seconds", str(seconds), "--warmup", str(warmup), *common,
        ]  # fmt: skip
        process = spawn_child(
            command, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        try:
            stdout, stderr = process.communicate(timeout=CLIENT_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            process.kill()
            reap(process)
            raise RuntimeError(f"the {arm} client did not finish within {CLIENT_TIMEOUT_S:.0f} s") from None
        if process.returncode != 0:
            raise RuntimeError(f"the {arm} client failed ({process.returncode}): {stderr.strip()[-2000:]}")
        answer: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
        return answer
    finally:
        server.terminate()
        reap(server)


MEASURES = ("p50_us", "p99_us", "client_cpu_us_per_rt", "server_cpu_us_per_rt")
BASELINE_ARM = "grpc_stream"


def summarize(rounds: list[dict[str, Any]], arms: tuple[str, ...], sizes: tuple[int, ...]) -> dict[str, Any]:
    """Per arm and size, the median over the quiet rounds (burner rounds left out) of each measure, and
    in how many of them the arm's p50 was below :data:`BASELINE_ARM`'s of the same round
    (``p50_below_grpc_stream``: [rounds below, rounds compared])."""
    out: dict[str, Any] = {}
    quiet = [r for r in rounds if not r["burner"]]
    for arm in arms:
        per_size: dict[str, Any] = {}
        for size in sizes:
            key = str(size)
            cells = [r["arms"][arm][key] for r in quiet if arm in r["arms"]]
            if not cells:
                continue
            summary: dict[str, Any] = {
                measure: round(statistics.median(cell[measure] for cell in cells), 1) for measure in MEASURES
            }
            if arm != BASELINE_ARM:
                pairs = [
                    (r["arms"][arm][key]["p50_us"], r["arms"][BASELINE_ARM][key]["p50_us"])
                    for r in quiet
                    if arm in r["arms"] and BASELINE_ARM in r["arms"]
                ]
                summary[f"p50_below_{BASELINE_ARM}"] = [sum(1 for a, b in pairs if a < b), len(pairs)]
            per_size[key] = summary
        out[arm] = per_size
    return out


def _burner() -> subprocess.Popen[bytes]:
    return spawn_child([sys.executable, "-c", "while True: pass"], stdout=subprocess.DEVNULL)


def run(args: argparse.Namespace) -> dict[str, Any]:
    arms = tuple(args.arms.split(",")) if args.arms else ARMS
    unknown = set(arms) - set(ARMS)
    if unknown:
        raise SystemExit(f"unknown arms: {', '.join(sorted(unknown))} (known: {', '.join(ARMS)})")
    sizes = tuple(int(size) for size in args.sizes.split(","))
    result: dict[str, Any] = {
        "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "arms": list(arms),
        "sizes": list(sizes),
        "seconds_per_size": args.seconds,
        "warmup": args.warmup,
        "cores": os.cpu_count(),
        "load_average_before": [round(v, 2) for v in os.getloadavg()],
        "rounds": [],
    }
    plan = [False] * args.rounds + ([True] if args.burner else [])
    with tempfile.TemporaryDirectory(prefix="raft-link-") as scratch:
        tls_dir = Path(scratch)
        write_tls(tls_dir)
        for index, burner in enumerate(plan):
            order = arms if index % 2 == 0 else tuple(reversed(arms))
            one: dict[str, Any] = {
                "burner": burner,
                "order": list(order),
                "load_average_before": [round(v, 2) for v in os.getloadavg()],
                "arms": {},
            }
            hot = _burner() if burner else None
            try:
                for arm in order:
                    one["arms"][arm] = run_arm(arm, sizes, args.seconds, args.warmup, tls_dir)
                    label = f"round {index + 1}{' (burner)' if burner else ''} {arm}"
                    print(f"{label}: {json.dumps(one['arms'][arm])}", file=sys.stderr)
            finally:
                if hot is not None:
                    hot.kill()
                    reap(hot)
            one["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
            result["rounds"].append(one)
    result["load_average_after"] = [round(v, 2) for v in os.getloadavg()]
    result["summary"] = summarize(result["rounds"], arms, sizes)
    burner_rounds = [r for r in result["rounds"] if r["burner"]]
    if burner_rounds:
        result["burner_summary"] = summarize([{**r, "burner": False} for r in burner_rounds], arms, sizes)
    return result


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.raft_link", description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--burner", action="store_true", help="one more round with one CPU burner process")
    parser.add_argument("--arms", default="", help=f"comma-separated subset of {','.join(ARMS)}")
    parser.add_argument(
        "--sizes", default=",".join(str(s) for s in DEFAULT_SIZES), help="record bytes per answer"
    )
    parser.add_argument("--seconds", type=float, default=2.0, help="timed seconds per arm and size")
    parser.add_argument("--warmup", type=int, default=300, help="untimed round trips per arm and size")
    parser.add_argument("--out", type=Path, default=REPO_ROOT / "bench" / "results" / "raft-link.json")
    parser.add_argument("--serve", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--client", choices=ARMS, help=argparse.SUPPRESS)
    parser.add_argument("--port", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--server-pid", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--tls-dir", type=Path, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    reap_children_on_exit()  # no server, client or burner outlives the benchmark (kraft.procutil)
    args = parse_args(argv)
    sizes = tuple(int(size) for size in args.sizes.split(","))
    if args.serve or args.client:
        arm = args.serve or args.client
        tls = tls_paths(args.tls_dir) if arm in TLS_ARMS and args.tls_dir is not None else None
        if args.serve:
            serve(arm, args.port, sizes, tls)
        else:
            client(arm, args.port, args.server_pid, sizes, args.seconds, args.warmup, tls)
        return 0
    result = run(args)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result["summary"], indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
