"""The authenticated principal behind a gRPC call, and the node identity a principal names.

Contract shared by the TLS transport and the authorizer (issue #15):

* :func:`principal_of` gives the caller's principal: ``User:ANONYMOUS`` on a PLAINTEXT listener or
  when no client certificate was presented; on an mTLS listener the certificate's subject mapped by
  ``ssl.principal.mapping.rules`` (Kafka's ``SslPrincipalMapper`` semantics, :mod:`kraft.security.mapping`)
  — read from the call's ``auth_context()`` (gRPC gives ``x509_subject``, ``x509_common_name``,
  ``x509_subject_alternative_name`` and ``x509_pem_cert`` after a verified handshake).  A node installs
  its rules once at start with :func:`install_principal_mapper`.
* :func:`node_identity` says which node a principal is, by kraft's naming convention for node
  certificates: a principal name ``controller-<id>`` or ``broker-<id>`` (or a distinguished name whose
  ``CN`` is one of those) is that node.  ``kraft cluster up --tls`` issues certificates that follow it.
  A controller may send Raft RPCs only as the voter its certificate names; a broker may register and
  heartbeat only as its own id.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from kraft.security.mapping import SslPrincipalMapper

PRINCIPAL_TYPE_USER = "User"


@dataclass(frozen=True, slots=True)
class Principal:
    """Kafka's ``KafkaPrincipal``: a type (always ``User`` here) and a name, written ``User:name``."""

    principal_type: str
    name: str

    def __str__(self) -> str:
        return f"{self.principal_type}:{self.name}"

    @classmethod
    def parse(cls, text: str) -> Principal:
        """``User:alice`` → Principal("User", "alice"); raises ValueError on anything else."""
        kind, sep, name = text.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"principal must be TYPE:NAME, e.g. User:alice (got {text!r})")
        return cls(kind, name)


ANONYMOUS = Principal(PRINCIPAL_TYPE_USER, "ANONYMOUS")


class NodeRole(Enum):
    CONTROLLER = "controller"
    BROKER = "broker"


@dataclass(frozen=True, slots=True)
class NodeIdentity:
    role: NodeRole
    node_id: int


_NODE_NAME = re.compile(r"^(controller|broker)-([0-9]{1,10})$")
_CN = re.compile(r"(?:^|,)\s*CN=([^,]+)")


def node_identity(principal: Principal) -> NodeIdentity | None:
    """The node a principal names (``controller-1``, ``broker-101``, or a DN with such a CN), else None."""
    if principal.principal_type != PRINCIPAL_TYPE_USER:
        return None
    name = principal.name
    match = _NODE_NAME.match(name)
    if match is None:
        cn = _CN.search(name)
        match = _NODE_NAME.match(cn.group(1).strip()) if cn else None
    if match is None:
        return None
    node_id = int(match.group(2))
    if node_id > 2**31 - 1:
        return None
    return NodeIdentity(NodeRole(match.group(1)), node_id)


PrincipalExtractor = Callable[[Any], Principal]
"""Maps a ``grpc.aio.ServicerContext`` to the caller's principal."""

_MAX_CACHED_SUBJECTS = 4096


class TlsPrincipalExtractor:
    """The principal of a call from its TLS auth context: the client certificate's subject (as gRPC
    prints it, RFC 2253 — ``CN=broker-1,O=kraft`` — the form Kafka's rules are written against) mapped by
    ``ssl.principal.mapping.rules``.  ``User:ANONYMOUS`` on a PLAINTEXT connection, without a client
    certificate, or when no rule applies.  Mapped names are cached per subject (bounded)."""

    def __init__(self, mapper: SslPrincipalMapper | None = None) -> None:
        self.mapper = mapper or SslPrincipalMapper()
        self._cache: dict[bytes, Principal] = {}

    def __call__(self, context: Any) -> Principal:
        auth = context.auth_context()
        subjects = auth.get("x509_subject")
        if not subjects or auth.get("transport_security_type") != [b"ssl"]:
            return ANONYMOUS
        subject = subjects[0]
        principal = self._cache.get(subject)
        if principal is None:
            name = self.mapper.name(subject.decode("utf-8", "replace"))
            principal = ANONYMOUS if not name else Principal(PRINCIPAL_TYPE_USER, name)
            if len(self._cache) >= _MAX_CACHED_SUBJECTS:
                self._cache.clear()
            self._cache[subject] = principal
        return principal


def is_tls(context: Any) -> bool:
    """Whether the call came over TLS (whatever the client presented)."""
    return bool(context.auth_context().get("transport_security_type") == [b"ssl"])


_extractor: PrincipalExtractor = TlsPrincipalExtractor()


def install_principal_mapper(mapper: SslPrincipalMapper) -> None:
    """Set by a node at start from its ``ssl.principal.mapping.rules`` (one process, one config)."""
    install_principal_extractor(TlsPrincipalExtractor(mapper))


def install_principal_extractor(extractor: PrincipalExtractor) -> None:
    """Replace how principals are found (tests; :func:`install_principal_mapper` for the TLS rules)."""
    global _extractor
    _extractor = extractor


def principal_of(context: Any) -> Principal:
    """The caller's principal (``User:ANONYMOUS`` when unauthenticated)."""
    return _extractor(context)
