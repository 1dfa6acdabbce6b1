"""Idempotent producers on real processes: a producer killed -9 mid-load and restarted
replays its whole input and the stream holds each sequence once, in order; the same
across a range roll (a replica killed) and a writer recovery; two writers with one
producer id (fencing decides); producers taking turns on one stream."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from tests.harness.writer import acked, run_producer

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=4, shared=True)]



async def sequences_in(client: estream.Client, name: str) -> list[int]:
    return [int(r.value[1:]) async for r in client.read(name)]


async def test_replay_after_reopen_stores_each_sequence_once(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("idem")
        async with await client.open_writer("idem", producer_id="p1") as writer:
            assert writer.last_sequence == -1
            offsets = [await writer.append(b"s%d" % s, sequence=s) for s in range(100)]
            assert offsets == list(range(100))
            assert writer.last_sequence == 99
            # Duplicates within the session: the offset holding them, nothing stored.
            assert await writer.append(b"s5", sequence=5) == 5
            assert await writer.append_batch([b"s98", b"s99", b"s100"],
                                             sequences=[98, 99, 100]) == [98, 99, 100]
            assert writer.statistics().duplicates == 3
        async with await client.open_writer("idem", producer_id="p1") as writer:
            assert writer.last_sequence == 100
            replay = await asyncio.gather(
                *(writer.append(b"s%d" % s, sequence=s) for s in range(150)))
            assert replay[100] == 100  # the last stored one's offset is known at open
            assert replay[:100].count(-1) == 100  # older ones: stored, offset unknown
            assert replay[101:] == list(range(101, 150))
            assert writer.last_sequence == 149
        assert await sequences_in(client, "idem") == list(range(150))


async def test_producers_take_turns_and_plain_writers_do_not_disturb(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("turns")
        async with await client.open_writer("turns", producer_id="p") as w:
            await w.append_batch([b"s%d" % s for s in range(10)], sequences=list(range(10)))
        async with await client.open_writer("turns", producer_id="q") as w:
            assert w.last_sequence == -1
            await w.append(b"s500", sequence=500)
        async with await client.open_writer("turns") as w:  # no producer
            await w.append(b"s900")
        async with await client.open_writer("turns", producer_id="p") as w:
            assert w.last_sequence == 9  # found behind q's and the plain writer's ranges
            assert await w.append(b"s9", sequence=9) == 9
            assert await w.append(b"s10") == 12  # no sequence: one above the last
            assert w.last_sequence == 10
        async with await client.open_writer("turns", producer_id="q") as w:
            assert w.last_sequence == 500
        assert await sequences_in(client, "turns") == [*range(10), 500, 900, 10]


async def test_two_writers_with_one_producer_id_fencing_decides(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("twins")
        first = await client.open_writer("twins", producer_id="p")
        await first.append_batch([b"s%d" % s for s in range(10)], sequences=list(range(10)))
        second = await client.open_writer("twins", producer_id="p")
        assert second.last_sequence == 9
        with pytest.raises(estream.Fenced):
            await first.append(b"s10", sequence=10)
        assert await second.append(b"s10", sequence=10) == 10
        await second.close()
        await first.close()
        assert await sequences_in(client, "twins") == list(range(11))


async def test_producer_killed_mid_load_replays_its_input_exactly_once(
    cluster: Cluster, tmp_path: Path
) -> None:
    total = 3000
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("killed")
        first = await asyncio.to_thread(
            run_producer, cluster.pd_addresses, tmp_path / "a.out", "killed", total, 1000)
        before = acked(first)
        assert len(before) >= 1000 and "DONE" not in first
        again = await asyncio.to_thread(
            run_producer, cluster.pd_addresses, tmp_path / "b.out", "killed", total, None)
        assert "DONE" in again, again[-2000:]
        opened = int(again.split("OPEN ", 1)[1].split()[0])
        assert opened >= max(before)  # every acknowledged sequence was found stored
        stored = await sequences_in(client, "killed")
        assert stored == list(range(total))  # each sequence once, in order
        for seq, offset in before.items():
            assert stored[offset] == seq


async def test_replay_across_a_roll_and_a_writer_recovery(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A replica of the open range is killed while the producer writes (the writer rolls),
    then the producer is killed and restarted (its recovery seals the range)."""
    total = 3000
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("rolled")
        meta = await client.describe_stream("rolled")
        victim = meta.ranges[-1].replicas[0].address
        killed: list[str] = []

        def kill_replica(acks: int) -> None:
            if acks >= 500 and not killed:
                cluster.kill9(victim)
                killed.append(victim)

        try:
            first = await asyncio.to_thread(
                run_producer, cluster.pd_addresses, tmp_path / "a.out", "rolled", total, 1500,
                kill_replica)
            assert killed and len(acked(first)) >= 1500
            again = await asyncio.to_thread(
                run_producer, cluster.pd_addresses, tmp_path / "b.out", "rolled", total, None)
            assert "DONE" in again, again[-2000:]
        finally:
            if killed:
                cluster.restart(victim)
        meta = await client.describe_stream("rolled")
        assert len(meta.ranges) >= 3  # the roll, then the recovery's next range
        stored = await sequences_in(client, "rolled")
        assert stored == list(range(total))
        for seq, offset in acked(first).items():
            assert stored[offset] == seq


async def test_last_sequence_found_behind_more_ranges_than_one_read_window(
    cluster: Cluster,
) -> None:
    from estream.sdk.writeropen import walk_window

    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("far")
        async with await client.open_writer("far", producer_id="p") as w:
            await w.append(b"s7", sequence=7)
        for i in range(walk_window + 3):  # each open seals the last range: one range each
            async with await client.open_writer("far", producer_id=f"other-{i}") as w:
                await w.append(b"s1000", sequence=1000)
        async with await client.open_writer("far", producer_id="p") as w:
            assert w.last_sequence == 7
            # (the stream's ranges: the writer holds a window of the last ones)
            assert len(w.stream.ranges) + w.stream.ranges_omitted >= walk_window + 4
