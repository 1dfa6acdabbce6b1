"""The gateway's ``--http`` endpoints: ``/healthz`` (200 while serving) and ``/metrics``
(Prometheus text: requests by API and error, bytes, connections, Fetch's read-ahead, and
each consumer group's lag per partition: ``estream/kafka/grouplag.py``, asked of PD at a
scrape at most every ``lag_refresh_ms_min``; a failed or slow refresh keeps the last
figures).

Side effects: the HTTP listening socket; PD calls for the lag at scrapes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Final

from aiohttp import web

from estream.kafka.grouplag import Lag, group_lags, groups_to_describe, lag_refresh_ms_min
from estream.kafka.shell.gateway import Gateway
from estream.sdk.groups import GroupClient
from estream.server.metrics import FamiliesCollector, metrics_response, new_registry
from estream.wire.errors import EstreamError

log = logging.getLogger("estream.kafka")

lag_refresh_timeout_ms: Final = 5_000  # a scrape waits at most this for the groups' lag


@dataclass(slots=True)
class GroupLags:
    """The last lag figures asked of PD, and when."""

    lags: list[Lag] = field(default_factory=list)
    groups_omitted: int = 0
    series_omitted: int = 0
    checked_ms: float = -1e18

    async def refresh(self, groups: GroupClient) -> None:
        """Ask PD again unless the figures are younger than ``lag_refresh_ms_min``."""
        now_ms = asyncio.get_running_loop().time() * 1000
        if now_ms - self.checked_ms < lag_refresh_ms_min:
            return
        self.checked_ms = now_ms
        try:
            async with asyncio.timeout(lag_refresh_timeout_ms / 1000):
                names, self.groups_omitted = groups_to_describe(await groups.list_groups())
                described = await asyncio.gather(
                    *(groups.describe(name, lag=True) for name in names),
                    return_exceptions=True)
        except (EstreamError, TimeoutError) as exc:
            log.info("group lag not refreshed: %s", exc)
            return
        self.lags, self.series_omitted = group_lags(
            [d for d in described if isinstance(d, dict)])


@dataclass(frozen=True, slots=True)
class Sample:
    suffix: str
    labels: tuple[tuple[str, str], ...]
    value: float


@dataclass(frozen=True, slots=True)
class Family:
    name: str
    kind: str
    help: str
    samples: tuple[Sample, ...]


def families(gateway: Gateway, lags: GroupLags | None = None) -> Iterator[Family]:
    """The gateway's metric families, measured now."""
    yield Family("estream_kafka_requests", "counter", "Kafka requests answered, by API and "
                 "error code", tuple(
                     Sample("_total", (("api", api), ("error", error)), float(count))
                     for (api, error), count in sorted(gateway.requests.items())))
    yield Family("estream_kafka_bytes", "counter", "Bytes received and sent on Kafka "
                 "connections", (Sample("_total", (("direction", "in"),), gateway.bytes_in),
                                 Sample("_total", (("direction", "out"),), gateway.bytes_out)))
    yield Family("estream_kafka_connections", "gauge", "Open Kafka connections",
                 (Sample("", (), float(gateway.connections)),))
    yield Family("estream_kafka_requests_in_flight", "gauge", "Kafka requests being served "
                 "(a request that only waits ends when its connection closes)",
                 (Sample("", (), float(gateway.in_flight)),))
    yield Family("estream_kafka_read_ahead_bytes", "gauge", "Bytes Fetch reads ahead of "
                 "consumers, each chunk counted at its fetch's max bytes (bounded by "
                 "gateway_read_ahead_bytes_max)",
                 (Sample("", (), float(gateway.read_ahead_bytes)),))
    yield Family("estream_kafka_read_ahead_refused", "counter", "Chunks not read ahead: "
                 "the gateway's read-ahead bound was reached",
                 (Sample("_total", (), float(gateway.read_ahead_refused)),))
    yield Family("estream_kafka_tail_cache_bytes", "gauge", "Kafka batches this gateway "
                 "stored, kept for fetches close behind (bounded by tail_cache_bytes_max)",
                 (Sample("", (), float(gateway.tail.bytes)),))
    yield Family("estream_kafka_tail_cache_hits", "counter", "Fetches of a partition "
                 "answered from the tail cache (no read, no conversion)",
                 (Sample("_total", (), float(gateway.tail.hits)),))
    if lags is not None:
        yield Family("estream_kafka_group_lag", "gauge", "Records between a consumer "
                     "group's committed offset and the partition's readable end", tuple(
                         Sample("", (("group", lag.group), ("topic", lag.topic),
                                     ("partition", str(lag.partition))), float(lag.lag))
                         for lag in lags.lags))
        yield Family("estream_kafka_group_lag_omitted", "gauge", "Groups not described and "
                     "group-partition series not shown (past the bounds)", (
                         Sample("", (("what", "groups"),), float(lags.groups_omitted)),
                         Sample("", (("what", "series"),), float(lags.series_omitted))))


def build_app(gateway: Gateway) -> web.Application:
    registry = new_registry()
    lags = GroupLags()
    groups = GroupClient(gateway.client.pd)
    registry.register(FamiliesCollector(lambda: families(gateway, lags)))

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(_: web.Request) -> web.Response:
        with contextlib.suppress(Exception):  # the other metrics are served whatever
            await lags.refresh(groups)
        return metrics_response(registry)

    app = web.Application()
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/metrics", metrics)
    return app


async def start_http(app: web.Application, host: str, port: int) -> tuple[web.AppRunner, str]:
    """Serve ``app``; returns the runner (``await runner.cleanup()`` stops it) and the
    bound ``host:port`` (port 0 picks one)."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    server = site._server
    sockets = getattr(server, "sockets", None) or []
    bound = sockets[0].getsockname() if sockets else (host, port)
    return runner, f"{bound[0]}:{bound[1]}"
