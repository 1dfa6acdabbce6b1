"""The web console's script (:mod:`pd.shell.consolepage` puts it inside its ``<script>``):
vanilla JavaScript that fetches the node's JSON API every 2 s and renders the page.

Side effects: none (a constant).
"""

from __future__ import annotations

from typing import Final

CONSOLE_SCRIPT: Final = """"use strict";
const $ = (id) => document.getElementById(id);
const tokenBox = $("token");
tokenBox.value = sessionStorage.getItem("estream-token") || "";
tokenBox.addEventListener("change", () => sessionStorage.setItem("estream-token", tokenBox.value));
const state = {stream: null, streamId: null, seenId: null, pages: [], after: null, next: null,
               rates: {}, browsed: null, records: [], health: {}, answered: null};

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
function iso(ms) { return typeof ms === "number" ? new Date(ms).toISOString() : "-"; }
function duration(ms) {
  if (typeof ms !== "number") return "none";
  const units = [["d", 86400000], ["h", 3600000], ["min", 60000], ["s", 1000]];
  for (const [u, n] of units) if (ms >= n && ms % n === 0) return (ms / n) + " " + u;
  return ms + " ms";
}
function table(columns, rows, id) {
  const head = "<tr>" + columns.map((c) => "<th>" + esc(c) + "</th>").join("") + "</tr>";
  const body = rows.map((r) => "<tr>" + r.map((c) => "<td>" + c + "</td>").join("") + "</tr>");
  return "<table" + (id ? ' id="' + id + '"' : "") + ">" + head + body.join("") + "</table>";
}
function authHeaders() {
  const headers = {};
  if (tokenBox.value) headers["Authorization"] = "Bearer " + tokenBox.value;
  return headers;
}
async function getJson(path) {
  let response, body;
  try {
    response = await fetch(path, {headers: authHeaders(), cache: "no-store"});
    body = await response.json();
  } catch (e) {
    throw new Error(path + ": this node does not answer (" + String(e.message || e) + ")");
  }
  if (!response.ok) throw new Error(path + ": " + ((body.error || {}).message || response.status));
  return body;
}
function say(text, ok) {
  $("message").innerHTML = '<span class="' + (ok ? "ok" : "bad") + '" id="message-text">' +
    esc(text) + "</span>";
}
async function write(method, path, body, done) {
  const headers = authHeaders();
  headers["Content-Type"] = "application/json";  // every write is JSON (pd/crosssite.py)
  try {
    const response = await fetch(path, {method, headers,
      body: body === undefined ? undefined : JSON.stringify(body)});
    const answer = await response.json();
    if (!response.ok) {
      say(method + " " + path + ": " + ((answer.error || {}).message || response.status), false);
    } else {
      say(done, true);
    }
  } catch (e) { say(String(e.message || e), false); }
  refresh();
}
let pending = null;
function confirmThen(text, action) {
  pending = action;
  $("confirm-text").textContent = text;
  $("confirm-box").classList.remove("hidden");
}
$("confirm-yes").addEventListener("click", () => {
  $("confirm-box").classList.add("hidden");
  const action = pending; pending = null;
  if (action) action();
});
$("confirm-no").addEventListener("click", () => {
  $("confirm-box").classList.add("hidden"); pending = null; say("cancelled", true);
});

// -- health, links, charts -----------------------------------------------------------------
// The banner speaks only for this refresh: a part that failed (this node down, say) shows
// as unknown, never as the last healthy answer.
function renderBanner(failed) {
  const h = state.health;
  if (failed) {
    $("banner").className = "unknown";
    $("banner").textContent = "UNKNOWN: " + failed +
      (state.answered ? "; last full answer at " + state.answered : "");
    return;
  }
  if (!h.cluster || !h.servers || !h.repair) return;
  const nodes = h.cluster.nodes || [];
  const reachable = nodes.filter((n) => n.reachable).length;
  const alive = h.servers.filter((s) => s.alive).length;
  const under = (h.repair.repair || {}).under_replicated || 0;
  const leader = h.cluster.leader;
  const problems = [];
  if (!leader) problems.push("no leader");
  if (reachable < nodes.length) {
    problems.push((nodes.length - reachable) + " PD node(s) unreachable");
  }
  if (alive < h.servers.length) problems.push((h.servers.length - alive) +
    " range server(s) down: " +
    h.servers.filter((s) => !s.alive).map((s) => s.address).join(", "));
  if (under) problems.push(under + " range(s) under-replicated");
  const summary = "leader " + (leader ? leader.id : "none") + "; PD nodes reachable " + reachable +
    "/" + nodes.length + "; range servers alive " + alive + "/" + h.servers.length + "; " +
    under + " under-replicated";
  $("banner").className = problems.length ? "degraded" : "healthy";
  $("banner").textContent = (problems.length ? "DEGRADED: " + problems.join("; ")
                                              : "HEALTHY") + " (" + summary + ")";
}
// A node listening on every interface (0.0.0.0, ::) is reached at the host this page came
// from, as the CLI does (estream/cli/admin.py).
function reachable(http) {
  const h = http || "", colon = h.lastIndexOf(":");
  return ["0.0.0.0", "[::]", "::"].includes(h.slice(0, colon))
    ? location.hostname + h.slice(colon) : http;
}
function renderLinks(c) {
  const leader = (c.nodes || []).find((n) => c.leader && n.id === c.leader.id);
  const me = (c.nodes || []).find((n) => reachable(n.http) === location.host);
  let leaderLink = '<span id="leader-link" class="muted">leader unknown</span>';
  if (leader && me && me.id === leader.id) {
    leaderLink = '<span id="leader-link" class="muted">this node is the leader</span>';
  } else if (leader && leader.http) {
    const http = reachable(leader.http);
    leaderLink = '<a id="leader-link" href="' + esc(location.protocol + "//" + http +
      "/ui") + '">leader\\'s console (' + esc(http) + ")</a>";
  }
  $("links").innerHTML = leaderLink + '<a id="openapi-link" href="/v1/openapi.json">OpenAPI</a>' +
    '<a id="metrics-link" href="/metrics">metrics</a>';
}
const CHARTS = [["bytes_stored", "bytes stored", bytes, false],
  ["bytes_stored", "stored bytes/s (append rate)", (v) => bytes(v) + "/s", true],
  ["ranges", "ranges", String, false],
  ["under_replicated", "under-replicated ranges", String, false],
  ["commit_index", "Raft commits/s", (v) => v.toFixed(1), true],
  ["commit_ms", "Raft commit latency ms", (v) => v.toFixed(2), false],
  ["cursor_lag_max", "largest cursor lag (records; the leader measures)", String, false]];
function series(samples, key, rate) {
  const points = [];
  for (let i = 0; i < samples.length; i++) {
    const s = samples[i];
    if (typeof s[key] !== "number") continue;
    if (!rate) { points.push([s.at_ms, s[key]]); continue; }
    const p = samples[i - 1];
    if (p && typeof p[key] === "number" && s.at_ms > p.at_ms) {
      points.push([s.at_ms, Math.max(0, (s[key] - p[key]) * 1000 / (s.at_ms - p.at_ms))]);
    }
  }
  return points;
}
function renderCharts(body) {
  const samples = body.samples || [];
  const now = Date.now(), from = now - 3600000, w = 260, h = 60;
  $("charts").innerHTML = CHARTS.map(([key, title, fmt, rate]) => {
    const points = series(samples, key, rate);
    const top = points.length ? Math.max(...points.map((p) => p[1])) : 0;
    const xy = points.map((p) => [((p[0] - from) / 3600000 * w).toFixed(1),
      (h - 3 - (top > 0 ? p[1] / top : 0) * (h - 8)).toFixed(1)]);
    const line = xy.map((p) => p[0] + "," + p[1]).join(" ");
    const dot = xy.length ? '<circle r="2.5" fill="#2f6fd6" cx="' + xy[xy.length - 1][0] +
      '" cy="' + xy[xy.length - 1][1] + '"/>' : "";
    const last = points.length ? fmt(points[points.length - 1][1]) : "no samples yet";
    return '<figure data-series="' + esc(key + (rate ? "-rate" : "")) + '"><figcaption>' +
      esc(title) + ": <b>" + esc(last) + "</b> (max " + esc(points.length ? fmt(top) : "-") +
      ')</figcaption><svg width="' + w + '" height="' + h + '" viewBox="0 0 ' + w + " " + h +
      '"><rect width="' + w + '" height="' + h + '" fill="#f6f8fb"/><polyline points="' +
      line + '"/>' + dot + "</svg></figure>";
  }).join("") + '<div class="muted" id="samples-count">' + samples.length + " samples, one every " +
    esc(body.interval_s) + " s</div>";
}

// -- cluster, servers, repair --------------------------------------------------------------
function renderCluster(c) {
  state.health.cluster = c;
  renderLinks(c);
  const leader = c.leader || {};
  const rows = (c.nodes || []).map((n) => [
    esc(n.id), esc(n.address), esc(n.http), n.role === "leader" ? "<b>leader</b>" : esc(n.role),
    n.reachable ? '<span class="ok">yes</span>' : '<span class="bad">no</span>']);
  $("cluster").innerHTML = '<div id="leader">leader: ' +
    (c.leader ? "<b>" + esc(leader.id) + "</b> at " + esc(leader.address)
              : '<span class="bad">none</span>') + " (term " + esc(c.term) + ")</div>" +
    table(["id", "address", "http", "role", "reachable"], rows, "pd-nodes");
}
function drain(server, cancel) {
  const path = "/v1/rangeservers/" + encodeURIComponent(server.id) + "/drain";
  if (cancel) {
    write("DELETE", path, undefined, "drain of " + server.address + " cancelled");
    return;
  }
  const outlook = server.drain || {};
  confirmThen("Drain range server " + server.address + " (" + server.id + ")? " +
    "Every replica moves " +
    "off it." + (outlook.can_finish === false ? " Warning: " + outlook.reason : ""),
    () => write("POST", path, undefined, "draining " + server.address));
}
function renderServers(details) {
  state.health.servers = details;
  const rows = details.map((s) => {
    const load = s.load || {};
    const st = s.state || "active";
    const cls = st === "active" ? "ok" : (st === "drained" ? "muted" : "warn");
    const button = st === "active"
      ? '<button data-drain="' + esc(s.id) + '">drain</button>'
      : '<button data-undrain="' + esc(s.id) + '">cancel drain</button>';
    const outlook = s.drain || {};
    const drainText = st === "draining" ? esc(s.replicas) + " replicas left" +
        (outlook.can_finish === false
          ? '; <span class="bad">' + esc(outlook.reason) + "</span>" : "")
      : st === "drained" ? "drained" : outlook.can_finish === false
        ? '<span class="bad">' + esc(outlook.reason) + "</span>"
        : (outlook.needs_servers !== undefined ? "a drain can finish" : "-");
    return ['<code>' + esc(s.id) + '</code>', esc(s.address),
      s.alive ? '<span class="ok">alive</span>' : '<span class="bad">down</span>',
      '<span class="' + cls + '">' + esc(st) + "</span>", esc(s.replicas),
      esc(s.open_ranges), esc(s.storage_class), bytes(load.bytes), bytes(load.free_bytes),
      button, drainText];
  });
  $("servers").innerHTML = table(["id", "address", "alive", "state", "replicas",
    "open ranges", "class", "stored", "free", "", "drain"], rows, "rangeservers");
  const byId = Object.fromEntries(details.map((s) => [s.id, s]));
  document.querySelectorAll("[data-drain]").forEach((b) =>
    b.addEventListener("click", () => drain(byId[b.dataset.drain], false)));
  document.querySelectorAll("[data-undrain]").forEach((b) =>
    b.addEventListener("click", () => drain(byId[b.dataset.undrain], true)));
}
function renderRepair(r) {
  state.health.repair = r;
  const repair = r.repair || {};
  const rows = (r.ranges || []).map((x) => [esc(x.stream), esc(x.index),
    esc(x.start) + " .. " + esc(x.end), esc(x.state), esc(x.healthy) + "/" + esc(x.wanted),
    x.replicas.map((p) => "<code>" + esc(p.id) + "</code> " + esc(p.address || "") + " " +
      esc(p.health) + (p.reason ? " (" + esc(p.reason) + ")" : "")).join("<br>"),
    x.repairing ? '<span class="warn">repairing</span>' : (x.reason ? esc(x.reason) : "")]);
  $("repair").innerHTML = '<div id="repair-summary">' + esc(repair.under_replicated) +
    " under-replicated; repairs in progress " + esc(repair.in_progress) + ", planned " +
    esc(repair.planned) + ", deferred " + esc(repair.deferred) +
    (repair.draining && repair.draining.length ? "; draining " +
      repair.draining.map(esc).join(", ") : "") +
    (repair.leader ? "" : " (this node is not the leader, which repairs: the leader's console, " +
      "linked above, shows repair progress)") + "</div>" +
    (rows.length ? table(["stream", "range", "offsets", "state", "healthy", "replicas", ""],
      rows, "under-replicated") : "") +
    ((repair.skipped || []).length ? table(["stream", "range", "repair skips it because",
      "replicas as judged"], repair.skipped.map((x) => [esc(x.stream), esc(x.index),
      esc(x.reason), (x.replicas || []).map(esc).join("<br>")]), "repair-skipped") : "") +
    (repair.skipped_omitted ? '<div id="repair-skipped-omitted">and ' +
      esc(repair.skipped_omitted) + " more ranges skipped</div>" : "");
}

// -- streams -------------------------------------------------------------------------------
function tiers(s) {
  const counts = {};
  for (const r of s.ranges || []) counts[r.tier || "local"] = (counts[r.tier || "local"] || 0) + 1;
  const split = Object.keys(counts).sort().map((t) => counts[t] + " " + t).join(", ") || "-";
  const shown = (s.ranges || []).length;  // (the answer holds the last ranges only)
  return s.ranges_omitted ? split + " of the last " + shown + " (" + (shown + s.ranges_omitted)
    + " ranges)" : split;
}
function retention(s) {
  const parts = [];
  if (typeof s.retention_ms === "number") parts.push(duration(s.retention_ms));
  if (typeof s.retention_bytes === "number") parts.push(bytes(s.retention_bytes));
  return parts.join(", ") || "none";
}
function rate(s) {
  if (typeof s.records !== "number") return "-";
  const now = Date.now(), last = state.rates[s.name];
  state.rates[s.name] = {t: now, records: s.records, rate: last ? last.rate : null};
  if (last && now - last.t >= 1000) {
    state.rates[s.name].rate = Math.max(0, (s.records - last.records) * 1000 / (now - last.t));
  }
  const r = state.rates[s.name].rate;
  return typeof r === "number" ? r.toFixed(1) + "/s" : "-";
}
function before(text) {  // a name just below every name starting with text
  return text.slice(0, -1) + String.fromCharCode(text.charCodeAt(text.length - 1) - 1) + "\\uffff";
}
async function loadStreams() {
  const prefix = $("stream-search").value.trim();
  const size = Number($("page-size").value);
  let after = state.after;
  if (after === null && prefix) after = before(prefix);
  const body = await getJson("/v1/streams?limit=" + size +
    (after === null ? "" : "&after=" + encodeURIComponent(after)));
  let list = body.streams || [];
  let next = body.next === undefined ? undefined : body.next;
  if (next === undefined) {  // an API without paging: every stream, paged here
    list = list.filter((s) => after === null || s.name > after)
      .sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    next = list.length > size ? list[size - 1].name : null;
    list = list.slice(0, size);
  }
  if (prefix) {
    const kept = list.filter((s) => s.name.startsWith(prefix));
    if (kept.length < list.length && list.length && list[list.length - 1].name > prefix) {
      next = null;
    }
    list = kept;
  }
  state.next = next;
  renderStreams(list);
}
function renderStreams(streams) {
  const rows = streams.map((s) => [
    '<a href="#" data-stream="' + esc(s.name) + '">' + esc(s.name) + "</a>",
    esc(s.end_offset), esc(s.records), bytes(s.bytes), rate(s), iso(s.first_timestamp),
    iso(s.last_timestamp), esc(retention(s)), esc(s.epoch), esc(tiers(s)),
    esc(s.replicas) + "/" + esc(s.ack_count) +
    (s.ensemble > s.replicas ? " of " + esc(s.ensemble) : "")]);
  $("streams").innerHTML = table(["stream", "end offset", "records", "bytes", "append rate",
    "first record", "last record", "retention", "epoch (writer)", "ranges by tier",
    "replicas/acks (of ensemble)"], rows, "streams-table");
  $("streams-page").textContent = "page " + (state.pages.length + 1) + ", " + streams.length +
    " streams shown" + (state.next ? "" : " (last page)");
  $("streams-next").disabled = !state.next;
  $("streams-prev").disabled = !state.pages.length;
  document.querySelectorAll("[data-stream]").forEach((a) => a.addEventListener("click", (e) => {
    e.preventDefault(); openStream(a.dataset.stream);
  }));
}
$("stream-search").addEventListener("input", () => {
  state.pages = []; state.after = null; refresh();
});
$("page-size").addEventListener("change", () => {
  state.pages = []; state.after = null; refresh();
});
$("streams-next").addEventListener("click", () => {
  if (!state.next) return;
  state.pages.push(state.after); state.after = state.next; refresh();
});
$("streams-prev").addEventListener("click", () => {
  if (!state.pages.length) return;
  state.after = state.pages.pop(); refresh();
});
$("create-go").addEventListener("click", () => {
  const name = $("create-name").value.trim();
  const body = {name, replicas: Number($("create-replicas").value),
                ack_count: Number($("create-ack").value)};
  if ($("create-retention-ms").value) body.retention_ms = Number($("create-retention-ms").value);
  if ($("create-digest").value !== "xxh3") body.digest = $("create-digest").value;
  write("POST", "/v1/streams", body, "created stream " + name);
});

// -- one stream ----------------------------------------------------------------------------
const streamPath = () => "/v1/streams/" + encodeURIComponent(state.stream);
function openStream(name) {
  state.stream = name; state.streamId = null;
  state.records = []; state.browsed = null;
  $("records").innerHTML = "";
  $("detail-name").textContent = name;
  $("stream-detail").classList.remove("hidden");
  $("retention-ms").value = ""; $("retention-bytes").value = "";
  loadDetail(true);
  $("stream-detail").scrollIntoView();
}
$("detail-close").addEventListener("click", () => {
  state.stream = null; $("stream-detail").classList.add("hidden");
});
function holding(s, r, p) {  // a striped range: how much of it position p holds (layout)
  const e = s.ensemble || 0, n = s.replicas || 0;
  if (!(e > n)) return "";
  if (typeof r.batches !== "number") return " (" + n + "/" + e + ")";
  let held = Math.floor(r.batches / e) * n;
  for (let k = 0; k < r.batches % e; k++) if (((p - k) % e + e) % e < n) held++;
  return " (" + held + "/" + r.batches + " batches)";
}
async function loadDetail(fill) {
  if (!state.stream) return;
  const [s, c] = await Promise.all([getJson(streamPath()), getJson(streamPath() + "/cursors")]);
  // The page acts on the incarnation it opened: a name deleted and created again since is
  // another stream, which the delete below (guarded by this id) refuses to touch.
  if (fill || state.streamId === null) state.streamId = s.id;
  state.seenId = s.id;
  $("detail-recreated").textContent = s.id === state.streamId ? "" : "The stream opened here " +
    "(id " + state.streamId + ") was deleted; " + state.stream + " is now another stream (id " +
    s.id + "). Close and open it again to act on that one.";
  $("detail-figures").innerHTML = '<div id="detail-summary">end offset ' + esc(s.end_offset) +
    ", start offset " + esc(s.start_offset) + ", records " + esc(s.records) + ", " +
    bytes(s.bytes) + ", epoch " + esc(s.epoch) + ", retention " + esc(retention(s)) +
    ", digest " + esc(s.digest || "xxh3") + ", first " + iso(s.first_timestamp) + ", last " +
    iso(s.last_timestamp) + "</div>";
  if (fill) {
    $("retention-ms").value = typeof s.retention_ms === "number" ? s.retention_ms : "";
    $("retention-bytes").value = typeof s.retention_bytes === "number" ? s.retention_bytes : "";
  }
  const ranges = (s.ranges || []).slice(-200);
  $("detail-ranges").innerHTML = ((s.ranges || []).length > ranges.length
    ? '<div class="muted">the last 200 of ' + s.ranges.length + " ranges</div>" : "") +
    table(["range", "start", "end", "state", "tier", "replicas"], ranges.map((r) => [
      esc(r.index), esc(r.start), esc(r.end), esc(r.state), esc(r.tier || "local"),
      (r.replicas || []).map((p, i) => "<code>" + esc(p.id) + "</code> " + esc(p.address) +
        esc(holding(s, r, i))).join("<br>")
    ]), "ranges-table");
  $("detail-cursors").innerHTML = (c.cursors || []).length
    ? table(["cursor", "offset", "lag", "reset to offset"], c.cursors.map((x) => [
      esc(x.cursor), esc(x.offset), esc(x.lag), '<input type="number" min="0" style="width:7em" ' +
      'data-cursor-input="' + esc(x.cursor) + '"> <button data-cursor-reset="' + esc(x.cursor) +
      '">reset</button>']), "cursors-table")
    : '<div class="muted" id="cursors-table">no cursors</div>';
  document.querySelectorAll("[data-cursor-reset]").forEach((b) => b.addEventListener("click",
      () => {
    if (recreated()) return;
    const cursor = b.dataset.cursorReset;
    const input = document.querySelector('[data-cursor-input="' + CSS.escape(cursor) + '"]');
    const offset = Number(input.value);
    confirmThen("Reset cursor " + cursor + " of " + state.stream + " to offset " + offset + "?",
      () => write("POST", streamPath() + "/cursors", {cursor, offset},
                  "cursor " + cursor + " reset to " + offset));
  }));
}
function recreated() {  // the name now holds another stream than the one opened here
  if (state.seenId === state.streamId) return false;
  say(state.stream + " was deleted and created again since it was opened here: open it again",
      false);
  return true;
}
function optionalNumber(id) {
  const v = $(id).value.trim();
  return v === "" ? null : Number(v);
}
$("retention-save").addEventListener("click", () => {
  if (recreated()) return;
  const body = {retention_ms: optionalNumber("retention-ms"),
                retention_bytes: optionalNumber("retention-bytes")};
  confirmThen("Set the retention of " + state.stream + " to " + duration(body.retention_ms) +
    " and " + (body.retention_bytes === null ? "no byte limit" : bytes(body.retention_bytes)) +
    "? Older records are then trimmed.",
    () => write("PATCH", streamPath(), body, "retention of " + state.stream + " saved"));
});
$("trim-go").addEventListener("click", () => {
  if (recreated()) return;
  const offset = Number($("trim-offset").value);
  confirmThen("Trim " + state.stream + " to offset " + offset + "? Records below it are deleted.",
    () => write("POST", streamPath() + "/trim", {start_offset: offset},
                state.stream + " trimmed to " + offset));
});
$("delete-stream").addEventListener("click", () => {
  const name = state.stream, id = state.streamId;
  if (id === null) { say("the stream is still loading", false); return; }
  confirmThen("Delete stream " + name + " and every record in it?", async () => {
    await write("DELETE", streamPath() + "?id=" + id, undefined, "deleted stream " + name);
    state.stream = null; $("stream-detail").classList.add("hidden");
  });
});

// -- record browser ------------------------------------------------------------------------
function decodeBase64(b64) {
  const raw = atob(b64);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}
function showValue(r, format) {
  if (format === "hex") {
    return Array.from(decodeBase64(r.value), (b) => b.toString(16).padStart(2, "0")).join(" ");
  }
  if (r.text === null) return "(not UTF-8: " + r.size + " bytes; view as hex)";
  if (format === "json") {
    try { return JSON.stringify(JSON.parse(r.text), null, 2); }
    catch (e) { return "(not JSON) " + r.text; }
  }
  return r.text;
}
function renderRecords() {
  const format = $("browse-format").value;
  const b = state.browsed;
  $("records").innerHTML = (b ? '<div class="muted" id="records-summary">' + state.records.length +
    " records from offset " + esc(b.offset) + " (stream starts at " + esc(b.start_offset) +
    ")</div>" : "") +
    table(["offset", "timestamp", "headers", "value"], state.records.map((r) => [
      esc(r.offset), esc(iso(r.timestamp)),
      Object.entries(r.headers).map(([k, v]) => esc(k) + "=" + esc(v)).join("<br>"),
      "<pre>" + esc(showValue(r, format)) + "</pre>"]), "records-table");
}
async function browse(more) {
  const limit = Number($("browse-limit").value) || 20;
  let query = "limit=" + limit;
  if (more && state.browsed && state.browsed.next !== null) {
    query += "&offset=" + state.browsed.next;
  } else if ($("browse-time").value.trim()) {
    const t = $("browse-time").value.trim();
    const ms = /^[0-9]+$/.test(t) ? Number(t) : Date.parse(t);
    if (Number.isNaN(ms)) { say("not a time: " + t, false); return; }
    query += "&timestamp=" + ms;
  } else if ($("browse-offset").value.trim()) {
    query += "&offset=" + Number($("browse-offset").value);
  }
  try {
    const answer = await getJson(streamPath() + "/records?" + query);
    state.records = more ? state.records.concat(answer.records) : answer.records;
    state.browsed = answer;
    renderRecords();
  } catch (e) { say(String(e.message || e), false); }
}
$("browse-go").addEventListener("click", () => browse(false));
$("browse-more").addEventListener("click", () => browse(true));
$("browse-format").addEventListener("change", renderRecords);

// -- refresh -------------------------------------------------------------------------------
let refreshing = false;
async function refresh() {
  if (refreshing) return;
  refreshing = true;
  const parts = [["/v1/cluster", renderCluster],
    ["/v1/rangeservers", (b) => renderServers(b.rangeservers || [])],
    ["/v1/ranges?under_replicated=1", renderRepair],
    ["/v1/samples", renderCharts]];
  const errors = [];
  await Promise.all(parts.map(async ([path, render]) => {
    try { await render(await getJson(path)); } catch (e) { errors.push(String(e.message || e)); }
  }).concat([loadStreams().catch((e) => errors.push(String(e.message || e))),
             loadDetail(false).catch((e) => errors.push(String(e.message || e)))]));
  const failed = errors.find((e) => ["/v1/cluster", "/v1/rangeservers", "/v1/ranges?"].some(
    (path) => e.startsWith(path)));
  if (errors.length === 0) state.answered = new Date().toLocaleTimeString();
  renderBanner(failed);
  $("status").innerHTML = errors.length
    ? '<span class="bad">' + errors.map(esc).join("; ") + "</span>"
    : 'updated <span id="updated">' + esc(new Date().toLocaleTimeString()) + "</span>";
  refreshing = false;
}
refresh();
setInterval(refresh, 2000);
"""
