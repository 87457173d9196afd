"""``kraft.v1.ControllerService`` over gRPC: a thin adapter onto :class:`QuorumController`.

The servicer is installed on the node's server before Raft starts, so the controller is bound late
(:meth:`ControllerServicer.bind`); until then every call answers NOT_CONTROLLER with no known leader.
Protocol errors travel inside responses (``error_code``/``error_message``, NOT_CONTROLLER with the active
controller's ``NodeRef``; INCONSISTENT_CLUSTER_ID for an empty or wrong cluster id; POLICY_VIOLATION for a
request over ``max.request.topics``/``max.request.partitions``); only bugs become gRPC status INTERNAL,
with the exception text, and undecodable bytes INVALID_ARGUMENT (:func:`add_controller_service`).

Every handler first asks the :class:`~kraft.security.guard.RequestGuard` (identity binding, ACLs against
this controller's committed image; docs/security.md has the RPC → resource/operation table); a refusal
aborts the call with PERMISSION_DENIED and ``TOPIC_AUTHORIZATION_FAILED: …`` or
``CLUSTER_AUTHORIZATION_FAILED: …`` before anything else happens.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from typing import Any, TypeVar

import grpc
import grpc.aio
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2

from kraft.api_versions import api_versions
from kraft.errors import ErrorCode
from kraft.grpc_errors import grpc_status_for
from kraft.grpc_service import RequestDecoder, register_service
from kraft.metadata.controller import QuorumController
from kraft.metadata.records import ConfigResourceType
from kraft.observability.logging import get_logger
from kraft.security.acl import AclOperation, StandardAcl
from kraft.security.authorizer import Authorizer, AuthorizerSettings
from kraft.security.guard import AccessDenied, RequestGuard
from kraft.v1 import common_pb2, controller_pb2_grpc, raft_pb2
from kraft.v1 import controller_pb2 as cpb

Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)
ServicerContext = grpc.aio.ServicerContext[Any, Any]

_log = get_logger("controller.service")


class ControllerServicer(controller_pb2_grpc.ControllerServiceServicer):
    def __init__(
        self,
        controller: QuorumController | None = None,
        authorizer: AuthorizerSettings | None = None,
    ) -> None:
        """``authorizer``: the node's authorizer settings (None or not enabled: no ACL checks; identity
        binding of node principals applies either way)."""
        self._controller = controller
        enabled = authorizer is not None and authorizer.enabled
        self.guard = RequestGuard(Authorizer(authorizer, self._acls) if authorizer and enabled else None)

    def bind(self, controller: QuorumController | None) -> None:
        self._controller = controller

    def _acls(self) -> Mapping[str, StandardAcl]:
        controller = self._controller
        return {} if controller is None else controller.committed.acls

    async def _call(
        self,
        context: ServicerContext,
        request: Req,
        empty: Callable[[], Resp],
        method: Callable[[QuorumController], Callable[[Req], Awaitable[Resp]]],
        check: Callable[[], None] | None = None,
    ) -> Resp:
        if check is not None:
            try:
                check()
            except AccessDenied as exc:
                await context.abort(grpc_status_for(exc.code), str(exc))
                raise AssertionError("unreachable: context.abort raises") from exc
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
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.RegisterBrokerResponse,
            lambda c: c.register_broker,
            lambda: guard.check_node(context, request.broker_id, "register as broker"),
        )

    async def BrokerHeartbeat(
        self, request: cpb.BrokerHeartbeatRequest, context: ServicerContext
    ) -> cpb.BrokerHeartbeatResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.BrokerHeartbeatResponse,
            lambda c: c.broker_heartbeat,
            lambda: guard.check_node(context, request.broker_id, "heartbeat as broker"),
        )

    async def BrokerHeartbeatStream(
        self, requests: AsyncIterator[cpb.BrokerHeartbeatRequest], context: ServicerContext
    ) -> AsyncIterator[cpb.BrokerHeartbeatResponse]:
        """Each message answered as :meth:`BrokerHeartbeat` answers it, in order (a refusal ends the
        stream).  Where the heartbeat bridge runs, kraft.node.heartbeat_stream serves the method instead."""
        async for request in requests:
            yield await self.BrokerHeartbeat(request, context)

    async def UnregisterBroker(
        self, request: cpb.UnregisterBrokerRequest, context: ServicerContext
    ) -> cpb.UnregisterBrokerResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.UnregisterBrokerResponse,
            lambda c: c.unregister_broker,
            lambda: guard.check_cluster(context, AclOperation.ALTER),
        )

    async def ShutdownBroker(
        self, request: cpb.ShutdownBrokerRequest, context: ServicerContext
    ) -> cpb.ShutdownBrokerResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.ShutdownBrokerResponse,
            lambda c: c.shutdown_broker,
            lambda: guard.check_cluster(context, AclOperation.ALTER),
        )

    async def MetadataFetch(
        self, request: cpb.MetadataFetchRequest, context: ServicerContext
    ) -> cpb.MetadataFetchResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.MetadataFetchResponse,
            lambda c: c.metadata_fetch,
            lambda: guard.check_node(context, request.broker_id, "fetch metadata as broker"),
        )

    async def CreateTopics(
        self, request: cpb.CreateTopicsRequest, context: ServicerContext
    ) -> cpb.CreateTopicsResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.CreateTopicsResponse,
            lambda c: c.create_topics,
            lambda: guard.check_topics(
                context, AclOperation.CREATE, [t.name for t in request.topics], or_cluster=True
            ),
        )

    async def DeleteTopics(
        self, request: cpb.DeleteTopicsRequest, context: ServicerContext
    ) -> cpb.DeleteTopicsResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.DeleteTopicsResponse,
            lambda c: c.delete_topics,
            lambda: guard.check_topics(context, AclOperation.DELETE, request.names),
        )

    async def DescribeTopics(
        self, request: cpb.DescribeTopicsRequest, context: ServicerContext
    ) -> cpb.DescribeTopicsResponse:
        response = await self._call(context, request, cpb.DescribeTopicsResponse, lambda c: c.describe_topics)
        if not self.guard.enabled or response.error_code != ErrorCode.NONE:
            return response
        # Kafka's rule: a listing leaves out what the caller may not DESCRIBE; a topic asked for by
        # name answers TOPIC_AUTHORIZATION_FAILED (whether it exists or not).
        may_describe = self.guard.topic_filter(context, AclOperation.DESCRIBE)
        kept = []
        for topic in response.topics:
            if may_describe(topic.name):
                kept.append(topic)
            elif request.names:
                kept.append(
                    cpb.TopicDescription(
                        name=topic.name,
                        error_code=int(ErrorCode.TOPIC_AUTHORIZATION_FAILED),
                        error_message=f"not authorized to DESCRIBE topic {topic.name!r}",
                    )
                )
        del response.topics[:]
        response.topics.extend(kept)
        return response

    async def DescribeCluster(
        self, request: cpb.DescribeClusterRequest, context: ServicerContext
    ) -> cpb.DescribeClusterResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.DescribeClusterResponse,
            lambda c: c.describe_cluster,
            lambda: guard.check_cluster(context, AclOperation.DESCRIBE),
        )

    async def ElectLeaders(
        self, request: cpb.ElectLeadersRequest, context: ServicerContext
    ) -> cpb.ElectLeadersResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.ElectLeadersResponse,
            lambda c: c.elect_leaders,
            lambda: guard.check_cluster(context, AclOperation.ALTER),
        )

    async def AlterPartition(
        self, request: cpb.AlterPartitionRequest, context: ServicerContext
    ) -> cpb.AlterPartitionResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.AlterPartitionResponse,
            lambda c: c.alter_partition,
            lambda: guard.check_node(context, request.broker_id, "alter partitions as broker"),
        )

    async def CreateAcls(
        self, request: cpb.CreateAclsRequest, context: ServicerContext
    ) -> cpb.CreateAclsResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.CreateAclsResponse,
            lambda c: c.create_acls,
            lambda: guard.check_cluster(context, AclOperation.ALTER),
        )

    async def DescribeAcls(
        self, request: cpb.DescribeAclsRequest, context: ServicerContext
    ) -> cpb.DescribeAclsResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.DescribeAclsResponse,
            lambda c: c.describe_acls,
            lambda: guard.check_cluster(context, AclOperation.DESCRIBE),
        )

    async def DeleteAcls(
        self, request: cpb.DeleteAclsRequest, context: ServicerContext
    ) -> cpb.DeleteAclsResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.DeleteAclsResponse,
            lambda c: c.delete_acls,
            lambda: guard.check_cluster(context, AclOperation.ALTER),
        )

    async def CreatePartitions(
        self, request: cpb.CreatePartitionsRequest, context: ServicerContext
    ) -> cpb.CreatePartitionsResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.CreatePartitionsResponse,
            lambda c: c.create_partitions,
            lambda: guard.check_topics(context, AclOperation.ALTER, [t.name for t in request.topics]),
        )

    async def DescribeConfigs(
        self, request: cpb.DescribeConfigsRequest, context: ServicerContext
    ) -> cpb.DescribeConfigsResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.DescribeConfigsResponse,
            lambda c: c.describe_configs,
            lambda: _check_config_resources(
                guard, context, AclOperation.DESCRIBE_CONFIGS, [r.resource for r in request.resources]
            ),
        )

    async def IncrementalAlterConfigs(
        self, request: cpb.IncrementalAlterConfigsRequest, context: ServicerContext
    ) -> cpb.IncrementalAlterConfigsResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.IncrementalAlterConfigsResponse,
            lambda c: c.incremental_alter_configs,
            lambda: _check_config_resources(
                guard, context, AclOperation.ALTER_CONFIGS, [r.resource for r in request.resources]
            ),
        )

    async def UpdateFeatures(
        self, request: cpb.UpdateFeaturesRequest, context: ServicerContext
    ) -> cpb.UpdateFeaturesResponse:
        guard = self.guard
        return await self._call(
            context,
            request,
            cpb.UpdateFeaturesResponse,
            lambda c: c.update_features,
            lambda: guard.check_cluster(context, AclOperation.ALTER),  # Kafka: ALTER on CLUSTER
        )

    async def ApiVersions(
        self, request: common_pb2.ApiVersionsRequest, context: ServicerContext
    ) -> common_pb2.ApiVersionsResponse:
        """Any controller answers, active or not (no authorization, as Kafka's ApiVersions)."""
        controller = self._controller
        if controller is None:
            return common_pb2.ApiVersionsResponse(
                error_code=int(ErrorCode.NOT_CONTROLLER), error_message="the controller is starting"
            )
        image = controller.committed
        return api_versions(
            controller.cluster_id,
            request,
            controller.node_id,
            "controller",
            [
                raft_pb2.DESCRIPTOR.services_by_name["RaftService"],
                cpb.DESCRIPTOR.services_by_name["ControllerService"],
                health_pb2.DESCRIPTOR.services_by_name["Health"],
            ],
            image.features,
            image.offset,
        )


def _check_config_resources(
    guard: RequestGuard,
    context: ServicerContext,
    operation: AclOperation,
    resources: list[cpb.ConfigResource],
) -> None:
    """Kafka's rule for DescribeConfigs / IncrementalAlterConfigs: ``operation`` on each TOPIC resource, on
    CLUSTER for BROKER resources (any other type is the controller's INVALID_REQUEST, checked as CLUSTER)."""
    topics = [r.resource_name for r in resources if r.resource_type == ConfigResourceType.TOPIC]
    if len(topics) < len(resources):
        guard.check_cluster(context, operation)
    guard.check_topics(context, operation, topics)


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
