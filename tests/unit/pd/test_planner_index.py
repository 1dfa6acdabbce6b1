"""The compaction planner's index kept from what each command changed (issue 27): after
any sequence of real catalog commands (seals, trims, deletes and re-creations, packs
committed, rewritten by compaction and released), the index kept from the ranges the
commands touched equals the index a fresh planner builds from the whole catalog, and so
do the plans; a change on a long stream costs the ranges it changed, not all of them.
Chunks are shrunk to 4 ranges so that short histories cross many chunk boundaries."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from itertools import count
from unittest import mock

from hypothesis import given, settings
from hypothesis import strategies as st

import pd.compaction
import pd.rangelist
from estream.wire.errors import EstreamError
from estream.wire.meta import ObjectPart, RangeMeta, StreamMeta
from pd.catalog import Catalog
from pd.commands import (
    CommitPack,
    CreateStream,
    DeleteStream,
    DropLocalReplicas,
    OpenWriter,
    PackMember,
    PreparePack,
    SealRange,
    TrimStream,
)
from pd.compaction import CompactionRule, Planner, plan
from pd.pmap import PMap
from pd.rangelist import RangeList, range_changes
from tests.unit.pd.catalogs import registered

PLACEMENT = ("s1", "s2")
NAMES = ("a", "b", "c")
RULE = CompactionRule(10_000, small_bytes=1_000, members_max=12)


def _catalog() -> Catalog:
    catalog = registered(["s1", "s2", "s3"])
    for name in NAMES:
        catalog.apply(CreateStream(name, 2, 2, "", (), PLACEMENT))
        _seal(catalog, name, 10)
    return catalog


def _seal(catalog: Catalog, name: str, count: int) -> None:
    """``count`` seals of ``name``'s last range (a writer's session each)."""
    for _ in range(count):
        s = catalog.stream(name)
        last = s.ranges[-1] if s.ranges else None
        if last is None or last.end is not None:
            catalog.apply(OpenWriter(name))
            continue
        catalog.apply(SealRange(name, s.epoch, last.index, last.start + 3, PLACEMENT))


def _members(catalog: Catalog, picks: list[tuple[str, int]], *,
             replaces: str = "") -> tuple[PackMember, ...]:
    out: dict[tuple[int, int], PackMember] = {}
    for name, at in picks:
        s = catalog.stream(name)
        sealed = [r for r in s.ranges
                  if r.end is not None and (r.object_key or "") == replaces]
        if sealed:
            r = sealed[at % len(sealed)]
            assert r.end is not None
            out[(s.id, r.index)] = PackMember(name, s.id, r.index, r.start, r.end,
                                              replaces=replaces)
    return tuple(out.values())


def _parted(ms: tuple[PackMember, ...]) -> tuple[PackMember, ...]:
    return tuple(replace(m, part=ObjectPart(100 * i, 100 * i + 100, 1000 + 52 * i,
                                            1052 + 52 * i, i)) for i, m in enumerate(ms))


_PICKS = st.lists(st.tuples(st.sampled_from(NAMES), st.integers(0, 30)), min_size=1,
                  max_size=6)
ACTIONS = st.lists(st.one_of(
    st.tuples(st.just("seal"), st.sampled_from(NAMES), st.integers(1, 12)),
    st.tuples(st.just("trim"), st.sampled_from(NAMES), st.integers(0, 60)),
    st.tuples(st.just("delete"), st.sampled_from(NAMES), st.just(0)),
    st.tuples(st.just("create"), st.sampled_from(NAMES), st.just(0)),
    st.tuples(st.just("pack"), _PICKS, st.integers(0, 7)),
    st.tuples(st.just("pack"), _PICKS, st.integers(0, 7)),
    st.tuples(st.just("compact"), _PICKS, st.integers(1, 6)),
    st.tuples(st.just("compact"), _PICKS, st.integers(1, 6)),
    st.tuples(st.just("release"), st.sampled_from(NAMES), st.integers(0, 3)),
    st.tuples(st.just("release"), st.sampled_from(NAMES), st.just(0)),
), min_size=5, max_size=40)


def _apply(catalog: Catalog, action: tuple[object, object, int], serial: Iterator[int]) -> None:
    what, arg, n = action
    try:
        if what == "seal":
            _seal(catalog, str(arg), n)
        elif what == "trim":
            catalog.apply(TrimStream(str(arg), n))
        elif what == "delete":
            catalog.apply(DeleteStream(str(arg)))
        elif what == "create":
            catalog.apply(CreateStream(str(arg), 2, 2, "", (), PLACEMENT))
        elif what == "pack":
            ms = _members(catalog, list(arg))  # type: ignore[call-overload]
            key = f"k{next(serial)}.eso"
            catalog.apply(PreparePack(key, 10**12, ms))
            catalog.apply(CommitPack(key, _parted(ms)))
        elif what == "compact":
            old = f"k{n}.eso"
            ms = _members(catalog, list(arg), replaces=old)  # type: ignore[call-overload]
            key = f"k{next(serial)}.eso"
            catalog.apply(PreparePack(key, 10**12, ms))
            catalog.apply(CommitPack(key, _parted(ms), compaction=True))
        elif what == "release":
            s = catalog.stream(str(arg))
            held = [r for r in s.ranges if r.object_key is not None and r.replicas]
            for r in held[n % max(1, len(held)):]:
                assert r.object_key is not None
                catalog.apply(DropLocalReplicas(s.name, s.id, r.index, r.object_key))
    except EstreamError:
        pass  # (a command refused leaves the catalog as it was)


def _sizes(serial: int) -> dict[str, int]:
    return {f"k{i}.eso": (300, 900, 5_000, 20_000)[i % 4] for i in range(serial)}


@settings(max_examples=150, deadline=None)
@given(ACTIONS)
def test_the_index_kept_from_changes_equals_a_rebuild(actions: list[tuple[object, object, int]],
                                                      ) -> None:
    with mock.patch.object(pd.rangelist, "chunk_ranges_max", 4):
        catalog, planner = _catalog(), Planner()
        keys = count(1)
        for action in actions:
            _apply(catalog, action, keys)
            streams = catalog.view().streams.values()
            sizes = _sizes(next(keys))
            got = planner.plan(streams, sizes, RULE)
            fresh = Planner()
            assert fresh.plan(list(streams), sizes, RULE) == got == plan(streams, sizes, RULE)
            assert planner.index() == fresh.index()


def test_a_change_on_a_long_stream_costs_the_ranges_it_changed() -> None:
    """20,000 ranges, the last one sealed (the next opened), then the one before
    committed to an object: the planner's update makes the index entry of that range
    alone, not of the stream's 20,000 (each in an object)."""
    part = ObjectPart(0, 100, 900, 952, 1)
    before = RangeList([*(RangeMeta(i, i * 3, i * 3 + 3, (), "object", f"k{i}.eso",
                                    object_part=part) for i in range(19_999)),
                        RangeMeta(19_999, 59_997, None, ())])
    sealed = replace(before[-1], end=60_000)
    after = before.with_last(sealed, RangeMeta(20_000, 60_000, None, ()))
    gone, come = range_changes(before, after)
    assert (gone, come) == ([before[-1]], [sealed, after[-1]])
    after = after.replace_at(19_999, replace(sealed, tier="object", object_key="new.eso",
                                             object_part=part))
    s0 = StreamMeta(1, "s", ranges=before)
    m0, m1 = PMap({"s": s0}), PMap({"s": replace(s0, ranges=after)})
    planner = Planner()
    planner.plan(m0.values(), {}, RULE)
    made: list[int] = []
    real = pd.compaction.Move

    def counted(*fields: object) -> object:
        made.append(1)
        return real(*fields)  # type: ignore[arg-type]
    with mock.patch.object(pd.compaction, "Move", counted):
        planner.plan(m1.values(), {}, RULE)
    assert len(made) == 1  # (the whole stream walked again: 20,000)
    fresh = Planner()
    fresh.plan(m1.values(), {}, RULE)
    assert planner.index() == fresh.index() and len(fresh.index()) == 20_000


def test_a_stream_under_a_new_id_is_indexed_again_whole() -> None:
    """A name whose stream has another id now (re-created) holding the very same range
    objects: every entry is made again under the new id, none left under the old."""
    part = ObjectPart(0, 100, 900, 952, 1)
    ranges = RangeList(RangeMeta(i, i, i + 1, (), "object", "k.eso", object_part=part)
                       for i in range(3))
    s0 = StreamMeta(1, "s", ranges=ranges)
    m0, m1 = PMap({"s": s0}), PMap({"s": replace(s0, id=2)})
    planner, fresh = Planner(), Planner()
    planner.plan(m0.values(), {}, RULE)
    planner.plan(m1.values(), {}, RULE)
    fresh.plan(m1.values(), {}, RULE)
    assert planner.index() == fresh.index()
    assert set(planner.index()["k.eso"]) == {(2, 0), (2, 1), (2, 2)}
