"""The object-storage tier's write side against SeaweedFS S3 (``weed mini`` on loopback,
every port explicit, telemetry off, explicit credentials; estream/devcluster/seaweed.py).

One module-scoped SeaweedFS and cluster (1 PD with ``--object-store s3://estream/tier``
and ``--object-store-endpoint`` from the environment, 3 range servers).

1. Sealed ranges are uploaded, committed ("object"), their objects hold exactly the
   range's records (read back through ``ObjectStore``), the local replicas are released,
   and deleting the stream deletes its objects.
2. The object store down (SeaweedFS stopped): appends are unaffected, sealed ranges stay
   local with their replicas, PUT errors are counted; once it is back, they are offloaded.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.seaweed import SeaweedS3, start_seaweed
from estream.wire.objectformat import decode_object, iter_object_batches
from estream.wire.record import decode_batch
from tests.integration.test_object_tier import (
    all_tiered,
    metric,
    start_tiered_cluster,
    tier_env,
    tier_timeout_s,
    wait_for,
    write_ranges,
)

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def seaweed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SeaweedS3]:
    server = start_seaweed(tmp_path_factory.mktemp("seaweed"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, seaweed: SeaweedS3) -> Iterator[Cluster]:
    env = {**tier_env(seaweed.url("tier")), **seaweed.env,
           "ESTREAM_OBJECT_STORE_ENDPOINT": seaweed.endpoint}
    c = start_tiered_cluster(tmp_path_factory.mktemp("tier-s3"), env, pd_nodes=1,
                             range_servers=3)
    try:
        yield c
    finally:
        c.stop()


async def object_values(seaweed: SeaweedS3, key: str, start: int, end: int) -> list[bytes]:
    """The records of range ``[start, end)`` in object ``key`` (checked whole)."""
    data = await seaweed.store("tier").get(key)
    index = decode_object(data)
    (entries,) = [e for _, _, e in index.ranges() if e and e[0].base_offset == start]
    lo, hi = entries[0].position, entries[-1].position + entries[-1].length
    records = [r for _, raw in iter_object_batches(data[lo:hi])
               for r in decode_batch(raw).records]
    assert [r.offset for r in records] == list(range(start, end))
    return [r.value for r in records]


async def test_offload_to_s3_release_and_delete(cluster: Cluster, seaweed: SeaweedS3) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("s3tier", replicas=3, ack_count=2)
        values = await write_ranges(client, "s3tier", [80, 20])
        ranges = await wait_for(lambda: all_tiered(cluster, "s3tier", released=True),
                                tier_timeout_s, "both ranges in the object tier, released")
        got: list[bytes] = []
        for r in ranges:
            got += await object_values(seaweed, r["object_key"], r["start"], r["end"])
        assert got == values
        keys = {r["object_key"] for r in ranges}
        store = seaweed.store("tier")
        assert keys <= {o.key for o in await store.list("")}
        await client.delete_stream("s3tier")

    async def swept() -> bool:
        return not keys & {o.key for o in await store.list("")}

    for _ in range(int(tier_timeout_s / 0.5)):
        if await swept():
            break
        await asyncio.sleep(0.5)
    assert await swept(), "the deleted stream's objects are still in the store"


async def test_store_down_keeps_local_copies_then_offloads(
    cluster: Cluster, seaweed: SeaweedS3, tmp_path: Path
) -> None:
    assert seaweed.process is not None
    seaweed.process.stop()
    errors_before = metric(cluster, 'estream_object_requests_total{op="put",outcome="error"}')
    try:
        async with await estream.connect(cluster.pd_addresses) as client:
            await client.create_stream("outage", replicas=3, ack_count=2)
            values = await write_ranges(client, "outage", [50])  # appends unaffected
            await wait_for(
                lambda: metric(cluster, 'estream_object_requests_total{op="put",'
                                        'outcome="error"}') > errors_before,
                tier_timeout_s, "a failed PUT while the store is down")
            r = cluster.describe("outage")["ranges"][0]
            assert r["tier"] == "local" and len(r["replicas"]) == 3 and r["end"] == 50
    finally:
        seaweed.process.start()
    (r,) = await wait_for(lambda: all_tiered(cluster, "outage", released=False),
                          tier_timeout_s + 60, "the range offloaded once the store is back")
    assert await object_values(seaweed, r["object_key"], 0, 50) == values
