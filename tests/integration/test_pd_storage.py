"""A real `estream pd` node on damaged files: a torn journal tail is cut, damage stops it.

A Raft member must not vote or lead with a log it cannot trust: a damaged journal, vote
file or snapshot makes the node refuse to start with one clear line (and exit code 2),
instead of replaying changed bytes as different commands.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from estream.devcluster.pd import PdCluster, start_pd_cluster
from estream.net.pdclient import PDClient
from pd.shell.journal import scan

pytestmark = pytest.mark.integration


@pytest.fixture
def node(tmp_path: Path) -> Iterator[PdCluster]:
    c = start_pd_cluster(tmp_path, n=1)
    try:
        yield c
    finally:
        c.stop()


async def _register(cluster: PdCluster, count: int) -> None:
    async with PDClient(cluster.rpc_addresses, timeout_s=10) as client:
        for i in range(count):
            await client.register_server(f"rs-{i}", f"127.0.0.1:{7300 + i}")


def _stop(cluster: PdCluster) -> Path:
    cluster.stop()
    return cluster.nodes[0].data_dir


def _start_expecting_refusal(cluster: PdCluster) -> str:
    done = subprocess.run(cluster.nodes[0].args(), capture_output=True, text=True, timeout=30)
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
    return lines[0]


async def test_a_torn_journal_tail_is_cut_and_the_node_serves(node: PdCluster) -> None:
    await _register(node, 3)
    journal = _stop(node) / "raft.journal"
    data = bytearray(journal.read_bytes())
    end = scan(data).valid_end  # zeros follow (space written ahead)
    data[end : end + 3] = b"\x07\x00\x00"  # a record header cut by a crash
    journal.write_bytes(data)
    node.nodes[0].start()
    node.nodes[0].wait_serving()
    async with PDClient(node.rpc_addresses, timeout_s=10) as client:
        deadline = time.monotonic() + 10
        while {s.id for s in await client.list_servers()} < {"rs-0", "rs-1", "rs-2"}:
            assert time.monotonic() < deadline, "the journal's entries were not replayed"
            await asyncio.sleep(0.05)
    assert scan(journal.read_bytes()).torn == "zero fill"  # the cut bytes are zeros again


async def test_a_damaged_journal_record_stops_the_node_with_one_line(node: PdCluster) -> None:
    await _register(node, 3)
    journal = _stop(node) / "raft.journal"
    data = bytearray(journal.read_bytes())
    offsets = scan(bytes(data)).offsets
    assert len(offsets) >= 3
    data[offsets[1] + 20] ^= 0x01  # the second record; valid records follow it
    journal.write_bytes(bytes(data))
    line = _start_expecting_refusal(node)
    assert f"raft.journal: damaged record at byte {offsets[1]}" in line
    assert f"with a valid record at byte {offsets[2]} after it" in line
    assert "move its --data-dir aside" in line


async def test_a_damaged_vote_file_stops_the_node(node: PdCluster) -> None:
    await _register(node, 1)
    meta = _stop(node) / "raft.journal.meta"
    data = bytearray(meta.read_bytes())
    data[2] ^= 0x01
    meta.write_bytes(bytes(data))
    assert "raft.journal.meta: damaged" in _start_expecting_refusal(node)


async def test_a_damaged_snapshot_stops_the_node(node: PdCluster, tmp_path: Path) -> None:
    await _register(node, 1)
    data_dir = _stop(node)
    (data_dir / "raft.dump").write_bytes(b"\x81\xa1v\x01" + bytes(8))  # a map, bad checksum
    assert "raft.dump: damaged" in _start_expecting_refusal(node)
