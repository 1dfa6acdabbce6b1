"""End-to-end append benchmark through the SDK against a local cluster of real processes.

Starts 3 PD nodes and 3 range servers (4 with ``--kill-replica``: a roll needs three live
servers for a 3-replica range), creates a stream (replicas 3, ack 2, fsync on), and
measures with 1 KiB records:

1. throughput with many appends in flight: records/s and MB/s;
2. latency with one append in flight: p50 / p99 / p99.9 (``--trace``: the slowest appends,
   each with the client's cyclic GC passes in it); ``--phases ceiling`` first gives the
   machine's own tail in the same run (a 1 KiB ``os.write`` + ``os.fdatasync`` loop on the
   cluster's filesystem, and the same to three files at once, done when two are durable:
   what one append waits for with no software in between; ``one_in_flight`` then says how
   far above that quorum each percentile is);
3. append-to-visible latency: from the call to ``append`` until a tailing reader
   (``follow=True``) yields the record (``visible``: an append every millisecond or so;
   ``tail``: the next append once the reader holds the last, as ``compare.py``'s
   "3 tail latency" row measures it, so no later batch carries the confirm offset);
4. ``--kill-replica``: appends with a window in flight while a range server holding a
   replica of the open range is killed (SIGKILL) mid-run: failed appends, worst latency
   overall and in the second around the kill;
5. ``--gray-replica hung|slow``: open-loop appends at ``--gray-rate``/s on exactly 3 range
   servers; mid-run one replica of the open range is stopped (SIGSTOP) or slowed (the
   test fault proxy, in a process of its own in front of that server only, delays each
   request to it by 50 ms; ``tests/harness/faultproxyproc.py``): worst and p99.9 latency (from
   each append's due time) within 2.5 s of the fault (and within 2.5 s after it), failed
   appends, lost or duplicated offsets (issue 32);
6. ``--exactly-once``: throughput 1 again beside the same with an idempotent producer
   (``producer_id`` set, every append with its ``sequence``) and with the ``crc32c`` and
   ``hmac-sha256`` entry digests, alternated ``--repeat`` times (the median of each, and
   its ratio to plain xxh3 appends without a producer);
7. ``--phases workers``: the comparison's per-record row (``compare.py`` scenario 1:
   ``--inflight`` workers, each awaiting one ``writer.append`` after another);
8. ``--phases typical``: a typical application loop: one task per append
   (``asyncio.create_task``), each append awaited with ``asyncio.wait_for``, each value
   built per record (a small JSON-ish prefix padded to 1 KiB), ``--inflight`` at once;
9. ``--striped``: on 6 range servers, throughput 1 of a striped stream (ensemble 6,
   replicas 3, ack 2) beside an unstriped one, alternated ``--repeat`` times (issue 30),
   and the bytes each of the striped stream's servers holds (each should hold 3/6).

Every throughput phase also reports the client's CPU time per record (steadier than
records/s on a shared machine). Every phase is bounded in count and time. Usage::

    .venv/bin/python -m benchmarks.bench_append [--records 50000] [--latency-samples 2000]
        [--phases ceiling,throughput,one,visible,workers,typical] [--inflight 256] [--trace]
        [--kill-replica] [--gray-replica hung|slow [--gray-delay-ms 50]]
        [--exactly-once [--repeat 3]] [--striped] [--batch-bytes N] [--json out.json]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import estream
from benchmarks.peers.load import measured_from
from benchmarks.tailprobe import (
    GcPasses,
    LoopStalls,
    fdatasync_ceiling,
    percentile,
    tail_figures,
)
from estream.devcluster.cluster import Cluster, start_cluster

RECORD = b"x" * 1024
PHASE_TIMEOUT_S = 120.0
WRITER_OPTIONS: dict[str, Any] = {}  # open_writer's options for every phase (--batch-bytes)


async def throughput(
    client: estream.Client,
    records: int,
    window: int,
    *,
    name: str = "bench-throughput",
    producer_id: str | None = None,
    digest: str | None = None,
    create: bool = True,
) -> dict[str, Any]:
    if create and digest is None:
        await client.create_stream(name, replicas=3, ack_count=2)
    elif create:
        await client.create_stream(name, replicas=3, ack_count=2, digest=digest)
    writer = await client.open_writer(name, producer_id=producer_id, **WRITER_OPTIONS)
    started = time.perf_counter()
    cpu_started = time.process_time()
    for wave in range(0, records, window):
        count = min(window, records - wave)
        if producer_id is None:
            await asyncio.gather(*(writer.append(RECORD) for _ in range(count)))
        else:
            await asyncio.gather(
                *(writer.append(RECORD, sequence=wave + i) for i in range(count)))
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    await writer.close()
    return {
        "records": records,
        "in_flight": window,
        "seconds": round(elapsed, 3),
        "records_per_s": round(records / elapsed),
        "mb_per_s": round(records * len(RECORD) / elapsed / 1e6, 1),
        "client_cpu_us_per_record": round(cpu_s / records * 1e6, 1),
    }


async def workers(
    client: estream.Client, records: int, inflight: int, time_s: float = 30.0,
    *, name: str = "bench-workers",
) -> dict[str, Any]:
    """``compare.py``'s per-record row (``benchmarks/peers/load.run_ops``, whose values
    are ``payload(size, i)``): ``inflight`` workers, one append after another."""
    await client.create_stream(name, replicas=3, ack_count=2)
    writer = await client.open_writer(name, **WRITER_OPTIONS)
    issued = failed = 0
    latencies: list[float] = []
    started = time.perf_counter()
    cpu_started = time.process_time()
    deadline = started + time_s

    async def worker() -> None:
        nonlocal issued, failed
        while issued < records and time.perf_counter() < deadline:
            i = issued
            issued += 1
            value = (i.to_bytes(8, "little") * (len(RECORD) // 8 + 1))[: len(RECORD)]
            t0 = time.perf_counter()
            try:
                await writer.append(value)
            except estream.EstreamError:
                failed += 1
            else:
                latencies.append((time.perf_counter() - t0) * 1000)

    await asyncio.gather(*(worker() for _ in range(inflight)))
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    await writer.close()
    return _loop_figures(len(latencies), failed, elapsed, cpu_s, inflight, latencies)


async def typical(
    client: estream.Client, records: int, inflight: int, time_s: float = 30.0,
    *, name: str = "bench-typical", latencies: list[float] | None = None,
) -> dict[str, Any]:
    """A typical application loop: one task per append, each awaited with
    ``asyncio.wait_for``, each value built per record, at most ``inflight`` at once
    (``compare.py``'s typical-loop row too). Each completed append's latency (ms) goes to
    ``latencies`` when given."""
    await client.create_stream(name, replicas=3, ack_count=2)
    writer = await client.open_writer(name, **WRITER_OPTIONS)
    slots = asyncio.Semaphore(inflight)
    tasks: set[asyncio.Task[None]] = set()
    failed = 0
    latencies = [] if latencies is None else latencies
    pad = "x" * len(RECORD)

    async def one(i: int) -> None:
        nonlocal failed
        t0 = time.perf_counter()
        try:
            value = f'{{"id": {i}, "at": {time.time():.6f}, "pad": "{pad}'.encode()
            await asyncio.wait_for(writer.append(value[: len(RECORD) - 2] + b'"}'), 10.0)
        except (estream.EstreamError, TimeoutError):
            failed += 1
        else:
            latencies.append((time.perf_counter() - t0) * 1000)
        finally:
            slots.release()

    started = time.perf_counter()
    cpu_started = time.process_time()
    deadline = started + time_s
    for i in range(records):
        await slots.acquire()
        if time.perf_counter() > deadline:
            slots.release()
            break
        task = asyncio.create_task(one(i))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
    if tasks:
        await asyncio.wait(list(tasks), timeout=30.0)
    elapsed = time.perf_counter() - started
    cpu_s = time.process_time() - cpu_started
    await writer.close()
    return _loop_figures(len(latencies), failed, elapsed, cpu_s, inflight, latencies)


def _loop_figures(
    ops: int, failed: int, seconds: float, cpu_s: float, inflight: int,
    latencies: list[float],
) -> dict[str, Any]:
    """The figures of the workers and typical loops (``latencies``: of each completed
    append, in ms)."""
    return {
        "records": ops,
        "failed": failed,
        "in_flight": inflight,
        "seconds": round(seconds, 3),
        "records_per_s": round(ops / seconds) if seconds > 0 else 0,
        "client_cpu_us_per_record": round(cpu_s / max(ops, 1) * 1e6, 1),
        "p50_ms": round(percentile(latencies, 50), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
    }


async def one_in_flight(client: estream.Client, samples: int, trace: bool = False
                        ) -> dict[str, Any]:
    await client.create_stream("bench-latency", replicas=3, ack_count=2)
    writer = await client.open_writer("bench-latency", **WRITER_OPTIONS)
    for _ in range(min(200, samples)):  # warm up connections and caches
        await writer.append(RECORD)
    latencies: list[float] = []
    starts: list[float] = []
    deadline = time.monotonic() + PHASE_TIMEOUT_S
    with GcPasses() as passes:
        for _ in range(samples):
            started = time.perf_counter()
            await writer.append(RECORD)
            latencies.append((time.perf_counter() - started) * 1000)
            starts.append(started)
            if time.monotonic() > deadline:
                break
    await writer.close()
    figures = tail_figures(latencies)
    figures["client_gc_passes"] = [sum(1 for p in passes.passes if p[2] == g) for g in range(3)]
    if trace:  # the slowest 0.5%: when (s into the phase), how long, the client's GC in it
        figures["phase_start_perf_counter"] = round(starts[0], 6)  # CLOCK_MONOTONIC, s
        slowest = sorted(range(len(latencies)), key=lambda i: -latencies[i])
        figures["slowest"] = [
            (round(starts[i] - starts[0], 3), round(latencies[i], 3),
             *passes.within(starts[i], starts[i] + latencies[i] / 1000))
            for i in slowest[:max(5, len(latencies) // 200)]]
    return figures


def above_ceiling(one: dict[str, Any], quorum: dict[str, Any]) -> dict[str, float]:
    """What one append at a time spends above the disk's own quorum write (the ceiling
    phase's two of three files durable), percentile by percentile: the software's share."""
    return {key: round(one[key] - quorum[key], 3) for key in ("p50_ms", "p99_ms", "p99_9_ms")}


async def append_to_visible(client: estream.Client, samples: int) -> dict[str, Any]:
    await client.create_stream("bench-visible", replicas=3, ack_count=2)
    writer = await client.open_writer("bench-visible", **WRITER_OPTIONS)
    sent: dict[int, float] = {}
    seen: list[float] = []

    async def follow() -> None:
        async for record in client.read("bench-visible", follow=True):
            seen.append((time.perf_counter() - sent[record.offset]) * 1000)
            if len(seen) == samples:
                return

    follower = asyncio.ensure_future(follow())
    await asyncio.sleep(0.1)
    for i in range(samples):
        sent[i] = time.perf_counter()
        await writer.append(RECORD)
        await asyncio.sleep(0.001)
    await asyncio.wait_for(follower, 30)
    await writer.close()
    return {
        "samples": len(seen),
        "p50_ms": round(percentile(seen, 50), 3),
        "p99_ms": round(percentile(seen, 99), 3),
        "max_ms": round(max(seen), 3),
    }


async def tail(client: estream.Client, samples: int) -> dict[str, Any]:
    """``compare.py``'s tail scenario (``benchmarks/peers/estream.py``): one append at a
    time, the next once a ``follow=True`` reader yielded the last; also how long after its
    append returned the reader had it (``after_ack``: what a replica's learning the
    confirm offset adds, steadier than the whole on a busy machine)."""
    await client.create_stream("bench-tail", replicas=3, ack_count=2)
    writer = await client.open_writer("bench-tail", **WRITER_OPTIONS)
    seen_at: dict[int, float] = {}
    arrived = asyncio.Event()

    async def follow() -> None:
        async for record in client.read("bench-tail", follow=True):
            seen_at[record.offset] = time.perf_counter()
            arrived.set()

    reader = asyncio.ensure_future(follow())
    whole: list[float] = []
    after_ack: list[float] = []
    deadline = time.monotonic() + PHASE_TIMEOUT_S / 4
    try:
        for _ in range(samples):
            if time.monotonic() > deadline or reader.done():
                break
            arrived.clear()
            started = time.perf_counter()
            offset = await writer.append(RECORD)
            acked = time.perf_counter()
            while offset not in seen_at:
                await asyncio.wait_for(arrived.wait(), 2.0)
                arrived.clear()
            whole.append((seen_at[offset] - started) * 1000)
            after_ack.append((seen_at[offset] - acked) * 1000)
    finally:
        reader.cancel()
        await asyncio.gather(reader, return_exceptions=True)
    await writer.close()
    return {
        "samples": len(whole),
        "p50_ms": round(percentile(whole, 50), 3),
        "p99_ms": round(percentile(whole, 99), 3),
        "max_ms": round(max(whole), 3),
        "after_ack_p50_ms": round(percentile(after_ack, 50), 3),
        "after_ack_p99_ms": round(percentile(after_ack, 99), 3),
    }


async def kill_replica(
    client: estream.Client, cluster: Cluster, records: int, window: int
) -> dict[str, Any]:
    await client.create_stream("bench-kill", replicas=3, ack_count=2)
    writer = await client.open_writer("bench-kill", **WRITER_OPTIONS)
    victim = writer.stream.ranges[-1].replicas[0].address
    latencies: list[tuple[float, float]] = []  # (start, latency ms)
    failures = 0
    killed_at = [0.0]

    async def one() -> None:
        nonlocal failures
        started = time.perf_counter()
        try:
            await writer.append(RECORD)
        except estream.EstreamError:
            failures += 1
            return
        latencies.append((started, (time.perf_counter() - started) * 1000))

    async def killer() -> None:
        while writer.statistics().completed < records // 2:
            await asyncio.sleep(0.001)
        killed_at[0] = time.perf_counter()
        await asyncio.to_thread(cluster.kill9, victim)

    kill_task = asyncio.ensure_future(killer())
    started = time.perf_counter()
    for wave in range(0, records, window):
        await asyncio.gather(*(one() for _ in range(min(window, records - wave))))
    elapsed = time.perf_counter() - started
    await asyncio.wait_for(kill_task, 10)
    rolls = writer.statistics().rolls
    await writer.close()
    around = [lat for t, lat in latencies if abs(t - killed_at[0]) < 1.0]
    return {
        "records": records,
        "in_flight": window,
        "failed_appends": failures,
        "rolls": rolls,
        "records_per_s": round(records / elapsed),
        "worst_ms": round(max(lat for _, lat in latencies), 1),
        "worst_within_1s_of_kill_ms": round(max(around), 1) if around else None,
        "p99_ms": round(percentile([lat for _, lat in latencies], 99), 2),
    }


async def gray_replica(
    client: estream.Client, cluster: Cluster, mode: str, rate: int, seconds: float,
    trace: bool = False, delay_ms: int = 50,
) -> dict[str, Any]:
    """Scenario 5 (module docstring): ``mode`` is ``hung`` or ``slow`` (each request to the
    victim delayed ``delay_ms``; 0: none, a control for what the proxy in front of it costs)."""
    name = f"bench-{mode}"
    await client.create_stream(name, replicas=3, ack_count=2)
    writer = await client.open_writer(name, **WRITER_OPTIONS)
    replicas = [r.address for r in writer.stream.ranges[-1].replicas]
    # hung: the open range's first replica; slow: the one server behind a fault proxy (each
    # of the 3 servers holds a replica of a 3-replica range)
    victim = replicas[0] if mode == "hung" else _proxied(cluster)
    assert victim in replicas, (victim, replicas)
    count = int(rate * seconds)
    latencies: list[tuple[float, float]] = []  # (due, latency ms)
    offsets: list[int] = []
    failures = 0

    async def one(due: float) -> None:
        nonlocal failures
        began = measured_from(due)  # (never from a due time still ahead)
        try:
            offsets.append(await writer.append(RECORD))
        except estream.EstreamError:
            failures += 1
            return
        latencies.append((due, (time.perf_counter() - began) * 1000))

    # The appends still out: each leaves when it finishes, so the end of the open loop waits
    # for the few left, not for thousands of finished tasks at once (a gather's callbacks
    # in one turn: a loop stall of its own).
    out: set[asyncio.Future[None]] = set()
    # what a full GC pass would walk; counted before the open loop, not in its window (with
    # the interpreter's defaults, counting 50,000 objects stalled the loop 10-15 ms)
    tracked = len(gc.get_objects()) if trace else None
    begin = time.perf_counter()
    fault_at = begin + seconds / 2
    faulted = False
    slowing: asyncio.Future[None] | None = None
    passes = GcPasses().__enter__()
    stalls = LoopStalls() if trace else None
    try:
        for i in range(count):
            due = begin + i / rate
            if not faulted and due >= fault_at:
                faulted = True
                if mode == "hung":
                    cluster.pause(victim)
                elif delay_ms > 0:  # a round trip to the proxy's process: on a thread
                    slowing = asyncio.ensure_future(asyncio.to_thread(
                        cluster.proxy(victim).delay, None, "request", delay_ms))
            await asyncio.sleep(max(0.0, due - time.perf_counter()))
            task = asyncio.ensure_future(one(due))
            out.add(task)
            task.add_done_callback(out.discard)
        if slowing is not None:
            await slowing
        if out:
            await asyncio.wait_for(asyncio.gather(*out), PHASE_TIMEOUT_S)
    finally:
        passes.__exit__()
        if stalls is not None:
            stalls.stop()
        if mode == "hung":
            cluster.resume(victim)
        else:
            cluster.proxy(victim).clear_rules()
    statistics = writer.statistics()
    await writer.close()
    read_back = [r.offset async for r in client.read(name)]  # every offset once, in order
    around = sorted(lat for due, lat in latencies if abs(due - fault_at) < 2.5)
    after = sorted(lat for due, lat in latencies if 0 <= due - fault_at < 2.5)
    every = sorted(lat for _, lat in latencies)
    return {
        "mode": mode, "delay_ms": delay_ms if mode == "slow" else None, "rate_per_s": rate,
        "appends": count, "failed_appends": failures,
        "read_back_matches": read_back == sorted(offsets) == list(range(len(offsets))),
        "window_ops": len(around),
        "window_worst_ms": round(around[-1], 2) if around else None,
        "window_p999_ms": round(percentile(around, 99.9), 2) if around else None,
        "window_p99_ms": round(percentile(around, 99), 2) if around else None,
        # the window's second half only (due within 2.5 s after the fault): what the fault
        # costs, without the noise of the 2.5 s before it
        "after_fault_worst_ms": round(after[-1], 2) if after else None,
        "after_fault_p999_ms": round(percentile(after, 99.9), 2) if after else None,
        "p50_ms": round(percentile(every, 50), 3), "worst_ms": round(every[-1], 2),
        # the same machine's noise: the worst before the fault, and the slowest appends
        # after it with when they were due (seconds from the fault)
        "worst_before_fault_ms": round(max(lat for due, lat in latencies if due < fault_at), 2),
        # (and the client's GC in each: ms, oldest generation)
        "slowest_after_fault": [(round(due - fault_at, 3), round(lat, 1),
                                 *passes.within(due, due + lat / 1000)) for due, lat in
                                sorted(latencies, key=lambda x: -x[1]) if due >= fault_at][:5],
        "rolls": statistics.rolls, "degraded_ranges": statistics.degraded_ranges,
        # the longest stalls within 2.5 s of the fault: (s from it, ms late)
        **({} if stalls is None else {"loop_stalls_in_window": stalls.longest(fault_at, 2.5),
                                      "client_gc_tracked_at_start": tracked}),
    }


def _proxied(cluster: Cluster) -> str:
    """The address of the one range server behind a fault proxy (``--gray-replica slow``)."""
    (address,) = [s.address for s in cluster.servers if s.proxy is not None]
    return address


def first_server_proxied() -> Callable[[str, str], Any]:
    """A ``start_cluster(proxy=...)`` factory putting a fault proxy process in front of the
    first range server only: the slowed replica's bytes are relayed by a process of their
    own (not by threads under this client's GIL), and the other servers' by none, as in the
    hung run."""
    from tests.harness.faultproxyproc import start_fault_proxy_process

    made: list[str] = []

    def factory(target: str, host: str) -> Any:
        if made:
            return None
        made.append(target)
        return start_fault_proxy_process(target, host)

    return factory


PHASES = {  # --phases name: results key, in the order they run
    "ceiling": "fdatasync_ceiling",
    "throughput": "throughput",
    "workers": "workers",
    "typical": "typical",
    "one": "one_in_flight",
    "visible": "append_to_visible",
    "tail": "tail",
}

EXACTLY_ONCE_ROWS = {
    "plain": {},
    "producer_id": {"producer_id": "bench"},
    "crc32c": {"digest": "crc32c"},
    "hmac_sha256": {"digest": "hmac-sha256"},
}


async def exactly_once(
    client: estream.Client, records: int, window: int, repeat: int
) -> dict[str, Any]:
    """Each row's throughput, rows alternated ``repeat`` times (a shared machine drifts):
    the median records/s of each and its ratio to the plain row's, and the same for the
    client's CPU time per record (what the producer and the digests add on the writer's
    side, steadier than throughput on a busy machine)."""
    runs: dict[str, list[int]] = {row: [] for row in EXACTLY_ONCE_ROWS}
    cpu: dict[str, list[float]] = {row: [] for row in EXACTLY_ONCE_ROWS}
    for i in range(repeat):
        for row, options in EXACTLY_ONCE_ROWS.items():
            result = await throughput(
                client, records, window, name=f"bench-eo-{row.replace('_', '-')}-{i}",
                **options)
            runs[row].append(result["records_per_s"])
            cpu[row].append(result["client_cpu_us_per_record"])
    medians = {row: sorted(v)[len(v) // 2] for row, v in runs.items()}
    cpu_medians = {row: sorted(v)[len(v) // 2] for row, v in cpu.items()}
    return {
        row: {"records_per_s": medians[row], "runs": runs[row],
              "ratio_to_plain": round(medians[row] / medians["plain"], 3),
              "client_cpu_us_per_record": cpu_medians[row], "cpu_runs": cpu[row],
              "cpu_ratio_to_plain": round(cpu_medians[row] / cpu_medians["plain"], 3)}
        for row in EXACTLY_ONCE_ROWS
    }


async def held_bytes(client: estream.Client, name: str) -> dict[str, int]:
    """Batch bytes each server of ``name``'s ranges holds, read back with the range client:
    batch k (from 0 at each range's start) asked of every server of its write set by
    index; a server answering it holds it."""
    from estream.net.rangeclient import RangeClient
    from estream.wire.record import iter_batches
    from estream.wire.stripe import Stripe

    meta = await client.describe_stream(name)
    stripe = Stripe(meta.ensemble, meta.replicas, meta.ack_count)
    rc = RangeClient(client.pool)
    held: dict[str, int] = {}
    for rng in meta.ranges:
        end = rng.end if rng.end is not None else rng.start  # (closed: the last is empty)
        offset, k = rng.start, 0
        while offset < end:
            after = offset
            for p in stripe.write_set(k):
                ref = rng.replicas[p]
                answer = await rc.read(ref.address, server_id=ref.id, stream_id=meta.id,
                                       range_index=rng.index, offset=offset, batch=k,
                                       unconfirmed=True)
                if answer.batches and answer.batches[0] == k:
                    header, raw = next(iter(iter_batches(answer.payload)))
                    held[ref.id] = held.get(ref.id, 0) + len(raw)
                    after = header.end_offset
            if after == offset:
                raise RuntimeError(f"batch {k} of range {rng.index} held by none")
            offset, k = after, k + 1
    return held


async def striped(
    client: estream.Client, records: int, window: int, repeat: int
) -> dict[str, Any]:
    """Throughput 1 of an unstriped (E 3) and a striped (E 6) stream, alternated: the
    median of each, the ratio, and the striped stream's bytes per server."""
    runs: dict[str, list[int]] = {"unstriped": [], "striped": []}
    cpu: dict[str, list[float]] = {"unstriped": [], "striped": []}
    for i in range(repeat):
        for row, ensemble in (("unstriped", 3), ("striped", 6)):
            name = f"bench-stripe-{row}-{i}"
            await client.create_stream(name, replicas=3, ack_count=2, ensemble=ensemble)
            result = await throughput(client, records, window, name=name, create=False)
            runs[row].append(result["records_per_s"])
            cpu[row].append(result["client_cpu_us_per_record"])
    medians = {row: sorted(v)[len(v) // 2] for row, v in runs.items()}
    cpu_medians = {row: sorted(v)[len(v) // 2] for row, v in cpu.items()}
    held = await held_bytes(client, f"bench-stripe-striped-{repeat - 1}")
    whole = sum(held.values()) / 3  # each batch is held by replicas (3) servers
    return {
        "records_per_s": medians, "runs": runs, "client_cpu_us_per_record": cpu_medians,
        "cpu_runs": cpu,
        "ratio_striped_to_unstriped": round(medians["striped"] / medians["unstriped"], 3),
        "cpu_ratio_striped_to_unstriped": round(
            cpu_medians["striped"] / cpu_medians["unstriped"], 3),
        # of the stream's bytes, what each of the 6 servers holds (3/6 expected)
        "striped_share_per_server": sorted(round(b / whole, 3) for b in held.values()),
    }


async def run(args: argparse.Namespace, cluster: Cluster) -> dict[str, Any]:
    results: dict[str, Any] = {}
    async with await estream.connect(cluster.pd_addresses, secret="bench-secret") as client:
        if args.gc_freeze:
            gc.freeze()
        if args.tune_gc:
            estream.tune_gc()
        if args.exactly_once:
            results["exactly_once"] = await asyncio.wait_for(
                exactly_once(client, args.records, args.window, args.repeat),
                PHASE_TIMEOUT_S * 4 * args.repeat,
            )
            print("exactly once", results["exactly_once"], flush=True)
            return results
        if args.striped:
            results["striped"] = await asyncio.wait_for(
                striped(client, args.records, args.window, args.repeat),
                PHASE_TIMEOUT_S * 2 * args.repeat)
            print("striped", results["striped"], flush=True)
            return results
        phases = set(args.phases.split(",")) - {""}
        unknown = phases - set(PHASES)
        if unknown:
            raise SystemExit(f"unknown phases: {', '.join(sorted(unknown))}")
        for phase in PHASES:
            if phase not in phases:
                continue
            if phase == "throughput":
                coro = throughput(client, args.records, args.window)
            elif phase == "workers":
                coro = workers(client, args.records, args.inflight)
            elif phase == "typical":
                coro = typical(client, args.records, args.inflight)
            elif phase == "ceiling":
                coro = asyncio.to_thread(fdatasync_ceiling, args.work, len(RECORD),
                                         args.latency_samples, PHASE_TIMEOUT_S / 4)
            elif phase == "one":
                coro = one_in_flight(client, args.latency_samples, args.trace)
            elif phase == "visible":
                coro = append_to_visible(client, args.visible_samples)
            else:
                coro = tail(client, args.visible_samples)
            results[PHASES[phase]] = await asyncio.wait_for(coro, PHASE_TIMEOUT_S)
            if phase == "one" and "fdatasync_ceiling" in results:
                results["one_in_flight"]["above_quorum_ceiling_ms"] = above_ceiling(
                    results["one_in_flight"], results["fdatasync_ceiling"]["quorum"])
            print(PHASES[phase].replace("_", " "), results[PHASES[phase]], flush=True)
        if args.kill_replica:
            results["kill_replica"] = await asyncio.wait_for(
                kill_replica(client, cluster, args.kill_records, args.kill_window),
                PHASE_TIMEOUT_S,
            )
            print("kill replica", results["kill_replica"], flush=True)
        if args.gray_replica:
            results["gray_replica"] = await asyncio.wait_for(
                gray_replica(client, cluster, args.gray_replica, args.gray_rate,
                             args.gray_seconds, args.trace, args.gray_delay_ms),
                PHASE_TIMEOUT_S)
            print("gray replica", results["gray_replica"], flush=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--records", type=int, default=50_000)
    parser.add_argument("--window", type=int, default=2_000, help="appends in flight")
    parser.add_argument("--inflight", type=int, default=256,
                        help="appends in flight in the workers and typical phases")
    parser.add_argument("--phases", default="throughput,one,visible",
                        help=f"comma-separated, of: {', '.join(PHASES)}")
    parser.add_argument("--latency-samples", type=int, default=2_000)
    parser.add_argument("--visible-samples", type=int, default=500)
    parser.add_argument("--kill-replica", action="store_true")
    parser.add_argument("--kill-records", type=int, default=40_000)
    parser.add_argument("--kill-window", type=int, default=200)
    parser.add_argument("--gray-replica", choices=("hung", "slow"), default=None,
                        help="scenario 5 on exactly 3 range servers: a replica stopped/slowed")
    parser.add_argument("--gray-rate", type=int, default=1_000, help="appends per second")
    parser.add_argument("--gray-seconds", type=float, default=8.0)
    parser.add_argument("--gray-delay-ms", type=int, default=50,
                        help="slow: each request to the victim delayed this long (0: the proxy "
                        "in place, nothing delayed: a control)")
    parser.add_argument("--gc-freeze", action="store_true",
                        help="gc.freeze() once connected (no full GC pass over the start-up heap)")
    parser.add_argument("--tune-gc", action="store_true",
                        help="estream.tune_gc() once connected (the SDK's documented option)")
    parser.add_argument("--exactly-once", action="store_true",
                        help="only the producer and digest rows beside plain appends")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--striped", action="store_true",
                        help="only a striped stream (E 6 of 6 servers) beside an unstriped one")
    parser.add_argument("--batch-bytes", type=int, default=None,
                        help="the writers' batch_bytes (default: the SDK's)")
    parser.add_argument("--trace", action="store_true",
                        help="one in flight: the slowest appends, each with the client's GC in "
                        "it; gray replica: the client's longest event-loop stalls")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.batch_bytes is not None:
        WRITER_OPTIONS["batch_bytes"] = args.batch_bytes
    import uvloop

    with tempfile.TemporaryDirectory(prefix="bench-append-") as tmp:
        args.work = Path(tmp)
        servers = 6 if args.striped else 4 if args.kill_replica else 3
        # No cluster secret of the launcher's: the servers verify hmac-sha256 MACs only when
        # ESTREAM_SECRET is set (the "with the secret" rows of RESULTS.md), as before.
        proxy = first_server_proxied() if args.gray_replica == "slow" else None
        cluster = start_cluster(Path(tmp), pd_nodes=3, range_servers=servers, secret=None,
                                proxy=proxy)
        try:
            results = uvloop.run(run(args, cluster))
        finally:
            cluster.stop()
    results["setup"] = {
        "pd_nodes": 3,
        "range_servers": servers,
        "replicas": 3,
        "ack_count": 2,
        "record_bytes": len(RECORD),
        "fsync": True,
    }
    print(json.dumps(results, indent=2))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
