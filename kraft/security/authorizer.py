"""The standard authorizer: Kafka's ``StandardAuthorizer`` (KIP-801) over the ACLs of a metadata image.

A decision, in Kafka's order (``StandardAuthorizerData.authorize``):

1. a principal listed in ``super.users`` is allowed everything;
2. the ACLs that apply to the resource are those of its type whose pattern matches its name: LITERAL
   equal to it, LITERAL ``*``, or PREFIXED by a prefix of it;
3. among those, an ACL *matches* the request when its principal is the caller or ``User:*``, its host is
   the caller's address or ``*``, and its operation is the one asked, or ``ALL``, or — for ALLOW ACLs
   only — implies it (READ, WRITE, DELETE and ALTER imply DESCRIBE; ALTER_CONFIGS implies
   DESCRIBE_CONFIGS);
4. a matching DENY wins over any ALLOW; else a matching ALLOW allows;
5. nothing matched: denied when the resource has ACLs at all, else ``allow.everyone.if.no.acl.found``
   (default false: once an authorizer is configured, everything not granted is denied).

Pure and IO-free: the ACLs come from a callable (the committed image on a controller, the applied image
on a broker).  Decisions are cached per ACL set (images share the ACL mapping while it is unchanged, so the
cache survives every image that does not touch ACLs): a Produce costs one dict lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final, NamedTuple

from kraft.security.acl import (
    CLUSTER_RESOURCE_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
    StandardAcl,
)
from kraft.security.principal import Principal

STANDARD_AUTHORIZER: Final = "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
"""``authorizer.class.name`` values that turn the authorizer on: Kafka's class name, or ``kraft``."""
AUTHORIZER_NAMES: Final = frozenset({STANDARD_AUTHORIZER, "kraft"})

_IMPLIES_DESCRIBE: Final = frozenset(
    {AclOperation.DESCRIBE, AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE, AclOperation.ALTER}
)
_IMPLIES_DESCRIBE_CONFIGS: Final = frozenset({AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS})
DECISION_CACHE_MAX = 8192


def parse_super_users(text: str) -> frozenset[str]:
    """``User:admin;User:controller-1`` → the principals (Kafka separates ``super.users`` by ``;``)."""
    users: set[str] = set()
    for item in text.split(";"):
        name = item.strip()
        if name:
            users.add(str(Principal.parse(name)))  # raises ValueError with a one-line message
    return frozenset(users)


@dataclass(frozen=True, slots=True)
class AuthorizerSettings:
    """``authorizer.class.name`` (enabled), ``super.users``, ``allow.everyone.if.no.acl.found``."""

    enabled: bool = False
    super_users: frozenset[str] = field(default_factory=frozenset)
    allow_everyone_if_no_acl_found: bool = False


class Action(NamedTuple):
    resource_type: ResourceType
    resource_name: str
    operation: AclOperation


class Decision(NamedTuple):
    allowed: bool
    rule: str
    """Why: ``SuperUser``, ``MatchingAcl(<acl>)``, ``DefaultAllow`` or ``DefaultDeny`` (Kafka's words)."""


def cluster_action(operation: AclOperation) -> Action:
    return Action(ResourceType.CLUSTER, CLUSTER_RESOURCE_NAME, operation)


class _AclIndex:
    """The ACLs of one image by resource: literal names, and prefixes grouped by length."""

    __slots__ = ("literal", "prefix_lengths", "prefixed")

    def __init__(self, acls: Mapping[str, StandardAcl]) -> None:
        self.literal: dict[tuple[ResourceType, str], list[StandardAcl]] = {}
        self.prefixed: dict[tuple[ResourceType, str], list[StandardAcl]] = {}
        lengths: dict[ResourceType, set[int]] = {}
        for acl in acls.values():
            key = (acl.resource_type, acl.resource_name)
            if acl.pattern_type is PatternType.PREFIXED:
                self.prefixed.setdefault(key, []).append(acl)
                lengths.setdefault(acl.resource_type, set()).add(len(acl.resource_name))
            else:
                self.literal.setdefault(key, []).append(acl)
        self.prefix_lengths = {rtype: sorted(ns) for rtype, ns in lengths.items()}

    def applicable(self, resource_type: ResourceType, name: str) -> Iterator[StandardAcl]:
        """Every ACL whose resource pattern matches ``name`` (any principal, host, operation)."""
        yield from self.literal.get((resource_type, name), ())
        if name != WILDCARD:
            yield from self.literal.get((resource_type, WILDCARD), ())
        for length in self.prefix_lengths.get(resource_type, ()):
            if length > len(name):
                break
            yield from self.prefixed.get((resource_type, name[:length]), ())


def _operation_matches(acl: StandardAcl, operation: AclOperation) -> bool:
    if acl.operation is AclOperation.ALL or acl.operation is operation:
        return True
    if acl.permission is not AclPermissionType.ALLOW:
        return False  # a DENY READ does not deny DESCRIBE
    if operation is AclOperation.DESCRIBE:
        return acl.operation in _IMPLIES_DESCRIBE
    if operation is AclOperation.DESCRIBE_CONFIGS:
        return acl.operation in _IMPLIES_DESCRIBE_CONFIGS
    return False


_SUPER_USER = Decision(True, "SuperUser")
_DEFAULT_ALLOW = Decision(True, "DefaultAllow")
_DEFAULT_DENY = Decision(False, "DefaultDeny")


def decide(
    settings: AuthorizerSettings,
    index: _AclIndex,
    principal: str,
    host: str,
    action: Action,
) -> Decision:
    """The decision for one action (uncached; :class:`Authorizer` caches it)."""
    if principal in settings.super_users:
        return _SUPER_USER
    principals = (principal, WILDCARD_PRINCIPAL)
    has_resource_acls = False
    allow: StandardAcl | None = None
    for acl in index.applicable(action.resource_type, action.resource_name):
        has_resource_acls = True
        if acl.principal not in principals:
            continue
        if acl.host not in (WILDCARD, host):
            continue
        if not _operation_matches(acl, action.operation):
            continue
        if acl.permission is AclPermissionType.DENY:
            return Decision(False, f"MatchingAcl({acl})")
        allow = acl
    if allow is not None:
        return Decision(True, f"MatchingAcl({allow})")
    if not has_resource_acls and settings.allow_everyone_if_no_acl_found:
        return _DEFAULT_ALLOW
    return _DEFAULT_DENY


class Authorizer:
    """Decisions over the ACLs ``acls()`` returns now; see the module doc for the rules."""

    def __init__(self, settings: AuthorizerSettings, acls: Callable[[], Mapping[str, StandardAcl]]) -> None:
        self.settings = settings
        self._acls = acls
        self._indexed: Mapping[str, StandardAcl] | None = None
        self._index = _AclIndex({})
        self._cache: dict[tuple[str, str, Action], Decision] = {}

    def acls_in_force(self) -> object:
        """The ACLs decisions are taken over now (compare by identity: a change of ACLs is a new object;
        the heartbeat fast lane's grants are valid only under the ACLs they were decided under)."""
        return self._acls()

    def is_super_user(self, principal: Principal) -> bool:
        return str(principal) in self.settings.super_users

    def authorize(self, principal: Principal, host: str, action: Action) -> Decision:
        acls = self._acls()
        if acls is not self._indexed:
            self._index = _AclIndex(acls)
            self._indexed = acls
            self._cache.clear()
        name = str(principal)
        key = (name, host, action)
        decision = self._cache.get(key)
        if decision is None:
            if len(self._cache) >= DECISION_CACHE_MAX:
                self._cache.clear()
            decision = self._cache[key] = decide(self.settings, self._index, name, host, action)
        return decision
