"""The PD offloader's handling of readers' damage reports (pd/shell/offloader.py,
pd/objectdamage.py), step by step on the rig of ``test_offloader_faults`` (a real catalog
and ``file://`` store, scripted range servers and Raft):

- a report is never trusted: a stale one (another key) is ignored, a sound object is
  read back and left alone (and not checked again for a while), a store failing the
  check leaves everything as it is;
- a damaged object with replicas left: the range goes back to the local tier
  (``object_damaged``), is uploaded again at once under a new key, and the old object,
  unreferenced, is deleted;
- a damaged object whose replicas are released: the range keeps its key, counted lost
  once;
- a truncated object (its ranged GETs fail as in an outage) is damage, by its size;
- the metrics pass ``promtool check metrics``.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from estream.server.metrics import FamiliesCollector, exposition, new_registry
from pd.objectdamage import DamageReport, recheck_ms_default
from tests.integration.test_offloader_faults import EXPECTED, Rig, rig, values_of
from tests.system_tools import require_tool

__all__ = ["rig"]  # the fixture, shared


def flip(rig: Rig, key: str) -> None:
    path: Path = rig.root / key
    data = bytearray(path.read_bytes())
    data[100] ^= 0x01  # inside the first batch's records
    path.write_bytes(bytes(data))


def report(rig: Rig, key: str) -> str:
    return rig.offloader.report_damage(DamageReport(rig.stream.id, 0, key, "checksum"))


def counter(rig: Rig, name: str, **labels: str) -> int:
    return rig.service.metrics.counter(name, **labels)


async def offloaded(rig: Rig) -> str:
    await rig.round_at(1_000)
    key = rig.range0().object_key
    assert key is not None
    return key


async def test_a_report_is_checked_before_anything_moves(rig: Rig) -> None:
    key = await offloaded(rig)
    assert report(rig, "05/1/0/t0-c0.eso") == "stale"  # the range names another key
    assert report(rig, key) == "queued"
    assert report(rig, key) == "pending"
    await rig.round_at(100)  # read back whole: nothing moves
    assert counter(rig, "estream_object_damage_checks_total", result="sound") == 1
    assert rig.range0().object_key == key and len(rig.range0().replicas) == 3
    assert report(rig, key) == "recent"
    flip(rig, key)
    rig.service.now_ms += recheck_ms_default
    assert report(rig, key) == "queued"
    await rig.round_at(100)  # damaged: back to local, uploaded again at once
    r = rig.range0()
    assert r.tier == "object" and r.object_key not in (None, key) and len(r.replicas) == 3
    assert values_of(rig, r.object_key) == EXPECTED
    assert [c.kind for c in rig.raft.proposed].count("object_damaged") == 1
    assert counter(rig, "estream_object_damage_checks_total", result="damaged") == 1
    assert counter(rig, "estream_object_damage_repaired_ranges_total") == 1
    await rig.round_at(100)  # the old key, unreferenced, deleted
    assert rig.objects() == {r.object_key}
    assert counter(rig, "estream_object_damage_reports_total", outcome="queued") == 2


async def test_a_store_failing_the_check_leaves_everything(rig: Rig) -> None:
    key = await offloaded(rig)
    flip(rig, key)
    rig.store.hang_gets = 1  # the check's GET hangs past the store's deadline
    assert report(rig, key) == "queued"
    await rig.round_at(100)
    assert counter(rig, "estream_object_damage_checks_total", result="inconclusive") == 1
    assert rig.range0().object_key == key and len(rig.range0().replicas) == 3
    assert report(rig, key) == "queued"  # not counted as checked: the next report checks
    await rig.round_at(100)
    assert rig.range0().object_key not in (None, key)


async def test_damage_after_the_release_is_counted_lost_once(rig: Rig) -> None:
    key = await offloaded(rig)
    await rig.round_at(100)
    await rig.round_at(5_000)  # released
    assert rig.range0().replicas == ()
    flip(rig, key)
    assert report(rig, key) == "queued"
    await rig.round_at(100)
    assert rig.range0().object_key == key  # nothing to upload from: the key stays
    assert "object_damaged" not in [c.kind for c in rig.raft.proposed]
    assert counter(rig, "estream_object_damage_lost_ranges_total") == 1
    rig.service.now_ms += recheck_ms_default
    assert report(rig, key) == "queued"
    await rig.round_at(100)
    assert counter(rig, "estream_object_damage_checks_total", result="damaged") == 2
    assert counter(rig, "estream_object_damage_lost_ranges_total") == 1  # the same range


async def test_counters_alerts_watch_exist_before_their_first_event(rig: Rig) -> None:
    """``EstreamObjectRangeLost`` takes ``increase()`` of the lost-ranges counter: a series
    first scraped at 1 increases by nothing, so it must be there at 0 from the start."""
    registry = new_registry()
    registry.register(FamiliesCollector(rig.service.metrics.families))
    text = exposition(registry).decode()
    for name in ("estream_object_damage_lost_ranges_total",
                 "estream_object_damage_repaired_ranges_total",
                 "estream_offload_ranges_total", "estream_objects_deleted_total"):
        assert f"\n{name} 0.0\n" in text, name


async def test_damage_metrics_pass_promtool(rig: Rig) -> None:
    promtool = require_tool("promtool", package="prometheus")  # CI: missing fails
    key = await offloaded(rig)
    report(rig, key)
    await rig.round_at(100)  # sound
    flip(rig, key)
    rig.service.now_ms += recheck_ms_default
    report(rig, key)
    report(rig, "other.eso")
    await rig.round_at(100)  # damaged, repaired
    registry = new_registry()
    registry.register(FamiliesCollector(rig.service.metrics.families))
    text = exposition(registry)
    for name in ("estream_object_damage_reports_total", "estream_object_damage_checks_total",
                 "estream_object_damage_repaired_ranges_total"):
        assert name.encode() in text, name
    checked = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


async def test_a_truncated_object_is_damage_not_an_outage(rig: Rig) -> None:
    key = await offloaded(rig)
    path = rig.root / key
    path.write_bytes(path.read_bytes()[:100])  # its part's index is past the end now
    assert report(rig, key) == "queued"
    await rig.round_at(100)
    assert counter(rig, "estream_object_damage_checks_total", result="damaged") == 1
    assert rig.range0().object_key not in (None, key)
