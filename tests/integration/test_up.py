"""`estream up` end to end: a real local cluster in a subprocess, used through the CLI, the
SDK and the README's own snippets.

Checks: ready within 30 s; streams work through the CLI and the SDK; an unknown stream is
a one-line error with exit code 1; a child killed with kill -9 is restarted; SIGINT stops
every child (their PIDs are gone); a new cluster's PD nodes start with --new-cluster, and
after a restart without it; a restart on the same data dir keeps the data; every
runnable README snippet passes against the cluster.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from estream.devcluster.cmdline import NEW_CLUSTER
from estream.devcluster.pd import alive_rangeservers, servers_not_beating
from estream.devcluster.process import free_port_block, run_cli
from estream.devcluster.up import PORT_SPAN, probe_ready
from estream.devcluster.upcluster import UpCluster, pid_alive

ROOT = Path(__file__).resolve().parents[2]
pytestmark = [pytest.mark.integration, pytest.mark.cluster(up=True, cwd=ROOT)]
READY_S_MAX = 30.0


def test_ready_within_30_s_and_prints_where_it_listens(cluster: UpCluster) -> None:
    assert cluster.ready_s < READY_S_MAX
    out = cluster.output()
    assert cluster.pd in out
    assert cluster.plan.admin_urls[0] in out
    assert probe_ready(cluster.plan, cluster.child_pids()) is None


def test_streams_through_the_cli(cluster: UpCluster) -> None:
    cluster.cli("stream", "create", "cli-orders", "--replicas", "3", "--ack-count", "2")
    appended = cluster.cli("append", "cli-orders", "--headers", "k=v", "--json", stdin="a\nb\nc\n")
    assert json.loads(appended.stdout)["count"] == 3
    assert cluster.cli("read", "cli-orders").stdout == "a\nb\nc\n"
    lines = cluster.cli("read", "cli-orders", "--from", "1", "--format", "json").stdout
    records = [json.loads(line) for line in lines.splitlines()]
    assert [(r["offset"], r["value"], r["headers"]) for r in records] == [
        (1, "b", {"k": "v"}),
        (2, "c", {"k": "v"}),
    ]
    assert cluster.cli("read", "cli-orders", "--follow", "--max", "3").stdout == "a\nb\nc\n"
    listed = json.loads(cluster.cli("stream", "list", "--json").stdout)
    assert "cli-orders" in [s["name"] for s in listed["streams"]]
    assert "cli-orders" in cluster.cli("stream", "list").stdout
    described = json.loads(cluster.cli("stream", "describe", "cli-orders", "--json").stdout)
    assert described["end_offset"] == 3 and len(described["ranges"][0]["replicas"]) == 3
    assert described["records"] == 3 and described["bytes"] > 0  # (sealed by the close)
    assert "records" in cluster.cli("stream", "describe", "cli-orders").stdout
    status = json.loads(cluster.cli("cluster", "status", "--json").stdout)
    assert status["cluster"]["leader"]["id"] is not None
    assert sum(1 for s in status["rangeservers"] if s["alive"]) == 3
    assert "alive" in cluster.cli("cluster", "status").stdout
    cluster.cli("stream", "trim", "cli-orders", "1")
    assert cluster.cli("read", "cli-orders", "--from", "1").stdout == "b\nc\n"
    refused = cluster.cli("stream", "delete", "cli-orders", "--id", str(described["id"] + 1000),
                          check=False)  # another incarnation's id: refused, nothing deleted
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    deleted = json.loads(cluster.cli("stream", "delete", "cli-orders", "--id",
                                     str(described["id"]), "--json").stdout)
    assert deleted == {"deleted": "cli-orders", "id": described["id"]}
    assert "cli-orders" not in cluster.cli("stream", "list").stdout


@pytest.mark.parametrize(
    "args",
    [
        ["stream", "describe", "no-such-stream"],
        ["stream", "delete", "no-such-stream"],
        ["read", "no-such-stream"],
        ["append", "no-such-stream"],
    ],
)
def test_unknown_stream_is_a_one_line_error_exit_1(cluster: UpCluster, args: list[str]) -> None:
    result = cluster.cli(*args, stdin="x\n", check=False)
    assert result.returncode == 1, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert "no-such-stream" in result.stderr or "STREAM_NOT_FOUND" in result.stderr


def test_duplicate_stream_is_a_one_line_error(cluster: UpCluster) -> None:
    cluster.cli("stream", "create", "dup")
    result = cluster.cli("stream", "create", "dup", check=False)
    assert result.returncode == 1 and len(result.stderr.strip().splitlines()) == 1


async def test_streams_through_the_sdk(cluster: UpCluster) -> None:
    import estream

    async with await estream.connect(cluster.pd) as client:
        await client.create_stream("sdk-orders", replicas=3, ack_count=2)
        async with await client.open_writer("sdk-orders") as writer:
            offsets = [
                await writer.append(f"r{i}".encode(), headers={"i": str(i)}) for i in range(5)
            ]
        assert offsets == [0, 1, 2, 3, 4]
        values = [r.value async for r in client.read("sdk-orders", start=0)]
        assert values == [f"r{i}".encode() for i in range(5)]
    assert cluster.cli("read", "sdk-orders", "--from", "3").stdout == "r3\nr4\n"
    cluster.cli("append", "sdk-orders", stdin="from-cli\n")
    async with await estream.connect(cluster.pd) as client:
        last = [r async for r in client.read("sdk-orders", start=5)]
        assert [(r.offset, r.value) for r in last] == [(5, b"from-cli")]


def readme_snippets() -> list[tuple[str, str]]:
    """(kind, code) of every README block marked ``<!-- test: run|python -->``."""
    text = (ROOT / "README.md").read_text()
    pattern = re.compile(r"<!-- test: (run|python) -->\n```\w*\n(.*?)```", re.S)
    return [(m.group(1), m.group(2)) for m in pattern.finditer(text)]


def localize(code: str, cluster: UpCluster, tmp: Path) -> str:
    """The README's default ports (71NN) moved to the test cluster's; /tmp to ``tmp``."""
    code = re.sub(
        r"127\.0\.0\.1:71(\d\d)", lambda m: f"127.0.0.1:{cluster.base_port + int(m.group(1))}", code
    )
    return code.replace("/tmp/", f"{tmp}/")


def test_readme_snippets_run_twice_against_the_cluster(cluster: UpCluster, tmp_path: Path) -> None:
    snippets = readme_snippets()
    assert sum(1 for kind, _ in snippets if kind == "run") >= 4
    assert any(kind == "python" for kind, _ in snippets)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    # ESTREAM_PD stands for the default addresses (7100..7102), moved like every README port
    env = {**os.environ, "PATH": path, "ESTREAM_PD": cluster.pd}
    # Twice, top to bottom: a reader following the README again must not trip on what it
    # made the first time.
    for kind, code in snippets + snippets:
        code = localize(code, cluster, tmp_path)
        if kind == "python":
            argv = [sys.executable, "-c", code]
        else:
            argv = ["bash", "-c", "set -euo pipefail\n" + code]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env, check=False
        )
        assert result.returncode == 0, f"{code}\nstdout:{result.stdout}\nstderr:{result.stderr}"


def test_child_killed_with_kill9_is_restarted(cluster: UpCluster) -> None:
    victim = cluster.child_pids()["rs-1"]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 20
    while cluster.child_pids()["rs-1"] == victim:
        assert time.monotonic() < deadline, cluster.output()
        time.sleep(0.1)
    assert f"(pid {victim}) exited with code -9" in cluster.output()
    restarted = cluster.child_pids()["rs-1"]
    assert not pid_alive(victim) and pid_alive(restarted)
    # estream up waits again, until PD has a beat from the new process (not by address:
    # the killed one stays listed alive a while), and says so.
    again = re.compile(rf"ready again in [0-9.]+s: .*rs-1 \(pid {restarted}\)")
    while not again.search(cluster.output()):
        assert time.monotonic() < deadline + 20, cluster.output()
        time.sleep(0.2)
    rs1 = cluster.plan.range_servers[1]
    assert servers_not_beating([(rs1.address, restarted)],
                               alive_rangeservers(cluster.plan.admin_urls)) == []
    assert probe_ready(cluster.plan, cluster.child_pids()) is None
    cluster.cli("stream", "create", "after-restart")
    cluster.cli("append", "after-restart", stdin="x\ny\n")
    assert cluster.cli("read", "after-restart").stdout == "x\ny\n"


def proc_args(pid: int) -> list[str]:
    return Path(f"/proc/{pid}/cmdline").read_text().split("\0")


def run_up(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli(["up", *args], timeout_s=30, cwd=ROOT)


def test_busy_port_and_busy_data_dir_are_one_line_errors(
    cluster: UpCluster, tmp_path: Path
) -> None:
    base = free_port_block(size=PORT_SPAN)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", base + 1))
        holder.listen()
        result = run_up("--data-dir", str(tmp_path / "d"), "--base-port", str(base))
    assert result.returncode == 1
    assert result.stderr.strip().count("\n") == 0 and "Traceback" not in result.stderr
    assert f"127.0.0.1:{base + 1} is already in use" in result.stderr
    result = run_up("--data-dir", str(cluster.data_dir),
                    "--base-port", str(free_port_block(size=PORT_SPAN)))
    assert result.returncode == 1
    assert "another `estream up` is running" in result.stderr
    assert result.stderr.strip().count("\n") == 0


@pytest.mark.cluster(fresh=True, up=True, cwd=ROOT, pd_nodes=1, range_servers=4)
def test_one_pd_node_and_four_range_servers(cluster: UpCluster) -> None:
    up = cluster
    status = json.loads(up.cli("cluster", "status", "--json").stdout)
    assert len(status["cluster"]["nodes"]) == 1
    assert sum(1 for s in status["rangeservers"] if s["alive"]) == 4
    up.cli("stream", "create", "small")
    up.cli("append", "small", stdin="1\n2\n")
    assert up.cli("read", "small").stdout == "1\n2\n"
    assert up.stop() == 0 and up.leftover == []


# Last in the module: it stops and restarts the module's cluster and leaves it stopped (a
# fresh cluster of its own cost one more start).
def test_sigint_stops_every_child_and_a_restart_keeps_the_data(cluster: UpCluster) -> None:
    up = cluster
    up.cli("stream", "create", "durable")
    up.cli("append", "durable", stdin="".join(f"rec-{i}\n" for i in range(20)))
    pids = up.child_pids()
    assert len(pids) == 7 and all(pid_alive(p) for p in pids.values())  # and kafka-0
    assert NEW_CLUSTER in proc_args(pids["pd-0"])  # empty dirs: no 2 s wait to elect
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": up.plan.kafka_addresses})
    admin.create_topics([NewTopic("stopping", 1)])["stopping"].result(30)
    producer = Producer({"bootstrap.servers": up.plan.kafka_addresses, "acks": "all"})
    reports: list[object] = []
    producer.produce("stopping", b"v", partition=0, on_delivery=lambda e, m: reports.append(e))
    assert producer.flush(30) == 0 and reports == [None]  # the gateway holds a writer
    assert up.stop(signal.SIGINT) == 0
    assert "stopped every process" in up.output()
    assert up.leftover == [] and not any(pid_alive(p) for p in pids.values())
    # The gateway stopped before PD, so it sealed its writer's range as it closed it.
    gateway_log = (up.data_dir / "logs" / "kafka-0.log").read_text()
    assert "stopped" in gateway_log and "not sealed at close" not in gateway_log
    up.start()
    assert up.cli("read", "durable").stdout == "".join(f"rec-{i}\n" for i in range(20))
    up.cli("append", "durable", stdin="after\n")
    assert up.cli("read", "durable", "--from", "20").stdout == "after\n"
    new_pids = up.child_pids()
    assert set(new_pids.values()).isdisjoint(pids.values())
    assert "--join" in proc_args(new_pids["pd-0"])
    assert NEW_CLUSTER not in proc_args(new_pids["pd-0"])  # restarted: it may wait
    assert up.stop(signal.SIGTERM) == 0
    assert up.leftover == [] and not any(pid_alive(p) for p in new_pids.values())
