"""``estream bench``: a quick append-then-read benchmark with progress bars and a summary.

Appends ``--records`` values of ``--size`` bytes with ``--window`` appends in flight, then
reads them back, and prints throughput and append latency percentiles. Every loop is
bounded by the record count. Side effects: creates (and unless ``--keep`` deletes) a
stream; output on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from estream.cli.output import console, emit_json, key_values, print_tables
from estream.server.config import positive_int


def percentile(sorted_values: list[float], fraction: float) -> float:
    """Nearest-rank percentile of an ascending list (0.0 for an empty one). Pure.

    >>> percentile([1.0, 2.0, 3.0, 4.0], 0.5), percentile([1.0, 2.0, 3.0, 4.0], 0.99)
    (2.0, 4.0)
    """
    if not sorted_values:
        return 0.0
    rank = max(int(-(-fraction * len(sorted_values) // 1)) - 1, 0)
    return sorted_values[min(rank, len(sorted_values) - 1)]


def _progress(enabled: bool) -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console(),
        disable=not enabled,
        transient=False,
    )


async def _timed_append(writer: Any, value: bytes, latencies: list[float]) -> None:
    started = time.perf_counter()
    await writer.append(value)
    latencies.append((time.perf_counter() - started) * 1000.0)


async def _append_phase(client: Any, ns: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    value = os.urandom(ns.size)
    latencies: list[float] = []
    task = progress.add_task("append", total=ns.records)
    started = time.perf_counter()
    async with await client.open_writer(ns.stream) as writer:
        done = 0
        while done < ns.records:
            chunk = min(ns.window, ns.records - done)
            await asyncio.gather(*(_timed_append(writer, value, latencies) for _ in range(chunk)))
            done += chunk
            progress.update(task, completed=done)
    elapsed_s = max(time.perf_counter() - started, 1e-9)
    latencies.sort()
    return {
        "append_records_per_s": round(ns.records / elapsed_s, 1),
        "append_mib_per_s": round(ns.records * ns.size / elapsed_s / 2**20, 2),
        "append_latency_ms_p50": round(percentile(latencies, 0.50), 2),
        "append_latency_ms_p99": round(percentile(latencies, 0.99), 2),
        "append_s": round(elapsed_s, 3),
    }


async def _read_phase(client: Any, ns: argparse.Namespace, progress: Progress) -> dict[str, Any]:
    task = progress.add_task("read  ", total=ns.records)
    started = time.perf_counter()
    count = 0
    async for _record in client.read(ns.stream, start=0, end=ns.records):
        count += 1
        if count % 256 == 0 or count == ns.records:
            progress.update(task, completed=count)
    elapsed_s = max(time.perf_counter() - started, 1e-9)
    return {
        "read_records": count,
        "read_records_per_s": round(count / elapsed_s, 1),
        "read_mib_per_s": round(count * ns.size / elapsed_s / 2**20, 2),
        "read_s": round(elapsed_s, 3),
    }


async def bench(client: Any, ns: argparse.Namespace) -> int:
    ns.stream = ns.stream or f"bench-{os.getpid()}-{int(time.time())}"
    await client.create_stream(ns.stream, replicas=ns.replicas, ack_count=ns.ack_count)
    summary: dict[str, Any] = {"stream": ns.stream, "records": ns.records, "size": ns.size}
    try:
        with _progress(not ns.json) as progress:
            summary.update(await _append_phase(client, ns, progress))
            summary.update(await _read_phase(client, ns, progress))
    finally:
        if not ns.keep:
            await client.delete_stream(ns.stream)
    if ns.json:
        emit_json(summary)
    else:
        print_tables(key_values("estream bench", summary))
    return 0 if summary["read_records"] == ns.records else 1


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    p = sub.add_parser("bench", parents=[common], help="quick append/read benchmark")
    p.add_argument("--records", type=positive_int, default=5000, help="default 5000")
    p.add_argument("--size", type=positive_int, default=1024, help="bytes per record")
    p.add_argument("--window", type=positive_int, default=128, help="appends in flight")
    p.add_argument("--replicas", type=positive_int, default=3)
    p.add_argument("--ack-count", type=positive_int, default=2)
    p.add_argument("--stream", default=None, help="stream name (default: a new bench-*)")
    p.add_argument("--keep", action="store_true", help="keep the stream afterwards")
    p.set_defaults(handler=bench)
