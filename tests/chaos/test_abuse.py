"""Raw-socket abuse of every port of a real cluster, which must stay correct afterwards.

Ports: a range server's RPC port, a PD node's RPC, HTTP and Raft ports. Abuse (with the
pieces in :mod:`tests.chaos.hostile`, which the nemesis's hostile client uses too): random
bytes, a 2 GiB length prefix, half-open connections (a partial request, then the write side
shut), many idle connections held open while the cluster serves, and slowloris (a byte a
second for a few seconds, on every port at once). Afterwards every process is
alive, a range server appends and reads back, and PD creates and describes a stream
through every node.
"""

from __future__ import annotations

import asyncio
import random
import struct
import time

import pytest

from estream.net.pdclient import PDClient
from estream.net.rpc import RpcClient
from estream.wire.protocol import Opcode, encode_frame_bytes
from estream.wire.record import Record, decode_batch, encode_batch, iter_batches
from tests.chaos.harness import ChaosCluster
from tests.chaos.hostile import FRAME_MAGIC, announced_prefix, exchange, trickle

pytestmark = [pytest.mark.integration, pytest.mark.cluster(chaos=True, range_servers=3)]

idle_connections = 40
slowloris_bytes = 4


def ports(c: ChaosCluster) -> dict[str, str]:
    pd = c.pd_cluster.nodes[0]
    return {"rangeserver-rpc": c.servers[0].address, "pd-rpc": pd.rpc, "pd-http": pd.http,
            "pd-raft": pd.raft}


def two_gib_prefix(kind: str) -> bytes:
    return announced_prefix(kind, 2**31)


async def still_correct(c: ChaosCluster, tag: str) -> None:
    """Every process alive; a range server appends and reads back; PD works via every node."""
    dead = [n.id for n in c.pd_cluster.nodes if not n.alive()]
    dead += [rs.address for rs in c.servers if not rs.alive()]
    assert not dead, f"processes died: {dead}"
    stream_id = random.Random(tag).randrange(1_000, 2**40)
    client = await RpcClient.connect(c.servers[0].address)
    try:
        await client.call(Opcode.CREATE_RANGE, {"stream_id": stream_id, "range_index": 0,
                                                "start": 0, "epoch": 1})
        records = [Record(f"{tag}-{i}".encode(), {}, 1) for i in range(3)]
        batch = encode_batch(records, stream_id=stream_id, range_index=0, epoch=1,
                             base_offset=0)
        header, _ = await client.call(Opcode.APPEND, {}, batch)
        assert header["end"] == 3
        _, payload = await client.call(Opcode.READ, {
            "stream_id": stream_id, "range_index": 0, "offset": 0, "max_bytes": 1 << 16,
            "wait_ms": 0, "unconfirmed": True})
        values = [r.value for _, raw in iter_batches(payload) for r in decode_batch(raw).records]
        assert values == [r.value for r in records]
    finally:
        await client.close()
    for i, node in enumerate(c.pd_cluster.nodes):
        async with PDClient(node.rpc, timeout_s=10) as pd:
            name = f"{tag}-{i}"
            created = await pd.create_stream(name, replicas=3, ack_count=2)
            assert (await pd.describe_stream(name)).id == created.id


@pytest.mark.parametrize("kind", ["rangeserver-rpc", "pd-rpc", "pd-http", "pd-raft"])
async def test_random_bytes(cluster: ChaosCluster, kind: str) -> None:
    rng = random.Random(kind)
    address = ports(cluster)[kind]
    for size in (1, 17, 18, 100, 4096, 70_000):
        await exchange(address, rng.randbytes(size))
    # Random bytes behind a valid frame magic: the decoder reads further.
    await exchange(address, struct.pack("<H", FRAME_MAGIC) + rng.randbytes(40))
    await still_correct(cluster, f"random-{kind}")


@pytest.mark.parametrize("kind", ["rangeserver-rpc", "pd-rpc", "pd-http", "pd-raft"])
async def test_two_gib_length_prefix(cluster: ChaosCluster, kind: str) -> None:
    address = ports(cluster)[kind]
    answer = await exchange(address, two_gib_prefix(kind), half_close=False)
    if kind.endswith("rpc"):
        assert answer[:2] == struct.pack("<H", FRAME_MAGIC), "a bad prefix gets an error frame"
    if kind == "pd-http":
        # aiohttp reads the body up to its 1 MiB limit, then refuses.
        assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    await still_correct(cluster, f"twogib-{kind}")


@pytest.mark.parametrize("kind", ["rangeserver-rpc", "pd-rpc", "pd-http", "pd-raft"])
async def test_half_open_connections(cluster: ChaosCluster, kind: str) -> None:
    address = ports(cluster)[kind]
    partial = {
        "pd-http": b"GET /v1/streams HTTP/1.1\r\nHost: 127.0.0.1\r\n",
        "pd-raft": b"\x00\x00",
    }.get(kind, encode_frame_bytes(Opcode.PING, 1, {})[:10])
    await asyncio.gather(*(exchange(address, partial) for _ in range(10)))
    await still_correct(cluster, f"halfopen-{kind}")


async def test_idle_connections_while_serving(cluster: ChaosCluster) -> None:
    held = []
    for address in ports(cluster).values():
        host, _, port = address.rpartition(":")
        for _ in range(idle_connections // 4):
            held.append(await asyncio.open_connection(host, int(port)))
    try:
        await still_correct(cluster, "idle")
    finally:
        for _, writer in held:
            writer.close()


async def slowloris(address: str, data: bytes) -> None:
    await trickle(address, data, count=slowloris_bytes)  # a byte a second


async def test_slowloris_on_every_port_while_serving(cluster: ChaosCluster) -> None:
    requests = {
        "rangeserver-rpc": encode_frame_bytes(Opcode.PING, 1, {}),
        "pd-rpc": encode_frame_bytes(Opcode.PD_CLUSTER, 1, {}),
        "pd-http": b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
        "pd-raft": b"\x00\x00\x00\x10abcdefghijklmnop",
    }
    lorises = [asyncio.ensure_future(slowloris(address, requests[kind]))
               for kind, address in ports(cluster).items() for _ in range(5)]
    try:
        started = time.monotonic()
        await still_correct(cluster, "slowloris")
        assert time.monotonic() - started < slowloris_bytes, "served while the lorises crawl"
    finally:
        await asyncio.gather(*lorises, return_exceptions=True)
    await still_correct(cluster, "after-slowloris")
