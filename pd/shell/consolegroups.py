"""The web console's consumer groups (Kafka's and ``client.subscribe``'s): the markup and
script of its "Consumer groups" section, joined into the page by
:mod:`pd.shell.consolepage` after :mod:`pd.shell.consolescript` (whose helpers it uses).

The list is ``GET /v1/groups`` (name order, at most :data:`shown_groups_max` rows, the
rest counted); a group opened shows ``GET /v1/groups/{name}``: its members with the
streams each reads, its committed offsets with each stream's end and lag, and the total
lag. Both are asked again every 2 s, one group described at a time.

Side effects: none (constants).
"""

from __future__ import annotations

from typing import Final

shown_groups_max: Final = 200  # rows of the groups table; the rest are counted

GROUPS_HTML: Final = """
<h2>Consumer groups</h2><div id="groups"></div><div id="groups-status" class="muted"></div>
<div id="group-detail" class="hidden">
  <h3>Group <span id="group-name"></span> <button id="group-close">close</button></h3>
  <div id="group-summary"></div>
  <h3>Members</h3><div id="group-members"></div>
  <h3>Committed offsets and lag</h3><div id="group-offsets"></div>
</div>
"""

GROUPS_SCRIPT: Final = """
// -- consumer groups -----------------------------------------------------------------------
const GROUPS_SHOWN_MAX = """ + str(shown_groups_max) + """;
state.group = null;
function renderGroups(groups) {
  const sorted = groups.slice().sort((a, b) => (a.group < b.group ? -1 : 1));
  const rows = sorted.slice(0, GROUPS_SHOWN_MAX).map((g) => [
    '<a href="#" data-group="' + esc(g.group) + '">' + esc(g.group) + "</a>",
    esc(g.state), esc(g.protocol_type), esc(g.members)]);
  const more = sorted.length > GROUPS_SHOWN_MAX
    ? '<div class="muted">' + (sorted.length - GROUPS_SHOWN_MAX) + " more groups</div>" : "";
  $("groups").innerHTML = rows.length
    ? table(["group", "state", "protocol type", "members"], rows, "groups-table") + more
    : '<span class="muted" id="groups-none">no consumer groups</span>';
  document.querySelectorAll("[data-group]").forEach((a) => a.addEventListener("click", (e) => {
    e.preventDefault(); openGroup(a.dataset.group);
  }));
}
function openGroup(name) {
  state.group = name;
  $("group-name").textContent = name;
  $("group-detail").classList.remove("hidden");
  loadGroup().catch((e) => { $("groups-status").textContent = String(e.message || e); });
}
$("group-close").addEventListener("click", () => {
  state.group = null; $("group-detail").classList.add("hidden");
});
async function loadGroup() {
  if (!state.group) return;
  const g = await getJson("/v1/groups/" + encodeURIComponent(state.group));
  const offsets = g.offsets || [];
  const total = offsets.reduce((sum, o) => sum + (o.lag || 0), 0);
  $("group-summary").innerHTML = '<span id="group-state">' + esc(g.state) + "</span>, " +
    "protocol " + esc(g.protocol_type) + "/" + esc(g.protocol) + ", generation " +
    esc(g.generation) + ", leader " + esc(g.leader) + ', total lag <b id="group-lag">' +
    total + "</b>";
  $("group-members").innerHTML = table(["member", "client", "host", "streams"],
    (g.members || []).map((m) => [esc(m.member), esc(m.client_id), esc(m.client_host),
      esc((m.streams || []).join(", "))]), "group-members-table");
  $("group-offsets").innerHTML = table(["stream", "committed offset", "end", "lag"],
    offsets.map((o) => [esc(o.stream), esc(o.offset), esc(o.end),
      o.lag > 0 ? '<span class="warn">' + esc(o.lag) + "</span>" : esc(o.lag)]),
    "group-offsets-table");
}
let groupsRefreshing = false;
async function refreshGroups() {
  if (groupsRefreshing) return;
  groupsRefreshing = true;
  try {
    renderGroups((await getJson("/v1/groups")).groups || []);
    await loadGroup();
    $("groups-status").textContent = "";
  } catch (e) {
    $("groups-status").innerHTML = '<span class="bad">' + esc(String(e.message || e)) +
      "</span>";
  }
  groupsRefreshing = false;
}
refreshGroups();
setInterval(refreshGroups, 2000);
"""
