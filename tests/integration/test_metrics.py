"""Metrics and health of real processes: every /metrics passes ``promtool check metrics``,
range servers' /healthz and /readyz, PD's /readyz flipping with its majority, and a
stalled writer showing up in a range server's metrics."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

import estream
from estream.devcluster.cluster import Cluster, RangeServerProcess
from estream.devcluster.pd import http_json
from tests.harness.faultproxy import start_fault_proxy
from tests.system_tools import require_tool

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(pd_nodes=3, range_servers=2, proxy=start_fault_proxy,
                                  rangeserver_args=["--http", "127.0.0.1:0"])]


def promtool() -> str:
    """promtool's path (a missing one fails in CI, skips elsewhere: tests/system_tools.py)."""
    return require_tool("promtool", package="prometheus")


def http_url(server: RangeServerProcess) -> str:
    assert server.process is not None
    return "http://" + server.process.wait_log(rb"http on (\S+:\d+)", 10).group(1).decode()


def scrape(url: str) -> dict[str, float]:
    """Every sample of ``url``/metrics: ``name{labels}`` (sorted) -> value."""
    status, text = http_json(url + "/metrics")
    assert status == 200 and isinstance(text, str)
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}" if labels else s.name] = s.value
    return out


def promtool_check(tool: str, url: str) -> None:
    _, text = http_json(url + "/metrics")
    result = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True,
                            text=True, timeout=30, check=False)
    assert result.returncode == 0, result.stdout + result.stderr


def cluster_status(pd: str) -> tuple[int, dict[str, object], str]:
    result = subprocess.run(
        [sys.executable, "-m", "estream.cli.main", "cluster", "status", "--json", "--pd", pd],
        capture_output=True, text=True, timeout=60, check=False)
    return result.returncode, json.loads(result.stdout), result.stderr


def wait_for(check: object, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


async def test_rangeserver_health_metrics_and_promtool(cluster: Cluster) -> None:
    tool = promtool()
    urls = [http_url(s) for s in cluster.servers]
    for url in urls:
        assert http_json(url + "/healthz")[0] == 200
        wait_for(lambda url=url: http_json(url + "/readyz")[0] == 200)
        assert http_json(url + "/nothing")[1]["error"]["code"] == "NOT_FOUND"
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("metered", replicas=2, ack_count=2)
        async with await client.open_writer("metered") as writer:
            for i in range(20):
                await writer.append(b"x" * 100 + str(i).encode())
        read = [r.offset async for r in client.read("metered", start=0)]
        assert read == list(range(20))
    for url in urls:
        seen = scrape(url)
        assert seen["estream_rangeserver_append_records_total"] >= 20
        assert seen["estream_rangeserver_append_bytes_total"] >= 20 * 100
        assert seen['estream_rangeserver_request_seconds_count{op="APPEND"}'] >= 1
        assert seen["estream_rangeserver_fsync_seconds_count"] >= 1
        assert seen['estream_rangeserver_replicas{state="sealed"}'] >= 1  # (by the close)
        assert seen["estream_rangeserver_disk_free_bytes"] > 0
        assert seen["estream_rangeserver_registered"] == 1
        assert seen["estream_rangeserver_log_failed"] == 0
        assert seen["estream_rangeserver_append_delay_seconds"] == 0  # below the watermark
        assert seen["estream_rangeserver_carried_replicas_total"] >= 0
        assert seen["estream_rangeserver_carried_bytes_total"] >= 0
        assert "process_resident_memory_bytes" in seen
        promtool_check(tool, url)
    assert sum(scrape(u).get("estream_rangeserver_read_bytes_total", 0) for u in urls) > 0


def test_pd_metrics_pass_promtool(cluster: Cluster) -> None:
    tool = promtool()
    for url in cluster.pd.http_urls:
        promtool_check(tool, url)
        seen = scrape(url)
        assert seen["estream_pd_raft_proposals_total"] >= 0
        assert "process_cpu_seconds_total" in seen
        assert not any(name.startswith("estream_pd_raft_commit_seconds_p") for name in seen)
        assert "estream_pd_raft_commit_seconds_count" in seen  # the histogram instead
    # The reclaim backlog: set by the leader each round, 0 on followers each tick.
    wait_for(lambda: all("estream_reclaim_backlog_replicas" in scrape(url)
                         for url in cluster.pd.http_urls), 20.0)


async def test_a_stalled_writer_shows_in_range_server_metrics(cluster: Cluster) -> None:
    """Stream on both servers, ack_count 2: one replica hangs (its proxy holds every
    frame), so the writer can neither acknowledge nor roll (no third server). The other
    replica holds records past its confirm offset, and the age of that grows."""
    hung, healthy = cluster.servers
    url = http_url(healthy)
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("stalls", replicas=2, ack_count=2)
        writer = await client.open_writer("stalls", delivery_timeout_s=30.0)
        await writer.append(b"before")
        assert scrape(url)["estream_rangeserver_unconfirmed_age_seconds"] == 0
        hung.proxy.partition()  # type: ignore[union-attr]
        try:
            pending = [asyncio.ensure_future(writer.append(b"stalled %d" % i))
                       for i in range(5)]
            await asyncio.sleep(1.0)
            assert not any(p.done() for p in pending), "nothing can be acknowledged"
            first = scrape(url)
            assert first["estream_rangeserver_unconfirmed_records"] >= 1
            await asyncio.sleep(1.5)
            second = scrape(url)
            assert second["estream_rangeserver_unconfirmed_records"] >= 1
            assert second["estream_rangeserver_unconfirmed_age_seconds"] >= 1.0
        finally:
            hung.proxy.heal()  # type: ignore[union-attr]
            for p in pending:
                p.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
            await asyncio.wait_for(asyncio.shield(writer.close()), 40)


def test_cluster_status_shows_a_paused_pd_node_as_unreachable(cluster: Cluster) -> None:
    code, status, _ = cluster_status(cluster.pd_addresses)
    assert code == 0 and status["healthy"] is True, status
    paused = cluster.pd.followers()[0]
    process = cluster.pd.nodes[paused].process
    assert process is not None
    process.signal(signal.SIGSTOP)
    try:
        code, status, stderr = cluster_status(cluster.pd_addresses)
    finally:
        process.signal(signal.SIGCONT)
    assert code == 1 and status["healthy"] is False
    nodes = {n["id"]: n for n in status["nodes"]}  # type: ignore[attr-defined]
    assert nodes[cluster.pd.nodes[paused].id]["role"] == "unreachable"
    assert sum(1 for n in nodes.values() if n["role"] == "leader") == 1
    assert "unreachable" in stderr


def test_pd_readyz_flips_when_two_nodes_die_and_come_back(cluster: Cluster) -> None:
    """Last in this module: it takes the module's PD majority away for a while."""
    pd = cluster.pd
    leader = pd.leader()
    survivor = next(i for i in range(3) if i != leader)
    url = pd.http_urls[survivor]
    wait_for(lambda: http_json(url + "/readyz")[0] == 200)
    for i in range(3):
        if i != survivor:
            pd.kill9(i)
    wait_for(lambda: http_json(url + "/readyz")[0] == 503)
    status, body = http_json(url + "/readyz")
    assert body["error"]["code"] == "UNAVAILABLE" and "leader" in body["error"]["message"]
    assert http_json(url + "/healthz")[0] == 200, "liveness is not readiness"
    assert scrape(url)["estream_pd_ready"] == 0
    code, status, stderr = cluster_status(pd.nodes[survivor].rpc)
    assert code == 1 and "no leader" in stderr, (status, stderr)
    for i in range(3):
        if i != survivor:
            pd.restart(i)
    wait_for(lambda: http_json(url + "/readyz")[0] == 200, timeout_s=30)
    assert http_json(url + "/readyz")[1]["status"] == "ready"
