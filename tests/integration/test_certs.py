"""Certificates for a local cluster (estream/devcluster/certs.py): made once and kept,
SANs for the given hosts, private files 0600, TLS handshakes with hostname checking, a role
in each (issue 28).

Roles in certificates against real processes: a cluster (1 PD node, 2 range servers) with
mutual TLS and no cluster secret, whose members authenticate by their member certificate
alone (their token file holds a read token only, for clients without a certificate): a
client certificate cannot act as a range server, a read certificate only reads, deleting
needs an admin certificate, and the member certificates keep the cluster working.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from cryptography import x509

import estream
from estream.devcluster.certs import ensure_cluster_tls, main, named_role
from estream.devcluster.pd import PdCluster, http_json, start_pd_cluster
from estream.devcluster.process import ManagedProcess
from estream.devcluster.rangeserver import start_rangeserver
from estream.net.pdclient import PDClient
from estream.net.rpc import RpcClient
from estream.net.security import SecurityConfig, client_context, member_certificate_warning
from estream.wire.errors import Unauthenticated
from estream.wire.protocol import Opcode
from tests.harness.certs import Pki, make_pki

pytestmark = pytest.mark.integration

DENIED = "permission denied"
READ_TOKEN = "a-read-token-for-certificate-less-clients"


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
    assert sans.get_values_for_type(x509.UniformResourceIdentifier) == ["estream-role:member"]
    assert named_role(tls.member_cert) == "member" and named_role(tls.client_cert) == "client"
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


def test_the_command_makes_a_certificate_of_a_role(tmp_path: Path) -> None:
    for role in ("admin", "read"):
        assert main([str(tmp_path), "--role", role]) == 0
        assert named_role(tmp_path / f"{role}.pem") == role
        assert (tmp_path / f"{role}.key").stat().st_mode & 0o777 == 0o600
    made = (tmp_path / "admin.pem").read_bytes()
    assert main([str(tmp_path), "--role", "admin"]) == 0
    assert (tmp_path / "admin.pem").read_bytes() == made  # kept, not made again


def test_certificates_made_before_roles_are_made_again_with_the_same_ca(
        tmp_path: Path) -> None:
    tls = ensure_cluster_tls(tmp_path, ["10.9.8.7"])
    ca = tls.ca.read_bytes()
    for path in (tls.member_cert, tls.client_cert):  # as estream certs made them before
        path.write_bytes(_roleless_copy(path, tmp_path / "ca.key"))
        assert named_role(path) is None
    again = ensure_cluster_tls(tmp_path, ["other"])
    assert again.ca.read_bytes() == ca
    assert named_role(tls.member_cert) == "member" and named_role(tls.client_cert) == "client"
    member = x509.load_pem_x509_certificate(tls.member_cert.read_bytes())
    sans = member.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert [str(ip) for ip in sans.get_values_for_type(x509.IPAddress)] == [
        "10.9.8.7", "127.0.0.1"]  # the hosts it was made for, not the new call's


def test_a_member_warns_when_nothing_it_holds_proves_it_a_member(tmp_path: Path) -> None:
    tls = ensure_cluster_tls(tmp_path, ["127.0.0.1"])
    old = tmp_path / "old.pem"
    old.write_bytes(_roleless_copy(tls.member_cert, tmp_path / "ca.key"))

    def config(cert: Path, token_role: str | None = None) -> SecurityConfig:
        roles = {} if token_role is None else {"t0ken": token_role}
        return SecurityConfig(tls_cert=str(cert), tls_key=str(tls.member_key),
                              tokens=frozenset(roles), token_roles=roles,
                              token="t0ken" if roles else None)

    warning = member_certificate_warning(config(old), member_secret=False)
    assert warning is not None and "names role 'client', not 'member'" in warning
    assert member_certificate_warning(config(old, "read"), member_secret=False) is not None
    assert member_certificate_warning(config(tls.client_cert), member_secret=False)
    for fine in (config(tls.member_cert), config(old, "member"), config(old, "all")):
        assert member_certificate_warning(fine, member_secret=False) is None
    assert member_certificate_warning(config(old), member_secret=True) is None
    assert member_certificate_warning(SecurityConfig(), member_secret=False) is None


def _roleless_copy(path: Path, ca_key_path: Path) -> bytes:
    """The certificate at ``path`` signed again without its role URI (an old one)."""
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    cert = x509.load_pem_x509_certificate(path.read_bytes())
    ca_key = serialization.load_pem_private_key(ca_key_path.read_bytes(), None)
    assert isinstance(ca_key, ec.EllipticCurvePrivateKey)
    builder = (x509.CertificateBuilder().subject_name(cert.subject)
               .issuer_name(cert.issuer).public_key(cert.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(cert.not_valid_before_utc)
               .not_valid_after(cert.not_valid_after_utc))
    for ext in cert.extensions:
        value = ext.value
        if isinstance(value, x509.SubjectAlternativeName):
            hosts = [n for n in value if not isinstance(n, x509.UniformResourceIdentifier)]
            if not hosts:
                continue
            value = x509.SubjectAlternativeName(hosts)
        builder = builder.add_extension(value, critical=ext.critical)
    return builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)


# --- roles in certificates, against a mutual-TLS cluster ----------------------------------


@dataclass
class MtlsCluster:
    pki: Pki
    pd: PdCluster
    servers: list[str]  # range servers' addresses
    flags: list[str]  # every member's

    def ssl(self, role: str) -> ssl.SSLContext:
        """A client's TLS settings presenting the certificate of ``role``."""
        pki = self.pki
        cert, key = {"member": (pki.server_cert, pki.server_key),
                     "client": (pki.client_cert, pki.client_key),
                     "admin": (pki.admin_cert, pki.admin_key),
                     "read": (pki.read_cert, pki.read_key)}[role]
        context = client_context(tls_ca=str(pki.ca), tls_cert=str(cert), tls_key=str(key))
        assert context is not None
        return context

    async def connect(self, role: str) -> estream.Client:
        pki = self.pki
        cert, key = {"client": (pki.client_cert, pki.client_key),
                     "admin": (pki.admin_cert, pki.admin_key),
                     "read": (pki.read_cert, pki.read_key)}[role]
        return await estream.connect(self.pd.rpc_addresses, tls_ca=str(pki.ca),
                                     tls_cert=str(cert), tls_key=str(key))


@pytest.fixture(scope="module")
def mtls(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MtlsCluster]:
    root = tmp_path_factory.mktemp("mtls")
    pki = make_pki(root / "pki")
    tokens = root / "tokens"
    tokens.write_text(f"read:{READ_TOKEN}\n")
    flags = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
             "--tls-ca", str(pki.ca), "--token-file", str(tokens)]
    with start_pd_cluster(root, n=1, extra_args=flags, tls_ca=pki.ca) as pd:
        processes: list[ManagedProcess] = []
        try:
            servers = []
            for i in range(2):
                process, address = start_rangeserver(root / f"rs{i}", "127.0.0.1",
                                                     pd.rpc_addresses, extra_args=flags)
                processes.append(process)
                servers.append(address)
            cluster = MtlsCluster(pki, pd, servers, flags)
            _wait_alive(cluster, 2)
            yield cluster
        finally:
            for process in processes:
                process.stop()


def _wait_alive(cluster: MtlsCluster, count: int) -> None:
    """Until PD lists ``count`` range servers alive (they registered with their member
    certificates: no secret, no member token), at most 30 s."""
    context = client_context(tls_ca=str(cluster.pki.ca))
    for _ in range(300):
        status, body = http_json(cluster.pd.http_urls[0] + "/v1/rangeservers",
                                 timeout_s=2.0, context=context)
        if status == 200 and sum(s["alive"] for s in body["rangeservers"]) == count:
            return
        time.sleep(0.1)
    raise TimeoutError("range servers did not register with their member certificates")


async def _servers(cluster: MtlsCluster) -> dict[str, tuple[str, bool]]:
    async with PDClient(cluster.pd.rpc_addresses, ssl=cluster.ssl("read")) as pd:
        return {s.id: (s.address, s.alive) for s in await pd.list_servers()}


async def test_a_client_certificate_cannot_take_a_range_servers_place(
        mtls: MtlsCluster) -> None:
    before = await _servers(mtls)
    victim = sorted(before)[0]
    async with PDClient(mtls.pd.rpc_addresses, ssl=mtls.ssl("client")) as pd:
        with pytest.raises(Unauthenticated, match=DENIED):
            await pd.register_server(victim, "127.0.0.1:9")
        with pytest.raises(Unauthenticated, match=DENIED):
            await pd.register_server("impostor", "127.0.0.1:9")
        for server_id, address in ((victim, "127.0.0.1:9"), ("impostor", before[victim][0])):
            with pytest.raises(Unauthenticated, match=DENIED):
                await pd.call(Opcode.PD_HEARTBEAT, {"server_id": server_id,
                                                    "address": address, "load": {}})
        with pytest.raises(Unauthenticated, match=DENIED):
            await pd.call(Opcode.PD_UPDATE_REPLICAS, {})
    client = await RpcClient.connect(mtls.servers[0], ssl=mtls.ssl("client"))
    try:
        for opcode in (Opcode.LIST_RANGES, Opcode.DROP_RANGE):
            with pytest.raises(Unauthenticated, match=DENIED):
                await client.call(opcode, {"stream_id": 1, "range_index": 0})
    finally:
        await client.close()
    assert await _servers(mtls) == before  # the catalog unchanged, every server alive
    assert all(alive for _, alive in before.values())


async def test_a_read_certificate_only_reads(mtls: MtlsCluster) -> None:
    async with await mtls.connect("client") as writer_client:
        await writer_client.create_stream("read-cert", replicas=2, ack_count=2)
        async with await writer_client.open_writer("read-cert") as writer:
            await writer.append_batch([b"a", b"b"])
    async with await mtls.connect("read") as reader:
        assert [r.value async for r in reader.read("read-cert")] == [b"a", b"b"]
        with pytest.raises(Unauthenticated, match=DENIED):
            await reader.create_stream("not-by-a-reader")
        with pytest.raises(Unauthenticated, match=DENIED):
            await reader.open_writer("read-cert")
        with pytest.raises(Unauthenticated, match=DENIED):
            await reader.delete_stream("read-cert")
        names = [s.name for s in await reader.list_streams()]
    assert "read-cert" in names and "not-by-a-reader" not in names
    client = await RpcClient.connect(mtls.servers[0], ssl=mtls.ssl("read"))
    try:  # straight to a range server: no replica made, no batch appended
        for opcode in (Opcode.CREATE_RANGE, Opcode.APPEND, Opcode.SEAL):
            with pytest.raises(Unauthenticated, match=DENIED):
                await client.call(opcode, {"stream_id": 1, "range_index": 0})
    finally:
        await client.close()


async def test_deleting_needs_an_admin_certificate(mtls: MtlsCluster) -> None:
    async with await mtls.connect("client") as client:
        await client.create_stream("admin-cert", replicas=2, ack_count=2)
        with pytest.raises(Unauthenticated, match=DENIED):
            await client.delete_stream("admin-cert")
        assert "admin-cert" in [s.name for s in await client.list_streams()]
    async with await mtls.connect("admin") as admin:
        await admin.delete_stream("admin-cert")
        assert "admin-cert" not in [s.name for s in await admin.list_streams()]


def test_the_admin_api_gives_a_certificate_its_role(mtls: MtlsCluster) -> None:
    url = mtls.pd.http_urls[0] + "/v1/streams"
    status, body = http_json(url, "POST", {"name": "http-cert", "replicas": 2},
                             context=mtls.ssl("read"))
    assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED"
    status, body = http_json(url, "POST", {"name": "http-cert", "replicas": 2},
                             context=mtls.ssl("client"))
    assert status == 201, body
    status, body = http_json(url + "/http-cert", "DELETE", context=mtls.ssl("client"))
    assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED"
    status, body = http_json(url + "/http-cert", "DELETE", context=mtls.ssl("admin"))
    assert status == 200, body


async def test_member_certificates_keep_the_cluster_working(mtls: MtlsCluster) -> None:
    async with await mtls.connect("client") as client:
        await client.create_stream("member-certs", replicas=2, ack_count=2)
        async with await client.open_writer("member-certs") as writer:
            offsets = [await writer.append(f"r{i}".encode()) for i in range(5)]
        assert offsets == list(range(5))
        values = [r.value async for r in client.read("member-certs", 0, 5)]
        assert values == [f"r{i}".encode() for i in range(5)]
    async with PDClient(mtls.pd.rpc_addresses, ssl=mtls.ssl("member")) as pd:
        servers = await pd.list_servers()
    assert {s.address for s in servers} == set(mtls.servers) and all(s.alive for s in servers)


async def test_a_member_certificate_naming_no_role_is_a_client(
        mtls: MtlsCluster, tmp_path: Path) -> None:
    """A range server with a member certificate made before roles, and no cluster secret:
    it warns at start, PD warns once and serves it as a client, so it never registers."""
    old = tmp_path / "old-member.pem"
    old.write_bytes(_roleless_copy(mtls.pki.server_cert, mtls.pki.ca.parent / "ca.key"))
    flags = list(mtls.flags)
    flags[flags.index("--tls-cert") + 1] = str(old)
    before = await _servers(mtls)
    process, _ = start_rangeserver(tmp_path / "rs-old", "127.0.0.1", mtls.pd.rpc_addresses,
                                   extra_args=flags)
    try:
        process.wait_log(rb"names role 'client', not 'member'", 20)
        process.wait_log(rb"registering with the placement driver failed: permission denied"
                         rb".*role: client", 30)
        pd_log = mtls.pd.nodes[0].log_path.read_text(errors="replace")
        assert pd_log.count("a client certificate names no role") == 1  # once, not per try
    finally:
        process.stop()
    assert await _servers(mtls) == before
