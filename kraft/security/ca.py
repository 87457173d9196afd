"""A local certificate authority for development clusters and tests (``kraft cluster up --tls``).

:func:`create_ca` makes a self-signed CA; :meth:`LocalCa.issue` a leaf certificate for a node or a client
(``CN=controller-1``, ``CN=broker-101``, ``CN=admin``) valid for server and client authentication, with
``127.0.0.1`` and ``localhost`` as subject alternative names so that clients verify host names without
``grpc.ssl_target_name_override``.  Keys are ECDSA P-256.  Files are PEM: ``<name>.pem`` holds the
private key and the certificate chain (what ``ssl.keystore.location`` names), ``ca.pem`` the CA
certificate (``ssl.truststore.location``); key files are written with mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

ORGANIZATION = "kraft"
DEFAULT_VALIDITY = datetime.timedelta(days=825)
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


def _name(common_name: str) -> x509.Name:
    # Encoded O then CN, so the RFC 2253 form (what principals are) reads "CN=<name>,O=kraft".
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


@dataclass(frozen=True, slots=True)
class Issued:
    """A private key and its certificate chain (leaf, then the CA), PEM."""

    key_pem: bytes
    cert_pem: bytes
    chain_pem: bytes

    @property
    def keystore_pem(self) -> bytes:
        """What ``ssl.keystore.location`` reads: the key, then the chain."""
        return self.key_pem + self.chain_pem


@dataclass(frozen=True, slots=True)
class LocalCa:
    key: ec.EllipticCurvePrivateKey
    certificate: x509.Certificate

    @property
    def cert_pem(self) -> bytes:
        return self.certificate.public_bytes(serialization.Encoding.PEM)

    def issue(
        self,
        common_name: str,
        *,
        hosts: tuple[str, ...] = DEFAULT_HOSTS,
        validity: datetime.timedelta = DEFAULT_VALIDITY,
    ) -> Issued:
        """A certificate ``CN=<common_name>,O=kraft`` for server and client auth on ``hosts``."""
        key = ec.generate_private_key(ec.SECP256R1())
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(_name(common_name))
            .issuer_name(self.certificate.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + validity)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
        )
        if hosts:
            builder = builder.add_extension(_san(hosts), critical=False)
        cert = builder.sign(self.key, hashes.SHA256())
        cert_pem = cert.public_bytes(serialization.Encoding.PEM)
        return Issued(_key_pem(key), cert_pem, cert_pem + self.cert_pem)


def create_ca(
    common_name: str = "kraft-local-ca", validity: datetime.timedelta = DEFAULT_VALIDITY
) -> LocalCa:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    name = _name(common_name)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + validity)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    return LocalCa(key, cert)


def write_private(path: Path, data: bytes) -> None:
    """Write ``data`` readable by the owner only, atomically (rename): a reader sees old or new."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where :func:`write_cluster_tls` put things."""

    directory: Path
    truststore: Path

    def keystore(self, name: str) -> Path:
        return self.directory / f"{name}.pem"


def write_cluster_tls(directory: Path, names: list[str], *, ca: LocalCa | None = None) -> TlsFiles:
    """A CA (``ca.pem``, ``ca-key.pem``) and one keystore ``<name>.pem`` per name in ``directory``."""
    ca = ca or create_ca()
    directory.mkdir(parents=True, exist_ok=True)
    truststore = directory / "ca.pem"
    truststore.write_bytes(ca.cert_pem)
    write_private(
        directory / "ca-key.pem",
        ca.key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    files = TlsFiles(directory, truststore)
    for name in names:
        write_private(files.keystore(name), ca.issue(name).keystore_pem)
    return files


def load_ca(directory: Path) -> LocalCa:
    """The CA :func:`write_cluster_tls` wrote (to issue more certificates, e.g. for a rotation)."""
    key = serialization.load_pem_private_key((directory / "ca-key.pem").read_bytes(), password=None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca-key.pem'} is not an EC key")
    cert = x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())
    return LocalCa(key, cert)
