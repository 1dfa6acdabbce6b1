"""Throw-away certificates for security tests, made the way ``estream up --tls`` makes
them (:mod:`estream.devcluster.certs`).

:func:`make_pki` writes, into one directory: a cluster CA, a server/member certificate
signed by it whose IP SANs cover 127.0.0.1..127.0.0.30 (so hostname checking stays on
when connecting by IP), a client certificate, an admin and a read certificate (each naming
its role, :mod:`estream.wire.roles`), and a CA and certificate from a *different*
authority (to be refused). Keys are EC P-256: fast to generate.

Side effects: writes PEM and key files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from estream.devcluster.certs import ensure_cluster_tls, ensure_role_cert

_LOOPBACK_HOSTS = [f"127.0.0.{i}" for i in range(1, 31)]


@dataclass(frozen=True)
class Pki:
    ca: Path
    server_cert: Path  # also the cluster members' client certificate (both usages)
    server_key: Path
    client_cert: Path  # role client
    client_key: Path
    admin_cert: Path
    admin_key: Path
    read_cert: Path
    read_key: Path
    other_ca: Path
    other_cert: Path  # signed by other_ca, same SANs: must be refused
    other_key: Path


def make_pki(directory: Path) -> Pki:
    """Generate the certificates into ``directory`` and return their paths: the cluster's
    from :func:`estream.devcluster.certs.ensure_cluster_tls` (what ``estream up --tls``
    uses), the impostor's from a second, unrelated run of it."""
    cluster = ensure_cluster_tls(directory / "cluster", _LOOPBACK_HOSTS)
    other = ensure_cluster_tls(directory / "other", _LOOPBACK_HOSTS)
    admin_cert, admin_key = ensure_role_cert(cluster.directory, "admin")
    read_cert, read_key = ensure_role_cert(cluster.directory, "read")
    return Pki(ca=cluster.ca, server_cert=cluster.member_cert, server_key=cluster.member_key,
               client_cert=cluster.client_cert, client_key=cluster.client_key,
               admin_cert=admin_cert, admin_key=admin_key, read_cert=read_cert,
               read_key=read_key,
               other_ca=other.ca, other_cert=other.member_cert, other_key=other.member_key)
