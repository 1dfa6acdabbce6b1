"""The SDK against a real cluster (3 PD nodes, 4 range servers as processes): round trip,
fencing, a follower tailing a writer, and recovery after a writer process is killed."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from tests.harness.writer import run_and_kill_writer

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=4, shared=True)]



async def test_append_then_read_back_across_ranges(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("roundtrip", replicas=3, ack_count=2)
        async with await client.open_writer("roundtrip") as writer:
            first = await writer.append(b"one", headers={"k": "v"}, timestamp=1234)
            offsets = await asyncio.gather(*(writer.append(b"v%d" % i) for i in range(500)))
            batch = await writer.append_batch([b"x", b"y", b"z"])
        assert first == 0 and list(offsets) == list(range(1, 501)) and batch == [501, 502, 503]
        records = [r async for r in client.read("roundtrip")]
        assert [r.offset for r in records] == list(range(504))
        assert (records[0].value, dict(records[0].headers), records[0].timestamp) == (
            b"one",
            {"k": "v"},
            1234,
        )
        assert [r.value for r in records[1:501]] == [b"v%d" % i for i in range(500)]
        assert await client.end_offset("roundtrip") == 504
        window = [r.offset async for r in client.read("roundtrip", start=100, end=110)]
        assert window == list(range(100, 110))
        # A second writer recovers the range the first closed and continues the offsets.
        async with await client.open_writer("roundtrip") as writer2:
            assert await writer2.append(b"after") == 504
        meta = await client.describe_stream("roundtrip")
        assert meta.epoch == 2


async def test_record_keys_round_trip_and_records_without_keys_read_none(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("keyed")
        async with await client.open_writer("keyed") as writer:
            offsets = await asyncio.gather(
                writer.append(b"plain"), writer.append(b"keyed", key=b"k1"),
                writer.append(b"both", headers={"h": "\udcff"}, key=b""))
            assert await writer.append_batch([estream.Record(b"rec", key=b"k2")]) == [3]
        assert list(offsets) == [0, 1, 2]
        records = [r async for r in client.read("keyed")]
        assert [(r.value, r.key) for r in records] == [
            (b"plain", None), (b"keyed", b"k1"), (b"both", b""), (b"rec", b"k2")]
        assert records[2].headers == {"h": "\udcff"}


async def test_second_writer_fences_the_first(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("fencing")
        first = await client.open_writer("fencing")
        assert await first.append(b"a") == 0
        second = await client.open_writer("fencing")
        assert second.epoch > first.epoch
        with pytest.raises(estream.Fenced):
            await asyncio.wait_for(first.append(b"zombie"), 10)
        with pytest.raises(estream.Fenced):
            await first.append(b"again")
        assert await second.append(b"b") == 1
        await second.flush()
        values = [r.value async for r in client.read("fencing")]
        assert values == [b"a", b"b"]


async def test_follower_reads_while_the_writer_appends(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("tail")
        writer = await client.open_writer("tail")
        total = 300
        seen: list[bytes] = []

        async def follow() -> None:
            async for record in client.read("tail", start=0, follow=True):
                seen.append(record.value)
                if len(seen) == total:
                    return

        follower = asyncio.ensure_future(follow())
        for i in range(0, total, 10):
            await asyncio.gather(*(writer.append(b"t%d" % (i + k)) for k in range(10)))
            await asyncio.sleep(0.005)
            if i == total // 2:
                # Mid-way the follower has seen records already: it reads as they come.
                deadline = time.monotonic() + 5
                while not seen and time.monotonic() < deadline:
                    await asyncio.sleep(0.01)
                assert seen, "the follower saw nothing while the writer appended"
        await asyncio.wait_for(follower, 20)
        assert seen == [b"t%d" % i for i in range(total)]
        await writer.close()


async def test_a_follower_sees_a_lone_append_without_another_append_or_idle_confirm(
    cluster: Cluster,
) -> None:
    """Issue 32: the idle writer hints its new confirm offset at once
    (``estream/core/confirmhint.py``), so a tail holds a lone record though no later
    batch carries the offset and the idle CONFIRM is a minute away."""
    from estream.core.writeeffects import WriterConfig
    from estream.sdk.writer import Writer

    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("hinted", replicas=3, ack_count=2)
        writer = await Writer.open(client, "hinted", WriterConfig(confirm_idle_ms=60_000))
        first = asyncio.Event()
        seen: list[bytes] = []

        async def follow() -> None:
            async for record in client.read("hinted", follow=True):
                seen.append(record.value)
                first.set()

        follower = asyncio.ensure_future(follow())
        try:
            assert await writer.append(b"one") == 0
            await asyncio.wait_for(first.wait(), 10)
            assert seen == [b"one"]
            assert await writer.append(b"two") == 1  # and again, the range's next record
            await asyncio.wait_for(_until(lambda: len(seen) == 2), 10)
            assert seen == [b"one", b"two"]
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await writer.close()


async def test_many_idle_writers_on_one_client_each_hint_their_tail(
    cluster: Cluster,
) -> None:
    """Issue 32: writers of one client whose appends complete in one turn each send their
    hint (none dropped as not first for its server), so every tail sees its lone record
    though the idle CONFIRM is a minute away."""
    from estream.core.writeeffects import WriterConfig
    from estream.sdk.writer import Writer

    names = [f"hinted-many-{i}" for i in range(6)]
    async with await estream.connect(cluster.pd_addresses) as client:
        for name in names:
            await client.create_stream(name, replicas=3, ack_count=2)
        writers = [await Writer.open(client, name, WriterConfig(confirm_idle_ms=60_000))
                   for name in names]
        seen: dict[str, list[bytes]] = {name: [] for name in names}

        async def follow(name: str) -> None:
            async for record in client.read(name, follow=True):
                seen[name].append(record.value)

        followers = [asyncio.ensure_future(follow(name)) for name in names]
        try:
            ends = await asyncio.gather(*(w.append(b"one") for w in writers))
            assert ends == [0] * len(names)
            await asyncio.wait_for(_until(lambda: all(seen.values())), 10)
            assert all(values == [b"one"] for values in seen.values())
        finally:
            for follower in followers:
                follower.cancel()
            await asyncio.gather(*followers, return_exceptions=True)
            for writer in writers:
                await writer.close()


async def test_a_tail_loops_next_append_carries_the_hinted_offset_not_a_confirm(
    cluster: Cluster,
) -> None:
    """Issue 32: a writer appending a few ms after each record reached its tail sends a
    hint per record and no durable CONFIRM (its next batch carries the offset, no CONFIRM's
    log write and fsync in front of it: ``confirm_hinted_idle_ms``); once it stays idle, the
    durable CONFIRM of its last offset follows."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("tail-loop", replicas=3, ack_count=2)
        writer = await client.open_writer("tail-loop")
        sent: list[tuple[bool, int]] = []
        start_confirm = writer._replicas.start_confirm

        def spy(replica: str, stream_id: int, range_index: int, confirm: int,
                done: Callable[..., None], *, durable: bool = True,
                on_durable: Callable[[], None] | None = None) -> None:
            sent.append((durable, confirm))
            start_confirm(replica, stream_id, range_index, confirm, done, durable=durable,
                          on_durable=on_durable)

        writer._replicas.start_confirm = spy  # type: ignore[method-assign]
        seen: list[int] = []

        async def follow() -> None:
            async for record in client.read("tail-loop", follow=True):
                seen.append(record.offset)

        follower = asyncio.ensure_future(follow())
        records = 20
        try:
            for i in range(records):
                assert await writer.append(b"r%d" % i) == i
                await asyncio.wait_for(_until(lambda i=i: len(seen) > i), 10)
                await asyncio.sleep(0.005)  # an application's next record, 5 ms on
            hinted = {c for durable, c in sent if not durable}
            durable = {c for d, c in sent if d}
            assert hinted == set(range(1, records + 1))
            # One a linger after each completion before; none now but on a stall of 45 ms.
            assert len(durable) <= 3, sorted(durable)
            await asyncio.wait_for(_until(lambda: (True, records) in sent), 5)
            assert sent.count((True, records)) == 3  # every replica's, once
            assert seen == list(range(records))
        finally:
            follower.cancel()
            await asyncio.gather(follower, return_exceptions=True)
            await writer.close()


async def _until(check: Callable[[], bool]) -> None:
    while not check():
        await asyncio.sleep(0.01)


async def test_never_written_stream_reads_empty_and_a_follower_waits_for_the_writer(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("fresh")
        assert [r async for r in client.read("fresh")] == []
        assert await client.end_offset("fresh") == 0
        seen: list[bytes] = []

        async def follow() -> None:
            async for record in client.read("fresh", follow=True):
                seen.append(record.value)
                return

        follower = asyncio.ensure_future(follow())
        await asyncio.sleep(0.3)  # the follower polls a range no writer created yet
        assert not follower.done()
        async with await client.open_writer("fresh") as writer:
            await writer.append(b"first")
        await asyncio.wait_for(follower, 10)
        assert seen == [b"first"]


async def test_killed_writer_process_then_recovery_keeps_every_acknowledged_record(
    cluster: Cluster, tmp_path: Path
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("recovery")
        acked = await run_and_kill_writer(cluster.pd_addresses, "recovery",
                                          tmp_path / "writer.out", acks=2000)
        writer = await client.open_writer("recovery")  # fences and recovers the range
        end = await client.end_offset("recovery")
        assert end > max(acked)
        after = await writer.append(b"new-writer")
        assert after == end
        await writer.flush()  # readers see it once its CONFIRM landed
        stored = {r.offset: r.value async for r in client.read("recovery")}
        missing = [o for o in acked if stored.get(o) != acked[o]]
        assert not missing, f"{len(missing)} acknowledged records lost, e.g. {missing[:5]}"
        assert sorted(stored) == list(range(end + 1))
        await writer.close()


async def test_deferred_sync_writer_forces_then_readers_see_it(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("deferred")
        writer = await client.open_writer("deferred", deferred_sync=True)
        offsets = await asyncio.gather(*(writer.append(b"d%d" % i) for i in range(50)))
        assert list(offsets) == list(range(50))
        await writer.force()
        assert await client.end_offset("deferred") == 50
        values = [r.value async for r in client.read("deferred")]
        assert values == [b"d%d" % i for i in range(50)]
        await writer.close()


async def test_trimmed_offsets_raise_offset_out_of_range(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("trimmed")
        async with await client.open_writer("trimmed") as writer:
            await writer.append_batch([b"%d" % i for i in range(20)])
        meta = await client.trim("trimmed", 5)
        assert meta.start_offset == 5
        with pytest.raises(estream.OffsetOutOfRange):
            _ = [r async for r in client.read("trimmed", start=2)]
        assert [r.offset async for r in client.read("trimmed", start=5)] == list(range(5, 20))
        with pytest.raises(estream.OffsetOutOfRange, match="its end is 20"):
            await client.trim("trimmed", 21)  # would drop records not written yet
        assert (await client.describe_stream("trimmed")).start_offset == 5
        assert (await client.trim("trimmed", 20)).start_offset == 20  # up to the end: all


async def test_connect_to_nothing_is_unavailable_within_the_timeout() -> None:
    from estream.devcluster.process import free_port

    started = time.monotonic()
    with pytest.raises(estream.Unavailable):
        await estream.connect(f"127.0.0.1:{free_port()}", timeout_s=1.0)
    assert time.monotonic() - started < 5


async def test_create_stream_exist_ok_returns_the_same_settings_only(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        made = await client.create_stream("exist-ok", replicas=3, ack_count=2,
                                          retention_ms=60_000)
        again = await client.create_stream("exist-ok", replicas=3, ack_count=2,
                                           retention_ms=60_000, exist_ok=True)
        assert again.id == made.id
        with pytest.raises(estream.StreamExists):
            await client.create_stream("exist-ok", replicas=3, ack_count=2,
                                       retention_ms=60_000)
        with pytest.raises(estream.StreamExists, match="retention_ms"):
            await client.create_stream("exist-ok", replicas=3, ack_count=2, exist_ok=True)
