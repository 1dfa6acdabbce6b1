"""The fault proxy (tests/harness/faultproxy.py) in front of a real range server.

The server listens on its own port and advertises the proxy's address; every request here
goes through the proxy. A dropped SEAL answer: the client gets Timeout while the server did
seal. A partition: every request times out, and the connection stays open; heal: the held
requests are served and new ones work. Delays keep order; a reset closes the connection;
frames are counted by opcode and direction, and a test can wait for a count.
"""

from __future__ import annotations

import asyncio
import gc
import os
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from estream.devcluster.cluster import Cluster
from estream.devcluster.process import ManagedProcess
from estream.net.rpc import RpcClient
from estream.wire.errors import RangeSealed, Timeout, Unavailable
from estream.wire.protocol import Opcode
from estream.wire.record import Record, encode_batch
from tests.harness.faultproxy import FaultProxy, rangeserver_behind, start_fault_proxy
from tests.harness.walfiles import damage_replica

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=3, proxy=start_fault_proxy)]

STREAM = 41
short_timeout_s = 0.5


@dataclass
class Proxied:
    proxy: FaultProxy
    server: ManagedProcess
    listen: str


@pytest.fixture
def proxied(tmp_path: Path) -> Iterator[Proxied]:
    with rangeserver_behind(start_fault_proxy, tmp_path / "rs") as (proxy, server, listen):
        yield Proxied(proxy, server, listen)


def batch(base: int, n: int = 1, epoch: int = 1) -> bytes:
    return encode_batch([Record(b"v%d" % (base + i), {}, 1) for i in range(n)],
                        stream_id=STREAM, range_index=0, epoch=epoch, base_offset=base)


async def create_and_fill(client: RpcClient, count: int) -> None:
    await client.call(Opcode.CREATE_RANGE,
                      {"stream_id": STREAM, "range_index": 0, "start": 0, "epoch": 1})
    for i in range(count):
        await client.call(Opcode.APPEND, {}, batch(i))


async def describe(client: RpcClient) -> dict[str, object]:
    header, _ = await client.call(Opcode.DESCRIBE_RANGE,
                                  {"stream_id": STREAM, "range_index": 0})
    return dict(header)


async def test_server_advertises_the_proxy(proxied: Proxied) -> None:
    assert proxied.proxy.address != proxied.listen
    client = await RpcClient.connect(proxied.proxy.address)
    try:
        header, _ = await client.call(Opcode.PING)
        assert header["address"] == proxied.proxy.address
        assert proxied.proxy.passed(Opcode.PING, "request") == 1
        assert proxied.proxy.passed(Opcode.PING, "answer") == 1
    finally:
        await client.close()


async def test_dropped_seal_answer_times_out_but_the_server_sealed(proxied: Proxied) -> None:
    proxy = proxied.proxy
    client = await RpcClient.connect(proxy.address)
    try:
        await create_and_fill(client, 3)
        proxy.drop(Opcode.SEAL, "answer", count=1)
        with pytest.raises(Timeout):
            await client.call(Opcode.SEAL, {"stream_id": STREAM, "range_index": 0,
                                            "epoch": 1, "end": 3}, timeout_s=short_timeout_s)
        assert proxy.seen(Opcode.SEAL, "answer") == 1  # the server did answer
        assert proxy.dropped(Opcode.SEAL, "answer") == 1
        assert proxy.passed(Opcode.SEAL, "answer") == 0
        d = await describe(client)  # the same connection still works: one frame was lost
        assert (d["sealed"], d["sealed_end"]) == (True, 3)
        with pytest.raises(RangeSealed):
            await client.call(Opcode.APPEND, {}, batch(3))
    finally:
        await client.close()


async def test_partition_times_out_every_request_and_heal_restores(proxied: Proxied) -> None:
    proxy = proxied.proxy
    client = await RpcClient.connect(proxy.address)
    try:
        await create_and_fill(client, 2)
        proxy.partition()
        assert proxy.partitioned
        for opcode, header in [(Opcode.PING, {}),
                               (Opcode.DESCRIBE_RANGE, {"stream_id": STREAM, "range_index": 0})]:
            with pytest.raises(Timeout):
                await client.call(opcode, header, timeout_s=short_timeout_s)
        with pytest.raises(Timeout):
            await client.call(Opcode.APPEND, {}, batch(2), timeout_s=short_timeout_s)
        fresh = await RpcClient.connect(proxy.address)  # a new connection is accepted...
        try:
            with pytest.raises(Timeout):  # ...and hangs as well
                await fresh.call(Opcode.PING, timeout_s=short_timeout_s)
        finally:
            await fresh.close()
        assert not client.closed, "a partition keeps the sockets open"
        assert proxy.passed(Opcode.APPEND, "request") == 2  # the third is held
        proxy.heal()
        # The held APPEND reaches the server once healed, in order.
        await proxy.wait_passed_async(Opcode.APPEND, "answer", 3, timeout_s=5.0)
        assert (await describe(client))["end"] == 3
        header, _ = await client.call(Opcode.APPEND, {}, batch(3))
        assert header["end"] == 4
    finally:
        await client.close()


async def test_blackhole_holds_from_the_matching_frame_on(proxied: Proxied) -> None:
    proxy = proxied.proxy
    client = await RpcClient.connect(proxy.address)
    try:
        await create_and_fill(client, 1)
        proxy.blackhole(Opcode.APPEND, "request", skip=1)
        await client.call(Opcode.APPEND, {}, batch(1))  # skipped: passes
        with pytest.raises(Timeout):
            await client.call(Opcode.APPEND, {}, batch(2), timeout_s=short_timeout_s)
        with pytest.raises(Timeout):  # everything after it is held too
            await client.call(Opcode.PING, timeout_s=short_timeout_s)
        assert proxy.partitioned
        assert proxy.seen(Opcode.APPEND, "answer") == 2
        proxy.heal()
        # Held, not lost: the APPEND is served once healed (its answer comes after fsync).
        await proxy.wait_passed_async(Opcode.APPEND, "answer", 3, timeout_s=5.0)
        assert (await describe(client))["end"] == 3
    finally:
        await client.close()


async def test_delay_keeps_order_and_counts_can_be_awaited(proxied: Proxied) -> None:
    proxy = proxied.proxy
    client = await RpcClient.connect(proxy.address)
    try:
        await create_and_fill(client, 0)
        delay_ms = 300
        proxy.delay(Opcode.APPEND, "request", delay_ms, count=1)
        started = time.monotonic()
        # The first APPEND is delayed; the next ones are sent right after it and must not
        # overtake it (an overtaking APPEND would be an offset gap).
        results = await asyncio.gather(*(client.call(Opcode.APPEND, {}, batch(i))
                                         for i in range(5)))
        elapsed = time.monotonic() - started
        ends = [h["end"] for h, _ in results]  # a durable end after each (group commit)
        assert all(end >= i + 1 for i, end in enumerate(ends)) and ends == sorted(ends)
        assert (await describe(client))["end"] == 5
        assert elapsed >= delay_ms / 1000
        assert proxy.wait_passed(Opcode.APPEND, "answer", 5, timeout_s=1.0) == 5
        with pytest.raises(TimeoutError):
            await proxy.wait_passed_async(Opcode.APPEND, "answer", 6, timeout_s=0.2)
    finally:
        await client.close()


async def test_reset_closes_connections_and_the_next_one_works(proxied: Proxied) -> None:
    proxy = proxied.proxy
    client = await RpcClient.connect(proxy.address)
    try:
        await client.call(Opcode.PING)
        assert proxy.reset() == 1
        with pytest.raises(Unavailable):
            await client.call(Opcode.PING, timeout_s=2.0)
    finally:
        await client.close()
    again = await RpcClient.connect(proxy.address)
    try:
        proxy.reset_on(Opcode.PING, "request")
        with pytest.raises(Unavailable):
            await again.call(Opcode.PING, timeout_s=2.0)
    finally:
        await again.close()
    last = await RpcClient.connect(proxy.address)
    try:
        header, _ = await last.call(Opcode.PING)
        assert header["address"] == proxy.address
    finally:
        await last.close()


async def test_a_dead_server_behind_the_proxy_fails_connections(proxied: Proxied) -> None:
    proxied.server.kill9()
    # The proxy accepts, finds nothing listening behind it and resets the connection: the
    # client sees that at connect when the reset comes first (a loaded machine), else at
    # its first call. Either way it is Unavailable, never a hang.
    with pytest.raises(Unavailable):
        client = await RpcClient.connect(proxied.proxy.address)
        try:
            await client.call(Opcode.PING, timeout_s=2.0)
        finally:
            await client.close()


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("upstream", ["listening", "gone"])
def test_close_racing_new_connections_leaves_no_socket_open(upstream: str) -> None:
    """Connections opened just before and while the proxy closes (accepted, connecting
    upstream, or forwarding) are all closed by close(), and no socket is left to the
    garbage collector (a ResourceWarning: once a CI teardown error)."""
    with socket.create_server(("127.0.0.1", 0), backlog=512) as target:
        address = f"127.0.0.1:{target.getsockname()[1]}"
        if upstream == "gone":
            target.close()  # connecting upstream fails: each accepted client is reset
        gc.collect()
        before = _open_fds()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ResourceWarning)
            for round_ in range(30):
                proxy = FaultProxy(address).start()
                host, port = proxy.address.split(":")
                clients = [_try_connect(host, int(port)) for _ in range(round_ % 6)]
                closing = threading.Thread(target=proxy.close)
                closing.start()
                clients += [_try_connect(host, int(port)) for _ in range(3)]
                closing.join(15)
                for client in clients:
                    if client is not None:
                        client.close()
                assert not closing.is_alive()
            leaked = _open_fds() - before
            gc.collect()
        warned = [str(w.message) for w in caught if issubclass(w.category, ResourceWarning)]
        assert (leaked, warned) == (0, [])


def _try_connect(host: str, port: int) -> socket.socket | None:
    try:
        return socket.create_connection((host, port), timeout=5)
    except OSError:
        return None  # the proxy stopped listening first, or reset it (nothing upstream)


# -- the proxied cluster and its fault helpers (estream/devcluster/cluster.py) -------------------


# About 13 s: in `make chaos` (the suite's time); the tests above drive each fault through
# the same proxy in every `make test`.
@pytest.mark.slow
async def test_proxied_cluster_and_its_faults(cluster: Cluster) -> None:
    import estream

    for server in cluster.servers:  # PD knows every server by its proxy's address
        assert server.proxy is not None and server.address == server.proxy.address
        assert server.listen != server.address
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        await client.create_stream("proxied", replicas=3, ack_count=2)
        async with await client.open_writer("proxied") as writer:
            for i in range(20):
                await writer.append(b"p%d" % i)
        meta = await client.describe_stream("proxied")
        first = meta.ranges[0]
        addresses = [ref.address for ref in first.replicas]
        assert {cluster.server(a).address for a in addresses} == set(addresses)
        appends = sum(cluster.proxy(a).passed(Opcode.APPEND, "answer") for a in addresses)
        assert appends >= 3 * 20 / 2, "the appends went through the proxies"

        # A flipped byte in an acknowledged batch: the replica is damaged after restart.
        victim = cluster.server(addresses[0])
        damaged = damage_replica(cluster, victim.address, meta.id, 0, below=20)
        assert damaged is not None and damaged.base_offset + damaged.count <= 20
        await asyncio.to_thread(cluster.wait_servers_alive)
        rpc = await RpcClient.connect(victim.address)
        try:
            header, _ = await rpc.call(Opcode.DESCRIBE_RANGE,
                                       {"stream_id": meta.id, "range_index": 0})
        finally:
            await rpc.close()
        assert not damaged.last_in_segment, damaged  # mid-log: a scan cannot call it torn
        assert header["damaged"] is True, header

        # A wiped data dir: a new identity at the same address (and the same proxy).
        other = cluster.server(addresses[1])
        old_id, old_proxy = other.server_id, other.proxy
        new_id = await asyncio.to_thread(cluster.wipe, other.address)
        assert new_id != old_id and other.address == addresses[1] and other.proxy is old_proxy
        assert new_id in {s["id"] for s in cluster.alive_servers()}

        # A whole-cluster crash: every process killed at once and started again.
        pids = [s.process.pid for s in cluster.servers if s.process is not None]
        await asyncio.to_thread(cluster.crash_all)
        assert all(s.alive() for s in cluster.servers)
        assert not {s.process.pid for s in cluster.servers if s.process} & set(pids)
        assert [s.server_id for s in cluster.servers if s.address == other.address] == [new_id]

        # The PD leader killed and restarted: a new leader is elected.
        leader = await asyncio.to_thread(cluster.kill_pd_leader)
        assert await asyncio.to_thread(cluster.pd.leader) != leader
        await asyncio.to_thread(cluster.restart_pd, leader)
        assert cluster.pd.nodes[leader].alive()

        # Paused: the process stops answering; resumed: it answers again.
        third = cluster.server(addresses[2])
        cluster.pause(third.address)
        rpc = await RpcClient.connect(third.address)
        try:
            with pytest.raises(Timeout):
                await rpc.call(Opcode.PING, timeout_s=short_timeout_s)
            cluster.resume(third.address)
            header, _ = await rpc.call(Opcode.PING, timeout_s=5.0)
            assert header["server_id"] == third.server_id
        finally:
            await rpc.close()
