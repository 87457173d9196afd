"""A small in-process ControllerService for broker unit tests: a committed record list, broker
registrations with Kafka's fencing rules, long-poll MetadataFetch and chunked snapshots.

It is a fake, not a mock: it keeps real state and answers as the real controller's contract says
(``proto/kraft/v1/controller.proto``), so the broker's loops run unmodified against it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.protobuf.message import Message

from kraft.errors import ErrorCode
from kraft.metadata.records import encode_value, wrap
from kraft.netutil import free_port
from kraft.v1 import common_pb2, controller_pb2_grpc
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as mpb
from kraft.v1.common_pb2 import Endpoint, NodeRef

Context = grpc.aio.ServicerContext[Any, Any]


@dataclass
class Registration:
    incarnation_id: str
    epoch: int
    fenced: bool = True
    heartbeats: int = 0


@dataclass
class FakeSnapshot:
    end_offset: int
    epoch: int
    values: list[bytes] = field(default_factory=list)


class FakeController(controller_pb2_grpc.ControllerServiceServicer):
    """Serves RegisterBroker, BrokerHeartbeat and MetadataFetch (the calls a broker makes); the admin
    calls answer UNIMPLEMENTED."""

    def __init__(self, cluster_id: str) -> None:
        self.cluster_id = cluster_id
        self.records: list[cpb.CommittedRecord] = []
        self.log_start = 0
        self.snapshot: FakeSnapshot | None = None
        self.brokers: dict[int, Registration] = {}
        self.snapshot_chunk = 2
        self.redirect_to: NodeRef | None = None
        self.blocked = False  # answer heartbeats and fetches with UNAVAILABLE (like a SIGSTOPped broker)
        self.fetch_requests: list[cpb.MetadataFetchRequest] = []
        self.register_requests: list[cpb.RegisterBrokerRequest] = []
        self.heartbeat_streams = 0  # BrokerHeartbeatStream calls opened
        self._appended = asyncio.Event()
        self.server: grpc.aio.Server | None = None
        self.port = -1

    # --- test controls -------------------------------------------------------------------------

    @property
    def next_offset(self) -> int:
        return self.records[-1].offset + 1 if self.records else self.log_start

    def append(self, *payloads: Message) -> int:
        """Commit records; returns the offset of the last one."""
        for payload in payloads:
            value = encode_value(wrap(payload))
            self.records.append(cpb.CommittedRecord(offset=self.next_offset, leader_epoch=1, value=value))
        self._appended.set()
        self._appended = asyncio.Event()
        return self.next_offset - 1

    def take_snapshot(self) -> None:
        """Fold every record into a snapshot and truncate the log before its end."""
        end = self.next_offset
        values = [r.value for r in self.records]
        if self.snapshot is not None:
            values = self.snapshot.values + values
        self.snapshot = FakeSnapshot(end, 1, values)
        self.records = []
        self.log_start = end

    async def start(self) -> str:
        server = grpc.aio.server()
        controller_pb2_grpc.add_ControllerServiceServicer_to_server(self, server)
        self.port = server.add_insecure_port(f"127.0.0.1:{free_port()}")
        await server.start()
        self.server = server
        return f"127.0.0.1:{self.port}"

    async def stop(self) -> None:
        if self.server is not None:
            await self.server.stop(None)

    def _not_controller(self) -> NodeRef | None:
        return self.redirect_to

    # --- ControllerService -----------------------------------------------------------------------

    async def RegisterBroker(
        self, request: cpb.RegisterBrokerRequest, context: Context
    ) -> cpb.RegisterBrokerResponse:
        if (hint := self._not_controller()) is not None:
            return cpb.RegisterBrokerResponse(error_code=ErrorCode.NOT_CONTROLLER, controller=hint)
        self.register_requests.append(request)
        if request.cluster_id != self.cluster_id:
            return cpb.RegisterBrokerResponse(
                error_code=ErrorCode.INCONSISTENT_CLUSTER_ID, error_message="no"
            )
        current = self.brokers.get(request.broker_id)
        if current is not None and current.incarnation_id == request.incarnation_id:
            return cpb.RegisterBrokerResponse(broker_epoch=current.epoch)
        epoch = self.append(
            mpb.RegisterBrokerRecord(
                broker_id=request.broker_id,
                incarnation_id=request.incarnation_id,
                broker_epoch=self.next_offset,
                endpoints=list(request.listeners),
                fenced=True,
            )
        )
        self.brokers[request.broker_id] = Registration(request.incarnation_id, epoch)
        return cpb.RegisterBrokerResponse(broker_epoch=epoch)

    async def BrokerHeartbeat(
        self, request: cpb.BrokerHeartbeatRequest, context: Context
    ) -> cpb.BrokerHeartbeatResponse:
        if (hint := self._not_controller()) is not None:
            return cpb.BrokerHeartbeatResponse(error_code=ErrorCode.NOT_CONTROLLER, controller=hint)
        if self.blocked:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "blocked by the test")
        registration = self.brokers.get(request.broker_id)
        if registration is None or registration.epoch != request.broker_epoch:
            return cpb.BrokerHeartbeatResponse(error_code=ErrorCode.STALE_BROKER_EPOCH, error_message="stale")
        registration.heartbeats += 1
        caught_up = request.current_metadata_offset >= registration.epoch
        if request.want_shut_down:
            registration.fenced = True
            return cpb.BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=True, should_shut_down=True)
        if registration.fenced and caught_up and not request.want_fence:
            registration.fenced = False
            self.append(mpb.UnfenceBrokerRecord(id=request.broker_id, epoch=registration.epoch))
        return cpb.BrokerHeartbeatResponse(is_caught_up=caught_up, is_fenced=registration.fenced)

    async def BrokerHeartbeatStream(
        self, requests: AsyncIterator[cpb.BrokerHeartbeatRequest], context: Context
    ) -> AsyncIterator[cpb.BrokerHeartbeatResponse]:
        """Each message answered as BrokerHeartbeat answers it (the brokers' default path)."""
        self.heartbeat_streams += 1
        async for request in requests:
            yield await self.BrokerHeartbeat(request, context)

    async def AlterPartition(
        self, request: cpb.AlterPartitionRequest, context: Context
    ) -> cpb.AlterPartitionResponse:
        # The fake hosts single-broker tests and benchmarks: it keeps no ISR state to change.
        return cpb.AlterPartitionResponse(
            error_code=ErrorCode.INVALID_REQUEST, error_message="the fake controller does not change ISRs"
        )

    async def MetadataFetch(
        self, request: cpb.MetadataFetchRequest, context: Context
    ) -> cpb.MetadataFetchResponse:
        self.fetch_requests.append(request)
        if (hint := self._not_controller()) is not None:
            return cpb.MetadataFetchResponse(error_code=ErrorCode.NOT_CONTROLLER, controller=hint)
        if self.blocked:
            await context.abort(grpc.StatusCode.UNAVAILABLE, "blocked by the test")
        if request.HasField("snapshot_id"):
            return self._snapshot_chunk(request)
        if request.fetch_offset < self.log_start and self.snapshot is not None:
            ref = cpb.SnapshotRef(end_offset=self.snapshot.end_offset, epoch=self.snapshot.epoch)
            return cpb.MetadataFetchResponse(
                snapshot_id=ref, high_watermark=self.next_offset, log_start_offset=self.log_start
            )
        records = self._records_from(request)
        if not records and request.max_wait_ms > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._appended.wait(), request.max_wait_ms / 1000.0)
            records = self._records_from(request)
        return cpb.MetadataFetchResponse(
            records=records, high_watermark=self.next_offset, log_start_offset=self.log_start
        )

    # --- admin calls a broker never makes -------------------------------------------------------

    async def _unsupported(self, context: Context) -> NoReturn:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "not part of the broker-facing fake")
        raise AssertionError("abort returned")

    async def UnregisterBroker(self, request: cpb.UnregisterBrokerRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def ShutdownBroker(self, request: cpb.ShutdownBrokerRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def CreateTopics(self, request: cpb.CreateTopicsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def DeleteTopics(self, request: cpb.DeleteTopicsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def DescribeTopics(self, request: cpb.DescribeTopicsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def DescribeCluster(self, request: cpb.DescribeClusterRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def ElectLeaders(self, request: cpb.ElectLeadersRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def CreateAcls(self, request: cpb.CreateAclsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def DescribeAcls(self, request: cpb.DescribeAclsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def DeleteAcls(self, request: cpb.DeleteAclsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def CreatePartitions(self, request: cpb.CreatePartitionsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def DescribeConfigs(self, request: cpb.DescribeConfigsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def IncrementalAlterConfigs(
        self, request: cpb.IncrementalAlterConfigsRequest, context: Context
    ) -> NoReturn:
        await self._unsupported(context)

    async def ApiVersions(self, request: common_pb2.ApiVersionsRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    async def UpdateFeatures(self, request: cpb.UpdateFeaturesRequest, context: Context) -> NoReturn:
        await self._unsupported(context)

    def _records_from(self, request: cpb.MetadataFetchRequest) -> list[cpb.CommittedRecord]:
        # The real controller's default page (controller.py DEFAULT_FETCH_RECORDS).
        limit = request.max_records if request.max_records > 0 else 10_000
        start = max(0, request.fetch_offset - self.log_start)
        return self.records[start : start + limit]

    def _snapshot_chunk(self, request: cpb.MetadataFetchRequest) -> cpb.MetadataFetchResponse:
        snapshot = self.snapshot
        assert snapshot is not None
        start = int(request.snapshot_position)
        end = min(start + self.snapshot_chunk, len(snapshot.values))
        return cpb.MetadataFetchResponse(
            snapshot_id=cpb.SnapshotRef(end_offset=snapshot.end_offset, epoch=snapshot.epoch),
            snapshot_records=snapshot.values[start:end],
            next_snapshot_position=end,
            snapshot_done=end >= len(snapshot.values),
            high_watermark=self.next_offset,
        )


def broker_endpoint(port: int) -> Endpoint:
    return Endpoint(name="PLAINTEXT", host="127.0.0.1", port=port, security_protocol="PLAINTEXT")
