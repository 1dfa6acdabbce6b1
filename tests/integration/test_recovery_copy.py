"""Recovery whose copy fails never commits with fewer than ack_count holders (real processes,
fault proxies in front of the range servers).

rs3 lags (down while half the records were acknowledged by rs1 and rs2), then rs2 goes down
and rs3 comes back short. A new writer's recovery must copy the missing records from rs1 to
rs3 before it may seal; the proxy in front of rs3 resets every connection carrying an
APPEND, so that copy fails. The writer must answer Unavailable and leave the range open
(before, the seal was committed with rs1 alone holding the tail: one more fault lost it).
Once the copy can go through, recovery seals the range with every record.
"""

from __future__ import annotations

import asyncio

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.wire import limits
from estream.wire.protocol import Opcode
from tests.harness.faultproxy import start_fault_proxy
from tests.integration.test_writer_faults import wait_read_all

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, proxy=start_fault_proxy)]


async def test_a_failed_recovery_copy_leaves_the_range_open_until_it_can_succeed(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("copy", replicas=3, ack_count=2)
        rs1, rs2, rs3 = (r.address for r in meta.ranges[0].replicas)
        acked: dict[int, bytes] = {}
        async with await client.open_writer("copy") as writer:
            for i in range(20):
                acked[await writer.append(b"c%d" % i)] = b"c%d" % i
            await asyncio.to_thread(cluster.kill9, rs3)  # rs3 lags from here
            for i in range(20, 40):
                acked[await writer.append(b"c%d" % i)] = b"c%d" % i
        assert sorted(acked) == list(range(40))
        await asyncio.to_thread(cluster.kill9, rs2)
        await asyncio.to_thread(cluster.restart, rs3)
        cluster.proxy(rs3).reset_on(Opcode.APPEND, "request", count=None)

        with pytest.raises(estream.Unavailable):
            await client.open_writer("copy", delivery_timeout_s=3.0)
        assert cluster.proxy(rs3).seen(Opcode.APPEND, "request") > 0  # the copy was tried
        still = await client.describe_stream("copy")
        assert still.ranges[0].end is None, "sealed with fewer than ack_count holders"

        cluster.proxy(rs3).clear_rules()
        async with await client.open_writer("copy") as again:
            acked[await again.append(b"after")] = b"after"
        sealed = await client.describe_stream("copy")
        assert sealed.ranges[0].end == 40
        assert await wait_read_all(client, "copy", acked) == sorted(acked.items())


# About 11 s (two leases): in `make chaos` (the suite's time); the failed copy above runs in
# every `make test`.
@pytest.mark.slow
async def test_a_recovery_waiting_longer_than_a_lease_keeps_its_writer(cluster: Cluster) -> None:
    """The same copy, refused for two leases while the new writer's open waits: the opening
    writer renews its lease meanwhile, so PD's lease recovery does not take the stream over
    (before, it did after one lease and fenced the opening writer), and once the copy goes
    through the writer opens at its own epoch and appends."""
    for server in cluster.servers:  # the test before leaves one server down
        if not server.alive():
            await asyncio.to_thread(cluster.restart, server.address)
    await asyncio.to_thread(cluster.wait_servers_alive)
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("long-open", replicas=3, ack_count=2)
        rs1, rs2, rs3 = (r.address for r in meta.ranges[0].replicas)
        acked: dict[int, bytes] = {}
        async with await client.open_writer("long-open") as writer:
            for i in range(20):
                acked[await writer.append(b"l%d" % i)] = b"l%d" % i
            await asyncio.to_thread(cluster.kill9, rs3)
            for i in range(20, 40):
                acked[await writer.append(b"l%d" % i)] = b"l%d" % i
        await asyncio.to_thread(cluster.kill9, rs2)
        await asyncio.to_thread(cluster.restart, rs3)
        cluster.proxy(rs3).reset_on(Opcode.APPEND, "request", count=None)
        try:
            opening = asyncio.ensure_future(
                client.open_writer("long-open", delivery_timeout_s=60.0))
            await asyncio.sleep(2 * limits.writer_lease_ms / 1000)
            assert not opening.done(), "the open should still wait for its copy"
            cluster.proxy(rs3).clear_rules()
            await asyncio.to_thread(cluster.restart, rs2)  # the next range needs 3 servers
            async with await opening as again:
                acked[await again.append(b"after")] = b"after"
                epoch = again.epoch
            stream = await client.describe_stream("long-open")
            assert stream.epoch == epoch, "PD's lease recovery took the stream over"
            assert stream.ranges[0].end == 40
            assert await wait_read_all(client, "long-open", acked) == sorted(acked.items())
        finally:
            cluster.proxy(rs3).clear_rules()
