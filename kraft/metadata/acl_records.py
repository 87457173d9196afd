"""``AccessControlEntryRecord`` ⇄ :class:`~kraft.security.acl.StandardAcl` (Kafka's ``StandardAcl.fromRecord``
/ ``toRecord``)."""

from __future__ import annotations

from kraft.security.acl import (
    AclError,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    StandardAcl,
)
from kraft.v1 import metadata_pb2 as pb


def acl_from_record(record: pb.AccessControlEntryRecord) -> StandardAcl:
    """The binding a record holds; :class:`AclError` for enum numbers this build does not know."""
    try:
        return StandardAcl(
            resource_type=ResourceType(record.resource_type),
            resource_name=record.resource_name,
            pattern_type=PatternType(record.pattern_type),
            principal=record.principal,
            host=record.host,
            operation=AclOperation(record.operation),
            permission=AclPermissionType(record.permission_type),
        )
    except ValueError as exc:
        raise AclError(f"ACL {record.id}: {exc}") from None


def acl_record(acl_id: str, acl: StandardAcl) -> pb.AccessControlEntryRecord:
    return pb.AccessControlEntryRecord(
        id=acl_id,
        resource_type=int(acl.resource_type),
        resource_name=acl.resource_name,
        pattern_type=int(acl.pattern_type),
        principal=acl.principal,
        host=acl.host,
        operation=int(acl.operation),
        permission_type=int(acl.permission),
    )
