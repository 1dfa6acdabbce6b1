"""The web console's page (``GET /ui``): one self-contained HTML document.

Vanilla JavaScript and CSS inline, no build step, nothing fetched from outside the node
(every request is to the same origin's JSON API; charts are inline SVG). The markup and
style are here, the script in :mod:`pd.shell.consolescript`. What the page shows: a health
banner, charts of the last hour (``GET /v1/samples``), PD nodes, range servers with drain,
under-replicated and skipped ranges, consumer groups with their members, offsets and lag
(:mod:`pd.shell.consolegroups`), streams (searched, paged) with their detail, cursors,
retention, trim, delete, a record browser, and create stream. Writes send the token typed
in (``Authorization: Bearer``); destructive ones ask for confirmation first.

Side effects: none (a constant).
"""

from __future__ import annotations

from typing import Final

from pd.shell.consolegroups import GROUPS_HTML, GROUPS_SCRIPT
from pd.shell.consolescript import CONSOLE_SCRIPT

_PAGE_HEAD: Final = """<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>estream console</title>
<style>
  body { font: 14px/1.4 system-ui, sans-serif; margin: 1.2em 1.5em; color: #1d2330; }
  h1 { font-size: 20px; margin: 0 0 .3em; display: inline-block; margin-right: 1em; }
  h2 { font-size: 16px; margin: 1.3em 0 .4em; }
  h3 { font-size: 14px; margin: 1em 0 .3em; }
  table { border-collapse: collapse; margin-bottom: .5em; }
  td a { white-space: nowrap; }  /* a stream's name stays one link on one line */
  th, td { border-bottom: 1px solid #d8dce4; padding: 3px 10px 3px 0; text-align: left;
           vertical-align: top; }
  th { color: #5a6272; font-weight: 600; }
  .ok { color: #18794e; } .bad { color: #c62a2a; font-weight: 600; } .warn { color: #a35c00; }
  .muted { color: #7a8292; } code, pre { font-size: 12px; }
  pre { margin: 0; white-space: pre-wrap; word-break: break-all; max-width: 60em; }
  button { font: inherit; padding: 1px 8px; }
  input, select { font: inherit; }
  #banner { padding: .5em .8em; border-radius: 4px; margin: .4em 0; font-weight: 600; }
  #banner.healthy { background: #e3f5ea; color: #18794e; }
  #banner.degraded { background: #fdecec; color: #c62a2a; }
  #banner.unknown { background: #fff4e0; color: #8a5a00; }
  #links a { margin-right: 1em; }
  #charts { display: flex; flex-wrap: wrap; gap: 1em; }
  #charts figure { margin: 0; border: 1px solid #d8dce4; padding: 4px 6px; }
  #charts figcaption { font-size: 12px; color: #5a6272; }
  #charts polyline { fill: none; stroke: #2f6fd6; stroke-width: 1.5; }
  #confirm-box { position: fixed; top: 30%; left: 50%; transform: translateX(-50%);
                 background: #fff; border: 2px solid #a35c00; padding: 1em 1.4em;
                 box-shadow: 0 4px 20px rgba(0,0,0,.2); z-index: 10; }
  .hidden { display: none !important; }
  #stream-detail { border-left: 3px solid #2f6fd6; padding-left: 1em; }
  .form span { margin-right: .8em; }
</style>
</head>
<body>
<h1>estream console</h1><span id="links"></span>
<div id="banner">loading...</div>
<div id="status" class="muted">loading...</div>
<div class="muted">admin token (for writes, when the cluster has tokens):
  <input id="token" type="password" autocomplete="off" size="24"></div>
<div id="message"></div>
<div id="confirm-box" class="hidden"><div id="confirm-text"></div><p>
  <button id="confirm-yes">confirm</button> <button id="confirm-no">cancel</button></p></div>

<h2>Last hour (this node's samples)</h2><div id="charts"></div>
<h2>Placement driver</h2><div id="cluster"></div>
<h2>Range servers</h2><div id="servers"></div>
<h2>Under-replicated ranges and repair</h2><div id="repair"></div>
""" + GROUPS_HTML + """
<h2>Streams</h2>
<div class="form">
  <span>search (name prefix) <input id="stream-search" size="20"></span>
  <span>per page <select id="page-size"><option>20</option><option selected>50</option>
    <option>200</option></select></span>
  <button id="streams-prev">&larr; previous</button> <button id="streams-next">next &rarr;</button>
  <span id="streams-page" class="muted"></span>
</div>
<div id="streams"></div>
<h3>Create a stream</h3>
<div class="form">
  <span>name <input id="create-name" size="18"></span>
  <span>replicas <input id="create-replicas" type="number" value="3" min="1"
    style="width:4em"></span>
  <span>ack count <input id="create-ack" type="number" value="2" min="1" style="width:4em"></span>
  <span>retention ms <input id="create-retention-ms" type="number" min="1" style="width:9em"></span>
  <span>digest <select id="create-digest"><option>xxh3</option><option>crc32c</option>
    <option>hmac-sha256</option></select></span>
  <button id="create-go">create</button>
</div>

<div id="stream-detail" class="hidden">
  <h2>Stream <span id="detail-name"></span> <button id="detail-close">close</button></h2>
  <div id="detail-recreated" class="bad"></div>
  <div id="detail-figures"></div>
  <h3>Retention, trim, delete</h3>
  <div class="form">
    <span>retention ms <input id="retention-ms" type="number" min="1" style="width:9em"></span>
    <span>retention bytes <input id="retention-bytes" type="number" min="1"
      style="width:9em"></span>
    <button id="retention-save">save retention</button>
    <span>trim to offset <input id="trim-offset" type="number" min="0" style="width:7em"></span>
    <button id="trim-go">trim</button>
    <button id="delete-stream">delete stream</button>
  </div>
  <h3>Ranges</h3><div id="detail-ranges"></div>
  <h3>Cursors</h3><div id="detail-cursors"></div>
  <h3>Records</h3>
  <div class="form">
    <span>from offset <input id="browse-offset" type="number" min="0" style="width:7em"></span>
    <span>or time <input id="browse-time" size="22" placeholder="ISO 8601 or ms"></span>
    <span>limit <input id="browse-limit" type="number" value="20" min="1" max="100"
      style="width:4em"></span>
    <span>value as <select id="browse-format"><option>text</option><option>json</option>
      <option>hex</option></select></span>
    <button id="browse-go">read</button> <button id="browse-more">more &rarr;</button>
  </div>
  <div id="records"></div>
</div>

<script>
"""

_PAGE_TAIL: Final = """</script>
</body>
</html>
"""


CONSOLE_HTML: Final = _PAGE_HEAD + CONSOLE_SCRIPT + GROUPS_SCRIPT + _PAGE_TAIL
