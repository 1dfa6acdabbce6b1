"""Spark source throughput: rows/s from an estream stream into a noop sink, beside the same
query over a local Parquet copy of the same data (Spark's built-in source: the ceiling).

Bounded: appends ``--records`` records of ``--value-bytes`` bytes (default 1,000,000 x
1 KiB = 1 GiB: enough for both queries to reach their steady state, so the fixed start-up
of a query does not decide the ratio; about 1 to 2 min), each a distinct random value
(``--values same`` repeats one value: Parquet then stores the column as one dictionary
entry and its reader never touches the bytes, which no real stream looks like). Copies
them to Parquet with a Spark batch read of the ``estream`` source, then runs each
streaming query (``availableNow``, ``local[2]``, noop sink) once to warm up and ``--runs``
times measured, and prints the best rows/s of each and their ratio (target: estream >=
50% of Parquet). ``--variants P:A,P:A`` measures several ``partitionRecords:arrowRows``
settings in one session, each beside its own Parquet runs.
Starts its own cluster (``estream up``) unless ``--pd``.

``--tiered`` (issue #16): the stream is read from the object tier instead. Starts SeaweedFS
(``weed mini``) and a cluster through estream/devcluster (1 PD node offloading to it 1 s
after a seal, releasing the range servers' replicas 1 s after the upload; 3 range
servers), writes the records in ranges of ``--range-mib`` MiB, seals the stream and waits
until every range is in the object tier with no replica left, so the source reads objects
only (executors GET them directly); the Parquet copy is made from that same stream.

    python benchmarks/bench_spark.py [--records 1000000] [--values distinct|same] [--pd H:P,...]
    python benchmarks/bench_spark.py --runs 3 --variants 50000:8192,100000:8192
    python benchmarks/bench_spark.py --tiered [--range-mib 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from estream.devcluster.cluster import Cluster, start_cluster
from estream.devcluster.seaweed import start_seaweed
from estream.devcluster.spark import new_spark
from estream.devcluster.upcluster import pd_or_up
from estream.spark.options import ARROW_ROWS_DEFAULT
from estream.spark.planning import PARTITION_RECORDS_DEFAULT

QUERY_TIMEOUT_S = 300
PARQUET_FILES = 4
TIER_TIMEOUT_S = 300.0  # --tiered: every range offloaded and released by then


def values(n: int, value_bytes: int, distinct: bool) -> list[bytes]:
    """``n`` random values of ``value_bytes`` bytes: all different, or one repeated."""
    if not distinct:
        return [os.urandom(value_bytes)] * n
    block = os.urandom(n * value_bytes)
    return [block[i : i + value_bytes] for i in range(0, n * value_bytes, value_bytes)]


async def fill(
    pd: str,
    stream: str,
    records: int,
    value_bytes: int,
    distinct: bool = True,
    range_bytes: int | None = None,
) -> float:
    """Create ``stream`` and append the records (in ranges of ``range_bytes``: a
    per-writer setting; default ``limits.range_bytes_max``); returns the append rate
    (records/s)."""
    import estream
    from estream.sdk.writer import Writer, WriterConfig

    async with await estream.connect(pd) as client:
        await client.create_stream(stream)
        started = time.perf_counter()
        if range_bytes is None:
            writer = await client.open_writer(stream)
        else:
            writer = await Writer.open(client, stream, WriterConfig(range_bytes_max=range_bytes))
        async with writer:
            for lo in range(0, records, 2_000):
                n = min(2_000, records - lo)
                await writer.append_batch(values(n, value_bytes, distinct))
            await writer.flush()
        return records / (time.perf_counter() - started)


async def tier_out(cluster: Cluster, pd: str, stream: str, records: int) -> int:
    """Seal ``stream`` (a new writer's recovery does) and wait until every range holding
    its ``records`` records is in the object tier with no replica left; returns how many."""
    import estream

    async with await estream.connect(pd) as client:
        async with await client.open_writer(stream):
            pass
    deadline = time.perf_counter() + TIER_TIMEOUT_S
    while True:
        ranges = [r for r in cluster.describe(stream)["ranges"] if r["start"] < records]
        if all(
            r["end"] is not None and r["tier"] == "object" and not r["replicas"] for r in ranges
        ):
            return len(ranges)
        if time.perf_counter() > deadline:
            raise TimeoutError(f"{stream}: not every range offloaded and released in time")
        await asyncio.sleep(0.2)


@contextmanager
def tiered_cluster(work: Path) -> Iterator[tuple[Cluster, str]]:
    """SeaweedFS and a cluster offloading to it after 1 s, releasing replicas 1 s later;
    every process stopped by PID on the way out. The AWS credential variables are set
    in this process too: Spark's executors read the objects with them."""
    (work / "cluster").mkdir(parents=True, exist_ok=True)
    seaweed = start_seaweed(work / "seaweed")
    try:
        os.environ.update(seaweed.env)
        env = {
            "ESTREAM_OBJECT_STORE": seaweed.url("bench-spark"),
            "ESTREAM_OBJECT_STORE_ENDPOINT": seaweed.endpoint,
            "ESTREAM_OFFLOAD_DELAY_S": "1",
            "ESTREAM_LOCAL_RETENTION_S": "1",
            **seaweed.env,
        }
        cluster = start_cluster(work / "cluster", pd_nodes=1, range_servers=3, env=env)
        try:
            yield cluster, cluster.pd_addresses
        finally:
            cluster.stop()
    finally:
        seaweed.stop()


def timed(spark: Any, df: Any, records: int) -> tuple[float, float]:
    """Rows/s of one availableNow run of ``df`` into the noop sink: over the query's wall
    time (start to end, including the source's set-up) and over its micro-batches'
    ``triggerExecution`` time only (the steady state)."""
    started = time.perf_counter()
    query = df.writeStream.format("noop").trigger(availableNow=True).start()
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        query.stop()
        raise RuntimeError("query did not finish in time")
    elapsed = time.perf_counter() - started
    if query.exception() is not None:
        raise RuntimeError(str(query.exception()))
    rows = sum(p["numInputRows"] for p in query.recentProgress)
    if os.environ.get("BENCH_VERBOSE"):
        for p in query.recentProgress:
            print(p["numInputRows"], json.dumps(p["durationMs"]), f"{elapsed:.2f}s")
    if rows != records:
        raise RuntimeError(f"query read {rows} rows, expected {records}")
    trigger_ms = sum(p["durationMs"].get("triggerExecution", 0) for p in query.recentProgress)
    return rows / elapsed, rows * 1000 / max(1, trigger_ms)


def best_of(spark: Any, make_df: Any, records: int, runs: int) -> tuple[float, float]:
    timed(spark, make_df(), records)  # warm-up: JIT, Python workers, caches
    results = [timed(spark, make_df(), records) for _ in range(runs)]
    return max(r[0] for r in results), max(r[1] for r in results)


def measure(
    pd: str, args: argparse.Namespace, work: Path, cluster: Cluster | None = None
) -> list[dict[str, Any]]:
    """With ``cluster`` (``--tiered``), the stream is read from the object tier."""
    stream = f"bench_spark_{int(time.time())}"
    range_bytes = args.range_mib * 1024 * 1024 if cluster is not None else None
    append_rate = asyncio.run(
        fill(pd, stream, args.records, args.value_bytes, args.values == "distinct", range_bytes)
    )
    tiered_ranges = (
        0 if cluster is None else asyncio.run(tier_out(cluster, pd, stream, args.records))
    )
    spark = new_spark("estream-bench", dict(c.split("=", 1) for c in args.conf))
    try:

        def estream_df(partition_records: int, arrow_rows: int) -> Any:
            return (
                spark.readStream.format("estream")
                .option("pd", pd)
                .option("streams", stream)
                .option("startingOffsets", "earliest")
                .option("partitionRecords", partition_records)
                .option("arrowRows", arrow_rows)
                .load()
            )

        parquet = work / "parquet"
        batch = spark.read.format("estream").option("pd", pd).option("streams", stream)
        # 4 files whatever the variant; Spark's file source packs them into one split per
        # core (local[2]: 2 tasks), as the estream source's default partitioning does here
        copy_records = max(1, args.records // PARQUET_FILES)
        batch.option("partitionRecords", copy_records).load().write.parquet(str(parquet))
        schema = spark.read.parquet(str(parquet)).schema
        if os.environ.get("BENCH_VERBOSE"):
            splits = spark.read.parquet(str(parquet)).rdd.getNumPartitions()
            files = list(parquet.glob("*.parquet"))
            size = sum(f.stat().st_size for f in files)
            print(f"parquet copy: {len(files)} files, {size:,} bytes, {splits} splits")

        def parquet_df() -> Any:
            return spark.readStream.schema(schema).parquet(str(parquet))

        results = []
        for partition_records, arrow_rows in variants(args):
            estream_rps, estream_steady = best_of(
                spark,
                lambda: estream_df(partition_records, arrow_rows),  # noqa: B023
                args.records,
                args.runs,
            )
            parquet_rps, parquet_steady = best_of(spark, parquet_df, args.records, args.runs)
            results.append(
                {
                    "records": args.records,
                    "tiered_ranges": tiered_ranges,
                    "value_bytes": args.value_bytes,
                    "values": args.values,
                    "partition_records": partition_records,
                    "arrow_rows": arrow_rows,
                    "append_records_per_s": round(append_rate),
                    "estream_rows_per_s": round(estream_rps),
                    "parquet_rows_per_s": round(parquet_rps),
                    "ratio": round(estream_rps / parquet_rps, 3),
                    "estream_batch_rows_per_s": round(estream_steady),
                    "parquet_batch_rows_per_s": round(parquet_steady),
                    "batch_ratio": round(estream_steady / parquet_steady, 3),
                    "target_ratio": 0.5,
                    "conf": args.conf,
                }
            )
    finally:
        spark.stop()
    return results


def variants(args: argparse.Namespace) -> list[tuple[int, int]]:
    """The (partitionRecords, arrowRows) pairs to measure: ``--variants P:A,P:A`` or the
    single pair given by ``--partition-records`` and ``--arrow-rows``."""
    if not args.variants:
        return [(args.partition_records, args.arrow_rows)]
    pairs = []
    for item in args.variants.split(","):
        records, _, rows = item.partition(":")
        pairs.append((int(records), int(rows or args.arrow_rows)))
    return pairs


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pd", default=None, help="an existing cluster; default: start one")
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--value-bytes", type=int, default=1024)
    parser.add_argument(
        "--values",
        choices=("distinct", "same"),
        default="distinct",
        help="distinct random values (default), or one value repeated (the old benchmark)",
    )
    parser.add_argument("--partition-records", type=int, default=PARTITION_RECORDS_DEFAULT)
    parser.add_argument("--arrow-rows", type=int, default=ARROW_ROWS_DEFAULT)
    parser.add_argument(
        "--variants",
        default="",
        help="several partitionRecords:arrowRows pairs, each measured beside Parquet",
    )
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument(
        "--tiered",
        action="store_true",
        help="read the stream from the object tier (SeaweedFS), replicas released",
    )
    parser.add_argument("--range-mib", type=int, default=64, help="--tiered: range size")
    parser.add_argument(
        "--conf", action="append", default=[], help="a Spark setting K=V (repeatable)"
    )
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-spark-"))
    try:
        if args.tiered:
            with tiered_cluster(work) as (cluster, pd):
                results = measure(pd, args, work, cluster)
        else:
            with pd_or_up(args.pd, work) as pd:
                results = measure(pd, args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for result in results:
        report(result)
    return 0


def report(result: dict[str, Any]) -> None:
    where = (
        f"object tier ({result['tiered_ranges']} ranges, replicas released)"
        if result["tiered_ranges"]
        else "range servers"
    )
    print(
        f"{result['records']:,} records of {result['value_bytes']:,} bytes ({result['values']} "
        f"values) read from the {where}, partitionRecords {result['partition_records']:,}, "
        f"arrowRows {result['arrow_rows']:,}"
    )
    print(
        f"estream source: {result['estream_rows_per_s']:>9,} rows/s   "
        f"parquet (ceiling): {result['parquet_rows_per_s']:>9,} rows/s   "
        f"ratio {result['ratio']:.2f} (target >= 0.50)"
    )
    print(
        f"  micro-batch time only: estream {result['estream_batch_rows_per_s']:,} rows/s, "
        f"parquet {result['parquet_batch_rows_per_s']:,} rows/s, "
        f"ratio {result['batch_ratio']:.2f}"
    )
    print(json.dumps(result))


if __name__ == "__main__":
    raise SystemExit(main())
