"""Certificates and a token for a local cluster: what ``estream up --tls`` runs with.

:func:`ensure_cluster_tls` makes, once, in one directory (``DATA_DIR/tls``): a cluster CA,
a member certificate for every PD node and range server, a client certificate (each naming
its role in a SAN URI ``estream-role:ROLE``) and a random token; EC P-256 keys, private
files mode 0600. A directory that holds them is reused, so identities and the CA outlive
restarts. ``estream certs DIR`` (:func:`main`) makes the same for a cluster run by hand,
and tokens and certificates of other roles (its docstring).

Side effects: writes PEM and token files.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import ipaddress
import os
import secrets
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from estream.net.security import certificate_file_role
from estream.server.durable import fsync_dir
from estream.wire.roles import CLIENT_ROLE, MEMBER_ROLE, ROLES, role_uri

validity_days: Final = 825  # what browsers accept at most for a leaf; a CA gets the same


@dataclass(frozen=True, slots=True)
class ClusterTls:
    """The files of a local cluster's TLS and token."""

    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.pem"

    @property
    def member_cert(self) -> Path:
        return self.directory / "member.pem"

    @property
    def member_key(self) -> Path:
        return self.directory / "member.key"

    @property
    def client_cert(self) -> Path:
        return self.directory / "client.pem"

    @property
    def client_key(self) -> Path:
        return self.directory / "client.key"

    def role_cert(self, role: str) -> Path:
        """The certificate of ``role`` (``member``: :attr:`member_cert`)."""
        return self.directory / f"{role}.pem"

    def role_key(self, role: str) -> Path:
        return self.directory / f"{role}.key"

    @property
    def token(self) -> Path:
        return self.directory / "token"

    def member_args(self) -> tuple[str, ...]:
        """The flags of every PD node and range server."""
        return ("--tls-cert", str(self.member_cert), "--tls-key", str(self.member_key),
                "--tls-ca", str(self.ca), "--token-file", str(self.token))

    def client_env(self) -> dict[str, str]:
        """What a client (the CLI, the SDK's users) needs, as environment variables."""
        return {"ESTREAM_TLS_CA": str(self.ca), "ESTREAM_TOKEN_FILE": str(self.token)}

    def complete(self) -> bool:
        return all(p.is_file() for p in (self.ca, self.member_cert, self.member_key,
                                         self.client_cert, self.client_key, self.token))


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)


def _key_bytes(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def _sans(hosts: list[str]) -> list[x509.GeneralName]:
    out: list[x509.GeneralName] = []
    for host in dict.fromkeys([*hosts, "127.0.0.1", "localhost"]):
        try:
            out.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            out.append(x509.DNSName(host))
    return out


def _builder(subject: str, issuer: x509.Name, public: ec.EllipticCurvePublicKey
             ) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(issuer)
            .public_key(public).serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=validity_days)))


def _leaf(role: str, ca_key: ec.EllipticCurvePrivateKey, ca: x509.Certificate,
          hosts: list[x509.GeneralName] | None) -> tuple[ec.EllipticCurvePrivateKey,
                                                         x509.Certificate]:
    """A certificate of ``role`` (its SAN URI); with ``hosts`` a server's too."""
    key = ec.generate_private_key(ec.SECP256R1())
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH]
    sans: list[x509.GeneralName] = [x509.UniformResourceIdentifier(role_uri(role))]
    if hosts is not None:
        usages.insert(0, ExtendedKeyUsageOID.SERVER_AUTH)
        sans = [*hosts, *sans]
    builder = (_builder(f"estream {role}", ca.subject, key.public_key())
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(
                   ca_key.public_key()), critical=False)
               .add_extension(x509.SubjectAlternativeName(sans), critical=False)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_leaf(directory: Path, role: str, ca_key: ec.EllipticCurvePrivateKey,
                ca: x509.Certificate, hosts: list[x509.GeneralName] | None) -> None:
    key, cert = _leaf(role, ca_key, ca, hosts)
    _write_private(directory / f"{role}.key", _key_bytes(key))
    (directory / f"{role}.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def named_role(path: Path) -> str | None:
    """The role the certificate in ``path`` names in its SAN URI (None: none, or not one)."""
    role, problem = certificate_file_role(path)
    return None if problem is not None else role


def _load_ca(directory: Path) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = serialization.load_pem_private_key((directory / "ca.key").read_bytes(), None)
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise ValueError(f"{directory / 'ca.key'} is not the EC key estream certs makes")
    return key, x509.load_pem_x509_certificate((directory / "ca.pem").read_bytes())


def _renew_roleless(tls: ClusterTls, hosts: list[str]) -> None:
    """Make again, with the same CA, the member and client certificates of a directory
    made before certificates named roles (the member's keeps its hosts)."""
    if (named_role(tls.member_cert) == MEMBER_ROLE
            and named_role(tls.client_cert) == CLIENT_ROLE):
        return
    ca_key, ca = _load_ca(tls.directory)
    old = x509.load_pem_x509_certificate(tls.member_cert.read_bytes())
    try:
        kept: list[x509.GeneralName] = [name for name in old.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value
            if isinstance(name, (x509.IPAddress, x509.DNSName))]
    except x509.ExtensionNotFound:
        kept = _sans(hosts)
    _write_leaf(tls.directory, MEMBER_ROLE, ca_key, ca, kept)
    _write_leaf(tls.directory, CLIENT_ROLE, ca_key, ca, None)


def ensure_cluster_tls(directory: Path, hosts: list[str]) -> ClusterTls:
    """The cluster's CA, member and client certificates and token in ``directory``, made
    now unless they are all there already (see the module docstring)."""
    tls = ClusterTls(directory)
    if tls.complete():
        _renew_roleless(tls, hosts)
        return tls
    directory.mkdir(parents=True, exist_ok=True)
    pem = serialization.Encoding.PEM
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (_builder("estream local cluster CA", _name("estream local cluster CA"),
                   ca_key.public_key())
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True,
                                       crl_sign=True, content_commitment=False,
                                       key_encipherment=False, data_encipherment=False,
                                       key_agreement=False, encipher_only=False,
                                       decipher_only=False), critical=True)
          .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()),
                         critical=False)
          .sign(ca_key, hashes.SHA256()))
    _write_private(directory / "ca.key", _key_bytes(ca_key))
    _write_leaf(directory, MEMBER_ROLE, ca_key, ca, _sans(hosts))
    _write_leaf(directory, CLIENT_ROLE, ca_key, ca, None)
    _write_private(tls.token, (secrets.token_urlsafe(32) + "\n").encode())
    tls.ca.write_bytes(ca.public_bytes(pem))  # last: complete() is true only after it
    return tls


def ensure_role_token(directory: Path, role: str) -> Path:
    """``DIR/ROLE-token``: a token of ``role`` made once, its line also in ``DIR/token``."""
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    path = directory / f"{role}-token"
    if path.exists():
        return path
    line = f"{role}:{secrets.token_urlsafe(32)}\n"
    servers = directory / "token"
    kept = servers.read_text(encoding="utf-8") if servers.exists() else ""
    _write_private(servers, (kept + ("" if not kept or kept.endswith("\n") else "\n")
                             + line).encode())
    _write_private(path, line.encode())
    return path


def ensure_role_cert(directory: Path, role: str) -> tuple[Path, Path]:
    """``DIR/ROLE.pem`` and ``DIR/ROLE.key``: a client certificate of ``role`` signed by the
    cluster CA of ``DIR`` (:func:`ensure_cluster_tls` first), made once."""
    tls = ClusterTls(directory)
    cert, key = tls.role_cert(role), tls.role_key(role)
    if role not in ROLES:
        raise ValueError(f"unknown role {role!r}: one of {', '.join(ROLES)}")
    if not (cert.is_file() and key.is_file()):
        ca_key, ca = _load_ca(directory)
        _write_leaf(directory, role, ca_key, ca, None)
    return cert, key


def main(argv: Sequence[str] | None = None) -> int:
    """``estream certs DIR [--host H ...]``: make (or keep) a cluster's certificates.

    ``estream certs DIR [--host H ...]`` (:func:`main`) makes the same files for a cluster run
    by hand: give every server's address with ``--host`` (IP addresses or names). With
    ``--role read|client|admin|member|gateway`` it also makes (once) a token of that role
    (:func:`ensure_role_token`, :mod:`estream.wire.roles`): ``DIR/ROLE-token`` holds the line
    ``ROLE:TOKEN``, also added to the servers' token file ``DIR/token`` (restart them to take
    it); a client given ``ESTREAM_TOKEN_FILE=DIR/ROLE-token`` presents the token alone. And a
    certificate of that role (:func:`ensure_role_cert`): ``DIR/ROLE.pem``/``DIR/ROLE.key``
    (``member`` and ``client`` are always there).
    """
    from estream.server.config import one_line_errors

    parser = one_line_errors(argparse.ArgumentParser(
        prog="estream certs",
        description="Make a cluster CA, a member certificate (every PD node and range "
        "server), a client certificate and a token in DIR; files already there are kept. "
        "Each certificate names its role in a SAN URI estream-role:ROLE; with mutual TLS a "
        "server gives a connection that role (a certificate naming none is a client: no "
        "member or admin opcodes)."))
    parser.add_argument("dir", type=Path)
    parser.add_argument("--host", action="append", default=[], metavar="H",
                        help="an address or name the servers are reached by (repeatable; "
                        "127.0.0.1 and localhost are always in)")
    parser.add_argument("--role", choices=ROLES, default=None,
                        help="also make a token and a client certificate (DIR/ROLE.pem, "
                        "DIR/ROLE.key) of this role (read: read only; client: create, "
                        "write, read; admin: also delete, trim, drain, forget; member: PD "
                        "nodes and range servers)")
    ns = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    tls = ensure_cluster_tls(ns.dir, list(ns.host))
    print(f"CA:       {tls.ca}")
    print(f"members:  {' '.join(tls.member_args())}")
    print(f"clients:  ESTREAM_TLS_CA={tls.ca} ESTREAM_TOKEN_FILE={tls.token} "
          f"(client certificate: --tls-cert {tls.client_cert} --tls-key {tls.client_key})")
    if ns.role is not None:
        path = ensure_role_token(ns.dir, ns.role)
        cert, key = ensure_role_cert(ns.dir, ns.role)
        print(f"{ns.role} token: ESTREAM_TOKEN_FILE={path} (its line is in {tls.token}: "
              "restart the servers to accept it)")
        print(f"{ns.role} certificate: --tls-cert {cert} --tls-key {key}")
    return 0


SECRET_NAME = "cluster-secret"


def ensure_cluster_secret(data_dir: Path) -> Path:
    """``DATA_DIR/cluster-secret``: made once (random, mode 0600, written to a temporary
    file and renamed, so a crash never leaves an empty one), then kept as it is, so a
    restarted cluster keeps verifying the MACs its clients make."""
    path = data_dir / SECRET_NAME
    with contextlib.suppress(FileNotFoundError):
        if path.read_bytes().strip():
            return path
    tmp = path.with_suffix(".tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, (secrets.token_urlsafe(32) + "\n").encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    fsync_dir(data_dir)
    return path
