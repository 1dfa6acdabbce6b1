"""Operating a real cluster (3 PD nodes, 5 range servers): drain, forget, range health,
the web console in headless Chromium, and the CLI's operator commands and fixes.

1. A range server is drained while a writer appends without pause: every sealed replica
   on it is copied elsewhere, the live writer's open range rolls away (keepalive
   ``leave``), the open ranges of a writer-less stream and of a never-written stream are
   rolled by PD; it ends ``drained`` with 0 replicas, no append failed, every
   acknowledged record reads back once, from offset 0; GET /v1/ranges matches its OpenAPI schema.
2. Forget: 409 while it is alive, 200 once it is dead, then 404.
   The PD leader is killed just after a second drain starts: the new leader finishes it
   (the flag is in the Raft catalog) and every record reads back.
3. ``/ui`` in headless Chromium against the API's answers: the DOM after its JavaScript
   ran shows the PD nodes and leader, every range server with its state and load, every
   stream with its epoch and ranges by tier (the console's clicks: test_console.py), the
   repair summary;
   a real ``--screenshot`` decodes to a drawn page (text, state colours, not blank).
4. CLI: ``server list|describe|drain|forget`` with ``--json``; ``append`` sends a line
   while standard input stays open and stops at a line it cannot store; ``read`` starts at
   the first kept offset of a trimmed stream, explains an offset below it, takes ``--from
   -N``; ``--json`` errors are JSON; an HTTP port given as ``--pd`` is named as such.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest

from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from tests.harness.openapi import validate
from tests.pngcheck import colour_stats, decode
from tests.system_tools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.cluster(range_servers=5)]
ROOT = Path(__file__).resolve().parents[2]
drain_timeout_s = 90.0
load_records_max = 50_000  # the load loop stops at this count or when told


def server(cluster: Cluster, server_id: str) -> dict[str, Any]:
    status, body = http_json(cluster.pd_url() + f"/v1/rangeservers/{server_id}")
    assert status == 200, body
    validate("/v1/rangeservers/{id}", "GET", 200, body)
    return body  # type: ignore[no-any-return]


def cli(cluster: Cluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", cluster.pd_addresses, *args],
        input=stdin, capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**os.environ, "COLUMNS": "300"})  # rich tables: no wrapped ids


async def test_drain_under_load_loses_nothing_and_ends_drained(cluster: Cluster) -> None:
    import estream

    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        await client.create_stream("drain-load", replicas=3, ack_count=2)
        await client.create_stream("drain-idle", replicas=3, ack_count=2)
        await client.create_stream("drain-empty", replicas=3, ack_count=2)
        async with await client.open_writer("drain-load") as first:
            for i in range(100):
                await first.append(b"load-%06d" % i)
        async with await client.open_writer("drain-idle") as idle:
            for i in range(20):
                await idle.append(b"idle-%03d" % i)
        writer = await client.open_writer("drain-load")  # recovers: range 0 sealed
        assert (await client.describe_stream("drain-load")).ranges[0].sealed
        open_range = writer.stream.ranges[-1]
        target = open_range.replicas[0].id
        acked: dict[int, bytes] = {}
        failures: list[BaseException] = []
        stop = asyncio.Event()

        async def load() -> None:
            for i in range(100, 100 + load_records_max):
                if stop.is_set():
                    return
                value = b"load-%06d" % i
                try:
                    acked[await writer.append(value)] = value
                except Exception as exc:  # noqa: BLE001 - counted: must stay empty
                    failures.append(exc)
                    return

        task = asyncio.ensure_future(load())
        await asyncio.sleep(1.0)
        status, body = http_json(cluster.pd_url() + f"/v1/rangeservers/{target}/drain", "POST")
        assert status == 200 and body["state"] in ("draining", "drained"), body
        validate("/v1/rangeservers/{id}/drain", "POST", 200, body)
        deadline = time.monotonic() + drain_timeout_s
        while server(cluster, target)["state"] != "drained":
            assert time.monotonic() < deadline, (server(cluster, target), http_json(
                cluster.pd_url() + "/v1/ranges?under_replicated=1")[1])
            assert not failures, failures
            await asyncio.sleep(1.0)
        await asyncio.sleep(1.0)  # appends go on after the drain too
        stop.set()
        await task
        await writer.close()
        assert not failures, failures
        assert len(acked) > 100 and writer.statistics().failed == 0
        detail = server(cluster, target)
        assert detail["replicas"] == 0 and detail["alive"] is True
        for name in ("drain-load", "drain-idle", "drain-empty"):
            meta = await client.describe_stream(name)
            assert all(target not in [r.id for r in rng.replicas] for rng in meta.ranges), meta
        first_values = {i: b"load-%06d" % i for i in range(100)}  # the first writer's
        end = max(acked) + 1
        got: dict[int, bytes] = {}
        async for record in client.read("drain-load", 0, end):
            assert record.offset not in got, f"offset {record.offset} read twice"
            got[record.offset] = bytes(record.value)
        assert list(got) == list(range(end))  # every offset from 0, in order, once
        assert got == first_values | acked  # each acknowledged record, as written
        idle_values = [bytes(r.value) async for r in client.read("drain-idle")]
        assert idle_values == [b"idle-%03d" % i for i in range(20)]
        # New ranges avoid the drained server.
        await client.create_stream("after-drain", replicas=3, ack_count=2)
        placed = (await client.describe_stream("after-drain")).ranges[0].replicas
        assert target not in [r.id for r in placed]
    status, report = http_json(cluster.pd_url() + "/v1/ranges?under_replicated=0")
    assert status == 200
    validate("/v1/ranges", "GET", 200, report)
    assert target in report["repair"]["draining"]
    assert all(target not in [p["id"] for p in r["replicas"]] for r in report["ranges"])
    status, body = http_json(cluster.pd_url() + "/v1/ranges?under_replicated=maybe")
    assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT"


def test_server_cli_commands(cluster: Cluster) -> None:
    listing = cli(cluster, "server", "list", "--json")
    assert listing.returncode == 0, listing.stderr
    servers = json.loads(listing.stdout)["rangeservers"]
    assert len(servers) == 5 and all(s["state"] in ("active", "drained") for s in servers)
    table = cli(cluster, "server", "list")
    assert table.returncode == 0 and servers[0]["id"][:12] in table.stdout
    sid = next(s["id"] for s in servers if s["state"] == "active")
    described = cli(cluster, "server", "describe", sid, "--json")
    assert json.loads(described.stdout)["id"] == sid
    drained = cli(cluster, "server", "drain", sid, "--json")
    assert json.loads(drained.stdout)["state"] in ("draining", "drained")
    back = cli(cluster, "server", "drain", sid, "--cancel", "--json")
    assert back.returncode == 0 and json.loads(back.stdout)["state"] == "active"
    missing = cli(cluster, "server", "describe", "no-such-server", "--json")
    assert missing.returncode == 1
    error = json.loads(missing.stderr)["error"]
    assert error["code"] == "SERVER_NOT_FOUND" and "no-such-server" in error["message"]
    refused = cli(cluster, "server", "forget", sid)
    assert refused.returncode == 1 and "alive" in refused.stderr, refused.stderr


def test_forget_a_dead_server(cluster: Cluster) -> None:
    drained = [s for s in http_json(cluster.pd_url() + "/v1/rangeservers")[1]["rangeservers"]
               if s["state"] == "drained"]
    assert drained, "the drain test leaves one drained server"
    sid = drained[0]["id"]
    status, body = http_json(cluster.pd_url() + f"/v1/rangeservers/{sid}/forget", "POST")
    assert status == 409 and "alive" in body["error"]["message"], body
    cluster.kill9(sid)
    deadline = time.monotonic() + 20
    while server(cluster, sid)["alive"]:
        assert time.monotonic() < deadline
        time.sleep(0.5)
    status, body = http_json(cluster.pd_url() + f"/v1/rangeservers/{sid}", "DELETE")
    assert status == 200 and body == {"forgotten": sid}, body
    status, body = http_json(cluster.pd_url() + f"/v1/rangeservers/{sid}")
    assert status == 404 and body["error"]["code"] == "SERVER_NOT_FOUND"
    ids = [s["id"] for s in http_json(cluster.pd_url() + "/v1/rangeservers")[1]["rangeservers"]]
    assert sid not in ids


async def wait_drained(cluster: Cluster, server_id: str, timeout_s: float) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            status, body = http_json(cluster.pd_url() + f"/v1/rangeservers/{server_id}")
        except OSError:
            status, body = 0, None  # the node we asked just died
        if status == 200 and body["state"] == "drained":
            return body  # type: ignore[no-any-return]
        assert time.monotonic() < deadline, body
        await asyncio.sleep(1.0)


async def test_a_drain_goes_on_after_the_pd_leader_dies(cluster: Cluster) -> None:
    import estream

    async with await estream.connect(cluster.pd_addresses, timeout_s=10.0) as client:
        await client.create_stream("drain-failover", replicas=3, ack_count=2)
        for part in range(2):  # two writers: range 0 sealed by the second one's recovery
            async with await client.open_writer("drain-failover") as writer:
                for i in range(50):
                    await writer.append(b"f-%d-%03d" % (part, i))
        meta = await client.describe_stream("drain-failover")
        target = meta.ranges[0].replicas[0].id
        status, body = http_json(cluster.pd_url() + f"/v1/rangeservers/{target}/drain",
                                 "POST")
        assert status == 200, body
        killed = cluster.kill_pd_leader()
        try:
            drained = await wait_drained(cluster, target, drain_timeout_s)
        finally:
            cluster.restart_pd(killed)
        assert drained["replicas"] == 0
        meta = await client.describe_stream("drain-failover")
        assert all(target not in [r.id for r in rng.replicas] for rng in meta.ranges)
        values = [bytes(r.value) async for r in client.read("drain-failover")]
        assert values == [b"f-%d-%03d" % (p, i) for p in range(2) for i in range(50)]


CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                  "--virtual-time-budget=5000")
console_width, console_height = 1280, 1600


def chromium() -> str:
    """Debian's chromium (a missing one fails in CI, skips elsewhere)."""
    return require_tool("chromium", "chromium-browser", "google-chrome", package="chromium")


def run_chromium(browser: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """One headless Chromium run with a fresh profile (``profile`` must not exist yet)."""
    assert not profile.exists()
    return subprocess.run(
        [browser, *CHROMIUM_FLAGS, f"--user-data-dir={profile}",
         f"--window-size={console_width},{console_height}", *args],
        capture_output=True, text=True, timeout=120, check=False)


class Tables(HTMLParser):
    """The text of every cell of every table with an id: ``tables[id]`` is its rows
    (header row included), ``texts[id]`` the text of any other element with an id."""

    def __init__(self) -> None:
        super().__init__()
        self.tables: dict[str, list[list[str]]] = {}
        self.texts: dict[str, str] = {}
        self._table: str | None = None
        self._cell: list[str] | None = None
        self._open: list[tuple[str, str | None]] = []  # (tag, id) of the open elements

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element_id = dict(attrs).get("id")
        if tag not in ("br", "input", "meta"):
            self._open.append((tag, element_id))
        if element_id:
            self.texts.setdefault(element_id, "")
        if tag == "table" and element_id:
            self._table = element_id
            self.tables[element_id] = []
        elif tag == "tr" and self._table:
            self.tables[self._table].append([])
        elif tag in ("td", "th") and self._table:
            self._cell = []
        elif tag == "br" and self._cell is not None:
            self._cell.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("td", "th") and self._cell is not None and self._table:
            self.tables[self._table][-1].append(" ".join("".join(self._cell).split(" ")))
            self._cell = None
        elif tag == "table":
            self._table = None
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        if self._cell is not None:
            self._cell.append(data)
        for _, element_id in self._open:
            if element_id:
                self.texts[element_id] += data


def rows_by_first_cell(table: list[list[str]]) -> dict[str, list[str]]:
    return {row[0]: row for row in table[1:]}


def test_console_in_headless_chromium(cluster: Cluster, tmp_path: Path) -> None:
    browser = chromium()
    url = cluster.pd_url()
    status, page = http_json(url + "/ui")
    assert status == 200 and "<script>" in page and "http://" not in page.split("<body>")[1]

    # The DOM after the page's JavaScript ran: what it shows, checked against the API.
    result = run_chromium(browser, tmp_path / "dom", "--dump-dom", url + "/ui")
    parsed = Tables()
    parsed.feed(result.stdout)
    assert "updated" in parsed.texts, (result.returncode, result.stderr[-2000:])  # no error
    cluster_info = http_json(url + "/v1/cluster")[1]
    leader = cluster_info["leader"]["id"]
    assert f"leader: {leader} at {cluster_info['leader']['address']}" in parsed.texts["leader"]
    pd_rows = rows_by_first_cell(parsed.tables["pd-nodes"])
    assert set(pd_rows) == {n["id"] for n in cluster_info["nodes"]}
    assert pd_rows[leader][3] == "leader"

    servers = http_json(url + "/v1/rangeservers")[1]["rangeservers"]
    server_rows = rows_by_first_cell(parsed.tables["rangeservers"])
    assert set(server_rows) == {s["id"] for s in servers}
    for s in servers:  # columns: id, address, alive, state, replicas, open, class, stored, free
        row = server_rows[s["id"]]
        assert row[1] == s["address"] and row[3] == s["state"], row
        assert row[2] == ("alive" if s["alive"] else "down"), row
        if s["alive"]:  # load: what it stores and the free disk, from its heartbeats
            assert row[7].endswith("B") and row[8].endswith("B") and row[8] != "0 B", row
    assert {"drained", "active"} <= {row[3] for row in server_rows.values()}

    streams = http_json(url + "/v1/streams")[1]["streams"]
    stream_rows = parsed.tables["streams-table"][1:]  # stream, end offset, records, bytes,
    shown = {row[0]: row for row in stream_rows}  # rate, first, last, retention, epoch,
    assert len(streams) <= 50  # one page of the console  # tiers, replicas/acks
    for stream in streams:  # each stream with its ranges by tier (replicas by address:
        row = shown[stream["name"]]  # the stream's detail, tests/integration/test_console.py)
        tiers: dict[str, int] = {}
        for rng in stream["ranges"]:
            tiers[rng.get("tier", "local")] = tiers.get(rng.get("tier", "local"), 0) + 1
        split = ", ".join(f"{n} {t}" for t, n in sorted(tiers.items())) or "-"
        if stream.get("ranges_omitted"):  # the answer holds the last ranges only: said so
            shown_n = len(stream["ranges"])
            split += f" of the last {shown_n} ({shown_n + stream['ranges_omitted']} ranges)"
        assert row[9] == split, row
        assert row[8] == str(stream["epoch"]), row
        assert row[10] == f"{stream['replicas']}/{stream['ack_count']}", row
    assert {"drain-load", "after-drain"} <= set(shown)
    summary = parsed.texts["repair-summary"]
    report = http_json(url + "/v1/ranges?under_replicated=1")[1]["repair"]
    assert summary.startswith(f"{report['under_replicated']} under-replicated; repairs in "
                              "progress"), summary

    # A real screenshot: a PNG of the rendered page, with text and coloured states drawn.
    shot = tmp_path / "console.png"
    result = run_chromium(browser, tmp_path / "shot", f"--screenshot={shot}", url + "/ui")
    assert shot.exists(), (result.returncode, result.stderr[-2000:])
    image = decode(shot.read_bytes())
    assert (image.width, image.height) == (console_width, console_height)
    colours, drawn_rows = colour_stats(image)
    background, background_pixels = colours.most_common(1)[0]
    assert background == (255, 255, 255)  # the page's background
    assert len(colours) > 50, len(colours)  # anti-aliased text in several colours
    assert background_pixels < 0.97 * image.width * image.height  # not blank
    assert drawn_rows > 300, drawn_rows  # every section drawn, not one heading
    ink = sum(n for (r, g, b), n in colours.items() if max(r, g, b) < 96)  # dark text
    green = sum(n for (r, g, b), n in colours.items() if g > r + 40 and g > b + 20)  # ok
    assert ink > 2000 and green > 100, (ink, green)


def test_append_sends_each_line_while_stdin_stays_open(cluster: Cluster) -> None:
    assert cli(cluster, "stream", "create", "tail-f").returncode == 0
    proc = subprocess.Popen(
        [sys.executable, "-m", "estream.cli.main", "--pd", cluster.pd_addresses, "append",
         "tail-f", "--json"],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
        env={**os.environ})
    try:
        assert proc.stdin is not None
        proc.stdin.write(b"first line\n")
        proc.stdin.flush()
        deadline = time.monotonic() + 15
        while True:
            seen = cli(cluster, "read", "tail-f")
            if seen.stdout == "first line\n":
                break
            assert time.monotonic() < deadline, (seen.stdout, seen.stderr)
            time.sleep(0.3)
        out, err = proc.communicate(b"second line\n", timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert json.loads(out)["count"] == 2


def test_read_a_trimmed_stream(cluster: Cluster) -> None:
    stdin = "".join(f"r{i}\n" for i in range(10))
    assert cli(cluster, "stream", "create", "trimmed").returncode == 0
    assert cli(cluster, "append", "trimmed", stdin=stdin).returncode == 0
    trim = cli(cluster, "stream", "trim", "trimmed", "6")
    assert trim.returncode == 0, trim.stderr
    assert cli(cluster, "read", "trimmed").stdout == "r6\nr7\nr8\nr9\n"
    assert cli(cluster, "read", "trimmed", "--from", "-2").stdout == "r8\nr9\n"
    assert cli(cluster, "read", "trimmed", "--from", "end").stdout == ""
    below = cli(cluster, "read", "trimmed", "--from", "2")
    assert below.returncode == 1 and "trimmed" in below.stderr and "6" in below.stderr
    as_json = cli(cluster, "read", "trimmed", "--from", "2", "--json")
    assert json.loads(as_json.stderr)["error"]["code"] == "OFFSET_OUT_OF_RANGE"
    usage = cli(cluster, "read", "trimmed", "--from", "x", "--json")
    assert usage.returncode == 2 and json.loads(usage.stderr)["error"]["code"] == "USAGE"


def test_an_http_port_is_named_as_such(cluster: Cluster) -> None:
    http = cluster.pd_url().split("://")[1]
    result = subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", http, "--timeout", "3", "stream",
         "list"], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 1
    assert "answers HTTP" in result.stderr and "0x5448" not in result.stderr, result.stderr


def test_a_raft_port_is_named_as_such(cluster: Cluster) -> None:
    raft = cluster.pd.nodes[0].raft
    result = subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", raft, "--timeout", "2", "stream",
         "list", "--json"], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 1
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "WRONG_PROTOCOL" and "Raft (peer) port" in error["message"], error


def test_a_range_server_port_is_named_as_such(cluster: Cluster) -> None:
    # (A live one: the forget test kills the server the drain test drained.)
    live = next(s for s in cluster.servers if s.alive())
    result = subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", live.address,
         "--timeout", "3", "stream", "list", "--json"],
        capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)
    assert result.returncode == 1
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "WRONG_PROTOCOL", error
    assert "range server's RPC port" in error["message"] and "opcode" not in error["message"]


def test_servers_are_named_by_id_prefix_or_address(cluster: Cluster) -> None:
    servers = json.loads(cli(cluster, "server", "list", "--json").stdout)["rangeservers"]
    target = servers[0]
    for key in (target["id"], target["id"][:6], target["address"]):
        described = cli(cluster, "server", "describe", key, "--json")
        assert described.returncode == 0, described.stderr
        assert json.loads(described.stdout)["id"] == target["id"]
    short = cli(cluster, "server", "describe", target["id"][:3], "--json")
    assert short.returncode == 1
    assert json.loads(short.stderr)["error"]["code"] == "INVALID_ARGUMENT"
    table = cli(cluster, "server", "list").stdout  # ids cut to a usable prefix
    assert target["id"][:12] in table and target["id"] not in table
    ranges = cli(cluster, "ranges")
    assert ranges.returncode == 0 and all(s["id"] not in ranges.stdout for s in servers)


def test_cli_errors_use_the_admin_api_codes_and_exit_codes(cluster: Cluster) -> None:
    missing = cli(cluster, "stream", "describe", "no-such-stream", "--json")
    status, body = http_json(cluster.pd_url() + "/v1/streams/no-such-stream")
    assert missing.returncode == 1 and status == 404
    assert json.loads(missing.stderr)["error"]["code"] == body["error"]["code"] \
        == "STREAM_NOT_FOUND"
    assert cli(cluster, "stream", "describe", "no-such-stream").stderr.startswith(
        "estream: error: STREAM_NOT_FOUND: ")
    assert cli(cluster, "stream", "create", "codes").returncode == 0
    for args in (("stream", "trim", "codes", "-1"), ("cursor", "commit", "codes", "c", "-1"),
                 ("read", "codes", "--to", "-1"), ("read", "codes", "--max", "-1"),
                 ("stream", "create", "codes2", "--replicas", "0")):
        refused = cli(cluster, *args)
        assert refused.returncode == 2, (args, refused.stderr)


def test_append_stops_at_a_line_it_cannot_store_and_says_what_it_stored(
        cluster: Cluster) -> None:
    """A line past the record limit used to fail the command while the lines after it were
    stored anyway (appended at the call, made durable by the writer's close), with no word
    of what was: a rerun of the input then duplicated them."""
    assert cli(cluster, "stream", "create", "too-long").returncode == 0
    stdin = "line1\n" + "x" * 5_000_000 + "\nline3\nline4\n"
    result = cli(cluster, "append", "too-long", "--json", stdin=stdin)
    assert result.returncode == 1, result.stderr
    assert json.loads(result.stdout) == {"stream": "too-long", "count": 1, "first": 0, "last": 0}
    error = json.loads(result.stderr)["error"]
    assert error["code"] == "INVALID_ARGUMENT" and error["message"].startswith("line 2: "), error
    assert cli(cluster, "read", "too-long").stdout == "line1\n"


def test_read_max_zero_and_binary_values_as_json(cluster: Cluster) -> None:
    assert cli(cluster, "stream", "create", "maxzero").returncode == 0
    assert cli(cluster, "append", "maxzero", stdin="a\nb\n").returncode == 0
    none = cli(cluster, "read", "maxzero", "--max", "0")
    assert none.returncode == 0 and none.stdout == ""
    lines = cli(cluster, "read", "maxzero", "--format", "json").stdout.splitlines()
    assert [json.loads(x)["value"] for x in lines] == ["a", "b"]
    assert {json.loads(x)["value_encoding"] for x in lines} == {"utf-8"}


def test_stream_views_count_the_open_range(cluster: Cluster) -> None:
    assert cli(cluster, "stream", "create", "figures").returncode == 0
    assert cli(cluster, "append", "figures", stdin="one\ntwo\nthree\n").returncode == 0
    described = json.loads(cli(cluster, "stream", "describe", "figures", "--json").stdout)
    # Every record is in the open range: its replica's figures count.
    assert (described["end_offset"], described["records"]) == (3, 3)
    assert described["bytes"] > 0 and described["last_timestamp"] is not None
    assert described["first_timestamp"] is not None
    listed = json.loads(cli(cluster, "stream", "list", "--json").stdout)["streams"]
    entry = next(s for s in listed if s["name"] == "figures")
    assert (entry["end_offset"], entry["records"]) == (3, 3) and entry["bytes"] > 0
    table = cli(cluster, "stream", "list").stdout
    row = next(line for line in table.splitlines() if line.startswith("figures"))
    assert " 3 " in row and "B" in row, row  # end offset, records, bytes
    assert "T" in cli(cluster, "stream", "describe", "figures").stdout  # ISO 8601 times
