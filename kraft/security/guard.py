"""Enforcement at the gRPC edge: who is calling (:func:`principal_of`), may it do this, is it who it says.

Every ControllerService and BrokerService handler asks a :class:`RequestGuard` before doing anything.  Two
independent checks:

* **identity binding** — whenever the caller is a node principal (``broker-<id>`` / ``controller-<id>``,
  :func:`node_identity`), a request that names a node (RegisterBroker, BrokerHeartbeat, MetadataFetch,
  AlterPartition, ReplicaFetch) must name the caller's own id, authorizer or not.  With an authorizer
  configured these requests *need* a node principal (or a super user): nobody else may speak for a node;
* **ACLs** — with an authorizer configured (``authorizer.class.name``), the action the RPC maps to
  (Kafka's mapping, docs/security.md) must be allowed by :class:`~kraft.security.authorizer.Authorizer`.
  Without one everything is allowed (PLAINTEXT development mode).

A refusal is :class:`AccessDenied` carrying TOPIC_AUTHORIZATION_FAILED or CLUSTER_AUTHORIZATION_FAILED;
the servicer aborts the call with gRPC PERMISSION_DENIED and a message that starts with that name.
Refusals are logged as ``event=authorization_denied`` (rate-limited per principal and action).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from kraft.clock import Clock, SystemClock
from kraft.errors import ErrorCode, KraftError
from kraft.observability.logging import get_logger
from kraft.security.acl import AclOperation, ResourceType
from kraft.security.authorizer import Action, Authorizer, cluster_action
from kraft.security.principal import Principal, node_identity, peer_of, principal_of

_log = get_logger("authorizer")
DENIAL_LOG_INTERVAL_MS = 10_000


class AccessDenied(KraftError):
    """The caller may not do this; ``str()`` is ``CODE: message``, the gRPC status details."""


def peer_host(context: Any) -> str:
    """The caller's address as ACL hosts name it: ``ipv4:10.0.0.5:4711`` → ``10.0.0.5``, ``ipv6:[::1]:1`` →
    ``::1``; empty when the transport does not say (only ACLs with host ``*`` match then)."""
    text = peer_of(context)
    kind, _, address = text.partition(":")
    if kind == "ipv4":
        return address.rpartition(":")[0]
    if kind == "ipv6":
        host = address.rpartition(":")[0]
        return host[1:-1] if host.startswith("[") and host.endswith("]") else host
    return ""


class RequestGuard:
    """The checks of one process (one security config); ``authorizer`` None = no authorizer configured."""

    def __init__(self, authorizer: Authorizer | None = None, *, clock: Clock | None = None) -> None:
        self.authorizer = authorizer
        self._clock = clock or SystemClock()
        self._logged: dict[tuple[str, str], int] = {}

    @property
    def enabled(self) -> bool:
        return self.authorizer is not None

    # ---- checks (each raises AccessDenied) ----

    def check_cluster(self, context: Any, operation: AclOperation) -> None:
        """CLUSTER ``operation`` (ElectLeaders: ALTER, DescribeCluster: DESCRIBE, CreateAcls: ALTER, …)."""
        if self.authorizer is not None:
            self._check(context, principal_of(context), cluster_action(operation))

    def check_topic(
        self, context: Any, operation: AclOperation, topic: str, *, or_cluster: bool = False
    ) -> None:
        """TOPIC ``operation`` on ``topic``; ``or_cluster``: the same operation on CLUSTER also grants it
        (Kafka's CreateTopics: CLUSTER CREATE or TOPIC CREATE)."""
        if self.authorizer is None:
            return
        principal = principal_of(context)
        if or_cluster and self._allowed(context, principal, cluster_action(operation)):
            return
        self._check(context, principal, Action(ResourceType.TOPIC, topic, operation))

    def check_topics(
        self, context: Any, operation: AclOperation, topics: Iterable[str], *, or_cluster: bool = False
    ) -> None:
        """:meth:`check_topic` for every topic (the first refusal raises); with ``or_cluster`` the CLUSTER
        grant is asked once, not per topic."""
        if self.authorizer is None:
            return
        principal = principal_of(context)
        if or_cluster and self._allowed(context, principal, cluster_action(operation)):
            return
        for topic in topics:
            self._check(context, principal, Action(ResourceType.TOPIC, topic, operation))

    def topic_filter(self, context: Any, operation: AclOperation) -> Callable[[str], bool]:
        """A predicate: may the caller ``operation`` this topic (listings leave the others out)."""
        authorizer = self.authorizer
        if authorizer is None:
            return lambda _topic: True
        principal = principal_of(context)
        host = peer_host(context)
        return lambda topic: (
            authorizer.authorize(principal, host, Action(ResourceType.TOPIC, topic, operation)).allowed
        )

    def check_node(self, context: Any, node_id: int, what: str) -> None:
        """A request naming node ``node_id`` (``what``: "register as broker", …): identity binding, then
        CLUSTER CLUSTER_ACTION when an authorizer is configured."""
        principal = principal_of(context)
        identity = node_identity(principal)
        if identity is not None:
            if identity.node_id != node_id:
                self._deny(
                    principal,
                    ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                    f"{principal} is {identity.role.value} {identity.node_id} and may not {what} {node_id}",
                    "identity",
                )
        elif self.authorizer is not None and not self.authorizer.is_super_user(principal):
            self._deny(
                principal,
                ErrorCode.CLUSTER_AUTHORIZATION_FAILED,
                f"{principal} is not a node principal (broker-<id> or controller-<id>) and may not {what} "
                f"{node_id}",
                "identity",
            )
        if self.authorizer is not None:
            self._check(context, principal, cluster_action(AclOperation.CLUSTER_ACTION))

    # ---- internals ----

    def _allowed(self, context: Any, principal: Principal, action: Action) -> bool:
        assert self.authorizer is not None
        return self.authorizer.authorize(principal, peer_host(context), action).allowed

    def _check(self, context: Any, principal: Principal, action: Action) -> None:
        assert self.authorizer is not None
        host = peer_host(context)
        decision = self.authorizer.authorize(principal, host, action)
        if decision.allowed:
            return
        code = (
            ErrorCode.TOPIC_AUTHORIZATION_FAILED
            if action.resource_type is ResourceType.TOPIC
            else ErrorCode.CLUSTER_AUTHORIZATION_FAILED
        )
        resource = (
            f"topic {action.resource_name!r}"
            if action.resource_type is ResourceType.TOPIC
            else action.resource_type.name.lower()
        )
        self._deny(
            principal,
            code,
            f"{principal} may not {action.operation.name} {resource} ({decision.rule})",
            f"{action.resource_type.name}:{action.operation.name}",
            host=host,
        )

    def _deny(self, principal: Principal, code: ErrorCode, message: str, kind: str, host: str = "") -> None:
        now = self._clock.monotonic_ms()
        key = (str(principal), kind)
        last = self._logged.get(key)
        if last is None or now - last >= DENIAL_LOG_INTERVAL_MS:
            if len(self._logged) >= 10_000:
                self._logged.clear()
            self._logged[key] = now
            _log.warning("authorization_denied", principal=str(principal), host=host, reason=message)
        raise AccessDenied(code, message)
