"""Why striping exists: one stream's throughput grows with its ensemble E when each
range server's disk is the bound (issue 30).

Starts 1 PD node and 6 range servers, each with ``--disk-bytes-per-s-max N`` (default
4 MiB/s: low enough that the disk budget, not the machine's CPU, bounds every row), and
writes one stream each of E = 3 (unstriped), 4 and 6 (replicas 3, ack 2, 1 KiB records,
``--window`` appends in flight), each for ``--seconds`` after a short warm-up, the rows
alternated ``--repeat`` times. Every batch goes to 3 of the E servers, so each server
writes 3/E of the stream: the ideal is E/3 times the unstriped rate, and the unstriped
rate is about N / 1 KiB records/s (less the log's entry headers and confirms). Prints
records/s and MiB/s per E (median of the runs, each run), the ratio to E = 3 beside E/3,
and the unstriped rate as a fraction of N / record size. Bounded: about ``3 x repeat x
(seconds + 2)`` seconds plus the cluster's start. Usage::

    .venv/bin/python -m benchmarks.bench_stripe_scaling [--disk-bytes-per-s-max 4194304]
        [--seconds 6] [--repeat 3] [--window 1024] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import estream
from estream.devcluster.cluster import Cluster, start_cluster

RECORD = b"x" * 1024
ENSEMBLES = (3, 4, 6)
WARM_UP_S = 1.0
MiB = 1024 * 1024


async def one_run(client: estream.Client, name: str, ensemble: int, seconds: float,
                  window: int) -> dict[str, float]:
    """Records/s of one stream of ``ensemble`` with ``window`` appends in flight, counted
    over ``seconds`` after the warm-up (appends still in flight at the end are awaited, not
    counted)."""
    await client.create_stream(name, replicas=3, ack_count=2, ensemble=ensemble)
    writer = await client.open_writer(name)
    started = time.perf_counter()
    measure_from, measure_to = started + WARM_UP_S, started + WARM_UP_S + seconds
    counted = 0

    async def worker() -> None:
        nonlocal counted
        while time.perf_counter() < measure_to:
            await writer.append(RECORD)
            if measure_from <= time.perf_counter() < measure_to:
                counted += 1

    await asyncio.wait_for(asyncio.gather(*(worker() for _ in range(window))), seconds + 60)
    await writer.close()
    rate = counted / seconds
    return {"records_per_s": round(rate), "mib_per_s": round(rate * len(RECORD) / MiB, 2)}


async def run(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    runs: dict[int, list[dict[str, float]]] = {e: [] for e in ENSEMBLES}
    async with await estream.connect(cluster.pd_addresses) as client:
        for i in range(args.repeat):
            for ensemble in ENSEMBLES:
                result = await one_run(client, f"bench-scaling-e{ensemble}-{i}", ensemble,
                                       args.seconds, args.window)
                runs[ensemble].append(result)
                print(f"run {i} E {ensemble}: {result}", flush=True)
    medians = {e: sorted(r["records_per_s"] for r in rs)[len(rs) // 2] for e, rs in runs.items()}
    ideal_unstriped = args.disk_bytes_per_s_max / len(RECORD)
    return {
        "rows": [{
            "ensemble": e,
            "records_per_s_median": medians[e],
            "mib_per_s_median": round(medians[e] * len(RECORD) / MiB, 2),
            "records_per_s_runs": [r["records_per_s"] for r in runs[e]],
            "ratio_to_e3": round(medians[e] / medians[3], 2),
            "ratio_to_e3_runs": [round(r["records_per_s"] / u["records_per_s"], 2)
                                 for r, u in zip(runs[e], runs[3], strict=True)],
            "ideal_ratio": round(e / 3, 2),
        } for e in ENSEMBLES],
        "unstriped_of_n_per_record": round(medians[3] / ideal_unstriped, 2),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--disk-bytes-per-s-max", type=int, default=4 * MiB,
                        help="each range server's --disk-bytes-per-s-max")
    parser.add_argument("--seconds", type=float, default=6.0, help="measured, per run")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--window", type=int, default=1024, help="appends in flight")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import uvloop

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-stripe-scaling-") as tmp:
        cluster = start_cluster(
            Path(tmp), pd_nodes=1, range_servers=6, secret=None,
            rangeserver_args=["--disk-bytes-per-s-max", str(args.disk_bytes_per_s_max)])
        try:
            results = uvloop.run(run(args, cluster))
        finally:
            cluster.stop()
    results["setup"] = {
        "pd_nodes": 1, "range_servers": 6, "replicas": 3, "ack_count": 2,
        "record_bytes": len(RECORD), "disk_bytes_per_s_max": args.disk_bytes_per_s_max,
        "seconds": args.seconds, "repeat": args.repeat, "window": args.window,
        "load_average_before": [round(x, 2) for x in load_before],
        "load_average_after": [round(x, 2) for x in os.getloadavg()],
    }
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
