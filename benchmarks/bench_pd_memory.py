"""Where a PD node's memory per catalog range goes (issue 27: the soak's PD RSS per range).

Against a local cluster of real processes (3 PD nodes, 3 range servers, the object tier
on ``file://`` with the soak's short waits), every PD node started with the memory probe
(``ESTREAM_PD_MEMPROBE``, :mod:`pd.shell.memprobe`):

1. ``--warm`` ranges, then a wait until the offloader has uploaded and released every
   sealed range (its backlog gauges at 0), then a probe of every node;
2. ``--ranges`` more, the same wait, a probe again.

A range is what the soak's kept streams leave (``--build sessions``): one writer session
of one append (``open_writer``, one record, ``close``) on one of ``--streams`` streams,
``--inflight`` sessions at once; the range is sealed, its statistics recorded, uploaded
in a packed object and its replicas released. ``--build seals``: empty ranges sealed
through PD (no data, nothing offloaded: quicker). Printed per node (leader first): the
growth between the probes per catalog range of RSS, what the allocations hold outside
the Raft journal (traced bytes, or pymalloc's and malloc's bytes in use, less the
journal's entries: a snapshot cuts the journal at 20,000 entries, so between two probes
it may have grown or been cut), the journal's entries, the allocators' slack (RSS less
what is held: free blocks, pools and arenas kept), pymalloc's
bytes in use and its arenas (``--no-trace`` only), malloc's bytes in use and free, the
Raft journal's entries in memory, and the code whose traced allocations grew most per
range (tracemalloc's ``compare_to`` by line); ``--json`` keeps it all. ``--no-trace``:
the PD nodes run without tracemalloc (RSS and allocator figures without its cost; no
code named). Every phase is bounded by ``PHASE_S_MAX``.

    python -m benchmarks.bench_pd_memory [--warm 2000] [--ranges 4000] [--streams 20]
        [--inflight 8] [--build sessions|seals] [--no-trace] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import estream
from benchmarks.bench_object_tier import metric
from benchmarks.bench_scale import _empty_ranges
from estream.devcluster.cluster import Cluster, start_cluster

PHASE_S_MAX = 900.0
SETTLE_S_MAX = 120.0
TOP_LINES = 12
JOURNAL_ENTRY_BYTES = 177  # a journal entry in memory beyond its command's bytes


def _pids(cluster: Cluster) -> list[int]:
    return [n.process.pid for n in cluster.pd.nodes if n.process is not None]


async def _sessions(client: estream.Client, names: list[str], count: int,
                    inflight: int) -> None:
    deadline = time.monotonic() + PHASE_S_MAX
    todo = iter(range(count))

    async def loop() -> None:
        for i in todo:
            async with await client.open_writer(names[i % len(names)]) as writer:
                await writer.append(b"%d" % i)
            if time.monotonic() > deadline:
                raise TimeoutError(f"writer sessions past {PHASE_S_MAX} s")

    await asyncio.gather(*(loop() for _ in range(inflight)))


async def _settle(cluster: Cluster) -> float:
    """Wait until the leader has no range waiting for upload or release (seconds)."""
    started = time.monotonic()
    while time.monotonic() - started < SETTLE_S_MAX:
        await asyncio.sleep(1.0)
        backlog = await asyncio.to_thread(metric, cluster, "estream_pd_offload_backlog_ranges")
        if backlog == 0:
            break
    await asyncio.sleep(2.0)  # a few rounds more: the catalog's last changes applied
    return time.monotonic() - started


async def _probe(cluster: Cluster, probes: Path, n: int, traced: bool) -> dict[str, Any]:
    """SIGUSR2 to every PD node; their ``n``-th probe files, by node id."""
    for pid in _pids(cluster):
        os.kill(pid, signal.SIGUSR2)
    deadline = time.monotonic() + 120
    ids = [str(node.id) for node in cluster.pd.nodes]
    out: dict[str, Any] = {}
    while len(out) < len(ids):
        if time.monotonic() > deadline:
            raise TimeoutError(f"probe {n}: only {sorted(out)} answered")
        await asyncio.sleep(0.5)
        for node_id in ids:
            path = probes / f"pd-{node_id}-{n}.json"
            snap = probes / f"pd-{node_id}-{n}.tracemalloc"
            if node_id not in out and path.exists() and (snap.exists() or not traced):
                out[node_id] = {**json.loads(path.read_text()),
                                "snapshot": str(snap) if traced else ""}
    ranges = await asyncio.to_thread(metric, cluster, "estream_pd_ranges ")
    leader = await asyncio.to_thread(cluster.pd.leader)
    return {"ranges": int(ranges), "leader": ids[leader], "nodes": out}


def _journal_bytes(probe: dict[str, Any]) -> int:
    """What the Raft journal's entries in memory hold: each command's bytes, and about
    177 bytes around it (the bytes object's header, the entry's tuple, its index and file
    offset as ints, two list slots)."""
    return int(probe["journal_command_bytes"]) + JOURNAL_ENTRY_BYTES * int(
        probe["journal_entries"])


def _held_bytes(probe: dict[str, Any]) -> int:
    """The bytes the process's allocations hold: traced, or (without tracing) pymalloc's
    blocks in use and malloc's bytes in use."""
    if probe["traced_bytes"]:
        return int(probe["traced_bytes"])
    return int(probe["pymalloc"].get("in_use", 0)) + int(probe["malloc"].get("in_use", 0))


def _growth(first: dict[str, Any], last: dict[str, Any]) -> dict[str, Any]:
    count = last["ranges"] - first["ranges"]
    rows: dict[str, Any] = {"ranges": count, "leader": [first["leader"], last["leader"]]}
    for node_id, b in last["nodes"].items():
        a = first["nodes"][node_id]

        def per(x: float, y: float) -> float:
            return round((y - x) / count, 1) if count else float("nan")

        top = []
        if a["snapshot"] and b["snapshot"]:
            old = tracemalloc.Snapshot.load(a["snapshot"])
            new = tracemalloc.Snapshot.load(b["snapshot"])
            top = [{"where": str(s.traceback[0]), "bytes_per_range": per(0, s.size_diff),
                    "objects_per_range": per(0, s.count_diff)}
                   for s in new.compare_to(old, "lineno")[:TOP_LINES]]
        journal = per(_journal_bytes(a), _journal_bytes(b))
        held = per(_held_bytes(a), _held_bytes(b))
        rows[node_id] = {
            "rss": per(a["rss_bytes"], b["rss_bytes"]),
            "held": held,
            "journal": journal,
            "held_outside_journal": round(held - journal, 1),
            "allocators_slack": round(per(a["rss_bytes"], b["rss_bytes"]) - held, 1),
            "traced": per(a["traced_bytes"], b["traced_bytes"]),
            "pymalloc_in_use": per(a["pymalloc"].get("in_use", 0),
                                   b["pymalloc"].get("in_use", 0)),
            "pymalloc_arenas": per(a["pymalloc"].get("total", 0), b["pymalloc"].get("total", 0)),
            "malloc_in_use": per(a["malloc"].get("in_use", 0), b["malloc"].get("in_use", 0)),
            "malloc_free": per(a["malloc"].get("free", 0), b["malloc"].get("free", 0)),
            "journal_entries": [a["journal_entries"], b["journal_entries"]],
            "objects_per_range": {k: per(a["gc_objects"].get(k, 0), v)
                                  for k, v in b["gc_objects"].items()
                                  if abs(v - a["gc_objects"].get(k, 0)) >= count // 2},
            "top": top,
        }
    return rows


async def run(args: argparse.Namespace, root: Path) -> dict[str, Any]:
    objects, probes = root / "objects", root / "probes"
    objects.mkdir()
    pd_args = ["--object-store", f"file://{objects}", "--offload-delay-s", "2",
               "--local-retention-s", "3", "--object-max-age-s", "2"]
    env = {"ESTREAM_PD_MEMPROBE": str(probes),
           "ESTREAM_PD_MEMPROBE_FRAMES": "0" if args.no_trace else "1"}
    cluster = start_cluster(root, range_servers=3, pd_args=pd_args, env=env)
    try:
        client = await estream.connect(cluster.pd_addresses)
        async with client:
            names = [f"mem-{i:04d}" for i in range(args.streams)]
            for name in names:
                await client.create_stream(name, replicas=3, ack_count=2)

            async def build(count: int) -> float:
                started = time.monotonic()
                if args.build == "sessions":
                    await _sessions(client, names, count, args.inflight)
                else:
                    await _empty_ranges(client, names[0], count)
                return time.monotonic() - started

            out: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}}
            out["warm_s"] = await build(args.warm)
            out["settle_s"] = [await _settle(cluster)]
            first = await _probe(cluster, probes, 1, not args.no_trace)
            out["build_s"] = await build(args.ranges)
            out["settle_s"].append(await _settle(cluster))
            last = await _probe(cluster, probes, 2, not args.no_trace)
            out["probes"] = [first, last]
            out["per_range"] = _growth(first, last)
            return out
    finally:
        cluster.stop()


def _print(out: dict[str, Any]) -> None:
    g = out["per_range"]
    print(f"ranges {g['ranges']} (build {out['build_s']:.0f} s), leader {g['leader']}")
    print("node | RSS B/range | held outside the journal | journal | allocators' slack | "
          "pymalloc in use | pymalloc arenas | malloc in use | malloc free | journal entries")
    for node_id, row in g.items():
        if not isinstance(row, dict):
            continue
        print(f"{node_id} | {row['rss']} | {row['held_outside_journal']} | "
              f"{row['journal']} | {row['allocators_slack']} | {row['pymalloc_in_use']} | "
              f"{row['pymalloc_arenas']} | {row['malloc_in_use']} | "
              f"{row['malloc_free']} | {row['journal_entries']}")
        for t in row["top"]:
            print(f"    {t['bytes_per_range']:>8} B {t['objects_per_range']:>6} obj  {t['where']}")
        print("    objects/range:", json.dumps(row["objects_per_range"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--warm", type=int, default=2000)
    parser.add_argument("--ranges", type=int, default=4000)
    parser.add_argument("--streams", type=int, default=20)
    parser.add_argument("--inflight", type=int, default=8)
    parser.add_argument("--build", choices=("sessions", "seals"), default="sessions")
    parser.add_argument("--no-trace", action="store_true")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="estream-pdmem-") as tmp:
        out = asyncio.run(run(args, Path(tmp)))
    _print(out)
    if args.json is not None:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
