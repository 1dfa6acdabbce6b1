"""The comparison's scenarios, each run against one system's driver (``drivers.py``), and
the scales that bound them: append bursts (1), one in flight (2), catch-up and tail (3),
a server killed mid-run (4), scaling over writers (6) and appends spread over many logs (7,
issue 27: each system's spread beside its own one-log figure). Scenario 5 (placement-driver
commits) comes from ``bench_pd.py``.

Every loop is bounded in count and time (:class:`Scale`); every figure goes through
:meth:`Run.add`, which prints it as it is measured.

Side effects: whatever the driver does (sockets); ``kill_one`` kills a server.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from benchmarks import drivers, report
from benchmarks.peers.load import run_ops
from benchmarks.peers.stats import Measurement

KIB = 1024
SMALL = 100
RETRY_S = 10.0


@dataclass(frozen=True)
class Scale:
    """How much each scenario does; every loop also stops at its time bound."""

    inflight: int = 256
    burst_count: int = 200_000
    burst_s: float = 8.0
    one_count: int = 5_000
    one_s: float = 8.0
    read_count: int = 1_000_000
    fill_s: float = 90.0
    read_s: float = 45.0
    tail_count: int = 1_000
    tail_s: float = 8.0
    kill_run_s: float = 10.0
    kill_at_s: float = 4.0
    kill_rate: float = 1_000.0
    pd_ops: int = 1_000
    pd_failovers: int = 2
    writers: tuple[int, ...] = (1, 2, 4, 8)
    scale_s: float = 5.0
    fsync_count: int = 20_000
    fsync_s: float = 3.0
    small_records: bool = True  # scenario 1 with 100 B records too
    catch_up: bool = True  # scenario 3
    scaling: bool = True  # scenario 6
    spread_logs: int = 1_000  # scenario 7 (0: not run)
    leader_kill: bool = True  # scenario 4 also with NATS's stream leader killed


SCALES = {
    "full": Scale(),
    # about a minute: scenarios 1 (1 KiB), 2, 4 and 5, short
    "quick": Scale(burst_count=20_000, burst_s=3.0, one_count=1_000, one_s=2.0,
                   kill_run_s=5.0, kill_at_s=2.0, pd_ops=100, pd_failovers=0,
                   fsync_s=1.0, small_records=False, catch_up=False, scaling=False,
                   leader_kill=False, spread_logs=0),
    "smoke": Scale(inflight=32, burst_count=500, burst_s=2.0, one_count=100, one_s=1.0,
                   read_count=2_000, fill_s=5.0, read_s=5.0, tail_count=20, tail_s=1.0,
                   kill_run_s=4.0, kill_at_s=1.5, kill_rate=200.0, pd_ops=30,
                   pd_failovers=0, writers=(1, 2), scale_s=1.0,
                   fsync_count=200, fsync_s=0.5, spread_logs=20),
}


class Run:
    """Every measurement of this run, in order."""

    def __init__(self, scale_name: str, scale: Scale) -> None:
        self.scale_name, self.scale = scale_name, scale
        self.measurements: list[Measurement] = []

    def add(self, m: Measurement) -> Measurement:
        self.measurements.append(m)
        print(report.line(m), flush=True)
        return m

    def pending(self, scenario: str, system: str, reason: str) -> None:
        self.add(Measurement(scenario, system, pending=reason))


# --- scenarios, each against one driver -------------------------------------------------------


async def burst(run: Run, drv: Any, scenario: str, size: int, inflight: int) -> Measurement:
    log = await drv.new_log(f"burst{size}x{inflight}")
    op, workers = drv.append_op(log, size, inflight)
    m = Measurement(scenario, drv.name, extra={"inflight": inflight, "record_bytes": size})
    s = run.scale
    return run.add(await run_ops(m, op, count=s.burst_count // max(1, inflight // workers),
                                 inflight=workers, time_s=s.burst_s))


async def one_in_flight(run: Run, drv: Any, log_name: str = "one") -> Measurement:
    log = await drv.new_log(log_name)
    op, _ = drv.append_op(log, KIB, 1)
    m = Measurement("2 append one in flight 1KiB", drv.name)
    return run.add(await run_ops(m, op, count=run.scale.one_count, inflight=1,
                                 time_s=run.scale.one_s))


async def catch_up_and_tail(run: Run, drv: Any) -> None:
    s = run.scale
    log = await drv.new_log("catchup")
    t0 = time.perf_counter()
    filled = await drv.fill(log, s.read_count, KIB, s.fill_s)
    fill_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    read = await drv.catch_up(log, filled, s.read_s)
    m = Measurement("3 catch-up read 1KiB", drv.name, ops=read,
                    seconds=time.perf_counter() - t0,
                    extra={"written": filled, "fill_rate": filled / fill_s})
    if read < filled:
        m.note = f"read {read} of {filled} within {s.read_s}s"
    run.add(m)
    if hasattr(drv, "catch_up_batches"):
        t0 = time.perf_counter()
        read = await drv.catch_up_batches(log, filled, s.read_s)
        if read >= 0:
            run.add(Measurement("3 catch-up read 1KiB", f"{drv.name} (read_batches)", ops=read,
                                seconds=time.perf_counter() - t0, extra={"written": filled},
                                note="" if read >= filled else f"read {read} of {filled}"))
    lat = await drv.tail(f"tail{int(time.time())}", s.tail_count, KIB, s.tail_s)
    run.add(Measurement("3 tail latency 1KiB", drv.name, ops=len(lat), latencies_ms=lat,
                        seconds=math.nan))


async def scaling(run: Run, drv: Any) -> None:
    s = run.scale
    per_writer = max(1, s.inflight // max(s.writers))
    for n in s.writers:
        logs = [await drv.new_log(f"scale{n}w{k}") for k in range(n)]
        parts = [Measurement("6 scaling", drv.name) for _ in logs]
        ops = [drv.append_op(log, KIB, per_writer) for log in logs]
        t0 = time.perf_counter()
        await asyncio.gather(*(
            run_ops(p, op, count=s.burst_count // max(1, per_writer // w) // n, inflight=w,
                    time_s=s.scale_s) for p, (op, w) in zip(parts, ops, strict=True)))
        m = Measurement("6 scaling", drv.name, ops=sum(p.ops for p in parts),
                        seconds=time.perf_counter() - t0, failed=sum(p.failed for p in parts),
                        extra={"writers": n, "inflight": per_writer * n})
        m.latencies_ms = [x for p in parts for x in p.latencies_ms]
        run.add(m)


SPREAD = "7 append spread over many logs 1KiB"
ONE_LOG = "1 append many in flight 1KiB"
CREATES_IN_FLIGHT = 16


async def spread(run: Run, drv: Any) -> Measurement:
    """Scenario 7: ``inflight`` single-record appends at once, op ``i`` on log ``i mod n`` (so
    every append in flight is on its own log), beside the same system's one-log row of
    scenario 1 in this run (``÷ one log``; issue 27 asks estream for >= 0.5)."""
    s = run.scale
    gate = asyncio.Semaphore(CREATES_IN_FLIGHT)

    async def created(k: int) -> Any:
        async with gate:
            return await drv.new_log(f"spread{k}")

    logs = list(await asyncio.gather(*(created(k) for k in range(s.spread_logs))))
    op, workers = drv.spread_op(logs, KIB, s.inflight)
    m = Measurement(SPREAD, drv.name, extra={"inflight": s.inflight, "logs": len(logs)})
    await run_ops(m, op, count=s.burst_count // max(1, s.inflight // workers),
                  inflight=workers, time_s=s.burst_s)
    one = next((x for x in run.measurements
                if x.scenario == ONE_LOG and x.system == drv.name and x.ops), None)
    if one is not None:
        m.extra["one_log_rate"] = one.rate
        m.note = f"÷ one log {m.rate / one.rate:.2f} ({m.rate:,.0f} vs {one.rate:,.0f}/s)"
    return run.add(m)


async def kill_one(run: Run, drv: Any, log: Any, kill: Callable[[], None],
                   system: str, retry_s: float = 0.0) -> Measurement:
    """Paced appends; ``kill()`` one server at ``kill_at_s``; latency over time.

    ``retry_s`` > 0: the client retries a failed append for up to that long (what a NATS
    user writes to survive an election); a failure is counted only once that runs out.
    """
    s = run.scale
    op, _ = drv.append_op(log, KIB, 1)
    if retry_s:
        op = retrying(op, retry_s)
    m = Measurement("4 replica killed", system, extra={"rate_per_s": s.kill_rate},
                    note=f"client retries a failed append for up to {retry_s:g} s"
                    if retry_s else "")

    async def killer() -> None:
        await asyncio.sleep(s.kill_at_s)
        m.events["kill_s"] = s.kill_at_s
        await asyncio.to_thread(kill)

    task = asyncio.ensure_future(killer())
    await run_ops(m, op, count=int(s.kill_rate * s.kill_run_s) + 1, inflight=64,
                  time_s=s.kill_run_s, rate_per_s=s.kill_rate, timeline=True)
    await task
    kill_s = m.events["kill_s"]
    around = sorted(lat for t, lat in m.timeline if kill_s - 2.5 <= t < kill_s + 2.5)
    m.extra.update(report.window_figures(around))
    return run.add(m)


def retrying(op: Any, retry_s: float) -> Any:
    async def again(i: int) -> int:
        deadline = time.monotonic() + retry_s
        while True:
            try:
                return int(await op(i))
            except Exception:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.02)

    return again




async def common_scenarios(run: Run, drv: Any, *, full: bool = True,
                           batched: str = "") -> None:
    """Scenarios 1, 2, 3, 6 and 7; ``batched`` (a label) adds scenario 1 rows in batches."""
    s = run.scale
    variants = [drv, *([drivers.Batched(drv, batched)] if batched else [])]
    for variant in variants:
        await burst(run, variant, "1 append many in flight 1KiB", KIB, s.inflight)
    if s.small_records:
        for variant in variants:
            await burst(run, variant, "1 append many in flight 100B", SMALL, s.inflight)
    await one_in_flight(run, drv)
    if full and s.catch_up:
        await catch_up_and_tail(run, drv)
    if full and s.scaling:
        await scaling(run, drv)
    if full and s.spread_logs:
        await spread(run, drv)
