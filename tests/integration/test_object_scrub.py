"""The PD leader's object scrub (pd/scrub.py, pd/shell/scrubber.py), step by step on the
rig of ``test_offloader_faults`` (a real catalog and ``file://`` store, scripted range
servers and Raft), the fake clock moved by each step's wait:

- an object damaged on disk behind estream's back is found within one period and its
  range uploaded again from its replicas (a new key, the records whole);
- one damaged after the release (no replica left) is counted lost, the key kept, the
  lost-range metric (which the alert rule watches) raised;
- a missing object is found too; a busy object is left for the next pass;
- the waits spread the period over the objects, and the bytes/s cap lengthens them;
- the scrub's metrics pass ``promtool check metrics``.

Against real processes (1 PD scrubbing every 3 s, 3 range servers, replicas kept): a
byte flipped in an object nobody reads is found by the scrub, the range uploaded again
under a new key, and every record reads back with every range server stopped.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.server.metrics import FamiliesCollector, exposition, new_registry
from pd.scrub import ScrubPace
from pd.shell.scrubber import Scrubber
from tests.harness.objecttier import ObjectTier, all_tiered, metric, wait_for, write_ranges
from tests.integration.test_object_damage import (
    REPAIR_TIMEOUT_S,
    file_tier,
    read_values,
    servers_stopped,
    tiered_under_new_key,
)
from tests.integration.test_offloader_damage import counter, flip
from tests.integration.test_offloader_faults import (
    EXPECTED,
    Rig,
    Status,
    rig,
    second_stream,
    t0_id,
    values_of,
    values_of_part,
)
from tests.system_tools import require_tool

__all__ = ["rig"]  # the fixture, shared

PERIOD_MS = 60_000


async def three_objects(rig: Rig) -> list[str]:
    """s/0, t/0 and u/0 each committed in an object of its own (replicas kept)."""
    rig.offloader.object_size_bytes = 1
    second_stream(rig)
    second_stream(rig, "u", end=25)
    await rig.round_at(1_000)
    keys = sorted(rig.raft.catalog.view().object_refs)
    assert len(keys) == 3
    return keys


def scrubber(rig: Rig, bytes_per_s_max: int = 10**9) -> Scrubber:
    return Scrubber(rig.service, rig.offloader,  # type: ignore[arg-type]
                    ScrubPace(PERIOD_MS, bytes_per_s_max))


async def scrub_until(rig: Rig, scrub: Scrubber, done: object, ms_max: int) -> int:
    """Steps (the clock moved by each wait) until ``done()``; the time it took (ms)."""
    elapsed = 0
    for _ in range(100):
        if done():  # type: ignore[operator]
            return elapsed
        assert elapsed <= ms_max, "not found within the period"
        wait = await scrub.step()
        elapsed += wait
        rig.service.now_ms += wait
    raise AssertionError("the scrub never got there")


async def test_a_damaged_object_is_found_within_the_period_and_uploaded_again(
        rig: Rig) -> None:
    keys = await three_objects(rig)
    t_key = rig.raft.catalog.stream("t").ranges[0].object_key
    assert t_key is not None and t_key in keys
    flip(rig, t_key)
    scrub = scrubber(rig)

    def t_moved() -> bool:
        return rig.raft.catalog.stream("t").ranges[0].object_key not in (None, t_key)

    await scrub_until(rig, scrub, t_moved, PERIOD_MS)
    new = rig.raft.catalog.stream("t").ranges[0].object_key
    assert values_of_part(rig, new or "", t0_id(rig)) == [f"v{i}".encode() for i in range(20)]
    assert len(rig.raft.catalog.stream("t").ranges[0].replicas) == 3
    assert counter(rig, "estream_object_scrub_damaged_total") == 1
    assert counter(rig, "estream_object_damage_repaired_ranges_total") == 1
    assert counter(rig, "estream_object_scrub_objects_total", result="damaged") == 1
    assert counter(rig, "estream_object_scrub_bytes_total") > 0
    assert rig.range0().object_key in keys  # the sound ones stay
    assert values_of(rig, rig.range0().object_key or "") == EXPECTED


async def test_damage_without_replicas_is_counted_lost(rig: Rig) -> None:
    await rig.round_at(1_000)
    await rig.round_at(100)
    await rig.round_at(5_000)  # released
    key = rig.range0().object_key
    assert key is not None and rig.range0().replicas == ()
    flip(rig, key)
    scrub = scrubber(rig)
    await scrub_until(rig, scrub, lambda: counter(
        rig, "estream_object_damage_lost_ranges_total") == 1, PERIOD_MS)
    assert rig.range0().object_key == key  # nothing to upload from: the key stays
    assert "object_damaged" not in [c.kind for c in rig.raft.proposed]
    assert counter(rig, "estream_object_scrub_damaged_total") == 1


async def test_a_missing_object_is_found_and_a_busy_one_skipped(rig: Rig) -> None:
    keys = await three_objects(rig)
    s_key = rig.range0().object_key
    assert s_key is not None
    (rig.root / s_key).unlink()
    rig.offloader.busy.add((rig.stream.id, 0))  # being released, say: left for now
    scrub = scrubber(rig)
    for _ in range(len(keys)):
        await scrub.step()
    assert rig.range0().object_key == s_key
    assert counter(rig, "estream_object_scrub_objects_total", result="sound") == 2
    rig.offloader.busy.clear()
    await scrub_until(rig, scrub, lambda: rig.range0().object_key not in (None, s_key),
                      PERIOD_MS)
    assert values_of(rig, rig.range0().object_key or "") == EXPECTED


async def test_the_waits_spread_the_period_and_obey_the_cap(rig: Rig) -> None:
    keys = await three_objects(rig)
    assert await scrubber(rig).step() == PERIOD_MS // len(keys)
    read = counter(rig, "estream_object_scrub_bytes_total")
    assert read > 0
    slow = scrubber(rig, bytes_per_s_max=1)  # one byte a second: the cap rules
    assert await slow.step() == read * 1000
    rig.raft.status = lambda: Status(role="follower")  # type: ignore[method-assign]
    assert await slow.step() == PERIOD_MS  # a follower scrubs nothing
    assert counter(rig, "estream_object_scrub_objects_total", result="sound") == 2


async def test_scrub_metrics_pass_promtool(rig: Rig) -> None:
    promtool = require_tool("promtool", package="prometheus")  # CI: missing fails
    keys = await three_objects(rig)
    flip(rig, keys[0])
    scrub = scrubber(rig)
    for _ in keys:
        await scrub.step()
    registry = new_registry()
    registry.register(FamiliesCollector(rig.service.metrics.families))
    text = exposition(registry)
    for name in ("estream_object_scrub_objects_total", "estream_object_scrub_bytes_total",
                 "estream_object_scrub_damaged_total"):
        assert name.encode() in text, name
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.integration
@pytest.mark.cluster(fresh=True, pd_nodes=1, range_servers=3, object_tier=ObjectTier(
    offload_delay_s=0.5, local_retention_s=600, orphan_grace_s=None, scrub_period_s=3))
async def test_the_scrub_finds_an_object_nobody_reads(cluster: Cluster,
                                                     objects_dir: Path) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("scrubbed", replicas=3, ack_count=2)
        values = await write_ranges(client, "scrubbed", [60])
    (r0,) = await wait_for(lambda: all_tiered(cluster, "scrubbed", released=False),
                           REPAIR_TIMEOUT_S, "range 0 in the object tier")
    old = r0["object_key"]
    await file_tier(objects_dir).flip(old, r0["object_part"]["data"][0] + 80)
    await wait_for(lambda: tiered_under_new_key(cluster, "scrubbed", 0, old),
                   REPAIR_TIMEOUT_S, "range 0 found by the scrub and uploaded again")
    assert metric(cluster, "estream_object_scrub_damaged_total") >= 1
    await wait_for(lambda: metric(
        cluster, 'estream_object_scrub_objects_total{result="sound"}') >= 1,
        REPAIR_TIMEOUT_S, "the new object scrubbed and found sound")
    with servers_stopped(cluster):
        assert await read_values(cluster.pd_addresses, "scrubbed", len(values)) == values
