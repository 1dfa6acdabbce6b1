"""A range server holding a replica is killed (SIGKILL) while 100,000 records are being
appended with many in flight: every append succeeds, and the read-back is exact."""

from __future__ import annotations

import asyncio
import time

import pytest

import estream
from estream.devcluster.cluster import Cluster

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=4, shared=True)]

TOTAL = 100_000
WAVE = 5_000  # appends in flight at once


async def test_kill9_of_a_replica_mid_stream_fails_no_append(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("failover", replicas=3, ack_count=2)
        writer = await client.open_writer("failover")
        victim = writer.stream.ranges[-1].replicas[0].address
        killed_at = -1
        worst_s = 0.0

        async def one(i: int) -> int:
            nonlocal worst_s
            started = time.monotonic()
            offset = await writer.append(b"r%d" % i)
            worst_s = max(worst_s, time.monotonic() - started)
            return offset

        async def killer() -> None:
            nonlocal killed_at
            while writer.statistics().completed < 32_500:
                await asyncio.sleep(0.001)
            killed_at = writer.statistics().completed
            await asyncio.to_thread(cluster.kill9, victim)  # mid-wave: appends in flight

        kill_task = asyncio.ensure_future(killer())
        offsets: list[int] = []
        for wave in range(0, TOTAL, WAVE):
            offsets += await asyncio.wait_for(
                asyncio.gather(*(one(i) for i in range(wave, wave + WAVE))), 30
            )
        await asyncio.wait_for(kill_task, 5)
        assert 32_500 <= killed_at < TOTAL
        print(f"killed {victim} at {killed_at}; worst append latency {worst_s * 1000:.0f} ms")
        assert offsets == list(range(TOTAL))  # every append succeeded, in order, no dup
        assert writer.statistics().rolls >= 1
        await writer.flush()
        meta = await client.describe_stream("failover")
        assert victim not in [r.address for r in meta.ranges[-1].replicas]
        values = [r.value async for r in client.read("failover")]
        assert len(values) == TOTAL
        assert values == [b"r%d" % i for i in range(TOTAL)]
        await writer.close()
