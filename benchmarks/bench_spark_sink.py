"""Spark sink throughput: rows/s of one streaming query (``availableNow``, ``local[2]``)
from a local Parquet source into three sinks: the ``estream`` sink in its default mode
(tasks hand rows to the driver, which appends them through one writer), the ``estream``
sink in ``mode executors`` (tasks append directly as idempotent producers, one stream per
partition, ``--partitions`` of them), and Parquet files (Spark's built-in file sink: the
ceiling). Each query runs once to warm up, then ``--runs`` times measured; prints the best
rows/s of each and the ratios. Bounded: ``--records`` rows of ``--value-bytes`` bytes.
Starts its own cluster (``estream up``) unless ``--pd``.

    python benchmarks/bench_spark_sink.py [--records 200000] [--partitions 2] [--runs 2]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from estream.devcluster.spark import new_spark
from estream.devcluster.upcluster import UpCluster

QUERY_TIMEOUT_S = 600


def run_query(spark: Any, source: Path, schema: Any, sink: str, options: dict[str, str],
              partitions: int, records: int) -> float:
    """Rows/s of one availableNow run of the Parquet source into ``sink``."""
    df = spark.readStream.schema(schema).parquet(str(source)).repartition(partitions, "value")
    writer = df.writeStream.format(sink).trigger(availableNow=True)
    for key, value in options.items():
        writer = writer.option(key, value)
    started = time.perf_counter()
    query = writer.start()
    if not query.awaitTermination(QUERY_TIMEOUT_S):
        query.stop()
        raise TimeoutError(f"the {sink} query did not finish in {QUERY_TIMEOUT_S}s")
    if query.exception() is not None:
        raise RuntimeError(f"the {sink} query failed: {query.exception()}")
    return records / (time.perf_counter() - started)


def measure(pd: str, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    spark = new_spark("bench-spark-sink")
    try:
        source = work / "source"
        rows = spark.range(args.records).selectExpr(
            f"cast(lpad(cast(id as string), {args.value_bytes}, 'x') as binary) as value")
        rows.repartition(4).write.parquet(str(source))
        schema = spark.read.parquet(str(source)).schema
        best: dict[str, float] = {}
        for attempt in range(args.runs + 1):  # the first run of each warms up
            for name, sink, options in (
                ("driver", "estream", {"pd": pd, "stream": f"sink-driver-{attempt}"}),
                ("executors", "estream", {"pd": pd, "stream": f"sink-exec-{attempt}",
                                          "mode": "executors"}),
                ("parquet", "parquet", {"path": str(work / f"out-{attempt}")}),
            ):
                if name == "driver":
                    _create(pd, f"sink-driver-{attempt}")
                ckpt = work / f"ckpt-{name}-{attempt}"
                rps = run_query(spark, source, schema, sink,
                                {**options, "checkpointLocation": str(ckpt)},
                                args.partitions, args.records)
                print(f"{name:9s} run {attempt}: {rps:,.0f} rows/s", flush=True)
                if attempt:
                    best[name] = max(best.get(name, 0.0), rps)
        return {
            "records": args.records, "value_bytes": args.value_bytes,
            "partitions": args.partitions, "runs": args.runs,
            **{f"{k}_rows_per_s": round(v) for k, v in best.items()},
            "executors_to_driver": round(best["executors"] / best["driver"], 3),
            "executors_to_parquet": round(best["executors"] / best["parquet"], 3),
        }
    finally:
        spark.stop()


def _create(pd: str, name: str) -> None:
    import asyncio

    import estream

    async def create() -> None:
        async with await estream.connect(pd) as client:
            await client.create_stream(name)

    asyncio.run(create())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pd", default=None, help="an existing cluster; default: start one")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="bench-spark-sink-"))
    cluster = None
    try:
        pd = args.pd
        if pd is None:
            cluster = UpCluster(work / "data", work / "estream-up.log").start()
            pd = cluster.pd
        result = measure(pd, args, work)
    finally:
        if cluster is not None:
            cluster.stop()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    raise SystemExit(main())
