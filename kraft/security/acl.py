"""ACL bindings and filters (Kafka's ``AclBinding`` / ``AclBindingFilter``, KIP-801 ``StandardAcl``).

The enums carry Kafka's numbers (``ResourceType``, ``PatternType``, ``AclOperation``,
``AclPermissionType``), which is what ``AccessControlEntryRecord`` stores in the metadata log and what the
ControllerService ACL RPCs carry.  :func:`validate_acl` is the one rule for what may be written: it is
checked where a CreateAcls request enters, before anything is appended.

Pure: no IO, nothing of kraft but :mod:`kraft.security.principal`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TypeVar

from kraft.security.principal import Principal

CLUSTER_RESOURCE_NAME = "kafka-cluster"
"""The one name of the CLUSTER resource (Kafka's ``Resource.CLUSTER_NAME``)."""
WILDCARD = "*"
"""A LITERAL resource name ``*`` matches every resource of its type; host ``*`` every host."""
WILDCARD_PRINCIPAL = "User:*"

MAX_RESOURCE_NAME_CHARS = 1024
MAX_PRINCIPAL_CHARS = 1024
MAX_HOST_CHARS = 255

E = TypeVar("E", bound=enum.IntEnum)


class ResourceType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5
    DELEGATION_TOKEN = 6
    USER = 7


class PatternType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12
    CREATE_TOKENS = 13
    DESCRIBE_TOKENS = 14


class AclPermissionType(enum.IntEnum):
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


class AclError(ValueError):
    """An ACL or filter that may not be written or used; the message is one line."""


def parse_enum(kind: type[E], text: str) -> E:
    """``read``, ``Read``, ``CLUSTER_ACTION``, ``ClusterAction`` or ``cluster-action`` → the member."""
    key = text.strip().replace("-", "_")
    if key and not key.isupper() and "_" not in key:
        # CamelCase as kafka-acls.sh prints it: ClusterAction → CLUSTER_ACTION.
        key = "".join("_" + c if c.isupper() and i else c for i, c in enumerate(key))
    try:
        return kind[key.upper()]
    except KeyError:
        names = ", ".join(m.name for m in kind if m.name not in ("UNKNOWN", "ANY", "MATCH"))
        raise AclError(f"unknown {kind.__name__} {text!r} (one of {names})") from None


@dataclass(frozen=True, slots=True)
class StandardAcl:
    """One ACL binding, as ``AccessControlEntryRecord`` holds it (its id is the key it is stored under)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermissionType

    def __str__(self) -> str:
        return (
            f"{self.permission.name} {self.principal} {self.operation.name} from {self.host} on "
            f"{self.resource_type.name}:{self.pattern_type.name}:{self.resource_name}"
        )


def validate_acl(acl: StandardAcl) -> None:
    """Raise :class:`AclError` unless ``acl`` may be stored (Kafka's ``AclControlManager.validateNewAcl``
    plus kraft's size limits)."""
    if acl.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
        raise AclError(f"resource type {acl.resource_type.name} is not a resource")
    if acl.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
        raise AclError(f"pattern type must be LITERAL or PREFIXED, not {acl.pattern_type.name}")
    if acl.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
        raise AclError(f"operation {acl.operation.name} is not an operation")
    if acl.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
        raise AclError(f"permission must be ALLOW or DENY, not {acl.permission.name}")
    if not acl.resource_name:
        raise AclError("resource name must not be empty")
    if len(acl.resource_name) > MAX_RESOURCE_NAME_CHARS:
        raise AclError(f"resource name is longer than {MAX_RESOURCE_NAME_CHARS} characters")
    if acl.resource_type is ResourceType.CLUSTER and (
        acl.resource_name != CLUSTER_RESOURCE_NAME or acl.pattern_type is not PatternType.LITERAL
    ):
        raise AclError(f"the CLUSTER resource is the LITERAL name {CLUSTER_RESOURCE_NAME!r}")
    if acl.pattern_type is PatternType.PREFIXED and acl.resource_name == WILDCARD:
        raise AclError("a PREFIXED pattern must not be '*' (use LITERAL '*' for every resource)")
    if len(acl.principal) > MAX_PRINCIPAL_CHARS:
        raise AclError(f"principal is longer than {MAX_PRINCIPAL_CHARS} characters")
    try:
        Principal.parse(acl.principal)
    except ValueError as exc:
        raise AclError(str(exc)) from None
    if not acl.host:
        raise AclError("host must not be empty (use '*' for every host)")
    if len(acl.host) > MAX_HOST_CHARS or any(c.isspace() for c in acl.host):
        raise AclError(f"host must be '*' or an address of at most {MAX_HOST_CHARS} characters")


@dataclass(frozen=True, slots=True)
class AclFilter:
    """Kafka's ``AclBindingFilter``: ANY / None match everything; pattern MATCH matches every pattern that
    applies to ``resource_name`` (the literal name, LITERAL ``*``, and PREFIXED prefixes of it)."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def validate(self) -> None:
        """Raise :class:`AclError` for a filter with an UNKNOWN field (Kafka refuses those too)."""
        for value in (self.resource_type, self.pattern_type, self.operation, self.permission):
            if value.name == "UNKNOWN":
                raise AclError(f"filter has an unknown {type(value).__name__}")
        if self.pattern_type is PatternType.MATCH and self.resource_name is None:
            raise AclError("pattern type MATCH needs a resource name")

    def matches(self, acl: StandardAcl) -> bool:
        if self.resource_type is not ResourceType.ANY and acl.resource_type is not self.resource_type:
            return False
        if not self._matches_pattern(acl):
            return False
        if self.principal is not None and acl.principal != self.principal:
            return False
        if self.host is not None and acl.host != self.host:
            return False
        if self.operation is not AclOperation.ANY and acl.operation is not self.operation:
            return False
        return self.permission is AclPermissionType.ANY or acl.permission is self.permission

    def _matches_pattern(self, acl: StandardAcl) -> bool:
        name = self.resource_name
        if self.pattern_type is PatternType.MATCH:
            assert name is not None  # validate() refuses MATCH without a name
            if acl.pattern_type is PatternType.LITERAL:
                return acl.resource_name in (name, WILDCARD)
            return name.startswith(acl.resource_name)
        if self.pattern_type is not PatternType.ANY and acl.pattern_type is not self.pattern_type:
            return False
        return name is None or acl.resource_name == name
