"""``kraft.v1.ControllerService`` over gRPC: a thin adapter onto :class:`QuorumController`.

The servicer is installed on the node's server before Raft starts, so the controller is bound late
(:meth:`ControllerServicer.bind`); until then every call answers NOT_CONTROLLER with no known leader.
Protocol errors travel inside responses (``error_code``/``error_message``, NOT_CONTROLLER with the active
controller's ``NodeRef``; INCONSISTENT_CLUSTER_ID for an empty or wrong cluster id; POLICY_VIOLATION for a
request over ``max.request.topics``/``max.request.partitions``); only bugs become gRPC status INTERNAL,
with the exception text, and undecodable bytes INVALID_ARGUMENT (:func:`add_controller_service`).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message

from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.grpc_service import RequestDecoder, register_service
from kraft.metadata.controller import QuorumController
from kraft.observability.logging import get_logger
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
ServicerContext = grpc.aio.ServicerContext[Any, Any]

_log = get_logger("controller.service")


class ControllerServicer(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self, controller: QuorumController | None = None) -> None:
        self._controller = controller

    def bind(self, controller: QuorumController | None) -> None:
        self._controller = controller

    async def _call(
        self,
        context: ServicerContext,
        request: Req,
        empty: Callable[[], Resp],
        method: Callable[[QuorumController], Callable[[Req], Awaitable[Resp]]],
    ) -> Resp:
        controller = self._controller
        if controller is None:
            response = empty()
            response.error_code = int(ErrorCode.NOT_CONTROLLER)  # type: ignore[attr-defined]
            response.error_message = "the controller is starting"  # type: ignore[attr-defined]
            response.controller.node_id = -1  # type: ignore[attr-defined]
            return response
        try:
            return await method(controller)(request)
        except Exception as exc:
            _log.exception("controller_request_failed", request=type(request).__name__)
            await context.abort(
                grpc_status_for(ErrorCode.UNKNOWN_SERVER_ERROR), f"{type(exc).__name__}: {exc}"
            )
            raise AssertionError("unreachable: context.abort raises") from exc

    async def RegisterBroker(
        self, request: cpb.RegisterBrokerRequest, context: ServicerContext
    ) -> cpb.RegisterBrokerResponse:
        return await self._call(context, request, cpb.RegisterBrokerResponse, lambda c: c.register_broker)

    async def BrokerHeartbeat(
        self, request: cpb.BrokerHeartbeatRequest, context: ServicerContext
    ) -> cpb.BrokerHeartbeatResponse:
        return await self._call(context, request, cpb.BrokerHeartbeatResponse, lambda c: c.broker_heartbeat)

    async def UnregisterBroker(
        self, request: cpb.UnregisterBrokerRequest, context: ServicerContext
    ) -> cpb.UnregisterBrokerResponse:
        return await self._call(context, request, cpb.UnregisterBrokerResponse, lambda c: c.unregister_broker)

    async def ShutdownBroker(
        self, request: cpb.ShutdownBrokerRequest, context: ServicerContext
    ) -> cpb.ShutdownBrokerResponse:
        return await self._call(context, request, cpb.ShutdownBrokerResponse, lambda c: c.shutdown_broker)

    async def MetadataFetch(
        self, request: cpb.MetadataFetchRequest, context: ServicerContext
    ) -> cpb.MetadataFetchResponse:
        return await self._call(context, request, cpb.MetadataFetchResponse, lambda c: c.metadata_fetch)

    async def CreateTopics(
        self, request: cpb.CreateTopicsRequest, context: ServicerContext
    ) -> cpb.CreateTopicsResponse:
        return await self._call(context, request, cpb.CreateTopicsResponse, lambda c: c.create_topics)

    async def DeleteTopics(
        self, request: cpb.DeleteTopicsRequest, context: ServicerContext
    ) -> cpb.DeleteTopicsResponse:
        return await self._call(context, request, cpb.DeleteTopicsResponse, lambda c: c.delete_topics)

    async def DescribeTopics(
        self, request: cpb.DescribeTopicsRequest, context: ServicerContext
    ) -> cpb.DescribeTopicsResponse:
        return await self._call(context, request, cpb.DescribeTopicsResponse, lambda c: c.describe_topics)

    async def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: ServicerContext
    ) -> cpb.DescribeClusterResponse:
        return await self._call(context, request, cpb.DescribeClusterResponse, lambda c: c.describe_cluster)

    async def ElectLeaders(
        self, request: cpb.ElectLeadersRequest, context: ServicerContext
    ) -> cpb.ElectLeadersResponse:
        return await self._call(context, request, cpb.ElectLeadersResponse, lambda c: c.elect_leaders)

    async def AlterPartition(
        self, request: cpb.AlterPartitionRequest, context: ServicerContext
    ) -> cpb.AlterPartitionResponse:
        return await self._call(context, request, cpb.AlterPartitionResponse, lambda c: c.alter_partition)


def add_controller_service(server: grpc.aio.Server, servicer: ControllerServicer) -> None:
    """Register ControllerService on a controller's grpc.aio server (before ``server.start()``), decoding
    inside the call: undecodable bytes get INVALID_ARGUMENT (one ``controller_bad_request`` warning per
    peer per interval) instead of gRPC's UNKNOWN with a traceback."""
    register_service(
        server,
        servicer,
        cpb.DESCRIPTOR.services_by_name["ControllerService"],
        RequestDecoder(logging.getLogger(__name__), "controller_bad_request"),
    )
