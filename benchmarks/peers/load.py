"""Bounded load loops shared by every system: ``inflight`` workers run ``op(i)`` until
``count`` ops are done or ``time_s`` has passed, recording each op's latency.

``op(i)`` does op number ``i`` and returns how many records it carried (a Redis pipeline
carries many); it raises on failure, which is counted and does not stop the run. With
``rate_per_s`` the ops are paced open-loop: op ``i`` is due at ``i / rate_per_s`` and its
latency is measured from that due time, so a stall also counts against the ops queued
behind it (no coordinated omission); an op that starts before it is due (the loop's timers
have millisecond resolution: a sleep may end up to a millisecond early) is measured from its
start, never from a due time still ahead (that would read as a near-zero or negative
latency).

Side effect: time (the event loop's clock).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from benchmarks.peers.stats import Measurement

Op = Callable[[int], Awaitable[int]]
FAILURES_KEPT = 5


def measured_from(due: float) -> float:
    """Where a paced op's latency starts, called as it starts: its due time, or now if it
    starts before that (see the module: woken early)."""
    return min(due, time.perf_counter())


async def run_ops(
    measurement: Measurement,
    op: Op,
    *,
    count: int,
    inflight: int,
    time_s: float,
    rate_per_s: float | None = None,
    timeline: bool = False,
) -> Measurement:
    """Run ``op`` ``count`` times (at most ``time_s`` seconds) with ``inflight`` workers."""
    assert count > 0 and inflight > 0 and time_s > 0
    issued = 0
    start = time.perf_counter()
    deadline = start + time_s
    errors: list[str] = []

    async def worker() -> None:
        nonlocal issued
        while issued < count:
            i = issued
            issued += 1
            due = start + i / rate_per_s if rate_per_s else time.perf_counter()
            if due >= deadline:
                return
            wait_s = due - time.perf_counter()
            if wait_s > 0:
                await asyncio.sleep(wait_s)
            began = measured_from(due)
            records = 0
            try:
                records = await op(i)
            except Exception as exc:  # noqa: BLE001 - a failed op is a measured outcome
                measurement.failed += 1
                if len(errors) < FAILURES_KEPT:
                    errors.append(f"{type(exc).__name__}: {exc}"[:200])
            else:
                measurement.ops += records
            latency_ms = (time.perf_counter() - began) * 1000.0
            if records:
                measurement.latencies_ms.extend([latency_ms] * records)
            if timeline:
                measurement.timeline.append((due - start, latency_ms))
            if time.perf_counter() >= deadline:
                return

    await asyncio.gather(*(worker() for _ in range(inflight)))
    measurement.seconds = time.perf_counter() - start
    if errors:
        measurement.note = (measurement.note + " errors: " + "; ".join(errors)).strip()
    return measurement


def round_robin(ops: list[Op]) -> Op:
    """Op ``i`` runs ``ops[i mod n]``: the ops in flight at once go to different logs."""
    n = len(ops)

    async def op(i: int) -> int:
        return await ops[i % n](i)

    return op


def payload(size: int, i: int = 0) -> bytes:
    """A record value of ``size`` bytes (not all zero, so nothing compresses it away)."""
    stamp = i.to_bytes(8, "little")
    return (stamp * (size // 8 + 1))[:size]
