"""Disk space comes back: deleting or trimming a stream makes PD's reclaimer drop its
replicas on the range servers, which delete the log segments only those replicas used.

A real cluster (3 PD nodes, 3 range servers with 1 MiB log segments, as processes)."""

from __future__ import annotations

import asyncio
import time

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.net.rangeclient import ListedRange, RangeClient, ReplicaListing
from estream.net.rpc import RpcClient
from estream.wire import limits
from estream.wire.protocol import Opcode

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=3, range_servers=3,
                                   rangeserver_args=["--wal-segment-mib", "1"])]

VALUE = bytes(range(256)) * 16  # 4 KiB records
reclaimed_within_s = limits.reclaim_interval_ms / 1000 * 2 + 5


async def replicas_of(cluster: Cluster, stream_id: int) -> dict[str, set[int]]:
    """Each range server's address -> the range indexes of ``stream_id`` it holds."""
    held: dict[str, set[int]] = {}
    pool = cluster.member_pool()  # LIST_RANGES is a member opcode
    try:
        for server in cluster.servers:
            listed = await RangeClient(pool).list_ranges(server.address, server_id=None)
            held[server.address] = {r.range_index for r in listed if r.stream_id == stream_id}
    finally:
        await pool.close()
    return held


def segment_files(cluster: Cluster) -> int:
    return sum(len(list((s.data_dir / "wal").glob("*.wal"))) for s in cluster.servers)


async def wait_until_dropped(cluster: Cluster, stream_id: int, ranges: set[int]) -> None:
    deadline = time.monotonic() + reclaimed_within_s
    while time.monotonic() < deadline:
        held = await replicas_of(cluster, stream_id)
        if not any(indexes & ranges for indexes in held.values()):
            return
        await asyncio.sleep(0.2)
    pytest.fail(f"ranges {ranges} of stream {stream_id} still held: {held}")


async def test_deleting_a_stream_drops_its_replicas_and_frees_their_segments(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        doomed = await client.create_stream("doomed", replicas=3, ack_count=2)
        kept = await client.create_stream("kept", replicas=3, ack_count=2)
        async with await client.open_writer("doomed") as writer:
            for _ in range(16):  # 4 MiB on each server: several 1 MiB segments
                await writer.append_batch([VALUE] * 64)
        async with await client.open_writer("kept") as writer:
            await writer.append_batch([b"kept-%d" % i for i in range(100)])
        before = segment_files(cluster)
        assert before >= 3 * 4
        assert all(held == {0} for held in (await replicas_of(cluster, doomed.id)).values())

        await client.delete_stream("doomed")
        await wait_until_dropped(cluster, doomed.id, {0})
        deadline = time.monotonic() + 5
        while segment_files(cluster) > before - 3 * 3 and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert segment_files(cluster) <= before - 3 * 3, "at least 3 segments freed a server"
        values = [r.value async for r in client.read("kept")]
        assert values == [b"kept-%d" % i for i in range(100)]
        assert all(held == {0} for held in (await replicas_of(cluster, kept.id)).values())

    restarted = cluster.servers[0]
    cluster.restart(restarted.address)
    assert (await replicas_of(cluster, doomed.id))[restarted.address] == set(), "stays dropped"
    assert (await replicas_of(cluster, kept.id))[restarted.address] == {0}


async def test_trimming_drops_the_ranges_it_removed_and_keeps_the_rest(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("trimmed-away", replicas=3, ack_count=2)
        for round_ in range(3):  # each writer seals its range at close: the next opens one
            async with await client.open_writer("trimmed-away") as writer:
                await writer.append_batch([b"%d-%d" % (round_, i) for i in range(50)])
        ranges = (await client.describe_stream("trimmed-away")).ranges
        assert len(ranges) >= 3
        cut = ranges[-2].start  # drops every range that ends at or before it
        gone = {r.index for r in ranges if r.end is not None and r.end <= cut}
        assert gone
        await client.trim("trimmed-away", cut)
        await wait_until_dropped(cluster, meta.id, gone)
        held = await replicas_of(cluster, meta.id)
        # (The open range the last writer's close placed is created by the next writer.)
        assert set().union(*held.values()) == {r.index for r in ranges if r.sealed} - gone
        offsets = [r.offset async for r in client.read("trimmed-away", start=cut)]
        assert offsets == list(range(cut, 150))


async def test_the_reclaimers_compact_listing_names_what_a_full_one_does(
    cluster: Cluster,
) -> None:
    """LIST_RANGES compact (the reclaimer's, every round) on the real servers: every replica
    named, the sealed one with its whole state as the full listing gives it, the open one
    by its key alone."""
    async with await estream.connect(cluster.pd_addresses) as client:
        meta = await client.create_stream("listed-compact", replicas=3, ack_count=2)
        async with await client.open_writer("listed-compact") as writer:
            await writer.append_batch([b"a", b"b"])  # sealed at 2 at close
        writer = await client.open_writer("listed-compact")  # range 1: open
        await writer.append(b"c")

        async def both(server: str) -> tuple[list[ListedRange], ReplicaListing]:
            pool = cluster.member_pool()
            try:
                listings = RangeClient(pool)
                full = await listings.list_ranges(server, server_id=None)
                return ([r for r in full if r.stream_id == meta.id],
                        await listings.list_replicas(server, server_id=None))
            finally:
                await pool.close()

        for server in cluster.servers:
            full, compact = await both(server.address)
            assert [(r.range_index, r.state.sealed) for r in full] == [(0, True), (1, False)]
            assert [k for k in compact.keys if k[0] == meta.id] == [(meta.id, 0), (meta.id, 1)]
            assert [r for r in compact.ranges if r.stream_id == meta.id] == full[:1]
        await writer.close()


FILLER_REPLICAS = 15_000  # one LIST_RANGES answer of them all would pass the 1 MiB header cap


async def test_reclaim_lists_a_server_with_many_replicas(cluster: Cluster) -> None:
    """A server holding more replicas than one answer can carry is listed a page at a time:
    the reclaimer still finds (and drops) the replicas of a deleted stream that sort after
    thousands of others."""
    server = cluster.servers[0]
    async with await estream.connect(cluster.pd_addresses) as client:
        filler = await client.create_stream("filler", replicas=3, ack_count=2)
        gone = await client.create_stream("gone-later", replicas=3, ack_count=2)
        rpc = await RpcClient.connect(server.address, member_secret=cluster.secret)
        try:
            async def create(stream_id: int, index: int) -> None:
                await rpc.call(Opcode.CREATE_RANGE, {"stream_id": stream_id,
                                                     "range_index": index, "start": 0,
                                                     "epoch": 1})

            # ranges the catalog does not have (past the filler's open range): kept
            for at in range(1, FILLER_REPLICAS + 1, 500):
                await asyncio.gather(*(create(filler.id, i) for i in range(at, at + 500)))
            await asyncio.gather(*(create(gone.id, i) for i in range(5)))
            page, _ = await rpc.call(Opcode.LIST_RANGES, {"limit": 100})
            assert len(page["ranges"]) == 100 and page["more"] is True
        finally:
            await rpc.close()
        await client.delete_stream("gone-later")
        await wait_until_dropped(cluster, gone.id, set(range(5)))
        held = await replicas_of(cluster, filler.id)
        assert held[server.address] == set(range(1, FILLER_REPLICAS + 1))
