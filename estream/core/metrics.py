"""The one way estream processes make metrics: a recorder of counters, gauges and latency
histograms by name and labels, described at each scrape as metric families (name, type,
help, samples) that ``estream/server/metrics.py`` hands to ``prometheus-client``.

Recording here keeps servers' decisions testable without a registry, a clock or a lock (the
event loop is the only writer). ``count`` / ``set_gauge`` / ``observe_seconds`` record by
name (a counter's name ends in ``_total``, a histogram's in ``_seconds``; a name is one type
for good); ``counter_series`` and ``histogram_series`` return one series to update on a hot
path (and show it at zero from the start). Families measured at scrape time are built with
``gauge_family``, ``counter_family`` and ``histogram_family``.

Pure: no I/O (the caller measures durations and serves the text).
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Final

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


class Counter:
    """One counter series (or one gauge's value): ``inc`` adds, ``value`` reads."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value: float = 0

    def inc(self, amount: float = 1) -> None:
        self.value += amount


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
    values: dict[Labels, Counter] = field(default_factory=dict)
    histograms: dict[Labels, Histogram] = field(default_factory=dict)
    bounds: tuple[float, ...] = LATENCY_BUCKETS_S


def _key(labels: Mapping[str, str]) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in labels.items()))


def _base(name: str, kind: str) -> str:
    return name.removesuffix("_total") if kind == "counter" else name


class Recorder:
    """Counters, gauges and histograms registered by name, as families at each scrape."""

    def __init__(self) -> None:
        self._named: dict[str, _Named] = {}

    def _family(self, name: str, kind: str, help_text: str) -> _Named:
        named = self._named.setdefault(name, _Named(kind, help_text))
        if named.kind != kind:
            raise ValueError(f"metric {name} is a {named.kind}, not a {kind}")
        return named

    def counter_series(self, name: str, help_text: str, **labels: str) -> Counter:
        """The series of the counter ``name`` (ending in ``_total``) with ``labels``,
        created at zero if new."""
        values = self._family(name, "counter", help_text).values
        key = _key(labels)
        series = values.get(key)
        if series is None:
            series = values[key] = Counter()
        return series

    def count(self, name: str, help_text: str, amount: int = 1, **labels: str) -> None:
        """Add ``amount`` to the counter ``name`` (ending in ``_total``) with ``labels``."""
        self.counter_series(name, help_text, **labels).inc(amount)

    def counter(self, name: str, **labels: str) -> int:
        named = self._named.get(name)
        series = None if named is None else named.values.get(_key(labels))
        return 0 if series is None else int(series.value)

    def set_gauge(self, name: str, help_text: str, value: float, **labels: str) -> None:
        values = self._family(name, "gauge", help_text).values
        series = values.setdefault(_key(labels), Counter())
        series.value = value

    def gauge_max(self, name: str) -> float | None:
        """The largest value the gauge ``name`` has under any labels (None: none set)."""
        named = self._named.get(name)
        if named is None or not named.values:
            return None
        return max(series.value for series in named.values.values())

    def histogram_series(self, name: str, help_text: str,
                         bounds: tuple[float, ...] = LATENCY_BUCKETS_S,
                         **labels: str) -> Histogram:
        """The series of the histogram ``name`` (ending in ``_seconds``) with ``labels``,
        created empty if new; ``bounds`` are the family's buckets, set by its first series."""
        named = self._family(name, "histogram", help_text)
        if not named.histograms:
            named.bounds = bounds
        key = _key(labels)
        series = named.histograms.get(key)
        if series is None:
            series = named.histograms[key] = Histogram(named.bounds)
        return series

    def observe_seconds(self, name: str, help_text: str, seconds: float, **labels: str) -> None:
        """Add one duration to the histogram ``name`` (ending in ``_seconds``)."""
        self.histogram_series(name, help_text, LATENCY_BUCKETS_S, **labels).observe(seconds)

    def histogram(self, name: str, **labels: str) -> Histogram | None:
        named = self._named.get(name)
        return None if named is None else named.histograms.get(_key(labels))

    def families(self, gauges: Mapping[str, tuple[str, float]] | None = None,
                 extra: Iterable[Family] = ()) -> list[Family]:
        """Everything recorded, plus ``gauges`` (name -> (help, value)) and ``extra``
        families measured by the caller at scrape time; sorted by name."""
        out = [gauge_family(name, help_text, value)
               for name, (help_text, value) in (gauges or {}).items()]
        for name, named in self._named.items():
            if named.kind == "histogram":
                samples = [s for key, h in sorted(named.histograms.items())
                           for s in h.samples(key)]
            else:
                suffix = "_total" if named.kind == "counter" else ""
                samples = [Sample(suffix, key, series.value)
                           for key, series in sorted(named.values.items())]
            out.append(Family(_base(name, named.kind), named.kind, named.help, tuple(samples)))
        return sorted([*out, *extra], key=lambda f: f.name)


def gauge_family(name: str, help_text: str, value: float = 0,
                 labelled: Mapping[str, Mapping[str, float]] | None = None) -> Family:
    """A gauge measured at scrape time: one unlabelled ``value``, or ``labelled`` as
    label name -> (label value -> value)."""
    if labelled is None:
        return Family(name, "gauge", help_text, (Sample("", (), value),))
    return Family(name, "gauge", help_text, tuple(
        Sample("", ((label, key),), v) for label, values in labelled.items()
        for key, v in values.items()))


def counter_family(name: str, help_text: str, value: float = 0,
                   labelled: Mapping[str, Mapping[str, float]] | None = None) -> Family:
    """A counter (``name`` ends in ``_total``) read at scrape time: one unlabelled
    ``value``, or ``labelled`` as label name -> (label value -> value)."""
    if labelled is None:
        samples: tuple[Sample, ...] = (Sample("_total", (), value),)
    else:
        samples = tuple(Sample("_total", ((label, key),), v)
                        for label, values in labelled.items() for key, v in values.items())
    return Family(_base(name, "counter"), "counter", help_text, samples)


def histogram_family(name: str, help_text: str, histogram: Histogram) -> Family:
    """One unlabelled histogram as a family (e.g. Raft's commit latency)."""
    return Family(name, "histogram", help_text, tuple(histogram.samples()))
