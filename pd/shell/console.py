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
- ``GET /ui``: one static HTML page (no external assets, vanilla JavaScript over the JSON
  API above, refreshed every 2 s): the PD nodes and leader, the range servers (state,
  liveness, replicas, load, a drain button), the streams and their ranges, the ranges
  needing repair. Writes from the page send the bearer token typed into it (kept in the
  tab's session storage), as the API needs one when the node has tokens.

Side effects: none of its own (the HTTP server is :mod:`pd.shell.http`'s).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Final

from aiohttp import web

from estream.wire.errors import InvalidArgument, Unavailable
from pd.shell.service import PdService

RangesReport = Callable[[bool], Awaitable[dict[str, Any]]]
_FLAGS: Final = {"1": True, "true": True, "0": False, "false": False}


def add_operator_routes(
    app: web.Application, service: PdService, ranges_report: RangesReport | None
) -> None:
    """Add the routes of the module docstring to ``app``."""
    views = _OperatorViews(service, ranges_report)
    app.router.add_get("/v1/rangeservers/{id}", views.describe)
    app.router.add_delete("/v1/rangeservers/{id}", views.forget)
    app.router.add_post("/v1/rangeservers/{id}/drain", views.drain)
    app.router.add_delete("/v1/rangeservers/{id}/drain", views.undrain)
    app.router.add_post("/v1/rangeservers/{id}/forget", views.forget)
    app.router.add_get("/v1/ranges", views.ranges)
    app.router.add_get("/ui", views.ui)


class _OperatorViews:
    def __init__(self, service: PdService, ranges_report: RangesReport | None) -> None:
        self.service = service
        self.ranges_report = ranges_report

    async def describe(self, request: web.Request) -> web.Response:
        return web.json_response((await self.service.server_details(request.match_info["id"]))[0])

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
        return web.Response(text=CONSOLE_HTML, content_type="text/html", charset="utf-8",
                            headers={"Cache-Control": "no-store"})


CONSOLE_HTML: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>estream console</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d2330; }
  h1 { font-size: 20px; margin: 0 0 .2em; }
  h2 { font-size: 16px; margin: 1.4em 0 .4em; }
  table { border-collapse: collapse; margin-bottom: .5em; }
  th, td { border-bottom: 1px solid #d8dce4; padding: 3px 10px 3px 0; text-align: left;
           vertical-align: top; }
  th { color: #5a6272; font-weight: 600; }
  .ok { color: #18794e; } .bad { color: #c62a2a; font-weight: 600; } .warn { color: #a35c00; }
  .muted { color: #7a8292; } code { font-size: 12px; }
  button { font: inherit; padding: 1px 8px; }
  #status { margin: .3em 0; } #token { width: 16em; }
</style>
</head>
<body>
<h1>estream console</h1>
<div id="status" class="muted">loading...</div>
<div class="muted">token for writes (only when the cluster has tokens):
  <input id="token" type="password" autocomplete="off"></div>
<h2>Placement driver</h2><div id="cluster"></div>
<h2>Range servers</h2><div id="servers"></div>
<h2>Under-replicated ranges and repair</h2><div id="repair"></div>
<h2>Streams</h2><div id="streams"></div>
<script>
"use strict";
const $ = (id) => document.getElementById(id);
const tokenBox = $("token");
tokenBox.value = sessionStorage.getItem("estream-token") || "";
tokenBox.addEventListener("change", () => sessionStorage.setItem("estream-token", tokenBox.value));

function esc(v) {
  if (v === null || v === undefined) return "-";
  return String(v).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
    '"': "&quot;", "'": "&#39;"}[c]));
}
function bytes(n) {
  if (typeof n !== "number") return "-";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (Math.abs(n) >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return (i ? n.toFixed(1) : n.toFixed(0)) + " " + units[i];
}
function table(columns, rows, id) {
  const head = "<tr>" + columns.map((c) => "<th>" + esc(c) + "</th>").join("") + "</tr>";
  const body = rows.map((r) => "<tr>" + r.map((c) => "<td>" + c + "</td>").join("") + "</tr>");
  return "<table" + (id ? ' id="' + id + '"' : "") + ">" + head + body.join("") + "</table>";
}
async function getJson(path) {
  const headers = {};
  if (tokenBox.value) headers["Authorization"] = "Bearer " + tokenBox.value;
  const response = await fetch(path, {headers, cache: "no-store"});
  const body = await response.json();
  if (!response.ok) throw new Error(path + ": " + ((body.error || {}).message || response.status));
  return body;
}
async function write(method, path) {
  const headers = {"Content-Type": "application/json"};  // writes are JSON (pd/crosssite.py)
  if (tokenBox.value) headers["Authorization"] = "Bearer " + tokenBox.value;
  const response = await fetch(path, {method, headers});
  const body = await response.json();
  if (!response.ok) alert((body.error || {}).message || ("HTTP " + response.status));
  refresh();
}
function drain(id, cancel) {
  if (cancel || confirm("Drain range server " + id + "? Every replica moves off it.")) {
    write(cancel ? "DELETE" : "POST", "/v1/rangeservers/" + encodeURIComponent(id) + "/drain");
  }
}
function renderCluster(c) {
  const leader = c.leader || {};
  const rows = (c.nodes || []).map((n) => [
    esc(n.id), esc(n.address), esc(n.http), n.role === "leader" ? "<b>leader</b>" : esc(n.role),
    n.reachable ? '<span class="ok">yes</span>' : '<span class="bad">no</span>']);
  $("cluster").innerHTML = '<div id="leader">leader: ' +
    (c.leader ? "<b>" + esc(leader.id) + "</b> at " + esc(leader.address)
              : '<span class="bad">none</span>') + " (term " + esc(c.term) + ")</div>" +
    table(["id", "address", "http", "role", "reachable"], rows, "pd-nodes");
}
function renderServers(list) {
  const rows = list.map((s) => {
    const load = s.load || {};
    const state = s.state || "active";
    const cls = state === "active" ? "ok" : (state === "drained" ? "muted" : "warn");
    const button = state === "active"
      ? '<button data-drain="' + esc(s.id) + '">drain</button>'
      : '<button data-undrain="' + esc(s.id) + '">undrain</button>';
    return ['<code>' + esc(s.id) + '</code>', esc(s.address),
      s.alive ? '<span class="ok">alive</span>' : '<span class="bad">down</span>',
      '<span class="' + cls + '">' + esc(state) + "</span>", esc(s.replicas),
      esc(s.open_ranges), esc(s.storage_class), bytes(load.bytes), bytes(load.free_bytes),
      button];
  });
  $("servers").innerHTML = table(["id", "address", "alive", "state", "replicas",
    "open ranges", "class", "stored", "free", ""], rows, "rangeservers");
  document.querySelectorAll("[data-drain]").forEach((b) =>
    b.addEventListener("click", () => drain(b.dataset.drain, false)));
  document.querySelectorAll("[data-undrain]").forEach((b) =>
    b.addEventListener("click", () => drain(b.dataset.undrain, true)));
}
function renderRepair(r) {
  const repair = r.repair || {};
  const rows = (r.ranges || []).map((x) => [esc(x.stream), esc(x.index),
    esc(x.start) + " .. " + esc(x.end), esc(x.state), esc(x.healthy) + "/" + esc(x.wanted),
    x.replicas.map((p) => "<code>" + esc(p.id) + "</code> " + esc(p.health) +
      (p.reason ? " (" + esc(p.reason) + ")" : "")).join("<br>"),
    x.repairing ? '<span class="warn">repairing</span>' : ""]);
  $("repair").innerHTML = '<div id="repair-summary">' + esc(repair.under_replicated) +
    " under-replicated; repairs in progress " + esc(repair.in_progress) + ", planned " +
    esc(repair.planned) + ", deferred " + esc(repair.deferred) +
    (repair.draining && repair.draining.length ? "; draining " +
      repair.draining.map(esc).join(", ") : "") +
    (repair.leader ? "" : " (this node is not the leader, which repairs: its console shows "
      + "repair progress)") + "</div>" +
    (rows.length ? table(["stream", "range", "offsets", "state", "healthy", "replicas", ""],
      rows, "under-replicated") : "");
}
function renderStreams(streams) {
  const rows = [];
  for (const s of streams) {
    for (const r of s.ranges || []) {
      rows.push([esc(s.name), esc(r.index), esc(r.start), esc(r.end), esc(r.state),
        esc(r.tier || "local"), (r.replicas || []).map((p) => "<code>" + esc(p.id) +
        "</code> " + esc(p.address)).join("<br>")]);
    }
  }
  $("streams").innerHTML = "<div>" + streams.length + " streams</div>" +
    table(["stream", "range", "start", "end", "state", "tier", "replicas"], rows, "streams-table");
}
async function refresh() {
  const parts = [["/v1/cluster", renderCluster],
    ["/v1/rangeservers", (b) => renderServers(b.rangeservers || [])],
    ["/v1/ranges?under_replicated=1", renderRepair],
    ["/v1/streams", (b) => renderStreams(b.streams || [])]];
  const errors = [];
  await Promise.all(parts.map(async ([path, render]) => {
    try { render(await getJson(path)); } catch (e) { errors.push(String(e.message || e)); }
  }));
  $("status").innerHTML = errors.length
    ? '<span class="bad">' + errors.map(esc).join("; ") + "</span>"
    : 'updated <span id="updated">' + esc(new Date().toLocaleTimeString()) + "</span>";
}
refresh();
setInterval(refresh, 2000);
</script>
</body>
</html>
"""
