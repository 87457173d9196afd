"""Issue #14's corruption suite at node level, broker side: a real broker (started in-process as
``kraft broker start`` does — the ``meta.properties`` check, the SQLite image store, :class:`BrokerServer`
with segmented partition logs, replication and gRPC — against an in-process fake controller) is given a
log dir with one damaged file — ``meta.properties``, a partition's ``.index``/``.timeindex``,
``recovery-point-offset-checkpoint`` or ``leader-epoch-checkpoint``, the dir's
``replication-offset-checkpoint``, the image store — by a flipped byte, a truncation, zeroed bytes or
garbage appended, and started.  Exactly one of two outcomes is allowed:

- it refuses to start (or stops: its only log dir offline) with one line that names the damaged file, or
- it runs with the partition hosted and every acknowledged record readable, byte for byte;

never serving less than it acknowledged, never serving the damaged bytes.

Built once: a broker that led a partition and acknowledged records (acks=all) over several segments,
stopped cleanly; each case copies that dir.  The partition's own files are damaged after removing its
clean-shutdown marker (a crash after the last flush), where the recovery point and epoch checkpoint
decide what is scanned and trusted.  Every case is one in-process start (~0.3 s); the 60 cases and the
build take ~15 s.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import dataclasses
import random
import shutil
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NoReturn

import grpc
import pytest
from fake_controller import FakeController

from kraft.broker import hwm_checkpoint
from kraft.broker.types import BrokerState, TopicPartition
from kraft.clock import SystemClock
from kraft.config import NodeConfig
from kraft.errors import KraftError
from kraft.metadata.store import IMAGE_STORE_FILE, SqliteImageStore
from kraft.netutil import free_port
from kraft.node.broker import BrokerServer, BrokerSettings, BrokerStartupError, cluster_id_of
from kraft.node.supervisor import Supervisor
from kraft.storage.ids import random_uuid
from kraft.storage.log import CLEAN_SHUTDOWN_FILE, RECOVERY_POINT_FILE
from kraft.storage.meta_properties import META_PROPERTIES_FILE, format_log_dir
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc
from kraft.v1 import metadata_pb2 as mpb

ME = 1
TOPIC_ID = "topic-orders"
TP = TopicPartition("orders", 0)
TIMEOUT_S = 15.0
KINDS = ("flip", "zero", "truncate", "extend")
# Text files also get "digit": their last number changed into another one.
TEXT_FILES = frozenset({"meta.properties", "recovery-point", "leader-epoch", "replication-offset-checkpoint"})
RECORDS = 60
VALUE_BYTES = 1000
SEGMENT_BYTES = 16 * 1024  # four index intervals: several segments, each with index entries


class Exited(BaseException):
    """Raised in place of the process exit (the supervisor's exit_process)."""


def _no_exit(code: int) -> NoReturn:
    raise Exited(code)


class _NoWatchdog:
    def cancel(self) -> None:
        return None


def _supervisor() -> Supervisor:
    return Supervisor(exit_process=_no_exit, start_watchdog=lambda _deadline, _fire: _NoWatchdog())


def _config(log_dir: Path, controller: FakeController) -> NodeConfig:
    port = free_port()
    return NodeConfig.build(
        process_roles="broker",
        node_id=ME,
        controller_quorum_voters=f"3000@127.0.0.1:{controller.port}",
        listeners=f"PLAINTEXT://127.0.0.1:{port}",
        log_dirs=str(log_dir),
        log_segment_bytes=SEGMENT_BYTES,
        broker_heartbeat_interval_ms=100,
        broker_session_timeout_ms=1500,
        controller_quorum_fetch_max_wait_ms=200,
    )


async def _controller(cluster_id: str) -> FakeController:
    """The same committed metadata for every start: one partition, led here, ISR = this broker."""
    fake = FakeController(cluster_id)
    await fake.start()
    fake.append(mpb.TopicRecord(name=TP.topic, topic_id=TOPIC_ID))
    fake.append(mpb.PartitionRecord(partition_id=0, topic_id=TOPIC_ID, replicas=[ME], isr=[ME], leader=ME))
    return fake


@dataclass
class Running:
    server: BrokerServer
    supervisor: Supervisor
    stop: asyncio.Event
    task: asyncio.Task[None]


async def _start(config: NodeConfig) -> Running:
    """What ``kraft broker start`` does after its meta.properties check (run_broker, minus the lock,
    signals and the process exit)."""
    cluster_id = cluster_id_of(config)
    store = await SqliteImageStore.open(config.log_dirs[0] / IMAGE_STORE_FILE, clock=_clock())
    supervisor = _supervisor()
    settings = dataclasses.replace(
        BrokerSettings.from_config(config, cluster_id), fetch_max_wait_ms=200, retry_backoff_ms=20
    )
    server = BrokerServer(settings, store, supervisor=supervisor)
    stop = asyncio.Event()
    return Running(server, supervisor, stop, asyncio.create_task(server.run(stop)))


def _clock() -> SystemClock:
    return SystemClock()


async def _wait(condition: Callable[[], bool], what: str, timeout_s: float = TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.02)


def _settled(running: Running) -> bool:
    return (
        running.supervisor.failure is not None
        or running.task.done()
        or running.server.status.state is BrokerState.RUNNING
    )


def _failed(running: Running) -> str | None:
    """Why the broker stopped, as ``run_broker`` reports it: the supervisor's failure, or the error
    ``BrokerServer.run`` raised (run_broker turns it into the fatal line ``reason=broker_failed``)."""
    failure = running.supervisor.failure
    if failure is not None:
        return f"{failure.reason} {failure.fields}"
    if running.task.done() and not running.task.cancelled() and running.task.exception() is not None:
        return f"broker_failed {running.task.exception()}"
    return None


async def _close(running: Running) -> None:
    if _failed(running) is not None:
        await running.server.abort()  # what run_broker's fail-stop does
        running.task.cancel()
        with contextlib.suppress(BaseException):
            await running.task
        return
    running.stop.set()
    await asyncio.wait_for(running.task, TIMEOUT_S)


@dataclass(frozen=True)
class Pristine:
    log_dir: Path
    cluster_id: str
    values: tuple[bytes, ...]  # every acknowledged record, offset = index


async def _produce(target: str, cluster_id: str, values: list[bytes]) -> None:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = broker_pb2_grpc.BrokerServiceStub(channel)
        for value in values:
            request = pb.ProduceRequest(
                cluster_id=cluster_id,
                topic=TP.topic,
                partition=TP.partition,
                leader_epoch=-1,
                acks=-1,
                records=[pb.BrokerRecord(value=value, has_value=True)],
            )
            response = await stub.Produce(request, timeout=TIMEOUT_S)
            assert response.error_code == 0, response


async def _build(log_dir: Path) -> Pristine:
    cluster_id = random_uuid()
    format_log_dir(log_dir, cluster_id=cluster_id, node_id=ME)
    controller = await _controller(cluster_id)
    try:
        running = await _start(_config(log_dir, controller))
        try:
            await _wait(lambda: _settled(running), "the broker to run")
            assert running.server.status.state is BrokerState.RUNNING
            values = [bytes([i % 251]) * VALUE_BYTES for i in range(RECORDS)]
            await _produce(f"127.0.0.1:{running.server.port}", cluster_id, values)
        finally:
            running.stop.set()
            await asyncio.wait_for(running.task, TIMEOUT_S)
        assert running.supervisor.failure is None
    finally:
        await controller.stop()
    partition = log_dir / TP.dir_name
    assert len([p for p in partition.glob("*.index") if p.stat().st_size > 0]) >= 2, "indexed segments"
    assert hwm_checkpoint.read_checked(log_dir).entries, "a high-watermark checkpoint"
    return Pristine(log_dir, cluster_id, tuple(values))


_built: list[Pristine] = []


async def _pristine() -> Pristine:
    """Built once per test session, copied by every case."""
    if not _built:
        root = Path(tempfile.mkdtemp(prefix="kraft-broker-corruption-"))
        atexit.register(shutil.rmtree, root, True)  # built once, removed when the test run ends
        log_dir = root / "logs"
        _built.append(await _build(log_dir))
    return _built[0]


# --- the damaged files -------------------------------------------------------------------------


FILES = (
    "meta.properties",
    "index",
    "timeindex",
    "recovery-point",
    "leader-epoch",
    "replication-offset-checkpoint",
    "image-store",
)
PARTITION_FILES = frozenset({"index", "timeindex", "recovery-point", "leader-epoch"})

# What each kind of file may do when damaged (asserted below):
EXPECTED: dict[str, set[str]] = {
    "meta.properties": {"refused", "recovered"},  # checksummed; a trailing comment still reads the same
    "index": {"recovered"},  # derived data: checked against the segment, rebuilt
    "timeindex": {"recovered"},
    "recovery-point": {"stopped", "recovered"},  # unreadable → full scan; above the end → refused
    "leader-epoch": {"stopped", "recovered"},  # unreadable → rebuilt; disagreeing → refused
    "replication-offset-checkpoint": {"recovered"},  # checksummed; unusable → high watermark from 0
    "image-store": {"recovered"},  # a cache: verified or discarded and rebuilt from the controller
}


def _victim(log_dir: Path, kind: str) -> Path:
    partition = log_dir / TP.dir_name
    if kind == "meta.properties":
        return log_dir / META_PROPERTIES_FILE
    if kind in ("index", "timeindex"):
        # The oldest segment's: below the recovery point, trusted without a scan.
        return next(p for p in sorted(partition.glob(f"*.{kind}")) if p.stat().st_size > 0)
    if kind == "recovery-point":
        return partition / RECOVERY_POINT_FILE
    if kind == "leader-epoch":
        return partition / "leader-epoch-checkpoint"
    if kind == "replication-offset-checkpoint":
        return log_dir / hwm_checkpoint.FILE_NAME
    assert kind == "image-store"
    return log_dir / IMAGE_STORE_FILE


def _damage(path: Path, damage: str, seed: str) -> None:
    """One damage at a position drawn from a per-case seed (deterministic, different per case)."""
    rng = random.Random(zlib.crc32(seed.encode()))
    before = path.read_bytes()
    data = bytearray(before)
    position = rng.randrange(len(data))
    if damage == "flip":
        data[position] ^= rng.randrange(1, 256)
    elif damage == "zero":
        end = min(len(data), position + rng.randrange(1, 64))
        data[position:end] = bytes(end - position)
        if bytes(data) == before:  # the range held zeros already: zero the file's first bytes
            data[: min(8, len(data))] = bytes(min(8, len(data)))
    elif damage == "truncate":
        del data[position:]
    elif damage == "digit":
        # A text file's last number changed into another valid number (still parses: only a checksum,
        # or a cross-check against the log, can tell).
        last = max(i for i, byte in enumerate(data) if chr(byte).isdigit())
        data[last] = ord("9") if data[last] != ord("9") else ord("1")
    else:
        data += bytes([rng.randrange(1, 256)]) * rng.randrange(1, 64)
    path.write_bytes(bytes(data))


def _names(text: str, victim: Path) -> bool:
    return victim.name in text or str(victim) in text


async def _start_damaged(pristine: Pristine, log_dir: Path, victim: Path) -> str:
    controller = await _controller(pristine.cluster_id)
    try:
        config = _config(log_dir, controller)
        try:
            running = await _start(config)
        except (BrokerStartupError, KraftError) as refused:
            line = str(refused)
            assert "\n" not in line and _names(line, victim), line
            return "refused"
        try:
            await _wait(lambda: _settled(running), "the broker to run or stop")
            failure = _failed(running)
            if failure is not None:
                assert _names(failure, victim), f"the fatal error does not name {victim.name}: {failure}"
                return "stopped"
            partition = running.server.partitions.get(TP)
            assert partition is not None, running.server.partitions.offline
            log = partition.log
            assert log.log_end_offset >= len(pristine.values)
            values: list[bytes | None] = []
            while len(values) < len(pristine.values):  # a read ends at a segment's end
                records = log.read_records(len(values), 1 << 30)
                assert records, f"nothing readable at offset {len(values)}"
                values.extend(r.value for r in records)
            assert values[: len(pristine.values)] == list(pristine.values)
            return "recovered"
        finally:
            await _close(running)
    finally:
        await controller.stop()


CASES = [
    *((file, damage, position) for file in FILES for damage in KINDS for position in (0, 1)),
    *((file, "digit", 0) for file in FILES if file in TEXT_FILES),
]


@pytest.mark.parametrize(("file", "damage", "position"), CASES)
async def test_a_broker_with_a_damaged_file_refuses_or_serves_everything_acknowledged(
    tmp_path: Path, file: str, damage: str, position: int
) -> None:
    pristine = await _pristine()
    log_dir = tmp_path / "logs"
    shutil.copytree(pristine.log_dir, log_dir)
    if file in PARTITION_FILES:
        (log_dir / TP.dir_name / CLEAN_SHUTDOWN_FILE).unlink()
    victim = _victim(log_dir, file)
    _damage(victim, damage, f"{file}/{damage}/{position}")
    outcome = await _start_damaged(pristine, log_dir, victim)
    assert outcome in EXPECTED[file], f"{file}/{damage}: {outcome}"
