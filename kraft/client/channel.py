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

gRPC fixes a channel's credentials when it is made (also for its reconnects), so long-lived channels
(the Raft transport's, a broker's to the controllers and to other brokers) come from a
:class:`ChannelPool`: at most once per ``check_interval_s`` it ``stat``s the keystore and truststore
files, and when they changed *and* their content hashes differently *and* the new material is usable
(a key that belongs to its certificate, certificates that parse), it retires every channel it holds —
closed after a grace period, so calls in flight finish — and the next call dials with the new files.

This module imports nothing else of kraft, so any layer may use it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

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

    def stamp(self) -> tuple[object, ...]:
        """The ``stat`` stamps of the keystore and truststore files: cheap, changes when they may have."""
        return (
            self.keystore.stamp() if self.keystore is not None else None,
            self.truststore.stamp() if self.truststore is not None else None,
        )

    def fingerprint(self) -> MaterialFingerprint:
        """Read and check the current material; raises :class:`TlsMaterialError` (one line) when it cannot
        be used — missing blocks, unparsable certificates, a key that is not the certificate's."""
        roots = self.truststore.read() if self.truststore is not None else b""
        key, chain = self.keystore.read() if self.keystore is not None else (b"", b"")
        # Imported here: only a rotation check needs it, and `kraft --help` must not pay for it.
        from cryptography import x509
        from cryptography.exceptions import UnsupportedAlgorithm
        from cryptography.hazmat.primitives import serialization

        subject = issuer = ""
        try:
            trusted = len(x509.load_pem_x509_certificates(roots)) if roots else 0
            if self.keystore is not None:
                leaf = x509.load_pem_x509_certificate(pem_blocks(chain, "CERTIFICATE")[0])
                private = serialization.load_pem_private_key(key, password=None)
                spki = serialization.PublicFormat.SubjectPublicKeyInfo
                der = serialization.Encoding.DER
                if private.public_key().public_bytes(der, spki) != leaf.public_key().public_bytes(der, spki):
                    raise TlsMaterialError(
                        f"the private key in {self.keystore.key.describe()} does not belong to the "
                        f"certificate {leaf.subject.rfc4514_string()}"
                    )
                subject, issuer = leaf.subject.rfc4514_string(), leaf.issuer.rfc4514_string()
        except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
            raise TlsMaterialError(f"cannot parse the TLS material: {exc}") from None
        digest = hashlib.sha256(b"\0".join((key, chain, roots))).hexdigest()
        return MaterialFingerprint(digest, subject, issuer, trusted)


@dataclass(frozen=True, slots=True)
class MaterialFingerprint:
    """What a channel's TLS material is: a hash of its bytes, and for logs its certificate's names."""

    digest: str
    subject: str
    issuer: str
    trusted: int
    """CA certificates in the truststore (a rotation to a new CA goes through 2)."""


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


# ------------------------------------------------------------------------------ long-lived channels

ROTATION_CHECK_INTERVAL_S = 1.0
"""How often a :class:`ChannelPool` looks at its TLS files: a few ``os.stat`` calls per second at most."""
RETIRED_CHANNEL_GRACE_S = 10.0
"""How long a channel replaced after a rotation lets its calls in flight finish before it is closed (a
Raft fetch long-poll, a replica fetch, a heartbeat all end well within it; a longer one is cancelled, and
its caller retries as after any transport error)."""


class PoolLog(Protocol):
    """The two log levels a pool uses (``kraft.observability.logging.StructLogger`` fits; this module
    imports nothing of kraft)."""

    def info(self, event: str, **fields: object) -> None: ...

    def warning(self, event: str, **fields: object) -> None: ...


class ChannelPool:
    """Asyncio channels by target that follow certificate rotation (see the module docstring).

    :meth:`get` is on hot paths (every Raft fetch), so between checks it costs one ``time.monotonic``
    call and one dictionary lookup.  A change is taken only when the files' bytes hash differently from
    the material the channels were opened with (a ``touch`` reopens nothing) and the new material loads;
    a change that does not load is logged (``tls_client_reload_failed``) and the open channels are kept,
    until the files change again.  Callers that cache stubs compare the channel :meth:`get` returns with
    the one their stub wraps."""

    def __init__(
        self,
        options: ChannelOptions = (),
        security: ChannelSecurity | None = None,
        *,
        check_interval_s: float = ROTATION_CHECK_INTERVAL_S,
        retire_grace_s: float = RETIRED_CHANNEL_GRACE_S,
        clock: Callable[[], float] = time.monotonic,
        log: PoolLog | None = None,
        name: str = "",
    ) -> None:
        """``security`` None: the process default (:func:`default_security`) at each use; ``clock``
        paces the checks (tests pass a manual one); ``name`` says in logs which pool it is."""
        self._options = list(options)
        self._security = security
        self._interval_s = check_interval_s
        self._grace_s = retire_grace_s
        self._clock = clock
        self._log = log
        self._name = name
        self._channels: dict[str, grpc.aio.Channel] = {}
        self._next_check = 0.0
        self._checked: tuple[ChannelSecurity, tuple[object, ...]] | None = None
        """The security and file stamps last looked at."""
        self._opened_with: MaterialFingerprint | None = None
        """The material the open channels use (taken when the first of them opened)."""
        self._retiring: set[asyncio.Task[None]] = set()
        self._retired: list[grpc.aio.Channel] = []
        self.rotations = 0
        """How many times the channels were replaced for new material."""
        self.failures = 0
        """Changes that did not load (kept the old channels)."""

    @property
    def security(self) -> ChannelSecurity:
        return self._security if self._security is not None else _default_security

    def get(self, target: str) -> grpc.aio.Channel:
        """The channel to ``target``, opened now if there is none (or the TLS material changed)."""
        if self._channels and self._clock() >= self._next_check:
            self._next_check = self._clock() + self._interval_s
            if self._material_changed():
                self._retire_all()
        channel = self._channels.get(target)
        if channel is None:
            security = self.security
            if not self._channels:
                self._baseline(security)
            channel = self._channels[target] = open_channel(target, self._options, security)
        return channel

    def _baseline(self, security: ChannelSecurity) -> None:
        self._next_check = self._clock() + self._interval_s
        self._checked = (security, security.stamp())
        if security.is_ssl:
            # Unusable material is the handshake's to report; the next change is compared to nothing.
            with contextlib.suppress(TlsMaterialError):
                self._opened_with = security.fingerprint()

    def _material_changed(self) -> bool:
        security = self.security
        checked = (security, security.stamp())
        if checked == self._checked:
            return False
        self._checked = checked
        if not security.is_ssl:  # the process default went from SSL to PLAINTEXT (or stayed so)
            was_ssl, self._opened_with = self._opened_with is not None, None
            return was_ssl
        try:
            fingerprint = security.fingerprint()
        except TlsMaterialError as exc:
            self.failures += 1
            if self._log is not None:
                self._log.warning("tls_client_reload_failed", pool=self._name, error=str(exc))
            return False
        if self._opened_with is not None and fingerprint.digest == self._opened_with.digest:
            return False
        self._opened_with = fingerprint
        self.rotations += 1
        if self._log is not None:
            self._log.info(
                "tls_client_channels_reopened",
                pool=self._name,
                channels=len(self._channels),
                subject=fingerprint.subject,
                issuer=fingerprint.issuer,
                trusted_cas=fingerprint.trusted,
            )
        return True

    def _retire_all(self) -> None:
        channels, self._channels = self._channels, {}
        self._retire(list(channels.values()))

    def _retire(self, channels: list[grpc.aio.Channel]) -> None:
        for channel in channels:
            self._retired.append(channel)
            try:
                task = asyncio.get_running_loop().create_task(self._close_later(channel))
            except RuntimeError:  # no running loop: closed by close()
                continue
            self._retiring.add(task)
            task.add_done_callback(self._retiring.discard)

    async def _close_later(self, channel: grpc.aio.Channel) -> None:
        await channel.close(self._grace_s)
        with contextlib.suppress(ValueError):
            self._retired.remove(channel)

    def discard(self, target: str) -> None:
        """Retire the channel to ``target`` (an address a peer moved away from), closed after the grace."""
        channel = self._channels.pop(target, None)
        if channel is not None:
            self._retire([channel])

    async def close(self) -> None:
        """Close every channel now, retired ones included (calls in flight are cancelled)."""
        channels, self._channels = self._channels, {}
        for task in list(self._retiring):
            task.cancel()
        for task in list(self._retiring):
            with contextlib.suppress(asyncio.CancelledError):
                await task
        retired, self._retired = self._retired, []
        for channel in [*channels.values(), *retired]:
            await channel.close(None)
