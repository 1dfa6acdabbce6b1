"""Catch-up read throughput through the SDK against a local cluster of real processes.

Starts 1 PD node and 3 range servers, appends ``--records`` records of ``--value-bytes``
bytes (default 200,000 x 1 KiB; replicas 3, ack 2) and reads the whole stream back
``--runs`` times with each read API, one after the other:

- ``read``: ``Client.read``, one ``Record`` per record;
- ``read_batches``: ``Client.read_batches``, one ``BatchColumns`` per stored batch (values
  in one buffer, no object per record);
- ``read_batches+arrow``: the same, each chunk of columns turned into an Arrow batch the
  way the Spark source does (``estream.spark.source.columns_to_arrow``).

Prints records/s (best and median of the runs) per API. Every phase is bounded in count
and time. Usage::

    .venv/bin/python benchmarks/bench_read.py [--records 200000] [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import estream
from estream.devcluster.cluster import start_cluster

PHASE_TIMEOUT_S = 120.0
STREAM = "bench-read"


async def fill(client: estream.Client, records: int, value_bytes: int) -> float:
    """Append the records; returns the append rate (records/s)."""
    value = os.urandom(value_bytes)
    await client.create_stream(STREAM, replicas=3, ack_count=2)
    started = time.perf_counter()
    async with await client.open_writer(STREAM) as writer:
        for lo in range(0, records, 2_000):
            await writer.append_batch([value] * min(2_000, records - lo))
        await writer.flush()
    return records / (time.perf_counter() - started)


async def read_records(client: estream.Client) -> int:
    count = 0
    async for _ in client.read(STREAM):
        count += 1
    return count


async def read_batches(client: estream.Client) -> int:
    count = 0
    async for columns in client.read_batches(STREAM):
        count += columns.count
    return count


async def read_batches_arrow(client: estream.Client) -> int:
    from estream.spark.source import arrow_schema, columns_to_arrow

    schema = arrow_schema()
    count = 0
    chunk: list[estream.BatchColumns] = []
    async for columns in client.read_batches(STREAM):
        chunk.append(columns)
        if sum(c.count for c in chunk) >= 8_192:
            count += columns_to_arrow(STREAM, chunk, schema).num_rows
            chunk = []
    if chunk:
        count += columns_to_arrow(STREAM, chunk, schema).num_rows
    return count


MODES: dict[str, Callable[[estream.Client], Awaitable[int]]] = {
    "read": read_records,
    "read_batches": read_batches,
    "read_batches+arrow": read_batches_arrow,
}


async def measure(pd: str, args: argparse.Namespace) -> dict[str, Any]:
    async with await estream.connect(pd) as client:
        append_rate = await fill(client, args.records, args.value_bytes)
        rates: dict[str, list[float]] = {mode: [] for mode in MODES}
        for _ in range(args.runs):
            for mode, read in MODES.items():
                started = time.perf_counter()
                count = await asyncio.wait_for(read(client), PHASE_TIMEOUT_S)
                elapsed = time.perf_counter() - started
                if count != args.records:
                    raise RuntimeError(f"{mode} read {count} records, expected {args.records}")
                rates[mode].append(count / elapsed)
    return {
        "records": args.records,
        "value_bytes": args.value_bytes,
        "append_records_per_s": round(append_rate),
        **{
            mode: {
                "best_records_per_s": round(max(r)),
                "median_records_per_s": round(statistics.median(r)),
                "best_mb_per_s": round(max(r) * args.value_bytes / 1e6, 1),
            }
            for mode, r in rates.items()
        },
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-read-") as work:
        cluster = start_cluster(Path(work), pd_nodes=1, range_servers=3)
        try:
            import uvloop

            result = uvloop.run(measure(cluster.pd_addresses, args))
        finally:
            cluster.stop()
    for mode in MODES:
        r = result[mode]
        print(
            f"{mode:>20}: best {r['best_records_per_s']:>9,} records/s "
            f"({r['best_mb_per_s']} MB/s), median {r['median_records_per_s']:,}"
        )
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
