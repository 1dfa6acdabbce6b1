"""Throw-away certificates for security tests (``cryptography``).

:func:`make_pki` writes, into one directory: a cluster CA, a server/member certificate
signed by it whose IP SANs cover 127.0.0.1..127.0.0.30 (so hostname checking stays on
when connecting by IP), a client certificate, and a CA and certificate from a *different*
authority (to be refused). Keys are EC P-256: fast to generate.

Side effects: writes PEM files.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_LOOPBACK_SANS = [ipaddress.IPv4Address(f"127.0.0.{i}") for i in range(1, 31)]


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path  # also the cluster members' client certificate (both usages)
    server_key: Path
    client_cert: Path
    client_key: Path
    other_ca: Path
    other_cert: Path  # signed by other_ca, same SANs: must be refused
    other_key: Path


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _ca(common_name: str) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(_name(common_name))
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                     content_commitment=False, key_encipherment=False,
                                     data_encipherment=False, key_agreement=False,
                                     encipher_only=False, decipher_only=False), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                       critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def _leaf(common_name: str, ca_key: ec.EllipticCurvePrivateKey, ca_cert: x509.Certificate,
          *, server: bool) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name)).issuer_name(ca_cert.subject)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(hours=1))
        .not_valid_after(now + datetime.timedelta(days=2))
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
                       critical=False)
    )
    if server:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        sans: list[x509.GeneralName] = [x509.DNSName("localhost")]
        sans += [x509.IPAddress(ip) for ip in _LOOPBACK_SANS]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    builder = builder.add_extension(x509.ExtendedKeyUsage(usages), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def make_pki(directory: Path) -> Pki:
    """Generate the certificates into ``directory`` and return their paths."""
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    paths: dict[str, Path] = {}
    ca_key, ca_cert = _ca("estream test CA")
    other_ca_key, other_ca_cert = _ca("some other CA")
    for label, cert in (("ca", ca_cert), ("other_ca", other_ca_cert)):
        paths[label] = directory / f"{label}.pem"
        paths[label].write_bytes(cert.public_bytes(pem))
    leaves = {
        "server": ("estream member", ca_key, ca_cert, True),
        "client": ("estream client", ca_key, ca_cert, False),
        "other": ("impostor member", other_ca_key, other_ca_cert, True),
    }
    for label, (cn, issuer_key, issuer_cert, server) in leaves.items():
        key, cert = _leaf(cn, issuer_key, issuer_cert, server=server)
        paths[f"{label}_cert"] = directory / f"{label}.pem"
        paths[f"{label}_key"] = directory / f"{label}.key"
        paths[f"{label}_cert"].write_bytes(cert.public_bytes(pem))
        _write_key(key, paths[f"{label}_key"])
    return Pki(**paths)
