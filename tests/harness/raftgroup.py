"""Three PD Raft nodes (``pd.shell.raft.RaftNode``) started on the test's event loop on
loopback ports, for the tests of the Raft shell itself."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator
from pathlib import Path

from estream.devcluster.process import free_port
from pd.shell.raft import RaftNode


@contextlib.asynccontextmanager
async def raft_group(tmp_path: Path, wait_s: float = 10.0) -> AsyncIterator[list[RaftNode]]:
    """Three started nodes on this loop with one leader they all know (within ``wait_s``),
    closed afterwards (a new cluster: ``new_cluster``)."""
    addresses = [f"127.0.0.1:{free_port()}" for _ in range(3)]
    nodes = [RaftNode(a, [p for p in addresses if p != a], tmp_path / str(i), password=None,
                      new_cluster=True) for i, a in enumerate(addresses)]
    for node in nodes:
        node.start()
    try:
        deadline = time.monotonic() + wait_s
        while len({n.leader() for n in nodes} - {None}) != 1 or any(
                n.leader() is None for n in nodes):
            assert time.monotonic() < deadline, "no leader"
            await asyncio.sleep(0.02)
        yield nodes
    finally:
        for node in nodes:
            await asyncio.to_thread(node.close)


__all__ = ["raft_group"]
