"""What one benchmark run of one system measured, and the percentiles of its latencies.

Pure: no I/O.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(sorted_values: list[float], p: float) -> float:
    """The ``p``-th percentile (0..100) of already sorted values, nearest-rank; NaN if empty."""
    if not sorted_values:
        return math.nan
    rank = max(1, math.ceil(p * len(sorted_values) / 100.0 - 1e-9))  # no float overshoot
    return sorted_values[min(rank, len(sorted_values)) - 1]


@dataclass
class Measurement:
    """One system in one scenario: ``ops`` done in ``seconds``, with per-op latencies.

    ``timeline`` holds ``(start_s, latency_ms)`` per op (relative to the run start) when the
    scenario needs latency over time (the kill scenario); ``events`` marks moments on it.
    """

    scenario: str
    system: str
    ops: int = 0
    seconds: float = 0.0
    failed: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    timeline: list[tuple[float, float]] = field(default_factory=list)
    events: dict[str, float] = field(default_factory=dict)
    extra: dict[str, float] = field(default_factory=dict)
    note: str = ""
    pending: str = ""  # non-empty: not measured, and why

    @property
    def rate(self) -> float:
        return self.ops / self.seconds if self.seconds > 0 else math.nan

    def pct(self, p: float) -> float:
        return percentile(sorted(self.latencies_ms), p)

    def summary(self) -> dict[str, Any]:
        """The figures without the raw samples (what goes into the tables)."""
        lat = sorted(self.latencies_ms)
        out: dict[str, Any] = {
            "scenario": self.scenario, "system": self.system, "ops": self.ops,
            "seconds": round(self.seconds, 3), "failed": self.failed,
            "rate": self.rate, "p50_ms": percentile(lat, 50), "p99_ms": percentile(lat, 99),
            "p999_ms": percentile(lat, 99.9), "max_ms": lat[-1] if lat else math.nan,
            "note": self.note, "pending": self.pending,
        }
        out.update(self.extra)
        return out

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def window(timeline: list[tuple[float, float]], start_s: float, end_s: float) -> list[float]:
    """Latencies (sorted) of the ops that started in ``[start_s, end_s)``."""
    return sorted(lat for t, lat in timeline if start_s <= t < end_s)
