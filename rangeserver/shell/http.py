"""A range server's HTTP port (``--http H:P``, off unless given): metrics and health.

``GET /metrics``: the Prometheus text (``rangeserver/shell/metrics.py``, ``process_*``
included). ``GET /healthz``: 200 ``{"status": "ok", "server_id"}`` while the process
serves. ``GET /readyz``: 200 once registered with PD (when started with ``--pd``) with its
log open, not failed, and its disk and descriptors there; else 503 ``{"error": {"code":
"UNAVAILABLE", "message"}}`` saying which. A failed log stays live (reads go on) but not
ready until a restart; exhaustion is not ready only while it lasts. Same TLS as the RPC
port when the server has a certificate.

Side effects: an HTTP listening socket.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from ssl import SSLContext
from typing import Any

from aiohttp import web

from estream.server.metrics import metrics_response
from rangeserver.shell.metrics import RangeServerMetrics

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _error(status: int, code: str, message: str) -> web.Response:
    return web.json_response({"error": {"code": code, "message": message}}, status=status)


def not_ready_reason(metrics: RangeServerMetrics, needs_registration: bool) -> str | None:
    """Why the server is not ready, or None when it is."""
    wal = metrics.store.wal
    if not wal.mode:
        return "the write-ahead log is not open yet (recovering)"
    if wal.failed is not None:
        return f"the write-ahead log failed ({wal.failed.message}); appends fail until a restart"
    if wal.exhausted is not None:
        return (f"the range server's {wal.exhausted} is exhausted: appends are refused until "
                "it is back")
    if needs_registration and not metrics.registered:
        return "not registered with the placement driver yet"
    return None


def build_app(metrics: RangeServerMetrics, server_id: str, *,
              needs_registration: bool) -> web.Application:
    @web.middleware
    async def errors(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            return _error(exc.status, exc.reason.upper().replace(" ", "_"), exc.reason)

    async def healthz(request: web.Request) -> web.Response:
        return web.json_response({"status": "ok", "server_id": server_id})

    async def readyz(request: web.Request) -> web.Response:
        reason = not_ready_reason(metrics, needs_registration)
        if reason is None:
            return web.json_response({"status": "ready", "server_id": server_id})
        response = _error(503, "UNAVAILABLE", reason)
        response.headers["Retry-After"] = "1"
        return response

    async def scrape(request: web.Request) -> web.Response:
        return metrics_response(metrics.registry)

    app = web.Application(middlewares=[errors], client_max_size=64 * 1024)
    app.router.add_get("/metrics", scrape)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


async def start_http(app: web.Application, host: str, port: int,
                     ssl: SSLContext | None = None) -> tuple[web.AppRunner, str]:
    """Serve ``app``; returns the runner (``await runner.cleanup()`` stops it) and the
    bound ``host:port``."""
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True, ssl_context=ssl)
    try:
        await site.start()
    except BaseException:
        await runner.cleanup()
        raise
    server: Any = site._server
    sockets = server.sockets if server is not None else []
    bound = sockets[0].getsockname() if sockets else (host, port)
    return runner, f"{bound[0]}:{bound[1]}"
