"""Reads follow the catalog, not a replica's own idea of the range (real processes).

- A replica sealed below the catalog's end does not end a read silently: the read fails
  over to a replica that has the rest.
- A sealed range is read to the catalog's end even where no replica's confirm offset got
  there (a writer died after PD recorded the seal and before it told the replicas), and a
  replica holding records past that end never serves them: answers are clipped.
"""

from __future__ import annotations

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.wire.protocol import Opcode
from estream.wire.record import Record, encode_records, wrap_records

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, shared=True)]

COUNT = 20


async def _write(client: estream.Client, name: str) -> estream.Writer:
    """A writer that appended ``COUNT`` records and stays open (its lease alive): its
    range stays open for the test to seal as it likes (a writer seals it at close)."""
    await client.create_stream(name, replicas=3, ack_count=2)
    writer = await client.open_writer(name)
    for i in range(COUNT):
        await writer.append(b"v%d" % i)
    await writer.flush()
    return writer


async def test_a_replica_sealed_short_does_not_end_a_read(cluster: Cluster) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        writer = await _write(client, "short")
        meta = writer.stream
        short = meta.ranges[-1].replicas[0]
        body, _ = await client.pool.call(short.address, Opcode.SEAL, {
            "stream_id": meta.id, "range_index": 0, "epoch": meta.epoch, "end": 5,
            "server_id": short.id,
        })
        assert body["sealed"] and body["end"] == 5
        values = [r.value async for r in client.read("short", replica=short.id)]
        assert values == [b"v%d" % i for i in range(COUNT)]
        await writer.close()


async def test_a_sealed_range_reads_to_the_catalog_end_and_never_past_it(
    cluster: Cluster,
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        writer = await _write(client, "clip")
        meta = writer.stream
        replicas = meta.ranges[-1].replicas

        def batch(base: int, count: int, value: bytes) -> bytes:
            return wrap_records(
                encode_records([Record(value, {}, 1)] * count),
                stream_id=meta.id, range_index=0, epoch=meta.epoch, base_offset=base,
                confirm_offset=COUNT,
            )

        async def append(ref: estream.wire.meta.ReplicaRef, payload: bytes) -> int:
            body, _ = await client.pool.call(
                ref.address, Opcode.APPEND, {"deferred": False, "server_id": ref.id}, payload
            )
            return int(body["end"])

        # [COUNT, COUNT + 5) on two replicas: acknowledged, never confirmed to anyone. The
        # writer then records the seal in PD at COUNT + 5 and dies before telling replicas.
        # One of them also holds two records past that end, never acknowledged.
        assert await append(replicas[0], batch(COUNT, 5, b"late")) == COUNT + 5
        assert await append(replicas[1], batch(COUNT, 5, b"late")) == COUNT + 5
        assert await append(replicas[0], batch(COUNT + 5, 2, b"ghost")) == COUNT + 7
        await client.pd.seal_range("clip", meta.epoch, 0, COUNT + 5)
        await writer.close()  # (its seal at COUNT is refused: PD's end stands)
    async with await estream.connect(cluster.pd_addresses) as reader:
        for preferred in replicas:
            records = [r async for r in reader.read("clip", replica=preferred.id)]
            assert [r.offset for r in records] == list(range(COUNT + 5)), preferred
            assert [r.value for r in records[COUNT:]] == [b"late"] * 5
