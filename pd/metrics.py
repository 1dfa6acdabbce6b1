"""Request counters and latency histograms of a PD node, rendered as Prometheus text.

Pure: no I/O (the caller measures durations and serves the text).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

WRITER_RECOVERIES_TOTAL: Final = "estream_writer_recoveries_total"
WRITER_RECOVERIES_HELP: Final = (
    "Open ranges the PD leader recovered after their writer's lease ran out, by outcome "
    "(sealed, kept, unavailable, superseded, failed).")

LATENCY_BUCKETS_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                            1.0, 2.5, 5.0)


@dataclass(slots=True)
class _Series:
    ok: int = 0
    errors: int = 0
    sum_s: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(LATENCY_BUCKETS_S) + 1))


class Metrics:
    """Per-operation request counts (ok / error) and latency histograms."""

    def __init__(self) -> None:
        self._series: dict[tuple[str, str], _Series] = {}
        self._counters: dict[str, tuple[str, dict[tuple[tuple[str, str], ...], int]]] = {}

    def count(self, name: str, help_text: str, amount: int = 1, **labels: str) -> None:
        """Add ``amount`` to the counter ``name`` with ``labels`` (e.g. repairs done)."""
        _, series = self._counters.setdefault(name, (help_text, {}))
        key = tuple(sorted(labels.items()))
        series[key] = series.get(key, 0) + amount

    def counter(self, name: str, **labels: str) -> int:
        series = self._counters.get(name, ("", {}))[1]
        return series.get(tuple(sorted(labels.items())), 0)

    def observe(self, api: str, op: str, seconds: float, ok: bool) -> None:
        series = self._series.setdefault((api, op), _Series())
        if ok:
            series.ok += 1
        else:
            series.errors += 1
        series.sum_s += seconds
        series.buckets[bisect_left(LATENCY_BUCKETS_S, seconds)] += 1

    def requests(self, api: str, op: str) -> int:
        series = self._series.get((api, op))
        return 0 if series is None else series.ok + series.errors

    def render(self, gauges: Mapping[str, tuple[str, float]]) -> str:
        """Prometheus text exposition: ``gauges`` maps name -> (help, value)."""
        lines: list[str] = []
        for name, (help_text, value) in sorted(gauges.items()):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} gauge", f"{name} {value:g}"]
        for name, (help_text, series) in sorted(self._counters.items()):
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} counter"]
            for key, value in sorted(series.items()):
                labels = ",".join(f'{k}="{v}"' for k, v in key)
                lines.append(f"{name}{{{labels}}} {value}" if labels else f"{name} {value}")
        lines += ["# HELP estream_pd_requests_total PD requests served, by API, operation "
                  "and outcome.", "# TYPE estream_pd_requests_total counter"]
        for (api, op), s in sorted(self._series.items()):
            labels = f'api="{api}",op="{op}"'
            lines.append(f'estream_pd_requests_total{{{labels},outcome="ok"}} {s.ok}')
            lines.append(f'estream_pd_requests_total{{{labels},outcome="error"}} {s.errors}')
        lines += ["# HELP estream_pd_request_seconds PD request latency.",
                  "# TYPE estream_pd_request_seconds histogram"]
        for (api, op), s in sorted(self._series.items()):
            labels = f'api="{api}",op="{op}"'
            cumulative = 0
            for bound, count in zip(LATENCY_BUCKETS_S, s.buckets, strict=False):
                cumulative += count
                lines.append(f'estream_pd_request_seconds_bucket{{{labels},le="{bound}"}} '
                             f"{cumulative}")
            total = s.ok + s.errors
            lines.append(f'estream_pd_request_seconds_bucket{{{labels},le="+Inf"}} {total}')
            lines.append(f"estream_pd_request_seconds_sum{{{labels}}} {s.sum_s:.6f}")
            lines.append(f"estream_pd_request_seconds_count{{{labels}}} {total}")
        return "\n".join(lines) + "\n"
