"""``estream ranges`` against real processes (1 PD node, 3 range servers): every range
with its replicas' health and the repair progress; ``--under-replicated`` lists a range
once one of its three replicas is on a dead server (no spare server: it stays so), with
the dead replica's health, in JSON and as a table."""

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

pytestmark = [pytest.mark.integration, pytest.mark.cluster(pd_nodes=1, range_servers=3)]
ROOT = Path(__file__).resolve().parents[2]
under_replicated_within_s = 30.0


def ranges_cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "--pd", cluster.pd_addresses, "ranges",
         *args], capture_output=True, text=True, timeout=60, cwd=ROOT, check=False,
        env={**os.environ, "COLUMNS": "300"})


def report(cluster: Cluster, *args: str) -> dict[str, Any]:
    result = ranges_cli(cluster, "--json", *args)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)  # type: ignore[no-any-return]


async def test_ranges_lists_health_and_the_under_replicated_ones(cluster: Cluster) -> None:
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
