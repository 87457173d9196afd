"""In-memory fakes for the broker unit tests (fakes, not mocks: they behave like the real thing)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar, cast

from google.protobuf.message import Message

from kraft.broker.fetcher import FetcherTimings, MetadataFetcher
from kraft.broker.partitions import Pacer, PartitionManager
from kraft.broker.publisher import MetadataPublisher
from kraft.broker.replica_transport import ReplicaFetchFailed
from kraft.broker.types import ProducedRecord, StoredRecord
from kraft.client.controller import ControllerClient
from kraft.clock import Clock, ManualClock
from kraft.metadata import records as rec
from kraft.metadata.delta import MetadataDelta
from kraft.metadata.image import MetadataImage
from kraft.storage.batch import build_batch, encode_batch, iter_batches
from kraft.storage.errors import OffsetOutOfRangeError, RecordTooLargeError
from kraft.v1 import broker_pb2 as pb
from kraft.v1.common_pb2 import Endpoint, NodeRef

T = TypeVar("T")


class MemoryPartitionLog:
    """A PartitionLog kept in a list; remembers which directory it was opened for."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.records: list[StoredRecord] = []
        self.batches: list[tuple[int, bytes]] = []  # (base offset, encoded batch), for replication
        self.closed = False
        self.start_offset = 0
        self.flushed = 0
        self.flush_calls = 0  # how many times flush() ran (a follower catching up flushes less often)

    @property
    def log_start_offset(self) -> int:
        return self.start_offset

    @property
    def log_end_offset(self) -> int:
        return self.start_offset + len(self.records)

    def append_records(
        self, records: Sequence[ProducedRecord], leader_epoch: int, max_batch_bytes: int | None = None
    ) -> int:
        size = len(build_batch(0, [(r.key, r.value) for r in records], leader_epoch=0, timestamp_ms=0))
        if max_batch_bytes is not None and size > max_batch_bytes:
            raise RecordTooLargeError(f"record batch of {size} bytes is above the limit of {max_batch_bytes}")
        base = self.log_end_offset
        for i, r in enumerate(records):
            self.records.append(StoredRecord(base + i, r.timestamp_ms, r.key, r.value, leader_epoch))
        batch = build_batch(
            base,
            [(r.key, r.value) for r in records],
            leader_epoch=leader_epoch,
            timestamp_ms=records[0].timestamp_ms,
        )
        self.batches.append((base, batch))
        return base

    def read_records(self, offset: int, max_bytes: int) -> list[StoredRecord]:
        if not self.log_start_offset <= offset <= self.log_end_offset:
            raise OffsetOutOfRangeError(f"offset {offset} out of range")
        out: list[StoredRecord] = []
        size = 0
        for record in self.records[offset - self.start_offset :]:
            size += len(record.key or b"") + len(record.value or b"") + 16
            if out and size > max_bytes:
                break
            out.append(record)
        return out

    def flush(self) -> None:
        self.flushed = self.log_end_offset
        self.flush_calls += 1

    @property
    def flushed_offset(self) -> int:
        return self.flushed

    def epoch_entries(self) -> list[tuple[int, int]]:
        entries: list[tuple[int, int]] = []
        for record in self.records:
            if not entries or entries[-1][0] != record.leader_epoch:
                entries.append((record.leader_epoch, record.offset))
        return entries

    def read_batches(self, offset: int, max_bytes: int, max_offset: int) -> bytes:
        out = b""
        for base, data in self.batches:
            last = base + len(next(iter(iter_batches(data))).records) - 1
            if last < offset or base >= max_offset:
                continue
            if out and len(out) + len(data) > max_bytes:
                break
            out += data
        return out

    def append_batches(self, data: bytes) -> int:
        for batch in iter_batches(data):
            if batch.base_offset != self.log_end_offset:
                raise ValueError(
                    f"batch at {batch.base_offset} does not continue the log at {self.log_end_offset}"
                )
            self.batches.append((batch.base_offset, encode_batch(batch)))
            for record in batch.records:
                self.records.append(
                    StoredRecord(
                        batch.base_offset + record.offset_delta,
                        batch.base_timestamp + record.timestamp_delta,
                        record.key,
                        record.value,
                        batch.partition_leader_epoch,
                    )
                )
        return self.log_end_offset

    def truncate_to(self, offset: int) -> int:
        self.records = [r for r in self.records if r.offset < offset]
        self.batches = [(base, data) for base, data in self.batches if base < offset]
        self.flushed = min(self.flushed, self.log_end_offset)
        return self.log_end_offset

    def close(self) -> None:
        self.closed = True


class SilentReplicaTransport:
    """A replica fetch transport whose leaders never answer: the fetchers wait, so a test or benchmark
    sees only the replication shell's own work (bench.replica_image imports it too)."""

    def __init__(self) -> None:
        self._never = asyncio.Event()

    async def replica_fetch(
        self, leader_id: int, request: pb.ReplicaFetchRequest, timeout_s: float
    ) -> pb.ReplicaFetchResponse:
        await self._never.wait()
        raise ReplicaFetchFailed("never")

    async def close(self) -> None:
        pass


def replayed(image: MetadataImage, offset: int, payloads: Iterable[Message]) -> MetadataImage:
    """``image`` after replaying record ``payloads`` (a ``TopicRecord``, a ``PartitionChangeRecord``...)
    at offsets ``offset``, ``offset + 1``, ... in one delta."""
    delta = MetadataDelta(image)
    for index, payload in enumerate(payloads):
        delta.replay(rec.wrap(payload), offset + index)
    return delta.apply()


class MemoryLogOpener:
    """Opens MemoryPartitionLogs, keeping one per directory so a reopen sees the same records."""

    def __init__(self) -> None:
        self.logs: dict[Path, MemoryPartitionLog] = {}
        self.opened: list[Path] = []

    def __call__(self, path: Path) -> MemoryPartitionLog:
        self.opened.append(path)
        log = self.logs.get(path)
        if log is None or log.closed:
            log = MemoryPartitionLog(path)
            self.logs[path] = log
        return log


class StaticMetadataView:
    """A MetadataView over fixed brokers and topics."""

    def __init__(
        self,
        brokers: dict[int, int],
        topics: dict[str, int],
        configs: dict[str, dict[str, str]] | None = None,
        broker_configs: dict[str, str] | None = None,
    ) -> None:
        self.brokers = brokers  # broker id -> port
        self.topics = topics  # topic -> partition count
        self.configs = configs or {}  # topic -> topic configs
        self.broker_configs = broker_configs or {}  # dynamic broker configs (every broker)

    def metadata_response(self, topics: list[str]) -> pb.BrokerMetadataResponse:
        response = pb.BrokerMetadataResponse(metadata_offset=10)
        for broker_id, port in sorted(self.brokers.items()):
            response.brokers.add(broker_id=broker_id, endpoints=[Endpoint(host="127.0.0.1", port=port)])
        leader = min(self.brokers)
        for name in topics or sorted(self.topics):
            topic = response.topics.add(name=name)
            for partition in range(self.topics.get(name, 0)):
                topic.partitions.add(partition=partition, leader=leader, replicas=[leader], isr=[leader])
        return response

    def node_ref(self, broker_id: int) -> NodeRef:
        port = self.brokers.get(broker_id)
        if port is None:
            return NodeRef(node_id=-1)
        return NodeRef(node_id=broker_id, endpoint=Endpoint(name="PLAINTEXT", host="127.0.0.1", port=port))

    def topic_exists(self, topic: str) -> bool:
        return topic in self.topics

    def topic_config(self, topic: str, name: str) -> str | None:
        return self.configs.get(topic, {}).get(name)

    def broker_config(self, broker_id: int, name: str) -> str | None:
        return self.broker_configs.get(name)

    def finalized_features(self) -> tuple[dict[str, int], int]:
        return {"metadata.version": 1}, 10

    def digest(self) -> str:
        return f"static-{sorted(self.topics.items())}"


class MemoryImageStore:
    """An ImageStore kept in memory; survives a BrokerServer restart when the same object is reused."""

    def __init__(self) -> None:
        self.image = MetadataImage.empty()
        self.saves = 0
        self.closed = False

    async def load(self) -> MetadataImage:
        self.closed = False
        return self.image

    async def save(self, image: MetadataImage) -> None:
        self.image = image
        self.saves += 1

    async def close(self) -> None:
        self.closed = True


async def started_publisher(
    broker_id: int,
    tmp_path: Path,
    store: MemoryImageStore,
    clock: Clock,
    manager_clock: Clock | None = None,
    opener: MemoryLogOpener | None = None,
) -> tuple[PartitionManager, MetadataPublisher]:
    """A PartitionManager (logs in memory — ``opener``'s, to reopen them after a restart — directories
    under ``tmp_path/logs``) and a MetadataPublisher over it, started and caught up (nothing to fetch
    here: it publishes normally from now on)."""
    logs = MemoryLogOpener() if opener is None else opener
    manager = PartitionManager(broker_id, [tmp_path / "logs"], logs, clock=manager_clock)
    publisher = MetadataPublisher(broker_id, manager, store, "PLAINTEXT", lambda view: None, clock=clock)
    await publisher.start()
    await publisher.open_partitions()
    return manager, publisher


def metadata_fetcher(
    broker_id: int,
    controller: object,
    publisher: MetadataPublisher,
    clock: Clock,
    on_applied: Callable[[int], None] = lambda offset: None,
) -> MetadataFetcher:
    """A MetadataFetcher feeding ``publisher`` from ``controller`` (a fake answering ``call`` as
    ControllerClient does), with no long-poll wait, for tests that drive it with ``fetch_once``."""
    return MetadataFetcher(
        broker_id,
        "c",
        cast(ControllerClient, controller),
        publisher,
        FetcherTimings(max_wait_ms=0, request_timeout_s=1.0),
        on_applied,
        clock=clock,
    )


class SwitchableLease:
    """A broker's controller lease that a test turns off (``valid = False``) to make it lapse."""

    def __init__(self) -> None:
        self.valid = True

    def lease_valid(self) -> bool:
        return self.valid

    def lease_expires_at_ms(self) -> int | None:
        return None


class YieldingPacer(Pacer):
    """Yields the loop at every look, after ``at_turn(number of the turn just ended)`` ran: a paced pass
    takes one element a turn, and the test acts between turns."""

    def __init__(self, at_turn: Callable[[int], Awaitable[None]] | None = None) -> None:
        super().__init__(ManualClock(), 1)
        self._at_turn = at_turn

    async def tick(self) -> None:
        self.pauses += 1
        if self._at_turn is not None:
            await self._at_turn(self.pauses)
        await asyncio.sleep(0)
