"""Kafka's ApiVersions for kraft nodes: which gRPC services and methods a node serves, its software version
and its features (``kraft api-versions``, the counterpart of kafka-broker-api-versions.sh).

kraft speaks gRPC, not Kafka's versioned api keys: an RPC is either served or not, and a field added to a
message is ignored by an older peer.  What an operator needs before a rolling upgrade or when a command
fails with UNIMPLEMENTED is therefore the list of methods each node serves (taken from the services it
registered, so an older node simply lacks the newer methods), the kraft version it runs, and the
``metadata.version`` range it supports next to the level finalized in its metadata image.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from google.protobuf.descriptor import ServiceDescriptor

import kraft
from kraft.errors import ErrorCode
from kraft.features import SUPPORTED_FEATURES
from kraft.v1 import common_pb2


def api_versions(
    cluster_id: str,
    request: common_pb2.ApiVersionsRequest,
    node_id: int,
    role: str,
    services: Sequence[ServiceDescriptor],
    finalized: Mapping[str, int],
    image_offset: int,
) -> common_pb2.ApiVersionsResponse:
    """The answer of one node; INCONSISTENT_CLUSTER_ID (stating the node's cluster id) for another one."""
    response = common_pb2.ApiVersionsResponse(cluster_id=cluster_id, node_id=node_id, role=role)
    if request.cluster_id != cluster_id:
        response.error_code = int(ErrorCode.INCONSISTENT_CLUSTER_ID)
        response.error_message = (
            f"request cluster id {request.cluster_id!r} does not match this node's cluster {cluster_id!r}"
        )
        return response
    response.software_version = kraft.__version__
    for service in services:
        response.services.add(name=service.full_name, methods=[m.name for m in service.methods])
    for name, (low, high) in sorted(SUPPORTED_FEATURES.items()):
        response.supported_features.add(name=name, min_version=low, max_version=high)
    for name in sorted(finalized):
        response.finalized_features.add(name=name, level=finalized[name])
    response.finalized_features_epoch = image_offset
    return response
