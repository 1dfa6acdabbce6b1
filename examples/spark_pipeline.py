"""A real pipeline on estream and Spark: orders in, per-minute revenue out.

1. A producer appends JSON order events to the stream ``orders`` (event times spread over
   a few minutes, a few of them late).
2. A Spark structured-streaming query reads ``orders`` with the ``estream`` source, parses
   the JSON, and counts orders and sums revenue per one-minute window of event time, with
   a two-minute watermark (append mode: a window is written once the watermark passes it).
3. The result goes to the stream ``orders_per_minute`` with the ``estream`` sink, exactly
   once, and the script prints it.

The query runs with ``Trigger.AvailableNow`` in two rounds (so the second round's events
move the watermark past the first round's windows), then the script exits by itself.
Run it against a cluster (``estream up`` in another terminal)::

    python examples/spark_pipeline.py --pd 127.0.0.1:7100,127.0.0.1:7101,127.0.0.1:7102

Side effects: appends to estream streams, a Spark checkpoint in ``--checkpoint``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from typing import Any

import estream
from estream.wire.errors import StreamExists

ORDERS_DEFAULT = 2_000
MINUTE_MS = 60_000


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pd", default=os.environ.get("ESTREAM_PD", "127.0.0.1:7100"))
    parser.add_argument("--orders", type=int, default=ORDERS_DEFAULT, help="events per round")
    parser.add_argument("--source", default="orders")
    parser.add_argument("--sink", default="orders_per_minute")
    parser.add_argument("--checkpoint", default=None, help="default: a new temporary dir")
    parser.add_argument("--seed", type=int, default=7)
    return parser.parse_args(argv)


def order_events(n: int, start_ms: int, rng: random.Random, first_id: int) -> list[bytes]:
    """``n`` orders over five minutes from ``start_ms``; one in twenty arrives 30 s late."""
    events = []
    for i in range(n):
        ts = start_ms + (i * 5 * MINUTE_MS) // n
        if rng.random() < 0.05:
            ts -= 30_000
        order = {
            "order_id": first_id + i,
            "customer": f"c{rng.randrange(100)}",
            "amount": round(rng.uniform(1, 200), 2),
            "event_time": ts,
        }
        events.append(json.dumps(order).encode())
    return events


async def ensure_streams(pd: str, names: list[str]) -> None:
    async with await estream.connect(pd) as client:
        for name in names:
            try:
                await client.create_stream(name)
            except StreamExists:
                pass


async def produce(pd: str, stream: str, events: list[bytes]) -> None:
    async with await estream.connect(pd) as client:
        async with await client.open_writer(stream) as writer:
            for lo in range(0, len(events), 500):
                await writer.append_batch(events[lo : lo + 500])
            await writer.flush()


async def read_results(pd: str, stream: str) -> list[dict[str, Any]]:
    async with await estream.connect(pd) as client:
        return [json.loads(r.value) async for r in client.read(stream)]


def spark_session() -> Any:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    import estream.spark

    spark = (
        SparkSession.builder.master("local[2]")
        .appName("estream-orders-per-minute")
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "2")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("ERROR")
    estream.spark.register(spark)
    return spark


def run_query(spark: Any, args: argparse.Namespace, checkpoint: str) -> None:
    """One availableNow run of the pipeline, resumed from ``checkpoint``."""
    from pyspark.sql import functions as F

    order = "order_id long, customer string, amount double, event_time long"
    orders = (
        spark.readStream.format("estream")
        .option("pd", args.pd)
        .option("streams", args.source)
        .option("startingOffsets", "earliest")
        .option("maxRecordsPerTrigger", 1000)
        .load()
        .select(F.from_json(F.col("value").cast("string"), order).alias("o"))
        .select("o.*")
        .withColumn("event_time", F.timestamp_millis("event_time"))
    )
    per_minute = (
        orders.withWatermark("event_time", "2 minutes")
        .groupBy(F.window("event_time", "1 minute"))
        .agg(F.count("*").alias("orders"), F.round(F.sum("amount"), 2).alias("revenue"))
        .select(
            F.to_json(
                F.struct(
                    F.date_format("window.start", "yyyy-MM-dd'T'HH:mm").alias("minute"),
                    "orders",
                    "revenue",
                )
            ).alias("value")
        )
    )
    query = (
        per_minute.writeStream.format("estream")
        .outputMode("append")
        .option("pd", args.pd)
        .option("stream", args.sink)
        .option("checkpointLocation", checkpoint)
        .trigger(availableNow=True)
        .start()
    )
    query.awaitTermination()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    rng = random.Random(args.seed)
    checkpoint = args.checkpoint or tempfile.mkdtemp(prefix="estream-pipeline-")
    asyncio.run(ensure_streams(args.pd, [args.source, args.sink]))
    spark = spark_session()
    try:
        base = (int(time.time() * 1000) // MINUTE_MS) * MINUTE_MS
        for round_no in range(2):
            start = base + round_no * 5 * MINUTE_MS
            events = order_events(args.orders, start, rng, round_no * args.orders)
            asyncio.run(produce(args.pd, args.source, events))
            print(f"round {round_no + 1}: produced {len(events)} orders", flush=True)
            run_query(spark, args, checkpoint)
    finally:
        spark.stop()
    results = asyncio.run(read_results(args.pd, args.sink))
    print(f"{args.sink}: {len(results)} closed one-minute windows")
    for row in sorted(results, key=lambda r: r["minute"]):
        print(f"  {row['minute']}  orders={row['orders']:5d}  revenue={row['revenue']:10.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
