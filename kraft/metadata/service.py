"""``kraft.v1.ControllerService`` over gRPC: a thin adapter onto :class:`QuorumController`.

Protocol errors travel inside responses (``error_code``/``error_message``, NOT_CONTROLLER with the active
controller's ``NodeRef``); only bugs become gRPC status INTERNAL, with the exception text.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
import grpc.aio

from kraft.metadata.controller import QuorumController
from kraft.observability.logging import get_logger
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import controller_pb2_grpc

Req = TypeVar("Req")
Resp = TypeVar("Resp")
ServicerContext = grpc.aio.ServicerContext[Any, Any]

_log = get_logger("controller.service")


async def _call(context: ServicerContext, handler: Callable[[Req], Awaitable[Resp]], request: Req) -> Resp:
    try:
        return await handler(request)
    except Exception as exc:
        _log.exception("controller_request_failed", request=type(request).__name__)
        await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        raise AssertionError("unreachable: context.abort raises") from exc


class ControllerServicer(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(self, controller: QuorumController) -> None:
        self._c = controller

    async def RegisterBroker(
        self, request: cpb.RegisterBrokerRequest, context: ServicerContext
    ) -> cpb.RegisterBrokerResponse:
        return await _call(context, self._c.register_broker, request)

    async def BrokerHeartbeat(
        self, request: cpb.BrokerHeartbeatRequest, context: ServicerContext
    ) -> cpb.BrokerHeartbeatResponse:
        return await _call(context, self._c.broker_heartbeat, request)

    async def UnregisterBroker(
        self, request: cpb.UnregisterBrokerRequest, context: ServicerContext
    ) -> cpb.UnregisterBrokerResponse:
        return await _call(context, self._c.unregister_broker, request)

    async def ShutdownBroker(
        self, request: cpb.ShutdownBrokerRequest, context: ServicerContext
    ) -> cpb.ShutdownBrokerResponse:
        return await _call(context, self._c.shutdown_broker, request)

    async def MetadataFetch(
        self, request: cpb.MetadataFetchRequest, context: ServicerContext
    ) -> cpb.MetadataFetchResponse:
        return await _call(context, self._c.metadata_fetch, request)

    async def CreateTopics(
        self, request: cpb.CreateTopicsRequest, context: ServicerContext
    ) -> cpb.CreateTopicsResponse:
        return await _call(context, self._c.create_topics, request)

    async def DeleteTopics(
        self, request: cpb.DeleteTopicsRequest, context: ServicerContext
    ) -> cpb.DeleteTopicsResponse:
        return await _call(context, self._c.delete_topics, request)

    async def DescribeTopics(
        self, request: cpb.DescribeTopicsRequest, context: ServicerContext
    ) -> cpb.DescribeTopicsResponse:
        return await _call(context, self._c.describe_topics, request)

    async def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: ServicerContext
    ) -> cpb.DescribeClusterResponse:
        return await _call(context, self._c.describe_cluster, request)

    async def ElectLeaders(
        self, request: cpb.ElectLeadersRequest, context: ServicerContext
    ) -> cpb.ElectLeadersResponse:
        return await _call(context, self._c.elect_leaders, request)


def add_controller_service(server: grpc.aio.Server, controller: QuorumController) -> None:
    """Register ControllerService on a controller's grpc.aio server (call before ``server.start()``)."""
    controller_pb2_grpc.add_ControllerServiceServicer_to_server(ControllerServicer(controller), server)
