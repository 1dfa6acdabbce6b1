"""``Client.read_batches`` against a real cluster (1 PD node, 3 range servers as
processes): the same records as ``Client.read`` over sealed ranges and the open range
(never past its confirm offset), each window trimmed to ``[start, end)``."""

from __future__ import annotations

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.wire.record import Record, decode_views

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, shared=True)]


async def by_batches(
    client: estream.Client, name: str, start: int = 0, end: int | None = None
) -> list[Record]:
    records: list[Record] = []
    async for columns in client.read_batches(name, start, end):
        assert columns.count > 0
        assert not records or columns.base_offset == records[-1].offset + 1
        records.extend(columns.records())
    return records


async def by_views(
    client: estream.Client, name: str, start: int = 0, end: int | None = None
) -> list[Record]:
    """``read_batch_views``, every answer's views decoded at once."""
    records: list[Record] = []
    async for views in client.read_batch_views(name, start, end):
        assert views and all(view.count > 0 for view in views)
        assert not records or views[0].start == records[-1].offset + 1
        records.extend(decode_views(views).records())
    return records


async def test_read_batches_equals_read_across_ranges_and_windows(cluster: Cluster) -> None:
    name = "batches"
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        async with await client.open_writer(name) as w1:  # range 0: mixed records
            await w1.append_batch([b"u%03d" % i for i in range(150)])
            await w1.append_batch(
                [
                    Record(b"h" * (i % 7), {"i": str(i)} if i % 2 else {}, 1000 + i)
                    for i in range(150)
                ]
            )
        async with await client.open_writer(name) as w2:  # seals range 0; range 1
            for lo in range(0, 200, 50):
                await w2.append_batch([b"%04d" % i for i in range(lo, lo + 50)])
        w3 = await client.open_writer(name, deferred_sync=True)  # seals range 1; range 2 open
        try:
            await w3.append_batch([b"f%d" % i for i in range(100)])
            await w3.force()
            await w3.append_batch([b"late%d" % i for i in range(50)])  # acked, not forced
            meta = await client.describe_stream(name)
            assert len(meta.ranges) == 3 and [r.sealed for r in meta.ranges] == [True, True, False]
            confirmed = await client.end_offset(name)
            assert 600 <= confirmed <= 650

            everything = [r async for r in client.read(name)]
            assert [r.offset for r in everything] == list(range(confirmed))
            assert await by_batches(client, name) == everything
            assert await by_views(client, name) == everything
            assert everything[151] == Record(b"h", {"i": "1"}, 1001, 151)

            sealed_end = meta.ranges[0].end
            assert sealed_end == 300
            windows = [
                (0, 1),
                (5, 17),
                (149, 152),
                (290, 310),
                (299, 300),
                (300, 301),
                (490, 510),
                (0, confirmed),
                (599, confirmed),
                (42, 42),
                (3, None),
            ]
            for start, end in windows:
                want = [r async for r in client.read(name, start, end)]
                got = await by_batches(client, name, start, end)
                assert got == want, (start, end)
                assert await by_views(client, name, start, end) == want, (start, end)
                stop = confirmed if end is None else end
                assert [r.offset for r in got] == list(range(start, stop)), (start, end)
        finally:
            await w3.close()


async def test_read_batches_of_a_trimmed_offset_raises(cluster: Cluster) -> None:
    name = "batches-trim"
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream(name, replicas=3, ack_count=2)
        async with await client.open_writer(name) as writer:
            await writer.append_batch([b"x"] * 20)
        await client.trim(name, 10)
        with pytest.raises(estream.OffsetOutOfRange):
            await by_batches(client, name, 0)
        assert [r.offset for r in await by_batches(client, name, 10)] == list(range(10, 20))
