"""The PD leader's background rounds walk only the ranges of the streams that changed
(issues 27 and 28), and decide exactly what a walk of every range decides.

Two kinds of tests: on seeded random catalogs, changed between passes as commands would
(new entries for some streams, others the same objects), each loop's narrowed or
remembered decision equals the whole walk written out as the loops took it before
``pd/streammemo.py``; and on a long stream built through real catalog commands, a second
round over an unchanged catalog reads none of its ranges."""

from __future__ import annotations

import doctest
import random
from dataclasses import replace
from typing import Any

import pd.streammemo
from estream.wire.meta import RangeMeta, ReplicaRef, StreamMeta
from pd.catalog import Catalog
from pd.commands import CreateStream, OpenWriter, RecordRangeStats, RegisterServer, SealRange
from pd.drain import replica_counts, replica_sets, under_replicated
from pd.metrics import Metrics
from pd.repair import SealedReports, ServerState, has_replicas, plan_repairs, track_short
from pd.replicareports import ReplicaReport
from pd.retention import needs_stats, plan_trim, recorded_bytes, stats_due
from pd.shell.retainer import Retainer
from pd.streammemo import Narrowing, StreamMemo
from tests.unit.pd.test_long_stream_cost import Counted

SERVERS = ("a", "b", "c", "d")
REFS = {s: ReplicaRef(s, f"127.0.0.1:{i + 1}") for i, s in enumerate(SERVERS)}


def test_doctests() -> None:
    assert doctest.testmod(pd.streammemo).failed == 0


# ------------------------------------------------------------------ random catalogs
def random_range(rnd: random.Random, index: int, start: int, last: bool) -> RangeMeta:
    end = None if last and rnd.random() < 0.7 else start + rnd.choice((0, 3, 5, 8))
    tier = "object" if end is not None and rnd.random() < 0.3 else "local"
    refs = tuple(REFS[s] for s in rnd.sample(SERVERS, rnd.choice((0, 2, 3, 3))))
    if tier == "object" and rnd.random() < 0.5:
        refs = ()  # released
    recorded = end is not None and rnd.random() < 0.6
    return RangeMeta(index, start, end, refs, tier=tier,
                     object_key=f"k{index}" if tier == "object" else None,
                     max_timestamp=rnd.randrange(0, 2_000) if recorded else None,
                     min_timestamp=0 if recorded else None,
                     size_bytes=rnd.randrange(0, 500) if recorded else None)


def random_stream(rnd: random.Random, sid: int, name: str) -> StreamMeta:
    ranges: list[RangeMeta] = []
    start = first = rnd.choice((0, 0, 3))
    count = rnd.randrange(1, 12)
    for i in range(count):
        rng = random_range(rnd, i, start, i == count - 1)
        ranges.append(rng)
        start = rng.end if rng.end is not None else start
    limits = rnd.choice(((None, None), (1_000, None), (None, 600), (500, 900)))
    return StreamMeta(sid, name, rnd.choice((2, 3)), 2, "", (), 1, first, tuple(ranges),
                      retention_ms=limits[0], retention_bytes=limits[1])


def random_catalogs(seed: int, passes: int = 4) -> list[list[StreamMeta]]:
    """Successive catalogs: each pass replaces some streams by new entries (a command
    changed them), drops some, adds some, and keeps the rest as the same objects."""
    rnd = random.Random(seed)
    streams = [random_stream(rnd, i, f"s{i}") for i in range(1, 30)]
    out = [list(streams)]
    next_id = 30
    for _ in range(passes - 1):
        kept = []
        for s in streams:
            roll = rnd.random()
            if roll < 0.1:
                continue  # deleted
            kept.append(random_stream(rnd, s.id, s.name) if roll < 0.35 else s)
        kept.append(random_stream(rnd, next_id, f"s{next_id}"))
        next_id += 1
        streams = kept
        out.append(list(streams))
    return out


def random_servers(rnd: random.Random, streams: list[StreamMeta]) -> dict[str, ServerState]:
    out = {}
    for sid in SERVERS[:rnd.choice((3, 4))]:
        reports = {}
        for s in streams:
            for r in s.ranges:
                if r.end is not None and sid in {x.id for x in r.replicas} and rnd.random() < 0.1:
                    sealed = rnd.random() < 0.5
                    reports[(s.id, r.index)] = ReplicaReport(
                        s.id, r.index, rnd.random() < 0.2, sealed,
                        r.end - rnd.choice((0, 1)), r.end + rnd.choice((0, 1)) if sealed else None)
        listed = None if rnd.random() < 0.5 else frozenset(
            (s.id, r.index) for s in streams for r in s.ranges if rnd.random() < 0.9)
        out[sid] = ServerState(sid, alive=rnd.random() < 0.8, silent_ms=rnd.choice((0, 20_000)),
                               reports=reports, listed=listed, draining=rnd.random() < 0.2)
    return out


SEEDS = range(40)


def test_stats_selection_matches_the_whole_walk() -> None:
    for seed in SEEDS:
        rnd = random.Random(seed)
        object_tier = rnd.random() < 0.5
        work = Narrowing(lambda r, o=object_tier: needs_stats(r, o))  # type: ignore[misc]
        for streams in random_catalogs(seed):
            retry = {(s.id, r.index): rnd.choice((0.0, 5.0, 20.0))
                     for s in streams for r in s.ranges if rnd.random() < 0.2}
            limit = rnd.choice((1, 3, 256))
            walk = [(s, r) for s in streams for r in s.ranges
                    if r.sealed and r.end != r.start and r.max_timestamp is None
                    and (r.replicas or (r.tier == "object" and r.object_key is not None
                                        and object_tier))
                    and retry.get((s.id, r.index), 0.0) <= 10.0][:limit]
            got = stats_due(work.narrow(streams), retry, 10.0, limit)
            assert [(s.id, s.name, r) for s, r in got] == [
                (s.id, s.name, r) for s, r in walk], seed


def plan_trim_walk(stream: StreamMeta, cursors: dict[str, int], now_ms: int) -> Any:
    """plan_trim as it was: every sealed range listed and summed first."""
    sealed = [r for r in stream.ranges if r.sealed]
    after = sum(r.size_bytes or 0 for r in sealed)
    lowest = min(cursors.values(), default=None)
    start, trimmed, held = None, 0, 0
    for rng in sealed:
        after -= rng.size_bytes or 0
        by_time = (stream.retention_ms is not None and rng.max_timestamp is not None
                   and rng.max_timestamp < now_ms - stream.retention_ms)
        by_bytes = (stream.retention_bytes is not None and rng.size_bytes is not None
                    and after >= stream.retention_bytes)
        if not (by_time or by_bytes or rng.end == rng.start):
            break
        assert rng.end is not None
        if held or (lowest is not None and rng.end > lowest):
            held += 1
            continue
        start, trimmed = rng.end, trimmed + 1
    if start is not None and start <= stream.start_offset:
        start = None
    return (start, trimmed if start is not None else 0, held)


def test_retention_plans_match_the_whole_walk() -> None:
    for seed in SEEDS:
        rnd = random.Random(seed)
        sizes: StreamMemo[int] = StreamMemo(recorded_bytes)
        for streams in random_catalogs(seed):
            limited = [s for s in streams
                       if s.retention_ms is not None or s.retention_bytes is not None]
            now = rnd.randrange(0, 3_000)
            for stream, sealed_bytes in sizes.over(limited):
                cursors = {} if rnd.random() < 0.5 else {"c": rnd.randrange(0, 40)}
                plan = plan_trim(stream, cursors, now, sealed_bytes=sealed_bytes)
                assert (plan.start_offset, plan.trimmed, plan.held) == plan_trim_walk(
                    stream, cursors, now), seed
                assert plan == plan_trim(stream, cursors, now)


def test_replica_figures_match_the_whole_walk() -> None:
    for seed in SEEDS:
        rnd = random.Random(seed)
        memo = StreamMemo(replica_sets)
        for streams in random_catalogs(seed):
            alive = set(rnd.sample(SERVERS, rnd.randrange(0, 5)))
            walk = sum(1 for s in streams for r in s.ranges if r.tier == "local"
                       and sum(1 for x in r.replicas if x.id in alive) < s.replicas)
            assert under_replicated(streams, alive, memo=memo) == walk, seed
            counts: dict[str, int] = {}
            for s in streams:
                for r in s.ranges:
                    for x in r.replicas:
                        counts[x.id] = counts.get(x.id, 0) + 1
            assert replica_counts(streams, memo=memo) == counts, seed


def test_repair_planning_on_the_placed_ranges_matches_the_whole_walk() -> None:
    for seed in SEEDS:
        rnd = random.Random(seed)
        placed = Narrowing(has_replicas)
        for streams in random_catalogs(seed):
            servers = random_servers(rnd, streams)
            narrow = placed.narrow(streams)
            before = {("a", 1, 0): 5}
            short = track_short(before, streams, servers, 30_000)
            assert track_short(before, narrow, servers, 30_000) == short, seed
            memory = SealedReports()
            for sid, server in servers.items():
                memory.observe(sid, server.reports.values())
                memory.observe(sid, [ReplicaReport(999, 0, False, True, 3, 3)])
                memory.observe(sid, [ReplicaReport(s.id, r.index, False, True, 9, 9)
                                     for s in streams for r in s.ranges if rnd.random() < 0.1])
            placed_pairs = {(ref.id, (s.id, r.index)) for s in streams for r in s.ranges
                            for ref in r.replicas}  # the whole walk prune took before
            kept = {sid: {k for k in memory.reports(sid) if (sid, k) in placed_pairs}
                    for sid in SERVERS}
            memory.prune(streams)
            assert {sid: set(memory.reports(sid)) for sid in SERVERS} == kept, seed
            for tasks_max in (1, 4, 100):
                kwargs: dict[str, Any] = {"short_since": short, "tasks_max": tasks_max}
                assert plan_repairs(narrow, servers, 30_000, **kwargs) == plan_repairs(
                    streams, servers, 30_000, **kwargs), seed


# ------------------------------------------------------ what a second round reads
LONG_RANGES = 2_000
PLACEMENT = ("rs1", "rs2", "rs3")


def long_catalog() -> Catalog:
    """A long stream with retention and every range's statistics recorded (nothing to
    trim), and a few short streams, all built by real commands."""
    catalog = Catalog()
    for sid in PLACEMENT:
        catalog.apply(RegisterServer(sid, "127.0.0.1:1", "ssd"))
    for name, count in (("long", LONG_RANGES), ("a", 3), ("b", 3)):
        catalog.apply(CreateStream(name, 3, 2, "", (), PLACEMENT, retention_ms=3_600_000))
        catalog.apply(OpenWriter(name))
        for i in range(count):
            catalog.apply(SealRange(name, 1, i, 5 * (i + 1), PLACEMENT))
            catalog.apply(RecordRangeStats(name, i, 5 * (i + 1), 10**12, 10**12, 100))
    stream = catalog.stream("long")
    catalog._put("long", replace(stream, ranges=Counted(stream.ranges)), keys_same=True)
    return catalog


class _Service:
    """What the retainer's decisions read of the PD service: a catalog view, metrics."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.metrics = Metrics()

    def view(self) -> Any:
        return self.catalog.view()


async def test_a_retainer_round_over_an_unchanged_catalog_reads_no_range_again() -> None:
    catalog = long_catalog()
    retainer = Retainer(_Service(catalog))  # type: ignore[arg-type]
    retainer.now_ms = lambda: 10**12 + 1_000  # type: ignore[method-assign]
    view = catalog.view()
    assert await retainer.record_stats(view) == 0 and await retainer.retain(view) == 0
    Counted.touched = 0
    assert await retainer.record_stats(view) == 0
    assert Counted.touched == 0, "statistics: the unchanged long stream is not walked again"
    assert await retainer.retain(view) == 0
    assert Counted.touched <= 2, (
        f"retention read {Counted.touched} ranges: only the first, to find nothing expired")
    catalog.apply(SealRange("a", 1, 3, 20, PLACEMENT))  # another stream changes
    Counted.touched = 0
    await retainer.record_stats(catalog.view())
    assert Counted.touched == 0
    await retainer.pool.close()


def test_replica_figures_over_an_unchanged_catalog_read_no_range_again() -> None:
    catalog = long_catalog()
    memo = StreamMemo(replica_sets)
    streams = list(catalog.view().streams.values())
    assert under_replicated(streams, set(PLACEMENT), memo=memo) == 0
    Counted.touched = 0
    assert under_replicated(streams, {"rs1"}, memo=memo) == LONG_RANGES + 1 + 2 * 4
    assert replica_counts(streams, memo=memo)["rs1"] == LONG_RANGES + 1 + 2 * 4
    assert Counted.touched == 0


def test_forgetting_replicas_reads_only_the_remembered_ranges() -> None:
    catalog = long_catalog()
    streams = list(catalog.view().streams.values())
    long_id = catalog.stream("long").id
    memory = SealedReports()
    memory.observe("rs1", [ReplicaReport(long_id, 5, False, True, 30, 30),
                           ReplicaReport(long_id, 10 * LONG_RANGES, False, True, 9, 9)])
    memory.observe("rs9", [ReplicaReport(long_id, 6, False, True, 35, 35)])
    Counted.touched = 0
    memory.prune(streams)
    assert Counted.touched <= 12, f"pruning read {Counted.touched} ranges"
    assert list(memory.reports("rs1")) == [(long_id, 5)] and memory.reports("rs9") == {}
