"""The gateway's ``--http`` endpoints: ``/healthz`` (200 while serving) and ``/metrics``
(Prometheus text: requests by API and error, bytes, connections).

Side effects: the HTTP listening socket.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from aiohttp import web

from estream.kafka.shell.gateway import Gateway
from estream.server.metrics import FamiliesCollector, metrics_response, new_registry


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


def families(gateway: Gateway) -> Iterator[Family]:
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


def build_app(gateway: Gateway) -> web.Application:
    registry = new_registry()
    registry.register(FamiliesCollector(lambda: families(gateway)))

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ok"})

    async def metrics(_: web.Request) -> web.Response:
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
