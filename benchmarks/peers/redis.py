"""Redis 7, one node with ``appendonly yes`` and ``appendfsync always``: XADD / XRANGE / XREAD
through redis-py asyncio. The "fast local log" row: durable on one disk, no replication.

Many in flight = ``pipelines`` concurrent pipelines of ``batch`` XADDs each (one round
trip per pipeline; each record's latency is its pipeline's). :func:`redis_server` stops
the server by PID on exit.

Side effects: a child process (redis-server), files under the work dir, sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import redis.asyncio as aioredis

from benchmarks.peers.load import payload
from benchmarks.peers.procs import ProcessGroup, find_binary, free_port
from estream.devcluster.process import ManagedProcess

HOST = "127.0.0.1"
READ_CHUNK = 1000


@dataclass
class RedisServer:
    host: str
    port: int
    process: ManagedProcess


@contextlib.contextmanager
def redis_server(work: Path) -> Iterator[RedisServer]:
    """Start redis-server (AOF, fsync always, no RDB snapshots); stop it by PID on exit."""
    port = free_port(HOST)
    data = work / "redis"
    data.mkdir(parents=True, exist_ok=True)
    args = [find_binary("redis-server"), "--bind", HOST, "--port", str(port),
            "--dir", str(data), "--appendonly", "yes", "--appendfsync", "always",
            "--save", "", "--daemonize", "no", "--protected-mode", "yes",
            "--maxclients", "1024"]
    with ProcessGroup() as group:
        process = group.start(args, data / "server.log", f"{HOST}:{port}")
        yield RedisServer(HOST, port, process)


@contextlib.asynccontextmanager
async def connect(server: RedisServer, max_connections: int = 64
                  ) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis(host=server.host, port=server.port,
                            max_connections=max_connections, socket_timeout=30)
    try:
        yield client
    finally:
        await client.aclose()


async def xadd_batch(client: aioredis.Redis, key: str, values: list[bytes]) -> int:
    """XADD every value in one pipeline (no MULTI); returns how many were added."""
    if len(values) == 1:
        await client.xadd(key, {b"v": values[0]})
        return 1
    pipe = client.pipeline(transaction=False)
    for value in values:
        pipe.xadd(key, {b"v": value})
    await pipe.execute()
    return len(values)


async def xadd_spread(client: aioredis.Redis, items: list[tuple[str, bytes]]) -> int:
    """XADD each (key, value) in one pipeline (no MULTI); returns how many were added."""
    pipe = client.pipeline(transaction=False)
    for key, value in items:
        pipe.xadd(key, {b"v": value})
    await pipe.execute()
    return len(items)


async def fill(client: aioredis.Redis, key: str, count: int, size: int, time_s: float,
               batch: int = 256) -> int:
    done = 0
    deadline = time.monotonic() + time_s
    while done < count and time.monotonic() < deadline:
        n = min(batch, count - done)
        done += await xadd_batch(client, key, [payload(size, done + j) for j in range(n)])
    return done


async def catch_up(client: aioredis.Redis, key: str, count: int, time_s: float) -> int:
    """XRANGE from the start in chunks of READ_CHUNK; returns how many records were read."""
    received = 0
    start = "-"
    deadline = time.monotonic() + time_s
    while received < count and time.monotonic() < deadline:
        chunk = await client.xrange(key, min=start, max="+", count=READ_CHUNK)
        if not chunk:
            break
        received += len(chunk)
        last = chunk[-1][0]
        start = "(" + (last.decode() if isinstance(last, bytes) else str(last))
    return received


async def tail_latencies(client: aioredis.Redis, reader: aioredis.Redis, key: str, count: int,
                         size: int, time_s: float) -> list[float]:
    """XADD one record at a time to a fresh ``key``; ms from the XADD call to its arrival
    in an XREAD BLOCK."""
    latencies: list[float] = []
    last_id = "0-0"  # a fresh key: every entry is new
    deadline = time.monotonic() + time_s
    for i in range(count):
        if time.monotonic() > deadline:
            break
        read = asyncio.ensure_future(reader.xread({key: last_id}, count=1, block=2000))
        await asyncio.sleep(0)  # let the XREAD go out before the XADD
        started = time.perf_counter()
        entry_id = await client.xadd(key, {b"v": payload(size, i)})
        answer = await read
        if answer:
            latencies.append((time.perf_counter() - started) * 1000.0)
        last_id = entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)
    return latencies
