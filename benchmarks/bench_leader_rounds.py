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
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pd.catalog import Catalog  # noqa: E402
from pd.commands import (  # noqa: E402
    CreateStream,
    OpenWriter,
    RecordRangeStats,
    RegisterServer,
    SealRange,
)
from pd.drain import replica_counts  # noqa: E402
from pd.repair import ServerState, SealedReports, plan_repairs, track_short  # noqa: E402
from pd.retention import plan_trim  # noqa: E402
from pd.shell.http import under_replicated  # noqa: E402

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
    streams = list(view.streams.values())
    servers = {s: ServerState(s) for s in PLACEMENT}
    alive = set(PLACEMENT)

    def stats_walk() -> object:
        return [(s, r) for s in streams for r in s.ranges
                if r.sealed and r.end != r.start and r.max_timestamp is None
                and (r.replicas or r.tier == "object")][:256]

    def retention_walk() -> object:
        return [plan_trim(s, {}, NOW_MS) for s in streams]

    def repair_walk() -> object:
        SealedReports().prune(streams)
        short = track_short({}, streams, servers, NOW_MS)
        return plan_repairs(streams, servers, NOW_MS, short_since=short)

    def metrics_walk() -> object:
        return under_replicated(view, alive), replica_counts(streams)

    rows = [("retainer statistics selection", stats_walk),
            ("retention planning", retention_walk),
            ("repair planning (prune, short, plan)", repair_walk),
            ("metrics gauges and replica counts", metrics_walk)]
    print(f"{'decision':40} {'walk ms':>9}")
    for name, walk in rows:
        print(f"{name:40} {timed(walk, args.rounds):9.1f}")


if __name__ == "__main__":
    main()
