"""grpc.health.v1 for kraft processes: a server-side reporter and a client-side check.

Service names and what SERVING means (the deployment tooling waits on these):

- ``""`` (overall): the process is up and its gRPC server accepts calls; NOT_SERVING while shutting down.
- ``kraft.v1.RaftService``: this controller knows the current leader (it is leader or follower).
- ``kraft.v1.ControllerService``: this node is the active controller (the Raft leader).
- ``kraft.v1.BrokerService``: this broker is unfenced (BrokerState RUNNING) and serves clients.

The service is registered like kraft's own (:func:`kraft.grpc_service.register_service`): bytes that are
no request answer ``INVALID_ARGUMENT`` with one rate-limited warning, not ``UNKNOWN`` with a traceback at
error level (issue #15's fuzzer).  ``List`` (every service name and its status) is implemented.
"""

from __future__ import annotations

import asyncio
import enum
import logging
from typing import Final

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

# grpc_health exposes this as ``health.aio``, an implicit re-export mypy --strict rejects.
from grpc_health.v1._async import HealthServicer as AioHealthServicer

from kraft.client.channel import open_blocking_channel, open_channel
from kraft.grpc_service import RequestDecoder, ServicerContext, register_service

OVERALL: Final = ""
RAFT_SERVICE: Final = "kraft.v1.RaftService"
CONTROLLER_SERVICE: Final = "kraft.v1.ControllerService"
BROKER_SERVICE: Final = "kraft.v1.BrokerService"


class HealthStatus(enum.StrEnum):
    """What a health check found; ``UNREACHABLE`` covers connection failures and deadlines."""

    SERVING = "SERVING"
    NOT_SERVING = "NOT_SERVING"
    SERVICE_UNKNOWN = "SERVICE_UNKNOWN"
    UNKNOWN = "UNKNOWN"
    UNREACHABLE = "UNREACHABLE"


_FROM_PB: Final = {
    health_pb2.HealthCheckResponse.SERVING: HealthStatus.SERVING,
    health_pb2.HealthCheckResponse.NOT_SERVING: HealthStatus.NOT_SERVING,
    health_pb2.HealthCheckResponse.SERVICE_UNKNOWN: HealthStatus.SERVICE_UNKNOWN,
    health_pb2.HealthCheckResponse.UNKNOWN: HealthStatus.UNKNOWN,
}


class _Servicer(AioHealthServicer):  # type: ignore[misc]
    """grpc_health's servicer, plus ``List`` (its asyncio servicer answers UNIMPLEMENTED)."""

    async def List(
        self, request: health_pb2.HealthListRequest, context: ServicerContext
    ) -> health_pb2.HealthListResponse:
        return health_pb2.HealthListResponse(
            statuses={
                name: health_pb2.HealthCheckResponse(status=status)
                for name, status in self._server_status.items()
            }
        )


_HEALTH = health_pb2.DESCRIPTOR.services_by_name["Health"]
_log = logging.getLogger(__name__)


class HealthReporter:
    """Owns the grpc.health.v1 servicer of one grpc.aio server; set statuses per service name."""

    def __init__(self) -> None:
        self._servicer = _Servicer()

    @property
    def servicer(self) -> health_pb2_grpc.HealthServicer:
        return self._servicer

    def register(self, server: grpc.aio.Server) -> None:
        """Add the servicer to ``server`` (before it starts)."""
        register_service(server, self._servicer, _HEALTH, RequestDecoder(_log, "health_bad_request"))

    async def set_serving(self, service: str, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self._servicer.set(service, status)

    async def shutdown(self) -> None:
        """Every service NOT_SERVING from now on (call first thing on SIGTERM)."""
        await self._servicer.enter_graceful_shutdown()


async def add_health_service(server: grpc.aio.Server, services: tuple[str, ...] = ()) -> HealthReporter:
    """Register grpc.health.v1 on ``server``; overall is SERVING, each of ``services`` NOT_SERVING."""
    reporter = HealthReporter()
    reporter.register(server)
    for service in services:
        await reporter.set_serving(service, False)
    return reporter


def _status_of(error: grpc.RpcError) -> HealthStatus:
    # Sync errors are grpc.Call, aio errors are AioRpcError; both have code().
    code = error.code() if isinstance(error, grpc.Call | grpc.aio.AioRpcError) else None
    return HealthStatus.SERVICE_UNKNOWN if code == grpc.StatusCode.NOT_FOUND else HealthStatus.UNREACHABLE


async def check_health(target: str, service: str = OVERALL, timeout_s: float = 2.0) -> HealthStatus:
    """One Health/Check call to ``target`` (``host:port``), bounded by ``timeout_s``; never raises for
    network trouble — an unreachable node is :attr:`HealthStatus.UNREACHABLE`."""
    async with open_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = await asyncio.wait_for(
                stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s), timeout_s + 1
            )
        except grpc.RpcError as error:
            return _status_of(error)
        except TimeoutError:
            return HealthStatus.UNREACHABLE
    return _FROM_PB.get(reply.status, HealthStatus.UNKNOWN)


def check_health_sync(target: str, service: str = OVERALL, timeout_s: float = 2.0) -> HealthStatus:
    """Blocking :func:`check_health` for CLI code that has no event loop."""
    with open_blocking_channel(target) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=timeout_s)
        except grpc.RpcError as error:
            return _status_of(error)
    return _FROM_PB.get(reply.status, HealthStatus.UNKNOWN)
