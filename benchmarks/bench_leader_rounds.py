"""What one round of the PD leader's background loops costs in pure decisions, on a wide
and long catalog (issue 28: "leader scans of the whole catalog run off the event loop or
in pages"; issue 27: "nothing grows with history").

    .venv/bin/python benchmarks/bench_leader_rounds.py [--streams 2000] [--ranges 50]
        [--long 20000] [--rounds 5]

Builds a catalog in process through real catalog commands (``pd.catalog.Catalog.apply``):
``--streams`` streams of ``--ranges`` sealed ranges each (statistics recorded, a
retention limit), plus one stream of ``--long`` sealed ranges. Then times, per round, the
decisions each loop takes on the event loop, first as the whole walk of every range
("walk"), then as the loops take them ("loop": the per-stream memo of
:mod:`pd.streammemo` after a first pass, with one stream changed between rounds as a
writer's seal would). Prints milliseconds per round and the ratio. In-process, no
servers: a minute at most.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estream.wire.meta import StreamMeta  # noqa: E402
from pd.catalog import Catalog  # noqa: E402
from pd.commands import (  # noqa: E402
    CreateStream,
    OpenWriter,
    RecordRangeStats,
    RegisterServer,
    SealRange,
)
from pd.compaction import CompactionRule, Planner  # noqa: E402
from pd.compaction import plan as plan_compactions  # noqa: E402
from pd.drain import replica_counts, replica_sets, under_replicated  # noqa: E402
from pd.repair import (  # noqa: E402
    SealedReports,
    ServerState,
    has_replicas,
    plan_repairs,
    track_short,
)
from pd.replicareports import ReplicaReport  # noqa: E402
from pd.retention import needs_stats, plan_trim, recorded_bytes, stats_due  # noqa: E402
from pd.streammemo import Narrowing, StreamMemo  # noqa: E402

PLACEMENT = ("rs1", "rs2", "rs3")
NOW_MS = 10_000_000


def build(streams: int, ranges: int, long: int) -> Catalog:
    catalog = Catalog()
    for sid in PLACEMENT:
        catalog.apply(RegisterServer(sid, "127.0.0.1:1", "ssd"))

    def stream(name: str, count: int) -> None:
        catalog.apply(CreateStream(name, 3, 2, "", (), PLACEMENT, retention_ms=3_600_000))
        catalog.apply(OpenWriter(name))
        for i in range(count):
            catalog.apply(SealRange(name, 1, i, 5 * (i + 1), PLACEMENT))
            catalog.apply(RecordRangeStats(name, i, 5 * (i + 1), NOW_MS, NOW_MS, 100))

    for n in range(streams):
        stream(f"s{n:06d}", ranges)
    stream("long", long)
    return catalog


def timed(fn: Callable[[], object], rounds: int) -> float:
    """Milliseconds per call, the best of ``rounds``."""
    best = float("inf")
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best * 1000


def timed_changing(catalog: Catalog, fn: Callable[[list[StreamMeta]], object],
                   rounds: int) -> float:
    """Milliseconds per call of ``fn`` on the catalog's streams, the best of ``rounds``,
    after a first call, with one short stream sealed between calls (a writer's roll)."""
    fn(list(catalog.view().streams.values()))
    best = float("inf")
    for i in range(rounds):
        stream = catalog.view().streams["s000000"]
        last = stream.ranges[-1]
        catalog.apply(SealRange("s000000", stream.epoch, last.index, last.start + 5 + i,
                                PLACEMENT))
        streams = list(catalog.view().streams.values())
        t = time.perf_counter()
        fn(streams)
        best = min(best, time.perf_counter() - t)
    return best * 1000


def timed_over_map(catalog: Catalog, fn: Callable[[Iterable[StreamMeta]], object],
                   rounds: int) -> float:
    """:func:`timed_changing` with the catalog's own map (``view.streams.values()``, as
    the leader's loops pass it) instead of a list: what follows the map's changes."""
    fn(catalog.view().streams.values())
    best = float("inf")
    for i in range(rounds):
        stream = catalog.view().streams["s000000"]
        last = stream.ranges[-1]
        catalog.apply(SealRange("s000000", stream.epoch, last.index, last.start + 5 + i,
                                PLACEMENT))
        streams = catalog.view().streams.values()
        t = time.perf_counter()
        fn(streams)
        best = min(best, time.perf_counter() - t)
    return best * 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=2000)
    ap.add_argument("--ranges", type=int, default=50)
    ap.add_argument("--long", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    t = time.perf_counter()
    catalog = build(args.streams, args.ranges, args.long)
    view = catalog.view()
    print(f"catalog: {len(view.streams)} streams, {view.range_count()} ranges, built in "
          f"{time.perf_counter() - t:.1f} s")
    servers = {s: ServerState(s) for s in PLACEMENT}
    alive = set(PLACEMENT)

    # The whole walks, as each loop took its decisions before pd/streammemo.py
    def stats_walk(streams: list[StreamMeta]) -> object:
        return [(s, r) for s in streams for r in s.ranges
                if r.sealed and r.end != r.start and r.max_timestamp is None
                and (r.replicas or r.tier == "object")][:256]

    def retention_walk(streams: list[StreamMeta]) -> object:
        return [plan_trim(s, {}, NOW_MS) for s in streams]

    def repair_plan(streams: list[StreamMeta]) -> object:
        short = track_short({}, streams, servers, NOW_MS)
        return plan_repairs(streams, servers, NOW_MS, short_since=short)

    def repair_walk(streams: list[StreamMeta]) -> object:
        placed = {(ref.id, (s.id, r.index)) for s in streams for r in s.ranges
                  for ref in r.replicas}  # SealedReports.prune's set, as it was
        return len(placed), repair_plan(streams)

    def metrics_walk(streams: list[StreamMeta]) -> object:
        return under_replicated(streams, alive), replica_counts(streams)

    # The loops' way: what each keeps between rounds
    stats_work = Narrowing(lambda r: needs_stats(r, True))
    sizes: StreamMemo[int] = StreamMemo(recorded_bytes)
    placed = Narrowing(has_replicas)
    sets = StreamMemo(replica_sets)

    def stats_loop(streams: list[StreamMeta]) -> object:
        return stats_due(stats_work.narrow(streams), {}, 0.0, 256)

    def retention_loop(streams: list[StreamMeta]) -> object:
        return [plan_trim(s, {}, NOW_MS, sealed_bytes=b) for s, b in sizes.over(streams)]

    def repair_loop(streams: list[StreamMeta]) -> object:
        SealedReports().prune(streams)
        return repair_plan(placed.narrow(streams))

    def metrics_loop(streams: list[StreamMeta]) -> object:
        return (under_replicated(streams, alive, memo=sets),
                replica_counts(streams, memo=sets))

    rows = [("retainer statistics selection", stats_walk, stats_loop),
            ("retention planning", retention_walk, retention_loop),
            ("repair planning (prune, short, plan)", repair_walk, repair_loop),
            ("metrics gauges and replica counts", metrics_walk, metrics_loop)]
    print(f"{'decision':40} {'walk ms':>9} {'loop ms':>9} {'loop/walk':>9}")
    for name, walk, loop in rows:
        walk_ms = timed_changing(catalog, walk, args.rounds)
        loop_ms = timed_changing(catalog, loop, args.rounds)
        print(f"{name:40} {walk_ms:9.1f} {loop_ms:9.1f} {loop_ms / walk_ms:9.3f}")
    # Over the catalog's map, following its changes (pd/sealedreports.py, pd/compaction.py)
    streams = list(catalog.view().streams.values())
    heard_walk, heard_loop = SealedReports(), SealedReports()
    for heard in (heard_walk, heard_loop):  # every sealed replica on rs1 heard of
        heard.observe("rs1", [ReplicaReport(s.id, r.index, False, True, r.end, r.end)
                              for s in streams for r in s.ranges if r.end is not None])
    planner = Planner()

    def compaction_walk(streams: Iterable[StreamMeta]) -> object:
        return plan_compactions(streams, {}, CompactionRule(1 << 26, small_bytes=1 << 24))

    def compaction_loop(streams: Iterable[StreamMeta]) -> object:
        return planner.plan(streams, {}, CompactionRule(1 << 26, small_bytes=1 << 24))

    for name, walk, loop in (
            ("repair: prune of sealed replicas heard of", heard_walk.prune, heard_loop.prune),
            ("compaction planning", compaction_walk, compaction_loop)):
        walk_ms = timed_changing(catalog, walk, args.rounds)
        loop_ms = timed_over_map(catalog, loop, args.rounds)
        print(f"{name:40} {walk_ms:9.1f} {loop_ms:9.1f} {loop_ms / walk_ms:9.3f}")
    streams = list(catalog.view().streams.values())
    inline, threaded = (asyncio.run(longest_stall(lambda: repair_loop(streams), t))
                        for t in (False, True))
    print(f"event loop's longest stall while repair plans: inline {inline:.1f} ms, "
          f"in a thread {threaded:.1f} ms ({threaded / inline:.3f})")


async def longest_stall(work: Callable[[], object], in_thread: bool) -> float:
    """The longest gap, in ms, between ticks of a 1 ms timer on the event loop while
    ``work`` runs inline on the loop or in a worker thread (as the repairer runs it)."""
    gaps = [0.0]
    running = True

    async def ticker() -> None:
        last = time.perf_counter()
        while running:
            await asyncio.sleep(0.001)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    tick = asyncio.create_task(ticker())
    await asyncio.sleep(0.01)
    if in_thread:
        await asyncio.to_thread(work)
    else:
        work()
    await asyncio.sleep(0.01)
    running = False
    await tick
    return max(gaps) * 1000


if __name__ == "__main__":
    main()
