"""Benchmark one real range server: append throughput and latency against the disk's ceiling.

    .venv/bin/python -m benchmarks.bench_rangeserver [--seconds 8] [--records-per-batch 64]
    .venv/bin/python -m benchmarks.bench_rangeserver --rate 5100   # the open loop only
    .venv/bin/python -m benchmarks.bench_rangeserver --no-pin      # client and server share CPUs

1. Ceiling: a raw loop of ``os.write`` + ``os.fdatasync`` of the batch bytes on the same
   filesystem (measured first, while no server runs).
2. Peak: one client, 1 KiB records in batches, many batches in flight: records/s, MB/s,
   append latency p50/p99/p99.9 (send to acknowledgement, i.e. fsynced), and the ratio
   of the server's bytes/s to the ceiling.
3. Half load: appends sent at half the peak rate (open loop): latency p50/p99/p99.9. The
   server runs with ``--wal-spares`` (log segments zero-filled while idle: appends
   overwrite them in place); the benchmark waits until they are ready before each phase.
   Beside it, the disk alone at the same rate (a thread doing ``pwritev(RWF_DSYNC)`` of
   whatever is queued, no server, no network), overwriting a zero-filled file and
   growing one: the physical references for that tail. Last, the same half load on two
   fresh servers: one whose log writes through its writer thread (``--wal-io thread``;
   the measured server uses ``--wal-io auto``, direct writes here), and one without
   spares (``--wal-spares 0``, the default: segments not zero-filled ahead), and one
   whose CPUs the client shares (without ``--pin``).

With ``--pin`` (the default, on two CPUs or more) the server runs on the last CPU
(``estream rangeserver --cpus``) and the client on the others, as a range server would
run on a host of its own; the raw references run on the client's CPUs. The client pauses
its own cyclic GC while it measures (``client_gc_paused``).

Targets (issue 2): >= 60% of the raw ceiling's bytes/s; p99 < 2 ms at half the peak.
Prints the figures and writes them to ``benchmarks/RESULTS.md`` (its "Range server"
section). Bounded to about two and a half minutes; needs ``--wal-spares`` x 256 MiB + 4 GiB free.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import mmap
import os
import queue
import re
import shutil
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import uvloop

from benchmarks import timerfd
from estream.devcluster.process import ManagedProcess
from estream.devcluster.rangeserver import start_rangeserver
from estream.net.rpc import RpcClient
from estream.wire import limits
from estream.wire.protocol import Opcode
from estream.wire.record import EncodedRecords, Record, encode_records, wrap_records
from rangeserver.shell import linuxaio
from rangeserver.shell.cli import cpu_list_text

ROOT = Path(__file__).resolve().parent.parent

RESULTS = ROOT / "benchmarks" / "RESULTS.md"
SECTION = "## Range server (benchmarks/bench_rangeserver.py)"
RECORD_BYTES = 1024
STREAM = 1


@dataclass(frozen=True)
class Cpus:
    """Where the client runs, and the server (``None``: on any CPU, the client's too)."""

    server: frozenset[int] | None
    client: frozenset[int]

    @classmethod
    def split(cls, pin: bool) -> Cpus:
        """The last CPU for the server, the others for the client (when ``pin`` and this
        process may run on two or more); else both anywhere."""
        available = sorted(os.sched_getaffinity(0))
        if not pin or len(available) < 2:
            return cls(None, frozenset(available))
        return cls(frozenset(available[-1:]), frozenset(available[:-1]))

    def shared(self) -> Cpus:
        """Both anywhere."""
        return Cpus(None, self.client | (self.server or frozenset()))

    def server_args(self) -> list[str]:
        return ["--cpus", cpu_list_text(self.server)] if self.server else []

    def describe(self) -> str:
        if not self.server:
            return f"{len(self.client)} CPUs shared by client and server"
        return (f"server on CPU {cpu_list_text(self.server)} (--cpus), client "
                f"on CPU {cpu_list_text(self.client)}")


@contextlib.contextmanager
def client_on(cpus: Cpus) -> Iterator[None]:
    """This process (the client, and the raw references' threads) on ``cpus.client``."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus.client)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


@contextlib.contextmanager
def client_gc_paused() -> Iterator[None]:
    """The client's cyclic GC off while it measures (as ``timeit`` does): a full
    collection walking the client's own tasks and samples stalled its event loop for
    20-30 ms, which it then counted as append latency."""
    gc.collect()
    gc.freeze()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
        gc.unfreeze()


def percentile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def section_records(n: int) -> EncodedRecords:
    value = os.urandom(RECORD_BYTES)
    return encode_records([Record(value, {}, 1_700_000_000_000) for _ in range(n)])


class Appender:
    def __init__(self, client: RpcClient, records: EncodedRecords) -> None:
        self.client = client
        self.records = records
        self.next_offset = 0
        self.latencies_ms: list[float] = []

    def next_batch(self) -> bytes:
        base = self.next_offset
        self.next_offset += self.records.count
        return wrap_records(
            self.records,
            stream_id=STREAM,
            range_index=0,
            epoch=1,
            base_offset=base,
            confirm_offset=base,
        )

    async def append(self, batch: bytes) -> None:
        started = time.perf_counter()
        await self.client.call(Opcode.APPEND, {}, batch)
        self.latencies_ms.append((time.perf_counter() - started) * 1000)


async def peak(appender: Appender, seconds: float, inflight: int) -> tuple[float, int]:
    """Closed loop with ``inflight`` appends outstanding; returns (elapsed s, batches)."""
    deadline = time.perf_counter() + seconds
    done = 0

    async def worker() -> None:
        nonlocal done
        while time.perf_counter() < deadline:
            await appender.append(appender.next_batch())
            done += 1

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(inflight)))
    return time.perf_counter() - started, done


async def paced(appender: Appender, seconds: float, batches_per_s: float) -> tuple[float, int]:
    """Open loop: one append every 1/rate seconds regardless of answers, evenly spaced
    (a timerfd: the event loop's own timers have a resolution of 1 ms)."""
    loop = asyncio.get_running_loop()
    count = int(seconds * batches_per_s)
    sent = 0
    running: set[asyncio.Task[None]] = set()  # only those not answered yet
    finished = loop.create_future()
    fd = timerfd.periodic(1.0 / batches_per_s)

    def tick() -> None:
        nonlocal sent
        for _ in range(min(timerfd.expirations(fd), count - sent)):
            task = asyncio.ensure_future(appender.append(appender.next_batch()))
            running.add(task)
            task.add_done_callback(running.discard)
            sent += 1
        if sent >= count and not finished.done():
            finished.set_result(None)

    started = time.perf_counter()
    loop.add_reader(fd, tick)
    try:
        await finished
    finally:
        loop.remove_reader(fd)
        os.close(fd)
    await asyncio.gather(*running)
    return time.perf_counter() - started, count


def raw_ceiling(
    directory: Path, batch: bytes, seconds: float, latencies_ms: list[float]
) -> tuple[float, int]:
    """os.write + os.fdatasync of ``batch`` in a loop; returns (elapsed s, batches)."""
    path = directory / "raw.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    count = 0
    started = time.perf_counter()
    try:
        while time.perf_counter() - started < seconds:
            t0 = time.perf_counter()
            os.write(fd, batch)
            os.fdatasync(fd)
            latencies_ms.append((time.perf_counter() - t0) * 1000)
            count += 1
    finally:
        os.close(fd)
        path.unlink()
    return time.perf_counter() - started, count


def raw_group_commit(
    directory: Path,
    batch: bytes,
    batches_per_s: float,
    seconds: float,
    *,
    in_place: bool,
    direct: bool = False,
) -> list[float]:
    """The disk alone at a given rate: ``batch`` queued open loop at ``batches_per_s``; a
    writer thread writes whatever is queued with one ``pwritev(RWF_DSYNC)`` (group commit,
    no server, no network), overwriting a file zero-filled beforehand (``in_place``, as
    the range server's spare segments) or growing one; with ``direct``, through
    ``O_DIRECT`` from an aligned buffer, each batch padded to whole blocks (as the range
    server's direct writes); latency per batch in ms."""
    path = directory / "raw-group.bin"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    block = linuxaio.BLOCK_BYTES
    slot = -(-len(batch) // block) * block if direct else len(batch)
    data: bytes | mmap.mmap = batch
    if direct:
        data = linuxaio.aligned_buffer(slot)
        data[: len(batch)] = batch
    if in_place:
        zeros = bytes(limits.MiB)
        for at in range(0, int(seconds * batches_per_s + 1) * slot, len(zeros)):
            os.pwrite(fd, zeros, at)
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # as the range server's spares
    if direct:
        os.close(fd)
        fd = os.open(path, os.O_WRONLY | os.O_DIRECT)
    waiting: queue.SimpleQueue[float | None] = queue.SimpleQueue()
    latencies_ms: list[float] = []

    def writer() -> None:
        done = False
        position = 0
        while not done:
            queued = [waiting.get()]
            while not waiting.empty():
                queued.append(waiting.get())
            if queued[-1] is None:
                queued.pop()
                done = True
            if queued:
                position += os.pwritev(fd, [data] * len(queued), position, os.RWF_DSYNC)
                now = time.perf_counter()
                latencies_ms.extend((now - t) * 1000 for t in queued if t is not None)

    thread = threading.Thread(target=writer, name="raw-group-commit")
    thread.start()
    try:
        started = time.perf_counter()
        for i in range(int(seconds * batches_per_s)):
            delay = started + i / batches_per_s - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            waiting.put(time.perf_counter())
    finally:
        waiting.put(None)
        thread.join()
        os.close(fd)
        path.unlink()
    return latencies_ms


def latency_line(samples: list[float]) -> str:
    return (
        f"p50 {percentile(samples, 0.5):.3f} ms, p99 {percentile(samples, 0.99):.3f} ms, "
        f"p99.9 {percentile(samples, 0.999):.3f} ms (n={len(samples)})"
    )


async def wait_for_spares(client: RpcClient, wanted: int, timeout_s: float = 120.0) -> int:
    """Wait (bounded) until the server has ``wanted`` spare segments ready; returns how
    many it has (fewer when the disk has no room for them)."""
    deadline = time.monotonic() + timeout_s
    while True:
        ready = int((await client.call(Opcode.PING))[0]["wal_spares"])
        if ready >= wanted or time.monotonic() > deadline:
            return ready
        await asyncio.sleep(0.2)


async def start_server(
    directory: Path, spares: int, io: str, cpus: Cpus
) -> tuple[ManagedProcess, RpcClient]:
    process, address = start_rangeserver(
        directory, extra_args=["--wal-spares", str(spares), "--wal-io", io, *cpus.server_args()]
    )
    client = await RpcClient.connect(address)
    await client.call(
        Opcode.CREATE_RANGE, {"stream_id": STREAM, "range_index": 0, "start": 0, "epoch": 1}
    )
    return process, client


async def half_load(
    directory: Path,
    spares: int,
    io: str,
    records: EncodedRecords,
    rate: float,
    args: argparse.Namespace,
    cpus: Cpus,
) -> list[float]:
    """Append latencies of a fresh server (``--wal-spares spares --wal-io io``, its
    spares ready, on ``cpus``) under the open-loop load ``rate`` batches/s."""
    process, client = await start_server(directory, spares, io, cpus)
    try:
        await wait_for_spares(client, spares)
        appender = Appender(client, records)
        await peak(appender, 1.0, args.inflight)  # warm up
        await wait_for_spares(client, spares)
        appender.latencies_ms.clear()
        with client_gc_paused():
            await paced(appender, args.seconds, rate)
        await client.close()
        return list(appender.latencies_ms)
    finally:
        process.stop()


async def run(args: argparse.Namespace, cpus: Cpus) -> list[str]:
    work = Path(tempfile.mkdtemp(prefix="bench-rs-", dir=args.dir))
    records = section_records(args.records_per_batch)
    one_batch = wrap_records(records, stream_id=STREAM, range_index=0, epoch=1, base_offset=0)
    batch_bytes = len(one_batch)
    processes: list[ManagedProcess] = []
    try:
        raw_latency: list[float] = []
        raw_elapsed, raw_batches = raw_ceiling(work, one_batch, args.raw_seconds, raw_latency)
        raw_mb_s = raw_batches * batch_bytes / raw_elapsed / 1e6

        process, client = await start_server(work / "rs", args.spares, args.wal_io, cpus)
        processes.append(process)
        mode = (await client.call(Opcode.PING))[0]["wal_io"]
        spares_before_peak = await wait_for_spares(client, args.spares)
        appender = Appender(client, records)
        await peak(appender, 1.0, args.inflight)  # warm up
        appender.latencies_ms.clear()
        with client_gc_paused():
            elapsed, batches = await peak(appender, args.seconds, args.inflight)
        peak_batches_s = batches / elapsed
        peak_mb_s = peak_batches_s * batch_bytes / 1e6
        peak_latency = list(appender.latencies_ms)

        half_rate = peak_batches_s / 2
        spares_before_half = await wait_for_spares(client, args.spares)
        appender.latencies_ms.clear()
        with client_gc_paused():
            await paced(appender, args.seconds, half_rate)
        half_latency = list(appender.latencies_ms)
        await client.close()
        process.stop()

        disk_in_place = raw_group_commit(
            work, one_batch, half_rate, args.seconds, in_place=True, direct=mode == "direct"
        )
        disk_growing = raw_group_commit(
            work, one_batch, half_rate, args.seconds, in_place=False
        )

        on_thread = await half_load(
            work / "rs-thread", args.spares, "thread", records, half_rate, args, cpus
        )
        growing_latency = await half_load(
            work / "rs-no-spares", 0, args.wal_io, records, half_rate, args, cpus
        )
        shared_latency: list[float] = []
        if cpus.server:
            with client_on(cpus.shared()):
                shared_latency = await half_load(
                    work / "rs-shared", args.spares, args.wal_io, records, half_rate, args,
                    cpus.shared(),
                )
    finally:
        for process in processes:
            process.stop()
        shutil.rmtree(work, ignore_errors=True)

    ratio = peak_mb_s / raw_mb_s
    half_p99 = percentile(half_latency, 0.99)
    spare_mib = limits.segment_bytes_max // limits.MiB
    return [
        f"- setup: 1 range server process, 1 client, {args.records_per_batch} records of "
        f"{RECORD_BYTES} B per batch ({batch_bytes} B), {args.inflight} batches in flight, "
        f"{args.seconds:g} s per phase, {cpus.describe()}; "
        f"server with --wal-io {args.wal_io} ({mode}), "
        f"--wal-spares {args.spares} ({spare_mib} MiB each; ready: "
        f"{spares_before_peak} before the peak, {spares_before_half} before half load)",
        f"- peak: {peak_batches_s * args.records_per_batch:,.0f} records/s, "
        f"{peak_mb_s:,.1f} MB/s, {peak_batches_s:,.0f} batches/s; latency "
        + latency_line(peak_latency),
        f"- raw ceiling (os.write + os.fdatasync per {batch_bytes} B batch, same filesystem): "
        f"{raw_mb_s:,.1f} MB/s ({raw_batches / raw_elapsed:,.0f} fsyncs/s); one write+fdatasync: "
        + latency_line(raw_latency),
        f"- ratio to the ceiling: {ratio:.0%} (target >= 60%: "
        f"{'met' if ratio >= 0.6 else 'MISSED'})",
        f"- half of the peak ({half_rate * args.records_per_batch:,.0f} records/s, open loop): "
        + latency_line(half_latency)
        + f" (target p99 < 2 ms: {'met' if half_p99 < 2 else 'MISSED'})",
        "- the disk alone at the same rate (open loop, a thread doing pwritev(RWF_DSYNC) of "
        "whatever is queued: group commit without server or network), overwriting a "
        f"zero-filled file{' with O_DIRECT, as the server' if mode == 'direct' else ''}: "
        + latency_line(disk_in_place)
        + f", max {max(disk_in_place):.3f} ms; growing a file: "
        + latency_line(disk_growing) + f", max {max(disk_growing):.3f} ms",
        "- half of the peak with the log's writer thread (--wal-io thread, the same "
        "spares): " + latency_line(on_thread),
        f"- half of the peak on a server without spares (--wal-spares 0, the default, "
        f"--wal-io {args.wal_io}: segments not zero-filled ahead; direct writes create "
        f"them as holes, the writer thread grows them): "
        + latency_line(growing_latency),
    ] + ([
        f"- half of the peak, client and server sharing all {len(cpus.shared().client)} CPUs "
        f"(no --cpus, as without --pin; the same spares): " + latency_line(shared_latency)
    ] if shared_latency else [])


async def at_rate(args: argparse.Namespace, cpus: Cpus) -> str:
    """``--rate``: one fresh server (``--wal-io``, ``--spares``), the open loop only."""
    work = Path(tempfile.mkdtemp(prefix="bench-rs-", dir=args.dir))
    try:
        records = section_records(args.records_per_batch)
        samples = await half_load(
            work / "rs", args.spares, args.wal_io, records, args.rate, args, cpus
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return (
        f"- {args.rate:,.0f} batches/s, open loop, --wal-io {args.wal_io}, "
        f"{cpus.describe()}: " + latency_line(samples)
    )


def write_results(command: str, lines: list[str], notes: str) -> None:
    body = "\n".join([SECTION, "", f"Command: `{command}`", "", *lines, "", notes]).rstrip()
    text = RESULTS.read_text() if RESULTS.exists() else "# Benchmark results\n"
    pattern = re.compile(re.escape(SECTION) + r".*?(?=\n## |\Z)", re.S)
    if pattern.search(text):
        text = pattern.sub(lambda _: body + "\n", text)
    else:
        text = text.rstrip() + "\n\n" + body + "\n"
    RESULTS.write_text(text)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--raw-seconds", type=float, default=4.0)
    parser.add_argument("--records-per-batch", type=int, default=64)
    parser.add_argument("--inflight", type=int, default=32)
    parser.add_argument("--spares", type=int, default=12,
                        help="the server's --wal-spares: enough for one phase at half load")
    parser.add_argument("--wal-io", default="auto", choices=("auto", "direct", "thread"),
                        help="the measured server's --wal-io (a thread-writer server is "
                        "measured at half load beside it)")
    parser.add_argument("--rate", type=float, default=None, metavar="BATCHES_PER_S",
                        help="only the open loop at this rate on one fresh server (after a "
                        "1 s warm-up), printed, not written: a quick look at the tail")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="the server on the last CPU (--cpus), the client on the others "
                        "(default; --no-pin: both anywhere)")
    parser.add_argument("--dir", default=None, help="where the data goes (default: $TMPDIR)")
    parser.add_argument("--notes", default="", help="a paragraph added under the figures")
    parser.add_argument("--no-write", action="store_true", help="print only")
    args = parser.parse_args()
    cpus = Cpus.split(args.pin)
    with client_on(cpus):
        if args.rate is not None:
            print(uvloop.run(at_rate(args, cpus)))
            return 0
        lines = uvloop.run(run(args, cpus))
    print("\n".join(lines))
    if not args.no_write:
        shown = [a for a, before in zip(sys.argv[1:], [""] + sys.argv[1:], strict=False)
                 if not a.startswith("--notes") and before != "--notes"]
        command = ".venv/bin/python -m benchmarks.bench_rangeserver " + " ".join(shown)
        write_results(command.strip(), lines, args.notes)
    return 0


if __name__ == "__main__":
    sys.exit(main())
