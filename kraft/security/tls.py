"""TLS for kraft's listeners and clients, from Kafka's configuration names.

Node configuration (:class:`kraft.config.NodeConfig`):

* ``listener.security.protocol.map`` — ``NAME:PROTOCOL`` pairs (``CONTROLLER:SSL,BROKER:SSL``); a name it
  does not list is PLAINTEXT (a listener named ``SSL`` is SSL).  PLAINTEXT and SSL are supported.
* ``ssl.keystore.type=PEM`` with ``ssl.keystore.location`` (one PEM file: private key and certificate
  chain) or ``ssl.keystore.key`` + ``ssl.keystore.certificate.chain`` (the PEM text itself, as in Kafka);
* ``ssl.truststore.type=PEM`` with ``ssl.truststore.location`` (a PEM file of CA certificates) or
  ``ssl.truststore.certificates`` (the PEM text);
* ``ssl.client.auth=required|none`` (``requested`` is refused: grpcio can only require a client
  certificate or not ask for one);
* ``ssl.principal.mapping.rules`` (:mod:`kraft.security.mapping`).

The same ``ssl.*`` keys serve every SSL listener of a node and its outbound connections (the node's
certificate is its client certificate when it dials a controller or another broker).  A client's
``--command-config`` file uses ``security.protocol`` and the same ``ssl.*`` keys (:func:`client_security`; the
file as a whole, timeouts included, is read by :mod:`kraft.client.properties`).

Server certificates are reloaded without a restart: :func:`server_credentials` builds
``grpc.dynamic_ssl_server_credentials`` whose fetcher (:class:`CertificateReloader`, called by gRPC at
each new handshake) re-reads the keystore and truststore files when their ``stat`` changes, checks that
the key matches the certificate and that the files parse, and only then hands gRPC the new configuration;
connections already open keep the certificate they negotiated.
"""

from __future__ import annotations

import os
import ssl
import tempfile
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import grpc
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from kraft.client.channel import (
    PLAINTEXT,
    PLAINTEXT_SECURITY,
    SSL,
    ChannelSecurity,
    KeyStore,
    PemSource,
    TlsMaterialError,
    TrustStore,
    pem_blocks,
)
from kraft.config import ConfigError, NodeConfig
from kraft.observability.logging import get_logger
from kraft.security.mapping import SslPrincipalMapper

CLIENT_AUTH_REQUIRED = "required"
CLIENT_AUTH_NONE = "none"

_log = get_logger("tls")


class TlsError(Exception):
    """TLS material that cannot be used; the message is one line naming the file and the problem."""


@dataclass(frozen=True, slots=True)
class SslSettings:
    """A node's (or client's) TLS material and policy."""

    keystore: KeyStore | None
    truststore: TrustStore | None
    client_auth: str = CLIENT_AUTH_NONE
    mapping_rules: str = "DEFAULT"

    @property
    def require_client_auth(self) -> bool:
        return self.client_auth == CLIENT_AUTH_REQUIRED

    def mapper(self) -> SslPrincipalMapper:
        return SslPrincipalMapper(self.mapping_rules)

    def channel_security(self) -> ChannelSecurity:
        return ChannelSecurity(SSL, self.truststore, self.keystore)

    def load(self) -> LoadedMaterial:
        """Read and check everything now; raises :class:`TlsError` with one line."""
        return load_material(self.keystore, self.truststore)


@dataclass(frozen=True, slots=True)
class LoadedMaterial:
    key: bytes | None
    chain: bytes | None
    roots: bytes | None
    subject: str
    """The keystore certificate's subject (RFC 4514), for logs."""


def _check_pair(key_pem: bytes, chain_pem: bytes, keystore: KeyStore) -> str:
    """The leaf certificate's subject after checking that the key belongs to it."""
    try:
        leaf = x509.load_pem_x509_certificate(pem_blocks(chain_pem, "CERTIFICATE")[0])
        key = serialization.load_pem_private_key(key_pem, password=None)
    except (ValueError, TypeError) as exc:
        raise TlsError(f"keystore {keystore.chain.describe()}: cannot parse: {exc}") from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    if key.public_key().public_bytes(serialization.Encoding.DER, public) != leaf.public_key().public_bytes(
        serialization.Encoding.DER, public
    ):
        raise TlsError(
            f"keystore {keystore.key.describe()}: the private key does not belong to the certificate "
            f"{leaf.subject.rfc4514_string()}"
        )
    return leaf.subject.rfc4514_string()


def _check_roots(roots: bytes, truststore: TrustStore) -> None:
    try:
        x509.load_pem_x509_certificates(roots)
    except ValueError as exc:
        raise TlsError(f"truststore {truststore.certificates.describe()}: cannot parse: {exc}") from None


def load_material(keystore: KeyStore | None, truststore: TrustStore | None) -> LoadedMaterial:
    try:
        key, chain = keystore.read() if keystore is not None else (None, None)
        roots = truststore.read() if truststore is not None else None
    except TlsMaterialError as exc:
        raise TlsError(str(exc)) from None
    subject = ""
    if keystore is not None and key is not None and chain is not None:
        subject = _check_pair(key, chain, keystore)
    if truststore is not None and roots is not None:
        _check_roots(roots, truststore)
    return LoadedMaterial(key, chain, roots, subject)


# ------------------------------------------------------------------------------------------- server side


class CertificateReloader:
    """gRPC's certificate-config fetcher: a new configuration when the files changed (and are valid).

    Called by gRPC on its own threads at every new TLS handshake, so the unchanged case is a few
    ``os.stat`` calls.  A change that does not load (half-written files, a key that does not match its
    certificate) is logged and ignored — the previous certificate keeps serving — and retried at the
    next handshake after the files change again."""

    def __init__(self, settings: SslSettings, material: LoadedMaterial, listener: str) -> None:
        assert settings.keystore is not None
        self._settings = settings
        self._listener = listener
        self._lock = threading.Lock()
        self._stamp = self._current_stamp()
        self.reloads = 0
        self.failures = 0
        self.subject = material.subject
        self.initial = _server_config(material)

    def _current_stamp(self) -> tuple[object, ...]:
        keystore = self._settings.keystore
        truststore = self._settings.truststore
        return (
            keystore.stamp() if keystore is not None else None,
            truststore.stamp() if truststore is not None else None,
        )

    def __call__(self) -> grpc.ServerCertificateConfiguration | None:
        stamp = self._current_stamp()
        if stamp == self._stamp:
            return None
        with self._lock:
            if stamp == self._stamp:
                return None
            self._stamp = stamp
            try:
                material = self._settings.load()
            except TlsError as exc:
                self.failures += 1
                _log.warning("tls_reload_failed", listener=self._listener, error=str(exc))
                return None
            self.reloads += 1
            self.subject = material.subject
            _log.info("tls_certificates_reloaded", listener=self._listener, subject=material.subject)
            return _server_config(material)


def _server_config(material: LoadedMaterial) -> grpc.ServerCertificateConfiguration:
    assert material.key is not None and material.chain is not None
    return grpc.ssl_server_certificate_configuration(
        [(material.key, material.chain)], root_certificates=material.roots
    )


def server_credentials(
    settings: SslSettings, listener: str
) -> tuple[grpc.ServerCredentials, CertificateReloader]:
    """Dynamic server credentials for one SSL listener (raises :class:`TlsError` on bad material)."""
    if settings.keystore is None:
        raise TlsError(f"listener {listener} is SSL but no keystore is configured")
    reloader = CertificateReloader(settings, settings.load(), listener)
    # grpc-stubs types the fetcher as never returning None; gRPC documents None as "no change".
    fetcher = cast(Callable[[], grpc.ServerCertificateConfiguration], reloader)
    credentials = grpc.dynamic_ssl_server_credentials(
        reloader.initial, fetcher, require_client_authentication=settings.require_client_auth
    )
    return credentials, reloader


def add_port(
    server: grpc.aio.Server, address: str, settings: SslSettings | None, listener: str
) -> tuple[int, CertificateReloader | None]:
    """Bind ``address`` PLAINTEXT (``settings`` None) or SSL; the bound port (0 when binding failed)."""
    if settings is None:
        return server.add_insecure_port(address), None
    credentials, reloader = server_credentials(settings, listener)
    return server.add_secure_port(address, credentials), reloader


class MetricsTlsContext:
    """The HTTPS context of the Prometheus endpoint, rebuilt when the keystore or truststore files
    change (the metrics server asks for it at each accepted connection): the node's keystore; client
    certificates verified against the truststore when ``ssl.client.auth=required``.  A change that does
    not load keeps the previous context (logged)."""

    def __init__(self, settings: SslSettings) -> None:
        self._settings = settings
        self._lock = threading.Lock()
        self._stamp = self._current_stamp()
        self._context = self._build(settings.load())

    def _current_stamp(self) -> tuple[object, ...]:
        keystore, truststore = self._settings.keystore, self._settings.truststore
        return (
            keystore.stamp() if keystore is not None else None,
            truststore.stamp() if truststore is not None else None,
        )

    def _build(self, material: LoadedMaterial) -> ssl.SSLContext:
        assert material.key is not None and material.chain is not None
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        # ssl loads a key only from a file: a private temporary one, removed at once.
        fd, name = tempfile.mkstemp(prefix="kraft-metrics-", suffix=".pem")
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(material.key + material.chain)
            context.load_cert_chain(name)
        finally:
            os.unlink(name)
        if material.roots is not None:
            context.load_verify_locations(cadata=material.roots.decode("ascii"))
        if self._settings.require_client_auth:
            context.verify_mode = ssl.CERT_REQUIRED
        return context

    def __call__(self) -> ssl.SSLContext:
        stamp = self._current_stamp()
        if stamp != self._stamp:
            with self._lock:
                if stamp != self._stamp:
                    self._stamp = stamp
                    try:
                        self._context = self._build(self._settings.load())
                    except (TlsError, ssl.SSLError, OSError) as exc:
                        _log.warning("tls_reload_failed", listener="metrics", error=str(exc))
        return self._context


# ------------------------------------------------------------------------------------------- from config


def _source(path: Path | None, inline: str | None) -> PemSource | None:
    if path is not None:
        return PemSource(path=path)
    if inline is not None:
        return PemSource(inline=inline)
    return None


def _keystore(location: Path | None, chain: str | None, key: str | None) -> KeyStore | None:
    if location is not None:
        return KeyStore.from_file(location)
    if chain is not None and key is not None:
        return KeyStore(PemSource(inline=key), PemSource(inline=chain))
    return None


def node_ssl_settings(config: NodeConfig) -> SslSettings | None:
    """The node's SSL settings, or None when no listener it serves or dials is SSL."""
    if not config.uses_ssl:
        return None
    truststore_source = _source(config.ssl_truststore_location, config.ssl_truststore_certificates)
    return SslSettings(
        keystore=_keystore(
            config.ssl_keystore_location, config.ssl_keystore_certificate_chain, config.ssl_keystore_key
        ),
        truststore=TrustStore(truststore_source) if truststore_source is not None else None,
        client_auth=config.ssl_client_auth,
        mapping_rules=config.ssl_principal_mapping_rules,
    )


def listener_settings(config: NodeConfig, name: str) -> SslSettings | None:
    """What :func:`add_port` needs for listener ``name``: its SSL settings, or None for PLAINTEXT."""
    if config.security_protocol(name) != SSL:
        return None
    return node_ssl_settings(config)


def outbound_security(config: NodeConfig, listener_name: str) -> ChannelSecurity:
    """How this node dials a listener named ``listener_name`` (on a controller or another broker)."""
    settings = listener_settings(config, listener_name)
    return PLAINTEXT_SECURITY if settings is None else settings.channel_security()


def check_node_tls(config: NodeConfig) -> SslSettings | None:
    """Load every file the node's TLS needs, once, at startup: raises :class:`TlsError` (one line)."""
    settings = node_ssl_settings(config)
    if settings is not None:
        settings.load()
    return settings


# ------------------------------------------------------------------------------------------- client side

CLIENT_KEYS = frozenset(
    {
        "security.protocol",
        "ssl.keystore.type",
        "ssl.keystore.location",
        "ssl.keystore.certificate.chain",
        "ssl.keystore.key",
        "ssl.truststore.type",
        "ssl.truststore.location",
        "ssl.truststore.certificates",
    }
)


def client_security(properties: Mapping[str, str], *, origin: str = "client config") -> ChannelSecurity:
    """The channel keys of a client properties file (Kafka's admin client keys) → how to open channels;
    raises :class:`ConfigError` (one line) on an unknown key, a bad value or unreadable material.  A whole
    file (timeouts too) goes through :func:`kraft.client.properties.parse_client_config`, which calls this."""
    for name in properties:
        if name not in CLIENT_KEYS:
            raise ConfigError.for_key(
                name, properties[name], f"unknown key in {origin} (known: {', '.join(sorted(CLIENT_KEYS))})"
            )
    protocol = properties.get("security.protocol", PLAINTEXT).strip().upper()
    if protocol not in (PLAINTEXT, SSL):
        raise ConfigError.for_key("security.protocol", protocol, "must be PLAINTEXT or SSL")
    for type_key in ("ssl.keystore.type", "ssl.truststore.type"):
        if properties.get(type_key, "PEM").strip().upper() != "PEM":
            raise ConfigError.for_key(type_key, properties[type_key], "only PEM is supported")
    if protocol == PLAINTEXT:
        return PLAINTEXT_SECURITY

    def opt(key: str) -> str | None:
        value = properties.get(key, "").strip()
        return value or None

    location = opt("ssl.keystore.location")
    chain, key = opt("ssl.keystore.certificate.chain"), opt("ssl.keystore.key")
    check_keystore_keys(location, chain, key)
    check_truststore_keys(opt("ssl.truststore.location"), opt("ssl.truststore.certificates"))
    trust_location = opt("ssl.truststore.location")
    trust = _source(Path(trust_location) if trust_location else None, opt("ssl.truststore.certificates"))
    settings = SslSettings(
        keystore=_keystore(Path(location) if location else None, chain, key),
        truststore=TrustStore(trust) if trust is not None else None,
    )
    try:
        settings.load()
    except TlsError as exc:
        raise ConfigError(f"{origin}: {exc}") from None
    return settings.channel_security()


def check_keystore_keys(location: Any, chain: Any, key: Any) -> None:
    """Kafka's rule: a keystore file, or both inline PEM values, never both."""
    if location is not None and (chain is not None or key is not None):
        raise ConfigError.for_key(
            "ssl.keystore.location",
            str(location),
            "give ssl.keystore.location or ssl.keystore.certificate.chain with ssl.keystore.key, not both",
        )
    if (chain is None) != (key is None):
        missing = "ssl.keystore.key" if key is None else "ssl.keystore.certificate.chain"
        raise ConfigError(
            f"missing config key {missing}: the inline PEM keystore needs both the key and the chain",
            key=missing,
        )
    for name, value in (("ssl.keystore.certificate.chain", chain), ("ssl.keystore.key", key)):
        if value is not None and "-----BEGIN" not in str(value):
            raise ConfigError.for_key(
                name, "…", "holds the PEM text itself (Kafka's meaning); for a file use ssl.keystore.location"
            )


def check_truststore_keys(location: Any, certificates: Any) -> None:
    if location is not None and certificates is not None:
        raise ConfigError.for_key(
            "ssl.truststore.location",
            str(location),
            "give ssl.truststore.location or ssl.truststore.certificates, not both",
        )
    if certificates is not None and "-----BEGIN" not in str(certificates):
        raise ConfigError.for_key(
            "ssl.truststore.certificates",
            "…",
            "holds the PEM text itself (Kafka's meaning); for a file use ssl.truststore.location",
        )
