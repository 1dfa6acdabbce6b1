"""Member opcodes need the cluster secret (issue 28): no client can take a range server's
place, mark one dead, or make one drop its replicas.

A real cluster (3 PD nodes, 3 range servers, as processes) started with the cluster secret,
as ``estream up`` runs one: its range servers registered and heartbeat by proving it. A
client without the secret sends exactly what the issue's impersonation sent: PD's
register-server opcode with a live server's id and an address of its own, a heartbeat of an
unknown id at a live server's address, DROP_RANGE and LIST_RANGES to a range server, and a
replica update. Each is refused with ``Unauthenticated`` and changes nothing. And PD, which
holds the secret, reclaims replicas on the range servers (LIST_RANGES, DROP_RANGE) with it.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.net.pdclient import PDClient
from estream.net.rpc import ConnectionPool, RpcClient
from estream.wire import limits
from estream.wire.errors import Unauthenticated
from estream.wire.protocol import Opcode

SECRET = b"the member credential of this test cluster"
pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=3, secret=SECRET)]

REFUSAL = "member opcode: needs the cluster secret"
IMPOSTOR_ADDRESS = "127.0.0.1:9"  # the "address of its own"
reclaimed_within_s = limits.reclaim_interval_ms / 1000 * 2 + 5  # as test_reclaim.py


async def servers_seen_by(node: str) -> dict[str, dict[str, Any]]:
    """Node ``node``'s own view of the range servers (its liveness): id -> server."""
    client = await RpcClient.connect(node)
    try:
        answer, _ = await client.call(Opcode.PD_LIST_SERVERS, {})
    finally:
        await client.close()
    return {s["id"]: s for s in answer["servers"]}


def pd_nodes(cluster: Cluster) -> list[str]:
    return cluster.pd_addresses.split(",")


async def test_registering_a_live_servers_id_at_another_address_is_refused(
    cluster: Cluster,
) -> None:
    victim = cluster.servers[0]
    before = await servers_seen_by(pd_nodes(cluster)[0])
    assert before[victim.server_id]["address"] == victim.address
    client = PDClient(cluster.pd_addresses)
    try:
        with pytest.raises(Unauthenticated, match=REFUSAL):
            await client.register_server(victim.server_id, IMPOSTOR_ADDRESS)
        with pytest.raises(Unauthenticated, match=REFUSAL):
            await client.register_server("impostor-new-id", IMPOSTOR_ADDRESS)
    finally:
        await client.close()
    for node in pd_nodes(cluster):
        after = await servers_seen_by(node)
        assert after[victim.server_id]["address"] == victim.address, node
        assert after[victim.server_id]["alive"] is True, node
        assert "impostor-new-id" not in after, node


async def test_a_heartbeat_at_a_live_servers_address_is_refused_and_it_stays_alive(
    cluster: Cluster,
) -> None:
    victim = cluster.servers[1]
    for node in pd_nodes(cluster):
        client = await RpcClient.connect(node)
        try:
            with pytest.raises(Unauthenticated, match=REFUSAL):
                await client.call(Opcode.PD_HEARTBEAT, {
                    "server_id": "impostor-unknown-id", "address": victim.address,
                    "load": {}})
        finally:
            await client.close()
        # Before the victim's next heartbeat could mend it: the impostor's beat (had it
        # been taken) superseded the victim at once on this node.
        seen = await servers_seen_by(node)
        assert seen[victim.server_id]["alive"] is True, node
        assert "impostor-unknown-id" not in seen, node


async def test_drop_and_list_ranges_from_a_client_are_refused_and_the_replica_stays(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("kept-by-its-servers", replicas=3, ack_count=2)
        async with await client.open_writer("kept-by-its-servers") as writer:
            await writer.append_batch([b"record-%d" % i for i in range(10)])
        described = await client.describe_stream("kept-by-its-servers")
        replicas = described.ranges[0].replicas
        for replica in replicas:
            rpc = await RpcClient.connect(replica.address)
            try:
                with pytest.raises(Unauthenticated, match=REFUSAL):
                    await rpc.call(Opcode.DROP_RANGE, {
                        "stream_id": meta.id, "range_index": 0, "server_id": replica.id})
                with pytest.raises(Unauthenticated, match=REFUSAL):
                    await rpc.call(Opcode.LIST_RANGES, {})
                # The refusal answered that request only: the connection still serves.
                state, _ = await rpc.call(Opcode.DESCRIBE_RANGE, {
                    "stream_id": meta.id, "range_index": 0})
                assert state
            finally:
                await rpc.close()
        values = [r.value async for r in client.read("kept-by-its-servers")]
        assert values == [b"record-%d" % i for i in range(10)]
    members = ConnectionPool(member_secret=SECRET)
    try:
        for replica in replicas:
            listing, _ = await members.call(replica.address, Opcode.LIST_RANGES, {})
            held = {(r["stream_id"], r["range_index"]) for r in listing["ranges"]}
            assert (meta.id, 0) in held, replica
    finally:
        await members.close()


async def test_a_replica_update_from_a_client_is_refused(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("replicas-unchanged", replicas=3, ack_count=2)
        before = (await client.describe_stream("replicas-unchanged")).ranges[0].replicas
    pd = PDClient(cluster.pd_addresses)
    try:
        with pytest.raises(Unauthenticated, match=REFUSAL):
            await pd.update_replicas("replicas-unchanged", 0, [before[0].id])
        after = (await pd.describe_stream("replicas-unchanged")).ranges[0].replicas
    finally:
        await pd.close()
    assert after == before


async def test_a_wrong_secret_is_refused_and_the_connection_closed(cluster: Cluster) -> None:
    for address in (pd_nodes(cluster)[0], cluster.servers[0].address):
        with pytest.raises(Unauthenticated, match="bad member proof"):
            await RpcClient.connect(address, member_secret=b"not the cluster secret")


async def test_a_member_with_the_secret_registers_and_heartbeats(cluster: Cluster) -> None:
    pool = ConnectionPool(member_secret=SECRET)
    client = PDClient(cluster.pd_addresses, pool=pool)
    try:
        server = await client.register_server("member-test-server", "127.0.0.1:19")
        assert server.address == "127.0.0.1:19"
        for _ in range(100):  # a follower may apply the registration a moment later
            answered, registered = await client.heartbeat("member-test-server",
                                                          "127.0.0.1:19", {})
            assert answered == 3
            if registered == 3:
                break
            await asyncio.sleep(0.1)
        assert registered == 3
        for node in pd_nodes(cluster):
            assert (await servers_seen_by(node))["member-test-server"]["alive"] is True
    finally:
        await client.close()
        await pool.close()


async def test_pd_reclaims_a_deleted_streams_replicas_as_a_member(cluster: Cluster) -> None:
    """PD's reclaimer lists and drops replicas with the member credential: a deleted
    stream's replicas go within two reclaim rounds, as without a secret
    (tests/integration/test_reclaim.py)."""
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("reclaimed-by-a-member", replicas=3, ack_count=2)
        async with await client.open_writer("reclaimed-by-a-member") as writer:
            await writer.append_batch([b"record-%d" % i for i in range(10)])
        await client.delete_stream("reclaimed-by-a-member")
    members = ConnectionPool(member_secret=SECRET)
    held: dict[str, bool] = {}
    try:
        deadline = time.monotonic() + reclaimed_within_s
        while time.monotonic() < deadline:
            for server in cluster.servers:
                listing, _ = await members.call(server.address, Opcode.LIST_RANGES, {})
                held[server.address] = any(r["stream_id"] == meta.id
                                           for r in listing["ranges"])
            if not any(held.values()):
                return
            await asyncio.sleep(0.2)
    finally:
        await members.close()
    pytest.fail(f"stream {meta.id}'s replicas still held {reclaimed_within_s}s after its "
                f"delete: {held}")
