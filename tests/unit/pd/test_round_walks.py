"""Two more leader rounds follow the catalog's changes, not a walk of every stream (issue
27): the repairer's forgetting of sealed replicas moved away (``SealedReports.prune``)
and the offloader's compaction planning (``pd.compaction.Planner``). Each gives what
the whole walk gives on seeded random histories of a catalog, and once warm it never
iterates the catalog's map (a map that refuses to be walked proves it) and looks at no
more than what changed."""

from __future__ import annotations

import doctest
import random
from dataclasses import replace
from typing import Any

import pytest

import pd.compaction
import pd.sealedreports
import pd.streammemo
from estream.wire.meta import ObjectPart, RangeMeta, ReplicaRef, StreamMeta
from pd.compaction import Compaction, CompactionRule, Planner, plan
from pd.pmap import PMap
from pd.reclaim import Drop, droppable
from pd.repair import SealedReports
from pd.replicareports import ReplicaReport
from pd.streammemo import StreamsById
from tests.unit.pd.test_catalog_changes import no_walk

SERVERS = ("a", "b", "c", "d")
REFS = {s: ReplicaRef(s, f"127.0.0.1:{i + 1}") for i, s in enumerate(SERVERS)}


def test_doctests() -> None:
    for module in (pd.compaction, pd.sealedreports, pd.streammemo):
        assert doctest.testmod(module).failed == 0


# -- SealedReports.prune ---------------------------------------------------------------------


def _placed_stream(sid: int, rng: random.Random) -> StreamMeta:
    ranges = tuple(RangeMeta(j, j * 10, j * 10 + 10, tuple(
        REFS[s] for s in rng.sample(SERVERS, rng.randrange(0, 4)))) for j in range(
        rng.randrange(1, 5)))
    return StreamMeta(sid, f"s{sid % 300:03d}", ranges=ranges)


def _reports(rng: random.Random, next_id: int) -> list[ReplicaReport]:
    out = []
    for _ in range(rng.randrange(0, 20)):
        sid, index = rng.randrange(1, next_id + 20), rng.randrange(0, 5)
        sealed = rng.random() < 0.8
        out.append(ReplicaReport(sid, index, False, sealed, 10, 10 if sealed else None))
    return out


def _remembered(memory: SealedReports) -> dict[str, dict[Any, ReplicaReport]]:
    return {s: memory.reports(s) for s in SERVERS}


def test_prune_over_the_catalog_forgets_what_a_whole_walk_forgets() -> None:
    """Random heartbeats, listings, forgets and catalog changes (replicas moved, ranges
    trimmed, streams deleted and created again under a new id): pruned over the
    catalog's map, the memory equals one pruned over a list of every stream each time."""
    for seed in range(6):
        rng = random.Random(seed)
        next_id = 1
        m: PMap[StreamMeta] = PMap()
        for _ in range(200):
            s = _placed_stream(next_id, rng)
            next_id += 1
            m = m.set(s.name, s)
        followed, walked = SealedReports(), SealedReports()
        for step in range(40):
            for _ in range(rng.randrange(0, 4)):
                server = rng.choice(SERVERS)
                reports = _reports(rng, next_id)
                complete = rng.random() < 0.1
                for memory in (followed, walked):
                    memory.observe(server, reports, complete=complete)
            if rng.random() < 0.3:
                server, key = rng.choice(SERVERS), (rng.randrange(1, next_id), 0)
                for memory in (followed, walked):
                    memory.forget(server, key)
            for _ in range(rng.randrange(0, 8)):
                name = f"s{rng.randrange(0, 320):03d}"
                old = m.get(name)
                if old is not None and rng.random() < 0.2:
                    m = m.delete(name)
                elif old is not None and rng.random() < 0.7:  # replicas moved or trimmed
                    m = m.set(name, replace(_placed_stream(old.id, rng), name=name))
                else:  # created (again): a new id
                    m = m.set(name, replace(_placed_stream(next_id, rng), name=name))
                    next_id += 1
            followed.prune((no_walk(m) if step else m).values())
            walked.prune(list(m.values()))
            assert _remembered(followed) == _remembered(walked), (seed, step)


def test_a_prune_looks_only_at_new_reports_and_the_streams_that_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(7)
    m: PMap[StreamMeta] = PMap((s.name, s) for s in (
        StreamMeta(i, f"s{i:04d}", ranges=tuple(RangeMeta(j, j, j + 1, (REFS["a"],))
                                                for j in range(3))) for i in range(1000)))
    memory = SealedReports()
    memory.observe("a", [ReplicaReport(i, j, False, True, 1, 1)
                         for i in range(1000) for j in range(3)])
    memory.prune(m.values())
    looked: list[Any] = []
    real = SealedReports._placed_on
    monkeypatch.setattr(SealedReports, "_placed_on",
                        lambda self, server, key: looked.append(key) or real(self, server, key))
    memory.prune(no_walk(m).values())
    assert looked == []  # nothing new, nothing changed: nothing looked up
    moved = replace(m["s0042"], ranges=tuple(replace(r, replicas=(REFS["b"],))
                                             for r in m["s0042"].ranges))
    m = m.set("s0042", moved)
    memory.observe("a", [ReplicaReport(rng.randrange(1000), 1, False, True, 1, 1)])
    memory.prune(no_walk(m).values())
    assert len(looked) <= 4  # the changed stream's three replicas on a, the new report
    assert sorted(k for k in memory.reports("a") if k[0] == 42) == []
    assert len(memory.reports("a")) == 2997



def test_the_reclaimers_index_follows_deletions_and_trims_without_a_walk() -> None:
    m: PMap[StreamMeta] = PMap((s.name, s) for s in (
        StreamMeta(i, f"s{i:04d}", ranges=tuple(RangeMeta(j, j, j + 1, (REFS["a"],))
                                                for j in range(3))) for i in range(1, 1001)))
    held = [(i, j) for i in range(1, 1001) for j in range(3)]
    index = StreamsById()
    assert index.follow(m.values()) is None  # the first pass: built
    assert droppable(held, index.by_id, 1001, "a") == []
    m = m.delete("s0007").set("s0042", replace(m["s0042"], ranges=m["s0042"].ranges[1:]))
    assert index.follow(no_walk(m).values()) == {7, 42}
    assert droppable(held, index.by_id, 1001, "a") == [
        Drop(7, 0, "deleted"), Drop(7, 1, "deleted"), Drop(7, 2, "deleted"),
        Drop(42, 0, "trimmed")]
    assert index.follow(no_walk(m).values()) == set()

# -- compaction planning ---------------------------------------------------------------------


def _tiered_stream(sid: int, name: str, rng: random.Random, keys: list[str]) -> StreamMeta:
    ranges = []
    for j in range(rng.randrange(0, 6)):
        kind = rng.random()
        if kind < 0.2:  # local, sealed
            ranges.append(RangeMeta(j, j * 10, j * 10 + 10, (REFS["a"],)))
            continue
        key = rng.choice(keys)
        lo = rng.randrange(0, 400)
        part = ObjectPart(lo, lo + rng.randrange(0, 300), 10_000, 10_052, j) if (
            kind < 0.9) else None  # (None: a version-1 object, never moved)
        replicas = (REFS["b"],) if rng.random() < 0.15 else ()
        ranges.append(RangeMeta(j, j * 10, j * 10 + 10, replicas, "object", key,
                                object_part=part))
    return StreamMeta(sid, name, ranges=tuple(ranges))


def _sources(plans: list[Compaction]) -> list[tuple[Any, ...]]:
    return [(c.sources, c.moves) for c in plans]


def test_the_planner_over_the_catalog_plans_what_a_whole_walk_plans() -> None:
    """Random catalogs of packed objects (shared keys, trims, deletes, re-creations,
    ranges still holding replicas, version-1 objects), sizes learned as the rounds go and
    ranges busy: the planner over the catalog's map plans what :func:`plan` plans over
    every stream, and never walks the map once warm."""
    for seed in range(8):
        rng = random.Random(seed)
        keys = [f"k{i:03d}" for i in range(60)]
        next_id = 1
        m: PMap[StreamMeta] = PMap()
        for i in range(150):
            m = m.set(f"s{i:03d}", _tiered_stream(next_id, f"s{i:03d}", rng, keys))
            next_id += 1
        planner = Planner()
        sizes: dict[str, int] = {}
        for step in range(30):
            for key in rng.sample(keys, rng.randrange(0, 8)):
                sizes.setdefault(key, rng.choice((300, 900, 2_000, 5_000, 20_000)))
            for _ in range(rng.randrange(0, 10)):
                name = f"s{rng.randrange(0, 170):03d}"
                if name in m and rng.random() < 0.2:
                    m = m.delete(name)
                else:
                    old = m.get(name)
                    sid = old.id if old is not None and rng.random() < 0.7 else next_id
                    next_id += 1
                    m = m.set(name, _tiered_stream(sid, name, rng, keys))
            streams = list(m.values())
            busy = {(s.id, r.index) for s in rng.sample(streams, min(3, len(streams)))
                    for r in s.ranges}
            size_max = 1_000 if step == 20 else 10_000  # (a new rule: weighed again)
            rule = CompactionRule(size_max, small_bytes=1_000, members_max=12)
            got = planner.plan((no_walk(m) if step else m).values(), dict(sizes), rule,
                               busy=busy)
            assert _sources(got) == _sources(plan(streams, sizes, rule, busy=busy)), (seed, step)


def test_the_planner_weighs_only_the_objects_that_changed(
        monkeypatch: pytest.MonkeyPatch) -> None:
    part = ObjectPart(0, 100, 900, 952, 1)
    m: PMap[StreamMeta] = PMap((f"s{i:04d}", StreamMeta(i, f"s{i:04d}", ranges=tuple(
        RangeMeta(j, j * 10, j * 10 + 10, (), "object", f"k{i:04d}-{j}", object_part=part)
        for j in range(5)))) for i in range(1000))
    sizes = {f"k{i:04d}-{j}": 200 for i in range(1000) for j in range(5)}
    planner = Planner()
    rule = CompactionRule(10**9, small_bytes=1_000)
    assert planner.plan(m.values(), sizes, rule)  # (small: worth rewriting)
    weighed: list[str] = []
    real = pd.compaction._worth
    monkeypatch.setattr(pd.compaction, "_worth", lambda moves, size, rule: weighed.append(
        moves[0].old_key) or real(moves, size, rule))
    planner.plan(no_walk(m).values(), sizes, rule)
    assert weighed == []  # nothing changed: nothing weighed
    s7 = m["s0007"]
    m = m.set("s0007", replace(s7, ranges=(*s7.ranges[:2], replace(
        s7.ranges[2], object_part=ObjectPart(0, 50, 900, 952, 1)), *s7.ranges[3:])))
    planner.plan(no_walk(m).values(), {**sizes, "new": 300}, rule)
    assert weighed == ["k0007-2"]  # (the range changed; no range names "new")
