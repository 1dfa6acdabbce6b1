"""The object tier under a double fault, real processes: the PD leader and a replica of
the range are killed (-9) right after the range is sealed, around its upload.

Three PD nodes (tier settings from the environment, as in test_object_tier.py), three range
servers, a ``file://`` store. The new leader starts its offload clocks again and uploads
from the surviving replicas: the range becomes "object" holding exactly its records; an
upload the old leader may have left uncommitted is swept, so in the end the store holds
exactly the objects the catalog names.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from tests.integration.test_object_tier import (
    all_tiered,
    file_tier_cluster,
    object_values,
    objects_dir,
    tier_timeout_s,
    wait_for,
    write_ranges,
)

__all__ = ["objects_dir"]  # the module-scoped fixture, shared

pytestmark = [pytest.mark.integration]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory, objects_dir: Path) -> Iterator[Cluster]:
    yield from file_tier_cluster(tmp_path_factory, objects_dir, pd_nodes=3)


def stored(objects_dir: Path) -> set[str]:
    return {str(p.relative_to(objects_dir)) for p in objects_dir.rglob("*.eso")}


async def test_pd_leader_and_a_replica_killed_around_the_upload(
    cluster: Cluster, objects_dir: Path
) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("faulty", replicas=3, ack_count=2)
        values = await write_ranges(client, "faulty", [150])
    victim = cluster.describe("faulty")["ranges"][0]["replicas"][0]["address"]
    cluster.kill9(victim)
    old_leader = cluster.kill_pd_leader()
    try:
        (r,) = await wait_for(lambda: all_tiered(cluster, "faulty", released=False),
                              tier_timeout_s, "range 0 offloaded by the new leader")
        assert (r["start"], r["end"]) == (0, 150)
        assert object_values(objects_dir / r["object_key"], 0, 150) == values
    finally:
        cluster.restart_pd(old_leader)
        cluster.restart(victim)
    await wait_for(lambda: stored(objects_dir) == {r["object_key"]}, tier_timeout_s,
                   "only the committed object left in the store")
