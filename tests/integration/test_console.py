"""The web console as an operator uses it: real headless Chromium (the system's, driven
through the DevTools protocol by :mod:`tests.cdp`) against a real cluster (3 PD nodes,
4 range servers).

One browser walks the page on a follower (as the README's URL usually lands there): the
health banner and the links to the leader's console, OpenAPI and metrics; charts drawn
from PD's samples; streams searched and paged; a stream opened (ranges with replicas by
address, cursors with lag); records browsed from an offset and from a time, values as
text, JSON and hex; a cursor reset, a trim; a stream created, its retention edited and
deleted (each destructive step confirmed in the page, one cancelled); a range server
drained with another's "cannot finish" shown up front, then the drain cancelled. Every
step is asserted on the DOM after the page's JavaScript ran and on the API's state; a
screenshot decodes to a drawn page. The admin endpoints the page needs (records, samples,
the drain outlook) are checked on their own for their bounds and refusals.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from tests.cdp import Page, start_browser
from tests.harness.objecttier import ObjectTier, all_tiered, wait_for, write_ranges
from tests.harness.openapi import validate
from tests.pngcheck import colour_stats, decode
from tests.system_tools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.cluster(range_servers=4)]

hung_browse_s_max = 3.0  # a browse whose first holder hangs: one 1.5 s bound, and the rest
RECORDS = [(b'{"a": 1, "b": [2, 3]}', {"kind": "json"}), (b"plain text", {}),
           (b"\x00\xffbin", {"kind": "binary"})]


async def append(cluster: Cluster, name: str, records: list[tuple[bytes, dict[str, str]]]
                 ) -> None:
    client = await estream.connect(cluster.pd_addresses)
    try:
        writer = await client.open_writer(name)
        for value, headers in records:
            await writer.append(value, headers=headers)
        await writer.close()
    finally:
        await client.close()


def api(cluster: Cluster, path: str, method: str = "GET", body: Any = None) -> Any:
    status, answer = http_json(cluster.pd_url() + path, method, body)
    assert status < 300, (path, status, answer)
    return answer


def follower_http(cluster: Cluster) -> tuple[str, str]:
    """(a follower's HTTP address, the leader's)."""
    info = api(cluster, "/v1/cluster")
    nodes = {n["id"]: n for n in info["nodes"]}
    leader = nodes[info["leader"]["id"]]["http"]
    follower = next(n["http"] for n in nodes.values() if n["http"] != leader)
    return follower, leader


async def rows(page: Page, table: str) -> list[list[str]]:
    """The cells' text of a table's body rows."""
    value = await page.evaluate(
        f"Array.from(document.querySelectorAll('#{table} tr')).slice(1).map((r) =>"
        " Array.from(r.cells).map((c) => c.innerText.trim()))")
    assert isinstance(value, list)
    return value


async def confirm(page: Page, expect: str, yes: bool = True) -> None:
    await page.wait("!document.getElementById('confirm-box').classList.contains('hidden')",
                    "a confirmation")
    assert expect in await page.text("#confirm-text")
    await page.click("#confirm-yes" if yes else "#confirm-no")


async def test_console_as_an_operator_uses_it(cluster: Cluster, tmp_path: Path) -> None:
    browser = require_tool("chromium", "chromium-browser", "google-chrome", package="chromium")
    for i in range(25):
        api(cluster, "/v1/streams", "POST", {"name": f"page-{i:02d}"})
    api(cluster, "/v1/streams", "POST", {"name": "browse-me"})
    await append(cluster, "browse-me", RECORDS)
    first = api(cluster, "/v1/streams/browse-me/records?offset=0&limit=1")["records"][0]
    api(cluster, "/v1/streams/browse-me/cursors", "POST", {"cursor": "billing", "offset": 1})
    follower, leader = follower_http(cluster)

    async with start_browser(browser, tmp_path / "profile") as page:
        await page.goto(f"http://{follower}/ui")
        # Health banner and links: a follower's page links to the leader's console.
        await page.wait("document.getElementById('banner').innerText.startsWith('HEALTHY')",
                        "a healthy banner")
        assert "range servers alive 4/4" in await page.text("#banner")
        href = await page.evaluate("document.getElementById('leader-link').href")
        assert href == f"http://{leader}/ui"
        assert await page.evaluate("document.getElementById('openapi-link').href") == \
            f"http://{follower}/v1/openapi.json"
        assert await page.evaluate("document.getElementById('metrics-link').href") == \
            f"http://{follower}/metrics"
        # Charts from this node's samples: one SVG per figure.
        await page.wait("/^[1-9]/.test(document.getElementById('samples-count').innerText)",
                        "samples")
        assert await page.evaluate("document.querySelectorAll('#charts svg').length") == 7
        # At least the gauges of one sample are drawn (rates need two samples).
        assert await page.evaluate("document.querySelectorAll('#charts svg circle').length") >= 3

        # Streams: search by prefix, pages of 20, next and previous.
        await page.choose("#page-size", "20")
        await page.type("#stream-search", "page-")
        await page.wait("document.querySelectorAll('#streams-table tr').length === 21 && "
                        "document.querySelector('#streams-table tr:nth-child(2)')"
                        ".innerText.startsWith('page-00')", "the first page")
        names = [r[0] for r in await rows(page, "streams-table")]
        assert names == [f"page-{i:02d}" for i in range(20)]
        await page.click("#streams-next")
        await page.wait("document.querySelectorAll('#streams-table tr').length === 6",
                        "the second page")
        assert [r[0] for r in await rows(page, "streams-table")] == \
            [f"page-{i:02d}" for i in range(20, 25)]
        assert "last page" in await page.text("#streams-page")
        await page.click("#streams-prev")
        await page.wait("document.querySelectorAll('#streams-table tr').length === 21",
                        "the first page again")

        # One stream: figures, ranges with replicas by address, cursors with lag.
        await page.type("#stream-search", "browse")
        await page.click('[data-stream="browse-me"]')
        await page.wait("document.getElementById('detail-summary') && document.getElementById("
                        "'detail-summary').innerText.startsWith('end offset 3')", "the detail")
        described = api(cluster, "/v1/streams/browse-me")
        shown = {r[0]: r for r in await rows(page, "ranges-table")}
        for rng in described["ranges"]:
            row = shown[str(rng["index"])]
            for replica in rng["replicas"]:
                assert f"{replica['id']} {replica['address']}" in row[5], row
        assert (await rows(page, "cursors-table"))[0][:3] == ["billing", "1", "2"]

        # Records: from offset 0; values as text, JSON (pretty) and hex; headers shown.
        await page.click("#browse-go")
        await page.wait("document.querySelectorAll('#records-table tr').length === 4",
                        "three records")
        shown_records = await rows(page, "records-table")
        assert [r[0] for r in shown_records] == ["0", "1", "2"]
        assert shown_records[0][2] == "kind=json" and shown_records[1][3] == "plain text"
        assert "not UTF-8" in shown_records[2][3]
        await page.choose("#browse-format", "json")
        assert (await rows(page, "records-table"))[0][3] == \
            json.dumps(json.loads(RECORDS[0][0]), indent=2)
        await page.choose("#browse-format", "hex")
        assert (await rows(page, "records-table"))[2][3] == "00 ff 62 69 6e"
        # From a time (ISO 8601): the first record at or after it.
        stamp = datetime.fromtimestamp(first["timestamp"] / 1000, UTC)
        await page.type("#browse-time", stamp.isoformat(timespec="milliseconds"))
        await page.click("#browse-go")
        await page.wait("document.getElementById('records-summary').innerText"
                        ".includes('from offset 0')", "a browse by time")

        # Cursor reset (confirmed), then trim (confirmed).
        await page.type('[data-cursor-input="billing"]', "0")
        await page.click('[data-cursor-reset="billing"]')
        await confirm(page, "Reset cursor billing of browse-me to offset 0")
        await page.wait("document.getElementById('message').innerText.includes("
                        "'reset to 0')", "the reset")
        cursors = api(cluster, "/v1/streams/browse-me/cursors")["cursors"]
        assert cursors == [{"cursor": "billing", "offset": 0, "lag": 3}]
        await page.type("#trim-offset", "1")
        await page.click("#trim-go")
        await confirm(page, "Trim browse-me to offset 1")
        await page.wait("document.getElementById('message').innerText.includes("
                        "'trimmed to 1')", "the trim")
        assert api(cluster, "/v1/streams/browse-me")["start_offset"] == 1

        # Create a stream with a retention, edit it, delete it (once cancelled).
        await page.type("#create-name", "made-in-ui")
        await page.type("#create-retention-ms", "3600000")
        await page.click("#create-go")
        await page.wait("document.getElementById('message').innerText === "
                        "'created stream made-in-ui'", "the create")
        assert api(cluster, "/v1/streams/made-in-ui")["retention_ms"] == 3_600_000
        await page.type("#stream-search", "made")
        await page.click('[data-stream="made-in-ui"]')
        await page.wait("document.getElementById('retention-ms').value === '3600000'",
                        "the retention shown")
        await page.type("#retention-ms", "7200000")
        await page.click("#retention-save")
        await confirm(page, "Set the retention of made-in-ui to 2 h")
        await page.wait("document.getElementById('message').innerText.includes("
                        "'retention of made-in-ui saved')", "the retention edit")
        assert api(cluster, "/v1/streams/made-in-ui")["retention_ms"] == 7_200_000
        await page.click("#delete-stream")
        await confirm(page, "Delete stream made-in-ui", yes=False)
        assert http_json(cluster.pd_url() + "/v1/streams/made-in-ui")[0] == 200
        await page.click("#delete-stream")
        await confirm(page, "Delete stream made-in-ui")
        await page.wait("document.getElementById('message').innerText === "
                        "'deleted stream made-in-ui'", "the delete")
        assert http_json(cluster.pd_url() + "/v1/streams/made-in-ui")[0] == 404

        # Drain one server: another one holding replicas shows it could not drain now.
        servers = api(cluster, "/v1/rangeservers")["rangeservers"]
        holders = [s for s in servers if s["replicas"] > 0]
        drained, other = holders[0], holders[1]
        await page.click(f'[data-drain="{drained["id"]}"]')
        await confirm(page, f"Drain range server {drained['address']}")
        await page.wait(f"!!document.querySelector('[data-undrain=\"{drained['id']}\"]')",
                        "the drain shown")
        assert api(cluster, f"/v1/rangeservers/{drained['id']}")["state"] in (
            "draining", "drained")
        other_row = await page.wait(
            "Array.from(document.querySelectorAll('#rangeservers tr')).map((r) => r.innerText)"
            f".find((t) => t.includes('{other['id']}') && t.includes('cannot finish'))",
            "cannot finish shown up front")
        assert "cannot finish: needs 3 servers besides this one" in other_row
        assert "2 available" in other_row
        await page.click(f'[data-undrain="{drained["id"]}"]')
        await page.wait(f"!!document.querySelector('[data-drain=\"{drained['id']}\"]')",
                        "the drain cancelled")
        assert api(cluster, f"/v1/rangeservers/{drained['id']}")["state"] == "active"
        assert "error" not in (await page.text("#status")).lower()

        shot = await page.screenshot()
    (tmp_path / "console.png").write_bytes(shot)
    image = decode(shot)
    colours, drawn_rows = colour_stats(image)
    background, background_pixels = colours.most_common(1)[0]
    assert background == (255, 255, 255)
    assert len(colours) > 50 and background_pixels < 0.97 * image.width * image.height
    assert drawn_rows > 300, drawn_rows


async def test_console_shows_consumer_groups_members_offsets_and_lag(
        cluster: Cluster, tmp_path: Path) -> None:
    """A real group (the SDK's ``subscribe``) in the console: listed, then opened with its
    member, the stream it reads and its committed offset, end and lag."""
    browser = require_tool("chromium", "chromium-browser", "google-chrome", package="chromium")
    api(cluster, "/v1/streams", "POST", {"name": "grouped"})
    await append(cluster, "grouped", [(b"r%d" % i, {}) for i in range(5)])
    async with await estream.connect(cluster.pd_addresses) as client:
        sub = client.subscribe("console-g", ["grouped"], heartbeat_s=0.2)
        try:
            seen = 0
            async with asyncio.timeout(40):
                async for _ in sub:
                    seen += 1
                    if seen == 2:
                        await sub.commit()
                        break
            follower, _ = follower_http(cluster)
            async with start_browser(browser, tmp_path / "profile") as page:
                await page.goto(f"http://{follower}/ui")
                await page.wait("!!document.querySelector('#groups-table [data-group="
                                "\"console-g\"]')", "the group listed")
                listed = [r for r in await rows(page, "groups-table") if r[0] == "console-g"]
                assert listed == [["console-g", "Stable", "estream", "1"]]
                await page.click('[data-group="console-g"]')
                await page.wait("document.querySelectorAll('#group-offsets-table tr')"
                                ".length === 2", "the group's offsets")
                assert await rows(page, "group-offsets-table") == [["grouped", "2", "5", "3"]]
                members = await rows(page, "group-members-table")
                assert len(members) == 1 and members[0][3] == "grouped"
                assert await page.text("#group-lag") == "3"
        finally:
            await sub.close()


async def test_console_acts_on_the_stream_it_opened_and_on_fresh_answers_only(
        cluster: Cluster, tmp_path: Path) -> None:
    """A page left open on a stream whose name was deleted and created again says so, and
    its delete (guarded by the id it opened) leaves the new stream alone; a page whose node
    stops answering shows its health as unknown, not the last healthy answer; no other
    site may frame the page."""
    browser = require_tool("chromium", "chromium-browser", "google-chrome", package="chromium")
    old = api(cluster, "/v1/streams", "POST", {"name": "reborn"})
    follower, _ = follower_http(cluster)
    async with start_browser(browser, tmp_path / "profile") as page:
        await page.goto(f"http://{follower}/ui")
        await page.type("#stream-search", "reborn")
        await page.click('[data-stream="reborn"]')
        await page.wait("!!document.getElementById('detail-summary')", "the detail")
        api(cluster, f"/v1/streams/reborn?id={old['id']}", "DELETE")
        new = api(cluster, "/v1/streams", "POST", {"name": "reborn"})
        assert new["id"] != old["id"]
        await page.wait("document.getElementById('detail-recreated').innerText"
                        f".includes('(id {new['id']})')", "the name's new stream noticed")
        await page.type("#trim-offset", "0")
        await page.click("#trim-go")
        await page.wait("document.getElementById('message').innerText.includes("
                        "'deleted and created again')", "the trim refused")
        await page.click("#delete-stream")
        await confirm(page, "Delete stream reborn")
        await page.wait("document.getElementById('message').innerText.startsWith("
                        f"'DELETE /v1/streams/reborn?id={old['id']}')", "the delete refused")
        assert api(cluster, "/v1/streams/reborn")["id"] == new["id"]

        await page.wait("document.getElementById('banner').innerText.startsWith('HEALTHY')",
                        "a healthy banner")
        await page.send("Network.enable")
        await page.send("Network.emulateNetworkConditions", offline=True, latency=0,
                        downloadThroughput=-1, uploadThroughput=-1)
        banner = await page.wait(
            "(t => t.startsWith('UNKNOWN') && t)(document.getElementById('banner').innerText)",
            "the banner unknown while the node does not answer")
        assert "does not answer" in banner and "last full answer at" in banner
        await page.send("Network.emulateNetworkConditions", offline=False, latency=0,
                        downloadThroughput=-1, uploadThroughput=-1)
        await page.wait("document.getElementById('banner').innerText.startsWith('HEALTHY')",
                        "healthy again")
    async with aiohttp.ClientSession() as session, session.get(f"http://{follower}/ui") as got:
        assert got.headers["X-Frame-Options"] == "DENY"
        assert got.headers["Content-Security-Policy"] == "frame-ancestors 'none'"


async def test_records_endpoint_bounds_and_refusals(cluster: Cluster) -> None:
    url = cluster.pd_url()
    api(cluster, "/v1/streams", "POST", {"name": "bounded"})
    for query, field in (("limit=101", "limit"), ("limit=0", "limit"), ("offset=-1", "offset"),
                         ("offset=x", "offset"), ("offset=1&timestamp=1", "timestamp"),
                         ("bogus=1", "bogus")):
        status, body = http_json(f"{url}/v1/streams/bounded/records?{query}")
        assert status == 400 and body["error"]["code"] == "INVALID_ARGUMENT", (query, body)
        assert field in body["error"]["message"], (query, body)
    assert http_json(f"{url}/v1/streams/no-such/records")[0] == 404
    empty = api(cluster, "/v1/streams/bounded/records")
    assert empty["records"] == [] and empty["offset"] == 0
    validate("/v1/streams/{name}/records", "GET", 200, empty)
    api(cluster, "/v1/streams", "POST", {"name": "maced", "digest": "hmac-sha256"})
    status, body = http_json(f"{url}/v1/streams/maced/records")
    assert status == 403 and "cluster secret" in body["error"]["message"], body
    validate("/v1/streams/{name}/records", "GET", 403, body)
    # A value that is not UTF-8 is given as base64 only.
    raw = bytes(range(200, 256))
    await append(cluster, "bounded", [(raw, {})])
    answer = api(cluster, "/v1/streams/bounded/records?offset=0")
    validate("/v1/streams/{name}/records", "GET", 200, answer)
    record = answer["records"][0]
    assert base64.b64decode(record["value"]) == raw and record["text"] is None


def test_samples_and_drain_outlook_in_the_api(cluster: Cluster) -> None:
    samples = api(cluster, "/v1/samples")
    validate("/v1/samples", "GET", 200, samples)
    assert samples["interval_s"] == 10.0 and samples["max"] == 360
    assert samples["samples"], samples
    newest = samples["samples"][-1]
    assert {"at_ms", "streams", "ranges", "bytes_stored", "under_replicated",
            "servers_live"} <= set(newest)
    assert abs(newest["at_ms"] - time.time() * 1000) < 3_600_000
    assert http_json(cluster.pd_url() + "/v1/samples?minutes=61")[0] == 400
    # The leader's samples carry the largest cursor lag (the operator test's cursor).
    deadline = time.monotonic() + 25.0
    while "cursor_lag_max" not in api(cluster, "/v1/samples")["samples"][-1]:
        assert time.monotonic() < deadline, "no cursor lag sampled on the leader"
        time.sleep(0.5)
    server = api(cluster, "/v1/rangeservers")["rangeservers"][0]
    described = api(cluster, f"/v1/rangeservers/{server['id']}")
    validate("/v1/rangeservers/{id}", "GET", 200, described)
    outlook = described["drain"]
    assert outlook["available_servers"] == 3 and outlook["can_finish"] is True


async def test_records_browse_outlasts_a_hung_holder(cluster: Cluster) -> None:
    """The browse's first holder hangs (SIGSTOP): its READ and TIME_INDEX are each bounded
    by the read cursor's ``read_answer_ms_max`` (1.5 s), the replica is then asked last, and
    each browse answers in full within ``hung_browse_s_max``. Before, a fixed 2 s bound on
    each request: the time browse asked the hung one twice (about 4 s)."""
    api(cluster, "/v1/streams", "POST", {"name": "browse-hung"})
    before_ms = int(time.time() * 1000)
    await append(cluster, "browse-hung", [(b"v%d" % i, {}) for i in range(5)])
    hung = api(cluster, "/v1/streams/browse-hung")["ranges"][0]["replicas"][0]["address"]
    cluster.pause(hung)
    try:
        for query in ("offset=0", f"timestamp={before_ms}"):
            began = time.monotonic()
            answer = api(cluster, f"/v1/streams/browse-hung/records?{query}")
            took_s = time.monotonic() - began
            print(f"browse {query} with a hung holder: {took_s:.2f}s")
            assert [r["offset"] for r in answer["records"]] == [0, 1, 2, 3, 4], (query, answer)
            assert took_s < hung_browse_s_max, (query, took_s)
    finally:
        cluster.resume(hung)


@pytest.mark.cluster(fresh=True, pd_nodes=1, range_servers=3, object_tier=ObjectTier("file"))
async def test_records_of_the_object_tier(cluster: Cluster) -> None:
    """Ranges uploaded and released from every range server read back from the object."""
    api(cluster, "/v1/streams", "POST", {"name": "tiered"})
    client = await estream.connect(cluster.pd_addresses)
    try:
        values = await write_ranges(client, "tiered", [3, 4])
    finally:
        await client.close()
    await wait_for(lambda: all_tiered(cluster, "tiered", released=True), 45.0,
                   "both sealed ranges in the object tier, released")
    answer = api(cluster, "/v1/streams/tiered/records?offset=1&limit=5")
    validate("/v1/streams/{name}/records", "GET", 200, answer)
    assert [r["offset"] for r in answer["records"]] == [1, 2, 3, 4, 5]  # across both objects
    assert [base64.b64decode(r["value"]) for r in answer["records"]] == values[1:6]
