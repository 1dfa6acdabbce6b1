"""``estream ranges`` against real processes (1 PD node, 3 range servers): every range
with its replicas' health and the repair progress; ``--under-replicated`` lists a range
once one of its three replicas is on a dead server (no spare server: it stays so), with
the dead replica's health, in JSON and as a table; once repair gives up on it ("no
target"), the skip with each replica's judgment in the API, the CLI and the console (real
headless Chromium)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json
from estream.wire import limits
from tests.cdp import start_browser
from tests.harness.openapi import validate
from tests.system_tools import require_tool

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=1, range_servers=3)]
ROOT = Path(__file__).resolve().parents[2]
under_replicated_within_s = 30.0
skipped_within_s = limits.repair_after_ms / 1000 + 20  # dead that long, then a round


def ranges_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", cluster.pd_addresses, "ranges",
         *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**os.environ, "COLUMNS": "300"})


def report(cluster: Cluster, *args: str) -> dict[str, Any]:
    result = ranges_cli(cluster, "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


async def test_ranges_lists_health_the_under_replicated_and_the_skipped(
        cluster: Cluster, tmp_path: Path) -> None:
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("ranged", replicas=3, ack_count=2)
        async with await client.open_writer("ranged") as writer:
            for i in range(10):
                await writer.append(b"r%d" % i)
        meta = await client.describe_stream("ranged")
    everything = report(cluster)
    mine = [r for r in everything["ranges"] if r["stream"] == "ranged"]
    assert [r["index"] for r in mine] == [rng.index for rng in meta.ranges]
    assert all(r["healthy"] == r["wanted"] == 3 for r in mine), mine
    assert everything["repair"]["leader"] is True
    assert report(cluster, "--under-replicated")["ranges"] == []

    victim = meta.ranges[0].replicas[0]
    cluster.kill9(victim.address)
    deadline = time.monotonic() + under_replicated_within_s
    while True:
        under = report(cluster, "--under-replicated")
        listed = [r for r in under["ranges"] if r["stream"] == "ranged"]
        if listed:
            break
        assert time.monotonic() < deadline, under
        time.sleep(0.5)
    assert under["repair"]["under_replicated"] >= 1
    first = listed[0]
    assert first["under_replicated"] and first["healthy"] < first["wanted"] == 3
    dead = [p for p in first["replicas"] if p["id"] == victim.id]
    assert dead and dead[0]["health"] != "healthy", first

    table = ranges_cli(cluster, "--under-replicated")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].startswith(f"{under['repair']['under_replicated']} ranges "
                               "under-replicated; repairs in progress")
    row = next(line for line in lines if line.lstrip().startswith("ranged"))
    assert f"{victim.address} unavailable" in row and "/3" in row

    # Dead past repair's 10 s, with no spare server: skipped, each replica judged, alike in
    # the API (its schema), the CLI and the console.
    deadline = time.monotonic() + skipped_within_s
    while not (skipped := [s for s in report(cluster)["repair"]["skipped"]
                           if s["stream"] == "ranged"]):
        assert time.monotonic() < deadline, report(cluster)["repair"]
        time.sleep(0.5)
    status, answer = http_json(cluster.pd_url() + "/v1/ranges?under_replicated=1")
    assert status == 200 and answer["repair"]["skipped_omitted"] == 0
    validate("/v1/ranges", "GET", 200, answer)
    skip = skipped[0]
    assert skip["reason"] == "no target" and skip["stream_id"] == meta.id, skip
    assert f"{victim.id}: dead" in skip["replicas"], skip
    assert len(skip["replicas"]) == 3, skip
    said = ranges_cli(cluster).stdout
    assert f"repair skips ranged range {skip['index']}: no target ({victim.id}: " in said, said
    browser = require_tool("chromium", "chromium-browser", "google-chrome", package="chromium")
    async with start_browser(browser, tmp_path / "profile") as page:
        await page.goto(cluster.pd_url() + "/ui")
        shown = await page.wait(
            "(document.getElementById('repair-skipped') || {}).innerText", "skipped table")
    row = next(line for line in shown.splitlines() if line.startswith("ranged\t"))
    assert "no target" in row and f"{victim.id}: dead" in shown, shown


def test_ranges_against_a_stopped_pd_fails_with_one_line(cluster: Cluster) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", "127.0.0.1:1", "--timeout", "1",
         "ranges", "--json"], capture_output=True, text=True, timeout=60, cwd=ROOT,
        check=False)
    assert result.returncode == 1
    assert json.loads(result.stderr)["error"]["code"] == "UNAVAILABLE"


def test_a_drain_that_cannot_finish_says_so_up_front(cluster: Cluster) -> None:
    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "estream.cli.main", "--pd", cluster.pd_addresses, *args],
            capture_output=True, text=True, timeout=60, cwd=ROOT, check=False)

    cluster.heal()  # the server an earlier test stopped is back
    assert cli("stream", "create", "three-wide", "--exist-ok").returncode == 0
    victim = cluster.servers[0].address  # by address: every server holds a replica
    try:
        drained = cli("server", "drain", victim)
        assert drained.returncode == 0, drained.stderr
        # Three servers, ranges of three replicas: it cannot finish, and says so first.
        assert "cannot finish: needs 3 servers" in drained.stderr, drained.stderr
        as_json = json.loads(cli("server", "drain", victim, "--json").stdout)
        assert as_json["drain"]["can_finish"] is False
        # Its ranges are whole (3/3): to be moved, not under-replicated.
        report = json.loads(ranges_cli(cluster, "--json").stdout)
        row = next(r for r in report["ranges"] if r["stream"] == "three-wide")
        assert row["healthy"] == 3 and row["moving"] and not row["under_replicated"], row
        assert report["repair"]["moving"] >= 1
        assert "to move off draining servers" in ranges_cli(cluster).stdout
    finally:
        assert cli("server", "drain", victim, "--cancel").returncode == 0
