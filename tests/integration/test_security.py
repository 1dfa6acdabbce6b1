"""Security end to end: TLS, mutual TLS for members, tokens, the admin API, the Raft secret.

Certificates are generated once per session (``tests/harness/certs.py``): a cluster CA,
a member certificate with IP SANs 127.0.0.1..30 (hostname checks stay on), a client
certificate, and a certificate from another CA. The first tests run the RPC layer
in-process over real loopback sockets; the cluster tests run real ``estream pd`` and
``estream rangeserver`` processes configured by flags, env and a token file.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import pickle
import socket
import ssl
import struct
import time
import urllib.error
import urllib.request
import zlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.devcluster.cmdline import ESTREAM
from estream.devcluster.pd import start_pd_cluster
from estream.devcluster.process import ManagedProcess, free_port
from estream.devcluster.rangeserver import start_rangeserver
from estream.net.pdclient import PDClient
from estream.net.rpc import ConnectionPool, Header, RpcClient, RpcServer
from estream.net.security import SecurityConfig, client_context, server_context
from estream.wire.errors import Unauthenticated, Unavailable
from estream.wire.protocol import Opcode
from pd.commands import RegisterServer
from pd.shell.raft import RaftNode
from tests.harness.certs import Pki, make_pki

pytestmark = pytest.mark.integration

HOST = "127.0.0.1"
TOKEN = "s3cret-client-token"
CLUSTER_TOKEN = "cluster-member-token"


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _server_ctx(pki: Pki, *, require_client_cert: bool = False) -> ssl.SSLContext:
    ctx = server_context(SecurityConfig(tls_cert=str(pki.server_cert), tls_key=str(pki.server_key),
                                        tls_ca=str(pki.ca),
                                        require_client_cert=require_client_cert))
    assert ctx is not None
    return ctx


async def _secret(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
    return {"data": "the secret"}, b"payload"


@pytest.fixture
async def tls_server(pki: Pki) -> AsyncIterator[RpcServer]:
    server = RpcServer({Opcode.READ: _secret}, name="test", ssl=_server_ctx(pki),
                       tokens=[TOKEN, "another"])
    await server.start(HOST, 0)
    yield server
    await server.close()


# --- the RPC layer, in-process ----------------------------------------------------------------


async def test_tls_and_token_serve_data(pki: Pki, tls_server: RpcServer) -> None:
    client = await RpcClient.connect(tls_server.address, ssl=client_context(tls_ca=str(pki.ca)),
                                     token=TOKEN)
    try:
        assert await client.call(Opcode.READ, {}) == ({"data": "the secret"}, b"payload")
    finally:
        await client.close()


async def test_large_answers_arrive_whole_over_tls(pki: Pki) -> None:
    blob = bytes(range(256)) * 8192  # 2 MiB: received in place, through the TLS layer

    async def big(header: Header, payload: bytes) -> tuple[Header | None, bytes]:
        return {}, blob[: header["size"]]

    server = RpcServer({Opcode.READ: big}, name="test", ssl=_server_ctx(pki), tokens=[TOKEN])
    await server.start(HOST, 0)
    client = await RpcClient.connect(server.address, ssl=client_context(tls_ca=str(pki.ca)),
                                     token=TOKEN)
    try:
        sizes = [len(blob), 5, 100_000, len(blob) - 1]
        answers = await asyncio.gather(
            *(client.call(Opcode.READ, {"size": size}) for size in sizes))
        assert [bytes(payload) for _, payload in answers] == [blob[:size] for size in sizes]
    finally:
        await client.close()
        await server.close()


async def test_plain_tcp_client_is_refused_with_no_data(tls_server: RpcServer) -> None:
    client = await RpcClient.connect(tls_server.address, timeout_s=2)  # TCP connects...
    with pytest.raises(Unavailable):  # ...but the server's TLS layer drops the connection
        await client.call(Opcode.READ, {}, timeout_s=3)
    await client.close()


async def test_no_token_is_unauthenticated_and_gets_no_data(
        pki: Pki, tls_server: RpcServer) -> None:
    client = await RpcClient.connect(tls_server.address, ssl=client_context(tls_ca=str(pki.ca)))
    try:
        for _ in range(2):  # every request, not only the first, is refused
            with pytest.raises(Unauthenticated) as info:
                await client.call(Opcode.READ, {})
            # Says how to give a token, not the protocol's step.
            assert "--token-file" in info.value.message and "token=" in info.value.message
        assert not client.closed
    finally:
        await client.close()


async def test_wrong_token_is_refused_and_the_connection_closed(
        pki: Pki, tls_server: RpcServer) -> None:
    with pytest.raises(Unauthenticated):
        await RpcClient.connect(tls_server.address, ssl=client_context(tls_ca=str(pki.ca)),
                                token="not-the-token")
    # A raw client that ignores the refusal and keeps sending gets nothing more.
    client = await RpcClient.connect(tls_server.address, ssl=client_context(tls_ca=str(pki.ca)))
    with pytest.raises(Unauthenticated):
        await client.call(Opcode.AUTH, {"token": "x" * 10})
    with pytest.raises(Unavailable):
        await client.call(Opcode.READ, {}, timeout_s=3)
    await client.close()


async def test_member_certificate_authenticates_without_token(
        pki: Pki, tls_server: RpcServer) -> None:
    member = client_context(tls_ca=str(pki.ca), tls_cert=str(pki.server_cert),
                            tls_key=str(pki.server_key))
    pool = ConnectionPool(ssl=member)
    try:
        header, _ = await pool.call(tls_server.address, Opcode.READ, {})
        assert header == {"data": "the secret"}
    finally:
        await pool.close()


async def test_certificate_from_another_ca_is_refused(pki: Pki, tls_server: RpcServer) -> None:
    impostor = client_context(tls_ca=str(pki.ca), tls_cert=str(pki.other_cert),
                              tls_key=str(pki.other_key))
    with pytest.raises(Unavailable):
        client = await RpcClient.connect(tls_server.address, ssl=impostor, timeout_s=3)
        await client.call(Opcode.READ, {}, timeout_s=3)  # TLS 1.3: refusal after the handshake


async def test_client_refuses_a_server_from_another_ca(pki: Pki) -> None:
    ctx = server_context(SecurityConfig(tls_cert=str(pki.other_cert), tls_key=str(pki.other_key)))
    server = RpcServer({Opcode.READ: _secret}, ssl=ctx)
    await server.start(HOST, 0)
    try:
        with pytest.raises(Unavailable, match="CERTIFICATE_VERIFY_FAILED|certificate verify"):
            await RpcClient.connect(server.address, ssl=client_context(tls_ca=str(pki.ca)))
    finally:
        await server.close()


async def test_required_client_cert_refuses_token_only_clients(pki: Pki) -> None:
    server = RpcServer({Opcode.READ: _secret}, ssl=_server_ctx(pki, require_client_cert=True),
                       tokens=[TOKEN])
    await server.start(HOST, 0)
    try:
        with pytest.raises((Unavailable, Unauthenticated)):
            client = await RpcClient.connect(server.address, timeout_s=3, token=TOKEN,
                                             ssl=client_context(tls_ca=str(pki.ca)))
            await client.call(Opcode.READ, {}, timeout_s=3)
        with_cert = client_context(tls_ca=str(pki.ca), tls_cert=str(pki.client_cert),
                                   tls_key=str(pki.client_key))
        client = await RpcClient.connect(server.address, ssl=with_cert)
        assert (await client.call(Opcode.READ, {}))[0] == {"data": "the secret"}
        await client.close()
    finally:
        await server.close()


async def test_auth_on_an_open_server_is_accepted(pki: Pki) -> None:
    server = RpcServer({Opcode.READ: _secret})
    await server.start(HOST, 0)
    try:
        client = await RpcClient.connect(server.address, token="anything")
        assert (await client.call(Opcode.READ, {}))[0] == {"data": "the secret"}
        await client.close()
    finally:
        await server.close()


# --- a real cluster: 3 PD nodes and 2 range servers, TLS only, tokens for clients ----------


@dataclass
class SecureCluster:
    pki: Pki
    pd: str  # RPC addresses, comma-separated
    http: list[str]
    servers: list[str]
    processes: list[ManagedProcess]
    token_file: Path


def _https(url: str, pki: Pki, method: str = "GET", body: Any = None,
           token: str | None = None) -> tuple[int, Any]:
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    context = client_context(tls_ca=str(pki.ca))
    try:
        with urllib.request.urlopen(request, timeout=5, context=context) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def _wait_for(condition: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise TimeoutError(f"{what} within {timeout_s}s")


@pytest.fixture(scope="module")
def cluster(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    root = tmp_path_factory.mktemp("secure")
    token_file = root / "tokens"
    token_file.write_text(f"# first line: the members' cluster token\n{CLUSTER_TOKEN}\n{TOKEN}\n")
    # PD nodes take their security settings from the environment (flag > env > TOML).
    env = {"ESTREAM_TLS_CERT": str(pki.server_cert), "ESTREAM_TLS_KEY": str(pki.server_key),
           "ESTREAM_TLS_CA": str(pki.ca), "ESTREAM_TOKEN_FILE": str(token_file),
           "ESTREAM_PD_PASSWORD": "raft-shared-secret"}
    with start_pd_cluster(root, n=3, host=HOST, env=env, tls_ca=pki.ca) as pd_cluster:
        processes: list[ManagedProcess] = []
        try:
            # Range servers take theirs from flags.
            flags = ["--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key),
                     "--tls-ca", str(pki.ca), "--token-file", str(token_file)]
            servers = []
            for i in range(2):
                process, address = start_rangeserver(root / f"rs{i}", HOST,
                                                     pd_cluster.rpc_addresses, extra_args=flags)
                processes.append(process)
                servers.append(address)

            def registered() -> bool:
                status, body = _https(pd_cluster.http_urls[0] + "/v1/rangeservers", pki)
                return status == 200 and sum(s["alive"] for s in body["rangeservers"]) == 2

            _wait_for(registered, 30, "range servers did not register over mutual TLS")
            yield SecureCluster(pki, pd_cluster.rpc_addresses, pd_cluster.http_urls, servers,
                                processes, token_file)
        finally:
            for process in processes:
                process.stop()


async def test_sdk_with_ca_and_token_appends_and_reads(cluster: SecureCluster) -> None:
    async with await estream.connect(cluster.pd, tls_ca=str(cluster.pki.ca),
                                     token=TOKEN) as client:
        await client.create_stream("secure", replicas=2, ack_count=2)
        async with await client.open_writer("secure") as writer:
            offsets = [await writer.append(f"r{i}".encode()) for i in range(5)]
        assert offsets == list(range(5))
        values = [r.value async for r in client.read("secure", 0, 5)]
        assert values == [f"r{i}".encode() for i in range(5)]
        assert {s.address for s in await client.list_servers()} == set(cluster.servers)


async def test_client_without_tls_is_refused(cluster: SecureCluster) -> None:
    with pytest.raises(Unavailable):
        await estream.connect(cluster.pd, timeout_s=1.5, token=TOKEN)
    client = await RpcClient.connect(cluster.servers[0])
    with pytest.raises(Unavailable):
        await client.call(Opcode.LIST_RANGES, {}, timeout_s=3)
    await client.close()


async def test_client_without_or_with_a_wrong_token_gets_unauthenticated(
        cluster: SecureCluster) -> None:
    ca = str(cluster.pki.ca)
    with pytest.raises(Unauthenticated):
        await estream.connect(cluster.pd, tls_ca=ca, timeout_s=3)
    with pytest.raises(Unauthenticated):
        await estream.connect(cluster.pd, tls_ca=ca, token="wrong", timeout_s=3)
    client = await RpcClient.connect(cluster.servers[0], ssl=client_context(tls_ca=ca))
    try:
        with pytest.raises(Unauthenticated):  # no ranges, no data
            await client.call(Opcode.LIST_RANGES, {})
        with pytest.raises(Unauthenticated):
            await client.call(Opcode.READ, {"stream_id": 1, "range_index": 0, "offset": 0})
    finally:
        await client.close()


async def test_members_authenticate_by_certificate_and_other_cas_are_refused(
        cluster: SecureCluster) -> None:
    pki = cluster.pki
    member = client_context(tls_ca=str(pki.ca), tls_cert=str(pki.server_cert),
                            tls_key=str(pki.server_key))
    async with PDClient(cluster.pd, ssl=member, timeout_s=5) as pd:  # no token
        assert len(await pd.list_servers()) == 2
    impostor = client_context(tls_ca=str(pki.ca), tls_cert=str(pki.other_cert),
                              tls_key=str(pki.other_key))
    for address in [cluster.pd.split(",")[0], cluster.servers[0]]:
        with pytest.raises(Unavailable):
            client = await RpcClient.connect(address, ssl=impostor, timeout_s=3)
            await client.call(Opcode.PD_REGISTER_SERVER, {"server_id": "evil", "address":
                              "127.0.0.9:1", "storage_class": "ssd"}, timeout_s=3)
    async with PDClient(cluster.pd, ssl=member) as pd:
        assert "evil" not in {s.id for s in await pd.list_servers()}


def test_admin_api_reads_are_open_writes_need_the_token(cluster: SecureCluster) -> None:
    url = cluster.http[1]
    pki = cluster.pki
    assert _https(url + "/v1/streams", pki)[0] == 200
    status, body = _https(url + "/v1/streams", pki, "POST", {"name": "admin-made"})
    assert status == 401 and body["error"]["code"] == "UNAUTHENTICATED"
    status, body = _https(url + "/v1/streams", pki, "POST", {"name": "admin-made"}, token="bad")
    assert status == 401 and body["error"]["code"] == "UNAUTHENTICATED"
    status, body = _https(url + "/v1/streams/admin-made", pki, "DELETE")
    assert status == 401
    status, body = _https(url + "/v1/streams", pki, "POST",
                          {"name": "admin-made", "replicas": 2}, token=TOKEN)
    assert status == 201 and body["name"] == "admin-made"
    made = body["id"]
    status, body = _https(url + "/v1/streams/admin-made", pki, "DELETE", token=TOKEN)
    assert status == 200 and body == {"deleted": "admin-made", "id": made}
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP: refused
        urllib.request.urlopen(url.replace("https", "http") + "/v1/streams", timeout=5)


def test_cli_uses_env_ca_and_token(cluster: SecureCluster) -> None:
    import subprocess

    env = {**os.environ, "ESTREAM_PD": cluster.pd, "ESTREAM_TLS_CA": str(cluster.pki.ca)}
    env.pop("ESTREAM_TOKEN", None)
    refused = subprocess.run([*ESTREAM, "stream", "list"], env=env, capture_output=True,
                             text=True, timeout=30)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr
    assert "ESTREAM_TOKEN" in refused.stderr
    env["ESTREAM_TOKEN"] = TOKEN
    ok = subprocess.run([*ESTREAM, "stream", "create", "from-cli", "--replicas", "2"], env=env,
                        capture_output=True, text=True, timeout=30)
    assert ok.returncode == 0, ok.stderr


# --- the Raft port: pysyncobj's shared secret ------------------------------------------------


def _raft_pair(tmp_path: Path, passwords: tuple[str, str]) -> list[RaftNode]:
    addresses = [f"{HOST}:{free_port(HOST)}" for _ in range(2)]
    return [RaftNode(addresses[i], [addresses[1 - i]], tmp_path / f"raft{i}",
                     password=passwords[i], new_cluster=True) for i in range(2)]


async def _leader_within(nodes: list[RaftNode], timeout_s: float) -> str | None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        leaders = {node.leader() for node in nodes} - {None}
        if leaders:
            return leaders.pop()
        await asyncio.sleep(0.05)
    return None


async def test_raft_peers_with_different_passwords_never_form_a_cluster(tmp_path: Path) -> None:
    strangers = _raft_pair(tmp_path / "strangers", ("alpha-secret", "beta-secret"))
    friends = _raft_pair(tmp_path / "friends", ("shared-secret", "shared-secret"))
    try:
        started = time.monotonic()
        for node in [*strangers, *friends]:
            node.start()
        assert await _leader_within(friends, 8.0) is not None  # the control group
        # At least 3 s (2+ election timeouts of at most 1.2 s) without a leader.
        waited = time.monotonic() - started
        assert await _leader_within(strangers, max(0.5, 3.0 - waited)) is None
        assert all(node.status().role != "leader" for node in strangers)
    finally:
        for node in [*strangers, *friends]:
            await asyncio.to_thread(node.close)


async def test_raw_pickle_sent_to_the_raft_port_executes_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "owned"

    class Evil:
        def __reduce__(self) -> tuple[object, tuple[str, str]]:
            return (open, (str(marker), "w"))

    address = f"{HOST}:{free_port(HOST)}"
    node = RaftNode(address, [], tmp_path / "raft", password="the-cluster-secret")
    node.start()
    try:
        await _leader_within([node], 8.0)
        evil = pickle.dumps({"type": "append_entries", "entries": [Evil()]}, 2)
        compressed = zlib.compress(evil)
        for data in (evil, compressed, struct.pack("i", len(evil)) + evil,
                     struct.pack("i", len(compressed)) + compressed):
            with socket.create_connection(("127.0.0.1", int(address.rsplit(":", 1)[1])), 2) as s:
                s.sendall(data)
                s.settimeout(1.0)
                with contextlib.suppress(OSError):
                    s.recv(1024)  # the node drops the connection (or stays silent)
        assert not marker.exists()
        served = await node.propose(RegisterServer("rs-after", "127.0.0.1:1", "ssd"))
        assert served is not None and not marker.exists()
    finally:
        await asyncio.to_thread(node.close)


# In `make chaos` (the suite's 25-minute budget): Spark and TLS each run in make test.
@pytest.mark.slow
def test_spark_reads_and_writes_a_tls_and_token_cluster(
    cluster: SecureCluster, tmp_path: Path, spark: Any
) -> None:
    """The Spark connector's tlsCa / tokenFile options, through real Spark (local[2]):
    a batch read and an exactly-once streaming copy into another stream; without the
    token the query fails with the cluster's refusal."""
    token_file = tmp_path / "spark-token"
    token_file.write_text(TOKEN + "\n")
    secure = {"pd": cluster.pd, "tlsCa": str(cluster.pki.ca), "tokenFile": str(token_file)}

    async def fill() -> None:
        async with await estream.connect(cluster.pd, tls_ca=str(cluster.pki.ca),
                                         token=TOKEN) as client:
            await client.create_stream("spark-in", replicas=2, ack_count=2)
            await client.create_stream("spark-out", replicas=2, ack_count=2)
            async with await client.open_writer("spark-in") as writer:
                await writer.append_batch([b"v%d" % i for i in range(30)])

    asyncio.run(fill())
    rows = spark.read.format("estream").options(**secure, streams="spark-in").load().collect()
    assert sorted(r.value for r in rows) == sorted(b"v%d" % i for i in range(30))

    query = (spark.readStream.format("estream").options(**secure, streams="spark-in")
             .option("startingOffsets", "earliest").load().select("value")
             .writeStream.format("estream").options(**secure, stream="spark-out")
             .option("checkpointLocation", str(tmp_path / "ckpt"))
             .trigger(availableNow=True).start())
    assert query.awaitTermination(120) and query.exception() is None

    async def copied() -> list[bytes]:
        async with await estream.connect(cluster.pd, tls_ca=str(cluster.pki.ca),
                                         token=TOKEN) as client:
            return [r.value async for r in client.read("spark-out", 0, 30)]

    assert sorted(asyncio.run(copied())) == sorted(b"v%d" % i for i in range(30))

    no_token = {k: v for k, v in secure.items() if k != "tokenFile"}
    with pytest.raises(Exception, match="Unauthenticated|not authenticated|bad token"):
        spark.read.format("estream").options(**no_token, streams="spark-in").load().collect()
