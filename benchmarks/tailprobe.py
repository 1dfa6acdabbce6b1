"""Where an append's tail goes, beside ``bench_append.py``'s one-in-flight phase: the
machine's own fdatasync tail in the same run, and the client's cyclic GC passes during the
phase and its event-loop stalls in the gray-replica phase (``--trace``).

Side effects: a scratch file under the work dir (the ceiling); a ``gc.callbacks`` entry while
watching; the interpreter's GC settings inside a :func:`tuned_gc` block.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.peers.machine import fdatasync_loop, fdatasync_quorum_loop


def percentile(samples: list[float], q: float) -> float:
    """Nearest-rank percentile (q in [0, 100])."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 100))))
    return ordered[rank - 1]


def tail_figures(latencies: list[float]) -> dict[str, Any]:
    """Samples, p50, p99, p99.9 and the worst, in ms."""
    return {
        "samples": len(latencies),
        "p50_ms": round(percentile(latencies, 50), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
        "p99_9_ms": round(percentile(latencies, 99.9), 3),
        "max_ms": round(max(latencies), 3),
    }


def fdatasync_ceiling(work: Path, size: int, samples: int, time_s: float) -> dict[str, Any]:
    """The machine's own tail beside one in flight, on the filesystem the cluster's logs are
    on: ``samples`` ``os.write`` of ``size`` bytes + ``os.fdatasync`` in a loop on one file
    (``compare.py``'s ``os.write+fdatasync/1`` row), and ``quorum``: the same written to
    three files at once, each round done when two are durable
    (:func:`~benchmarks.peers.machine.fdatasync_quorum_loop`: what an append one at a time
    to replicas 3, ack 2 waits for on this disk with no software in between)."""
    figures = tail_figures(fdatasync_loop(work, size, samples, time_s).latencies_ms)
    figures["quorum"] = tail_figures(
        fdatasync_quorum_loop(work, size, samples, time_s).latencies_ms)
    return figures


class GcPasses:
    """The client's cyclic GC passes while it is watching: ``(start, end, generation)`` on
    the ``perf_counter`` clock (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.passes: list[tuple[float, float, int]] = []
        self._started = 0.0

    def __enter__(self) -> GcPasses:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def _callback(self, phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            self._started = now
        else:
            self.passes.append((self._started, now, info["generation"]))

    def within(self, start: float, end: float) -> tuple[float, int]:
        """Milliseconds of GC between ``start`` and ``end``, and the oldest generation."""
        ms, oldest = 0.0, -1
        for a, b, generation in self.passes:
            if b > start and a < end:
                ms += (min(b, end) - max(a, start)) * 1000
                oldest = max(oldest, generation)
        return round(ms, 3), oldest


class LoopStalls:
    """The client's event-loop stalls while it runs: a task sleeping 1 ms at a time notes
    each wake more than ``late_ms`` late (``(start on the perf_counter clock, ms late)``).
    It wakes the loop 1,000 times a second: a probe, not for figures that are judged."""

    def __init__(self, late_ms: float = 2.0) -> None:
        self.late_ms = late_ms
        self.stalls: list[tuple[float, float]] = []
        self._task = asyncio.ensure_future(self._watch())

    async def _watch(self) -> None:
        while True:
            before = time.perf_counter()
            await asyncio.sleep(0.001)
            late = (time.perf_counter() - before) * 1000 - 1.0
            if late > self.late_ms:
                self.stalls.append((before, late))

    def stop(self) -> None:
        self._task.cancel()

    def longest(self, around: float, within_s: float, count: int = 8
                ) -> list[tuple[float, float]]:
        """The ``count`` longest within ``within_s`` of ``around``: (s from it, ms late)."""
        near = sorted((s for s in self.stalls if abs(s[0] - around) < within_s),
                      key=lambda s: -s[1])
        return [(round(start - around, 3), round(late, 2)) for start, late in near[:count]]


@contextlib.contextmanager
def tuned_gc() -> Iterator[None]:
    """``estream.tune_gc()`` for one block, as a latency-minded client calls it once it is
    connected (README), so a full collection of the comparison's own heap does not land
    in a latency row's window; the interpreter's settings again after it, for the blocks
    (and systems) that follow."""
    import estream

    threshold = gc.get_threshold()
    estream.tune_gc()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
