"""CreateAcls / DescribeAcls / DeleteAcls on the active controller (Kafka's ``AclControlManager``).

Every binding is validated (:func:`kraft.security.acl.validate_acl`) and the request bounded before any
record is produced; the records are AccessControlEntryRecord / RemoveAccessControlEntryRecord, replayed
into the speculative image like every other write, so a second request in flight sees the first one's ACLs.
Creating a binding that already exists writes nothing and answers with the existing id (as Kafka does).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping

from kraft.errors import ErrorCode, KraftError
from kraft.metadata.acl_records import acl_record
from kraft.metadata.controller_logic import ControllerLogic, Outcome, _Batch, error_response
from kraft.security.acl import (
    AclError,
    AclFilter,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    StandardAcl,
    validate_acl,
)
from kraft.v1 import controller_pb2 as cpb
from kraft.v1 import metadata_pb2 as pb

MAX_ACLS_PER_REQUEST = 1_000
"""Creations in one CreateAcls request."""
MAX_ACL_FILTERS_PER_REQUEST = 100
"""Filters in one DeleteAcls request."""
MAX_ACLS = 100_000
"""ACLs in the cluster: every one is in every image, snapshot and authorizer index."""


def _resource_type(value: int) -> ResourceType:
    try:
        return ResourceType(value)
    except ValueError:
        raise AclError(f"unknown resource type {value}") from None


def _pattern_type(value: int) -> PatternType:
    try:
        return PatternType(value)
    except ValueError:
        raise AclError(f"unknown pattern type {value}") from None


def _operation(value: int) -> AclOperation:
    try:
        return AclOperation(value)
    except ValueError:
        raise AclError(f"unknown operation {value}") from None


def _permission(value: int) -> AclPermissionType:
    try:
        return AclPermissionType(value)
    except ValueError:
        raise AclError(f"unknown permission type {value}") from None


def acl_from_binding(binding: cpb.AclBinding) -> StandardAcl:
    """A wire binding as an ACL, validated; :class:`AclError` otherwise."""
    acl = StandardAcl(
        _resource_type(binding.resource_type),
        binding.resource_name,
        _pattern_type(binding.pattern_type),
        binding.principal,
        binding.host,
        _operation(binding.operation),
        _permission(binding.permission_type),
    )
    validate_acl(acl)
    return acl


def binding_of(acl: StandardAcl) -> cpb.AclBinding:
    return cpb.AclBinding(
        resource_type=int(acl.resource_type),
        resource_name=acl.resource_name,
        pattern_type=int(acl.pattern_type),
        principal=acl.principal,
        host=acl.host,
        operation=int(acl.operation),
        permission_type=int(acl.permission),
    )


def filter_from_wire(wire: cpb.AclFilter) -> AclFilter:
    """A wire filter, validated; :class:`AclError` otherwise (an unset enum field is UNKNOWN: refused)."""
    acl_filter = AclFilter(
        _resource_type(wire.resource_type),
        wire.resource_name if wire.HasField("resource_name") else None,
        _pattern_type(wire.pattern_type),
        wire.principal if wire.HasField("principal") else None,
        wire.host if wire.HasField("host") else None,
        _operation(wire.operation),
        _permission(wire.permission_type),
    )
    acl_filter.validate()
    return acl_filter


def filter_of(acl_filter: AclFilter) -> cpb.AclFilter:
    wire = cpb.AclFilter(
        resource_type=int(acl_filter.resource_type),
        pattern_type=int(acl_filter.pattern_type),
        operation=int(acl_filter.operation),
        permission_type=int(acl_filter.permission),
    )
    if acl_filter.resource_name is not None:
        wire.resource_name = acl_filter.resource_name
    if acl_filter.principal is not None:
        wire.principal = acl_filter.principal
    if acl_filter.host is not None:
        wire.host = acl_filter.host
    return wire


def matching_acls(acls: Mapping[str, StandardAcl], acl_filter: AclFilter) -> list[tuple[str, StandardAcl]]:
    """The ACLs a filter matches, ordered by resource then id (a stable listing)."""
    found = [(i, a) for i, a in acls.items() if acl_filter.matches(a)]
    found.sort(key=lambda item: (item[1].resource_type, item[1].resource_name, item[1].principal, item[0]))
    return found


def describe_acls(acls: Mapping[str, StandardAcl], req: cpb.DescribeAclsRequest) -> cpb.DescribeAclsResponse:
    response = cpb.DescribeAclsResponse()
    try:
        acl_filter = filter_from_wire(req.filter)
    except AclError as exc:
        return error_response(response, ErrorCode.INVALID_REQUEST, str(exc))
    for acl_id, acl in matching_acls(acls, acl_filter):
        response.acls.add(id=acl_id, binding=binding_of(acl))
    return response


def create_acls(
    logic: ControllerLogic,
    req: cpb.CreateAclsRequest,
    next_offset: int,
    new_id: Callable[[], str] | None = None,
) -> Outcome[cpb.CreateAclsResponse]:
    """Per-creation results; an invalid binding fails alone, the valid ones are written."""
    response = cpb.CreateAclsResponse()
    try:
        logic.check_cluster_id(req.cluster_id)
        if len(req.creations) > MAX_ACLS_PER_REQUEST:
            raise KraftError(
                ErrorCode.POLICY_VIOLATION,
                f"{len(req.creations)} ACLs in one request; at most {MAX_ACLS_PER_REQUEST}",
            )
    except KraftError as exc:
        return Outcome([], error_response(response, exc.code, exc.message))
    make_id = new_id or (lambda: str(uuid.uuid4()))
    existing = {acl: acl_id for acl_id, acl in logic.image.acls.items()}
    count = len(logic.image.acls)
    batch = _Batch(logic, next_offset)
    for creation in req.creations:
        result = response.results.add()
        try:
            acl = acl_from_binding(creation)
        except AclError as exc:
            error_response(result, ErrorCode.INVALID_REQUEST, str(exc))
            continue
        known = existing.get(acl)
        if known is not None:
            result.id = known
            continue
        if count >= MAX_ACLS:
            error_response(result, ErrorCode.POLICY_VIOLATION, f"the cluster already has {MAX_ACLS} ACLs")
            continue
        acl_id = make_id()
        batch.add(acl_record(acl_id, acl))
        existing[acl] = acl_id
        count += 1
        result.id = acl_id
    return Outcome(batch.finish(), response, next_offset)


def delete_acls(
    logic: ControllerLogic, req: cpb.DeleteAclsRequest, next_offset: int
) -> Outcome[cpb.DeleteAclsResponse]:
    """Per-filter results listing what each filter deleted (an ACL matched by two filters is deleted once,
    reported by the first)."""
    response = cpb.DeleteAclsResponse()
    try:
        logic.check_cluster_id(req.cluster_id)
        if len(req.filters) > MAX_ACL_FILTERS_PER_REQUEST:
            raise KraftError(
                ErrorCode.POLICY_VIOLATION,
                f"{len(req.filters)} filters in one request; at most {MAX_ACL_FILTERS_PER_REQUEST}",
            )
    except KraftError as exc:
        return Outcome([], error_response(response, exc.code, exc.message))
    batch = _Batch(logic, next_offset)
    removed: set[str] = set()
    acls = logic.image.acls
    for wire in req.filters:
        result = response.filter_results.add()
        try:
            acl_filter = filter_from_wire(wire)
        except AclError as exc:
            error_response(result, ErrorCode.INVALID_REQUEST, str(exc))
            continue
        for acl_id, acl in matching_acls(acls, acl_filter):
            if acl_id in removed:
                continue
            removed.add(acl_id)
            batch.add(pb.RemoveAccessControlEntryRecord(id=acl_id))
            result.matching_acls.add(id=acl_id, binding=binding_of(acl))
    return Outcome(batch.finish(), response, next_offset)
