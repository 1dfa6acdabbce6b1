"""Token roles on every port (issue 28): a read token only reads, a client token writes but
cannot delete, trim, drain or forget, an admin token can, and member opcodes stay with
members. RPC (SDK) and the admin API.

A real cluster (3 PD nodes, 3 range servers, as processes) whose PD nodes and range
servers share one token file with a token of each role, and the cluster secret.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.devcluster.cluster import Cluster, start_cluster
from estream.net.pdclient import PDClient
from estream.net.rangerequests import RangeClient
from estream.net.security import load_role_token_file, load_token_file
from estream.wire.errors import InvalidArgument, Unauthenticated

pytestmark = [pytest.mark.integration]

READ, CLIENT, ADMIN, MEMBER = "read-t0ken", "client-t0ken", "admin-t0ken", "member-t0ken"
GATEWAY = "gateway-t0ken"
DENIED = "permission denied"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("roles")
    tokens = root / "tokens"
    tokens.write_text(f"member:{MEMBER}\nread:{READ}\nclient:{CLIENT}\nadmin:{ADMIN}\n"
                      f"gateway:{GATEWAY}\n")
    flags = ["--token-file", str(tokens)]
    with start_cluster(root / "cluster", pd_nodes=3, range_servers=3, pd_args=flags,
                       rangeserver_args=list(flags), secret=b"roles test secret") as running:
        yield running


def http(cluster: Cluster, method: str, path: str, body: Any = None,
         token: str | None = None) -> tuple[int, Any]:
    """One admin-API request to the first PD node, with ``token`` as its bearer."""
    url = cluster.pd.http_urls[0] + path
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


async def test_a_read_token_reads_and_nothing_else(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses, token=CLIENT) as client:
        await client.create_stream("read-only-view", replicas=3, ack_count=2)
        async with await client.open_writer("read-only-view") as writer:
            await writer.append_batch([b"a", b"b"])
    async with await estream.connect(cluster.pd_addresses, token=READ) as reader:
        assert "read-only-view" in [s.name for s in await reader.list_streams()]
        assert [r.value async for r in reader.read("read-only-view")] == [b"a", b"b"]
        with pytest.raises(Unauthenticated, match=DENIED):
            await reader.create_stream("not-by-a-reader")
        with pytest.raises(Unauthenticated, match=DENIED):
            await reader.commit_cursor("read-only-view", "g", 1)
        with pytest.raises(Unauthenticated, match=DENIED):
            await reader.delete_stream("read-only-view")
        # On the connection its reads went over (READ let, and remembered as let), a range
        # server refuses a SEAL every time it is asked, not only the first.
        meta = await reader.stream_meta("read-only-view")
        replica = meta.ranges[-1].replicas[0]
        servers = RangeClient(reader.pool)
        for _ in range(2):
            with pytest.raises(Unauthenticated, match=DENIED):
                await servers.seal(replica.address, server_id=replica.id, stream_id=meta.id,
                                   range_index=meta.ranges[-1].index, epoch=99, end=None)
        names = [s.name for s in await reader.list_streams()]
    assert "not-by-a-reader" not in names and "read-only-view" in names


async def test_a_client_token_writes_but_cannot_delete_or_trim(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses, token=CLIENT) as client:
        await client.create_stream("client-owned", replicas=3, ack_count=2)
        async with await client.open_writer("client-owned") as writer:
            await writer.append_batch([b"x%d" % i for i in range(4)])
        await client.commit_cursor("client-owned", "g", 2)
        with pytest.raises(Unauthenticated, match=DENIED):
            await client.delete_stream("client-owned")
        with pytest.raises(Unauthenticated, match=DENIED):
            await client.trim("client-owned", 2)
        assert [r.value async for r in client.read("client-owned")] == [
            b"x0", b"x1", b"x2", b"x3"]
    async with await estream.connect(cluster.pd_addresses, token=ADMIN) as admin:
        await admin.trim("client-owned", 2)
        await admin.delete_stream("client-owned")
        assert "client-owned" not in [s.name for s in await admin.list_streams()]


async def test_member_opcodes_need_the_secret_whatever_the_token(cluster: Cluster) -> None:
    victim = cluster.servers[0]
    for token in (ADMIN, MEMBER):
        pd = PDClient(cluster.pd_addresses, token=token)
        try:
            with pytest.raises(Unauthenticated, match="needs the cluster secret"):
                await pd.register_server(victim.server_id, "127.0.0.1:9")
        finally:
            await pd.close()
    status, body = http(cluster, "GET", f"/v1/rangeservers/{victim.server_id}", token=READ)
    assert status == 200 and body["address"] == victim.address


async def test_only_a_gateway_stamps_kafka_producer_ids(cluster: Cluster) -> None:
    """A client token may write a stream but not stamp its batches in the Kafka gateways'
    producer namespace (a Kafka producer's state, docs/KAFKA.md): refused naming
    producer_id, nothing stored, the servers keep serving; a gateway token may."""
    async with await estream.connect(cluster.pd_addresses, token=CLIENT) as client:
        with pytest.raises(InvalidArgument, match="__kafka/") as early:
            await client.open_writer("no-such-stream", producer_id="__kafka/7/0")  # no I/O
        assert early.value.fields["argument"] == "producer_id"
        await client.create_stream("stamps", replicas=3, ack_count=2)
        async with await client.open_writer("stamps") as writer:
            with pytest.raises(InvalidArgument, match="gateway") as refused:
                await writer.append(b"forged", stamp="__kafka/7/0", sequence=5)
            assert refused.value.fields["argument"] == "producer_id"
        async with await client.open_writer("stamps") as writer:
            assert await writer.append(b"plain") == 0
        assert [r.value async for r in client.read("stamps")] == [b"plain"]
    async with await estream.connect(cluster.pd_addresses, token=GATEWAY) as gateway:
        async with await gateway.open_writer("stamps") as writer:
            assert await writer.append(b"stamped", stamp="__kafka/7/0", sequence=5) == 1
        assert [r.value async for r in gateway.read("stamps")] == [b"plain", b"stamped"]


def test_admin_api_roles(cluster: Cluster) -> None:
    status, _ = http(cluster, "POST", "/v1/streams", {"name": "http-by-reader"}, token=READ)
    assert status == 403
    status, body = http(cluster, "POST", "/v1/streams", {"name": "http-owned"}, token=CLIENT)
    assert status in (200, 201), body
    status, body = http(cluster, "DELETE", "/v1/streams/http-owned", token=CLIENT)
    assert status == 403 and body["error"]["code"] == "PERMISSION_DENIED"
    status, _ = http(cluster, "POST", "/v1/streams/http-owned/trim", {"start_offset": 0},
                     token=CLIENT)
    assert status == 403
    server_id = cluster.servers[1].server_id
    for path in (f"/v1/rangeservers/{server_id}/drain", f"/v1/rangeservers/{server_id}/forget"):
        status, _ = http(cluster, "POST", path, token=CLIENT)
        assert status == 403, path
    status, body = http(cluster, "GET", f"/v1/rangeservers/{server_id}")
    assert status == 200 and body["state"] == "active"  # reads stay open; nothing drained
    status, _ = http(cluster, "DELETE", "/v1/streams/http-owned", token=ADMIN)
    assert status == 200
    status, _ = http(cluster, "GET", "/v1/streams/http-owned")
    assert status == 404
    status, _ = http(cluster, "POST", "/v1/streams", {"name": "nobody"}, token="wrong")
    assert status == 401


def test_estream_certs_makes_a_token_of_a_role(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    from estream.devcluster.certs import main as certs

    assert certs([str(tmp_path), "--role", "read"]) == 0
    assert "read token: ESTREAM_TOKEN_FILE=" in capsys.readouterr().out
    line = (tmp_path / "read-token").read_text()
    assert line.startswith("read:") and (tmp_path / "read-token").stat().st_mode & 0o777 == 0o600
    servers = load_role_token_file(tmp_path / "token")
    assert servers[0][0] == "all"  # the cluster token made with the certificates: every role
    assert ("read", line.strip().removeprefix("read:")) in servers
    assert load_token_file(tmp_path / "read-token") == (line.strip().removeprefix("read:"),)
    assert certs([str(tmp_path), "--role", "read"]) == 0  # kept, not made again
    assert (tmp_path / "read-token").read_text() == line
    assert len(load_role_token_file(tmp_path / "token")) == 2
    assert certs([str(tmp_path), "--role", "admin"]) == 0
    assert [r for r, _ in load_role_token_file(tmp_path / "token")] == ["all", "read", "admin"]
