"""One asyncio driver per system, with the same small surface, so that every scenario in
``compare.py`` runs the same code against estream, NATS JetStream and Redis.

A driver creates logs (an estream stream, a JetStream R3 stream, a Redis stream key),
returns an append op for the bounded load loop (:func:`benchmarks.peers.load.run_ops`)
on one log or spread over many,
fills a log, reads it back from the start, and measures tail latency. Redis's "many in
flight" is pipelines of ``REDIS_BATCH`` XADDs (the way a user drives Redis fast).

Side effects: sockets (each driver owns its client connection).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Protocol

from benchmarks.peers import estream as pe
from benchmarks.peers import nats as pn
from benchmarks.peers import redis as pr
from benchmarks.peers.load import Op, payload, round_robin

REDIS_BATCH = 32
BATCH = 32  # records per batch for the batched rows (as Redis's pipelines)


class Driver(Protocol):
    name: str

    async def new_log(self, name: str) -> Any: ...
    def append_op(self, log: Any, size: int, inflight: int) -> tuple[Op, int]: ...
    def spread_op(self, logs: list[Any], size: int, inflight: int) -> tuple[Op, int]: ...
    async def fill(self, log: Any, count: int, size: int, time_s: float) -> int: ...
    async def catch_up(self, log: Any, count: int, time_s: float) -> int: ...
    async def tail(self, name: str, count: int, size: int, time_s: float) -> list[float]: ...


class EstreamDriver:
    """estream through its SDK: one writer per stream, 3 replicas, ack 2, fsync."""

    def __init__(self, name: str, client: Any, **writer_options: Any) -> None:
        self.name, self.client = name, client
        self.writer_options = writer_options  # open_writer keywords (linger_ms, ...)
        self.writers: list[Any] = []

    async def new_log(self, name: str) -> tuple[str, Any]:
        await self.client.create_stream(name, replicas=3, ack_count=2)
        writer = await self.client.open_writer(name, **self.writer_options)
        self.writers.append(writer)
        return name, writer

    def append_op(self, log: tuple[str, Any], size: int, inflight: int) -> tuple[Op, int]:
        writer = log[1]

        async def op(i: int) -> int:
            await writer.append(payload(size, i))
            return 1

        return op, inflight

    def spread_op(self, logs: list[tuple[str, Any]], size: int,
                  inflight: int) -> tuple[Op, int]:
        return round_robin([self.append_op(log, size, 1)[0] for log in logs]), inflight

    async def append_many(self, log: tuple[str, Any], values: list[bytes]) -> int:
        await log[1].append_batch(values)
        return len(values)

    async def fill(self, log: tuple[str, Any], count: int, size: int, time_s: float) -> int:
        return await pe.fill(log[1], count, size, 4, time_s)

    async def catch_up(self, log: tuple[str, Any], count: int, time_s: float) -> int:
        return await pe.catch_up(self.client, log[0], count, time_s)

    async def catch_up_batches(self, log: tuple[str, Any], count: int, time_s: float) -> int:
        """The batch-level read API, when this SDK has it (else -1)."""
        if not hasattr(self.client, "read_batches"):
            return -1
        return await pe.catch_up_batches(self.client, log[0], count, time_s)

    async def tail(self, name: str, count: int, size: int, time_s: float) -> list[float]:
        _, writer = await self.new_log(name)
        return await pe.tail_latencies(self.client, writer, name, count, size, time_s)

    async def close(self) -> None:
        for writer in self.writers:
            with contextlib.suppress(Exception):
                await writer.close()


class NatsDriver:
    """NATS JetStream through nats-py: one request (publish, wait for the PubAck) per record."""

    def __init__(self, name: str, js: Any) -> None:
        self.name, self.js = name, js

    async def new_log(self, name: str) -> str:
        return await pn.create_stream(self.js, name)

    def append_op(self, log: str, size: int, inflight: int) -> tuple[Op, int]:
        js = self.js

        async def op(i: int) -> int:
            await js.publish(log, payload(size, i))
            return 1

        return op, inflight

    def spread_op(self, logs: list[str], size: int, inflight: int) -> tuple[Op, int]:
        return round_robin([self.append_op(log, size, 1)[0] for log in logs]), inflight

    async def append_many(self, log: str, values: list[bytes]) -> int:
        futures = [await self.js.publish_async(log, value) for value in values]
        await asyncio.gather(*futures)
        return len(values)

    async def fill(self, log: str, count: int, size: int, time_s: float) -> int:
        return await pn.fill(self.js, log, count, size, time_s)

    async def catch_up(self, log: str, count: int, time_s: float) -> int:
        return await pn.catch_up(self.js, log, count, time_s)

    async def tail(self, name: str, count: int, size: int, time_s: float) -> list[float]:
        subject = await self.new_log(name)
        return await pn.tail_latencies(self.js, subject, count, size, time_s)

    async def close(self) -> None:
        return None


class RedisDriver:
    """Redis XADD through redis-py asyncio; many in flight = concurrent pipelines."""

    def __init__(self, name: str, client: Any, reader: Any) -> None:
        self.name, self.client, self.reader = name, client, reader

    async def new_log(self, name: str) -> str:
        await self.client.delete(name)
        return name

    def append_op(self, log: str, size: int, inflight: int) -> tuple[Op, int]:
        batch = min(REDIS_BATCH, inflight)
        client = self.client

        async def op(i: int) -> int:
            return await pr.xadd_batch(client, log, [payload(size, i + j) for j in range(batch)])

        return op, max(1, inflight // batch)

    def spread_op(self, logs: list[str], size: int, inflight: int) -> tuple[Op, int]:
        """Pipelines of ``REDIS_BATCH`` XADDs, each to the next key (as ``append_op``'s)."""
        batch, n, client = min(REDIS_BATCH, inflight), len(logs), self.client

        async def op(i: int) -> int:
            return await pr.xadd_spread(client, [(logs[(i * batch + j) % n], payload(size, i + j))
                                                 for j in range(batch)])

        return op, max(1, inflight // batch)

    async def fill(self, log: str, count: int, size: int, time_s: float) -> int:
        return await pr.fill(self.client, log, count, size, time_s)

    async def catch_up(self, log: str, count: int, time_s: float) -> int:
        return await pr.catch_up(self.client, log, count, time_s)

    async def tail(self, name: str, count: int, size: int, time_s: float) -> list[float]:
        await self.client.delete(name)
        return await pr.tail_latencies(self.client, self.reader, name, count, size, time_s)

    async def close(self) -> None:
        return None


class Batched:
    """Another driver's appends in batches of BATCH records, ``inflight // BATCH`` batches
    in flight: estream ``Writer.append_batch``, NATS ``publish_async`` then wait for the
    batch's acks. Each record's latency is its batch's."""

    def __init__(self, inner: Any, label: str) -> None:
        self.inner, self.name = inner, f"{inner.name} ({label})"

    async def new_log(self, name: str) -> Any:
        return await self.inner.new_log(name + "b")

    def append_op(self, log: Any, size: int, inflight: int) -> tuple[Op, int]:
        batch = min(BATCH, inflight)
        append_many = self.inner.append_many

        async def op(i: int) -> int:
            return int(await append_many(log, [payload(size, i * batch + j)
                                               for j in range(batch)]))

        return op, max(1, inflight // batch)
