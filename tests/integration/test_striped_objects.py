"""A striped stream's sealed ranges in the object tier (issue 30; docs/ARCHITECTURE.md
section 10): 1 PD node, 6 range servers, E 5, R 3, A 2, the shared ``file://`` object tier
fixture (tests/harness/objecttier.py).

Two ranges written and sealed by hand as in test_striped_reads.py (no server holds a whole
range: each holds 3 of every 5 batches). PD's offloader assembles each from its ensemble,
batch by batch from a server of its write set, into one object holding exactly the range's
records (no read of it failing), and the replicas are released; reads then find the ranges
in the object tier (whole and from inside a range), and the open range's records still on
the servers.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from tests.harness.objecttier import (
    ObjectTier,
    all_tiered,
    metric,
    object_values,
    tier_timeout_s,
    wait_for,
)
from tests.integration.test_striped_reads import SIZES, build, hand_writer, offsets, value

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=1, range_servers=6, object_tier=ObjectTier())]


async def test_the_offloader_assembles_a_striped_range_from_its_ensemble(
        cluster: Cluster, objects_dir: Path) -> None:
    cluster.wait_servers(6)
    async with await estream.connect(cluster.pd_addresses, timeout_s=5.0) as client:
        async with hand_writer(client, "so-tier") as writer:
            end = await build(writer, sealed=2, open_batches=3)
            ranges = await wait_for(lambda: all_tiered(cluster, "so-tier", released=True),
                                    tier_timeout_s, "both striped ranges in the object tier")
            assert [(r["start"], r["end"]) for r in ranges] == [(0, sum(SIZES)),
                                                               (sum(SIZES), 2 * sum(SIZES))]
            # read from the ensemble at once (the repair of unstriped ranges, which would
            # make whole replicas of them, has no part in it: no read of a range failed)
            assert metric(cluster, 'estream_offload_errors_total{stage="read"}') == 0
            for r in ranges:
                data = (objects_dir / r["object_key"]).read_bytes()
                assert object_values(data, r["start"], r["end"]) == [
                    value(o) for o in range(r["start"], r["end"])]
            await client.stream_meta("so-tier", refresh=True)
            assert await offsets(client, "so-tier") == list(range(end))
            assert await offsets(client, "so-tier", 40) == list(range(40, end))
