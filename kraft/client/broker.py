"""A small async client of BrokerService that finds partition leaders and follows them.

Used by ``kraft produce`` / ``kraft consume``, the broker benchmark and the integration tests.  Metadata
comes from any reachable, unfenced broker of the bootstrap list (and every broker it names).  A request
answered with a retriable error — NOT_LEADER_OR_FOLLOWER, FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH,
LEADER_NOT_AVAILABLE, OFFSET_NOT_AVAILABLE (a new leader's high watermark not caught up yet),
BROKER_NOT_AVAILABLE, UNKNOWN_TOPIC_OR_PARTITION (metadata may still be propagating) — or a transport
error refreshes the metadata and is retried until the deadline.

A partition that no broker's metadata knows fails with UNKNOWN_TOPIC_OR_PARTITION once the topic (or
that partition index) stayed unknown in metadata answers for the call's limit — time for a topic created
a moment ago to reach the brokers — or its deadline, whichever comes first (never REQUEST_TIMED_OUT for
it).  The limit: a produce's ``max_block_s`` (``kraft produce`` passes Kafka's producer ``max.block.ms``,
60 s, capped by its ``--timeout``); otherwise ``unknown_topic_grace_s`` (1 s: ``consume`` and ``offsets``
name a topic that exists, as Kafka's tools that fail at once for a missing one).  Metadata is asked again
after ``retry_backoff_s`` (Kafka's ``retry.backoff.ms``, 100 ms) each time.  A record batch
above the broker's limits is MESSAGE_TOO_LARGE at once (the broker's own answer, or gRPC's
RESOURCE_EXHAUSTED for a request above ``grpc.max.message.bytes``), never retried.

Delivery is at least once: a Produce whose answer is lost is sent again (Kafka without idempotence).

:func:`describe_broker` asks one broker for its own lifecycle state and hosted partitions, page by page
(``kraft broker describe``); :func:`broker_state` for the state alone.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, TypeVar

import grpc

from kraft.client.channel import ChannelPool, open_channel
from kraft.client.rotation import address_rotation
from kraft.errors import ErrorCode, KraftError
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc

if TYPE_CHECKING:
    from kraft.v1.broker_pb2_grpc import BrokerServiceAsyncStub

# ListOffsetsRequest.timestamp sentinels (Kafka's ListOffsets): the earliest / the latest offset.  The
# broker's service uses these names too; they live here so that `kraft consume` need not import it.
EARLIEST_TIMESTAMP = -2
LATEST_TIMESTAMP = -1

RETRIABLE = frozenset(
    {
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
        ErrorCode.REQUEST_TIMED_OUT,
    }
)
RETRY_BACKOFF_S = 0.1
"""Kafka's ``retry.backoff.ms`` default: the pause before metadata is asked again and a request resent."""
UNKNOWN_TOPIC_GRACE_S = 1.0
# grpc.max.message.bytes' default (kraft.config is not imported here: the CLI imports this module lazily).
MAX_MESSAGE_BYTES = 16 * 1024 * 1024
_UNLIMITED = [("grpc.max_receive_message_length", -1), ("grpc.max_send_message_length", -1)]


class _ResponseWithError(Protocol):
    @property
    def error_code(self) -> int: ...

    @property
    def error_message(self) -> str: ...


ResponseT = TypeVar("ResponseT", bound=_ResponseWithError)


async def describe_broker(
    target: str,
    cluster_id: str,
    timeout_s: float,
    *,
    max_partitions: int | None = None,
    max_message_bytes: int = MAX_MESSAGE_BYTES,
) -> pb.DescribeBrokerResponse | None:
    """DescribeBroker answered by the broker at ``target`` itself (its own lifecycle state and hosted
    partitions); None when it cannot be asked (unreachable, timeout).  An error answer is returned as it
    is.  The broker answers its partitions in pages (any number of partitions: a broker may host
    100,000); they are asked for one after another, each within ``timeout_s``, and returned as one response —
    all of them, or the first ``max_partitions`` (0: none, the state only; ``more_partitions`` tells
    whether some were left out, ``partition_count`` how many there are)."""
    # Pages are at most 1 MiB; the configured limit still applies to the channel (never gRPC's default
    # 4 MiB, which one answer with every partition once outgrew).
    options = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.max_send_message_length", max_message_bytes),
    ]
    request = pb.DescribeBrokerRequest(cluster_id=cluster_id, without_partitions=max_partitions == 0)
    merged: pb.DescribeBrokerResponse | None = None
    try:
        async with open_channel(target, options) as channel:
            stub: BrokerServiceAsyncStub = broker_pb2_grpc.BrokerServiceStub(channel)
            while True:
                if max_partitions:
                    request.max_partitions = max_partitions - (len(merged.partitions) if merged else 0)
                # Per page (bounded work on the broker), so describing 100,000 partitions is not cut off
                # by a timeout meant for one answer (the CLI's 2 s for the broker's state).
                page: pb.DescribeBrokerResponse = await stub.DescribeBroker(request, timeout=timeout_s)
                if merged is None:
                    merged = page
                else:
                    if page.error_code != 0:
                        return page
                    merged.partitions.extend(page.partitions)
                    merged.more_partitions = page.more_partitions
                    merged.partition_count = page.partition_count
                done = max_partitions is not None and len(merged.partitions) >= max_partitions
                if page.error_code != 0 or not page.more_partitions or not page.partitions or done:
                    return merged
                last = page.partitions[-1]
                request.partitions_after_topic = last.topic
                request.partitions_after_partition = last.partition
    except (grpc.RpcError, OSError):
        return None


async def broker_state(target: str, cluster_id: str, timeout_s: float) -> pb.DescribeBrokerResponse | None:
    """DescribeBroker without partitions: the broker's own lifecycle state, one small answer."""
    return await describe_broker(target, cluster_id, timeout_s, max_partitions=0)


@dataclass(frozen=True, slots=True)
class LeaderInfo:
    broker_id: int
    target: str
    leader_epoch: int


class BrokerClient:
    def __init__(
        self,
        bootstrap: Sequence[str],
        *,
        cluster_id: str = "",
        request_timeout_s: float = 5.0,
        unknown_topic_grace_s: float = UNKNOWN_TOPIC_GRACE_S,
        unreachable_timeout_s: float | None = None,
        retry_backoff_s: float = RETRY_BACKOFF_S,
        clock: Callable[[], float] | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """Every request names ``cluster_id``; empty: the cluster of the first broker that answers
        Metadata (it states its cluster id when it refuses a request without one).
        ``unreachable_timeout_s`` (the CLI's :data:`kraft.client.rotation.UNREACHABLE_TIMEOUT_S`): a
        produce/fetch/list-offsets gives up that early when no broker answers Metadata at all (a wrong
        ``--bootstrap-server``); None: it retries to its deadline.  ``retry_backoff_s``: the pause before
        each retry.  ``clock`` (seconds; default the event loop's) and ``sleep`` measure deadlines and
        pause: tests pass a manual clock."""
        if not bootstrap:
            raise ValueError("at least one bootstrap server (host:port) is needed")
        self._bootstrap = list(bootstrap)
        # Which broker answers Metadata (kraft.client.rotation, the rule every client shares): the brokers
        # the cluster named, then the bootstrap list, skipping one whose last attempt failed in transport
        # while one that has not failed is left — a dead broker costs a command one request timeout, not
        # one per metadata refresh.
        self._rotation = address_rotation(self._bootstrap)
        self._cluster_id = cluster_id
        self._timeout_s = request_timeout_s
        self._unknown_grace_s = unknown_topic_grace_s
        # No client-side size cap: the broker bounds what it accepts and what it sends
        # (grpc.max.message.bytes), and a consumer must be able to read any batch it accepted.  A pool: a
        # long-running `kraft consume` follows a rotation of its --command-config certificate files.
        self._channels = ChannelPool(_UNLIMITED, name="broker_client")
        self._brokers: dict[int, str] = {}
        self._leaders: dict[tuple[str, int], LeaderInfo] = {}
        # topic → why the last metadata answer does not know a partition of it (None: it knows them all)
        self._partition_counts: dict[str, int] = {}
        self._unknown_topics: dict[str, str] = {}
        # Why the last metadata refresh failed (None: it did not): a partition without a known leader
        # names it, so an unreachable bootstrap list does not read as "no leader known".
        self._metadata_error: str | None = None
        self._metadata_unreachable = False  # the last refresh failed and no broker answered at all
        self._unreachable_timeout_s = unreachable_timeout_s
        self._retry_backoff_s = retry_backoff_s
        self._clock = clock
        self._sleep = sleep

    @property
    def request_timeout_s(self) -> float:
        """The limit of one RPC (Metadata, Produce, ListOffsets; a Fetch adds its ``max_wait_ms``)."""
        return self._timeout_s

    async def __aenter__(self) -> BrokerClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        await self._channels.close()

    def stub(self, target: str) -> BrokerServiceAsyncStub:
        stub: BrokerServiceAsyncStub = broker_pb2_grpc.BrokerServiceStub(self._channels.get(target))
        return stub

    # --- metadata ---------------------------------------------------------------------------------

    async def metadata(self, topics: Sequence[str] = ()) -> pb.BrokerMetadataResponse:
        """Metadata from the first broker that answers without error; raises KraftError otherwise.

        The candidates are asked as :class:`kraft.client.rotation.NodeRotation` says; when every one
        asked failed in transport, those skipped for an earlier failure are asked too before giving up."""
        self._rotation.replace(list(dict.fromkeys([*self._brokers.values(), *self._bootstrap])))
        last = "no broker answered"
        asked: set[str] = set()
        self._metadata_unreachable = True
        while batch := [t for t in self._rotation.round() if t not in asked]:
            for target in batch:
                asked.add(target)
                answer = await self._metadata_at(target, topics)
                if not self._rotation.is_failed(target):
                    self._metadata_unreachable = False
                if isinstance(answer, str):
                    last = answer
                    continue
                self._learn(answer)
                return answer
        raise KraftError(ErrorCode.BROKER_NOT_AVAILABLE, f"no broker could answer Metadata ({last})")

    async def _metadata_at(self, target: str, topics: Sequence[str]) -> pb.BrokerMetadataResponse | str:
        """Metadata from ``target`` without error, or why not; a transport failure marks it failed."""
        request = pb.BrokerMetadataRequest(cluster_id=self._cluster_id, topics=list(topics))
        try:
            response = await self.stub(target).Metadata(request, timeout=self._timeout_s)
            code = ErrorCode.from_wire(response.error_code)
            if code is ErrorCode.INCONSISTENT_CLUSTER_ID and not self._cluster_id and response.cluster_id:
                # Not told the cluster id: adopt the one the broker states in its refusal (every
                # request must name the cluster, issue #15), then ask again.
                self._cluster_id = request.cluster_id = response.cluster_id
                response = await self.stub(target).Metadata(request, timeout=self._timeout_s)
        except grpc.aio.AioRpcError as err:
            self._rotation.failed(target)
            return f"{target}: {err.code().name}"
        self._rotation.answered(target)
        code = ErrorCode.from_wire(response.error_code)
        if code is not ErrorCode.NONE:
            return f"{target}: {code.name} {response.error_message}"
        return response

    def _learn(self, response: pb.BrokerMetadataResponse) -> None:
        for broker in response.brokers:
            if broker.endpoints:
                endpoint = broker.endpoints[0]
                self._brokers[broker.broker_id] = f"{endpoint.host or '127.0.0.1'}:{endpoint.port}"
        for topic in response.topics:
            if topic.error_code == ErrorCode.UNKNOWN_TOPIC_OR_PARTITION:
                self._unknown_topics[topic.name] = topic.error_message or f"unknown topic {topic.name!r}"
                self._partition_counts.pop(topic.name, None)
                continue
            self._unknown_topics.pop(topic.name, None)
            self._partition_counts[topic.name] = len(topic.partitions)
            for p in topic.partitions:
                target = self._brokers.get(p.leader)
                key = (topic.name, p.partition)
                if p.leader >= 0 and target is not None:
                    self._leaders[key] = LeaderInfo(p.leader, target, p.leader_epoch)
                else:
                    self._leaders.pop(key, None)

    def unknown_reason(self, topic: str, partition: int) -> str | None:
        """Why the last metadata answer knows no ``topic``-``partition`` (None when it knows it or was
        not asked)."""
        reason = self._unknown_topics.get(topic)
        if reason is not None:
            return f"topic {topic!r} does not exist" + (f" ({reason})" if topic not in reason else "")
        count = self._partition_counts.get(topic)
        if count is not None and partition >= count:
            return (
                f"topic {topic!r} has {count} partition(s), 0..{count - 1}; there is no partition {partition}"
            )
        return None

    async def leader(self, topic: str, partition: int, *, refresh: bool = False) -> LeaderInfo | None:
        key = (topic, partition)
        if refresh or key not in self._leaders:
            self._leaders.pop(key, None)
            try:
                await self.metadata([topic])
            except KraftError as exc:
                self._metadata_error = exc.message
                return None
            self._metadata_error = None
        return self._leaders.get(key)

    # --- data path ----------------------------------------------------------------------------------

    async def produce(
        self,
        topic: str,
        partition: int,
        records: Sequence[tuple[bytes | None, bytes | None]],
        *,
        deadline_s: float = 30.0,
        acks: int = -1,
        max_block_s: float | None = None,
    ) -> pb.ProduceResponse:
        """Append ``records`` (key, value) as one batch on the partition's leader, following leader moves.

        ``acks``: -1 (all: answered once every in-sync replica has the batch on disk), 1 (the leader
        appended it) or 0 (the same answer as 1: gRPC always answers).  ``max_block_s``: how long the
        partition may stay unknown to metadata (Kafka's ``max.block.ms``; None: the client's
        ``unknown_topic_grace_s``) — within ``deadline_s`` either way."""
        wire = [
            pb.BrokerRecord(key=k or b"", value=v or b"", has_key=k is not None, has_value=v is not None)
            for k, v in records
        ]

        def send(stub: BrokerServiceAsyncStub, leader: LeaderInfo) -> Awaitable[pb.ProduceResponse]:
            request = pb.ProduceRequest(
                cluster_id=self._cluster_id,
                topic=topic,
                partition=partition,
                leader_epoch=leader.leader_epoch,
                records=wire,
                acks=acks,
            )
            return stub.Produce(request, timeout=self._timeout_s)

        return await self._on_leader(topic, partition, send, deadline_s, "produce", max_block_s)

    async def fetch(
        self,
        topic: str,
        partition: int,
        offset: int,
        *,
        max_bytes: int = 1 << 20,
        max_wait_ms: int = 0,
        deadline_s: float = 30.0,
    ) -> pb.BrokerFetchResponse:
        """Fetch from the partition's leader, following leader moves; OFFSET_OUT_OF_RANGE is returned."""

        def send(stub: BrokerServiceAsyncStub, leader: LeaderInfo) -> Awaitable[pb.BrokerFetchResponse]:
            request = pb.BrokerFetchRequest(
                cluster_id=self._cluster_id,
                topic=topic,
                partition=partition,
                offset=offset,
                max_bytes=max_bytes,
                leader_epoch=-1,
                max_wait_ms=max_wait_ms,
            )
            return stub.Fetch(request, timeout=self._timeout_s + max_wait_ms / 1000.0)

        return await self._on_leader(topic, partition, send, deadline_s, "fetch")

    async def list_offset(
        self, topic: str, partition: int, timestamp: int, *, deadline_s: float = 30.0
    ) -> int:
        """Earliest (-2) or latest (-1) offset of a partition, from its leader."""

        def send(stub: BrokerServiceAsyncStub, leader: LeaderInfo) -> Awaitable[pb.ListOffsetsResponse]:
            request = pb.ListOffsetsRequest(
                cluster_id=self._cluster_id,
                topic=topic,
                partition=partition,
                timestamp=timestamp,
                leader_epoch=-1,
            )
            return stub.ListOffsets(request, timeout=self._timeout_s)

        response = await self._on_leader(topic, partition, send, deadline_s, "list offsets")
        code = ErrorCode.from_wire(response.error_code)
        if code is not ErrorCode.NONE:
            raise KraftError(code, response.error_message)
        return response.offset

    async def _on_leader(
        self,
        topic: str,
        partition: int,
        send: Callable[[BrokerServiceAsyncStub, LeaderInfo], Awaitable[ResponseT]],
        deadline_s: float,
        what: str,
        unknown_limit_s: float | None = None,
    ) -> ResponseT:
        """Send to the leader until the answer is not retriable (refreshing metadata in between)."""
        now = self._clock or asyncio.get_running_loop().time
        deadline = now() + deadline_s
        unknown_limit = self._unknown_grace_s if unknown_limit_s is None else unknown_limit_s
        refresh = False
        unknown_since: float | None = None
        unreachable_since: float | None = None
        while True:
            leader = await self.leader(topic, partition, refresh=refresh)
            if leader is None and self._metadata_error is not None and self._metadata_unreachable:
                unreachable_since = now() if unreachable_since is None else unreachable_since
                limit_s = self._unreachable_timeout_s
                if limit_s is not None and now() - unreachable_since >= limit_s:
                    raise KraftError(
                        ErrorCode.BROKER_NOT_AVAILABLE,
                        f"no broker reachable at {','.join(self._bootstrap)} for {limit_s:g}s "
                        f"({self._metadata_error}); is --bootstrap-server right and is a broker running "
                        "there?",
                    )
            else:
                unreachable_since = None
            if leader is None:
                last = f"no leader known for {topic}-{partition}"
                if self._metadata_error is not None:
                    last = f"{last}: {self._metadata_error}"
                unknown = self.unknown_reason(topic, partition)
                if unknown is None:
                    unknown_since = None
                else:
                    unknown_since = now() if unknown_since is None else unknown_since
                    waited_s = now() - unknown_since
                    # The deadline too: a topic that never appears is UNKNOWN_TOPIC_OR_PARTITION (Kafka's
                    # "not present in metadata after …"), not REQUEST_TIMED_OUT.
                    if waited_s >= unknown_limit or now() >= deadline:
                        raise KraftError(
                            ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,
                            f"{what} on {topic}-{partition}: {unknown} "
                            f"(not present in metadata after {waited_s * 1000:.0f} ms)",
                        )
            else:
                try:
                    response = await send(self.stub(leader.target), leader)
                except grpc.aio.AioRpcError as err:
                    if err.code() is grpc.StatusCode.RESOURCE_EXHAUSTED:
                        # The request is above the broker's grpc.max.message.bytes: retrying cannot help.
                        raise KraftError(
                            ErrorCode.MESSAGE_TOO_LARGE,
                            f"{what} on {topic}-{partition}: broker {leader.broker_id} refused the request "
                            f"as too large ({err.details()})",
                        ) from err
                    last = f"broker {leader.broker_id}: {err.code().name}"
                else:
                    code = ErrorCode.from_wire(response.error_code)
                    if code not in RETRIABLE:
                        return response
                    last = f"broker {leader.broker_id}: {code.name} {response.error_message}"
            if now() >= deadline:
                raise KraftError(
                    ErrorCode.REQUEST_TIMED_OUT, f"{what} on {topic}-{partition} gave up: {last}"
                )
            refresh = True
            await self._sleep(self._retry_backoff_s)
