"""The Kafka gateway's Fetch: a long poll over the partitions asked, each read through the
SDK's reader (so the object tier is transparent). A mixin of
:class:`~estream.kafka.shell.gateway.Gateway`.

What a consumer's fetches cost, and what this module keeps from one to the next (one
:class:`_Partition` per stream fetched, the least recently used dropped past
:data:`fetch_partitions_max`): the stream's end and start, looked up (PD, then the last
range's replicas) before answering only when a fetch reaches the end known, and in the
background once they are :data:`end_refresh_ms` old; the bytes per record, to size the
next read; and a read-ahead, the next chunks read at once while the client takes this one
(planned by :mod:`estream.kafka.readahead`, within a bound per partition and one for the
gateway), each used when a fetch asks for its offset. A fetch at an offset a batch
this gateway stored holds is answered from the tail cache (:mod:`estream.kafka.tailcache`,
filled by Produce) without a read.

Side effects: the SDK's reads; the loop's clock (the age of an end looked up).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any, Final

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.convert import fetch_batch
from estream.kafka.readahead import chunk_stop, plan_chunks
from estream.kafka.tailcache import TailCache
from estream.kafka.topics import stream_name
from estream.net.bounded import gather_bounded
from estream.sdk.client import Client
from estream.wire.errors import EstreamError

fetch_wait_ms_max: Final = 30_000  # the longest long poll held, whatever max_wait_ms says
record_bytes_guess: Final = 256  # a stream's record size before its first fetch
end_refresh_ms: Final = 1_000  # behind the end, the end known is looked up again (in the
#   background) once it is this old
fetch_partitions_max: Final = 4096  # partitions whose state is kept; past it the least
#   recently fetched is forgotten (its next fetch looks its end up again)
# A Fetch names any number of partitions (a frame holds millions, the same one many times):
fetch_partitions_in_flight_max: Final = 64  # partitions read at once
fetch_answer_bytes_max: Final = 64 * 1024 * 1024  # an answer's records, whatever max_bytes
#   says (as a broker's fetch.max.bytes); past it (and past the request's max_bytes) a
#   partition is answered with its offsets and no records, unread
fetch_partition_bytes_max: Final = 8 * 1024 * 1024  # one partition's read, whatever
#   partition_max_bytes says (so a round holds at most the answer's bound plus this much
#   per partition in flight)
fetch_waits_max: Final = 1024  # partitions a long poll waits on (distinct, in order)

_Chunk = tuple[bytes, int]  # Kafka batches, records in them
_Ahead = tuple[int, int, int, "asyncio.Task[_Chunk]"]  # offset, planned stop, max bytes, read


@dataclass(slots=True)
class _Partition:
    """What the gateway keeps of one fetched stream between fetches."""

    end: int = 0  # the readable end last known (a lower bound of the current one)
    start: int = 0
    stream_id: int = -1  # (a stream made again under the same name is another)
    checked_ms: float = -1e18  # the loop's time of the last lookup of both
    record_bytes: int = record_bytes_guess
    ahead: list[_Ahead] = field(default_factory=list)  # the next chunks' reads, in order
    refresh: asyncio.Task[None] | None = None  # the end's lookup in the background


class Fetch:
    """Fetch over ``client``."""

    client: Client
    _background: set[asyncio.Task[Any]]

    def _init_fetch(self) -> None:
        self._fetched: OrderedDict[str, _Partition] = OrderedDict()
        self.tail = TailCache()
        self.read_ahead_bytes = 0  # the chunks planned ahead, each at its max bytes
        self.read_ahead_refused = 0  # chunks not read ahead: the gateway's bound was reached

    def _fetch_state(self, name: str) -> _Partition:
        state = self._fetched.get(name)
        if state is None:
            state = self._fetched[name] = _Partition()
            while len(self._fetched) > fetch_partitions_max:
                _, old = self._fetched.popitem(last=False)
                self._drop_ahead(old)
                if old.refresh is not None:
                    old.refresh.cancel()
        else:
            self._fetched.move_to_end(name)
        return state

    async def _fetch_partition(self, topic: str, index: int, offset: int, max_bytes: int
                               ) -> tuple[ErrorCode, int, int, bytes]:
        """(error, high watermark, log start, record batches) of one partition now."""
        name = stream_name(topic, index)
        state = self._fetch_state(name)
        now_ms = asyncio.get_running_loop().time() * 1000
        try:
            if offset >= state.end or offset < state.start:
                await self._look_up(name, state, now_ms)
            elif now_ms - state.checked_ms > end_refresh_ms and (
                    state.refresh is None or state.refresh.done()):
                state.refresh = self._in_background(self._look_up(name, state, now_ms))
            end, start = state.end, state.start
            if offset < start or offset > end:
                self._drop_ahead(state)
                return ErrorCode.offset_out_of_range, end, start, b""
            if offset == end or max_bytes <= 0:  # (<= 0: the answer's budget is spent)
                return ErrorCode.none, end, start, b""
            cached = self.tail.take(name, state.stream_id, offset, end, max_bytes)
            if cached is not None:
                self._drop_ahead(state)
                return ErrorCode.none, end, start, cached[0]
            data, records = await self._chunk(name, state, offset, max_bytes)
            self._read_ahead(name, state, offset + records, max_bytes)
            return ErrorCode.none, end, start, data
        except (EstreamError, TimeoutError) as exc:
            state.checked_ms = -1e18  # (deleted, trimmed, moved: the next fetch looks up)
            self._drop_ahead(state)
            self.tail.forget(name)
            return kp.error_code(exc), -1, -1, b""

    async def _look_up(self, name: str, state: _Partition, now_ms: float) -> None:
        """The stream's end and start now (in the background, a failure leaves them as
        they were: the next fetch tries again). Another stream id than before (made again
        under the name) drops the read-ahead; the one fetch that starts a background
        lookup may still take a chunk of the old stream (``end_refresh_ms``' staleness)."""
        state.end = await self.client.end_offset(name)
        meta = await self.client.stream_meta(name)
        if meta.id != state.stream_id:  # made again under the name: the chunks read ahead
            self._drop_ahead(state)  # are the old stream's records
        state.start, state.stream_id = meta.start_offset, meta.id
        state.checked_ms = now_ms

    def _in_background(self, work: Awaitable[Any]) -> asyncio.Task[Any]:
        task = asyncio.ensure_future(work)
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        task.add_done_callback(lambda t: t.cancelled() or t.exception())
        return task

    def _read_ahead(self, name: str, state: _Partition, reached: int, max_bytes: int
                    ) -> None:
        """Keep the reads of the chunks after ``reached`` in flight, as many as the
        bounds hold (:func:`~estream.kafka.readahead.plan_chunks`), each planned to stop
        where the one after starts (so they run at once: the range servers' reads
        overlap the client's)."""
        if state.ahead and state.ahead[0][0] != reached:
            self._drop_ahead(state)  # (a chunk stopped short of its plan: plan again)
        at = state.ahead[-1][1] if state.ahead else reached
        chunks = plan_chunks(at, state.end, max_bytes, state.record_bytes,
                             len(state.ahead), self.read_ahead_bytes)
        wanted = plan_chunks(at, state.end, max_bytes, state.record_bytes,
                             len(state.ahead), 0)
        self.read_ahead_refused += len(wanted) - len(chunks)
        for at, stop in chunks:
            task = self._in_background(self._read(name, state, at, max_bytes, stop))
            state.ahead.append((at, stop, max_bytes, task))
            self.read_ahead_bytes += max_bytes

    async def _chunk(self, name: str, state: _Partition, offset: int, max_bytes: int
                     ) -> _Chunk:
        """The batches from ``offset``: the read-ahead's when it read that offset for a
        fetch as large (the chunks planned before it are dropped), else read now."""
        for i, (at, _, size, task) in enumerate(state.ahead):
            if at == offset and size == max_bytes:
                self._forget(state.ahead[: i + 1], task)
                state.ahead = state.ahead[i + 1 :]
                await asyncio.wait([task])  # (its failure or cancellation: read now)
                if not task.cancelled() and task.exception() is None and task.result()[1]:
                    return task.result()
                self._drop_ahead(state)
                break
        else:
            self._drop_ahead(state)
        return await self._read(name, state, offset, max_bytes)

    async def _read(self, name: str, state: _Partition, offset: int, max_bytes: int,
                    stop: int | None = None) -> _Chunk:
        """About ``max_bytes`` of batches from ``offset`` below the end known, or to
        ``stop`` (the reader asks for whole answers: reading to the end would read past
        what is answered)."""
        if stop is None:
            stop = chunk_stop(offset, state.end, max_bytes, state.record_bytes)
        parts: list[bytes | bytearray] = []
        size = records = 0
        async for columns in self.client.read_batches(name, offset, stop):
            part = fetch_batch(columns)
            parts.append(part)
            size += len(part)
            records += columns.count
            if size >= max_bytes:
                break
        if records:
            state.record_bytes = max(1, size // records)
        return b"".join(parts), records  # (bytes: what kio's Records takes)

    async def _fetch(self, request: Any, version: int) -> Any:
        """The partitions asked, read once, then read again each time one of them has
        more, until ``min_bytes`` or ``max_wait``: one deadline for the whole long poll
        (not a wait of what remains, re-armed each round, which a round's reads could
        outlast); when it passes while a round reads again, the last round's results
        answer (the same offsets: what was read then is still there). A round waits for
        records past each partition's end known (distinct partitions, the first
        :data:`fetch_waits_max`), not at the offset asked: records already there would
        wake it at once, round after round until the deadline."""
        loop = asyncio.get_running_loop()
        wait_s = min(max(request.max_wait.total_seconds(), 0.0), fetch_wait_ms_max / 1000)
        deadline = loop.time() + wait_s
        asked = [(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
                 for t in request.topics for p in t.partitions]
        budget = min(max(1, request.max_bytes), fetch_answer_bytes_max)
        results = await self._fetch_round(asked, budget)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout_at(deadline):
                while sum(len(r[3]) for r in results) < max(1, request.min_bytes):
                    waits = list(dict.fromkeys(
                        (topic, index, r[1]) for (topic, index, _, _), r in
                        zip(asked, results, strict=True) if r[0] == ErrorCode.none))
                    if not waits:
                        break
                    await self._wait_for_records(waits[:fetch_waits_max])
                    results = await self._fetch_round(asked, budget)
        return self._fetch_response(version, asked, results, budget)

    async def _fetch_round(self, asked: list[tuple[str, int, int, int]], budget: int
                           ) -> list[tuple[ErrorCode, int, int, bytes]]:
        """Every partition asked, :data:`fetch_partitions_in_flight_max` at once, each reading at
        most its ``partition_max_bytes``, ``budget`` (the answer's bytes) and
        :data:`fetch_partition_bytes_max`; once the records read reach ``budget`` the
        partitions not started are answered unread (the first always reads), so a round
        holds at most ``budget`` plus one read per partition in flight. (Each partition
        reads the same size from one fetch to the next: the read-ahead's chunks match.)"""
        left = [budget]

        async def one(item: tuple[str, int, int, int]) -> tuple[ErrorCode, int, int, bytes]:
            topic, index, offset, limit = item
            size = min(max(1, limit), budget, fetch_partition_bytes_max) if left[0] > 0 else 0
            result = await self._fetch_partition(topic, index, offset, size)
            left[0] -= len(result[3])
            return result

        return await gather_bounded(one, asked, fetch_partitions_in_flight_max)

    def _fetch_response(self, version: int, asked: list[tuple[str, int, int, int]],
                        results: list[tuple[ErrorCode, int, int, bytes]],
                        max_bytes: int) -> Any:
        schema = kp.response_schema(kp.FETCH, version)
        topic_cls = kp.nested(schema, "FetchableTopicResponse")
        part_cls = kp.nested(schema, "PartitionData")
        by_topic: dict[str, list[Any]] = {}
        budget = max(1, max_bytes)
        for (topic, index, _, _), (error, high, start, data) in zip(asked, results,
                                                                     strict=True):
            if budget <= 0:
                data = b""  # the first partition's data goes whatever its size
            budget -= len(data)
            by_topic.setdefault(topic, []).append(kp.build(
                part_cls, partition_index=index, error_code=error, high_watermark=high,
                last_stable_offset=high, log_start_offset=start, aborted_transactions=(),
                preferred_read_replica=-1, records=data))
        return kp.build(schema, throttle_time=0, error_code=ErrorCode.none, session_id=0,
                        responses=tuple(kp.build(topic_cls, topic=t, partitions=tuple(p))
                                        for t, p in by_topic.items()))

    async def _wait_for_records(self, waits: list[tuple[str, int, int]]) -> None:
        """Until one of the partitions has a record at or past its offset (the caller's
        deadline bounds it)."""

        async def first(name: str, offset: int) -> None:
            batches: AsyncIterator[Any] = self.client.read_batches(name, offset, follow=True)
            try:
                await anext(batches)
            finally:
                await batches.aclose()  # type: ignore[attr-defined]

        tasks = [asyncio.ensure_future(first(stream_name(t, p), o)) for t, p, o in waits]
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    def _drop_ahead(self, state: _Partition) -> None:
        self._forget(state.ahead)
        state.ahead = []

    def _forget(self, chunks: list[_Ahead], keep: asyncio.Task[_Chunk] | None = None
                ) -> None:
        """Chunks no longer held by the read-ahead: counted out, their reads cancelled
        (but ``keep``'s, answered now)."""
        for _, _, size, task in chunks:
            self.read_ahead_bytes -= size
            if task is not keep:
                task.cancel()
