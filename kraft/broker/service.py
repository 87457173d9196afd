"""``kraft.v1.BrokerService``: Metadata, Produce, Fetch, ListOffsets, DescribeBroker.

Handlers validate in a fixed order — cluster id, the serving rule (RUNNING, unfenced, live lease), the
partition (hosted here? led here? the client's leader epoch) — and answer every failure with an
``error_code`` and a message, never a gRPC error, so clients can follow NOT_LEADER_OR_FOLLOWER.  The hot
path (Produce/Fetch) builds no pydantic models and formats no log lines.

Every request must name this broker's cluster (an empty id is refused too, issue #15); Metadata and
DescribeBroker state the cluster id even when they refuse, which is how a client learns it.  At most
``fetch.max.parked.requests`` Fetches long-poll at once; the others are answered at once.

Size limits (docs/configuration.md): a Produce's batch, as it would be appended, must fit the topic's
``max.message.bytes`` (else the broker's ``message.max.bytes``) and what one gRPC message can carry back
to a consumer; it is refused with MESSAGE_TOO_LARGE before anything is written.  A Fetch returns at least
the first record and, like Kafka, the whole first batch even when it is larger than ``max_bytes``; it only
stops early where the response would outgrow ``grpc.max.message.bytes``, so every accepted batch can be
fetched.

Authorization (docs/security.md): each handler first asks the :class:`RequestGuard` — Produce needs
TOPIC WRITE, Fetch TOPIC READ, ListOffsets TOPIC DESCRIBE, DescribeBroker CLUSTER DESCRIBE, ReplicaFetch
CLUSTER CLUSTER_ACTION as the broker the caller is; Metadata lists only the topics the caller may DESCRIBE.
A refusal is the one case this service aborts: gRPC PERMISSION_DENIED, ``TOPIC_AUTHORIZATION_FAILED: …``.
Without an authorizer the guard costs one call (node principals are still bound to their own id).
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import logging
import time
from collections.abc import Mapping
from contextvars import ContextVar
from typing import Any, NoReturn, Protocol

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from kraft.api_versions import api_versions
from kraft.broker.log_dirs import HostedPartition, measure
from kraft.broker.partitions import Partition, PartitionManager, is_storage_failure
from kraft.broker.replication import ReplicaManager
from kraft.broker.status import BrokerStatus
from kraft.broker.types import ProducedRecord, ReplicaRole, TopicPartition
from kraft.client.broker import EARLIEST_TIMESTAMP, LATEST_TIMESTAMP
from kraft.config import DEFAULT_MAX_PARKED_FETCHES, DEFAULT_MESSAGE_MAX_BYTES, GRPC_ENVELOPE_BYTES
from kraft.errors import ErrorCode, KraftError
from kraft.grpc_errors import grpc_status_for
from kraft.grpc_service import RequestDecoder, ServicerContext, register_service
from kraft.observability.metrics import BrokerRequestMetrics
from kraft.replication.acks import Acks, answered_at_append
from kraft.security.acl import AclOperation
from kraft.security.guard import AccessDenied, RequestGuard
from kraft.storage.errors import FatalStorageError
from kraft.v1 import broker_pb2 as pb
from kraft.v1 import broker_pb2_grpc, common_pb2
from kraft.v1.common_pb2 import NodeRef

DEFAULT_GRPC_MAX_MESSAGE_BYTES = 16 * 1024 * 1024  # grpc.max.message.bytes default
# An upper bound of what one BrokerRecord adds to a Fetch response besides its key and value: message tag
# and length (6), offset (11), timestamp (11), key and value tags and lengths (12), flags (4), epoch (11).
RECORD_WIRE_OVERHEAD = 64
TOPIC_MAX_MESSAGE_BYTES = "max.message.bytes"
BROKER_MESSAGE_MAX_BYTES = "message.max.bytes"  # dynamic: kraft config alter --entity-type brokers
DEFAULT_FETCH_MAX_BYTES = 1 << 20
MAX_FETCH_WAIT_MS = 10_000
_NO_EPOCH_CHECK = -1

Context = grpc.aio.ServicerContext[Any, Any]


class MetadataView(Protocol):
    """What the service needs from the broker's current metadata image."""

    def metadata_response(self, topics: list[str]) -> pb.BrokerMetadataResponse:
        """Brokers and the requested topics (all when empty), error_code unset."""
        ...

    def node_ref(self, broker_id: int) -> NodeRef:
        """The client endpoint of a broker (node_id -1 when unknown)."""
        ...

    def topic_exists(self, topic: str) -> bool: ...

    def topic_config(self, topic: str, name: str) -> str | None:
        """A topic config value set on the topic (None when unset)."""
        ...

    def broker_config(self, broker_id: int, name: str) -> str | None:
        """A dynamic broker config from the metadata (the broker's own, else the cluster default; None when
        neither is set: the broker's .properties decide)."""
        ...

    def digest(self) -> str:
        """A digest of the image's content (equal images, equal digests)."""
        ...

    def finalized_features(self) -> tuple[Mapping[str, int], int]:
        """The features finalized in the image (metadata.version …) and the image's offset."""
        ...


# One DescribeBroker page: well under gRPC's default 4 MiB receive limit, so any client can read it.
DESCRIBE_PAGE_BYTES = 1 << 20


class _Rejected(Exception):
    """Internal: a request that fails validation (turned into a response by each handler)."""

    def __init__(self, code: ErrorCode, message: str, leader: NodeRef | None = None, epoch: int = -1) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.leader = leader
        self.leader_epoch = epoch


class BrokerService(broker_pb2_grpc.BrokerServiceServicer):
    def __init__(
        self,
        status: BrokerStatus,
        partitions: PartitionManager,
        view: MetadataView,
        message_max_bytes: int = DEFAULT_MESSAGE_MAX_BYTES,
        grpc_max_message_bytes: int = DEFAULT_GRPC_MAX_MESSAGE_BYTES,
        replicas: ReplicaManager | None = None,
        guard: RequestGuard | None = None,
        max_parked: int = DEFAULT_MAX_PARKED_FETCHES,
        request_metrics: BrokerRequestMetrics | None = None,
    ) -> None:
        """Without ``replicas`` partitions are leader-only (the high watermark is the log end: tests of
        the serving rules); a broker process always passes its :class:`ReplicaManager`.  ``guard``:
        the process's authorization checks (default: no authorizer, identity binding only).
        ``request_metrics``: the Produce/Fetch series (default: those of ``status.broker_id``)."""
        self._request_metrics = request_metrics or BrokerRequestMetrics(status.broker_id)
        self._guard = guard or RequestGuard()
        self._status = status
        self._replicas = replicas
        self._partitions = partitions
        self._view = view
        self._message_max_bytes = message_max_bytes
        # What one gRPC message can carry besides the envelope: the ceiling of every batch and response.
        self._wire_max_bytes = max(grpc_max_message_bytes - GRPC_ENVELOPE_BYTES, 1024)
        self._max_parked = max_parked
        self._parked = 0  # Fetch requests long-polling now

    def set_view(self, view: MetadataView) -> None:
        """Swap in the view of a newly applied image (called by the metadata publisher)."""
        self._view = view
        self._request_metrics.retain_topics(view.topic_exists)

    def _metric_topic(self, topic: str) -> str | None:
        """``topic`` when it has per-topic series: a topic of the image (bounded by what exists)."""
        return topic if self._view.topic_exists(topic) else None

    # --- handlers --------------------------------------------------------------------------------

    async def _denied(self, context: Context, denied: AccessDenied) -> NoReturn:
        await context.abort(grpc_status_for(denied.code), str(denied))
        raise AssertionError("unreachable: context.abort raises") from denied

    async def Metadata(
        self, request: pb.BrokerMetadataRequest, context: Context
    ) -> pb.BrokerMetadataResponse:
        try:
            self._check_cluster(request.cluster_id)
            self._check_serving()
        except _Rejected as rejected:
            # The cluster id is stated even in a refusal: how a client that was not told it learns it.
            return pb.BrokerMetadataResponse(
                error_code=rejected.code, error_message=rejected.message, cluster_id=self._status.cluster_id
            )
        response = self._view.metadata_response(list(request.topics))
        response.cluster_id = self._status.cluster_id
        response.controller_id = self._status.controller_id
        if self._guard.enabled:
            # Kafka's rule: a listing leaves out what the caller may not DESCRIBE; a topic asked for by
            # name answers TOPIC_AUTHORIZATION_FAILED (whether it exists or not).
            may_describe = self._guard.topic_filter(context, AclOperation.DESCRIBE)
            kept = []
            for topic in response.topics:
                if may_describe(topic.name):
                    kept.append(topic)
                elif request.topics:
                    kept.append(
                        pb.BrokerMetadataResponse.Topic(
                            name=topic.name,
                            error_code=ErrorCode.TOPIC_AUTHORIZATION_FAILED,
                            error_message=f"not authorized to DESCRIBE topic {topic.name!r}",
                        )
                    )
            del response.topics[:]
            response.topics.extend(kept)
        return response

    async def Produce(self, request: pb.ProduceRequest, context: Context) -> pb.ProduceResponse:
        started = time.perf_counter()
        wire_bytes = _REQUEST_WIRE_BYTES.get()
        _REQUEST_WIRE_BYTES.set(None)
        metrics = self._request_metrics
        try:
            response = await self._produce(request, context)
        except BaseException:  # a refusal by abort (PERMISSION_DENIED), an internal error, cancellation
            metrics.produce_failed(self._metric_topic(request.topic), time.perf_counter() - started)
            raise
        elapsed = time.perf_counter() - started
        if response.error_code:
            metrics.produce_failed(self._metric_topic(request.topic), elapsed)
        else:
            if wire_bytes is None:  # called without the broker's decoder (tests): measure it here
                wire_bytes = request.ByteSize()
            metrics.produced(self._metric_topic(request.topic), len(request.records), wire_bytes, elapsed)
        return response

    async def _produce(self, request: pb.ProduceRequest, context: Context) -> pb.ProduceResponse:
        try:
            self._guard.check_topic(context, AclOperation.WRITE, request.topic)
        except AccessDenied as denied:
            await self._denied(context, denied)
        try:
            self._check_cluster(request.cluster_id)
            self._check_serving()
            partition = self._leader_partition(request.topic, request.partition, request.leader_epoch)
            if not request.records:
                raise _Rejected(ErrorCode.INVALID_REQUEST, "a produce request needs at least one record")
            if request.acks not in (0, 1, -1):
                raise _Rejected(ErrorCode.INVALID_REQUEST, f"acks must be 0, 1 or -1, not {request.acks}")
            acks = Acks(request.acks)
            if self._replicas is not None:
                # acks=all with a committed ISR below min.insync.replicas: refused before anything is
                # written (Kafka's appendRecordsToLeader).
                admitted = self._replicas.admit_produce(partition, acks)
                if admitted is not ErrorCode.NONE:
                    raise _Rejected(
                        admitted,
                        f"{partition.tp}: the ISR is below min.insync.replicas for acks=all",
                        epoch=partition.leader_epoch,
                    )
            records = [_to_produced(r, self._status.now_ms()) for r in request.records]
            limit, source = self._produce_limit(request.topic)
            try:
                base_offset = partition.log.append_records(records, partition.leader_epoch, limit)
            except (FatalStorageError, OSError) as err:
                # A failed write: the log's state is unknown and the log refuses further use. Fail-stop
                # (the supervisor ends the process); this request is answered with the error.
                if self._replicas is not None:
                    self._replicas.storage_failed(partition, err, "partition_append_failed")
                raise _Rejected(ErrorCode.KAFKA_STORAGE_ERROR, f"{partition.tp}: {err}") from err
            except Exception as err:
                if is_storage_failure(err):  # e.g. corrupt data met on the way: its log dir goes offline
                    self._partitions.storage_failed(partition, err)
                    raise _Rejected(ErrorCode.KAFKA_STORAGE_ERROR, f"{partition.tp}: {err}") from err
                if not isinstance(err, KraftError):
                    raise
                message = err.message
                if err.code is ErrorCode.MESSAGE_TOO_LARGE:
                    message = f"{partition.tp}: {message} ({source})"
                raise _Rejected(err.code, message) from err
        except _Rejected as rejected:
            return pb.ProduceResponse(
                error_code=rejected.code,
                error_message=rejected.message,
                base_offset=-1,
                log_end_offset=-1,
                leader_epoch=rejected.leader_epoch,
                current_leader=rejected.leader,
            )
        partition.notify_appended()
        if self._replicas is not None:
            self._replicas.on_appended(partition)
            if not answered_at_append(acks):
                # acks=all: answered once the high watermark passes the batch, i.e. every ISR member
                # has it on disk (docs/internals/replication.md); a timeout or lost leadership is an
                # error: the records may or may not commit (at-least-once, as in Kafka).
                error = await self._replicas.wait_for_acks(partition, base_offset + len(records))
                if error is not ErrorCode.NONE:
                    return pb.ProduceResponse(
                        error_code=error,
                        error_message=f"{partition.tp}: acks=all not satisfied for offset {base_offset}",
                        base_offset=-1,
                        log_end_offset=-1,
                        leader_epoch=partition.leader_epoch,
                    )
        return pb.ProduceResponse(
            base_offset=base_offset,
            log_end_offset=partition.log.log_end_offset,
            leader_epoch=partition.leader_epoch,
        )

    async def Fetch(self, request: pb.BrokerFetchRequest, context: Context) -> pb.BrokerFetchResponse:
        started = time.perf_counter()
        metrics = self._request_metrics
        try:
            response, sent_bytes = await self._fetch(request, context)
        except BaseException:  # a refusal by abort (PERMISSION_DENIED), an internal error, cancellation
            metrics.fetch_failed(self._metric_topic(request.topic), time.perf_counter() - started)
            raise
        elapsed = time.perf_counter() - started
        if response.error_code:
            metrics.fetch_failed(self._metric_topic(request.topic), elapsed)
        else:
            metrics.fetched(self._metric_topic(request.topic), sent_bytes, elapsed)
        return response

    async def _fetch(
        self, request: pb.BrokerFetchRequest, context: Context
    ) -> tuple[pb.BrokerFetchResponse, int]:
        """The response and the bytes of its records (keys, values, framing bound) for the metrics."""
        max_bytes = request.max_bytes if request.max_bytes > 0 else DEFAULT_FETCH_MAX_BYTES
        max_bytes = min(max_bytes, self._wire_max_bytes)
        try:
            self._guard.check_topic(context, AclOperation.READ, request.topic)
        except AccessDenied as denied:
            await self._denied(context, denied)
        try:
            self._check_cluster(request.cluster_id)
            partition = self._fetchable(request)
            if (
                request.offset >= self._high_watermark(partition)
                and request.max_wait_ms > 0
                and self._parked < self._max_parked
            ):
                # Long-poll until the high watermark passes the offset (woken by appends and by the
                # high watermark moving), up to max_wait_ms.
                # At most max_parked requests wait at once (fetch.max.parked.requests); the rest are
                # answered at once, empty, and the client asks again.
                loop = asyncio.get_running_loop()
                deadline = loop.time() + min(request.max_wait_ms, MAX_FETCH_WAIT_MS) / 1000.0
                self._parked += 1
                try:
                    while request.offset >= self._high_watermark(partition):
                        remaining = deadline - loop.time()
                        if remaining <= 0:
                            break
                        event = partition.data_event()
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(event.wait(), remaining)
                        # Role, epoch or the partition itself may have changed while parked.
                        partition = self._fetchable(request)
                finally:
                    self._parked -= 1
            try:
                records = partition.log.read_records(request.offset, max_bytes)
            except Exception as err:
                if is_storage_failure(err):
                    # Kafka's KafkaStorageException: the log dir goes offline, the controller (told by
                    # the next heartbeat) moves leadership; the client gets KAFKA_STORAGE_ERROR.
                    self._partitions.storage_failed(partition, err)
                    raise _Rejected(ErrorCode.KAFKA_STORAGE_ERROR, f"{partition.tp}: {err}") from err
                if not isinstance(err, KraftError):
                    raise
                raise _Rejected(err.code, err.message) from err
        except _Rejected as rejected:
            return pb.BrokerFetchResponse(
                error_code=rejected.code,
                error_message=rejected.message,
                high_watermark=-1,
                log_start_offset=-1,
                log_end_offset=-1,
                leader_epoch=rejected.leader_epoch,
                current_leader=rejected.leader,
            ), 0
        log = partition.log
        high_watermark = self._high_watermark(partition)
        response = pb.BrokerFetchResponse(
            high_watermark=high_watermark,
            log_start_offset=log.log_start_offset,
            log_end_offset=log.log_end_offset,
            leader_epoch=partition.leader_epoch,
        )
        add = response.records.add  # built in place: no per-record message copy
        budget = self._wire_max_bytes
        for r in records:
            if r.offset >= high_watermark:
                break  # not on every ISR member yet: consumers never see it (Kafka's read isolation)
            # The first record always goes (it fits: Produce bounds batches by the same budget); later
            # ones only while the response stays sendable.  The client fetches the rest next time.
            size = len(r.key or b"") + len(r.value or b"") + RECORD_WIRE_OVERHEAD
            if size > budget and response.records:
                break
            budget -= size
            add(
                offset=r.offset,
                timestamp_ms=r.timestamp_ms,
                key=r.key or b"",
                value=r.value or b"",
                has_key=r.key is not None,
                has_value=r.value is not None,
                leader_epoch=r.leader_epoch,
            )
        # What the budget spent is the bytes sent (kraft_broker_bytes_out): no extra work per record.
        return response, self._wire_max_bytes - budget

    def _high_watermark(self, partition: Partition) -> int:
        if self._replicas is None:
            return partition.log.log_end_offset
        return self._replicas.high_watermark(partition)

    async def ListOffsets(self, request: pb.ListOffsetsRequest, context: Context) -> pb.ListOffsetsResponse:
        try:
            self._guard.check_topic(context, AclOperation.DESCRIBE, request.topic)
        except AccessDenied as denied:
            await self._denied(context, denied)
        try:
            self._check_cluster(request.cluster_id)
            self._check_serving()
            partition = self._leader_partition(request.topic, request.partition, request.leader_epoch)
            if request.timestamp == EARLIEST_TIMESTAMP:
                offset = partition.log.log_start_offset
            elif request.timestamp == LATEST_TIMESTAMP:
                offset = self._high_watermark(partition)  # Kafka's LATEST for consumers: the HWM
                self._check_high_watermark_caught_up(partition, offset)
            else:
                raise _Rejected(
                    ErrorCode.INVALID_REQUEST,
                    f"timestamp must be -2 (earliest) or -1 (latest), not {request.timestamp}",
                )
        except _Rejected as rejected:
            return pb.ListOffsetsResponse(
                error_code=rejected.code,
                error_message=rejected.message,
                offset=-1,
                leader_epoch=rejected.leader_epoch,
                current_leader=rejected.leader,
            )
        return pb.ListOffsetsResponse(offset=offset, leader_epoch=partition.leader_epoch)

    async def DescribeBroker(
        self, request: pb.DescribeBrokerRequest, context: Context
    ) -> pb.DescribeBrokerResponse:
        """Always answers (also while fenced or starting): it is how operators see the lifecycle state."""
        status = self._status
        try:
            self._guard.check_cluster(context, AclOperation.DESCRIBE)
        except AccessDenied as denied:
            await self._denied(context, denied)
        try:
            self._check_cluster(request.cluster_id)
        except _Rejected as rejected:
            return pb.DescribeBrokerResponse(
                error_code=rejected.code, error_message=rejected.message, cluster_id=status.cluster_id
            )
        hosted = self._partitions.partitions()
        response = pb.DescribeBrokerResponse(
            broker_id=status.broker_id,
            cluster_id=status.cluster_id,
            state=status.state.name,
            broker_epoch=status.broker_epoch,
            incarnation_id=status.incarnation_id,
            fenced=status.fenced,
            metadata_offset=status.metadata_offset,
            controller_id=status.controller_id,
            image_digest=self._view.digest(),
            offline_log_dirs=[f"{d}: {why}" for d, why in sorted(self._partitions.offline_dirs.items())],
            partition_count=len(hosted),
        )
        if not request.without_partitions:
            self._describe_page(request, hosted, response)
        return response

    def _describe_page(
        self, request: pb.DescribeBrokerRequest, hosted: list[Partition], response: pb.DescribeBrokerResponse
    ) -> None:
        """One page of the hosted partitions, in (topic, partition) order after the request's cursor: at
        most ``max_partitions`` and :data:`DESCRIBE_PAGE_BYTES` (at least one, so paging always ends).
        Every partition at ~80 B in one answer outgrew gRPC's default 4 MiB receive limit at ~50,000
        partitions (and any limit at some count), so ``kraft broker describe`` failed on a big broker."""
        ordered = sorted(hosted, key=lambda p: (p.tp.topic, p.tp.partition))
        start = 0
        if request.partitions_after_topic:
            cursor = (request.partitions_after_topic, request.partitions_after_partition)
            start = bisect.bisect_right(ordered, cursor, key=lambda p: (p.tp.topic, p.tp.partition))
        limit = request.max_partitions if request.max_partitions > 0 else len(ordered)
        budget = min(DESCRIBE_PAGE_BYTES, self._wire_max_bytes)
        used = 0
        end = start
        while end < len(ordered) and end - start < limit:
            described = self._describe_partition(ordered[end])
            # The field's tag and length prefix: at most 4 bytes for an entry under 2 MiB.
            size = described.ByteSize() + 4
            if end > start and used + size > budget:
                break
            response.partitions.append(described)
            used += size
            end += 1
        response.more_partitions = end < len(ordered)

    def _describe_partition(self, p: Partition) -> pb.DescribeBrokerResponse.LocalPartition:
        out = pb.DescribeBrokerResponse.LocalPartition(
            topic=p.tp.topic,
            partition=p.tp.partition,
            role=p.role.value,
            leader_epoch=p.leader_epoch,
            log_start_offset=p.log.log_start_offset,
            log_end_offset=p.log.log_end_offset,
            log_dir=str(p.log_dir),
            high_watermark=-1,
            lag=-1,
        )
        if self._replicas is not None:
            out.high_watermark, out.lag, followers = self._replicas.replica_lag(p.tp)
            for broker_id, end, lag, in_isr in followers:
                out.followers.add(broker_id=broker_id, log_end_offset=end, lag=lag, in_isr=in_isr)
        return out

    async def ReplicaFetch(
        self, request: pb.ReplicaFetchRequest, context: Context
    ) -> pb.ReplicaFetchResponse:
        """A follower's fetch (docs/internals/replication.md); served by the :class:`ReplicaManager`."""
        try:
            self._guard.check_node(context, request.replica_id, "fetch replicas as broker")
        except AccessDenied as denied:
            await self._denied(context, denied)
        try:
            self._check_cluster(request.cluster_id)
        except _Rejected as rejected:
            return pb.ReplicaFetchResponse(error_code=rejected.code, error_message=rejected.message)
        if self._replicas is None:
            return pb.ReplicaFetchResponse(
                error_code=ErrorCode.UNSUPPORTED_VERSION, error_message="this broker does not replicate"
            )
        if self._parked >= self._max_parked:
            # fetch.max.parked.requests counts follower fetches too: past it they are answered at once.
            request.max_wait_ms = 0
            return await self._replicas.replica_fetch(request)
        self._parked += 1
        try:
            return await self._replicas.replica_fetch(request)
        finally:
            self._parked -= 1

    async def DescribeLogDirs(
        self, request: pb.DescribeLogDirsRequest, context: Context
    ) -> pb.DescribeLogDirsResponse:
        """Every log dir, the size of each hosted partition, the offline dirs (CLUSTER Describe, as Kafka)."""
        try:
            self._guard.check_cluster(context, AclOperation.DESCRIBE)
        except AccessDenied as denied:
            await self._denied(context, denied)
        try:
            self._check_cluster(request.cluster_id)
        except _Rejected as rejected:
            return pb.DescribeLogDirsResponse(error_code=rejected.code, error_message=rejected.message)
        wanted = set(request.topics)
        hosted = []
        for p in self._partitions.partitions():
            if wanted and p.tp.topic not in wanted:
                continue
            lag = -1
            if self._replicas is not None:
                lag = 0 if p.role is ReplicaRole.LEADER else self._replicas.replica_lag(p.tp)[1]
            hosted.append(HostedPartition(p.tp.topic, p.tp.partition, p.log_dir, p.path, lag))
        manager = self._partitions
        log_dirs = await asyncio.to_thread(measure, manager.log_dirs, dict(manager.offline_dirs), hosted)
        return pb.DescribeLogDirsResponse(broker_id=self._status.broker_id, log_dirs=log_dirs)

    async def ApiVersions(
        self, request: common_pb2.ApiVersionsRequest, context: Context
    ) -> common_pb2.ApiVersionsResponse:
        """What this broker serves (no authorization, as Kafka's ApiVersions)."""
        features, offset = self._view.finalized_features()
        return api_versions(
            self._status.cluster_id,
            request,
            self._status.broker_id,
            "broker",
            [
                pb.DESCRIPTOR.services_by_name["BrokerService"],
                health_pb2.DESCRIPTOR.services_by_name["Health"],
            ],
            features,
            offset,
        )

    # --- validation ------------------------------------------------------------------------------

    def _produce_limit(self, topic: str) -> tuple[int, str]:
        """The largest batch a Produce to ``topic`` may append, and which setting sets it."""
        configured = self._view.topic_config(topic, TOPIC_MAX_MESSAGE_BYTES)
        topic_limit = _parse_int(configured) if configured is not None else None
        if topic_limit is not None:
            limit, source = topic_limit, f"max.message.bytes={configured} of topic {topic}"
        else:
            dynamic = self._view.broker_config(self._status.broker_id, BROKER_MESSAGE_MAX_BYTES)
            dynamic_limit = _parse_int(dynamic) if dynamic is not None else None
            if dynamic_limit is not None:
                limit = dynamic_limit
                source = (
                    f"message.max.bytes={limit} (dynamic broker config) of broker {self._status.broker_id}"
                )
            else:
                limit = self._message_max_bytes
                source = f"message.max.bytes={limit} of broker {self._status.broker_id}"
        if limit > self._wire_max_bytes:
            limit = self._wire_max_bytes
            source = f"grpc.max.message.bytes minus {GRPC_ENVELOPE_BYTES} bytes of envelope on broker "
            source += str(self._status.broker_id)
        return limit, source

    def _check_high_watermark_caught_up(self, partition: Partition, high_watermark: int) -> None:
        """KIP-207: a new leader whose high watermark is still below the start offset of its own epoch
        (its followers have not fetched since it took over, e.g. right after a restart) does not know the
        committed end yet; LATEST would go backwards.  OFFSET_NOT_AVAILABLE (retriable) until it does."""
        state = None if self._replicas is None else self._replicas.leader_state(partition.tp)
        if state is not None and high_watermark < state.leader_epoch_start_offset:
            raise _Rejected(
                ErrorCode.OFFSET_NOT_AVAILABLE,
                f"{partition.tp}: the high watermark ({high_watermark}) is below the start offset of "
                f"leader epoch {state.leader_epoch} ({state.leader_epoch_start_offset}); retry",
                epoch=partition.leader_epoch,
            )

    def _check_cluster(self, cluster_id: str) -> None:
        if cluster_id != self._status.cluster_id:
            raise _Rejected(
                ErrorCode.INCONSISTENT_CLUSTER_ID,
                f"request is for cluster {cluster_id!r}, this broker belongs to {self._status.cluster_id!r}",
            )

    def _check_serving(self) -> None:
        error = self._status.serving_error()
        if error is not None:
            raise _Rejected(error[0], error[1])

    def _fetchable(self, request: pb.BrokerFetchRequest) -> Partition:
        self._check_serving()
        partition = self._leader_partition(request.topic, request.partition, request.leader_epoch)
        log = partition.log
        if not log.log_start_offset <= request.offset <= log.log_end_offset:
            raise _Rejected(
                ErrorCode.OFFSET_OUT_OF_RANGE,
                f"offset {request.offset} is outside [{log.log_start_offset}, {log.log_end_offset}] "
                f"of {partition.tp}",
                epoch=partition.leader_epoch,
            )
        return partition

    def _leader_partition(self, topic: str, index: int, client_epoch: int) -> Partition:
        tp = TopicPartition(topic, index)
        partition = self._partitions.get(tp)
        if partition is None:
            if self._view.topic_exists(topic):
                raise _Rejected(
                    ErrorCode.NOT_LEADER_OR_FOLLOWER, f"broker {self._status.broker_id} does not host {tp}"
                )
            raise _Rejected(ErrorCode.UNKNOWN_TOPIC_OR_PARTITION, f"unknown topic or partition {tp}")
        epoch = partition.leader_epoch
        if partition.role is not ReplicaRole.LEADER:
            raise _Rejected(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"broker {self._status.broker_id} is not the leader of {tp} (leader {partition.leader_id})",
                leader=self._view.node_ref(partition.leader_id),
                epoch=epoch,
            )
        if client_epoch not in (_NO_EPOCH_CHECK, epoch):
            code = ErrorCode.FENCED_LEADER_EPOCH if client_epoch < epoch else ErrorCode.UNKNOWN_LEADER_EPOCH
            raise _Rejected(
                code,
                f"leader epoch {client_epoch} of {tp} does not match the current epoch {epoch}",
                leader=self._view.node_ref(self._status.broker_id),
                epoch=epoch,
            )
        if self._replicas is not None and not self._replicas.leads(partition):
            # Becoming the leader: the partition is open but its replication state (high watermark, ISR
            # progress) is not set up yet.  Answering now would show HWM 0 — an empty partition.
            raise _Rejected(
                ErrorCode.NOT_LEADER_OR_FOLLOWER,
                f"broker {self._status.broker_id} is becoming the leader of {tp} (epoch {epoch}): "
                "its replication state is not set up yet, retry",
                leader=self._view.node_ref(self._status.broker_id),
                epoch=epoch,
            )
        return partition


def _to_produced(record: pb.BrokerRecord, now_ms: int) -> ProducedRecord:
    return ProducedRecord(
        key=record.key if record.has_key else None,
        value=record.value if record.has_value else None,
        timestamp_ms=record.timestamp_ms or now_ms,
    )


def _parse_int(text: str) -> int | None:
    """The controller validated the value (Java long syntax); anything else is treated as unset."""
    try:
        return int(text)
    except ValueError:
        return None


_log = logging.getLogger(__name__)


def add_broker_service(server: grpc.aio.Server, service: BrokerService) -> None:
    """Register BrokerService decoding inside the call: undecodable bytes get INVALID_ARGUMENT (one
    ``broker_bad_request`` warning per peer per interval) instead of gRPC's UNKNOWN with a traceback."""
    register_service(
        server,
        service,
        pb.DESCRIPTOR.services_by_name["BrokerService"],
        _SizingDecoder(_log, "broker_bad_request"),
    )


_REQUEST_WIRE_BYTES: ContextVar[int | None] = ContextVar("broker_request_wire_bytes", default=None)
"""The size of the request being handled as it came off the wire (kraft_broker_bytes_in), set by
:class:`_SizingDecoder` in the request's own task and read by the handler before its first await."""


class _SizingDecoder(RequestDecoder):
    """The broker's decoder also notes each request's wire size: known here for free, whereas measuring
    the decoded message again (``ByteSize``) would re-encode every record of a Produce."""

    async def decode(
        self, raw: bytes, pb_type: type[Message], method: str, context: ServicerContext
    ) -> Message:
        _REQUEST_WIRE_BYTES.set(len(raw))
        return await super().decode(raw, pb_type, method, context)
