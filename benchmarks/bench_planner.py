"""What the PD leader's compaction planner costs per update after one seal, on a stream
of ``--ranges`` ranges (issue 27: "a stream has 100,000 ranges"; an update costs
O(change), not O(history)).

    .venv/bin/python benchmarks/bench_planner.py [--ranges 1000 20000] [--seals 200]

Builds a catalog in process through real catalog commands (``pd.catalog.Catalog.apply``):
one stream of ``--ranges`` sealed ranges (a writer's session each, as a Spark sink's
micro-batches leave them), packed into objects of ``pack_members_max`` ranges, committed
and their replicas released (every range is in the planner's index), the objects' sizes
known (every byte live, none small but the last: nothing worth rewriting, so the cost
is the index's upkeep). Then, a first
:meth:`pd.compaction.Planner.plan` (the build), and ``--seals`` times: the open range
sealed (one ``seal_range`` command) and the planner updated from the catalog's map as the
leader's offloader passes it (``view.streams.values()``). Prints the build's ms, and per
seal the catalog command's and the planner update's CPU in microseconds (the median and
the 90th percentile of ``time.process_time`` around each call). In process, no servers:
under a minute.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from estream.wire.meta import ObjectPart  # noqa: E402
from pd.catalog import Catalog  # noqa: E402
from pd.catalogmodel import pack_members_max  # noqa: E402
from pd.commands import (  # noqa: E402
    CommitPack,
    CreateStream,
    DropLocalReplicas,
    OpenWriter,
    PackMember,
    PreparePack,
    RegisterServer,
    SealRange,
)
from pd.compaction import CompactionRule, Planner  # noqa: E402

SERVERS = ("s1", "s2", "s3")
RULE = CompactionRule(64 * 1024 * 1024, small_bytes=1_000)


def _seal(catalog: Catalog) -> None:
    """The open range of "long" sealed one record past its start (the next one opens)."""
    s = catalog.stream("long")
    last = s.ranges[-1]
    catalog.apply(SealRange("long", s.epoch, last.index, last.start + 1, SERVERS))


def build(ranges: int) -> tuple[Catalog, dict[str, int]]:
    """One stream of ``ranges`` sealed ranges, packed, committed and released."""
    catalog = Catalog()
    for i, sid in enumerate(SERVERS):
        catalog.apply(RegisterServer(sid, f"127.0.0.1:{7001 + i}", "ssd"))
    catalog.apply(CreateStream("long", 3, 2, "", (), SERVERS))
    catalog.apply(OpenWriter("long"))
    for _ in range(ranges):
        _seal(catalog)
    s = catalog.stream("long")
    sealed = [r for r in s.ranges if r.end is not None]
    sizes: dict[str, int] = {}
    for n, at in enumerate(range(0, len(sealed), pack_members_max)):
        key = f"pack-{n}.eso"
        group = sealed[at:at + pack_members_max]
        members = tuple(PackMember("long", s.id, r.index, r.start, r.end or r.start)
                        for r in group)
        catalog.apply(PreparePack(key, 10**15, members))
        catalog.apply(CommitPack(key, tuple(
            PackMember(m.name, m.stream_id, m.range_index, m.start, m.end,
                       part=ObjectPart(100 * i, 100 * i + 100, 10**6 + 52 * i,
                                       10**6 + 52 * i + 52, i))
            for i, m in enumerate(members))))
        for r in group:
            catalog.apply(DropLocalReplicas("long", s.id, r.index, key))
        sizes[key] = 152 * len(members) + 64  # (its parts, index and footer: all live)
    return catalog, sizes


def _us(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return (statistics.median(ordered) * 1e6,
            ordered[min(len(ordered) - 1, int(len(ordered) * 0.9))] * 1e6)


def measure(ranges: int, seals: int) -> dict[str, float]:
    catalog, sizes = build(ranges)
    planner = Planner()
    t = time.process_time()
    planner.plan(catalog.view().streams.values(), sizes, RULE)
    build_ms = (time.process_time() - t) * 1e3
    seal_s: list[float] = []
    update_s: list[float] = []
    for _ in range(seals):
        t = time.process_time()
        _seal(catalog)
        seal_s.append(time.process_time() - t)
        streams = catalog.view().streams.values()
        t = time.process_time()
        planner.plan(streams, sizes, RULE)
        update_s.append(time.process_time() - t)
    (seal_med, seal_p90), (update_med, update_p90) = _us(seal_s), _us(update_s)
    return {"ranges": len(catalog.stream("long").ranges), "build_ms": build_ms,
            "seal_us": seal_med, "seal_p90_us": seal_p90, "update_us": update_med,
            "update_p90_us": update_p90}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranges", type=int, nargs="+", default=[1_000, 20_000])
    parser.add_argument("--seals", type=int, default=200)
    args = parser.parse_args()
    print("| ranges | planner build ms | seal command us (median, p90) "
          "| planner update per seal us (median, p90) |")
    print("| --- | --- | --- | --- |")
    for n in args.ranges:
        r = measure(n, args.seals)
        print(f"| {r['ranges']:,} | {r['build_ms']:.1f} | {r['seal_us']:.0f}, "
              f"{r['seal_p90_us']:.0f} | {r['update_us']:.0f}, {r['update_p90_us']:.0f} |",
              flush=True)


if __name__ == "__main__":
    main()
