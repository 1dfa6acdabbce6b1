"""Benchmark: a stream several times larger than any range server's disk use (issue #16).

    .venv/bin/python benchmarks/bench_tier_disk.py [--scale quick|full] [--rate-mb-s R]
        [--json out.json]

The object tier's promise: range servers hold the hot tail, the stream grows as far as
the object store allows. Starts SeaweedFS and a cluster (1 PD node offloading to it with
short ``--offload-delay-s`` and ``--local-retention-s``, 3 range servers: every range has
a replica on each) through estream/devcluster, as bench_object_tier.py does (whose
figures this completes), then writes one stream of ``--total-mib`` MiB (4 KiB records,
1 MiB batches, 3 replicas, ack 2; as fast as it goes, or paced at ``--rate-mb-s``: on a
shared machine, a rate below the offloader's measured drain rate) in ranges of
``--range-mib`` MiB, while a thread samples each range server's data directory (the
blocks its files take, as ``du``: log segments, spares, checkpoint) every 0.2 s. The
stream is then sealed and, once every range is in the object tier and its replicas
dropped, the disk use is sampled until it settles.

Range size: a range rolls once the writer has sent ``range_bytes_max`` bytes into it
(estream/core/rangewriter.py; default ``limits.range_bytes_max``, 1 GiB): a per-writer
setting, ``WriterConfig(range_bytes_max=...)`` with ``Writer.open`` (as bench_time_index.py
does); no PD or CLI flag sets it. Range servers delete a log segment once no live replica
needs it (rangeserver/retention.py), so their segments (``--wal-segment-mib``) are sized
like the ranges.

Prints the largest disk use seen per server, its ratio to ``--bound-mib`` (the issue:
4 GiB written, each server under 1 GiB; ``--scale quick`` keeps the 4:1 ratio with 1 GiB
against 256 MiB), how often it shrank, and what is left once everything is released.
Bounded: every phase has a deadline; every process is stopped by PID at the end, also
on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import estream
from benchmarks.bench_object_tier import tier as object_tier
from estream.devcluster.cluster import Cluster
from estream.devcluster.seaweed import SeaweedS3
from estream.sdk.writer import Writer, WriterConfig

MiB = 1024 * 1024
RECORD_BYTES = 4096
BATCH_RECORDS = 256  # 1 MiB batches
SAMPLE_S = 0.2
WRITE_TIMEOUT_S = 600.0
RELEASE_TIMEOUT_S = 300.0
SETTLE_S = 10.0  # after the last release, how long the disk use may take to settle
SCALES = {
    "quick": {"total_mib": 1024, "bound_mib": 256, "range_mib": 32, "segment_mib": 32},
    "full": {"total_mib": 4096, "bound_mib": 1024, "range_mib": 64, "segment_mib": 64},
}


@contextmanager
def tier(work: Path, ns: argparse.Namespace) -> Iterator[tuple[SeaweedS3, Cluster]]:
    """:func:`benchmarks.bench_object_tier.tier` with log segments of ``--segment-mib``;
    a range of ``range_mib`` or more is an object of its own (no wait for packing)."""
    with object_tier(work, ns, "bench-disk",
                     pd_args=["--object-size-bytes", str(ns.range_mib * MiB)],
                     rangeserver_args=["--wal-segment-mib", str(ns.segment_mib)]) as both:
        yield both


def value(i: int) -> bytes:
    head = f"{i}:".encode()
    return head + b"v" * (RECORD_BYTES - len(head))


def disk_use(path: Path) -> int:
    """Bytes the files under ``path`` take on disk (``du``: allocated blocks)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(root, name)).st_blocks * 512
            except FileNotFoundError:  # deleted while walking
                pass
    return total


class Sampler:
    """A thread sampling each directory's disk use every ``SAMPLE_S``."""

    def __init__(self, dirs: dict[str, Path]) -> None:
        self.dirs = dirs
        self.series: dict[str, list[tuple[float, int]]] = {k: [] for k in dirs}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="du-sampler", daemon=True)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while not self._stop.is_set():
            self.sample()
            self._stop.wait(SAMPLE_S)

    def sample(self) -> dict[str, int]:
        now = time.perf_counter()
        use = {k: disk_use(p) for k, p in self.dirs.items()}
        for k, u in use.items():
            self.series[k].append((now, u))
        return use

    def peak(self, key: str) -> int:
        return max(u for _, u in self.series[key])

    def shrinks(self, key: str, min_bytes: int) -> int:
        """How many times the use fell by at least ``min_bytes`` between two samples."""
        s = self.series[key]
        return sum(1 for (_, a), (_, b) in zip(s, s[1:], strict=False) if a - b >= min_bytes)


def unreleased(cluster: Cluster, name: str, records: int) -> dict[str, Any] | None:
    """The first range of ``name`` holding records below ``records`` that is not yet in
    the object tier with its replicas dropped, or None."""
    ranges: list[dict[str, Any]] = cluster.describe(name)["ranges"]
    for r in ranges:
        if r["start"] < records and (r["end"] is None or r["tier"] != "object"
                                     or r["replicas"]):
            return r
    return None


class Lifecycle:
    """When each range was first seen sealed, in the object tier, and released (no
    replicas), from PD's ``GET /v1/streams/{name}`` polled every ``SAMPLE_S``."""

    def __init__(self, cluster: Cluster, name: str) -> None:
        self.cluster = cluster
        self.name = name
        self.seen: dict[str, dict[int, float]] = {"sealed": {}, "object": {}, "released": {}}

    def poll(self) -> None:
        now = time.perf_counter()
        ranges: list[dict[str, Any]] = self.cluster.describe(self.name)["ranges"]
        for i, r in enumerate(ranges):
            if r["end"] is not None:
                self.seen["sealed"].setdefault(i, now)
            if r["tier"] == "object":
                self.seen["object"].setdefault(i, now)
                if not r["replicas"]:
                    self.seen["released"].setdefault(i, now)

    async def run(self) -> None:
        while True:
            await asyncio.to_thread(self.poll)
            await asyncio.sleep(SAMPLE_S)

    def lags(self, since: str, until: str) -> list[float]:
        a, b = self.seen[since], self.seen[until]
        return sorted(b[i] - a[i] for i in b if i in a)


async def write(client: estream.Client, name: str, records: int, range_bytes: int,
                rate_mb_s: float | None = None) -> float:
    """Write ``records`` (at most ``rate_mb_s`` MB/s on average when set); returns the
    seconds it took."""
    started = time.perf_counter()
    writer = await Writer.open(client, name, WriterConfig(range_bytes_max=range_bytes))
    try:
        for lo in range(0, records, BATCH_RECORDS):
            if rate_mb_s is not None:  # paced: never ahead of rate_mb_s since the start
                ahead = started + lo * RECORD_BYTES / (rate_mb_s * 1e6) - time.perf_counter()
                if ahead > 0:
                    await asyncio.sleep(ahead)
            await writer.append_batch([value(i) for i in range(
                lo, min(records, lo + BATCH_RECORDS))])
        await writer.flush()
    finally:
        await writer.close()
    return time.perf_counter() - started


async def measure(seaweed: SeaweedS3, cluster: Cluster, ns: argparse.Namespace
                  ) -> dict[str, Any]:
    name = "tier-disk"
    records = ns.total_mib * MiB // RECORD_BYTES
    os.environ.update(seaweed.env)
    dirs = {s.listen: s.data_dir for s in cluster.servers}
    with Sampler(dirs) as sampler:
        before = sampler.sample()
        async with await estream.connect(cluster.pd_addresses) as client:
            lifecycle = Lifecycle(cluster, name)
            await client.create_stream(name, replicas=3, ack_count=2)
            poller = asyncio.ensure_future(lifecycle.run())
            try:
                write_s = await asyncio.wait_for(
                    write(client, name, records, ns.range_mib * MiB, ns.rate_mb_s),
                    WRITE_TIMEOUT_S)
                ranges = len(cluster.describe(name)["ranges"])
                async with await client.open_writer(name):  # its recovery seals the last
                    pass
                deadline = time.perf_counter() + RELEASE_TIMEOUT_S
                while (waiting := unreleased(cluster, name, records)) is not None:
                    if time.perf_counter() > deadline:
                        raise TimeoutError(f"range not released in time: {waiting}")
                    await asyncio.sleep(SAMPLE_S)
            finally:
                poller.cancel()
                await asyncio.gather(poller, return_exceptions=True)
            released_at = time.perf_counter()
            # The disk use settles once the range servers checkpoint and delete segments.
            settled = sampler.sample()
            while time.perf_counter() < released_at + SETTLE_S:
                await asyncio.sleep(0.5)
                settled = sampler.sample()
            async for columns in client.read_batches(name, records - 1, records):
                if columns.values()[-1] != value(records - 1):
                    raise RuntimeError("the last record read back wrong from the object tier")
    bound = ns.bound_mib * MiB
    servers = {k: {"peak_mib": sampler.peak(k) / MiB, "ratio": sampler.peak(k) / bound,
                   "shrinks": sampler.shrinks(k, ns.segment_mib * MiB // 2),
                   "before_mib": before[k] / MiB, "after_mib": settled[k] / MiB}
               for k in dirs}
    return {
        "total_mib": ns.total_mib, "bound_mib": ns.bound_mib, "range_mib": ns.range_mib,
        "segment_mib": ns.segment_mib, "offload_delay_s": ns.offload_delay_s,
        "local_retention_s": ns.local_retention_s, "ranges": ranges,
        "rate_mb_s": ns.rate_mb_s,
        "write_mb_s": records * RECORD_BYTES / write_s / 1e6, "write_s": write_s,
        "servers": servers,
        "max_peak_mib": max(s["peak_mib"] for s in servers.values()),
        "max_ratio": max(s["ratio"] for s in servers.values()),
        "samples": len(next(iter(sampler.series.values()))),
        "seal_to_object_s": quantiles(lifecycle.lags("sealed", "object")),
        "object_to_released_s": quantiles(lifecycle.lags("object", "released")),
        # ranges of range_mib released per second while writing: the rate the tier drains
        "released_mb_s": drained(lifecycle, ns.range_mib * MiB),
    }


def quantiles(lags: list[float]) -> dict[str, float]:
    if not lags:
        return {"median": float("nan"), "max": float("nan")}
    return {"median": lags[len(lags) // 2], "max": lags[-1]}


def drained(lifecycle: Lifecycle, range_bytes: int) -> float:
    """MB/s of ranges released, between the first and the last release seen."""
    times = sorted(lifecycle.seen["released"].values())
    if len(times) < 2 or times[-1] <= times[0]:
        return float("nan")
    return (len(times) - 1) * range_bytes / (times[-1] - times[0]) / 1e6


def report(r: dict[str, Any]) -> None:
    ok = r["max_ratio"] < 1.0
    paced = "" if r["rate_mb_s"] is None else f" (paced at {r['rate_mb_s']} MB/s)"
    print(f"{r['total_mib']} MiB written into one stream ({r['ranges']} ranges of "
          f"{r['range_mib']} MiB, log segments of {r['segment_mib']} MiB) at "
          f"{r['write_mb_s']:.1f} MB/s"
          f"{paced}; offload delay {r['offload_delay_s']} s, local "
          f"retention {r['local_retention_s']} s; {r['samples']} samples per server")
    for key, s in r["servers"].items():
        print(f"  range server {key}: peak {s['peak_mib']:7.1f} MiB ({s['ratio']:.2f} of "
              f"{r['bound_mib']} MiB), shrank {s['shrinks']} times, {s['before_mib']:.1f} MiB "
              f"before, {s['after_mib']:.1f} MiB after release")
    print(f"range lifecycle: sealed to object median {r['seal_to_object_s']['median']:.1f} s "
          f"(max {r['seal_to_object_s']['max']:.1f}), object to released median "
          f"{r['object_to_released_s']['median']:.1f} s (max "
          f"{r['object_to_released_s']['max']:.1f}); ranges released at "
          f"{r['released_mb_s']:.1f} MB/s vs written at {r['write_mb_s']:.1f} MB/s")
    print(f"largest per-server disk use: {r['max_peak_mib']:.1f} MiB = {r['max_ratio']:.2f} of "
          f"the {r['bound_mib']} MiB bound ({r['total_mib'] / r['bound_mib']:.0f}x written): "
          f"{'met' if ok else 'MISSED'}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="quick")
    parser.add_argument("--total-mib", type=int, default=None)
    parser.add_argument("--bound-mib", type=int, default=None)
    parser.add_argument("--range-mib", type=int, default=None)
    parser.add_argument("--segment-mib", type=int, default=None)
    parser.add_argument("--offload-delay-s", type=float, default=1.0)
    parser.add_argument("--local-retention-s", type=float, default=1.0)
    parser.add_argument("--rate-mb-s", type=float, default=None,
                        help="pace the writer to at most this many MB/s (default: as fast "
                             "as it goes)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    ns = parser.parse_args(argv)
    for key, default in SCALES[ns.scale].items():
        if getattr(ns, key) is None:
            setattr(ns, key, default)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-tier-disk-") as work, \
            tier(Path(work), ns) as (seaweed, cluster):
        result = asyncio.run(measure(seaweed, cluster, ns))
    result["seconds"] = round(time.monotonic() - started, 1)
    report(result)
    print(json.dumps(result, default=lambda v: round(v, 3)))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
