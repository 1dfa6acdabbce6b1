"""Benchmark: the object-storage tier against SeaweedFS S3 on loopback (issue #16).

    .venv/bin/python benchmarks/bench_object_tier.py [--scale quick|full] [--json out.json]

Starts SeaweedFS (``weed mini``, estream/devcluster/seaweed.py) and a cluster (1 PD node
with ``--object-store s3://estream/bench``, 3 range servers, estream/devcluster), then, in
one run:

1. writes ``--streams`` streams of ``--range-mib`` MiB each (records of 4 KiB, batches of
   1 MiB), each one open range: nothing is sealed, so nothing is offloaded yet;
2. reads them all back from the range servers (``read_batches``): the local read;
3. the raw references, with the same client library and object sizes: a put loop
   (``ObjectStore.put``, obstore, one object at a time, the same part size as the
   offloader's; run again once the offload is over and the replicas released, the
   reference being the mean of the two), a ranged-get loop (8 MiB ``get_range`` one
   after the other, the reader's window size), and the same loop in the reader's
   windows (whole batches up to 8 MiB, as many GETs under way ahead as the reader
   keeps: ``READ_AHEAD``) verifying every batch's checksum: the limit of any verified
   read;
4. seals every stream at once (a new writer each), and times the offload: from when PD
   may start (the seals plus ``--offload-delay-s``) until every range is "object";
   PUTs per GiB come from PD's ``estream_object_requests_total{op="put"}`` and
   ``estream_offload_bytes_total``; the HTTP requests those PUTs make follow from the
   part size (``ObjectStore.put_requests``);
5. once the local replicas are released (``--local-retention-s``), reads every stream
   again (``read_batches``), now from the object store, and checks every record,
   alternating with the raw GET loops.

Every read (2, the GET loops, 5) runs ``--passes`` times (default 3); the medians are
reported, since the machine's other jobs come and go.

Prints the figures and the ratios to the targets: offload >= 0.7 of the raw put loop,
tiered catch-up read >= 0.7 of the raw ranged-get loop (and beside the range-server read),
PUTs per GiB <= 16. Bounded: every phase has a deadline; every process it starts (weed,
PD, range servers) is stopped by PID at the end, also on failure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import estream
from estream.devcluster.cluster import Cluster, start_cluster
from estream.devcluster.pd import http_json
from estream.devcluster.seaweed import SeaweedS3, start_seaweed
from estream.net.objectstore import ObjectStore, put_part_bytes
from estream.sdk.objectreads import read_ahead_windows
from estream.wire.objectformat import encode_object_parts
from estream.wire.record import Record, encode_batch, iter_batches, verify_batch

MiB = 1024 * 1024
GiB = 1024 * MiB
RECORD_BYTES = 4096
BATCH_RECORDS = 256  # 1 MiB batches
WINDOW_BYTES = 8 * MiB  # the SDK's object read window (estream/core/readcursor.py)
READ_AHEAD = read_ahead_windows  # windows the SDK's catch-up read fetches ahead
PHASE_TIMEOUT_S = 180.0
TARGET_OFFLOAD = 0.7
TARGET_READ = 0.7
TARGET_PUTS_PER_GIB = 16.0
SCALES = {"quick": {"streams": 6, "range_mib": 64}, "full": {"streams": 16, "range_mib": 128}}


@contextmanager
def tier(work: Path, ns: argparse.Namespace, prefix: str = "bench",
         **cluster_options: Any) -> Iterator[tuple[SeaweedS3, Cluster]]:
    """SeaweedFS and a cluster (1 PD node offloading to it under ``prefix`` after
    ``ns.offload_delay_s``, releasing after ``ns.local_retention_s``; 3 range servers;
    ``cluster_options`` go to ``start_cluster``), stopped by PID on the way out."""
    (work / "cluster").mkdir(parents=True, exist_ok=True)
    seaweed = start_seaweed(work / "seaweed")
    try:
        env = {"ESTREAM_OFFLOAD_DELAY_S": str(ns.offload_delay_s),
               "ESTREAM_LOCAL_RETENTION_S": str(ns.local_retention_s),
               **seaweed.pd_env(prefix)}
        cluster = start_cluster(work / "cluster", pd_nodes=1, range_servers=3, env=env,
                                **cluster_options)
        try:
            yield seaweed, cluster
        finally:
            cluster.stop()
    finally:
        seaweed.stop()


def metric(cluster: Cluster, prefix: str) -> float:
    status, text = http_json(cluster.pd_url() + "/metrics")
    if status != 200:
        raise RuntimeError(f"PD /metrics answered {status}")
    return sum(float(line.split()[-1]) for line in str(text).splitlines()
               if line.startswith(prefix))


def value(stream: int, i: int) -> bytes:
    head = f"{stream}:{i}:".encode()
    return head + b"v" * (RECORD_BYTES - len(head))


async def write(client: estream.Client, names: list[str], records: int) -> float:
    started = time.perf_counter()
    for s, name in enumerate(names):
        await client.create_stream(name, replicas=3, ack_count=2)
        async with await client.open_writer(name) as writer:
            for lo in range(0, records, BATCH_RECORDS):
                await writer.append_batch([value(s, i) for i in range(
                    lo, min(records, lo + BATCH_RECORDS))])
            await writer.flush()
    return time.perf_counter() - started


async def read_all(client: estream.Client, names: list[str], records: int) -> tuple[float, int]:
    """Every stream read from 0 to ``records`` with ``read_batches`` (which verifies every
    batch's checksum), the count and each batch's first and last value checked; returns
    the seconds and the bytes of values read."""
    started = time.perf_counter()
    total = 0
    for s, name in enumerate(names):
        offset = 0
        async for columns in client.read_batches(name, 0, records):
            values = columns.values()
            n = len(values)
            if n and (values[0] != value(s, offset) or values[-1] != value(s, offset + n - 1)):
                raise RuntimeError(f"{name}: records from {offset} read back wrong")
            total += sum(len(v) for v in values)
            offset += n
        if offset != records:
            raise RuntimeError(f"{name}: read {offset} records, expected {records}")
    return time.perf_counter() - started, total


def object_parts(records: int) -> list[bytes | memoryview]:
    """An object of one range of ``records`` records, as the offloader builds it."""
    batches = [encode_batch([Record(value(0, i), {}, 0) for i in range(
        lo, min(records, lo + BATCH_RECORDS))], stream_id=1, range_index=0, epoch=1,
        base_offset=lo) for lo in range(0, records, BATCH_RECORDS)]
    return encode_object_parts(batches, stream_id=1, range_index=0, start_offset=0,
                               end_offset=records)


def batch_windows(parts: list[bytes | memoryview]) -> list[tuple[int, int]]:
    """The object's data (its parts but the last, the index and footer) in spans of whole
    batches of at most ``WINDOW_BYTES`` (at least one batch): the SDK's GETs."""
    spans: list[tuple[int, int]] = []
    lo = hi = 0
    for batch in parts[:-1]:
        if hi > lo and hi - lo + len(batch) > WINDOW_BYTES:
            spans.append((lo, hi))
            lo = hi
        hi += len(batch)
    spans.append((lo, hi))
    return spans


async def raw_put(store: ObjectStore, count: int, parts: list[bytes | memoryview]
                  ) -> tuple[float, int]:
    """``count`` objects put one after the other; returns (seconds, bytes per object)."""
    started = time.perf_counter()
    for i in range(count):
        await store.put(f"raw/{i}.obj", parts)
    return time.perf_counter() - started, sum(len(p) for p in parts)


async def raw_get(store: ObjectStore, count: int, size: int) -> float:
    """The objects read back in 8 MiB ranged GETs one after the other (no byte looked
    at, nor copied: the store's buffer, as the SDK reads it); returns the seconds."""
    started = time.perf_counter()
    for i in range(count):
        for lo in range(0, size, WINDOW_BYTES):
            await store.get_range_view(f"raw/{i}.obj", lo, min(size, lo + WINDOW_BYTES))
    return time.perf_counter() - started


async def raw_verified_get(store: ObjectStore, count: int, windows: list[tuple[int, int]]
                           ) -> float:
    """The objects read in the SDK's windows (whole batches, up to 8 MiB), the next
    ``READ_AHEAD`` GETs under way while every batch of this one is checksum-verified
    (``verify_batch``): the least any verified read does; returns the seconds."""
    started = time.perf_counter()
    gets = [(f"raw/{i}.obj", lo, hi) for i in range(count) for lo, hi in windows]
    pending = [asyncio.ensure_future(store.get_range_view(*get))
               for get in gets[:1 + READ_AHEAD]]
    for k in range(len(gets)):
        data = await pending.pop(0)
        if k + 1 + READ_AHEAD < len(gets):
            pending.append(asyncio.ensure_future(
                store.get_range_view(*gets[k + 1 + READ_AHEAD])))
        for _, batch in iter_batches(data):
            verify_batch(batch)
    return time.perf_counter() - started


async def wait_until(cluster: Cluster, names: list[str], released: bool, deadline: float
                     ) -> float:
    """Polls until every stream's sealed range is "object" (and, with ``released``, has
    no replicas); returns the time it saw that."""
    while True:
        done = True
        for name in names:
            r = cluster.describe(name)["ranges"][0]
            if r["end"] is None or r["tier"] != "object" or (released and r["replicas"]):
                done = False
                break
        if done:
            return time.perf_counter()
        if time.perf_counter() > deadline:
            raise TimeoutError(f"the ranges were not {'released' if released else 'tiered'}"
                               " in time")
        await asyncio.sleep(0.1)


async def measure(seaweed: SeaweedS3, cluster: Cluster, ns: argparse.Namespace
                  ) -> dict[str, Any]:
    names = [f"tier-{i}" for i in range(ns.streams)]
    records = ns.range_mib * MiB // RECORD_BYTES
    os.environ.update(seaweed.env)  # the SDK reads the tier with the AWS_* variables
    async with await estream.connect(cluster.pd_addresses) as client:
        write_s = await asyncio.wait_for(write(client, names, records), PHASE_TIMEOUT_S)
        local = [await asyncio.wait_for(read_all(client, names, records), PHASE_TIMEOUT_S)
                 for _ in range(ns.passes)]
        local_s, value_bytes = statistics.median(s for s, _ in local), local[0][1]
        if any(cluster.describe(n)["ranges"][0]["tier"] != "local" for n in names):
            raise RuntimeError("a range was offloaded before the seal")
        store = seaweed.store("bench-raw")
        parts = object_parts(records)
        put_s, object_bytes = await asyncio.wait_for(raw_put(store, ns.streams, parts),
                                                     PHASE_TIMEOUT_S)
        puts_before = metric(cluster, 'estream_object_requests_total{op="put",outcome="ok"}')
        bytes_before = metric(cluster, "estream_offload_bytes_total")
        first_sealed = 0.0
        for name in names:  # a new writer's recovery seals the range
            async with await client.open_writer(name):
                pass
            first_sealed = first_sealed or time.perf_counter()
        tiered = await wait_until(cluster, names, False, first_sealed + PHASE_TIMEOUT_S)
        # From the first seal plus the offload delay (the earliest PD may start; it sees a
        # seal within a round of 1 s, which counts against the offload here).
        offload_s = tiered - first_sealed - ns.offload_delay_s
        puts = metric(cluster, 'estream_object_requests_total{op="put",outcome="ok"}'
                      ) - puts_before
        offloaded = metric(cluster, "estream_offload_bytes_total") - bytes_before
        if offloaded <= 0 or puts <= 0:
            raise RuntimeError(f"PD's metrics show {offloaded} bytes in {puts} PUTs offloaded")
        await wait_until(cluster, names, True, time.perf_counter() + PHASE_TIMEOUT_S)
        # The put loop again, the cluster idle (every range released): the reference is
        # the mean of the passes before and after the offload (the VM's load comes and goes).
        put_after_s, _ = await asyncio.wait_for(raw_put(store, ns.streams, parts),
                                                PHASE_TIMEOUT_S)
        # The tiered read and the raw GET loops alternate, ``--passes`` times (medians):
        # the VM's other jobs come and go.
        reads: list[tuple[float, int]] = []
        gets: list[float] = []
        verified: list[float] = []
        windows = batch_windows(parts)
        for _ in range(ns.passes):
            reads.append(await asyncio.wait_for(read_all(client, names, records),
                                                PHASE_TIMEOUT_S))
            gets.append(await asyncio.wait_for(raw_get(store, ns.streams, object_bytes),
                                               PHASE_TIMEOUT_S))
            verified.append(await asyncio.wait_for(
                raw_verified_get(store, ns.streams, windows), PHASE_TIMEOUT_S))
        for i in range(ns.streams):
            await store.delete(f"raw/{i}.obj")
        tiered_s, tiered_bytes = statistics.median(s for s, _ in reads), reads[0][1]
        get_s, verified_s = statistics.median(gets), statistics.median(verified)
    total = object_bytes * ns.streams
    mb = 1e6
    r = {
        "streams": ns.streams, "range_mib": ns.range_mib, "object_bytes": object_bytes,
        "put_part_bytes": put_part_bytes, "write_mb_s": total / write_s / mb,
        "offload_mb_s": offloaded / offload_s / mb,
        "raw_put_mb_s": (total / put_s + total / put_after_s) / 2 / mb,
        "raw_put_before_mb_s": total / put_s / mb, "raw_put_after_mb_s": total / put_after_s / mb,
        "local_read_mb_s": value_bytes / local_s / mb,
        "tiered_read_mb_s": tiered_bytes / tiered_s / mb, "raw_get_mb_s": total / get_s / mb,
        "raw_verified_get_mb_s": total / verified_s / mb,
        "puts_per_gib": puts / (offloaded / GiB),
        "http_puts_per_gib": ObjectStore.put_requests(object_bytes) * ns.streams / (
            offloaded / GiB),
    }
    r["offload_ratio"] = r["offload_mb_s"] / r["raw_put_mb_s"]
    r["read_ratio"] = r["tiered_read_mb_s"] / r["raw_get_mb_s"]
    r["read_vs_verified"] = r["tiered_read_mb_s"] / r["raw_verified_get_mb_s"]
    r["read_vs_local"] = r["tiered_read_mb_s"] / r["local_read_mb_s"]
    return r


def report(r: dict[str, Any]) -> None:
    def verdict(ok: bool) -> str:
        return "met" if ok else "MISSED"

    print(f"{r['streams']} streams of one {r['range_mib']} MiB range ({r['object_bytes']:,} "
          f"bytes per object), PUT parts of {r['put_part_bytes'] // MiB} MiB")
    print(f"write (3 replicas, ack 2):       {r['write_mb_s']:8.1f} MB/s")
    print(f"offload (seal to all committed): {r['offload_mb_s']:8.1f} MB/s")
    print(f"raw put loop, same objects:      {r['raw_put_mb_s']:8.1f} MB/s   offload / raw "
          f"{r['offload_ratio']:.2f} (target >= {TARGET_OFFLOAD}: "
          f"{verdict(r['offload_ratio'] >= TARGET_OFFLOAD)}; mean of the loop before "
          f"{r['raw_put_before_mb_s']:.1f} and after {r['raw_put_after_mb_s']:.1f})")
    print(f"catch-up read, range servers:    {r['local_read_mb_s']:8.1f} MB/s")
    print(f"catch-up read, object tier:      {r['tiered_read_mb_s']:8.1f} MB/s   tiered / "
          f"range servers {r['read_vs_local']:.2f}")
    print(f"raw ranged-get loop (8 MiB):     {r['raw_get_mb_s']:8.1f} MB/s   tiered / raw "
          f"{r['read_ratio']:.2f} (target >= {TARGET_READ}: "
          f"{verdict(r['read_ratio'] >= TARGET_READ)})")
    print(f"raw get loop, batches verified:  {r['raw_verified_get_mb_s']:8.1f} MB/s   tiered / "
          f"raw verified {r['read_vs_verified']:.2f} (the SDK's windows, {READ_AHEAD} GETs "
          "ahead, every checksum)")
    print(f"PUTs per GiB offloaded (PD metric): {r['puts_per_gib']:.1f} (target <= "
          f"{TARGET_PUTS_PER_GIB:.0f}: {verdict(r['puts_per_gib'] <= TARGET_PUTS_PER_GIB)}); "
          f"HTTP requests of those PUTs per GiB: {r['http_puts_per_gib']:.1f}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--scale", choices=sorted(SCALES), default="quick")
    parser.add_argument("--streams", type=int, default=None)
    parser.add_argument("--range-mib", type=int, default=None)
    parser.add_argument("--offload-delay-s", type=float, default=1.0)
    parser.add_argument("--local-retention-s", type=float, default=1.0)
    parser.add_argument("--passes", type=int, default=3,
                        help="reads of each kind (the medians are reported)")
    parser.add_argument("--json", default=None, help="also write the figures to this file")
    ns = parser.parse_args(argv)
    scale = SCALES[ns.scale]
    ns.streams = ns.streams or scale["streams"]
    ns.range_mib = ns.range_mib or scale["range_mib"]
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="bench-tier-") as work, \
            tier(Path(work), ns) as (seaweed, cluster):
        result = asyncio.run(measure(seaweed, cluster, ns))
    result["seconds"] = round(time.monotonic() - started, 1)
    report(result)
    print(json.dumps({k: round(v, 3) if isinstance(v, float) else v
                      for k, v in result.items()}))
    if ns.json:
        Path(ns.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
