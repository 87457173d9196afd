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

import base64
import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
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


# --- the caller's transport identity, as an intake process forwards it (kraft/node/intake_process.py) ---
#
# An intake process terminates the caller's connection (TLS included) and forwards the call to its node
# over the node's unix socket, so the call the node sees has the intake process's transport.  The intake
# process therefore sends the caller's auth context and address as metadata, and the node believes them
# ONLY on a call whose own transport is the unix socket (``peer()`` ``unix:…``: reachable only by this
# user, 0600 in a 0700 directory, and a network caller cannot make its peer look like that).  On the
# network port the same keys are ignored (and an intake process drops them from what callers send).

INTAKE_METADATA_PREFIX = "x-kraft-intake-"
INTAKE_PEER_KEY = "x-kraft-intake-peer"
INTAKE_AUTH_KEY = "x-kraft-intake-auth-bin"
_LOCAL_PEER_PREFIX = "unix:"
# Not forwarded: nothing here reads it, and it would add ~1 KB to every forwarded call.
_NOT_FORWARDED = frozenset({"x509_pem_cert", "x509_pem_cert_chain"})
_intake_forwarding: dict[str, list[bytes]] | None = None
"""None: nothing is trusted (no intake processes).  Else the auth context of a unix-socket call that
carries none: TLS without a certificate on a TLS node (refused wherever an identity is needed — never
more than the caller could have had on the network port), plaintext on a PLAINTEXT node."""


def trust_intake_forwarding(tls: bool) -> None:
    """Believe the forwarded identity on unix-socket calls (a node with intake processes, at start)."""
    global _intake_forwarding
    _intake_forwarding = {"transport_security_type": [b"ssl"]} if tls else {}


def stop_trusting_intake_forwarding() -> None:
    global _intake_forwarding
    _intake_forwarding = None


def encode_auth(auth: Mapping[str, Iterable[bytes]]) -> bytes:
    """An auth context (``context.auth_context()``) as one binary metadata value."""
    return json.dumps(
        {
            key: [base64.b64encode(value).decode("ascii") for value in values]
            for key, values in auth.items()
            if key not in _NOT_FORWARDED
        },
        separators=(",", ":"),
    ).encode()


def decode_auth(data: bytes) -> dict[str, list[bytes]]:
    decoded = json.loads(data)
    if not isinstance(decoded, dict):
        raise ValueError("forwarded auth context is not an object")
    return {str(key): [base64.b64decode(value) for value in values] for key, values in decoded.items()}


def _forwarded(context: Any) -> tuple[dict[str, list[bytes]], str] | None:
    """(auth context, peer) an intake process forwarded with this call, if it is to be believed."""
    default = _intake_forwarding
    if default is None:
        return None
    peer = context.peer()
    if not isinstance(peer, str) or not peer.startswith(_LOCAL_PEER_PREFIX):
        return None
    auth: dict[str, list[bytes]] = default
    forwarded_peer = ""
    for key, value in context.invocation_metadata() or ():
        if key == INTAKE_AUTH_KEY:
            try:
                auth = decode_auth(value)
            except (ValueError, TypeError):  # garbled: no identity rather than a guessed one
                auth = default
        elif key == INTAKE_PEER_KEY:
            forwarded_peer = value if isinstance(value, str) else ""
    return auth, forwarded_peer


def auth_context_of(context: Any) -> Mapping[str, Sequence[bytes]]:
    """The caller's auth context: the call's own, or the one its intake process forwarded."""
    forwarded = _forwarded(context)
    if forwarded is not None:
        return forwarded[0]
    auth: Mapping[str, Sequence[bytes]] = context.auth_context()
    return auth


def peer_of(context: Any) -> str:
    """The caller's address as gRPC prints it (``ipv4:10.0.0.5:4711``): the call's own, or the one its
    intake process forwarded; empty when unknown."""
    forwarded = _forwarded(context)
    if forwarded is not None:
        return forwarded[1]
    peer = getattr(context, "peer", None)
    text = peer() if callable(peer) else ""
    return text if isinstance(text, str) else ""


class TlsPrincipalExtractor:
    """The principal of a call from its TLS auth context: the client certificate's subject (as gRPC
    prints it, RFC 2253 — ``CN=broker-1,O=kraft`` — the form Kafka's rules are written against) mapped by
    ``ssl.principal.mapping.rules``.  ``User:ANONYMOUS`` on a PLAINTEXT connection, without a client
    certificate, or when no rule applies.  Mapped names are cached per subject (bounded)."""

    def __init__(self, mapper: SslPrincipalMapper | None = None) -> None:
        self.mapper = mapper or SslPrincipalMapper()
        self._cache: dict[bytes, Principal] = {}

    def __call__(self, context: Any) -> Principal:
        auth = auth_context_of(context)
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
    return bool(list(auth_context_of(context).get("transport_security_type") or ()) == [b"ssl"])


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
