"""Where an append's tail goes, beside ``bench_append.py``'s one-in-flight phase: the
machine's own fdatasync tail in the same run, and the client's cyclic GC passes during the
phase (``--trace``).

Side effects: a scratch file under the work dir (the ceiling); a ``gc.callbacks`` entry while
watching.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

from benchmarks.peers.machine import fdatasync_loop


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
    """The machine's own tail beside one in flight: ``samples`` ``os.write`` of ``size``
    bytes + ``os.fdatasync`` in a loop, on the filesystem the cluster's logs are on
    (``compare.py``'s ``os.write+fdatasync/1`` row)."""
    return tail_figures(fdatasync_loop(work, size, samples, time_s).latencies_ms)


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
