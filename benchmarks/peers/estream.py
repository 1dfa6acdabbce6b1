"""estream itself, measured like a peer: 3 PD nodes and 3 range servers on 127.0.0.1
(started by the one launcher, :mod:`estream.devcluster`, so each range server can be killed
or hung by PID), driven through
the public SDK (``estream.connect``, ``Client.open_writer``, ``Writer.append``,
``Client.read``) and, for placement-driver commits, :class:`estream.net.pdclient.PDClient`.

:func:`sdk_missing` says why the SDK cannot be used yet (empty when it can); the
comparison then marks estream's rows "pending" instead of measuring anything else.

Side effects: child processes (estream pd / rangeserver), files under the work dir, sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

from benchmarks.peers.load import payload
from estream.devcluster.cluster import Cluster, start_cluster

RANGE_SERVERS = 3
READY_TIMEOUT_S = 60.0
FILL_BATCH = 500


def sdk_missing() -> str:
    """Why estream's SDK cannot be driven yet ("" when it can)."""
    try:
        module = importlib.import_module("estream")
        importlib.import_module("estream.sdk.client")
        importlib.import_module("estream.sdk.writer")
    except ImportError as exc:
        return f"SDK not importable yet ({exc})"
    if not hasattr(module, "connect"):
        return "SDK not landed yet (estream.connect missing)"
    return ""


@contextlib.contextmanager
def estream_cluster(work: Path, range_servers: int = RANGE_SERVERS) -> Iterator[Cluster]:
    """3 PD nodes and ``range_servers`` range servers from the one launcher
    (:func:`~estream.devcluster.cluster.start_cluster`: ``pd_addresses``, ``kill9``,
    ``pause`` (SIGSTOP), ``resume``); every process stopped by PID on exit."""
    with start_cluster(work, pd_nodes=3, range_servers=range_servers) as cluster:
        yield cluster


@contextlib.asynccontextmanager
async def connect(cluster: Cluster) -> AsyncIterator[Any]:
    """An SDK client, once every range server is registered and alive."""
    import estream

    client = await estream.connect(cluster.pd_addresses, timeout_s=10.0)
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while True:
            servers = await client.list_servers()
            if sum(1 for s in servers if s.alive) >= len(cluster.servers):
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"range servers not all alive: {servers}")
            await asyncio.sleep(0.2)
        yield client
    finally:
        await client.close()


async def open_range_replicas(client: Any, name: str) -> list[str]:
    """The addresses of the replicas of ``name``'s open (last) range."""
    meta = await client.describe_stream(name)
    return [replica.address for replica in meta.ranges[-1].replicas]


async def fill(writer: Any, count: int, size: int, inflight: int, time_s: float) -> int:
    """Write ``count`` records fast (bounded by ``time_s``) to set up a read: batches of
    FILL_BATCH through ``append_batch``, ``inflight`` batches at a time; returns how many."""
    done = 0
    deadline = time.monotonic() + time_s

    async def worker() -> None:
        nonlocal done
        while done < count and time.monotonic() < deadline:
            first, n = done, min(FILL_BATCH, count - done)
            done += n
            await writer.append_batch([payload(size, first + j) for j in range(n)])

    await asyncio.gather(*(worker() for _ in range(inflight)))
    await writer.flush()
    return done


async def catch_up(client: Any, name: str, count: int, time_s: float) -> int:
    """Read records ``[0, count)`` in order; returns how many arrived within ``time_s``."""
    received = 0
    deadline = time.monotonic() + time_s
    async for _record in client.read(name, start=0, end=count):
        received += 1
        if received % 1024 == 0 and time.monotonic() > deadline:
            break
    return received


async def catch_up_batches(client: Any, name: str, count: int, time_s: float) -> int:
    """Read records ``[0, count)`` with the batch-level API (``Client.read_batches``: one
    column set per stored batch); returns how many records arrived within ``time_s``."""
    received = 0
    deadline = time.monotonic() + time_s
    async for batch in client.read_batches(name, start=0, end=count):
        received += batch.count
        if time.monotonic() > deadline:
            break
    return received


async def tail_latencies(client: Any, writer: Any, name: str, count: int, size: int,
                         time_s: float) -> list[float]:
    """Append one record at a time; ms from the append call to its arrival in a tailing
    reader (``follow=True``)."""
    start = await client.end_offset(name)
    sent: dict[int, float] = {}
    latencies: list[float] = []
    arrived = asyncio.Event()

    async def tail() -> None:
        async for record in client.read(name, start=start, follow=True):
            i = int.from_bytes(record.value[:8], "little")
            if i in sent:
                latencies.append((time.perf_counter() - sent.pop(i)) * 1000.0)
            arrived.set()

    reader = asyncio.ensure_future(tail())
    deadline = time.monotonic() + time_s
    try:
        for i in range(1, count + 1):
            if time.monotonic() > deadline or reader.done():
                break
            arrived.clear()
            sent[i] = time.perf_counter()
            await writer.append(payload(size, i))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(arrived.wait(), 2.0)
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await reader
    return latencies
