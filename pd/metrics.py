"""What a PD node measures: request counts, latency histograms, named counters and gauges.

:class:`Metrics` records; :meth:`Metrics.families` describes everything recorded as
metric families (name, type, help, samples) that the shell hands to ``prometheus-client``
for the text exposition (``estream/server/metrics.py``), beside the ``process_*``
metrics. Recording here keeps the PD's decisions testable without a registry, a clock
or a lock: the event loop is the only writer.

Registration API for other parts of PD (repair, reclaim, recovery, offload):
``count(name, help, amount, **labels)`` adds to a counter (its name ends in ``_total``),
``set_gauge(name, help, value, **labels)`` sets a gauge, ``observe_seconds(name, help,
seconds, **labels)`` adds to a latency histogram (its name ends in ``_seconds``). A name
is one type for good; labels are short strings.

Pure: no I/O (the caller measures durations and serves the text).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

WRITER_RECOVERIES_TOTAL: Final = "estream_writer_recoveries_total"
WRITER_RECOVERIES_HELP: Final = (
    "Open ranges the PD leader recovered after their writer's lease ran out, by outcome "
    "(sealed, kept, unavailable, superseded, failed).")
# The object-storage tier's offloader (pd/shell/offloader.py): name -> help.
OFFLOADED_BYTES: Final = "estream_offload_bytes_total"
OFFLOADED_RANGES: Final = "estream_offload_ranges_total"
OFFLOAD_ERRORS: Final = "estream_offload_errors_total"
OFFLOAD_LAG: Final = "estream_offload_lag_seconds"
OBJECT_REQUESTS: Final = "estream_object_requests_total"
RECLAIMED_BYTES: Final = "estream_offload_reclaimed_bytes_total"
RELEASED_RANGES: Final = "estream_offload_released_ranges_total"
OBJECTS_DELETED: Final = "estream_objects_deleted_total"
OBJECTS_COMPACTED: Final = "estream_objects_compacted_total"
OFFLOAD_HELP: Final = {
    OFFLOADED_BYTES: "Bytes of sealed ranges uploaded to the object store and committed.",
    OFFLOADED_RANGES: "Sealed ranges uploaded to the object store and committed.",
    OFFLOAD_ERRORS: "Failed offload steps, by stage (read, put, verify, commit, release, sweep).",
    OFFLOAD_LAG: "How long the oldest sealed range still in the local tier has waited.",
    OBJECT_REQUESTS: "Object-store requests of the offloader, by operation and outcome.",
    RECLAIMED_BYTES: "Range-server bytes released (object size times replicas dropped).",
    RELEASED_RANGES: "Object-tier ranges whose range-server replicas were released.",
    OBJECTS_DELETED: "Objects deleted: unreferenced, uncommitted, or found by the sweep.",
}
# (not in OFFLOAD_HELP, whose every metric the Grafana dashboard must show: none shows this)
OBJECTS_COMPACTED_HELP: Final = ("Objects rewritten by compaction into a new object (small "
                                 "or mostly garbage), counted when the rewrite commits.")
# Damaged objects (pd/objectdamage.py, pd/shell/offloader.py): name -> help (not in
# OFFLOAD_HELP: the dashboard need not show them; the alert rules may).
DAMAGE_REPORTS: Final = "estream_object_damage_reports_total"
DAMAGE_CHECKS: Final = "estream_object_damage_checks_total"
DAMAGE_REPAIRED: Final = "estream_object_damage_repaired_ranges_total"
DAMAGE_LOST: Final = "estream_object_damage_lost_ranges_total"
DAMAGE_HELP: Final = {
    DAMAGE_REPORTS: "Readers' reports of a missing or damaged object received by the PD "
                    "leader, by outcome (queued, stale, pending, recent, full).",
    DAMAGE_CHECKS: "Objects the PD leader read back after a report or a failed check "
                   "before a release, by result (damaged, sound, inconclusive).",
    DAMAGE_REPAIRED: "Ranges of damaged objects moved back to the local tier, to be "
                     "uploaded again from their replicas.",
    DAMAGE_LOST: "Ranges whose part of an object is damaged and whose replicas are "
                 "released: unreadable until restored by hand.",
}
# The object scrub (pd/scrub.py, pd/shell/scrubber.py): name -> help.
SCRUB_OBJECTS: Final = "estream_object_scrub_objects_total"
SCRUB_BYTES: Final = "estream_object_scrub_bytes_total"
SCRUB_DAMAGED: Final = "estream_object_scrub_damaged_total"
SCRUB_HELP: Final = {
    SCRUB_OBJECTS: "Committed objects the PD leader's scrub read back, by result (sound, "
                   "damaged, inconclusive).",
    SCRUB_BYTES: "Bytes the PD leader's scrub read back from committed objects.",
    SCRUB_DAMAGED: "Objects the scrub found missing or damaged (their ranges uploaded "
                   "again from replicas, or counted as lost).",
}
REQUESTS_TOTAL: Final = "estream_pd_requests_total"
REQUEST_SECONDS: Final = "estream_pd_request_seconds"
COMMIT_SECONDS: Final = "estream_pd_raft_commit_seconds"
COMMIT_HELP: Final = "Raft commit latency of the commands this node proposed."

LATENCY_BUCKETS_S: Final = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                            1.0, 2.5, 5.0)

Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True, slots=True)
class Sample:
    """One line of a family: ``suffix`` is ``""``, ``"_total"``, ``"_bucket"``, ``"_sum"``
    or ``"_count"`` after the family's name."""

    suffix: str
    labels: Labels
    value: float


@dataclass(frozen=True, slots=True)
class Family:
    """A metric family: ``name`` without ``_total`` for counters; ``kind`` is
    ``"counter"``, ``"gauge"`` or ``"histogram"``."""

    name: str
    kind: str
    help: str
    samples: tuple[Sample, ...]


class Histogram:
    """Cumulative latency buckets (seconds), their sum and count."""

    __slots__ = ("bounds", "counts", "sum_s")

    def __init__(self, bounds: tuple[float, ...] = LATENCY_BUCKETS_S) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)  # the last: above every bound
        self.sum_s = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.sum_s += seconds

    @property
    def count(self) -> int:
        return sum(self.counts)

    def samples(self, labels: Labels = ()) -> list[Sample]:
        """``_bucket`` lines (cumulative, ``le`` last among the labels), ``_sum``, ``_count``."""
        out = []
        cumulative = 0
        for bound, count in zip((*self.bounds, float("inf")), self.counts, strict=True):
            cumulative += count
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            out.append(Sample("_bucket", (*labels, ("le", le)), cumulative))
        return [*out, Sample("_sum", labels, self.sum_s), Sample("_count", labels, cumulative)]


@dataclass(slots=True)
class _Named:
    kind: str
    help: str
    values: dict[Labels, float] = field(default_factory=dict)
    histograms: dict[Labels, Histogram] = field(default_factory=dict)


def _key(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _base(name: str, kind: str) -> str:
    return name.removesuffix("_total") if kind == "counter" else name


class Metrics:
    """Per-operation request counts (ok / error) and latency histograms, plus the
    counters, gauges and histograms other parts of PD register by name."""

    def __init__(self) -> None:
        self._named: dict[str, _Named] = {}

    def _family(self, name: str, kind: str, help_text: str) -> _Named:
        named = self._named.setdefault(name, _Named(kind, help_text))
        if named.kind != kind:
            raise ValueError(f"metric {name} is a {named.kind}, not a {kind}")
        return named

    def count(self, name: str, help_text: str, amount: int = 1, **labels: str) -> None:
        """Add ``amount`` to the counter ``name`` (ending in ``_total``) with ``labels``."""
        values = self._family(name, "counter", help_text).values
        key = _key(labels)
        values[key] = values.get(key, 0) + amount

    def counter(self, name: str, **labels: str) -> int:
        named = self._named.get(name)
        return 0 if named is None else int(named.values.get(_key(labels), 0))

    def set_gauge(self, name: str, help_text: str, value: float, **labels: str) -> None:
        self._family(name, "gauge", help_text).values[_key(labels)] = value

    def gauge_max(self, name: str) -> float | None:
        """The largest value the gauge ``name`` has under any labels (None: none set)."""
        named = self._named.get(name)
        return max(named.values.values()) if named is not None and named.values else None

    def observe_seconds(self, name: str, help_text: str, seconds: float, **labels: str) -> None:
        """Add one duration to the histogram ``name`` (ending in ``_seconds``)."""
        histograms = self._family(name, "histogram", help_text).histograms
        histograms.setdefault(_key(labels), Histogram()).observe(seconds)

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        named = self._named.get(name)
        return None if named is None else named.histograms.get(_key(labels))

    def observe(self, api: str, op: str, seconds: float, ok: bool) -> None:
        """One request served by ``api`` ("rpc", "http") for ``op``, and how long it took."""
        self.count(REQUESTS_TOTAL, "PD requests served, by API, operation and outcome.",
                   api=api, op=op, outcome="ok" if ok else "error")
        self.observe_seconds(REQUEST_SECONDS, "PD request latency, by API and operation.",
                             seconds, api=api, op=op)

    def requests(self, api: str, op: str) -> int:
        return (self.counter(REQUESTS_TOTAL, api=api, op=op, outcome="ok")
                + self.counter(REQUESTS_TOTAL, api=api, op=op, outcome="error"))

    def families(self, gauges: Mapping[str, tuple[str, float]] | None = None,
                 extra: Iterable[Family] = ()) -> list[Family]:
        """Everything recorded, plus ``gauges`` (name -> (help, value)) and ``extra``
        families measured by the caller at scrape time; sorted by name."""
        out = [Family(name, "gauge", help_text, (Sample("", (), value),))
               for name, (help_text, value) in (gauges or {}).items()]
        for name, named in self._named.items():
            if named.kind == "histogram":
                samples = [s for key, h in sorted(named.histograms.items())
                           for s in h.samples(key)]
            else:
                suffix = "_total" if named.kind == "counter" else ""
                samples = [Sample(suffix, key, value)
                           for key, value in sorted(named.values.items())]
            out.append(Family(_base(name, named.kind), named.kind, named.help, tuple(samples)))
        return sorted([*out, *extra], key=lambda f: f.name)


def histogram_family(name: str, help_text: str, histogram: Histogram) -> Family:
    """One unlabelled histogram as a family (e.g. Raft's commit latency)."""
    return Family(name, "histogram", help_text, tuple(histogram.samples()))


def counter_family(name: str, help_text: str, value: float) -> Family:
    """One unlabelled counter (``name`` ends in ``_total``) as a family."""
    return Family(_base(name, "counter"), "counter", help_text, (Sample("_total", (), value),))
