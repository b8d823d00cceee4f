"""The sandbox's TLS: a local CA generated once in ``CT_HOME``, and a server certificate
for 127.0.0.1, ::1 and localhost (plus the configured sandbox host) signed by it.

Files: ``sandbox-ca.pem`` (the CA certificate: what a client trusts),
``sandbox-ca-key.pem``, ``sandbox-tls.pem`` (server certificate then CA) and
``sandbox-tls-key.pem``; keys ``0600``. The server certificate is re-issued by the same
CA when it is missing, due to expire within 30 days, or does not name the host.
The server offers ALPN ``h2`` and ``http/1.1`` and TLS 1.2+.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from campaign_trigger.delivery.sandbox_files import home_lock, write_private

CA_FILE: Final = "sandbox-ca.pem"
CA_KEY_FILE: Final = "sandbox-ca-key.pem"
CERT_FILE: Final = "sandbox-tls.pem"
CERT_KEY_FILE: Final = "sandbox-tls-key.pem"
_DEFAULT_HOSTS: Final = ("localhost", "127.0.0.1", "::1")


@dataclass(frozen=True, slots=True)
class TlsFiles:
    """Where the CA and the server certificate are."""

    ca: Path
    certificate: Path  # chain: server certificate, then the CA
    key: Path


def ca_path(home: Path) -> Path:
    """Where the sandbox CA certificate is (or will be) in ``home``."""
    return home.resolve() / CA_FILE


def _pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _names(hosts: tuple[str, ...]) -> list[x509.GeneralName]:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return names


def _new_ca(home: Path) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "campaign-trigger sandbox CA")])
    now = dt.datetime.now(dt.UTC)
    certificate = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=3650))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(False, False, False, False, False, True, True, False, False),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    write_private(home / CA_KEY_FILE, _pem(key))
    (home / CA_FILE).write_bytes(certificate.public_bytes(serialization.Encoding.PEM))
    return certificate, key


def ensure_ca(home: Path) -> Path:
    """The CA certificate's path, generating the CA the first time."""
    home = home.resolve()
    with home_lock(home):
        if not (home / CA_FILE).exists() or not (home / CA_KEY_FILE).exists():
            _new_ca(home)
    return home / CA_FILE


def _leaf_is_good(path: Path, ca: x509.Certificate, hosts: tuple[str, ...]) -> bool:
    try:
        leaf = x509.load_pem_x509_certificates(path.read_bytes())[0]
        names = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (OSError, ValueError, x509.ExtensionNotFound):
        return False
    fresh = leaf.not_valid_after_utc - dt.datetime.now(dt.UTC) > dt.timedelta(days=30)
    covered = all(name in list(names) for name in _names(hosts))
    return fresh and covered and leaf.issuer == ca.subject


def ensure_server_files(home: Path, *, host: str = "127.0.0.1") -> TlsFiles:
    """The CA and a current server certificate for ``host`` and the loopback names."""
    home = home.resolve()
    hosts = tuple(dict.fromkeys((*_DEFAULT_HOSTS, host)))
    ensure_ca(home)
    with home_lock(home):
        ca = x509.load_pem_x509_certificate((home / CA_FILE).read_bytes())
        if not _leaf_is_good(home / CERT_FILE, ca, hosts):
            ca_key = serialization.load_pem_private_key(
                (home / CA_KEY_FILE).read_bytes(), password=None
            )
            assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
            key = ec.generate_private_key(ec.SECP256R1())
            now = dt.datetime.now(dt.UTC)
            leaf = (
                x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, hosts[0])]))
                .issuer_name(ca.subject)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - dt.timedelta(minutes=5))
                .not_valid_after(now + dt.timedelta(days=397))
                .add_extension(x509.SubjectAlternativeName(_names(hosts)), critical=False)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(
                    x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
                )
                .add_extension(
                    x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
                )
                .add_extension(
                    x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                    critical=False,
                )
                .sign(ca_key, hashes.SHA256())
            )
            write_private(home / CERT_KEY_FILE, _pem(key))
            chain = leaf.public_bytes(serialization.Encoding.PEM) + ca.public_bytes(
                serialization.Encoding.PEM
            )
            (home / CERT_FILE).write_bytes(chain)
    return TlsFiles(home / CA_FILE, home / CERT_FILE, home / CERT_KEY_FILE)


def server_context(tls: TlsFiles) -> ssl.SSLContext:
    """The server side: our certificate, ALPN ``h2`` then ``http/1.1``, TLS 1.2 or later."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.load_cert_chain(tls.certificate, tls.key)
    context.set_alpn_protocols(["h2", "http/1.1"])
    return context


def client_context(ca_file: Path | str | None, *, alpn: list[str] | None = None) -> ssl.SSLContext:
    """A client context trusting the system CAs and ``ca_file`` (the sandbox CA) if it
    exists (without it, a sandbox certificate simply fails verification)."""
    context = ssl.create_default_context()
    if ca_file is not None and Path(ca_file).exists():
        context.load_verify_locations(cafile=str(ca_file))
    if alpn:
        context.set_alpn_protocols(alpn)
    return context
