"""The operator's part of the PD admin API: range servers one by one, drain and forget,
range health and repair progress, and the web console at ``/ui``.

Routes (added to :func:`pd.shell.http.build_app`'s application, so they share its error
middleware, bearer-token rules and metrics; shapes in :mod:`pd.openapi`):

- ``GET /v1/rangeservers/{id}``: the server with ``"state"`` (``active`` | ``draining`` |
  ``drained``), ``"replicas"`` (ranges naming it) and ``"open_ranges"``; 404 unknown;
- ``POST /v1/rangeservers/{id}/drain``: start draining it (``DELETE`` on the same path:
  active again); answers the server;
- ``POST /v1/rangeservers/{id}/forget`` or ``DELETE /v1/rangeservers/{id}``: remove a dead
  server from the catalog; 409 while it is alive or may hold the only copy of a range;
- ``GET /v1/ranges?under_replicated=1``: ranges with their replicas' health by repair's
  rules (``under_replicated=0`` or absent: every range) and ``"repair"``: this node's
  repair progress (``leader`` says whether it is the node that repairs);
- ``GET /v1/streams/{name}/records?offset=N|timestamp=MS&limit=M``: the record browser
  (:mod:`pd.shell.records`; at most 100 records and 1 MiB of values);
- ``GET /v1/samples?minutes=M``: this node's own samples of the last hour (every 10 s: streams,
  ranges, bytes stored, live servers, under-replicated ranges, Raft commits and commit
  latency; :class:`pd.console.SampleRing`, 360 at most), for the console's charts;
- ``GET /ui``: the console (:mod:`pd.shell.consolepage`: one self-contained page, vanilla
  JavaScript over this API, nothing fetched from outside the node). Writes from the page
  send the bearer token typed into it (kept in the tab's session storage).

``GET /v1/rangeservers/{id}`` and each server of ``GET /v1/rangeservers`` also say whether
a drain of the server can finish (``"drain"``: :func:`pd.console.drain_outlooks`, one pass
over the catalog for the whole list).

Side effects: one background task sampling this node's figures (started and stopped with
the application); the HTTP server is :mod:`pd.shell.http`'s.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from estream.net.objectstore import ObjectStore
from estream.wire.errors import InvalidArgument, Unavailable
from pd.console import (
    SampleRing,
    drain_outlooks,
    interval_mean_ms,
    records_query,
    sample_interval_s,
    samples_max,
)
from pd.shell.consolepage import CONSOLE_HTML
from pd.shell.records import browse
from pd.shell.retainer import LAG as CURSOR_LAG
from pd.shell.service import PdService

log = logging.getLogger(__name__)
RangesReport = Callable[[bool], Awaitable[dict[str, Any]]]
Gauges = Callable[[], dict[str, tuple[str, float]]]
_FLAGS: Final = {"1": True, "true": True, "0": False, "false": False}
# sample figure -> the /metrics gauge it copies (one way to count each thing)
_SAMPLED_GAUGES: Final = {
    "streams": "estream_pd_streams", "ranges": "estream_pd_ranges",
    "servers_live": "estream_pd_rangeservers_live",
    "under_replicated": "estream_pd_ranges_under_replicated",
    "commit_index": "estream_pd_raft_commit_index",
}


def add_operator_routes(
    app: web.Application, service: PdService, ranges_report: RangesReport | None,
    gauges: Gauges | None = None, object_store: ObjectStore | None = None,
) -> None:
    """Add the routes of the module docstring to ``app`` (``gauges``: the /metrics gauges
    the samples copy; ``object_store``: where the record browser reads the object tier)."""
    views = _OperatorViews(service, ranges_report, gauges, object_store)
    app.router.add_get("/v1/rangeservers/{id}", views.describe)
    app.router.add_delete("/v1/rangeservers/{id}", views.forget)
    app.router.add_post("/v1/rangeservers/{id}/drain", views.drain)
    app.router.add_delete("/v1/rangeservers/{id}/drain", views.undrain)
    app.router.add_post("/v1/rangeservers/{id}/forget", views.forget)
    app.router.add_get("/v1/ranges", views.ranges)
    app.router.add_get("/v1/streams/{name}/records", views.records)
    app.router.add_get("/v1/samples", views.samples)
    app.router.add_get("/ui", views.ui)
    app.cleanup_ctx.append(views.sampling)


async def with_drain_outlooks(
    service: PdService, servers: list[dict[str, Any]]
) -> list[dict[str, Any]]:
    """``servers`` (as :meth:`PdService.server_details` gives them) each with ``"drain"``:
    whether draining it can finish (:func:`pd.console.drain_outlooks`)."""
    view = await service.read_view()
    live = {s.id for s in service.servers() if s.alive}
    outlooks = drain_outlooks([s["id"] for s in servers], view.streams.values(), live,
                              view.draining)
    return [{**s, "drain": outlooks[s["id"]]} for s in servers]


class _OperatorViews:
    def __init__(self, service: PdService, ranges_report: RangesReport | None,
                 gauges: Gauges | None, object_store: ObjectStore | None) -> None:
        self.service = service
        self.object_store = object_store
        self.ranges_report = ranges_report
        self.gauges = gauges
        self.ring = SampleRing(samples_max)
        self._commits = (0.0, 0)  # the commit-latency histogram's (sum, count) last sampled

    async def describe(self, request: web.Request) -> web.Response:
        servers = await with_drain_outlooks(
            self.service, await self.service.server_details(request.match_info["id"]))
        return web.json_response(servers[0])

    async def records(self, request: web.Request) -> web.Response:
        query = records_query(request.query)
        answer = await browse(self.service.pool, self.object_store, self._describe,
                              request.match_info["name"], query)
        return web.json_response(answer)

    async def _describe(self, name: str, refresh: bool) -> Any:
        return await self.service.describe_stream(name)

    async def samples(self, request: web.Request) -> web.Response:
        raw = request.query.get("minutes", "60")
        if not raw.isdigit() or not 1 <= int(raw) <= 60:
            raise InvalidArgument("minutes must be an integer from 1 to 60", argument="minutes")
        since = int(time.time() * 1000) - int(raw) * 60_000
        return web.json_response({"interval_s": sample_interval_s, "max": samples_max,
                                  "samples": [s.to_dict() for s in self.ring.since(since)]})

    def sample(self) -> None:
        """Take one sample of this node's figures into the ring."""
        figures: dict[str, float] = {}
        if self.gauges is not None:
            gauges = self.gauges()
            figures = {k: gauges[g][1] for k, g in _SAMPLED_GAUGES.items() if g in gauges}
        figures["bytes_stored"] = sum(int(s.load.get("bytes", 0) or 0)
                                      for s in self.service.servers() if s.alive)
        lag = self.service.metrics.gauge_max(CURSOR_LAG)  # the leader's retainer sets it
        if lag is not None:
            figures["cursor_lag_max"] = lag
        histogram = getattr(self.service.raft, "commit_seconds", None)
        if histogram is not None:
            reading = (histogram.sum_s, histogram.count)
            mean = interval_mean_ms(self._commits, reading)
            self._commits = reading
            if mean is not None:
                figures["commit_ms"] = mean
        self.ring.add(int(time.time() * 1000), figures)

    async def sampling(self, app: web.Application) -> AsyncIterator[None]:
        async def loop() -> None:
            while True:
                try:
                    self.sample()
                except Exception:  # a sample is never worth the node: say so, go on
                    log.exception("sampling this node's figures failed")
                await asyncio.sleep(sample_interval_s)

        task = asyncio.get_running_loop().create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def drain(self, request: web.Request) -> web.Response:
        return web.json_response(await self.service.drain_server(request.match_info["id"]))

    async def undrain(self, request: web.Request) -> web.Response:
        server = await self.service.drain_server(request.match_info["id"], cancel=True)
        return web.json_response(server)

    async def forget(self, request: web.Request) -> web.Response:
        server_id = request.match_info["id"]
        await self.service.forget_server(server_id)
        return web.json_response({"forgotten": server_id})

    async def ranges(self, request: web.Request) -> web.Response:
        raw = request.query.get("under_replicated", "0")
        if raw not in _FLAGS:
            raise InvalidArgument("under_replicated must be 1, 0, true or false",
                                  argument="under_replicated")
        if self.ranges_report is None:
            raise Unavailable("range health is not available on this node")
        return web.json_response(await self.ranges_report(_FLAGS[raw]))

    async def ui(self, request: web.Request) -> web.Response:
        # Never inside another site's frame: its buttons delete, trim and drain, and a
        # cluster without tokens would take a click lured through an invisible frame.
        return web.Response(text=CONSOLE_HTML, content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-store", "X-Frame-Options": "DENY",
                                     "Content-Security-Policy": "frame-ancestors 'none'"})
