"""Certificates for a local cluster (estream/devcluster/certs.py): made once and kept,
SANs for the given hosts, private files 0600, TLS handshakes with hostname checking."""

from __future__ import annotations

import ssl
from pathlib import Path

import pytest
from cryptography import x509

from estream.devcluster.certs import ensure_cluster_tls, main

pytestmark = pytest.mark.integration


def test_made_once_then_kept(tmp_path: Path) -> None:
    tls = ensure_cluster_tls(tmp_path / "tls", ["10.9.8.7", "db.example"])
    assert tls.complete()
    ca = tls.ca.read_bytes()
    again = ensure_cluster_tls(tmp_path / "tls", ["other"])
    assert again.ca.read_bytes() == ca
    for private in (tls.member_key, tls.client_key, tls.token, tmp_path / "tls" / "ca.key"):
        assert private.stat().st_mode & 0o777 == 0o600
    assert len(tls.token.read_text().strip()) >= 32
    member = x509.load_pem_x509_certificate(tls.member_cert.read_bytes())
    sans = member.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [
        "10.9.8.7", "127.0.0.1"]
    assert sans.get_values_for_type(x509.DNSName) == ["db.example", "localhost"]
    assert tls.member_args()[:2] == ("--tls-cert", str(tls.member_cert))


def test_the_member_certificate_verifies_against_the_ca(tmp_path: Path) -> None:
    tls = ensure_cluster_tls(tmp_path, ["127.0.0.1"])
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server.load_cert_chain(tls.member_cert, tls.member_key)
    client = ssl.create_default_context(cafile=str(tls.ca))
    client.load_cert_chain(tls.client_cert, tls.client_key)
    a, b = ssl.MemoryBIO(), ssl.MemoryBIO()
    c, d = ssl.MemoryBIO(), ssl.MemoryBIO()
    s = server.wrap_bio(a, b, server_side=True)
    k = client.wrap_bio(c, d, server_hostname="127.0.0.1")
    for _ in range(10):  # shuttle the handshake bytes between the two ends
        for end in (k, s):
            try:
                end.do_handshake()
            except ssl.SSLWantReadError:
                pass
        a.write(d.read())
        c.write(b.read())
    assert k.version() is not None and s.version() is not None


def test_the_command(tmp_path: Path, capsys: object) -> None:
    assert main([str(tmp_path / "c"), "--host", "10.0.0.1"]) == 0
    assert (tmp_path / "c" / "ca.pem").is_file()
