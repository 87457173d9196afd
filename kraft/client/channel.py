"""The one place kraft opens gRPC channels to its own services (controllers, brokers, Raft peers).

Every client — brokers, the CLI, the chaos harness, benchmarks, tests and the Raft transport — opens its
channels here, so transport security is decided in one place.  A channel is PLAINTEXT or SSL by its
:class:`ChannelSecurity`: passed explicitly (a node passes the security of the listener it dials, see
:mod:`kraft.security.tls`), or the process default set once with :func:`set_default_security` (the CLI does
that from ``--command-config``).

SSL channels verify the server's certificate against the truststore (or the system roots when none is
given) *and its host name*: kraft dials ``127.0.0.1:port``/``host:port`` as configured, so node
certificates carry those names as subject alternative names (``kraft cluster up --tls`` issues them for
``127.0.0.1`` and ``localhost``); no ``grpc.ssl_target_name_override`` is used.  The client certificate
(mutual TLS) comes from the keystore.  PEM files are re-read when they change (checked with one
``os.stat`` each when a channel opens), so a rotated client certificate is used by the next channel.

This module imports nothing else of kraft, so any layer may use it.
"""

from __future__ import annotations

import os
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import grpc.aio

ChannelOptions = Sequence[tuple[str, Any]]
"""gRPC channel arguments, e.g. ``[("grpc.max_receive_message_length", n)]``."""

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SECURITY_PROTOCOLS = (PLAINTEXT, SSL)

_PEM_BLOCK = re.compile(rb"-----BEGIN ([A-Z0-9 ]+)-----\r?\n.*?-----END \1-----\r?\n?", re.DOTALL)


class TlsMaterialError(Exception):
    """PEM material missing, unreadable or malformed; the message is one line naming the source."""


def pem_blocks(data: bytes, kind: str) -> list[bytes]:
    """The PEM blocks of ``data`` whose label ends in ``kind`` (``CERTIFICATE``, ``PRIVATE KEY``)."""
    return [
        block.group(0).rstrip(b"\r\n") + b"\n"
        for block in _PEM_BLOCK.finditer(data)
        if block.group(1).decode("ascii").endswith(kind)
    ]


class PemSource:
    """PEM text given inline (Kafka's ``ssl.keystore.key``/``ssl.truststore.certificates``) or a file
    (``ssl.*.location``); a file is re-read only when its ``stat`` changes, so :meth:`read` is cheap."""

    def __init__(self, *, path: Path | str | None = None, inline: str | bytes | None = None) -> None:
        if (path is None) == (inline is None):
            raise ValueError("a PEM source is a path or inline text, exactly one")
        self.path = Path(path) if path is not None else None
        self._data: bytes | None = inline.encode() if isinstance(inline, str) else inline
        self._stamp: tuple[int, ...] | None = None
        self._lock = threading.Lock()  # the server's certificate fetcher runs on gRPC's threads

    def __repr__(self) -> str:
        return f"PemSource({self.describe()})"

    def describe(self) -> str:
        return str(self.path) if self.path is not None else "inline PEM"

    def stamp(self) -> tuple[int, ...] | None:
        """What identifies the current content of the file (None for inline text or a missing file)."""
        if self.path is None:
            return None
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def read(self) -> bytes:
        """The current PEM bytes; raises :class:`TlsMaterialError` when the file cannot be read."""
        if self.path is None:
            assert self._data is not None
            return self._data
        with self._lock:
            stamp = self.stamp()
            if stamp is None or stamp != self._stamp or self._data is None:
                try:
                    data = self.path.read_bytes()
                except OSError as exc:
                    raise TlsMaterialError(f"cannot read {self.path}: {exc.strerror or exc}") from None
                self._data, self._stamp = data, stamp
            return self._data


@dataclass(frozen=True, slots=True)
class KeyStore:
    """A private key and its certificate chain (one PEM file holding both, or two sources)."""

    key: PemSource
    chain: PemSource

    @classmethod
    def from_file(cls, path: Path | str) -> KeyStore:
        source = PemSource(path=path)
        return cls(source, source)

    def read(self) -> tuple[bytes, bytes]:
        """(private key PEM, certificate chain PEM); raises :class:`TlsMaterialError` when either lacks."""
        keys = pem_blocks(self.key.read(), "PRIVATE KEY")
        if not keys:
            raise TlsMaterialError(f"no PEM private key in {self.key.describe()}")
        if any(b"ENCRYPTED" in key.split(b"\n", 1)[0] for key in keys):
            raise TlsMaterialError(f"the private key in {self.key.describe()} is encrypted (not supported)")
        chain = pem_blocks(self.chain.read(), "CERTIFICATE")
        if not chain:
            raise TlsMaterialError(f"no PEM certificate in {self.chain.describe()}")
        return keys[0], b"".join(chain)

    def stamp(self) -> tuple[object, ...]:
        return (self.key.stamp(), self.chain.stamp())


@dataclass(frozen=True, slots=True)
class TrustStore:
    """The CA certificates a peer's certificate must chain to."""

    certificates: PemSource

    def read(self) -> bytes:
        certs = pem_blocks(self.certificates.read(), "CERTIFICATE")
        if not certs:
            raise TlsMaterialError(f"no PEM certificate in {self.certificates.describe()}")
        return b"".join(certs)

    def stamp(self) -> tuple[object, ...]:
        return (self.certificates.stamp(),)


@dataclass(frozen=True, slots=True)
class ChannelSecurity:
    """How a client connects: PLAINTEXT, or SSL with a truststore (None: the system's roots) and an
    optional keystore for mutual TLS."""

    protocol: str = PLAINTEXT
    truststore: TrustStore | None = None
    keystore: KeyStore | None = None

    @property
    def is_ssl(self) -> bool:
        return self.protocol == SSL

    def credentials(self) -> grpc.ChannelCredentials:
        """``grpc.ssl_channel_credentials`` from the current PEM files."""
        roots = self.truststore.read() if self.truststore is not None else None
        key, chain = self.keystore.read() if self.keystore is not None else (None, None)
        return grpc.ssl_channel_credentials(roots, key, chain)


PLAINTEXT_SECURITY = ChannelSecurity()

_default_security = PLAINTEXT_SECURITY


def set_default_security(security: ChannelSecurity) -> None:
    """The security of channels opened without an explicit one (the CLI's ``--command-config``)."""
    global _default_security
    _default_security = security


def default_security() -> ChannelSecurity:
    return _default_security


def open_channel(
    target: str, options: ChannelOptions = (), security: ChannelSecurity | None = None
) -> grpc.aio.Channel:
    """An asyncio channel to ``target`` (``host:port``); close it with ``await channel.close()``."""
    sec = security if security is not None else _default_security
    if sec.is_ssl:
        return grpc.aio.secure_channel(target, sec.credentials(), options=list(options))
    return grpc.aio.insecure_channel(target, options=list(options))


def open_blocking_channel(
    target: str, options: ChannelOptions = (), security: ChannelSecurity | None = None
) -> grpc.Channel:
    """A blocking channel to ``target`` for callers without an event loop (CLI probes, harnesses)."""
    sec = security if security is not None else _default_security
    if sec.is_ssl:
        return grpc.secure_channel(target, sec.credentials(), options=list(options))
    return grpc.insecure_channel(target, options=list(options))
