"""Many writers of one client on many streams (issue 27's spread): their batches and
confirms to one range server share APPEND_MANY requests. Against real processes: every
append acknowledged and read back once in order; one writer refused (fenced) while the
others in the same turn go on; a range server killed with requests in flight, the writers
roll away and nothing acknowledged is lost or stored twice."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.wire.protocol import Opcode
from tests.harness.faultproxy import start_fault_proxy

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=4, proxy=start_fault_proxy, heal=True)]


def append_many_requests(cluster: Cluster) -> int:
    """APPEND_MANY requests the range servers' proxies have passed so far."""
    return sum(cluster.proxy(s.address).passed(Opcode.APPEND_MANY, "request")
               for s in cluster.servers)


async def writers_of(client: estream.Client, prefix: str, count: int) -> list[estream.Writer]:
    names = [f"{prefix}-{i}" for i in range(count)]
    await asyncio.gather(*(client.create_stream(n, replicas=3, ack_count=2) for n in names))
    return list(await asyncio.gather(*(client.open_writer(n) for n in names)))


async def values_of(client: estream.Client, name: str) -> list[bytes]:
    return [r.value async for r in client.read(name, start=0, end=None, follow=False)]


async def test_many_writers_share_requests_and_every_record_reads_back_once_in_order(
        cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        writers = await writers_of(client, "spread", 40)
        before = append_many_requests(cluster)
        rounds = 15
        offsets = await asyncio.gather(*(
            w.append(b"%d-%d" % (i, r)) for r in range(rounds) for i, w in enumerate(writers)))
        for i in range(len(writers)):
            assert offsets[i::len(writers)] == list(range(rounds)), "one writer's, in order"
        assert append_many_requests(cluster) > before, "the batches shared requests"
        for i, w in enumerate(writers):
            await w.close()
            assert await values_of(client, f"spread-{i}") == [
                b"%d-%d" % (i, r) for r in range(rounds)]


async def test_a_fenced_writer_fails_alone_beside_the_others_in_its_turn(
        cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        writers = await writers_of(client, "fence", 20)
        await asyncio.gather(*(w.append(b"first") for w in writers))
        async with await estream.connect(cluster.pd_addresses) as other:
            newer = await other.open_writer("fence-0")  # fences writers[0]
            before = append_many_requests(cluster)
            got = await asyncio.gather(*(w.append(b"second") for w in writers),
                                       return_exceptions=True)
            assert isinstance(got[0], estream.Fenced), got[0]
            assert got[1:] == [1] * (len(writers) - 1), "the others are acknowledged"
            assert append_many_requests(cluster) > before
            assert await newer.append(b"newer") == 1
            await newer.close()
        for i, w in enumerate(writers[1:], start=1):
            await w.close()
            assert await values_of(client, f"fence-{i}") == [b"first", b"second"]
        assert await values_of(client, "fence-0") == [b"first", b"newer"]
        await writers[0].close()


# About 30 s (the roll waits for PD to give up on the dead server): in `make chaos`;
# test_sdk_failover kills a replica mid-stream in every `make test`.
@pytest.mark.slow
async def test_a_server_killed_with_requests_in_flight_loses_and_repeats_nothing(
        cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        writers = await writers_of(client, "kill", 30)
        metas = [await client.describe_stream(f"kill-{i}") for i in range(len(writers))]
        held = Counter(r.address for m in metas for r in m.ranges[-1].replicas)
        victim = held.most_common(1)[0][0]
        proxy = cluster.proxy(victim)
        acked: list[list[bytes]] = [[] for _ in writers]

        async def rounds(first: int, count: int) -> None:
            """``count`` rounds of one append per writer, all in flight at once."""
            values = [[b"%d-%d" % (i, r) for i in range(len(writers))]
                      for r in range(first, first + count)]
            offsets = await asyncio.gather(*(w.append(v) for vs in values
                                             for w, v in zip(writers, vs, strict=True)))
            for k, vs in enumerate(values):
                for i, v in enumerate(vs):
                    assert offsets[k * len(writers) + i] == len(acked[i]), "contiguous"
                    acked[i].append(v)

        await rounds(0, 5)
        cluster.pause(victim)  # requests reach it and are never answered ...
        seen = proxy.passed(Opcode.APPEND_MANY, "request")
        racing = asyncio.ensure_future(rounds(5, 3))
        deadline = time.monotonic() + 30
        while proxy.passed(Opcode.APPEND_MANY, "request") == seen:
            assert time.monotonic() < deadline, "no APPEND_MANY reached the paused server"
            await asyncio.sleep(0.01)
        cluster.kill9(victim)  # ... and it dies with them in flight
        await asyncio.wait_for(racing, 60)
        await rounds(8, 4)
        # Writers whose range held the dead server roll away from it (degraded meanwhile:
        # the two live replicas acknowledge; a roll waits for PD to place without it).
        deadline, r = time.monotonic() + 60, 12
        while await on_victim(client, victim, len(writers)):
            assert time.monotonic() < deadline, "a writer never rolled away from the dead server"
            await rounds(r, 1)
            r += 1
        for i, w in enumerate(writers):
            await w.close()
            assert await values_of(client, f"kill-{i}") == acked[i]
            assert len(acked[i]) == r


async def on_victim(client: estream.Client, victim: str, count: int) -> list[str]:
    """The streams whose open range still has a replica on ``victim``."""
    metas = [await client.describe_stream(f"kill-{i}") for i in range(count)]
    return [m.name for m in metas if victim in {r.address for r in m.ranges[-1].replicas}]
