"""The object-storage tier's write side against SeaweedFS S3 (``weed mini`` on loopback,
every port explicit, telemetry off, explicit credentials; estream/devcluster/seaweed.py).

The module's SeaweedFS and cluster (the shared fixtures, ``object_tier=ObjectTier("s3")``:
1 PD with ``--object-store s3://estream/tier`` and ``--object-store-endpoint`` from the
environment, 3 range servers).

1. Sealed ranges are uploaded, committed ("object"), their objects hold exactly the
   range's records (read back through ``ObjectStore``), the local replicas are released,
   and deleting the stream deletes its objects.
2. The object store down (SeaweedFS stopped): appends are unaffected, sealed ranges stay
   local with their replicas, PUT errors are counted; once it is back, they are offloaded.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.seaweed import SeaweedS3
from tests.harness import objecttier as tier

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, object_tier=tier.ObjectTier("s3"))]


async def object_values(seaweed: SeaweedS3, key: str, start: int, end: int) -> list[bytes]:
    """The records of range ``[start, end)`` in object ``key`` (checked whole)."""
    return tier.object_values(await seaweed.store(tier.PREFIX).get(key), start, end)


async def test_offload_to_s3_release_and_delete(cluster: Cluster, seaweed: SeaweedS3) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("s3tier", replicas=3, ack_count=2)
        values = await tier.write_ranges(client, "s3tier", [80, 20])
        ranges = await tier.wait_for(lambda: tier.all_tiered(cluster, "s3tier", released=True),
                                     tier.tier_timeout_s,
                                     "both ranges in the object tier, released")
        got: list[bytes] = []
        for r in ranges:
            got += await object_values(seaweed, r["object_key"], r["start"], r["end"])
        assert got == values
        keys = {r["object_key"] for r in ranges}
        store = seaweed.store(tier.PREFIX)
        assert keys <= {o.key for o in await store.list("")}
        await client.delete_stream("s3tier")

    async def swept() -> bool:
        return not keys & {o.key for o in await store.list("")}

    for _ in range(int(tier.tier_timeout_s / 0.5)):
        if await swept():
            break
        await asyncio.sleep(0.5)
    assert await swept(), "the deleted stream's objects are still in the store"


async def test_store_down_keeps_local_copies_then_offloads(
    cluster: Cluster, seaweed: SeaweedS3, tmp_path: Path
) -> None:
    assert seaweed.process is not None
    seaweed.process.stop()
    errors_before = tier.metric(cluster, 'estream_object_requests_total{op="put",outcome="error"}')
    try:
        async with await estream.connect(cluster.pd_addresses) as client:
            await client.create_stream("outage", replicas=3, ack_count=2)
            values = await tier.write_ranges(client, "outage", [50])  # appends unaffected
            await tier.wait_for(
                lambda: tier.metric(cluster, 'estream_object_requests_total{op="put",'
                                             'outcome="error"}') > errors_before,
                tier.tier_timeout_s, "a failed PUT while the store is down")
            r = cluster.describe("outage")["ranges"][0]
            assert r["tier"] == "local" and len(r["replicas"]) == 3 and r["end"] == 50
    finally:
        seaweed.process.start()
    (r,) = await tier.wait_for(lambda: tier.all_tiered(cluster, "outage", released=False),
                               tier.tier_timeout_s + 60,
                               "the range offloaded once the store is back")
    assert await object_values(seaweed, r["object_key"], 0, 50) == values
