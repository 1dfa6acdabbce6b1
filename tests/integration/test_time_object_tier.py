"""``offset_for_time`` over ranges in the object tier (issue #18), on a real cluster whose
PD offloads sealed ranges at once and drops their local replicas a second later: every
boundary (each timestamp, one below, one above) equals the naive answer once the sealed
ranges' replicas are gone, with timestamps that go backwards within and across ranges."""

from __future__ import annotations

import asyncio
import time

import pytest

import estream
from estream.devcluster.cluster import Cluster
from tests.harness.objecttier import ObjectTier, all_tiered
from tests.integration.test_time_cursors import T0, naive, write_ranges

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=3, object_tier=ObjectTier())]


async def test_lookups_in_object_tier_ranges(cluster: Cluster) -> None:
    groups = [[T0 + 10, T0 + 30, T0 + 20], [T0 + 25, T0 + 50, T0 + 40, T0 + 5],
              [T0 + 45, T0 + 60], [T0 + 70]]
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("tiered-times")
        stamps = await write_ranges(client, "tiered-times", groups)
        deadline = time.monotonic() + 60
        while all_tiered(cluster, "tiered-times", released=True) is None:
            assert time.monotonic() < deadline, "sealed ranges not offloaded and released"
            await asyncio.sleep(0.5)
        meta = await client.describe_stream("tiered-times")
        assert all(r.tier == "object" and not r.replicas for r in meta.ranges if r.sealed)
        for t in sorted({p for s in stamps for p in (s - 1, s, s + 1)} | {0}):
            assert await client.offset_for_time("tiered-times", t) == naive(stamps, t), t
