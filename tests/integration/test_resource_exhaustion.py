"""Real processes out of disk and out of descriptors, back without a restart.

A range server on a small tmpfs filled by a file beside its log: the writer keeps being
acknowledged (it rolls to the other servers), the server answers ``/readyz`` 503 and its
metric says "disk", PD places no new range there; once the file is deleted the same
process is ready again and takes new ranges. A range server whose descriptor limit is
lowered (``prlimit``) and then used up by idle connections recovers once they close.
Every acknowledged record reads back."""

from __future__ import annotations

import asyncio
import os
import resource
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import estream
from estream.devcluster.cluster import Cluster, RangeServerProcess
from estream.devcluster.pd import http_json
from tests.integration.test_metrics import scrape

pytestmark = [pytest.mark.integration,
              pytest.mark.cluster(fresh=True, pd_nodes=3, range_servers=4,
                                  rangeserver_args=["--http", "127.0.0.1:0",
                                                    "--wal-segment-mib", "1"])]

TMPFS_MIB = 40
VALUE = b"v" * 16_000
back_within_s = 30.0  # a heartbeat or two, the probe, PD's view


def wait_for(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


@pytest.fixture
def small_disk(cluster: Cluster, tmp_path: Path) -> Iterator[RangeServerProcess]:
    """The cluster's first range server restarted on a ``TMPFS_MIB`` tmpfs holding its
    data (stopped and unmounted after the test)."""
    server = cluster.servers[0]
    saved = tmp_path / "saved"
    server.stop()
    shutil.copytree(server.data_dir, saved)
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_MIB}m", "tmpfs", str(server.data_dir)],
        capture_output=True, text=True, check=False)
    if mounted.returncode != 0:
        server.start()
        pytest.skip(f"cannot mount a tmpfs here (root needed): {mounted.stderr.strip()}")
    try:
        shutil.copytree(saved, server.data_dir, dirs_exist_ok=True)
        seen = server.launch()
        server.wait_started(seen)
        _log_since[server.data_dir] = seen  # its log goes on after the earlier process's
        yield server
    finally:
        server.stop()
        subprocess.run(["umount", str(server.data_dir)], check=False)
        shutil.copytree(saved, server.data_dir, dirs_exist_ok=True)  # for the cluster's stop


_log_since: dict[Path, int] = {}


def http_url(server: RangeServerProcess) -> str:
    """The current process's HTTP address (from its log, after the earlier ones')."""
    assert server.process is not None
    since = _log_since.get(server.data_dir, 0)
    found = server.process.wait_log(rb"http on (\S+:\d+)", 10, since=since)
    return "http://" + found.group(1).decode()


def ready(server: RangeServerProcess) -> tuple[int, Any]:
    """``/readyz``'s status and body (0 while the port does not answer yet)."""
    try:
        return http_json(http_url(server) + "/readyz")
    except OSError:
        return 0, None


def replicas_of(cluster: Cluster, name: str) -> list[set[str]]:
    return [{r["id"] for r in rng["replicas"]} for rng in cluster.describe(name)["ranges"]]


async def stream_on(client: Any, cluster: Cluster, server: RangeServerProcess,
                    prefix: str) -> tuple[str, Any]:
    """A new stream and its open writer, whose current range has a replica on ``server``
    (placement goes to the least loaded servers: a few streams are enough; a writer's
    range is its own, so the writer stays open)."""
    for i in range(6):
        name = f"{prefix}-{i}"
        await client.create_stream(name, replicas=3, ack_count=2)
        writer = await client.open_writer(name)
        await writer.append_batch([b"first"])
        if server.server_id in replicas_of(cluster, name)[-1]:
            return name, writer
        # (Left open, as the client closes it: its open range counts as load where it
        # is, so the next placement leans to ``server``; a close would seal it and have
        # PD place the next range anywhere.)
    pytest.fail(f"no new range placed on {server.server_id}")


async def read_values(client: Any, name: str) -> list[bytes]:
    return [r.value async for r in client.read(name)]


async def test_a_full_disk_refuses_then_recovers_without_a_restart(
    cluster: Cluster, small_disk: RangeServerProcess
) -> None:
    server = small_disk
    assert server.process is not None
    pid = server.process.pid
    wait_for(lambda: ready(server)[0] == 200, 20, "the server on tmpfs to be ready")
    async with await estream.connect(cluster.pd_addresses) as client:
        name, writer = await stream_on(client, cluster, server, "filled")
        free = shutil.disk_usage(server.data_dir).free
        filler = server.data_dir / "filler"
        with open(filler, "wb") as f:  # all but ~1 MiB (and the log's headroom) taken
            f.write(bytes(max(0, free - 1024 * 1024)))
        acknowledged: list[bytes] = [b"first"]
        async with writer:
            for i in range(40):  # 16 KB records, 64 at a time: 1 MiB per batch
                batch = [VALUE[:-8] + b"%08d" % (64 * i + j) for j in range(64)]
                await writer.append_batch(batch)  # never fails: the writer rolls away
                acknowledged += batch
                if ready(server)[0] == 503 and len(replicas_of(cluster, name)) > 1:
                    break
        status, body = ready(server)
        assert status == 503 and "disk is exhausted" in body["error"]["message"]
        metrics = scrape(http_url(server))
        assert metrics['estream_storage_exhausted{resource="disk"}'] == 1
        assert metrics['estream_storage_exhausted{resource="descriptors"}'] == 0
        await asyncio.sleep(2.5)  # heartbeats tell PD
        for i in range(3):  # no new range on a server out of room
            await client.create_stream(f"elsewhere-{i}", replicas=3, ack_count=2)
            assert server.server_id not in replicas_of(cluster, f"elsewhere-{i}")[0]

        filler.unlink()  # room again
        wait_for(lambda: ready(server)[0] == 200, back_within_s, "ready again")
        assert server.process.pid == pid and server.alive(), "no restart"
        assert scrape(http_url(server))['estream_storage_exhausted{resource="disk"}'] == 0
        await asyncio.sleep(2.5)
        _, again = await stream_on(client, cluster, server, "again")  # placed there again
        await again.close()
        assert await read_values(client, name) == acknowledged, "nothing acknowledged lost"


def before_hard(pid: int) -> int:
    return resource.prlimit(pid, resource.RLIMIT_NOFILE)[1]


async def test_exhausted_descriptors_recover_once_idle_connections_close(
    cluster: Cluster,
) -> None:
    server = cluster.servers[1]
    assert server.process is not None
    pid = server.process.pid
    wait_for(lambda: ready(server)[0] == 200, 20, "the server to be ready")
    async with await estream.connect(cluster.pd_addresses) as client:
        name, writer = await stream_on(client, cluster, server, "fds")
        async with writer:
            await writer.append_batch([b"warm"])  # its connections are open before the limit
            in_use = len(os.listdir(f"/proc/{pid}/fd"))
            limit = in_use + 24
            before = resource.prlimit(pid, resource.RLIMIT_NOFILE, (limit, before_hard(pid)))
            host, port = server.listen.rsplit(":", 1)
            idle = []
            try:
                for _ in range(64):  # more than the limit leaves: the server runs out
                    idle.append(await asyncio.open_connection(host, int(port)))
                await asyncio.sleep(0.5)
                acknowledged = [b"first", b"warm"]
                for i in range(24):  # 1 MiB segments: a switch needs a descriptor
                    batch = [VALUE[:-8] + b"%08d" % (64 * i + j) for j in range(64)]
                    await writer.append_batch(batch)  # never fails: the writer rolls away
                    acknowledged += batch
            finally:
                for _, w in idle:
                    w.close()
                resource.prlimit(pid, resource.RLIMIT_NOFILE, before)
        wait_for(lambda: ready(server)[0] == 200, back_within_s, "ready again")
        metrics = scrape(http_url(server))
        assert metrics["estream_rangeserver_storage_exhaustions_total"] >= 1, "it ran out"
        assert metrics['estream_storage_exhausted{resource="descriptors"}'] == 0
        assert server.process.pid == pid and server.alive(), "no restart"
        assert await read_values(client, name) == acknowledged
