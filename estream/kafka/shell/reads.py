"""The Kafka gateway's reads: Fetch (a long poll over the partitions asked) and
ListOffsets (earliest, latest, by time), each partition through the SDK's reader, so the
object tier is transparent. A mixin of :class:`~estream.kafka.shell.gateway.Gateway`.

Side effects: the SDK's reads.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, Final

from kio.schema.errors import ErrorCode

from estream.kafka import protocol as kp
from estream.kafka.convert import fetch_batch
from estream.kafka.topics import stream_name
from estream.sdk.client import Client
from estream.wire.errors import EstreamError

fetch_wait_ms_max: Final = 30_000  # the longest long poll held, whatever max_wait_ms says
record_bytes_guess: Final = 256  # a stream's record size before its first fetch


class Reads:
    """Fetch and ListOffsets over ``client``; ``_record_bytes``: per stream, the bytes per
    record last fetched (to size the next read)."""

    client: Client
    _record_bytes: dict[str, int]

    async def _fetch_partition(self, topic: str, index: int, offset: int, max_bytes: int
                               ) -> tuple[ErrorCode, int, int, bytes]:
        """(error, high watermark, log start, record batches) of one partition now."""
        name = stream_name(topic, index)
        try:
            end = await self.client.end_offset(name)
            start = (await self.client.stream_meta(name)).start_offset
            if offset < start or offset > end:
                return ErrorCode.offset_out_of_range, end, start, b""
            parts: list[bytes] = []
            size = records = 0
            if offset < end:
                # Read about max_bytes, not to the end: the reader asks for whole answers.
                guess = self._record_bytes.get(name, record_bytes_guess)
                stop = min(end, offset + max(1, max_bytes // max(1, guess)))
                async for columns in self.client.read_batches(name, offset, stop):
                    part = fetch_batch(columns)
                    parts.append(part)
                    size += len(part)
                    records += columns.count
                    if size >= max_bytes:
                        break
            if records:
                self._record_bytes[name] = max(1, size // records)
            return ErrorCode.none, end, start, b"".join(parts)
        except (EstreamError, TimeoutError) as exc:
            return kp.error_code(exc), -1, -1, b""

    async def _fetch(self, request: Any, version: int) -> Any:
        loop = asyncio.get_running_loop()
        wait_s = min(max(request.max_wait.total_seconds(), 0.0), fetch_wait_ms_max / 1000)
        deadline = loop.time() + wait_s
        asked = [(t.topic, p.partition, p.fetch_offset, p.partition_max_bytes)
                 for t in request.topics for p in t.partitions]
        while True:
            results = await asyncio.gather(*(
                self._fetch_partition(topic, index, offset, max(1, limit))
                for topic, index, offset, limit in asked))
            total = sum(len(r[3]) for r in results)
            remaining = deadline - loop.time()
            if total >= max(1, request.min_bytes) or remaining <= 0 or not asked:
                break
            waits = [(topic, index, offset) for (topic, index, offset, _), r in
                     zip(asked, results, strict=True) if r[0] == ErrorCode.none]
            if not waits:
                break
            await self._wait_for_records(waits, remaining)
        return self._fetch_response(version, asked, results, request.max_bytes)

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

    async def _wait_for_records(self, waits: list[tuple[str, int, int]], timeout_s: float
                                ) -> None:
        """Until one of the partitions has a record at or past its offset, or the time."""

        async def first(name: str, offset: int) -> None:
            batches: AsyncIterator[Any] = self.client.read_batches(name, offset, follow=True)
            try:
                await anext(batches)
            finally:
                await batches.aclose()  # type: ignore[attr-defined]

        tasks = [asyncio.ensure_future(first(stream_name(t, p), o)) for t, p, o in waits]
        try:
            await asyncio.wait(tasks, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    # -- ListOffsets --------------------------------------------------------------------

    async def _list_offset(self, topic: str, index: int, timestamp: int
                           ) -> tuple[ErrorCode, int, int]:
        """(error, timestamp, offset) for -1 (latest), -2 (earliest) or a time in ms."""
        name = stream_name(topic, index)
        try:
            if timestamp == -1:
                return ErrorCode.none, -1, await self.client.end_offset(name)
            if timestamp == -2:
                return ErrorCode.none, -1, (await self.client.stream_meta(
                    name, refresh=True)).start_offset
            if timestamp < 0:
                return ErrorCode.invalid_request, -1, -1
            offset = await self.client.offset_for_time(name, timestamp)
            end = await self.client.end_offset(name)
            if offset >= end:
                return ErrorCode.none, -1, -1
            found = -1
            async for record in self.client.read(name, offset, offset + 1):
                found = record.timestamp
            return ErrorCode.none, found, offset
        except (EstreamError, TimeoutError) as exc:
            return kp.error_code(exc), -1, -1

    async def _list_offsets(self, request: Any, version: int) -> Any:
        schema = kp.response_schema(kp.LIST_OFFSETS, version)
        topic_cls = kp.nested(schema, "ListOffsetsTopicResponse")
        part_cls = kp.nested(schema, "ListOffsetsPartitionResponse")
        topics = []
        for topic in request.topics:
            found = await asyncio.gather(*(self._list_offset(topic.name, p.partition_index,
                                                             p.timestamp)
                                           for p in topic.partitions))
            topics.append(kp.build(topic_cls, name=topic.name, partitions=tuple(
                kp.build(part_cls, partition_index=p.partition_index, error_code=error,
                         timestamp=ts, offset=offset, leader_epoch=0)
                for p, (error, ts, offset) in zip(topic.partitions, found, strict=True))))
        return kp.build(schema, throttle_time=0, topics=tuple(topics))

    # -- InitProducerId -----------------------------------------------------------------
