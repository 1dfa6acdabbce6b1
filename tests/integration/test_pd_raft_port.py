"""The Raft port against a client without the password (pd/shell/raftwire.py): a 64 MiB
frame announced and trickled at about 1 MiB/s to the leader costs it little CPU, and the
leader keeps leading (same term) while creates and a writer's appends carry on."""

from __future__ import annotations

import asyncio
import os
import struct
import time
from pathlib import Path
from typing import Final

import pytest

import estream
from estream.devcluster.cluster import Cluster
from estream.devcluster.pd import http_json

pytestmark = [pytest.mark.integration, pytest.mark.cluster(range_servers=3)]

TRICKLE_S: Final = 25.0
CHUNK_BYTES: Final = 64 * 1024
CHUNKS_PER_S: Final = 16  # 1 MiB/s
ANNOUNCED_BYTES: Final = 64 * 1024 * 1024
# The leader's whole CPU (ticks, heartbeats, creates, keepalives and the trickle) over the
# trickle: re-concatenating the buffer on every read cost about 4 s here, against under
# 1 s with the frame refused on its announcement.
LEADER_CPU_S_MAX: Final = 2.0
# Bytes one connection may take before it is closed: the announcement is refused at once
# (the client's socket buffers take a little more before it sees the close).
CONNECTION_BYTES_MAX: Final = 1024 * 1024
CREATE_S_MAX: Final = 2.0


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (/proc/PID/stat, fields 14 and 15)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def term_of(url: str) -> float:
    _, text = http_json(url + "/metrics")
    for line in str(text).splitlines():
        if line.startswith("estream_pd_raft_term "):
            return float(line.split()[1])
    raise AssertionError("no estream_pd_raft_term in /metrics")


async def trickle(address: str, deadline: float) -> list[int]:
    """Announce a 64 MiB frame and send it at about 1 MiB/s until ``deadline``; connect
    again whenever the leader closes the connection. Returns the bytes sent on each
    connection."""
    host, _, port = address.rpartition(":")
    connections: list[int] = []
    while time.monotonic() < deadline and len(connections) < 200:
        sent = 0
        try:
            _, writer = await asyncio.open_connection(host, int(port))
        except OSError:
            await asyncio.sleep(0.1)
            continue
        try:
            writer.write(struct.pack("i", ANNOUNCED_BYTES))
            while time.monotonic() < deadline and not writer.is_closing():
                writer.write(b"\0" * CHUNK_BYTES)
                await writer.drain()
                sent += CHUNK_BYTES
                await asyncio.sleep(1 / CHUNKS_PER_S)
        except OSError:
            pass  # closed by the leader: connect again
        finally:
            writer.close()
            connections.append(sent)
        await asyncio.sleep(0.1)
    return connections


# 25 s of trickling: in `make chaos` (the nemesis' hostile client trickles frames on every
# port in every `make test`).
@pytest.mark.slow
async def test_a_trickled_64_mib_frame_does_not_unseat_the_leader(cluster: Cluster) -> None:
    pd = cluster.pd
    leader = pd.leader()
    node = pd.nodes[leader]
    assert node.process is not None
    term = term_of(node.url)
    failures: list[BaseException] = []
    creates: list[float] = []
    async with await estream.connect(cluster.pd_addresses) as client:
        await client.create_stream("trickle-writer", replicas=3, ack_count=2)
        async with await client.open_writer("trickle-writer") as writer:
            cpu_before = cpu_seconds(node.process.pid)
            deadline = time.monotonic() + TRICKLE_S
            attack = asyncio.ensure_future(trickle(node.raft, deadline))
            appended = 0
            while time.monotonic() < deadline:
                started = time.monotonic()
                try:
                    await client.create_stream(f"trickle-{len(creates)}")
                except estream.EstreamError as exc:
                    failures.append(exc)
                creates.append(time.monotonic() - started)
                for _ in range(10):
                    try:
                        await writer.append(b"x" * 100)
                        appended += 1
                    except estream.EstreamError as exc:
                        failures.append(exc)
                await asyncio.sleep(0.2)
            cpu_spent = cpu_seconds(node.process.pid) - cpu_before
            sent = await attack
    assert failures == []
    assert appended >= 100
    assert pd.leader() == leader and term_of(node.url) == term
    assert max(creates) < CREATE_S_MAX, creates
    assert max(sent) < CONNECTION_BYTES_MAX, sent
    assert cpu_spent < LEADER_CPU_S_MAX, cpu_spent


def test_a_bind_that_fails_closes_its_socket() -> None:
    """pysyncobj retries binding its Raft port every second while it is taken; each failed
    try left a socket to the garbage collector (a ResourceWarning each, which failed
    whatever test was running in a process hosting a PD node)."""
    import gc
    import socket
    import warnings

    import pysyncobj.transport
    from pysyncobj.poller import createPoller

    from pd.shell import raftpatch

    raftpatch.install()
    taken = socket.socket()
    taken.bind(("127.0.0.1", 0))
    taken.listen()
    try:
        server = pysyncobj.transport.TcpServer(createPoller("auto"), "127.0.0.1",
                                               taken.getsockname()[1],
                                               onNewConnection=lambda conn: None)
        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            for _ in range(3):
                with pytest.raises(OSError):
                    server.bind()
            del server
            gc.collect()
    finally:
        taken.close()
    assert [w for w in seen if issubclass(w.category, ResourceWarning)] == []
