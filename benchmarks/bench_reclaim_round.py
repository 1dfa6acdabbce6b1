"""What one reclaim round costs the PD leader in process (issue 27: "10,000 open writers
from 10 client processes: PD leader CPU at idle <= 10% of a core"): each live server's
``LIST_RANGES`` answer (compact, as the reclaimer asks it: an open sound replica is its
key alone) decoded, parsed into reports, remembered for repair (``SealedReports``,
``ServerListing``) and decided on (``droppable``, ``confirmed``), as
``pd/shell/reclaimer.py``'s round does, with no servers.

    .venv/bin/python -m benchmarks.bench_reclaim_round [--streams 10000] [--servers 3]
        [--rounds 5]

Builds a catalog through real catalog commands: ``--streams`` streams of one open range
on the ``--servers`` servers (every server lists one replica of each: 30,000 replicas a
round with the defaults). Prints the milliseconds of a round, the best of ``--rounds``
(one stream sealed between rounds, as a writer's roll), split into the wire decode
(msgpack and ``listed_entries``) and the rest; beside it, in the same run, the floor: the
bare ``msgpack.unpackb`` of the same listings, and the round's share of a core at one round
every ``reclaim_interval_ms``.

And what the round's listings can judge, taken at its start, before and after issue 27's
change: the walk of every stream (``sealed_ranges``, a dict) against ``SealedBefore.at``
(the reclaimer's ``StreamsById`` brought to the catalog, its persistent maps kept; the
first round builds the index of names, reported apart), each the best of ``--rounds``; and
what a question costs either way (every stream asked once, microseconds a question).
"""

from __future__ import annotations

import argparse
import time

import msgpack

from estream.wire.limits import reclaim_interval_ms
from estream.wire.rangeanswers import ListedRange, RangeKey, listed_entries
from pd.catalog import Catalog
from pd.commands import CreateStream, OpenWriter, RegisterServer, SealRange
from pd.reclaim import confirmed, droppable
from pd.replicareports import SealedBefore, ServerListing, parse_listing, sealed_ranges
from pd.sealedreports import SealedReports
from pd.streammemo import StreamsById


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--streams", type=int, default=10_000)
    parser.add_argument("--servers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    servers = tuple(f"rs{i}" for i in range(1, args.servers + 1))
    catalog = Catalog()
    for sid in servers:
        catalog.apply(RegisterServer(sid, "127.0.0.1:1", "ssd"))
    for n in range(args.streams):
        catalog.apply(CreateStream(f"s{n:06d}", len(servers), 2, "", (), servers))
        catalog.apply(OpenWriter(f"s{n:06d}"))
    sealed = SealedReports()
    streams = StreamsById()
    listings: dict[str, ServerListing] = {}
    decode = rest = floor = walk = taken = float("inf")
    first = asked_walk = asked_taken = 0.0
    for i in range(args.rounds + 1):
        view = catalog.view()
        # what the round's listings judge: before, the walk; after, the persistent maps
        t = time.perf_counter()
        walked = sealed_ranges(view.streams.values())
        took_walk = time.perf_counter() - t
        t = time.perf_counter()
        sealed_before = SealedBefore.at(view.streams, streams)
        took_taken = time.perf_counter() - t
        if i:
            walk, taken = min(walk, took_walk), min(taken, took_taken)
        else:
            first = took_taken
            ids = [s.id for s in view.streams.values()]
            t = time.perf_counter()
            assert sum(walked.get(sid, 0) for sid in ids) == 0  # (every range open)
            asked_walk = time.perf_counter() - t
            t = time.perf_counter()
            assert sum(sealed_before.get(sid, 0) for sid in ids) == 0
            asked_taken = time.perf_counter() - t
        # what each server sends: every open replica as its key (rangeserver/listing.py)
        packed = msgpack.packb([[s.id, s.ranges[-1].index] for s in view.streams.values()])
        took_decode = took_rest = took_floor = 0.0
        for sid in servers:
            t = time.perf_counter()
            msgpack.unpackb(packed)
            took_floor += time.perf_counter() - t
            t = time.perf_counter()
            keys: list[RangeKey] = []
            listing: list[ListedRange] = []
            listed_entries(msgpack.unpackb(packed), keys, listing)
            took_decode += time.perf_counter() - t
            t = time.perf_counter()
            reports = parse_listing([entry for entry in listing if entry.state.sealed])
            sealed.observe(sid, reports, complete=True)
            listings[sid] = ServerListing(0, frozenset(keys), sealed_before)
            streams.follow(catalog.view().streams.values())
            confirmed(sid, droppable(keys, streams.by_id, view.next_stream_id, sid), {})
            took_rest += time.perf_counter() - t
        if i:  # (the first round builds the index)
            decode, rest = min(decode, took_decode), min(rest, took_rest)
            floor = min(floor, took_floor)
        stream = catalog.view().streams["s000000"]
        last = stream.ranges[-1]
        catalog.apply(SealRange("s000000", stream.epoch, last.index, last.start + 5 + i,
                                servers))
    replicas = args.streams * len(servers)
    round_s = decode + rest
    print(f"reclaim round, {replicas} listed replicas, {args.streams} streams: "
          f"{round_s * 1000:.1f} ms (decode {decode * 1000:.1f}, the rest {rest * 1000:.1f}; "
          f"{round_s / replicas * 1e6:.2f} us a replica)")
    print(f"floor, msgpack.unpackb of the same listings: {floor * 1000:.1f} ms; "
          f"round / floor {round_s / floor:.1f}x; "
          f"share of a core at a round every {reclaim_interval_ms / 1000:g} s: "
          f"{round_s / (reclaim_interval_ms / 1000) * 100:.1f}%")
    print(f"what the round's listings judge, at its start: the walk of every stream "
          f"{walk * 1000:.2f} ms, SealedBefore {taken * 1000:.3f} ms (its first round, the "
          f"index of names built: {first * 1000:.1f} ms); a question "
          f"{asked_walk / args.streams * 1e6:.2f} us of the dict, "
          f"{asked_taken / args.streams * 1e6:.2f} us of SealedBefore")

if __name__ == "__main__":
    main()
