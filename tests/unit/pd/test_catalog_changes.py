"""A leader's round and a node's gauges follow the catalog's changes, not a walk of every
stream (issue 27: at 40,000 streams the walks of ``/metrics``' under-replicated gauge,
sampled every 10 s on every node, and of the retainer's and offloader's rounds stalled a
PD node's event loop 0.1-0.4 s each).

``PMap.changes`` is checked against a brute-force diff on seeded random histories; the
narrowed round and the replica totals equal the whole walk, and once warm they never
iterate the catalog's map (a map that refuses to be walked proves it)."""

from __future__ import annotations

import doctest
import random
from dataclasses import replace
from typing import Any

import pd.drain
import pd.pmap
import pd.streammemo
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.drain import ReplicaTotals, replica_counts, under_replicated
from pd.pmap import PMap
from pd.retention import has_retention, recorded_bytes
from pd.streammemo import Chosen, Narrowing

SERVERS = ("a", "b", "c", "d")
REFS = {s: ReplicaRef(s, f"127.0.0.1:{i + 1}") for i, s in enumerate(SERVERS)}


class NoWalk(PMap[Any]):
    """A catalog map whose entries cannot be walked in turn (what a round must not do)."""

    def _leaves(self) -> Any:
        raise AssertionError("walked every entry of the catalog")


def no_walk(m: PMap[Any]) -> NoWalk:
    return NoWalk._of(m._root, len(m))  # type: ignore[return-value]


def test_doctests() -> None:
    for module in (pd.pmap, pd.drain, pd.streammemo):
        assert doctest.testmod(module).failed == 0


def _brute(old: PMap[Any], new: PMap[Any]) -> list[tuple[str, Any, Any]]:
    a, b = dict(old.items()), dict(new.items())
    return [(k, a.get(k), b.get(k)) for k in sorted(a.keys() | b.keys())
            if a.get(k) is not b.get(k)]


def test_changes_are_exactly_the_keys_whose_value_changed() -> None:
    rng = random.Random(27)
    for _ in range(10):
        m: PMap[object] = PMap({f"k{i:05d}": object() for i in range(rng.randrange(0, 2000))})
        for _ in range(5):
            new = m
            for _ in range(rng.randrange(0, 80)):
                key = f"k{rng.randrange(0, 4000):05d}"
                new = new.delete(key) if rng.random() < 0.4 else new.set(key, object())
            assert new.changes(m) == _brute(m, new)
            assert m.changes(new) == _brute(new, m)
            m = new
    assert PMap().changes(PMap()) == []


def test_changes_between_maps_of_other_heights_or_no_shared_node() -> None:
    """A map grown or shrunk past a root split or merge, and maps built apart (no node
    shared: every entry compared), still give exactly the keys whose value changed."""
    rng = random.Random(32)
    values = [object() for _ in range(50)]
    small: PMap[object] = PMap({f"k{i:05d}": values[i % 50] for i in range(30)})
    grown = small
    for i in range(30, 6_000):  # two levels of branches more
        grown = grown.set(f"k{i:05d}", values[i % 50])
    shrunk = grown
    for i in rng.sample(range(6_000), 5_990):
        shrunk = shrunk.delete(f"k{i:05d}")
    apart: PMap[object] = PMap({f"k{i:05d}": values[(i + i % 3) % 50] for i in range(3_000)})
    for a, b in [(small, grown), (grown, shrunk), (small, shrunk), (grown, apart),
                 (PMap(), grown), (apart, PMap(dict(apart.items())))]:
        assert b.changes(a) == _brute(a, b)
        assert a.changes(b) == _brute(b, a)


class _CountedKids(list[Any]):
    """A branch's kids that count the nodes a walk over them is handed."""

    handed = 0

    def __iter__(self) -> Any:
        _CountedKids.handed += len(self)
        return super().__iter__()


def _count_kids(*maps: PMap[Any]) -> None:
    stack: list[Any] = [m._root for m in maps]
    while stack:
        node = stack.pop()
        if isinstance(node, pd.pmap._Branch):
            node.kids = _CountedKids(node.kids)
            stack.extend(list.__iter__(node.kids))


def test_changes_visit_the_changed_paths_not_every_node() -> None:
    """Two changes in 100,000 entries: the two trees are walked down together and the
    nodes they share are not entered, so a few hundred nodes are handed over, not the
    ~4,300 of the two trees (issue 27: every follower of the catalog, the reclaimer's
    at each round's start too, paid that)."""
    m: PMap[int] = PMap({f"s{i:06d}": i for i in range(100_000)})
    new = m.set("s042000", -1).delete("s077000")
    _count_kids(m, new)
    _CountedKids.handed = 0
    assert new.changes(m) == [("s042000", 42_000, -1), ("s077000", 77_000, None)]
    assert _CountedKids.handed <= 400  # (the kids of two paths' nodes, in both trees)


def _stream(i: int, rng: random.Random) -> StreamMeta:
    ranges = []
    for j in range(rng.randrange(1, 6)):
        refs = tuple(REFS[s] for s in rng.sample(SERVERS, rng.randrange(1, 4)))
        sealed = j < 4 and rng.random() < 0.8
        ranges.append(RangeMeta(j, j * 10, j * 10 + 10 if sealed else None, refs))
        if not sealed:
            break
    return StreamMeta(i, f"s{i:05d}", replicas=3, ranges=tuple(ranges))


def _catalogs(seed: int, streams: int, steps: int) -> list[PMap[StreamMeta]]:
    rng = random.Random(seed)
    m: PMap[StreamMeta] = PMap({f"s{i:05d}": _stream(i, rng) for i in range(streams)})
    out = [m]
    for _ in range(steps):
        for _ in range(rng.randrange(0, 12)):
            i = rng.randrange(0, streams + 50)
            m = m.delete(f"s{i:05d}") if rng.random() < 0.2 else m.set(f"s{i:05d}",
                                                                          _stream(i, rng))
        out.append(m)
    return out


def test_a_narrowed_round_over_the_catalog_looks_only_at_what_changed() -> None:
    keep = lambda r: r.sealed and "b" in {x.id for x in r.replicas}  # noqa: E731
    work = Narrowing(keep)
    catalogs = _catalogs(seed=1, streams=1500, steps=10)
    work.narrow(catalogs[0].values())  # the first pass walks every stream once
    for m in catalogs[1:]:
        expected = [[r.index for r in n.ranges] for n in Narrowing(keep).narrow(list(m.values()))]
        got = work.narrow(no_walk(m).values())
        assert [[r.index for r in n.ranges] for n in got] == expected
        assert [n.name for n in got] == sorted(n.name for n in got)


def test_the_replica_totals_follow_the_catalog_without_walking_it() -> None:
    totals = ReplicaTotals()
    catalogs = _catalogs(seed=2, streams=1500, steps=10)
    totals.update(catalogs[0])
    for m in catalogs[1:]:
        alive = {"a", "c", "d"}
        streams = list(m.values())
        assert totals.under_replicated(no_walk(m), alive) == under_replicated(streams, alive)
        assert totals.replica_counts(no_walk(m)) == replica_counts(streams)
    # a mapping that is not the catalog's map is summed afresh
    assert totals.replica_counts(dict(catalogs[0].items())) == replica_counts(
        list(catalogs[0].values()))


def test_the_retainers_streams_with_limits_follow_the_catalog_without_walking_it() -> None:
    chosen = Chosen(has_retention, recorded_bytes)
    catalogs = _catalogs(seed=3, streams=1500, steps=10)
    rng = random.Random(3)
    limited = [m.update((k, replace(s, retention_ms=1000)) for k, s in m.items()
                        if rng.random() < 0.3) for m in catalogs]
    chosen.over(limited[0].values())
    for m in limited[1:]:
        expected = [(s.name, recorded_bytes(s)) for s in m.values() if has_retention(s)]
        assert [(s.name, n) for s, n in chosen.over(no_walk(m).values())] == expected


def test_the_replica_totals_forget_what_no_stream_has_any_more() -> None:
    totals = ReplicaTotals()
    catalogs = _catalogs(seed=4, streams=500, steps=10)
    for m in catalogs:
        totals.update(m)
    totals.update(PMap())
    assert (totals._per, totals._shared, totals._totals) == ({}, {}, {})
