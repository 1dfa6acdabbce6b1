"""Catch-up read throughput through the SDK against a local cluster of real processes.

Starts 1 PD node and 3 range servers, appends ``--records`` records of ``--value-bytes``
bytes (default 200,000 x 1 KiB; replicas 3, ack 2) and reads the whole stream back
``--runs`` times with each read API, one after the other:

- ``read``: ``Client.read``, one ``Record`` per record;
- ``read_batches``: ``Client.read_batches``, one ``BatchColumns`` per stored batch (values
  in one buffer, no object per record);
- ``read_batches+arrow``: the same, each chunk of columns turned into an Arrow batch the
  way the Spark source does (``estream.spark.arrow.columns_to_arrow``).

Prints records/s (best and median of the runs) per API. Every phase is bounded in count
and time. ``--striped``: instead, 6 range servers and two sealed streams of the same
records in batches of ``--batch-records``, one unstriped (replicas 3) and one striped (E 6,
replicas 3: written by hand by write set, as the SDK writer does not stripe yet), each
read whole with ``read_batches`` in turn, ``--runs`` times: the striped read's ratio to
the unstriped one (issue 30), and the reading process's CPU time a record. Usage::

    .venv/bin/python benchmarks/bench_read.py [--records 200000] [--runs 3] [--json out.json]
    .venv/bin/python benchmarks/bench_read.py --striped [--records 50000] [--batch-records 500]
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
    from estream.spark.arrow import columns_to_arrow
    from estream.spark.source import arrow_schema

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


async def fill_striped(client: estream.Client, name: str, records: int, value_bytes: int,
                       batch_records: int) -> None:
    """One sealed range of E 6, replicas 3: batch k appended to its write set's servers
    (naming its index), sealed on each with the batch count and in PD."""
    from estream.net.rangeclient import RangeClient
    from estream.net.rpc import ConnectionPool
    from estream.wire.record import Record, encode_batch
    from estream.wire.stripe import Stripe

    stripe = Stripe(6, 3, 2)
    await client.create_stream(name, replicas=3, ack_count=2, ensemble=6)
    meta = await client.pd.open_writer(name)
    refs, epoch = meta.ranges[0].replicas, meta.epoch
    pool = ConnectionPool()
    rc = RangeClient(pool, timeout_s=30.0)
    try:
        for p, ref in enumerate(refs):
            await rc.create_range(ref.address, server_id=ref.id, stream_id=meta.id,
                                  range_index=0, start=0, epoch=epoch, stripe=(6, 3, p))
        value = os.urandom(value_bytes)
        offset = k = 0
        while offset < records:
            n = min(batch_records, records - offset)
            batch = encode_batch([Record(value, {}, 0)] * n, stream_id=meta.id, range_index=0,
                                 epoch=epoch, base_offset=offset)
            await asyncio.gather(*(rc.append(refs[p].address, server_id=refs[p].id,
                                             batch=batch, batch_index=k)
                                   for p in stripe.write_set(k)))
            offset, k = offset + n, k + 1
        await asyncio.gather(*(rc.seal(r.address, server_id=r.id, stream_id=meta.id,
                                       range_index=0, epoch=epoch, end=offset, batches=k)
                               for r in refs))
        await client.pd.seal_range(name, epoch, 0, offset, stream_id=meta.id)
    finally:
        await pool.close()


async def fill_plain(client: estream.Client, name: str, records: int, value_bytes: int,
                     batch_records: int) -> None:
    """The same records unstriped, in batches of the same size (its range left open, every
    record confirmed: a read ends there)."""
    value = os.urandom(value_bytes)
    await client.create_stream(name, replicas=3, ack_count=2)
    async with await client.open_writer(name) as writer:
        for lo in range(0, records, batch_records):
            await writer.append_batch([value] * min(batch_records, records - lo))
        await writer.flush()


async def measure_striped(pd: str, args: argparse.Namespace) -> dict[str, Any]:
    names = {"unstriped": "bench-read-e3", "striped": "bench-read-e6"}
    async with await estream.connect(pd, timeout_s=30.0) as client:
        await fill_plain(client, names["unstriped"], args.records, args.value_bytes,
                         args.batch_records)
        await fill_striped(client, names["striped"], args.records, args.value_bytes,
                           args.batch_records)
        rates: dict[str, list[float]] = {kind: [] for kind in names}
        cpu: dict[str, list[float]] = {kind: [] for kind in names}  # the reading process's
        for _ in range(args.runs):
            for kind, name in names.items():
                started, cpu_started = time.perf_counter(), time.process_time()

                async def read_all(name: str = name) -> int:
                    n = 0
                    async for columns in client.read_batches(name):
                        n += columns.count
                    return n

                count = await asyncio.wait_for(read_all(), PHASE_TIMEOUT_S)
                if count != args.records:
                    raise RuntimeError(f"{kind} read {count} records, expected {args.records}")
                rates[kind].append(count / (time.perf_counter() - started))
                cpu[kind].append((time.process_time() - cpu_started) / count * 1e6)
    best = {kind: max(r) for kind, r in rates.items()}
    return {
        "records": args.records, "value_bytes": args.value_bytes,
        "batch_records": args.batch_records,
        **{kind: {"best_records_per_s": round(best[kind]),
                  "median_records_per_s": round(statistics.median(r)),
                  "client_cpu_us_per_record_median": round(statistics.median(cpu[kind]), 2)}
           for kind, r in rates.items()},
        "striped_over_unstriped_best": round(best["striped"] / best["unstriped"], 2),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", default=None, help="also write the result to this file")
    parser.add_argument("--striped", action="store_true",
                        help="striped (E 6) vs unstriped catch-up reads on 6 servers")
    parser.add_argument("--batch-records", type=int, default=500)
    args = parser.parse_args(argv)
    if args.striped:
        return main_striped(args)
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


def main_striped(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-read-") as work:
        cluster = start_cluster(Path(work), pd_nodes=1, range_servers=6)
        try:
            cluster.wait_servers(6)
            import uvloop

            result = uvloop.run(measure_striped(cluster.pd_addresses, args))
        finally:
            cluster.stop()
    for kind in ("unstriped", "striped"):
        r = result[kind]
        print(f"{kind:>10}: best {r['best_records_per_s']:>9,} records/s, "
              f"median {r['median_records_per_s']:,}; the reader's CPU "
              f"{r['client_cpu_us_per_record_median']} us a record (median)")
    print(f"striped / unstriped (best): {result['striped_over_unstriped_best']}x")
    print(json.dumps(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
