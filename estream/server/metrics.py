"""Prometheus exposition shared by the PD and range-server processes (``prometheus-client``).

Each process builds one :func:`new_registry` (its own, not the library's global one, so
tests can run several servers in one interpreter): the ``process_*`` and ``python_*``
metrics of the library's collectors, plus a :class:`FamiliesCollector` that turns the
families of a recorder (``estream/core/metrics.py``'s ``Family``: the one way estream
processes make metrics) into the library's metrics at each scrape. This is the only module
that imports ``prometheus-client``.
:func:`metrics_response` serves the text format (version 0.0.4) over aiohttp.

Side effects: the process collector reads ``/proc/self`` at scrape time.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Final, Protocol

from aiohttp import web
from prometheus_client import (
    CollectorRegistry,
    GCCollector,
    PlatformCollector,
    ProcessCollector,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"


class SampleLike(Protocol):
    @property
    def suffix(self) -> str: ...
    @property
    def labels(self) -> Sequence[tuple[str, str]]: ...
    @property
    def value(self) -> float: ...


class FamilyLike(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def kind(self) -> str: ...
    @property
    def help(self) -> str: ...
    @property
    def samples(self) -> Sequence[SampleLike]: ...


def to_metric(family: FamilyLike) -> Metric:
    """One family as a ``prometheus-client`` metric (validated by the library)."""
    metric = Metric(family.name, family.help, family.kind)
    for sample in family.samples:
        metric.add_sample(family.name + sample.suffix, dict(sample.labels), sample.value)
    return metric


class FamiliesCollector(Collector):
    """A collector whose families are computed by ``collect_families`` at each scrape."""

    def __init__(self, collect_families: Callable[[], Iterable[FamilyLike]]) -> None:
        self._collect_families = collect_families

    def describe(self) -> list[Metric]:
        return []  # measured at scrapes only: registering must not measure (or fail)

    def collect(self) -> Iterator[Metric]:
        for family in self._collect_families():
            yield to_metric(family)


def new_registry() -> CollectorRegistry:
    """A registry with the process (``process_*``), platform and GC (``python_*``)
    collectors. Counters get no ``_created`` series (they would double every counter)."""
    disable_created_metrics()  # type: ignore[no-untyped-call]
    registry = CollectorRegistry(auto_describe=True)
    ProcessCollector(registry=registry)
    PlatformCollector(registry=registry)
    GCCollector(registry=registry)
    return registry


def exposition(registry: CollectorRegistry) -> bytes:
    return generate_latest(registry)


def metrics_response(registry: CollectorRegistry) -> web.Response:
    response = web.Response(body=exposition(registry))
    response.headers["Content-Type"] = CONTENT_TYPE
    return response
