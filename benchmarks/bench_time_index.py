"""Benchmark: ``client.offset_for_time`` on a stream of 1,000 ranges (issue #18).

    .venv/bin/python benchmarks/bench_time_index.py [--ranges 1000] [--lookups 500]

Starts a local cluster (1 PD node, 3 range servers, ``estream/devcluster``), writes a
stream whose writer rolls every ``--range-kib`` KiB (records with increasing timestamps,
one clock step back every 7 records), waits until PD recorded every sealed range's
statistics, then times ``--lookups`` lookups at random times over the whole stream,
checking each answer against the expected offset. Prints p50/p99 and the p99's ratio to
the target (5 ms p99, issue #18) and to the floor of any lookup, measured in the same
run: one small PD request (``PD_CLUSTER``) then one range-server ``PING``, back to back
(a lookup asks PD for the candidate ranges, then one replica).
Bounded: about a minute (``--deadline-s``).
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path

import estream
from estream.core.writeeffects import WriterConfig
from estream.devcluster.cluster import start_cluster
from estream.sdk.writer import Writer
from estream.wire.protocol import Opcode

TARGET_P99_MS = 5.0
T0 = 1_700_000_000_000


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def stamp(i: int) -> int:
    """Record ``i``'s timestamp: increasing, with a step back every 7 records."""
    return T0 + 10 * i - (15 if i % 7 == 6 else 0)


def expected(count: int, t: int) -> int:
    return next((i for i in range(count) if stamp(i) >= t), count)


async def fill(client: estream.Client, name: str, ranges: int, range_kib: int,
               deadline: float) -> int:
    """Records until the stream has ``ranges`` ranges; returns how many were written."""
    await client.create_stream(name)
    config = WriterConfig(range_bytes_max=range_kib * 1024, linger_ms=0, confirm_idle_ms=1)
    writer = await Writer.open(client, name, config)
    value = b"x" * 1024
    count = 0
    try:
        while time.monotonic() < deadline:
            await writer.append(value, timestamp=stamp(count))
            count += 1
            if count % 16 == 0 and len(writer.stream.ranges) >= ranges:
                break
    finally:
        await writer.close()
    return count


async def recorded(client: estream.Client, name: str, deadline: float) -> int:
    """Wait until PD recorded the statistics of every sealed range; returns the ranges."""
    while True:
        meta = await client.describe_stream(name)
        missing = [r for r in meta.ranges if r.sealed and r.end != r.start
                   and r.max_timestamp is None]
        if not missing or time.monotonic() > deadline:
            return len(meta.ranges)
        await asyncio.sleep(0.5)


async def measure(pd: str, ns: argparse.Namespace) -> int:
    deadline = time.monotonic() + ns.deadline_s
    async with await estream.connect(pd) as client:
        count = await fill(client, "timed", ns.ranges, ns.range_kib, deadline)
        ranges = await recorded(client, "timed", deadline + 30)
        rng = random.Random(18)
        lookups, floors = [], []
        server = (await client.describe_stream("timed")).ranges[-1].replicas[0].address
        for _ in range(ns.lookups):
            t = stamp(rng.randrange(count)) + rng.choice((-1, 0, 1))
            started = time.perf_counter()
            got = await client.offset_for_time("timed", t)
            lookups.append((time.perf_counter() - started) * 1000)
            if got != expected(count, t):
                print(f"WRONG: offset_for_time({t}) = {got}, expected {expected(count, t)}")
                return 1
            started = time.perf_counter()
            await client.pd.cluster()
            await client.pool.call(server, Opcode.PING, {}, timeout_s=5.0)
            floors.append((time.perf_counter() - started) * 1000)
    p50, p99 = pct(lookups, 0.5), pct(lookups, 0.99)
    floor50, floor = pct(floors, 0.5), pct(floors, 0.99)
    print(f"stream: {count} records in {ranges} ranges")
    print(f"offset_for_time over {len(lookups)} lookups: p50 {p50:.2f} ms, p99 {p99:.2f} ms")
    print(f"  p99 / target ({TARGET_P99_MS:.0f} ms): {p99 / TARGET_P99_MS:.2f}")
    print(f"  p99 / floor p99 ({floor:.2f} ms: a PD request + a range-server ping; floor "
          f"p50 {floor50:.2f} ms): {p99 / floor:.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranges", type=int, default=1000)
    parser.add_argument("--range-kib", type=int, default=4)
    parser.add_argument("--lookups", type=int, default=500)
    parser.add_argument("--deadline-s", type=float, default=240.0)
    ns = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-time-") as tmp, \
            start_cluster(Path(tmp), pd_nodes=1, range_servers=3) as cluster:
        return asyncio.run(measure(cluster.pd_addresses, ns))


if __name__ == "__main__":
    sys.exit(main())
