"""``Writer.append`` returns a future completed by the batch: the ways an application awaits
it (await, gather, wait, wait_for, as_completed, ensure_future), call order kept under
backpressure, and errors raised where it is awaited, as from the coroutine it was."""

from __future__ import annotations

import asyncio
import dataclasses

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.wire.meta import StreamMeta

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, shared=True)]


async def test_append_is_awaited_every_way_and_keeps_call_order(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("awaits", replicas=3, ack_count=2)
        async with await client.open_writer("awaits") as writer:
            assert await writer.append(b"a") == 0
            assert await asyncio.wait_for(writer.append(b"b"), 10) == 1
            done, pending_ = await asyncio.wait([writer.append(b"c")], timeout=10)
            assert [f.result() for f in done] == [2] and not pending_
            assert await asyncio.ensure_future(writer.append(b"d")) == 3
            # A budget of a few records: most appends wait for room, in call order.
            core = writer._core
            assert core is not None
            core.config = dataclasses.replace(
                core.config, inflight_bytes_max=4 * 1100, inflight_batches_max=2)
            pending = [writer.append(b"%04d" % i + b"x" * 1000) for i in range(200)]
            assert await asyncio.gather(*pending) == list(range(4, 204))
            assert writer.statistics().completed == 204
            ordered = [await f for f in asyncio.as_completed([writer.append(b"e")])]
            assert ordered == [204]
            # A future, not a coroutine: create_task refuses it, as any future (the call to
            # append had submitted the record already).
            with pytest.raises(TypeError):
                asyncio.create_task(writer.append(b"refused"))  # type: ignore[arg-type]
        values = [r.value[:4] async for r in client.read("awaits")]
        assert values == [b"a", b"b", b"c", b"d"] + [b"%04d" % i for i in range(200)] \
            + [b"e", b"refu"]


async def test_errors_are_raised_where_the_append_is_awaited(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("errors", replicas=3, ack_count=2)
        writer = await client.open_writer("errors")
        bad = writer.append("not bytes")  # type: ignore[arg-type]
        with pytest.raises(estream.InvalidArgument):
            await bad
        core = writer._core
        assert core is not None
        core.config = dataclasses.replace(core.config, inflight_bytes_max=1, inflight_batches_max=1)
        first = writer.append(b"x")
        queued = writer.append(b"y")  # waits for room
        cancelled = writer.append(b"never")
        cancelled.cancel()
        assert await first == 0 and await queued == 1
        await writer.close()
        late = writer.append(b"late")  # no raise at the call
        with pytest.raises(estream.Closed):
            await late
        assert [r.value async for r in client.read("errors")] == [b"x", b"y"]


async def test_close_flushes_appends_waiting_for_budget(cluster: Cluster) -> None:
    """Appends taken before close but still waiting for in-flight budget are flushed by
    it, not failed (they failed with Closed before)."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("close-queued", replicas=3, ack_count=2)
        writer = await client.open_writer("close-queued")
        assert await writer.append(b"first") == 0
        core = writer._core
        assert core is not None
        core.config = dataclasses.replace(
            core.config, inflight_bytes_max=4 * 1100, inflight_batches_max=2)
        pending = [writer.append(b"%04d" % i + b"x" * 1000) for i in range(201)]
        pending.pop().cancel()  # the last one, never sent: the others are still waited for
        await writer.close()
        assert await asyncio.gather(*pending) == list(range(1, 201))
        values = [r.value async for r in client.read("close-queued")]
        assert values == [b"first"] + [b"%04d" % i + b"x" * 1000 for i in range(200)]


async def test_an_append_while_close_seals_is_refused_never_acknowledged_and_lost(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """close() seals the open range at its end in PD, then on the replicas. An append taken
    while PD's seal was on its way was acknowledged by replicas still open, past the end
    the range was sealed at: acknowledged and never readable (the Kafka gateway did it,
    closing a partition writer it evicted while a Produce request went on with it). Now
    close() takes no append from its start: the late one raises Closed."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("close-race", replicas=3, ack_count=2)
        writer = await client.open_writer("close-race")
        for i in range(10):
            await writer.append(b"r%d" % i)
        late: list[asyncio.Future[int]] = []
        seal_in_pd = writer.seal_in_pd

        async def sealing(*args: object, **kwargs: object) -> StreamMeta:
            late.append(writer.append(b"late"))  # taken (or not) while the seal waits
            await asyncio.sleep(0.2)  # long enough for replicas to acknowledge it
            return await seal_in_pd(*args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(writer, "seal_in_pd", sealing)
        await writer.close()
        assert len(late) == 1, "close did not seal"
        with pytest.raises(estream.Closed):
            await late[0]
        meta = await client.describe_stream("close-race")
        assert meta.ranges[0].end == 10, meta.ranges
        assert [r.value async for r in client.read("close-race")] == [
            b"r%d" % i for i in range(10)]


async def test_a_batch_submitted_at_the_call_keeps_call_order_under_backpressure(
        cluster: Cluster) -> None:
    """``submit_batch``: many records with one future, submitted (or queued whole while the
    budget is spent) at the call, in call order with single appends; a timestamp 0 kept
    when asked (a Kafka record's CreateTime), a stamp on every record of the batch."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("batched", replicas=3, ack_count=2)
        async with await client.open_writer("batched") as writer:
            core = writer._core
            assert core is not None
            core.config = dataclasses.replace(
                core.config, inflight_bytes_max=4 * 1100, inflight_batches_max=2)
            before = [writer.append(b"%04d" % i + b"x" * 1000) for i in range(20)]
            batch = writer.submit_batch([b"b0", estream.Record(b"b1", timestamp=0),
                                         estream.Record(b"b2", key=b"k", timestamp=7)],
                                        zero_is_now=False)
            assert any(getattr(q, "future", None) is batch for q in writer._queue._queued)
            after = writer.append(b"after")
            assert await asyncio.gather(*before) == list(range(20))
            assert await batch == [20, 21, 22] and await after == 23
            assert await writer.submit_batch([]) == []
            bad = writer.submit_batch([b"ok", "not bytes"])  # type: ignore[list-item]
            with pytest.raises(estream.InvalidArgument):
                await bad
            assert await writer.append_batch([b"last"]) == [24]
        records = [r async for r in client.read("batched")]
        assert [r.value[:4] for r in records] == [b"%04d" % i for i in range(20)] + [
            b"b0", b"b1", b"b2", b"afte", b"last"]
        assert (records[21].timestamp, records[22].timestamp, records[22].key) == (0, 7, b"k")
        assert records[20].timestamp > 0 and records[21].key is None


async def test_an_append_cancelled_by_wait_for_is_still_stored_in_order(cluster: Cluster) -> None:
    """A ``wait_for`` that times out cancels the append's future, not its record: it was
    submitted at the call, so it is stored, in call order, and later appends go on."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("cancelled", replicas=3, ack_count=2)
        async with await client.open_writer("cancelled") as writer:
            assert await writer.append(b"first") == 0
            timed_out = 0
            for i in range(50):
                try:
                    await asyncio.wait_for(writer.append(b"c%02d" % i), 0)
                except TimeoutError:
                    timed_out += 1
            assert timed_out > 0
            offsets = await asyncio.gather(*(writer.append(b"n%02d" % i) for i in range(50)))
            assert offsets == list(range(51, 101))
            assert writer.statistics().completed == 101
        values = [r.value async for r in client.read("cancelled")]
        assert values == [b"first"] + [b"c%02d" % i for i in range(50)] + [
            b"n%02d" % i for i in range(50)]


def _placement(stream: StreamMeta) -> StreamMeta:
    """``stream`` without its ranges' statistics."""
    return dataclasses.replace(stream, ranges=tuple(
        dataclasses.replace(r, min_timestamp=None, max_timestamp=None, size_bytes=None,
                            batches=None)
        for r in stream.ranges))


async def test_rolls_ask_pd_for_the_new_ranges_only_and_keep_the_stream_whole(
    cluster: Cluster,
) -> None:
    """A writer's seal_range passes the stream it holds (PD answers the new ranges only,
    the earlier ones come from it): after many rolls its view equals PD's."""
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("rolls", replicas=3, ack_count=2)
        seal_range = client.pd.seal_range
        knowns: list[object] = []

        async def spy(*args: object, **kwargs: object) -> object:
            knowns.append(kwargs.get("known"))
            return await seal_range(*args, **kwargs)  # type: ignore[arg-type]

        client.pd.seal_range = spy  # type: ignore[method-assign, assignment]
        async with await client.open_writer("rolls") as writer:
            core = writer._core
            assert core is not None
            core.config = dataclasses.replace(core.config, range_bytes_max=2_000)
            for i in range(12):
                assert await writer.append(b"%03d" % i + b"x" * 1000) == i
            assert writer.statistics().rolls >= 4 and len(knowns) == writer.statistics().rolls
            assert all(known is not None for known in knowns)
            described = await client.describe_stream("rolls")
            # (a sealed range's statistics reach PD from its servers after the seal, so
            # they may be in PD's answer and never in the writer's view: compared apart)
            assert _placement(writer.stream) == _placement(described)
        values = [r.value[:3] async for r in client.read("rolls")]
        assert values == [b"%03d" % i for i in range(12)]
