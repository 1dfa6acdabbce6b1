"""The writer on striped streams against real processes (issue 30, item 1; docs/
ARCHITECTURE.md section 10): 1 PD node, 6 range servers.

Appends through ``open_writer`` land on exactly their write sets (each batch read back by
index from every server of the range with the range client: the SDK reader is made
stripe-aware elsewhere), also when two writers' batches share APPEND_MANY requests; the
servers' confirm offsets advance; a server killed mid-stream leaves the range degraded
with no append failed; two servers of one write set killed roll the range to a new
ensemble (every acknowledged record once, in order, offsets contiguous across the roll);
a SIGSTOPped server does not stop appends; E == replicas is today's writer; a
DEFERRED_SYNC force of sealed striped ranges needs ``acks`` servers of each write set,
and PD's delete fences a striped range per write set (the name then made again is new).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.net.rangeclient import RangeClient
from estream.net.rpc import ConnectionPool
from estream.sdk.writer import Writer, WriterConfig
from estream.wire.errors import EstreamError, StreamNotFound, Unavailable
from estream.wire.meta import RangeMeta, StreamMeta
from estream.wire.record import decode_batch, iter_batches, verify_batch
from estream.wire.stripe import Stripe
from tests.harness import writer as writer_process
from tests.harness.deletes import delete_refused_while_hung

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=6, heal=True)]


async def holdings(rc: RangeClient, meta: StreamMeta, rng: RangeMeta, end: int,
                   skip: frozenset[str] = frozenset()) -> dict[int, set[str]]:
    """Batch k of ``rng`` (one record each: offsets ``rng.start + k``) -> the servers that
    answer it by index; every other server (but ``skip``) must not hold it (a READ by
    offset names the batch to ask for elsewhere)."""
    stripe = Stripe(meta.ensemble, meta.replicas, meta.ack_count)
    held: dict[int, set[str]] = {}
    for position, ref in enumerate(rng.replicas):
        if ref.id in skip:
            continue
        for k in range(end - rng.start):
            offset = rng.start + k
            mine = stripe.holds(position, k)
            answer = await rc.read(ref.address, server_id=ref.id, stream_id=meta.id,
                                   range_index=rng.index, offset=offset, unconfirmed=True,
                                   batch=k if mine else None)
            if not mine:
                assert answer.payload == b"" and answer.next is not None, (ref.id, k)
                continue
            if not answer.payload:
                continue  # a chain cut short (a roll re-sent the rest)
            bases = [verify_batch(raw).base_offset for _, raw in iter_batches(answer.payload)]
            assert answer.batches is not None and answer.batches[0] == k
            assert bases[0] == offset
            held.setdefault(k, set()).add(ref.id)
    return held


async def check_striped(cluster: Cluster, meta: StreamMeta, records: int,
                        skip: frozenset[str] = frozenset()) -> None:
    """Every range holding records: each batch (one record each) on ``acks`` or more
    servers of its write set and on no other (``skip``: servers not asked)."""
    stripe = Stripe(meta.ensemble, meta.replicas, meta.ack_count)
    pool = ConnectionPool()
    try:
        rc = RangeClient(pool, timeout_s=10.0)
        for rng in meta.ranges:
            end = rng.end if rng.end is not None else records
            held = await holdings(rc, meta, rng, end, skip)
            for k in range(end - rng.start):
                ws = {rng.replicas[p].id for p in stripe.write_set(k)}
                assert stripe.acks <= len(held.get(k, set())) and held[k] <= ws, (k, held)
    finally:
        await pool.close()


async def test_appends_land_on_exactly_their_write_sets(cluster: Cluster) -> None:
    cluster.wait_servers(6)
    pool = ConnectionPool()
    rc = RangeClient(pool, timeout_s=10.0)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        metas = [await client.create_stream(f"sw-ws-{i}", 3, 2, ensemble=5) for i in (0, 1)]
        writers = [await client.open_writer(m.name) for m in metas]
        try:
            for i in range(8):  # one record a batch: batch k holds offset k
                assert await writers[0].append(b"a%d" % i) == i
            # two writers in one turn: their batches to a server share APPEND_MANY
            for i in range(8):
                got = await asyncio.gather(writers[0].append(b"a%d" % (8 + i)),
                                           writers[1].append(b"b%d" % i))
                assert got == [8 + i, i]
            for w in writers:
                await w.flush()
                assert w.statistics().degraded == 0 and w.statistics().rolls == 0
        finally:
            for w in writers:
                await w.close()
        metas = [await client.describe_stream(m.name) for m in metas]
    try:
        for meta, count in zip(metas, (16, 8), strict=True):
            rng = meta.ranges[0]
            stripe = Stripe(5, 3, 2)
            held = await holdings(rc, meta, rng, count)
            assert held == {k: {rng.replicas[p].id for p in stripe.write_set(k)}
                            for k in range(count)}
            states = [await rc.describe_range(ref.address, server_id=ref.id,
                                              stream_id=meta.id, range_index=0)
                      for ref in rng.replicas]
            # each server learned the confirm offset (CONFIRM goes to all E at flush)
            assert sum(1 for s in states if s.confirm == count) >= 2, states
            assert all(0 < s.confirm <= count for s in states), states
        # the next writer opens the fresh range PD placed at the close, and stripes it
        async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
            async with await client.open_writer(metas[0].name) as writer:
                assert [await writer.append(b"n%d" % i) for i in range(4)] == [16, 17, 18, 19]
            meta = await client.describe_stream(metas[0].name)
        rng = meta.ranges[1]
        assert rng.start == 16 and await holdings(rc, meta, rng, rng.end or 20) == {
            k: {rng.replicas[p].id for p in Stripe(5, 3, 2).write_set(k)} for k in range(4)}
    finally:
        await pool.close()


async def test_a_server_killed_mid_stream_leaves_the_range_degraded(cluster: Cluster) -> None:
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("sw-kill1", 3, 2, ensemble=5)
        victim = meta.ranges[0].replicas[2]
        async with await client.open_writer(meta.name) as writer:
            for i in range(6):
                assert await writer.append(b"%d" % i) == i
            cluster.kill9(victim.address)
            offsets = [await writer.append(b"%d" % i) for i in range(6, 20)]
            assert offsets == list(range(6, 20))  # nothing failed
            stats = writer.statistics()
            assert stats.failed == 0 and stats.degraded_ranges >= 1
        meta = await client.describe_stream(meta.name)
    await check_striped(cluster, meta, 20, skip=frozenset({victim.id}))


async def test_two_servers_of_one_write_set_killed_roll_to_a_new_ensemble(
        cluster: Cluster) -> None:
    """E 4 (6 servers: after two are lost, a new ensemble of 4 can still be placed;
    with E 5 it could not), R 3, A 2: positions 0 and 1 share W(0) and W(1)."""
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("sw-roll", 3, 2, ensemble=4)
        first = meta.ranges[0].replicas
        async with await client.open_writer(meta.name) as writer:
            acked = [await writer.append(b"r%d" % i) for i in range(8)]
            cluster.kill9(first[0].address)
            cluster.kill9(first[1].address)
            pending = [writer.append(b"r%d" % i) for i in range(8, 30)]
            acked += [await p for p in pending]
            assert acked == list(range(30))  # none failed, offsets contiguous
            assert writer.statistics().rolls >= 1
        meta = await client.describe_stream(meta.name)
    ranges = list(meta.ranges)  # (the close sealed the last and PD placed one more)
    assert ranges[0].end is not None and len(ranges) >= 2
    assert not {first[0].id, first[1].id} & {r.id for r in ranges[1].replicas}
    assert len(ranges[1].replicas) == 4
    pool = ConnectionPool()
    values: list[bytes] = []
    try:
        rc = RangeClient(pool, timeout_s=10.0)
        for rng in ranges:
            end = rng.end if rng.end is not None else 30
            assert rng.start == len(values)  # contiguous across the roll
            stripe = Stripe(4, 3, 2)
            k, offset = 0, rng.start
            while offset < end:  # batch k from a live server of W(k), by its index
                for p in stripe.write_set(k):
                    ref = rng.replicas[p]
                    if ref.id in (first[0].id, first[1].id):
                        continue
                    answer = await rc.read(ref.address, server_id=ref.id,
                                           stream_id=meta.id, range_index=rng.index,
                                           offset=offset, batch=k, unconfirmed=True)
                    if answer.payload:
                        _, raw = next(iter(iter_batches(answer.payload)))
                        assert verify_batch(raw).base_offset == offset
                        got = [r.value for r in decode_batch(bytes(raw)).records]
                        values += got
                        offset += len(got)
                        break
                else:
                    pytest.fail(f"batch {k} of range {rng.index} held by no live server")
                k += 1
            if rng.end is not None:  # PD keeps each sealed range's batch count
                assert rng.batches == k, (rng.index, rng.batches, k)
    finally:
        await pool.close()
    assert values == [b"r%d" % i for i in range(30)]  # each acknowledged record once, in order


async def test_a_sigstopped_server_does_not_stop_appends(cluster: Cluster) -> None:
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("sw-stop", 3, 2, ensemble=5)
        hung = meta.ranges[0].replicas[1]
        async with await client.open_writer(meta.name) as writer:
            assert await writer.append(b"0") == 0
            cluster.pause(hung.address)
            try:
                slowest = 0.0
                for i in range(1, 16):
                    began = time.monotonic()
                    assert await writer.append(b"%d" % i) == i
                    slowest = max(slowest, time.monotonic() - began)
                # loose: never a request timeout (5 s) per append: the others answer
                assert slowest < 4.0, slowest
                assert writer.statistics().failed == 0
            finally:
                cluster.resume(hung.address)
        meta = await client.describe_stream(meta.name)
    await check_striped(cluster, meta, 16)


async def test_an_ensemble_of_replicas_is_todays_writer(cluster: Cluster) -> None:
    cluster.wait_servers(6)
    pool = ConnectionPool()
    try:
        rc = RangeClient(pool, timeout_s=10.0)
        async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
            meta = await client.create_stream("sw-plain", 3, 2, ensemble=3)
            assert not meta.striped
            async with await client.open_writer(meta.name) as writer:
                for i in range(5):
                    assert await writer.append(b"%d" % i) == i
                await writer.flush()
            whole = 0
            for ref in meta.ranges[0].replicas:  # whole replicas: a prefix on each
                answer = await rc.read(ref.address, server_id=ref.id, stream_id=meta.id,
                                       range_index=0, offset=0, unconfirmed=True)
                assert answer.batches is None and answer.next is None
                bases = [h.base_offset for h, _ in iter_batches(answer.payload)]
                assert bases == list(range(len(bases)))
                whole += len(bases) == 5
            assert whole >= 2
    finally:
        await pool.close()


async def test_a_writer_fencing_another_stripes_the_range_its_recovery_opens(
        cluster: Cluster) -> None:
    """The first writer left its range open (not closed, every batch on its whole write
    set): the next one's recovery seals it and creates the next range, each server at its
    stripe position (estream/sdk/writeropen.py), so it takes indexed appends: no roll."""
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as first:
        await first.create_stream("sw-fence", 3, 2, ensemble=5)
        old = await first.open_writer("sw-fence")
        for i in range(6):
            await old.append(b"%d" % i)
        await old.flush()
        async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as second:
            async with await second.open_writer("sw-fence") as writer:
                assert [await writer.append(b"n%d" % i) for i in range(3)] == [6, 7, 8]
                assert writer.statistics().rolls == 0 and writer.statistics().degraded == 0
            meta = await second.describe_stream("sw-fence")
    rng = meta.ranges[1]
    assert (meta.ranges[0].end, rng.start) == (6, 6)
    await check_striped(cluster, meta, 9)


async def test_deferred_sync_force_on_a_striped_stream(cluster: Cluster) -> None:
    """DEFERRED_SYNC: force() returns once the FORCE answers cover every confirmed batch
    by the prefix rule, and the confirm offset then moves."""
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        await client.create_stream("sw-force", 3, 2, ensemble=5)
        async with await client.open_writer("sw-force", deferred_sync=True) as writer:
            assert [await writer.append(b"%d" % i) for i in range(7)] == list(range(7))
            await writer.force()
            assert writer._core is not None and writer._core.ranges.forced == 7
        meta = await client.describe_stream("sw-force")
    await check_striped(cluster, meta, 7)


async def test_a_striped_stream_end_to_end_through_the_sdk(cluster: Cluster, tmp_path: Path
                                                          ) -> None:
    """A user's striped stream (E 5, R 3, A 2), end to end through the SDK: a writer process
    killed (-9) mid-stream, the next writer's open recovering its open range by write set,
    appends going on with a server killed (degraded), then ``Client.read`` from the start
    and from the middle: every acknowledged record once, in order; PD keeps each sealed
    range's batch count."""
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("sw-e2e", 3, 2, ensemble=5)
        acked = await writer_process.run_and_kill_writer(
            cluster.pd_addresses, meta.name, tmp_path / "writer.out", 300)
        async with await client.open_writer(meta.name) as writer:
            recovered = await client.describe_stream(meta.name)
            first = recovered.ranges[0]
            assert first.end is not None and first.end >= max(acked) + 1
            assert first.batches is not None and first.batches > 0
            cluster.kill9(recovered.ranges[-1].replicas[0].address)
            for i in range(100):
                value = b"after-%d" % i
                acked[await writer.append(value)] = value
        read = [(r.offset, r.value) async for r in client.read(meta.name, follow=False)]
        offsets = [o for o, _ in read]
        assert offsets == list(range(len(read))), "offsets skipped or repeated"
        got = dict(read)
        assert all(got.get(o) == v for o, v in acked.items()), "an acknowledged record lost"
        middle = max(acked) // 2
        tail = [(r.offset, r.value) async for r in client.read(meta.name, start=middle,
                                                                follow=False)]
        assert tail == read[middle:]


async def test_time_lookups_on_a_striped_stream_find_the_first_record(cluster: Cluster) -> None:
    """``offset_for_time`` on a striped stream: each server indexes only its own batches,
    so the lookup merges the ensemble's answers (asking one server answered the first of
    ITS records, skipping others' earlier ones); sealed and open ranges, and with a
    server of the open range killed (the range is then scanned)."""
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("sw-time", 3, 2, ensemble=5)
        stamps: list[int] = []
        async with await client.open_writer(meta.name) as writer:  # sealed at close
            for i in range(40):
                stamps.append(1_000 + 10 * i)
                await writer.append(b"t%d" % i, timestamp=stamps[-1])
        writer = await client.open_writer(meta.name)
        try:  # the open range
            for i in range(40, 80):
                stamps.append(1_000 + 10 * i)
                await writer.append(b"t%d" % i, timestamp=stamps[-1])
            await writer.flush()

            def expected(t: int) -> int:
                return next((o for o, s in enumerate(stamps) if s >= t), len(stamps))

            for t in [995, 1_000, 1_005, 1_105, 1_213, 1_395, 1_400, 1_555, 1_790, 9_999]:
                assert await client.offset_for_time(meta.name, t) == expected(t), t
            last = (await client.describe_stream(meta.name)).ranges[-1]
            cluster.kill9(last.replicas[1].address)  # (the module's cluster heals it)
            for t in (1_405, 1_615):
                assert await client.offset_for_time(meta.name, t) == expected(t), t
        finally:
            await writer.close()


async def test_force_of_sealed_striped_ranges_needs_acks_of_each_write_set(
        cluster: Cluster) -> None:
    """DEFERRED_SYNC ``force()`` over sealed striped ranges (E 5, R 3, A 2; rolled by
    size, every server live). Before: a sealed striped range needed FORCE answered by
    every live server of its ensemble, so one server down (E 5 or E 6 alike) failed the
    force with ``Unavailable``, after the request timeout (5 s) when it hung. Now: ``acks``
    live servers of each write set (``WriterCore.force_short``); the force returns once
    they answered, a SIGSTOPped server left behind. Two servers sharing a write set down
    fail it with ``Unavailable`` naming the range."""
    cluster.wait_servers(6)
    config = WriterConfig(range_bytes_max=1_000, deferred=True)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        await client.create_stream("sf-force", 3, 2, ensemble=5)
        writer = await Writer.open(client, "sf-force", config)
        try:
            for i in range(12):
                assert await writer.append(b"%03d" % i + b"x" * 200) == i
            await writer.flush()
            await asyncio.sleep(0.3)  # every live server of each write set answered
            meta = await client.describe_stream("sf-force")
            sealed = [r for r in meta.ranges if r.end is not None]
            assert len(sealed) >= 2 and all(r.batches for r in sealed), meta.ranges
            hung = sealed[0].replicas[2]
            cluster.pause(hung.address)
            try:
                started = time.monotonic()
                await writer.force()
                assert time.monotonic() - started < 3.0  # not the 5 s request timeout
                assert writer._core is not None and writer._core.ranges.forced == 12
            finally:
                cluster.resume(hung.address)
            for i in range(12, 24):
                assert await writer.append(b"%03d" % i + b"x" * 200) == i
            await writer.flush()
            meta = await client.describe_stream("sf-force")
            owed = [r for r in meta.ranges
                    if r.end is not None and r.index > sealed[-1].index]
            assert owed, meta.ranges
            down = [owed[0].replicas[0].address, owed[0].replicas[1].address]  # W(0)
            for address in down:
                cluster.kill9(address)
            try:
                with pytest.raises(Unavailable, match=f"range\\(s\\) {owed[0].index}"):
                    await writer.force()
            finally:
                for address in down:
                    cluster.restart(address)
        finally:
            await writer.close()


async def test_delete_fences_a_striped_range_per_write_set(cluster: Cluster) -> None:
    """``delete_stream`` of a striped stream fences its open range per write set. Before:
    a quorum of the whole ensemble (E - A + 1): with E 5 (R 3, A 2) that is 4 of 5, the
    same as two of every write set (any two servers of five share a write set); with E 6
    it is 5 of 6, so two servers three apart down (no write set has both, every one keeps
    two fenced) failed the delete with ``Unavailable`` although no earlier writer could
    get a batch acknowledged any more. Now: E 6 with positions 0 and 3 hung deletes (the
    old writer's next append is refused, the name made again is a new stream holding only
    its own records); with 0 and 1 hung (W(5) = 5 0 1 keeps one fenced) the delete fails
    with ``FenceIncomplete`` naming them, after one try, deleting nothing, and succeeds once
    they answer again."""
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        meta = await client.create_stream("sd-del", 3, 2, ensemble=6)
        old = await client.open_writer("sd-del")
        try:
            assert [await old.append(b"old%d" % i) for i in range(6)] == list(range(6))
            await old.flush()
            hung = [meta.ranges[0].replicas[p].address for p in (0, 3)]
            for address in hung:
                cluster.pause(address)
            try:
                await client.delete_stream("sd-del")
                with pytest.raises(StreamNotFound):
                    await client.describe_stream("sd-del")
                with pytest.raises(EstreamError):  # Fenced: never acknowledged
                    await old.append(b"late")
            finally:
                for address in hung:
                    cluster.resume(address)
        finally:
            with contextlib.suppress(EstreamError):
                await old.close()
        # (PD may have seen the hung servers' heartbeats stop: six live ones to place on)
        await asyncio.to_thread(cluster.wait_servers_alive)
        again = await client.create_stream("sd-del", 3, 2, ensemble=6)
        assert again.id != meta.id
        async with await client.open_writer("sd-del") as writer:
            assert [await writer.append(b"new%d" % i) for i in range(3)] == [0, 1, 2]
        got = [r.value async for r in client.read("sd-del", follow=False)]
        assert got == [b"new0", b"new1", b"new2"]
        last = (await client.describe_stream("sd-del")).ranges[-1]  # open, placed at close
        await delete_refused_while_hung(cluster, client, "sd-del",
                                        [last.replicas[p] for p in (0, 1)])
